/*
 * test_trace.c -- the trace readers on the shared traces (row counts, token statistics,
 * Mooncake prefix sharing turned into equal token blocks) and on malformed files (every
 * error names the line and the column), the options (window, cap, rate scale, clip,
 * synthetic arrivals and their seed) and the embedded workload.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sim.h"
#include "sim_test_util.h"

static void load_ok(const char *path, tdm_sim_trace_opts *o, tdm_sim_trace *t)
{
    char err[TDM_SIM_ERRLEN] = "";
    int rc = tdm_sim_trace_load(path, o, t, err, sizeof err);
    if (rc != 0) fprintf(stderr, "load: %s\n", err);
    assert_int_equal(rc, 0);
}

/* load_ok, and the trace has exactly n requests. */
static void load_rows(const char *path, tdm_sim_trace_opts *o, tdm_sim_trace *t, size_t n)
{
    load_ok(path, o, t);
    assert_int_equal(t->n, n);
}

/* Write text to the temporary file `name` (its path into p) and load it with the defaults. */
static void load_tmp_ok(char *p, size_t n, const char *name, const char *text, tdm_sim_trace *t)
{
    write_tmp(p, n, name, text);
    load_ok(p, NULL, t);
}

/* Loading path (options o, may be NULL) fails, the message holding `needle`. */
static void load_fails(const char *path, tdm_sim_trace_opts *o, const char *needle)
{
    char err[TDM_SIM_ERRLEN] = "";
    tdm_sim_trace t;
    assert_int_equal(tdm_sim_trace_load(path, o, &t, err, sizeof err), -1);
    if (!strstr(err, needle)) fail_msg("'%s' lacks '%s'", err, needle);
}

static void trace_load__azure_conv_all_rows(void **state)
{
    (void)state;
    char p[512];
    NEED_SHARED("traces/azure2023_conv.csv", p);
    tdm_sim_trace t;
    tdm_sim_trace_opts o;
    tdm_sim_trace_opts_init(&o);
    load_rows(p, &o, &t, 19366);
    double in = 0, out = 0;
    for (size_t i = 0; i < t.n; i++) {
        in += t.reqs[i].prompt_len;
        out += t.reqs[i].output_len;
        if (i) assert_true(t.reqs[i].arrival >= t.reqs[i - 1].arrival);
    }
    /* papers_traces.md 3.2: mean input 1155, output 211, span 58.4 min */
    assert_true(fabs(in / t.n - 1155) < 1.0);
    assert_true(fabs(out / t.n - 211) < 1.0);
    assert_true(fabs(tdm_sim_trace_span(&t) / 60 - 58.4) < 0.1);
    assert_float_equal(t.reqs[0].arrival, 0.0, 1e-12);
    tdm_sim_trace_free(&t);
}

static void trace_load__azure_code_all_rows(void **state)
{
    (void)state;
    char p[512];
    NEED_SHARED("traces/azure2023_code.csv", p);
    tdm_sim_trace t;
    load_rows(p, NULL, &t, 8819);
    /* 57.3 minutes; the first gap: 18:17:03.9799600 -> 18:17:04.0319600 = 52 ms */
    assert_true(fabs(tdm_sim_trace_span(&t) / 60 - 57.3) < 0.1);
    assert_float_equal(t.reqs[1].arrival, 0.052, 1e-6);
    assert_int_equal(t.reqs[0].prompt_len, 4808);
    assert_int_equal(t.reqs[0].output_len, 10);
    tdm_sim_trace_free(&t);
}

static void trace_load__mooncake_hash_ids_give_equal_token_blocks(void **state)
{
    (void)state;
    char p[512];
    NEED_SHARED("traces/mooncake_fast25_conversation_trace.jsonl", p);
    tdm_sim_trace t;
    tdm_sim_trace_opts o;
    tdm_sim_trace_opts_init(&o);
    o.jitter_s = 0;
    load_rows(p, &o, &t, 12031);
    assert_int_equal(t.hash_block, 512);
    /* the first two rows share hash id 0 (block 0) and nothing else */
    assert_int_equal(t.reqs[0].prompt_len, 6758);
    assert_int_equal(t.reqs[0].num_hash, 14);
    assert_int_equal(t.reqs[1].prompt_len, 7322);
    tdm_token *a = malloc(8000 * sizeof *a), *b = malloc(8000 * sizeof *b);
    tdm_sim_trace_tokens(&t, 0, a);
    tdm_sim_trace_tokens(&t, 1, b);
    assert_memory_equal(a, b, 512 * sizeof *a);
    assert_memory_not_equal(a + 512, b + 512, 512 * sizeof *a);
    /* every row: ceil(input / 512) hash ids */
    for (size_t i = 0; i < t.n; i++)
        assert_int_equal(t.reqs[i].num_hash, (t.reqs[i].prompt_len + 511) / 512);
    free(a);
    free(b);
    tdm_sim_trace_free(&t);
}

static void trace_load__mooncake_default_jitter_spreads_bins(void **state)
{
    (void)state;
    char p[512];
    NEED_SHARED("traces/mooncake_fast25_synthetic_trace.jsonl", p);
    tdm_sim_trace t;
    load_rows(p, NULL, &t, 3993);
    size_t zero = 0;
    for (size_t i = 1; i < t.n; i++) zero += t.reqs[i].arrival == t.reqs[i - 1].arrival;
    assert_true(zero < 10);
    tdm_sim_trace_free(&t);
}

static void trace_load__length_files_get_poisson_arrivals(void **state)
{
    (void)state;
    char p[512], q[512];
    NEED_SHARED("traces/sarathi_sharegpt_8k_filtered_lengths_llama2.csv", p);
    NEED_SHARED("traces/vidur_arxiv_summarization_lengths_llama2.csv", q);
    tdm_sim_trace t;
    tdm_sim_trace_opts o;
    tdm_sim_trace_opts_init(&o);
    o.rate = 4.0;
    load_rows(p, &o, &t, 30731);
    double rate = (double)(t.n - 1) / tdm_sim_trace_span(&t);
    assert_true(fabs(rate - 4.0) < 0.1);
    tdm_sim_trace_free(&t);
    o.max_len = 0;
    load_rows(q, &o, &t, 28257);
    tdm_sim_trace_free(&t);
}

static void trace_load__gamma_cv_controls_burstiness(void **state)
{
    (void)state;
    tdm_sim_trace_opts o;
    tdm_sim_trace_opts_init(&o);
    o.arrival = TDM_SIM_ARRIVAL_GAMMA;
    o.rate = 10;
    o.max_requests = 4000;
    double cvs[2];
    for (int k = 0; k < 2; k++) {
        o.cv = k ? 4.0 : 1.0;
        tdm_sim_trace t;
        load_ok("builtin", &o, &t);
        double s = 0, s2 = 0;
        size_t n = t.n - 1;
        for (size_t i = 1; i < t.n; i++) {
            double g = t.reqs[i].arrival - t.reqs[i - 1].arrival;
            s += g;
            s2 += g * g;
        }
        double mean = s / n, var = s2 / n - mean * mean;
        cvs[k] = sqrt(var) / mean;
        assert_true(fabs(mean - 0.1) < 0.03);
        tdm_sim_trace_free(&t);
    }
    assert_true(fabs(cvs[0] - 1.0) < 0.15);
    assert_true(cvs[1] > 2.5);
}

/* Field by field: the struct has tail padding that memcmp would read. */
static int reqs_equal(const tdm_sim_trace *a, const tdm_sim_trace *b)
{
    if (a->n != b->n) return 0;
    for (size_t i = 0; i < a->n; i++) {
        const tdm_sim_req *x = &a->reqs[i], *y = &b->reqs[i];
        if (x->arrival != y->arrival || x->prompt_len != y->prompt_len ||
            x->output_len != y->output_len || x->hash_off != y->hash_off ||
            x->num_hash != y->num_hash || x->priority != y->priority ||
            x->slo_class != y->slo_class)
            return 0;
    }
    return 1;
}

/* JSONL is parsed as it is read, in 4 MB chunks of whole lines: a 10 MB file with a 5 MB line
 * (a buffer that must grow) loads exactly as the whole text parses, and an error past the
 * first chunk names its own line. */
static void trace_load__jsonl_streams_in_chunks(void **state)
{
    (void)state;
    size_t cap = 16u << 20, n = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    size_t lines = 0;
    for (int i = 0; i < 120000; i++, lines++)
        n += (size_t)snprintf(text + n, cap - n, "{\"arrival_s\": %d, \"input_tokens\": %d, "
                              "\"output_tokens\": %d, \"hash_ids\": [%d, %d]}\n", i, 1024 + i % 7,
                              1 + i % 11, i % 5, i);
    /* one line longer than a chunk */
    n += (size_t)snprintf(text + n, cap - n, "{\"arrival_s\": 200000, \"input_tokens\": 100000000, "
                          "\"output_tokens\": 2, \"hash_ids\": [0");
    for (int k = 1; k < 700000; k++) n += (size_t)snprintf(text + n, cap - n, ",%d", k);
    n += (size_t)snprintf(text + n, cap - n, "]}\n");
    lines++;
    for (int i = 0; i < 20000; i++, lines++)
        n += (size_t)snprintf(text + n, cap - n, "{\"arrival_s\": %d, \"input_tokens\": 9, "
                              "\"output_tokens\": 3}\n", 300000 + i);
    assert_true(n > (size_t)(10u << 20) && n < cap);
    char p[512];
    write_tmp(p, sizeof p, "big.jsonl", text);
    tdm_sim_trace a, b;
    load_rows(p, NULL, &a, lines);
    char err[TDM_SIM_ERRLEN];
    assert_int_equal(tdm_sim_parse_jsonl(text, n, "big.jsonl", TDM_SIM_FMT_TANDEM, &b, err,
                                         sizeof err), 0);
    assert_true(reqs_equal(&a, &b));
    assert_int_equal(a.n_hash, b.n_hash);
    assert_memory_equal(a.hash_ids, b.hash_ids, a.n_hash * sizeof *a.hash_ids);
    assert_int_equal(a.reqs[120000].num_hash, 100000000 / 512 + 1);
    tdm_sim_trace_free(&a);
    tdm_sim_trace_free(&b);
    /* a bad line far past the first chunk */
    n += (size_t)snprintf(text + n, cap - n, "{\"arrival_s\": 1e9, \"input_tokens\": \"x\"}\n");
    write_tmp(p, sizeof p, "bad.jsonl", text);
    char want[64];
    snprintf(want, sizeof want, "bad.jsonl:%zu:", lines + 1);
    load_fails(p, NULL, want);
    free(text);
}

/* Vidur's request traces are detected by their arrived_at column and keep their arrivals. */
static void trace_load__vidur_trace_keeps_its_arrivals(void **state)
{
    (void)state;
    char p[256];
    tdm_sim_trace t;
    load_tmp_ok(p, sizeof p, "vidur.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n"
                                          "10.5,200,20\n10.0,100,10\n12.25,300,5\n", &t);
    assert_int_equal(t.n, 3);
    static const double AT[3] = {0.0, 0.5, 2.25};
    static const uint32_t PL[3] = {100, 200, 300};
    for (int i = 0; i < 3; i++) {
        assert_float_equal(t.reqs[i].arrival, AT[i], 1e-12);
        assert_int_equal(t.reqs[i].prompt_len, PL[i]);
    }
    tdm_sim_trace_free(&t);
    /* --format vidur on a file without arrived_at: the header error names it */
    tdm_sim_trace_opts o;
    tdm_sim_trace_opts_init(&o);
    o.fmt = TDM_SIM_FMT_VIDUR;
    write_tmp(p, sizeof p, "vidur2.csv", "num_prefill_tokens,num_decode_tokens\n5,6\n");
    load_fails(p, &o, "arrived_at,num_prefill_tokens,num_decode_tokens");
    write_tmp(p, sizeof p, "vidur3.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.1,5,6\nsoon,5,6\n");
    char want[300];
    snprintf(want, sizeof want, "%s:3:1: bad timestamp", p);
    load_fails(p, NULL, want);
    unlink(p);
}

static void trace_load__slo_class_column_and_field(void **state)
{
    (void)state;
    char p[256];
    tdm_sim_trace t;
    load_tmp_ok(p, sizeof p, "cls.csv", "arrived_at,num_prefill_tokens,num_decode_tokens,slo_class\n"
                                        "0,10,5,chat\n1,10,5,\n2,10,5,batch\n3,10,5,chat\n", &t);
    assert_int_equal(t.n_slo, 2);
    assert_string_equal(t.slo_names[0], "chat");
    assert_string_equal(t.slo_names[1], "batch");
    static const uint32_t CL[4] = {1, 0, 2, 1};
    for (int i = 0; i < 4; i++) assert_int_equal(t.reqs[i].slo_class, CL[i]);
    tdm_sim_trace_free(&t);
    load_tmp_ok(p, sizeof p, "cls.jsonl",
                "{\"arrival_s\": 0, \"input_tokens\": 9, \"output_tokens\": 3, \"slo_class\": \"chat\"}\n"
                "{\"arrival_s\": 1, \"input_tokens\": 9, \"output_tokens\": 3}\n", &t);
    assert_int_equal(t.n_slo, 1);
    assert_int_equal(t.reqs[0].slo_class, 1);
    assert_int_equal(t.reqs[1].slo_class, 0);
    tdm_sim_trace_free(&t);
    write_tmp(p, sizeof p, "cls2.jsonl", "{\"arrival_s\": 0, \"input_tokens\": 9, \"output_tokens\": 3, \"slo_class\": 7}\n");
    load_fails(p, NULL, ":1:57: \"slo_class\" must be a string");
    /* more classes than the table holds is an error, not a silent merge */
    char big[4096] = "num_prefill_tokens,num_decode_tokens,slo_class\n";
    for (int i = 0; i <= TDM_SIM_MAX_SLO_CLASSES; i++)
        snprintf(big + strlen(big), sizeof big - strlen(big), "5,5,c%d\n", i);
    write_tmp(p, sizeof p, "cls3.csv", big);
    load_fails(p, NULL, "more than 16 SLO classes");
    unlink(p);
}

static void trace_load__same_seed_same_trace(void **state)
{
    (void)state;
    tdm_sim_trace a, b, c;
    tdm_sim_trace_opts o;
    tdm_sim_trace_opts_init(&o);
    o.seed = 7;
    load_ok("builtin", &o, &a);
    load_ok("builtin", &o, &b);
    o.seed = 8;
    load_ok("builtin", &o, &c);
    assert_int_equal(a.n, b.n);
    assert_true(reqs_equal(&a, &b));
    assert_false(reqs_equal(&a, &c));
    tdm_sim_trace_free(&a);
    tdm_sim_trace_free(&b);
    tdm_sim_trace_free(&c);
}

static void trace_load__window_cap_scale_and_clip(void **state)
{
    (void)state;
    char path[256];
    write_tmp(path, sizeof path, "t.jsonl",
              "{\"arrival_s\": 0, \"input_tokens\": 10, \"output_tokens\": 5}\n"
              "{\"arrival_s\": 1, \"input_tokens\": 9000, \"output_tokens\": 100, \"priority\": 3}\n"
              "\n"
              "{\"arrival_s\": 2, \"input_tokens\": 30, \"output_tokens\": 5, \"hash_ids\": [4]}\n"
              "{\"arrival_s\": 3, \"input_tokens\": 40, \"output_tokens\": 5, \"id\": \"x\"}\n");
    tdm_sim_trace t;
    tdm_sim_trace_opts o;
    tdm_sim_trace_opts_init(&o);
    o.window_start = 1;
    o.window_end = 3;
    o.rate_scale = 2;
    o.max_len = 4096;
    load_rows(path, &o, &t, 2);
    assert_float_equal(t.reqs[0].arrival, 0.0, 1e-12);
    assert_float_equal(t.reqs[1].arrival, 0.5, 1e-12);
    assert_int_equal(t.reqs[0].prompt_len + t.reqs[0].output_len, 4096);
    assert_int_equal(t.reqs[0].output_len, 100);
    assert_int_equal(t.reqs[0].priority, 3);
    assert_int_equal(t.reqs[1].num_hash, 1);
    tdm_sim_trace_free(&t);
    o.window_start = 0;
    o.window_end = 0;
    o.max_requests = 3;
    load_rows(path, &o, &t, 3);
    tdm_sim_trace_free(&t);
    unlink(path);
}

/* A malformed file: the error must carry "name:line:col:" and mention `what`. */
static void expect_error(const char *name, const char *text, const char *where, const char *what)
{
    char path[256], err[TDM_SIM_ERRLEN] = "";
    write_tmp(path, sizeof path, name, text);
    tdm_sim_trace t;
    tdm_sim_trace_opts o;
    tdm_sim_trace_opts_init(&o);
    assert_int_equal(tdm_sim_trace_load(path, &o, &t, err, sizeof err), -1);
    char want[300];
    snprintf(want, sizeof want, "%s:%s:", path, where);
    if (!strstr(err, want) || !strstr(err, what))
        fail_msg("error '%s' lacks '%s' / '%s'", err, want, what);
    assert_null(t.reqs);
    unlink(path);
}

static void trace_load__malformed_azure_names_line_and_column(void **state)
{
    (void)state;
    expect_error("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                          "2023-11-16 18:17:03.9799600,4808,10\n"
                          "2023-11-16 18:17:04.0319600,31x0,8\n",
                 "3:29", "prompt token count");
    expect_error("b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                          "2023-13-16 18:17:03.97,4808,10\n",
                 "2:1", "bad timestamp");
    expect_error("c.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                          "2023-11-16 18:17:03.97,4808\n",
                 "2:24", "expected 3 columns");
    expect_error("d.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                          "2023-11-16 18:17:03.97,4808,-1\n",
                 "2:29", "output token count");
    expect_error("e.csv", "TIMESTAMP,Context,GeneratedTokens\n1,2,3\n", "1:1", "header lacks");
}

static void trace_load__malformed_lengths_names_line_and_column(void **state)
{
    (void)state;
    expect_error("l.csv", "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
                          "74,918,992,0.08\n290,,1195,0.32\n",
                 "3:5", "output token count");
}

static void trace_load__malformed_jsonl_names_line_and_column(void **state)
{
    (void)state;
    expect_error("m.jsonl", "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [0]}\n"
                            "{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [0,]}\n",
                 "2:73", "unexpected token");
    expect_error("n.jsonl", "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2}\n"
                            "{\"timestamp\": 0, \"input_length\": \"ten\", \"output_length\": 2}\n",
                 "2:18", "\"input_length\" must be a number");
    expect_error("o.jsonl", "{\"arrival_s\": 0, \"input_tokens\": 10}\n", "1:1",
                 "missing key \"output_tokens\"");
    expect_error("p.jsonl", "{\"arrival_s\": 0, \"input_tokens\": 10, \"output_tokens\": 1, \"colour\": 1}\n",
                 "1:58", "unknown key \"colour\"");
    expect_error("q.jsonl", "{\"arrival_s\": 0, \"input_tokens\": 10, \"output_tokens\": 1, \"hash_ids\": [-1]}\n",
                 "1:58", "hash_ids");
    expect_error("r.txt", "hello\n", "1:1", "unknown trace format");
}

static void trace_load__missing_file_is_an_error(void **state)
{
    (void)state;
    load_fails("/nonexistent/x.csv", NULL, "/nonexistent/x.csv");
}

static void trace_builtin__shares_system_prompts(void **state)
{
    (void)state;
    tdm_sim_trace t;
    load_ok("builtin", NULL, &t);
    assert_int_equal(t.n, 1200);
    size_t shared = 0;
    for (size_t i = 0; i < t.n; i++) shared += t.reqs[i].num_hash == 1;
    assert_true(shared > 300 && shared < 700);
    double rate = (double)(t.n - 1) / tdm_sim_trace_span(&t);
    assert_true(fabs(rate - 20) < 2);
    tdm_sim_trace_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(trace_load__azure_conv_all_rows),
        cmocka_unit_test(trace_load__azure_code_all_rows),
        cmocka_unit_test(trace_load__mooncake_hash_ids_give_equal_token_blocks),
        cmocka_unit_test(trace_load__mooncake_default_jitter_spreads_bins),
        cmocka_unit_test(trace_load__length_files_get_poisson_arrivals),
        cmocka_unit_test(trace_load__gamma_cv_controls_burstiness),
        cmocka_unit_test(trace_load__jsonl_streams_in_chunks),
        cmocka_unit_test(trace_load__vidur_trace_keeps_its_arrivals),
        cmocka_unit_test(trace_load__slo_class_column_and_field),
        cmocka_unit_test(trace_load__same_seed_same_trace),
        cmocka_unit_test(trace_load__window_cap_scale_and_clip),
        cmocka_unit_test(trace_load__malformed_azure_names_line_and_column),
        cmocka_unit_test(trace_load__malformed_lengths_names_line_and_column),
        cmocka_unit_test(trace_load__malformed_jsonl_names_line_and_column),
        cmocka_unit_test(trace_load__missing_file_is_an_error),
        cmocka_unit_test(trace_builtin__shares_system_prompts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
