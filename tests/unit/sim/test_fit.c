/*
 * test_fit.c -- `tandem fit` (sim/fit.c): on steps generated from a known step-time model the
 * fit recovers its coefficients (exactly without noise; within a few percent with noise and
 * timing outliers, which it drops), keeps a coefficient that is truly zero non-negative, and
 * the table set it writes makes the table cost model give the fitted step time for any
 * shape (also for a model whose LM head has the shape of a layer GEMM, as the e2e tiny
 * Llama's); the CSV reader names the file, line and column of what is wrong; the command
 * line writes hw.json and sched_cost.json and prints its held-out error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fit.h"
#include "sim.h"
#include "sim_test_util.h"
#include "tool_test_util.h"

/* The known model: overhead, per token, per sampled sequence, per decode context token (ns),
 * per prefill attention unit (ps). */
static const double TRUE_COEF[5] = {850.0, 11.5, 40.0, 30.0, 900.0};

static double true_us(const double c[5], const tdm_sim_fit_row *r, double lm_shared)
{
    double T = (double)r->prefill_tokens + r->decode_reqs;
    return c[0] + c[1] * T + c[2] * (r->emit_seqs + lm_shared * T) + c[3] * 1e-3 * r->decode_ctx +
           c[4] * 1e-6 * r->prefill_attn;
}

/* A random step: decode-only, prefill-only or mixed, as an engine produces them. */
static void random_shape(tdm_sim_rng *g, tdm_sim_fit_row *r)
{
    memset(r, 0, sizeof *r);
    int kind = (int)(tdm_sim_rng_uniform(g) * 3);
    if (kind != 1) { /* decodes */
        r->decode_reqs = 1 + (uint32_t)(tdm_sim_rng_uniform(g) * 128);
        r->decode_ctx = (uint64_t)(r->decode_reqs * (64 + tdm_sim_rng_uniform(g) * 3000));
    }
    if (kind != 0) { /* prefill chunks */
        r->prefill_reqs = 1 + (uint32_t)(tdm_sim_rng_uniform(g) * 4);
        for (uint32_t i = 0; i < r->prefill_reqs; i++) {
            double c = 16 + floor(tdm_sim_rng_uniform(g) * 1024);
            double p = floor(tdm_sim_rng_uniform(g) * 2048);
            r->prefill_tokens += (uint64_t)c;
            r->prefill_attn += c * (p + c / 2);
        }
    }
    r->emit_seqs = r->decode_reqs + (r->prefill_reqs ? (uint32_t)(tdm_sim_rng_uniform(g) * 2) : 0);
}

static tdm_sim_fit_row *synth(size_t n, uint64_t seed, const double c[5], double lm_shared,
                              double noise, double outlier_frac)
{
    tdm_sim_fit_row *rows = calloc(n, sizeof *rows);
    assert_non_null(rows);
    tdm_sim_rng g;
    tdm_sim_rng_seed(&g, seed);
    for (size_t i = 0; i < n; i++) {
        random_shape(&g, &rows[i]);
        double us = true_us(c, &rows[i], lm_shared);
        us *= 1 + noise * (2 * tdm_sim_rng_uniform(&g) - 1);
        if (tdm_sim_rng_uniform(&g) < outlier_frac) us *= 4; /* a descheduled step */
        rows[i].dur_s = us * 1e-6;
    }
    return rows;
}

static void model(const char *name, tdm_sim_model *m)
{
    char err[256];
    assert_int_equal(tdm_sim_model_load(name, m, err, sizeof err), 0);
}

static void assert_close(double got, double want, double rel)
{
    if (fabs(got - want) > rel * fabs(want) + 1e-9) fail_msg("got %.9g, want %.9g (+-%g%%)", got, want, 100 * rel);
}

static void fit_rows__recovers_a_known_model_exactly(void **state)
{
    (void)state;
    tdm_sim_model m;
    model("llama-3-8b", &m);
    tdm_sim_fit_row *rows = synth(1000, 1, TRUE_COEF, 0, 0, 0);
    tdm_sim_fit f;
    char err[256];
    assert_int_equal(tdm_sim_fit_rows(rows, 1000, 5, 0, &m, &f, err, sizeof err), 0);
    assert_true(f.lm_shared == 0);
    assert_int_equal(f.n_rows, 1000);
    assert_int_equal(f.n_held, 200);
    assert_int_equal(f.n_fit, 800);
    assert_int_equal(f.n_trimmed, 0);
    assert_close(f.overhead_us, TRUE_COEF[0], 1e-6);
    assert_close(f.token_us, TRUE_COEF[1], 1e-6);
    assert_close(f.seq_us, TRUE_COEF[2], 1e-6);
    assert_close(f.ctx_ns, TRUE_COEF[3], 1e-6);
    assert_close(f.attn_ps, TRUE_COEF[4], 1e-6);
    assert_true(f.held_mape < 1e-8);
    free(rows);
}

static void fit_rows__noise_and_outliers(void **state)
{
    (void)state;
    tdm_sim_model m;
    model("llama-3-8b", &m);
    tdm_sim_fit_row *rows = synth(4000, 2, TRUE_COEF, 0, 0.03, 0.02);
    tdm_sim_fit f;
    char err[256];
    assert_int_equal(tdm_sim_fit_rows(rows, 4000, 4, 1, &m, &f, err, sizeof err), 0);
    assert_true(f.n_trimmed >= 30);     /* ~2% of 3000 fitted rows are 4x slow */
    assert_true(f.n_trimmed <= 120);
    assert_close(f.overhead_us, TRUE_COEF[0], 0.05);
    assert_close(f.token_us, TRUE_COEF[1], 0.05);
    assert_close(f.seq_us, TRUE_COEF[2], 0.10);
    assert_close(f.ctx_ns, TRUE_COEF[3], 0.05);
    assert_close(f.attn_ps, TRUE_COEF[4], 0.05);
    assert_true(f.held_median_ape < 0.03);  /* the outliers are held out too: the median */
    assert_true(f.fit_mape < 0.03);
    free(rows);
}

static void fit_rows__mean_step_time_under_skewed_noise(void **state)
{
    (void)state;
    /* a loaded machine: each step takes 0.8x-longer than its cost, 0.8 + Exp(mean 0.5), so
     * the mean is 1.3x; serving throughput follows the mean, so the fit (no trimming) must
     * be 1.3x the cost and unbiased on held-out rows */
    tdm_sim_model m;
    model("llama-3-8b", &m);
    size_t n = 6000;
    tdm_sim_fit_row *rows = synth(n, 8, TRUE_COEF, 0, 0, 0);
    tdm_sim_rng g;
    tdm_sim_rng_seed(&g, 9);
    for (size_t i = 0; i < n; i++) rows[i].dur_s *= 0.8 + tdm_sim_rng_exp(&g, 0.5);
    tdm_sim_fit f;
    char err[256];
    assert_int_equal(tdm_sim_fit_rows(rows, n, 5, 0, &m, &f, err, sizeof err), 0);
    assert_int_equal(f.n_trimmed, 0);
    assert_close(f.overhead_us, 1.3 * TRUE_COEF[0], 0.12);   /* 1/y^2 weights: ~0.95x */
    assert_close(f.token_us, 1.3 * TRUE_COEF[1], 0.08);
    assert_close(f.ctx_ns, 1.3 * TRUE_COEF[3], 0.08);
    assert_close(f.held_total_ratio, 1.0, 0.04);
    /* the held-out steps' total time is predicted: sum of predictions vs sum of measured */
    double sp = 0, sm = 0;
    for (size_t i = 4; i < n; i += 5) {
        sp += tdm_sim_fit_predict(&f, &m, &rows[i]);
        sm += rows[i].dur_s;
    }
    assert_close(sp, sm, 0.04);
    free(rows);
}

static void fit_rows__a_zero_term_stays_non_negative(void **state)
{
    (void)state;
    tdm_sim_model m;
    model("llama-3-8b", &m);
    const double c[5] = {850.0, 11.5, 0.0, 30.0, 0.0};
    tdm_sim_fit_row *rows = synth(2000, 3, c, 0, 0.05, 0);
    tdm_sim_fit f;
    char err[256];
    assert_int_equal(tdm_sim_fit_rows(rows, 2000, 5, 0, &m, &f, err, sizeof err), 0);
    assert_true(f.seq_us >= 0 && f.seq_us < 2.0);
    assert_true(f.attn_ps >= 0 && f.attn_ps < 50.0);
    assert_close(f.token_us, 11.5, 0.05);
    free(rows);
}

static void fit_rows__bad_arguments(void **state)
{
    (void)state;
    tdm_sim_model m;
    model("llama-3-8b", &m);
    tdm_sim_fit_row *rows = synth(20, 4, TRUE_COEF, 0, 0, 0);
    tdm_sim_fit f;
    char err[256];
    assert_int_equal(tdm_sim_fit_rows(rows, 20, 1, 0, &m, &f, err, sizeof err), -1);
    assert_non_null(strstr(err, "holdout"));
    assert_int_equal(tdm_sim_fit_rows(rows, 8, 5, 0, &m, &f, err, sizeof err), -1);
    assert_non_null(strstr(err, "at least"));
    free(rows);
}

/* The written tables, loaded back as a hardware JSON: the table cost model's step time is
 * the fitted one for shapes across the grid. */
static void check_tables_reproduce(const char *model_name, double want_lm_shared, uint64_t seed)
{
    tdm_sim_model m;
    model(model_name, &m);
    tdm_sim_fit f;
    char err[512];
    tdm_sim_fit_row *rows = synth(600, seed, TRUE_COEF, want_lm_shared, 0, 0);
    assert_int_equal(tdm_sim_fit_rows(rows, 600, 5, 0, &m, &f, err, sizeof err), 0);
    assert_true(f.lm_shared == want_lm_shared);
    assert_close(f.seq_us, TRUE_COEF[2], 1e-6);
    char dir[] = "/tmp/tandem-fittest-XXXXXX";
    assert_non_null(mkdtemp(dir));
    if (tdm_sim_fit_write_tables(&f, &m, dir, "synthetic", err, sizeof err)) fail_msg("%s", err);
    char hwpath[600];
    snprintf(hwpath, sizeof hwpath, "%s/hw.json", dir);
    tdm_sim_hw hw;
    if (tdm_sim_hw_load(hwpath, &hw, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(hw.cost_model, TDM_SIM_COST_TABLE);
    tdm_sim_cost c;
    tdm_sim_cost_init(&c, &m, &hw);
    tdm_sim_rng g;
    tdm_sim_rng_seed(&g, seed + 100);
    for (int i = 0; i < 300; i++) {
        tdm_sim_fit_row r;
        random_shape(&g, &r);
        tdm_sim_shape sh;
        tdm_sim_fit_shape(&r, &sh);
        double got = tdm_sim_cost_step(&c, &sh, NULL);
        assert_close(got, tdm_sim_fit_predict(&f, &m, &r), 1e-6);
        assert_close(got, true_us(TRUE_COEF, &r, want_lm_shared) * 1e-6, 1e-6);
    }
    assert_int_equal(c.extrapolated_steps, 0);
    const char *names[] = {"hw.json", "gemm.txt", "elementwise.txt", "attn_context.txt",
                           "attn_generation.txt"};
    for (size_t i = 0; i < 5; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        assert_int_equal(unlink(p), 0);
    }
    assert_int_equal(rmdir(dir), 0);
    free(rows);
}

static void write_tables__table_model_reproduces_the_fit(void **state)
{
    (void)state;
    check_tables_reproduce("llama-3-8b", 0, 5);
}

static void write_tables__lm_head_sharing_a_layer_gemm_shape(void **state)
{
    (void)state;
    /* the e2e tiny Llama's shape (tests_vllm_e2e/gen_model.py asks for a 512-token vocabulary;
     * its trained tokenizer may have fewer): vocab 512 = 2 x intermediate 256, so the LM head
     * (512 x 128) is the gate/up GEMM's shape: 2 layers share its row */
    char path[256];
    write_tmp(path, sizeof path, "tiny-llama.json",
              "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 128, "
              "\"intermediate_size\": 256, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
              "\"num_key_value_heads\": 1, \"head_dim\": 64, \"vocab_size\": 512, "
              "\"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-05}");
    check_tables_reproduce(path, 2, 6);
    unlink(path);
}

/* ---- the CSV ---- */

static void read_csv__columns_by_name_and_legacy_files(void **state)
{
    (void)state;
    char path[256], err[512];
    write_tmp(path, sizeof path, "steps.csv",
              "instance,role,step,start_s,duration_s,prefill_tokens,prefill_reqs,decode_reqs,"
              "decode_context_tokens,batch_tokens,running,waiting,kv_usage,preemptions,emit_seqs,"
              "prefill_attn\n"
              "0,colocated,1,0.000000,0.012000,100,1,2,300,102,3,0,0.1,0,3,5000\n"
              "0,colocated,2,0.012000,0.000100,0,0,0,0,0,0,0,0.1,0,0,0\n"   /* empty: skipped */
              "0,colocated,3,0.013000,0.004000,0,0,4,40,4,4,0,0.1,0,4,0\n");
    tdm_sim_fit_row *rows;
    size_t n;
    if (tdm_sim_fit_read_csv(path, &rows, &n, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(n, 2);
    assert_true(rows[0].dur_s == 0.012 && rows[0].prefill_tokens == 100 && rows[0].prefill_reqs == 1);
    assert_true(rows[0].decode_reqs == 2 && rows[0].decode_ctx == 300 && rows[0].emit_seqs == 3);
    assert_true(rows[0].prefill_attn == 5000 && rows[1].decode_reqs == 4);
    free(rows);
    /* the columns before emit_seqs and prefill_attn existed, in another order */
    write_tmp(path, sizeof path, "legacy.csv",
              "prefill_reqs,duration_s,decode_reqs,prefill_tokens,decode_context_tokens\n"
              "2,0.02,3,200,90\n");
    if (tdm_sim_fit_read_csv(path, &rows, &n, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(n, 1);
    assert_true(rows[0].emit_seqs == 5 && rows[0].prefill_attn == 200.0 * 200 / 4);
    free(rows);
    unlink(path);
}

static void read_csv__errors_name_file_line_and_column(void **state)
{
    (void)state;
    static const struct { const char *text, *needle; } cases[] = {
        {"", "empty file"},
        {"duration_s,prefill_tokens,prefill_reqs,decode_reqs\n1,2,3,4\n",
         ":1: no column \"decode_context_tokens\""},
        {"duration_s,prefill_tokens,prefill_reqs,decode_reqs,decode_context_tokens\n"
         "0.1,10,1,0,0\n0.1,1x0,1,0,0\n", ":3: column prefill_tokens: bad value '1x0'"},
        {"duration_s,prefill_tokens,prefill_reqs,decode_reqs,decode_context_tokens\n0.1,10,1\n",
         ":2: 3 fields, the header names 5"},
        {"duration_s,prefill_tokens,prefill_reqs,decode_reqs,decode_context_tokens\n-1,10,1,0,0\n",
         ":2: column duration_s: bad value '-1'"},
        {"duration_s,prefill_tokens,prefill_reqs,decode_reqs,decode_context_tokens\n0,10,1,0,0\n",
         ":2: column duration_s: a step with tokens must take time"},
        {"duration_s,prefill_tokens,prefill_reqs,decode_reqs,decode_context_tokens\n0.1,0,0,0,0\n",
         "no step with tokens"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[256], err[512];
        write_tmp(path, sizeof path, "bad.csv", cases[i].text);
        tdm_sim_fit_row *rows = (tdm_sim_fit_row *)1;
        size_t n = 7;
        assert_int_equal(tdm_sim_fit_read_csv(path, &rows, &n, err, sizeof err), -1);
        assert_null(rows);
        assert_int_equal(n, 0);
        if (!strstr(err, cases[i].needle) || !strstr(err, "bad.csv"))
            fail_msg("case %zu: '%s' lacks '%s'", i, err, cases[i].needle);
        unlink(path);
    }
    char err[512];
    tdm_sim_fit_row *rows;
    size_t n;
    assert_int_equal(tdm_sim_fit_read_csv("/nonexistent/steps.csv", &rows, &n, err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent/steps.csv"));
}

/* ---- the command ---- */

/* rows[0..n) as a steps CSV (the adapter's columns) at a temporary path, durations times
 * slow (the same engine running slower or faster). */
static void write_steps_csv(char *path, size_t len, const char *name, const tdm_sim_fit_row *rows,
                            int n, double slow)
{
    write_tmp(path, len, name, "");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("instance,role,step,start_s,duration_s,prefill_tokens,prefill_reqs,decode_reqs,"
          "decode_context_tokens,batch_tokens,running,waiting,kv_usage,preemptions,emit_seqs,"
          "prefill_attn\n", f);
    for (int i = 0; i < n; i++)
        fprintf(f, "0,colocated,%d,0,%.9f,%llu,%u,%u,%llu,0,0,0,0,0,%u,%.0f\n", i + 1,
                rows[i].dur_s * slow, (unsigned long long)rows[i].prefill_tokens,
                rows[i].prefill_reqs, rows[i].decode_reqs, (unsigned long long)rows[i].decode_ctx,
                rows[i].emit_seqs, rows[i].prefill_attn);
    fclose(f);
}

/* The value after key in the first line of file path starting with prefix; -1 if none. */
static double line_value(const char *path, const char *prefix, const char *key)
{
    char line[1024];
    FILE *o = fopen(path, "r");
    assert_non_null(o);
    double v = -1;
    while (fgets(line, sizeof line, o)) {
        const char *k;
        if (!strncmp(line, prefix, strlen(prefix)) && (k = strstr(line, key))) {
            v = strtod(k + strlen(key), NULL);
            break;
        }
    }
    fclose(o);
    return v;
}

static void fit_command__writes_tables_and_prints_held_out_error(void **state)
{
    (void)state;
    NEED_TOOL();
    tdm_sim_fit_row *rows = synth(500, 7, TRUE_COEF, 0, 0.02, 0);
    char csv[256];
    write_steps_csv(csv, sizeof csv, "cmd-steps.csv", rows, 500, 1.0);
    char dir[] = "/tmp/tandem-fitcmd-XXXXXX", out[600];
    assert_non_null(mkdtemp(dir));
    snprintf(out, sizeof out, "%s/out.txt", dir);
    assert_int_equal(SH("%s fit %s --model llama-3-8b --out %s/t > %s", g_tool, csv, dir, out), 0);
    double mape = line_value(out, "fit rows=500 held_out=100 held_out_mape=", "held_out_mape=");
    assert_true(mape >= 0 && mape < 0.02);   /* 2% uniform noise: ~1% mean */
    json_error_t je;
    char p[700];
    snprintf(p, sizeof p, "%s/t/sched_cost.json", dir);
    json_t *sc = json_load_file(p, 0, &je);
    assert_non_null(sc);
    json_t *cm = json_object_get(sc, "cost_model");
    assert_close(json_number_value(json_object_get(cm, "per_decode_req_us")),
                 TRUE_COEF[1] + TRUE_COEF[2], 0.05);
    json_decref(sc);
    /* and the simulator runs on what it wrote */
    assert_int_equal(SH("%s sim --hw %s/t/hw.json --model llama-3-8b --max-requests 20 --quiet "
                        ">/dev/null", g_tool, dir), 0);
    /* errors */
    assert_int_equal(SH("%s fit %s --model llama-3-8b 2>/dev/null", g_tool, csv), 2);
    assert_int_equal(SH("%s fit %s --model llama-3-8b --out %s/t --holdout 1 2>/dev/null", g_tool,
                        csv, dir), 2);
    assert_int_equal(SH("%s fit %s --model nosuch --out %s/t 2>/dev/null", g_tool, csv, dir), 2);
    assert_int_equal(SH("%s fit /nonexistent.csv --model llama-3-8b --out %s/t 2>/dev/null",
                        g_tool, dir), 1);
    assert_int_equal(SH("rm -rf %s", dir), 0);
    unlink(csv);
    free(rows);
}

/* --score: another CSV of the same engine, 25% slower, scored through the written tables */
static void fit_command__scores_another_steps_csv(void **state)
{
    (void)state;
    NEED_TOOL();
    tdm_sim_fit_row *rows = synth(500, 11, TRUE_COEF, 0, 0.02, 0);
    tdm_sim_fit_row *later = synth(300, 12, TRUE_COEF, 0, 0.02, 0);
    char csv[256], slow[256], same[256];
    write_steps_csv(csv, sizeof csv, "score-fit.csv", rows, 500, 1.0);
    write_steps_csv(slow, sizeof slow, "score-slow.csv", later, 300, 1.25);
    write_steps_csv(same, sizeof same, "score-same.csv", later, 300, 1.0);
    char dir[] = "/tmp/tandem-fitscore-XXXXXX", out[600];
    assert_non_null(mkdtemp(dir));
    snprintf(out, sizeof out, "%s/out.txt", dir);
    assert_int_equal(SH("%s fit %s --model llama-3-8b --out %s/t --score %s > %s", g_tool, csv, dir,
                        slow, out), 0);
    assert_int_equal((int)line_value(out, "fit_score ", "rows="), 300);
    double r = line_value(out, "fit_score ", "measured_over_predicted=");
    assert_true(r > 1.22 && r < 1.28);
    double mape = line_value(out, "fit_score ", " mape=");
    assert_true(mape > 0.18 && mape < 0.27);    /* 25% slower, 2% noise */
    assert_int_equal(SH("%s fit %s --model llama-3-8b --out %s/t --score %s > %s", g_tool, csv, dir,
                        same, out), 0);
    r = line_value(out, "fit_score ", "measured_over_predicted=");
    assert_true(r > 0.98 && r < 1.02);
    /* without --score no fit_score line; a missing or malformed file fails naming it */
    assert_int_equal(SH("%s fit %s --model llama-3-8b --out %s/t > %s", g_tool, csv, dir, out), 0);
    assert_true(line_value(out, "fit_score ", "rows=") < 0);
    assert_int_equal(SH("%s fit %s --model llama-3-8b --out %s/t --score /nonexistent.csv "
                        "2>%s >/dev/null", g_tool, csv, dir, out), 1);
    assert_int_equal(SH("grep -q 'tandem fit: --score: .*/nonexistent.csv' %s", out), 0);
    assert_int_equal(SH("%s fit %s --model llama-3-8b --out %s/t --score 2>/dev/null", g_tool, csv,
                        dir), 2);
    assert_int_equal(SH("rm -rf %s", dir), 0);
    unlink(csv);
    unlink(slow);
    unlink(same);
    free(rows);
    free(later);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fit_rows__recovers_a_known_model_exactly),
        cmocka_unit_test(fit_rows__noise_and_outliers),
        cmocka_unit_test(fit_rows__mean_step_time_under_skewed_noise),
        cmocka_unit_test(fit_rows__a_zero_term_stays_non_negative),
        cmocka_unit_test(fit_rows__bad_arguments),
        cmocka_unit_test(write_tables__table_model_reproduces_the_fit),
        cmocka_unit_test(write_tables__lm_head_sharing_a_layer_gemm_shape),
        cmocka_unit_test(read_csv__columns_by_name_and_legacy_files),
        cmocka_unit_test(read_csv__errors_name_file_line_and_column),
        cmocka_unit_test(fit_command__writes_tables_and_prints_held_out_error),
        cmocka_unit_test(fit_command__scores_another_steps_csv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
