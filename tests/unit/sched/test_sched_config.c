/*
 * test_sched_config.c -- the scheduler's configuration: a JSON document with every key, its
 * round trip through tdm_sched_get_config, unknown keys and bad values rejected with a
 * message naming the key, all-or-nothing application, pool-shaping keys refused while
 * requests exist, the enum-keyed setters with out-of-range values, and allocation-failure
 * injection (tdm__alloc_fail_after) on create, configure, add, step and update.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

static int64_t getp(const tdm_sched *s, tdm_sched_param k)
{
    int64_t v = -12345;
    assert_int_equal(tdm_sched_get_param(s, k, &v), TDM_OK);
    return v;
}

static const char *every_key =
    "{\"max_num_batched_tokens\": 4096, \"max_num_seqs\": 64, \"max_model_len\": 4000,"
    " \"long_prefill_token_threshold\": 256, \"enable_chunked_prefill\": true,"
    " \"num_blocks\": 2000, \"block_size\": 32, \"enable_prefix_caching\": false,"
    " \"watermark\": 0.01, \"policy\": \"priority\", \"mode\": \"decode_first\","
    " \"tbt_target_ms\": 25, \"num_lookahead_tokens\": 2, \"role\": \"decode\","
    " \"remote_kv_failure\": \"fail\", \"remote_kv_timeout_ms\": 5000,"
    " \"delay_free_timeout_ms\": 60000, \"max_num_partial_prefills\": 2,"
    " \"cost_model\": {\"base_us\": 100, \"per_prefill_token_us\": 0.5, \"per_decode_req_us\": 2,"
    " \"per_context_token_ns\": 1, \"per_attn_token2_ps\": 3}}";

static void configure__every_key_applied_and_round_trips(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(every_key);
    assert_int_equal(getp(s, TDM_SCHED_MAX_NUM_BATCHED_TOKENS), 4096);
    assert_int_equal(getp(s, TDM_SCHED_MAX_NUM_SEQS), 64);
    assert_int_equal(getp(s, TDM_SCHED_MAX_MODEL_LEN), 4000);
    assert_int_equal(getp(s, TDM_SCHED_LONG_PREFILL_TOKEN_THRESHOLD), 256);
    assert_int_equal(getp(s, TDM_SCHED_ENABLE_CHUNKED_PREFILL), 1);
    assert_int_equal(getp(s, TDM_SCHED_NUM_BLOCKS), 2000);
    assert_int_equal(getp(s, TDM_SCHED_BLOCK_SIZE), 32);
    assert_int_equal(getp(s, TDM_SCHED_ENABLE_PREFIX_CACHING), 0);
    assert_int_equal(getp(s, TDM_SCHED_WATERMARK_PPM), 10000);
    assert_int_equal(getp(s, TDM_SCHED_POLICY), TDM_POLICY_PRIORITY);
    assert_int_equal(getp(s, TDM_SCHED_MODE), TDM_MODE_DECODE_FIRST);
    assert_int_equal(getp(s, TDM_SCHED_TBT_TARGET_US), 25000);
    assert_int_equal(getp(s, TDM_SCHED_NUM_LOOKAHEAD_TOKENS), 2);
    assert_int_equal(getp(s, TDM_SCHED_ROLE), TDM_ROLE_DECODE);
    assert_int_equal(getp(s, TDM_SCHED_REMOTE_KV_FAILURE), TDM_REMOTE_KV_FAIL);
    assert_int_equal(getp(s, TDM_SCHED_REMOTE_KV_TIMEOUT_MS), 5000);
    assert_int_equal(getp(s, TDM_SCHED_DELAY_FREE_TIMEOUT_MS), 60000);
    assert_int_equal(getp(s, TDM_SCHED_MAX_NUM_PARTIAL_PREFILLS), 2);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_total_blocks, 1999);
    char *c1 = tsd_config(s);
    static const char *const keys[] = {
        "max_num_batched_tokens", "max_num_seqs", "max_model_len", "long_prefill_token_threshold",
        "enable_chunked_prefill", "num_blocks", "block_size", "enable_prefix_caching", "watermark",
        "policy", "mode", "tbt_target_ms", "num_lookahead_tokens", "role", "remote_kv_failure",
        "remote_kv_timeout_ms", "delay_free_timeout_ms", "max_num_partial_prefills", "reserve_full_prompt",
        "continue_after_self_preemption", "cost_model",
        "per_attn_token2_ps", NULL };
    for (int i = 0; keys[i]; i++)
        if (!strstr(c1, keys[i])) fail_msg("get_config lacks \"%s\": %s", keys[i], c1);
    /* the output is itself a valid configuration that reproduces the same state */
    tdm_sched *s2 = tsd_new(c1);
    char *c2 = tsd_config(s2);
    assert_string_equal(c1, c2);
    free(c1);
    free(c2);
    tsd_done(s2);
    tsd_done(s);
}

typedef struct bad_case {
    const char *json;
    const char *key;
} bad_case;

static void configure__bad_values_rejected_naming_the_key(void **state)
{
    (void)state;
    static const bad_case cases[] = {
        { "{\"bogus_key\": 1}", "bogus_key" },
        { "{\"max_num_seqs\": 8, \"no_such_option\": true}", "no_such_option" },
        { "{\"max_num_seqs\": 0}", "max_num_seqs" },
        { "{\"max_num_seqs\": -5}", "max_num_seqs" },
        { "{\"max_num_seqs\": \"8\"}", "max_num_seqs" },
        { "{\"max_num_batched_tokens\": 1.5}", "max_num_batched_tokens" },
        { "{\"max_num_batched_tokens\": 99999999999}", "max_num_batched_tokens" },
        { "{\"block_size\": 0}", "block_size" },
        { "{\"num_blocks\": 1}", "num_blocks" },
        { "{\"max_model_len\": 1}", "max_model_len" },
        { "{\"long_prefill_token_threshold\": -1}", "long_prefill_token_threshold" },
        { "{\"enable_chunked_prefill\": 2}", "enable_chunked_prefill" },
        { "{\"enable_prefix_caching\": \"yes\"}", "enable_prefix_caching" },
        { "{\"watermark\": 1.5}", "watermark" },
        { "{\"watermark\": -0.1}", "watermark" },
        { "{\"policy\": \"lifo\"}", "policy" },
        { "{\"policy\": 1}", "policy" },
        { "{\"mode\": \"fast\"}", "mode" },
        { "{\"tbt_target_ms\": -1}", "tbt_target_ms" },
        { "{\"num_lookahead_tokens\": -2}", "num_lookahead_tokens" },
        { "{\"role\": \"router\"}", "role" },
        { "{\"remote_kv_failure\": \"retry\"}", "remote_kv_failure" },
        { "{\"remote_kv_timeout_ms\": -1}", "remote_kv_timeout_ms" },
        { "{\"delay_free_timeout_ms\": \"soon\"}", "delay_free_timeout_ms" },
        { "{\"max_num_partial_prefills\": -1}", "max_num_partial_prefills" },
        { "{\"cost_model\": {\"base_us\": -1}}", "base_us" },
        { "{\"cost_model\": {\"per_gpu_us\": 1}}", "per_gpu_us" },
        { "{\"cost_model\": 3}", "cost_model" },
        { "{\"policy_plugin\": 7}", "policy_plugin" },
        { "{\"max_num_batched_tokens\": 8, \"max_num_seqs\": 16}", "max_num_batched_tokens" },
        { "{\"enable_chunked_prefill\": false, \"max_model_len\": 4096,"
          " \"max_num_batched_tokens\": 2048}", "max_num_batched_tokens" },
        { NULL, NULL } };
    tdm_sched *s = tsd_new(NULL);
    char *before = tsd_config(s);
    for (int i = 0; cases[i].json; i++) {
        int rc = tdm_sched_configure(s, cases[i].json);
        if (rc != TDM_E_CONFIG)
            fail_msg("configure(%s) -> %d (%s), expected TDM_E_CONFIG", cases[i].json, rc,
                     tdm_sched_errmsg(s));
        tsd_assert_msg_has(s, cases[i].key);
        char *after = tsd_config(s);
        if (strcmp(before, after)) fail_msg("configure(%s) changed the config", cases[i].json);
        free(after);
    }
    free(before);
    tsd_done(s);
}

/* A failing document changes nothing, whichever order the good and bad keys come in. */
static void configure__all_or_nothing(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    char *before = tsd_config(s);
    assert_int_equal(tdm_sched_configure(s, "{\"max_num_seqs\": 7, \"num_blocks\": 500, \"block_size\": 0}"),
                     TDM_E_CONFIG);
    assert_int_equal(tdm_sched_configure(s, "{\"block_size\": 0, \"max_num_seqs\": 7}"), TDM_E_CONFIG);
    assert_int_equal(tdm_sched_configure(s, "{\"max_num_seqs\": 7, \"policy_plugin\": {\"path\": "
                                            "\"/nonexistent/plugin.so\"}}"), TDM_E_PLUGIN);
    char *after = tsd_config(s);
    assert_string_equal(before, after);
    assert_int_equal(getp(s, TDM_SCHED_MAX_NUM_SEQS), 128);
    assert_int_equal(getp(s, TDM_SCHED_NUM_BLOCKS), 10000);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_total_blocks, 9999);
    free(before);
    free(after);
    /* and a good document applies every key */
    assert_int_equal(tdm_sched_configure(s, "{\"max_num_seqs\": 7, \"num_blocks\": 500}"), TDM_OK);
    assert_int_equal(getp(s, TDM_SCHED_MAX_NUM_SEQS), 7);
    tsd_stats(s, &st);
    assert_int_equal(st.num_total_blocks, 499);
    tsd_done(s);
}

static void configure__malformed_json_rejected(void **state)
{
    (void)state;
    static const char *const docs[] = { "", "{", "[1, 2]", "null", "{\"max_num_seqs\": }",
                                        "{\"max_num_seqs\": 8,}", "42", "{\"a\" 1}", NULL };
    tdm_sched *s = tsd_new(NULL);
    char *before = tsd_config(s);
    for (int i = 0; docs[i]; i++) {
        int rc = tdm_sched_configure(s, docs[i]);
        if (rc != TDM_E_CONFIG && rc != TDM_E_INVAL)
            fail_msg("configure(\"%s\") -> %d", docs[i], rc);
        assert_true(tdm_sched_errmsg(s)[0] != '\0');
    }
    assert_int_equal(tdm_sched_configure(s, NULL), TDM_E_INVAL);
    assert_int_equal(tdm_sched_configure(NULL, "{}"), TDM_E_INVAL);
    char *after = tsd_config(s);
    assert_string_equal(before, after);
    free(before);
    free(after);
    assert_int_equal(tdm_sched_configure(s, "{}"), TDM_OK);
    tsd_done(s);
}

static void configure__pool_keys_refused_while_requests_exist(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    assert_int_equal(tsd_add(s, 1, 20, 3), TDM_OK);
    char *before = tsd_config(s);
    assert_int_equal(tdm_sched_configure(s, "{\"num_blocks\": 500}"), TDM_E_STATE);
    tsd_assert_msg_has(s, "num_blocks");
    assert_int_equal(tdm_sched_configure(s, "{\"max_num_seqs\": 9, \"block_size\": 32}"), TDM_E_STATE);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_NUM_BLOCKS, 500), TDM_E_STATE);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_BLOCK_SIZE, 32), TDM_E_STATE);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_ENABLE_PREFIX_CACHING, 0), TDM_E_STATE);
    char *after = tsd_config(s);
    assert_string_equal(before, after);
    free(before);
    free(after);
    /* other keys may change at any time */
    assert_int_equal(tdm_sched_configure(s, "{\"max_num_seqs\": 9}"), TDM_OK);
    assert_int_equal(getp(s, TDM_SCHED_MAX_NUM_SEQS), 9);
    tsd_run(s, 20, NULL);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_NUM_BLOCKS, 500), TDM_OK);
    tsd_done(s);
}

static void get_config__length_query_and_truncation(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    size_t len = 0;
    int rc = tdm_sched_get_config(s, NULL, 0, &len);
    assert_true(rc == TDM_OK || rc == TDM_E_TRUNCATED);
    assert_true(len > 10);
    char *buf = malloc(len + 1);
    memset(buf, 'x', len + 1);
    size_t len2 = 0;
    assert_int_equal(tdm_sched_get_config(s, buf, len, &len2), TDM_E_TRUNCATED);
    assert_int_equal(len2, len);
    assert_int_equal(tdm_sched_get_config(s, buf, len + 1, &len2), TDM_OK);
    assert_int_equal(buf[len], '\0');
    assert_int_equal(buf[0], '{');
    assert_int_equal(tdm_sched_get_config(NULL, buf, len + 1, &len2), TDM_E_INVAL);
    assert_int_equal(tdm_sched_get_config(s, buf, len + 1, NULL), TDM_E_INVAL);
    assert_int_equal(tdm_sched_get_config(s, NULL, 16, &len2), TDM_E_INVAL);
    free(buf);
    tsd_done(s);
}

typedef struct param_case {
    tdm_sched_param key;
    int64_t bad;
    int64_t good;
} param_case;

static void set_param__out_of_range_rejected_and_valid_round_trip(void **state)
{
    (void)state;
    static const param_case cases[] = {
        { TDM_SCHED_MAX_NUM_BATCHED_TOKENS, 0, 4096 },
        { TDM_SCHED_MAX_NUM_BATCHED_TOKENS, -1, 4096 },
        { TDM_SCHED_MAX_NUM_SEQS, 0, 64 },
        { TDM_SCHED_MAX_MODEL_LEN, 0, 4096 },
        { TDM_SCHED_LONG_PREFILL_TOKEN_THRESHOLD, -1, 128 },
        { TDM_SCHED_ENABLE_CHUNKED_PREFILL, 2, 1 },
        { TDM_SCHED_NUM_BLOCKS, 1, 64 },
        { TDM_SCHED_NUM_BLOCKS, (int64_t)1 << 40, 64 },
        { TDM_SCHED_BLOCK_SIZE, 0, 8 },
        { TDM_SCHED_ENABLE_PREFIX_CACHING, -1, 0 },
        { TDM_SCHED_WATERMARK_PPM, 1000000, 5000 },
        { TDM_SCHED_WATERMARK_PPM, -1, 5000 },
        { TDM_SCHED_POLICY, 7, TDM_POLICY_PRIORITY },
        { TDM_SCHED_POLICY, TDM_POLICY_CUSTOM, TDM_POLICY_FCFS },
        { TDM_SCHED_MODE, 3, TDM_MODE_DECODE_FIRST },
        { TDM_SCHED_TBT_TARGET_US, -1, 20000 },
        { TDM_SCHED_NUM_LOOKAHEAD_TOKENS, -1, 3 },
        { TDM_SCHED_ROLE, 3, TDM_ROLE_PREFILL },
        { TDM_SCHED_REMOTE_KV_FAILURE, 2, TDM_REMOTE_KV_FAIL },
        { TDM_SCHED_REMOTE_KV_TIMEOUT_MS, -1, 100 },
        { TDM_SCHED_DELAY_FREE_TIMEOUT_MS, -5, 100 },
        { TDM_SCHED_MAX_NUM_PARTIAL_PREFILLS, -1, 4 },
        { TDM_SCHED_RESERVE_FULL_PROMPT, 2, 1 },
        { TDM_SCHED_CONTINUE_AFTER_SELF_PREEMPTION, -1, 0 },
        { 0, 0, 0 } };
    tdm_sched *s = tsd_new(NULL);
    for (int i = 0; cases[i].key; i++) {
        char *before = tsd_config(s);
        int64_t old = getp(s, cases[i].key);
        int rc = tdm_sched_set_param(s, cases[i].key, cases[i].bad);
        if (rc != TDM_E_CONFIG)
            fail_msg("set_param(%d, %lld) -> %d, expected TDM_E_CONFIG", (int)cases[i].key,
                     (long long)cases[i].bad, rc);
        assert_true(tdm_sched_errmsg(s)[0] != '\0');
        assert_int_equal(getp(s, cases[i].key), old);
        char *after = tsd_config(s);
        assert_string_equal(before, after);
        free(before);
        free(after);
        rc = tdm_sched_set_param(s, cases[i].key, cases[i].good);
        if (rc != TDM_OK) fail_msg("set_param(%d, %lld) -> %d: %s", (int)cases[i].key,
                                   (long long)cases[i].good, rc, tdm_sched_errmsg(s));
        assert_int_equal(getp(s, cases[i].key), cases[i].good);
    }
    int64_t v = 777;
    assert_int_equal(tdm_sched_set_param(s, (tdm_sched_param)0, 1), TDM_E_INVAL);
    assert_int_equal(tdm_sched_set_param(s, (tdm_sched_param)99, 1), TDM_E_INVAL);
    assert_int_equal(tdm_sched_get_param(s, (tdm_sched_param)99, &v), TDM_E_INVAL);
    assert_int_equal(v, 777);
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_MAX_NUM_SEQS, NULL), TDM_E_INVAL);
    assert_int_equal(tdm_sched_get_param(NULL, TDM_SCHED_MAX_NUM_SEQS, &v), TDM_E_INVAL);
    assert_int_equal(tdm_sched_set_param(NULL, TDM_SCHED_MAX_NUM_SEQS, 4), TDM_E_INVAL);
    assert_int_equal(v, 777);
    tsd_done(s);
}

/* Header (TDM_SCHED_MAX_NUM_SEQS): lowered below the running count, the running requests keep
 * running and none is admitted until fewer run than the cap. */
static void set_param__lowering_max_num_seqs_keeps_running_admits_none(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    for (uint64_t id = 1; id <= 8; id++) assert_int_equal(tsd_add(s, id, 10, 50), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 8);
    tsd_update(s, &b, 7, 1.05, NULL);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_MAX_NUM_SEQS, 4), TDM_OK);
    assert_int_equal(tsd_add(s, 9, 10, 5), TDM_OK);
    tsd_step(s, 1.1, &b);
    assert_int_equal(b.num_reqs, 8);
    assert_int_equal(b.num_preempted, 0);
    assert_int_equal(tsd_state(s, 9), TDM_STATE_WAITING);
    tsd_update(s, &b, 7, 1.15, NULL);
    for (uint64_t id = 1; id <= 4; id++) assert_int_equal(tdm_sched_finish(s, id, TDM_FINISH_STOP), TDM_OK);
    tsd_step(s, 1.2, &b); /* 4 running == the cap */
    assert_int_equal(b.num_reqs, 4);
    assert_int_equal(tsd_state(s, 9), TDM_STATE_WAITING);
    tsd_update(s, &b, 7, 1.25, NULL);
    assert_int_equal(tdm_sched_finish(s, 5, TDM_FINISH_STOP), TDM_OK);
    tsd_step(s, 1.3, &b);
    assert_int_equal(b.num_reqs, 4);
    assert_true(tsd_find(&b, 9) >= 0);
    tsd_update(s, &b, 7, 1.35, NULL);
    double now = 2.0;
    tsd_run(s, 100, &now);
    tsd_done(s);
}

static void configure__policy_plugin_key_loads_shared_object(void **state)
{
    (void)state;
    const char *bd = getenv("TANDEM_BUILD");
    char path[4096], json[4300];
    snprintf(path, sizeof(path), "%s/tests/sched/plugin_sjf.so", bd ? bd : "build");
    if (access(path, R_OK) != 0) {
        print_message("policy plug-in %s not built: skipped\n", path);
        skip();
    }
    snprintf(json, sizeof(json), "{\"policy_plugin\": {\"path\": \"%s\"}, \"max_num_seqs\": 1}", path);
    tdm_sched *s = tsd_new(json);
    assert_int_equal(getp(s, TDM_SCHED_POLICY), TDM_POLICY_CUSTOM);
    assert_int_equal(tsd_add(s, 1, 30, 2), TDM_OK);
    assert_int_equal(tsd_add(s, 2, 10, 2), TDM_OK);
    tdm_batch b;
    tsd_step(s, 1.0, &b);
    assert_int_equal(b.num_reqs, 1);
    assert_int_equal(b.req_ids[0], 2);
    tsd_update(s, &b, 7, 1.1, NULL);
    tsd_run(s, 20, NULL);
    tsd_done(s);
}

/* ---- allocation-failure injection ---- */

static void create__allocation_failure_is_clean(void **state)
{
    (void)state;
    int ok = 0;
    for (long n = 1; n < 1000 && !ok; n++) {
        tdm_sched *s = NULL;
        tdm__alloc_fail_after(n);
        int rc = tdm_sched_create(&s);
        tdm__alloc_fail_after(0);
        if (rc == TDM_OK) {
            ok = 1;
            tsd_done(s);
        } else {
            assert_int_equal(rc, TDM_E_NOMEM);
            assert_null(s);
            assert_true(tdm_sched_errmsg(NULL) != NULL);
        }
    }
    assert_true(ok);
}

static void configure__allocation_failure_changes_nothing(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    char *before = tsd_config(s);
    int ok = 0;
    for (long n = 1; n < 1000 && !ok; n++) {
        tdm__alloc_fail_after(n);
        int rc = tdm_sched_configure(s, every_key);
        tdm__alloc_fail_after(0);
        if (rc == TDM_OK) {
            ok = 1;
        } else {
            if (rc != TDM_E_NOMEM) fail_msg("configure under failure %ld -> %d: %s", n, rc, tdm_sched_errmsg(s));
            char *after = tsd_config(s);
            int changed = strcmp(before, after) != 0;
            free(after);
            if (changed) {
                free(before);
                fail_msg("configure failed (%d: \"%s\") at injected failure %ld but changed the config",
                         rc, tdm_sched_errmsg(s), n);
            }
            tsd_check(s);
        }
    }
    assert_true(ok);
    assert_int_equal(getp(s, TDM_SCHED_NUM_BLOCKS), 2000);
    free(before);
    tsd_done(s);
}

static int destroyed_count;
static void count_destroy(void *ctx) { (void)ctx; destroyed_count++; }
static int cmp_len(void *ctx, const tdm_request_view *a, const tdm_request_view *b)
{
    (void)ctx;
    return a->num_prompt_tokens < b->num_prompt_tokens ? -1 : a->num_prompt_tokens > b->num_prompt_tokens;
}

/* set_policy / load_policy under allocation failure: TDM_E_NOMEM leaves the old policy in
 * place and does not adopt (or destroy) the caller's table. */
static void set_policy__allocation_failure_keeps_old_policy(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    tdm_policy p;
    memset(&p, 0, sizeof(p));
    p.version = TDM_POLICY_VERSION;
    p.name = "a-policy-with-a-name";
    p.compare = cmp_len;
    p.destroy = count_destroy;
    destroyed_count = 0;
    int ok = 0;
    for (long n = 1; n < 100 && !ok; n++) {
        tdm__alloc_fail_after(n);
        int rc = tdm_sched_set_policy(s, &p);
        tdm__alloc_fail_after(0);
        if (rc == TDM_OK) {
            ok = 1;
        } else {
            assert_int_equal(rc, TDM_E_NOMEM);
            assert_int_equal(destroyed_count, 0);
            assert_int_equal(getp(s, TDM_SCHED_POLICY), TDM_POLICY_FCFS);
            tsd_check(s);
        }
    }
    assert_true(ok);
    assert_int_equal(getp(s, TDM_SCHED_POLICY), TDM_POLICY_CUSTOM);
    const char *bd = getenv("TANDEM_BUILD");
    char path[4096];
    snprintf(path, sizeof(path), "%s/tests/sched/plugin_sjf.so", bd ? bd : "build");
    if (access(path, R_OK) == 0) {
        ok = 0;
        for (long n = 1; n < 100 && !ok; n++) {
            tdm__alloc_fail_after(n);
            int rc = tdm_sched_load_policy(s, path, NULL);
            tdm__alloc_fail_after(0);
            if (rc == TDM_OK) {
                ok = 1;
            } else {
                assert_int_equal(rc, TDM_E_NOMEM);
                assert_int_equal(destroyed_count, 0); /* the C policy is still installed */
                tsd_check(s);
            }
        }
        assert_true(ok);
        assert_int_equal(destroyed_count, 1); /* replaced by the plug-in */
    }
    tsd_done(s);
}

/* Every add, step and update is first tried with its first allocation failing: it either
 * succeeds without allocating or fails with TDM_E_NOMEM leaving a consistent scheduler that
 * the plain retry then advances. */
static void add_step_update__allocation_failure_is_clean(void **state)
{
    (void)state;
    const int64_t kv[] = { TDM_SCHED_NUM_BLOCKS, 400, TDM_SCHED_MAX_NUM_SEQS, 32, 0 };
    tdm_sched *s = tsd_newp(kv);
    int nomem = 0;
    double now = 1.0;
    uint64_t next = 1;
    for (int round = 0; round < 60; round++) {
        for (int k = 0; k < 3; k++) {
            uint32_t before = tsd_unfinished(s);
            for (long n = 1;; n++) {
                tdm__alloc_fail_after(n);
                int rc = tsd_add(s, next, 5 + (uint32_t)(next * 7 % 90), 1 + (uint32_t)(next % 9));
                tdm__alloc_fail_after(0);
                if (rc == TDM_OK) break;
                assert_int_equal(rc, TDM_E_NOMEM);
                assert_int_equal(tsd_unfinished(s), before);
                tdm_request_info i;
                tdm_request_info_init(&i);
                assert_int_equal(tdm_sched_request_info(s, next, &i), TDM_E_NOT_FOUND);
                tsd_check(s);
                nomem++;
            }
            next++;
        }
        tdm_batch b;
        memset(&b, 0, sizeof(b));
        tdm_batch_init(&b);
        tdm__alloc_fail_after(1);
        int rc = tdm_sched_step(s, now, &b);
        tdm__alloc_fail_after(0);
        if (rc != TDM_OK) {
            assert_int_equal(rc, TDM_E_NOMEM);
            tsd_check(s);
            nomem++;
            tsd_step(s, now, &b);
        } else {
            tsd_check(s);
        }
        tsd_update(s, &b, 7, now + 0.001, NULL); /* plain update: the batch must be served */
        now += 0.01;
    }
    print_message("%d injected allocation failures handled\n", nomem);
    assert_true(nomem > 0);
    tsd_run(s, 2000, &now);
    tsd_done(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(configure__every_key_applied_and_round_trips),
        TSD_TEST(configure__bad_values_rejected_naming_the_key),
        TSD_TEST(configure__all_or_nothing),
        TSD_TEST(configure__malformed_json_rejected),
        TSD_TEST(configure__pool_keys_refused_while_requests_exist),
        TSD_TEST(get_config__length_query_and_truncation),
        TSD_TEST(set_param__out_of_range_rejected_and_valid_round_trip),
        TSD_TEST(set_param__lowering_max_num_seqs_keeps_running_admits_none),
        TSD_TEST(configure__policy_plugin_key_loads_shared_object),
        TSD_TEST(create__allocation_failure_is_clean),
        TSD_TEST(configure__allocation_failure_changes_nothing),
        TSD_TEST(set_policy__allocation_failure_keeps_old_policy),
        TSD_TEST(add_step_update__allocation_failure_is_clean),
    };
    return cmocka_run_group_tests_name("sched_config", tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_config")
#endif
