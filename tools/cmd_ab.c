/*
 * cmd_ab.c -- `tandem ab A.json B.json ...`: every config on the same trace and cost model,
 * a side-by-side table with each metric's ratio to the first config, --plot FILE.png (TTFT
 * and TPOT CDFs and throughput, with gnuplot), --json FILE with every summary and the ratios.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sim/cli.h"
#include "commands.h"
#include "../sim/sim.h"

static const char USAGE[] =
    "usage: tandem ab A.json [B.json ...] [options] [--plot FILE.png]\n"
    "  Runs every config (scheduler JSON or {\"name\", \"scheduler\", \"deployment\"} wrapper)\n"
    "  on the same trace and cost model; prints a side-by-side table with ratios to A.\n";

static int write_ab_json(const char *path, const tdm_sim_cli *c, tdm_sim_result *const *rs,
                         size_t n)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\n\"trace\": \"%s\", \"model\": \"%s\", \"hw\": \"%s\", \"tp\": %u,\n\"configs\": [\n",
            c->t.name, c->m.name, c->h.name, c->m.tp);
    for (size_t i = 0; i < n; i++) {
        tdm_sim_write_json_f(f, rs[i]);
        fputs(i + 1 < n ? ",\n" : "\n", f);
    }
    fputs("],\n\"ratios\": [\n", f);
    for (size_t i = 0; i < n; i++) {
        fputs("  {", f);
        for (size_t k = 0; k < tdm_sim_ab_num_metrics; k++) {
            const char *key = tdm_sim_ab_metrics[k].key;
            double v0 = tdm_sim_metric(&rs[0]->sum, key), v = tdm_sim_metric(&rs[i]->sum, key);
            double ratio = v0 != 0 ? v / v0 : (v == 0 ? 1.0 : -1.0);
            if (!strcmp(key, "goodput_req_s") && v0 < 0) continue;
            fprintf(f, "%s\"%s\": %.10g", k ? ", " : "", key, ratio);
        }
        fputs(i + 1 < n ? "},\n" : "}\n", f);
    }
    fputs("]\n}\n", f);
    return fclose(f) == 0 ? 0 : -1;
}

int tdm_cmd_ab(int argc, char **argv)
{
    tdm_sim_cli c;
    int p = tdm_sim_cli_parse(&c, argc, argv, USAGE);
    if (p != 0) return p > 0 ? 0 : 2;
    if (c.npos < 1) {
        fprintf(stderr, "%s", USAGE);
        return 2;
    }
    if (tdm_sim_cli_setup(&c) != 0) return 1;
    size_t n = (size_t)c.npos;
    tdm_sim_config *cfg = calloc(n, sizeof *cfg);
    tdm_sim_result *res = calloc(n, sizeof *res);
    tdm_sim_result **rp = calloc(n, sizeof *rp);
    size_t ncfg = 0, nres = 0;
    int rc = 1;
    char err[TDM_SIM_ERRLEN];
    if (!cfg || !res || !rp) {
        fprintf(stderr, "tandem ab: out of memory\n");
        goto out;
    }
    for (size_t i = 0; i < n; i++, ncfg++)
        if (tdm_sim_config_load(c.pos[i], &c.m, &c.h, &cfg[i], err, sizeof err) != 0) {
            fprintf(stderr, "tandem ab: %s\n", err);
            goto out;
        }
    /* identical names (the same file twice) get a suffix so that columns stay apart */
    for (size_t i = 1; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (!strcmp(cfg[i].name, cfg[j].name)) {
                char nm[96];
                snprintf(nm, sizeof nm, "%.50s#%zu", cfg[i].name, i + 1);
                memcpy(cfg[i].name, nm, sizeof cfg[i].name - 1);
                cfg[i].name[sizeof cfg[i].name - 1] = '\0';
                break;
            }
    tdm_sim_cli_describe(stdout, &c, NULL);
    for (size_t i = 0; i < n; i++, nres++) {
        c.ropts.label = cfg[i].name;
        c.ropts.keep_requests = c.plot != NULL; /* the CDFs need every request */
        if (tdm_sim_run(&c.t, &cfg[i], &c.ropts, &res[i], err, sizeof err) != 0) {
            fprintf(stderr, "tandem ab: %s: %s\n", cfg[i].name, err);
            goto out;
        }
        if (c.goodput) {
            tdm_sim_goodput_out g;
            if (tdm_sim_goodput(&c.t, &cfg[i], &c.ropts, &g, err, sizeof err) != 0) {
                fprintf(stderr, "tandem ab: %s: goodput: %s\n", cfg[i].name, err);
                nres++;
                goto out;
            }
            tdm_sim_goodput_to_summary(&g, &res[i].sum);
        }
        rp[i] = &res[i];
        char hw[160];
        tdm_sim_config_hw_label(&cfg[i], hw, sizeof hw);
        printf("  %-24s %u GPU%s on %s%s\n", cfg[i].name, res[i].sum.gpus,
               res[i].sum.gpus == 1 ? "" : "s", hw, cfg[i].disagg ? ", disaggregated" : "");
    }
    printf("SLO: TTFT <= %.0f ms, TPOT <= %.0f ms\n", c.ropts.slo_ttft_s * 1e3,
           c.ropts.slo_tpot_s * 1e3);
    tdm_sim_print_ab(stdout, (const tdm_sim_result *const *)rp, n);
    rc = 0;
    if (c.json && write_ab_json(c.json, &c, rp, n) != 0) {
        fprintf(stderr, "tandem ab: cannot write %s\n", c.json);
        rc = 1;
    }
    if (c.plot) {
        if (tdm_sim_plot_ab(c.plot, (const tdm_sim_result *const *)rp, n, err, sizeof err) != 0) {
            fprintf(stderr, "tandem ab: --plot: %s\n", err);
            rc = 1;
        } else {
            printf("plot: %s\n", c.plot);
        }
    }
out:
    for (size_t i = 0; i < nres && res; i++) tdm_sim_result_free(&res[i]);
    for (size_t i = 0; i < ncfg && cfg; i++) tdm_sim_config_free(&cfg[i]);
    free(cfg);
    free(res);
    free(rp);
    tdm_sim_cli_free(&c);
    return rc;
}
