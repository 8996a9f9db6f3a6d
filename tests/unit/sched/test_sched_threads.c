/*
 * test_sched_threads.c -- distinct scheduler handles are independent (header: "distinct
 * handles may be used from distinct threads concurrently"): the same deterministic workload
 * (shared prompt prefixes, chunked prefills, preemptions, drafts) is run once alone, then on
 * four threads at once; every run must produce exactly the same sequence of batches (a digest
 * of ids, token counts, kinds and block ids) and the same final statistics. Hidden global
 * state (a static buffer, a shared counter) would make them differ. Also: the step counters,
 * scheduled-token and finished counters in the stats match what the batches said.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

typedef struct run_result {
    uint64_t digest;
    uint64_t steps, tokens, finished, preemptions;
    int error;             /* nonzero: the run failed (no cmocka from threads) */
    char what[160];
} run_result;

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdULL;
}

#define RUN_CHECK(cond, msg)                                           \
    do {                                                               \
        if (!(cond)) {                                                 \
            res->error = 1;                                            \
            strncpy(res->what, msg, sizeof(res->what) - 1);            \
            goto out;                                                  \
        }                                                              \
    } while (0)

/* The workload; no cmocka calls (it runs on other threads). */
static void run_workload(run_result *res)
{
    memset(res, 0, sizeof(*res));
    tdm_sched *s = NULL;
    if (tdm_sched_create(&s) != TDM_OK) {
        res->error = 1;
        strcpy(res->what, "create");
        return;
    }
    static const uint64_t ids_cap = 64;
    uint64_t ids[64 + 1];
    uint32_t offs[64 + 2];
    tdm_token toks[64 * 3 + 1];
    uint32_t plen[200] = { 0 }, olen[200] = { 0 };
    RUN_CHECK(tdm_sched_configure(s, "{\"num_blocks\": 120, \"block_size\": 8, \"max_num_seqs\": 24,"
                                     " \"max_num_batched_tokens\": 256, \"long_prefill_token_threshold\": 64,"
                                     " \"num_lookahead_tokens\": 2}") == TDM_OK, "configure");
    uint64_t rs = 42;
#define RND() (rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17, rs)
    uint32_t next = 0;
    double now = 0;
    for (int cycle = 0; cycle < 600; cycle++) {
        if (next < 200 && RND() % 3 == 0) {
            tdm_token p[160];
            uint32_t n = 8 + (uint32_t)(RND() % 150), fam = (uint32_t)(RND() % 3);
            for (uint32_t i = 0; i < n; i++) p[i] = i < 48 ? (tdm_token)(100 + fam * 100 + i) : (tdm_token)(1000 + RND() % 9000);
            tdm_request_desc d;
            tsd_desc(&d, next, p, n, 4 + (uint32_t)(RND() % 40));
            d.arrival_time = now;
            RUN_CHECK(tdm_sched_add(s, &d) == TDM_OK, "add");
            plen[next++] = n;
        }
        tdm_batch b;
        tdm_batch_init(&b);
        now += 0.01;
        RUN_CHECK(tdm_sched_step(s, now, &b) == TDM_OK, "step");
        RUN_CHECK(b.num_reqs <= ids_cap, "too many entries");
        res->steps++;
        res->tokens += b.total_tokens;
        res->digest = mix(res->digest, b.num_reqs);
        uint32_t nt = 0;
        for (uint32_t i = 0; i < b.num_reqs; i++) {
            uint64_t id = b.req_ids[i];
            res->digest = mix(mix(mix(res->digest, id), b.num_tokens[i]), b.kinds[i]);
            for (uint32_t k = b.block_offsets[i]; k < b.block_offsets[i + 1]; k++) res->digest = mix(res->digest, b.blocks[k]);
            ids[i] = id;
            offs[i] = nt;
            if ((uint64_t)b.num_computed[i] + b.num_tokens[i] - b.num_spec[i] >= (uint64_t)plen[id] + olen[id]) {
                uint32_t k = 1 + b.num_spec[i];
                for (uint32_t j = 0; j < k; j++) toks[nt++] = (tdm_token)(10 + (RND() % 50));
            }
        }
        for (uint32_t i = 0; i < b.num_preempted; i++) res->digest = mix(res->digest, 1000000 + b.preempted_ids[i]);
        offs[b.num_reqs] = nt;
        tdm_step_output o;
        tdm_step_output_init(&o);
        o.num_reqs = b.num_reqs;
        o.req_ids = ids;
        o.token_offsets = offs;
        o.tokens = toks;
        o.now = now + 0.005;
        tdm_update_result r;
        tdm_update_result_init(&r);
        RUN_CHECK(tdm_sched_update(s, &o, &r) == TDM_OK, "update");
        for (uint32_t i = 0; i < r.num_reqs; i++) {
            olen[r.req_ids[i]] += r.num_new_tokens[i];
            res->finished += r.finish_reasons[i] != TDM_FINISH_NONE;
        }
        /* drafts for every other running request */
        for (uint32_t i = 0; i < b.num_reqs; i++) {
            tdm_request_info info;
            tdm_request_info_init(&info);
            if (tdm_sched_request_info(s, ids[i], &info) != TDM_OK || info.state != TDM_STATE_RUNNING) continue;
            if (ids[i] % 2) {
                const tdm_token dr[2] = { 11, 12 };
                RUN_CHECK(tdm_sched_set_draft_tokens(s, ids[i], dr, 2) == TDM_OK, "drafts");
            }
        }
    }
    tdm_sched_stats st;
    tdm_sched_stats_init(&st);
    RUN_CHECK(tdm_sched_get_stats(s, &st) == TDM_OK, "stats");
    RUN_CHECK(st.steps == res->steps, "stats.steps differs from the number of steps");
    RUN_CHECK(st.scheduled_tokens == res->tokens, "stats.scheduled_tokens differs from the batches' sum");
    RUN_CHECK(st.finished == res->finished, "stats.finished differs from the updates' finishes");
    res->preemptions = st.preemptions;
    res->digest = mix(res->digest, st.prefix_hits);
    res->digest = mix(res->digest, st.evictions);
out:
    tdm_sched_destroy(s);
#undef RND
}

static void *thread_main(void *arg)
{
    run_workload(arg);
    return NULL;
}

static void sched__handles_independent_across_threads(void **state)
{
    (void)state;
    run_result ref;
    run_workload(&ref);
    if (ref.error) fail_msg("reference run: %s", ref.what);
    assert_true(ref.finished > 20);
    assert_true(ref.preemptions > 0);
    enum { NT = 4 };
    pthread_t th[NT];
    run_result rr[NT];
    for (int i = 0; i < NT; i++) assert_int_equal(pthread_create(&th[i], NULL, thread_main, &rr[i]), 0);
    for (int i = 0; i < NT; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < NT; i++) {
        if (rr[i].error) fail_msg("thread %d: %s", i, rr[i].what);
        if (rr[i].digest != ref.digest || rr[i].steps != ref.steps || rr[i].finished != ref.finished)
            fail_msg("thread %d produced different batches (digest %llx vs %llx)", i,
                     (unsigned long long)rr[i].digest, (unsigned long long)ref.digest);
    }
    print_message("%llu steps, %llu finished, %llu preemptions, identical on %d threads\n",
                  (unsigned long long)ref.steps, (unsigned long long)ref.finished,
                  (unsigned long long)ref.preemptions, NT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(sched__handles_independent_across_threads),
    };
    return cmocka_run_group_tests_name("sched_threads", tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_threads")
#endif
