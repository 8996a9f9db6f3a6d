/*
 * test_sched_kv_loads.c -- the remote-KV load queues (sched/kv_loads.c), as vLLM 0.33/0.34
 * schedule them: with max_inflight_kv_loads, MAY_LOAD_ASYNC requests start their loads while
 * the running batch is full, the cap counts loads receiving, received but not running, and
 * aborted while receiving; with kv_load_queues, received requests are admitted before the
 * waiting queue in load-start order, a load must leave the blocks that prefilling requests
 * still need, and a failed load with no valid block gives its blocks back.
 */
#include <stdlib.h>
#include <string.h>

#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

#define LOAD (TDM_REQ_REMOTE_PREFILL | TDM_REQ_MAY_LOAD_ASYNC)

static int add_flags(tdm_sched *s, uint64_t id, uint32_t n, uint32_t max_tokens, uint32_t flags)
{
    tsd_req r;
    tsd_req_init(&r, id, n, max_tokens);
    r.d.flags = flags;
    return tdm_sched_add(s, &r.d);
}

static void finish_all(tdm_sched *s, double now)
{
    tsd_run(s, 200, &now);
    tsd_done(s);
}

/* One running request fills the batch (max_num_seqs 1); a remote request arrives. */
static tdm_sched *batch_full(int64_t cap, tdm_batch *b)
{
    const int64_t kv[] = { TDM_SCHED_ROLE, TDM_ROLE_DECODE, TDM_SCHED_MAX_NUM_SEQS, 1,
                           TDM_SCHED_MAX_INFLIGHT_KV_LOADS, cap, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 1, 20, 50), TDM_OK);
    tsd_step(s, 1.0, b);
    tsd_update(s, b, 7, 1.01, NULL);
    assert_int_equal(add_flags(s, 2, 40, 2, LOAD), TDM_OK);
    return s;
}

static void max_inflight__load_starts_while_batch_full(void **state)
{
    (void)state;
    tdm_batch b;
    tdm_sched *s = batch_full(4, &b);
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 1);
    assert_int_equal(b.num_recv_ready, 1); /* the running slot is taken, the load starts */
    assert_int_equal(b.recv_ready_ids[0], 2);
    assert_int_equal(tsd_state(s, 2), TDM_STATE_WAITING_REMOTE_KV);
    tsd_update(s, &b, 7, 1.11, NULL);
    assert_int_equal(tdm_sched_remote_kv_done(s, 2, 1, 0), TDM_OK);
    finish_all(s, 2.0);
}

static void max_inflight__unset_load_waits_for_a_slot(void **state)
{
    (void)state;
    tdm_batch b;
    tdm_sched *s = batch_full(0, &b);
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_recv_ready, 0); /* vLLM without the option: needs a running slot */
    assert_int_equal(tsd_state(s, 2), TDM_STATE_WAITING);
    tsd_update(s, &b, 7, 1.11, NULL);
    assert_int_equal(tdm_sched_finish(s, 1, TDM_FINISH_STOP), TDM_OK);
    tsd_step(s, 1.2, &b);
    assert_int_equal(b.num_recv_ready, 1);
    assert_int_equal(tdm_sched_remote_kv_done(s, 2, 1, 0), TDM_OK);
    finish_all(s, 2.0);
}

/* Cap 1: the second load waits until the first has run, not merely arrived (it starts in the
 * step that admits the first, as in vLLM, where the first leaves the count on admission); a
 * load queue request waits at its queue's head while a plain waiting request behind it is
 * admitted. */
static void max_inflight__cap_counts_received_until_running(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_ROLE, TDM_ROLE_DECODE, TDM_SCHED_MAX_NUM_SEQS, 4,
                           TDM_SCHED_MAX_INFLIGHT_KV_LOADS, 1, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(add_flags(s, 1, 40, 2, LOAD), TDM_OK);
    assert_int_equal(add_flags(s, 2, 40, 2, LOAD), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_recv_ready, 1);
    assert_int_equal(b.recv_ready_ids[0], 1);
    assert_int_equal(tsd_add(s, 3, 20, 2), TDM_OK); /* after 2, admitted past it */
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_recv_ready, 0);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 3);
    tsd_update(s, &b, 7, 1.15, NULL);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_waiting, 2); /* 1 receiving, 2 in the load queue */
    assert_int_equal(st.num_waiting_remote_kv, 1);
    /* Arrived: 1 still counts (received, not running) until the step that admits it. */
    assert_int_equal(tdm_sched_remote_kv_done(s, 1, 1, 0), TDM_OK);
    tsd_stats(s, &st);
    assert_int_equal(st.num_waiting, 2);
    assert_int_equal(st.num_waiting_remote_kv, 0);
    tsd_step(s, 1.2, &b);
    assert_int_not_equal(tsd_find(&b, 1), -1);
    assert_int_equal(b.num_computed[tsd_find(&b, 1)], 39);
    assert_int_equal(b.num_recv_ready, 1);
    assert_int_equal(b.recv_ready_ids[0], 2);
    tsd_update(s, &b, 7, 1.25, NULL);
    assert_int_equal(tdm_sched_remote_kv_done(s, 2, 1, 0), TDM_OK);
    finish_all(s, 2.0);
}

/* An aborted receive holds its blocks until the receive reports, and counts against the cap. */
static void max_inflight__aborted_receive_counts_until_done(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_ROLE, TDM_ROLE_DECODE, TDM_SCHED_MAX_INFLIGHT_KV_LOADS, 1, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(add_flags(s, 1, 40, 2, LOAD), TDM_OK);
    assert_int_equal(add_flags(s, 2, 40, 2, LOAD), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_recv_ready, 1);
    assert_int_equal(tdm_sched_abort(s, 1), TDM_OK);
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_recv_ready, 0);
    assert_int_equal(tdm_sched_remote_kv_done(s, 1, 1, 0), TDM_OK);
    tsd_step(s, 1.2, &b);
    assert_int_equal(b.num_recv_ready, 1);
    assert_int_equal(b.recv_ready_ids[0], 2);
    assert_int_equal(tdm_sched_remote_kv_done(s, 2, 1, 0), TDM_OK);
    finish_all(s, 2.0);
}

/* kv_load_queues: received requests go first, in load-start order, even when a waiting
 * request arrived before one of them. */
static void kv_load_queues__received_first_in_start_order(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_ROLE, TDM_ROLE_DECODE, TDM_SCHED_MAX_NUM_SEQS, 1,
                           TDM_SCHED_KV_LOAD_QUEUES, 1, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(add_flags(s, 1, 40, 2, TDM_REQ_REMOTE_PREFILL), TDM_OK);
    assert_int_equal(add_flags(s, 2, 40, 2, TDM_REQ_REMOTE_PREFILL), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_recv_ready, 2);
    assert_int_equal(tsd_add(s, 3, 20, 2), TDM_OK);
    assert_int_equal(tdm_sched_remote_kv_done(s, 2, 1, 0), TDM_OK); /* 2 before 1 */
    assert_int_equal(tdm_sched_remote_kv_done(s, 1, 1, 0), TDM_OK);
    const uint64_t order[3] = { 1, 2, 3 };
    for (int k = 0; k < 3; k++) {
        tsd_step(s, 1.1 + 0.1 * k, &b);
        assert_int_equal(b.num_reqs, 1);
        if (b.req_ids[0] != order[k])
            fail_msg("admission %d is request %llu, expected %llu", k, (unsigned long long)b.req_ids[0],
                     (unsigned long long)order[k]);
        tsd_update(s, &b, 7, 1.15 + 0.1 * k, NULL);
        if (tsd_state(s, order[k]) != TDM_STATE_FINISHED)
            assert_int_equal(tdm_sched_finish(s, order[k], TDM_FINISH_STOP), TDM_OK);
    }
    finish_all(s, 3.0);
}

/* kv_load_queues: a running request still prefilling keeps the blocks it needs for its whole
 * prompt; a load that would take them waits (num_blocks 12 = the null block + 11: request 1,
 * 160 tokens, 64 alone then 32-token chunks under the long-prefill threshold, holds 6 of its
 * 10 blocks in the step where request 2 arrives, so 5 are free but 4 reserved; the load
 * needs 3). */
static void kv_load_queues__load_leaves_prefills_their_blocks(void **state)
{
    (void)state;
    for (int queues = 0; queues <= 1; queues++) {
        const int64_t kv[] = { TDM_SCHED_ROLE, TDM_ROLE_DECODE, TDM_SCHED_NUM_BLOCKS, 12,
                               TDM_SCHED_MAX_NUM_SEQS, 4, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 64,
                               TDM_SCHED_LONG_PREFILL_TOKEN_THRESHOLD, 32,
                               TDM_SCHED_KV_LOAD_QUEUES, queues, 0 };
        tdm_sched *s = tsd_newp(kv);
        assert_int_equal(tsd_add(s, 1, 160, 2), TDM_OK);
        tdm_batch b;
        tsd_step(s, 1.0, &b);
        assert_int_equal(b.num_reqs, 1);
        tsd_update(s, &b, 7, 1.01, NULL);
        assert_int_equal(add_flags(s, 2, 40, 2, TDM_REQ_REMOTE_PREFILL), TDM_OK);
        tsd_step(s, 1.1, &b);
        /* without the queues (vLLM 0.32-like) the load takes 3 of the 5 free blocks */
        assert_int_equal(b.num_recv_ready, queues ? 0 : 1);
        tsd_update(s, &b, 7, 1.11, NULL);
        if (!queues) assert_int_equal(tdm_sched_remote_kv_done(s, 2, 1, 0), TDM_OK);
        double now = 1.2;
        int started = -1;
        for (int k = 0; k < 10 && queues && started < 0; k++, now += 0.1) {
            tsd_step(s, now, &b);
            if (b.num_recv_ready == 1) started = k;
            tsd_update(s, &b, 7, now + 0.01, NULL);
        }
        if (queues) {
            /* not while 1 prefills (k 0, 1) nor while its decode holds the last free block
             * (k 2): once 1 has finished */
            assert_int_equal(started, 3);
            assert_int_equal(tsd_state(s, 2), TDM_STATE_WAITING_REMOTE_KV);
            assert_int_equal(tdm_sched_remote_kv_done(s, 2, 1, 0), TDM_OK);
        }
        finish_all(s, now + 1.0);
    }
}

/* kv_load_queues: a load that fails with no valid block frees its blocks (when the next step
 * reaches it) and is recomputed in full, without a second load. */
static void kv_load_queues__failed_load_without_valid_blocks_relooks_up(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_ROLE, TDM_ROLE_DECODE, TDM_SCHED_KV_LOAD_QUEUES, 1, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(add_flags(s, 2, 40, 2, TDM_REQ_REMOTE_PREFILL), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_recv_ready, 1);
    tdm_request_info i;
    tsd_info(s, 2, &i);
    assert_int_equal(i.num_blocks, 3);
    assert_int_equal(tdm_sched_remote_kv_done(s, 2, 0, 0), TDM_OK);
    tsd_info(s, 2, &i);
    assert_int_equal(i.num_blocks, 3); /* given back when a step reaches it, as vLLM does */
    assert_int_equal(i.state, TDM_STATE_WAITING);
    assert_int_equal(i.num_computed_tokens, 0);
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 2);
    assert_int_equal(b.num_computed[0], 0); /* recomputed in full, no second load */
    assert_int_equal(b.num_tokens[0], 40);
    assert_int_equal(b.num_recv_ready, 0);
    tsd_update(s, &b, 7, 1.11, NULL);
    finish_all(s, 2.0);
}

/* An admission checks the watermark even when the request holds all its blocks (vLLM applies
 * it with no new block to allocate): 11 usable blocks, watermark 0.45 = 5 blocks; request 1
 * (47 tokens) runs on 3, the load of 2 takes 3 (3 + 5 <= 8 free), then 1's fourth block
 * leaves 4 free: 2, received, waits until 1 has finished. */
static void kv_load_queues__received_request_admitted_above_the_watermark(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_ROLE, TDM_ROLE_DECODE, TDM_SCHED_NUM_BLOCKS, 12,
                           TDM_SCHED_WATERMARK_PPM, 450000, TDM_SCHED_KV_LOAD_QUEUES, 1, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 1, 47, 4), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    tsd_update(s, &b, 7, 1.01, NULL);
    assert_int_equal(add_flags(s, 2, 40, 2, TDM_REQ_REMOTE_PREFILL), TDM_OK);
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_recv_ready, 1);
    tsd_update(s, &b, 7, 1.11, NULL);
    assert_int_equal(tdm_sched_remote_kv_done(s, 2, 1, 0), TDM_OK);
    double now = 1.2;
    for (int k = 0; k < 2; k++, now += 0.1) { /* 1's last two tokens */
        tsd_step(s, now, &b);
        assert_int_not_equal(tsd_find(&b, 1), -1);
        assert_int_equal(tsd_find(&b, 2), -1);
        tsd_update(s, &b, 7, now + 0.01, NULL);
    }
    assert_int_equal(tsd_state(s, 1), TDM_STATE_FINISHED);
    tsd_step(s, now, &b); /* nothing runs: no watermark */
    assert_int_not_equal(tsd_find(&b, 2), -1);
    assert_int_equal(b.num_computed[tsd_find(&b, 2)], 39);
    tsd_update(s, &b, 7, now + 0.01, NULL);
    finish_all(s, now + 1.0);
}

static void kv_load_params__validated_and_fixed_while_requests_held(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_MAX_INFLIGHT_KV_LOADS, -1), TDM_E_CONFIG);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_KV_LOAD_QUEUES, 2), TDM_E_CONFIG);
    assert_int_equal(tdm_sched_configure(s, "{\"max_inflight_kv_loads\": 3, \"kv_load_queues\": true}"), TDM_OK);
    int64_t v = 0;
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_MAX_INFLIGHT_KV_LOADS, &v), TDM_OK);
    assert_int_equal(v, 3);
    char *cfg = tsd_config(s);
    if (!strstr(cfg, "\"max_inflight_kv_loads\":3") || !strstr(cfg, "\"kv_load_queues\":true"))
        fail_msg("config dump lacks the keys: %s", cfg);
    free(cfg);
    assert_int_equal(tsd_add(s, 1, 20, 2), TDM_OK);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_MAX_INFLIGHT_KV_LOADS, 4), TDM_E_STATE);
    tsd_assert_msg_has(s, "max_inflight_kv_loads");
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_KV_LOAD_QUEUES, 0), TDM_E_STATE);
    finish_all(s, 2.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(max_inflight__load_starts_while_batch_full),
        TSD_TEST(max_inflight__unset_load_waits_for_a_slot),
        TSD_TEST(max_inflight__cap_counts_received_until_running),
        TSD_TEST(max_inflight__aborted_receive_counts_until_done),
        TSD_TEST(kv_load_queues__received_first_in_start_order),
        TSD_TEST(kv_load_queues__load_leaves_prefills_their_blocks),
        TSD_TEST(kv_load_queues__failed_load_without_valid_blocks_relooks_up),
        TSD_TEST(kv_load_queues__received_request_admitted_above_the_watermark),
        TSD_TEST(kv_load_params__validated_and_fixed_while_requests_held),
    };
    return cmocka_run_group_tests_name("sched_kv_loads", tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_kv_loads")
#endif
