/*
 * test_sched_prefix.c -- the prefix cache as seen through the scheduler, ported from vLLM's
 * test_prefix_caching.py and test_scheduler.py: partial and full hits (a hit never covers the
 * last prompt token, and is block-aligned), LRU eviction with a freed request's tail blocks
 * first, blocks held by running requests never evicted, cache salt, caching disabled or
 * skipped per request, reset_prefix_cache with and without running requests, and the
 * query/hit/eviction counters. Every scenario ends with all blocks free.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

static const int64_t kv11[] = { TDM_SCHED_NUM_BLOCKS, 11, TDM_SCHED_BLOCK_SIZE, 16,
                                TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 1024, 0 };

static void blocks_of(const tdm_sched *s, uint64_t id, const uint32_t **t, uint32_t *n)
{
    assert_int_equal(tdm_sched_request_blocks(s, id, t, n), TDM_OK);
}

/* Step once and return the entry of `id` (which must be scheduled). */
static int step_expect(tdm_sched *s, double now, tdm_batch *b, uint64_t id)
{
    tsd_step(s, now, b);
    int k = tsd_find(b, id);
    if (k < 0) fail_msg("id %llu not scheduled", (unsigned long long)id);
    return k;
}

/* A partial hit: the common full blocks are shared, the rest computed. */
static void prefix__partial_hit_shares_full_blocks(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    tdm_token a[40], bp[42];
    tsd_prompt(100, 40, a);
    memcpy(bp, a, 32 * sizeof(*a));
    tsd_prompt(200, 10, bp + 32);
    assert_int_equal(tsd_add_tokens(s, 1, a, 40, 10), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    tsd_update(s, &b, 7, 1.1, NULL);
    assert_int_equal(tsd_add_tokens(s, 2, bp, 42, 10), TDM_OK);
    int k = step_expect(s, 1.2, &b, 2);
    assert_int_equal(b.kinds[k], TDM_ENTRY_NEW);
    assert_int_equal(b.num_computed[k], 32);
    assert_int_equal(b.num_tokens[k], 10);
    const uint32_t *ta, *tb;
    uint32_t na, nb;
    blocks_of(s, 1, &ta, &na);
    blocks_of(s, 2, &tb, &nb);
    assert_int_equal(na, 3);
    assert_int_equal(nb, 3);
    assert_int_equal(ta[0], tb[0]);
    assert_int_equal(ta[1], tb[1]);
    assert_int_not_equal(ta[2], tb[2]);
    assert_int_equal(tdm__sched_blocks_in_use(s), 4);
    tdm_request_info i;
    tsd_info(s, 2, &i);
    assert_int_equal(i.num_cached_tokens, 32);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    /* vLLM's PrefixCacheStats: queries += num_tokens, hits += computed tokens found */
    assert_int_equal(st.prefix_queries, 40 + 42);
    assert_int_equal(st.prefix_hits, 32);
    assert_true(fabs(st.prefix_hit_rate - 32.0 / 82.0) < 1e-9);
    tsd_update(s, &b, 7, 1.3, NULL);
    tsd_run(s, 50, NULL);
    tsd_done(s);
}

/* A full hit is capped at num_tokens - 1, block-aligned: a prompt of exactly k full cached
 * blocks gets k-1 blocks; one more token gets all k. */
static void prefix__full_hit_recomputes_last_token(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    tdm_token a[33];
    tsd_prompt(100, 33, a);
    assert_int_equal(tsd_add_tokens(s, 1, a, 32, 10), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    tsd_update(s, &b, 7, 1.1, NULL);
    assert_int_equal(tsd_add_tokens(s, 2, a, 32, 10), TDM_OK);
    assert_int_equal(tsd_add_tokens(s, 3, a, 33, 10), TDM_OK);
    tsd_step(s, 1.2, &b);
    int k2 = tsd_find(&b, 2), k3 = tsd_find(&b, 3);
    assert_true(k2 >= 0 && k3 >= 0);
    assert_int_equal(b.num_computed[k2], 16);
    assert_int_equal(b.num_tokens[k2], 16);
    assert_int_equal(b.num_computed[k3], 32);
    assert_int_equal(b.num_tokens[k3], 1);
    const uint32_t *t1, *t3;
    uint32_t n1, n3;
    blocks_of(s, 1, &t1, &n1);
    blocks_of(s, 3, &t3, &n3);
    assert_int_equal(n3, 3);
    assert_int_equal(t1[0], t3[0]);
    assert_int_equal(t1[1], t3[1]);
    tsd_update(s, &b, 7, 1.3, NULL);
    tsd_run(s, 50, NULL);
    tsd_done(s);
}

/* vLLM caches a request's full prompt blocks when they are allocated, so a later request of
 * the same step already hits them (capped at num_tokens - 1). */
static void prefix__same_step_request_hits_blocks_allocated_before_it(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    tdm_token p[48];
    tsd_prompt(100, 48, p);
    assert_int_equal(tsd_add_tokens(s, 1, p, 48, 3), TDM_OK);
    assert_int_equal(tsd_add_tokens(s, 2, p, 48, 3), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(b.num_computed[0], 0);
    assert_int_equal(b.num_tokens[0], 48);
    assert_int_equal(b.num_computed[1], 32);
    assert_int_equal(b.num_tokens[1], 16);
    assert_int_equal(tdm__sched_blocks_in_use(s), 4);
    tsd_update(s, &b, 7, 1.1, NULL);
    tsd_run(s, 20, NULL);
    tsd_done(s);
}

/* LRU with tail-first order: two requests freed one after the other; a new request takes the
 * never-used blocks first, then the first-freed request's tail blocks. */
static void prefix__eviction_lru_with_tail_blocks_first(void **state)
{
    (void)state;
    tdm_sched *s = tsd_newp(kv11);
    tdm_token a[48], bq[48], c[95], d[33];
    tsd_prompt(100, 48, a);
    tsd_prompt(200, 48, bq);
    tsd_prompt(300, 95, c);
    memcpy(d, a, 32 * sizeof(*d));
    d[32] = 77777;
    assert_int_equal(tsd_add_tokens(s, 1, a, 48, 3), TDM_OK);
    assert_int_equal(tsd_add_tokens(s, 2, bq, 48, 3), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 2);
    tsd_update(s, &b, 7, 1.1, NULL);
    assert_int_equal(tdm_sched_finish(s, 1, TDM_FINISH_STOP), TDM_OK);
    assert_int_equal(tdm_sched_finish(s, 2, TDM_FINISH_STOP), TDM_OK);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_free_blocks, 10);
    assert_int_equal(st.num_cached_blocks, 6);
    assert_int_equal(st.evictions, 0);
    tsd_step(s, 1.2, &b);
    /* 6 blocks: 4 never used, then request 1's two tail blocks */
    assert_int_equal(tsd_add_tokens(s, 3, c, 95, 3), TDM_OK);
    int k = step_expect(s, 1.3, &b, 3);
    assert_int_equal(b.num_computed[k], 0);
    tsd_stats(s, &st);
    assert_int_equal(st.evictions, 2);
    tsd_update(s, &b, 7, 1.4, NULL);
    /* request 1's first block survived, its second did not */
    assert_int_equal(tsd_add_tokens(s, 4, d, 33, 3), TDM_OK);
    k = step_expect(s, 1.5, &b, 4);
    assert_int_equal(b.num_computed[k], 16);
    assert_int_equal(b.num_tokens[k], 17);
    tsd_stats(s, &st);
    assert_int_equal(st.evictions, 4); /* two of request 2's blocks, tail first */
    tsd_update(s, &b, 7, 1.6, NULL);
    double now = 2.0;
    tsd_run(s, 100, &now);
    tsd_done(s);
}

/* Blocks held by running requests are never evicted: other requests share them, and a
 * request that needs space waits instead of taking them. */
static void prefix__running_blocks_never_evicted(void **state)
{
    (void)state;
    tdm_sched *s = tsd_newp(kv11);
    tdm_token a[40], r[111], p2[37], p3[81], p4[16];
    tsd_prompt(100, 40, a);
    tsd_prompt(200, 111, r);
    memcpy(p2, a, 32 * sizeof(*p2));
    tsd_prompt(300, 5, p2 + 32);
    memcpy(p3, r, 80 * sizeof(*p3));
    p3[80] = 88888;
    tsd_prompt(400, 16, p4);
    assert_int_equal(tsd_add_tokens(s, 1, a, 40, 6), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    tsd_update(s, &b, 7, 1.05, NULL);
    const uint32_t *t;
    uint32_t n;
    uint32_t a_tbl[3];
    blocks_of(s, 1, &t, &n);
    assert_int_equal(n, 3);
    memcpy(a_tbl, t, sizeof(a_tbl));
    assert_int_equal(tsd_add_tokens(s, 2, r, 111, 6), TDM_OK);
    step_expect(s, 1.1, &b, 2);
    tsd_update(s, &b, 7, 1.15, NULL);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_free_blocks, 0);
    assert_int_equal(tdm_sched_finish(s, 2, TDM_FINISH_STOP), TDM_OK);
    assert_int_equal(tsd_add_tokens(s, 3, p2, 37, 6), TDM_OK);
    int k = step_expect(s, 1.2, &b, 3);
    assert_int_equal(b.num_computed[k], 32);
    blocks_of(s, 3, &t, &n);
    assert_int_equal(t[0], a_tbl[0]);
    assert_int_equal(t[1], a_tbl[1]);
    tsd_stats(s, &st);
    assert_int_equal(st.evictions, 0); /* the partial tail block of request 2 went first */
    tsd_update(s, &b, 7, 1.25, NULL);
    assert_int_equal(tsd_add_tokens(s, 4, p3, 81, 6), TDM_OK);
    k = step_expect(s, 1.3, &b, 4);
    assert_int_equal(b.num_computed[k], 80);
    tsd_stats(s, &st);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.num_free_blocks, 0);
    tsd_update(s, &b, 7, 1.35, NULL);
    assert_int_equal(tsd_add_tokens(s, 5, p4, 16, 6), TDM_OK);
    tsd_step(s, 1.4, &b);
    assert_int_equal(tsd_find(&b, 5), -1);
    assert_int_equal(tsd_state(s, 5), TDM_STATE_WAITING);
    blocks_of(s, 1, &t, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(t, a_tbl, sizeof(a_tbl));
    tsd_update(s, &b, 7, 1.45, NULL);
    double now = 2.0;
    tsd_run(s, 100, &now);
    tsd_done(s);
}

/* vLLM allocate_slots: prefix-hit blocks that are currently free count against the free
 * blocks (touching removes them from the free list): a request whose hits are the only free
 * blocks cannot be admitted even though "free >= new blocks needed". */
static void prefix__touched_free_hit_blocks_count_against_free(void **state)
{
    (void)state;
    tdm_sched *s = tsd_newp(kv11);
    tdm_token a[49], x[111];
    tsd_prompt(100, 49, a);
    tsd_prompt(200, 111, x);
    assert_int_equal(tsd_add_tokens(s, 1, a, 48, 1), TDM_OK);
    double now = 1.0;
    tsd_run(s, 10, &now); /* 3 cached blocks, free */
    assert_int_equal(tsd_add_tokens(s, 2, x, 111, 10), TDM_OK); /* takes the 7 never-used blocks */
    tdm_batch b;
    tsd_step(s, 2.0, &b);
    tsd_update(s, &b, 7, 2.05, NULL);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_free_blocks, 3);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(tsd_add_tokens(s, 3, a, 49, 3), TDM_OK); /* hits 3 free blocks, needs 1 more */
    tsd_step(s, 2.1, &b);
    assert_int_equal(tsd_find(&b, 3), -1);
    assert_int_equal(tsd_state(s, 3), TDM_STATE_WAITING);
    tsd_stats(s, &st);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.num_free_blocks, 3);
    tsd_update(s, &b, 7, 2.15, NULL);
    assert_int_equal(tdm_sched_finish(s, 2, TDM_FINISH_STOP), TDM_OK);
    int k = step_expect(s, 2.2, &b, 3);
    assert_int_equal(b.num_computed[k], 48);
    assert_int_equal(b.num_tokens[k], 1);
    tsd_update(s, &b, 7, 2.25, NULL);
    now = 3.0;
    tsd_run(s, 20, &now);
    tsd_done(s);
}

/* Newer vLLM BlockPool.free_blocks: freed blocks without a hash go to the head of the free
 * list (reused first), hashed ones to the tail, so a partial tail block is reused before any
 * cached block is evicted. */
static void prefix__unhashed_freed_blocks_reused_before_cached_ones(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_NUM_BLOCKS, 14, TDM_SCHED_BLOCK_SIZE, 16, 0 };
    tdm_sched *s = tsd_newp(kv);
    tdm_token a[33];
    tsd_prompt(100, 33, a);
    assert_int_equal(tsd_add_tokens(s, 1, a, 32, 1), TDM_OK);
    double now = 1.0;
    tsd_run(s, 10, &now); /* a1, a2 cached and free, at the tail */
    assert_int_equal(tsd_add(s, 2, 127, 50), TDM_OK); /* 8 never-used blocks, keeps running */
    assert_int_equal(tsd_add(s, 3, 24, 1), TDM_OK);   /* a full (hashed) block + a partial one */
    tdm_batch b;
    tsd_step(s, 2.0, &b);
    tsd_update(s, &b, 7, 2.05, NULL); /* 3 finishes: its partial block is freed to the head */
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_free_blocks, 13 - 8);
    assert_int_equal(tsd_add(s, 4, 20, 1), TDM_OK); /* 2 blocks: the partial one and a never-used one */
    tsd_step(s, 2.1, &b);
    assert_true(tsd_find(&b, 4) >= 0);
    tsd_stats(s, &st);
    assert_int_equal(st.evictions, 0);
    tsd_update(s, &b, 7, 2.15, NULL);
    assert_int_equal(tsd_add_tokens(s, 5, a, 33, 1), TDM_OK);
    tsd_step(s, 2.2, &b);
    int k = tsd_find(&b, 5);
    assert_true(k >= 0);
    assert_int_equal(b.num_computed[k], 32);
    tsd_update(s, &b, 7, 2.25, NULL);
    assert_int_equal(tdm_sched_abort(s, 2), TDM_OK);
    now = 3.0;
    tsd_run(s, 20, &now);
    tsd_done(s);
}

static int add_salted(tdm_sched *s, uint64_t id, const tdm_token *p, uint32_t n,
                      const char *salt)
{
    tdm_request_desc d;
    tsd_desc(&d, id, p, n, 3);
    d.cache_salt = salt;
    d.cache_salt_len = salt ? (uint32_t)strlen(salt) : 0;
    return tdm_sched_add(s, &d);
}

/* The cache salt is part of the first block's hash: equal prompts with different salts (or
 * with and without one) share nothing; the same salt shares. */
static void prefix__cache_salt_separates_equal_prompts(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    tdm_token p[32];
    tsd_prompt(100, 32, p);
    assert_int_equal(add_salted(s, 1, p, 32, "tenant-a"), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    tsd_update(s, &b, 7, 1.1, NULL);
    assert_int_equal(add_salted(s, 2, p, 32, "tenant-b"), TDM_OK);
    assert_int_equal(add_salted(s, 3, p, 32, "tenant-a"), TDM_OK);
    assert_int_equal(add_salted(s, 4, p, 32, NULL), TDM_OK);
    tsd_step(s, 1.2, &b);
    assert_int_equal(b.num_computed[tsd_find(&b, 2)], 0);
    assert_int_equal(b.num_computed[tsd_find(&b, 3)], 16);
    assert_int_equal(b.num_computed[tsd_find(&b, 4)], 0);
    tsd_update(s, &b, 7, 1.3, NULL);
    tsd_run(s, 50, NULL);
    tsd_done(s);
}

static void prefix__disabled_or_skipped_gives_no_hit(void **state)
{
    (void)state;
    const int64_t off[] = { TDM_SCHED_ENABLE_PREFIX_CACHING, 0, 0 };
    tdm_token p[40];
    tsd_prompt(100, 40, p);
    for (int mode = 0; mode < 2; mode++) {
        tdm_sched *s = mode == 0 ? tsd_newp(off) : tsd_new(NULL);
        assert_int_equal(tsd_add_tokens(s, 1, p, 40, 3), TDM_OK);
        tdm_batch b;
        tsd_step(s, 1.0, &b);
        tsd_update(s, &b, 7, 1.1, NULL);
        tdm_request_desc d;
        tsd_desc(&d, 2, p, 40, 3);
        d.flags = mode == 0 ? 0 : TDM_REQ_SKIP_PREFIX_CACHE;
        assert_int_equal(tdm_sched_add(s, &d), TDM_OK);
        int k = step_expect(s, 1.2, &b, 2);
        assert_int_equal(b.num_computed[k], 0);
        assert_int_equal(b.num_tokens[k], 40);
        tdm_sched_stats st;
        tsd_stats(s, &st);
        if (mode == 0) assert_int_equal(st.num_cached_blocks, 0);
        assert_int_equal(st.prefix_hits, 0);
        tsd_update(s, &b, 7, 1.3, NULL);
        tsd_run(s, 50, NULL);
        tsd_done(s);
    }
}

/* vLLM test_reset_prefix_cache: refused while requests hold blocks; with reset_running every
 * running request is preempted (moved to waiting in order) and the cache emptied. */
static void reset_prefix_cache__needs_reset_running_while_running(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MAX_NUM_SEQS, 3, 0 };
    tdm_sched *s = tsd_newp(kv);
    for (uint64_t id = 1; id <= 4; id++) assert_int_equal(tsd_add(s, id, 20, 5), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 3);
    tsd_update(s, &b, 7, 1.1, NULL);
    tdm_sched_stats before, after;
    tsd_stats(s, &before);
    assert_int_equal(tdm_sched_reset_prefix_cache(s, 0), TDM_E_STATE);
    assert_true(tdm_sched_errmsg(s)[0] != '\0');
    tsd_stats(s, &after);
    assert_memory_equal(&before, &after, sizeof(before));
    assert_int_equal(tdm_sched_reset_prefix_cache(s, 1), TDM_OK);
    tsd_check(s);
    tsd_stats(s, &after);
    assert_int_equal(after.num_running, 0);
    assert_int_equal(after.num_waiting, 4);
    assert_int_equal(after.num_cached_blocks, 0);
    assert_int_equal(after.num_free_blocks, after.num_total_blocks);
    for (uint64_t id = 1; id <= 3; id++) assert_int_equal(tsd_state(s, id), TDM_STATE_PREEMPTED);
    tsd_step(s, 1.2, &b);
    assert_int_equal(b.num_reqs, 3);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(b.req_ids[i], i + 1);
        assert_int_equal(b.kinds[i], TDM_ENTRY_RESUMED);
        assert_int_equal(b.num_computed[i], 0);
        assert_int_equal(b.num_tokens[i], 21);
    }
    tsd_update(s, &b, 7, 1.3, NULL);
    tsd_run(s, 50, NULL);
    tsd_done(s);
}

static void reset_prefix_cache__drops_cached_blocks_when_idle(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    tdm_token p[40];
    tsd_prompt(100, 40, p);
    assert_int_equal(tsd_add_tokens(s, 1, p, 40, 3), TDM_OK);
    tsd_run(s, 20, NULL);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_cached_blocks, 2);
    assert_int_equal(tdm_sched_reset_prefix_cache(s, 0), TDM_OK);
    tsd_stats(s, &st);
    assert_int_equal(st.num_cached_blocks, 0);
    assert_int_equal(st.num_free_blocks, st.num_total_blocks);
    assert_int_equal(tsd_add_tokens(s, 2, p, 40, 3), TDM_OK);
    tdm_batch b;
    int k = step_expect(s, 1.0, &b, 2);
    assert_int_equal(b.num_computed[k], 0);
    tsd_update(s, &b, 7, 1.1, NULL);
    tsd_run(s, 20, NULL);
    tsd_done(s);
}

/* A request preempted with prefix caching on (here: it is its own victim, the tail of the
 * running list) resumes with a hit on its own freed blocks. */
static void prefix__resumed_request_hits_its_own_blocks(void **state)
{
    (void)state;
    tdm_sched *s = tsd_newp(kv11);
    assert_int_equal(tsd_add(s, 1, 64, 2), TDM_OK);
    assert_int_equal(tsd_add(s, 2, 80, 10), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 2);
    tsd_update(s, &b, 7, 1.1, NULL);
    tsd_step(s, 1.2, &b); /* 1 takes the last block; 2 needs one: 2 is the victim */
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 1);
    assert_int_equal(b.num_preempted, 1);
    assert_int_equal(b.preempted_ids[0], 2);
    tsd_update(s, &b, 7, 1.3, NULL); /* 1 finishes (max_tokens 2) */
    int k = step_expect(s, 1.4, &b, 2);
    assert_int_equal(b.kinds[k], TDM_ENTRY_RESUMED);
    assert_int_equal(b.num_computed[k], 80);
    assert_int_equal(b.num_tokens[k], 1);
    assert_int_equal(b.block_offsets[k + 1] - b.block_offsets[k], 6);
    tsd_update(s, &b, 7, 1.5, NULL);
    double now = 2.0;
    tsd_run(s, 50, &now);
    tsd_done(s);
}

/* Two requests computing the same prefix at once each fill their own copy of its blocks, and
 * both copies are indexed (vLLM's hash -> several blocks map): once the first copy is evicted
 * the prefix is still found in the second. Here request 1's copy is evicted while request 2
 * still runs; request 4 then hits request 2's copy. */
static void prefix__concurrent_copies_both_indexed(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_NUM_BLOCKS, 13, TDM_SCHED_BLOCK_SIZE, 16,
                           TDM_SCHED_LONG_PREFILL_TOKEN_THRESHOLD, 8, 0 };
    tdm_sched *s = tsd_newp(kv);
    tdm_token p[48], c[128];
    tsd_prompt(100, 48, p);
    tsd_prompt(300, 128, c);
    assert_int_equal(tsd_add_tokens(s, 1, p, 48, 1), TDM_OK);
    assert_int_equal(tsd_add_tokens(s, 2, p, 48, 16), TDM_OK);
    tdm_batch b;
    double now = 1.0;
    for (int i = 0; i < 6; i++) { /* 8 tokens each per step: neither hits the other's blocks */
        tsd_step(s, now, &b);
        assert_int_equal(b.num_reqs, 2);
        assert_int_equal(b.num_computed[1], 8 * i);
        tsd_update(s, &b, 7, now + 0.01, NULL);
        now += 0.1;
    }
    assert_int_equal(tsd_state(s, 1), TDM_STATE_FINISHED);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_cached_blocks, 6); /* both copies of the 3 blocks */
    /* request 3 (no threshold now) takes the 5 never-used blocks and request 1's 3 copies */
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_LONG_PREFILL_TOKEN_THRESHOLD, 0), TDM_OK);
    assert_int_equal(tsd_add_tokens(s, 3, c, 120, 1), TDM_OK);
    int k = step_expect(s, now, &b, 3);
    assert_int_equal(b.num_computed[k], 0);
    assert_int_equal(b.num_tokens[k], 120);
    tsd_stats(s, &st);
    assert_int_equal(st.evictions, 3);
    tsd_update(s, &b, 7, now + 0.01, NULL);
    while (tsd_state(s, 2) != TDM_STATE_FINISHED) {
        now += 0.1;
        tsd_step(s, now, &b);
        tsd_update(s, &b, 7, now + 0.01, NULL);
    }
    assert_int_equal(tsd_add_tokens(s, 4, p, 48, 1), TDM_OK);
    k = step_expect(s, now + 0.1, &b, 4);
    assert_int_equal(b.num_computed[k], 32); /* request 2's copy (capped at num_tokens - 1) */
    assert_int_equal(b.num_tokens[k], 16);
    tsd_update(s, &b, 7, now + 0.11, NULL);
    tsd_run(s, 50, NULL);
    tsd_done(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(prefix__partial_hit_shares_full_blocks),
        TSD_TEST(prefix__full_hit_recomputes_last_token),
        TSD_TEST(prefix__same_step_request_hits_blocks_allocated_before_it),
        TSD_TEST(prefix__eviction_lru_with_tail_blocks_first),
        TSD_TEST(prefix__running_blocks_never_evicted),
        TSD_TEST(prefix__touched_free_hit_blocks_count_against_free),
        TSD_TEST(prefix__unhashed_freed_blocks_reused_before_cached_ones),
        TSD_TEST(prefix__cache_salt_separates_equal_prompts),
        TSD_TEST(prefix__disabled_or_skipped_gives_no_hit),
        TSD_TEST(reset_prefix_cache__needs_reset_running_while_running),
        TSD_TEST(reset_prefix_cache__drops_cached_blocks_when_idle),
        TSD_TEST(prefix__resumed_request_hits_its_own_blocks),
        TSD_TEST(prefix__concurrent_copies_both_indexed),
    };
    return cmocka_run_group_tests_name("sched_prefix", tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_prefix")
#endif
