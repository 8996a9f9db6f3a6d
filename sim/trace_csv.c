/*
 * trace_csv.c -- readers of the CSV traces: the Azure LLM inference trace
 * (TIMESTAMP,ContextTokens,GeneratedTokens with wall-clock timestamps such as
 * "2023-11-16 18:17:03.9799600"), Vidur's request traces (arrived_at in seconds,
 * num_prefill_tokens, num_decode_tokens), and length-only files (num_prefill_tokens,
 * num_decode_tokens[, ...], ShareGPT and arXiv style) whose arrivals are synthesized later.
 * Any of them may carry an slo_class column (a class name per request, empty = none).
 * Columns are found by header name; every error names the file, line and column.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sim.h"

#define MAX_COLS 32

typedef struct csv_line {
    const char *f[MAX_COLS];
    size_t flen[MAX_COLS];
    size_t col[MAX_COLS];       /* 1-based character column of each field */
    size_t n;
} csv_line;

/* Split [s, e) at commas (no quoting: these traces never quote). */
static int split(const char *s, const char *e, csv_line *l)
{
    l->n = 0;
    const char *p = s;
    for (;;) {
        const char *q = p;
        while (q < e && *q != ',') q++;
        if (l->n == MAX_COLS) return -1;
        l->f[l->n] = p;
        l->flen[l->n] = (size_t)(q - p);
        l->col[l->n] = (size_t)(p - s) + 1;
        l->n++;
        if (q >= e) break;
        p = q + 1;
    }
    return 0;
}

static int field_is(const csv_line *l, size_t i, const char *name)
{
    const char *p = l->f[i];
    size_t n = l->flen[i];
    while (n && (*p == ' ' || *p == '"')) p++, n--;
    while (n && (p[n - 1] == ' ' || p[n - 1] == '"' || p[n - 1] == '\r')) n--;
    return strlen(name) == n && !strncasecmp(p, name, n);
}

/* A non-negative integer field; -1 when malformed. */
static long long parse_uint(const char *p, size_t n)
{
    while (n && *p == ' ') p++, n--;
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\r')) n--;
    if (n == 0 || n > 12) return -1;
    long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '.' ) { /* "12.0" is accepted when the fraction is zero */
            for (size_t j = i + 1; j < n; j++)
                if (p[j] != '0') return -1;
            return i ? v : -1;
        }
        if (p[i] < '0' || p[i] > '9') return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

static long long days_from_civil(long long y, unsigned m, unsigned d)
{
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (long long)doe - 719468;
}

static int digits(const char *p, size_t n, int *v)
{
    int x = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        x = x * 10 + (p[i] - '0');
    }
    *v = x;
    return 0;
}

/* "YYYY-MM-DD HH:MM:SS[.fffffff]" (or a plain number of seconds) -> seconds. */
static int parse_time(const char *p, size_t n, double *out)
{
    while (n && (*p == ' ' || *p == '"')) p++, n--;
    while (n && (p[n - 1] == ' ' || p[n - 1] == '"' || p[n - 1] == '\r')) n--;
    if (n >= 19 && p[4] == '-' && p[7] == '-' && (p[10] == ' ' || p[10] == 'T') && p[13] == ':' &&
        p[16] == ':') {
        int Y, M, D, h, mi, s;
        if (digits(p, 4, &Y) || digits(p + 5, 2, &M) || digits(p + 8, 2, &D) ||
            digits(p + 11, 2, &h) || digits(p + 14, 2, &mi) || digits(p + 17, 2, &s))
            return -1;
        if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || mi > 59 || s > 60) return -1;
        double frac = 0, scale = 0.1;
        size_t i = 19;
        if (i < n) {
            if (p[i] != '.') return -1;
            for (i++; i < n; i++) {
                if (p[i] < '0' || p[i] > '9') return -1;
                frac += (p[i] - '0') * scale;
                scale *= 0.1;
            }
        }
        long long days = days_from_civil(Y, (unsigned)M, (unsigned)D);
        *out = (double)(days * 86400 + h * 3600 + mi * 60 + s) + frac;
        return 0;
    }
    char tmp[64];
    if (n == 0 || n >= sizeof tmp) return -1;
    memcpy(tmp, p, n);
    tmp[n] = '\0';
    char *end;
    double v = strtod(tmp, &end);
    if (*end != '\0' || v != v) return -1;
    *out = v;
    return 0;
}

typedef struct reader {
    const char *buf, *end, *p;
    size_t line;
} reader;

/* Next non-empty line into [*s, *e); 0 at the end. */
static int next_line(reader *r, const char **s, const char **e)
{
    while (r->p < r->end) {
        const char *a = r->p, *b = a;
        while (b < r->end && *b != '\n') b++;
        r->p = b < r->end ? b + 1 : b;
        r->line++;
        const char *c = b;
        if (c > a && c[-1] == '\r') c--;
        if (c == a) continue;
        *s = a;
        *e = c;
        return 1;
    }
    return 0;
}

static int find_col(const csv_line *hdr, const char *a, const char *b)
{
    for (size_t i = 0; i < hdr->n; i++)
        if (field_is(hdr, i, a) || (b && field_is(hdr, i, b))) return (int)i;
    return -1;
}

enum { CSV_LENGTHS, CSV_AZURE, CSV_VIDUR };

static int parse_csv(const char *buf, size_t len, const char *name, tdm_sim_trace *t, int kind,
                     char *err, size_t errlen)
{
    reader r = {buf, buf + len, buf, 0};
    const char *s, *e;
    csv_line l;
    memset(t, 0, sizeof *t);
    if (!next_line(&r, &s, &e)) {
        snprintf(err, errlen, "%s:1:1: empty file (expected a header line)", name);
        return -1;
    }
    if (split(s, e, &l) != 0) {
        snprintf(err, errlen, "%s:%zu:1: too many columns in the header", name, r.line);
        return -1;
    }
    int ct, cp, co;
    const char *want;
    if (kind == CSV_AZURE) {
        ct = find_col(&l, "TIMESTAMP", "arrived_at");
        cp = find_col(&l, "ContextTokens", "num_prefill_tokens");
        co = find_col(&l, "GeneratedTokens", "num_decode_tokens");
        want = "TIMESTAMP,ContextTokens,GeneratedTokens";
    } else if (kind == CSV_VIDUR) {
        ct = find_col(&l, "arrived_at", NULL);
        cp = find_col(&l, "num_prefill_tokens", NULL);
        co = find_col(&l, "num_decode_tokens", NULL);
        want = "arrived_at,num_prefill_tokens,num_decode_tokens";
    } else {
        ct = -1;
        cp = find_col(&l, "num_prefill_tokens", "prompt_tokens");
        co = find_col(&l, "num_decode_tokens", "output_tokens");
        want = "num_prefill_tokens,num_decode_tokens";
    }
    int cs = find_col(&l, "slo_class", NULL);
    if ((kind != CSV_LENGTHS && ct < 0) || cp < 0 || co < 0) {
        snprintf(err, errlen, "%s:%zu:1: header lacks a column; expected %s", name, r.line, want);
        return -1;
    }
    size_t ncols = l.n;
    t->hash_block = 0;
    while (next_line(&r, &s, &e)) {
        if (split(s, e, &l) != 0 || l.n != ncols) {
            snprintf(err, errlen, "%s:%zu:%zu: expected %zu columns, found %s%zu", name, r.line,
                     l.n ? l.col[l.n - 1] : (size_t)1, ncols, l.n == MAX_COLS ? ">" : "", l.n);
            return -1;
        }
        tdm_sim_req q = {0};
        if (ct >= 0 && parse_time(l.f[ct], l.flen[ct], &q.arrival) != 0) {
            snprintf(err, errlen, "%s:%zu:%zu: bad timestamp '%.*s'", name, r.line, l.col[ct],
                     (int)(l.flen[ct] > 40 ? 40 : l.flen[ct]), l.f[ct]);
            return -1;
        }
        long long pv = parse_uint(l.f[cp], l.flen[cp]);
        long long ov = parse_uint(l.f[co], l.flen[co]);
        if (pv < 0 || pv > 100000000) {
            snprintf(err, errlen, "%s:%zu:%zu: bad prompt token count '%.*s'", name, r.line,
                     l.col[cp], (int)(l.flen[cp] > 40 ? 40 : l.flen[cp]), l.f[cp]);
            return -1;
        }
        if (ov < 0 || ov > 100000000) {
            snprintf(err, errlen, "%s:%zu:%zu: bad output token count '%.*s'", name, r.line,
                     l.col[co], (int)(l.flen[co] > 40 ? 40 : l.flen[co]), l.f[co]);
            return -1;
        }
        q.prompt_len = pv < 1 ? 1 : (uint32_t)pv;
        q.output_len = ov < 1 ? 1 : (uint32_t)ov;
        if (cs >= 0 && l.flen[cs]) {
            q.slo_class = tdm_sim_trace_slo_class(t, l.f[cs], l.flen[cs]);
            if (q.slo_class == UINT32_MAX) {
                snprintf(err, errlen, "%s:%zu:%zu: more than %d SLO classes", name, r.line,
                         l.col[cs], TDM_SIM_MAX_SLO_CLASSES);
                return -1;
            }
        }
        if (tdm_sim_trace_push(t, &q, NULL, 0) != 0) {
            snprintf(err, errlen, "%s:%zu: out of memory", name, r.line);
            return -1;
        }
    }
    if (t->n == 0) {
        snprintf(err, errlen, "%s:%zu:1: no data rows after the header", name, r.line + 1);
        return -1;
    }
    return 0;
}

int tdm_sim_parse_azure(const char *buf, size_t len, const char *name, tdm_sim_trace *t,
                        char *err, size_t errlen)
{
    int rc = parse_csv(buf, len, name, t, CSV_AZURE, err, errlen);
    if (rc) tdm_sim_trace_free(t);
    return rc;
}

int tdm_sim_parse_vidur(const char *buf, size_t len, const char *name, tdm_sim_trace *t,
                        char *err, size_t errlen)
{
    int rc = parse_csv(buf, len, name, t, CSV_VIDUR, err, errlen);
    if (rc) tdm_sim_trace_free(t);
    return rc;
}

int tdm_sim_parse_lengths(const char *buf, size_t len, const char *name, tdm_sim_trace *t,
                          char *err, size_t errlen)
{
    int rc = parse_csv(buf, len, name, t, CSV_LENGTHS, err, errlen);
    if (rc) tdm_sim_trace_free(t);
    return rc;
}
