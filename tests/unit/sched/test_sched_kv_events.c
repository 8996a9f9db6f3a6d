/*
 * test_sched_kv_events.c -- the KV cache event queue (tdm_sched_kv_events): disabled records
 * nothing; a prompt's full blocks are one STORED event (digests, no parent, tokens, request,
 * first block), a block filled in decode a STORED event whose parent is the previous block;
 * host-supplied digests come back byte for byte; eviction gives REMOVED events (before the
 * STORED of the same step, as vLLM's allocate_slots); a reset is one ALL_CLEARED; a full queue
 * is counted (batch flag, drop count, stats) and never silent; steady-state steps with events
 * allocate nothing; drained arrays survive later steps until the next drain; bad arguments.
 */
#include <stdlib.h>
#include <string.h>

#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

/* ---- a counting allocator (installed by the allocation test only) ---- */
static long g_allocs;
static void *c_malloc(void *ctx, size_t n) { (void)ctx; g_allocs++; return malloc(n); }
static void *c_realloc(void *ctx, void *p, size_t n) { (void)ctx; g_allocs++; return realloc(p, n); }
static void c_free(void *ctx, void *p) { (void)ctx; free(p); }

static tdm_sched *new_kv(uint32_t blocks, uint32_t cap)
{
    int64_t kv[] = { TDM_SCHED_NUM_BLOCKS, blocks, TDM_SCHED_BLOCK_SIZE, 16, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 1024,
                     TDM_SCHED_ENABLE_KV_EVENTS, 1, TDM_SCHED_KV_EVENTS_CAPACITY, cap, 0 };
    return tsd_newp(kv);
}

static void drain(tdm_sched *s, tdm_kv_event_batch *e)
{
    assert_int_equal(tdm_kv_event_batch_init(e), TDM_OK);
    assert_int_equal(tdm_sched_kv_events(s, e), TDM_OK);
}

/* Drain, expecting exactly one event, of `kind`. */
static void drain_one(tdm_sched *s, tdm_kv_event_batch *e, uint32_t kind)
{
    drain(s, e);
    assert_int_equal(e->num_events, 1);
    assert_int_equal(e->kinds[0], kind);
}

static uint32_t nhash(const tdm_kv_event_batch *e, uint32_t i) { return e->hash_offsets[i + 1] - e->hash_offsets[i]; }
static const uint8_t *hash_at(const tdm_kv_event_batch *e, uint32_t i, uint32_t k)
{
    return e->hashes + (size_t)(e->hash_offsets[i] + k) * TDM_KV_EVENT_HASH_STRIDE;
}

/* One step and one update with token `tok` for everything scheduled. */
static void cycle(tdm_sched *s, double *now, tdm_token tok)
{
    tdm_batch b;
    tsd_step(s, *now, &b);
    tsd_update(s, &b, tok, *now + 0.01, NULL);
    *now += 0.02;
}

/* Step and update until every request is done (at most max_steps), then the end checks. */
static void run_to_end(tdm_sched *s, double *now, int max_steps)
{
    (void)tsd_run(s, max_steps, now);
    tsd_done(s);
}

static void kv_events__disabled_records_nothing(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    assert_int_equal(tsd_add(s, 1, 40, 4), TDM_OK);
    double now = 1.0;
    cycle(s, &now, 5);
    tdm_kv_event_batch e;
    drain(s, &e);
    assert_int_equal(e.num_events, 0);
    assert_int_equal(e.overflowed, 0);
    int64_t v = -1;
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_ENABLE_KV_EVENTS, &v), TDM_OK);
    assert_int_equal(v, 0);
    run_to_end(s, &now, 100);
}

static void kv_events__prompt_blocks_stored_then_decode_block_with_parent(void **state)
{
    (void)state;
    tdm_sched *s = new_kv(64, 64);
    tdm_token p[40];
    tsd_prompt(7, 40, p);
    assert_int_equal(tsd_add_tokens(s, 9, p, 40, 20), TDM_OK);
    double now = 1.0;
    cycle(s, &now, 3); /* 40 prompt tokens computed: blocks 0 and 1 are full */
    tdm_kv_event_batch e;
    drain_one(s, &e, TDM_KV_EVENT_STORED);
    assert_int_equal(nhash(&e, 0), 2);
    assert_int_equal(e.hash_sizes[0], 32); /* SHA-256 by default */
    assert_int_equal(e.has_parent[0], 0);
    assert_int_equal(e.req_ids[0], 9);
    assert_int_equal(e.first_blocks[0], 0);
    assert_int_equal(e.block_size, 16);
    assert_int_equal(e.token_offsets[1] - e.token_offsets[0], 32);
    assert_memory_equal(e.token_ids, p, 32 * sizeof(tdm_token));
    assert_memory_not_equal(hash_at(&e, 0, 0), hash_at(&e, 0, 1), 32);
    uint8_t second[32];
    memcpy(second, hash_at(&e, 0, 1), 32);
    assert_true(tdm__sched_is_cached(s, second));
    /* Decode to 48 tokens: block 2 fills, parent = block 1's digest. */
    for (int i = 0; i < 8; i++) cycle(s, &now, 3);
    drain_one(s, &e, TDM_KV_EVENT_STORED);
    assert_int_equal(nhash(&e, 0), 1);
    assert_int_equal(e.has_parent[0], 1);
    assert_memory_equal(e.parent_hashes, second, 32);
    assert_int_equal(e.first_blocks[0], 2);
    assert_int_equal(e.token_ids[0], p[32]);
    assert_int_equal(e.token_ids[8], 3); /* the sampled tokens are part of the block */
    (void)tsd_run(s, 100, &now);
    drain(s, &e);
    assert_int_equal(e.num_events, 0); /* freeing blocks keeps them cached: no event */
    tsd_done(s);
}

static void kv_events__host_digests_come_back(void **state)
{
    (void)state;
    tdm_sched *s = new_kv(64, 64);
    tdm_token p[33];
    tsd_prompt(11, 33, p);
    uint8_t hh[2][16];
    for (int i = 0; i < 2; i++) memset(hh[i], 0xa0 + i, 16);
    tdm_request_desc d;
    tsd_desc(&d, 4, p, 33, 2);
    d.block_hashes = hh;
    d.num_block_hashes = 2;
    d.block_hash_size = 16;
    assert_int_equal(tdm_sched_add(s, &d), TDM_OK);
    double now = 1.0;
    cycle(s, &now, 1);
    tdm_kv_event_batch e;
    drain(s, &e);
    assert_int_equal(e.num_events, 1);
    assert_int_equal(e.hash_sizes[0], 16);
    assert_int_equal(nhash(&e, 0), 2);
    assert_memory_equal(hash_at(&e, 0, 0), hh[0], 16);
    assert_memory_equal(hash_at(&e, 0, 1), hh[1], 16);
    (void)tsd_run(s, 100, &now);
    /* Reset with nothing running: one ALL_CLEARED, no REMOVED. */
    assert_int_equal(tdm_sched_reset_prefix_cache(s, 0), TDM_OK);
    drain_one(s, &e, TDM_KV_EVENT_ALL_CLEARED);
    assert_int_equal(nhash(&e, 0), 0);
    assert_int_equal(tdm__sched_num_cached(s), 0);
    tsd_done(s);
}

static void kv_events__eviction_removed_before_stored(void **state)
{
    (void)state;
    tdm_sched *s = new_kv(5, 64); /* 4 usable blocks */
    tdm_token a[33], b[49];
    tsd_prompt(1, 33, a);
    tsd_prompt(2, 49, b);
    assert_int_equal(tsd_add_tokens(s, 1, a, 33, 1), TDM_OK);
    double now = 1.0;
    (void)tsd_run(s, 10, &now);
    tdm_kv_event_batch e;
    drain(s, &e);
    assert_int_equal(e.num_events, 1);
    uint8_t ha[2][32];
    memcpy(ha[0], hash_at(&e, 0, 0), 32);
    memcpy(ha[1], hash_at(&e, 0, 1), 32);
    /* b needs 4 blocks: the two uncached ones, then a's cached blocks (LRU: the tail of a,
     * its block 1, was freed first). */
    assert_int_equal(tsd_add_tokens(s, 2, b, 49, 1), TDM_OK);
    cycle(s, &now, 1);
    drain(s, &e);
    assert_int_equal(e.num_events, 3);
    assert_int_equal(e.kinds[0], TDM_KV_EVENT_REMOVED);
    assert_int_equal(e.kinds[1], TDM_KV_EVENT_REMOVED);
    assert_int_equal(e.kinds[2], TDM_KV_EVENT_STORED);
    assert_int_equal(nhash(&e, 0), 1);
    assert_memory_equal(hash_at(&e, 0, 0), ha[1], 32);
    assert_memory_equal(hash_at(&e, 1, 0), ha[0], 32);
    assert_int_equal(nhash(&e, 2), 3);
    assert_false(tdm__sched_is_cached(s, ha[0]));
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(st.kv_events_dropped, 0);
    run_to_end(s, &now, 10);
}

static void kv_events__reset_with_running_clears(void **state)
{
    (void)state;
    tdm_sched *s = new_kv(64, 64);
    assert_int_equal(tsd_add(s, 1, 40, 10), TDM_OK);
    double now = 1.0;
    cycle(s, &now, 1);
    tdm_kv_event_batch e;
    drain(s, &e);
    assert_int_equal(tdm_sched_reset_prefix_cache(s, 1), TDM_OK);
    drain_one(s, &e, TDM_KV_EVENT_ALL_CLEARED);
    run_to_end(s, &now, 100);
}

static void kv_events__overflow_counted_not_silent(void **state)
{
    (void)state;
    tdm_sched *s = new_kv(64, 3);
    assert_int_equal(tsd_add(s, 1, 81, 1), TDM_OK); /* 5 full blocks, room for 3 digests */
    double now = 1.0;
    cycle(s, &now, 1);
    tdm_kv_event_batch e;
    drain(s, &e);
    assert_int_equal(e.overflowed, 1);
    assert_int_equal(e.num_dropped, 2);
    assert_int_equal(e.num_events, 1);
    assert_int_equal(nhash(&e, 0), 3); /* the events up to the overflow are kept */
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.kv_events_dropped, 2);
    assert_int_equal(tdm__sched_num_cached(s), 5); /* the cache itself is unaffected */
    drain(s, &e);
    assert_int_equal(e.overflowed, 0); /* the next batch starts afresh */
    assert_int_equal(e.num_dropped, 0);
    run_to_end(s, &now, 10);
}

static void kv_events__steady_state_allocates_nothing(void **state)
{
    (void)state;
    tdm_allocator a;
    tdm_allocator_init(&a);
    a.malloc_fn = c_malloc;
    a.realloc_fn = c_realloc;
    a.free_fn = c_free;
    assert_int_equal(tdm_set_allocator(&a), TDM_OK);
    tdm_sched *s = new_kv(40, 256);
    double now = 1.0;
    tdm_kv_event_batch e;
    long during = 0, events = 0;
    for (int round = 0; round < 4; round++) {
        for (uint64_t k = 0; k < 6; k++) assert_int_equal(tsd_add(s, 100 * (uint64_t)round + k + 1, 50, 30), TDM_OK);
        long before = g_allocs;
        for (int i = 0; i < 60 && tsd_unfinished(s); i++) {
            cycle(s, &now, (tdm_token)(i + round));
            drain(s, &e);
            events += e.num_events;
        }
        if (round > 1) during += g_allocs - before; /* rounds 0 and 1 warm the buffers */
        assert_int_equal(tsd_unfinished(s), 0);
    }
    assert_true(events > 0);
    assert_int_equal(during, 0);
    tsd_done(s);
    assert_int_equal(tdm_set_allocator(NULL), TDM_OK);
}

static void kv_events__drained_arrays_valid_until_next_drain(void **state)
{
    (void)state;
    tdm_sched *s = new_kv(64, 64);
    assert_int_equal(tsd_add(s, 1, 40, 30), TDM_OK);
    double now = 1.0;
    cycle(s, &now, 1);
    tdm_kv_event_batch e;
    drain(s, &e);
    assert_int_equal(e.num_events, 1);
    uint8_t copy[64];
    memcpy(copy, e.hashes, 64);
    tdm_token t0 = e.token_ids[0];
    assert_int_equal(tsd_add(s, 2, 70, 3), TDM_OK);
    for (int i = 0; i < 10; i++) cycle(s, &now, 2); /* more events are recorded meanwhile */
    assert_int_equal(e.num_events, 1);
    assert_memory_equal(e.hashes, copy, 64);
    assert_int_equal(e.token_ids[0], t0);
    tdm_kv_event_batch f;
    drain(s, &f);
    assert_true(f.num_events >= 2);
    assert_true(f.hashes != e.hashes);
    run_to_end(s, &now, 100);
}

static void kv_events__bad_arguments(void **state)
{
    (void)state;
    tdm_kv_event_batch e;
    assert_int_equal(tdm_kv_event_batch_init(NULL), TDM_E_INVAL);
    assert_int_equal(tdm_kv_event_batch_init(&e), TDM_OK);
    assert_int_equal(e.struct_size, sizeof(e));
    assert_int_equal(tdm_sched_kv_events(NULL, &e), TDM_E_INVAL);
    tdm_sched *s = new_kv(64, 64);
    assert_int_equal(tdm_sched_kv_events(s, NULL), TDM_E_INVAL);
    tsd_assert_msg_has(s, "kv_events");
    e.struct_size = 8;
    assert_int_equal(tdm_sched_kv_events(s, &e), TDM_E_INVAL);
    /* A stats struct of a caller built before kv_events_dropped was appended still works. */
    tdm_sched_stats st;
    tdm_sched_stats_init(&st);
    st.struct_size = (uint32_t)offsetof(tdm_sched_stats, kv_events_dropped);
    st.kv_events_dropped = 77;
    assert_int_equal(tdm_sched_get_stats(s, &st), TDM_OK);
    assert_int_equal(st.kv_events_dropped, 77); /* beyond its size: untouched */
    st.struct_size = 8;
    assert_int_equal(tdm_sched_get_stats(s, &st), TDM_E_INVAL);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_KV_EVENTS_CAPACITY, 0), TDM_E_CONFIG);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_ENABLE_KV_EVENTS, 2), TDM_E_CONFIG);
    assert_int_equal(tdm_sched_configure(s, "{\"kv_events_capacity\": -1}"), TDM_E_CONFIG);
    /* JSON keys work; disabling drops the queue, enabling starts an empty one. */
    assert_int_equal(tdm_sched_configure(s, "{\"enable_kv_events\": false}"), TDM_OK);
    assert_int_equal(tsd_add(s, 1, 40, 2), TDM_OK);
    double now = 1.0;
    cycle(s, &now, 1);
    tdm_kv_event_batch_init(&e);
    assert_int_equal(tdm_sched_kv_events(s, &e), TDM_OK);
    assert_int_equal(e.num_events, 0);
    assert_int_equal(tdm_sched_configure(s, "{\"enable_kv_events\": true, \"kv_events_capacity\": 8}"), TDM_OK);
    assert_int_equal(tdm_sched_kv_events(s, &e), TDM_OK);
    assert_int_equal(e.num_events, 0);
    run_to_end(s, &now, 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(kv_events__disabled_records_nothing),
        TSD_TEST(kv_events__prompt_blocks_stored_then_decode_block_with_parent),
        TSD_TEST(kv_events__host_digests_come_back),
        TSD_TEST(kv_events__eviction_removed_before_stored),
        TSD_TEST(kv_events__reset_with_running_clears),
        TSD_TEST(kv_events__overflow_counted_not_silent),
        TSD_TEST(kv_events__steady_state_allocates_nothing),
        TSD_TEST(kv_events__drained_arrays_valid_until_next_drain),
        TSD_TEST(kv_events__bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_kv_events")
#endif
