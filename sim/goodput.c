/*
 * goodput.c -- goodput as DistServe defines it: the highest arrival rate at which at least
 * a target fraction (90% by default) of requests meet both the TTFT and the TPOT SLO;
 * requests that never finish count as misses. The search scales the trace's arrival rate:
 * it doubles or halves the scale until the target is bracketed, then bisects until the
 * bracket is within 2% (or 16 runs). The rate reported is scale * base rate, where the base
 * rate is requests / arrival span of the trace. The highest attainment seen is kept: when no
 * scale down to 2^-11 reaches the target, goodput is 0 and that figure says how far off the
 * SLOs are (requests whose prefill alone takes longer than the TTFT target miss at any load).
 */
#include <math.h>
#include <string.h>

#include "sim.h"

static int attain_at(const tdm_sim_trace *t, const tdm_sim_config *c, const tdm_sim_run_opts *o,
                     double scale, double *att, tdm_sim_goodput_out *g, char *err, size_t errlen)
{
    tdm_sim_trace s;
    if (tdm_sim_trace_scaled(t, scale, &s) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    tdm_sim_run_opts q = *o;
    q.progress = 0;
    q.keep_requests = 0; /* the summary is all a search needs */
    q.steps_csv = q.chrome_trace = NULL; /* the traces are of the base run only */
    tdm_sim_result r;
    int rc = tdm_sim_run(&s, c, &q, &r, err, errlen);
    tdm_sim_trace_free(&s);
    if (rc != 0) return -1;
    *att = r.sum.attainment;
    tdm_sim_result_free(&r);
    g->runs++;
    if (g->runs == 1 || *att > g->best_attainment) {
        g->best_attainment = *att;
        g->best_scale = scale;
    }
    return 0;
}

int tdm_sim_goodput(const tdm_sim_trace *t, const tdm_sim_config *c, const tdm_sim_run_opts *o,
                    tdm_sim_goodput_out *out, char *err, size_t errlen)
{
    tdm_sim_goodput_out g = {0};
    double target = o->goodput_target > 0 ? o->goodput_target : 0.9;
    double span = tdm_sim_trace_span(t);
    double base = span > 0 ? (double)t->n / span : (double)t->n;
    double lo = 0, hi = 0, s = 1.0, a;
    if (attain_at(t, c, o, s, &a, &g, err, errlen) != 0) return -1;
    if (a >= target) {
        lo = s;
        while (g.runs < 12) {
            s *= 2;
            if (attain_at(t, c, o, s, &a, &g, err, errlen) != 0) return -1;
                    if (a < target) {
                hi = s;
                break;
            }
            lo = s;
        }
        if (hi == 0) hi = lo; /* never failed within 2^11: report the largest tried */
    } else {
        hi = s;
        while (g.runs < 12) {
            s /= 2;
            if (attain_at(t, c, o, s, &a, &g, err, errlen) != 0) return -1;
                    if (a >= target) {
                lo = s;
                break;
            }
            hi = s;
        }
    }
    while (lo > 0 && hi / lo > 1.02 && g.runs < 16) {
        double mid = sqrt(lo * hi);
        if (attain_at(t, c, o, mid, &a, &g, err, errlen) != 0) return -1;
            if (a >= target) lo = mid;
        else hi = mid;
    }
    g.req_s = lo * base;
    g.scale = lo;
    *out = g;
    return 0;
}

void tdm_sim_goodput_to_summary(const tdm_sim_goodput_out *g, tdm_sim_summary *s)
{
    s->goodput_req_s = g->req_s;
    s->goodput_scale = g->scale;
    s->goodput_best_attainment = g->best_attainment;
    s->goodput_best_scale = g->best_scale;
}
