/*
 * test_cli_load.c -- the load and trace options of the `tandem` binary end to end
 * (TANDEM_BUILD, else build/; skipped when it is not built): the closed-loop command a user
 * of vllm bench serve or aiconfigurator would type, the config's hardware in the header and
 * the JSON, the step CSV and the Chrome trace (loaded by Python's json when python3 is
 * installed), SLO classes from a trace, the three scheduling modes' configs side by side, and
 * `tandem cost --batch` in its three spellings.
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


static int file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[1 << 14];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

static void sim_command__closed_loop_as_a_benchmark_user_types_it(void **state)
{
    (void)state;
    NEED_TOOL();
    char js[256], out[256];
    write_tmp(js, sizeof js, "cl.json", "");
    write_tmp(out, sizeof out, "cl.txt", "");
    assert_int_equal(SH("%s sim --model llama-3.1-70b --hw h200 --tp 4 --isl 1024 --osl 1024 "
                        "--concurrency 32 --max-requests 128 --json %s --quiet > %s",
                        g_tool, js, out), 0);
    if (!file_has(out, "closed loop at concurrency 32")) fail_msg("header lacks the load");
    if (!file_has(out, "model llama-3.1-70b (tp 4, bf16) on h200")) fail_msg("header lacks the model");
    if (!file_has(out, "first 32 requests excluded as warm-up")) fail_msg("no warm-up line");
    json_t *o = load_json(js);
    assert_string_equal(json_string_value(json_object_get(o, "model")), "llama-3.1-70b");
    assert_string_equal(json_string_value(json_object_get(o, "hw")), "h200");
    assert_int_equal(json_integer_value(json_object_get(o, "tp")), 4);
    assert_int_equal(json_integer_value(json_object_get(o, "gpus")), 4);
    assert_int_equal(json_integer_value(json_object_get(o, "concurrency")), 32);
    assert_int_equal(json_integer_value(json_object_get(o, "warmup_requests")), 32);
    assert_int_equal(json_integer_value(json_object_get(o, "requests")), 96);
    assert_int_equal(json_integer_value(json_object_get(o, "completed")), 96);
    double tok = json_number_value(json_object_get(o, "output_throughput_tok_s"));
    double per = json_number_value(json_object_get(o, "output_throughput_tok_s_per_gpu"));
    assert_true(tok > 0);
    assert_float_equal(per * 4, tok, 1e-6 * tok);
    json_t *tp = json_object_get(json_object_get(o, "tpot_s"), "p50");
    assert_true(json_number_value(tp) > 0);
    json_decref(o);
    /* the options that make no sense together are refused */
    assert_int_equal(SH("%s sim --concurrency 4 --goodput --quiet 2>/dev/null >/dev/null", g_tool), 2);
    assert_int_equal(SH("%s sim --osl 5 --quiet 2>/dev/null >/dev/null", g_tool), 2);
    assert_int_equal(SH("%s ab --steps-csv %s x.json 2>/dev/null >/dev/null", g_tool, out), 2);
    unlink(js);
    unlink(out);
}

static void sim_command__config_hw_in_header_and_json(void **state)
{
    (void)state;
    NEED_TOOL();
    char cfg[256], js[256], out[256];
    write_tmp(cfg, sizeof cfg, "hwcfg.json", "{\"name\": \"on-h200\", \"deployment\": {\"hw\": \"h200\", \"tp\": 2}}");
    write_tmp(js, sizeof js, "hw.json", "");
    write_tmp(out, sizeof out, "hw.txt", "");
    assert_int_equal(SH("%s sim %s --max-requests 30 --quiet --json %s > %s", g_tool, cfg, js, out), 0);
    if (!file_has(out, "(tp 2, bf16) on h200\n")) fail_msg("header does not show the config's hw");
    if (!file_has(js, "\"hw\": \"h200\", \"tp\": 2")) fail_msg("JSON does not show the config's hw");
    write_tmp(cfg, sizeof cfg, "hwcfg2.json",
              "{\"deployment\": {\"mode\": \"disaggregated\", \"prefill\": {\"hw\": \"h100-sxm\"}, "
              "\"decode\": {\"hw\": \"h200\"}}}");
    assert_int_equal(SH("%s sim %s --max-requests 30 --quiet --json %s > %s", g_tool, cfg, js, out), 0);
    if (!file_has(out, "on prefill h100-sxm, decode h200")) fail_msg("disaggregated hw label");
    if (!file_has(js, "\"hw\": \"prefill h100-sxm, decode h200\"")) fail_msg("disaggregated JSON hw");
    unlink(cfg);
    unlink(js);
    unlink(out);
}

static void sim_command__step_csv_and_chrome_trace_load_in_python(void **state)
{
    (void)state;
    NEED_TOOL();
    char cfg[256], csv[256], tr[256];
    write_tmp(cfg, sizeof cfg, "pd.json",
              "{\"deployment\": {\"mode\": \"disaggregated\", \"prefill\": {\"instances\": 2}, "
              "\"decode\": {\"instances\": 2}}}");
    write_tmp(csv, sizeof csv, "steps.csv", "");
    write_tmp(tr, sizeof tr, "trace.json", "");
    assert_int_equal(SH("%s sim %s --max-requests 60 --quiet --steps-csv %s --chrome-trace %s >/dev/null",
                        g_tool, cfg, csv, tr), 0);
    if (!file_has(csv, "instance,role,step,start_s,duration_s,prefill_tokens,prefill_reqs,decode_reqs,"))
        fail_msg("steps CSV header");
    if (run_cmd("python3 -c 'import json' 2>/dev/null") != 0) {
        printf("[ SKIP     ] python3 not installed: the Chrome trace was checked by jansson only\n");
        json_t *o = load_json(tr);
        json_decref(o);
    } else {
        /* tracks: 4 instances + 2 prefill links; every slice an X event with ts and dur */
        assert_int_equal(SH("python3 -c '\n"
                            "import json, sys\n"
                            "d = json.load(open(sys.argv[1]))\n"
                            "ev = d[\"traceEvents\"]\n"
                            "names = {e[\"tid\"]: e[\"args\"][\"name\"] for e in ev if e[\"ph\"] == \"M\" and e[\"name\"] == \"thread_name\"}\n"
                            "assert len(names) == 6, names\n"
                            "xs = [e for e in ev if e[\"ph\"] == \"X\"]\n"
                            "assert all(e[\"dur\"] > 0 and e[\"ts\"] >= 0 and e[\"tid\"] in names for e in xs)\n"
                            "steps = [e for e in xs if e[\"cat\"] == \"step\"]\n"
                            "kv = [e for e in xs if e[\"cat\"] == \"kv_transfer\"]\n"
                            "assert {e[\"tid\"] for e in steps} == {0, 1, 2, 3}\n"
                            "assert len(kv) == 60 and {e[\"tid\"] for e in kv} <= {100000, 100001}\n"
                            "rows = open(sys.argv[2]).read().splitlines()[1:]\n"
                            "assert len(rows) == len(steps), (len(rows), len(steps))\n"
                            "for tid in names:\n"
                            "    s = sorted((e[\"ts\"], e[\"ts\"] + e[\"dur\"]) for e in xs if e[\"tid\"] == tid)\n"
                            "    assert all(a[1] <= b[0] + 1e-2 for a, b in zip(s, s[1:])), tid\n"
                            "' %s %s", tr, csv), 0);
    }
    unlink(cfg);
    unlink(csv);
    unlink(tr);
}

static void sim_command__slo_classes_from_the_trace(void **state)
{
    (void)state;
    NEED_TOOL();
    char tr[256], js[256];
    write_tmp(tr, sizeof tr, "slo.csv", "arrived_at,num_prefill_tokens,num_decode_tokens,slo_class\n"
                                        "0,100,10,chat\n0.01,100,10,batch\n0.02,100,10,chat\n");
    write_tmp(js, sizeof js, "slo.json", "");
    assert_int_equal(SH("%s sim --trace %s --quiet >/dev/null 2>&1", g_tool, tr), 1);
    assert_int_equal(SH("%s sim --trace %s --quiet --slo-class chat:0.001:0.001 --json %s >/dev/null",
                        g_tool, tr, js), 0);
    json_t *o = load_json(js);
    /* 1 us TTFT for chat cannot be met; the best-effort batch request meets it by definition */
    double att = json_number_value(json_object_get(json_object_get(o, "slo"), "ttft_attainment"));
    assert_float_equal(att, 1.0 / 3.0, 1e-9);
    json_t *cl = json_object_get(o, "slo_classes");
    assert_int_equal(json_array_size(cl), 2);
    json_t *chat = json_array_get(cl, 0), *batch = json_array_get(cl, 1);
    assert_string_equal(json_string_value(json_object_get(chat, "name")), "chat");
    assert_int_equal(json_integer_value(json_object_get(chat, "requests")), 2);
    assert_float_equal(json_number_value(json_object_get(chat, "ttft_s")), 1e-6, 1e-12);
    assert_float_equal(json_number_value(json_object_get(chat, "ttft_attainment")), 0.0, 0);
    assert_string_equal(json_string_value(json_object_get(batch, "name")), "batch");
    assert_float_equal(json_number_value(json_object_get(batch, "attainment")), 1.0, 0);
    json_decref(o);
    assert_int_equal(SH("%s sim --slo-class chat --quiet 2>/dev/null >/dev/null", g_tool), 2);
    assert_int_equal(SH("%s sim --slo-class :1:2 --quiet 2>/dev/null >/dev/null", g_tool), 2);
    unlink(tr);
    unlink(js);
}

/* The three scheduling modes' configs under configs/ run side by side on a long-context model. */
static void ab_command__the_three_mode_configs_run(void **state)
{
    (void)state;
    NEED_TOOL();
    if (access("configs/prefill-first.json", R_OK) != 0) {
        printf("[ SKIP     ] configs/ not found from the working directory\n");
        skip();
        return;
    }
    char out[256];
    write_tmp(out, sizeof out, "ab3.txt", "");
    assert_int_equal(SH("%s ab configs/vllm-default.json configs/stall-free.json configs/prefill-first.json "
                        "--model llama-3.1-8b --max-requests 120 --quiet > %s", g_tool, out), 0);
    if (!file_has(out, "prefill-first            1 GPU on h100-sxm")) fail_msg("no prefill-first column");
    unlink(out);
}

static double cost_total(const char *batch)
{
    char out[256];
    write_tmp(out, sizeof out, "cb.json", "");
    if (SH("%s cost --model llama-3-8b --hw h100-sxm --batch '%s' --json > %s", g_tool, batch, out) != 0)
        fail_msg("cost --batch '%s' failed", batch);
    json_t *o = load_json(out);
    double v = json_number_value(json_object_get(json_object_get(o, "step"), "total_ms"));
    json_decref(o);
    unlink(out);
    return v;
}

static void cost_command__batch_spec_json_and_file_agree(void **state)
{
    (void)state;
    NEED_TOOL();
    double spec = cost_total("prefill:512@2048,decode:64@1024");
    double js = cost_total("[{\"kind\": \"prefill\", \"tokens\": 512, \"context\": 2048}, "
                           "{\"kind\": \"decode\", \"count\": 64, \"context\": 1024}]");
    char f[256], arg[300];
    write_tmp(f, sizeof f, "batch.json", "[{\"kind\": \"decode\", \"count\": 64, \"context\": 1024}, "
                                         "{\"kind\": \"prefill\", \"tokens\": 512, \"context\": 2048}]");
    snprintf(arg, sizeof arg, "@%s", f);
    double file = cost_total(arg);
    assert_true(spec > 0);
    assert_float_equal(spec, js, 1e-9);
    assert_float_equal(spec, file, 1e-9);
    /* a chunk on a cached prefix reads and attends to that prefix: it costs more */
    assert_true(cost_total("prefill:512@8192") > cost_total("prefill:512"));
    /* a mixed batch costs more than either part, less than both steps apart */
    double p = cost_total("prefill:512@2048"), d = cost_total("decode:64@1024");
    assert_true(spec > p && spec > d && spec < p + d);
    assert_float_equal(cost_total("4*prefill:128"), cost_total("prefill:128,prefill:128,prefill:128,prefill:128"), 1e-9);
    assert_int_equal(SH("%s cost --batch 'prefill:x' 2>/dev/null", g_tool), 2);
    assert_int_equal(SH("%s cost --batch '[{\"kind\": \"decode\", \"tokens\": 3}]' 2>/dev/null", g_tool), 2);
    assert_int_equal(SH("%s cost --batch @/nonexistent/file 2>/dev/null", g_tool), 2);
    unlink(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sim_command__closed_loop_as_a_benchmark_user_types_it),
        cmocka_unit_test(sim_command__config_hw_in_header_and_json),
        cmocka_unit_test(sim_command__step_csv_and_chrome_trace_load_in_python),
        cmocka_unit_test(sim_command__slo_classes_from_the_trace),
        cmocka_unit_test(ab_command__the_three_mode_configs_run),
        cmocka_unit_test(cost_command__batch_spec_json_and_file_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
