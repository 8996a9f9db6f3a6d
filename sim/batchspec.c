/*
 * batchspec.c -- the batch a `tandem cost --batch` prices, as the shape the cost model
 * takes. Two spellings of the same thing:
 *   a spec   "prefill:512@2048,chunk:1024,decode:64@1024,4*prefill:128"
 *            prefill:N[@C]  a prompt chunk of N tokens on C tokens already in the KV cache
 *                           (a prefix-cache hit or earlier chunks) that ends its prompt, so
 *                           it samples a token; chunk:N[@C] the same chunk mid-prompt (no
 *                           token sampled); decode:B[@C] B decodes at context C each;
 *                           K*item repeats an item K times
 *   JSON     [{"kind": "prefill"|"chunk"|"decode", "tokens": N (prefill/chunk),
 *              "context": C, "count": K (decode: the batch)}, ...]
 * Errors name the item; nothing here allocates beyond jansson's parse of the JSON form.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define MAX_TOKENS 100000000.0

static void add_item(tdm_sim_shape *sh, int kind, double count, double tokens, double ctx)
{
    if (kind == 'd') {
        sh->decode_reqs += (uint32_t)count;
        sh->emit_seqs += (uint32_t)count;
        sh->decode_ctx += (uint64_t)(count * ctx);
        return;
    }
    sh->prefill_tokens += (uint64_t)(count * tokens);
    sh->prefill_reqs += (uint32_t)count;
    sh->prefill_attn += count * tokens * (ctx + tokens / 2.0);
    sh->prefill_kv_read += (uint64_t)(count * (ctx + tokens));
    if (kind == 'p') sh->emit_seqs += (uint32_t)count;
}

static int kind_of(const char *s, size_t n)
{
    if (n == 7 && !strncmp(s, "prefill", 7)) return 'p';
    if (n == 5 && !strncmp(s, "chunk", 5)) return 'c';
    if (n == 6 && !strncmp(s, "decode", 6)) return 'd';
    return 0;
}

/* A whole non-negative number in [lo, hi] from [s, e); -1 when malformed. */
static double whole(const char *s, const char *e, double lo, double hi)
{
    if (s >= e || e - s > 12) return -1;
    double v = 0;
    for (const char *p = s; p < e; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
    }
    return v >= lo && v <= hi ? v : -1;
}

static int parse_spec(const char *spec, tdm_sim_shape *sh, char *err, size_t errlen)
{
    const char *p = spec;
    int item = 0;
    while (*p) {
        item++;
        const char *e = strchr(p, ',');
        if (!e) e = p + strlen(p);
        const char *s = p, *star = memchr(s, '*', (size_t)(e - s));
        double count = 1;
        if (star) {
            count = whole(s, star, 1, 1e6);
            s = star + 1;
        }
        const char *colon = memchr(s, ':', (size_t)(e - s));
        const char *at = colon ? memchr(colon, '@', (size_t)(e - colon)) : NULL;
        int kind = colon ? kind_of(s, (size_t)(colon - s)) : 0;
        double n = colon ? whole(colon + 1, at ? at : e, 1, kind == 'd' ? 1e6 : MAX_TOKENS) : -1;
        double ctx = at ? whole(at + 1, e, 0, MAX_TOKENS) : 0;
        if (count < 0 || !kind || n < 0 || ctx < 0) {
            snprintf(err, errlen, "--batch item %d '%.*s': expected [K*]prefill:N[@C], "
                     "[K*]chunk:N[@C] or decode:B[@C] (whole numbers)", item,
                     (int)(e - p > 60 ? 60 : e - p), p);
            return -1;
        }
        if (kind == 'd') add_item(sh, 'd', count * n, 1, ctx);
        else add_item(sh, kind, count, n, ctx);
        p = *e ? e + 1 : e;
    }
    if (item == 0) {
        snprintf(err, errlen, "--batch: empty");
        return -1;
    }
    return 0;
}

static int json_whole(json_t *o, const char *key, double lo, double hi, double def, double *v)
{
    json_t *x = json_object_get(o, key);
    if (!x) {
        *v = def;
        return def >= 0 ? 0 : -1;
    }
    if (!json_is_integer(x)) return -1;
    *v = (double)json_integer_value(x);
    return *v >= lo && *v <= hi ? 0 : -1;
}

static int parse_json(const char *text, tdm_sim_shape *sh, char *err, size_t errlen)
{
    json_error_t je;
    json_t *a = json_loads(text, 0, &je);
    if (!a || !json_is_array(a) || json_array_size(a) == 0) {
        if (!a) snprintf(err, errlen, "--batch JSON:%d:%d: %s", je.line, je.column, je.text);
        else snprintf(err, errlen, "--batch JSON: expected a non-empty array of items");
        json_decref(a);
        return -1;
    }
    size_t i;
    json_t *o;
    json_array_foreach(a, i, o) {
        json_t *k = json_object_get(o, "kind");
        int kind = k && json_is_string(k) ? kind_of(json_string_value(k), strlen(json_string_value(k))) : 0;
        const char *key;
        json_t *v;
        int bad = !json_is_object(o) || !kind;
        if (!bad)
            json_object_foreach(o, key, v)
                if (strcmp(key, "kind") && strcmp(key, "tokens") && strcmp(key, "context") &&
                    strcmp(key, "count"))
                    bad = 1;
        double n = 1, ctx = 0, count = 1;
        if (!bad)
            bad = (kind != 'd' && json_whole(o, "tokens", 1, MAX_TOKENS, -1, &n) != 0) ||
                  (kind == 'd' && json_object_get(o, "tokens")) ||
                  json_whole(o, "context", 0, MAX_TOKENS, 0, &ctx) != 0 ||
                  json_whole(o, "count", 1, 1e6, 1, &count) != 0;
        if (bad) {
            snprintf(err, errlen, "--batch JSON item %zu: expected {\"kind\": \"prefill\"|\"chunk\""
                     "|\"decode\", \"tokens\": N (not for decode), \"context\": C, \"count\": K}", i);
            json_decref(a);
            return -1;
        }
        add_item(sh, kind, count, n, ctx);
    }
    json_decref(a);
    return 0;
}

int tdm_sim_batch_parse(const char *spec, tdm_sim_shape *sh, char *err, size_t errlen)
{
    memset(sh, 0, sizeof *sh);
    if (!spec) {
        snprintf(err, errlen, "--batch: empty");
        return -1;
    }
    const char *p = spec;
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    int rc = *p == '[' ? parse_json(p, sh, err, errlen) : parse_spec(p, sh, err, errlen);
    if (rc != 0) memset(sh, 0, sizeof *sh);
    return rc;
}
