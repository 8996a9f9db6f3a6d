/*
 * test_engine.c -- the simulator driving the real scheduler: every request of a run
 * finishes with exactly its output tokens; the same seed gives the same JSON; the
 * disaggregated mode conserves every request (each one prefilled on a prefill instance,
 * its KV transferred, decoded on a decode instance); the goodput search converges; two
 * identical configs give ratios of 1 (in the library and through `tandem ab`); a small KV
 * pool forces preemptions without losing requests; the KV-aware router finds prefix hits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "sim.h"
#include "sim_test_util.h"

static tdm_sim_model M;
static tdm_sim_hw H;

static int setup(void **state)
{
    (void)state;
    tdm_sim_model_preset("llama-3-8b", &M);
    tdm_sim_hw_preset("h100-sxm", &H);
    return 0;
}

static void builtin(tdm_sim_trace *t, size_t n, double rate, uint64_t seed)
{
    tdm_sim_trace_opts o;
    tdm_sim_trace_opts_init(&o);
    o.max_requests = n;
    o.rate = rate;
    o.seed = seed;
    o.max_len = 8192;
    char err[TDM_SIM_ERRLEN];
    assert_int_equal(tdm_sim_trace_load("builtin", &o, t, err, sizeof err), 0);
}

static void config(const char *json, tdm_sim_config *c)
{
    char err[TDM_SIM_ERRLEN];
    if (tdm_sim_config_parse(json, "t", &M, &H, c, err, sizeof err) != 0) fail_msg("%s", err);
}

static void run(const tdm_sim_trace *t, const tdm_sim_config *c, tdm_sim_result *r)
{
    char err[TDM_SIM_ERRLEN];
    tdm_sim_run_opts o;
    tdm_sim_run_opts_init(&o);
    if (tdm_sim_run(t, c, &o, r, err, sizeof err) != 0) fail_msg("run: %s", err);
}

static void check_all_finished(const tdm_sim_trace *t, const tdm_sim_result *r)
{
    assert_int_equal(r->sum.completed, t->n);
    uint64_t gaps = 0;
    for (size_t i = 0; i < t->n; i++) {
        const tdm_sim_req_out *q = &r->reqs[i];
        assert_int_equal(q->status, 1);
        assert_int_equal(q->generated, t->reqs[i].output_len);
        assert_true(q->first_token > q->arrival);
        assert_true(q->finish >= q->first_token);
        gaps += q->generated - 1;
    }
    assert_int_equal(r->sum.itl.n, gaps);
}

static void sim_run__every_request_finishes_with_its_outputs(void **state)
{
    (void)state;
    tdm_sim_trace t;
    builtin(&t, 300, 20, 1);
    static const char *const CFG[] = {
        "{\"mode\": \"vllm\", \"max_num_batched_tokens\": 2048}",
        "{\"mode\": \"decode_first\", \"tbt_target_ms\": 30}",
        "{\"policy\": \"priority\", \"long_prefill_token_threshold\": 256}",
    };
    for (size_t k = 0; k < 3; k++) {
        tdm_sim_config c;
        config(CFG[k], &c);
        tdm_sim_result r;
        run(&t, &c, &r);
        check_all_finished(&t, &r);
        assert_true(r.sum.steps > 0);
        assert_true(r.sum.prefix_hit_rate > 0); /* shared system prompts */
        tdm_sim_result_free(&r);
        tdm_sim_config_free(&c);
    }
    tdm_sim_trace_free(&t);
}

/* Without the per-request outcomes the summary is the same, field by field: the metrics are
 * streamed as requests end (and at a max_steps stop, the unfinished and unsent ones count),
 * colocated and disaggregated, closed loop with warm-up. */
static void sim_run__summary_without_kept_requests_is_the_same(void **state)
{
    (void)state;
    tdm_sim_trace t;
    builtin(&t, 1500, 60, 7);
    static const char *const CFG[] = {
        "{\"mode\": \"vllm\", \"max_num_batched_tokens\": 2048}",
        "{\"deployment\": {\"mode\": \"disaggregated\", \"prefill\": {\"instances\": 1}, "
        "\"decode\": {\"instances\": 2}}}",
    };
    for (size_t k = 0; k < 2; k++)
        for (int variant = 0; variant < 3; variant++) {
            tdm_sim_config c;
            config(CFG[k], &c);
            tdm_sim_run_opts o;
            tdm_sim_run_opts_init(&o);
            if (variant == 1) o.concurrency = 16;
            if (variant == 2) o.max_steps = 1; /* stops at the first check (4096 events), with
                                                 * requests in flight and unsent */
            tdm_sim_result a, b;
            char err[TDM_SIM_ERRLEN];
            if (tdm_sim_run(&t, &c, &o, &a, err, sizeof err) != 0) fail_msg("%s", err);
            o.keep_requests = 0;
            if (tdm_sim_run(&t, &c, &o, &b, err, sizeof err) != 0) fail_msg("%s", err);
            assert_non_null(a.reqs);
            assert_null(b.reqs);
            if (variant == 2) assert_true(a.sum.completed < t.n);
            assert_int_equal(a.sum.requests, b.sum.requests);
            assert_int_equal(a.sum.completed, b.sum.completed);
            assert_true(a.sum.duration_s == b.sum.duration_s);
            assert_true(a.sum.attainment == b.sum.attainment);
            assert_true(a.sum.output_throughput_tok_s == b.sum.output_throughput_tok_s);
            const tdm_sim_stat *sa[] = {&a.sum.ttft, &a.sum.tpot, &a.sum.e2e, &a.sum.itl};
            const tdm_sim_stat *sb[] = {&b.sum.ttft, &b.sum.tpot, &b.sum.e2e, &b.sum.itl};
            for (int m = 0; m < 4; m++) {
                assert_int_equal(sa[m]->n, sb[m]->n);
                assert_true(sa[m]->p50 == sb[m]->p50 && sa[m]->p99 == sb[m]->p99);
                assert_true(sa[m]->max == sb[m]->max);
            }
            /* and the kept outcomes summarize to the streamed figures */
            tdm_sim_summary keep = a.sum;
            assert_int_equal(tdm_sim_summarize(&a, o.slo_ttft_s, o.slo_tpot_s), 0);
            assert_true(keep.ttft.p90 == a.sum.ttft.p90 && keep.attainment == a.sum.attainment);
            tdm_sim_result_free(&a);
            tdm_sim_result_free(&b);
            tdm_sim_config_free(&c);
        }
    tdm_sim_trace_free(&t);
}

static void sim_run__decode_first_caps_token_gaps(void **state)
{
    (void)state;
    tdm_sim_trace t;
    builtin(&t, 400, 30, 2);
    tdm_sim_config a, b;
    config("{\"mode\": \"vllm\", \"max_num_batched_tokens\": 8192}", &a);
    config("{\"mode\": \"decode_first\", \"tbt_target_ms\": 40, \"max_num_batched_tokens\": 8192}", &b);
    tdm_sim_result ra, rb;
    run(&t, &a, &ra);
    run(&t, &b, &rb);
    /* the TBT-sized budget keeps every step (hence every gap) near the target; 8192-token
     * steps of the vLLM-like config produce far longer gaps */
    assert_true(rb.sum.itl.max < 0.045);
    assert_true(ra.sum.itl.max > rb.sum.itl.max);
    tdm_sim_result_free(&ra);
    tdm_sim_result_free(&rb);
    tdm_sim_config_free(&a);
    tdm_sim_config_free(&b);
    tdm_sim_trace_free(&t);
}

static char *json_of(tdm_sim_result *r)
{
    char path[256];
    static int k;
    char name[32];
    snprintf(name, sizeof name, "j%d.json", k++);
    write_tmp(path, sizeof path, name, "");
    r->sum.wall_s = 0; /* the only field that depends on the machine */
    assert_int_equal(tdm_sim_write_json(path, r, NULL), 0);
    FILE *f = fopen(path, "rb");
    char *buf = calloc(1, 1 << 16);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = '\0';
    fclose(f);
    unlink(path);
    return buf;
}

static void sim_run__same_seed_same_json(void **state)
{
    (void)state;
    char *j[3];
    for (int k = 0; k < 3; k++) {
        tdm_sim_trace t;
        builtin(&t, 250, 25, k == 2 ? 99 : 5);
        tdm_sim_config c;
        config("{\"mode\": \"decode_first\", \"tbt_target_ms\": 50}", &c);
        tdm_sim_result r;
        run(&t, &c, &r);
        j[k] = json_of(&r);
        tdm_sim_result_free(&r);
        tdm_sim_config_free(&c);
        tdm_sim_trace_free(&t);
    }
    assert_string_equal(j[0], j[1]);
    assert_string_not_equal(j[0], j[2]);
    for (int k = 0; k < 3; k++) free(j[k]);
}

static void disagg__conserves_every_request(void **state)
{
    (void)state;
    tdm_sim_trace t;
    builtin(&t, 300, 20, 3);
    tdm_sim_config c;
    config("{\"name\": \"pd\", \"deployment\": {\"mode\": \"disaggregated\", \"router\": \"kv_aware\","
           " \"kv_gbps\": 25, \"prefill\": {\"instances\": 2}, \"decode\": {\"instances\": 2, \"hw\": \"h200\"}}}",
           &c);
    assert_int_equal(c.disagg, 1);
    assert_string_equal(c.pools[1].hw.name, "h200");
    assert_int_equal(tdm_sim_config_gpus(&c), 4);
    tdm_sim_result r;
    run(&t, &c, &r);
    check_all_finished(&t, &r);
    assert_int_equal(r.sum.kv_transfers, t.n);
    double kvb = tdm_sim_model_kv_bytes_per_token(&M);
    for (size_t i = 0; i < t.n; i++) {
        const tdm_sim_req_out *q = &r.reqs[i];
        assert_true(q->prefill_instance == 0 || q->prefill_instance == 1);
        assert_true(q->instance == 2 || q->instance == 3);
        /* the first token comes after the KV crossed the link */
        assert_true(q->first_token - q->arrival >= kvb * q->prompt_len / 25e9);
    }
    tdm_sim_result_free(&r);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

static void colocated__multi_instance_routers_conserve_requests(void **state)
{
    (void)state;
    tdm_sim_trace t;
    builtin(&t, 400, 40, 4);
    static const char *const R[] = {"round_robin", "least_load", "kv_aware"};
    double hit[3];
    for (int k = 0; k < 3; k++) {
        char js[256];
        snprintf(js, sizeof js, "{\"deployment\": {\"instances\": 4, \"router\": \"%s\"}}", R[k]);
        tdm_sim_config c;
        config(js, &c);
        tdm_sim_result r;
        run(&t, &c, &r);
        check_all_finished(&t, &r);
        size_t per[4] = {0};
        for (size_t i = 0; i < t.n; i++) per[r.reqs[i].instance]++;
        for (int i = 0; i < 4; i++) assert_true(per[i] > 0);
        hit[k] = r.sum.prefix_hit_rate;
        tdm_sim_result_free(&r);
        tdm_sim_config_free(&c);
    }
    /* routing by prefix overlap keeps each system prompt on fewer instances */
    assert_true(hit[2] >= hit[0]);
    tdm_sim_trace_free(&t);
}

static void sim_run__small_pool_preempts_without_losing_requests(void **state)
{
    (void)state;
    tdm_sim_trace t;
    builtin(&t, 200, 50, 6);
    tdm_sim_config c;
    config("{\"num_blocks\": 1200, \"max_num_seqs\": 256}", &c);
    tdm_sim_result r;
    run(&t, &c, &r);
    check_all_finished(&t, &r);
    assert_true(r.sum.preemptions > 0);
    assert_true(r.sum.kv_usage_max > 0.9);
    tdm_sim_result_free(&r);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

static void sim_run__too_long_requests_are_rejected_misses(void **state)
{
    (void)state;
    tdm_sim_trace t;
    builtin(&t, 50, 10, 7);
    t.reqs[3].prompt_len = 9000; /* past max_model_len 8192 */
    tdm_sim_config c;
    config("{\"max_model_len\": 8192}", &c);
    tdm_sim_result r;
    run(&t, &c, &r);
    assert_int_equal(r.sum.rejected, 1);
    assert_int_equal(r.reqs[3].status, 2);
    assert_int_equal(r.sum.completed, 49);
    assert_true(r.sum.attainment <= 49.0 / 50);
    tdm_sim_result_free(&r);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

/* The goodput search over n requests of the builtin trace (rate 10, seed 8) under the config
 * json and the SLOs ttft / tpot (seconds); t, c and o are kept for the caller's runs. */
static void goodput_search(size_t n, const char *json, double ttft, double tpot, tdm_sim_trace *t,
                           tdm_sim_config *c, tdm_sim_run_opts *o, tdm_sim_goodput_out *go)
{
    builtin(t, n, 10, 8);
    config(json, c);
    tdm_sim_run_opts_init(o);
    o->slo_ttft_s = ttft;
    o->slo_tpot_s = tpot;
    char err[TDM_SIM_ERRLEN];
    if (tdm_sim_goodput(t, c, o, go, err, sizeof err) != 0) fail_msg("goodput: %s", err);
}

/* The summary of a run of t with its arrivals scaled by `scale`. */
static tdm_sim_summary run_scaled(const tdm_sim_trace *t, double scale, const tdm_sim_config *c,
                                  const tdm_sim_run_opts *o)
{
    tdm_sim_trace u;
    assert_int_equal(tdm_sim_trace_scaled(t, scale, &u), 0);
    tdm_sim_result r;
    char err[TDM_SIM_ERRLEN];
    if (tdm_sim_run(&u, c, o, &r, err, sizeof err) != 0) fail_msg("run: %s", err);
    tdm_sim_summary sum = r.sum;
    tdm_sim_result_free(&r);
    tdm_sim_trace_free(&u);
    return sum;
}

static void goodput__converges(void **state)
{
    (void)state;
    tdm_sim_trace t;
    tdm_sim_config c;
    tdm_sim_run_opts o;
    tdm_sim_goodput_out go;
    goodput_search(300, "{\"mode\": \"decode_first\", \"tbt_target_ms\": 40}", 0.3, 0.03, &t, &c, &o, &go);
    double g = go.req_s, s = go.scale;
    int runs = go.runs;
    assert_true(runs >= 2 && runs <= 16);
    /* the best attainment seen is at least the target (the found scale met it) */
    assert_true(go.best_attainment >= 0.9 && go.best_scale > 0);
    assert_true(g > 0 && s > 0);
    double base = (double)t.n / tdm_sim_trace_span(&t);
    assert_float_equal(g, s * base, 1e-9);
    /* attainment at the found scale meets the target, and at 1.5x it no longer does */
    assert_true(run_scaled(&t, s, &c, &o).attainment >= 0.9);
    assert_true(run_scaled(&t, s * 1.5, &c, &o).attainment < 0.9);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

/* SLOs no load can meet (a TTFT shorter than most prompts' prefill alone): goodput 0 after
 * every halving down to 2^-11, and the best attainment reported is what a run at its scale
 * gives, below the target. */
static void goodput__unreachable_reports_best_attainment(void **state)
{
    (void)state;
    tdm_sim_trace t;
    tdm_sim_config c;
    tdm_sim_run_opts o;
    tdm_sim_goodput_out go;
    goodput_search(200, "{\"mode\": \"vllm\"}", 0.015, 0.05, &t, &c, &o, &go);
    assert_true(go.req_s == 0 && go.scale == 0);
    assert_int_equal(go.runs, 12);
    assert_true(go.best_attainment < 0.9);
    assert_true(go.best_scale > 0 && go.best_scale <= 1);
    tdm_sim_summary sum = run_scaled(&t, go.best_scale, &c, &o);
    assert_float_equal(sum.attainment, go.best_attainment, 1e-12);
    tdm_sim_goodput_to_summary(&go, &sum);
    assert_true(sum.goodput_req_s == 0 && sum.goodput_best_attainment == go.best_attainment);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

static void ab__identical_configs_give_ratios_of_one(void **state)
{
    (void)state;
    tdm_sim_trace t;
    builtin(&t, 200, 20, 9);
    tdm_sim_config c;
    config("{\"mode\": \"decode_first\", \"tbt_target_ms\": 50}", &c);
    tdm_sim_result a, b;
    run(&t, &c, &a);
    run(&t, &c, &b);
    for (size_t k = 0; k < tdm_sim_ab_num_metrics; k++) {
        const char *key = tdm_sim_ab_metrics[k].key;
        double x = tdm_sim_metric(&a.sum, key), y = tdm_sim_metric(&b.sum, key);
        if (!strcmp(key, "goodput_req_s")) continue;
        if (x != y) fail_msg("%s: %g vs %g", key, x, y);
    }
    tdm_sim_result_free(&a);
    tdm_sim_result_free(&b);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

static void ab_command__identical_configs_give_ratios_of_one(void **state)
{
    (void)state;
    const char *bd = getenv("TANDEM_BUILD");
    char tool[512];
    snprintf(tool, sizeof tool, "%s/tandem", bd ? bd : "build");
    if (access(tool, X_OK) != 0) {
        printf("[ SKIP     ] %s not built\n", tool);
        skip();
        return;
    }
    char cfg[256], out[256], cmd[1400];
    write_tmp(cfg, sizeof cfg, "same.json", "{\"name\": \"same\", \"scheduler\": {\"mode\": \"decode_first\", \"tbt_target_ms\": 50}}");
    write_tmp(out, sizeof out, "ab.json", "");
    snprintf(cmd, sizeof cmd, "%s ab %s %s --max-requests 150 --quiet --json %s >/dev/null", tool,
             cfg, cfg, out);
    assert_int_equal(system(cmd), 0);
    json_error_t je;
    json_t *o = json_load_file(out, 0, &je);
    assert_non_null(o);
    json_t *ratios = json_object_get(o, "ratios");
    assert_int_equal(json_array_size(ratios), 2);
    json_t *second = json_array_get(ratios, 1);
    assert_true(json_object_size(second) > 10);
    const char *key;
    json_t *v;
    json_object_foreach(second, key, v) {
        if (json_number_value(v) != 1.0) fail_msg("ratio %s = %g", key, json_number_value(v));
    }
    json_t *cf = json_object_get(o, "configs");
    assert_int_equal(json_array_size(cf), 2);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(cf, 0), "completed")), 150);
    json_decref(o);
    unlink(cfg);
    unlink(out);
}

/* The prefix sharing Mooncake records (hash ids of 512-token blocks) reaches the scheduler's
 * prefix cache: with a pool large enough to keep every block, the hit rate approaches the
 * trace's leading-block sharing (16.9% of the prompt blocks of the first 600 requests). */
static void mooncake__prefix_cache_sees_the_trace_sharing(void **state)
{
    (void)state;
    char p[512], err[TDM_SIM_ERRLEN];
    NEED_SHARED("traces/mooncake_fast25_conversation_trace.jsonl", p);
    tdm_sim_trace t;
    tdm_sim_trace_opts o;
    tdm_sim_trace_opts_init(&o);
    o.max_requests = 600;
    o.max_len = 131072;
    assert_int_equal(tdm_sim_trace_load(p, &o, &t, err, sizeof err), 0);
    /* the leading-block overlap the trace itself records, over these requests */
    size_t hits = 0, blocks = 0, cap = 1 << 20;
    uint64_t *seen = calloc(cap, sizeof *seen);
    for (size_t i = 0; i < t.n; i++) {
        int lead = 1;
        uint64_t h = 0;
        for (uint32_t b = 0; b < t.reqs[i].num_hash; b++) {
            h = tdm_sim_mix64(h ^ t.hash_ids[t.reqs[i].hash_off + b]) | 1;
            size_t k = h & (cap - 1);
            while (seen[k] && seen[k] != h) k = (k + 1) & (cap - 1);
            if (lead && seen[k] == h) hits++;
            else lead = 0;
            seen[k] = h;
            blocks++;
        }
    }
    free(seen);
    double want = (double)hits / (double)blocks;
    tdm_sim_config c;
    config("{\"max_model_len\": 131072, \"num_blocks\": 2000000, \"max_num_seqs\": 64}", &c);
    tdm_sim_result r;
    run(&t, &c, &r);
    assert_int_equal(r.sum.completed, t.n);
    printf("  trace leading-block sharing %.3f, scheduler prefix hit rate %.3f\n", want,
           r.sum.prefix_hit_rate);
    assert_true(want > 0.1);
    /* within a few points: partial last blocks and blocks still being computed when a
     * sharer arrives make the two differ a little */
    assert_true(fabs(r.sum.prefix_hit_rate - want) < 0.06);
    tdm_sim_result_free(&r);
    tdm_sim_config_free(&c);
    tdm_sim_trace_free(&t);
}

/* Randomized invariants: random scheduler configs (budget, sequences, chunk cap, a tight KV
 * pool, mode, policy) on random deployments (1-3 colocated instances or a P/D pair with
 * 1-2 + 1-2 instances, any router) and random workloads: no request is lost, every request
 * finishes with exactly its output tokens, time only moves forward. */
static void sim_run__randomized_configs_lose_no_request(void **state)
{
    (void)state;
    tdm_sim_rng rng;
    tdm_sim_rng_seed(&rng, 2024);
    static const char *const R[] = {"round_robin", "least_load", "kv_aware"};
    for (int it = 0; it < 48; it++) {
        tdm_sim_trace t;
        builtin(&t, 60 + tdm_sim_rng_next(&rng) % 80, 5 + tdm_sim_rng_uniform(&rng) * 60,
                tdm_sim_rng_next(&rng));
        uint32_t need = 0;
        for (size_t i = 0; i < t.n; i++) {
            uint32_t b = (t.reqs[i].prompt_len + t.reqs[i].output_len + 15) / 16;
            if (b > need) need = b;
        }
        char sched[256], js[768];
        snprintf(sched, sizeof sched,
                 "{\"max_num_batched_tokens\": %u, \"max_num_seqs\": %u, "
                 "\"long_prefill_token_threshold\": %u, \"num_blocks\": %u, \"mode\": \"%s\", "
                 "\"policy\": \"%s\"%s}",
                 (unsigned)(64 << (tdm_sim_rng_next(&rng) % 6)),
                 (unsigned)(1 + tdm_sim_rng_next(&rng) % 64),
                 (unsigned)(tdm_sim_rng_next(&rng) % 2 ? 0 : 128),
                 need + 2 + (unsigned)(tdm_sim_rng_next(&rng) % 600),
                 tdm_sim_rng_next(&rng) % 2 ? "vllm" : "decode_first",
                 tdm_sim_rng_next(&rng) % 2 ? "fcfs" : "priority",
                 tdm_sim_rng_next(&rng) % 2 ? ", \"tbt_target_ms\": 30" : "");
        int disagg = tdm_sim_rng_next(&rng) % 3 == 0;
        if (disagg)
            snprintf(js, sizeof js,
                     "{\"scheduler\": %s, \"deployment\": {\"mode\": \"disaggregated\", \"router\": \"%s\","
                     " \"prefill\": {\"instances\": %u}, \"decode\": {\"instances\": %u}}}",
                     sched, R[tdm_sim_rng_next(&rng) % 3], (unsigned)(1 + tdm_sim_rng_next(&rng) % 2),
                     (unsigned)(1 + tdm_sim_rng_next(&rng) % 2));
        else
            snprintf(js, sizeof js,
                     "{\"scheduler\": %s, \"deployment\": {\"instances\": %u, \"router\": \"%s\"}}",
                     sched, (unsigned)(1 + tdm_sim_rng_next(&rng) % 3), R[tdm_sim_rng_next(&rng) % 3]);
        tdm_sim_config c;
        config(js, &c);
        tdm_sim_result r;
        char err[TDM_SIM_ERRLEN];
        if (tdm_sim_run(&t, &c, NULL, &r, err, sizeof err) != 0) fail_msg("%s: %s", js, err);
        if (r.sum.completed != t.n) fail_msg("%s: %zu of %zu finished", js, r.sum.completed, t.n);
        check_all_finished(&t, &r);
        for (size_t i = 0; i < t.n; i++) assert_true(r.reqs[i].finish <= r.sum.duration_s);
        if (disagg) assert_int_equal(r.sum.kv_transfers, t.n);
        tdm_sim_result_free(&r);
        tdm_sim_config_free(&c);
        tdm_sim_trace_free(&t);
    }
}

static void config_parse__wrapper_bare_and_errors(void **state)
{
    (void)state;
    char err[TDM_SIM_ERRLEN];
    tdm_sim_config c;
    assert_int_equal(tdm_sim_config_parse("{\"max_num_seqs\": 8}", "bare", &M, &H, &c, err, sizeof err), 0);
    assert_string_equal(c.name, "bare");
    assert_non_null(strstr(c.pools[0].sched_json, "max_num_seqs"));
    tdm_sim_config_free(&c);
    assert_int_equal(tdm_sim_config_parse("{\"name\": \"w\", \"scheduler\": {\"max_num_seqs\": 8}, "
                                          "\"deployment\": {\"instances\": 3, \"tp\": 2}}",
                                          NULL, &M, &H, &c, err, sizeof err), 0);
    assert_string_equal(c.name, "w");
    assert_int_equal(c.pools[0].instances, 3);
    assert_int_equal(tdm_sim_config_gpus(&c), 6);
    tdm_sim_config_free(&c);
    assert_int_equal(tdm_sim_config_parse("{\"name\": \"w\", \"schedular\": {}}", NULL, &M, &H, &c,
                                          err, sizeof err), -1);
    assert_non_null(strstr(err, "schedular"));
    assert_int_equal(tdm_sim_config_parse("{\"deployment\": {\"mode\": \"disaggregated\", \"prefill\": {}}}",
                                          NULL, &M, &H, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "decode"));
    assert_int_equal(tdm_sim_config_parse("{\"deployment\": {\"router\": \"random\"}}", NULL, &M, &H,
                                          &c, err, sizeof err), -1);
    assert_int_equal(tdm_sim_config_parse("{\"deployment\": {\"instances\": 0}}", NULL, &M, &H, &c,
                                          err, sizeof err), -1);
    /* a bad scheduler key is the library's to refuse, at run time, naming the key */
    assert_int_equal(tdm_sim_config_parse("{\"max_num_seq\": 8}", "x", &M, &H, &c, err, sizeof err), 0);
    tdm_sim_trace t;
    builtin(&t, 10, 10, 1);
    tdm_sim_result r;
    assert_int_equal(tdm_sim_run(&t, &c, NULL, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "max_num_seq"));
    tdm_sim_trace_free(&t);
    tdm_sim_config_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sim_run__every_request_finishes_with_its_outputs),
        cmocka_unit_test(sim_run__summary_without_kept_requests_is_the_same),
        cmocka_unit_test(sim_run__decode_first_caps_token_gaps),
        cmocka_unit_test(sim_run__same_seed_same_json),
        cmocka_unit_test(disagg__conserves_every_request),
        cmocka_unit_test(colocated__multi_instance_routers_conserve_requests),
        cmocka_unit_test(sim_run__small_pool_preempts_without_losing_requests),
        cmocka_unit_test(sim_run__too_long_requests_are_rejected_misses),
        cmocka_unit_test(goodput__converges),
        cmocka_unit_test(goodput__unreachable_reports_best_attainment),
        cmocka_unit_test(ab__identical_configs_give_ratios_of_one),
        cmocka_unit_test(ab_command__identical_configs_give_ratios_of_one),
        cmocka_unit_test(mooncake__prefix_cache_sees_the_trace_sharing),
        cmocka_unit_test(sim_run__randomized_configs_lose_no_request),
        cmocka_unit_test(config_parse__wrapper_bare_and_errors),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
