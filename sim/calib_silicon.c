/*
 * calib_silicon.c -- the simulator against measured serving runs: aiconfigurator 0.12's
 * silicon rows (systems/silicon_sample.csv in the aiconfigurator-core wheel, extracted by
 * `make calibrate` into build/; never committed). Each vLLM aggregated row of a model the
 * simulator knows (Llama-3.1-8B/70B) on a GPU it has tables for (H100 SXM, H200 SXM) is a
 * closed-loop benchmark run at a fixed ISL/OSL and concurrency with fp8 weights; the row is
 * replayed as aiperf runs it (`tandem sim --hw <tables>.json --precision fp8 --tp N
 * --isl I --osl O --concurrency C --warmup 2C --warmup-drain --desync-round R
 * --client-jitter-ms J --frontend-ms F`: 2 C warm-up requests, all finished before the
 * measured phase starts with C sends at once, kept in phase for R waves; vLLM's default
 * scheduler keys, bf16 KV as vLLM keeps it without --kv-cache-dtype), and the predicted TTFT
 * and TPOT means are compared with the measured
 * ones (the rows' silicon_ttft_ms and silicon_tpot_ms are aiperf's means: aiconfigurator's
 * tools fill them from mean_ttft and mean_tpot, and its TTFT correction for concurrency is the
 * mean over N rounds whose first queues as a burst). The rows split in two halves by a hash of
 * their id: the serving path (J, F, R) was chosen on the fitting half only, and make calibrate
 * scores the other; every other constant of the model comes from the sources cited in
 * docs/cost_model.md. The figure is the median over the rows of |predicted - measured| /
 * measured, as the issue that asked for it measures it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

/* The benchmark of aiconfigurator's generator (bench_run.sh.j2 in the aiconfigurator 0.12
 * wheel): aiperf at concurrency C, 20 C requests measured after 2 C warm-up requests, fixed
 * lengths (stddev 0), ignore_eos. aiperf starts the measured phase once the warm-up has
 * returned (its docs, warmup.md), with C sends at once. */
#define BENCH_ROUNDS 20
#define BENCH_WARMUP_ROUNDS 2

/* vLLM v1's scheduler defaults for an online server on an H100-class GPU. */
static const char VLLM_SCHED[] =
    "{\"scheduler\": {\"mode\": \"vllm\", \"max_num_batched_tokens\": 8192, \"max_num_seqs\": 256,"
    " \"enable_chunked_prefill\": true, \"enable_prefix_caching\": true, \"policy\": \"fcfs\"}}";

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
    if (!n) return -1;
    qsort(v, n, sizeof *v, cmp_d);
    return tdm_sim_percentile_sorted(v, n, 0.5);
}

/* The preset of a row's model_path, or NULL when the simulator has none. */
static const char *model_of(const char *path)
{
    if (strstr(path, "Llama-3.1-70B")) return "llama-3.1-70b";
    if (strstr(path, "Llama-3.1-8B")) return "llama-3.1-8b";
    return NULL;
}

static const char *hw_of(const char *system)
{
    if (!strcmp(system, "h100_sxm")) return "h100-sxm";
    if (!strcmp(system, "h200_sxm")) return "h200";
    return NULL;
}

/* Replay one row; 0 with the predicted TTFT/TPOT medians (seconds), -1 with err. */
static int replay(const char *model, const char *hwjson, unsigned tp, unsigned isl,
                  unsigned osl, unsigned conc, double frontend_s, double jitter_s,
                  int desync, double *ttft, double *tpot,
                  char *err, size_t errlen)
{
    tdm_sim_model m;
    tdm_sim_hw h;
    if (tdm_sim_model_load(model, &m, err, errlen) != 0 ||
        tdm_sim_hw_load(hwjson, &h, err, errlen) != 0)
        return -1;
    m.tp = tp;
    tdm_sim_model_set_precision(&m, "fp8");
    tdm_sim_trace_opts to;
    tdm_sim_trace_opts_init(&to);
    to.fmt = TDM_SIM_FMT_FIXED;
    to.isl = isl;
    to.osl = osl;
    to.rate = INFINITY;
    to.max_requests = (size_t)conc * (BENCH_ROUNDS + BENCH_WARMUP_ROUNDS);
    tdm_sim_trace t;
    if (tdm_sim_trace_load(NULL, &to, &t, err, errlen) != 0) return -1;
    tdm_sim_config c;
    if (tdm_sim_config_parse(VLLM_SCHED, "vllm", &m, &h, &c, err, errlen) != 0) {
        tdm_sim_trace_free(&t);
        return -1;
    }
    tdm_sim_run_opts o;
    tdm_sim_run_opts_init(&o);
    o.concurrency = conc;
    o.frontend_s = frontend_s;
    o.client_jitter_s = jitter_s;
    o.desync = desync;
    o.warmup = (int64_t)conc * BENCH_WARMUP_ROUNDS;
    o.warmup_drain = 1;
    o.keep_requests = 0;
    tdm_sim_result r;
    int rc = tdm_sim_run(&t, &c, &o, &r, err, errlen);
    if (rc == 0) {
        *ttft = r.sum.ttft.mean;
        *tpot = r.sum.tpot.mean;
        tdm_sim_result_free(&r);
    }
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
    return rc;
}

/* FNV-1a of a row's id: its half (even: the fitting rows, odd: the held-out rows). */
static int fit_row(const char *id)
{
    uint64_t h = 1469598103934665603ull;
    for (; *id; id++) h = (h ^ (unsigned char)*id) * 1099511628211ull;
    return (h & 1) == 0;
}

int tdm_sim_calibrate_silicon(const char *csv, const char *tables_dir, double frontend_s,
                              double jitter_s, int desync, int rows, FILE *f,
                              tdm_sim_calib_table *out)
{
    out->silicon_ttft_mape = out->silicon_tpot_mape = -1;
    out->silicon_n = 0;
    out->silicon_ttft_low = 0;
    size_t len;
    char *buf = csv && tables_dir ? tdm_sim__slurp(csv, &len) : NULL;
    if (!buf) return 0;
    char *save = NULL, *line = strtok_r(buf, "\n", &save);
    char *hdr[64];
    int nh = line ? tdm_sim__csv_fields(line, hdr, 64) : 0;
    enum { ID, BACKEND, MODEL, SYSTEM, PREC, MODE, ISL, OSL, BS, TP, TTFT, TPOT, NCOL };
    static const char *const NAMES[NCOL] = {"id", "backend", "model_path", "system", "precision",
                                            "mode", "isl", "osl", "batch_size", "tp_size",
                                            "silicon_ttft_ms", "silicon_tpot_ms"};
    int col[NCOL];
    for (int i = 0; i < NCOL; i++)
        if ((col[i] = tdm_sim__csv_col(hdr, nh, NAMES[i])) < 0) {
            if (f) fprintf(f, "silicon: %s has no column %s\n", csv, NAMES[i]);
            free(buf);
            return 0;
        }
    size_t cap = 256, n = 0, low = 0;
    double *et = malloc(cap * sizeof *et), *ep = malloc(cap * sizeof *ep);
    if (!et || !ep) goto done;
    if (f) fprintf(f, "silicon rows (aiconfigurator 0.12 silicon_sample.csv, vLLM, closed loop):\n"
                      "  %-14s %-9s %2s %5s %5s %4s %9s %9s %7s %9s %9s %7s\n", "model", "gpu",
                   "tp", "isl", "osl", "conc", "ttft_ms", "sim_ms", "err", "tpot_ms", "sim_ms", "err");
    while ((line = strtok_r(NULL, "\n", &save))) {
        char *v[64];
        int nv = tdm_sim__csv_fields(line, v, 64);
        if (nv < nh) continue;
        const char *model = model_of(v[col[MODEL]]), *hw = hw_of(v[col[SYSTEM]]);
        if (strcmp(v[col[BACKEND]], "vllm") || strcmp(v[col[MODE]], "agg") ||
            strcmp(v[col[PREC]], "fp8") || !model || !hw)
            continue;
        unsigned tp = (unsigned)atoi(v[col[TP]]), isl = (unsigned)atoi(v[col[ISL]]);
        unsigned osl = (unsigned)atoi(v[col[OSL]]), conc = (unsigned)atoi(v[col[BS]]);
        double mt = atof(v[col[TTFT]]) / 1e3, mp = atof(v[col[TPOT]]) / 1e3;
        if (!tp || !isl || !osl || !conc || mt <= 0 || mp <= 0) continue;
        if ((rows == TDM_SIM_SILICON_FIT && !fit_row(v[col[ID]])) ||
            (rows == TDM_SIM_SILICON_CHECK && fit_row(v[col[ID]])))
            continue;
        char hwjson[1024], err[TDM_SIM_ERRLEN];
        snprintf(hwjson, sizeof hwjson, "%s/%s.json", tables_dir, hw);
        double pt, pp;
        if (replay(model, hwjson, tp, isl, osl, conc, frontend_s, jitter_s, desync, &pt, &pp,
                   err, sizeof err) != 0) {
            if (f) fprintf(f, "  %s %s tp%u: %s\n", model, hw, tp, err);
            continue;
        }
        if (n == cap) {
            cap *= 2;
            double *a = realloc(et, cap * sizeof *a);
            if (a) et = a;
            double *b = realloc(ep, cap * sizeof *b);
            if (b) ep = b;
            if (!a || !b) goto done;
        }
        et[n] = fabs(pt - mt) / mt;
        ep[n] = fabs(pp - mp) / mp;
        low += pt < mt;
        n++;
        if (f) fprintf(f, "  %-14s %-9s %2u %5u %5u %4u %9.1f %9.1f %+6.1f%% %9.2f %9.2f %+6.1f%%\n",
                       model, hw, tp, isl, osl, conc, mt * 1e3, pt * 1e3, 100 * (pt - mt) / mt,
                       mp * 1e3, pp * 1e3, 100 * (pp - mp) / mp);
    }
    out->silicon_n = n;
    out->silicon_ttft_low = n ? (double)low / (double)n : 0;
    out->silicon_ttft_mape = median(et, n);
    out->silicon_tpot_mape = median(ep, n);
    if (f && n)
        fprintf(f, "silicon: %zu %s rows, frontend %.1f ms, client jitter %.0f ms, drained warm-up, "
                   "in phase for %d wave%s then desynchronized, median |error| mean TTFT %.1f%% "
                   "(predicted low on %.0f%%), mean TPOT %.1f%%\n", n,
                rows == TDM_SIM_SILICON_FIT ? "fitting" : rows == TDM_SIM_SILICON_CHECK ? "held-out" : "(all)",
                1e3 * frontend_s, 1e3 * jitter_s, desync, desync == 1 ? "" : "s",
                100 * out->silicon_ttft_mape,
                100 * out->silicon_ttft_low, 100 * out->silicon_tpot_mape);
done:
    free(et);
    free(ep);
    free(buf);
    return (int)n;
}
