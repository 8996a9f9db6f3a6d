/*
 * model.c -- model and hardware descriptions for the cost model: the presets (Llama-2
 * 7B/13B/70B, Llama-3 and Llama-3.1 8B/70B, Mistral-7B, and OPT-13B/66B for the DistServe calibration;
 * A100-80G, H100-SXM, H200) and their JSON forms. The hardware JSON is the format
 * `tandem profile` writes: {"name", "peak_tflops", "hbm_gbps", "eff_compute", "eff_memory",
 * "step_overhead_us", "interconnect_gbps", optional "mem_gib", optional "measured"}, plus
 * optional "peak_fp8_tflops", optional "time_scale" (every step's time multiplied by it: an
 * engine measured running faster or slower than its fit) and the table model's "cost_model":
 * "table" with "tables": {"gemm": path, "attn_context": path, ...} (paths relative to the JSON
 * file).
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

typedef struct model_row {
    const char *name;
    uint32_t layers, hidden, heads, kv_heads, head_dim, ffn, vocab, gated, max_len;
} model_row;

static const model_row MODELS[] = {
    {"llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 1, 4096},
    {"llama-2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 1, 4096},
    {"llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000, 1, 4096},
    {"llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 1, 8192},
    {"llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256, 1, 8192},
    {"llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 1, 131072},
    {"llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 1, 131072},
    {"mistral-7b", 32, 4096, 32, 8, 128, 14336, 32000, 1, 32768},
    {"opt-13b", 40, 5120, 40, 40, 128, 20480, 50272, 0, 2048},
    {"opt-66b", 64, 9216, 72, 72, 128, 36864, 50272, 0, 2048},
};

/* Efficiencies from the Vidur per-operator profiles (papers_traces.md 2.5): decode GEMMs
 * reach 75-78% of HBM bandwidth, prefill GEMMs 68-75% of dense peak; the per-step overhead
 * is fitted to DistServe's A100 decode intercepts and Splitwise's H100 tables
 * (docs/cost_model.md). */
static const tdm_sim_hw HWS[] = {
    {"a100-80g", 312.0, 2039.0, 0.70, 0.75, 2500.0, 300.0, 80.0, 0.0, 0, NULL, 1.0},
    {"h100-sxm", 989.0, 3350.0, 0.74, 0.78, 1000.0, 450.0, 80.0, 1979.0, 0, NULL, 1.0},
    {"h200", 989.0, 4800.0, 0.74, 0.78, 1000.0, 450.0, 141.0, 1979.0, 0, NULL, 1.0},
};

const char *tdm_sim_model_names(void)
{
    return "llama-2-7b, llama-2-13b, llama-2-70b, llama-3-8b, llama-3-70b, llama-3.1-8b, "
           "llama-3.1-70b, mistral-7b, opt-13b, opt-66b";
}

const char *tdm_sim_hw_names(void) { return "a100-80g, h100-sxm, h200"; }

int tdm_sim_model_preset(const char *name, tdm_sim_model *m)
{
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) {
        const model_row *r = &MODELS[i];
        if (strcmp(name, r->name) != 0) continue;
        memset(m, 0, sizeof *m);
        snprintf(m->name, sizeof m->name, "%s", r->name);
        m->layers = r->layers;
        m->hidden = r->hidden;
        m->heads = r->heads;
        m->kv_heads = r->kv_heads;
        m->head_dim = r->head_dim;
        m->ffn = r->ffn;
        m->vocab = r->vocab;
        m->gated = r->gated;
        m->max_len = r->max_len;
        m->tp = 1;
        m->bytes_per_param = 2;
        m->bytes_per_kv = 2;
        return 0;
    }
    return -1;
}

int tdm_sim_hw_preset(const char *name, tdm_sim_hw *h)
{
    for (size_t i = 0; i < sizeof HWS / sizeof HWS[0]; i++)
        if (!strcmp(name, HWS[i].name)) {
            *h = HWS[i];
            return 0;
        }
    if (!strcmp(name, "a100") || !strcmp(name, "a100-80gb")) return tdm_sim_hw_preset("a100-80g", h);
    if (!strcmp(name, "h100") || !strcmp(name, "h100-80gb")) return tdm_sim_hw_preset("h100-sxm", h);
    return -1;
}

double tdm_sim_model_layer_params(const tdm_sim_model *m)
{
    double H = m->hidden, q = (double)m->heads * m->head_dim, kv = (double)m->kv_heads * m->head_dim;
    return H * q + 2.0 * H * kv + q * H + (m->gated ? 3.0 : 2.0) * H * m->ffn;
}

double tdm_sim_model_params(const tdm_sim_model *m)
{
    return m->layers * tdm_sim_model_layer_params(m) + 2.0 * m->vocab * (double)m->hidden;
}

double tdm_sim_model_kv_bytes_per_token(const tdm_sim_model *m)
{
    return 2.0 * m->layers * m->kv_heads * (double)m->head_dim * m->bytes_per_kv;
}

static int json_num(json_t *o, const char *key, double *v, int required, const char *what,
                    char *err, size_t errlen)
{
    json_t *x = json_object_get(o, key);
    if (!x) {
        if (required) snprintf(err, errlen, "%s: missing key \"%s\"", what, key);
        return required ? -1 : 1;
    }
    if (!json_is_number(x) || !isfinite(json_number_value(x))) {
        snprintf(err, errlen, "%s: \"%s\" must be a number", what, key);
        return -1;
    }
    *v = json_number_value(x);
    return 0;
}

static int load_text(const char *path, char **out, char *err, size_t errlen)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) {
        if (je.line > 0) snprintf(err, errlen, "%s:%d:%d: %s", path, je.line, je.column, je.text);
        else snprintf(err, errlen, "%s", je.text);
        return -1;
    }
    *out = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!*out) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    return 0;
}

int tdm_sim_model_from_json(const char *text, tdm_sim_model *out, char *err, size_t errlen)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    if (!o || !json_is_object(o)) {
        snprintf(err, errlen, "model JSON:%d:%d: %s", je.line, je.column,
                 o ? "expected an object" : je.text);
        json_decref(o);
        return -1;
    }
    /* Our names first, then Hugging Face config.json aliases. */
    static const struct { const char *key, *alias; int req; } K[] = {
        {"layers", "num_hidden_layers", 1},      {"hidden_size", "hidden", 1},
        {"heads", "num_attention_heads", 1},     {"kv_heads", "num_key_value_heads", 0},
        {"head_dim", NULL, 0},                   {"intermediate_size", "ffn_dim", 1},
        {"vocab_size", "vocab", 1},              {"bytes_per_param", NULL, 0},
        {"bytes_per_kv", NULL, 0},               {"tp", "tensor_parallel", 0},
        {"max_len", "max_position_embeddings", 0},
    };
    double v[sizeof K / sizeof K[0]];
    tdm_sim_model m;
    memset(&m, 0, sizeof m);
    int rc = -1;
    for (size_t i = 0; i < sizeof K / sizeof K[0]; i++) {
        v[i] = -1;
        int r = json_num(o, K[i].key, &v[i], 0, "model JSON", err, errlen);
        if (r < 0) goto done;
        if (r == 1 && K[i].alias) {
            r = json_num(o, K[i].alias, &v[i], 0, "model JSON", err, errlen);
            if (r < 0) goto done;
        }
        if (r == 1 && K[i].req) {
            snprintf(err, errlen, "model JSON: missing key \"%s\"", K[i].key);
            goto done;
        }
        if (r == 0 && (v[i] <= 0 || v[i] > 1e9)) {
            snprintf(err, errlen, "model JSON: \"%s\" out of range (%g)", K[i].key, v[i]);
            goto done;
        }
    }
    json_t *nm = json_object_get(o, "name");
    snprintf(m.name, sizeof m.name, "%s", json_is_string(nm) ? json_string_value(nm) : "custom");
    m.layers = (uint32_t)v[0];
    m.hidden = (uint32_t)v[1];
    m.heads = (uint32_t)v[2];
    m.kv_heads = v[3] > 0 ? (uint32_t)v[3] : m.heads;
    m.head_dim = v[4] > 0 ? (uint32_t)v[4] : m.hidden / m.heads;
    m.ffn = (uint32_t)v[5];
    m.vocab = (uint32_t)v[6];
    m.bytes_per_param = v[7] > 0 ? v[7] : 2;
    m.bytes_per_kv = v[8] > 0 ? v[8] : 2;
    m.tp = v[9] > 0 ? (uint32_t)v[9] : 1;
    m.max_len = v[10] > 0 ? (uint32_t)v[10] : 8192;
    json_t *g = json_object_get(o, "gated_mlp");
    m.gated = g ? json_is_true(g) : 1;
    if (m.kv_heads > m.heads || m.head_dim == 0) {
        snprintf(err, errlen, "model JSON: kv_heads must be <= heads and head_dim > 0");
        goto done;
    }
    *out = m;
    rc = 0;
done:
    json_decref(o);
    return rc;
}

int tdm_sim_model_set_precision(tdm_sim_model *m, const char *p)
{
    if (!m || !p) return -1;
    if (!strcmp(p, "bf16") || !strcmp(p, "fp16")) m->bytes_per_param = 2;
    else if (!strcmp(p, "fp8")) m->bytes_per_param = 1;
    else return -1;
    return 0;
}

int tdm_sim_model_set_kv_dtype(tdm_sim_model *m, const char *d)
{
    if (!m || !d) return -1;
    /* "auto": the model's activation dtype, bf16 here (vLLM's --kv-cache-dtype auto) */
    if (!strcmp(d, "auto") || !strcmp(d, "bf16") || !strcmp(d, "fp16")) m->bytes_per_kv = 2;
    else if (!strcmp(d, "fp8") || !strcmp(d, "fp8_e4m3") || !strcmp(d, "fp8_e5m2")) m->bytes_per_kv = 1;
    else return -1;
    return 0;
}

const char *tdm_sim_model_precision(const tdm_sim_model *m)
{
    return m->bytes_per_param <= 1 ? "fp8" : "bf16";
}

/* "cost_model" and "tables" of a hardware JSON into h (tables through the cache). */
static int hw_tables(json_t *o, const char *dir, tdm_sim_hw *h, char *err, size_t errlen)
{
    json_t *cm = json_object_get(o, "cost_model"), *tb = json_object_get(o, "tables");
    h->cost_model = TDM_SIM_COST_ROOFLINE;
    h->tables = NULL;
    if (cm && (!json_is_string(cm) || (strcmp(json_string_value(cm), "roofline") &&
                                        strcmp(json_string_value(cm), "table")))) {
        snprintf(err, errlen, "hardware JSON: \"cost_model\" must be \"roofline\" or \"table\"");
        return -1;
    }
    int table = cm && !strcmp(json_string_value(cm), "table");
    if (tb && !json_is_object(tb)) {
        snprintf(err, errlen, "hardware JSON: \"tables\" must be an object {op: path}");
        return -1;
    }
    if (!table) return 0;
    if (!tb) {
        snprintf(err, errlen, "hardware JSON: \"cost_model\": \"table\" needs \"tables\"");
        return -1;
    }
    const char *paths[TDM_SIM_OP_COUNT] = {0};
    const char *key;
    json_t *val;
    json_object_foreach(tb, key, val) {
        tdm_sim_op op;
        if (tdm_sim_op_from_name(key, &op) || !json_is_string(val)) {
            snprintf(err, errlen, "hardware JSON: \"tables\": \"%s\" must be one of gemm, "
                     "attn_context, attn_generation, allreduce, elementwise with a path", key);
            return -1;
        }
        paths[op] = json_string_value(val);
    }
    char e2[TDM_SIM_ERRLEN];
    h->tables = tdm_sim_tableset_get(paths, dir, e2, sizeof e2);
    if (!h->tables) {
        snprintf(err, errlen, "hardware JSON: %s", e2);
        return -1;
    }
    h->cost_model = TDM_SIM_COST_TABLE;
    return 0;
}

static int hw_parse(const char *text, const char *dir, tdm_sim_hw *out, char *err, size_t errlen);

int tdm_sim_hw_from_json(const char *text, tdm_sim_hw *out, char *err, size_t errlen)
{
    return hw_parse(text, NULL, out, err, errlen);
}

static int hw_parse(const char *text, const char *dir, tdm_sim_hw *out, char *err, size_t errlen)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    if (!o || !json_is_object(o)) {
        snprintf(err, errlen, "hardware JSON:%d:%d: %s", je.line, je.column,
                 o ? "expected an object" : je.text);
        json_decref(o);
        return -1;
    }
    static const char *const KEYS[] = {"peak_tflops", "hbm_gbps", "eff_compute", "eff_memory",
                                       "step_overhead_us", "interconnect_gbps", "mem_gib"};
    double v[7] = {0};
    int rc = -1;
    const char *key;
    json_t *val;
    json_object_foreach(o, key, val) {
        int ok = !strcmp(key, "name") || !strcmp(key, "measured") ||
                 !strcmp(key, "cost_model") || !strcmp(key, "tables") ||
                 !strcmp(key, "peak_fp8_tflops") || !strcmp(key, "source") ||
                 !strcmp(key, "time_scale");
        for (size_t i = 0; i < 7; i++) ok |= !strcmp(key, KEYS[i]);
        if (!ok) {
            snprintf(err, errlen, "hardware JSON: unknown key \"%s\"", key);
            goto done;
        }
    }
    for (size_t i = 0; i < 7; i++) {
        int r = json_num(o, KEYS[i], &v[i], i < 6, "hardware JSON", err, errlen);
        if (r < 0) goto done;
        if (r == 0 && (v[i] < 0 || v[i] > 1e9 || (i < 4 && v[i] == 0))) {
            snprintf(err, errlen, "hardware JSON: \"%s\" out of range (%g)", KEYS[i], v[i]);
            goto done;
        }
    }
    if (v[2] > 1 || v[3] > 1) {
        snprintf(err, errlen, "hardware JSON: efficiencies must be in (0, 1]");
        goto done;
    }
    tdm_sim_hw h;
    memset(&h, 0, sizeof h);
    json_t *nm = json_object_get(o, "name");
    if (nm && !json_is_string(nm)) {
        snprintf(err, errlen, "hardware JSON: \"name\" must be a string");
        goto done;
    }
    snprintf(h.name, sizeof h.name, "%s", nm ? json_string_value(nm) : "custom");
    h.peak_tflops = v[0];
    h.hbm_gbps = v[1];
    h.eff_compute = v[2];
    h.eff_memory = v[3];
    h.step_overhead_us = v[4];
    h.interconnect_gbps = v[5];
    h.mem_gib = v[6];
    /* `tandem profile` records the device memory under "measured" */
    json_t *ms = json_object_get(o, "measured");
    json_t *mg = json_is_object(ms) ? json_object_get(ms, "memory_gib") : NULL;
    if (h.mem_gib <= 0 && json_is_number(mg) && json_number_value(mg) > 0 &&
        json_number_value(mg) < 1e6)
        h.mem_gib = json_number_value(mg);
    double f8 = 0;
    if (json_num(o, "peak_fp8_tflops", &f8, 0, "hardware JSON", err, errlen) < 0) goto done;
    if (f8 < 0 || f8 > 1e9) {
        snprintf(err, errlen, "hardware JSON: \"peak_fp8_tflops\" out of range (%g)", f8);
        goto done;
    }
    h.peak_fp8_tflops = f8;
    double ts = 0;
    int has_ts = json_num(o, "time_scale", &ts, 0, "hardware JSON", err, errlen);
    if (has_ts < 0) goto done;
    if (has_ts == 0 && !(ts > 0 && ts <= 1000)) {
        snprintf(err, errlen, "hardware JSON: \"time_scale\" must be in (0, 1000] (%g)", ts);
        goto done;
    }
    h.time_scale = ts;
    if (hw_tables(o, dir, &h, err, errlen) != 0) goto done;
    *out = h;
    rc = 0;
done:
    json_decref(o);
    return rc;
}

int tdm_sim_model_load(const char *s, tdm_sim_model *m, char *err, size_t errlen)
{
    if (tdm_sim_model_preset(s, m) == 0) return 0;
    if (!strstr(s, ".json") && !strchr(s, '/')) {
        snprintf(err, errlen, "unknown model '%s' (presets: %s; or a JSON file)", s,
                 tdm_sim_model_names());
        return -1;
    }
    char *text;
    if (load_text(s, &text, err, errlen) != 0) return -1;
    int rc = tdm_sim_model_from_json(text, m, err, errlen);
    free(text);
    return rc;
}

int tdm_sim_hw_load(const char *s, tdm_sim_hw *h, char *err, size_t errlen)
{
    if (tdm_sim_hw_preset(s, h) == 0) return 0;
    if (!strstr(s, ".json") && !strchr(s, '/')) {
        snprintf(err, errlen, "unknown hardware '%s' (presets: %s; or a JSON file)", s,
                 tdm_sim_hw_names());
        return -1;
    }
    char *text;
    if (load_text(s, &text, err, errlen) != 0) return -1;
    char dir[512];
    snprintf(dir, sizeof dir, "%s", s);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    int rc = hw_parse(text, dir, h, err, errlen);
    free(text);
    return rc;
}
