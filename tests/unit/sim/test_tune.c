/*
 * test_tune.c -- `tandem tune` (sim/tune.c, tools/cmd_tune.c): the space's "key=v1,v2"
 * overrides and their errors; on a small builtin workload, that the best point is the
 * maximum of every point evaluated and never below the base, that the result is the same
 * with one worker or two, that refused configs are skipped with their message, that the
 * base's other keys and deployment are kept; through the built binary, argument errors
 * (exit 2 with a message) and --out read back by `tandem sim --config` giving the goodput
 * tune reported; and a short window of ../shared's azure2023_code.csv.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <jansson.h>

#include "sim.h"
#include "sim_test_util.h"
#include "tool_test_util.h"
#include "tune.h"

/* ---- the library ----------------------------------------------------------------------- */

static void space_set__rejects_bad_specs(void **state)
{
    (void)state;
    tdm_sim_tune_space s;
    tdm_sim_tune_space_default(&s);
    char err[512];
    assert_int_equal(tdm_sim_tune_space_set(&s, "max_num_seqs", err, sizeof err), -1);
    assert_non_null(strstr(err, "KEY=V1,V2"));
    assert_int_equal(tdm_sim_tune_space_set(&s, "bogus=1,2", err, sizeof err), -1);
    assert_non_null(strstr(err, "unknown key 'bogus'"));
    assert_non_null(strstr(err, "max_num_partial_prefills")); /* the known keys are listed */
    assert_int_equal(tdm_sim_tune_space_set(&s, "max_num_seqs=64,abc", err, sizeof err), -1);
    assert_non_null(strstr(err, "bad value 'abc'"));
    assert_int_equal(tdm_sim_tune_space_set(&s, "max_num_seqs=0", err, sizeof err), -1);
    assert_int_equal(tdm_sim_tune_space_set(&s, "max_num_seqs=1.5", err, sizeof err), -1);
    assert_int_equal(tdm_sim_tune_space_set(&s, "tbt_target_ms=-5", err, sizeof err), -1);
    assert_int_equal(tdm_sim_tune_space_set(&s, "mode=fast", err, sizeof err), -1);
    assert_non_null(strstr(err, "decode_first"));
    assert_int_equal(tdm_sim_tune_space_set(&s, "enable_chunked_prefill=maybe", err, sizeof err), -1);
    assert_int_equal(tdm_sim_tune_space_set(&s, "max_num_batched_tokens=", err, sizeof err), -1);
    assert_non_null(strstr(err, "no values"));
    assert_int_equal(tdm_sim_tune_space_set(&s, "max_num_seqs=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16",
                                            err, sizeof err), -1);
    assert_non_null(strstr(err, "at most"));
    /* the failed specs left the space as it was: the defaults */
    tdm_sim_tune_space d;
    tdm_sim_tune_space_default(&d);
    assert_memory_equal(&s, &d, sizeof s);
    /* accepted: sorted, duplicates dropped, booleans normalised */
    assert_int_equal(tdm_sim_tune_space_set(&s, "max_num_seqs=256,64,64,128", err, sizeof err), 0);
    assert_int_equal(tdm_sim_tune_space_set(&s, "enable_chunked_prefill=1", err, sizeof err), 0);
    for (int a = 0; a < s.n; a++) {
        if (!strcmp(s.ax[a].key, "max_num_seqs")) {
            assert_int_equal(s.ax[a].n, 3);
            assert_string_equal(s.ax[a].vals[0], "64");
            assert_string_equal(s.ax[a].vals[2], "256");
        }
        if (!strcmp(s.ax[a].key, "enable_chunked_prefill")) {
            assert_int_equal(s.ax[a].n, 1);
            assert_string_equal(s.ax[a].vals[0], "true");
        }
    }
    tdm_sim_tune_objective o;
    assert_int_equal(tdm_sim_tune_objective_parse("attainment", &o), 0);
    assert_int_equal(o, TDM_SIM_TUNE_ATTAINMENT);
    assert_int_equal(tdm_sim_tune_objective_parse("speed", &o), -1);
}

typedef struct env {
    tdm_sim_trace t;
    tdm_sim_model m;
    tdm_sim_hw h;
    tdm_sim_run_opts ro;
} env;

static void env_init(env *e, size_t nreq)
{
    char err[TDM_SIM_ERRLEN];
    assert_int_equal(tdm_sim_model_load("llama-3-8b", &e->m, err, sizeof err), 0);
    assert_int_equal(tdm_sim_hw_load("h100-sxm", &e->h, err, sizeof err), 0);
    tdm_sim_trace_opts to;
    tdm_sim_trace_opts_init(&to);
    to.max_requests = nreq;
    to.max_len = e->m.max_len;
    assert_int_equal(tdm_sim_trace_load("builtin", &to, &e->t, err, sizeof err), 0);
    tdm_sim_run_opts_init(&e->ro);
    e->ro.slo_ttft_s = 0.3;
    e->ro.slo_tpot_s = 0.025;
}

/* A small space (fast) that still has every phase: grid and refinement. */
static void small_space(tdm_sim_tune_space *s)
{
    char err[256];
    tdm_sim_tune_space_default(s);
    assert_int_equal(tdm_sim_tune_space_set(s, "max_num_batched_tokens=512,1024,2048,4096", err, sizeof err), 0);
    assert_int_equal(tdm_sim_tune_space_set(s, "tbt_target_ms=0,20,30,50", err, sizeof err), 0);
    assert_int_equal(tdm_sim_tune_space_set(s, "max_num_seqs=64,128,256", err, sizeof err), 0);
    assert_int_equal(tdm_sim_tune_space_set(s, "long_prefill_token_threshold=0,512", err, sizeof err), 0);
    assert_int_equal(tdm_sim_tune_space_set(s, "max_num_partial_prefills=0", err, sizeof err), 0);
    assert_int_equal(tdm_sim_tune_space_set(s, "enable_chunked_prefill=true", err, sizeof err), 0);
}

static void run__best_is_the_maximum_and_never_below_the_base(void **state)
{
    (void)state;
    env e;
    env_init(&e, 150);
    tdm_sim_tune_space s;
    small_space(&s);
    tdm_sim_tune_opts o;
    tdm_sim_tune_opts_init(&o);
    o.budget = 16;
    tdm_sim_tune_result r;
    char err[TDM_SIM_ERRLEN];
    const char *base = "{\"mode\": \"vllm\", \"max_num_batched_tokens\": 8192, \"max_num_seqs\": 256}";
    assert_int_equal(tdm_sim_tune_run(&e.t, base, &e.m, &e.h, &e.ro, &s, &o, &r, err, sizeof err), 0);
    assert_true(r.evaluated >= 2 && r.evaluated <= 16);
    int sims = 0;
    for (size_t i = 0; i < r.n; i++) sims += !r.pts[i].refused;
    assert_int_equal(sims, r.evaluated);
    assert_true(r.pts[0].is_base && r.pts[0].ok && r.pts[0].value > 0);
    const tdm_sim_tune_point *b = &r.pts[r.best];
    assert_true(b->ok);
    assert_true(b->value >= r.pts[0].value);
    int grid = 0, refine = 0;
    uint64_t runs = 0;
    for (size_t i = 0; i < r.n; i++) {
        runs += (uint64_t)r.pts[i].runs;
        if (!r.pts[i].ok) continue;
        assert_true(r.pts[i].value <= b->value);
        if (i < r.best) assert_true(r.pts[i].value < b->value); /* the first among equals */
        grid += r.pts[i].phase == 1;
        refine += r.pts[i].phase == 2;
        for (size_t j = 0; j < i; j++) /* no point evaluated twice */
            if (!r.pts[j].is_base) assert_string_not_equal(r.pts[i].label, r.pts[j].label);
    }
    assert_int_equal(runs, r.runs);
    assert_true(grid > 0 && refine > 0);
    /* the base's 8192 joined the token axis: the axis now has it in order */
    for (int a = 0; a < s.n; a++)
        if (!strcmp(s.ax[a].key, "max_num_batched_tokens")) {
            assert_int_equal(s.ax[a].n, 5);
            assert_string_equal(s.ax[a].vals[4], "8192");
            assert_int_equal(s.ax[a].start, 4);
        }
    /* what was evaluated is what the point's document says: its goodput again, directly */
    char *doc = tdm_sim_tune_point_json(base, &s, b, "tuned", NULL);
    assert_non_null(doc);
    tdm_sim_config cfg;
    assert_int_equal(tdm_sim_config_parse(doc, "x", &e.m, &e.h, &cfg, err, sizeof err), 0);
    tdm_sim_goodput_out g;
    assert_int_equal(tdm_sim_goodput(&e.t, &cfg, &e.ro, &g, err, sizeof err), 0);
    assert_true(g.req_s == b->value);
    tdm_sim_config_free(&cfg);
    free(doc);
    tdm_sim_tune_result_free(&r);
    tdm_sim_trace_free(&e.t);
}

static void run__same_result_with_one_or_two_workers(void **state)
{
    (void)state;
    env e;
    env_init(&e, 100);
    tdm_sim_tune_result r[2];
    char err[TDM_SIM_ERRLEN];
    for (int k = 0; k < 2; k++) {
        tdm_sim_tune_space s;
        small_space(&s);
        tdm_sim_tune_opts o;
        tdm_sim_tune_opts_init(&o);
        o.budget = 12;
        o.jobs = k + 1;
        assert_int_equal(tdm_sim_tune_run(&e.t, NULL, &e.m, &e.h, &e.ro, &s, &o, &r[k], err, sizeof err), 0);
    }
    assert_int_equal(r[0].n, r[1].n);
    assert_int_equal(r[0].best, r[1].best);
    assert_int_equal(r[0].runs, r[1].runs);
    for (size_t i = 0; i < r[0].n; i++) {
        assert_string_equal(r[0].pts[i].label, r[1].pts[i].label);
        assert_int_equal(r[0].pts[i].ok, r[1].pts[i].ok);
        assert_true(r[0].pts[i].value == r[1].pts[i].value);
    }
    tdm_sim_tune_result_free(&r[0]);
    tdm_sim_tune_result_free(&r[1]);
    tdm_sim_trace_free(&e.t);
}

static void run__refused_configs_are_skipped_with_their_message(void **state)
{
    (void)state;
    env e;
    env_init(&e, 60);
    tdm_sim_tune_space s;
    char err[TDM_SIM_ERRLEN];
    tdm_sim_tune_space_default(&s);
    /* a 256-token budget under 512 sequences is refused by the scheduler */
    assert_int_equal(tdm_sim_tune_space_set(&s, "mode=vllm", err, sizeof err), 0);
    assert_int_equal(tdm_sim_tune_space_set(&s, "max_num_batched_tokens=256,2048", err, sizeof err), 0);
    assert_int_equal(tdm_sim_tune_space_set(&s, "max_num_seqs=512", err, sizeof err), 0);
    assert_int_equal(tdm_sim_tune_space_set(&s, "long_prefill_token_threshold=0", err, sizeof err), 0);
    assert_int_equal(tdm_sim_tune_space_set(&s, "enable_chunked_prefill=true", err, sizeof err), 0);
    tdm_sim_tune_opts o;
    tdm_sim_tune_opts_init(&o);
    o.budget = 6;
    o.jobs = 2;
    o.objective = TDM_SIM_TUNE_ATTAINMENT;
    tdm_sim_tune_result r;
    assert_int_equal(tdm_sim_tune_run(&e.t, "{\"max_num_seqs\": 512, \"max_num_batched_tokens\": 2048}",
                                      &e.m, &e.h, &e.ro, &s, &o, &r, err, sizeof err), 0);
    int refused = 0;
    for (size_t i = 0; i < r.n; i++) {
        if (r.pts[i].ok) {
            assert_true(r.pts[i].value >= 0 && r.pts[i].value <= 1); /* an attainment */
            continue;
        }
        refused++;
        assert_true(r.pts[i].refused);
        assert_int_equal(r.pts[i].runs, 0);
        assert_non_null(strstr(r.pts[i].label, "B256"));
        assert_non_null(strstr(r.pts[i].err, "max_num_seqs"));
    }
    assert_int_equal(refused, 1);
    assert_true(r.pts[r.best].ok);
    tdm_sim_tune_result_free(&r);
    tdm_sim_trace_free(&e.t);
}

static void run__bad_arguments_are_refused(void **state)
{
    (void)state;
    env e;
    env_init(&e, 20);
    tdm_sim_tune_space s;
    tdm_sim_tune_space_default(&s);
    tdm_sim_tune_opts o;
    tdm_sim_tune_opts_init(&o);
    tdm_sim_tune_result r;
    char err[TDM_SIM_ERRLEN];
    o.budget = 0;
    assert_int_equal(tdm_sim_tune_run(&e.t, NULL, &e.m, &e.h, &e.ro, &s, &o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "budget"));
    assert_null(r.pts);
    o.budget = 4;
    e.ro.concurrency = 8;
    assert_int_equal(tdm_sim_tune_run(&e.t, NULL, &e.m, &e.h, &e.ro, &s, &o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "closed loop"));
    e.ro.concurrency = 0;
    assert_int_equal(tdm_sim_tune_run(&e.t, "{\"mode\": ", &e.m, &e.h, &e.ro, &s, &o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "base config"));
    assert_int_equal(tdm_sim_tune_run(&e.t, "{\"max_num_seqs\": \"many\"}", &e.m, &e.h, &e.ro, &s, &o,
                                      &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "max_num_seqs"));
    tdm_sim_trace_free(&e.t);
}

static void point_json__keeps_the_base_keys_and_deployment(void **state)
{
    (void)state;
    tdm_sim_tune_space s;
    char err[256];
    tdm_sim_tune_space_default(&s);
    assert_int_equal(tdm_sim_tune_space_set(&s, "mode=decode_first", err, sizeof err), 0);
    tdm_sim_tune_point p;
    memset(&p, 0, sizeof p);
    for (int a = 0; a < TDM_SIM_TUNE_MAXAXES; a++) p.idx[a] = -1;
    for (int a = 0; a < s.n; a++) {
        if (!strcmp(s.ax[a].key, "mode")) p.idx[a] = 0;
        if (!strcmp(s.ax[a].key, "max_num_seqs")) p.idx[a] = 3;        /* 256 */
        if (!strcmp(s.ax[a].key, "tbt_target_ms")) p.idx[a] = 2;       /* 20 */
    }
    const char *base = "{\"name\": \"two\", \"scheduler\": {\"policy\": \"priority\", \"max_num_seqs\": 8},"
                       " \"deployment\": {\"instances\": 2, \"router\": \"round_robin\","
                       " \"scheduler\": {\"max_num_seqs\": 16}}}";
    char *doc = tdm_sim_tune_point_json(base, &s, &p, "tuned", "d");
    assert_non_null(doc);
    json_t *o = json_loads(doc, 0, NULL);
    assert_non_null(o);
    json_t *sc = json_object_get(o, "scheduler"), *dep = json_object_get(o, "deployment");
    assert_string_equal(json_string_value(json_object_get(sc, "policy")), "priority");
    assert_string_equal(json_string_value(json_object_get(sc, "mode")), "decode_first");
    assert_int_equal(json_integer_value(json_object_get(sc, "max_num_seqs")), 256);
    assert_int_equal(json_integer_value(json_object_get(sc, "tbt_target_ms")), 20);
    assert_int_equal(json_integer_value(json_object_get(dep, "instances")), 2);
    /* the pool's own value would override the top-level one: it is set too */
    assert_int_equal(json_integer_value(json_object_get(json_object_get(dep, "scheduler"), "max_num_seqs")), 256);
    assert_string_equal(json_string_value(json_object_get(o, "name")), "tuned");
    tdm_sim_model m;
    tdm_sim_hw h;
    assert_int_equal(tdm_sim_model_load("llama-3-8b", &m, err, sizeof err), 0);
    assert_int_equal(tdm_sim_hw_load("h100-sxm", &h, err, sizeof err), 0);
    tdm_sim_config cfg;
    assert_int_equal(tdm_sim_config_parse(doc, NULL, &m, &h, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.pools[0].instances, 2);
    assert_int_equal(cfg.router, TDM_SIM_ROUTER_ROUND_ROBIN);
    assert_non_null(strstr(cfg.pools[0].sched_json, "\"max_num_seqs\":256"));
    tdm_sim_config_free(&cfg);
    json_decref(o);
    free(doc);
}

/* ---- the command ----------------------------------------------------------------------- */


static int file_has(const char *path, const char *needle)
{
    size_t n;
    char *b = tdm_sim__slurp(path, &n);
    int r = b && strstr(b, needle) != NULL;
    free(b);
    return r;
}

static void tune_command__argument_errors_exit_2_with_a_message(void **state)
{
    (void)state;
    NEED_TOOL();
    char e[256];
    write_tmp(e, sizeof e, "tune-err.txt", "");
    static const struct {
        const char *args, *msg;
    } C[] = {
        {"--space bogus=1", "unknown key 'bogus'"},
        {"--space max_num_seqs", "KEY=V1,V2"},
        {"--space max_num_seqs=x", "bad value 'x'"},
        {"--budget 0", "--budget: bad value '0'"},
        {"--budget many", "--budget: bad value 'many'"},
        {"--objective speed", "goodput, attainment or throughput"},
        {"--jobs 0", "--jobs"},
        {"--budget", "--budget needs a value"},
        {"--concurrency 4", "closed loop"},
        {"--policy fcfs", "not an option of tune"},
        {"a.json b.json", "one base config at most"},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        assert_int_equal(SH("%s tune --max-requests 10 %s >/dev/null 2>%s", g_tool, C[i].args, e), 2);
        if (!file_has(e, C[i].msg)) fail_msg("tune %s: no '%s' in the message", C[i].args, C[i].msg);
    }
    assert_int_equal(SH("%s tune /nonexistent.json --max-requests 10 >/dev/null 2>%s", g_tool, e), 1);
    assert_true(file_has(e, "nonexistent.json"));
    unlink(e);
}

static void tune_command__out_reads_back_with_the_goodput_reported(void **state)
{
    (void)state;
    NEED_TOOL();
    char out[256], js[256], log[256], sim[256];
    write_tmp(out, sizeof out, "tune-best.json", "");
    write_tmp(js, sizeof js, "tune-points.json", "");
    write_tmp(log, sizeof log, "tune-log.txt", "");
    write_tmp(sim, sizeof sim, "tune-sim.json", "");
    const char *w = "--max-requests 120 --slo-ttft-ms 300 --slo-tpot-ms 25";
    assert_int_equal(SH("%s tune %s --space max_num_batched_tokens=512,2048 --space max_num_seqs=128,256 "
                        "--space long_prefill_token_threshold=0 --space tbt_target_ms=0,30 "
                        "--space max_num_partial_prefills=0 --space enable_chunked_prefill=true "
                        "--budget 8 --jobs 2 --quiet --out %s --json %s > %s", g_tool, w, out, js, log), 0);
    assert_true(file_has(log, "tune best="));
    assert_true(file_has(log, "evaluated="));
    json_t *p = load_json(js);
    size_t best = (size_t)json_integer_value(json_object_get(p, "best"));
    json_t *pts = json_object_get(p, "points");
    assert_true(json_array_size(pts) >= 2);
    assert_true(json_integer_value(json_object_get(p, "evaluated")) <= 8);
    double bv = json_number_value(json_object_get(json_array_get(pts, best), "value"));
    double base = json_number_value(json_object_get(json_array_get(pts, 0), "value"));
    assert_true(bv >= base && bv > 0);
    for (size_t i = 0; i < json_array_size(pts); i++)
        assert_true(json_number_value(json_object_get(json_array_get(pts, i), "value")) <= bv);
    json_decref(p);
    /* the config tune wrote, run by tandem sim: the same goodput */
    assert_int_equal(SH("%s sim --config %s %s --goodput --quiet --json %s >/dev/null", g_tool, out, w, sim), 0);
    json_t *s = load_json(sim);
    double g = json_number_value(json_object_get(s, "goodput_req_s"));
    assert_true(fabs(g - bv) <= 1e-6 * bv);
    json_decref(s);
    assert_int_equal(SH("%s ab %s %s --quiet >/dev/null", g_tool, out, out), 0);
    unlink(out);
    unlink(js);
    unlink(log);
    unlink(sim);
}

static void tune_command__azure_code_window(void **state)
{
    (void)state;
    NEED_TOOL();
    char tr[512], js[256];
    NEED_SHARED("traces/azure2023_code.csv", tr);
    if (access("configs/vllm-default.json", R_OK) != 0) {
        printf("[ SKIP     ] configs/ not found from the working directory\n");
        skip();
        return;
    }
    write_tmp(js, sizeof js, "tune-azure.json", "");
    assert_int_equal(SH("%s tune configs/vllm-default.json --trace %s --max-requests 300 --slo-ttft-ms 300 "
                        "--slo-tpot-ms 25 --budget 6 --quiet --json %s >/dev/null", g_tool, tr, js), 0);
    json_t *p = load_json(js);
    json_t *pts = json_object_get(p, "points");
    size_t best = (size_t)json_integer_value(json_object_get(p, "best"));
    assert_true(json_number_value(json_object_get(json_array_get(pts, best), "value")) >=
                json_number_value(json_object_get(json_array_get(pts, 0), "value")));
    assert_int_equal(json_integer_value(json_object_get(p, "evaluated")), 6);
    json_decref(p);
    unlink(js);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(space_set__rejects_bad_specs),
        cmocka_unit_test(run__best_is_the_maximum_and_never_below_the_base),
        cmocka_unit_test(run__same_result_with_one_or_two_workers),
        cmocka_unit_test(run__refused_configs_are_skipped_with_their_message),
        cmocka_unit_test(run__bad_arguments_are_refused),
        cmocka_unit_test(point_json__keeps_the_base_keys_and_deployment),
        cmocka_unit_test(tune_command__argument_errors_exit_2_with_a_message),
        cmocka_unit_test(tune_command__out_reads_back_with_the_goodput_reported),
        cmocka_unit_test(tune_command__azure_code_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
