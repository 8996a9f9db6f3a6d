/*
 * cmd_profile.c -- `tandem profile --model M [--out FILE] [--tp N] [--reps N]
 * [--max-tokens N] [--max-batch N] [--tables DIR]`: measures the GPU's GEMM rates at the model's prefill
 * and decode shapes, its memory bandwidth, a decode-attention KV read rate and the launch
 * overhead with cuBLAS (tdm_cuda_profile, in libtandem_cuda.so), and writes the hardware
 * JSON that `tandem sim` reads; --tables DIR also writes the measurements as tables of the
 * table cost model (DIR/gemm.txt, DIR/attn_generation.txt, DIR/hw.json). Exit status: 0 done, 1 CUDA error, 2 usage, 3 no GPU
 * (or no libtandem_cuda.so). The model presets are the shapes of their HF configs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sim/sim.h"
#include "commands.h"
#include "tandem.h"

int tdm_cmd_profile(int argc, char **argv);

struct preset {
    const char *name;
    uint32_t hidden, intermediate, heads, kv_heads, head_dim, layers, vocab;
};

static const struct preset presets[] = {
    {"llama-2-7b", 4096, 11008, 32, 32, 128, 32, 32000},
    {"llama-2-13b", 5120, 13824, 40, 40, 128, 40, 32000},
    {"llama-2-70b", 8192, 28672, 64, 8, 128, 80, 32000},
    {"llama-3-8b", 4096, 14336, 32, 8, 128, 32, 128256},
    {"llama-3-70b", 8192, 28672, 64, 8, 128, 80, 128256},
    {"mistral-7b", 4096, 14336, 32, 8, 128, 32, 32000},
};

static void usage(FILE *o)
{
    fprintf(o, "usage: tandem profile --model M [--out FILE] [--tp N] [--reps N] "
               "[--max-tokens N] [--max-batch N] [--tables DIR]\n"
               "  measures bf16 GEMM rates (cuBLAS) at the model's prefill and decode shapes,\n"
               "  memory bandwidth, KV read rate and launch overhead on the GPU, and writes the\n"
               "  hardware JSON for `tandem sim` (stdout without --out). Needs a GPU.\n"
               "  --tables DIR also writes them as cost tables (DIR/gemm.txt, attn_generation.txt)\n"
               "  and DIR/hw.json, the hardware with \"cost_model\": \"table\".\n"
               "  models:");
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) fprintf(o, " %s", presets[i].name);
    fprintf(o, "\n");
}

static int parse_u32(const char *s, uint32_t *out)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || v == 0 || v > 1u << 20) return -1;
    *out = (uint32_t)v;
    return 0;
}

int tdm_cmd_profile(int argc, char **argv)
{
    const char *model = NULL, *out = NULL, *tables = NULL;
    tdm_profile_spec spec;
    tdm_profile_spec_init(&spec);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tandem profile: %s needs a value (or is unknown)\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        uint32_t *num = !strcmp(a, "--tp") ? &spec.tp : !strcmp(a, "--reps") ? &spec.reps
                      : !strcmp(a, "--max-tokens") ? &spec.max_tokens
                      : !strcmp(a, "--max-batch") ? &spec.max_batch : NULL;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--tables")) tables = v;
        else if (num) {
            if (parse_u32(v, num)) {
                fprintf(stderr, "tandem profile: %s: '%s' is not a positive integer\n", a, v);
                return 2;
            }
        } else {
            fprintf(stderr, "tandem profile: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    const struct preset *p = NULL;
    for (size_t i = 0; model && i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(model, presets[i].name)) p = &presets[i];
    if (!p) {
        fprintf(stderr, "tandem profile: %s\n", model ? "unknown model" : "--model is required");
        usage(stderr);
        return 2;
    }
    if (p->heads % spec.tp || p->intermediate % spec.tp) {
        fprintf(stderr, "tandem profile: --tp %u does not divide %s's heads / intermediate size\n",
                spec.tp, p->name);
        return 2;
    }
    if (spec.max_tokens < spec.min_tokens) spec.min_tokens = spec.max_tokens;
    spec.hidden = p->hidden;
    spec.intermediate = p->intermediate;
    spec.num_heads = p->heads;
    spec.num_kv_heads = p->kv_heads;
    spec.head_dim = p->head_dim;
    spec.num_layers = p->layers;
    spec.vocab = p->vocab;
    spec.model_name = p->name;

    char msg[256];
    if (tdm_cuda_available(msg, sizeof msg) != TDM_OK) {
        if (strstr(msg, "no CUDA device"))
            fprintf(stderr, "tandem profile: no CUDA device: tandem profile needs a GPU (%s)\n", msg);
        else
            fprintf(stderr, "tandem profile: %s; tandem profile needs a GPU and libtandem_cuda.so\n",
                    msg);
        return 3;
    }
    size_t cap = 1 << 20, len = 0;
    char *json = malloc(cap);
    if (!json) {
        fprintf(stderr, "tandem profile: out of memory\n");
        return 1;
    }
    fprintf(stderr, "tandem profile: measuring %s (tp %u) ...\n", p->name, spec.tp);
    int rc = tdm_cuda_profile(&spec, json, cap, &len);
    if (rc != TDM_OK) {
        fprintf(stderr, "tandem profile: %s\n", tdm_kv_errmsg());
        free(json);
        return rc == TDM_E_NO_CUDA ? 3 : 1;
    }
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f || fwrite(json, 1, len, f) != len || (out && fclose(f) != 0)) {
        fprintf(stderr, "tandem profile: cannot write %s\n", out ? out : "stdout");
        free(json);
        return 1;
    }
    if (out) fprintf(stderr, "tandem profile: wrote %s\n", out);
    if (tables) {
        char err[TDM_SIM_ERRLEN];
        if (tdm_sim_profile_to_tables(json, tables, p->heads, p->kv_heads, p->head_dim, spec.tp,
                                      err, sizeof err) != 0) {
            fprintf(stderr, "tandem profile: %s\n", err);
            free(json);
            return 1;
        }
        fprintf(stderr, "tandem profile: wrote the cost tables and %s/hw.json\n", tables);
    }
    free(json);
    return 0;
}
