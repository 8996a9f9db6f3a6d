/*
 * config.c -- deployment configs for `tandem sim`, `ab` and `sweep`. A config file is
 * either the library's scheduler JSON itself (what tdm_sched_configure takes), or a wrapper
 *   {"name": "...", "scheduler": {...},
 *    "deployment": {"instances": N, "router": "round_robin|least_load|kv_aware", "tp": T,
 *                   "hw": "h100-sxm"}}                                   (colocated) or
 *    "deployment": {"mode": "disaggregated", "router": ..., "kv_gbps": G, "kv_latency_ms": L,
 *                   "overlap_weight": W,
 *                   "prefill": {"instances", "hw", "tp", "scheduler"},
 *                   "decode":  {"instances", "hw", "tp", "scheduler"}}}
 * A pool's "scheduler" keys override the top-level "scheduler" keys. docs/simulator.md.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

void tdm_sim_config_init(tdm_sim_config *c, const tdm_sim_model *m, const tdm_sim_hw *h)
{
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "default");
    for (int i = 0; i < 2; i++) {
        c->pools[i].instances = i == 0 ? 1 : 0;
        c->pools[i].model = *m;
        c->pools[i].hw = *h;
    }
    c->router = TDM_SIM_ROUTER_LEAST_LOAD;
    c->kv_latency_s = 0;
    c->overlap_weight = 1.0;
}

void tdm_sim_config_free(tdm_sim_config *c)
{
    if (!c) return;
    for (int i = 0; i < 2; i++) {
        free(c->pools[i].sched_json);
        c->pools[i].sched_json = NULL;
    }
}

int tdm_sim_config_copy(tdm_sim_config *dst, const tdm_sim_config *src)
{
    *dst = *src;
    for (int i = 0; i < 2; i++) {
        dst->pools[i].sched_json = NULL;
        if (src->pools[i].sched_json && !(dst->pools[i].sched_json = strdup(src->pools[i].sched_json))) {
            tdm_sim_config_free(dst);
            return -1;
        }
    }
    return 0;
}

uint32_t tdm_sim_config_gpus(const tdm_sim_config *c)
{
    uint32_t g = 0;
    for (int i = 0; i < (c->disagg ? 2 : 1); i++)
        g += c->pools[i].instances * (c->pools[i].model.tp ? c->pools[i].model.tp : 1);
    return g;
}

static int parse_router(const char *s, tdm_sim_router *r)
{
    if (!strcmp(s, "round_robin") || !strcmp(s, "rr")) *r = TDM_SIM_ROUTER_ROUND_ROBIN;
    else if (!strcmp(s, "least_load") || !strcmp(s, "ll")) *r = TDM_SIM_ROUTER_LEAST_LOAD;
    else if (!strcmp(s, "kv_aware") || !strcmp(s, "kv")) *r = TDM_SIM_ROUTER_KV_AWARE;
    else return -1;
    return 0;
}

static int pool_from(json_t *p, json_t *top_sched, tdm_sim_pool *pool, const char *what,
                     char *err, size_t errlen)
{
    const char *key;
    json_t *v;
    json_object_foreach(p, key, v) {
        if (strcmp(key, "instances") && strcmp(key, "hw") && strcmp(key, "tp") &&
            strcmp(key, "scheduler") && strcmp(key, "mode") && strcmp(key, "router") &&
            strcmp(key, "kv_gbps") && strcmp(key, "kv_latency_ms") &&
            strcmp(key, "overlap_weight") && strcmp(key, "prefill") && strcmp(key, "decode") &&
            strcmp(key, "precision") && strcmp(key, "kv_cache_dtype")) {
            snprintf(err, errlen, "%s: unknown key \"%s\"", what, key);
            return -1;
        }
    }
    json_t *x = json_object_get(p, "instances");
    if (x) {
        if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > 1024) {
            snprintf(err, errlen, "%s: \"instances\" must be an integer in [1, 1024]", what);
            return -1;
        }
        pool->instances = (uint32_t)json_integer_value(x);
    }
    x = json_object_get(p, "tp");
    if (x) {
        if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > 64) {
            snprintf(err, errlen, "%s: \"tp\" must be an integer in [1, 64]", what);
            return -1;
        }
        pool->model.tp = (uint32_t)json_integer_value(x);
    }
    x = json_object_get(p, "hw");
    if (x) {
        if (!json_is_string(x)) {
            snprintf(err, errlen, "%s: \"hw\" must be a preset name or a JSON path", what);
            return -1;
        }
        char e2[TDM_SIM_ERRLEN];
        if (tdm_sim_hw_load(json_string_value(x), &pool->hw, e2, sizeof e2) != 0) {
            snprintf(err, errlen, "%s: %s", what, e2);
            return -1;
        }
    }
    x = json_object_get(p, "precision");
    if (x && (!json_is_string(x) ||
              tdm_sim_model_set_precision(&pool->model, json_string_value(x)) != 0)) {
        snprintf(err, errlen, "%s: \"precision\" must be \"bf16\" or \"fp8\"", what);
        return -1;
    }
    x = json_object_get(p, "kv_cache_dtype");
    if (x && (!json_is_string(x) ||
              tdm_sim_model_set_kv_dtype(&pool->model, json_string_value(x)) != 0)) {
        snprintf(err, errlen, "%s: \"kv_cache_dtype\" must be \"auto\", \"bf16\" or \"fp8\"", what);
        return -1;
    }
    json_t *ps = json_object_get(p, "scheduler");
    if (ps && !json_is_object(ps)) {
        snprintf(err, errlen, "%s: \"scheduler\" must be an object", what);
        return -1;
    }
    json_t *merged = top_sched ? json_deep_copy(top_sched) : json_object();
    if (!merged || (ps && json_object_update(merged, ps) != 0)) {
        json_decref(merged);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    free(pool->sched_json);
    pool->sched_json = json_object_size(merged) ? json_dumps(merged, JSON_COMPACT | JSON_SORT_KEYS)
                                                : NULL;
    json_decref(merged);
    return 0;
}

int tdm_sim_config_parse(const char *text, const char *default_name, const tdm_sim_model *m,
                         const tdm_sim_hw *h, tdm_sim_config *c, char *err, size_t errlen)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    tdm_sim_config_init(c, m, h);
    snprintf(c->name, sizeof c->name, "%s", default_name ? default_name : "config");
    if (!o || !json_is_object(o)) {
        snprintf(err, errlen, "%d:%d: %s", je.line, je.column, o ? "expected an object" : je.text);
        json_decref(o);
        return -1;
    }
    int rc = -1;
    json_t *sched = json_object_get(o, "scheduler"), *dep = json_object_get(o, "deployment");
    json_t *nm = json_object_get(o, "name");
    int wrapper = sched || dep || nm;
    if (!wrapper) sched = o;
    if (wrapper) {
        const char *key;
        json_t *v;
        json_object_foreach(o, key, v) {
            if (strcmp(key, "name") && strcmp(key, "scheduler") && strcmp(key, "deployment") &&
                strcmp(key, "description")) {
                snprintf(err, errlen, "unknown key \"%s\" (a wrapper has name, description, "
                                      "scheduler, deployment)", key);
                goto done;
            }
        }
    }
    if (nm) {
        if (!json_is_string(nm)) {
            snprintf(err, errlen, "\"name\" must be a string");
            goto done;
        }
        snprintf(c->name, sizeof c->name, "%s", json_string_value(nm));
    }
    if (sched && !json_is_object(sched)) {
        snprintf(err, errlen, "\"scheduler\" must be an object");
        goto done;
    }
    if (dep && !json_is_object(dep)) {
        snprintf(err, errlen, "\"deployment\" must be an object");
        goto done;
    }
    json_t *mode = dep ? json_object_get(dep, "mode") : NULL;
    if (mode && (!json_is_string(mode) || (strcmp(json_string_value(mode), "colocated") &&
                                           strcmp(json_string_value(mode), "disaggregated")))) {
        snprintf(err, errlen, "deployment: \"mode\" must be \"colocated\" or \"disaggregated\"");
        goto done;
    }
    c->disagg = mode && !strcmp(json_string_value(mode), "disaggregated");
    if (dep) {
        json_t *r = json_object_get(dep, "router");
        if (r && (!json_is_string(r) || parse_router(json_string_value(r), &c->router) != 0)) {
            snprintf(err, errlen, "deployment: \"router\" must be round_robin, least_load or "
                                  "kv_aware");
            goto done;
        }
        static const char *const NUMS[] = {"kv_gbps", "kv_latency_ms", "overlap_weight"};
        for (int i = 0; i < 3; i++) {
            json_t *x = json_object_get(dep, NUMS[i]);
            if (!x) continue;
            if (!json_is_number(x) || json_number_value(x) < 0 || !isfinite(json_number_value(x))) {
                snprintf(err, errlen, "deployment: \"%s\" must be a number >= 0", NUMS[i]);
                goto done;
            }
            double v = json_number_value(x);
            if (i == 0) c->kv_gbps = v;
            else if (i == 1) c->kv_latency_s = v * 1e-3;
            else c->overlap_weight = v;
        }
    }
    if (!c->disagg) {
        json_t *empty = json_object();
        json_t *p = dep ? dep : empty;
        if (json_object_get(p, "prefill") || json_object_get(p, "decode")) {
            json_decref(empty);
            snprintf(err, errlen, "deployment: prefill/decode pools need \"mode\": "
                                  "\"disaggregated\"");
            goto done;
        }
        int prc = pool_from(p, sched, &c->pools[0], "deployment", err, errlen);
        json_decref(empty);
        if (prc != 0) goto done;
    } else {
        const char *names[2] = {"prefill", "decode"};
        for (int i = 0; i < 2; i++) {
            json_t *p = json_object_get(dep, names[i]);
            if (!p || !json_is_object(p)) {
                snprintf(err, errlen, "deployment: disaggregated mode needs a \"%s\" object",
                         names[i]);
                goto done;
            }
            c->pools[i].instances = 1;
            json_t *pr = json_object_get(dep, "precision"); /* both pools; a pool may override */
            if (pr && (!json_is_string(pr) ||
                       tdm_sim_model_set_precision(&c->pools[i].model, json_string_value(pr)))) {
                snprintf(err, errlen, "deployment: \"precision\" must be \"bf16\" or \"fp8\"");
                goto done;
            }
            json_t *kd = json_object_get(dep, "kv_cache_dtype");
            if (kd && (!json_is_string(kd) ||
                       tdm_sim_model_set_kv_dtype(&c->pools[i].model, json_string_value(kd)))) {
                snprintf(err, errlen, "deployment: \"kv_cache_dtype\" must be \"auto\", \"bf16\" or \"fp8\"");
                goto done;
            }
            char what[64];
            snprintf(what, sizeof what, "deployment.%s", names[i]);
            if (pool_from(p, sched, &c->pools[i], what, err, errlen) != 0) goto done;
        }
    }
    rc = 0;
done:
    json_decref(o);
    if (rc != 0) tdm_sim_config_free(c);
    return rc;
}

int tdm_sim_config_load(const char *path, const tdm_sim_model *m, const tdm_sim_hw *h,
                        tdm_sim_config *c, char *err, size_t errlen)
{
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) {
        tdm_sim_config_init(c, m, h);
        if (je.line > 0) snprintf(err, errlen, "%s:%d:%d: %s", path, je.line, je.column, je.text);
        else snprintf(err, errlen, "%s", je.text);
        return -1;
    }
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!text) {
        tdm_sim_config_init(c, m, h);
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    /* default name: the file's base name without .json */
    char name[64];
    const char *b = strrchr(path, '/');
    snprintf(name, sizeof name, "%s", b ? b + 1 : path);
    char *dot = strstr(name, ".json");
    if (dot) *dot = '\0';
    char e2[TDM_SIM_ERRLEN];
    int rc = tdm_sim_config_parse(text, name, m, h, c, e2, sizeof e2);
    free(text);
    if (rc != 0) snprintf(err, errlen, "%s: %s", path, e2);
    return rc;
}
