/*
 * trace_jsonl.c -- readers of the JSON-lines traces: Mooncake's FAST'25 format
 * ({"timestamp": ms, "input_length", "output_length", "hash_ids": [ids of 512-token
 * blocks]}) and Tandem's own ({"arrival_s", "input_tokens", "output_tokens", optional
 * "hash_ids" (512-token blocks), "priority", "id", "slo_class" (a class name)}; see
 * docs/simulator.md). Each line is one
 * JSON object parsed with jansson; errors name the file, the line and the column.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define HASH_BLOCK 512

/* 1-based column of "key" in the line, or 1. */
static size_t key_col(const char *s, size_t n, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    size_t pl = strlen(pat);
    for (size_t i = 0; i + pl <= n; i++)
        if (!memcmp(s + i, pat, pl)) return i + 1;
    return 1;
}

static int get_uint(json_t *o, const char *key, int required, long long lo, long long hi,
                    long long *v, const char *why_name, const char *s, size_t n,
                    const char *name, size_t line, char *err, size_t errlen)
{
    json_t *x = json_object_get(o, key);
    if (!x) {
        if (!required) return 1;
        snprintf(err, errlen, "%s:%zu:1: missing key \"%s\"", name, line, key);
        return -1;
    }
    double d;
    if (json_is_integer(x)) d = (double)json_integer_value(x);
    else if (json_is_real(x)) d = json_real_value(x);
    else {
        snprintf(err, errlen, "%s:%zu:%zu: \"%s\" must be a number", name, line,
                 key_col(s, n, key), key);
        return -1;
    }
    if (!isfinite(d) || d < (double)lo || d > (double)hi || (why_name && d != floor(d))) {
        snprintf(err, errlen, "%s:%zu:%zu: \"%s\" out of range (%g)", name, line,
                 key_col(s, n, key), key, d);
        return -1;
    }
    *v = (long long)d;
    return 0;
}

void tdm_sim__jsonl_begin(tdm_sim_trace *t)
{
    memset(t, 0, sizeof *t);
    t->hash_block = HASH_BLOCK;
}

int tdm_sim__jsonl_end(tdm_sim_trace *t, const char *name, size_t line, char *err, size_t errlen)
{
    if (t->n == 0) {
        snprintf(err, errlen, "%s:%zu:1: no requests in the file", name, line ? line : 1);
        return -1;
    }
    return 0;
}

int tdm_sim_parse_jsonl(const char *buf, size_t len, const char *name, tdm_sim_fmt fmt,
                        tdm_sim_trace *t, char *err, size_t errlen)
{
    size_t line = 0;
    tdm_sim__jsonl_begin(t);
    if (tdm_sim__parse_jsonl_chunk(buf, len, name, fmt, t, &line, err, errlen) != 0 ||
        tdm_sim__jsonl_end(t, name, line, err, errlen) != 0) {
        tdm_sim_trace_free(t);
        return -1;
    }
    return 0;
}

int tdm_sim__parse_jsonl_chunk(const char *buf, size_t len, const char *name, tdm_sim_fmt fmt,
                               tdm_sim_trace *t, size_t *line_io, char *err, size_t errlen)
{
    int mooncake = fmt == TDM_SIM_FMT_MOONCAKE;
    const char *kt = mooncake ? "timestamp" : "arrival_s";
    const char *ki = mooncake ? "input_length" : "input_tokens";
    const char *ko = mooncake ? "output_length" : "output_tokens";
    const char *end = buf + len, *p = buf;
    size_t line = *line_io, hcap = 0;
    uint64_t *hash = NULL;
    while (p < end) {
        const char *s = p, *e = p;
        while (e < end && *e != '\n') e++;
        p = e < end ? e + 1 : e;
        line++;
        size_t n = (size_t)(e - s);
        while (n && (s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
        size_t lead = 0;
        while (lead < n && (s[lead] == ' ' || s[lead] == '\t')) lead++;
        if (lead == n) continue;
        json_error_t je;
        json_t *o = json_loadb(s, n, JSON_REJECT_DUPLICATES, &je);
        if (!o) {
            snprintf(err, errlen, "%s:%zu:%d: %s", name, line, je.column > 0 ? je.column : 1,
                     je.text);
            goto fail;
        }
        if (!json_is_object(o)) {
            json_decref(o);
            snprintf(err, errlen, "%s:%zu:%zu: expected a JSON object", name, line, lead + 1);
            goto fail;
        }
        const char *key;
        json_t *val;
        json_object_foreach(o, key, val) {
            if (!strcmp(key, kt) || !strcmp(key, ki) || !strcmp(key, ko) ||
                !strcmp(key, "hash_ids") || !strcmp(key, "slo_class") ||
                (!mooncake && (!strcmp(key, "priority") || !strcmp(key, "id"))))
                continue;
            if (mooncake) continue; /* tolerate extra fields in third-party files */
            snprintf(err, errlen, "%s:%zu:%zu: unknown key \"%s\"", name, line,
                     key_col(s, n, key), key);
            json_decref(o);
            goto fail;
        }
        tdm_sim_req q = {0};
        long long ii, oi, pr = 0;
        json_t *tv = json_object_get(o, kt);
        if (!tv) {
            snprintf(err, errlen, "%s:%zu:1: missing key \"%s\"", name, line, kt);
            json_decref(o);
            goto fail;
        }
        if (!json_is_number(tv) || !isfinite(json_number_value(tv)) ||
            json_number_value(tv) < 0) {
            snprintf(err, errlen, "%s:%zu:%zu: \"%s\" must be a non-negative number", name, line,
                     key_col(s, n, kt), kt);
            json_decref(o);
            goto fail;
        }
        q.arrival = json_number_value(tv) * (mooncake ? 1e-3 : 1.0);
        if (get_uint(o, ki, 1, 0, 100000000, &ii, "int", s, n, name, line, err, errlen) < 0 ||
            get_uint(o, ko, 1, 0, 100000000, &oi, "int", s, n, name, line, err, errlen) < 0 ||
            get_uint(o, "priority", 0, -2147483647LL, 2147483647LL, &pr, "int", s, n, name, line,
                     err, errlen) < 0) {
            json_decref(o);
            goto fail;
        }
        q.prompt_len = ii < 1 ? 1 : (uint32_t)ii;
        q.output_len = oi < 1 ? 1 : (uint32_t)oi;
        q.priority = (int32_t)pr;
        json_t *sc = json_object_get(o, "slo_class");
        if (sc) {
            if (!json_is_string(sc)) {
                snprintf(err, errlen, "%s:%zu:%zu: \"slo_class\" must be a string", name, line,
                         key_col(s, n, "slo_class"));
                json_decref(o);
                goto fail;
            }
            const char *cn = json_string_value(sc);
            q.slo_class = tdm_sim_trace_slo_class(t, cn, strlen(cn));
            if (q.slo_class == UINT32_MAX) {
                snprintf(err, errlen, "%s:%zu:%zu: more than %d SLO classes", name, line,
                         key_col(s, n, "slo_class"), TDM_SIM_MAX_SLO_CLASSES);
                json_decref(o);
                goto fail;
            }
        }
        uint32_t nh = 0;
        json_t *h = json_object_get(o, "hash_ids");
        if (h) {
            if (!json_is_array(h)) {
                snprintf(err, errlen, "%s:%zu:%zu: \"hash_ids\" must be an array", name, line,
                         key_col(s, n, "hash_ids"));
                json_decref(o);
                goto fail;
            }
            size_t m = json_array_size(h);
            size_t maxb = (q.prompt_len + HASH_BLOCK - 1) / HASH_BLOCK;
            if (m > maxb) m = maxb; /* ids past the prompt carry no tokens */
            if (m > hcap) {
                uint64_t *nhp = realloc(hash, m * sizeof *nhp);
                if (!nhp) {
                    json_decref(o);
                    snprintf(err, errlen, "%s:%zu: out of memory", name, line);
                    goto fail;
                }
                hash = nhp;
                hcap = m;
            }
            for (size_t k = 0; k < m; k++) {
                json_t *x = json_array_get(h, k);
                if (!json_is_integer(x) || json_integer_value(x) < 0) {
                    snprintf(err, errlen, "%s:%zu:%zu: \"hash_ids\"[%zu] must be a "
                             "non-negative integer", name, line, key_col(s, n, "hash_ids"), k);
                    json_decref(o);
                    goto fail;
                }
                hash[k] = (uint64_t)json_integer_value(x);
            }
            nh = (uint32_t)m;
        }
        json_decref(o);
        if (tdm_sim_trace_push(t, &q, hash, nh) != 0) {
            snprintf(err, errlen, "%s:%zu: out of memory", name, line);
            goto fail;
        }
    }
    free(hash);
    *line_io = line;
    return 0;
fail:
    free(hash);
    return -1;
}
