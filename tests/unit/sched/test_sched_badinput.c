/*
 * test_sched_badinput.c -- every public tdm_sched_* function (and the *_init helpers) with
 * NULL or out-of-range arguments, unknown and duplicate ids, malformed step outputs and wrong
 * states: each call returns an error status, sets a message when it has a handle, leaves its
 * out-parameters untouched, and changes nothing (stats, configuration, request counts and the
 * known requests' info are compared before and after). A seeded stream of malformed step
 * outputs between valid steps (TANDEM_SCHED_GARBAGE_SEED picks another seed) must never leave
 * the scheduler inconsistent.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

typedef struct snap {
    char *config;
    tdm_sched_stats st;
    uint32_t unfinished;
    tdm_request_info info[3];
} snap;

/* Requests 1 (running, one output) and 2 (waiting: max_num_seqs 1). */
static tdm_sched *fixture(void)
{
    const int64_t kv[] = { TDM_SCHED_MAX_NUM_SEQS, 1, 0 };
    tdm_sched *s = tsd_newp(kv);
    assert_int_equal(tsd_add(s, 1, 20, 50), TDM_OK);
    assert_int_equal(tsd_add(s, 2, 20, 50), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    tsd_update(s, &b, 7, 1.1, NULL);
    return s;
}

static void take(const tdm_sched *s, snap *p)
{
    memset(p, 0, sizeof(*p));
    p->config = tsd_config(s);
    tsd_stats(s, &p->st);
    p->unfinished = tsd_unfinished(s);
    for (uint64_t id = 1; id <= 2; id++) {
        tdm_request_info_init(&p->info[id]);
        if (tdm_sched_request_info(s, id, &p->info[id]) != TDM_OK) p->info[id].state = 999;
    }
}

static void same(const tdm_sched *s, snap *p, const char *what)
{
    snap q;
    take(s, &q);
    if (strcmp(p->config, q.config)) fail_msg("%s changed the configuration", what);
    if (memcmp(&p->st, &q.st, sizeof(q.st))) fail_msg("%s changed the stats", what);
    if (p->unfinished != q.unfinished) fail_msg("%s changed the request count", what);
    if (memcmp(p->info, q.info, sizeof(q.info))) fail_msg("%s changed a request", what);
    free(q.config);
    tsd_check(s);
}

/* Assert an error status with a message, and no change. */
#define BAD(expr, want)                                                                    \
    do {                                                                                   \
        int rc_ = (expr);                                                                  \
        if (rc_ != (want)) fail_msg("%s -> %d (%s), expected %d", #expr, rc_,              \
                                    tdm_sched_errmsg(s), (want));                          \
        if (tdm_sched_errmsg(s)[0] == '\0') fail_msg("%s: no error message", #expr);      \
        same(s, &before, #expr);                                                           \
    } while (0)

/* Assert an error status for a call without a handle. */
#define BAD_NULL(expr)                                                                     \
    do {                                                                                   \
        int rc_ = (expr);                                                                  \
        if (rc_ != TDM_E_INVAL) fail_msg("%s -> %d, expected TDM_E_INVAL", #expr, rc_);    \
        same(s, &before, #expr);                                                           \
    } while (0)

static void init_functions__reject_null(void **state)
{
    (void)state;
    assert_int_equal(tdm_request_desc_init(NULL), TDM_E_INVAL);
    assert_int_equal(tdm_batch_init(NULL), TDM_E_INVAL);
    assert_int_equal(tdm_step_output_init(NULL), TDM_E_INVAL);
    assert_int_equal(tdm_update_result_init(NULL), TDM_E_INVAL);
    assert_int_equal(tdm_request_info_init(NULL), TDM_E_INVAL);
    assert_int_equal(tdm_sched_stats_init(NULL), TDM_E_INVAL);
    assert_int_equal(tdm_sched_create(NULL), TDM_E_INVAL);
    assert_non_null(tdm_sched_errmsg(NULL));
    tdm_sched_destroy(NULL);
}

static void add__bad_descriptors_rejected(void **state)
{
    (void)state;
    tdm_sched *s = fixture();
    snap before;
    take(s, &before);
    tdm_token p[20];
    tsd_prompt(9, 20, p);
    tdm_request_desc d, good;
    tdm_request_desc_init(&good);
    good.id = 9;
    good.prompt = p;
    good.num_prompt_tokens = 20;
    good.max_tokens = 4;
    BAD_NULL(tdm_sched_add(NULL, &good));
    BAD(tdm_sched_add(s, NULL), TDM_E_INVAL);
    d = good; d.struct_size = 0;
    BAD(tdm_sched_add(s, &d), TDM_E_INVAL);
    d = good; d.prompt = NULL;
    BAD(tdm_sched_add(s, &d), TDM_E_INVAL);
    d = good; d.num_prompt_tokens = 0;
    BAD(tdm_sched_add(s, &d), TDM_E_INVAL);
    d = good; d.max_tokens = 0;
    BAD(tdm_sched_add(s, &d), TDM_E_INVAL);
    d = good; d.stop_token_ids = NULL; d.num_stop_token_ids = 2;
    BAD(tdm_sched_add(s, &d), TDM_E_INVAL);
    d = good; d.cache_salt = NULL; d.cache_salt_len = 4;
    BAD(tdm_sched_add(s, &d), TDM_E_INVAL);
    d = good; d.flags = TDM_REQ_REMOTE_PREFILL; d.num_remote_tokens = 21;
    BAD(tdm_sched_add(s, &d), TDM_E_INVAL);
    d = good; d.min_tokens = 5; /* > max_tokens 4 */
    BAD(tdm_sched_add(s, &d), TDM_E_INVAL);
    tsd_assert_msg_has(s, "min_tokens 5 > max_tokens 4");
    d = good; d.arrival_time = -1e308;
    BAD(tdm_sched_add(s, &d), TDM_E_INVAL);
    tsd_assert_msg_has(s, "arrival_time");
    d = good; d.arrival_time = NAN;
    BAD(tdm_sched_add(s, &d), TDM_E_INVAL);
    d = good; d.id = 1;
    BAD(tdm_sched_add(s, &d), TDM_E_EXISTS);
    d = good; d.id = 2;
    BAD(tdm_sched_add(s, &d), TDM_E_EXISTS);
    tdm_token *big = calloc(8192, sizeof(*big));
    d = good; d.prompt = big; d.num_prompt_tokens = 8192; /* > max_model_len - 1 */
    BAD(tdm_sched_add(s, &d), TDM_E_RANGE);
    free(big);
    free(before.config);
    tdm_sched_abort(s, 1);
    tdm_sched_abort(s, 2);
    tdm_batch b;
    tsd_step(s, 2.0, &b);
    tsd_done(s);

    /* a prompt needing more blocks than the pool has */
    const int64_t kv[] = { TDM_SCHED_NUM_BLOCKS, 4, 0 };
    s = tsd_newp(kv);
    take(s, &before);
    tdm_token q[60];
    tsd_prompt(3, 60, q);
    d = good; d.prompt = q; d.num_prompt_tokens = 60;
    BAD(tdm_sched_add(s, &d), TDM_E_RANGE);
    d.num_prompt_tokens = 40;
    assert_int_equal(tdm_sched_add(s, &d), TDM_OK);
    free(before.config);
    tsd_run(s, 20, NULL);
    tsd_done(s);
}

static void request_calls__bad_ids_and_states_rejected(void **state)
{
    (void)state;
    tdm_sched *s = fixture();
    snap before;
    take(s, &before);
    BAD_NULL(tdm_sched_abort(NULL, 1));
    BAD(tdm_sched_abort(s, 999), TDM_E_NOT_FOUND);
    BAD_NULL(tdm_sched_finish(NULL, 1, TDM_FINISH_STOP));
    BAD(tdm_sched_finish(s, 999, TDM_FINISH_STOP), TDM_E_NOT_FOUND);
    BAD(tdm_sched_finish(s, 1, TDM_FINISH_NONE), TDM_E_INVAL);
    BAD(tdm_sched_finish(s, 1, (tdm_finish_reason)99), TDM_E_INVAL);
    const tdm_token dr[2] = { 1, 2 };
    BAD_NULL(tdm_sched_set_draft_tokens(NULL, 1, dr, 1));
    BAD(tdm_sched_set_draft_tokens(s, 999, dr, 1), TDM_E_NOT_FOUND);
    BAD(tdm_sched_set_draft_tokens(s, 2, dr, 0), TDM_E_STATE);   /* waiting */
    BAD(tdm_sched_set_draft_tokens(s, 1, NULL, 1), TDM_E_INVAL);
    BAD(tdm_sched_set_draft_tokens(s, 1, dr, 1), TDM_E_RANGE);   /* lookahead is 0 */
    BAD_NULL(tdm_sched_remote_kv_done(NULL, 1, 1, 0));
    BAD(tdm_sched_remote_kv_done(s, 999, 1, 0), TDM_E_NOT_FOUND);
    BAD(tdm_sched_remote_kv_done(s, 1, 1, 0), TDM_E_STATE);
    BAD_NULL(tdm_sched_release(NULL, 1));
    BAD(tdm_sched_release(s, 999), TDM_E_NOT_FOUND);
    BAD(tdm_sched_release(s, 1), TDM_E_STATE);
    BAD_NULL(tdm_sched_reset_prefix_cache(NULL, 0));
    BAD(tdm_sched_reset_prefix_cache(s, 0), TDM_E_STATE);

    /* queries: untouched out-parameters */
    tdm_request_info info, info0;
    tdm_request_info_init(&info);
    info.num_blocks = 4242;
    info0 = info;
    BAD_NULL(tdm_sched_request_info(NULL, 1, &info));
    BAD(tdm_sched_request_info(s, 1, NULL), TDM_E_INVAL);
    BAD(tdm_sched_request_info(s, 999, &info), TDM_E_NOT_FOUND);
    info.struct_size = 0;
    info0.struct_size = 0;
    BAD(tdm_sched_request_info(s, 1, &info), TDM_E_INVAL);
    assert_memory_equal(&info, &info0, sizeof(info));
    const uint32_t *blk = (const uint32_t *)&info;
    uint32_t n = 4343;
    BAD_NULL(tdm_sched_request_blocks(NULL, 1, &blk, &n));
    BAD(tdm_sched_request_blocks(s, 1, NULL, &n), TDM_E_INVAL);
    BAD(tdm_sched_request_blocks(s, 1, &blk, NULL), TDM_E_INVAL);
    BAD(tdm_sched_request_blocks(s, 999, &blk, &n), TDM_E_NOT_FOUND);
    assert_ptr_equal(blk, (const uint32_t *)&info);
    assert_int_equal(n, 4343);
    const tdm_token *tok = (const tdm_token *)&info;
    BAD_NULL(tdm_sched_request_tokens(NULL, 1, &tok, &n));
    BAD(tdm_sched_request_tokens(s, 1, NULL, &n), TDM_E_INVAL);
    BAD(tdm_sched_request_tokens(s, 1, &tok, NULL), TDM_E_INVAL);
    BAD(tdm_sched_request_tokens(s, 999, &tok, &n), TDM_E_NOT_FOUND);
    assert_ptr_equal(tok, (const tdm_token *)&info);
    assert_int_equal(n, 4343);
    tdm_sched_stats st;
    tdm_sched_stats_init(&st);
    BAD_NULL(tdm_sched_get_stats(NULL, &st));
    BAD(tdm_sched_get_stats(s, NULL), TDM_E_INVAL);
    st.struct_size = 0;
    BAD(tdm_sched_get_stats(s, &st), TDM_E_INVAL);
    BAD_NULL(tdm_sched_num_unfinished(NULL, &n));
    BAD(tdm_sched_num_unfinished(s, NULL), TDM_E_INVAL);
    assert_int_equal(n, 4343);

    /* policy and cost model */
    tdm_cost_model cm = { 99, NULL, NULL };
    BAD_NULL(tdm_sched_set_cost_model(NULL, &cm));
    BAD(tdm_sched_set_cost_model(s, &cm), TDM_E_VERSION);
    cm.version = TDM_COST_MODEL_VERSION;
    BAD(tdm_sched_set_cost_model(s, &cm), TDM_E_INVAL);
    BAD(tdm_sched_set_policy(s, NULL), TDM_E_INVAL);
    BAD(tdm_sched_load_policy(s, NULL, NULL), TDM_E_INVAL);
    BAD(tdm_sched_load_policy(s, "/nonexistent/p.so", NULL), TDM_E_STATE); /* 2 is waiting */
    free(before.config);

    assert_int_equal(tdm_sched_finish(s, 1, TDM_FINISH_STOP), TDM_OK);
    assert_int_equal(tdm_sched_abort(s, 2), TDM_OK);
    /* finishing an already finished request again changes nothing (refused or a no-op) */
    tdm_sched_stats st1, st2;
    tsd_stats(s, &st1);
    int rc1 = tdm_sched_abort(s, 1), rc2 = tdm_sched_finish(s, 2, TDM_FINISH_STOP);
    assert_true(rc1 == TDM_OK || rc1 == TDM_E_NOT_FOUND || rc1 == TDM_E_STATE);
    assert_true(rc2 == TDM_OK || rc2 == TDM_E_NOT_FOUND || rc2 == TDM_E_STATE);
    tsd_stats(s, &st2);
    assert_memory_equal(&st1, &st2, sizeof(st1));
    tdm_request_info fi;
    tsd_info(s, 1, &fi);
    assert_int_equal(fi.finish_reason, TDM_FINISH_STOP);
    tdm_batch b;
    tsd_step(s, 2.0, &b);
    assert_int_equal(b.num_finished, 2);
    tsd_done(s);
}

static void step_update__malformed_arguments_apply_nothing(void **state)
{
    (void)state;
    tdm_sched *s = fixture();
    tdm_batch b;
    tsd_step(s, 2.0, &b); /* request 1 decodes */
    assert_int_equal(b.num_reqs, 1);
    snap before;
    take(s, &before);
    tdm_batch bb;
    tdm_batch_init(&bb);
    BAD_NULL(tdm_sched_step(NULL, 3.0, &bb));
    BAD(tdm_sched_step(s, 3.0, NULL), TDM_E_INVAL);
    bb.struct_size = 0;
    BAD(tdm_sched_step(s, 3.0, &bb), TDM_E_INVAL);

    uint64_t ids[2] = { 1, 2 };
    uint32_t offs[3] = { 0, 1, 1 };
    tdm_token toks[4] = { 5, 6, 7, 8 };
    tdm_step_output o, good;
    tdm_step_output_init(&good);
    good.num_reqs = 1;
    good.req_ids = ids;
    good.token_offsets = offs;
    good.tokens = toks;
    good.now = 2.1;
    BAD_NULL(tdm_sched_update(NULL, &good, NULL));
    BAD(tdm_sched_update(s, NULL, NULL), TDM_E_INVAL);
    o = good; o.struct_size = 0;
    BAD(tdm_sched_update(s, &o, NULL), TDM_E_INVAL);
    o = good; o.req_ids = NULL;
    BAD(tdm_sched_update(s, &o, NULL), TDM_E_INVAL);
    o = good; o.token_offsets = NULL;
    BAD(tdm_sched_update(s, &o, NULL), TDM_E_INVAL);
    o = good; o.tokens = NULL;
    BAD(tdm_sched_update(s, &o, NULL), TDM_E_INVAL);
    uint32_t dec[3] = { 0, 2, 1 }; /* decreasing offsets; the first entry is valid */
    o = good; o.num_reqs = 2; o.token_offsets = dec;
    BAD(tdm_sched_update(s, &o, NULL), TDM_E_INVAL);
    uint32_t nz[2] = { 1, 2 }; /* offsets not starting at 0 */
    o = good; o.token_offsets = nz;
    BAD(tdm_sched_update(s, &o, NULL), TDM_E_INVAL);
    /* now negative or not finite, for step and update */
    tdm_batch_init(&bb);
    BAD(tdm_sched_step(s, -1e308, &bb), TDM_E_INVAL);
    BAD(tdm_sched_step(s, -0.5, &bb), TDM_E_INVAL);
    o = good; o.now = -1e308;
    BAD(tdm_sched_update(s, &o, NULL), TDM_E_INVAL);
    /* an unknown id (777) or one not scheduled in the step (2 is waiting) in a well-formed
     * output: refused with TDM_E_STATE naming the request, and nothing applied (not even
     * request 1's token, listed first) */
    uint64_t ids2[2] = { 1, 777 };
    uint32_t offs2[3] = { 0, 1, 2 };
    o = good; o.num_reqs = 2; o.req_ids = ids2; o.token_offsets = offs2;
    BAD(tdm_sched_update(s, &o, NULL), TDM_E_STATE);
    tsd_assert_msg_has(s, "request 777 is unknown");
    ids2[1] = 2;
    BAD(tdm_sched_update(s, &o, NULL), TDM_E_STATE);
    tsd_assert_msg_has(s, "request 2 has no scheduled step");
    free(before.config);

    tdm_update_result r;
    tdm_update_result_init(&r);
    assert_int_equal(tdm_sched_update(s, &good, &r), TDM_OK);
    tdm_request_info i;
    tsd_info(s, 1, &i);
    assert_int_equal(i.num_output_tokens, 2);
    /* the same update again (a host retrying): refused, no second token */
    take(s, &before);
    BAD(tdm_sched_update(s, &good, &r), TDM_E_STATE);
    tsd_assert_msg_has(s, "request 1 has no scheduled step awaiting its output");
    free(before.config);
    double now = 3.0;
    tsd_run(s, 200, &now);
    tsd_done(s);
}

static uint64_t xs64(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Seeded garbage step outputs (unknown and duplicate ids, non-monotonic or out-of-range
 * offsets, negative tokens, too many tokens) between valid steps: each update either applies
 * (TDM_OK) or is refused with TDM_E_INVAL or TDM_E_STATE and changes nothing; the scheduler
 * stays consistent and the scenario still runs to completion. */
static void update__random_malformed_outputs_never_corrupt(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_NUM_LOOKAHEAD_TOKENS, 2, TDM_SCHED_NUM_BLOCKS, 200, 0 };
    tdm_sched *s = tsd_newp(kv);
    static uint64_t rs;
    const char *seed = getenv("TANDEM_SCHED_GARBAGE_SEED"); /* reproduce or explore other seeds */
    rs = seed && *seed ? strtoull(seed, NULL, 0) : 0x5eed;
    if (!rs) rs = 1;
#define RND() xs64(&rs)
    for (uint64_t id = 1; id <= 12; id++) assert_int_equal(tsd_add(s, id, 10 + (uint32_t)(id * 7 % 40), 30), TDM_OK);
    int refused = 0;
    double now = 1.0;
    for (int it = 0; it < 1500; it++) {
        tdm_batch b;
        now += 0.01;
        tsd_step(s, now, &b);
        /* a garbage output first */
        uint64_t ids[8];
        uint32_t offs[9];
        tdm_token toks[40];
        uint32_t n = (uint32_t)(RND() % 8);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t r = RND() % 4;
            ids[i] = r == 0 && b.num_reqs ? b.req_ids[RND() % b.num_reqs] : r == 1 ? 1 + RND() % 14 : RND();
        }
        uint32_t acc = 0;
        for (uint32_t i = 0; i <= n; i++) {
            /* garbage shape, but inside the caller's 40-token array: the API has no length */
            offs[i] = RND() % 5 == 0 ? (uint32_t)(RND() % 41) : acc;
            acc += (uint32_t)(RND() % 5);
            if (acc > 40) acc = 40;
        }
        for (int k = 0; k < 40; k++) {
            uint64_t r = RND(), v = RND();
            toks[k] = r % 9 == 0 ? -(tdm_token)(v % 5 + 1) : (tdm_token)(v % 100);
        }
        tdm_step_output o;
        tdm_step_output_init(&o);
        o.num_reqs = n;
        o.req_ids = ids;
        o.token_offsets = offs;
        o.tokens = toks;
        o.now = now + 0.001;
        tdm_sched_stats before, after;
        tsd_stats(s, &before);
        int rc = tdm_sched_update(s, &o, NULL);
        assert_true(rc == TDM_OK || rc == TDM_E_INVAL || rc == TDM_E_STATE);
        tsd_check(s);
        if (rc != TDM_OK) {
            refused++;
            tsd_stats(s, &after);
            assert_memory_equal(&before, &after, sizeof(before));
            tsd_update(s, &b, 7, now + 0.002, NULL); /* then the real output */
        }
        /* occasionally drafts and new requests keep it busy */
        if (b.num_reqs && RND() % 3 == 0) {
            uint64_t id = b.req_ids[RND() % b.num_reqs];
            tdm_request_info i;
            tdm_request_info_init(&i);
            if (tdm_sched_request_info(s, id, &i) == TDM_OK && i.state == TDM_STATE_RUNNING) {
                const tdm_token dr[2] = { 5, 6 };
                /* refused while the request's step is in flight (its token is not known yet) */
                int drc = tdm_sched_set_draft_tokens(s, id, dr, (uint32_t)(RND() % 3));
                assert_true(drc == TDM_OK || drc == TDM_E_STATE);
            }
        }
        if (tsd_unfinished(s) < 6) {
            static uint64_t next = 100;
            assert_int_equal(tsd_add(s, next++, 5 + (uint32_t)(RND() % 60), 1 + (uint32_t)(RND() % 30)), TDM_OK);
        }
    }
#undef RND
    print_message("%d malformed outputs refused\n", refused);
    assert_true(refused > 100);
    for (uint64_t id = 1; id < 100000; id++) {
        tdm_request_info i;
        tdm_request_info_init(&i);
        if (tdm_sched_request_info(s, id, &i) == TDM_OK && i.state != TDM_STATE_FINISHED)
            assert_int_equal(tdm_sched_abort(s, id), TDM_OK);
    }
    tdm_batch b;
    tsd_step(s, now + 1.0, &b);
    tsd_done(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(init_functions__reject_null),
        TSD_TEST(add__bad_descriptors_rejected),
        TSD_TEST(request_calls__bad_ids_and_states_rejected),
        TSD_TEST(step_update__malformed_arguments_apply_nothing),
        TSD_TEST(update__random_malformed_outputs_never_corrupt),
    };
    return cmocka_run_group_tests_name("sched_badinput", tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_badinput")
#endif
