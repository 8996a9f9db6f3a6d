/*
 * trace.c -- the simulator's workload: a list of requests (arrival, prompt and output
 * lengths, optional prefix hash ids of fixed-size token blocks), the loader that picks a
 * reader by content (Azure CSV, Vidur CSV, length-only CSV, Mooncake JSONL, Tandem JSONL;
 * readers live in trace_csv.c and trace_jsonl.c), the embedded synthetic chat workload and
 * the fixed-length one (--isl/--osl), the table of SLO class names, the options
 * applied after reading (synthetic Poisson/Gamma arrivals, jitter, rate scale, time window,
 * request cap, length clip) and the token ids each request's prompt is made of.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sim.h"

void tdm_sim_trace_opts_init(tdm_sim_trace_opts *o)
{
    memset(o, 0, sizeof *o);
    o->fmt = TDM_SIM_FMT_AUTO;
    o->arrival = TDM_SIM_ARRIVAL_TRACE;
    o->cv = 1.0;
    o->rate_scale = 1.0;
    o->seed = 42;
    o->jitter_s = -1.0;
}

void tdm_sim_trace_free(tdm_sim_trace *t)
{
    if (!t) return;
    free(t->reqs);
    free(t->hash_ids);
    memset(t, 0, sizeof *t);
}

int tdm_sim_trace_push(tdm_sim_trace *t, const tdm_sim_req *r, const uint64_t *hash, uint32_t nh)
{
    if (t->n == t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 1024;
        tdm_sim_req *p = realloc(t->reqs, nc * sizeof *p);
        if (!p) return -1;
        t->reqs = p;
        t->cap = nc;
    }
    tdm_sim_req q = *r;
    q.hash_off = (uint32_t)t->n_hash;
    q.num_hash = nh;
    if (nh) {
        if (t->n_hash + nh > t->cap_hash) {
            size_t nc = t->cap_hash ? t->cap_hash : 4096;
            while (nc < t->n_hash + nh) nc *= 2;
            uint64_t *p = realloc(t->hash_ids, nc * sizeof *p);
            if (!p) return -1;
            t->hash_ids = p;
            t->cap_hash = nc;
        }
        memcpy(t->hash_ids + t->n_hash, hash, nh * sizeof *hash);
        t->n_hash += nh;
    }
    t->reqs[t->n++] = q;
    return 0;
}

void tdm_sim_trace_tokens(const tdm_sim_trace *t, size_t i, tdm_token *out)
{
    const tdm_sim_req *r = &t->reqs[i];
    uint32_t hb = t->hash_block;
    uint64_t uniq = tdm_sim_mix64(((uint64_t)i + 1) * 0x100000001b3ull ^ 0x5eedull);
    for (uint32_t k = 0; k < r->prompt_len; k++) {
        uint64_t x;
        uint32_t b = hb ? k / hb : 0;
        if (hb && b < r->num_hash)
            x = tdm_sim_mix64(t->hash_ids[r->hash_off + b] * 0x9e3779b97f4a7c15ull + k % hb);
        else
            x = tdm_sim_mix64(uniq + k);
        out[k] = (tdm_token)(1 + x % 32000);
    }
}

double tdm_sim_trace_span(const tdm_sim_trace *t)
{
    if (t->n < 2) return 0;
    return t->reqs[t->n - 1].arrival - t->reqs[0].arrival;
}

static int cmp_arrival(const void *a, const void *b)
{
    const tdm_sim_req *x = a, *y = b;
    if (x->arrival < y->arrival) return -1;
    if (x->arrival > y->arrival) return 1;
    /* stable by insertion order (hash_off grows with it; reserved holds the index) */
    return (x->reserved > y->reserved) - (x->reserved < y->reserved);
}

int tdm_sim_trace_finish(tdm_sim_trace *t, const tdm_sim_trace_opts *o, int has_times,
                         char *err, size_t errlen)
{
    tdm_sim_rng rng;
    tdm_sim_rng_seed(&rng, o->seed);
    if (t->n == 0) {
        snprintf(err, errlen, "%s: the trace has no requests", t->name);
        return -1;
    }
    if (o->rate_scale <= 0 || !isfinite(o->rate_scale)) {
        snprintf(err, errlen, "rate scale must be > 0");
        return -1;
    }
    tdm_sim_arrival arr = o->arrival;
    if (arr == TDM_SIM_ARRIVAL_TRACE && !has_times) arr = TDM_SIM_ARRIVAL_POISSON;
    if (arr != TDM_SIM_ARRIVAL_TRACE) {
        double rate = o->rate > 0 ? o->rate : 1.0;
        double cv = o->cv > 0 ? o->cv : 1.0;
        double now = 0;
        for (size_t i = 0; i < t->n; i++) {
            t->reqs[i].arrival = now;
            double gap = isinf(rate) ? 0.0 /* all at once (a closed loop paces them) */
                         : arr == TDM_SIM_ARRIVAL_POISSON
                             ? tdm_sim_rng_exp(&rng, 1.0 / rate)
                             : tdm_sim_rng_gamma(&rng, 1.0 / (cv * cv), cv * cv / rate);
            now += gap;
        }
    } else if (o->jitter_s > 0) {
        for (size_t i = 0; i < t->n; i++)
            t->reqs[i].arrival += tdm_sim_rng_uniform(&rng) * o->jitter_s;
    }
    for (size_t i = 0; i < t->n; i++) t->reqs[i].reserved = (uint32_t)i;
    qsort(t->reqs, t->n, sizeof *t->reqs, cmp_arrival);
    double t0 = t->reqs[0].arrival;
    size_t w = 0;
    for (size_t i = 0; i < t->n; i++) {
        tdm_sim_req r = t->reqs[i];
        r.arrival -= t0;
        if (r.arrival < o->window_start) continue;
        if (o->window_end > 0 && r.arrival >= o->window_end) continue;
        if (o->max_requests && w >= o->max_requests) break;
        r.arrival = (r.arrival - o->window_start) / o->rate_scale;
        r.reserved = 0;
        if (o->max_len) {
            if (o->max_len < 2) {
                snprintf(err, errlen, "max length must be >= 2");
                return -1;
            }
            if (r.output_len >= o->max_len) r.output_len = o->max_len - 1;
            if ((uint64_t)r.prompt_len + r.output_len > o->max_len)
                r.prompt_len = o->max_len - r.output_len;
        }
        t->reqs[w++] = r;
    }
    t->n = w;
    if (w == 0) {
        snprintf(err, errlen, "%s: no request left after the window and cap", t->name);
        return -1;
    }
    if (w > 0) {
        double s = t->reqs[0].arrival;
        for (size_t i = 0; i < w; i++) t->reqs[i].arrival -= s;
    }
    return 0;
}

uint32_t tdm_sim_trace_slo_class(tdm_sim_trace *t, const char *name, size_t len)
{
    while (len && (*name == ' ' || *name == '"')) name++, len--;
    while (len && (name[len - 1] == ' ' || name[len - 1] == '"' || name[len - 1] == '\r')) len--;
    if (len == 0) return 0;
    if (len >= TDM_SIM_SLO_NAME) len = TDM_SIM_SLO_NAME - 1;
    for (uint32_t k = 0; k < t->n_slo; k++)
        if (strlen(t->slo_names[k]) == len && !memcmp(t->slo_names[k], name, len)) return k + 1;
    if (t->n_slo == TDM_SIM_MAX_SLO_CLASSES) return UINT32_MAX;
    memcpy(t->slo_names[t->n_slo], name, len);
    t->slo_names[t->n_slo][len] = '\0';
    return ++t->n_slo;
}

static uint32_t draw_len(tdm_sim_rng *rng, uint32_t l, double range)
{
    if (range <= 0) return l;
    double lo = l * (1 - range), hi = l * (1 + range);
    double v = floor(lo + tdm_sim_rng_uniform(rng) * (hi - lo + 1));
    return v < 1 ? 1 : v > 1e8 ? 100000000u : (uint32_t)v;
}

/* Fixed lengths, as `vllm bench serve --dataset-name random --random-input-len ISL
 * --random-output-len OSL [--random-range-ratio R]` and genai-perf's synthetic prompts:
 * every prompt is unique (no shared prefix). */
int tdm_sim_trace_fixed(tdm_sim_trace *t, const tdm_sim_trace_opts *o)
{
    tdm_sim_rng rng;
    tdm_sim_rng_seed(&rng, o->seed ^ 0xf1edull);
    size_t n = o->max_requests ? o->max_requests : 1000;
    memset(t, 0, sizeof *t);
    if (o->len_range > 0)
        snprintf(t->name, sizeof t->name, "fixed:isl=%u,osl=%u,range=%g", o->isl, o->osl ? o->osl : 1,
                 o->len_range);
    else
        snprintf(t->name, sizeof t->name, "fixed:isl=%u,osl=%u", o->isl, o->osl ? o->osl : 1);
    uint32_t ne = o->dataset_entries;
    if (!ne) {
        for (size_t i = 0; i < n; i++) {
            tdm_sim_req r = {0};
            r.prompt_len = draw_len(&rng, o->isl, o->len_range);
            r.output_len = draw_len(&rng, o->osl ? o->osl : 1, o->len_range);
            if (tdm_sim_trace_push(t, &r, NULL, 0) != 0) return -1;
        }
        return 0;
    }
    /* ne distinct prompts: entry e's tokens are named by hash ids (e + 1) << 24 | block, so
     * the same entry gives the same tokens; requests take the entries in a shuffled order,
     * reshuffled after each pass (aiperf's shuffle sampler) */
    size_t slen = strlen(t->name);
    snprintf(t->name + slen, sizeof t->name - slen, ",entries=%u", ne);
    t->hash_block = 512;
    uint32_t *len = malloc(2 * (size_t)ne * sizeof *len), *perm = malloc((size_t)ne * sizeof *perm);
    uint64_t *h = NULL;
    int rc = -1;
    if (!len || !perm) goto out;
    uint32_t maxb = 0;
    for (uint32_t e = 0; e < ne; e++) {
        len[2 * e] = draw_len(&rng, o->isl, o->len_range);
        len[2 * e + 1] = draw_len(&rng, o->osl ? o->osl : 1, o->len_range);
        uint32_t nb = (len[2 * e] + t->hash_block - 1) / t->hash_block;
        maxb = nb > maxb ? nb : maxb;
        perm[e] = e;
    }
    h = malloc((maxb ? maxb : 1) * sizeof *h);
    if (!h) goto out;
    for (size_t i = 0; i < n; i++) {
        uint32_t k = (uint32_t)(i % ne);
        if (k == 0) /* a new pass: Fisher-Yates */
            for (uint32_t j = ne - 1; j > 0; j--) {
                uint32_t m = (uint32_t)(tdm_sim_rng_next(&rng) % (j + 1u)), x = perm[j];
                perm[j] = perm[m];
                perm[m] = x;
            }
        uint32_t e = perm[k];
        tdm_sim_req r = {0};
        r.prompt_len = len[2 * e];
        r.output_len = len[2 * e + 1];
        uint32_t nb = (r.prompt_len + t->hash_block - 1) / t->hash_block;
        for (uint32_t b = 0; b < nb; b++) h[b] = ((uint64_t)e + 1) << 24 | b;
        if (tdm_sim_trace_push(t, &r, h, nb) != 0) goto out;
    }
    rc = 0;
out:
    free(len);
    free(perm);
    free(h);
    return rc;
}

/* The embedded default: a chat workload with log-normal prompt and output lengths (medians
 * 700 and 160 tokens) and 40% of the requests opening with one of 8 shared 512-token system
 * prompts, arriving as a Poisson process (20 req/s unless --rate says otherwise). */
int tdm_sim_trace_builtin(tdm_sim_trace *t, const tdm_sim_trace_opts *o)
{
    tdm_sim_rng rng;
    tdm_sim_rng_seed(&rng, o->seed ^ 0xc4a7ull);
    size_t n = o->max_requests ? o->max_requests : 1200;
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "builtin:chat");
    t->hash_block = 512;
    for (size_t i = 0; i < n; i++) {
        tdm_sim_req r = {0};
        double p = exp(log(700.0) + 0.9 * tdm_sim_rng_normal(&rng));
        double q = exp(log(160.0) + 0.8 * tdm_sim_rng_normal(&rng));
        p = p < 16 ? 16 : p > 7000 ? 7000 : p;
        q = q < 4 ? 4 : q > 1000 ? 1000 : q;
        r.prompt_len = (uint32_t)p;
        r.output_len = (uint32_t)q;
        uint64_t h = 0;
        uint32_t nh = 0;
        if (tdm_sim_rng_uniform(&rng) < 0.4) {
            h = 1000 + tdm_sim_rng_next(&rng) % 8;
            nh = 1;
            r.prompt_len += 512;
        }
        if (tdm_sim_trace_push(t, &r, &h, nh) != 0) return -1;
    }
    return 0;
}

static int read_file(const char *path, char **buf, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 20, n = 0;
    char *b = malloc(cap + 1);
    if (!b) {
        fclose(f);
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    for (;;) {
        if (n == cap) {
            char *nb = realloc(b, cap * 2 + 1);
            if (!nb) {
                free(b);
                fclose(f);
                snprintf(err, errlen, "%s: out of memory", path);
                return -1;
            }
            b = nb;
            cap *= 2;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(b);
        snprintf(err, errlen, "%s: read error", path);
        return -1;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

/* JSONL is parsed as it is read, a chunk of whole lines at a time, so a long trace file costs
 * its parsed requests and not its text as well (a week of requests is a 200 MB file). */
#define STREAM_CHUNK ((size_t)4 << 20)

/* Parse the JSONL file f, whose first `have` bytes are already in buf (capacity cap, which
 * may grow for a line longer than it); buf is the caller's to free. */
static int stream_jsonl(FILE *f, char **bufp, size_t cap, size_t have, const char *path,
                        tdm_sim_fmt fmt, tdm_sim_trace *t, char *err, size_t errlen)
{
    char *buf = *bufp;
    size_t line = 0;
    int eof = 0;
    tdm_sim__jsonl_begin(t);
    for (;;) {
        size_t cut = have;
        if (!eof)
            while (cut > 0 && buf[cut - 1] != '\n') cut--;
        if (cut > 0 || eof) {
            if (tdm_sim__parse_jsonl_chunk(buf, cut, path, fmt, t, &line, err, errlen) != 0)
                return -1;
            memmove(buf, buf + cut, have - cut);
            have -= cut;
            if (eof) break;
        } else if (have == cap) { /* one line fills the buffer: make room */
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                snprintf(err, errlen, "%s: out of memory", path);
                return -1;
            }
            *bufp = buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + have, 1, cap - have, f);
        if (r == 0 && ferror(f)) {
            snprintf(err, errlen, "%s: read error", path);
            return -1;
        }
        have += r;
        eof = r == 0;
    }
    return tdm_sim__jsonl_end(t, path, line, err, errlen);
}

static tdm_sim_fmt detect(const char *buf, size_t len)
{
    size_t i = 0;
    while (i < len && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\r' || buf[i] == '\n')) i++;
    size_t e = i;
    while (e < len && buf[e] != '\n') e++;
    char line[512];
    size_t m = e - i < sizeof line - 1 ? e - i : sizeof line - 1;
    memcpy(line, buf + i, m);
    line[m] = '\0';
    if (line[0] == '{') {
        if (strstr(line, "\"arrival_s\"") || strstr(line, "\"input_tokens\"") ||
            strstr(line, "\"output_tokens\""))
            return TDM_SIM_FMT_TANDEM;
        return TDM_SIM_FMT_MOONCAKE;
    }
    if (strcasestr(line, "timestamp")) return TDM_SIM_FMT_AZURE;
    if (strstr(line, "arrived_at")) return TDM_SIM_FMT_VIDUR;
    if (strstr(line, "num_prefill_tokens")) return TDM_SIM_FMT_LENGTHS;
    return TDM_SIM_FMT_AUTO;
}

int tdm_sim_trace_load(const char *path, const tdm_sim_trace_opts *o, tdm_sim_trace *t,
                       char *err, size_t errlen)
{
    tdm_sim_trace_opts def;
    if (!o) {
        tdm_sim_trace_opts_init(&def);
        o = &def;
    }
    memset(t, 0, sizeof *t);
    if (o->len_range < 0 || o->len_range >= 1) {
        snprintf(err, errlen, "length range must be in [0, 1)");
        return -1;
    }
    if (o->fmt == TDM_SIM_FMT_FIXED || (!path && o->isl > 0)) {
        tdm_sim_trace_opts b = *o;
        if (b.isl == 0) b.isl = 1024;
        if (b.osl == 0) b.osl = 128;
        if (b.rate <= 0) b.rate = 20.0;
        if (b.arrival == TDM_SIM_ARRIVAL_TRACE) b.arrival = TDM_SIM_ARRIVAL_POISSON;
        if (tdm_sim_trace_fixed(t, &b) != 0) {
            snprintf(err, errlen, "fixed: out of memory");
            tdm_sim_trace_free(t);
            return -1;
        }
        b.max_requests = 0;
        if (tdm_sim_trace_finish(t, &b, 0, err, errlen) != 0) {
            tdm_sim_trace_free(t);
            return -1;
        }
        return 0;
    }
    if (!path || !strcmp(path, "builtin") || !strcmp(path, "builtin:chat") ||
        o->fmt == TDM_SIM_FMT_BUILTIN) {
        tdm_sim_trace_opts b = *o;
        if (b.rate <= 0) b.rate = 20.0;
        if (b.arrival == TDM_SIM_ARRIVAL_TRACE) b.arrival = TDM_SIM_ARRIVAL_POISSON;
        if (tdm_sim_trace_builtin(t, &b) != 0) {
            snprintf(err, errlen, "builtin: out of memory");
            tdm_sim_trace_free(t);
            return -1;
        }
        b.max_requests = 0; /* already applied */
        if (tdm_sim_trace_finish(t, &b, 0, err, errlen) != 0) {
            tdm_sim_trace_free(t);
            return -1;
        }
        return 0;
    }
    /* the first chunk tells the format; JSONL streams on from it, the rest is read whole */
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    size_t len = 0;
    char *buf = malloc(STREAM_CHUNK);
    if (buf) len = fread(buf, 1, STREAM_CHUNK, f);
    if (!buf || ferror(f)) {
        free(buf);
        fclose(f);
        snprintf(err, errlen, "%s: %s", path, buf ? "read error" : "out of memory");
        return -1;
    }
    tdm_sim_fmt fmt = o->fmt != TDM_SIM_FMT_AUTO ? o->fmt : detect(buf, len);
    int jsonl = fmt == TDM_SIM_FMT_MOONCAKE || fmt == TDM_SIM_FMT_TANDEM;
    int jrc = 0;
    if (jsonl) {
        jrc = stream_jsonl(f, &buf, STREAM_CHUNK, len, path, fmt, t, err, errlen);
        fclose(f);
    } else {
        fclose(f);
        free(buf);
        if (read_file(path, &buf, &len, err, errlen) != 0) return -1;
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    int rc = -1, has_times = 1;
    tdm_sim_trace_opts eff = *o;
    switch (fmt) {
    case TDM_SIM_FMT_AZURE:
        rc = tdm_sim_parse_azure(buf, len, path, t, err, errlen);
        break;
    case TDM_SIM_FMT_VIDUR:
        rc = tdm_sim_parse_vidur(buf, len, path, t, err, errlen);
        break;
    case TDM_SIM_FMT_LENGTHS:
        rc = tdm_sim_parse_lengths(buf, len, path, t, err, errlen);
        has_times = 0;
        break;
    case TDM_SIM_FMT_MOONCAKE:
        rc = jrc;
        /* Mooncake timestamps are quantized to ~3 s bins: spread each bin by default. */
        if (eff.jitter_s < 0) eff.jitter_s = 3.0;
        break;
    case TDM_SIM_FMT_TANDEM:
        rc = jrc;
        break;
    default:
        snprintf(err, errlen, "%s:1:1: unknown trace format (expected an Azure CSV header "
                              "TIMESTAMP,..., a Vidur CSV arrived_at,..., a length CSV with "
                              "num_prefill_tokens, or JSONL)",
                 path);
        break;
    }
    free(buf);
    if (rc != 0) {
        tdm_sim_trace_free(t);
        return -1;
    }
    snprintf(t->name, sizeof t->name, "%s", base);
    if (tdm_sim_trace_finish(t, &eff, has_times, err, errlen) != 0) {
        tdm_sim_trace_free(t);
        return -1;
    }
    return 0;
}

int tdm_sim_trace_scaled(const tdm_sim_trace *src, double scale, tdm_sim_trace *dst)
{
    memset(dst, 0, sizeof *dst);
    dst->reqs = malloc((src->n ? src->n : 1) * sizeof *dst->reqs);
    dst->hash_ids = malloc((src->n_hash ? src->n_hash : 1) * sizeof *dst->hash_ids);
    if (!dst->reqs || !dst->hash_ids) {
        tdm_sim_trace_free(dst);
        return -1;
    }
    memcpy(dst->reqs, src->reqs, src->n * sizeof *dst->reqs);
    if (src->n_hash) memcpy(dst->hash_ids, src->hash_ids, src->n_hash * sizeof *dst->hash_ids);
    dst->n = dst->cap = src->n;
    dst->n_hash = dst->cap_hash = src->n_hash;
    dst->hash_block = src->hash_block;
    memcpy(dst->name, src->name, sizeof dst->name);
    memcpy(dst->slo_names, src->slo_names, sizeof dst->slo_names);
    dst->n_slo = src->n_slo;
    for (size_t i = 0; i < dst->n; i++) dst->reqs[i].arrival /= scale;
    return 0;
}
