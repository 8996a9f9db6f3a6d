/*
 * cmd_fit.c -- `tandem fit STEPS.csv --model M --out DIR`: the table cost model fitted to the
 * measured steps of a deployment (the steps CSV that the vLLM adapter's recorder or `tandem
 * sim --steps-csv` writes; sim/fit.c). Writes DIR/hw.json and its tables (for `tandem sim
 * --hw DIR/hw.json`, ab, sweep, tune) and DIR/sched_cost.json (the library's linear
 * "cost_model" object with the same coefficients, for the scheduler's own step-time
 * estimates: decode-first budgets, slo_adaptive). Prints the fitted terms, the error on the
 * fitted rows, and the error on the held-out rows computed through the written tables
 * themselves (the table cost model loaded back), and a closing "fit ..." line for scripts.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "../sim/fit.h"

static const char USAGE[] =
    "usage: tandem fit STEPS.csv --model M --out DIR [--holdout K] [--tp N] [--trim] [--score S]\n"
    "  STEPS.csv  a steps CSV (tandem sim --steps-csv; the vLLM adapter's \"steps_csv\")\n"
    "  --model M  the served model: a preset or a model JSON (a Hugging Face config.json works)\n"
    "  --out DIR  writes DIR/hw.json (the table cost model: tandem sim --hw DIR/hw.json),\n"
    "             DIR/{gemm,elementwise,attn_context,attn_generation}.txt and\n"
    "             DIR/sched_cost.json ({\"cost_model\": ...} for the scheduler's JSON)\n"
    "  --holdout K  every K-th row is held out of the fit and scored (default 5: 20%)\n"
    "  --tp N     the engine's tensor-parallel degree (default: the model's)\n"
    "  --trim     drop the steps 5x further from the fit than the median (at least 10%) and\n"
    "             fit again: the undisturbed engine (by default slow steps count, as in serving)\n"
    "  --score S  also score every step of another steps CSV S (the same engine at another\n"
    "             time or load) through the written tables: its per-step error and its measured\n"
    "             total time over the predicted (> 1: the engine ran slower there than in\n"
    "             STEPS.csv)\n";

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Rows start, start + stride, ... of rows[0..n) through the table cost model loaded back
 * from hwpath: the mean and median relative error per step, the measured total time over the
 * predicted (ratio; NULL to skip) and the steps beyond the tables. */
static int table_error(const char *hwpath, const tdm_sim_model *m, const tdm_sim_fit_row *rows,
                       size_t n, size_t start, size_t stride, double *mape, double *median,
                       double *ratio, uint64_t *extrap)
{
    char err[512];
    tdm_sim_hw hw;
    if (tdm_sim_hw_load(hwpath, &hw, err, sizeof err)) {
        fprintf(stderr, "tandem fit: cannot load what was written: %s\n", err);
        return -1;
    }
    tdm_sim_cost c;
    tdm_sim_cost_init(&c, m, &hw);
    size_t k = 0;
    double *ape = malloc((n / stride + 1) * sizeof *ape), s = 0, meas = 0, pred = 0;
    if (!ape) {
        fprintf(stderr, "tandem fit: out of memory\n");
        return -1;
    }
    for (size_t i = start; i < n; i += stride) {
        tdm_sim_shape sh;
        tdm_sim_fit_shape(&rows[i], &sh);
        double t = tdm_sim_cost_step(&c, &sh, NULL);
        ape[k] = fabs(t / rows[i].dur_s - 1);
        s += ape[k++];
        meas += rows[i].dur_s;
        pred += t;
    }
    qsort(ape, k, sizeof *ape, cmp_dbl);
    *mape = k ? s / (double)k : 0;
    *median = k ? tdm_sim_percentile_sorted(ape, k, 0.5) : 0;
    if (ratio) *ratio = pred > 0 ? meas / pred : 0;
    *extrap = c.extrapolated_steps;
    free(ape);
    return 0;
}

int tdm_cmd_fit(int argc, char **argv)
{
    const char *csv = NULL, *model = NULL, *out = NULL, *score = NULL;
    unsigned holdout = 5, tp = 0;
    int trim = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (!strcmp(a, "--trim")) {
            trim = 1;
            continue;
        }
        if (!strcmp(a, "--model") || !strcmp(a, "--out") || !strcmp(a, "--holdout") ||
            !strcmp(a, "--tp") || !strcmp(a, "--score")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tandem fit: %s needs a value\n%s", a, USAGE);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--model")) model = v;
            else if (!strcmp(a, "--out")) out = v;
            else if (!strcmp(a, "--score")) score = v;
            else {
                char *end;
                long x = strtol(v, &end, 10);
                long lo = !strcmp(a, "--holdout") ? 2 : 1;
                if (*end || end == v || x < lo || x > 1000000) {
                    fprintf(stderr, "tandem fit: %s: bad value '%s' (an integer >= %ld)\n", a, v, lo);
                    return 2;
                }
                if (!strcmp(a, "--holdout")) holdout = (unsigned)x;
                else tp = (unsigned)x;
            }
        } else if (a[0] == '-') {
            fprintf(stderr, "tandem fit: unknown option %s\n%s", a, USAGE);
            return 2;
        } else if (!csv) {
            csv = a;
        } else {
            fprintf(stderr, "tandem fit: one steps CSV only (got %s and %s)\n", csv, a);
            return 2;
        }
    }
    if (!csv || !model || !out) {
        fprintf(stderr, "tandem fit: STEPS.csv, --model and --out are required\n%s", USAGE);
        return 2;
    }
    char err[512];
    tdm_sim_model m;
    if (tdm_sim_model_load(model, &m, err, sizeof err)) {
        fprintf(stderr, "tandem fit: --model: %s\n", err);
        return 2;
    }
    if (tp) m.tp = tp;
    tdm_sim_fit_row *rows = NULL;
    size_t n = 0;
    if (tdm_sim_fit_read_csv(csv, &rows, &n, err, sizeof err)) {
        fprintf(stderr, "tandem fit: %s\n", err);
        return 1;
    }
    int rc = 1;
    tdm_sim_fit f;
    if (tdm_sim_fit_rows(rows, n, holdout, trim, &m, &f, err, sizeof err)) {
        fprintf(stderr, "tandem fit: %s\n", err);
        goto done;
    }
    struct stat st;
    if (stat(out, &st) != 0 && mkdir(out, 0777) != 0) {
        fprintf(stderr, "tandem fit: cannot create %s\n", out);
        goto done;
    }
    if (tdm_sim_fit_write_tables(&f, &m, out, csv, err, sizeof err)) {
        fprintf(stderr, "tandem fit: %s\n", err);
        goto done;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/sched_cost.json", out);
    FILE *sc = fopen(path, "w");
    /* the library's linear model: decodes sample (token + sequence terms); the sampling of
     * a prompt's last chunk has no term of its own there */
    if (!sc || fprintf(sc, "{\"cost_model\": {\"base_us\": %.6g, \"per_prefill_token_us\": %.6g, "
                           "\"per_decode_req_us\": %.6g, \"per_context_token_ns\": %.6g, "
                           "\"per_attn_token2_ps\": %.6g}}\n",
                       f.overhead_us, f.token_us + f.lm_shared * f.seq_us,
                       f.token_us + (1 + f.lm_shared) * f.seq_us, f.ctx_ns, f.attn_ps) < 0 ||
        fclose(sc)) {
        fprintf(stderr, "tandem fit: cannot write %s\n", path);
        goto done;
    }
    snprintf(path, sizeof path, "%s/hw.json", out);
    double tmape = 0, tmed = 0;
    uint64_t ex = 0;
    if (table_error(path, &m, rows, n, holdout - 1, holdout, &tmape, &tmed, NULL, &ex)) goto done;
    printf("fit  %s: %zu steps; fitted on %zu (%zu timing outliers dropped), %zu held out "
           "(every %u-th)\n", csv, f.n_rows, f.n_fit, f.n_trimmed, f.n_held, holdout);
    printf("fit  step_us = %.1f + %.4g*tokens + %.4g*sampled_seqs + %.4g*decode_ctx/1e3 + "
           "%.4g*prefill_attn/1e6\n", f.overhead_us, f.token_us, f.seq_us, f.ctx_ns, f.attn_ps);
    printf("fit  error on the fitted rows: mean %.1f%%\n", 100 * f.fit_mape);
    printf("fit  held-out error (the written tables, %zu rows): per step mean %.1f%%, median "
           "%.1f%%, p90 %.1f%%; their total time %.3fx the measured; %llu steps beyond the "
           "tables\n", f.n_held, 100 * tmape, 100 * tmed, 100 * f.held_p90_ape,
           f.held_total_ratio, (unsigned long long)ex);
    printf("fit  wrote %s/hw.json (tandem sim --hw %s/hw.json --model %s), %s/sched_cost.json\n",
           out, out, model, out);
    printf("fit rows=%zu held_out=%zu held_out_mape=%.4f held_out_median_ape=%.4f "
           "held_out_total_ratio=%.4f fit_mape=%.4f overhead_us=%.2f token_us=%.4g seq_us=%.4g ctx_ns=%.4g attn_ps=%.4g\n",
           f.n_rows, f.n_held, tmape, tmed, f.held_total_ratio, f.fit_mape, f.overhead_us, f.token_us, f.seq_us,
           f.ctx_ns, f.attn_ps);
    if (score) {
        tdm_sim_fit_row *srows = NULL;
        size_t sn = 0;
        double smape = 0, smed = 0, sratio = 0;
        uint64_t sex = 0;
        if (tdm_sim_fit_read_csv(score, &srows, &sn, err, sizeof err)) {
            fprintf(stderr, "tandem fit: --score: %s\n", err);
            goto done;
        }
        int bad = table_error(path, &m, srows, sn, 0, 1, &smape, &smed, &sratio, &sex);
        free(srows);
        if (bad) goto done;
        printf("fit  scored %s (%zu steps) through the written tables: per step mean %.1f%%, "
               "median %.1f%%; measured total time %.3fx the predicted; %llu steps beyond the "
               "tables\n", score, sn, 100 * smape, 100 * smed, sratio, (unsigned long long)sex);
        printf("fit_score rows=%zu mape=%.4f median_ape=%.4f measured_over_predicted=%.4f\n", sn,
               smape, smed, sratio);
    }
    rc = 0;
done:
    free(rows);
    return rc;
}
