/*
 * test_sched_deferred_free.c -- TDM_SCHED_DEFER_BLOCK_FREE (sched/deferred_free.c), vLLM
 * 0.33+'s defer_block_free: the blocks of a request finished (aborted, stopped) while a step
 * of it is in flight go back to the pool only once every non-empty batch returned before the
 * free has been reported; they go back run after run in the order freed, each request's tail
 * block first, so that blocks freed at once in between are evicted before them; empty batches
 * do not count; named updates count; a running request with a step in flight is not
 * preempted (the running pass ends); a host that reports each step before the next frees at
 * once; the parameter is validated, fixed while requests or deferred blocks are held, and
 * reset_prefix_cache refuses while blocks wait; allocation failure leaves state unchanged.
 * Each scenario runs with the parameter off as the control.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "sched_driver.h"
#include "../../sched/sched_internal.h"

#if TDM_HAVE_SCHED_IMPL

#define EOS 2

/* A batch kept past the next step: its step, ids and which entries sample. */
typedef struct kept {
    uint64_t step;
    uint32_t n;
    uint64_t ids[16];
    uint8_t samples[16];
} kept;

static tdm_sched *new_sched(int async, int defer, int64_t bs, int64_t num_blocks, int caching)
{
    const int64_t kv[] = { TDM_SCHED_ASYNC_SCHEDULING, async, TDM_SCHED_DEFER_BLOCK_FREE, defer,
                           TDM_SCHED_BLOCK_SIZE, bs, TDM_SCHED_NUM_BLOCKS, num_blocks,
                           TDM_SCHED_ENABLE_PREFIX_CACHING, caching, 0 };
    return tsd_newp(kv);
}

static void add_req(tdm_sched *s, uint64_t id, uint32_t num_prompt, uint32_t max_tokens)
{
    tdm_token p[64];
    assert_true(num_prompt <= 64);
    for (uint32_t i = 0; i < num_prompt; i++) p[i] = (tdm_token)(100 + 1000 * id + i);
    tdm_request_desc d;
    assert_int_equal(tsd_desc(&d, id, p, num_prompt, max_tokens), TDM_OK);
    d.eos_token_id = EOS;
    d.arrival_time = (double)id * 1e-3;
    assert_int_equal(tdm_sched_add(s, &d), TDM_OK);
}

static void step_keep(tdm_sched *s, double now, kept *k)
{
    tdm_batch b;
    tsd_step(s, now, &b);
    assert_true(b.num_reqs <= 16);
    k->step = b.step;
    k->n = b.num_reqs;
    for (uint32_t i = 0; i < b.num_reqs; i++) {
        tdm_request_info info;
        tsd_info(s, b.req_ids[i], &info);
        k->ids[i] = b.req_ids[i];
        uint64_t end = (uint64_t)b.num_computed[i] + b.num_tokens[i] - b.num_spec[i];
        k->samples[i] = end >= (uint64_t)info.num_prompt_tokens + info.num_output_tokens;
    }
}

/* Report a kept batch in one update listing all its requests, each sampling `tok`; with
 * named, as tdm_sched_update_step of its step. */
static void report(tdm_sched *s, const kept *k, tdm_token tok, double now, int named)
{
    uint32_t offs[17];
    tdm_token toks[16];
    uint32_t nt = 0;
    for (uint32_t i = 0; i < k->n; i++) {
        offs[i] = nt;
        if (k->samples[i]) toks[nt++] = tok;
    }
    offs[k->n] = nt;
    int rc = tsd_report_step(s, named ? k->step : 0, k->n, k->ids, offs, toks, now, NULL);
    if (rc != TDM_OK) fail_msg("report of step %llu -> %d: %s", (unsigned long long)k->step, rc,
                               tdm_sched_errmsg(s));
    tsd_check(s);
}

static uint32_t num_free(const tdm_sched *s)
{
    tdm_sched_stats st;
    tsd_stats(s, &st);
    return st.num_free_blocks;
}

static void finish_all(tdm_sched *s, double now)
{
    tsd_run(s, 400, &now);
    tsd_done(s);
}

/* Aborted with a step in flight (async: steps 1 and 2 of it are): its 2 blocks stay out of
 * the pool until the second step, the newest returned before the abort, is reported. */
static void defer__aborted_in_flight_blocks_wait_for_newest_report(void **state)
{
    (void)state;
    for (int defer = 0; defer <= 1; defer++) {
        tdm_sched *s = new_sched(1, defer, 16, 64, 0);
        add_req(s, 1, 20, 10);
        kept k1, k2;
        step_keep(s, 1.0, &k1);
        step_keep(s, 1.1, &k2);
        assert_int_equal(k2.n, 1);
        assert_int_equal(num_free(s), 63 - 2);
        assert_int_equal(tdm_sched_abort(s, 1), TDM_OK);
        assert_int_equal(num_free(s), defer ? 63 - 2 : 63);
        tsd_check(s);
        report(s, &k1, 7, 1.2, 0);
        assert_int_equal(num_free(s), defer ? 63 - 2 : 63); /* fenced by step 2 */
        report(s, &k2, 7, 1.3, 0);
        assert_int_equal(num_free(s), 63);
        finish_all(s, 2.0);
    }
}

/* Stopped by the update of step 1 while step 2 of it is in flight: deferred until step 2's
 * report; with a named report too. */
static void defer__stopped_in_update_waits_for_the_later_step(void **state)
{
    (void)state;
    for (int defer = 0; defer <= 1; defer++) {
        for (int named = 0; named <= 1; named++) {
            tdm_sched *s = new_sched(1, defer, 16, 64, 0);
            add_req(s, 1, 20, 10);
            kept k1, k2;
            step_keep(s, 1.0, &k1);
            step_keep(s, 1.1, &k2);
            report(s, &k1, EOS, 1.2, named);
            assert_int_equal(tsd_state(s, 1), TDM_STATE_FINISHED);
            assert_int_equal(num_free(s), defer ? 63 - 2 : 63);
            report(s, &k2, 7, 1.3, named);
            assert_int_equal(num_free(s), 63);
            finish_all(s, 2.0);
        }
    }
}

/* A request whose last step is reported frees at once even while another batch is in
 * flight; an empty batch returned in between does not move the fence. */
static void defer__empty_batches_do_not_count_and_reported_requests_free_at_once(void **state)
{
    (void)state;
    tdm_sched *s = new_sched(1, 1, 16, 64, 0);
    add_req(s, 1, 20, 1); /* one token: no second step */
    add_req(s, 2, 20, 10);
    kept k1, k2, k3;
    step_keep(s, 1.0, &k1);
    assert_int_equal(k1.n, 2);
    step_keep(s, 1.1, &k2);
    assert_int_equal(k2.n, 1); /* only request 2 */
    assert_int_equal(k2.ids[0], 2);
    report(s, &k1, 7, 1.2, 0); /* request 1 finishes: its only step is reported */
    assert_int_equal(tsd_state(s, 1), TDM_STATE_FINISHED);
    assert_int_equal(num_free(s), 63 - 2);
    assert_int_equal(tdm_sched_abort(s, 2), TDM_OK);
    step_keep(s, 1.3, &k3); /* empty: nothing left to schedule */
    assert_int_equal(k3.n, 0);
    assert_int_equal(num_free(s), 63 - 2);
    report(s, &k3, 7, 1.35, 0); /* an empty report: not a batch's */
    assert_int_equal(num_free(s), 63 - 2);
    report(s, &k2, 7, 1.4, 0); /* step 2, the newest non-empty batch before the abort */
    assert_int_equal(num_free(s), 63);
    finish_all(s, 2.0);
}

/* The free queue's tail after two requests freed in the order A (deferred) then B (at once):
 * with deferral, A's cached blocks go back after B's, so B's are evicted first; without, A's
 * first. Each request's tail block goes back first. */
static void defer__release_order_deferred_after_freed_in_between(void **state)
{
    (void)state;
    for (int defer = 0; defer <= 1; defer++) {
        tdm_sched *s = new_sched(1, defer, 4, 32, 1);
        add_req(s, 1, 8, 5); /* A */
        add_req(s, 2, 8, 1); /* B: one token, in step 1 only */
        kept k1, k2;
        step_keep(s, 1.0, &k1);
        assert_int_equal(k1.n, 2);
        const uint32_t *blk;
        uint32_t nb;
        uint32_t a[3], bb[2];
        assert_int_equal(tdm_sched_request_blocks(s, 2, &blk, &nb), TDM_OK);
        assert_int_equal(nb, 2);
        memcpy(bb, blk, sizeof(bb));
        step_keep(s, 1.1, &k2);
        assert_int_equal(k2.n, 1);
        assert_int_equal(tdm_sched_request_blocks(s, 1, &blk, &nb), TDM_OK);
        assert_int_equal(nb, 3); /* the third holds the placeholder's position */
        memcpy(a, blk, sizeof(a));
        assert_int_equal(tdm_sched_abort(s, 1), TDM_OK); /* A: step 2 in flight */
        report(s, &k1, 7, 1.2, 0);                        /* B finishes (length) */
        assert_int_equal(tsd_state(s, 2), TDM_STATE_FINISHED);
        report(s, &k2, 7, 1.3, 0);
        assert_int_equal(num_free(s), 31);
        /* The last four blocks of the free queue: the cached (full) blocks, tail first. */
        const tdm__pool *p = &s->pool;
        uint32_t tail[4], b = p->num_blocks;
        for (int i = 3; i >= 0; i--) {
            b = p->blk[b].prev;
            tail[i] = b;
        }
        const uint32_t *first = defer ? bb : a, *second = defer ? a : bb;
        assert_int_equal(tail[0], first[1]);
        assert_int_equal(tail[1], first[0]);
        assert_int_equal(tail[2], second[1]);
        assert_int_equal(tail[3], second[0]);
        /* A's unhashed third block went to the head. */
        assert_int_equal(p->blk[p->num_blocks].next, a[2]);
        finish_all(s, 2.0);
    }
}

/* Two decoding requests fill the pool; the first needs a block. The victim (the newest) has
 * a step in flight: with deferral it is not preempted and the running pass ends (the step is
 * empty); without, it is preempted and the first runs. */
static void defer__in_flight_victim_is_not_preempted(void **state)
{
    (void)state;
    for (int defer = 0; defer <= 1; defer++) {
        tdm_sched *s = new_sched(1, defer, 4, 5, 0); /* 4 usable blocks */
        add_req(s, 1, 7, 20);
        add_req(s, 2, 7, 20);
        kept k1, k2, k3;
        step_keep(s, 1.0, &k1);
        assert_int_equal(k1.n, 2);
        step_keep(s, 1.1, &k2);
        assert_int_equal(k2.n, 2);
        assert_int_equal(num_free(s), 0);
        report(s, &k1, 7, 1.2, 0);
        tdm_batch b;
        tsd_step(s, 1.3, &b);
        if (defer) {
            assert_int_equal(b.num_reqs, 0);
            assert_int_equal(b.num_preempted, 0);
            assert_int_equal(tsd_state(s, 2), TDM_STATE_RUNNING);
        } else {
            assert_int_equal(b.num_preempted, 1);
            assert_int_equal(b.preempted_ids[0], 2);
            assert_int_equal(b.num_reqs, 1);
            assert_int_equal(b.req_ids[0], 1);
        }
        k3.step = b.step;
        k3.n = b.num_reqs;
        for (uint32_t i = 0; i < b.num_reqs; i++) {
            k3.ids[i] = b.req_ids[i];
            k3.samples[i] = 1;
        }
        report(s, &k2, 7, 1.4, 0);
        report(s, &k3, 7, 1.5, 0);
        tsd_check(s);
        assert_int_equal(tdm_sched_abort(s, 1), TDM_OK);
        assert_int_equal(tdm_sched_abort(s, 2), TDM_OK);
        finish_all(s, 2.0);
    }
}

/* A host that reports each step before the next (no step in flight at a free) frees at once. */
static void defer__sync_host_frees_at_once(void **state)
{
    (void)state;
    tdm_sched *s = new_sched(0, 1, 16, 64, 0);
    add_req(s, 1, 20, 10);
    kept k1;
    step_keep(s, 1.0, &k1);
    report(s, &k1, 7, 1.1, 0);
    step_keep(s, 1.2, &k1);
    report(s, &k1, 7, 1.3, 0);
    assert_int_equal(num_free(s), 63 - 2);
    assert_int_equal(tdm_sched_abort(s, 1), TDM_OK);
    assert_int_equal(num_free(s), 63);
    finish_all(s, 2.0);
}

static void defer__param_validated_and_fixed_while_held(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new("{\"defer_block_free\": true, \"async_scheduling\": true}");
    int64_t v = 0;
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_DEFER_BLOCK_FREE, &v), TDM_OK);
    assert_int_equal(v, 1);
    char *cfg = tsd_config(s);
    if (!strstr(cfg, "\"defer_block_free\":true")) fail_msg("config dump lacks defer_block_free: %s", cfg);
    free(cfg);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_DEFER_BLOCK_FREE, 2), TDM_E_CONFIG);
    tsd_assert_msg_has(s, "defer_block_free");
    add_req(s, 1, 20, 10);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_DEFER_BLOCK_FREE, 0), TDM_E_STATE);
    tsd_assert_msg_has(s, "defer_block_free");
    kept k1, k2;
    step_keep(s, 1.0, &k1);
    step_keep(s, 1.1, &k2);
    assert_int_equal(tdm_sched_abort(s, 1), TDM_OK);
    report(s, &k1, 7, 1.2, 0);
    assert_int_equal(tdm_sched_reset_prefix_cache(s, 0), TDM_E_STATE); /* 2 blocks wait */
    tsd_assert_msg_has(s, "defer_block_free");
    report(s, &k2, 7, 1.3, 0);
    assert_int_equal(tdm_sched_reset_prefix_cache(s, 0), TDM_OK);
    finish_all(s, 2.0);
}

/* Allocation failure while the queue must grow: the abort fails with NOMEM and changes
 * nothing; it succeeds once memory is back. */
static void defer__allocation_failure_changes_nothing(void **state)
{
    (void)state;
    tdm_sched *s = new_sched(1, 1, 16, 64, 0);
    for (uint64_t id = 1; id <= 3; id++) add_req(s, id, 60, 10);
    kept k1, k2;
    step_keep(s, 1.0, &k1);
    step_keep(s, 1.1, &k2);
    uint32_t before = num_free(s);
    const uint32_t *blk;
    uint32_t held;
    assert_int_equal(tdm_sched_request_blocks(s, 1, &blk, &held), TDM_OK);
    /* the rings grow only when reserved: drop what the steps' reserves made (none waits) */
    assert_int_equal(s->dfr.len, 0);
    tdm__dfr_free(&s->dfr);
    tdm__alloc_fail_after(1);
    int rc = tdm_sched_abort(s, 1);
    tdm__alloc_fail_after(0);
    assert_int_equal(rc, TDM_E_NOMEM);
    assert_int_equal(tsd_state(s, 1), TDM_STATE_RUNNING);
    assert_int_equal(num_free(s), before);
    tsd_check(s);
    assert_int_equal(tdm_sched_abort(s, 1), TDM_OK);
    assert_int_equal(num_free(s), before);
    report(s, &k1, 7, 1.2, 0);
    report(s, &k2, 7, 1.3, 0);
    assert_int_equal(num_free(s), before + held);
    assert_int_equal(tdm_sched_abort(s, 2), TDM_OK);
    assert_int_equal(tdm_sched_abort(s, 3), TDM_OK);
    finish_all(s, 2.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(defer__aborted_in_flight_blocks_wait_for_newest_report),
        TSD_TEST(defer__stopped_in_update_waits_for_the_later_step),
        TSD_TEST(defer__empty_batches_do_not_count_and_reported_requests_free_at_once),
        TSD_TEST(defer__release_order_deferred_after_freed_in_between),
        TSD_TEST(defer__in_flight_victim_is_not_preempted),
        TSD_TEST(defer__sync_host_frees_at_once),
        TSD_TEST(defer__param_validated_and_fixed_while_held),
        TSD_TEST(defer__allocation_failure_changes_nothing),
    };
    return cmocka_run_group_tests_name("sched_deferred_free", tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_deferred_free")
#endif
