/*
 * metrics.c -- what a run measured, as the serving papers define it: TTFT (arrival to
 * first token), TPOT (per request, (finish - first token) / (outputs - 1)), ITL (every gap
 * between consecutive tokens of a request), E2E (arrival to finish), each with mean, p50,
 * p90, p99 (linear interpolation, numpy's default); throughput over the simulated duration;
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

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void tdm_sim_stat_compute(double *v, size_t n, tdm_sim_stat *s)
{
    memset(s, 0, sizeof *s);
    s->n = n;
    if (!n) return;
    qsort(v, n, sizeof *v, cmp_d);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    s->mean = sum / (double)n;
    s->p50 = tdm_sim_percentile_sorted(v, n, 0.50);
    s->p90 = tdm_sim_percentile_sorted(v, n, 0.90);
    s->p99 = tdm_sim_percentile_sorted(v, n, 0.99);
    s->max = v[n - 1];
}

double tdm_sim_req_tpot(const tdm_sim_req_out *r)
{
    if (r->status != 1 || r->generated < 2 || r->first_token < 0) return -1;
    return (r->finish - r->first_token) / (double)(r->generated - 1);
}

/* The ITL samples (one per output token, millions of them) are sorted by an LSD radix sort
 * on their float bits (non-negative floats order as their bit patterns): exact and fast. */
static int radix_sort_f(const float *g, size_t n, float *out)
{
    uint32_t *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    size_t *cnt = malloc(65536 * sizeof *cnt);
    if (!a || !b || !cnt) {
        free(a);
        free(b);
        free(cnt);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        float f = g[i] < 0 ? 0.0f : g[i];
        memcpy(&a[i], &f, sizeof f);
    }
    for (int shift = 0; shift < 32; shift += 16) {
        memset(cnt, 0, 65536 * sizeof *cnt);
        for (size_t i = 0; i < n; i++) cnt[(a[i] >> shift) & 0xffff]++;
        size_t sum = 0;
        for (size_t k = 0; k < 65536; k++) {
            size_t c = cnt[k];
            cnt[k] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) b[cnt[(a[i] >> shift) & 0xffff]++] = a[i];
        uint32_t *t = a;
        a = b;
        b = t;
    }
    memcpy(out, a, n * sizeof *out);
    free(cnt);
    free(a);
    free(b);
    return 0;
}

static double pct_f(const float *v, size_t n, double q)
{
    double pos = q * (double)(n - 1);
    size_t lo = (size_t)floor(pos);
    double f = pos - (double)lo;
    if (lo + 1 >= n) return v[n - 1];
    return v[lo] + ((double)v[lo + 1] - v[lo]) * f;
}

static int stat_gaps(const float *g, size_t n, tdm_sim_stat *s)
{
    memset(s, 0, sizeof *s);
    s->n = n;
    if (!n) return 0;
    float *v = malloc(n * sizeof *v);
    if (!v || radix_sort_f(g, n, v) != 0) {
        free(v);
        return -1;
    }
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    s->mean = sum / (double)n;
    s->max = v[n - 1];
    s->p50 = pct_f(v, n, 0.5);
    s->p90 = pct_f(v, n, 0.9);
    s->p99 = pct_f(v, n, 0.99);
    free(v);
    return 0;
}

int tdm_sim_summarize(tdm_sim_result *res, double slo_ttft_s, double slo_tpot_s)
{
    tdm_sim_summary *s = &res->sum;
    size_t n = res->n;
    double *buf = malloc((n ? n : 1) * sizeof *buf);
    if (!buf) return -1;
    s->requests = 0;
    s->completed = s->rejected = 0;
    size_t k = 0, ok_t = 0, ok_p = 0, ok_b = 0, measured = 0;
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
    for (size_t i = 0; i < n; i++)
        if (!res->reqs[i].warmup && res->reqs[i].first_token >= 0) buf[k++] = res->reqs[i].first_token - res->reqs[i].arrival;
    tdm_sim_stat_compute(buf, k, &s->ttft);
    k = 0;
    for (size_t i = 0; i < n; i++) {
        double tp = tdm_sim_req_tpot(&res->reqs[i]);
        if (!res->reqs[i].warmup && tp >= 0) buf[k++] = tp;
    }
    tdm_sim_stat_compute(buf, k, &s->tpot);
    k = 0;
    for (size_t i = 0; i < n; i++)
        if (!res->reqs[i].warmup && res->reqs[i].status == 1) buf[k++] = res->reqs[i].finish - res->reqs[i].arrival;
    tdm_sim_stat_compute(buf, k, &s->e2e);
    free(buf);
    if (stat_gaps(res->gaps, res->n_gaps, &s->itl) != 0) return -1;
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
