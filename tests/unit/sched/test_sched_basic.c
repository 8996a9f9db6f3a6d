/*
 * test_sched_basic.c -- vLLM v1 scheduler behaviours ported from test_scheduler.py as
 * scenarios against the C ABI: adding, aborting and finishing requests; FIFO admission;
 * concurrent partial prefills (400/400/224); head-of-line blocking with chunked prefill off;
 * stop conditions (EOS, stop tokens, max_tokens, ignore_eos, min_tokens, max_model_len) with
 * trimming and speculative drafts; preemption (FCFS victim, late output still applied, no
 * admission in a preempting step, resumption at the front with the whole block table);
 * per-request timings. Every scenario ends with all blocks free (tsd_done).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

#define EOS 2

static void assert_close(double a, double b)
{
    if (fabs(a - b) > 1e-9) fail_msg("%.9f != %.9f", a, b);
}

static void assert_tokens(const tdm_sched *s, uint64_t id, const tdm_token *prompt, uint32_t np,
                          const tdm_token *outs, uint32_t no)
{
    const tdm_token *t = NULL;
    uint32_t n = 0;
    assert_int_equal(tdm_sched_request_tokens(s, id, &t, &n), TDM_OK);
    assert_int_equal(n, np + no);
    for (uint32_t i = 0; i < np; i++) assert_int_equal(t[i], prompt[i]);
    for (uint32_t i = 0; i < no; i++) assert_int_equal(t[np + i], outs[i]);
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
    tsd_update(s, &b, 7, 1.5, NULL);
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

/* Two running requests after their prefill, each with one output token (100). */
static tdm_sched *two_decoding(const tdm_request_desc *d0, const tdm_request_desc *d1,
                               tdm_token *prompt)
{
    const int64_t kv[] = { TDM_SCHED_NUM_LOOKAHEAD_TOKENS, 2, 0 };
    tdm_sched *s = tsd_newp(kv);
    tdm_request_desc d[2] = { *d0, *d1 };
    for (int i = 0; i < 2; i++) {
        d[i].id = (uint64_t)i;
        d[i].prompt = prompt;
        d[i].num_prompt_tokens = 4;
        assert_int_equal(tdm_sched_add(s, &d[i]), TDM_OK);
    }
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 2);
    tsd_update(s, &b, 100, 1.1, NULL);
    return s;
}

static void desc_default(tdm_request_desc *d, uint32_t max_tokens)
{
    tdm_request_desc_init(d);
    d->max_tokens = max_tokens;
    d->eos_token_id = EOS;
}

/* Report explicit outputs for requests 0 and 1. */
static void update_two(tdm_sched *s, const tdm_token *t0, uint32_t n0, const tdm_token *t1,
                       uint32_t n1, tdm_update_result *r)
{
    uint64_t ids[2] = { 0, 1 };
    uint32_t offs[3] = { 0, n0, n0 + n1 };
    tdm_token toks[16];
    memcpy(toks, t0, n0 * sizeof(*toks));
    memcpy(toks + n0, t1, n1 * sizeof(*toks));
    tdm_step_output o;
    tdm_step_output_init(&o);
    o.num_reqs = 2;
    o.req_ids = ids;
    o.token_offsets = offs;
    o.tokens = toks;
    o.now = 2.1;
    tdm_update_result_init(r);
    assert_int_equal(tdm_sched_update(s, &o, r), TDM_OK);
}

static int result_index(const tdm_update_result *r, uint64_t id)
{
    for (uint32_t i = 0; i < r->num_reqs; i++)
        if (r->req_ids[i] == id) return (int)i;
    fail_msg("id %llu not in the update result", (unsigned long long)id);
    return -1;
}

static void finish_all(tdm_sched *s)
{
    for (uint64_t id = 0; id < 2; id++) {
        tdm_request_info i;
        tsd_info(s, id, &i);
        if (i.state != TDM_STATE_FINISHED) assert_int_equal(tdm_sched_abort(s, id), TDM_OK);
    }
    tdm_batch b;
    tsd_step(s, 9.0, &b);
    tsd_done(s);
}

/* vLLM test_stop_via_update_from_output, EOS case with drafts [10, 42] and [13]. */
static void update__eos_stops_and_trims_after_it(void **state)
{
    (void)state;
    tdm_token prompt[4] = { 501, 502, 503, 504 };
    tdm_request_desc d;
    desc_default(&d, 10);
    tdm_sched *s = two_decoding(&d, &d, prompt);
    const tdm_token dr0[2] = { 10, 42 }, dr1[1] = { 13 };
    assert_int_equal(tdm_sched_set_draft_tokens(s, 0, dr0, 2), TDM_OK);
    assert_int_equal(tdm_sched_set_draft_tokens(s, 1, dr1, 1), TDM_OK);
    tdm_batch b;
    tsd_step(s, 2.0, &b);
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(b.num_tokens[0], 3);
    assert_int_equal(b.num_spec[0], 2);
    assert_int_equal(b.num_tokens[1], 2);
    assert_int_equal(b.num_spec[1], 1);
    const tdm_token o0[2] = { EOS, 10 }, o1[2] = { 10, 11 };
    tdm_update_result r;
    update_two(s, o0, 2, o1, 2, &r);
    int i0 = result_index(&r, 0), i1 = result_index(&r, 1);
    assert_int_equal(r.num_new_tokens[i0], 1);
    assert_int_equal(r.finish_reasons[i0], TDM_FINISH_STOP);
    assert_int_equal(r.num_new_tokens[i1], 2);
    assert_int_equal(r.finish_reasons[i1], TDM_FINISH_NONE);
    const tdm_token e0[2] = { 100, EOS }, e1[3] = { 100, 10, 11 };
    assert_tokens(s, 0, prompt, 4, e0, 2);
    assert_tokens(s, 1, prompt, 4, e1, 3);
    tdm_request_info i;
    tsd_info(s, 0, &i);
    assert_int_equal(i.state, TDM_STATE_FINISHED);
    assert_int_equal(i.finish_reason, TDM_FINISH_STOP);
    assert_int_equal(i.num_output_tokens, 2);
    tsd_info(s, 1, &i);
    assert_int_equal(i.num_computed_tokens, 6); /* one draft, accepted: nothing rejected */
    finish_all(s);
}

/* vLLM: custom stop token, stop_reason set, tokens after it trimmed. */
static void update__stop_token_sets_reason_and_trims(void **state)
{
    (void)state;
    tdm_token prompt[4] = { 501, 502, 503, 504 };
    const tdm_token stops[2] = { 42, 43 };
    tdm_request_desc d;
    desc_default(&d, 10);
    d.stop_token_ids = stops;
    d.num_stop_token_ids = 2;
    tdm_sched *s = two_decoding(&d, &d, prompt);
    const tdm_token dr0[2] = { 10, 42 }, dr1[1] = { 13 };
    assert_int_equal(tdm_sched_set_draft_tokens(s, 0, dr0, 2), TDM_OK);
    assert_int_equal(tdm_sched_set_draft_tokens(s, 1, dr1, 1), TDM_OK);
    tdm_batch b;
    tsd_step(s, 2.0, &b);
    const tdm_token o0[3] = { 10, 42, 12 }, o1[2] = { 13, 14 };
    tdm_update_result r;
    update_two(s, o0, 3, o1, 2, &r);
    int i0 = result_index(&r, 0), i1 = result_index(&r, 1);
    assert_int_equal(r.num_new_tokens[i0], 2);
    assert_int_equal(r.finish_reasons[i0], TDM_FINISH_STOP);
    assert_int_equal(r.stop_tokens[i0], 42);
    assert_int_equal(r.finish_reasons[i1], TDM_FINISH_NONE);
    assert_int_equal(r.stop_tokens[i1], -1);
    const tdm_token e0[3] = { 100, 10, 42 }, e1[3] = { 100, 13, 14 };
    assert_tokens(s, 0, prompt, 4, e0, 3);
    assert_tokens(s, 1, prompt, 4, e1, 3);
    finish_all(s);
}

/* vLLM: max_tokens caps the output (LENGTH) and trims the extra accepted tokens. */
static void update__max_tokens_caps_and_trims(void **state)
{
    (void)state;
    tdm_token prompt[4] = { 501, 502, 503, 504 };
    tdm_request_desc d0, d1;
    desc_default(&d0, 3);
    desc_default(&d1, 10);
    tdm_sched *s = two_decoding(&d0, &d1, prompt);
    const tdm_token dr0[2] = { 10, 11 };
    assert_int_equal(tdm_sched_set_draft_tokens(s, 0, dr0, 2), TDM_OK);
    tdm_batch b;
    tsd_step(s, 2.0, &b);
    int k = tsd_find(&b, 0);
    assert_true(k >= 0);
    assert_int_equal(b.num_spec[k], 2); /* vLLM schedules the drafts as given */
    const tdm_token o0[3] = { 10, 11, 12 }, o1[1] = { 13 };
    tdm_update_result r;
    update_two(s, o0, 3, o1, 1, &r);
    int i0 = result_index(&r, 0), i1 = result_index(&r, 1);
    assert_int_equal(r.num_new_tokens[i0], 2);
    assert_int_equal(r.finish_reasons[i0], TDM_FINISH_LENGTH);
    assert_int_equal(r.stop_tokens[i0], -1);
    assert_int_equal(r.num_new_tokens[i1], 1);
    assert_int_equal(r.finish_reasons[i1], TDM_FINISH_NONE);
    const tdm_token e0[3] = { 100, 10, 11 };
    assert_tokens(s, 0, prompt, 4, e0, 3);
    finish_all(s);
}

/* vLLM: ignore_eos keeps going through EOS until max_tokens. */
static void update__ignore_eos_runs_to_max_tokens(void **state)
{
    (void)state;
    tdm_token prompt[4] = { 501, 502, 503, 504 };
    tdm_request_desc d0, d1;
    desc_default(&d0, 3);
    d0.flags = TDM_REQ_IGNORE_EOS;
    desc_default(&d1, 10);
    tdm_sched *s = two_decoding(&d0, &d1, prompt);
    /* the prefill step already produced 100; now EOS, then EOS + drafts */
    const tdm_token dr0[2] = { 5, 6 };
    assert_int_equal(tdm_sched_set_draft_tokens(s, 0, dr0, 2), TDM_OK);
    tdm_batch b;
    tsd_step(s, 2.0, &b);
    const tdm_token o0[3] = { EOS, 10, 11 }, o1[1] = { 13 };
    tdm_update_result r;
    update_two(s, o0, 3, o1, 1, &r);
    int i0 = result_index(&r, 0);
    assert_int_equal(r.num_new_tokens[i0], 2);
    assert_int_equal(r.finish_reasons[i0], TDM_FINISH_LENGTH);
    const tdm_token e0[3] = { 100, EOS, 10 };
    assert_tokens(s, 0, prompt, 4, e0, 3);
    finish_all(s);
}

/* vLLM test_check_stop_min_tokens: EOS and stop tokens do not stop before min_tokens. */
static void update__min_tokens_defers_eos_and_stop_tokens(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    tdm_token prompt[4] = { 501, 502, 503, 504 };
    const tdm_token stops[1] = { 42 };
    tdm_request_desc d;
    desc_default(&d, 10);
    d.id = 9;
    d.prompt = prompt;
    d.num_prompt_tokens = 4;
    d.min_tokens = 3;
    d.stop_token_ids = stops;
    d.num_stop_token_ids = 1;
    assert_int_equal(tdm_sched_add(s, &d), TDM_OK);
    const tdm_token outs[3] = { EOS, 42, EOS };
    for (int k = 0; k < 3; k++) {
        tdm_batch b;
        tsd_step(s, 1.0 + k, &b);
        assert_int_equal(b.num_reqs, 1);
        tdm_update_result r;
        assert_int_equal(tsd_update_one(s, 9, &outs[k], 1, 1.5 + k, &r), TDM_OK);
        assert_int_equal(r.num_reqs, 1);
        assert_int_equal(r.num_new_tokens[0], 1);
        assert_int_equal(r.finish_reasons[0], k < 2 ? TDM_FINISH_NONE : TDM_FINISH_STOP);
    }
    assert_tokens(s, 9, prompt, 4, outs, 3);
    tdm_batch b;
    tsd_step(s, 9.0, &b);
    tsd_done(s);
}

/* Spec decode: rejected drafts roll num_computed_tokens back (num_rejected = drafts -
 * (sampled - 1)); the next step schedules only the new last token. */
static void update__rejected_drafts_correct_num_computed(void **state)
{
    (void)state;
    tdm_token prompt[4] = { 501, 502, 503, 504 };
    tdm_request_desc d;
    desc_default(&d, 10);
    tdm_sched *s = two_decoding(&d, &d, prompt);
    const tdm_token dr[2] = { 13, 14 };
    assert_int_equal(tdm_sched_set_draft_tokens(s, 1, dr, 2), TDM_OK);
    tdm_batch b;
    tsd_step(s, 2.0, &b);
    int k = tsd_find(&b, 1);
    assert_int_equal(b.num_computed[k], 4);
    assert_int_equal(b.num_tokens[k], 3);
    const tdm_token o0[1] = { 7 }, o1[1] = { 13 };
    tdm_update_result r;
    update_two(s, o0, 1, o1, 1, &r);
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_int_equal(i.num_output_tokens, 2);
    assert_int_equal(i.num_computed_tokens, 5);
    tsd_step(s, 3.0, &b);
    k = tsd_find(&b, 1);
    assert_true(k >= 0);
    assert_int_equal(b.num_computed[k], 5);
    assert_int_equal(b.num_tokens[k], 1);
    assert_int_equal(b.num_spec[k], 0); /* drafts are used once */
    tsd_update(s, &b, 7, 3.1, NULL);
    finish_all(s);
}

static void update__max_model_len_stops_with_length(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MAX_MODEL_LEN, 64, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 1, 64, 10), TDM_E_RANGE); /* prompt > max_model_len - 1 */
    assert_int_equal(tsd_add(s, 1, 60, 100), TDM_OK);
    tdm_update_result r;
    uint32_t outs = 0;
    for (int k = 0; k < 10; k++) {
        tdm_batch b;
        tsd_step(s, 1.0 + k, &b);
        if (b.num_reqs == 0) break;
        tsd_update(s, &b, 7, 1.5 + k, &r);
        outs += r.num_new_tokens[0];
        if (r.finish_reasons[0] != TDM_FINISH_NONE) {
            assert_int_equal(r.finish_reasons[0], TDM_FINISH_LENGTH);
            break;
        }
    }
    assert_int_equal(outs, 4); /* 60 + 4 == max_model_len */
    tdm_batch b;
    tsd_step(s, 20.0, &b);
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
    assert_tokens(s, 1, prompt, 80, &t1, 1);
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
    tdm_request_desc_init(&d);
    d.id = 1;
    d.prompt = p;
    d.num_prompt_tokens = 8;
    d.max_tokens = 3;
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(add__queues_waiting_and_abort_counts_down),
        cmocka_unit_test(add__duplicate_id_rejected),
        cmocka_unit_test(step__fifo_admits_all_prompts_in_order),
        cmocka_unit_test(step__concurrent_partial_prefills_400_400_224),
        cmocka_unit_test(step__chunked_prefill_off_head_of_line_blocks),
        cmocka_unit_test(update__eos_stops_and_trims_after_it),
        cmocka_unit_test(update__stop_token_sets_reason_and_trims),
        cmocka_unit_test(update__max_tokens_caps_and_trims),
        cmocka_unit_test(update__ignore_eos_runs_to_max_tokens),
        cmocka_unit_test(update__min_tokens_defers_eos_and_stop_tokens),
        cmocka_unit_test(update__rejected_drafts_correct_num_computed),
        cmocka_unit_test(update__max_model_len_stops_with_length),
        cmocka_unit_test(preempt__late_output_of_preempted_request_applied),
        cmocka_unit_test(preempt__fcfs_victim_newest_no_admission_resume_front),
        cmocka_unit_test(finish__host_finish_frees_and_ignores_late_output),
        cmocka_unit_test(update__records_timings_from_host_clock),
    };
    return cmocka_run_group_tests_name("sched_basic", tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_basic")
#endif
