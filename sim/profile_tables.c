/*
 * profile_tables.c -- `tandem profile --tables DIR`: the measurements of a hardware JSON
 * written by kernels/profile.cu ("measured": {"prefill": [...], "decode": [...],
 * "attention": [...]}) turned into the table cost model's files: DIR/gemm.txt (every
 * measured GEMM: m = tokens or batch, n, k), DIR/attn_generation.txt (the decode-attention
 * kernel's (batch, context) points at the profiled model's heads per rank) and DIR/hw.json,
 * the same hardware with "cost_model": "table" naming them. A shape measured twice keeps
 * the geometric mean of its times.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sim.h"

static int add_list(json_t *list, const char *mkey, tdm_sim_table *g)
{
    size_t i;
    json_t *e;
    int n = 0;
    json_array_foreach(list, i, e) {
        json_t *m = json_object_get(e, mkey), *nn = json_object_get(e, "n"),
               *k = json_object_get(e, "k"), *us = json_object_get(e, "us");
        if (!json_is_number(m) || !json_is_number(nn) || !json_is_number(k) || !json_is_number(us))
            return -1;
        double key[3] = {json_number_value(nn), json_number_value(k), json_number_value(m)};
        if (tdm_sim_table_add(g, TDM_SIM_DT_BF16, key, json_number_value(us))) return -1;
        n++;
    }
    return n;
}

int tdm_sim_profile_to_tables(const char *hw_json, const char *dir, uint32_t heads,
                              uint32_t kv_heads, uint32_t head_dim, uint32_t tp, char *err,
                              size_t errlen)
{
    json_error_t je;
    json_t *o = json_loads(hw_json, 0, &je);
    json_t *ms = o ? json_object_get(o, "measured") : NULL;
    tdm_sim_table g, a;
    tdm_sim_table_init(&g, TDM_SIM_OP_GEMM, "gemm");
    tdm_sim_table_init(&a, TDM_SIM_OP_ATTN_GEN, "attn_generation");
    int rc = -1;
    char path[1024];
    if (!json_is_object(ms) || !tp || !heads || !head_dim) {
        snprintf(err, errlen, "profile JSON: %s", o ? "no \"measured\" object" : je.text);
        goto done;
    }
    json_t *pf = json_object_get(ms, "prefill"), *dc = json_object_get(ms, "decode"),
           *at = json_object_get(ms, "attention");
    if (!json_is_array(pf) || !json_is_array(dc) || add_list(pf, "tokens", &g) < 0 ||
        add_list(dc, "batch", &g) < 0) {
        snprintf(err, errlen, "profile JSON: \"measured\" needs \"prefill\" and \"decode\" lists "
                 "of {tokens|batch, n, k, us} with positive values");
        goto done;
    }
    if (tdm_sim_table_merge(&g) != 0) {
        snprintf(err, errlen, "profile JSON: no GEMM was measured");
        goto done;
    }
    double h = (double)heads / tp, kv = kv_heads >= tp ? (double)kv_heads / tp : 1;
    size_t i;
    json_t *e;
    json_array_foreach(at, i, e) {
        json_t *b = json_object_get(e, "batch"), *c = json_object_get(e, "context"),
               *us = json_object_get(e, "us");
        double key[5] = {h, kv, head_dim, json_number_value(b), json_number_value(c)};
        if (!json_is_number(b) || !json_is_number(c) || !json_is_number(us) ||
            tdm_sim_table_add(&a, TDM_SIM_DT_BF16, key, json_number_value(us))) {
            snprintf(err, errlen, "profile JSON: \"attention\" entries need positive batch, "
                     "context and us");
            goto done;
        }
    }
    snprintf(path, sizeof path, "%s/gemm.txt", dir);
    if (tdm_sim_table_write(&g, path, "tandem profile", err, errlen) != 0) goto done;
    json_t *tables = json_object();
    json_object_set_new(o, "cost_model", json_string("table"));
    json_object_set_new(o, "tables", tables);
    json_object_set_new(tables, "gemm", json_string("gemm.txt"));
    if (a.n && tdm_sim_table_merge(&a) == 0) {
        snprintf(path, sizeof path, "%s/attn_generation.txt", dir);
        if (tdm_sim_table_write(&a, path, "tandem profile", err, errlen) != 0) goto done;
        json_object_set_new(tables, "attn_generation", json_string("attn_generation.txt"));
    }
    snprintf(path, sizeof path, "%s/hw.json", dir);
    if (json_dump_file(o, path, JSON_INDENT(2)) != 0) {
        snprintf(err, errlen, "%s: cannot write", path);
        goto done;
    }
    rc = 0;
done:
    tdm_sim_table_free(&g);
    tdm_sim_table_free(&a);
    json_decref(o);
    return rc;
}
