/*
 * test_sched_update_step.c -- the update contract (issue 23): tdm_sched_update_step reports a
 * whole batch, and a request of that batch the report leaves out reports no tokens (vLLM's
 * update_from_output): a host that lists only the requests that sampled runs chunked prompts
 * to completion; a decode left out is computed again; a request outside the batch, a batch
 * out of step order and a step with no batch are refused naming what was wrong, with nothing
 * applied; pipelined batches are kept and reported oldest first. With per-request reports
 * (tdm_sched_update), an aborted request whose only owed step is a non-final prefill chunk
 * the host left out is freed once a later step is reported.
 */
#include <stdio.h>
#include <string.h>

#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

/* A copy of a batch's entries (the library's arrays last only until the next step). */
typedef struct snap {
    uint64_t step;
    uint32_t n;
    uint64_t ids[64];
    uint32_t end[64]; /* num_computed + num_tokens */
} snap;

static void take(snap *c, const tdm_batch *b)
{
    assert_true(b->num_reqs <= 64);
    c->step = b->step;
    c->n = b->num_reqs;
    for (uint32_t i = 0; i < b->num_reqs; i++) {
        c->ids[i] = b->req_ids[i];
        c->end[i] = b->num_computed[i] + b->num_tokens[i];
    }
}

/* Report, as a batch, a token (tok) for every entry of c that reached the end of its known
 * tokens and nothing for the others (they are left out); count the outputs in outs[id]. */
static int report_sampled(tdm_sched *s, const snap *c, tdm_token tok, double now, uint32_t *listed,
                          uint32_t *outs)
{
    uint64_t ids[64];
    uint32_t offs[65];
    tdm_token toks[64];
    uint32_t n = 0;
    offs[0] = 0;
    for (uint32_t i = 0; i < c->n; i++) {
        tdm_request_info info;
        tsd_info(s, c->ids[i], &info);
        if (c->end[i] < info.num_prompt_tokens + info.num_output_tokens) continue;
        ids[n] = c->ids[i];
        toks[n] = tok;
        offs[n + 1] = n + 1;
        n++;
    }
    if (listed) *listed = n;
    tdm_update_result r;
    int rc = tsd_report_step(s, c->step, n, ids, offs, toks, now, &r);
    for (uint32_t i = 0; rc == TDM_OK && outs && i < r.num_reqs; i++)
        outs[r.req_ids[i]] += r.num_new_tokens[i];
    return rc;
}

static int report_batch(tdm_sched *s, const tdm_batch *b, tdm_token tok, double now, uint32_t *listed,
                        uint32_t *outs)
{
    snap c;
    take(&c, b);
    return report_sampled(s, &c, tok, now, listed, outs);
}

static int update_step_one(tdm_sched *s, uint64_t step, uint64_t id, const tdm_token *toks, uint32_t n,
                           double now)
{
    uint32_t offs[2] = { 0, n };
    return tsd_report_step(s, step, id == UINT64_MAX ? 0 : 1, &id, offs, toks, now, NULL);
}

/* The host: chunked prompts, only the requests that sampled are reported. Every
 * request completes with its max_tokens outputs; the partial chunks left out changed nothing. */
static void update_step__left_out_prefill_chunks_report_no_tokens(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MAX_NUM_SEQS, 8, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 32,
                           TDM_SCHED_LONG_PREFILL_TOKEN_THRESHOLD, 16, 0 };
    tdm_sched *s = tsd_newp(kv);
    for (uint64_t id = 1; id <= 4; id++) assert_int_equal(tsd_add(s, id, 40 + 17 * (uint32_t)id, 5), TDM_OK);
    double t = 1.0;
    uint32_t left_out = 0, outs[8] = { 0 };
    for (int k = 0; k < 200 && tsd_unfinished(s); k++) {
        tdm_batch b;
        tsd_step(s, t, &b);
        uint32_t listed = 0;
        int rc = report_batch(s, &b, 9, t + 0.005, &listed, outs);
        if (rc != TDM_OK) fail_msg("update_step -> %d: %s", rc, tdm_sched_errmsg(s));
        left_out += b.num_reqs - listed;
        tsd_check(s);
        t += 0.01;
    }
    assert_int_equal(tsd_unfinished(s), 0);
    assert_true(left_out > 0); /* chunks were left out */
    for (uint64_t id = 1; id <= 4; id++) assert_int_equal(outs[id], 5);
    tdm_batch b;
    tsd_step(s, t, &b);
    assert_int_equal(b.num_reqs, 0);
    tsd_done(s);
}

/* A decode left out of its batch's report sampled nothing: its last token is computed again
 * in the next step (one token), and no output was added. */
static void update_step__left_out_decode_is_computed_again(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    assert_int_equal(tsd_add(s, 1, 8, 4), TDM_OK);
    assert_int_equal(tsd_add(s, 2, 8, 4), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(report_batch(s, &b, 5, 1.05, NULL, NULL), TDM_OK);
    tsd_step(s, 1.1, &b); /* both decode */
    assert_int_equal(b.num_reqs, 2);
    const tdm_token t = 6;
    assert_int_equal(update_step_one(s, b.step, 1, &t, 1, 1.15), TDM_OK); /* 2 left out */
    tdm_request_info i;
    tsd_info(s, 2, &i);
    assert_int_equal(i.num_output_tokens, 1);
    assert_int_equal(i.num_computed_tokens, 8); /* the position of its last token again */
    tsd_step(s, 1.2, &b);
    int k = tsd_find(&b, 2);
    assert_true(k >= 0);
    assert_int_equal(b.num_tokens[k], 1);
    assert_int_equal(b.num_computed[k], 8);
    assert_int_equal(report_batch(s, &b, 7, 1.25, NULL, NULL), TDM_OK);
    tsd_info(s, 2, &i);
    assert_int_equal(i.num_output_tokens, 2);
    tsd_run(s, 50, NULL);
    tsd_done(s);
}

/* A request outside the batch, a batch out of order and a step with no batch are refused,
 * naming what was wrong, and nothing is applied. */
static void update_step__wrong_request_or_step_refused_without_change(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    assert_int_equal(tsd_add(s, 1, 8, 4), TDM_OK);
    tdm_batch b1, b2;
    tsd_step(s, 1.0, &b1);
    assert_int_equal(tsd_add(s, 2, 8, 4), TDM_OK);
    tsd_step(s, 1.1, &b2); /* pipelined: 2 is admitted; 1 waits for its token */
    assert_int_equal(b2.num_reqs, 1);
    assert_int_equal(b2.req_ids[0], 2);
    const tdm_token t = 6;
    /* batch 2 before batch 1 */
    assert_int_equal(update_step_one(s, b2.step, 2, &t, 1, 1.15), TDM_E_STATE);
    char want[96];
    snprintf(want, sizeof(want), "step %llu is reported before step %llu", (unsigned long long)b2.step,
             (unsigned long long)b1.step);
    tsd_assert_msg_has(s, want);
    /* request 2 is not in batch 1 */
    assert_int_equal(update_step_one(s, b1.step, 2, &t, 1, 1.15), TDM_E_STATE);
    tsd_assert_msg_has(s, "request 2 was not scheduled in step");
    /* a step that never made a batch */
    assert_int_equal(update_step_one(s, b2.step + 5, 1, &t, 1, 1.15), TDM_E_STATE);
    tsd_assert_msg_has(s, "no batch of step");
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_int_equal(i.num_output_tokens, 0);
    tsd_info(s, 2, &i);
    assert_int_equal(i.num_output_tokens, 0);
    /* in order, each once; a replay finds no batch */
    assert_int_equal(update_step_one(s, b1.step, 1, &t, 1, 1.15), TDM_OK);
    assert_int_equal(update_step_one(s, b1.step, 1, &t, 1, 1.16), TDM_E_STATE);
    assert_int_equal(update_step_one(s, b2.step, 2, &t, 1, 1.16), TDM_OK);
    tsd_info(s, 1, &i);
    assert_int_equal(i.num_output_tokens, 1);
    tsd_info(s, 2, &i);
    assert_int_equal(i.num_output_tokens, 1);
    /* an empty report of a step that awaits none changes nothing */
    assert_int_equal(update_step_one(s, b2.step, UINT64_MAX, NULL, 0, 1.17), TDM_OK);
    tsd_run(s, 50, NULL);
    tsd_done(s);
}

/* Async scheduling keeps two batches in flight: each is reported once, oldest first, the
 * host listing only the requests that sampled. */
static void update_step__pipelined_batches_oldest_first(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MAX_NUM_SEQS, 4, TDM_SCHED_ASYNC_SCHEDULING, 1,
                           TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 24,
                           TDM_SCHED_LONG_PREFILL_TOKEN_THRESHOLD, 16, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 1, 50, 6), TDM_OK);
    assert_int_equal(tsd_add(s, 2, 10, 6), TDM_OK);
    double t = 1.0;
    uint32_t outs[4] = { 0 };
    tdm_batch b;
    snap prev, cur;
    tsd_step(s, t, &b);
    take(&prev, &b);
    for (int k = 0; k < 100 && tsd_unfinished(s); k++) {
        t += 0.01;
        tsd_step(s, t, &b); /* the next batch before the previous one's report */
        take(&cur, &b);
        int rc = report_sampled(s, &prev, 9, t + 0.005, NULL, outs);
        if (rc != TDM_OK) fail_msg("update_step -> %d: %s", rc, tdm_sched_errmsg(s));
        tsd_check(s);
        prev = cur;
    }
    assert_int_equal(tsd_unfinished(s), 0);
    assert_int_equal(outs[1], 6);
    assert_int_equal(outs[2], 6);
    if (prev.n) assert_int_equal(report_sampled(s, &prev, 9, t + 0.02, NULL, outs), TDM_OK);
    tsd_step(s, t + 0.1, &b);
    tsd_done(s);
}

/* Per-request reports (tdm_sched_update) that leave out a non-final chunk: the aborted
 * request owed only that chunk is freed (its id can be added again) once an update reports a
 * later step. */
static void update__left_out_chunks_neither_block_nor_leak(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MAX_NUM_SEQS, 4, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 16, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 7, 60, 3), TDM_OK);
    assert_int_equal(tsd_add(s, 8, 4, 3), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b); /* 7: a 16-token chunk (left out); 8 waits for budget */
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 7);
    assert_int_equal(tdm_sched_abort(s, 7), TDM_OK);
    tsd_step(s, 1.1, &b); /* reports 7 finished; 8 is scheduled */
    assert_int_equal(b.num_finished, 1);
    assert_int_equal(tsd_find(&b, 8), 0);
    tdm_request_info i;
    assert_int_equal(tdm_request_info_init(&i), TDM_OK);
    assert_int_equal(tdm_sched_request_info(s, 7, &i), TDM_OK); /* kept: its chunk is owed */
    const tdm_token t = 5;
    assert_int_equal(tsd_update_one(s, 8, &t, 1, 1.15, NULL), TDM_OK); /* a later step */
    assert_int_equal(tdm_sched_request_info(s, 7, &i), TDM_E_NOT_FOUND);
    assert_int_equal(tsd_add(s, 7, 20, 3), TDM_OK);
    tsd_run(s, 50, NULL);
    tsd_done(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(update_step__left_out_prefill_chunks_report_no_tokens),
        TSD_TEST(update_step__left_out_decode_is_computed_again),
        TSD_TEST(update_step__wrong_request_or_step_refused_without_change),
        TSD_TEST(update_step__pipelined_batches_oldest_first),
        TSD_TEST(update__left_out_chunks_neither_block_nor_leak),
    };
    return cmocka_run_group_tests_name("sched_update_step", tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_update_step")
#endif
