/*
 * goodput.c -- goodput as DistServe defines it: the highest arrival rate at which at least
 * a target fraction (90% by default) of requests meet both the TTFT and the TPOT SLO;
 * requests that never finish count as misses. The search scales the trace's arrival rate:
 * it doubles or halves the scale until the target is bracketed, then bisects until the
 * bracket is within 2% (or 16 runs). The rate reported is scale * base rate, where the base
 * rate is requests / arrival span of the trace.
 */
#include <math.h>
#include <string.h>

#include "sim.h"

static int attain_at(const tdm_sim_trace *t, const tdm_sim_config *c, const tdm_sim_run_opts *o,
                     double scale, double *att, char *err, size_t errlen)
{
    tdm_sim_trace s;
    if (tdm_sim_trace_scaled(t, scale, &s) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    tdm_sim_run_opts q = *o;
    q.progress = 0;
    q.steps_csv = q.chrome_trace = NULL; /* the traces are of the base run only */
    tdm_sim_result r;
    int rc = tdm_sim_run(&s, c, &q, &r, err, errlen);
    tdm_sim_trace_free(&s);
    if (rc != 0) return -1;
    *att = r.sum.attainment;
    tdm_sim_result_free(&r);
    return 0;
}

int tdm_sim_goodput(const tdm_sim_trace *t, const tdm_sim_config *c, const tdm_sim_run_opts *o,
                    double *goodput, double *scale_out, int *runs_out, char *err, size_t errlen)
{
    double target = o->goodput_target > 0 ? o->goodput_target : 0.9;
    double span = tdm_sim_trace_span(t);
    double base = span > 0 ? (double)t->n / span : (double)t->n;
    double lo = 0, hi = 0, s = 1.0, a;
    int runs = 0;
    if (attain_at(t, c, o, s, &a, err, errlen) != 0) return -1;
    runs++;
    if (a >= target) {
        lo = s;
        while (runs < 12) {
            s *= 2;
            if (attain_at(t, c, o, s, &a, err, errlen) != 0) return -1;
            runs++;
            if (a < target) {
                hi = s;
                break;
            }
            lo = s;
        }
        if (hi == 0) hi = lo; /* never failed within 2^11: report the largest tried */
    } else {
        hi = s;
        while (runs < 12) {
            s /= 2;
            if (attain_at(t, c, o, s, &a, err, errlen) != 0) return -1;
            runs++;
            if (a >= target) {
                lo = s;
                break;
            }
            hi = s;
        }
    }
    while (lo > 0 && hi / lo > 1.02 && runs < 16) {
        double mid = sqrt(lo * hi);
        if (attain_at(t, c, o, mid, &a, err, errlen) != 0) return -1;
        runs++;
        if (a >= target) lo = mid;
        else hi = mid;
    }
    *goodput = lo * base;
    *scale_out = lo;
    if (runs_out) *runs_out = runs;
    return 0;
}
