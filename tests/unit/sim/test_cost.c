/*
 * test_cost.c -- the model presets and JSON descriptions, the hardware JSON (the exact
 * format `tandem profile` writes), the cost model against hand-computed step times, and
 * the calibration errors against ../shared/profiles staying within the bounds quoted in
 * docs/cost_model.md.
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

static void model_preset__params_and_kv_bytes(void **state)
{
    (void)state;
    static const struct { const char *name; double params; double kv; } T[] = {
        {"llama-2-7b", 6.74e9, 524288},  {"llama-2-13b", 13.0e9, 819200},
        {"llama-2-70b", 69.0e9, 327680}, {"llama-3-8b", 8.03e9, 131072},
        {"llama-3-70b", 70.6e9, 327680}, {"mistral-7b", 7.24e9, 131072},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        tdm_sim_model m;
        assert_int_equal(tdm_sim_model_preset(T[i].name, &m), 0);
        double p = tdm_sim_model_params(&m);
        if (fabs(p - T[i].params) / T[i].params > 0.005)
            fail_msg("%s: %g params, expected %g", T[i].name, p, T[i].params);
        assert_float_equal(tdm_sim_model_kv_bytes_per_token(&m), T[i].kv, 0.5);
    }
    tdm_sim_model m;
    assert_int_equal(tdm_sim_model_preset("gpt-5", &m), -1);
}

static void model_from_json__ours_and_hf_names(void **state)
{
    (void)state;
    char err[TDM_SIM_ERRLEN];
    tdm_sim_model m;
    assert_int_equal(tdm_sim_model_from_json(
                         "{\"name\": \"x\", \"layers\": 2, \"hidden_size\": 1000, \"heads\": 10,"
                         " \"kv_heads\": 5, \"intermediate_size\": 2000, \"vocab_size\": 1000,"
                         " \"tp\": 2, \"bytes_per_param\": 1}",
                         &m, err, sizeof err), 0);
    assert_int_equal(m.head_dim, 100);
    assert_int_equal(m.kv_heads, 5);
    assert_int_equal(m.tp, 2);
    assert_float_equal(m.bytes_per_param, 1, 0);
    assert_int_equal(tdm_sim_model_from_json(
                         "{\"num_hidden_layers\": 32, \"hidden_size\": 4096, \"num_attention_heads\": 32,"
                         " \"num_key_value_heads\": 8, \"intermediate_size\": 14336, \"vocab_size\": 128256}",
                         &m, err, sizeof err), 0);
    assert_int_equal(m.layers, 32);
    assert_int_equal(m.kv_heads, 8);
    assert_int_equal(tdm_sim_model_from_json("{\"layers\": 2}", &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "hidden_size"));
    assert_int_equal(tdm_sim_model_from_json("{\"layers\": -2, \"hidden_size\": 8, \"heads\": 1, "
                                             "\"intermediate_size\": 8, \"vocab_size\": 8}",
                                             &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "layers"));
}

static void hw_from_json__profile_format(void **state)
{
    (void)state;
    char err[TDM_SIM_ERRLEN];
    tdm_sim_hw h;
    assert_int_equal(tdm_sim_hw_from_json(
                         "{\"name\": \"h100-measured\", \"peak_tflops\": 700, \"hbm_gbps\": 3000,"
                         " \"eff_compute\": 1, \"eff_memory\": 1, \"step_overhead_us\": 0,"
                         " \"interconnect_gbps\": 450, \"mem_gib\": 79.6,"
                         " \"measured\": {\"gemm\": [1, 2, 3]}}",
                         &h, err, sizeof err), 0);
    assert_string_equal(h.name, "h100-measured");
    assert_float_equal(h.peak_tflops, 700, 0);
    assert_float_equal(h.mem_gib, 79.6, 1e-12);
    assert_int_equal(tdm_sim_hw_from_json(
                         "{\"name\": \"x\", \"peak_tflops\": 700, \"hbm_gbps\": 3000, \"eff_compute\": 1,"
                         " \"eff_memory\": 1, \"step_overhead_us\": 0}",
                         &h, err, sizeof err), -1);
    assert_non_null(strstr(err, "interconnect_gbps"));
    assert_int_equal(tdm_sim_hw_from_json(
                         "{\"peak_tflop\": 700, \"hbm_gbps\": 3000, \"eff_compute\": 1, \"eff_memory\": 1,"
                         " \"step_overhead_us\": 0, \"interconnect_gbps\": 1}",
                         &h, err, sizeof err), -1);
    assert_non_null(strstr(err, "unknown key \"peak_tflop\""));
    assert_int_equal(tdm_sim_hw_from_json(
                         "{\"peak_tflops\": 700, \"hbm_gbps\": 3000, \"eff_compute\": 1.5, \"eff_memory\": 1,"
                         " \"step_overhead_us\": 0, \"interconnect_gbps\": 1}",
                         &h, err, sizeof err), -1);
    assert_int_equal(tdm_sim_hw_preset("h200", &h), 0);
    assert_float_equal(h.hbm_gbps, 4800, 0);
    assert_float_equal(h.mem_gib, 141, 0);
}

/* A round-number model and GPU so that the expected times are computed by hand:
 * layer params 10M (q,k,v,o 1M each, FFN 3 x 2M), 2 layers, LM head 1M, bf16 weights 42 MB;
 * 50 TFLOP/s and 500 GB/s effective; KV 8000 B per token; overhead 1 ms. */
static void toy(tdm_sim_cost *c, uint32_t tp)
{
    tdm_sim_model m;
    memset(&m, 0, sizeof m);
    m.layers = 2;
    m.hidden = 1000;
    m.heads = 10;
    m.kv_heads = 10;
    m.head_dim = 100;
    m.ffn = 2000;
    m.vocab = 1000;
    m.gated = 1;
    m.tp = tp;
    m.bytes_per_param = m.bytes_per_kv = 2;
    tdm_sim_hw h = {"toy", 100, 1000, 0.5, 0.5, 1000, 100, 0, 0, TDM_SIM_COST_ROOFLINE, NULL, 1.0};
    tdm_sim_cost_init(c, &m, &h);
}

/* the per-layer kernel floor of the toy's 2 layers */
#define FLOOR2 (2 * TDM_SIM_LAYER_FLOOR_US * 1e-6)

/* n decoding requests (one token each) reading ctx context tokens in all. */
static tdm_sim_shape decode_shape(uint32_t n, uint64_t ctx)
{
    tdm_sim_shape s = {0};
    s.decode_reqs = n;
    s.emit_seqs = n;
    s.decode_ctx = ctx;
    return s;
}

/* One request's prefill chunk of `tokens` tokens (sampling its first token). */
static tdm_sim_shape prefill_shape(uint64_t tokens, double attn, uint64_t kv_read)
{
    tdm_sim_shape s = {0};
    s.prefill_tokens = tokens;
    s.prefill_reqs = 1;
    s.emit_seqs = 1;
    s.prefill_attn = attn;
    s.prefill_kv_read = kv_read;
    return s;
}

/* "time_scale" multiplies every step's time and each of its terms; out-of-range values and
 * non-numbers are refused naming the key; without it a step costs what it did. */
static void hw_from_json__time_scale_multiplies_every_step(void **state)
{
    (void)state;
    char err[TDM_SIM_ERRLEN];
    const char *base = "{\"peak_tflops\": 100, \"hbm_gbps\": 1000, \"eff_compute\": 0.5,"
                       " \"eff_memory\": 0.5, \"step_overhead_us\": 1000, \"interconnect_gbps\": 100";
    char text[512];
    tdm_sim_hw h1, h2;
    snprintf(text, sizeof text, "%s}", base);
    assert_int_equal(tdm_sim_hw_from_json(text, &h1, err, sizeof err), 0);
    snprintf(text, sizeof text, "%s, \"time_scale\": 1.25}", base);
    assert_int_equal(tdm_sim_hw_from_json(text, &h2, err, sizeof err), 0);
    assert_float_equal(h2.time_scale, 1.25, 0);
    tdm_sim_model m;
    assert_int_equal(tdm_sim_model_preset("llama-3-8b", &m), 0);
    tdm_sim_cost c1, c2;
    tdm_sim_cost_init(&c1, &m, &h1);
    tdm_sim_cost_init(&c2, &m, &h2);
    tdm_sim_shape shapes[2] = {decode_shape(16, 16 * 900), prefill_shape(512, 512 * 256.0, 512)};
    for (int i = 0; i < 2; i++) {
        tdm_sim_cost_terms t1, t2;
        double a = tdm_sim_cost_step(&c1, &shapes[i], &t1), b = tdm_sim_cost_step(&c2, &shapes[i], &t2);
        assert_true(a > 0);
        assert_float_equal(b, 1.25 * a, 1e-15);
        assert_float_equal(t2.total_s, 1.25 * t1.total_s, 1e-15);
        assert_float_equal(t2.linear_s, 1.25 * t1.linear_s, 1e-15);
        assert_float_equal(t2.attn_prefill_s, 1.25 * t1.attn_prefill_s, 1e-15);
        assert_float_equal(t2.overhead_s, 1.25 * t1.overhead_s, 1e-15);
    }
    const char *bad[] = {"0", "-1", "1001", "\"fast\""};
    for (size_t i = 0; i < 4; i++) {
        snprintf(text, sizeof text, "%s, \"time_scale\": %s}", base, bad[i]);
        assert_int_equal(tdm_sim_hw_from_json(text, &h2, err, sizeof err), -1);
        assert_non_null(strstr(err, "time_scale"));
    }
}

/* The step time of shape s on the toy at tensor-parallel degree tp, its terms in *t. */
static double toy_step(uint32_t tp, const tdm_sim_shape *s, tdm_sim_cost_terms *t)
{
    tdm_sim_cost c;
    toy(&c, tp);
    return tdm_sim_cost_step(&c, s, t);
}

static void cost_step__decode_hand_computed(void **state)
{
    (void)state;
    tdm_sim_shape s = decode_shape(10, 1000);
    tdm_sim_cost_terms t;
    double total = toy_step(1, &s, &t);
    /* weights 42 MB / 500 GB/s = 84 us (binds over 8.4 us of GEMM FLOPs); element-wise
     * 8 x 3000 x 2 B x 2 layers x 10 tokens / 500 GB/s = 1.92 us; KV 8000 B x 1000 / 500 GB/s
     * = 16 us; overhead 1000 us; plus the kernel floor of 2 layers. */
    assert_float_equal(t.linear_compute_s, 8.4e-6, 1e-12);
    assert_float_equal(t.linear_memory_s, 84e-6, 1e-12);
    assert_int_equal(t.linear_compute_bound, 0);
    assert_float_equal(t.linear_s, 85.92e-6 + FLOOR2, 1e-12);
    assert_float_equal(t.attn_decode_s, 16e-6, 1e-12);
    assert_float_equal(t.allreduce_s, 0, 0);
    assert_float_equal(total, 1101.92e-6 + FLOOR2, 1e-12);
}

static void cost_step__prefill_hand_computed(void **state)
{
    (void)state;
    tdm_sim_shape s = prefill_shape(1000, 1000 * 500.0, 1000);
    tdm_sim_cost_terms t;
    double total = toy_step(1, &s, &t);
    /* GEMMs (2 x 20M x 1000 + 2 x 1M) / 50 TFLOP/s = 800.04 us (compute-bound); element-wise
     * 192 us; attention 4 x 2 x 10 x 100 x 500000 / (50e12 x TDM_SIM_ATTN_REL_EFF) = 80 us
     * / 0.82; overhead 1000 us. */
    assert_float_equal(t.linear_compute_s, 800.04e-6, 1e-12);
    assert_int_equal(t.linear_compute_bound, 1);
    assert_float_equal(t.attn_prefill_s, 80e-6 / TDM_SIM_ATTN_REL_EFF, 1e-12);
    assert_float_equal(total, 1992.04e-6 + 80e-6 / TDM_SIM_ATTN_REL_EFF + FLOOR2, 1e-12);
}

static void cost_step__tensor_parallel_divides_and_adds_allreduce(void **state)
{
    (void)state;
    tdm_sim_shape s = decode_shape(10, 1000);
    tdm_sim_cost_terms t;
    double total = toy_step(2, &s, &t);
    /* weights 42 us, element-wise 1.28 us, KV 8 us; 4 all-reduces of 12 us plus
     * 80 kB x 2 (tp-1)/tp / 100 GB/s = 0.8 us. */
    assert_float_equal(t.linear_memory_s, 42e-6, 1e-12);
    assert_float_equal(t.attn_decode_s, 8e-6, 1e-12);
    assert_float_equal(t.allreduce_s, 4 * TDM_SIM_ALLREDUCE_ALPHA_S + 0.8e-6, 1e-12);
    assert_float_equal(total, (42 + 1.28 + 8 + 0.8 + 1000) * 1e-6 + 4 * TDM_SIM_ALLREDUCE_ALPHA_S +
                                  FLOOR2, 1e-12);
}

static void cost_step__empty_step_costs_nothing(void **state)
{
    (void)state;
    tdm_sim_shape s = {0};
    assert_float_equal(toy_step(1, &s, NULL), 0, 0);
}

static void cost_estimate_cb__matches_the_step_model(void **state)
{
    (void)state;
    tdm_sim_cost c;
    toy(&c, 1);
    tdm_step_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.struct_size = sizeof sh;
    sh.num_prefill_tokens = 100;
    sh.num_prefill_reqs = 1;
    sh.num_decode_reqs = 4;
    sh.num_decode_tokens = 4;
    sh.decode_context_tokens = 400;
    sh.prefill_attn_work = 100 * 50;
    tdm_sim_shape s = decode_shape(4, 400);
    s.prefill_tokens = 100;
    s.prefill_reqs = 1;
    s.emit_seqs = 5;
    s.prefill_attn = 5000;
    assert_float_equal(tdm_sim_cost_estimate_cb(&c, &sh), tdm_sim_cost_step(&c, &s, NULL), 1e-15);
}

/* What `tandem profile` writes on a GPU (kernels/profile.cu): efficiencies of 1 (the rates
 * are measured), the link unknown (0), the memory under "measured". */
static void hw_from_json__tandem_profile_output_runs(void **state)
{
    (void)state;
    char err[TDM_SIM_ERRLEN];
    tdm_sim_hw h;
    assert_int_equal(tdm_sim_hw_from_json(
                         "{\"name\": \"measured-NVIDIA H200\", \"peak_tflops\": 702.5, \"hbm_gbps\": 4012.1,"
                         " \"eff_compute\": 1, \"eff_memory\": 1, \"step_overhead_us\": 9.5,"
                         " \"interconnect_gbps\": 0, \"measured\": {\"gpu\": \"NVIDIA H200\","
                         " \"model\": \"llama-3-8b\", \"tp\": 1, \"memory_gib\": 139.8,"
                         " \"attention\": [{\"batch\": 8, \"context\": 2048, \"us\": 12.0, \"gbps\": 3000}],"
                         " \"prefill\": [], \"decode\": []}}",
                         &h, err, sizeof err), 0);
    assert_float_equal(h.mem_gib, 139.8, 1e-9);
    assert_float_equal(h.interconnect_gbps, 0, 0);
    tdm_sim_model m;
    tdm_sim_model_preset("llama-3-70b", &m);
    m.tp = 4;
    tdm_sim_cost c;
    tdm_sim_cost_init(&c, &m, &h);
    tdm_sim_shape s = prefill_shape(1000, 0, 0);
    tdm_sim_cost_terms t;
    double total = tdm_sim_cost_step(&c, &s, &t);
    assert_true(isfinite(total) && total > 0);
    /* the unknown link falls back to TDM_SIM_DEFAULT_LINK_GBPS */
    double bytes = 2.0 * 80 * 8192 * 2 * 1000;
    assert_float_equal(t.allreduce_s, 160 * TDM_SIM_ALLREDUCE_ALPHA_S +
                                          bytes * 2 * 3 / 4 / (TDM_SIM_DEFAULT_LINK_GBPS * 1e9), 1e-12);
    assert_true(tdm_sim_cost_num_blocks(&c, 16, 0.9, 8192, 256) > 0);
}

static void cost_num_blocks__fits_memory(void **state)
{
    (void)state;
    tdm_sim_model m;
    tdm_sim_hw h;
    tdm_sim_model_preset("llama-3-8b", &m);
    tdm_sim_hw_preset("h100-sxm", &h);
    tdm_sim_cost c;
    tdm_sim_cost_init(&c, &m, &h);
    uint32_t b = tdm_sim_cost_num_blocks(&c, 16, 0.9, 8192, 256);
    /* vLLM's accounting: 72 GiB less 16.06 GB of weights, the activation peak of an
     * 8192-token forward (8192 x (3 x 14336 + 4 x 4096) x 2 B = 0.91 GiB) and of the
     * sampler (256 x 128256 x 4 B x 2 = 0.24 GiB), 0.5 GiB outside PyTorch */
    double act = 8192.0 * (3 * 14336 + 4 * 4096) * 2 + 256.0 * 128256 * 8;
    assert_float_equal(tdm_sim_cost_activation_bytes(&c, 8192, 256), act, 1);
    double want = ((0.9 * 80 - 0.5) * 1073741824.0 - tdm_sim_model_params(&m) * 2 - act) /
                  (131072.0 * 16);
    assert_int_equal(b, (uint32_t)floor(want));
    assert_true(b > 27000 && b < 30000);
    /* a larger token budget and more sequences take more of it; fp8 KV doubles the blocks */
    assert_true(tdm_sim_cost_num_blocks(&c, 16, 0.9, 16384, 1024) < b);
    tdm_sim_model k8 = m;
    tdm_sim_model_set_kv_dtype(&k8, "fp8");
    tdm_sim_cost c8;
    tdm_sim_cost_init(&c8, &k8, &h);
    assert_int_equal(tdm_sim_cost_num_blocks(&c8, 16, 0.9, 8192, 256), (uint32_t)floor(2 * want));
    /* TP: weights and activations per rank, NCCL's buffers beyond one rank */
    tdm_sim_model_preset("llama-3-70b", &m);
    tdm_sim_cost_init(&c, &m, &h);
    assert_int_equal(tdm_sim_cost_num_blocks(&c, 16, 0.9, 8192, 256), 0); /* 141 GB in 80 */
    m.tp = 4;
    tdm_sim_cost_init(&c, &m, &h);
    double act4 = 8192.0 * (3 * 28672 / 4.0 + 4 * 8192) * 2 + 256.0 * 128256 * 8;
    double want4 = ((0.9 * 80 - 0.75) * 1073741824.0 - tdm_sim_model_params(&m) * 2 / 4 - act4) /
                   (2.0 * 80 * 8 * 128 * 2 / 4 * 16);
    assert_int_equal(tdm_sim_cost_num_blocks(&c, 16, 0.9, 8192, 256), (uint32_t)floor(want4));
}

static void calibrate__errors_within_documented_bounds(void **state)
{
    (void)state;
    char p[512];
    NEED_SHARED("profiles/splitwise/perf_model.csv", p);
    tdm_sim_calib cal;
    int n = tdm_sim_calibrate(shared_dir(), stdout, &cal);
    assert_int_equal(n, 5);
    assert_int_equal(cal.vidur_n, 3132);
    assert_int_equal(cal.sw_prompt_n, 630);
    /* bounds of docs/cost_model.md (the measured values are a little below them) */
    assert_true(cal.vidur_linear_mape < 0.12);
    assert_true(cal.ds_prefill_mape < 0.22);
    assert_true(cal.ds_decode_mape < 0.20);
    assert_true(cal.sw_prompt_mape < 0.55);
    assert_true(cal.sw_token_mape < 0.45);
    assert_true(cal.sw_refit_token_mape < 0.30);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(model_preset__params_and_kv_bytes),
        cmocka_unit_test(model_from_json__ours_and_hf_names),
        cmocka_unit_test(hw_from_json__profile_format),
        cmocka_unit_test(hw_from_json__time_scale_multiplies_every_step),
        cmocka_unit_test(cost_step__decode_hand_computed),
        cmocka_unit_test(cost_step__prefill_hand_computed),
        cmocka_unit_test(cost_step__tensor_parallel_divides_and_adds_allreduce),
        cmocka_unit_test(cost_step__empty_step_costs_nothing),
        cmocka_unit_test(cost_estimate_cb__matches_the_step_model),
        cmocka_unit_test(hw_from_json__tandem_profile_output_runs),
        cmocka_unit_test(cost_num_blocks__fits_memory),
        cmocka_unit_test(calibrate__errors_within_documented_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
