/*
 * test_sched_async.c -- async scheduling (TDM_SCHED_ASYNC_SCHEDULING, vLLM's AsyncScheduler):
 * the host schedules step N+1 before it reports step N. A request scheduled to sample holds an
 * output placeholder, so the next step schedules its next position at once; no step is added
 * once the steps in flight reach max_tokens; a KV block is allocated for the placeholder's
 * position; a stop or an abort while a step is in flight discards that step's output and the
 * request stays known until its last awaited update; a request preempted with a step in flight
 * gets that (stale) output and waits in the queue, keeping its place, until it has come; an
 * update caches the blocks whose KV its step completed; the parameter's validation. Off, a decode in flight is not scheduled again (the sync rule).
 */
#include <stdlib.h>
#include <string.h>

#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

#define EOS 2

static tdm_sched *new_async(int64_t block_size, int64_t num_blocks)
{
    const int64_t kv[] = { TDM_SCHED_ASYNC_SCHEDULING, 1, TDM_SCHED_BLOCK_SIZE, block_size,
                           TDM_SCHED_NUM_BLOCKS, num_blocks, 0 };
    return tsd_newp(kv);
}

static void add_req(tdm_sched *s, uint64_t id, uint32_t num_prompt, uint32_t max_tokens, int32_t eos)
{
    tdm_token p[64];
    assert_true(num_prompt <= 64);
    for (uint32_t i = 0; i < num_prompt; i++) p[i] = (tdm_token)(100 + 7 * id + i);
    tdm_request_desc d;
    assert_int_equal(tsd_desc(&d, id, p, num_prompt, max_tokens), TDM_OK);
    d.eos_token_id = eos;
    d.arrival_time = (double)id * 1e-3;
    assert_int_equal(tdm_sched_add(s, &d), TDM_OK);
}

/* Report one token for one request; returns the number of requests in the result. */
static uint32_t upd1(tdm_sched *s, uint64_t id, tdm_token tok, double now)
{
    tdm_update_result r;
    int rc = tsd_update_one(s, id, &tok, 1, now, &r);
    if (rc != TDM_OK) fail_msg("update(%llu) -> %d: %s", (unsigned long long)id, rc, tdm_sched_errmsg(s));
    return r.num_reqs;
}

/* Report one token each for two requests (one update); fails the test on an error. */
static void upd2(tdm_sched *s, uint64_t id0, tdm_token t0, uint64_t id1, tdm_token t1, double now,
                 tdm_update_result *r)
{
    uint64_t ids[2] = { id0, id1 };
    uint32_t offs[3] = { 0, 1, 2 };
    tdm_token toks[2] = { t0, t1 };
    tdm_step_output o;
    assert_int_equal(tdm_step_output_init(&o), TDM_OK);
    o.num_reqs = 2;
    o.req_ids = ids;
    o.token_offsets = offs;
    o.tokens = toks;
    o.now = now;
    assert_int_equal(tdm_update_result_init(r), TDM_OK);
    int rc = tdm_sched_update(s, &o, r);
    if (rc != TDM_OK) fail_msg("update(%llu, %llu) -> %d: %s", (unsigned long long)id0,
                               (unsigned long long)id1, rc, tdm_sched_errmsg(s));
}

static uint32_t blocks_of(const tdm_batch *b, int i)
{
    return b->block_offsets[i + 1] - b->block_offsets[i];
}

static void async__decode_scheduled_again_before_its_update(void **state)
{
    (void)state;
    tdm_sched *s = new_async(16, 1000);
    add_req(s, 1, 20, 4, -1);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.num_tokens[0], 20);
    tsd_step(s, 1.1, &b); /* step 1 in flight: its placeholder's position is computed now */
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.num_tokens[0], 1);
    assert_int_equal(b.num_computed[0], 20);
    assert_int_equal(b.kinds[0], TDM_ENTRY_CONTINUING);
    assert_int_equal(b.num_spec[0], 0);
    assert_int_equal(upd1(s, 1, 500, 1.15), 1);
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_int_equal(i.num_output_tokens, 1);
    assert_int_equal(i.num_computed_tokens, 21);
    tsd_step(s, 1.2, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.num_computed[0], 21);
    assert_int_equal(upd1(s, 1, 501, 1.25), 1);
    tsd_step(s, 1.3, &b); /* the 4th (last) output token is scheduled here */
    assert_int_equal(b.num_computed[0], 22);
    assert_int_equal(upd1(s, 1, 502, 1.35), 1);
    /* The step in flight brings the 4th token: no further step (vLLM's max_tokens rule). */
    tsd_step(s, 1.4, &b);
    assert_int_equal(b.num_reqs, 0);
    tdm_update_result r;
    tdm_token t = 503;
    assert_int_equal(tsd_update_one(s, 1, &t, 1, 1.45, &r), TDM_OK);
    assert_int_equal(r.num_reqs, 1);
    assert_int_equal(r.finish_reasons[0], TDM_FINISH_LENGTH);
    const tdm_token outs[] = { 500, 501, 502, 503 };
    tdm_token p[20];
    for (uint32_t k = 0; k < 20; k++) p[k] = (tdm_token)(107 + k);
    tsd_assert_tokens(s, 1, p, 20, outs, 4);
    tsd_step(s, 1.5, &b);
    assert_int_equal(b.num_finished, 1);
    assert_int_equal(b.finished_ids[0], 1);
    tsd_done(s);
}

static void async__off_keeps_a_decode_in_flight_unscheduled(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    add_req(s, 1, 20, 4, -1);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_reqs, 0);
    assert_int_equal(upd1(s, 1, 500, 1.15), 1);
    double now = 2.0;
    tsd_run(s, 20, &now);
    tsd_done(s);
}

static void async__max_tokens_one_schedules_no_second_step(void **state)
{
    (void)state;
    tdm_sched *s = new_async(16, 1000);
    add_req(s, 1, 20, 1, -1);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 1);
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_reqs, 0);
    tdm_update_result r;
    tdm_token t = 500;
    assert_int_equal(tsd_update_one(s, 1, &t, 1, 1.15, &r), TDM_OK);
    assert_int_equal(r.finish_reasons[0], TDM_FINISH_LENGTH);
    tsd_step(s, 1.2, &b);
    assert_int_equal(b.num_finished, 1);
    tsd_done(s);
}

static void async__block_allocated_for_the_placeholder_position(void **state)
{
    (void)state;
    tdm_sched *s = new_async(4, 100);
    add_req(s, 1, 8, 10, -1);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(blocks_of(&b, 0), 2);
    tsd_step(s, 1.1, &b); /* position 8 (the placeholder) opens a third block */
    assert_int_equal(b.num_computed[0], 8);
    assert_int_equal(blocks_of(&b, 0), 1);
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_int_equal(i.num_blocks, 3);
    assert_int_equal(upd1(s, 1, 500, 1.15), 1);
    assert_int_equal(upd1(s, 1, 501, 1.16), 1);
    double now = 2.0;
    tsd_run(s, 40, &now);
    tsd_done(s);
}

static void async__stop_while_next_step_in_flight_discards_its_output(void **state)
{
    (void)state;
    tdm_sched *s = new_async(16, 1000);
    add_req(s, 1, 20, 10, EOS);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    tsd_step(s, 1.1, &b);
    assert_int_equal(upd1(s, 1, 500, 1.15), 1);
    tsd_step(s, 1.2, &b);
    assert_int_equal(b.num_reqs, 1);
    tdm_update_result r;
    tdm_token t = EOS;
    assert_int_equal(tsd_update_one(s, 1, &t, 1, 1.25, &r), TDM_OK);
    assert_int_equal(r.num_reqs, 1);
    assert_int_equal(r.finish_reasons[0], TDM_FINISH_STOP);
    assert_int_equal(tsd_state(s, 1), TDM_STATE_FINISHED);
    tsd_step(s, 1.3, &b); /* reported, but kept: step 3 still awaits its update */
    assert_int_equal(b.num_reqs, 0);
    assert_int_equal(b.num_finished, 1);
    assert_int_equal(tsd_state(s, 1), TDM_STATE_FINISHED);
    t = 600;
    assert_int_equal(tsd_update_one(s, 1, &t, 1, 1.35, &r), TDM_OK);
    assert_int_equal(r.num_reqs, 0); /* the output of a finished request is skipped */
    tdm_request_info i;
    assert_int_equal(tdm_request_info_init(&i), TDM_OK);
    assert_int_equal(tdm_sched_request_info(s, 1, &i), TDM_E_NOT_FOUND); /* freed by that update */
    assert_int_equal(tsd_update_one(s, 1, &t, 1, 1.36, &r), TDM_E_STATE);
    tsd_assert_msg_has(s, "unknown");
    tsd_done(s);
}

static void async__abort_with_two_steps_in_flight(void **state)
{
    (void)state;
    tdm_sched *s = new_async(16, 1000);
    add_req(s, 1, 20, 10, -1);
    add_req(s, 2, 10, 3, -1);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 2);
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(tdm_sched_abort(s, 1), TDM_OK);
    tdm_update_result r;
    upd2(s, 1, 500, 2, 501, 1.15, &r);
    assert_int_equal(r.num_reqs, 1); /* request 1's output is skipped */
    assert_int_equal(r.req_ids[0], 2);
    tsd_step(s, 1.2, &b);
    assert_int_equal(b.num_finished, 1);
    assert_int_equal(b.finished_ids[0], 1);
    assert_int_equal(tsd_find(&b, 2), 0);
    upd2(s, 1, 500, 2, 501, 1.25, &r); /* step 2: 1 still known */
    assert_int_equal(r.num_reqs, 1);
    tdm_request_info i;
    assert_int_equal(tdm_request_info_init(&i), TDM_OK);
    assert_int_equal(tdm_sched_request_info(s, 1, &i), TDM_E_NOT_FOUND);
    tdm_token t = 502;
    assert_int_equal(tsd_update_one(s, 2, &t, 1, 1.26, &r), TDM_OK); /* step 3: its last token */
    assert_int_equal(r.finish_reasons[0], TDM_FINISH_LENGTH);
    double now = 2.0;
    tsd_run(s, 20, &now);
    tsd_done(s);
}

/* B is preempted while its step is in flight; its (stale) output still comes and is applied,
 * its num_computed_tokens stays 0. */
static void async__preempted_in_flight_gets_its_late_output(void **state)
{
    (void)state;
    tdm_sched *s = new_async(4, 5); /* 4 usable blocks */
    add_req(s, 1, 8, 6, -1);
    add_req(s, 2, 8, 6, -1);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 2);
    tsd_step(s, 1.1, &b); /* 1 needs a block for its placeholder: 2 (newest) is preempted */
    assert_int_equal(b.num_preempted, 1);
    assert_int_equal(b.preempted_ids[0], 2);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(tsd_state(s, 2), TDM_STATE_PREEMPTED);
    assert_int_equal(upd1(s, 2, 501, 1.15), 1);
    tdm_request_info i;
    tsd_info(s, 2, &i);
    assert_int_equal(i.num_output_tokens, 1);
    assert_int_equal(i.num_computed_tokens, 0);
    assert_int_equal(upd1(s, 1, 500, 1.16), 1);
    tsd_info(s, 1, &i);
    assert_int_equal(i.num_computed_tokens, 9);
    assert_int_equal(upd1(s, 1, 502, 1.17), 1); /* step 2 */
    double now = 2.0;
    tsd_run(s, 400, &now);
    tsd_done(s);
}

/* Three steps in flight (a pipeline): B, preempted with its output still to come, is skipped
 * by admission, which takes C behind it; B keeps its place at the head of the queue. */
static void async__preempted_with_output_in_flight_waits_keeping_its_place(void **state)
{
    (void)state;
    tdm_sched *s = new_async(4, 5);
    add_req(s, 1, 8, 6, -1);
    add_req(s, 2, 4, 10, -1);
    tdm_batch b;
    tsd_step(s, 1.0, &b); /* A 2 blocks, B 1 block: 1 free */
    assert_int_equal(b.num_reqs, 2);
    tsd_step(s, 1.1, &b); /* A takes the last block, B preempts itself */
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.num_preempted, 1);
    assert_int_equal(b.preempted_ids[0], 2);
    add_req(s, 3, 2, 1, -1);
    tsd_step(s, 1.2, &b); /* B is at the head of the queue but its step-1 output is owed */
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(tsd_find(&b, 1), 0);
    assert_true(tsd_find(&b, 3) >= 0);
    assert_int_equal(tsd_find(&b, 2), -1);
    assert_int_equal(tsd_state(s, 2), TDM_STATE_PREEMPTED);
    /* step 1's output, then steps 2 and 3 */
    tdm_update_result r;
    upd2(s, 1, 500, 2, 501, 1.25, &r);
    assert_int_equal(upd1(s, 1, 502, 1.26), 1);
    upd2(s, 1, 503, 3, 600, 1.25, &r);
    assert_int_equal(r.num_reqs, 2);
    assert_int_equal(r.finish_reasons[1], TDM_FINISH_LENGTH);
    tdm_request_info i;
    tsd_info(s, 2, &i);
    assert_int_equal(i.num_output_tokens, 1);
    /* B is still first in line: the next admission is B's */
    add_req(s, 4, 2, 1, -1);
    tsd_step(s, 1.3, &b);
    if (tsd_find(&b, 4) >= 0) assert_true(tsd_find(&b, 2) >= 0);
    tsd_update(s, &b, 7, 1.35, NULL);
    double now = 2.0;
    tsd_run(s, 600, &now);
    tsd_done(s);
}

/* The final update caches the block its step's KV completed (vLLM's AsyncScheduler caches
 * in the update, before the finished request frees its blocks); a step would never have. */
static void async__final_update_caches_the_block_its_kv_completed(void **state)
{
    (void)state;
    tdm_sched *s = new_async(4, 100);
    add_req(s, 1, 6, 3, -1); /* tokens 107..112 */
    tdm_batch b;
    tsd_step(s, 1.0, &b); /* positions 0..5 */
    tsd_step(s, 1.1, &b); /* position 6 */
    assert_int_equal(upd1(s, 1, 500, 1.15), 1);
    tsd_step(s, 1.2, &b); /* position 7 */
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(upd1(s, 1, 501, 1.25), 1);
    tsd_step(s, 1.3, &b); /* the step in flight brings the 3rd token: nothing */
    assert_int_equal(b.num_reqs, 0);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_cached_blocks, 1); /* positions 4..7 are not computed yet */
    assert_int_equal(upd1(s, 1, 502, 1.35), 1); /* LENGTH: positions 0..7 computed */
    tsd_stats(s, &st);
    assert_int_equal(st.num_cached_blocks, 2);
    tsd_step(s, 1.4, &b);
    assert_int_equal(b.num_finished, 1);
    const tdm_token p2[] = { 107, 108, 109, 110, 111, 112, 500, 501, 9 };
    assert_int_equal(tsd_add_tokens(s, 2, p2, 9, 1), TDM_OK);
    tsd_step(s, 1.5, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.num_computed[0], 8); /* both blocks hit */
    assert_int_equal(upd1(s, 2, 503, 1.55), 1);
    double now = 2.0;
    tsd_run(s, 10, &now);
    tsd_done(s);
}

static void async__param_validated_and_fixed_while_requests_held(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    int64_t v = -1;
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_ASYNC_SCHEDULING, &v), TDM_OK);
    assert_int_equal(v, 0);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_ASYNC_SCHEDULING, 2), TDM_E_CONFIG);
    tsd_assert_msg_has(s, "async_scheduling");
    assert_int_equal(tdm_sched_configure(s, "{\"async_scheduling\": 7}"), TDM_E_CONFIG);
    assert_int_equal(tdm_sched_configure(s, "{\"async_scheduling\": true}"), TDM_OK);
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_ASYNC_SCHEDULING, &v), TDM_OK);
    assert_int_equal(v, 1);
    char *c = tsd_config(s);
    assert_non_null(strstr(c, "\"async_scheduling\""));
    free(c);
    add_req(s, 1, 4, 2, -1);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_ASYNC_SCHEDULING, 0), TDM_E_STATE);
    tsd_assert_msg_has(s, "async_scheduling can only change");
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_ASYNC_SCHEDULING, &v), TDM_OK);
    assert_int_equal(v, 1);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_ASYNC_SCHEDULING, 1), TDM_OK); /* unchanged */
    double now = 1.0;
    tsd_run(s, 20, &now);
    tsd_done(s);
}

/* decode_stagger N (vLLM's AsyncScheduler with N pipeline stages): a request sampled in step
 * t is next scheduled from the running queue in step t + N; empty steps count. A prefill chunk
 * that does not complete the prompt sets no gate. N = 1 schedules it every step. */
static void async__decode_stagger_spaces_a_request_s_steps(void **state)
{
    (void)state;
    for (int64_t stagger = 1; stagger <= 3; stagger++) {
        tdm_sched *s = new_async(16, 1000);
        assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_DECODE_STAGGER, stagger), TDM_OK);
        assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_LONG_PREFILL_TOKEN_THRESHOLD, 16), TDM_OK);
        add_req(s, 1, 40, 50, -1); /* chunks of 16: 16, 16, then 8 completing the prompt */
        add_req(s, 2, 10, 50, -1); /* (two requests: the threshold applies) */
        tdm_batch b;
        uint64_t steps_with_1[8];
        uint32_t n1 = 0;
        for (int k = 0; k < 12; k++) {
            tsd_step(s, 1.0 + 0.01 * k, &b);
            if (tsd_find(&b, 1) >= 0 && n1 < 8) steps_with_1[n1++] = b.step;
        } /* no update comes: the placeholders let every step schedule it, but for the gate */
        /* the chunks run in steps 1, 2, 3 (no gate); the third samples: next at 3 + N, ... */
        assert_true(n1 >= 4);
        assert_int_equal(steps_with_1[0], 1);
        assert_int_equal(steps_with_1[1], 2);
        assert_int_equal(steps_with_1[2], 3);
        for (uint32_t i = 3; i < n1; i++)
            assert_int_equal(steps_with_1[i], steps_with_1[i - 1] + (uint64_t)stagger);
        tsd_free(s);
    }
}

static void async__decode_stagger_validated(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new("{\"decode_stagger\": 2}");
    int64_t v = 0;
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_DECODE_STAGGER, &v), TDM_OK);
    assert_int_equal(v, 2);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_DECODE_STAGGER, 0), TDM_E_CONFIG);
    tsd_assert_msg_has(s, "decode_stagger");
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_DECODE_STAGGER, 1025), TDM_E_CONFIG);
    char *cfg = tsd_config(s);
    if (!strstr(cfg, "\"decode_stagger\":2")) fail_msg("config dump lacks decode_stagger: %s", cfg);
    free(cfg);
    tsd_done(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(async__decode_scheduled_again_before_its_update),
        TSD_TEST(async__off_keeps_a_decode_in_flight_unscheduled),
        TSD_TEST(async__max_tokens_one_schedules_no_second_step),
        TSD_TEST(async__block_allocated_for_the_placeholder_position),
        TSD_TEST(async__stop_while_next_step_in_flight_discards_its_output),
        TSD_TEST(async__abort_with_two_steps_in_flight),
        TSD_TEST(async__preempted_in_flight_gets_its_late_output),
        TSD_TEST(async__preempted_with_output_in_flight_waits_keeping_its_place),
        TSD_TEST(async__final_update_caches_the_block_its_kv_completed),
        TSD_TEST(async__param_validated_and_fixed_while_requests_held),
        TSD_TEST(async__decode_stagger_spaces_a_request_s_steps),
        TSD_TEST(async__decode_stagger_validated),
    };
    return cmocka_run_group_tests_name("sched_async", tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_async")
#endif
