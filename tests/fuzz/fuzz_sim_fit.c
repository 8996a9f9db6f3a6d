/*
 * fuzz_sim_fit.c -- `tandem fit`'s reader of a steps CSV (outside input: a file a deployment
 * wrote), then the fit on what was read when it is enough rows. The sim sources it needs are
 * compiled in (the fuzz build links only libtandem.a).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../sim/fit.h"

#include "../../sim/table.c"
#include "../../sim/metrics.c"
#include "../../sim/rng.c"
#include "../../sim/model.c"
#include "../../sim/cost.c"
#include "../../sim/cost_table.c"
#include "../../sim/calib.c"
#include "../../sim/fit.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    tdm_sim_fit_row *rows = NULL;
    size_t n = 0;
    if (tdm_sim_fit_parse_csv((const char *)data, size, "fuzz", &rows, &n, err, sizeof err) == 0) {
        tdm_sim_model m;
        memset(&m, 0, sizeof m);
        m.layers = 2;
        m.hidden = 128;
        m.heads = 2;
        m.kv_heads = 1;
        m.head_dim = 64;
        m.ffn = 256;
        m.vocab = 512;
        m.tp = 1;
        m.gated = 1;
        tdm_sim_fit f;
        (void)tdm_sim_fit_rows(rows, n, 2, 1, &m, &f, err, sizeof err);
        free(rows);
    }
    return 0;
}
