/*
 * sim_bench.c -- simulator speed: the whole Azure conv trace (19,366 requests) through the
 * real scheduler (library defaults) on the llama-3-8b / h100-sxm cost model, on one core.
 * Prints `sim_bench azure_conv_wall_s=... request_steps_per_s=...` on a line of its own,
 * and a baseline measured in the same run: the same trace through a minimal continuous-
 * batching loop written inline (FCFS, 2048-token budget, chunked prefill, no KV pages, no
 * prefix cache), i.e. the cost of the step loop without the scheduler's bookkeeping.
 * Then the same run with the table cost model (build/tables/h100-sxm.json from `make
 * tables`, or $TANDEM_TABLES/h100-sxm.json): `sim_bench table_model_wall_s=...`, with the
 * tables' load time apart. Never fails on speed. Without ../shared, it uses the embedded
 * workload and says so; without the tables it says so and skips that figure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim.h"

/* The inline baseline: returns request-steps, fills the simulated duration. */
static uint64_t baseline(const tdm_sim_trace *t, const tdm_sim_cost *c, double *dur)
{
    size_t n = t->n, next = 0, head = 0, nrun = 0;
    uint32_t *done = calloc(n, sizeof *done), *run = malloc(256 * sizeof *run);
    uint64_t rs = 0;
    double now = 0;
    size_t finished = 0;
    while (finished < n) {
        while (next < n && t->reqs[next].arrival <= now) next++;
        /* admit FCFS up to 256 running */
        while (nrun < 256 && head < next) run[nrun++] = (uint32_t)head++;
        if (nrun == 0) {
            now = t->reqs[next].arrival;
            continue;
        }
        tdm_sim_shape s = {0};
        uint32_t budget = 2048;
        for (size_t i = 0; i < nrun && budget; i++) {
            const tdm_sim_req *r = &t->reqs[run[i]];
            uint32_t d = done[run[i]];
            if (d >= r->prompt_len) {
                s.decode_reqs++;
                s.decode_ctx += d + 1;
                s.emit_seqs++;
                done[run[i]]++;
                budget--;
            } else {
                uint32_t k = r->prompt_len - d < budget ? r->prompt_len - d : budget;
                s.prefill_tokens += k;
                s.prefill_attn += k * (d + k / 2.0);
                done[run[i]] += k;
                budget -= k;
                if (done[run[i]] >= r->prompt_len) s.emit_seqs++;
            }
            rs++;
        }
        now += tdm_sim_cost_step(c, &s, NULL);
        size_t w = 0;
        for (size_t i = 0; i < nrun; i++) {
            const tdm_sim_req *r = &t->reqs[run[i]];
            if (done[run[i]] >= r->prompt_len + r->output_len - 1) finished++;
            else run[w++] = run[i];
        }
        nrun = w;
    }
    free(done);
    free(run);
    *dur = now;
    return rs;
}

int main(void)
{
    const char *sh = getenv("TANDEM_SHARED");
    char path[1024];
    snprintf(path, sizeof path, "%s/traces/azure2023_conv.csv", sh && *sh ? sh : "../shared");
    FILE *probe = fopen(path, "r");
    const char *src = probe ? path : "builtin";
    if (probe) fclose(probe);
    else printf("sim_bench: %s not found; using the embedded workload instead\n", path);
    tdm_sim_model m;
    tdm_sim_hw h;
    tdm_sim_model_preset("llama-3-8b", &m);
    tdm_sim_hw_preset("h100-sxm", &h);
    tdm_sim_trace_opts to;
    tdm_sim_trace_opts_init(&to);
    to.max_len = m.max_len;
    char err[TDM_SIM_ERRLEN];
    tdm_sim_trace t;
    double t0 = tdm_sim_wall();
    if (tdm_sim_trace_load(src, &to, &t, err, sizeof err) != 0) {
        fprintf(stderr, "sim_bench: %s\n", err);
        return 1;
    }
    double load_s = tdm_sim_wall() - t0;
    tdm_sim_config cfg;
    tdm_sim_config_init(&cfg, &m, &h);
    snprintf(cfg.name, sizeof cfg.name, "library-defaults");
    tdm_sim_run_opts o;
    tdm_sim_run_opts_init(&o);
    tdm_sim_result r;
    t0 = tdm_sim_wall();
    clock_t c0 = clock();
    if (tdm_sim_run(&t, &cfg, &o, &r, err, sizeof err) != 0) {
        fprintf(stderr, "sim_bench: %s\n", err);
        return 1;
    }
    double wall = tdm_sim_wall() - t0;
    double cpu = (double)(clock() - c0) / CLOCKS_PER_SEC;
    tdm_sim_cost c;
    tdm_sim_cost_init(&c, &m, &h);
    double bdur;
    t0 = tdm_sim_wall();
    uint64_t brs = baseline(&t, &c, &bdur);
    double bwall = tdm_sim_wall() - t0;
    printf("trace %s: %zu requests, loaded in %.3f s; simulated %.1f s in %llu steps, %llu "
           "request-steps, %zu completed\n",
           t.name, t.n, load_s, r.sum.duration_s, (unsigned long long)r.sum.steps,
           (unsigned long long)r.sum.request_steps, r.sum.completed);
    printf("baseline (inline FCFS loop, no scheduler): %.3f s wall, %llu request-steps, "
           "%.0f request-steps/s\n",
           bwall, (unsigned long long)brs, bwall > 0 ? brs / bwall : 0.0);
    printf("sim_bench azure_conv_wall_s=%.3f request_steps_per_s=%.0f\n", wall,
           wall > 0 ? r.sum.request_steps / wall : 0.0);
    printf("sim_bench ratio_to_baseline=%.2f (per request-step)\n",
           (wall / (double)r.sum.request_steps) / (bwall / (double)(brs ? brs : 1)));
    tdm_sim_result_free(&r);
    const char *td = getenv("TANDEM_TABLES");
    char hp[1024];
    snprintf(hp, sizeof hp, "%s/h100-sxm.json", td && *td ? td : "build/tables");
    tdm_sim_hw th;
    t0 = tdm_sim_wall();
    if (tdm_sim_hw_load(hp, &th, err, sizeof err) != 0) {
        printf("sim_bench: no table model (%s); run `make tables`\n", err);
    } else {
        double tload = tdm_sim_wall() - t0;
        tdm_sim_config tc;
        tdm_sim_config_init(&tc, &m, &th);
        snprintf(tc.name, sizeof tc.name, "library-defaults-table");
        t0 = tdm_sim_wall();
        c0 = clock();
        if (tdm_sim_run(&t, &tc, &o, &r, err, sizeof err) != 0) {
            fprintf(stderr, "sim_bench: %s\n", err);
            tdm_sim_config_free(&tc);
            tdm_sim_config_free(&cfg);
            tdm_sim_trace_free(&t);
            return 1;
        }
        double tw = tdm_sim_wall() - t0;
        double tcpu = (double)(clock() - c0) / CLOCKS_PER_SEC;
        printf("table model (%s, loaded in %.3f s): simulated %.1f s in %llu steps, %llu "
               "extrapolated\n", hp, tload, r.sum.duration_s, (unsigned long long)r.sum.steps,
               (unsigned long long)r.sum.extrapolated_steps);
        /* CPU seconds too: wall time on a loaded machine says little */
        printf("sim_bench table_model_wall_s=%.3f request_steps_per_s=%.0f cpu_s=%.3f "
               "roofline_cpu_s=%.3f\n", tw, tw > 0 ? r.sum.request_steps / tw : 0.0, tcpu, cpu);
        tdm_sim_result_free(&r);
        tdm_sim_config_free(&tc);
    }
    tdm_sim_config_free(&cfg);
    tdm_sim_trace_free(&t);
    return 0;
}
