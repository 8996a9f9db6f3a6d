/*
 * test_sched_admission.c -- the admission rules vLLM 0.34 added, as the vLLM adapter sets
 * them: the per-request prefix-hit limit (tdm_request_desc.prefix_hit_limit with
 * TDM_REQ_PREFIX_HIT_LIMIT: hits bounded to whole blocks within N tokens, 0 = no reads, the
 * TANDEM_1.1 layout without it), the long-prefill threshold applied only with chunked prefill
 * (TDM_SCHED_LONG_PREFILL_NEEDS_CHUNKING) and cache-aware admission (TDM_SCHED_CACHE_AWARE_*:
 * the head of the FCFS waiting queue reordered by cached-prefix depth once the KV usage
 * reaches the threshold; only merely-waiting requests move). Every scenario ends clean.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

/* Run request 1 (prompt p[0..n)) to completion so that its full blocks are cached. */
static void cache_prompt(tdm_sched *s, uint64_t id, const tdm_token *p, uint32_t n, double *now)
{
    assert_int_equal(tsd_add_tokens(s, id, p, n, 1), TDM_OK);
    tsd_run(s, 50, now);
}

/* Add request `id` with prompt p[0..n) and the given hit limit (flagged); returns its status. */
static int add_limited(tdm_sched *s, uint64_t id, const tdm_token *p, uint32_t n, uint32_t limit)
{
    tdm_request_desc d;
    assert_int_equal(tsd_desc(&d, id, p, n, 1), TDM_OK);
    d.flags |= TDM_REQ_PREFIX_HIT_LIMIT;
    d.prefix_hit_limit = limit;
    return tdm_sched_add(s, &d);
}

/* The prefix hit of the next admission of `id` (it must be admitted in this step). */
static uint32_t admitted_hit(tdm_sched *s, uint64_t id, double now)
{
    tdm_batch b;
    tsd_step(s, now, &b);
    int k = tsd_find(&b, id);
    if (k < 0) fail_msg("request %llu was not admitted", (unsigned long long)id);
    uint32_t hit = b.num_computed[k];
    tsd_update(s, &b, 7, now + 0.001, NULL);
    return hit;
}

static void hit_limit__bounds_hits_to_whole_blocks(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new("{\"block_size\": 16, \"num_blocks\": 64}");
    tdm_token p[80];
    tsd_prompt(1, 80, p);
    double now = 1.0;
    cache_prompt(s, 1, p, 64, &now);
    /* 70 tokens, 64 of them cached (4 blocks): unlimited -> 64, limit 40 -> 32, limit 16 ->
     * 16, limit 15 -> 0, limit 0 -> 0 (no lookup), a limit past the prompt -> 64. */
    static const uint32_t limits[] = { 40, 16, 15, 0, 1000 };
    static const uint32_t hits[] = { 32, 16, 0, 0, 64 };
    for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
        assert_int_equal(add_limited(s, 10 + i, p, 70, limits[i]), TDM_OK);
        assert_int_equal(admitted_hit(s, 10 + i, now), hits[i]);
        tsd_run(s, 50, &now);
    }
    assert_int_equal(tsd_add_tokens(s, 20, p, 70, 1), TDM_OK);
    assert_int_equal(admitted_hit(s, 20, now), 64);
    tsd_run(s, 50, &now);
    tsd_done(s);
}

static void hit_limit__without_flag_is_rejected(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    tdm_token p[8];
    tsd_prompt(1, 8, p);
    tdm_request_desc d;
    assert_int_equal(tsd_desc(&d, 1, p, 8, 1), TDM_OK);
    d.prefix_hit_limit = 4;
    assert_int_equal(tdm_sched_add(s, &d), TDM_E_INVAL);
    tsd_assert_msg_has(s, "TDM_REQ_PREFIX_HIT_LIMIT");
    assert_int_equal(tsd_unfinished(s), 0);
    tsd_done(s);
}

/* A caller of the TANDEM_1.1 layout (struct_size stops before prefix_hit_limit) is accepted
 * and its flag, if set, reads a limit of 0. */
static void hit_limit__short_struct_reads_no_limit(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new("{\"block_size\": 16, \"num_blocks\": 64}");
    tdm_token p[48];
    tsd_prompt(1, 48, p);
    double now = 1.0;
    cache_prompt(s, 1, p, 48, &now);
    tdm_request_desc d;
    assert_int_equal(tsd_desc(&d, 2, p, 48, 1), TDM_OK);
    d.struct_size = (uint32_t)offsetof(tdm_request_desc, prefix_hit_limit);
    d.prefix_hit_limit = 1000; /* past the caller's struct: never read */
    assert_int_equal(tdm_sched_add(s, &d), TDM_OK);
    assert_int_equal(admitted_hit(s, 2, now), 32);
    tsd_run(s, 50, &now);
    tsd_done(s);
}

/* Two waiting 100-token prompts, threshold 16, chunked prefill off: the first chunk of the
 * first request, by the rule of the parameter. */
static uint32_t first_chunk(int needs_chunking)
{
    char json[256];
    snprintf(json, sizeof(json),
             "{\"enable_chunked_prefill\": false, \"long_prefill_token_threshold\": 16,"
             " \"long_prefill_needs_chunking\": %s, \"max_num_batched_tokens\": 512,"
             " \"max_model_len\": 512}",
             needs_chunking ? "true" : "false");
    tdm_sched *s = tsd_new(json);
    assert_int_equal(tsd_add(s, 1, 100, 2), TDM_OK);
    assert_int_equal(tsd_add(s, 2, 100, 2), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    int k = tsd_find(&b, 1);
    assert_true(k >= 0);
    uint32_t n = b.num_tokens[k];
    tsd_update(s, &b, 7, 1.01, NULL);
    tsd_run(s, 100, NULL);
    tsd_done(s);
    return n;
}

static void threshold__ignored_without_chunked_prefill(void **state)
{
    (void)state;
    assert_int_equal(first_chunk(1), 100); /* vLLM 0.34: the whole prompt */
    assert_int_equal(first_chunk(0), 16);  /* vLLM 0.33: capped even without chunking */
}

/* Cache-aware admission. Request 1 caches a 64-token prefix; then X (nothing cached), Y (48
 * cached tokens) and Z (32) wait, in that order, with one admission per step. Returns the
 * admission order as a string of 'X', 'Y', 'Z'. */
static void admission_order(const char *extra, char out[4])
{
    char json[384];
    snprintf(json, sizeof(json),
             "{\"block_size\": 16, \"num_blocks\": 64, \"max_num_seqs\": 1%s%s}",
             extra[0] ? ", " : "", extra);
    tdm_sched *s = tsd_new(json);
    tdm_token p[64], x[60], y[60], z[60];
    tsd_prompt(1, 64, p);
    tsd_prompt(2, 60, x);
    memcpy(y, p, 48 * sizeof(*p));
    tsd_prompt(3, 12, y + 48);
    memcpy(z, p, 32 * sizeof(*p));
    tsd_prompt(4, 28, z + 32);
    double now = 1.0;
    cache_prompt(s, 1, p, 64, &now);
    assert_int_equal(tsd_add_tokens(s, 'X', x, 60, 1), TDM_OK);
    assert_int_equal(tsd_add_tokens(s, 'Y', y, 60, 1), TDM_OK);
    assert_int_equal(tsd_add_tokens(s, 'Z', z, 60, 1), TDM_OK);
    int got = 0;
    for (int step = 0; step < 20 && got < 3; step++) {
        tdm_batch b;
        tsd_step(s, now, &b);
        for (uint32_t i = 0; i < b.num_reqs; i++)
            if (b.kinds[i] == TDM_ENTRY_NEW) out[got++] = (char)b.req_ids[i];
        tsd_update(s, &b, 7, now + 0.001, NULL);
        now += 0.01;
    }
    out[got] = 0;
    tsd_run(s, 50, &now);
    tsd_done(s);
}

static void cache_aware__deepest_cached_prefix_first(void **state)
{
    (void)state;
    char o[4];
    admission_order("", o); /* off: arrival order */
    assert_string_equal(o, "XYZ");
    admission_order("\"cache_aware_window\": 8, \"cache_aware_threshold\": 0", o);
    assert_string_equal(o, "YZX");
    /* a window of 2 sees X and Y only, then X and Z */
    admission_order("\"cache_aware_window\": 2, \"cache_aware_threshold\": 0", o);
    assert_string_equal(o, "YZX");
}

static void cache_aware__not_below_threshold_nor_with_priority(void **state)
{
    (void)state;
    char o[4];
    /* 64 blocks, a few in use: far below a 0.9 usage */
    admission_order("\"cache_aware_window\": 8, \"cache_aware_threshold\": 0.9", o);
    assert_string_equal(o, "XYZ");
    admission_order("\"cache_aware_window\": 8, \"cache_aware_threshold\": 0, \"policy\": \"priority\"", o);
    assert_string_equal(o, "XYZ");
    admission_order("\"cache_aware_window\": 8, \"cache_aware_threshold\": 0, \"enable_prefix_caching\": false", o);
    assert_string_equal(o, "XYZ");
}

/* A preempted request keeps its place at the head: only merely-waiting requests move. */
static void cache_aware__preempted_request_keeps_its_place(void **state)
{
    (void)state;
    /* 10 usable blocks of 16: A (cached 64-token prefix) then two long runners collide. */
    tdm_sched *s = tsd_new("{\"block_size\": 16, \"num_blocks\": 11, \"max_num_seqs\": 2,"
                           " \"cache_aware_window\": 8, \"cache_aware_threshold\": 0}");
    assert_int_equal(tsd_add(s, 1, 60, 40), TDM_OK);
    assert_int_equal(tsd_add(s, 2, 60, 40), TDM_OK);
    double now = 1.0;
    uint64_t preempted = 0;
    for (int step = 0; step < 200 && !preempted; step++) {
        tdm_batch b;
        tsd_step(s, now, &b);
        if (b.num_preempted) preempted = b.preempted_ids[0];
        tsd_update(s, &b, 7, now + 0.001, NULL);
        now += 0.01;
    }
    assert_true(preempted != 0);
    /* A newcomer whose prompt is all cached (the survivor's own prefix) would sort first if
     * the preempted request were movable. */
    uint64_t survivor = preempted == 1 ? 2 : 1;
    tdm_token p[32];
    tsd_prompt(survivor, 32, p);
    assert_int_equal(tsd_add_tokens(s, 9, p, 32, 1), TDM_OK);
    /* The next admission, whenever it comes, is the preempted request. */
    for (int step = 0; step < 400; step++) {
        tdm_batch b;
        tsd_step(s, now, &b);
        int found = -1;
        for (uint32_t i = 0; i < b.num_reqs && found < 0; i++)
            if (b.kinds[i] != TDM_ENTRY_CONTINUING) found = (int)i;
        if (found >= 0) {
            assert_int_equal(b.req_ids[found], preempted);
            assert_int_equal(b.kinds[found], TDM_ENTRY_RESUMED);
            tsd_update(s, &b, 7, now + 0.001, NULL);
            break;
        }
        tsd_update(s, &b, 7, now + 0.001, NULL);
        now += 0.01;
    }
    tsd_run(s, 400, &now);
    tsd_done(s);
}

/* A window wider than 64 requests (the reorder sorts them itself; glibc's qsort allocated
 * from 64 slots up): 100 waiting requests whose prompts share 0 to 3 blocks of a cached
 * 64-token prefix, the depths interleaved in arrival order, are admitted one per step
 * deepest first, arrival order among equals. */
static void cache_aware__wide_window_deepest_first_in_arrival_order(void **state)
{
    (void)state;
    enum { N = 100 };
    tdm_sched *s = tsd_new("{\"block_size\": 16, \"num_blocks\": 2048, \"max_num_seqs\": 1,"
                           " \"cache_aware_window\": 128, \"cache_aware_threshold\": 0}");
    tdm_token p[64], q[60];
    tsd_prompt(1, 64, p);
    double now = 1.0;
    cache_prompt(s, 1, p, 64, &now);
    for (uint32_t j = 0; j < N; j++) {
        uint32_t shared = 16 * ((j * 7) % 4); /* 0, 48, 32, 16, 0, ... tokens of p */
        memcpy(q, p, shared * sizeof(*p));
        tsd_prompt(1000 + j, 60 - shared, q + shared);
        assert_int_equal(tsd_add_tokens(s, 100 + j, q, 60, 1), TDM_OK);
    }
    uint64_t order[N];
    uint32_t got = 0;
    for (int step = 0; step < 20 * N && got < N; step++) {
        tdm_batch b;
        tsd_step(s, now, &b);
        for (uint32_t i = 0; i < b.num_reqs; i++)
            if (b.kinds[i] == TDM_ENTRY_NEW) order[got++] = b.req_ids[i];
        tsd_update(s, &b, 7, now + 0.001, NULL);
        now += 0.01;
    }
    assert_int_equal(got, N);
    uint32_t k = 0;
    for (uint32_t depth = 4; depth-- > 0;)
        for (uint32_t j = 0; j < N; j++)
            if ((j * 7) % 4 == depth) assert_int_equal(order[k++], 100 + j);
    tsd_run(s, 50, &now);
    tsd_done(s);
}

static void config__new_parameters_round_trip(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new("{\"cache_aware_window\": 32, \"cache_aware_threshold\": 1.0,"
                           " \"long_prefill_needs_chunking\": true}");
    int64_t v;
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_CACHE_AWARE_WINDOW, &v), TDM_OK);
    assert_int_equal(v, 32);
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_CACHE_AWARE_THRESHOLD_PPM, &v), TDM_OK);
    assert_int_equal(v, 1000000);
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_LONG_PREFILL_NEEDS_CHUNKING, &v), TDM_OK);
    assert_int_equal(v, 1);
    assert_int_equal(tdm_sched_configure(s, "{\"cache_aware_threshold\": 1.5}"), TDM_E_CONFIG);
    tsd_assert_msg_has(s, "cache_aware_threshold");
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_CACHE_AWARE_WINDOW, -1), TDM_E_CONFIG);
    char *cfg = tsd_config(s);
    assert_non_null(strstr(cfg, "\"cache_aware_window\""));
    assert_non_null(strstr(strstr(cfg, "\"cache_aware_window\""), "32"));
    free(cfg);
    tdm_sched *d = tsd_new(NULL);
    assert_int_equal(tdm_sched_get_param(d, TDM_SCHED_CACHE_AWARE_THRESHOLD_PPM, &v), TDM_OK);
    assert_int_equal(v, 500000); /* vLLM's default 0.5 */
    assert_int_equal(tdm_sched_get_param(d, TDM_SCHED_CACHE_AWARE_WINDOW, &v), TDM_OK);
    assert_int_equal(v, 0);
    tsd_done(d);
    tsd_done(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(hit_limit__bounds_hits_to_whole_blocks),
        TSD_TEST(hit_limit__without_flag_is_rejected),
        TSD_TEST(hit_limit__short_struct_reads_no_limit),
        TSD_TEST(threshold__ignored_without_chunked_prefill),
        TSD_TEST(cache_aware__deepest_cached_prefix_first),
        TSD_TEST(cache_aware__not_below_threshold_nor_with_priority),
        TSD_TEST(cache_aware__preempted_request_keeps_its_place),
        TSD_TEST(cache_aware__wide_window_deepest_first_in_arrival_order),
        TSD_TEST(config__new_parameters_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_admission")
#endif
