/*
 * test_sched_slo_adaptive.c -- the SLO-adaptive policy's decisions on small hand-built
 * scenarios, with a linear cost model installed so the expected chunks can be computed by
 * hand: least-laxity order, the step budget's response to a TPOT overrun and to steps that
 * take longer than predicted, the starvation bound, preemption that spares requests on
 * track, TDM_REQ_SLO_DEPRIORITIZE (the hopeless head and the overload rule that demotes the
 * longest waiting prefill), and its configuration keys.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../../../sched/sched_debug.h"
#include "tandem.h"

/* 2 ms per step, 10 us per prefill token, 0.1 ms per decode. */
#define BASE 0.002
#define PER_TOKEN 1e-5
#define PER_DECODE 1e-4
/* The policy's step target for a 25 ms TPOT: the 0.95 margin (sched/slo_adaptive.c). */
#define G (0.025 * 0.95)
/* The largest chunk next to one decode within a step of t seconds. */
#define FIT(t) ((uint32_t)(((t) - BASE - PER_DECODE) / PER_TOKEN))
static double linear_cost(void *ctx, const tdm_step_shape *sh)
{
    (void)ctx;
    if (!sh->num_prefill_tokens && !sh->num_decode_tokens) return 0.0;
    return BASE + PER_TOKEN * sh->num_prefill_tokens + PER_DECODE * sh->num_decode_reqs;
}

static tdm_sched *make(const char *json)
{
    tdm_sched *s;
    assert_int_equal(tdm_sched_create(&s), TDM_OK);
    if (tdm_sched_configure(s, json) != TDM_OK) fail_msg("configure: %s", tdm_sched_errmsg(s));
    tdm_cost_model cm = { TDM_COST_MODEL_VERSION, NULL, linear_cost };
    assert_int_equal(tdm_sched_set_cost_model(s, &cm), TDM_OK);
    return s;
}

static void add(tdm_sched *s, uint64_t id, uint32_t n, double arrival, double ttft, double tpot,
                uint32_t max_tokens, uint32_t flags)
{
    static tdm_token p[16384];
    for (uint32_t i = 0; i < n; i++) p[i] = (tdm_token)(100000 * (id % 1000) + i);
    tdm_request_desc d;
    tdm_request_desc_init(&d);
    d.id = id;
    d.prompt = p;
    d.num_prompt_tokens = n;
    d.max_tokens = max_tokens;
    d.arrival_time = arrival;
    d.ttft_slo = ttft;
    d.tpot_slo = tpot;
    d.flags = flags;
    if (tdm_sched_add(s, &d) != TDM_OK) fail_msg("add %llu: %s", (unsigned long long)id, tdm_sched_errmsg(s));
}

static void check(const tdm_sched *s)
{
    char msg[256];
    if (tdm__sched_check(s, msg, sizeof msg) != TDM_OK) fail_msg("%s", msg);
}

/* Report one token for every entry that reached the end of its tokens. */
static void update(tdm_sched *s, const tdm_batch *b, double now)
{
    uint32_t off[65];
    tdm_token toks[64];
    uint64_t ids[64];
    uint32_t n = 0, nt = 0;
    off[0] = 0;
    for (uint32_t i = 0; i < b->num_reqs && i < 64; i++) {
        ids[n] = b->req_ids[i];
        tdm_request_info info;
        tdm_request_info_init(&info);
        assert_int_equal(tdm_sched_request_info(s, b->req_ids[i], &info), TDM_OK);
        if (info.num_computed_tokens >= info.num_prompt_tokens + info.num_output_tokens) toks[nt++] = 7;
        off[++n] = nt;
    }
    tdm_step_output o;
    tdm_step_output_init(&o);
    o.num_reqs = n;
    o.req_ids = ids;
    o.token_offsets = off;
    o.tokens = toks;
    o.now = now;
    assert_int_equal(tdm_sched_update(s, &o, NULL), TDM_OK);
    check(s);
}

static uint32_t tokens_of(const tdm_batch *b, uint64_t id)
{
    for (uint32_t i = 0; i < b->num_reqs; i++)
        if (b->req_ids[i] == id) return b->num_tokens[i];
    return 0;
}

static void slo_adaptive__config_keys_round_trip(void **state)
{
    (void)state;
    tdm_sched *s = make("{\"policy\": \"slo_adaptive\", \"slo_ttft_ms\": 300, \"slo_tpot_ms\": 25.5}");
    int64_t v = -1;
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_POLICY, &v), TDM_OK);
    assert_int_equal(v, TDM_POLICY_SLO_ADAPTIVE);
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_SLO_TTFT_US, &v), TDM_OK);
    assert_int_equal(v, 300000);
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_SLO_TPOT_US, &v), TDM_OK);
    assert_int_equal(v, 25500);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_SLO_TPOT_US, -1), TDM_E_CONFIG);
    assert_int_equal(tdm_sched_configure(s, "{\"slo_ttft_ms\": \"fast\"}"), TDM_E_CONFIG);
    assert_non_null(strstr(tdm_sched_errmsg(s), "slo_ttft_ms"));
    assert_int_equal(tdm_sched_configure(s, "{\"policy\": \"adaptive\"}"), TDM_E_CONFIG);
    assert_non_null(strstr(tdm_sched_errmsg(s), "slo_adaptive"));
    char buf[4096];
    size_t len = 0;
    assert_int_equal(tdm_sched_get_config(s, buf, sizeof buf, &len), TDM_OK);
    assert_non_null(strstr(buf, "\"slo_adaptive\""));
    assert_non_null(strstr(buf, "\"slo_tpot_ms\""));
    tdm_request_desc d; /* the flag is accepted */
    tdm_token p[4] = { 1, 2, 3, 4 };
    tdm_request_desc_init(&d);
    d.id = 9;
    d.prompt = p;
    d.num_prompt_tokens = 4;
    d.flags = TDM_REQ_SLO_DEPRIORITIZE;
    assert_int_equal(tdm_sched_add(s, &d), TDM_OK);
    d.id = 10;
    d.flags = 1u << 30;
    assert_int_equal(tdm_sched_add(s, &d), TDM_E_INVAL);
    tdm_sched_destroy(s);
}

/* One request runs at a time, so admission order is the policy's order. Least laxity: of
 * two requests with the same deadline the one with the longer prefill goes first (EDF would
 * keep arrival order); an earlier deadline beats both. */
static void slo_adaptive__admits_least_laxity_first(void **state)
{
    (void)state;
    tdm_sched *s = make("{\"policy\": \"slo_adaptive\", \"max_num_seqs\": 1, \"max_num_batched_tokens\": 8192,"
                        " \"num_blocks\": 2000}");
    add(s, 1, 16, 0.0, 1.0, 0, 1, 0);   /* deadline 1.0, 2.2 ms of prefill */
    add(s, 2, 4000, 0.0, 1.0, 0, 1, 0); /* deadline 1.0, 42 ms of prefill: less slack */
    add(s, 3, 16, 0.1, 0.5, 0, 1, 0);   /* deadline 0.6: first */
    add(s, 4, 16, 0.0, 0, 0, 1, 0);     /* no SLO: last (starvation bound 10 s) */
    const uint64_t want[] = { 3, 2, 1, 4 };
    tdm_batch b;
    tdm_batch_init(&b);
    for (size_t k = 0; k < 4; k++) {
        double now = 0.2 + 0.1 * (double)k;
        assert_int_equal(tdm_sched_step(s, now, &b), TDM_OK);
        assert_int_equal(b.num_reqs, 1);
        assert_int_equal(b.req_ids[0], want[k]);
        update(s, &b, now + 0.05); /* max_tokens 1: finished */
    }
    tdm_sched_destroy(s);
}

/* A decoding request (TPOT `tpot`; 25 ms makes a 23.75 ms step target with the 0.95 margin)
 * and a long prompt without a TTFT SLO: the chunk fills the target. Returns the chunk of
 * request 2 in the step `lag` after the decode's next token is due less one target, with
 * every step before reported `slow` times its predicted length. */
static uint32_t chunk_after_tpot(double slow, double lag, double tpot)
{
    tdm_sched *s = make("{\"policy\": \"slo_adaptive\", \"max_num_batched_tokens\": 8192, \"num_blocks\": 2000,"
                        " \"enable_prefix_caching\": false}");
    tdm_batch b;
    tdm_batch_init(&b);
    add(s, 1, 16, 1.0, 0, tpot, 200, 0);
    double t = 1.0;
    assert_int_equal(tdm_sched_step(s, t, &b), TDM_OK); /* its prompt: 2.16 ms */
    t += 0.00216 * slow;
    update(s, &b, t);
    double first = t;
    for (int k = 0; k < 10; k++) { /* ten decodes of 2.1 ms each */
        assert_int_equal(tdm_sched_step(s, t, &b), TDM_OK);
        assert_int_equal(b.num_reqs, 1);
        t += 0.0021 * slow;
        update(s, &b, t);
    }
    /* 11 tokens out: the 12th is due at first + 11 * G; step one target before that (plus a
     * lag: the host was late by that much). */
    double now = first + 10 * tpot * 0.95 + lag;
    add(s, 2, 8000, now, 0, 0, 1, 0);
    assert_int_equal(tdm_sched_step(s, now, &b), TDM_OK);
    assert_int_equal(tokens_of(&b, 1), 1);
    uint32_t n = tokens_of(&b, 2);
    tdm_sched_destroy(s);
    return n;
}

static uint32_t chunk_after(double slow, double lag)
{
    return chunk_after_tpot(slow, lag, 0.025);
}

static void slo_adaptive__budget_follows_tpot_bank_overrun_and_slow_steps(void **state)
{
    (void)state;
    /* on track: 2 ms + 0.1 ms + 10 us * n <= 23.75 ms -> n = 2165 */
    uint32_t on_track = chunk_after(1.0, 0.0);
    assert_in_range(on_track, FIT(G) - 10, FIT(G) + 1);
    /* 10 ms ahead (banked): the next token is due in 33.75 ms -> n = 3165 */
    uint32_t ahead = chunk_after(1.0, -0.010);
    assert_in_range(ahead, FIT(G + 0.010) - 10, FIT(G + 0.010) + 1);
    /* 10 ms late: the next token is due in 13.75 ms -> n = 1165 */
    uint32_t late = chunk_after(1.0, 0.010);
    assert_in_range(late, FIT(G - 0.010) - 10, FIT(G - 0.010) + 1);
    /* far behind (TPOT overrun): the floor, half the target -> n = 977 */
    uint32_t overrun = chunk_after(1.0, 0.5);
    assert_in_range(overrun, FIT(G / 2) - 10, FIT(G / 2) + 1);
    /* TPOT 5 ms, far behind: half the 4.75 ms target (2.375 ms) would leave 27 tokens next to
     * the 2.1 ms decode step; the floor keeps a quarter target of prefill beyond that step,
     * 2.1 + 1.1875 ms -> n = 118 */
    uint32_t heavy = chunk_after_tpot(1.0, 0.5, 0.005);
    assert_in_range(heavy, FIT(BASE + PER_DECODE + 0.25 * 0.005 * 0.95) - 10,
                    FIT(BASE + PER_DECODE + 0.25 * 0.005 * 0.95) + 1);
    /* steps measured 2x their prediction: the target in cost-model time shrinks by the
     * smoothed ratio, 1 + (1 - 0.8^11) = 1.91 after eleven reports -> n = 1031 */
    uint32_t slow = chunk_after(2.0, 0.0);
    double ratio = 2.0 - 0.0859; /* 0.8^11 = 0.0859 */
    assert_in_range(slow, FIT(G / ratio) - 10, FIT(G / ratio) + 1);
    assert_true(overrun < late && late < on_track && slow < on_track && on_track < ahead);
}

/* An n-token prompt with a TTFT of `ttft` arrives next to a decode on track (11 tokens out
 * of at most `decode_max`): at the paced target it moves 2165 tokens a step. Returns its
 * first chunk. */
static uint32_t urgent_chunk_next_to(uint32_t n, double ttft, uint32_t decode_max)
{
    tdm_sched *s = make("{\"policy\": \"slo_adaptive\", \"max_num_batched_tokens\": 8192, \"num_blocks\": 2000,"
                        " \"enable_prefix_caching\": false}");
    tdm_batch b;
    tdm_batch_init(&b);
    add(s, 1, 16, 1.0, 0, 0.025, decode_max, 0);
    assert_int_equal(tdm_sched_step(s, 1.0, &b), TDM_OK);
    double t = 1.0 + 0.00216;
    update(s, &b, t);
    double first = t;
    for (int k = 0; k < 10; k++) {
        assert_int_equal(tdm_sched_step(s, t, &b), TDM_OK);
        t += 0.0021;
        update(s, &b, t);
    }
    double now = first + 10 * G;
    add(s, 2, n, now, ttft, 0, 1, 0);
    assert_int_equal(tdm_sched_step(s, now, &b), TDM_OK);
    assert_int_equal(tokens_of(&b, 1), 1);
    uint32_t chunk = tokens_of(&b, 2);
    tdm_sched_destroy(s);
    return chunk;
}

/* A 3000-token prompt next to a long decode: paced, it needs two steps, 47.5 ms. */
static uint32_t urgent_chunk(double ttft)
{
    return urgent_chunk_next_to(3000, ttft, 500);
}

/* The step widens past the TPOT pace only when that saves a TTFT the pace would miss, and
 * the decode can recover the extra time over its expected output. */
static void slo_adaptive__step_widens_to_save_an_urgent_ttft(void **state)
{
    (void)state;
    assert_in_range(urgent_chunk(1.0), FIT(G) - 10, FIT(G) + 1); /* the pace meets 1 s */
    assert_int_equal(urgent_chunk(0.040), 3000);                   /* 40 ms: all of it now */
}

/* A widening that every decode can recover in full over its expected output is taken whole;
 * past that, only half the recovery (the soft target) is spent. The decode has 11 tokens out
 * of `max` and recovers 23.75 - 2.1 = 21.65 ms a token; its next token is due in one target.
 * A 7000-token prompt (72.1 ms alone with the decode) with an 80 ms TTFT misses paced (four
 * steps, 95 ms). */
static void slo_adaptive__widening_spends_a_full_recovery_only_whole(void **state)
{
    (void)state;
    /* 3 tokens left: 64.95 ms to recover, the full target 88.7 ms >= 72.1: all of it */
    assert_int_equal(urgent_chunk_next_to(7000, 0.080, 14), 7000);
    /* 2 left: 43.3 ms, full 67.05 ms < 72.1: the soft target, 23.75 + 21.65 = 45.4 ms */
    assert_in_range(urgent_chunk_next_to(7000, 0.080, 13), FIT(G + 0.02165) - 10, FIT(G + 0.02165) + 1);
}

/* With no decode to protect, a step is still capped at a sixth of the TTFT target (it
 * delays every request arriving behind it): 16.7 ms for 100 ms -> (16.67 - 2) / 0.01 = 1466
 * tokens. */
static void slo_adaptive__step_without_decodes_is_capped_by_ttft(void **state)
{
    (void)state;
    tdm_sched *s = make("{\"policy\": \"slo_adaptive\", \"slo_ttft_ms\": 100, \"max_num_batched_tokens\": 8192,"
                        " \"num_blocks\": 2000}");
    tdm_batch b;
    tdm_batch_init(&b);
    add(s, 1, 8000, 0.0, 0, 0, 1, 0);
    assert_int_equal(tdm_sched_step(s, 0.0, &b), TDM_OK);
    assert_in_range(tokens_of(&b, 1), 1456, 1467);
    tdm_sched_destroy(s);
}

/* A request without an SLO waits behind a stream of requests with one, but its key is
 * capped at arrival + 10 s: it is admitted once the newcomers' deadlines pass that point. */
static void slo_adaptive__starvation_is_bounded(void **state)
{
    (void)state;
    tdm_sched *s = make("{\"policy\": \"slo_adaptive\", \"max_num_seqs\": 1, \"num_blocks\": 500}");
    tdm_batch b;
    tdm_batch_init(&b);
    add(s, 1, 16, 0.0, 0, 0, 1, 0);
    double served = -1;
    for (int k = 0; k < 60 && served < 0; k++) {
        double now = 0.5 * k;
        add(s, 100 + (uint64_t)k, 16, now, 0.3, 0, 1, 0);
        assert_int_equal(tdm_sched_step(s, now, &b), TDM_OK);
        assert_int_equal(b.num_reqs, 1);
        if (b.req_ids[0] == 1) served = now;
        update(s, &b, now + 0.01);
    }
    /* newcomers' keys are about arrival + 0.3: they stop beating 10.0 after 9.7 s */
    assert_true(served >= 9.5 && served <= 10.5);
    tdm_sched_destroy(s);
}

/* Out of blocks: FCFS and the adaptive policy alike take the latest admitted running
 * request, unless an earlier one already lost its SLO (here: its first token came after its
 * TTFT deadline), which is then preempted instead, sparing the one on track. */
static uint64_t victim(double ttft_first)
{
    tdm_sched *s = make("{\"policy\": \"slo_adaptive\", \"num_blocks\": 6, \"block_size\": 16,"
                        " \"enable_prefix_caching\": false, \"max_model_len\": 512}");
    tdm_batch b;
    tdm_batch_init(&b);
    add(s, 1, 32, 0.0, ttft_first, 0, 50, 0);
    assert_int_equal(tdm_sched_step(s, 0.1, &b), TDM_OK);
    update(s, &b, 0.15); /* its first token at 0.15 */
    add(s, 2, 32, 0.2, 0.5, 0, 50, 0);
    assert_int_equal(tdm_sched_step(s, 0.2, &b), TDM_OK);
    assert_int_equal(b.num_reqs, 2); /* all 5 blocks taken */
    update(s, &b, 0.25);
    assert_int_equal(tdm_sched_step(s, 0.3, &b), TDM_OK);
    assert_int_equal(b.num_preempted, 1);
    uint64_t v = b.preempted_ids[0];
    check(s);
    tdm_sched_destroy(s);
    return v;
}

static void slo_adaptive__preemption_spares_requests_on_track(void **state)
{
    (void)state;
    assert_int_equal(victim(1.0), 2);  /* both on track: the latest admitted */
    assert_int_equal(victim(0.05), 1); /* 1 missed its TTFT: it goes, 2 is spared */
}

/* At t = 1 two requests have missed their 0.1 s TTFT: the flagged one waits behind a
 * request that can still meet its deadline; the unflagged one keeps its (earliest) place. */
static void slo_adaptive__deprioritize_flag_demotes_hopeless_requests(void **state)
{
    (void)state;
    tdm_sched *s = make("{\"policy\": \"slo_adaptive\", \"max_num_seqs\": 1, \"num_blocks\": 500}");
    add(s, 1, 16, 0.0, 0.1, 0, 1, TDM_REQ_SLO_DEPRIORITIZE);
    add(s, 2, 16, 0.01, 0.1, 0, 1, 0);
    add(s, 3, 16, 0.9, 1.0, 0, 1, TDM_REQ_SLO_DEPRIORITIZE);
    const uint64_t want[] = { 2, 3, 1 };
    tdm_batch b;
    tdm_batch_init(&b);
    for (size_t k = 0; k < 3; k++) {
        double now = 1.0 + 0.1 * (double)k;
        assert_int_equal(tdm_sched_step(s, now, &b), TDM_OK);
        assert_int_equal(b.num_reqs, 1);
        assert_int_equal(b.req_ids[0], want[k]);
        update(s, &b, now + 0.01);
    }
    tdm_sched_destroy(s);
}

/* A flagged request past its TPOT for good no longer limits the step; an unflagged one does. */
static void slo_adaptive__lost_flagged_decode_does_not_limit_steps(void **state)
{
    (void)state;
    uint32_t got[2];
    for (int f = 0; f < 2; f++) {
        tdm_sched *s = make("{\"policy\": \"slo_adaptive\", \"max_num_batched_tokens\": 8192,"
                            " \"num_blocks\": 2000, \"enable_prefix_caching\": false}");
        tdm_batch b;
        tdm_batch_init(&b);
        add(s, 1, 16, 0.0, 0, 0.025, 3, f ? TDM_REQ_SLO_DEPRIORITIZE : 0);
        assert_int_equal(tdm_sched_step(s, 0.0, &b), TDM_OK);
        update(s, &b, 0.00216);
        /* 3 outputs at most: after 1 s without its second token its TPOT is lost */
        add(s, 2, 8000, 1.0, 0, 0, 1, 0);
        assert_int_equal(tdm_sched_step(s, 1.0, &b), TDM_OK);
        assert_int_equal(tokens_of(&b, 1), 1);
        got[f] = tokens_of(&b, 2);
        tdm_sched_destroy(s);
    }
    assert_in_range(got[0], FIT(G / 2) - 10, FIT(G / 2) + 1); /* the floor */
    assert_int_equal(got[1], 8000);    /* the whole budget (8192 less the decode) */
}

/* Overload, with a 100 ms TTFT target (1000 tokens a step, 12 ms: 83k tokens/s observed):
 * A (3000 tokens) runs its first chunk and B (500) waits; then C (500), D (3000) and E (2900)
 * arrive. With E, the queued prefill work (A's 2000 left, 500 + 500 + 3000 + 2900) cannot
 * finish by E's deadline, so the longest waiting request, D, goes behind the others
 * (Moore-Hodgson): A, B, C and E get their first token in time, only D misses. Without the
 * flag the least-laxity order serves D and E (the longer prefills) first, and B and C miss.
 * Writes each request's time to first token (ids 1..5). */
static void ttfts(uint32_t flags, double ttft[6])
{
    static const uint32_t len[6] = { 0, 3000, 500, 500, 3000, 2900 };
    static const double arrival[6] = { 0, 0.0, 0.0, 0.005, 0.005, 0.005 };
    tdm_sched *s = make("{\"policy\": \"slo_adaptive\", \"slo_ttft_ms\": 100, \"max_num_batched_tokens\": 1000,"
                        " \"num_blocks\": 2000, \"enable_prefix_caching\": false}");
    tdm_batch b;
    tdm_batch_init(&b);
    for (int id = 0; id < 6; id++) ttft[id] = -1;
    add(s, 1, len[1], arrival[1], 0, 0, 1, flags);
    add(s, 2, len[2], arrival[2], 0, 0, 1, flags);
    double t = 0.0;
    for (int k = 1; k <= 20; k++) {
        assert_int_equal(tdm_sched_step(s, t, &b), TDM_OK);
        if (k == 1) /* during the first step */
            for (uint64_t id = 3; id <= 5; id++) add(s, id, len[id], arrival[id], 0, 0, 1, flags);
        t += linear_cost(NULL, &(tdm_step_shape){ .num_prefill_tokens = b.total_tokens });
        for (uint32_t i = 0; i < b.num_reqs; i++) {
            uint64_t id = b.req_ids[i];
            if (b.num_computed[i] + b.num_tokens[i] >= len[id]) ttft[id] = t - arrival[id];
        }
        update(s, &b, t);
    }
    tdm_sched_destroy(s);
}

static void slo_adaptive__overload_demotes_the_longest_waiting_prefill(void **state)
{
    (void)state;
    double on[6], off[6];
    ttfts(TDM_REQ_SLO_DEPRIORITIZE, on);
    ttfts(0, off);
    for (int id = 1; id <= 5; id++) assert_true(on[id] > 0 && off[id] > 0); /* nobody is lost */
    /* flagged: only D misses 100 ms */
    assert_true(on[1] <= 0.1 && on[2] <= 0.1 && on[3] <= 0.1 && on[5] <= 0.1);
    assert_true(on[4] > 0.1);
    /* not flagged: D and E first, B and C miss */
    assert_true(off[4] <= 0.1 && off[2] > 0.1 && off[3] > 0.1);
}

/* The overload rule spares a request with nobody queued ahead of it: demoting it would only
 * let later arrivals overtake it. X runs a 1000-token chunk while Y waits (83k tokens/s
 * observed), Y finishes, then R (8300 tokens, flagged) arrives alone: at the observed rate
 * its own prefill passes its 100 ms deadline (99.6 ms after the 2.1 ms step in flight), but
 * alone in one step (85 ms) it can make it, so it keeps its place; S (16 tokens, a 1 s TTFT)
 * arriving with it waits behind it. Returns the id admitted next to the decode X. */
static uint64_t admitted_after_lone_arrival(void)
{
    tdm_sched *s = make("{\"policy\": \"slo_adaptive\", \"slo_ttft_ms\": 100, \"max_num_batched_tokens\": 1000,"
                        " \"max_num_seqs\": 2, \"num_blocks\": 2000, \"enable_prefix_caching\": false,"
                        " \"max_model_len\": 16384}");
    tdm_batch b;
    tdm_batch_init(&b);
    add(s, 1, 1000, 0.0, 0, 0, 50, 0); /* X */
    add(s, 2, 16, 0.0, 0, 0, 1, 0);    /* Y */
    double t = 0.0;
    for (int k = 0; k < 3; k++) { /* X's prompt (Y waits), X decodes + Y, X decodes */
        assert_int_equal(tdm_sched_step(s, t, &b), TDM_OK);
        uint32_t dec = b.num_reqs - b.num_prefill_reqs; /* steps take their predicted time */
        t += linear_cost(NULL, &(tdm_step_shape){ .num_prefill_tokens = b.total_tokens - dec, .num_decode_reqs = dec });
        update(s, &b, t);
    }
    add(s, 3, 8300, t, 0, 0, 1, TDM_REQ_SLO_DEPRIORITIZE); /* R */
    add(s, 4, 16, t, 1.0, 0, 1, TDM_REQ_SLO_DEPRIORITIZE); /* S */
    assert_int_equal(tdm_sched_step(s, t, &b), TDM_OK);
    assert_int_equal(tokens_of(&b, 1), 1);
    uint64_t got = tokens_of(&b, 3) ? 3 : tokens_of(&b, 4) ? 4 : 0;
    tdm_sched_destroy(s);
    return got;
}

static void slo_adaptive__overload_rule_spares_a_request_alone(void **state)
{
    (void)state;
    assert_int_equal(admitted_after_lone_arrival(), 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(slo_adaptive__config_keys_round_trip),
        cmocka_unit_test(slo_adaptive__admits_least_laxity_first),
        cmocka_unit_test(slo_adaptive__budget_follows_tpot_bank_overrun_and_slow_steps),
        cmocka_unit_test(slo_adaptive__step_widens_to_save_an_urgent_ttft),
        cmocka_unit_test(slo_adaptive__widening_spends_a_full_recovery_only_whole),
        cmocka_unit_test(slo_adaptive__step_without_decodes_is_capped_by_ttft),
        cmocka_unit_test(slo_adaptive__starvation_is_bounded),
        cmocka_unit_test(slo_adaptive__preemption_spares_requests_on_track),
        cmocka_unit_test(slo_adaptive__deprioritize_flag_demotes_hopeless_requests),
        cmocka_unit_test(slo_adaptive__lost_flagged_decode_does_not_limit_steps),
        cmocka_unit_test(slo_adaptive__overload_demotes_the_longest_waiting_prefill),
        cmocka_unit_test(slo_adaptive__overload_rule_spares_a_request_alone),
    };
    return cmocka_run_group_tests_name("sched_slo_adaptive", tests, NULL, NULL);
}
