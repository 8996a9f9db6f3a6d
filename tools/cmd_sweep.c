/*
 * cmd_sweep.c -- `tandem sweep`: a grid over scheduler parameters (token budget, max
 * sequences, long-prefill threshold, policy, mode, TBT target) on one trace; prints a table
 * with the Pareto frontier of output throughput against p99 TPOT marked, and draws it with
 * --plot FILE.png; --json FILE writes every point.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sim/cli.h"
#include "commands.h"
#include "../sim/sim.h"

static const char USAGE[] =
    "usage: tandem sweep [BASE.json] [--budget LIST] [--max-seqs LIST] [--long-prefill LIST]\n"
    "                    [--policy LIST] [--mode LIST] [--tbt-ms LIST] [--plot FILE.png] [options]\n"
    "  LIST is comma-separated, e.g. --budget 512,2048,8192 --mode vllm,decode_first,prefill_first.\n"
    "  BASE is a config (scheduler JSON or wrapper) whose scheduler keys the grid overrides.\n";

#define MAXV 16

typedef struct axis {
    const char *key;
    char *vals[MAXV];
    int n, is_str;
    char *buf;
} axis;

static int split(axis *a, const char *key, const char *list, int is_str)
{
    a->key = key;
    a->n = 0;
    a->is_str = is_str;
    a->buf = NULL;
    if (!list) return 0;
    a->buf = strdup(list);
    if (!a->buf) return -1;
    for (char *save = NULL, *tok = strtok_r(a->buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (a->n == MAXV) {
            fprintf(stderr, "tandem sweep: at most %d values per parameter\n", MAXV);
            return -1;
        }
        if (!is_str) {
            char *end;
            double v = strtod(tok, &end);
            if (*end || v < 0) {
                fprintf(stderr, "tandem sweep: %s: bad value '%s'\n", key, tok);
                return -1;
            }
        }
        a->vals[a->n++] = tok;
    }
    return 0;
}

static int set_key(json_t *o, const axis *a, int k)
{
    const char *v = a->vals[k];
    json_t *x = a->is_str ? json_string(v)
                          : (strchr(v, '.') ? json_real(strtod(v, NULL))
                                            : json_integer(strtoll(v, NULL, 10)));
    return json_object_set_new(o, a->key, x);
}

int tdm_cmd_sweep(int argc, char **argv)
{
    tdm_sim_cli c;
    int p = tdm_sim_cli_parse(&c, argc, argv, USAGE);
    if (p != 0) return p > 0 ? 0 : 2;
    axis ax[6];
    memset(ax, 0, sizeof ax);
    int rc = 2;
    if (split(&ax[0], "max_num_batched_tokens", c.g_budget ? c.g_budget : "512,2048,8192", 0) ||
        split(&ax[1], "max_num_seqs", c.g_seqs, 0) ||
        split(&ax[2], "long_prefill_token_threshold", c.g_long, 0) ||
        split(&ax[3], "policy", c.g_policy, 1) ||
        split(&ax[4], "mode", c.g_mode ? c.g_mode : "vllm,decode_first", 1) ||
        split(&ax[5], "tbt_target_ms", c.g_tbt, 0))
        goto out_axes;
    rc = 1;
    if (tdm_sim_cli_setup(&c) != 0) goto out_axes;
    char err[TDM_SIM_ERRLEN];
    tdm_sim_config base;
    const char *bpath = c.config ? c.config : c.npos ? c.pos[0] : NULL;
    if (bpath) {
        if (tdm_sim_config_load(bpath, &c.m, &c.h, &base, err, sizeof err) != 0) {
            fprintf(stderr, "tandem sweep: %s\n", err);
            goto out_cli;
        }
    } else {
        tdm_sim_config_init(&base, &c.m, &c.h);
    }
    size_t total = 1;
    for (int i = 0; i < 6; i++) total *= ax[i].n ? (size_t)ax[i].n : 1;
    double *thr = calloc(total, sizeof *thr), *tp99 = calloc(total, sizeof *tp99);
    double *req = calloc(total, sizeof *req), *tt99 = calloc(total, sizeof *tt99);
    double *att = calloc(total, sizeof *att);
    int *front = calloc(total, sizeof *front);
    char **labels = calloc(total, sizeof *labels);
    if (!thr || !tp99 || !req || !tt99 || !att || !front || !labels) {
        fprintf(stderr, "tandem sweep: out of memory\n");
        goto out_all;
    }
    tdm_sim_cli_describe(stdout, &c, &base);
    printf("sweep: %zu configs\n", total);
    for (size_t g = 0; g < total; g++) {
        int idx[6];
        size_t r = g;
        for (int i = 5; i >= 0; i--) {
            int n = ax[i].n ? ax[i].n : 1;
            idx[i] = (int)(r % (size_t)n);
            r /= (size_t)n;
        }
        char label[160];
        int w = 0;
        static const char *const SHORT[6] = {"B", "S", "L", "", "", "tbt"};
        label[0] = '\0';
        for (int i = 0; i < 6; i++)
            if (ax[i].n && w < (int)sizeof label &&
                !(i == 5 && ax[4].n && strcmp(ax[4].vals[idx[4]], "decode_first")))
                w += snprintf(label + w, sizeof label - (size_t)w, "%s%s%s", w ? " " : "",
                              SHORT[i], ax[i].vals[idx[i]]);
        tdm_sim_config cfg;
        if (tdm_sim_config_copy(&cfg, &base) != 0) goto oom;
        snprintf(cfg.name, sizeof cfg.name, "%.63s", label);
        for (int pl = 0; pl < (cfg.disagg ? 2 : 1); pl++) {
            json_t *o = cfg.pools[pl].sched_json ? json_loads(cfg.pools[pl].sched_json, 0, NULL)
                                                 : json_object();
            if (!o) {
                tdm_sim_config_free(&cfg);
                goto oom;
            }
            for (int i = 0; i < 6; i++) {
                if (!ax[i].n) continue;
                /* a TBT target only means something in decode-first mode */
                if (i == 5) {
                    json_t *mo = json_object_get(o, "mode");
                    if (!mo || !json_is_string(mo) || strcmp(json_string_value(mo), "decode_first"))
                        continue;
                }
                set_key(o, &ax[i], idx[i]);
            }
            free(cfg.pools[pl].sched_json);
            cfg.pools[pl].sched_json = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
            json_decref(o);
        }
        tdm_sim_result res;
        c.ropts.label = label;
        c.ropts.keep_requests = 0;
        int ok = tdm_sim_run(&c.t, &cfg, &c.ropts, &res, err, sizeof err);
        tdm_sim_config_free(&cfg);
        labels[g] = strdup(label);
        if (ok != 0) {
            fprintf(stderr, "tandem sweep: %s: %s\n", label, err);
            goto out_all;
        }
        thr[g] = res.sum.output_throughput_tok_s;
        req[g] = res.sum.request_throughput;
        tp99[g] = res.sum.tpot.p99 * 1e3;
        tt99[g] = res.sum.ttft.p99 * 1e3;
        att[g] = res.sum.attainment;
        tdm_sim_result_free(&res);
    }
    for (size_t i = 0; i < total; i++) {
        front[i] = 1;
        for (size_t j = 0; j < total && front[i]; j++)
            if (j != i && thr[j] >= thr[i] && tp99[j] <= tp99[i] &&
                (thr[j] > thr[i] || tp99[j] < tp99[i]))
                front[i] = 0;
    }
    printf("  %-40s %12s %9s %11s %11s %9s %s\n", "config", "output tok/s", "req/s",
           "p99 TPOT ms", "p99 TTFT ms", "SLO both", "pareto");
    for (size_t i = 0; i < total; i++)
        printf("  %-40s %12.1f %9.3f %11.2f %11.1f %8.1f%% %s\n", labels[i], thr[i], req[i],
               tp99[i], tt99[i], 100 * att[i], front[i] ? "*" : "");
    rc = 0;
    if (c.json) {
        FILE *f = fopen(c.json, "w");
        if (!f) {
            fprintf(stderr, "tandem sweep: cannot write %s\n", c.json);
            rc = 1;
        } else {
            fprintf(f, "{\"points\": [\n");
            for (size_t i = 0; i < total; i++)
                fprintf(f, "  {\"config\": \"%s\", \"output_throughput_tok_s\": %.10g, "
                           "\"request_throughput\": %.10g, \"tpot_p99_s\": %.10g, "
                           "\"ttft_p99_s\": %.10g, \"attainment\": %.10g, \"pareto\": %s}%s\n",
                        labels[i], thr[i], req[i], tp99[i] / 1e3, tt99[i] / 1e3, att[i],
                        front[i] ? "true" : "false", i + 1 < total ? "," : "");
            fprintf(f, "]}\n");
            if (fclose(f) != 0) rc = 1;
        }
    }
    if (c.plot) {
        if (tdm_sim_plot_pareto(c.plot, thr, tp99, front, (const char *const *)labels, total,
                                err, sizeof err) != 0) {
            fprintf(stderr, "tandem sweep: --plot: %s\n", err);
            rc = 1;
        } else {
            printf("plot: %s\n", c.plot);
        }
    }
    goto out_all;
oom:
    fprintf(stderr, "tandem sweep: out of memory\n");
out_all:
    for (size_t i = 0; labels && i < total; i++) free(labels[i]);
    free(labels);
    free(thr);
    free(tp99);
    free(req);
    free(tt99);
    free(att);
    free(front);
    tdm_sim_config_free(&base);
out_cli:
    tdm_sim_cli_free(&c);
out_axes:
    for (int i = 0; i < 6; i++) free(ax[i].buf);
    return rc;
}
