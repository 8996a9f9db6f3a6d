/*
 * test_sched_slo.c -- the built-in SLO policy: admission by TTFT deadline (arrival_time +
 * ttft_slo), requests without a TTFT SLO last by arrival, preemption of the latest deadline.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../../../sched/sched_debug.h"
#include "tandem.h"

static void add(tdm_sched *s, uint64_t id, uint32_t n, double arrival, double ttft_slo, uint32_t max_tokens)
{
    tdm_token p[256];
    for (uint32_t i = 0; i < n; i++) p[i] = (tdm_token)(1000 * id + i);
    tdm_request_desc d;
    tdm_request_desc_init(&d);
    d.id = id;
    d.prompt = p;
    d.num_prompt_tokens = n;
    d.max_tokens = max_tokens;
    d.arrival_time = arrival;
    d.ttft_slo = ttft_slo;
    assert_int_equal(tdm_sched_add(s, &d), TDM_OK);
}

static void check(const tdm_sched *s)
{
    char msg[256];
    if (tdm__sched_check(s, msg, sizeof msg) != TDM_OK) fail_msg("%s", msg);
}

/* One request runs at a time: the admission order is the policy's order. */
static void slo__admits_by_ttft_deadline_then_best_effort_by_arrival(void **state)
{
    (void)state;
    tdm_sched *s;
    assert_int_equal(tdm_sched_create(&s), TDM_OK);
    assert_int_equal(tdm_sched_configure(s, "{\"policy\": \"slo\", \"max_num_seqs\": 1}"), TDM_OK);
    int64_t v = -1;
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_POLICY, &v), TDM_OK);
    assert_int_equal(v, TDM_POLICY_SLO);
    add(s, 1, 16, 0.0, 0, 1);   /* best effort, earliest arrival */
    add(s, 2, 16, 0.1, 2.0, 1); /* deadline 2.1 */
    add(s, 3, 16, 0.2, 0.5, 1); /* deadline 0.7: first */
    add(s, 4, 16, 0.05, 0, 1);  /* best effort, after 1 */
    add(s, 5, 16, 1.0, 1.0, 1); /* deadline 2.0 */
    const uint64_t want[] = { 3, 5, 2, 1, 4 };
    tdm_batch b;
    tdm_batch_init(&b);
    for (size_t k = 0; k < 5; k++) {
        assert_int_equal(tdm_sched_step(s, 1.0 + (double)k, &b), TDM_OK);
        assert_int_equal(b.num_reqs, 1);
        assert_int_equal(b.req_ids[0], want[k]);
        uint32_t off[2] = { 0, 1 };
        tdm_token tok = 7;
        tdm_step_output o;
        tdm_step_output_init(&o);
        o.num_reqs = 1;
        o.req_ids = b.req_ids;
        o.token_offsets = off;
        o.tokens = &tok;
        o.now = 1.5 + (double)k;
        assert_int_equal(tdm_sched_update(s, &o, NULL), TDM_OK); /* max_tokens 1: finished */
        check(s);
    }
    assert_int_equal(tdm_sched_step(s, 10.0, &b), TDM_OK);
    assert_int_equal(b.num_reqs, 0);
    assert_int_equal(tdm__sched_blocks_in_use(s), 0);
    tdm_sched_destroy(s);
}

static void one_token_each(tdm_sched *s, const tdm_batch *b, double now)
{
    uint32_t off[8];
    tdm_token toks[8];
    for (uint32_t i = 0; i <= b->num_reqs; i++) off[i] = i;
    for (uint32_t i = 0; i < b->num_reqs; i++) toks[i] = 7;
    tdm_step_output o;
    tdm_step_output_init(&o);
    o.num_reqs = b->num_reqs;
    o.req_ids = b->req_ids;
    o.token_offsets = off;
    o.tokens = toks;
    o.now = now;
    assert_int_equal(tdm_sched_update(s, &o, NULL), TDM_OK);
}

/* Out of blocks, the running request with the latest deadline (a best-effort one before any
 * with an SLO) is preempted, even when it is not the most recently admitted (FCFS would
 * take the tail, here the SLO request itself). */
static void slo__preempts_the_latest_deadline_not_the_tail(void **state)
{
    (void)state;
    tdm_sched *s;
    assert_int_equal(tdm_sched_create(&s), TDM_OK);
    /* 5 usable blocks of 16 tokens. */
    assert_int_equal(tdm_sched_configure(s, "{\"policy\": \"slo\", \"num_blocks\": 6, \"block_size\": 16,"
                                            " \"enable_prefix_caching\": false, \"max_model_len\": 512}"),
                     TDM_OK);
    tdm_batch b;
    tdm_batch_init(&b);
    add(s, 1, 32, 0.0, 0, 50); /* best effort: 2 blocks */
    assert_int_equal(tdm_sched_step(s, 0.1, &b), TDM_OK);
    assert_int_equal(b.num_reqs, 1);
    one_token_each(s, &b, 0.15);                /* 1 holds 33 tokens */
    add(s, 2, 32, 0.2, 0.5, 50);                /* deadline 0.7 */
    assert_int_equal(tdm_sched_step(s, 0.2, &b), TDM_OK);
    assert_int_equal(b.num_reqs, 2);            /* 1 takes a 3rd block, 2 takes 2: none free */
    assert_int_equal(b.req_ids[1], 2);          /* running = [1, 2]: 2 is the tail */
    one_token_each(s, &b, 0.25);                /* 1: 34 tokens, 2: 33 tokens */
    assert_int_equal(tdm_sched_step(s, 0.3, &b), TDM_OK);
    assert_int_equal(b.num_preempted, 1);
    assert_int_equal(b.preempted_ids[0], 1);    /* the best-effort request, not the tail */
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 2);
    check(s);
    tdm_sched_abort(s, 1);
    tdm_sched_abort(s, 2);
    assert_int_equal(tdm_sched_step(s, 1.0, &b), TDM_OK);
    assert_int_equal(tdm__sched_blocks_in_use(s), 0);
    tdm_sched_destroy(s);
}

static void slo__unknown_policy_name_lists_slo(void **state)
{
    (void)state;
    tdm_sched *s;
    assert_int_equal(tdm_sched_create(&s), TDM_OK);
    assert_int_equal(tdm_sched_configure(s, "{\"policy\": \"edf\"}"), TDM_E_CONFIG);
    assert_non_null(strstr(tdm_sched_errmsg(s), "\"slo\""));
    tdm_sched_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(slo__admits_by_ttft_deadline_then_best_effort_by_arrival),
        cmocka_unit_test(slo__preempts_the_latest_deadline_not_the_tail),
        cmocka_unit_test(slo__unknown_policy_name_lists_slo),
    };
    return cmocka_run_group_tests_name("sched_slo", tests, NULL, NULL);
}
