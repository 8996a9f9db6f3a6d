/*
 * test_sched_policy.c -- waiting-queue order and preemption victims: vLLM's priority tests
 * (priority then arrival, FCFS tie-break, heap order over 8 priorities, max_num_seqs, no
 * preemption with space, preempting the lowest priority and resuming it with its full token
 * ids), custom policies through tdm_sched_set_policy (shortest prompt first, a pick_victim that
 * chooses a request already scheduled in the step, destroy callbacks), and policies loaded
 * from a shared object with tdm_sched_load_policy (built by mk/schedtests.mk).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

static tdm_sched *priority_sched(int64_t max_seqs)
{
    const int64_t kv[] = { TDM_SCHED_POLICY, TDM_POLICY_PRIORITY, TDM_SCHED_MAX_NUM_SEQS, max_seqs, 0 };
    return tsd_newp(kv);
}

static void add_prio(tdm_sched *s, uint64_t id, int32_t prio, double arrival, uint32_t n,
                     uint32_t max_tokens)
{
    tsd_req r;
    tsd_req_init(&r, id, n, max_tokens);
    r.d.priority = prio;
    r.d.arrival_time = arrival;
    assert_int_equal(tdm_sched_add(s, &r.d), TDM_OK);
}

static void expect_order(tdm_sched *s, const uint64_t *ids, uint32_t n)
{
    tdm_batch b;
    tsd_step(s, 10.0, &b);
    assert_int_equal(b.num_reqs, n);
    for (uint32_t i = 0; i < n; i++) {
        if (b.req_ids[i] != ids[i])
            fail_msg("entry %u is id %llu, expected %llu", i, (unsigned long long)b.req_ids[i],
                     (unsigned long long)ids[i]);
        assert_int_equal(b.kinds[i], TDM_ENTRY_NEW);
    }
    tsd_update(s, &b, 7, 10.1, NULL);
}

static void finish_everything(tdm_sched *s)
{
    double now = 20.0;
    tsd_run(s, 200, &now);
    tsd_done(s);
}

/* Under PRIORITY with room for all: requests 0..n-1 (10-token prompts) with prios[i] and
 * arrivals[i] are admitted in one step in the order `want`. */
static void expect_priority_order(const int32_t *prios, const double *arrivals, uint32_t n,
                                  const uint64_t *want)
{
    tdm_sched *s = priority_sched(16);
    for (uint32_t i = 0; i < n; i++) add_prio(s, i, prios[i], arrivals[i], 10, 2);
    expect_order(s, want, n);
    finish_everything(s);
}

static void expect_policy_param(const tdm_sched *s, int64_t policy)
{
    int64_t v = -1;
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_POLICY, &v), TDM_OK);
    assert_int_equal(v, policy);
}

/* vLLM test_priority_scheduling_basic_ordering */
static void priority__orders_by_priority_value(void **state)
{
    (void)state;
    const int32_t prios[3] = { 2, 0, 1 };
    const double arrivals[3] = { 1.0, 2.0, 3.0 };
    const uint64_t want[3] = { 1, 2, 0 };
    expect_priority_order(prios, arrivals, 3, want);
}

/* vLLM test_priority_scheduling_arrival_time_tiebreaker / test_priority_scheduling_fcfs_fallback */
static void priority__equal_priority_falls_back_to_arrival(void **state)
{
    (void)state;
    const int32_t prios[3] = { 1, 1, 1 };
    const double arrivals[3] = { 3.0, 1.0, 2.0 };
    const uint64_t want[3] = { 1, 2, 0 };
    expect_priority_order(prios, arrivals, 3, want);
}

/* vLLM test_priority_scheduling_mixed_priority_and_arrival */
static void priority__mixed_priority_and_arrival(void **state)
{
    (void)state;
    const int32_t prios[4] = { 2, 1, 1, 0 };
    const double arrivals[4] = { 1.0, 3.0, 2.0, 4.0 };
    const uint64_t want[4] = { 3, 2, 1, 0 };
    expect_priority_order(prios, arrivals, 4, want);
}

/* Admit one request per step (max_num_seqs 1), finishing each before the next. */
static void admit_one_by_one(tdm_sched *s, const uint64_t *want, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        tdm_batch b;
        tsd_step(s, 1.0 + i, &b);
        assert_int_equal(b.num_reqs, 1);
        if (b.req_ids[0] != want[i])
            fail_msg("admission %u is id %llu, expected %llu", i, (unsigned long long)b.req_ids[0],
                     (unsigned long long)want[i]);
        tsd_update(s, &b, 7, 1.5 + i, NULL);
        assert_int_equal(tdm_sched_finish(s, want[i], TDM_FINISH_STOP), TDM_OK);
    }
}

/* vLLM test_priority_scheduling_heap_property: 8 priorities come out sorted. */
static void priority__heap_order_across_8_priorities(void **state)
{
    (void)state;
    tdm_sched *s = priority_sched(1);
    const int32_t prios[8] = { 5, 1, 8, 3, 2, 7, 4, 6 };
    for (uint64_t i = 0; i < 8; i++) add_prio(s, i, prios[i], (double)i, 10, 5);
    const uint64_t want[8] = { 1, 4, 3, 6, 0, 7, 5, 2 };
    admit_one_by_one(s, want, 8);
    finish_everything(s);
}

/* vLLM test_priority_scheduling_with_limited_slots */
static void priority__max_num_seqs_limits_admission(void **state)
{
    (void)state;
    tdm_sched *s = priority_sched(2);
    add_prio(s, 0, 3, 1.0, 10, 5);
    add_prio(s, 1, 1, 2.0, 10, 5);
    add_prio(s, 2, 2, 3.0, 10, 5);
    add_prio(s, 3, 0, 4.0, 10, 5);
    const uint64_t want[2] = { 3, 1 };
    expect_order(s, want, 2);
    assert_int_equal(tsd_state(s, 0), TDM_STATE_WAITING);
    assert_int_equal(tsd_state(s, 2), TDM_STATE_WAITING);
    assert_int_equal(tdm_sched_finish(s, 3, TDM_FINISH_STOP), TDM_OK);
    tdm_batch b;
    tsd_step(s, 11.0, &b);
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(b.req_ids[0], 1);
    assert_int_equal(b.req_ids[1], 2);
    tsd_update(s, &b, 7, 11.1, NULL);
    finish_everything(s);
}

/* vLLM test_priority_scheduling_no_preemption_when_space_available */
static void priority__no_preemption_when_space(void **state)
{
    (void)state;
    tdm_sched *s = priority_sched(16);
    add_prio(s, 0, 5, 0.0, 30, 8);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    tsd_update(s, &b, 7, 1.1, NULL);
    add_prio(s, 1, 0, 1.0, 30, 8);
    tsd_step(s, 1.2, &b);
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(b.num_preempted, 0);
    tsd_update(s, &b, 7, 1.3, NULL);
    double now = 2.0;
    tsd_run(s, 50, &now);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.preemptions, 0);
    tsd_done(s);
}

/* vLLM test_priority_scheduling_preemption_when_out_of_kv: 5 blocks (4 usable); the low
 * priority request, though already scheduled in the step, is undone and preempted for the
 * high priority one, then resumes with its full token ids. */
static void priority__preempts_lowest_and_resumes_with_full_tokens(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_POLICY, TDM_POLICY_PRIORITY, TDM_SCHED_MAX_NUM_SEQS, 2,
                           TDM_SCHED_NUM_BLOCKS, 5, TDM_SCHED_BLOCK_SIZE, 16, 0 };
    tdm_sched *s = tsd_newp(kv);
    add_prio(s, 0, 1, 0.0, 30, 20);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 1);
    const tdm_token t100 = 100, t200 = 200;
    assert_int_equal(tsd_update_one(s, 0, &t100, 1, 1.1, NULL), TDM_OK);
    add_prio(s, 1, 0, 1.0, 32, 20);
    tsd_step(s, 1.2, &b);
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(b.kinds[tsd_find(&b, 1)], TDM_ENTRY_NEW);
    assert_int_equal(tsd_update_one(s, 0, &t100, 1, 1.3, NULL), TDM_OK);
    assert_int_equal(tsd_update_one(s, 1, &t200, 1, 1.3, NULL), TDM_OK);
    tsd_step(s, 1.4, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 1);
    assert_int_equal(b.total_tokens, 1); /* the undone request's tokens went back */
    assert_int_equal(b.num_preempted, 1);
    assert_int_equal(b.preempted_ids[0], 0);
    assert_int_equal(tsd_state(s, 0), TDM_STATE_PREEMPTED);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_running, 1);
    assert_int_equal(st.num_waiting, 1);
    assert_int_equal(st.preemptions, 1);
    assert_int_equal(tsd_update_one(s, 1, &t200, 1, 1.5, NULL), TDM_OK);
    assert_int_equal(tdm_sched_finish(s, 1, TDM_FINISH_STOP), TDM_OK);
    tsd_step(s, 1.6, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 0);
    assert_int_equal(b.kinds[0], TDM_ENTRY_RESUMED);
    assert_int_equal(b.num_computed[0], 16); /* its first block is still cached */
    assert_int_equal(b.num_tokens[0], 16);
    assert_int_equal(b.block_offsets[1], 2);
    const tdm_token *t;
    uint32_t n;
    assert_int_equal(tdm_sched_request_tokens(s, 0, &t, &n), TDM_OK);
    assert_int_equal(n, 32);
    tdm_token p[30];
    tsd_prompt(0, 30, p);
    assert_memory_equal(t, p, sizeof(p));
    assert_int_equal(t[30], 100);
    assert_int_equal(t[31], 100);
    tdm_request_info info;
    tsd_info(s, 0, &info);
    assert_int_equal(info.num_preemptions, 1);
    assert_int_equal(info.num_cached_tokens, 0); /* the hit at the first admission, not this one */
    assert_true(info.first_scheduled_time > 0.99 && info.first_scheduled_time < 1.01);
    tsd_update(s, &b, 7, 1.7, NULL);
    finish_everything(s);
}

/* vLLM 0.33: when the request being scheduled is itself the victim it is preempted, and under
 * PRIORITY the running loop goes on (`continue`): the requests after it rank higher and may
 * fit in the blocks it freed (vLLM 0.32 and older: `break`, kept with
 * continue_after_self_preemption 0). Here the worst request (the first one, which needs a
 * block) preempts itself and the second one runs; under FCFS the tail of the running list is
 * the victim instead and the first request runs. */
static void priority__worst_request_preempts_itself_fcfs_takes_tail(void **state)
{
    (void)state;
    for (int v = 0; v < 3; v++) { /* FCFS; PRIORITY going on (vLLM 0.33); PRIORITY stopping */
        int pol = v > 0, cont = v < 2;
        const int64_t kv[] = { TDM_SCHED_POLICY, pol ? TDM_POLICY_PRIORITY : TDM_POLICY_FCFS,
                               TDM_SCHED_NUM_BLOCKS, 5, TDM_SCHED_BLOCK_SIZE, 16,
                               TDM_SCHED_ENABLE_PREFIX_CACHING, 0,
                               TDM_SCHED_CONTINUE_AFTER_SELF_PREEMPTION, cont, 0 };
        tdm_sched *s = tsd_newp(kv);
        add_prio(s, 1, 1, 0.0, 31, 20); /* low priority, admitted first */
        tdm_batch b;
        tsd_step(s, 1.0, &b);
        tsd_update(s, &b, 7, 1.05, NULL);
        add_prio(s, 2, 0, 1.0, 32, 20);
        tsd_step(s, 1.1, &b);
        assert_int_equal(b.num_reqs, 2);
        tsd_update(s, &b, 7, 1.15, NULL);
        tsd_step(s, 1.2, &b); /* both need a third block; none is free */
        uint64_t victim = pol ? 1 : 2;
        assert_int_equal(b.num_preempted, 1);
        assert_int_equal(b.preempted_ids[0], victim);
        /* PRIORITY: request 1 preempted itself; vLLM 0.33 goes on with the higher-priority
         * request behind it, which now fits in the blocks it freed (0.32: the step ends
         * there, empty). FCFS: the tail (2) goes. */
        if (pol && !cont) {
            assert_int_equal(b.num_reqs, 0);
        } else {
            assert_int_equal(b.num_reqs, 1);
            assert_int_equal(b.req_ids[0], pol ? 2 : 1);
            assert_int_equal(b.kinds[0], TDM_ENTRY_CONTINUING);
        }
        assert_int_equal(tsd_state(s, victim), TDM_STATE_PREEMPTED);
        tsd_update(s, &b, 7, 1.25, NULL);
        finish_everything(s);
    }
}

/* ---- custom policies ---- */

typedef struct pol_ctx {
    int destroyed;
    int victim_calls;
} pol_ctx;

static int cmp_short_first(void *ctx, const tdm_request_view *a, const tdm_request_view *b)
{
    (void)ctx;
    if (a->num_prompt_tokens != b->num_prompt_tokens)
        return a->num_prompt_tokens < b->num_prompt_tokens ? -1 : 1;
    return 0;
}

static int cmp_arrival(void *ctx, const tdm_request_view *a, const tdm_request_view *b)
{
    (void)ctx;
    return a->arrival_time < b->arrival_time ? -1 : a->arrival_time > b->arrival_time ? 1 : 0;
}

static uint32_t victim_oldest(void *ctx, const tdm_request_view *const *running, uint32_t n)
{
    pol_ctx *c = ctx;
    c->victim_calls++;
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (running[i]->admit_seq < running[best]->admit_seq) best = i;
    return best;
}

static void pol_destroy(void *ctx) { ((pol_ctx *)ctx)->destroyed++; }

static tdm_policy make_policy(pol_ctx *c, int (*cmp)(void *, const tdm_request_view *,
                                                      const tdm_request_view *))
{
    tdm_policy p;
    memset(&p, 0, sizeof(p));
    p.version = TDM_POLICY_VERSION;
    p.name = "test-policy";
    p.ctx = c;
    p.compare = cmp;
    p.destroy = pol_destroy;
    return p;
}

/* Install a fresh test policy on s: compare `cmp`, pick_victim `victim` (may be NULL), the
 * context *c zeroed (it counts destroy and pick_victim calls). */
static void install_policy(tdm_sched *s, pol_ctx *c,
                           int (*cmp)(void *, const tdm_request_view *, const tdm_request_view *),
                           uint32_t (*victim)(void *, const tdm_request_view *const *, uint32_t))
{
    *c = (pol_ctx){ 0, 0 };
    tdm_policy p = make_policy(c, cmp);
    p.pick_victim = victim;
    assert_int_equal(tdm_sched_set_policy(s, &p), TDM_OK);
}

/* With max_num_seqs 1 and a shortest-prompt-first policy installed: four requests (prompts of
 * 50, 10, 30, 20 tokens) are admitted shortest first, then a last step. */
static void expect_shortest_first_admission(tdm_sched *s)
{
    const uint32_t lens[4] = { 50, 10, 30, 20 };
    for (uint64_t i = 0; i < 4; i++) assert_int_equal(tsd_add(s, i + 1, lens[i], 3), TDM_OK);
    const uint64_t want[4] = { 2, 4, 3, 1 };
    admit_one_by_one(s, want, 4);
    tdm_batch b;
    tsd_step(s, 9.0, &b);
}

static void policy__custom_compare_orders_admission(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_MAX_NUM_SEQS, 1, 0 };
    tdm_sched *s = tsd_newp(kv);
    static pol_ctx c;
    install_policy(s, &c, cmp_short_first, NULL);
    expect_policy_param(s, TDM_POLICY_CUSTOM);
    expect_shortest_first_admission(s);
    assert_int_equal(c.destroyed, 0);
    tsd_done(s);
    assert_int_equal(c.destroyed, 1); /* destroy(ctx) on tdm_sched_destroy */
}

/* pick_victim chooses the oldest running request, which was already scheduled earlier in
 * the step: its scheduling is undone (blocks and budget) and it is preempted. */
static void policy__pick_victim_honoured_and_undone(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_NUM_BLOCKS, 11, TDM_SCHED_BLOCK_SIZE, 16,
                           TDM_SCHED_ENABLE_PREFIX_CACHING, 0, 0 };
    tdm_sched *s = tsd_newp(kv);
    static pol_ctx c;
    install_policy(s, &c, cmp_arrival, victim_oldest);
    for (uint64_t id = 1; id <= 3; id++) assert_int_equal(tsd_add(s, id, 48, 20), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 3);
    tsd_update(s, &b, 7, 1.1, NULL);
    tsd_step(s, 1.2, &b);
    assert_true(c.victim_calls >= 1);
    assert_int_equal(b.num_preempted, 1);
    assert_int_equal(b.preempted_ids[0], 1);
    assert_int_equal(b.num_reqs, 2);
    assert_int_equal(b.req_ids[0], 2);
    assert_int_equal(b.req_ids[1], 3);
    assert_int_equal(b.total_tokens, 2);
    assert_int_equal(tsd_state(s, 1), TDM_STATE_PREEMPTED);
    assert_int_equal(tdm__sched_blocks_in_use(s), 8);
    tsd_update(s, &b, 7, 1.3, NULL);
    finish_everything(s);
    assert_int_equal(c.destroyed, 1);
}

static void policy__set_rejected_while_waiting_and_bad_tables(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    static pol_ctx c;
    c = (pol_ctx){ 0, 0 };
    tdm_policy p = make_policy(&c, cmp_short_first);
    tdm_policy bad = p;
    bad.compare = NULL;
    assert_int_equal(tdm_sched_set_policy(s, &bad), TDM_E_INVAL);
    assert_true(tdm_sched_errmsg(s)[0] != '\0');
    bad = p;
    bad.version = 999;
    assert_int_equal(tdm_sched_set_policy(s, &bad), TDM_E_VERSION);
    assert_int_equal(tdm_sched_set_policy(NULL, &p), TDM_E_INVAL);
    assert_int_equal(c.destroyed, 0); /* rejected tables are not adopted */
    assert_int_equal(tsd_add(s, 1, 10, 2), TDM_OK);
    assert_int_equal(tdm_sched_set_policy(s, &p), TDM_E_STATE);
    assert_true(tdm_sched_errmsg(s)[0] != '\0');
    expect_policy_param(s, TDM_POLICY_FCFS);
    tsd_run(s, 20, NULL);
    /* replacing a custom policy destroys the old one */
    static pol_ctx c2;
    c2 = (pol_ctx){ 0, 0 };
    tdm_policy p2 = make_policy(&c2, cmp_arrival);
    assert_int_equal(tdm_sched_set_policy(s, &p), TDM_OK);
    assert_int_equal(tdm_sched_set_policy(s, &p2), TDM_OK);
    assert_int_equal(c.destroyed, 1);
    assert_int_equal(c2.destroyed, 0);
    tsd_done(s);
    assert_int_equal(c2.destroyed, 1);
}

static int cmp_tie(void *ctx, const tdm_request_view *a, const tdm_request_view *b)
{
    (void)ctx;
    (void)a;
    (void)b;
    return 0;
}

static uint32_t victim_out_of_range(void *ctx, const tdm_request_view *const *running, uint32_t n)
{
    (void)ctx;
    (void)running;
    return n + 7;
}

/* compare() ties fall back to arrival order (header: "0 if equal (then arrival order)"), read
 * as arrival_time like the built-in PRIORITY tie-break and vLLM's Request ordering. */
static void policy__compare_ties_follow_arrival_time(void **state)
{
    (void)state;
    const int64_t seqs[] = { TDM_SCHED_MAX_NUM_SEQS, 1, 0 };
    tdm_sched *s = tsd_newp(seqs);
    static pol_ctx c;
    install_policy(s, &c, cmp_tie, NULL);
    add_prio(s, 0, 0, 3.0, 10, 3);
    add_prio(s, 1, 0, 1.0, 10, 3);
    add_prio(s, 2, 0, 2.0, 10, 3);
    const uint64_t want[3] = { 1, 2, 0 };
    admit_one_by_one(s, want, 3);
    finish_everything(s);
}

/* Without pick_victim the victim is the request compare() ranks last (even when it is not the
 * tail of running); an out-of-range victim index from a misbehaving policy is contained. */
static void policy__default_victim_and_bad_victim_index(void **state)
{
    (void)state;
    static pol_ctx c;
    for (int bad = 0; bad < 2; bad++) {
        const int64_t kv[] = { TDM_SCHED_NUM_BLOCKS, 8, TDM_SCHED_BLOCK_SIZE, 16,
                               TDM_SCHED_ENABLE_PREFIX_CACHING, 0, 0 };
        tdm_sched *s = tsd_newp(kv);
        install_policy(s, &c, cmp_short_first, bad ? victim_out_of_range : NULL);
        assert_int_equal(tsd_add(s, 1, 47, 20), TDM_OK);
        tdm_batch b;
        tsd_step(s, 1.0, &b);
        tsd_update(s, &b, 7, 1.05, NULL);
        assert_int_equal(tsd_add(s, 2, 32, 20), TDM_OK);
        assert_int_equal(tsd_add(s, 3, 32, 20), TDM_OK);
        tsd_step(s, 1.1, &b);
        assert_int_equal(b.num_reqs, 3);
        tsd_update(s, &b, 7, 1.15, NULL);
        tsd_step(s, 1.2, &b); /* all three need a block, none is free */
        assert_int_equal(b.num_preempted, 1);
        if (!bad) {
            assert_int_equal(b.preempted_ids[0], 1); /* the longest prompt, first in running */
            /* it was the request being scheduled: the running loop goes on, and the two
             * after it fit in the blocks it freed (vLLM 0.33) */
            assert_int_equal(b.num_reqs, 2);
        }
        tsd_update(s, &b, 7, 1.25, NULL);
        finish_everything(s);
    }
}

/* ---- plug-in shared object ---- */

static int plugin_path(char *buf, size_t n)
{
    const char *bd = getenv("TANDEM_BUILD");
    snprintf(buf, n, "%s/tests/sched/plugin_sjf.so", bd ? bd : "build");
    if (access(buf, R_OK) != 0) {
        print_message("policy plug-in %s not built (run through make): skipped\n", buf);
        return 0;
    }
    return 1;
}

static void load_policy__shared_object_changes_admission_order(void **state)
{
    (void)state;
    char path[4096];
    if (!plugin_path(path, sizeof(path))) skip();
    const int64_t kv[] = { TDM_SCHED_MAX_NUM_SEQS, 1, 0 };
    tdm_sched *s = tsd_newp(kv);
    int rc = tdm_sched_load_policy(s, path, NULL);
    if (rc != TDM_OK) fail_msg("load_policy -> %d: %s", rc, tdm_sched_errmsg(s));
    expect_shortest_first_admission(s);
    tsd_done(s);
}

static void load_policy__errors_report_plugin_and_keep_policy(void **state)
{
    (void)state;
    char path[4096];
    tdm_sched *s = tsd_new(NULL);
    assert_int_equal(tdm_sched_load_policy(s, "/nonexistent/libtdm-nope.so", NULL), TDM_E_PLUGIN);
    tsd_assert_msg_has(s, "cannot open shared object file"); /* dlerror's message */
    assert_int_equal(tdm_sched_load_policy(s, NULL, NULL), TDM_E_INVAL);
    assert_int_equal(tdm_sched_load_policy(NULL, "x.so", NULL), TDM_E_INVAL);
    if (plugin_path(path, sizeof(path))) {
        assert_int_equal(tdm_sched_load_policy(s, path, "tdm_no_such_entry"), TDM_E_PLUGIN);
        tsd_assert_msg_has(s, "tdm_no_such_entry");
        assert_int_equal(tdm_sched_load_policy(s, path, "tdm_policy_entry_badver"), TDM_E_VERSION);
        assert_true(tdm_sched_errmsg(s)[0] != '\0');
        assert_int_equal(tdm_sched_load_policy(s, path, "tdm_policy_entry_fails"), TDM_E_PLUGIN);
        assert_true(tdm_sched_errmsg(s)[0] != '\0');
    }
    expect_policy_param(s, TDM_POLICY_FCFS);
    tsd_done(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(priority__orders_by_priority_value),
        TSD_TEST(priority__equal_priority_falls_back_to_arrival),
        TSD_TEST(priority__mixed_priority_and_arrival),
        TSD_TEST(priority__heap_order_across_8_priorities),
        TSD_TEST(priority__max_num_seqs_limits_admission),
        TSD_TEST(priority__no_preemption_when_space),
        TSD_TEST(priority__preempts_lowest_and_resumes_with_full_tokens),
        TSD_TEST(priority__worst_request_preempts_itself_fcfs_takes_tail),
        TSD_TEST(policy__custom_compare_orders_admission),
        TSD_TEST(policy__pick_victim_honoured_and_undone),
        TSD_TEST(policy__set_rejected_while_waiting_and_bad_tables),
        TSD_TEST(policy__compare_ties_follow_arrival_time),
        TSD_TEST(policy__default_victim_and_bad_victim_index),
        TSD_TEST(load_policy__shared_object_changes_admission_order),
        TSD_TEST(load_policy__errors_report_plugin_and_keep_policy),
    };
    return cmocka_run_group_tests_name("sched_policy", tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_policy")
#endif
