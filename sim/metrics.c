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

void tdm_sim_acc_init(tdm_sim_acc *a, double slo_ttft_s, double slo_tpot_s)
{
    memset(a, 0, sizeof *a);
    a->slo_ttft_s = slo_ttft_s;
    a->slo_tpot_s = slo_tpot_s;
    a->first_arrival = a->last_finish = -1;
}

void tdm_sim_acc_add(tdm_sim_acc *a, const tdm_sim_req_out *r)
{
    if (r->warmup) return;
    a->measured++;
    a->completed += r->status == 1;
    a->rejected += r->status == 2;
    a->out_tokens += r->generated;
    if (r->status == 1) a->in_tokens += r->prompt_len;
    if (a->first_arrival < 0 || r->arrival < a->first_arrival) a->first_arrival = r->arrival;
    if (r->finish > a->last_finish) a->last_finish = r->finish;
    double st = r->has_slo ? r->slo_ttft_s : a->slo_ttft_s;
    double sp = r->has_slo ? r->slo_tpot_s : a->slo_tpot_s;
    int mt = r->first_token >= 0 && (st <= 0 || r->first_token - r->arrival <= st);
    double tp = tdm_sim_req_tpot(r);
    int mp = r->status == 1 && (sp <= 0 || tp <= sp); /* tp = -1 (one output) meets it */
    if (r->first_token >= 0) a->oom |= tdm_sim_sketch_add(&a->ttft, r->first_token - r->arrival);
    if (tp >= 0) a->oom |= tdm_sim_sketch_add(&a->tpot, tp);
    if (r->status == 1) a->oom |= tdm_sim_sketch_add(&a->e2e, r->finish - r->arrival);
    a->ok_t += mt;
    a->ok_p += mp;
    a->ok_b += mt && mp;
    if (r->slo_class > 0 && r->slo_class <= TDM_SIM_MAX_SLO_CLASSES) {
        a->cls_n[r->slo_class - 1]++;
        a->cls_t[r->slo_class - 1] += mt;
        a->cls_b[r->slo_class - 1] += mt && mp;
    }
}

int tdm_sim_acc_finish(tdm_sim_acc *a, tdm_sim_result *res)
{
    tdm_sim_summary *s = &res->sum;
    s->completed = a->completed;
    s->rejected = a->rejected;
    for (size_t c = 0; c < TDM_SIM_MAX_SLO_CLASSES; c++) {
        s->class_n[c] = a->cls_n[c];
        s->class_attain_ttft[c] = a->cls_n[c] ? (double)a->cls_t[c] / (double)a->cls_n[c] : 0;
        s->class_attain[c] = a->cls_n[c] ? (double)a->cls_b[c] / (double)a->cls_n[c] : 0;
    }
    tdm_sim_sketch_stat(&a->ttft, &s->ttft);
    tdm_sim_sketch_stat(&a->tpot, &s->tpot);
    tdm_sim_sketch_stat(&a->e2e, &s->e2e);
    tdm_sim_sketch_free(&a->ttft);
    tdm_sim_sketch_free(&a->tpot);
    tdm_sim_sketch_free(&a->e2e);
    if (a->oom) return -1;
    tdm_sim_sketch_stat(&res->itl, &s->itl);
    double d = s->duration_s > 0 ? s->duration_s : 1e-9;
    s->request_throughput = (double)a->completed / d;
    s->output_throughput_tok_s = (double)a->out_tokens / d;
    s->total_throughput_tok_s = (double)(a->out_tokens + a->in_tokens) / d;
    s->slo_ttft_s = a->slo_ttft_s;
    s->slo_tpot_s = a->slo_tpot_s;
    s->requests = a->measured;
    double m = (double)a->measured;
    s->attain_ttft = a->measured ? (double)a->ok_t / m : 0;
    s->attain_tpot = a->measured ? (double)a->ok_p / m : 0;
    s->attainment = a->measured ? (double)a->ok_b / m : 0;
    return 0;
}

int tdm_sim_summarize(tdm_sim_result *res, double slo_ttft_s, double slo_tpot_s)
{
    tdm_sim_acc a;
    tdm_sim_acc_init(&a, slo_ttft_s, slo_tpot_s);
    for (size_t i = 0; i < res->n && res->reqs; i++) tdm_sim_acc_add(&a, &res->reqs[i]);
    return tdm_sim_acc_finish(&a, res);
}
