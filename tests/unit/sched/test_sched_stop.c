/*
 * test_sched_stop.c -- stop conditions and speculative decoding, ported from vLLM's
 * test_stop_via_update_from_output and test_check_stop_min_tokens: EOS, stop token ids (with
 * the stop reason), max_tokens and max_model_len (LENGTH), ignore_eos, min_tokens, trimming of
 * the tokens after a stop, drafts set with tdm_sched_set_draft_tokens (scheduled with the
 * request, truncated to the budget, used once), num_computed_tokens corrected for rejected
 * drafts, a late output with drafts for a request preempted in flight, and the outputs a
 * report may hold (a replayed update, a token for a non-final prefill chunk: TDM_E_STATE).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

#define EOS 2
#define ANY INT_MIN /* expect_result: this field is not checked */

/* The prompt of the two requests two_decoding() starts. */
static const tdm_token PROMPT[4] = { 501, 502, 503, 504 };

/* Two running requests (ids 0 and 1, prompt PROMPT) after their prefill, each with one
 * output token (100). */
static tdm_sched *two_decoding(const tdm_request_desc *d0, const tdm_request_desc *d1)
{
    const int64_t kv[] = { TDM_SCHED_NUM_LOOKAHEAD_TOKENS, 2, 0 };
    tdm_sched *s = tsd_newp(kv);
    tdm_request_desc d[2] = { *d0, *d1 };
    for (int i = 0; i < 2; i++) {
        d[i].id = (uint64_t)i;
        d[i].prompt = PROMPT;
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

/* two_decoding() with the default request (max_tokens 10, EOS) for both. */
static tdm_sched *two_decoding_default(void)
{
    tdm_request_desc d;
    desc_default(&d, 10);
    return two_decoding(&d, &d);
}

static void set_drafts(tdm_sched *s, uint64_t id, const tdm_token *drafts, uint32_t n)
{
    assert_int_equal(tdm_sched_set_draft_tokens(s, id, drafts, n), TDM_OK);
}

/* Set drafts for request 0 (n0 of them) and request 1 (n1), then step at 2.0. */
static void step_with_drafts(tdm_sched *s, const tdm_token *dr0, uint32_t n0,
                             const tdm_token *dr1, uint32_t n1, tdm_batch *b)
{
    if (n0) set_drafts(s, 0, dr0, n0);
    if (n1) set_drafts(s, 1, dr1, n1);
    tsd_step(s, 2.0, b);
}

/* Report explicit outputs for requests 0 and 1 at 2.1; returns the update status. */
static int try_update_two(tdm_sched *s, const tdm_token *t0, uint32_t n0, const tdm_token *t1,
                          uint32_t n1, tdm_update_result *r)
{
    uint64_t ids[2] = { 0, 1 };
    uint32_t offs[3] = { 0, n0, n0 + n1 };
    tdm_token toks[16];
    if (n0) memcpy(toks, t0, n0 * sizeof(*toks));
    if (n1) memcpy(toks + n0, t1, n1 * sizeof(*toks));
    tdm_step_output o;
    tdm_step_output_init(&o);
    o.num_reqs = 2;
    o.req_ids = ids;
    o.token_offsets = offs;
    o.tokens = toks;
    o.now = 2.1;
    tdm_update_result_init(r);
    return tdm_sched_update(s, &o, r);
}

/* try_update_two() that must succeed. */
static void update_two(tdm_sched *s, const tdm_token *t0, uint32_t n0, const tdm_token *t1,
                       uint32_t n1, tdm_update_result *r)
{
    int rc = try_update_two(s, t0, n0, t1, n1, r);
    if (rc != TDM_OK) fail_msg("update -> %d: %s", rc, tdm_sched_errmsg(s));
}

static int result_index(const tdm_update_result *r, uint64_t id)
{
    for (uint32_t i = 0; i < r->num_reqs; i++)
        if (r->req_ids[i] == id) return (int)i;
    fail_msg("id %llu not in the update result", (unsigned long long)id);
    return -1;
}

/* What the update did for request id: new tokens, finish reason, stop token (ANY: not
 * checked). */
static void expect_result(const tdm_update_result *r, uint64_t id, int num_new, int finish,
                          int stop_token)
{
    int k = result_index(r, id);
    if (num_new != ANY) assert_int_equal(r->num_new_tokens[k], num_new);
    if (finish != ANY) assert_int_equal(r->finish_reasons[k], finish);
    if (stop_token != ANY) assert_int_equal(r->stop_tokens[k], stop_token);
}

/* Batch entry k schedules `tokens` tokens, `spec` of them drafts. */
static void expect_entry(const tdm_batch *b, int k, uint32_t tokens, uint32_t spec)
{
    assert_true(k >= 0);
    assert_int_equal(b->num_tokens[k], tokens);
    assert_int_equal(b->num_spec[k], spec);
}

/* Request id's tokens are PROMPT then outs[0..n). */
static void expect_output(const tdm_sched *s, uint64_t id, const tdm_token *outs, uint32_t n)
{
    tsd_assert_tokens(s, id, PROMPT, 4, outs, n);
}

static void expect_computed(const tdm_sched *s, uint64_t id, uint32_t n)
{
    tdm_request_info i;
    tsd_info(s, id, &i);
    assert_int_equal(i.num_computed_tokens, n);
}

/* One last step at `now` (it hands back what finished), then the clean-state checks. */
static void step_and_done(tdm_sched *s, double now)
{
    tdm_batch b;
    tsd_step(s, now, &b);
    tsd_done(s);
}

/* Run what is left to the end from `now`, then the clean-state checks. */
static void run_and_done(tdm_sched *s, double now, int max_steps)
{
    tsd_run(s, max_steps, &now);
    tsd_done(s);
}

static void finish_all(tdm_sched *s)
{
    for (uint64_t id = 0; id < 2; id++) {
        tdm_request_info i;
        tsd_info(s, id, &i);
        if (i.state != TDM_STATE_FINISHED) assert_int_equal(tdm_sched_abort(s, id), TDM_OK);
    }
    step_and_done(s, 9.0);
}

/* vLLM test_stop_via_update_from_output, EOS case with drafts [10, 42] and [13]. */
static void update__eos_stops_and_trims_after_it(void **state)
{
    (void)state;
    tdm_sched *s = two_decoding_default();
    const tdm_token dr0[2] = { 10, 42 }, dr1[1] = { 13 };
    tdm_batch b;
    step_with_drafts(s, dr0, 2, dr1, 1, &b);
    assert_int_equal(b.num_reqs, 2);
    expect_entry(&b, 0, 3, 2);
    expect_entry(&b, 1, 2, 1);
    const tdm_token o0[2] = { EOS, 10 }, o1[2] = { 10, 11 };
    tdm_update_result r;
    update_two(s, o0, 2, o1, 2, &r);
    expect_result(&r, 0, 1, TDM_FINISH_STOP, ANY);
    expect_result(&r, 1, 2, TDM_FINISH_NONE, ANY);
    const tdm_token e0[2] = { 100, EOS }, e1[3] = { 100, 10, 11 };
    expect_output(s, 0, e0, 2);
    expect_output(s, 1, e1, 3);
    tdm_request_info i;
    tsd_info(s, 0, &i);
    assert_int_equal(i.state, TDM_STATE_FINISHED);
    assert_int_equal(i.finish_reason, TDM_FINISH_STOP);
    assert_int_equal(i.num_output_tokens, 2);
    expect_computed(s, 1, 6); /* one draft, accepted: nothing rejected */
    finish_all(s);
}

/* vLLM: custom stop token, stop_reason set, tokens after it trimmed. */
static void update__stop_token_sets_reason_and_trims(void **state)
{
    (void)state;
    const tdm_token stops[2] = { 42, 43 };
    tdm_request_desc d;
    desc_default(&d, 10);
    d.stop_token_ids = stops;
    d.num_stop_token_ids = 2;
    tdm_sched *s = two_decoding(&d, &d);
    const tdm_token dr0[2] = { 10, 42 }, dr1[1] = { 13 };
    tdm_batch b;
    step_with_drafts(s, dr0, 2, dr1, 1, &b);
    const tdm_token o0[3] = { 10, 42, 12 }, o1[2] = { 13, 14 };
    tdm_update_result r;
    update_two(s, o0, 3, o1, 2, &r);
    expect_result(&r, 0, 2, TDM_FINISH_STOP, 42);
    expect_result(&r, 1, ANY, TDM_FINISH_NONE, -1);
    const tdm_token e0[3] = { 100, 10, 42 }, e1[3] = { 100, 13, 14 };
    expect_output(s, 0, e0, 3);
    expect_output(s, 1, e1, 3);
    finish_all(s);
}

/* vLLM: max_tokens caps the output (LENGTH) and trims the extra accepted tokens. */
static void update__max_tokens_caps_and_trims(void **state)
{
    (void)state;
    tdm_request_desc d0, d1;
    desc_default(&d0, 3);
    desc_default(&d1, 10);
    tdm_sched *s = two_decoding(&d0, &d1);
    const tdm_token dr0[2] = { 10, 11 };
    tdm_batch b;
    step_with_drafts(s, dr0, 2, NULL, 0, &b);
    int k = tsd_find(&b, 0);
    assert_true(k >= 0);
    assert_int_equal(b.num_spec[k], 2); /* vLLM schedules the drafts as given */
    const tdm_token o0[3] = { 10, 11, 12 }, o1[1] = { 13 };
    tdm_update_result r;
    update_two(s, o0, 3, o1, 1, &r);
    expect_result(&r, 0, 2, TDM_FINISH_LENGTH, -1);
    expect_result(&r, 1, 1, TDM_FINISH_NONE, ANY);
    const tdm_token e0[3] = { 100, 10, 11 };
    expect_output(s, 0, e0, 3);
    finish_all(s);
}

/* vLLM: ignore_eos keeps going through EOS until max_tokens. */
static void update__ignore_eos_runs_to_max_tokens(void **state)
{
    (void)state;
    tdm_request_desc d0, d1;
    desc_default(&d0, 3);
    d0.flags = TDM_REQ_IGNORE_EOS;
    desc_default(&d1, 10);
    tdm_sched *s = two_decoding(&d0, &d1);
    /* the prefill step already produced 100; now EOS, then EOS + drafts */
    const tdm_token dr0[2] = { 5, 6 };
    tdm_batch b;
    step_with_drafts(s, dr0, 2, NULL, 0, &b);
    const tdm_token o0[3] = { EOS, 10, 11 }, o1[1] = { 13 };
    tdm_update_result r;
    update_two(s, o0, 3, o1, 1, &r);
    expect_result(&r, 0, 2, TDM_FINISH_LENGTH, ANY);
    const tdm_token e0[3] = { 100, EOS, 10 };
    expect_output(s, 0, e0, 3);
    finish_all(s);
}

/* vLLM 0.33's check_stop tests EOS and stop tokens before the length cap: an EOS (or stop
 * token) that is also the max_tokens-th output finishes with STOP (a stop token with its
 * stop reason); a plain max_tokens-th token still finishes with LENGTH. */
static void update__stop_on_max_tokens_th_token_reports_stop(void **state)
{
    (void)state;
    const tdm_token stops[1] = { 42 };
    tdm_request_desc d0, d1;
    desc_default(&d0, 2);
    desc_default(&d1, 2);
    d1.stop_token_ids = stops;
    d1.num_stop_token_ids = 1;
    tdm_sched *s = two_decoding(&d0, &d1);
    tdm_batch b;
    tsd_step(s, 2.0, &b);
    const tdm_token o0[1] = { EOS }, o1[1] = { 42 };
    tdm_update_result r;
    update_two(s, o0, 1, o1, 1, &r);
    expect_result(&r, 0, ANY, TDM_FINISH_STOP, EOS);
    expect_result(&r, 1, ANY, TDM_FINISH_STOP, 42);
    finish_all(s);
    /* the same requests sampling ordinary tokens: LENGTH, no stop token */
    s = two_decoding(&d0, &d1);
    tsd_step(s, 2.0, &b);
    const tdm_token p0[1] = { 11 }, p1[1] = { 12 };
    update_two(s, p0, 1, p1, 1, &r);
    expect_result(&r, 0, ANY, TDM_FINISH_LENGTH, ANY);
    expect_result(&r, 1, ANY, TDM_FINISH_LENGTH, -1);
    finish_all(s);
}

/* vLLM test_check_stop_min_tokens: EOS and stop tokens do not stop before min_tokens. */
static void update__min_tokens_defers_eos_and_stop_tokens(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    const tdm_token stops[1] = { 42 };
    tdm_request_desc d;
    desc_default(&d, 10);
    d.id = 9;
    d.prompt = PROMPT;
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
    expect_output(s, 9, outs, 3);
    step_and_done(s, 9.0);
}

/* Spec decode: rejected drafts roll num_computed_tokens back (num_rejected = drafts -
 * (sampled - 1)); the next step schedules only the new last token. */
static void update__rejected_drafts_correct_num_computed(void **state)
{
    (void)state;
    tdm_sched *s = two_decoding_default();
    const tdm_token dr[2] = { 13, 14 };
    tdm_batch b;
    step_with_drafts(s, NULL, 0, dr, 2, &b);
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
    expect_entry(&b, k, 1, 0); /* drafts are used once */
    assert_int_equal(b.num_computed[k], 5);
    tsd_update(s, &b, 7, 3.1, NULL);
    finish_all(s);
}

/* vLLM truncates a request's drafts to what fits in the remaining token budget; drafts
 * that were not scheduled are dropped. */
static void step__drafts_truncated_to_budget(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MAX_NUM_SEQS, 2, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 6,
                           TDM_SCHED_NUM_LOOKAHEAD_TOKENS, 3, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 0, 2, 10), TDM_OK);
    assert_int_equal(tsd_add(s, 1, 2, 10), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 2);
    tsd_update(s, &b, 7, 1.05, NULL);
    const tdm_token dr[3] = { 11, 12, 13 };
    set_drafts(s, 0, dr, 3);
    set_drafts(s, 1, dr, 3);
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_reqs, 2);
    expect_entry(&b, 0, 4, 3);
    expect_entry(&b, 1, 2, 1);
    tsd_update(s, &b, 7, 1.15, NULL); /* every scheduled draft accepted */
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_int_equal(i.num_output_tokens, 3);
    assert_int_equal(i.num_computed_tokens, 4);
    tsd_step(s, 1.2, &b);
    expect_entry(&b, tsd_find(&b, 1), 1, 0);
    tsd_update(s, &b, 7, 1.25, NULL);
    run_and_done(s, 2.0, 40);
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
    /* the longest prompt allowed is max_model_len - 1: one output token, then LENGTH */
    assert_int_equal(tsd_add(s, 2, 63, 100), TDM_OK);
    tsd_step(s, 21.0, &b);
    assert_int_equal(b.num_tokens[0], 63);
    tsd_update(s, &b, 7, 21.1, &r);
    assert_int_equal(r.num_new_tokens[0], 1);
    assert_int_equal(r.finish_reasons[0], TDM_FINISH_LENGTH);
    step_and_done(s, 22.0);
}

/* vLLM applies a late output to a request preempted while its batch was in flight, also
 * with drafts: the tokens are appended (no num_computed correction: it restarts from 0), and
 * the other requests of the same output are applied too. */
static void update__late_output_with_drafts_after_preemption_applied(void **state)
{
    (void)state;
    tdm_sched *s = two_decoding_default();
    const tdm_token dr[2] = { 11, 12 };
    tdm_batch b;
    step_with_drafts(s, NULL, 0, dr, 2, &b);
    assert_int_equal(b.num_spec[tsd_find(&b, 1)], 2);
    /* the host preempts everything while the batch runs */
    assert_int_equal(tdm_sched_reset_prefix_cache(s, 1), TDM_OK);
    assert_int_equal(tsd_state(s, 1), TDM_STATE_PREEMPTED);
    const tdm_token o0[1] = { 20 }, o1[3] = { 11, 12, 13 };
    tdm_update_result r;
    update_two(s, o0, 1, o1, 3, &r);
    const tdm_token e0[2] = { 100, 20 }, e1[4] = { 100, 11, 12, 13 };
    expect_output(s, 0, e0, 2);
    expect_output(s, 1, e1, 4);
    expect_computed(s, 1, 0);
    finish_all(s);
}

/* vLLM: a late output that stops a request preempted mid-flight finishes it and removes it
 * from the waiting queue; it is never resumed. */
static void update__late_stop_of_preempted_request_finishes_it(void **state)
{
    (void)state;
    tdm_sched *s = two_decoding_default();
    tdm_batch b;
    tsd_step(s, 2.0, &b);
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(tdm_sched_reset_prefix_cache(s, 1), TDM_OK); /* preempts both in flight */
    const tdm_token o0[1] = { EOS }, o1[1] = { 20 };
    tdm_update_result r;
    update_two(s, o0, 1, o1, 1, &r);
    expect_result(&r, 0, ANY, TDM_FINISH_STOP, ANY);
    assert_int_equal(tsd_state(s, 0), TDM_STATE_FINISHED);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_waiting, 1);
    assert_int_equal(tsd_unfinished(s), 1);
    tsd_step(s, 2.2, &b);
    assert_int_equal(tsd_find(&b, 0), -1);
    assert_true(tsd_find_id(b.finished_ids, b.num_finished, 0) >= 0);
    int k = tsd_find(&b, 1);
    assert_true(k >= 0);
    assert_int_equal(b.kinds[k], TDM_ENTRY_RESUMED);
    tsd_update(s, &b, 7, 2.3, NULL);
    run_and_done(s, 3.0, 20);
}

/* A malformed report: no token for a decode entry that had drafts scheduled (the contract
 * says 1 + accepted drafts). The scheduler may refuse it (TDM_E_INVAL) or treat every draft
 * as rejected, but it must not keep counting the drafts as computed: num_computed_tokens never
 * exceeds the request's token count and later batches stay consistent. */
static void update__empty_output_for_drafted_decode_keeps_state_consistent(void **state)
{
    (void)state;
    tdm_sched *s = two_decoding_default();
    const tdm_token dr[2] = { 11, 12 };
    tdm_batch b;
    step_with_drafts(s, NULL, 0, dr, 2, &b);
    const tdm_token o0[1] = { 20 };
    tdm_update_result r;
    int rc = try_update_two(s, o0, 1, NULL, 0, &r); /* request 1: no token */
    assert_true(rc == TDM_OK || rc == TDM_E_INVAL);
    tdm_request_info i;
    tsd_info(s, 1, &i);
    if (rc == TDM_OK && i.num_computed_tokens > i.num_prompt_tokens + i.num_output_tokens)
        fail_msg("after an empty report, request 1 has %u tokens computed of %u (drafts kept as computed)",
                 i.num_computed_tokens, i.num_prompt_tokens + i.num_output_tokens);
    if (rc == TDM_E_INVAL) tsd_update(s, &b, 7, 2.15, NULL); /* refused: send a proper one */
    for (int k = 0; k < 3; k++) { /* tsd_step checks num_spec <= num_tokens, and so on */
        tsd_step(s, 3.0 + k, &b);
        tsd_update(s, &b, 7, 3.05 + k, NULL);
    }
    run_and_done(s, 4.0, 40);
}

/* Drafts set while the request's previous step is still in flight (not yet reported): the
 * scheduler may refuse them (TDM_E_STATE) or hold them, but a batch never schedules more draft
 * tokens than tokens (num_spec <= num_tokens), and the late output still applies cleanly. */
static void set_draft_tokens__while_step_in_flight_keeps_batches_consistent(void **state)
{
    (void)state;
    tdm_sched *s = two_decoding_default();
    const tdm_token dr1[1] = { 11 };
    tdm_batch b;
    /* request 1: its last token + 1 draft; not reported yet */
    step_with_drafts(s, NULL, 0, dr1, 1, &b);
    const tdm_token dr2[2] = { 21, 22 };
    int rc = tdm_sched_set_draft_tokens(s, 1, dr2, 2);
    assert_true(rc == TDM_OK || rc == TDM_E_STATE);
    tdm_batch b2;
    tsd_step(s, 2.1, &b2); /* tsd_step checks num_spec <= num_tokens for every entry */
    /* the first step's output arrives late: 1 token + the accepted draft */
    const tdm_token o1[2] = { 11, 30 };
    assert_int_equal(tsd_update_one(s, 1, o1, 2, 2.15, NULL), TDM_OK);
    const tdm_token o0[1] = { 31 };
    assert_int_equal(tsd_update_one(s, 0, o0, 1, 2.15, NULL), TDM_OK);
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_true(i.num_computed_tokens <= i.num_prompt_tokens + i.num_output_tokens);
    run_and_done(s, 3.0, 40);
}

/* Issue 11, defect 6: the same update sent three times after one step gave three tokens.
 * Each step's output is taken once; a replay is refused with TDM_E_STATE naming the request
 * and changes nothing. */
static void update__replayed_update_refused_and_applied_once(void **state)
{
    (void)state;
    tdm_sched *s = two_decoding_default();
    tdm_batch b;
    tsd_step(s, 2.0, &b);
    assert_int_equal(b.num_reqs, 2);
    const tdm_token t = 20;
    assert_int_equal(tsd_update_one(s, 0, &t, 1, 2.1, NULL), TDM_OK);
    for (int k = 0; k < 2; k++) {
        int rc = tsd_update_one(s, 0, &t, 1, 2.1, NULL);
        if (rc != TDM_E_STATE) fail_msg("replay %d -> %d: %s", k, rc, tdm_sched_errmsg(s));
        tsd_assert_msg_has(s, "request 0 has no scheduled step awaiting its output");
    }
    tdm_request_info i;
    tsd_info(s, 0, &i);
    assert_int_equal(i.num_output_tokens, 2); /* 100 from the prefill, 20 once */
    /* request 1 of the same step is still owed its output: accepted once */
    assert_int_equal(tsd_update_one(s, 1, &t, 1, 2.1, NULL), TDM_OK);
    assert_int_equal(tsd_update_one(s, 1, &t, 1, 2.1, NULL), TDM_E_STATE);
    tsd_info(s, 1, &i);
    assert_int_equal(i.num_output_tokens, 2);
    finish_all(s);
}

/* Issue 11, defect 6: a token sent for a non-final prefill chunk became output #1 with the
 * first-token time set at 32 of 99 prompt tokens. Only a step that completes the prompt (or
 * decodes) may bring sampled tokens; also with two chunks in flight (a pipelining host), each
 * chunk is reported once, in order, and only the last one takes the token. */
static void update__token_for_non_final_prefill_chunk_refused(void **state)
{
    (void)state;
    /* 32-token chunks from the budget (a lone request ignores the long-prefill threshold) */
    const int64_t kv[] = { TDM_SCHED_MAX_NUM_SEQS, 8, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 32, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 7, 99, 5), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.num_tokens[0], 32);
    const tdm_token t = 20;
    assert_int_equal(tsd_update_one(s, 7, &t, 1, 1.1, NULL), TDM_E_STATE);
    tsd_assert_msg_has(s, "request 7: 1 sampled token(s) for a prefill chunk that does not complete");
    tdm_request_info i;
    tsd_info(s, 7, &i);
    assert_int_equal(i.num_output_tokens, 0);
    assert_true(i.first_token_time < 0);
    assert_int_equal(i.num_computed_tokens, 32);
    assert_int_equal(tsd_update_one(s, 7, NULL, 0, 1.1, NULL), TDM_OK); /* the right report */
    /* two chunks in flight before any update: 64 and 96 of 99 */
    tdm_batch b2;
    tsd_step(s, 1.2, &b);
    tsd_step(s, 1.3, &b2);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b2.num_reqs, 1);
    assert_int_equal(b2.num_computed[0], 64);
    assert_int_equal(tsd_update_one(s, 7, &t, 1, 1.35, NULL), TDM_E_STATE); /* for step 2 */
    assert_int_equal(tsd_update_one(s, 7, NULL, 0, 1.35, NULL), TDM_OK);
    assert_int_equal(tsd_update_one(s, 7, &t, 1, 1.36, NULL), TDM_E_STATE); /* step 3 too */
    assert_int_equal(tsd_update_one(s, 7, NULL, 0, 1.36, NULL), TDM_OK);
    assert_int_equal(tsd_update_one(s, 7, NULL, 0, 1.37, NULL), TDM_E_STATE); /* nothing owed */
    tsd_step(s, 1.4, &b); /* the last 3 tokens complete the prompt: the token is taken */
    assert_int_equal(b.num_tokens[0], 3);
    assert_int_equal(tsd_update_one(s, 7, &t, 1, 1.5, NULL), TDM_OK);
    tsd_info(s, 7, &i);
    assert_int_equal(i.num_output_tokens, 1);
    assert_true(i.first_token_time == 1.5);
    run_and_done(s, 2.0, 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(update__eos_stops_and_trims_after_it),
        TSD_TEST(update__stop_token_sets_reason_and_trims),
        TSD_TEST(update__max_tokens_caps_and_trims),
        TSD_TEST(update__ignore_eos_runs_to_max_tokens),
        TSD_TEST(update__stop_on_max_tokens_th_token_reports_stop),
        TSD_TEST(update__min_tokens_defers_eos_and_stop_tokens),
        TSD_TEST(update__rejected_drafts_correct_num_computed),
        TSD_TEST(step__drafts_truncated_to_budget),
        TSD_TEST(update__max_model_len_stops_with_length),
        TSD_TEST(update__late_output_with_drafts_after_preemption_applied),
        TSD_TEST(update__late_stop_of_preempted_request_finishes_it),
        TSD_TEST(update__empty_output_for_drafted_decode_keeps_state_consistent),
        TSD_TEST(set_draft_tokens__while_step_in_flight_keeps_batches_consistent),
        TSD_TEST(update__replayed_update_refused_and_applied_once),
        TSD_TEST(update__token_for_non_final_prefill_chunk_refused),
    };
    return cmocka_run_group_tests_name("sched_stop", tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_stop")
#endif
