/*
 * slo_adaptive.c -- the SLO-adaptive policy (TDM_POLICY_SLO_ADAPTIVE): configured by the
 * TTFT and TPOT targets instead of token budgets, it decides from what it observes:
 *   - order: least laxity first. A waiting request's key is its TTFT deadline minus the
 *     predicted time of its remaining prefill (a time-invariant form of slack, so it can key
 *     a heap), capped at arrival + a starvation bound so no request waits forever;
 *   - step budget: each step gets a time target, the smallest next-token allowance among
 *     the running decodes (the TPOT they have banked plus one TPOT), and chunks are sized to
 *     fit it with the cost model corrected by the measured/predicted step-time ratio; when
 *     the most urgent prefill would miss its TTFT at that pace but can meet it with a longer
 *     step, the step may grow up to what the decodes can recover over their expected output;
 *   - preemption: a request that can no longer meet its SLO goes first, then the latest
 *     admitted, so requests on track are spared;
 *   - TDM_REQ_SLO_DEPRIORITIZE: a waiting request that can no longer meet its TTFT is moved
 *     behind every request that still can; and when an arrival finds more on-time prefill
 *     work queued than the observed prefill rate can do by its deadline, the flagged waiting
 *     request with the most prefill left goes behind instead (Moore-Hodgson's rule).
 * Cost: O(running) per step for the target and the work left (the running array is walked
 * by the step anyway), O(log waiting) per queue operation (the waiting heap and the
 * longest-prefill heap), O(1) plus at most one demotion per arrival, each request demoted at
 * most once.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "heap.h"
#include "sched_internal.h"

/* Safety margin on the TPOT target, the step cap without decodes (in TTFT targets: a step
 * delays every arrival behind it), the fraction of the predicted recovery a longer step may
 * spend, the shortest step target (in margined TPOTs: decodes behind their schedule win back
 * up to half a TPOT a token) and the prefill time a step at that floor keeps beyond the
 * decode step (in margined TPOTs: where a decode step alone is most of the TPOT, as for a
 * 70B model, half a TPOT would stop every queued prefill while any decode is behind), and
 * the starvation bound (in TTFT targets; seconds without one). */
#define AD_TPOT_MARGIN 0.95
#define AD_CAP (1.0 / 6.0)
#define AD_RECOVER_SHARE 0.5
#define AD_FLOOR_TPOTS 0.5
#define AD_FLOOR_PREFILL_TPOTS 0.25
#define AD_STARVE_TTFTS 8.0
#define AD_STARVE_DEFAULT_S 10.0
/* The weight of one backlogged step in the smoothed prefill rate (about the last 20 steps:
 * long enough to smooth chunk sizes, short enough to follow a change of decode load). */
#define AD_RATE_EWMA 0.05

double tdm__ad_ttft(const tdm_sched *s, const tdm__req *r)
{
    return r->ttft_slo > 0 ? r->ttft_slo : (double)s->prm.slo_ttft_us * 1e-6;
}

double tdm__ad_tpot(const tdm_sched *s, const tdm__req *r)
{
    return r->tpot_slo > 0 ? r->tpot_slo : (double)s->prm.slo_tpot_us * 1e-6;
}

/* Predicted time, with the measured correction, of a prefill of n tokens at context `computed`
 * added to the step shape sh (NULL: alone). */
static double prefill_time(const tdm_sched *s, const tdm_step_shape *sh, uint32_t computed, uint32_t n)
{
    tdm_step_shape t;
    if (sh) t = *sh;
    else memset(&t, 0, sizeof(t)), t.struct_size = sizeof(t);
    t.num_prefill_reqs++;
    t.num_prefill_tokens += n;
    t.prefill_attn_work += (uint64_t)n * computed + (uint64_t)n * n / 2;
    return tdm__cost_estimate(s, &t) * s->ad_ratio;
}

static double ttft_deadline(const tdm_sched *s, const tdm__req *r)
{
    if (r->flags & TDM_REQ_REMOTE_PREFILL) return INFINITY; /* the prefill peer's business */
    double t = tdm__ad_ttft(s, r);
    return t > 0 ? r->arrival + t : INFINITY;
}

void tdm__ad_set_key(tdm_sched *s, tdm__req *r)
{
    double ttft = tdm__ad_ttft(s, r);
    double bound = r->arrival + (ttft > 0 ? AD_STARVE_TTFTS * ttft : AD_STARVE_DEFAULT_S);
    if (r->first_token >= 0 || ttft <= 0) { /* TTFT met or none: the starvation bound orders it */
        r->ad_key = bound;
        return;
    }
    uint32_t rem = r->num_tokens > r->num_computed ? r->num_tokens - r->num_computed : 1;
    double key = r->arrival + ttft - prefill_time(s, NULL, r->num_computed, rem);
    r->ad_key = key < bound ? key : bound;
}

/* The longest-prefill heap (a max-heap by ad_qtok): the flagged waiting requests that are on
 * time and have no first token, the candidates of tdm__ad_arrived. */
static bool long_before(const void *ctx, const tdm__req *a, const tdm__req *b)
{
    return a->ad_qtok > b->ad_qtok;
}

static const tdm__heap_order LONG_ORDER = { long_before, offsetof(tdm__req, ad_long_index) };

/* r enters (in) or leaves the waiting heap: its key, and the queued prefill work. The caller
 * has reserved heap room, which is also the longest-prefill heap's. */
void tdm__ad_queued(tdm_sched *s, tdm__req *r, bool in)
{
    if (!in) {
        s->ad_wait_tokens -= r->ad_qtok;
        if (r->ad_in_long) {
            r->ad_in_long = false;
            tdm__heap_remove(&LONG_ORDER, NULL, s->ad_long, &s->ad_long_len, r->ad_long_index);
        }
        r->ad_qtok = 0;
        return;
    }
    if (r->ad_late) return;
    tdm__ad_set_key(s, r);
    r->ad_qtok = r->num_tokens > r->num_computed ? r->num_tokens - r->num_computed : 0;
    s->ad_wait_tokens += r->ad_qtok;
    if ((r->flags & TDM_REQ_SLO_DEPRIORITIZE) && r->first_token < 0 && isfinite(ttft_deadline(s, r))) {
        r->ad_in_long = true;
        tdm__heap_insert(&LONG_ORDER, NULL, s->ad_long, &s->ad_long_len, r);
    }
}

int tdm__ad_compare(const tdm__req *a, const tdm__req *b)
{
    if (a->ad_late != b->ad_late) return a->ad_late ? 1 : -1;
    if (a->ad_late) return a->arrival < b->arrival ? -1 : a->arrival > b->arrival;
    if (a->ad_key != b->ad_key) return a->ad_key < b->ad_key ? -1 : 1;
    return 0;
}

/* r cannot meet its SLO any more: TTFT passed (or certain to pass) before its first token,
 * or its time since the first token already exceeds the TPOT target over its whole output. */
static bool slo_lost(const tdm_sched *s, const tdm__req *r, double now)
{
    if (r->ad_late) return true;
    /* A decode engine's request (its prompt's KV came from a prefill peer): the peer produced
     * the first token, so its TTFT is not this engine's to judge. */
    double d = ttft_deadline(s, r);
    if (r->first_token < 0) return now > d;
    if (r->first_token > d) return true;
    double tpot = tdm__ad_tpot(s, r);
    if (tpot <= 0 || r->max_tokens < 2) return false;
    return now - r->first_token > tpot * (double)(r->max_tokens - 1);
}

/* slo_lost for a request with its first token (first_token >= 0) whose TPOT target tpot
 * (> 0) the caller has: the same answer without the checks the caller has made. */
static inline bool decode_slo_lost(const tdm_sched *s, const tdm__req *r, double now, double tpot)
{
    if (r->ad_late || r->first_token > ttft_deadline(s, r)) return true;
    return r->max_tokens >= 2 && now - r->first_token > tpot * (double)(r->max_tokens - 1);
}

uint32_t tdm__ad_victim(tdm_sched *s)
{
    uint32_t best = s->num_running - 1;
    bool best_lost = slo_lost(s, s->running[best], s->now);
    for (uint32_t i = s->num_running - 1; i-- > 0;) {
        if (best_lost) break;
        if (slo_lost(s, s->running[i], s->now)) {
            best = i;
            best_lost = true;
        }
    }
    /* Among lost requests, or else among all: the latest admitted (least work lost). The
     * running array is in admission order, so the scan from the tail finds it first. */
    return best;
}

/* Demote the head of the waiting heap while it is a flagged request that cannot meet its
 * TTFT even if its prefill started now. Each request is demoted at most once. */
void tdm__ad_demote(tdm_sched *s, double now)
{
    while (s->heap_len) {
        tdm__req *r = s->heap[0];
        if (r->ad_late || !(r->flags & TDM_REQ_SLO_DEPRIORITIZE) || r->first_token >= 0) return;
        double d = ttft_deadline(s, r);
        if (!isfinite(d)) return;
        uint32_t rem = r->num_tokens > r->num_computed ? r->num_tokens - r->num_computed : 1;
        if (now + prefill_time(s, NULL, r->num_computed, rem) <= d) return;
        tdm__waiting_pop(s);
        r->ad_late = true;
        (void)tdm__waiting_requeue(s, r); /* room: it was in the heap */
    }
}

/* The mean output length seen so far (finished requests), or 256 before any finished. */
static double mean_output(const tdm_sched *s)
{
    return s->ad_out_n ? s->ad_out_sum / (double)s->ad_out_n : 256.0;
}

void tdm__ad_observe_finish(tdm_sched *s, const tdm__req *r)
{
    if (r->first_token < 0) return;
    s->ad_out_sum += (double)(r->num_tokens - r->num_prompt);
    s->ad_out_n++;
}

void tdm__ad_observe_step(tdm_sched *s, double now)
{
    if (s->ad_pred_step != s->step_no || s->ad_pred <= 0) return; /* pipelined or empty */
    double measured = now - s->ad_pred_start;
    s->ad_pred_step = 0;
    if (!(measured > 0)) return;
    double r = measured / s->ad_pred;
    if (r < 0.25) r = 0.25;
    if (r > 4.0) r = 4.0;
    s->ad_ratio = 0.8 * s->ad_ratio + 0.2 * r;
}

void tdm__ad_record_step(tdm_sched *s, const tdm_step_shape *sh, double now)
{
    double p = tdm__cost_estimate(s, sh);
    s->ad_pred = p;
    s->ad_pred_start = now;
    s->ad_pred_step = p > 0 ? s->step_no : 0;
}

/* The prefill rate a step of `target` seconds allows next to the decodes dec (whose step
 * takes dstep): the tokens that fit in what is left, per second; smoothed over steps. */
void tdm__ad_after_step(tdm_sched *s, const tdm_step_shape *sh)
{
    uint64_t run = 0;
    for (uint32_t i = 0; i < s->num_running; i++) {
        const tdm__req *r = s->running[i];
        if (r->first_token < 0 && !r->ad_late && r->num_computed < r->num_tokens)
            run += r->num_tokens - r->num_computed;
    }
    s->ad_run_tokens = run;
    double t = tdm__cost_estimate(s, sh) * s->ad_ratio;
    s->ad_free_at = s->now + t;
    if (!s->ad_wait_tokens || !sh->num_prefill_tokens || !(t > 0)) return; /* not backlogged */
    double rate = (double)sh->num_prefill_tokens / t;
    s->ad_rate = s->ad_rate > 0 ? (1 - AD_RATE_EWMA) * s->ad_rate + AD_RATE_EWMA * rate : rate;
}

/* A flagged request just arrived: when the on-time prefill work queued ahead of it (waiting
 * and running) cannot be done by its TTFT deadline at the observed prefill rate, one request
 * among those with the most prefill work goes behind every on-time one (Moore-Hodgson: in
 * deadline order, when a job would be late, drop the longest so far; with one TTFT target the
 * newest arrival has the latest deadline, so this check is that algorithm's step). */
void tdm__ad_arrived(tdm_sched *s, tdm__req *r)
{
    if (!(r->flags & TDM_REQ_SLO_DEPRIORITIZE) || r->ad_late || r->first_token >= 0) return;
    double d = ttft_deadline(s, r);
    if (!isfinite(d) || !(s->ad_rate > 0)) return;
    uint64_t queued = s->ad_wait_tokens + s->ad_run_tokens; /* r's own included */
    if (queued <= r->ad_qtok) return; /* alone: nobody to spare (tdm__ad_demote judges it) */
    double w = (double)queued / s->ad_rate;
    double now = s->ad_free_at > r->arrival ? s->ad_free_at : r->arrival;
    if (now + w <= d) return;
    if (!s->ad_long_len) return;
    tdm__req *v = s->ad_long[0]; /* the longest (r itself, often) */
    tdm__waiting_remove(s, v);
    v->ad_late = true;
    (void)tdm__waiting_requeue(s, v); /* room: it was in the heap */
}

/* The time target of this step (seconds, before the measured correction is divided out by
 * the caller; INFINITY: no decode to protect). dec is the shape of the running decodes. */
double tdm__ad_target(tdm_sched *s, double now, const tdm_step_shape *dec)
{
    double hard = INFINITY, soft = INFINITY, full = INFINITY, gmin = INFINITY;
    double dstep = tdm__cost_estimate(s, dec) * s->ad_ratio; /* a decode-only step */
    double mout = mean_output(s);
    double tpot_default = (double)s->prm.slo_tpot_us * 1e-6; /* tdm__ad_tpot's, hoisted */
    for (uint32_t i = 0; i < s->num_running; i++) {
        tdm__req *r = s->running[i];
        if (r->first_token < 0 || r->num_computed + 1 < r->num_tokens) continue;
        double tpot = r->tpot_slo > 0 ? r->tpot_slo : tpot_default;
        if (tpot <= 0) continue;
        if ((r->flags & TDM_REQ_SLO_DEPRIORITIZE) && decode_slo_lost(s, r, now, tpot)) continue;
        double g = tpot * AD_TPOT_MARGIN;
        double k = (double)(r->num_tokens - r->num_prompt); /* outputs so far, >= 1 */
        double allow = r->first_token + k * g - now;          /* due time of the next token */
        /* expected outputs left: the mean output seen (at most max_tokens) less those out */
        double rem = TDM_MIN(mout, (double)r->max_tokens) - k;
        double rec = rem > 0 && g > dstep ? rem * (g - dstep) : 0;
        if (allow < hard) hard = allow;
        if (allow + rec * AD_RECOVER_SHARE < soft) soft = allow + rec * AD_RECOVER_SHARE;
        if (allow + rec < full) full = allow + rec;
        if (g < gmin) gmin = g;
    }
    if (!isfinite(hard)) { /* no decode to protect: a step still delays the next arrivals */
        double cap = (double)s->prm.slo_ttft_us * 1e-6 * AD_CAP;
        s->ad_soft = s->ad_full = INFINITY;
        return cap > 0 ? cap : INFINITY;
    }
    /* the floor, from the tightest TPOT (it grows with the TPOT) */
    double floor = TDM_MAX(AD_FLOOR_TPOTS * gmin, dstep + AD_FLOOR_PREFILL_TPOTS * gmin);
    if (hard < floor) hard = floor;
    if (soft < hard) soft = hard;
    if (full < soft) full = soft;
    s->ad_soft = soft;
    s->ad_full = full;
    return hard;
}

/* The widened target for a step of `one` seconds that the most urgent prefill can use: all
 * of it when every decode can recover it in full over its expected output (the TTFT is
 * saved at no decode's expected TPOT), else what the soft target allows. */
static double widened(const tdm_sched *s, double one)
{
    if (one <= s->ad_full) return one;
    return one < s->ad_soft ? one : s->ad_soft;
}

/* Called before the first prefill of the step: when the most urgent prefill (the least-
 * slack running partial prefill, or the waiting head) would miss its TTFT at the pace the
 * target allows, raise the target to what it needs, as far as the decodes allow. */
double tdm__ad_widen(tdm_sched *s, double now, double target, const tdm_step_shape *sh)
{
    if (!isfinite(target) || s->ad_full <= target) return target;
    tdm__req *u = NULL;
    double best = INFINITY;
    uint64_t queued = s->ad_wait_tokens; /* prefill work that wants a TTFT */
    for (uint32_t i = 0; i < s->num_running; i++) {
        tdm__req *r = s->running[i];
        if (r->first_token >= 0 || r->num_computed + 1 >= r->num_tokens) continue;
        if (slo_lost(s, r, now)) continue;
        queued += r->num_tokens - r->num_computed;
        double d = ttft_deadline(s, r);
        if (d < best) best = d, u = r;
    }
    if (s->heap_len) {
        tdm__req *w = s->heap[0];
        double d = ttft_deadline(s, w);
        if (!w->ad_late && w->first_token < 0 && d < best) best = d, u = w;
    }
    if (!u || !isfinite(best)) return target;
    uint32_t rem = u->num_tokens > u->num_computed ? u->num_tokens - u->num_computed : 1;
    uint32_t chunk = TDM_MIN(rem, (uint32_t)s->prm.max_num_batched_tokens);
    double one = prefill_time(s, sh, u->num_computed, chunk); /* the largest step it can use */
    if (one <= target) return target;                           /* fits the pace anyway */
    double dstep = tdm__cost_estimate(s, sh) * s->ad_ratio;
    double per = target - dstep;                                /* prefill time per paced step */
    if (per <= 0) return widened(s, one);
    /* Paced, u's own prefill ends in ceil(need / per) steps, and the queued work (u's and
     * everyone's behind it) in ceil(all / per): widen when u would miss its deadline, or the
     * queue would not clear within u's TTFT target (the queue would grow). */
    double need = prefill_time(s, sh, u->num_computed, rem) - dstep;
    double per_tok = (prefill_time(s, sh, 0, 1024) - dstep) / 1024.0;
    double all = per_tok * (double)queued;
    if (now + ceil(need / per) * target <= best && ceil(all / per) * target <= tdm__ad_ttft(s, u))
        return target;
    return widened(s, one); /* as much as the decodes allow */
}
