/*
 * cmd_sim.c -- `tandem sim [CONFIG.json] [options]`: replay a trace (or the embedded chat
 * workload) through the libtandem scheduler on the cost model and print the metrics table;
 * --json, --requests-csv, --steps-csv, --chrome-trace and --goodput as in docs/simulator.md.
 */
#include <stdio.h>
#include <string.h>

#include "../sim/cli.h"
#include "commands.h"
#include "../sim/sim.h"

static const char USAGE[] =
    "usage: tandem sim [CONFIG.json] [options]\n"
    "  Replays a trace through the scheduler (library defaults, or CONFIG: the scheduler JSON\n"
    "  or a wrapper {\"name\", \"scheduler\", \"deployment\"}) on the cost model.\n";

int tdm_cmd_sim(int argc, char **argv)
{
    tdm_sim_cli c;
    int p = tdm_sim_cli_parse(&c, argc, argv, USAGE);
    if (p != 0) return p > 0 ? 0 : 2;
    const char *cfgpath = c.config ? c.config : c.npos ? c.pos[0] : NULL;
    if (c.npos > (c.config ? 0 : 1)) {
        fprintf(stderr, "tandem sim: one config at most (use tandem ab to compare)\n");
        return 2;
    }
    if (tdm_sim_cli_setup(&c) != 0) return 1;
    char err[TDM_SIM_ERRLEN];
    tdm_sim_config cfg;
    int rc = 1;
    if (cfgpath) {
        if (tdm_sim_config_load(cfgpath, &c.m, &c.h, &cfg, err, sizeof err) != 0) {
            fprintf(stderr, "tandem sim: %s\n", err);
            tdm_sim_cli_free(&c);
            return 1;
        }
    } else {
        tdm_sim_config_init(&cfg, &c.m, &c.h);
        snprintf(cfg.name, sizeof cfg.name, "library-defaults");
    }
    tdm_sim_result r;
    c.ropts.label = cfg.name;
    FILE *steps = NULL, *chrome = NULL;
    if ((c.steps_csv && !(steps = fopen(c.steps_csv, "w"))) ||
        (c.chrome_trace && !(chrome = fopen(c.chrome_trace, "w")))) {
        fprintf(stderr, "tandem sim: cannot write %s\n", steps || !c.steps_csv ? c.chrome_trace : c.steps_csv);
        if (steps) fclose(steps);
        goto out;
    }
    c.ropts.steps_csv = steps;
    c.ropts.keep_requests = c.csv != NULL; /* else memory does not grow with the trace */
    c.ropts.chrome_trace = chrome;
    int run_rc = tdm_sim_run(&c.t, &cfg, &c.ropts, &r, err, sizeof err);
    c.ropts.steps_csv = c.ropts.chrome_trace = NULL;
    int wbad = (steps && fclose(steps) != 0) | (chrome && fclose(chrome) != 0);
    if (run_rc != 0) {
        fprintf(stderr, "tandem sim: %s\n", err);
        goto out;
    }
    if (wbad) {
        fprintf(stderr, "tandem sim: error writing the step traces\n");
        tdm_sim_result_free(&r);
        goto out;
    }
    if (c.goodput) {
        tdm_sim_goodput_out g;
        if (tdm_sim_goodput(&c.t, &cfg, &c.ropts, &g, err, sizeof err) != 0) {
            fprintf(stderr, "tandem sim: goodput: %s\n", err);
            tdm_sim_result_free(&r);
            goto out;
        }
        tdm_sim_goodput_to_summary(&g, &r.sum);
    }
    tdm_sim_cli_describe(stdout, &c, &cfg);
    printf("config: %s (%u GPU%s%s)\n", cfg.name, r.sum.gpus, r.sum.gpus == 1 ? "" : "s",
           cfg.disagg ? ", disaggregated" : "");
    tdm_sim_print_table(stdout, &r);
    rc = 0;
    if (c.json) {
        char extra[768], hw[160];
        tdm_sim_config_hw_label(&cfg, hw, sizeof hw);
        snprintf(extra, sizeof extra, "\"trace\": \"%s\", \"model\": \"%s\", \"hw\": \"%s\", \"tp\": %u",
                 c.t.name, c.m.name, hw, cfg.pools[0].model.tp);
        if (tdm_sim_write_json(c.json, &r, extra) != 0) {
            fprintf(stderr, "tandem sim: cannot write %s\n", c.json);
            rc = 1;
        }
    }
    if (c.csv && tdm_sim_write_requests_csv(c.csv, &r) != 0) {
        fprintf(stderr, "tandem sim: cannot write %s\n", c.csv);
        rc = 1;
    }
    tdm_sim_result_free(&r);
out:
    tdm_sim_config_free(&cfg);
    tdm_sim_cli_free(&c);
    return rc;
}
