/*
 * cmd_cost.c -- `tandem cost`: the cost model as a calculator. Prints the predicted time of
 * one prefill step of P tokens and of one decode step of B requests at context C, with the
 * compute and memory terms and which one binds; --batch prices one mixed batch instead
 * (prompt chunks on cached prefixes next to decodes; sim/batchspec.c); --json for machines;
 * --calibrate prints the model's error against the measured tables in ../shared/profiles.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "../sim/sim.h"

static const char USAGE[] =
    "usage: tandem cost --model M --hw H [--tp N] [--precision bf16|fp8] --prefill P --decode-batch B\n"
    "                   --context C [--json]\n"
    "       tandem cost --model M --hw H [--tp N] [--precision bf16|fp8] --batch SPEC|JSON|@FILE [--json]\n"
    "       tandem cost --calibrate [--shared DIR] [--tables DIR] [--silicon CSV]\n"
    "                   [--silicon-rows check|fit|all] [--frontend-ms X] [--client-jitter-ms Z]\n"
    "                   [--desync-round R]\n"
    "  --silicon: aiconfigurator's silicon_sample.csv (make calibrate extracts it), replayed\n"
    "     closed loop on the tables' hardware as aiperf runs it (docs/cost_model.md: drained\n"
    "     warm-up, the measured burst kept in phase for R waves then refilled out of phase,\n"
    "     means compared), with this serving path (defaults: frontend 6.6 ms as\n"
    "     bench-vllm-serve measured it, no jitter, R = 2 as chosen on the fitting rows).\n"
    "  SPEC: comma-separated [K*]prefill:N[@C] (a chunk of N tokens on C cached tokens that ends\n"
    "     its prompt), [K*]chunk:N[@C] (a chunk mid-prompt), decode:B[@C] (B decodes at\n"
    "     context C), e.g. prefill:512@2048,decode:64@1024; JSON: [{\"kind\", \"tokens\",\n"
    "     \"context\", \"count\"}, ...]; @FILE reads that JSON from FILE.\n"
    "  M: a preset (llama-2-7b, llama-2-13b, llama-2-70b, llama-3-8b, llama-3-70b, mistral-7b,\n"
    "     opt-13b, opt-66b) or a model JSON; H: a100-80g, h100-sxm, h200 or a hardware JSON.\n";

static void terms_json(const char *key, const tdm_sim_cost_terms *t, const char *tail)
{
    printf("  \"%s\": {\"total_ms\": %.6g, \"linear_ms\": %.6g, \"linear_compute_ms\": %.6g, "
           "\"linear_memory_ms\": %.6g, \"attention_ms\": %.6g, \"attention_compute_ms\": %.6g, "
           "\"attention_memory_ms\": %.6g, \"allreduce_ms\": %.6g, \"overhead_ms\": %.6g, "
           "\"bound\": \"%s\"}%s\n",
           key, t->total_s * 1e3, t->linear_s * 1e3, t->linear_compute_s * 1e3,
           t->linear_memory_s * 1e3, (t->attn_prefill_s + t->attn_decode_s) * 1e3,
           t->attn_compute_s * 1e3, t->attn_memory_s * 1e3, t->allreduce_s * 1e3,
           t->overhead_s * 1e3, t->linear_compute_bound ? "compute" : "memory", tail);
}

static void terms_text(const char *title, const tdm_sim_cost_terms *t)
{
    printf("%s: %.3f ms\n", title, t->total_s * 1e3);
    if (t->linear_compute_s == 0 && t->linear_memory_s == 0) { /* the table model */
        printf("  linear layers   %8.3f ms  (measured GEMM and element-wise tables)\n",
               t->linear_s * 1e3);
        printf("  attention       %8.3f ms  (measured attention tables)\n",
               (t->attn_prefill_s + t->attn_decode_s) * 1e3);
        printf("  all-reduce      %8.3f ms\n", t->allreduce_s * 1e3);
        printf("  overhead        %8.3f ms\n", t->overhead_s * 1e3);
        return;
    }
    printf("  linear layers   %8.3f ms  (compute %.3f ms, weights %.3f ms: %s-bound)\n",
           t->linear_s * 1e3, t->linear_compute_s * 1e3, t->linear_memory_s * 1e3,
           t->linear_compute_bound ? "compute" : "memory");
    printf("  attention       %8.3f ms  (compute %.3f ms, KV reads %.3f ms: %s-bound)\n",
           (t->attn_prefill_s + t->attn_decode_s) * 1e3, t->attn_compute_s * 1e3,
           t->attn_memory_s * 1e3, t->attn_compute_s > t->attn_memory_s ? "compute" : "memory");
    printf("  all-reduce      %8.3f ms\n", t->allreduce_s * 1e3);
    printf("  overhead        %8.3f ms\n", t->overhead_s * 1e3);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && n < (1 << 24) && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)n + 1))) {
        if (fread(b, 1, (size_t)n, f) != (size_t)n) {
            free(b);
            b = NULL;
        } else {
            b[n] = '\0';
        }
    }
    fclose(f);
    return b;
}

/* --batch: one step of a mixed batch. */
static int cost_batch(const tdm_sim_cost *c, const char *spec, int json)
{
    char err[TDM_SIM_ERRLEN], *text = NULL;
    if (spec[0] == '@' && !(text = slurp(spec + 1))) {
        fprintf(stderr, "tandem cost: --batch: cannot read %s\n", spec + 1);
        return 2;
    }
    tdm_sim_shape sh;
    int rc = tdm_sim_batch_parse(text ? text : spec, &sh, err, sizeof err);
    free(text);
    if (rc != 0) {
        fprintf(stderr, "tandem cost: %s\n", err);
        return 2;
    }
    tdm_sim_cost_terms t;
    tdm_sim_cost_step(c, &sh, &t);
    unsigned long long tokens = (unsigned long long)(sh.prefill_tokens + sh.decode_reqs);
    if (json) {
        printf("{\n  \"model\": \"%s\", \"hw\": \"%s\", \"tp\": %u,\n  \"batch\": "
               "{\"prefill_tokens\": %llu, \"prefill_reqs\": %u, \"prefill_attn_work\": %.6g, "
               "\"prefill_kv_read_tokens\": %llu, \"decode_reqs\": %u, "
               "\"decode_context_tokens\": %llu, \"sampled_seqs\": %u, \"tokens\": %llu},\n",
               c->model.name, c->hw.name, c->model.tp, (unsigned long long)sh.prefill_tokens,
               sh.prefill_reqs, sh.prefill_attn, (unsigned long long)sh.prefill_kv_read,
               sh.decode_reqs, (unsigned long long)sh.decode_ctx, sh.emit_seqs, tokens);
        terms_json("step", &t, "");
        printf("}\n");
        return 0;
    }
    printf("model %s, tp %u, on %s\n", c->model.name, c->model.tp, c->hw.name);
    char title[192];
    snprintf(title, sizeof title, "step of %u prefill chunk%s (%llu tokens) and %u decode%s "
             "(%llu context tokens)", sh.prefill_reqs, sh.prefill_reqs == 1 ? "" : "s",
             (unsigned long long)sh.prefill_tokens, sh.decode_reqs, sh.decode_reqs == 1 ? "" : "s",
             (unsigned long long)sh.decode_ctx);
    terms_text(title, &t);
    if (t.total_s > 0) printf("  -> %.0f tokens/s through this batch\n", (double)tokens / t.total_s);
    return 0;
}

int tdm_cmd_cost(int argc, char **argv)
{
    const char *model = "llama-3-8b", *hw = "h100-sxm", *shared = NULL, *batch_spec = NULL;
    const char *precision = NULL, *tables = NULL, *silicon = NULL;
    int silicon_rows = TDM_SIM_SILICON_CHECK, desync = TDM_SIM_DESYNC_ROUND;
    double frontend_ms = TDM_SIM_FRONTEND_S * 1e3, jitter_ms = TDM_SIM_CLIENT_JITTER_S * 1e3;
    long tp = 1, prefill = 2048, batch = 64, context = 2048;
    int json = 0, calibrate = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s", USAGE);
            return 0;
        }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--calibrate")) { calibrate = 1; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "tandem cost: %s needs a value\n%s", a, USAGE);
            return 2;
        }
        const char *v = argv[++i];
        char *end;
        long n = strtol(v, &end, 10);
        int isnum = *v && !*end;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--hw")) hw = v;
        else if (!strcmp(a, "--shared")) shared = v;
        else if (!strcmp(a, "--batch")) batch_spec = v;
        else if (!strcmp(a, "--tables")) tables = v;
        else if (!strcmp(a, "--silicon")) silicon = v;
        else if (!strcmp(a, "--silicon-rows")) {
            if (!strcmp(v, "all")) silicon_rows = TDM_SIM_SILICON_ALL;
            else if (!strcmp(v, "fit")) silicon_rows = TDM_SIM_SILICON_FIT;
            else if (!strcmp(v, "check")) silicon_rows = TDM_SIM_SILICON_CHECK;
            else {
                fprintf(stderr, "tandem cost: --silicon-rows: all, fit or check\n");
                return 2;
            }
        } else if (!strcmp(a, "--client-jitter-ms")) {
            char *e2;
            jitter_ms = strtod(v, &e2);
            if (*e2 || !(jitter_ms >= 0 && jitter_ms < 1e5)) {
                fprintf(stderr, "tandem cost: --client-jitter-ms: bad value '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--desync-round")) {
            if (!isnum || n < 1 || n > 1000) {
                fprintf(stderr, "tandem cost: --desync-round: bad value '%s' (a whole number of "
                                "waves, 1 to 1000)\n", v);
                return 2;
            }
            desync = (int)n;
        } else if (!strcmp(a, "--frontend-ms")) {
            char *e2;
            frontend_ms = strtod(v, &e2);
            if (*e2 || !(frontend_ms >= 0 && frontend_ms < 1e4)) {
                fprintf(stderr, "tandem cost: --frontend-ms: bad value '%s'\n", v);
                return 2;
            }
        }
        else if (!strcmp(a, "--precision")) precision = v;
        else if (!isnum || n < 0 || n > 100000000) {
            fprintf(stderr, "tandem cost: %s: bad value '%s'\n", a, v);
            return 2;
        } else if (!strcmp(a, "--tp") && n >= 1 && n <= 64) tp = n;
        else if (!strcmp(a, "--prefill")) prefill = n;
        else if (!strcmp(a, "--decode-batch")) batch = n;
        else if (!strcmp(a, "--context")) context = n;
        else {
            fprintf(stderr, "tandem cost: unknown or out-of-range option %s %s\n%s", a, v, USAGE);
            return 2;
        }
    }
    if (calibrate) {
        if (!shared) shared = getenv("TANDEM_SHARED");
        if (!shared) shared = "../shared";
        tdm_sim_calib cal;
        int n = tdm_sim_calibrate(shared, stdout, &cal);
        if (n <= 0) {
            fprintf(stderr, "tandem cost: no profile tables under %s/profiles\n", shared);
            return 1;
        }
        tdm_sim_calib_table ct;
        tdm_sim_calibrate_table(shared, tables, stdout, &ct);
        tdm_sim_calibrate_silicon(silicon, tables, frontend_ms / 1e3, jitter_ms / 1e3, desync,
                                  silicon_rows, stdout, &ct);
        tdm_sim_calib_table_line(stdout, &ct);
        return 0;
    }
    char err[TDM_SIM_ERRLEN];
    tdm_sim_model m;
    tdm_sim_hw h;
    if (tdm_sim_model_load(model, &m, err, sizeof err) != 0 ||
        tdm_sim_hw_load(hw, &h, err, sizeof err) != 0) {
        fprintf(stderr, "tandem cost: %s\n", err);
        return 2;
    }
    m.tp = (uint32_t)tp;
    if (precision && tdm_sim_model_set_precision(&m, precision) != 0) {
        fprintf(stderr, "tandem cost: --precision must be bf16 or fp8\n");
        return 2;
    }
    tdm_sim_cost c;
    tdm_sim_cost_init(&c, &m, &h);
    if (batch_spec) return cost_batch(&c, batch_spec, json);
    tdm_sim_shape ps = {0}, ds = {0};
    ps.prefill_tokens = (uint64_t)prefill;
    ps.prefill_reqs = prefill > 0;
    ps.emit_seqs = prefill > 0;
    ps.prefill_attn = (double)prefill * (prefill / 2.0);
    ps.prefill_kv_read = (uint64_t)prefill;
    ds.decode_reqs = (uint32_t)batch;
    ds.emit_seqs = (uint32_t)batch;
    ds.decode_ctx = (uint64_t)batch * (uint64_t)context;
    tdm_sim_cost_terms pt, dt;
    tdm_sim_cost_step(&c, &ps, &pt);
    tdm_sim_cost_step(&c, &ds, &dt);
    double kvb = tdm_sim_model_kv_bytes_per_token(&m);
    if (json) {
        printf("{\n  \"model\": \"%s\", \"hw\": \"%s\", \"tp\": %ld, \"params\": %.6g, "
               "\"kv_bytes_per_token\": %.6g,\n  \"prefill_tokens\": %ld, \"decode_batch\": %ld, "
               "\"context\": %ld,\n",
               m.name, h.name, tp, tdm_sim_model_params(&m), kvb, prefill, batch, context);
        terms_json("prefill", &pt, ",");
        terms_json("decode", &dt, "");
        printf("}\n");
        return 0;
    }
    printf("model %s (%.2f B params, %.0f KiB KV/token, %s), tp %ld, on %s (%.0f TFLOP/s x %.2f, "
           "%.0f GB/s x %.2f, overhead %.0f us%s)\n",
           m.name, tdm_sim_model_params(&m) / 1e9, kvb / 1024, tdm_sim_model_precision(&m), tp,
           h.name, h.peak_tflops, h.eff_compute, h.hbm_gbps, h.eff_memory, h.step_overhead_us,
           h.cost_model == TDM_SIM_COST_TABLE ? "; table cost model" : "");
    char title[128];
    snprintf(title, sizeof title, "prefill step of %ld tokens", prefill);
    terms_text(title, &pt);
    snprintf(title, sizeof title, "decode step of %ld requests at context %ld", batch, context);
    terms_text(title, &dt);
    if (dt.total_s > 0)
        printf("  -> %.1f output tokens/s per instance at this batch\n", batch / dt.total_s);
    return 0;
}
