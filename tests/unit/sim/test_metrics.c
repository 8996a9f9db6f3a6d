/*
 * test_metrics.c -- the metrics against a hand-built schedule: TTFT, TPOT, ITL and E2E
 * statistics (numpy-style percentiles), throughput, SLO attainment with unfinished requests
 * counted as misses, a large ITL sample through the sketch, and the JSON and CSV writers' key names.
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

/* A percentile from the sketch: within its documented bound of the exact one. */
#define assert_near_sketch(v, exact) \
    assert_float_equal((v), (exact), ldexp(1.0, -(TDM_SIM_SKETCH_SUB_BITS + 1)) * (exact) + 1e-9)

static void percentile__numpy_linear(void **state)
{
    (void)state;
    double v[] = {1, 2, 3, 4};
    assert_float_equal(tdm_sim_percentile_sorted(v, 4, 0.5), 2.5, 1e-12);
    assert_float_equal(tdm_sim_percentile_sorted(v, 4, 0.9), 3.7, 1e-12);
    assert_float_equal(tdm_sim_percentile_sorted(v, 4, 0.99), 3.97, 1e-12);
    assert_float_equal(tdm_sim_percentile_sorted(v, 4, 0), 1, 0);
    assert_float_equal(tdm_sim_percentile_sorted(v, 1, 0.9), 1, 0);
    assert_float_equal(tdm_sim_percentile_sorted(v, 0, 0.9), 0, 0);
}

/* Four requests: three finished with known token times, one never scheduled. */
static void build(tdm_sim_result *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "hand");
    r->n = 4;
    r->reqs = calloc(4, sizeof *r->reqs);
    static const float gaps[] = {0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.2f, 0.2f, 0.2f};
    tdm_sim_sketch_init(&r->itl);
    for (size_t i = 0; i < 9; i++) assert_int_equal(tdm_sim_sketch_add(&r->itl, gaps[i]), 0);
    tdm_sim_req_out q[4] = {
        {0.0, 0.1, 0.5, 100, 5, 5, 0, 0, 0, -1, 1, 0, 0, 0, 0, 0},    /* TTFT .1, TPOT .1, E2E .5 */
        {1.0, 1.3, 1.5, 100, 3, 3, 0, 0, 0, -1, 1, 0, 0, 0, 0, 0},    /* TTFT .3, TPOT .1, E2E .5 */
        {2.0, 2.05, 2.65, 100, 4, 4, 1, 0, 0, -1, 1, 0, 0, 0, 0, 0},  /* TTFT .05, TPOT .2, E2E .65 */
        {3.0, -1, -1, 100, 9, 0, 0, 0, -1, -1, 0, 0, 0, 0, 0, 0},     /* never ran */
    };
    memcpy(r->reqs, q, sizeof q);
    r->sum.duration_s = 4.0;
}

static void summarize__hand_built_schedule(void **state)
{
    (void)state;
    tdm_sim_result r;
    build(&r);
    assert_int_equal(tdm_sim_summarize(&r, 0.2, 0.15), 0);
    const tdm_sim_summary *s = &r.sum;
    assert_int_equal(s->requests, 4);
    assert_int_equal(s->completed, 3);
    assert_int_equal(s->ttft.n, 3);
    assert_float_equal(s->ttft.mean, 0.15, 1e-12);
    assert_near_sketch(s->ttft.p50, 0.1);
    assert_near_sketch(s->ttft.p90, 0.26);
    assert_near_sketch(s->ttft.p99, 0.296);
    assert_float_equal(s->tpot.mean, 0.4 / 3, 1e-12);
    assert_near_sketch(s->tpot.p50, 0.1);
    assert_float_equal(s->e2e.mean, 1.65 / 3, 1e-12);
    assert_float_equal(s->e2e.max, 0.65, 1e-12);
    assert_int_equal(s->itl.n, 9);
    assert_float_equal(s->itl.mean, 1.2 / 9, 1e-7);
    assert_near_sketch(s->itl.p50, 0.1);
    assert_near_sketch(s->itl.p90, 0.2);
    assert_float_equal(s->request_throughput, 0.75, 1e-12);
    assert_float_equal(s->output_throughput_tok_s, 3.0, 1e-12);
    /* r0 meets both; r1 misses TTFT; r2 misses TPOT; r3 never finished: misses both */
    assert_float_equal(s->attain_ttft, 0.5, 1e-12);
    assert_float_equal(s->attain_tpot, 0.5, 1e-12);
    assert_float_equal(s->attainment, 0.25, 1e-12);
    tdm_sim_result_free(&r);
}

static void summarize__large_itl_sample_within_sketch_bound(void **state)
{
    (void)state;
    tdm_sim_result r;
    memset(&r, 0, sizeof r);
    /* a permutation of k/100000, k = 0..100000 */
    for (size_t i = 0; i < 100001; i++)
        assert_int_equal(tdm_sim_sketch_add(&r.itl, (double)((i * 7919) % 100001) / 100000.0), 0);
    r.reqs = calloc(1, sizeof *r.reqs);
    r.sum.duration_s = 1;
    assert_int_equal(tdm_sim_summarize(&r, 1, 1), 0);
    assert_int_equal(r.sum.itl.n, 100001);
    assert_float_equal(r.sum.itl.mean, 0.5, 1e-12);
    assert_near_sketch(r.sum.itl.p50, 0.5);
    assert_near_sketch(r.sum.itl.p90, 0.9);
    assert_near_sketch(r.sum.itl.p99, 0.99);
    assert_float_equal(r.sum.itl.max, 1.0, 0);
    tdm_sim_result_free(&r);
}

static void write_json__has_the_issue_keys(void **state)
{
    (void)state;
    tdm_sim_result r;
    build(&r);
    tdm_sim_summarize(&r, 0.2, 0.15);
    r.sum.goodput_req_s = 1.5;
    char path[256];
    write_tmp(path, sizeof path, "m.json", "");
    assert_int_equal(tdm_sim_write_json(path, &r, "\"trace\": \"x\""), 0);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    assert_non_null(o);
    static const char *const KEYS[] = {"requests", "completed", "duration_s", "request_throughput",
                                       "output_throughput_tok_s", "ttft_s", "tpot_s", "itl_s",
                                       "e2e_s", "slo", "goodput_req_s", "preemptions",
                                       "prefix_hit_rate", "steps", "wall_s", "trace"};
    for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++)
        if (!json_object_get(o, KEYS[i])) fail_msg("missing key %s", KEYS[i]);
    static const char *const ST[] = {"ttft_s", "tpot_s", "itl_s", "e2e_s"};
    for (size_t i = 0; i < 4; i++)
        for (size_t k = 0; k < 4; k++) {
            static const char *const F[] = {"mean", "p50", "p90", "p99"};
            assert_true(json_is_number(json_object_get(json_object_get(o, ST[i]), F[k])));
        }
    json_t *slo = json_object_get(o, "slo");
    assert_float_equal(json_number_value(json_object_get(slo, "ttft_s")), 0.2, 1e-12);
    assert_float_equal(json_number_value(json_object_get(slo, "tpot_s")), 0.15, 1e-12);
    assert_float_equal(json_number_value(json_object_get(slo, "attainment")), 0.25, 1e-12);
    assert_int_equal(json_integer_value(json_object_get(o, "requests")), 4);
    json_decref(o);
    /* without a goodput search there is no goodput key */
    r.sum.goodput_req_s = -1;
    assert_int_equal(tdm_sim_write_json(path, &r, NULL), 0);
    o = json_load_file(path, 0, &je);
    assert_non_null(o);
    assert_null(json_object_get(o, "goodput_req_s"));
    json_decref(o);
    unlink(path);
    tdm_sim_result_free(&r);
}

static void write_requests_csv__one_row_per_request(void **state)
{
    (void)state;
    tdm_sim_result r;
    build(&r);
    tdm_sim_summarize(&r, 0.2, 0.15);
    char path[256];
    write_tmp(path, sizeof path, "r.csv", "");
    assert_int_equal(tdm_sim_write_requests_csv(path, &r), 0);
    FILE *f = fopen(path, "r");
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) n++;
    fclose(f);
    assert_int_equal(n, 5);
    unlink(path);
    tdm_sim_result_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(percentile__numpy_linear),
        cmocka_unit_test(summarize__hand_built_schedule),
        cmocka_unit_test(summarize__large_itl_sample_within_sketch_bound),
        cmocka_unit_test(write_json__has_the_issue_keys),
        cmocka_unit_test(write_requests_csv__one_row_per_request),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
