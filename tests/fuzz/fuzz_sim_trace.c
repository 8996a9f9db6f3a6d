/*
 * fuzz_sim_trace.c -- the simulator's decoders of outside input: the trace readers (Azure
 * CSV, length CSV, Mooncake JSONL, Tandem JSONL, Vidur CSV; with their slo_class columns)
 * with the options pass after them, the config / model / hardware JSON parsers, and the
 * `tandem cost --batch` spec and JSON. The first byte picks the decoder; the rest is the
 * input. The sim sources are compiled in (the fuzz build links only libtandem.a).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../sim/sim.h"

#include "../../sim/rng.c"
#include "../../sim/trace.c"
#include "../../sim/trace_csv.c"
#include "../../sim/trace_jsonl.c"
#include "../../sim/table.c"
#include "../../sim/cost_table.c"
#include "../../sim/model.c"
#include "../../sim/config.c"
#include "../../sim/batchspec.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int which = data[0] % 9;
    const char *buf = (const char *)data + 1;
    size_t len = size - 1;
    char err[TDM_SIM_ERRLEN];
    tdm_sim_trace t;
    int rc = -1, has_times = 1;
    switch (which) {
    case 0: rc = tdm_sim_parse_azure(buf, len, "fuzz", &t, err, sizeof err); break;
    case 1: rc = tdm_sim_parse_lengths(buf, len, "fuzz", &t, err, sizeof err); has_times = 0; break;
    case 2: rc = tdm_sim_parse_jsonl(buf, len, "fuzz", TDM_SIM_FMT_MOONCAKE, &t, err, sizeof err); break;
    case 3: rc = tdm_sim_parse_jsonl(buf, len, "fuzz", TDM_SIM_FMT_TANDEM, &t, err, sizeof err); break;
    case 7: rc = tdm_sim_parse_vidur(buf, len, "fuzz", &t, err, sizeof err); break;
    default: {
        char *s = malloc(len + 1);
        if (!s) return 0;
        memcpy(s, buf, len);
        s[len] = '\0';
        tdm_sim_model m;
        tdm_sim_hw h;
        tdm_sim_model_preset("llama-3-8b", &m);
        tdm_sim_hw_preset("h100-sxm", &h);
        if (which == 4) {
            tdm_sim_config c;
            if (tdm_sim_config_parse(s, "fuzz", &m, &h, &c, err, sizeof err) == 0)
                tdm_sim_config_free(&c);
        } else if (which == 8) {
            tdm_sim_shape sh;
            tdm_sim_batch_parse(s, &sh, err, sizeof err);
        } else if (which == 5) {
            tdm_sim_model_from_json(s, &m, err, sizeof err);
        } else {
            tdm_sim_hw_from_json(s, &h, err, sizeof err);
        }
        free(s);
        return 0;
    }
    }
    if (rc == 0) {
        tdm_sim_trace_opts o;
        tdm_sim_trace_opts_init(&o);
        o.max_len = 4096;
        o.max_requests = 1000;
        o.rate = 5;
        if (tdm_sim_trace_finish(&t, &o, has_times, err, sizeof err) == 0 && t.n) {
            /* token generation must stay in bounds */
            tdm_token tok[64];
            for (size_t i = 0; i < t.n && i < 4; i++)
                if (t.reqs[i].prompt_len <= 64) tdm_sim_trace_tokens(&t, i, tok);
            /* every class index names a class of the table */
            for (size_t i = 0; i < t.n; i++)
                if (t.reqs[i].slo_class > t.n_slo) abort();
        }
        tdm_sim_trace_free(&t);
    }
    return 0;
}
