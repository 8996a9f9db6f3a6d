/*
 * test_tools.c -- the subcommands end to end through the built `tandem` binary
 * (TANDEM_BUILD, else build/; skipped when it is not built): `cost --json` (terms and which
 * one binds), `sweep --json` (the Pareto marks are exactly the non-dominated points), `ab
 * --plot` (a PNG, when gnuplot is installed), `sim --requests-csv`, `demo`, and a malformed
 * trace failing with its line and column.
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
#include "tool_test_util.h"


static void cost_command__json_terms_and_bound(void **state)
{
    (void)state;
    NEED_TOOL();
    char out[256];
    write_tmp(out, sizeof out, "cost.json", "");
    assert_int_equal(SH("%s cost --model llama-3-8b --hw h100-sxm --prefill 4096 --decode-batch 32 "
                        "--context 1024 --json > %s", g_tool, out), 0);
    json_t *o = load_json(out);
    json_t *p = json_object_get(o, "prefill"), *d = json_object_get(o, "decode");
    assert_string_equal(json_string_value(json_object_get(p, "bound")), "compute");
    assert_string_equal(json_string_value(json_object_get(d, "bound")), "memory");
    double sum = 0;
    static const char *const K[] = {"linear_ms", "attention_ms", "allreduce_ms", "overhead_ms"};
    for (int i = 0; i < 4; i++) sum += json_number_value(json_object_get(p, K[i]));
    assert_float_equal(sum, json_number_value(json_object_get(p, "total_ms")), 1e-3);
    json_decref(o);
    unlink(out);
    assert_int_equal(SH("%s cost --model nope 2>/dev/null", g_tool), 2);
}

static void sweep_command__pareto_marks_the_non_dominated(void **state)
{
    (void)state;
    NEED_TOOL();
    char out[256];
    write_tmp(out, sizeof out, "sweep.json", "");
    assert_int_equal(SH("%s sweep --budget 256,1024,4096 --mode vllm,decode_first --tbt-ms 30 "
                        "--max-requests 200 --rate 30 --quiet --json %s >/dev/null", g_tool, out), 0);
    json_t *o = load_json(out);
    json_t *pts = json_object_get(o, "points");
    size_t n = json_array_size(pts);
    assert_int_equal(n, 6);
    size_t nf = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(pts, i);
        double ta = json_number_value(json_object_get(a, "output_throughput_tok_s"));
        double la = json_number_value(json_object_get(a, "tpot_p99_s"));
        int dominated = 0;
        for (size_t j = 0; j < n; j++) {
            json_t *b = json_array_get(pts, j);
            double tb = json_number_value(json_object_get(b, "output_throughput_tok_s"));
            double lb = json_number_value(json_object_get(b, "tpot_p99_s"));
            if (j != i && tb >= ta && lb <= la && (tb > ta || lb < la)) dominated = 1;
        }
        int front = json_is_true(json_object_get(a, "pareto"));
        assert_int_equal(front, !dominated);
        nf += front;
    }
    assert_true(nf >= 1);
    json_decref(o);
    unlink(out);
}

static void ab_command__plot_writes_a_png(void **state)
{
    (void)state;
    NEED_TOOL();
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        printf("[ SKIP     ] gnuplot not installed\n");
        skip();
        return;
    }
    char a[256], b[256], png[256];
    write_tmp(a, sizeof a, "a.json", "{\"name\": \"a\", \"scheduler\": {\"max_num_batched_tokens\": 512}}");
    write_tmp(b, sizeof b, "b.json", "{\"mode\": \"decode_first\", \"tbt_target_ms\": 30}");
    write_tmp(png, sizeof png, "ab.png", "");
    unlink(png);
    assert_int_equal(SH("%s ab %s %s --max-requests 100 --quiet --plot %s >/dev/null", g_tool, a, b, png), 0);
    FILE *f = fopen(png, "rb");
    assert_non_null(f);
    unsigned char magic[8] = {0};
    assert_int_equal(fread(magic, 1, 8, f), 8);
    fclose(f);
    assert_memory_equal(magic, "\x89PNG\r\n\x1a\n", 8);
    unlink(a);
    unlink(b);
    unlink(png);
}

static void sim_command__requests_csv_and_demo(void **state)
{
    (void)state;
    NEED_TOOL();
    char csv[256];
    write_tmp(csv, sizeof csv, "req.csv", "");
    assert_int_equal(SH("%s sim --max-requests 50 --quiet --requests-csv %s >/dev/null", g_tool, csv), 0);
    FILE *f = fopen(csv, "r");
    assert_non_null(f);
    char line[512];
    int n = 0, finished = 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        finished += strstr(line, ",finished,") != NULL;
    }
    fclose(f);
    assert_int_equal(n, 51);
    assert_int_equal(finished, 50);
    unlink(csv);
    assert_int_equal(SH("%s demo --quiet >/dev/null", g_tool), 0);
}

static void sim_command__malformed_trace_names_line_and_column(void **state)
{
    (void)state;
    NEED_TOOL();
    char tr[256], out[256];
    write_tmp(tr, sizeof tr, "bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,10,5\n"
                                        "2023-11-16 18:17:04.1,10,five\n");
    write_tmp(out, sizeof out, "err.txt", "");
    assert_int_equal(SH("%s sim --trace %s --quiet 2> %s >/dev/null", g_tool, tr, out), 1);
    FILE *f = fopen(out, "r");
    char msg[1024] = "";
    assert_non_null(fgets(msg, sizeof msg, f));
    fclose(f);
    char want[300];
    snprintf(want, sizeof want, "%s:3:26:", tr);
    if (!strstr(msg, want)) fail_msg("'%s' lacks '%s'", msg, want);
    unlink(tr);
    unlink(out);
}

/* The closed loop's aiperf options: --warmup-drain and --desync[-round] need --concurrency,
 * --dataset-entries needs --isl, --desync-round a whole number of waves >= 1 (argument
 * errors exit 2); together they run, in tandem sim and in the silicon check's options. */
static void sim_command__aiperf_options(void **state)
{
    (void)state;
    NEED_TOOL();
    assert_int_equal(SH("%s sim --warmup-drain --quiet >/dev/null 2>&1", g_tool), 2);
    assert_int_equal(SH("%s sim --dataset-entries 10 --quiet >/dev/null 2>&1", g_tool), 2);
    assert_int_equal(SH("%s sim --isl 512 --osl 8 --dataset-entries 5 --concurrency 4 --max-requests 40 "
                        "--warmup-drain --desync --quiet >/dev/null 2>&1", g_tool), 0);
    assert_int_equal(SH("%s sim --desync --quiet >/dev/null 2>&1", g_tool), 2);
    assert_int_equal(SH("%s sim --desync-round 2 --quiet >/dev/null 2>&1", g_tool), 2);
    const char *bad[] = {"0", "1.5", "x", "-2", "1001"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(SH("%s sim --isl 64 --concurrency 4 --desync-round %s --quiet "
                            ">/dev/null 2>&1", g_tool, bad[i]), 2);
    assert_int_equal(SH("%s sim --isl 512 --osl 8 --concurrency 4 --max-requests 40 --warmup 8 "
                        "--warmup-drain --desync-round 3 --quiet >/dev/null 2>&1", g_tool), 0);
    assert_int_equal(SH("%s cost --calibrate --desync-round 0 >/dev/null 2>&1", g_tool), 2);
    assert_int_equal(SH("%s cost --calibrate --desync-round 2.5 >/dev/null 2>&1", g_tool), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cost_command__json_terms_and_bound),
        cmocka_unit_test(sweep_command__pareto_marks_the_non_dominated),
        cmocka_unit_test(ab_command__plot_writes_a_png),
        cmocka_unit_test(sim_command__requests_csv_and_demo),
        cmocka_unit_test(sim_command__malformed_trace_names_line_and_column),
        cmocka_unit_test(sim_command__aiperf_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
