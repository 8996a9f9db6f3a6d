/*
 * test_sched_pd.c -- the P/D roles as scheduler states, and the decode-first mode.
 * Decode side (REMOTE_PREFILL): blocks reserved and reported in recv_ready_ids, not
 * schedulable until tdm_sched_remote_kv_done, then only the tokens not received (at least the
 * last prompt token) are computed; failure recomputes (keeping the valid tokens) or fails the
 * request by configuration; abort while waiting keeps the blocks until the receive reports or
 * times out; remote-KV timeouts. Prefill side (REMOTE_DECODE): a finished request holds its
 * blocks until tdm_sched_release or the delayed-free timeout (vLLM's NIXL delay_free).
 * DECODE_FIRST: running decodes, then partial prefills, then new prefills; a TBT target with a
 * host cost model keeps the predicted step cost within the target.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

static int add_flags(tdm_sched *s, uint64_t id, uint32_t n, uint32_t max_tokens, uint32_t flags,
                     uint32_t num_remote)
{
    tsd_req r;
    tsd_req_init(&r, id, n, max_tokens);
    r.d.flags = flags;
    r.d.num_remote_tokens = num_remote;
    return tdm_sched_add(s, &r.d);
}

static tdm_sched *decode_side(int64_t failure, int64_t timeout_ms)
{
    const int64_t kv[] = { TDM_SCHED_ROLE, TDM_ROLE_DECODE, TDM_SCHED_REMOTE_KV_FAILURE, failure,
                           TDM_SCHED_REMOTE_KV_TIMEOUT_MS, timeout_ms, 0 };
    return tsd_newp(kv);
}

/* Add remote request 1 (40 tokens) and step once: blocks are reserved for the tokens whose
 * KV arrives (vLLM allocates local + external tokens for an async load): 3 blocks for the
 * whole prompt, ceil(num_remote / 16) otherwise. */
static void reserve_remote(tdm_sched *s, double now, uint32_t num_remote)
{
    assert_int_equal(add_flags(s, 1, 40, 2, TDM_REQ_REMOTE_PREFILL, num_remote), TDM_OK);
    uint32_t want = num_remote ? (num_remote + 15) / 16 : 3;
    tdm_batch b;
    tsd_step(s, now, &b);
    uint32_t others = 0;
    for (uint32_t k = 0; k < b.num_reqs; k++) others += b.block_offsets[k + 1] - b.block_offsets[k];
    assert_int_equal(tsd_find(&b, 1), -1);
    assert_int_equal(b.num_recv_ready, 1);
    assert_int_equal(b.recv_ready_ids[0], 1);
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_int_equal(i.state, TDM_STATE_WAITING_REMOTE_KV);
    assert_int_equal(i.num_blocks, want);
    assert_int_equal(tdm__sched_blocks_in_use(s), want + others);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_waiting_remote_kv, 1);
    assert_int_equal(st.num_running, b.num_reqs);
    tsd_update(s, &b, 7, now + 0.01, NULL);
}

static void finish_all(tdm_sched *s, double now)
{
    tsd_run(s, 100, &now);
    tsd_done(s);
}

/* The batch holds request id alone. */
static void expect_only(const tdm_batch *b, uint64_t id)
{
    assert_int_equal(b->num_reqs, 1);
    assert_int_equal(b->req_ids[0], id);
}

/* The batch holds request id alone, computing `tokens` tokens from `computed`. */
static void expect_only_chunk(const tdm_batch *b, uint64_t id, uint32_t computed, uint32_t tokens)
{
    expect_only(b, id);
    assert_int_equal(b->num_computed[0], computed);
    assert_int_equal(b->num_tokens[0], tokens);
}

/* Request id has finished with `reason` and is still known. */
static void expect_finished(const tdm_sched *s, uint64_t id, uint32_t reason)
{
    tdm_request_info i;
    tsd_info(s, id, &i);
    assert_int_equal(i.state, TDM_STATE_FINISHED);
    assert_int_equal(i.finish_reason, reason);
}

/* Request id is no longer known to the scheduler. */
static void expect_gone(const tdm_sched *s, uint64_t id)
{
    tdm_request_info i;
    tdm_request_info_init(&i);
    assert_int_equal(tdm_sched_request_info(s, id, &i), TDM_E_NOT_FOUND);
}

/* On a RECOMPUTE decode side: reserve request 1 (num_remote of its 40 tokens remote, 0: all),
 * report its receive (ok, num_valid tokens), and check that the next step computes it from
 * `computed` for `tokens` tokens; then run to the end. */
static void receive_then_compute(uint32_t num_remote, int ok, uint32_t num_valid,
                                 uint32_t computed, uint32_t tokens)
{
    tdm_sched *s = decode_side(TDM_REMOTE_KV_RECOMPUTE, 0);
    reserve_remote(s, 1.0, num_remote);
    assert_int_equal(tdm_sched_remote_kv_done(s, 1, ok, num_valid), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.1, &b);
    expect_only_chunk(&b, 1, computed, tokens);
    tsd_update(s, &b, 7, 1.15, NULL);
    finish_all(s, 2.0);
}

static void remote_prefill__reserved_then_computes_last_token(void **state)
{
    (void)state;
    tdm_sched *s = decode_side(TDM_REMOTE_KV_RECOMPUTE, 0);
    assert_int_equal(tsd_add(s, 7, 20, 2), TDM_OK); /* a local request runs meanwhile */
    reserve_remote(s, 1.0, 0);
    const uint32_t *t;
    uint32_t n;
    uint32_t tbl[3];
    assert_int_equal(tdm_sched_request_blocks(s, 1, &t, &n), TDM_OK);
    memcpy(tbl, t, sizeof(tbl));
    tdm_batch b;
    tsd_step(s, 1.1, &b);
    assert_int_equal(tsd_find(&b, 1), -1);
    assert_int_equal(b.num_recv_ready, 0);
    tsd_update(s, &b, 7, 1.15, NULL);
    assert_int_equal(tdm_sched_remote_kv_done(s, 1, 1, 0), TDM_OK);
    tsd_step(s, 1.2, &b);
    int k = tsd_find(&b, 1);
    assert_true(k >= 0);
    assert_int_equal(b.kinds[k], TDM_ENTRY_NEW);
    assert_int_equal(b.num_computed[k], 39);
    assert_int_equal(b.num_tokens[k], 1);
    assert_int_equal(b.block_offsets[k + 1] - b.block_offsets[k], 3);
    assert_memory_equal(b.blocks + b.block_offsets[k], tbl, sizeof(tbl));
    assert_int_equal(tdm_sched_remote_kv_done(s, 1, 1, 0), TDM_E_STATE);
    tsd_update(s, &b, 7, 1.25, NULL);
    /* the received blocks were offered to the prefix cache */
    tdm_token p[40];
    tsd_prompt(1, 40, p);
    assert_int_equal(tsd_add_tokens(s, 2, p, 40, 2), TDM_OK);
    tsd_step(s, 1.3, &b);
    k = tsd_find(&b, 2);
    assert_true(k >= 0);
    assert_int_equal(b.num_computed[k], 32);
    tsd_update(s, &b, 7, 1.35, NULL);
    finish_all(s, 2.0);
}

/* vLLM: the local prefix hit comes first; only the rest is expected from the remote side
 * (get_num_new_matched_tokens is asked with the local hit). */
static void remote_prefill__local_prefix_hit_reduces_remote_part(void **state)
{
    (void)state;
    tdm_sched *s = decode_side(TDM_REMOTE_KV_RECOMPUTE, 0);
    tdm_token p[40];
    tsd_prompt(1, 40, p);
    assert_int_equal(tsd_add_tokens(s, 5, p, 40, 2), TDM_OK); /* same prompt, computed locally */
    double now = 1.0;
    tsd_run(s, 20, &now);
    const uint32_t *t;
    uint32_t n;
    assert_int_equal(add_flags(s, 1, 40, 2, TDM_REQ_REMOTE_PREFILL, 0), TDM_OK);
    tdm_batch b;
    tsd_step(s, 2.0, &b);
    assert_int_equal(b.num_recv_ready, 1);
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_int_equal(i.state, TDM_STATE_WAITING_REMOTE_KV);
    assert_int_equal(i.num_cached_tokens, 32);
    assert_int_equal(i.num_blocks, 3);
    assert_int_equal(tdm_sched_request_blocks(s, 1, &t, &n), TDM_OK);
    assert_int_equal(tdm_sched_remote_kv_done(s, 1, 1, 0), TDM_OK);
    tsd_step(s, 2.1, &b);
    expect_only_chunk(&b, 1, 39, 1);
    tsd_update(s, &b, 7, 2.15, NULL);
    finish_all(s, 3.0);
}

/* vLLM keeps requests waiting for remote KV in the waiting queue (skipped each step and
 * prepended back in their order, test_prepend_skipped_requests_order): once their KV has
 * arrived they are admitted in queue (arrival) order, whatever order the receives end in,
 * and ahead of requests that arrived after them. */
static void remote_prefill__received_requests_keep_queue_order(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_ROLE, TDM_ROLE_DECODE, TDM_SCHED_MAX_NUM_SEQS, 1, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(add_flags(s, 1, 40, 2, TDM_REQ_REMOTE_PREFILL, 0), TDM_OK);
    assert_int_equal(add_flags(s, 2, 40, 2, TDM_REQ_REMOTE_PREFILL, 0), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_recv_ready, 2);
    assert_int_equal(b.recv_ready_ids[0], 1);
    assert_int_equal(b.recv_ready_ids[1], 2);
    assert_int_equal(tsd_add(s, 3, 20, 2), TDM_OK); /* runs while 1 and 2 receive */
    tsd_step(s, 1.1, &b);
    expect_only(&b, 3);
    tsd_update(s, &b, 7, 1.15, NULL);
    assert_int_equal(tsd_add(s, 4, 20, 2), TDM_OK); /* arrives after 1 and 2 */
    assert_int_equal(tdm_sched_remote_kv_done(s, 1, 1, 0), TDM_OK);
    assert_int_equal(tdm_sched_remote_kv_done(s, 2, 1, 0), TDM_OK);
    tsd_step(s, 1.2, &b);
    tsd_update(s, &b, 7, 1.25, NULL); /* 3 finishes */
    const uint64_t order[3] = { 1, 2, 4 };
    for (int k = 0; k < 3; k++) {
        tsd_step(s, 1.3 + 0.1 * k, &b);
        assert_int_equal(b.num_reqs, 1);
        if (b.req_ids[0] != order[k])
            fail_msg("admission %d is request %llu, expected %llu", k, (unsigned long long)b.req_ids[0],
                     (unsigned long long)order[k]);
        tsd_update(s, &b, 7, 1.35 + 0.1 * k, NULL);
        assert_int_equal(tdm_sched_finish(s, order[k], TDM_FINISH_STOP), TDM_OK);
    }
    finish_all(s, 3.0);
}

/* vLLM: lookahead slots are allocated for a waiting request whose num_computed_tokens is not
 * 0, which is the case of a request whose remote KV has arrived (its first local scheduling):
 * 48-token prompt, 47 received tokens computed, 1 to compute + 2 lookahead = 50 slots = 4 blocks. */
static void remote_prefill__received_request_gets_lookahead_slots(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_ROLE, TDM_ROLE_DECODE, TDM_SCHED_NUM_LOOKAHEAD_TOKENS, 2, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(add_flags(s, 1, 48, 3, TDM_REQ_REMOTE_PREFILL, 0), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_int_equal(i.num_blocks, 3); /* the reservation: the prompt's blocks only */
    assert_int_equal(tdm_sched_remote_kv_done(s, 1, 1, 0), TDM_OK);
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.num_computed[0], 47);
    if (b.block_offsets[1] != 4)
        fail_msg("received request scheduled with %u blocks; vLLM adds the lookahead slots (4 blocks)",
                 b.block_offsets[1]);
    tsd_update(s, &b, 7, 1.15, NULL);
    finish_all(s, 2.0);
}

static void remote_prefill__partial_remote_tokens_compute_the_rest(void **state)
{
    (void)state;
    receive_then_compute(32, 1, 0, 32, 8);
}

static void remote_prefill__failure_recompute_keeps_valid_tokens(void **state)
{
    (void)state;
    receive_then_compute(0, 0, 16, 16, 24);
    /* vLLM's recompute policy truncates to the first invalid block: 20 valid tokens keep one
     * whole block */
    receive_then_compute(0, 0, 20, 16, 24);
    receive_then_compute(0, 0, 0, 0, 40);
}

static void remote_prefill__failure_fail_policy_finishes_with_error(void **state)
{
    (void)state;
    tdm_sched *s = decode_side(TDM_REMOTE_KV_FAIL, 0);
    reserve_remote(s, 1.0, 0);
    assert_int_equal(tdm_sched_remote_kv_done(s, 1, 0, 0), TDM_OK);
    expect_finished(s, 1, TDM_FINISH_ERROR);
    assert_int_equal(tdm__sched_blocks_in_use(s), 0);
    tdm_batch b;
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_reqs, 0);
    assert_true(tsd_find_id(b.finished_ids, b.num_finished, 1) >= 0);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.finished, 1);
    tsd_done(s);
}

/* vLLM: aborting a WAITING_FOR_REMOTE_KVS request delays the free until the receive ends. */
static void remote_prefill__abort_while_waiting_frees_on_done(void **state)
{
    (void)state;
    tdm_sched *s = decode_side(TDM_REMOTE_KV_RECOMPUTE, 0);
    reserve_remote(s, 1.0, 0);
    assert_int_equal(tdm_sched_abort(s, 1), TDM_OK);
    assert_int_equal(tsd_unfinished(s), 0);
    assert_int_equal(tdm__sched_blocks_in_use(s), 3); /* the receive may still write */
    tsd_check(s);
    tdm_batch b;
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_reqs, 0);
    assert_int_equal(tdm__sched_blocks_in_use(s), 3);
    assert_int_equal(tdm_sched_remote_kv_done(s, 1, 1, 0), TDM_OK);
    assert_int_equal(tdm__sched_blocks_in_use(s), 0);
    tsd_step(s, 1.2, &b);
    expect_gone(s, 1);
    tsd_done(s);

    /* aborted before its blocks were reserved: freed at once */
    s = decode_side(TDM_REMOTE_KV_RECOMPUTE, 0);
    assert_int_equal(add_flags(s, 1, 40, 2, TDM_REQ_REMOTE_PREFILL, 0), TDM_OK);
    assert_int_equal(tdm_sched_abort(s, 1), TDM_OK);
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_recv_ready, 0);
    tsd_done(s);
}

static void remote_prefill__timeout_fails_the_wait(void **state)
{
    (void)state;
    /* FAIL policy: the request ends with ERROR and its blocks are freed */
    tdm_sched *s = decode_side(TDM_REMOTE_KV_FAIL, 1000);
    reserve_remote(s, 0.0, 0);
    tdm_batch b;
    tsd_step(s, 0.5, &b);
    assert_int_equal(tsd_state(s, 1), TDM_STATE_WAITING_REMOTE_KV);
    tsd_step(s, 2.0, &b);
    int seen = tsd_find_id(b.finished_ids, b.num_finished, 1) >= 0;
    tdm_request_info i;
    tdm_request_info_init(&i);
    if (tdm_sched_request_info(s, 1, &i) == TDM_OK) {
        assert_int_equal(i.state, TDM_STATE_FINISHED);
        assert_int_equal(i.finish_reason, TDM_FINISH_ERROR);
    }
    assert_int_equal(tdm__sched_blocks_in_use(s), 0);
    tsd_step(s, 2.1, &b);
    seen |= tsd_find_id(b.finished_ids, b.num_finished, 1) >= 0;
    assert_true(seen);
    assert_int_equal(tdm_sched_remote_kv_done(s, 1, 1, 0), TDM_E_NOT_FOUND);
    tsd_done(s);

    /* RECOMPUTE policy: the prompt is computed locally instead */
    s = decode_side(TDM_REMOTE_KV_RECOMPUTE, 1000);
    reserve_remote(s, 0.0, 0);
    tsd_step(s, 2.0, &b);
    int k = tsd_find(&b, 1);
    if (k < 0) {
        tsd_step(s, 2.1, &b);
        k = tsd_find(&b, 1);
    }
    assert_true(k >= 0);
    assert_int_equal(b.num_computed[k], 0);
    assert_int_equal(b.num_tokens[k], 40);
    assert_int_equal(tdm_sched_remote_kv_done(s, 1, 1, 0), TDM_E_STATE);
    tsd_update(s, &b, 7, 2.2, NULL);
    finish_all(s, 3.0);

    /* aborted while waiting: the timeout frees the blocks */
    s = decode_side(TDM_REMOTE_KV_RECOMPUTE, 1000);
    reserve_remote(s, 0.0, 0);
    assert_int_equal(tdm_sched_abort(s, 1), TDM_OK);
    tsd_step(s, 0.5, &b);
    assert_int_equal(tdm__sched_blocks_in_use(s), 3);
    tsd_step(s, 2.0, &b);
    assert_int_equal(tdm__sched_blocks_in_use(s), 0);
    tsd_step(s, 2.1, &b);
    tsd_done(s);
}

static void remote_kv_done__rejects_unknown_and_local_requests(void **state)
{
    (void)state;
    tdm_sched *s = decode_side(TDM_REMOTE_KV_RECOMPUTE, 0);
    assert_int_equal(tdm_sched_remote_kv_done(s, 99, 1, 0), TDM_E_NOT_FOUND);
    assert_true(tdm_sched_errmsg(s)[0] != '\0');
    assert_int_equal(tsd_add(s, 5, 20, 2), TDM_OK);
    assert_int_equal(tdm_sched_remote_kv_done(s, 5, 1, 0), TDM_E_STATE);
    assert_true(tdm_sched_errmsg(s)[0] != '\0');
    assert_int_equal(tdm_sched_remote_kv_done(NULL, 5, 1, 0), TDM_E_INVAL);
    /* a remote request not yet reserved is not waiting for KV either */
    assert_int_equal(add_flags(s, 6, 20, 2, TDM_REQ_REMOTE_PREFILL, 0), TDM_OK);
    assert_int_equal(add_flags(s, 8, 20, 2, TDM_REQ_REMOTE_PREFILL, 21), TDM_E_INVAL);
    assert_int_equal(tdm_sched_remote_kv_done(s, 6, 1, 0), TDM_E_STATE);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(tdm_sched_remote_kv_done(s, 6, 1, 0), TDM_OK);
    tsd_update(s, &b, 7, 1.05, NULL);
    finish_all(s, 2.0);
}

/* A prefill side (delayed free after delay_ms) running request 1 (40 tokens, REMOTE_DECODE,
 * max_tokens): *b is its first step, at `now`. */
static tdm_sched *prefill_side_running(int64_t delay_ms, uint32_t max_tokens, double now,
                                       tdm_batch *b)
{
    const int64_t kv[] = { TDM_SCHED_ROLE, TDM_ROLE_PREFILL, TDM_SCHED_DELAY_FREE_TIMEOUT_MS, delay_ms, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(add_flags(s, 1, 40, max_tokens, TDM_REQ_REMOTE_DECODE, 0), TDM_OK);
    tsd_step(s, now, b);
    return s;
}

static void remote_decode__blocks_held_until_release(void **state)
{
    (void)state;
    tdm_batch b;
    tdm_sched *s = prefill_side_running(120000, 1, 1.0, &b);
    assert_int_equal(tdm_sched_release(s, 1), TDM_E_STATE); /* running: nothing held */
    tdm_update_result r;
    tsd_update(s, &b, 7, 1.1, &r);
    assert_int_equal(r.finish_reasons[0], TDM_FINISH_LENGTH);
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_int_equal(i.state, TDM_STATE_FINISHED_HELD);
    assert_int_equal(tdm__sched_blocks_in_use(s), 3);
    assert_int_equal(tsd_unfinished(s), 0);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_held, 1);
    tsd_step(s, 1.2, &b);
    assert_true(tsd_find_id(b.finished_ids, b.num_finished, 1) >= 0);
    assert_int_equal(tsd_state(s, 1), TDM_STATE_FINISHED_HELD);
    tsd_step(s, 100.0, &b); /* within the 120 s delayed-free timeout */
    assert_int_equal(tdm__sched_blocks_in_use(s), 3);
    tsd_step(s, 500.0, &b); /* past it */
    assert_int_equal(tdm__sched_blocks_in_use(s), 0);
    tsd_step(s, 500.1, &b);
    tsd_done(s);
}

static void remote_decode__release_frees_held_blocks(void **state)
{
    (void)state;
    tdm_batch b;
    tdm_sched *s = prefill_side_running(120000, 1, 1.0, &b);
    tsd_update(s, &b, 7, 1.1, NULL);
    tsd_step(s, 1.2, &b);
    tsd_step(s, 1.3, &b);
    assert_int_equal(tsd_state(s, 1), TDM_STATE_FINISHED_HELD); /* survives steps */
    const uint32_t *t;
    uint32_t n;
    assert_int_equal(tdm_sched_request_blocks(s, 1, &t, &n), TDM_OK);
    assert_int_equal(n, 3);
    assert_int_equal(tdm_sched_release(s, 1), TDM_OK);
    assert_int_equal(tdm__sched_blocks_in_use(s), 0);
    assert_true(tdm_sched_release(s, 1) != TDM_OK);
    assert_int_equal(tdm_sched_release(s, 77), TDM_E_NOT_FOUND);
    tsd_step(s, 1.4, &b);
    expect_gone(s, 1);
    tsd_done(s);
}

/* Only a normal finish hands the KV to a remote decode: an aborted REMOTE_DECODE request
 * frees its blocks at once. */
static void remote_decode__abort_frees_without_holding(void **state)
{
    (void)state;
    tdm_batch b;
    tdm_sched *s = prefill_side_running(120000, 5, 1.0, &b);
    tsd_update(s, &b, 7, 1.1, NULL);
    assert_int_equal(tdm_sched_abort(s, 1), TDM_OK);
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_int_equal(i.state, TDM_STATE_FINISHED);
    assert_int_equal(tdm__sched_blocks_in_use(s), 0);
    assert_int_equal(tdm_sched_release(s, 1), TDM_E_STATE);
    tsd_step(s, 1.2, &b);
    tsd_done(s);
}

static void remote_decode__held_blocks_freed_after_timeout(void **state)
{
    (void)state;
    tdm_batch b;
    tdm_sched *s = prefill_side_running(1000, 1, 0.5, &b);
    tsd_update(s, &b, 7, 1.0, NULL); /* finished (and held) at 1.0 */
    tsd_step(s, 1.5, &b);
    assert_int_equal(tsd_state(s, 1), TDM_STATE_FINISHED_HELD);
    assert_int_equal(tdm__sched_blocks_in_use(s), 3);
    tsd_step(s, 3.0, &b);
    assert_int_equal(tdm__sched_blocks_in_use(s), 0);
    tsd_step(s, 3.1, &b);
    tsd_done(s);
}

/* ---- decode-first mode ---- */

static tdm_sched *mixed_running(int64_t mode, tdm_batch *b)
{
    const int64_t kv[] = { TDM_SCHED_MAX_MODEL_LEN, 4096, TDM_SCHED_MODE, mode,
                           TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 512,
                           TDM_SCHED_LONG_PREFILL_TOKEN_THRESHOLD, 256, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 1, 2000, 3), TDM_OK);
    assert_int_equal(tsd_add(s, 2, 10, 50), TDM_OK);
    assert_int_equal(tsd_add(s, 3, 10, 50), TDM_OK);
    tsd_step(s, 1.0, b);
    assert_int_equal(b->num_reqs, 3);
    tsd_update(s, b, 7, 1.05, NULL);
    assert_int_equal(tsd_add(s, 4, 100, 3), TDM_OK);
    tsd_step(s, 1.1, b);
    return s;
}

static void decode_first__decodes_then_partial_then_new(void **state)
{
    (void)state;
    tdm_batch b;
    tdm_sched *s = mixed_running(TDM_MODE_DECODE_FIRST, &b);
    const uint64_t want[4] = { 2, 3, 1, 4 };
    const uint32_t toks[4] = { 1, 1, 256, 100 };
    assert_int_equal(b.num_reqs, 4);
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(b.req_ids[i], want[i]);
        assert_int_equal(b.num_tokens[i], toks[i]);
    }
    tsd_update(s, &b, 7, 1.15, NULL);
    finish_all(s, 2.0);
}

static void vllm_mode__running_list_order_then_waiting(void **state)
{
    (void)state;
    tdm_batch b;
    tdm_sched *s = mixed_running(TDM_MODE_VLLM, &b);
    const uint64_t want[4] = { 1, 2, 3, 4 };
    assert_int_equal(b.num_reqs, 4);
    for (uint32_t i = 0; i < 4; i++) assert_int_equal(b.req_ids[i], want[i]);
    tsd_update(s, &b, 7, 1.15, NULL);
    finish_all(s, 2.0);
}

/* Prefill-first (vLLM v0 / TGI baseline): a step with a prompt to run holds prompts only
 * (running prefills, then waiting); the decodes run in the steps where no prompt can. */
static void prefill_first__prompt_steps_then_decode_steps(void **state)
{
    (void)state;
    tdm_batch b;
    tdm_sched *s = mixed_running(TDM_MODE_PREFILL_FIRST, &b);
    /* request 1's next chunk, then the new request 4; the decodes of 2 and 3 wait */
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(b.req_ids[0], 1);
    assert_int_equal(b.num_tokens[0], 256);
    assert_int_equal(b.req_ids[1], 4);
    assert_int_equal(b.num_tokens[1], 100);
    assert_int_equal(b.num_prefill_reqs, 2);
    double t = 1.15;
    tsd_update(s, &b, 7, t, NULL);
    /* request 1 keeps the steps (256-token chunks) until its 2000-token prompt is in */
    uint32_t chunks = 2;
    for (;;) {
        tsd_step(s, t += 0.05, &b);
        assert_true(b.num_reqs >= 1);
        if (b.num_prefill_reqs == 0) break;
        expect_only(&b, 1);
        chunks++;
        tsd_update(s, &b, 7, t + 0.01, NULL);
    }
    assert_int_equal(chunks, 8); /* ceil(2000 / 256) */
    /* now a decode-only step: 2, 3, 4 and 1 each compute one token */
    assert_int_equal(b.num_reqs, 4);
    for (uint32_t i = 0; i < b.num_reqs; i++) assert_int_equal(b.num_tokens[i], 1);
    tsd_update(s, &b, 7, t + 0.01, NULL);
    /* a new prompt takes the next step alone */
    assert_int_equal(tsd_add(s, 5, 40, 3), TDM_OK);
    tsd_step(s, t += 0.05, &b);
    expect_only(&b, 5);
    assert_int_equal(b.num_tokens[0], 40);
    tsd_update(s, &b, 7, t + 0.01, NULL);
    tsd_step(s, t += 0.05, &b);
    assert_int_equal(b.num_prefill_reqs, 0);
    assert_true(b.num_reqs >= 4);
    tsd_update(s, &b, 7, t + 0.01, NULL);
    finish_all(s, t + 1.0);
}

/* Prefill-first: a prompt that cannot get its blocks does not hold the step; the decodes
 * run, and the prompt runs alone once the blocks are free. */
static void prefill_first__decodes_run_when_no_prompt_fits(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MODE, TDM_MODE_PREFILL_FIRST, TDM_SCHED_NUM_BLOCKS, 8,
                           TDM_SCHED_BLOCK_SIZE, 16, TDM_SCHED_ENABLE_PREFIX_CACHING, 0, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 1, 10, 6), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 1);
    tsd_update(s, &b, 7, 1.01, NULL);
    assert_int_equal(tsd_add(s, 2, 100, 2), TDM_OK); /* 7 blocks: the pool's all, 6 are free */
    double t = 1.01;
    for (int k = 0; k < 5; k++) {
        tsd_step(s, t += 0.01, &b);
        expect_only(&b, 1);
        assert_int_equal(b.num_tokens[0], 1);
        assert_int_equal(b.num_prefill_reqs, 0);
        tsd_update(s, &b, 7, t + 0.005, NULL);
    }
    assert_int_equal(tsd_state(s, 1), TDM_STATE_FINISHED);
    tsd_step(s, t += 0.01, &b); /* request 1's blocks come back: 2 runs its prompt alone */
    expect_only(&b, 2);
    assert_int_equal(b.num_tokens[0], 100);
    tsd_update(s, &b, 7, t + 0.005, NULL);
    finish_all(s, t + 1.0);
}

static void decode_first__max_num_partial_prefills_limits_prefills(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MAX_MODEL_LEN, 4096, TDM_SCHED_MODE, TDM_MODE_DECODE_FIRST,
                           TDM_SCHED_LONG_PREFILL_TOKEN_THRESHOLD, 256,
                           TDM_SCHED_MAX_NUM_PARTIAL_PREFILLS, 1, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 1, 1000, 2), TDM_OK);
    assert_int_equal(tsd_add(s, 2, 1000, 2), TDM_OK);
    tdm_batch b;
    for (int k = 0; k < 4; k++) {
        tsd_step(s, 1.0 + k, &b);
        expect_only(&b, 1);
        tsd_update(s, &b, 7, 1.05 + k, NULL);
    }
    tsd_step(s, 5.0, &b); /* request 1's prompt is done: request 2 may start */
    assert_true(tsd_find(&b, 2) >= 0);
    tsd_update(s, &b, 7, 5.05, NULL);
    finish_all(s, 6.0);
}

typedef struct cost_ctx {
    int calls;
} cost_ctx;

#define COST_BASE 0.001
#define COST_DECODE 0.0001
#define COST_PREFILL_TOKEN 0.00002

static double linear_cost(void *ctx, const tdm_step_shape *sh)
{
    ((cost_ctx *)ctx)->calls++;
    return COST_BASE + COST_DECODE * sh->num_decode_reqs + COST_PREFILL_TOKEN * sh->num_prefill_tokens;
}

/* A scheduler configured by kv with linear_cost as its cost model (counting calls in *cc)
 * and ten 10-token requests (ids 1..10, max_tokens 100): *b is the first step, at 1.0. */
static tdm_sched *ten_requests_with_cost_model(const int64_t *kv, cost_ctx *cc, tdm_batch *b)
{
    tdm_sched *s = tsd_newp(kv);
    cc->calls = 0;
    tdm_cost_model cm = { TDM_COST_MODEL_VERSION, cc, linear_cost };
    assert_int_equal(tdm_sched_set_cost_model(s, &cm), TDM_OK);
    for (uint64_t id = 1; id <= 10; id++) assert_int_equal(tsd_add(s, id, 10, 100), TDM_OK);
    tsd_step(s, 1.0, b);
    return s;
}

static void abort_ten(tdm_sched *s)
{
    for (uint64_t id = 1; id <= 10; id++) assert_int_equal(tdm_sched_abort(s, id), TDM_OK);
}

/* The predicted cost of a batch under linear_cost, classifying entries from the scheduler. */
static double batch_cost(const tdm_sched *s, const tdm_batch *b, uint32_t *prefill_tokens,
                         uint32_t *decodes)
{
    *prefill_tokens = 0;
    *decodes = 0;
    for (uint32_t i = 0; i < b->num_reqs; i++) {
        tdm_request_info info;
        tsd_info(s, b->req_ids[i], &info);
        if (b->num_computed[i] >= info.num_prompt_tokens) (*decodes)++;
        else *prefill_tokens += b->num_tokens[i];
    }
    return COST_BASE + COST_DECODE * *decodes + COST_PREFILL_TOKEN * *prefill_tokens;
}

static void decode_first__tbt_target_bounds_predicted_cost(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MODE, TDM_MODE_DECODE_FIRST, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 8192,
                           TDM_SCHED_TBT_TARGET_US, 10000, 0 };
    static cost_ctx cc;
    tdm_batch b;
    tdm_sched *s = ten_requests_with_cost_model(kv, &cc, &b);
    tsd_update(s, &b, 7, 1.01, NULL);
    assert_int_equal(tsd_add(s, 100, 4000, 2), TDM_OK);
    for (int k = 0; k < 3; k++) {
        tsd_step(s, 1.1 + k, &b);
        uint32_t pt, dec;
        double cost = batch_cost(s, &b, &pt, &dec);
        assert_int_equal(dec, 10);          /* every decode is scheduled */
        assert_true(pt > 0);                /* the rest of the target goes to the prompt */
        if (cost > 0.010 + 1e-9) fail_msg("step %d predicted %.6f s > TBT target 0.010 s", k, cost);
        tsd_update(s, &b, 7, 1.15 + k, NULL);
    }
    assert_true(cc.calls > 0);
    /* removing the callback is allowed */
    assert_int_equal(tdm_sched_set_cost_model(s, NULL), TDM_OK);
    tdm_cost_model bad = { 999, &cc, linear_cost };
    assert_int_equal(tdm_sched_set_cost_model(s, &bad), TDM_E_VERSION);
    bad.version = TDM_COST_MODEL_VERSION;
    bad.estimate = NULL;
    assert_int_equal(tdm_sched_set_cost_model(s, &bad), TDM_E_INVAL);
    abort_ten(s);
    assert_int_equal(tdm_sched_abort(s, 100), TDM_OK);
    tsd_step(s, 9.0, &b);
    tsd_done(s);
}

/* When the decodes alone already exceed the TBT target, every decode still runs (decodes are
 * never starved) and no prompt token is added to the step. */
static void decode_first__tbt_exceeded_by_decodes_adds_no_prefill(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MODE, TDM_MODE_DECODE_FIRST, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 8192, 0 };
    static cost_ctx cc;
    tdm_batch b;
    tdm_sched *s = ten_requests_with_cost_model(kv, &cc, &b); /* no target yet: all ten admitted */
    assert_int_equal(b.num_reqs, 10);
    tsd_update(s, &b, 7, 1.01, NULL);
    /* 10 decodes cost 1 ms + 10 x 0.1 ms = 2 ms > 1.5 ms */
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_TBT_TARGET_US, 1500), TDM_OK);
    assert_int_equal(tsd_add(s, 100, 400, 2), TDM_OK);
    for (int k = 0; k < 3; k++) {
        tsd_step(s, 2.0 + k, &b);
        uint32_t pt, dec;
        batch_cost(s, &b, &pt, &dec);
        assert_int_equal(dec, 10);
        assert_int_equal(pt, 0);
        assert_int_equal(tsd_state(s, 100), TDM_STATE_WAITING);
        tsd_update(s, &b, 7, 2.05 + k, NULL);
    }
    abort_ten(s);
    tsd_step(s, 9.0, &b); /* alone, the prompt runs: at least a block's worth */
    int k = tsd_find(&b, 100);
    assert_true(k >= 0);
    assert_true(b.num_tokens[k] > 0);
    tsd_update(s, &b, 7, 9.05, NULL);
    assert_int_equal(tdm_sched_abort(s, 100), TDM_OK);
    tsd_step(s, 10.0, &b);
    tsd_done(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(remote_prefill__reserved_then_computes_last_token),
        TSD_TEST(remote_prefill__local_prefix_hit_reduces_remote_part),
        TSD_TEST(remote_prefill__received_requests_keep_queue_order),
        TSD_TEST(remote_prefill__received_request_gets_lookahead_slots),
        TSD_TEST(remote_prefill__partial_remote_tokens_compute_the_rest),
        TSD_TEST(remote_prefill__failure_recompute_keeps_valid_tokens),
        TSD_TEST(remote_prefill__failure_fail_policy_finishes_with_error),
        TSD_TEST(remote_prefill__abort_while_waiting_frees_on_done),
        TSD_TEST(remote_prefill__timeout_fails_the_wait),
        TSD_TEST(remote_kv_done__rejects_unknown_and_local_requests),
        TSD_TEST(remote_decode__blocks_held_until_release),
        TSD_TEST(remote_decode__release_frees_held_blocks),
        TSD_TEST(remote_decode__abort_frees_without_holding),
        TSD_TEST(remote_decode__held_blocks_freed_after_timeout),
        TSD_TEST(decode_first__decodes_then_partial_then_new),
        TSD_TEST(vllm_mode__running_list_order_then_waiting),
        TSD_TEST(prefill_first__prompt_steps_then_decode_steps),
        TSD_TEST(prefill_first__decodes_run_when_no_prompt_fits),
        TSD_TEST(decode_first__max_num_partial_prefills_limits_prefills),
        TSD_TEST(decode_first__tbt_target_bounds_predicted_cost),
        TSD_TEST(decode_first__tbt_exceeded_by_decodes_adds_no_prefill),
    };
    return cmocka_run_group_tests_name("sched_pd", tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_pd")
#endif
