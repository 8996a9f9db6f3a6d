/*
 * test_load.c -- the load the simulator offers and what it records: closed-loop load (never
 * more than `concurrency` requests in flight, each later request sent at the finish of an
 * earlier one, or a client's delay after it; the desynchronized start; aiperf's drained
 * warm-up and measured burst), the warm-up rule (the first requests sent are left out of every metric), SLO
 * classes reaching the scheduler (the slo policy serves by deadline and so differs from FCFS),
 * the per-step CSV and Chrome trace (one track per instance, KV transfers as slices), and the
 * prefill-first baseline mode run end to end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "sim.h"
#include "sim_test_util.h"

static tdm_sim_model M;
static tdm_sim_hw H;

static int setup(void **state)
{
    (void)state;
    tdm_sim_model_preset("llama-3.1-8b", &M);
    tdm_sim_hw_preset("h200", &H);
    return 0;
}

static void config(const char *json, tdm_sim_config *c)
{
    char err[TDM_SIM_ERRLEN];
    if (tdm_sim_config_parse(json, "t", &M, &H, c, err, sizeof err) != 0) fail_msg("%s", err);
}

static void fixed(tdm_sim_trace *t, uint32_t n, uint32_t isl, uint32_t osl, double range, double rate)
{
    tdm_sim_trace_opts o;
    tdm_sim_trace_opts_init(&o);
    o.isl = isl;
    o.osl = osl;
    o.len_range = range;
    o.max_requests = n;
    o.rate = rate;
    char err[TDM_SIM_ERRLEN];
    if (tdm_sim_trace_load(NULL, &o, t, err, sizeof err) != 0) fail_msg("%s", err);
}

static void run(const tdm_sim_trace *t, const tdm_sim_config *c, const tdm_sim_run_opts *o,
                tdm_sim_result *r)
{
    char err[TDM_SIM_ERRLEN];
    if (tdm_sim_run(t, c, o, r, err, sizeof err) != 0) fail_msg("run: %s", err);
}

/* The serving path (frontend_s): a request reaches the scheduler between fe/2 and 3fe/2 after
 * it is sent (its TTFT counted from the send), then waits for the step in flight; requests in
 * transit count as in flight in a closed loop. */
static void frontend__delays_every_request_and_counts_in_flight(void **state)
{
    (void)state;
    tdm_sim_trace t;
    fixed(&t, 200, 1024, 64, 0, INFINITY);
    tdm_sim_config c;
    config("{\"max_num_batched_tokens\": 8192}", &c);
    tdm_sim_run_opts o;
    tdm_sim_run_opts_init(&o);
    o.concurrency = 8;
    tdm_sim_result a, b, b2;
    run(&t, &c, &o, &a);
    o.frontend_s = 0.1;
    run(&t, &c, &o, &b);
    run(&t, &c, &o, &b2);
    assert_int_equal(b.sum.completed, a.sum.completed);
    assert_true(b.sum.ttft.p50 == b2.sum.ttft.p50); /* deterministic */
    for (size_t i = 0; i < t.n; i++) {
        const tdm_sim_req_out *q = &b.reqs[i];
        assert_true(q->first_token - q->arrival >= 0.05); /* at least fe/2 */
        uint32_t inflight = 0;
        for (size_t j = 0; j < t.n; j++)
            inflight += b.reqs[j].arrival <= q->arrival && b.reqs[j].finish > q->arrival;
        assert_true(inflight <= 8);
    }
    /* no request waits longer than the frontend's most plus the slowest TTFT without it */
    assert_true(b.sum.ttft.max < a.sum.ttft.max + 0.15 + 1e-9);
    tdm_sim_result_free(&a);
    tdm_sim_result_free(&b);
    tdm_sim_result_free(&b2);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The finish times of a run's requests, sorted: the k-th send of a closed loop of C takes
 * the slot the (k - C)-th of them freed. */
static double *sorted_finishes(const tdm_sim_result *r, size_t n)
{
    double *f = malloc(n * sizeof *f);
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) f[i] = r->reqs[i].finish;
    qsort(f, n, sizeof *f, cmp_double);
    return f;
}

/* The serving path as one server (frontend_service_s): requests sent together reach the
 * scheduler one service time apart, in the order sent, so the k-th waits (k+1) services
 * before its first step and the TTFT grows with the queue; sent slower than the server's
 * rate, they never queue and each pays one service. */
static void frontend_service__queues_requests_past_its_rate(void **state)
{
    (void)state;
    tdm_sim_config c;
    config("{\"max_num_batched_tokens\": 8192}", &c);
    tdm_sim_run_opts o;
    tdm_sim_run_opts_init(&o);
    tdm_sim_trace t;
    fixed(&t, 40, 64, 4, 0, INFINITY); /* all sent at 0 */
    tdm_sim_result a, b;
    run(&t, &c, &o, &a);
    o.frontend_service_s = 0.010;
    run(&t, &c, &o, &b);
    assert_int_equal(b.sum.completed, 40);
    for (size_t k = 0; k < t.n; k++) {
        double ttft = b.reqs[k].first_token - b.reqs[k].arrival;
        assert_true(ttft >= 0.010 * (double)(k + 1) - 1e-9);
    }
    assert_true(b.sum.ttft.max >= 0.40 - 1e-9);
    assert_true(a.sum.ttft.max < 0.40);
    tdm_sim_result_free(&a);
    tdm_sim_result_free(&b);
    tdm_sim_trace_free(&t);

    fixed(&t, 40, 64, 4, 0, 10.0); /* 10 req/s against a 100 req/s server */
    o.frontend_service_s = 0;
    run(&t, &c, &o, &a);
    o.frontend_service_s = 0.010;
    run(&t, &c, &o, &b);
    double extra = 0;
    for (size_t k = 0; k < t.n; k++) {
        double ttft = b.reqs[k].first_token - b.reqs[k].arrival;
        assert_true(ttft >= 0.010 - 1e-9);
        extra += ttft - (a.reqs[k].first_token - a.reqs[k].arrival);
    }
    extra /= (double)t.n;
    assert_true(extra > 0.005 && extra < 0.030); /* one service, give or take a step */
    tdm_sim_result_free(&a);
    tdm_sim_result_free(&b);
    tdm_sim_trace_free(&t);
    tdm_sim_config_free(&c);
}

/* The client's jitter (client_jitter_s): the k-th send (k >= C) leaves an exponential delay
 * of that mean after the slot it takes frees, and the delay is not counted in its TTFT (the
 * TTFT counts from the send); 0 sends at the finish itself. */
static void client_jitter__delays_sends_not_ttft(void **state)
{
    (void)state;
    tdm_sim_trace t;
    fixed(&t, 480, 512, 32, 0, INFINITY);
    tdm_sim_config c;
    config("{\"max_num_batched_tokens\": 8192}", &c);
    tdm_sim_run_opts o;
    tdm_sim_run_opts_init(&o);
    o.concurrency = 8;
    tdm_sim_result a, b;
    run(&t, &c, &o, &a);
    o.client_jitter_s = 0.05;
    run(&t, &c, &o, &b);
    assert_int_equal(b.sum.completed, a.sum.completed);
    double *fa = sorted_finishes(&a, t.n), *fb = sorted_finishes(&b, t.n);
    double gap = 0, gmax = 0;
    for (size_t k = 8; k < t.n; k++) {
        assert_true(fabs(a.reqs[k].arrival - fa[k - 8]) < 1e-12); /* no jitter: at the finish */
        double g = b.reqs[k].arrival - fb[k - 8];
        assert_true(g >= 0);
        gap += g;
        gmax = g > gmax ? g : gmax;
        /* TTFT from the send: never more than the lockstep run's slowest (a wave's) */
        assert_true(b.reqs[k].first_token - b.reqs[k].arrival <= a.sum.ttft.max + 1e-9);
    }
    gap /= (double)(t.n - 8);
    assert_true(gap > 0.04 && gap < 0.06); /* mean 50 ms over 472 exponential draws */
    assert_true(gmax > 0.1);                /* a tail, not a constant */
    free(fa);
    free(fb);
    tdm_sim_result_free(&a);
    tdm_sim_result_free(&b);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

/* The requests in [lo, hi) of r whose first token no other request in [lo, hi) shares. */
static size_t alone_in(const tdm_sim_result *r, size_t lo, size_t hi)
{
    size_t alone = 0;
    for (size_t i = lo; i < hi; i++) {
        int shared = 0;
        for (size_t j = lo; j < hi && !shared; j++)
            shared = j != i && r->reqs[j].first_token == r->reqs[i].first_token;
        alone += !shared;
    }
    return alone;
}

/* 240 equal requests (1024 prompt, 256 output tokens) in a closed loop of 8 under an
 * 8192-token budget, the first 16 left out: a wave's prompts fit one step. */
static void equal_loop(tdm_sim_trace *t, tdm_sim_config *c, tdm_sim_run_opts *o)
{
    fixed(t, 240, 1024, 256, 0, INFINITY);
    config("{\"max_num_batched_tokens\": 8192}", c);
    tdm_sim_run_opts_init(o);
    o->concurrency = 8;
    o->warmup = 16;
}

/* A closed loop of equal requests moves in lockstep: the first wave's prompts share a step,
 * its requests finish in one step and the next wave's prompts share a step again. With
 * desync, the first wave's slots are refilled at uniformly random times over the time so far
 * (one lifetime), and the measured requests then reach the scheduler apart: most have a first
 * token of their own, and the median TTFT is about one prompt's step instead of a wave's. */
static void desync__breaks_the_lockstep_of_equal_requests(void **state)
{
    (void)state;
    tdm_sim_trace t;
    tdm_sim_config c;
    tdm_sim_run_opts o;
    equal_loop(&t, &c, &o);
    tdm_sim_result a, b;
    run(&t, &c, &o, &a);
    o.desync = 1;
    run(&t, &c, &o, &b);
    double *f = sorted_finishes(&b, t.n);
    for (size_t k = 8; k < 16; k++) { /* the refills: within the time elapsed when sent */
        double g = b.reqs[k].arrival - f[k - 8];
        assert_true(g >= 0 && g <= f[k - 8] + 1e-12);
    }
    assert_int_equal(alone_in(&a, 16, t.n), 0);                /* lockstep: all shared */
    assert_true(alone_in(&b, 16, t.n) >= 3 * (t.n - 16) / 4); /* out of phase: most alone */
    assert_true(b.sum.ttft.p50 < 0.5 * a.sum.ttft.p50);
    free(f);
    tdm_sim_result_free(&a);
    tdm_sim_result_free(&b);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

/* desync = R keeps the loop in phase for R waves: the sends that refill waves 1..R-1 leave
 * the instant a slot frees (their prompts share steps as the burst's did), and only the R-th
 * wave's refills are spread, each within one request lifetime (the time so far over R) of
 * its slot freeing. R = 1 is the out-of-phase start above; a larger R ends out of phase too.
 * With a drained warm-up the measured phase counts its own waves from its burst. */
static void desync_round__keeps_the_loop_in_phase_for_r_waves(void **state)
{
    (void)state;
    tdm_sim_trace t;
    tdm_sim_config c;
    tdm_sim_run_opts o;
    equal_loop(&t, &c, &o);
    o.desync = 3;
    tdm_sim_result r;
    run(&t, &c, &o, &r);
    assert_int_equal(r.sum.completed, t.n - 16);
    double *f = sorted_finishes(&r, t.n);
    for (size_t k = 8; k < 24; k++) /* waves 2 and 3: sent as their slots free */
        assert_true(r.reqs[k].arrival == f[k - 8]);
    size_t spread = 0;
    for (size_t k = 24; k < 32; k++) { /* the third wave's refills: within a lifetime */
        double g = r.reqs[k].arrival - f[k - 8];
        assert_true(g >= 0 && g <= f[k - 8] / 3 + 1e-12);
        spread += g > 0;
    }
    assert_true(spread >= 6);
    /* in phase: the second and third waves' prompts share their first tokens' steps; out of
     * phase after: the requests past the fourth wave mostly come alone */
    assert_int_equal(alone_in(&r, 8, 24), 0);
    assert_true(alone_in(&r, 32, t.n) >= 3 * (t.n - 32) / 4);
    free(f);
    tdm_sim_result_free(&r);
    /* with aiperf's drained warm-up (16 = two waves, fewer than R), the waves are counted
     * from the measured burst (sends 16-23, at the last warm-up finish): the warm-up's
     * refills and the measured phase's second and third waves leave as slots free, and the
     * refills of its third wave (sends 40-47) are spread within one lifetime since the burst */
    o.warmup_drain = 1;
    run(&t, &c, &o, &r);
    f = sorted_finishes(&r, t.n);
    for (size_t k = 8; k < 40; k++)
        if (k < 16 || k >= 24)
            assert_true(r.reqs[k].arrival == f[k - 8]);
    spread = 0;
    for (size_t k = 40; k < 48; k++) {
        double g = r.reqs[k].arrival - f[k - 8];
        assert_true(g >= 0 && g <= (f[k - 8] - r.reqs[16].arrival) / 3 + 1e-12);
        spread += g > 0;
    }
    assert_true(spread >= 6);
    free(f);
    tdm_sim_result_free(&r);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

/* aiperf's phases (warmup_drain): the first measured request is sent only when the last
 * warm-up request finishes, the measured phase starts with `concurrency` sends at that
 * instant (a burst on an idle engine: its prompts queue for the token budget, and that
 * queueing is measured), and with desync the burst's slots are refilled at random times over
 * the time since the burst. Without the option the measured phase follows the warm-up. */
static void warmup_drain__measured_phase_starts_with_a_burst(void **state)
{
    (void)state;
    tdm_sim_trace t;
    fixed(&t, 96, 1024, 64, 0, INFINITY);
    tdm_sim_config c;
    config("{\"max_num_batched_tokens\": 2048}", &c);
    tdm_sim_run_opts o;
    tdm_sim_run_opts_init(&o);
    o.concurrency = 8;
    o.warmup = 16;
    o.desync = 1;
    tdm_sim_result a, b;
    run(&t, &c, &o, &a);
    o.warmup_drain = 1;
    run(&t, &c, &o, &b);
    assert_int_equal(b.sum.completed, t.n - 16); /* the measured ones */
    assert_int_equal(b.sum.warmup, 16);
    double wend_a = 0, wend_b = 0;
    for (size_t k = 0; k < 16; k++) {
        wend_a = a.reqs[k].finish > wend_a ? a.reqs[k].finish : wend_a;
        wend_b = b.reqs[k].finish > wend_b ? b.reqs[k].finish : wend_b;
    }
    assert_true(a.reqs[16].arrival < wend_a); /* no drain: sent while warm-ups run */
    for (size_t k = 16; k < 24; k++)          /* drained: the burst at the last finish */
        assert_true(b.reqs[k].arrival == wend_b);
    double *f = sorted_finishes(&b, t.n);
    for (size_t k = 24; k < 32; k++) { /* the burst's refills: desynchronized since it */
        double g = b.reqs[k].arrival - f[k - 8];
        assert_true(f[k - 8] >= wend_b);
        assert_true(g >= 0 && g <= f[k - 8] - wend_b + 1e-12);
    }
    for (size_t k = 16; k < t.n; k++) assert_true(b.reqs[k].arrival >= wend_b);
    /* 8 prompts of 1024 tokens under a 2048-token budget: at least 4 prefill steps, so the
     * burst's first tokens come at >= 4 different times, the last >= 3 steps after the first */
    size_t distinct = 0;
    double t0 = INFINITY, t1 = 0;
    for (size_t i = 16; i < 24; i++) {
        int seen = 0;
        for (size_t j = 16; j < i && !seen; j++)
            seen = b.reqs[j].first_token == b.reqs[i].first_token;
        distinct += !seen;
        t0 = b.reqs[i].first_token < t0 ? b.reqs[i].first_token : t0;
        t1 = b.reqs[i].first_token > t1 ? b.reqs[i].first_token : t1;
    }
    assert_true(distinct >= 4);
    assert_true(t1 - t0 >= 3 * (t0 - wend_b) * 0.9);
    /* the burst's queueing is in the measured TTFT: the mean grows, and more than the median */
    assert_true(b.sum.ttft.mean > 1.2 * a.sum.ttft.mean);
    assert_true(b.sum.ttft.mean > b.sum.ttft.p50);
    free(f);
    tdm_sim_result_free(&a);
    tdm_sim_result_free(&b);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

static void fixed__lengths_and_range(void **state)
{
    (void)state;
    tdm_sim_trace t;
    fixed(&t, 200, 1024, 128, 0, INFINITY);
    assert_int_equal(t.n, 200);
    for (size_t i = 0; i < t.n; i++) {
        assert_int_equal(t.reqs[i].prompt_len, 1024);
        assert_int_equal(t.reqs[i].output_len, 128);
        assert_true(t.reqs[i].arrival == 0.0); /* rate inf: all at once */
    }
    tdm_sim_trace_free(&t);
    fixed(&t, 500, 1000, 100, 0.5, 10);
    uint32_t lo = UINT32_MAX, hi = 0;
    for (size_t i = 0; i < t.n; i++) {
        assert_true(t.reqs[i].prompt_len >= 500 && t.reqs[i].prompt_len <= 1500);
        assert_true(t.reqs[i].output_len >= 50 && t.reqs[i].output_len <= 150);
        lo = t.reqs[i].prompt_len < lo ? t.reqs[i].prompt_len : lo;
        hi = t.reqs[i].prompt_len > hi ? t.reqs[i].prompt_len : hi;
    }
    assert_true(lo < 600 && hi > 1400); /* the range is used, not just its centre */
    assert_true(t.reqs[t.n - 1].arrival > 10); /* 500 requests at 10 req/s */
    tdm_sim_trace_free(&t);
}

static uint64_t prompt_digest(const tdm_sim_trace *t, size_t i, tdm_token *buf)
{
    tdm_sim_trace_tokens(t, i, buf);
    uint64_t h = 1469598103934665603ull ^ t->reqs[i].prompt_len;
    for (uint32_t k = 0; k < t->reqs[i].prompt_len; k++) h = (h ^ (uint64_t)buf[k]) * 1099511628211ull;
    return h;
}

/* aiperf's synthetic dataset (dataset_entries): the requests' prompts are N distinct ones,
 * each pass of N consecutive requests uses every one once in a shuffled order (a different
 * order each pass), equal prompts have equal tokens and lengths, and in a run the repeats
 * hit the prefix cache; without it every prompt is unique and nothing hits. */
static void dataset_entries__repeat_prompts_per_pass(void **state)
{
    (void)state;
    tdm_sim_trace_opts to;
    tdm_sim_trace_opts_init(&to);
    to.isl = 1000;
    to.osl = 16;
    to.len_range = 0.3;
    to.max_requests = 250;
    to.rate = INFINITY;
    to.dataset_entries = 40;
    tdm_sim_trace t, u;
    char err[TDM_SIM_ERRLEN];
    if (tdm_sim_trace_load(NULL, &to, &t, err, sizeof err) != 0) fail_msg("%s", err);
    to.dataset_entries = 0;
    if (tdm_sim_trace_load(NULL, &to, &u, err, sizeof err) != 0) fail_msg("%s", err);
    tdm_token *buf = malloc(1400 * sizeof *buf);
    uint64_t *d = malloc(t.n * sizeof *d);
    assert_non_null(buf);
    assert_non_null(d);
    for (size_t i = 0; i < t.n; i++) d[i] = prompt_digest(&t, i, buf);
    size_t distinct = 0, same_order = 0;
    for (size_t i = 0; i < t.n; i++) {
        size_t j = 0;
        while (j < i && d[j] != d[i]) j++;
        if (j == i) distinct++;
        else assert_int_equal(t.reqs[j].output_len, t.reqs[i].output_len);
        if (i >= 40 && i < 80) same_order += d[i] == d[i - 40];
        /* within a pass every prompt once */
        for (size_t k = i - i % 40; k < i; k++) assert_true(d[k] != d[i]);
    }
    assert_int_equal(distinct, 40);
    assert_true(same_order < 10); /* the second pass is reshuffled */
    size_t udist = 0;
    for (size_t i = 0; i < u.n; i++) {
        uint64_t x = prompt_digest(&u, i, buf);
        size_t j = 0;
        while (j < i && prompt_digest(&u, j, buf) != x) j++;
        udist += j == i;
    }
    assert_int_equal(udist, u.n);
    tdm_sim_config c;
    config("{\"max_num_batched_tokens\": 8192, \"enable_prefix_caching\": true}", &c);
    tdm_sim_run_opts o;
    tdm_sim_run_opts_init(&o);
    o.concurrency = 8;
    tdm_sim_result a, b;
    run(&t, &c, &o, &a);
    run(&u, &c, &o, &b);
    assert_true(a.sum.prefix_hit_rate > 0.7); /* 210 of 250 repeat a cached prompt */
    assert_true(b.sum.prefix_hit_rate == 0);
    assert_true(a.sum.ttft.mean < 0.5 * b.sum.ttft.mean);
    free(buf);
    free(d);
    tdm_sim_result_free(&a);
    tdm_sim_result_free(&b);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
    tdm_sim_trace_free(&u);
}

static void closed_loop__at_most_concurrency_in_flight(void **state)
{
    (void)state;
    tdm_sim_trace t;
    fixed(&t, 60, 700, 40, 0.5, INFINITY);
    tdm_sim_config c;
    config("{\"max_num_batched_tokens\": 2048}", &c);
    tdm_sim_run_opts o;
    tdm_sim_run_opts_init(&o);
    o.concurrency = 5;
    tdm_sim_result r;
    run(&t, &c, &o, &r);
    assert_int_equal(r.sum.concurrency, 5);
    assert_int_equal(r.sum.warmup, 5); /* the default rule: the first wave */
    assert_int_equal(r.sum.requests, 55);
    assert_int_equal(r.sum.completed, 55);
    for (size_t i = 0; i < t.n; i++) {
        const tdm_sim_req_out *q = &r.reqs[i];
        assert_int_equal(q->status, 1);
        assert_int_equal(q->warmup, i < 5);
        if (i < 5) {
            assert_true(q->arrival == 0.0);
            continue;
        }
        /* sent exactly when an earlier request finished */
        int found = 0;
        for (size_t j = 0; j < i; j++) found |= r.reqs[j].finish == q->arrival;
        if (!found) fail_msg("request %zu sent at %.6f, when no request finished", i, q->arrival);
        /* in flight at its send: the requests sent before it and not yet finished */
        uint32_t inflight = 1;
        for (size_t j = 0; j < i; j++)
            inflight += r.reqs[j].arrival <= q->arrival && r.reqs[j].finish > q->arrival;
        if (inflight > 5) fail_msg("%u requests in flight at %.6f", inflight, q->arrival);
    }
    /* the same trace open loop (all at t = 0) keeps all 60 in flight at once */
    tdm_sim_run_opts_init(&o);
    tdm_sim_result ro;
    run(&t, &c, &o, &ro);
    assert_int_equal(ro.sum.warmup, 0);
    assert_int_equal(ro.sum.requests, 60);
    assert_true(ro.sum.ttft.p99 > r.sum.ttft.p99); /* everything queued behind everything */
    tdm_sim_result_free(&ro);
    tdm_sim_result_free(&r);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

static void warmup__requests_left_out_of_the_metrics(void **state)
{
    (void)state;
    tdm_sim_trace t;
    fixed(&t, 40, 512, 32, 0.3, 20);
    tdm_sim_config c;
    config("{}", &c);
    tdm_sim_run_opts o;
    tdm_sim_run_opts_init(&o);
    o.warmup = 0;
    tdm_sim_result a, b;
    run(&t, &c, &o, &a);
    o.warmup = 10;
    run(&t, &c, &o, &b);
    assert_int_equal(a.sum.requests, 40);
    assert_int_equal(b.sum.requests, 30);
    assert_int_equal(b.sum.ttft.n, 30);
    assert_int_equal(b.sum.e2e.n, 30);
    /* the gaps of the measured requests only */
    uint64_t gaps = 0;
    for (size_t i = 10; i < t.n; i++) gaps += b.reqs[i].generated - 1;
    assert_int_equal(b.sum.itl.n, gaps);
    /* the window starts at the first measured send */
    double last = 0;
    for (size_t i = 10; i < t.n; i++) last = b.reqs[i].finish > last ? b.reqs[i].finish : last;
    assert_true(fabs(b.sum.duration_s - (last - b.reqs[10].arrival)) < 1e-9);
    /* the runs are the same underneath: request 20 saw the same thing */
    assert_true(a.reqs[20].first_token == b.reqs[20].first_token);
    o.warmup = 40;
    tdm_sim_result z;
    char err[TDM_SIM_ERRLEN];
    assert_int_equal(tdm_sim_run(&t, &c, &o, &z, err, sizeof err), -1);
    assert_non_null(strstr(err, "warm-up"));
    tdm_sim_result_free(&a);
    tdm_sim_result_free(&b);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

/* Six requests queued at t = 0, one running at a time: the service order is the policy's. */
static void slo_trace(tdm_sim_trace *t)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "slo");
    static const char *const CLS[6] = {"relaxed", "tight", "mid", "best_effort", "tight", "mid"};
    for (int i = 0; i < 6; i++) {
        tdm_sim_req q = {0};
        q.prompt_len = 600;
        q.output_len = 4;
        q.slo_class = tdm_sim_trace_slo_class(t, CLS[i], strlen(CLS[i]));
        assert_int_equal(tdm_sim_trace_push(t, &q, NULL, 0), 0);
    }
}

static void slo_classes__slo_policy_serves_by_deadline(void **state)
{
    (void)state;
    tdm_sim_trace t;
    slo_trace(&t);
    assert_int_equal(t.n_slo, 4);
    static const tdm_sim_slo_class CL[] = {
        {"relaxed", 5.0, 0.1}, {"tight", 0.1, 0.05}, {"mid", 1.0, 0.05}};
    tdm_sim_run_opts o;
    tdm_sim_run_opts_init(&o);
    o.slo_classes = CL;
    o.n_slo_classes = 3;
    tdm_sim_config cs, cf;
    config("{\"policy\": \"slo\", \"max_num_seqs\": 1}", &cs);
    config("{\"policy\": \"fcfs\", \"max_num_seqs\": 1}", &cf);
    tdm_sim_result rs, rf;
    run(&t, &cs, &o, &rs);
    run(&t, &cf, &o, &rf);
    /* each request carries its class's SLOs */
    assert_true(rs.reqs[1].has_slo && rs.reqs[1].slo_ttft_s == 0.1);
    assert_true(rs.reqs[3].has_slo && rs.reqs[3].slo_ttft_s == 0.0);
    /* FCFS: trace order. SLO: deadlines 0.1 (1, 4), 1.0 (2, 5), 5.0 (0), best effort (3) last */
    static const int FCFS[6] = {0, 1, 2, 3, 4, 5}, SLO[6] = {1, 4, 2, 5, 0, 3};
    for (int k = 0; k + 1 < 6; k++) {
        if (!(rf.reqs[FCFS[k]].first_token < rf.reqs[FCFS[k + 1]].first_token))
            fail_msg("fcfs: request %d not served before %d", FCFS[k], FCFS[k + 1]);
        if (!(rs.reqs[SLO[k]].first_token < rs.reqs[SLO[k + 1]].first_token))
            fail_msg("slo: request %d (ttft %.3f) not served before %d (ttft %.3f)", SLO[k],
                     rs.reqs[SLO[k]].first_token, SLO[k + 1], rs.reqs[SLO[k + 1]].first_token);
    }
    /* the tight requests come out earlier than under FCFS, the best-effort one later */
    assert_true(rs.reqs[1].first_token < rf.reqs[1].first_token);
    assert_true(rs.reqs[4].first_token < rf.reqs[4].first_token);
    assert_true(rs.reqs[3].first_token > rf.reqs[3].first_token);
    assert_true(rs.sum.attain_ttft >= rf.sum.attain_ttft);
    tdm_sim_result_free(&rs);
    tdm_sim_result_free(&rf);
    tdm_sim_config_free(&cs);
    tdm_sim_config_free(&cf);
    tdm_sim_trace_free(&t);
}

static void slo_classes__undefined_class_is_an_error(void **state)
{
    (void)state;
    tdm_sim_trace t;
    slo_trace(&t);
    tdm_sim_config c;
    config("{}", &c);
    tdm_sim_result r;
    char err[TDM_SIM_ERRLEN];
    assert_int_equal(tdm_sim_run(&t, &c, NULL, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "'relaxed'"));
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

/* Uniform SLOs order as arrivals do, so the slo policy equals FCFS; two classes make it differ. */
static void slo_classes__make_the_slo_policy_differ_from_fcfs(void **state)
{
    (void)state;
    tdm_sim_trace t;
    fixed(&t, 300, 1500, 60, 0.5, 40);
    static const tdm_sim_slo_class CL[] = {{"chat", 0.3, 0.05}};
    tdm_sim_run_opts o;
    tdm_sim_run_opts_init(&o);
    tdm_sim_config cs, cf;
    config("{\"policy\": \"slo\"}", &cs);
    config("{\"policy\": \"fcfs\"}", &cf);
    tdm_sim_result rs, rf;
    run(&t, &cs, &o, &rs); /* without classes: every request the run's SLOs */
    run(&t, &cf, &o, &rf);
    assert_int_equal(rs.sum.steps, rf.sum.steps);
    for (size_t i = 0; i < t.n; i++) assert_true(rs.reqs[i].first_token == rf.reqs[i].first_token);
    tdm_sim_result_free(&rs);
    tdm_sim_result_free(&rf);
    /* every third request a chat with a 300 ms TTFT target, the rest best-effort batch */
    for (size_t i = 0; i < t.n; i++)
        t.reqs[i].slo_class = tdm_sim_trace_slo_class(&t, i % 3 ? "batch" : "chat", i % 3 ? 5 : 4);
    o.slo_classes = CL;
    o.n_slo_classes = 1;
    run(&t, &cs, &o, &rs);
    run(&t, &cf, &o, &rf);
    double chat_s = 0, chat_f = 0;
    size_t differ = 0, n = 0;
    for (size_t i = 0; i < t.n; i += 3, n++) {
        chat_s += rs.reqs[i].first_token - rs.reqs[i].arrival;
        chat_f += rf.reqs[i].first_token - rf.reqs[i].arrival;
    }
    for (size_t i = 0; i < t.n; i++) differ += rs.reqs[i].first_token != rf.reqs[i].first_token;
    assert_true(differ > 0);
    /* per-class figures: chat is class 1 (first named), batch 2 (best effort) */
    assert_int_equal(rs.n_classes, 2);
    assert_string_equal(rs.classes[0].name, "chat");
    assert_true(rs.classes[0].ttft_s == 0.3 && rs.classes[1].ttft_s == 0);
    assert_int_equal(rs.sum.class_n[0], 100);
    assert_int_equal(rs.sum.class_n[1], 200);
    assert_true(rs.sum.class_attain[1] == 1.0); /* best effort meets it by definition */
    assert_true(rs.sum.class_attain_ttft[0] >= rf.sum.class_attain_ttft[0]);
    if (!(chat_s < chat_f)) fail_msg("chat TTFT mean: slo %.4f s, fcfs %.4f s", chat_s / n, chat_f / n);
    tdm_sim_result_free(&rs);
    tdm_sim_result_free(&rf);
    tdm_sim_config_free(&cs);
    tdm_sim_config_free(&cf);
    tdm_sim_trace_free(&t);
}

static void steptrace__csv_rows_and_chrome_tracks(void **state)
{
    (void)state;
    tdm_sim_trace t;
    fixed(&t, 40, 800, 20, 0.5, 30);
    tdm_sim_config c;
    config("{\"deployment\": {\"mode\": \"disaggregated\", \"prefill\": {\"instances\": 2}, "
           "\"decode\": {\"instances\": 1}}}", &c);
    char csv[256], js[256];
    write_tmp(csv, sizeof csv, "steps.csv", "");
    write_tmp(js, sizeof js, "chrome.json", "");
    tdm_sim_run_opts o;
    tdm_sim_run_opts_init(&o);
    o.steps_csv = fopen(csv, "w");
    o.chrome_trace = fopen(js, "w");
    assert_non_null(o.steps_csv);
    assert_non_null(o.chrome_trace);
    tdm_sim_result r;
    run(&t, &c, &o, &r);
    fclose(o.steps_csv);
    fclose(o.chrome_trace);
    /* CSV: a header, one row per step; prefill instances never decode */
    FILE *f = fopen(csv, "r");
    char line[512];
    assert_non_null(fgets(line, sizeof line, f));
    assert_non_null(strstr(line, "start_s,duration_s,prefill_tokens"));
    assert_non_null(strstr(line, "kv_usage,preemptions"));
    uint64_t rows = 0, ptok = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned inst, pr, dr, bt, run_, wait, pre;
        unsigned long long step, pt, dc;
        char role[16];
        double st, du, kv;
        int k = sscanf(line, "%u,%15[a-z],%llu,%lf,%lf,%llu,%u,%u,%llu,%u,%u,%u,%lf,%u", &inst, role,
                       &step, &st, &du, &pt, &pr, &dr, &dc, &bt, &run_, &wait, &kv, &pre);
        assert_int_equal(k, 14);
        assert_true(du > 0 && kv >= 0 && kv <= 1);
        if (inst < 2) {
            assert_string_equal(role, "prefill");
            assert_int_equal(dr, 0);
        } else {
            assert_string_equal(role, "decode");
        }
        ptok += inst < 2 ? pt : 0;
        rows++;
    }
    fclose(f);
    assert_int_equal(rows, r.sum.steps);
    uint64_t prompts = 0;
    for (size_t i = 0; i < t.n; i++) prompts += t.reqs[i].prompt_len;
    assert_true(ptok >= prompts); /* every prompt token prefilled (recomputes add more) */
    /* Chrome trace: the structure Perfetto expects */
    json_error_t je;
    json_t *root = json_load_file(js, 0, &je);
    if (!root) fail_msg("%s:%d: %s", js, je.line, je.text);
    json_t *ev = json_object_get(root, "traceEvents");
    assert_true(json_is_array(ev));
    size_t i, steps = 0, xfers = 0, names = 0, counters = 0;
    json_t *e;
    json_array_foreach(ev, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        assert_non_null(ph);
        assert_true(json_is_integer(json_object_get(e, "pid")));
        json_int_t tid = json_integer_value(json_object_get(e, "tid"));
        if (!strcmp(ph, "M")) {
            names += !strcmp(json_string_value(json_object_get(e, "name")), "thread_name");
            continue;
        }
        if (!strcmp(ph, "C")) { /* KV usage and queue counters, one pair per step */
            json_t *args = json_object_get(e, "args");
            assert_true(json_is_object(args) && json_object_size(args) >= 1);
            counters++;
            continue;
        }
        assert_string_equal(ph, "X");
        assert_true(json_is_number(json_object_get(e, "ts")));
        assert_true(json_number_value(json_object_get(e, "dur")) > 0);
        const char *cat = json_string_value(json_object_get(e, "cat"));
        if (!strcmp(cat, "step")) {
            assert_true(tid >= 0 && tid < 3);
            steps++;
        } else {
            assert_string_equal(cat, "kv_transfer");
            assert_true(tid >= 100000 && tid < 100002); /* the link of prefill 0 or 1 */
            xfers++;
        }
    }
    assert_int_equal(steps, r.sum.steps);
    assert_int_equal(counters, 2 * r.sum.steps);
    assert_int_equal(xfers, r.sum.kv_transfers);
    assert_int_equal(xfers, t.n);
    assert_int_equal(names, 3 + 2); /* three instances, two prefill links */
    json_decref(root);
    unlink(csv);
    unlink(js);
    tdm_sim_result_free(&r);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

static void prefill_first__end_to_end_differs_from_vllm(void **state)
{
    (void)state;
    tdm_sim_trace t;
    fixed(&t, 200, 900, 80, 0.8, 25);
    tdm_sim_config a, b;
    config("{\"mode\": \"vllm\"}", &a);
    config("{\"mode\": \"prefill_first\"}", &b);
    tdm_sim_result ra, rb;
    run(&t, &a, NULL, &ra);
    run(&t, &b, NULL, &rb);
    assert_int_equal(ra.sum.completed, 200);
    assert_int_equal(rb.sum.completed, 200);
    for (size_t i = 0; i < t.n; i++) assert_int_equal(rb.reqs[i].generated, t.reqs[i].output_len);
    /* prompts jump ahead of decodes: TTFT down, token gaps up */
    assert_true(rb.sum.ttft.mean < ra.sum.ttft.mean);
    assert_true(rb.sum.itl.p99 > ra.sum.itl.p99);
    tdm_sim_result_free(&ra);
    tdm_sim_result_free(&rb);
    tdm_sim_config_free(&a);
    tdm_sim_config_free(&b);
    tdm_sim_trace_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fixed__lengths_and_range),
        cmocka_unit_test(frontend__delays_every_request_and_counts_in_flight),
        cmocka_unit_test(frontend_service__queues_requests_past_its_rate),
        cmocka_unit_test(client_jitter__delays_sends_not_ttft),
        cmocka_unit_test(desync__breaks_the_lockstep_of_equal_requests),
        cmocka_unit_test(desync_round__keeps_the_loop_in_phase_for_r_waves),
        cmocka_unit_test(warmup_drain__measured_phase_starts_with_a_burst),
        cmocka_unit_test(dataset_entries__repeat_prompts_per_pass),
        cmocka_unit_test(closed_loop__at_most_concurrency_in_flight),
        cmocka_unit_test(warmup__requests_left_out_of_the_metrics),
        cmocka_unit_test(slo_classes__slo_policy_serves_by_deadline),
        cmocka_unit_test(slo_classes__undefined_class_is_an_error),
        cmocka_unit_test(slo_classes__make_the_slo_policy_differ_from_fcfs),
        cmocka_unit_test(steptrace__csv_rows_and_chrome_tracks),
        cmocka_unit_test(prefill_first__end_to_end_differs_from_vllm),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
