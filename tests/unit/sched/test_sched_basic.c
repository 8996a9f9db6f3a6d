/*
 * test_sched_basic.c -- vLLM v1 scheduler behaviours ported from test_scheduler.py as
 * scenarios against the C ABI: adding, aborting and finishing requests; FIFO admission;
 * concurrent partial prefills (400/400/224); head-of-line blocking with chunked prefill off;
 * preemption (FCFS victim, late output still applied, no admission in a preempting step,
 * resumption at the front with the whole block table); the admission watermark; lookahead
 * slots; per-request timings. Stop conditions live in test_sched_stop.c. Every scenario
 * ends with all blocks free (tsd_done).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

static void assert_close(double a, double b)
{
    if (fabs(a - b) > 1e-9) fail_msg("%.9f != %.9f", a, b);
}

/* vLLM test_add_requests / test_finish_request / test_get_num_unfinished_requests. */
static void add__queues_waiting_and_abort_counts_down(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    for (uint64_t i = 0; i < 10; i++) {
        assert_int_equal(tsd_add(s, i, 10, 16), TDM_OK);
        assert_int_equal(tsd_state(s, i), TDM_STATE_WAITING);
    }
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_waiting, 10);
    assert_int_equal(st.num_running, 0);
    assert_int_equal(tsd_unfinished(s), 10);
    for (uint64_t i = 0; i < 10; i++) {
        assert_int_equal(tdm_sched_abort(s, i), TDM_OK);
        assert_int_equal(tsd_unfinished(s), 9 - i);
        tdm_request_info info;
        tsd_info(s, i, &info);
        assert_int_equal(info.state, TDM_STATE_FINISHED);
        assert_int_equal(info.finish_reason, TDM_FINISH_ABORT);
    }
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 0);
    /* vLLM's _free_request puts aborted ids into finished_req_ids, flushed by the next step */
    assert_int_equal(b.num_finished, 10);
    for (uint64_t i = 0; i < 10; i++) {
        assert_true(tsd_find_id(b.finished_ids, b.num_finished, i) >= 0);
        tdm_request_info info;
        tdm_request_info_init(&info);
        assert_int_equal(tdm_sched_request_info(s, i, &info), TDM_E_NOT_FOUND);
    }
    tsd_stats(s, &st);
    assert_int_equal(st.finished, 10);
    tsd_done(s);
}

static void add__duplicate_id_rejected(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    assert_int_equal(tsd_add(s, 5, 10, 4), TDM_OK);
    assert_int_equal(tsd_add(s, 5, 12, 4), TDM_E_EXISTS);
    assert_true(tdm_sched_errmsg(s)[0] != '\0');
    assert_int_equal(tsd_unfinished(s), 1);
    tdm_request_info i;
    tsd_info(s, 5, &i);
    assert_int_equal(i.num_prompt_tokens, 10);
    tsd_run(s, 100, NULL);
    tsd_done(s);
}

/* vLLM test_schedule: all prompts scheduled in one step, in FIFO order. */
static void step__fifo_admits_all_prompts_in_order(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MAX_NUM_SEQS, 16, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 8192, 0 };
    tdm_sched *s = tsd_newp(kv);
    for (uint64_t i = 0; i < 10; i++) assert_int_equal(tsd_add(s, i, 10, 3), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 10);
    assert_int_equal(b.step, 1);
    assert_int_equal(b.total_tokens, 100);
    for (uint32_t i = 0; i < 10; i++) {
        assert_int_equal(b.req_ids[i], i);
        assert_int_equal(b.kinds[i], TDM_ENTRY_NEW);
        assert_int_equal(b.num_tokens[i], 10);
        assert_int_equal(b.num_computed[i], 0);
        assert_int_equal(b.block_offsets[i + 1] - b.block_offsets[i], 1);
    }
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_running, 10);
    assert_int_equal(st.num_waiting, 0);
    tsd_update(s, &b, 7, 1.1, NULL);
    tsd_step(s, 1.2, &b);
    assert_int_equal(b.num_reqs, 10);
    for (uint32_t i = 0; i < 10; i++) {
        assert_int_equal(b.kinds[i], TDM_ENTRY_CONTINUING);
        assert_int_equal(b.num_tokens[i], 1);
        assert_int_equal(b.num_computed[i], 10);
    }
    tsd_update(s, &b, 7, 1.3, NULL);
    tsd_run(s, 20, NULL);
    tsd_done(s);
}

/* vLLM test_schedule_concurrent_partial_requests: threshold 400, budget 1024, 3 x 800. */
static void step__concurrent_partial_prefills_400_400_224(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MAX_MODEL_LEN, 2048, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 1024,
                           TDM_SCHED_LONG_PREFILL_TOKEN_THRESHOLD, 400, 0 };
    tdm_sched *s = tsd_newp(kv);
    for (uint64_t i = 0; i < 3; i++) assert_int_equal(tsd_add(s, i, 800, 2), TDM_OK);
    tdm_batch b;
    const uint32_t want[3] = { 400, 400, 224 };
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 3);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(b.kinds[i], TDM_ENTRY_NEW);
        assert_int_equal(b.num_tokens[i], want[i]);
    }
    assert_int_equal(b.num_prefill_reqs, 3);
    tsd_update(s, &b, 7, 1.1, NULL);
    tsd_step(s, 1.2, &b);
    assert_int_equal(b.num_reqs, 3);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(b.kinds[i], TDM_ENTRY_CONTINUING);
        assert_int_equal(b.num_tokens[i], want[i]);
    }
    assert_int_equal(b.num_computed[2], 224);
    tsd_update(s, &b, 7, 1.3, NULL);
    tsd_step(s, 1.4, &b);
    assert_int_equal(b.num_reqs, 3);
    assert_int_equal(b.num_tokens[0], 1);
    assert_int_equal(b.num_tokens[1], 1);
    assert_int_equal(b.num_tokens[2], 352);
    assert_int_equal(b.num_prefill_reqs, 1);
    tsd_update(s, &b, 7, 1.5, NULL);
    tsd_run(s, 20, NULL);
    tsd_done(s);
}

/* vLLM test_schedule_partial_requests (text only): without a threshold a prompt takes all the
 * budget it can; the next one is chunked to what is left. */
static void step__partial_prefill_fills_budget_without_threshold(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MAX_MODEL_LEN, 2048, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 1024, 0 };
    tdm_sched *s = tsd_newp(kv);
    for (uint64_t i = 0; i < 3; i++) assert_int_equal(tsd_add(s, i, 800, 2), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(b.num_tokens[0], 800);
    assert_int_equal(b.num_tokens[1], 224);
    assert_int_equal(tsd_state(s, 2), TDM_STATE_WAITING);
    tsd_update(s, &b, 7, 1.1, NULL);
    tsd_step(s, 1.2, &b);
    assert_int_equal(b.num_reqs, 3);
    const uint32_t want[3] = { 1, 576, 447 };
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(b.req_ids[i], i);
        assert_int_equal(b.num_tokens[i], want[i]);
    }
    assert_int_equal(b.kinds[2], TDM_ENTRY_NEW);
    tsd_update(s, &b, 7, 1.3, NULL);
    tsd_run(s, 20, NULL);
    tsd_done(s);
}

/* vLLM test_schedule_order: with chunked prefill off the head of the waiting queue blocks
 * shorter requests behind it; with it on, the second long prompt is chunked. */
static void step__chunked_prefill_off_head_of_line_blocks(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MAX_MODEL_LEN, 1024, TDM_SCHED_ENABLE_CHUNKED_PREFILL, 0,
                           TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 1024, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 1, 600, 2), TDM_OK);
    assert_int_equal(tsd_add(s, 2, 600, 2), TDM_OK);
    assert_int_equal(tsd_add(s, 3, 10, 2), TDM_OK);
    assert_int_equal(tsd_add(s, 4, 10, 2), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 1);
    assert_int_equal(b.num_tokens[0], 600);
    for (uint64_t id = 2; id <= 4; id++) assert_int_equal(tsd_state(s, id), TDM_STATE_WAITING);
    tsd_update(s, &b, 7, 1.1, NULL);
    tsd_step(s, 1.2, &b);
    assert_int_equal(b.num_reqs, 4);
    const uint32_t want[4] = { 1, 600, 10, 10 };
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(b.req_ids[i], i + 1);
        assert_int_equal(b.num_tokens[i], want[i]);
    }
    tsd_update(s, &b, 7, 1.3, NULL);
    tsd_run(s, 20, NULL);
    tsd_done(s);

    const int64_t kv2[] = { TDM_SCHED_MAX_MODEL_LEN, 1024, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 1024, 0 };
    s = tsd_newp(kv2);
    for (uint64_t id = 1; id <= 2; id++) assert_int_equal(tsd_add(s, id, 600, 2), TDM_OK);
    for (uint64_t id = 3; id <= 4; id++) assert_int_equal(tsd_add(s, id, 10, 2), TDM_OK);
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(b.num_tokens[0], 600);
    assert_int_equal(b.num_tokens[1], 424);
    tsd_update(s, &b, 7, 1.1, NULL);
    tsd_run(s, 20, NULL);
    tsd_done(s);
}

/* vLLM test_preempt_during_execution: 11 blocks (10 usable + null), two 80-token prompts. */
static void preempt__late_output_of_preempted_request_applied(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_NUM_BLOCKS, 11, TDM_SCHED_BLOCK_SIZE, 16,
                           TDM_SCHED_MAX_NUM_SEQS, 16, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 100,
                           TDM_SCHED_ENABLE_PREFIX_CACHING, 0, 0 };
    tdm_sched *s = tsd_newp(kv);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_total_blocks, 10);
    tdm_batch b;
    assert_int_equal(tsd_add(s, 0, 80, 3), TDM_OK);
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.block_offsets[1], 5);
    assert_int_equal(tsd_add(s, 1, 80, 3), TDM_OK);
    tsd_step(s, 1.1, &b); /* request 0 still in flight: n == 0, skipped */
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 1);
    assert_int_equal(b.block_offsets[1], 5);
    const tdm_token t0 = 5, t1 = 42;
    assert_int_equal(tsd_update_one(s, 0, &t0, 1, 1.2, NULL), TDM_OK);
    tsd_step(s, 1.3, &b); /* request 0 needs a 6th block: request 1 is preempted */
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 0);
    assert_int_equal(b.num_preempted, 1);
    assert_int_equal(b.preempted_ids[0], 1);
    assert_int_equal(tsd_state(s, 1), TDM_STATE_PREEMPTED);
    tsd_stats(s, &st);
    assert_int_equal(st.num_running, 1);
    assert_int_equal(st.preemptions, 1);
    /* the late output of the preempted request is still appended */
    tdm_update_result r;
    assert_int_equal(tsd_update_one(s, 1, &t1, 1, 1.35, &r), TDM_OK);
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_int_equal(i.num_output_tokens, 1);
    assert_int_equal(i.num_preemptions, 1);
    assert_int_equal(i.num_computed_tokens, 0);
    tdm_token prompt[80];
    tsd_prompt(1, 80, prompt);
    tsd_assert_tokens(s, 1, prompt, 80, &t1, 1);
    tsd_update(s, &b, 5, 1.4, NULL); /* request 0: second output */
    tsd_step(s, 1.5, &b);
    assert_int_equal(b.num_reqs, 1); /* request 1 needs 6 blocks, 4 free */
    tsd_update(s, &b, 5, 1.6, &r);
    assert_int_equal(r.finish_reasons[0], TDM_FINISH_LENGTH);
    tsd_step(s, 1.7, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 1);
    assert_int_equal(b.kinds[0], TDM_ENTRY_RESUMED);
    assert_int_equal(b.num_computed[0], 0);
    assert_int_equal(b.num_tokens[0], 81);
    assert_int_equal(b.block_offsets[1], 6);
    tsd_update(s, &b, 5, 1.8, NULL);
    double now = 2.0;
    tsd_run(s, 10, &now);
    tsd_done(s);
}

/* FCFS preemption: the victim is the most recently admitted running request; nothing is
 * admitted in a step that preempted; the victim resumes at the front of the waiting queue
 * (blocking a later request that would fit) and comes back RESUMED with its whole table. */
static void preempt__fcfs_victim_newest_no_admission_resume_front(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_NUM_BLOCKS, 11, TDM_SCHED_BLOCK_SIZE, 16,
                           TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 1024,
                           TDM_SCHED_ENABLE_PREFIX_CACHING, 0, 0 };
    tdm_sched *s = tsd_newp(kv);
    enum { A = 1, B, C, D };
    for (uint64_t id = A; id <= C; id++) assert_int_equal(tsd_add(s, id, 48, 20), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 3);
    tsd_update(s, &b, 7, 1.05, NULL);
    assert_int_equal(tsd_add(s, D, 16, 20), TDM_OK);
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(b.req_ids[0], A);
    assert_int_equal(b.req_ids[1], B);
    assert_int_equal(b.num_preempted, 1);
    assert_int_equal(b.preempted_ids[0], C);
    assert_int_equal(tsd_state(s, C), TDM_STATE_PREEMPTED);
    assert_int_equal(tsd_state(s, D), TDM_STATE_WAITING); /* no admission after preemption */
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_free_blocks, 2);
    tsd_update(s, &b, 7, 1.15, NULL);
    tsd_step(s, 1.2, &b); /* C heads the queue and does not fit: D (which fits) waits too */
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(b.num_preempted, 0);
    assert_int_equal(tsd_state(s, D), TDM_STATE_WAITING);
    tsd_update(s, &b, 7, 1.25, NULL);
    assert_int_equal(tdm_sched_finish(s, A, TDM_FINISH_STOP), TDM_OK);
    tsd_step(s, 1.3, &b);
    assert_int_equal(b.num_reqs, 3);
    assert_int_equal(b.req_ids[0], B);
    assert_int_equal(b.req_ids[1], C);
    assert_int_equal(b.req_ids[2], D);
    assert_int_equal(b.kinds[1], TDM_ENTRY_RESUMED);
    assert_int_equal(b.num_computed[1], 0);
    assert_int_equal(b.num_tokens[1], 49);
    assert_int_equal(b.block_offsets[2] - b.block_offsets[1], 4);
    assert_int_equal(b.kinds[2], TDM_ENTRY_NEW);
    assert_true(tsd_find_id(b.finished_ids, b.num_finished, A) >= 0);
    tsd_update(s, &b, 7, 1.35, NULL);
    double now = 2.0;
    tsd_run(s, 200, &now);
    tsd_done(s);
}

/* The admission watermark keeps free blocks in reserve while other requests run, but never
 * blocks a request that runs alone (vLLM adds it only when another request is scheduled). */
static void step__watermark_blocks_admission_only_alongside_others(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_NUM_BLOCKS, 101, TDM_SCHED_MAX_MODEL_LEN, 2048,
                           TDM_SCHED_WATERMARK_PPM, 100000, TDM_SCHED_ENABLE_PREFIX_CACHING, 0, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 1, 80, 50), TDM_OK); /* 5 blocks */
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    tsd_update(s, &b, 7, 1.05, NULL);
    assert_int_equal(tsd_add(s, 2, 90 * 16, 2), TDM_OK); /* 90 blocks: 95 free - 10 reserved < 90 */
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(tsd_state(s, 2), TDM_STATE_WAITING);
    tsd_update(s, &b, 7, 1.15, NULL);
    assert_int_equal(tdm_sched_finish(s, 1, TDM_FINISH_STOP), TDM_OK);
    tsd_step(s, 1.2, &b); /* alone: admitted although it leaves less than the watermark free */
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 2);
    tsd_update(s, &b, 7, 1.25, NULL);
    double now = 2.0;
    tsd_run(s, 20, &now);
    tsd_done(s);
}

/* Lookahead slots (num_lookahead_tokens) are reserved for running requests, not on a
 * request's first admission (vLLM: avoids a P/D block-count mismatch). vLLM's rule is
 * `0 if request.num_computed_tokens == 0 else num_lookahead_tokens` for waiting requests, so a
 * resumed request (num_computed reset to 0 by the preemption) gets none either. */
static void step__lookahead_slots_reserved_after_first_admission(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_NUM_LOOKAHEAD_TOKENS, 2, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 1, 16, 10), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.block_offsets[1], 1);
    tsd_update(s, &b, 7, 1.05, NULL);
    tsd_step(s, 1.1, &b); /* 16 computed + 1 + 2 lookahead slots: a second block */
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_int_equal(i.num_blocks, 2);
    tsd_update(s, &b, 7, 1.15, NULL);
    /* request 2: 47-token prompt, one output (48 tokens), preempted, resumed: 48 tokens need 3
     * blocks; lookahead slots would make it 4 */
    assert_int_equal(tsd_add(s, 2, 47, 10), TDM_OK);
    tsd_step(s, 1.2, &b);
    tsd_update(s, &b, 7, 1.25, NULL);
    assert_int_equal(tdm_sched_reset_prefix_cache(s, 1), TDM_OK);
    tsd_step(s, 1.3, &b);
    int k = tsd_find(&b, 2);
    assert_true(k >= 0);
    assert_int_equal(b.kinds[k], TDM_ENTRY_RESUMED);
    assert_int_equal(b.num_tokens[k], 48);
    if (b.block_offsets[k + 1] - b.block_offsets[k] != 3)
        fail_msg("resumed request got %u blocks for 48 tokens; vLLM allocates no lookahead when "
                 "num_computed_tokens == 0 (3 blocks)", b.block_offsets[k + 1] - b.block_offsets[k]);
    tsd_update(s, &b, 7, 1.35, NULL);
    double now = 2.0;
    tsd_run(s, 20, &now);
    tsd_done(s);
}

/* A request finished by the host frees its blocks at once, is reported in the next batch's
 * finished list, and a late output for it is ignored. */
static void finish__host_finish_frees_and_ignores_late_output(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    assert_int_equal(tsd_add(s, 3, 40, 10), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    tsd_update(s, &b, 7, 1.1, NULL);
    tsd_step(s, 1.2, &b);
    assert_int_equal(tdm_sched_finish(s, 3, TDM_FINISH_STOP), TDM_OK);
    assert_int_equal(tdm__sched_blocks_in_use(s), 0);
    tdm_request_info i;
    tsd_info(s, 3, &i);
    assert_int_equal(i.state, TDM_STATE_FINISHED);
    assert_int_equal(i.finish_reason, TDM_FINISH_STOP);
    const tdm_token t = 9;
    tdm_update_result r;
    assert_int_equal(tsd_update_one(s, 3, &t, 1, 1.3, &r), TDM_OK);
    tsd_info(s, 3, &i);
    assert_int_equal(i.num_output_tokens, 1);
    tsd_step(s, 1.4, &b);
    assert_int_equal(b.num_reqs, 0);
    assert_int_equal(b.num_finished, 1);
    assert_int_equal(b.finished_ids[0], 3);
    assert_int_equal(tdm_sched_request_info(s, 3, &i), TDM_E_NOT_FOUND);
    tsd_done(s);
}

static void update__records_timings_from_host_clock(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    tdm_token p[8];
    tsd_prompt(1, 8, p);
    tdm_request_desc d;
    tsd_desc(&d, 1, p, 8, 3);
    d.arrival_time = 0.5;
    assert_int_equal(tdm_sched_add(s, &d), TDM_OK);
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_close(i.arrival_time, 0.5);
    assert_close(i.first_token_time, -1);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    tsd_info(s, 1, &i);
    assert_close(i.first_scheduled_time, 1.0);
    tsd_update(s, &b, 7, 1.5, NULL);
    tsd_info(s, 1, &i);
    assert_close(i.first_token_time, 1.5);
    assert_close(i.last_token_time, 1.5);
    tsd_step(s, 2.0, &b);
    tsd_update(s, &b, 7, 2.7, NULL);
    tsd_step(s, 3.0, &b);
    tsd_update(s, &b, 7, 3.1, NULL);
    tsd_info(s, 1, &i);
    assert_int_equal(i.state, TDM_STATE_FINISHED);
    assert_close(i.last_token_time, 3.1);
    assert_close(i.finish_time, 3.1);
    assert_close(i.max_token_gap, 1.2);
    tsd_step(s, 4.0, &b);
    tsd_done(s);
}

/* vLLM 0.33: long_prefill_token_threshold keeps a long prefill from starving the others, so
 * it does not cap a request that is the only one eligible (running, waiting or receiving). */
static void step__lone_request_ignores_long_prefill_threshold(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_LONG_PREFILL_TOKEN_THRESHOLD, 8, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 1, 40, 10), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.num_tokens[0], 40); /* alone: the whole prompt */
    tsd_update(s, &b, 7, 1.01, NULL);
    assert_int_equal(tsd_add(s, 2, 40, 2), TDM_OK);
    assert_int_equal(tsd_add(s, 3, 40, 2), TDM_OK);
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_reqs, 3);
    for (uint32_t i = 0; i < 3; i++) /* 1 decodes, 2 and 3 are capped */
        assert_int_equal(b.num_tokens[i], b.req_ids[i] == 1 ? 1 : 8);
    tsd_update(s, &b, 7, 1.11, NULL);
    assert_int_equal(tdm_sched_abort(s, 1), TDM_OK);
    assert_int_equal(tdm_sched_abort(s, 2), TDM_OK);
    tsd_step(s, 1.2, &b); /* 3 is alone again: the rest of its prompt at once */
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 3);
    assert_int_equal(b.num_computed[0], 8);
    assert_int_equal(b.num_tokens[0], 32);
    tsd_update(s, &b, 7, 1.21, NULL);
    double now = 2.0;
    tsd_run(s, 20, &now);
    tsd_done(s);
}

/* reserve_full_prompt (vLLM 0.33's scheduler_reserve_full_isl): a waiting request is admitted
 * only when blocks for all its tokens are free; without it the first chunk is enough. */
static void step__reserve_full_prompt_admits_only_whole_prompts(void **state)
{
    (void)state;
    for (int full = 0; full < 2; full++) {
        const int64_t kv[] = { TDM_SCHED_NUM_BLOCKS, 11, TDM_SCHED_BLOCK_SIZE, 16,
                               TDM_SCHED_MAX_NUM_SEQS, 8,
                               TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 64, TDM_SCHED_MAX_MODEL_LEN, 1024,
                               TDM_SCHED_ENABLE_PREFIX_CACHING, 0, TDM_SCHED_RESERVE_FULL_PROMPT, full, 0 };
        tdm_sched *s = tsd_newp(kv);
        assert_int_equal(tsd_add(s, 1, 100, 2), TDM_OK);
        tdm_batch b;
        tsd_step(s, 1.0, &b); /* 64 tokens: 4 blocks */
        assert_int_equal(b.num_tokens[0], 64);
        tsd_update(s, &b, 7, 1.01, NULL);
        assert_int_equal(tsd_add(s, 2, 100, 2), TDM_OK);
        tsd_step(s, 1.1, &b); /* 1 takes 36 more (7 blocks, 3 free); 2 has 28 tokens of budget */
        if (full) {
            assert_int_equal(b.num_reqs, 1); /* 2 needs 7 blocks */
            assert_int_equal(tsd_state(s, 2), TDM_STATE_WAITING);
        } else {
            assert_int_equal(b.num_reqs, 2); /* its first chunk fits in 2 blocks */
            assert_int_equal(b.req_ids[1], 2);
            assert_int_equal(b.num_tokens[1], 28);
        }
        tsd_update(s, &b, 7, 1.11, NULL);
        double now = 2.0;
        tsd_run(s, 50, &now);
        tsd_done(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(add__queues_waiting_and_abort_counts_down),
        TSD_TEST(add__duplicate_id_rejected),
        TSD_TEST(step__fifo_admits_all_prompts_in_order),
        TSD_TEST(step__concurrent_partial_prefills_400_400_224),
        TSD_TEST(step__partial_prefill_fills_budget_without_threshold),
        TSD_TEST(step__chunked_prefill_off_head_of_line_blocks),
        TSD_TEST(preempt__late_output_of_preempted_request_applied),
        TSD_TEST(preempt__fcfs_victim_newest_no_admission_resume_front),
        TSD_TEST(step__watermark_blocks_admission_only_alongside_others),
        TSD_TEST(step__lookahead_slots_reserved_after_first_admission),
        TSD_TEST(finish__host_finish_frees_and_ignores_late_output),
        TSD_TEST(update__records_timings_from_host_clock),
        TSD_TEST(step__lone_request_ignores_long_prefill_threshold),
        TSD_TEST(step__reserve_full_prompt_admits_only_whole_prompts),
    };
    return cmocka_run_group_tests_name("sched_basic", tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_basic")
#endif
