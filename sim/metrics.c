/*
 * metrics.c -- what a run measured, as the serving papers define it: TTFT (arrival to
 * first token), TPOT (per request, (finish - first token) / (outputs - 1)), ITL (every gap
 * between consecutive tokens of a request), E2E (arrival to finish), each with mean, p50,
 * p90, p99 (linear interpolation, numpy's default, on a streaming sketch: within 2^-11
 * relative of the exact percentile, in memory that does not grow with the trace); throughput over the simulated duration;
 * SLO attainment over all requests (unfinished and rejected requests count as misses), each
 * against its own SLOs when it has a class (none = best effort, met by definition).
 * Warm-up requests are left out of every figure.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

double tdm_sim_percentile_sorted(const double *v, size_t n, double q)
{
    if (n == 0) return 0;
    if (q <= 0) return v[0];
    if (q >= 1) return v[n - 1];
    double pos = q * (double)(n - 1);
    size_t lo = (size_t)floor(pos);
    double f = pos - (double)lo;
    if (lo + 1 >= n) return v[n - 1];
    return v[lo] + (v[lo + 1] - v[lo]) * f;
}

double tdm_sim_req_tpot(const tdm_sim_req_out *r)
{
    if (r->status != 1 || r->generated < 2 || r->first_token < 0) return -1;
    return (r->finish - r->first_token) / (double)(r->generated - 1);
}

int tdm_sim_summarize(tdm_sim_result *res, double slo_ttft_s, double slo_tpot_s)
{
    tdm_sim_summary *s = &res->sum;
    size_t n = res->n;
    tdm_sim_sketch sk[3]; /* TTFT, TPOT, E2E */
    for (int j = 0; j < 3; j++) tdm_sim_sketch_init(&sk[j]);
    int oom = 0;
    s->requests = 0;
    s->completed = s->rejected = 0;
    size_t ok_t = 0, ok_p = 0, ok_b = 0, measured = 0;
    size_t cls_t[TDM_SIM_MAX_SLO_CLASSES] = {0}, cls_b[TDM_SIM_MAX_SLO_CLASSES] = {0};
    memset(s->class_n, 0, sizeof s->class_n);
    uint64_t out_tokens = 0, in_tokens = 0;
    for (size_t i = 0; i < n; i++) {
        const tdm_sim_req_out *r = &res->reqs[i];
        if (r->warmup) continue;
        measured++;
        s->completed += r->status == 1;
        s->rejected += r->status == 2;
        out_tokens += r->generated;
        if (r->status == 1) in_tokens += r->prompt_len;
        double st = r->has_slo ? r->slo_ttft_s : slo_ttft_s;
        double sp = r->has_slo ? r->slo_tpot_s : slo_tpot_s;
        int mt = r->first_token >= 0 && (st <= 0 || r->first_token - r->arrival <= st);
        double tp = tdm_sim_req_tpot(r);
        int mp = r->status == 1 && (sp <= 0 || tp <= sp); /* tp = -1 (one output) meets it */
        if (r->first_token >= 0) oom |= tdm_sim_sketch_add(&sk[0], r->first_token - r->arrival);
        if (tp >= 0) oom |= tdm_sim_sketch_add(&sk[1], tp);
        if (r->status == 1) oom |= tdm_sim_sketch_add(&sk[2], r->finish - r->arrival);
        ok_t += mt;
        ok_p += mp;
        ok_b += mt && mp;
        if (r->slo_class > 0 && r->slo_class <= TDM_SIM_MAX_SLO_CLASSES) {
            s->class_n[r->slo_class - 1]++;
            cls_t[r->slo_class - 1] += mt;
            cls_b[r->slo_class - 1] += mt && mp;
        }
    }
    for (size_t c = 0; c < TDM_SIM_MAX_SLO_CLASSES; c++) {
        s->class_attain_ttft[c] = s->class_n[c] ? (double)cls_t[c] / (double)s->class_n[c] : 0;
        s->class_attain[c] = s->class_n[c] ? (double)cls_b[c] / (double)s->class_n[c] : 0;
    }
    tdm_sim_sketch_stat(&sk[0], &s->ttft);
    tdm_sim_sketch_stat(&sk[1], &s->tpot);
    tdm_sim_sketch_stat(&sk[2], &s->e2e);
    for (int j = 0; j < 3; j++) tdm_sim_sketch_free(&sk[j]);
    if (oom) return -1;
    tdm_sim_sketch_stat(&res->itl, &s->itl);
    double d = s->duration_s > 0 ? s->duration_s : 1e-9;
    s->request_throughput = (double)s->completed / d;
    s->output_throughput_tok_s = (double)out_tokens / d;
    s->total_throughput_tok_s = (double)(out_tokens + in_tokens) / d;
    s->slo_ttft_s = slo_ttft_s;
    s->slo_tpot_s = slo_tpot_s;
    s->requests = measured;
    s->attain_ttft = measured ? (double)ok_t / (double)measured : 0;
    s->attain_tpot = measured ? (double)ok_p / (double)measured : 0;
    s->attainment = measured ? (double)ok_b / (double)measured : 0;
    return 0;
}
