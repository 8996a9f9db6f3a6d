/*
 * test_sketch.c -- the streaming quantile sketch against exact percentiles (numpy's linear
 * interpolation on the sorted sample, tdm_sim_percentile_sorted) on random and adversarial
 * distributions: every quantile on a fine grid must be within the documented bound, a
 * relative 2^-(SUB_BITS+1) plus 2^-30 s absolute; count, mean, min and max exact; merge
 * equal to recording both streams; reset empties; bad values clamp to 0.
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

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double unif(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
}

static double normal(void)
{
    return sqrt(-2 * log(unif())) * cos(2 * M_PI * unif());
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Worst error over the quantile grid divided by the bound (must be <= 1). */
static double check(const double *v, size_t n)
{
    tdm_sim_sketch s;
    tdm_sim_sketch_init(&s);
    double *w = malloc(n * sizeof *w);
    assert_non_null(w);
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(tdm_sim_sketch_add(&s, v[i]), 0);
        w[i] = v[i] > 0 ? v[i] : 0;
        sum += w[i];
    }
    qsort(w, n, sizeof *w, cmp_d);
    assert_int_equal(s.n, n);
    assert_true(s.min == w[0]);
    assert_true(s.max == w[n - 1]);
    assert_float_equal(s.sum, sum, 1e-9 * fabs(sum) + 1e-12);
    const double eps = ldexp(1.0, -(TDM_SIM_SKETCH_SUB_BITS + 1));
    double worst = 0;
    for (int k = 0; k <= 1000 + 4; k++) {
        double q = k <= 1000 ? k / 1000.0 : (double[]){0.999, 0.9999, 0.99999, 0.123456}[k - 1001];
        double exact = tdm_sim_percentile_sorted(w, n, q);
        double est = tdm_sim_sketch_quantile(&s, q);
        double bound = eps * exact * (1 + 1e-9) + ldexp(1.0, -30) + 1e-15;
        double r = fabs(est - exact) / bound;
        if (r > worst) worst = r;
        if (r > 1) fail_msg("n=%zu q=%g: sketch %.17g exact %.17g (bound %.3g)", n, q, est, exact, bound);
    }
    tdm_sim_stat st;
    tdm_sim_sketch_stat(&s, &st);
    assert_int_equal(st.n, n);
    assert_true(st.max == w[n - 1]);
    assert_float_equal(st.mean, sum / (double)n, 1e-9 * fabs(sum / (double)n) + 1e-15);
    free(w);
    tdm_sim_sketch_free(&s);
    return worst;
}

static void sketch__random_distributions_within_bound(void **state)
{
    (void)state;
    size_t n = 200000;
    double *v = malloc(n * sizeof *v);
    assert_non_null(v);
    for (int d = 0; d < 6; d++) {
        for (size_t i = 0; i < n; i++) {
            switch (d) {
            case 0: v[i] = unif(); break;                          /* uniform [0, 1) */
            case 1: v[i] = 0.03 * exp(1.5 * normal()); break;      /* log-normal latencies */
            case 2: v[i] = -0.02 * log(unif()); break;             /* exponential */
            case 3: v[i] = 0.001 * pow(unif(), -1.0 / 1.1); break; /* Pareto, heavy tail */
            case 4: v[i] = unif() < 0.95 ? 0.02 + 0.001 * normal() : 3 + unif(); break;
            default: v[i] = ldexp(1 + unif(), (int)(unif() * 60) - 30); break; /* 18 decades */
            }
        }
        double worst = check(v, n);
        assert_true(worst <= 1);
        /* and on small samples, where interpolation between ranks matters most */
        for (size_t m = 1; m <= 7; m++) check(v, m);
        check(v, 101);
    }
    free(v);
}

static void sketch__adversarial_within_bound(void **state)
{
    (void)state;
    size_t n = 4099;
    double *v = malloc(n * sizeof *v);
    assert_non_null(v);
    /* every value on a bucket's lower edge, then just below the next edge (the widest miss) */
    for (int side = 0; side < 2; side++) {
        for (size_t i = 0; i < n; i++) {
            double edge = ldexp(1 + (double)(i % 1024) / 1024.0, (int)(i % 13) - 6);
            v[i] = side ? nextafter(edge + ldexp(1.0, (int)(i % 13) - 6 - 10), 0) : edge;
        }
        check(v, n);
    }
    for (size_t i = 0; i < n; i++) v[i] = 0.125; /* constant: exact */
    check(v, n);
    tdm_sim_sketch s;
    tdm_sim_sketch_init(&s);
    for (size_t i = 0; i < n; i++) tdm_sim_sketch_add(&s, 0.125);
    assert_true(tdm_sim_sketch_quantile(&s, 0.5) == 0.125);
    tdm_sim_sketch_free(&s);
    for (size_t i = 0; i < n; i++) v[i] = (double)i; /* ascending, then descending */
    check(v, n);
    for (size_t i = 0; i < n; i++) v[i] = (double)(n - i);
    check(v, n);
    for (size_t i = 0; i < n; i++) v[i] = i % 3 ? 0.0 : 1e-10 * (double)i; /* zeros, sub-ns */
    check(v, n);
    for (size_t i = 0; i < n; i++) v[i] = i % 2 ? 1e-6 : 1e6; /* two far modes */
    check(v, n);
    for (size_t i = 0; i < n; i++) v[i] = i == n / 2 ? 1e5 : 1e-3; /* one outlier */
    check(v, n);
    free(v);
}

static void sketch__bad_values_clamp_to_zero(void **state)
{
    (void)state;
    tdm_sim_sketch s;
    tdm_sim_sketch_init(&s);
    assert_true(tdm_sim_sketch_quantile(&s, 0.5) == 0); /* empty */
    tdm_sim_sketch_add(&s, -1);
    tdm_sim_sketch_add(&s, NAN);
    tdm_sim_sketch_add(&s, 2);
    assert_int_equal(s.n, 3);
    assert_true(s.min == 0 && s.max == 2);
    assert_true(tdm_sim_sketch_quantile(&s, 0.5) == 0);
    assert_true(tdm_sim_sketch_quantile(&s, -3) == 0);
    assert_true(tdm_sim_sketch_quantile(&s, 7) == 2);
    /* beyond the top power of two: clamped into the top bucket, max still exact */
    tdm_sim_sketch_add(&s, 1e30);
    assert_true(s.max == 1e30 && tdm_sim_sketch_quantile(&s, 1) == 1e30);
    tdm_sim_sketch_free(&s);
}

static void sketch__merge_equals_one_stream_and_reset_empties(void **state)
{
    (void)state;
    tdm_sim_sketch a, b, all;
    tdm_sim_sketch_init(&a);
    tdm_sim_sketch_init(&b);
    tdm_sim_sketch_init(&all);
    for (int i = 0; i < 50000; i++) {
        double x = 0.01 * exp(normal());
        tdm_sim_sketch_add(i % 3 ? &a : &b, x);
        tdm_sim_sketch_add(&all, x);
    }
    assert_int_equal(tdm_sim_sketch_merge(&a, &b), 0);
    assert_int_equal(a.n, all.n);
    assert_true(a.min == all.min && a.max == all.max);
    for (int k = 0; k <= 100; k++)
        assert_true(tdm_sim_sketch_quantile(&a, k / 100.0) == tdm_sim_sketch_quantile(&all, k / 100.0));
    tdm_sim_sketch_reset(&a);
    assert_int_equal(a.n, 0);
    assert_true(tdm_sim_sketch_quantile(&a, 0.5) == 0);
    tdm_sim_sketch_add(&a, 3);
    assert_true(tdm_sim_sketch_quantile(&a, 0.5) == 3);
    tdm_sim_sketch_free(&a);
    tdm_sim_sketch_free(&b);
    tdm_sim_sketch_free(&all);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sketch__random_distributions_within_bound),
        cmocka_unit_test(sketch__adversarial_within_bound),
        cmocka_unit_test(sketch__bad_values_clamp_to_zero),
        cmocka_unit_test(sketch__merge_equals_one_stream_and_reset_empties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
