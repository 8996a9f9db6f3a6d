/*
 * fuzz_sim_table.c -- the table cost model's reader of outside input (sim/table.c): the
 * text format of docs/cost_model.md. Whatever parses is looked up at keys taken from the
 * input's last bytes (inside, between and outside the profiled points), merged and
 * looked up again. The sim sources it needs are compiled in (the fuzz build links only
 * libtandem.a).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../sim/table.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    tdm_sim_table t;
    if (tdm_sim_table_parse((const char *)data, size, "fuzz", &t, err, sizeof err) != 0)
        return 0;
    double k[TDM_SIM_TABLE_MAXDIM];
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < t.ndim; i++) {
            uint8_t b = size > (size_t)(i + round) ? data[size - 1 - (size_t)(i + round)] : 1;
            k[i] = round == 3 ? t.rows[(size_t)i + 1] : ldexp(1.0 + b / 256.0, b % 40 - 8);
        }
        int ex = 0;
        double us = tdm_sim_table_lookup(&t, (tdm_sim_dtype)(round & 1), k, &ex);
        if (!(us == -1 || (us > 0 && us < INFINITY))) abort();
    }
    if (tdm_sim_table_merge(&t) != 0) abort();
    int ex = 0;
    if (tdm_sim_table_lookup(&t, TDM_SIM_DT_BF16, k, &ex) == 0) abort();
    tdm_sim_table_free(&t);
    return 0;
}
