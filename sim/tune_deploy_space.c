/*
 * tune_deploy_space.c -- the space of `tandem tune --gpus N` (tune_deploy.h): the TP degrees,
 * serving modes and batch-limit lists, the enumeration of the topologies a GPU budget holds,
 * the labels, the config document of a candidate (the base's deployment replaced, its other
 * keys kept) and of each of its engines (one colocated instance, for vLLM), and the base's
 * batch limits as the search's start.
 */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tune_deploy.h"

/* ---- the space ----------------------------------------------------------------------- */

void tdm_sim_deploy_opts_init(tdm_sim_deploy_opts *o)
{
    memset(o, 0, sizeof *o);
    o->budget = 60;
    o->refine = 3;
    o->jobs = 1;
}

void tdm_sim_deploy_space_default(tdm_sim_deploy_space *s, uint32_t gpus)
{
    static const uint32_t TP[] = {1, 2, 4, 8};
    static const uint32_t SEQS[] = {16, 32, 64, 128, 256, 512};
    static const uint32_t TOK[] = {1024, 2048, 4096, 8192, 16384};
    memset(s, 0, sizeof *s);
    s->gpus = gpus;
    for (size_t i = 0; i < sizeof TP / sizeof TP[0]; i++)
        if (TP[i] <= gpus) s->tp[s->ntp++] = TP[i];
    s->agg = s->disagg = 1;
    for (size_t i = 0; i < sizeof SEQS / sizeof SEQS[0]; i++) s->seqs[s->nseqs++] = SEQS[i];
    for (size_t i = 0; i < sizeof TOK / sizeof TOK[0]; i++) s->tokens[s->ntokens++] = TOK[i];
}

static int insert_sorted(uint32_t *v, int *n, int max, uint32_t x)
{
    int i = 0;
    while (i < *n && v[i] < x) i++;
    if (i < *n && v[i] == x) return i;
    if (*n >= max) return -1;
    memmove(v + i + 1, v + i, (size_t)(*n - i) * sizeof *v);
    v[i] = x;
    (*n)++;
    return i;
}

int tdm_sim_deploy_parse_list(const char *what, const char *list, uint32_t *out, int max, int *n,
                              char *err, size_t errlen)
{
    uint32_t v[64];
    int k = 0;
    const char *p = list ? list : "";
    if (!*p) {
        snprintf(err, errlen, "%s: no values", what);
        return -1;
    }
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 1 || x > 1048576 || (*end && *end != ',')) {
            snprintf(err, errlen, "%s: bad value in '%s' (expected positive integers, "
                                  "comma-separated)", what, list);
            return -1;
        }
        if (insert_sorted(v, &k, max < 64 ? max : 64, (uint32_t)x) < 0) {
            snprintf(err, errlen, "%s: at most %d values", what, max);
            return -1;
        }
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) {
            snprintf(err, errlen, "%s: bad value in '%s' (a trailing comma)", what, list);
            return -1;
        }
    }
    memcpy(out, v, (size_t)k * sizeof *v);
    *n = k;
    return 0;
}

int tdm_sim_deploy_parse_modes(const char *s, tdm_sim_deploy_space *sp, char *err, size_t errlen)
{
    int agg = 0, dis = 0;
    if (s && (!strcmp(s, "both") || !strcmp(s, "auto"))) agg = dis = 1;
    else if (s && (!strcmp(s, "agg") || !strcmp(s, "colocated"))) agg = 1;
    else if (s && (!strcmp(s, "disagg") || !strcmp(s, "disaggregated"))) dis = 1;
    else if (s && (!strcmp(s, "agg,disagg") || !strcmp(s, "disagg,agg"))) agg = dis = 1;
    else {
        snprintf(err, errlen, "--serving-mode: '%s' (agg, disagg or both)", s ? s : "");
        return -1;
    }
    sp->agg = agg;
    sp->disagg = dis;
    return 0;
}

/* vLLM shards the attention heads over the TP ranks: the query heads must divide, and the KV
 * heads either divide or are replicated (tp a multiple of them). */
int tdm_sim__deploy_tp_fits(const tdm_sim_model *m, uint32_t tp)
{
    if (tp == 0 || (m->heads && m->heads % tp)) return 0;
    uint32_t kv = m->kv_heads ? m->kv_heads : m->heads;
    return kv == 0 || kv % tp == 0 || tp % kv == 0;
}

uint32_t tdm_sim_deploy_gpus(const tdm_sim_deploy *d)
{
    return d->n[0] * d->tp[0] + (d->disagg ? d->n[1] * d->tp[1] : 0);
}

int tdm_sim_deploy_enumerate(const tdm_sim_deploy_space *s, const tdm_sim_model *m, int is, int it,
                             tdm_sim_deploy **out, size_t *n, char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    if (!s || !m || s->gpus < 1 || s->ntp < 1 || (!s->agg && !s->disagg) || is < 0 ||
        is >= s->nseqs || it < 0 || it >= s->ntokens) {
        snprintf(err, errlen, "deployment space: a budget of at least one GPU, a TP list, a "
                              "serving mode and the batch limits are needed");
        return -1;
    }
    size_t cap = 16, k = 0;
    tdm_sim_deploy *v = calloc(cap, sizeof *v);
    if (!v) goto oom;
    for (int pass = 0; pass < 2; pass++) {
        if ((pass == 0 && !s->agg) || (pass == 1 && !s->disagg)) continue;
        for (int a = 0; a < s->ntp; a++) {
            uint32_t p = s->tp[a];
            if (p > s->gpus || !tdm_sim__deploy_tp_fits(m, p)) continue;
            for (int b = 0; b < (pass ? s->ntp : 1); b++) {
                uint32_t d = pass ? s->tp[b] : 0;
                if (pass && (d > s->gpus || !tdm_sim__deploy_tp_fits(m, d))) continue;
                for (uint32_t x = 1; pass ? x * p + d <= s->gpus : x == 1; x++) {
                    tdm_sim_deploy c;
                    memset(&c, 0, sizeof c);
                    c.disagg = pass;
                    c.is = is;
                    c.it = it;
                    c.tp[0] = p;
                    if (!pass) {
                        c.n[0] = s->gpus / p;
                    } else {
                        c.n[0] = x;
                        c.tp[1] = d;
                        c.n[1] = (s->gpus - x * p) / d;
                        uint32_t left = s->gpus - tdm_sim_deploy_gpus(&c);
                        /* maximal: a further instance of either pool would not fit */
                        if (left >= (p < d ? p : d)) continue;
                    }
                    if (k == cap) {
                        tdm_sim_deploy *nv = realloc(v, 2 * cap * sizeof *nv);
                        if (!nv) goto oom;
                        v = nv;
                        cap *= 2;
                    }
                    v[k++] = c;
                }
            }
        }
    }
    *out = v;
    *n = k;
    return 0;
oom:
    free(v);
    snprintf(err, errlen, "out of memory");
    return -1;
}

void tdm_sim_deploy_label(const tdm_sim_deploy_space *s, const tdm_sim_deploy *d, char *out, size_t n)
{
    if (!d->disagg)
        snprintf(out, n, "agg %ux tp%u S%u B%u", d->n[0], d->tp[0], s->seqs[d->is], s->tokens[d->it]);
    else
        snprintf(out, n, "disagg %uP tp%u B%u + %uD tp%u S%u", d->n[0], d->tp[0], s->tokens[d->it],
                 d->n[1], d->tp[1], s->seqs[d->is]);
}

/* ---- documents ----------------------------------------------------------------------- */

/* The base as a wrapper with a "scheduler" object (a bare scheduler JSON is wrapped). */
static json_t *base_doc(const char *base_json)
{
    json_t *o = base_json ? json_loads(base_json, 0, NULL) : json_object();
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return NULL;
    }
    if (base_json && !json_object_get(o, "scheduler") && !json_object_get(o, "deployment") &&
        !json_object_get(o, "name")) {
        json_t *w = json_object();
        if (!w || json_object_set_new(w, "scheduler", o) != 0) {
            json_decref(w);
            return NULL;
        }
        o = w;
    }
    if (!json_is_object(json_object_get(o, "scheduler")))
        json_object_set_new(o, "scheduler", json_object());
    return o;
}

/* Copy the keys of src named in keys into dst (those present). */
static void copy_keys(json_t *dst, json_t *src, const char *const *keys, size_t nk)
{
    if (!json_is_object(src)) return;
    for (size_t i = 0; i < nk; i++) {
        json_t *v = json_object_get(src, keys[i]);
        if (v) json_object_set(dst, keys[i], v);
    }
}

static const char *const POOL_KEYS[] = {"hw", "precision", "kv_cache_dtype"};
static const char *const DEP_KEYS[] = {"router", "kv_gbps", "kv_latency_ms", "overlap_weight"};
#define NPOOLK (sizeof POOL_KEYS / sizeof POOL_KEYS[0])
#define NDEPK (sizeof DEP_KEYS / sizeof DEP_KEYS[0])

/* The scheduler object of the old deployment's pool role ("prefill"/"decode") or of a
 * colocated deployment (role NULL), as a new object (empty when absent). */
static json_t *old_pool_sched(json_t *old, const char *role)
{
    json_t *p = role ? json_object_get(old, role) : old;
    json_t *sc = json_is_object(p) ? json_object_get(p, "scheduler") : NULL;
    return json_is_object(sc) ? json_deep_copy(sc) : json_object();
}

/* A pool's effective value of a scheduler key: its own object, else the top-level one. */
static long long eff_key(json_t *top, json_t *pool, const char *key, long long dflt)
{
    json_t *v = json_object_get(pool, key);
    if (!json_is_integer(v)) v = json_object_get(top, key);
    return json_is_integer(v) ? json_integer_value(v) : dflt;
}

/* The candidate's pool objects (built on the base doc, whose deployment is replaced). */
static json_t *build_doc(const char *base_json, const tdm_sim_deploy_space *s, const tdm_sim_deploy *d)
{
    json_t *doc = base_doc(base_json);
    if (!doc) return NULL;
    json_t *top = json_object_get(doc, "scheduler");
    json_t *old = json_object_get(doc, "deployment");
    int old_dis = json_is_object(old) && json_is_string(json_object_get(old, "mode")) &&
                  !strcmp(json_string_value(json_object_get(old, "mode")), "disaggregated");
    json_t *dep = json_object();
    if (!dep) goto fail;
    copy_keys(dep, old, DEP_KEYS, NDEPK);
    json_int_t S = s->seqs[d->is], B = s->tokens[d->it];
    if (!d->disagg) {
        json_object_set_new(dep, "mode", json_string("colocated"));
        json_object_set_new(dep, "instances", json_integer(d->n[0]));
        json_object_set_new(dep, "tp", json_integer(d->tp[0]));
        if (!old_dis) copy_keys(dep, old, POOL_KEYS, NPOOLK);
        else copy_keys(dep, json_object_get(old, "decode"), POOL_KEYS, NPOOLK);
        json_object_set_new(top, "max_num_seqs", json_integer(S));
        json_object_set_new(top, "max_num_batched_tokens", json_integer(B));
        json_t *ps = old_dis ? json_object() : old_pool_sched(old, NULL);
        if (!ps) goto fail;
        json_object_del(ps, "max_num_seqs");
        json_object_del(ps, "max_num_batched_tokens");
        if (json_object_size(ps)) json_object_set_new(dep, "scheduler", ps);
        else json_decref(ps);
    } else {
        static const char *const ROLE[2] = {"prefill", "decode"};
        json_object_set_new(dep, "mode", json_string("disaggregated"));
        for (int i = 0; i < 2; i++) {
            json_t *p = json_object();
            json_t *ps = old_dis ? old_pool_sched(old, ROLE[i]) : old_pool_sched(old, NULL);
            if (!p || !ps) {
                json_decref(p);
                json_decref(ps);
                goto fail;
            }
            json_object_set_new(p, "instances", json_integer(d->n[i]));
            json_object_set_new(p, "tp", json_integer(d->tp[i]));
            copy_keys(p, old, POOL_KEYS, NPOOLK);
            if (old_dis) copy_keys(p, json_object_get(old, ROLE[i]), POOL_KEYS, NPOOLK);
            if (i == 0) {
                json_object_set_new(ps, "max_num_batched_tokens", json_integer(B));
            } else {
                /* the decode pool's budget: the base's, at least its sequence cap (the library
                 * refuses a budget below max_num_seqs) */
                long long b = eff_key(top, ps, "max_num_batched_tokens", 0);
                json_object_set_new(ps, "max_num_seqs", json_integer(S));
                if (b && b < S) json_object_set_new(ps, "max_num_batched_tokens", json_integer(S));
                else if (!b && S > 2048) json_object_set_new(ps, "max_num_batched_tokens", json_integer(S));
            }
            json_object_set_new(p, "scheduler", ps);
            json_object_set_new(dep, ROLE[i], p);
        }
    }
    json_object_set_new(doc, "deployment", dep);
    return doc;
fail:
    json_decref(dep);
    json_decref(doc);
    return NULL;
}

char *tdm_sim_deploy_json(const char *base_json, const tdm_sim_deploy_space *s,
                          const tdm_sim_deploy *d, const char *name, const char *description)
{
    json_t *doc = build_doc(base_json, s, d);
    if (!doc) return NULL;
    if (name) json_object_set_new(doc, "name", json_string(name));
    if (description) json_object_set_new(doc, "description", json_string(description));
    char *txt = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(doc);
    return txt;
}

char *tdm_sim_deploy_engine_json(const char *base_json, const tdm_sim_deploy_space *s,
                                 const tdm_sim_deploy *d, int pool, const char *description)
{
    if (pool < 0 || pool > (d->disagg ? 1 : 0)) return NULL;
    json_t *doc = build_doc(base_json, s, d);
    if (!doc) return NULL;
    json_t *dep = json_object_get(doc, "deployment");
    json_t *p = d->disagg ? json_object_get(dep, pool ? "decode" : "prefill") : dep;
    json_t *sched = json_deep_copy(json_object_get(doc, "scheduler"));
    json_t *ps = json_object_get(p, "scheduler");
    json_t *e = json_object(), *ed = json_object();
    char *txt = NULL;
    if (!sched || !e || !ed || (json_is_object(ps) && json_object_update(sched, ps) != 0)) goto done;
    char name[64];
    snprintf(name, sizeof name, "%s", d->disagg ? (pool ? "tuned-decode" : "tuned-prefill") : "tuned-engine");
    json_object_set_new(e, "name", json_string(name));
    if (description) json_object_set_new(e, "description", json_string(description));
    json_object_set_new(e, "scheduler", sched);
    sched = NULL;
    json_object_set_new(ed, "mode", json_string("colocated"));
    json_object_set_new(ed, "instances", json_integer(1));
    json_object_set_new(ed, "tp", json_integer(d->tp[pool]));
    copy_keys(ed, p, POOL_KEYS, NPOOLK);
    json_object_set_new(e, "deployment", ed);
    ed = NULL;
    txt = json_dumps(e, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
done:
    json_decref(sched);
    json_decref(ed);
    json_decref(e);
    json_decref(doc);
    return txt;
}

int tdm_sim_deploy_base_limits(const char *base_json, tdm_sim_deploy_space *s, int *is, int *it,
                               char *err, size_t errlen)
{
    json_t *doc = base_doc(base_json);
    if (!doc) {
        snprintf(err, errlen, "base config: not a JSON object");
        return -1;
    }
    tdm_sched *sc = NULL;
    int rc = -1;
    if (tdm_sched_create(&sc) != TDM_OK) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    /* the library's defaults where the base omits a limit */
    json_t *top = json_object_get(doc, "scheduler");
    int64_t S = 0, B = 0;
    tdm_sched_get_param(sc, TDM_SCHED_MAX_NUM_SEQS, &S);
    tdm_sched_get_param(sc, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, &B);
    json_t *x = json_object_get(top, "max_num_seqs"), *y = json_object_get(top, "max_num_batched_tokens");
    if (x && (!json_is_integer(x) || json_integer_value(x) < 1)) {
        snprintf(err, errlen, "base config: max_num_seqs must be a positive integer");
        goto done;
    }
    if (y && (!json_is_integer(y) || json_integer_value(y) < 1)) {
        snprintf(err, errlen, "base config: max_num_batched_tokens must be a positive integer");
        goto done;
    }
    if (x) S = json_integer_value(x);
    if (y) B = json_integer_value(y);
    if (S > 1048576 || B > 1048576) {
        snprintf(err, errlen, "base config: batch limits above 1048576");
        goto done;
    }
    int a = insert_sorted(s->seqs, &s->nseqs, TDM_SIM_DEPLOY_MAXV, (uint32_t)S);
    int b = insert_sorted(s->tokens, &s->ntokens, TDM_SIM_DEPLOY_MAXV, (uint32_t)B);
    if (a < 0 || b < 0) {
        snprintf(err, errlen, "the base's batch limits do not fit the value lists (at most %d values)",
                 TDM_SIM_DEPLOY_MAXV);
        goto done;
    }
    *is = a;
    *it = b;
    rc = 0;
done:
    tdm_sched_destroy(sc);
    json_decref(doc);
    return rc;
}
