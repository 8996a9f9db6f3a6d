/*
 * sketch.c -- a streaming quantile sketch for the simulator's metrics, so that memory per
 * metric does not grow with the trace (a week of tokens is billions of inter-token gaps).
 * It is HdrHistogram's log-linear bucketing (G. Tene, "HdrHistogram: a high dynamic range
 * histogram"): each power of two is split into 2^TDM_SIM_SKETCH_SUB_BITS equal sub-buckets,
 * so a bucket's width is at most 2^-SUB_BITS of the values it holds. Here it is taken on
 * the IEEE-754 bits of a double directly: for a positive normal value the exponent picks the
 * power of two and the top SUB_BITS mantissa bits the sub-bucket. Values in [2^-30, 2^34)
 * seconds (1 ns to 544 years) get their own buckets; smaller ones (and 0, and negatives,
 * clamped to 0) share an "under" bucket valued 0, larger ones the top bucket.
 *
 * A value is reported as its bucket's midpoint, clamped to the exact minimum and maximum
 * recorded, so any order statistic is within a relative 2^-(SUB_BITS+1) (2^-11 = 0.049%)
 * of the exact one (plus 2^-30 s absolute for the under bucket). Quantiles interpolate
 * linearly between the two closest ranks, as numpy's default does; an interpolation of two
 * values each within that relative error is itself within it, so the same bound holds for
 * every quantile (tests/unit/sim/test_sketch.c checks it against exact percentiles). The
 * count, sum (mean), minimum and maximum are exact. The buckets (64 powers of two x 1024,
 * 512 KiB of counts) are allocated on the first value with calloc, whose untouched pages
 * cost no memory: a run touches only the pages of the magnitudes it sees.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define SUB (1u << TDM_SIM_SKETCH_SUB_BITS)
#define EXP_LO (-30)                 /* 2^-30 s: the smallest value with its own bucket */
#define EXP_HI 34                    /* 2^34 s: values from here on share the top bucket */
#define NBUCKETS ((size_t)(EXP_HI - EXP_LO) * SUB)

void tdm_sim_sketch_init(tdm_sim_sketch *s)
{
    memset(s, 0, sizeof *s);
}

void tdm_sim_sketch_free(tdm_sim_sketch *s)
{
    if (!s) return;
    free(s->counts);
    memset(s, 0, sizeof *s);
}

void tdm_sim_sketch_reset(tdm_sim_sketch *s)
{
    uint64_t *c = s->counts;
    if (c) memset(c, 0, NBUCKETS * sizeof *c);
    memset(s, 0, sizeof *s);
    s->counts = c;
}

/* The bucket of v >= 2^EXP_LO (clamped to the top bucket). */
static size_t bucket_of(double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    int e = (int)((bits >> 52) & 0x7ff) - 1023;
    if (e >= EXP_HI) return NBUCKETS - 1;
    size_t m = (size_t)((bits >> (52 - TDM_SIM_SKETCH_SUB_BITS)) & (SUB - 1));
    return (size_t)(e - EXP_LO) * SUB + m;
}

/* The midpoint of bucket b. */
static double bucket_mid(size_t b)
{
    int e = (int)(b / SUB) + EXP_LO;
    double m = (double)(b % SUB);
    return ldexp(1.0 + (m + 0.5) / SUB, e);
}

int tdm_sim_sketch_add(tdm_sim_sketch *s, double v)
{
    if (!(v > 0)) v = 0; /* negatives and NaN clamp to 0 */
    if (!s->counts && !(s->counts = calloc(NBUCKETS, sizeof *s->counts))) return -1;
    if (s->n == 0 || v < s->min) s->min = v;
    if (s->n == 0 || v > s->max) s->max = v;
    s->n++;
    s->sum += v;
    if (v < ldexp(1.0, EXP_LO)) s->under++;
    else s->counts[bucket_of(v)]++;
    return 0;
}

int tdm_sim_sketch_merge(tdm_sim_sketch *dst, const tdm_sim_sketch *src)
{
    if (!src->n) return 0;
    if (!dst->counts && !(dst->counts = calloc(NBUCKETS, sizeof *dst->counts))) return -1;
    for (size_t b = 0; b < NBUCKETS; b++) dst->counts[b] += src->counts[b];
    if (dst->n == 0 || src->min < dst->min) dst->min = src->min;
    if (dst->n == 0 || src->max > dst->max) dst->max = src->max;
    dst->n += src->n;
    dst->under += src->under;
    dst->sum += src->sum;
    return 0;
}

/* The value of rank r (0-based) among the n recorded, from bucket b onwards with `below`
 * values in buckets before b; advances b/below (ranks are asked for in increasing order). */
static double rank_value(const tdm_sim_sketch *s, uint64_t r, size_t *b, uint64_t *below)
{
    if (r == 0) return s->min;
    if (r >= s->n - 1) return s->max;
    if (r < s->under) return s->min; /* the under bucket: within 2^-30 s of its values */
    while (*b < NBUCKETS && *below + s->counts[*b] <= r) *below += s->counts[(*b)++];
    double v = bucket_mid(*b);
    return v < s->min ? s->min : v > s->max ? s->max : v;
}

double tdm_sim_sketch_quantile(const tdm_sim_sketch *s, double q)
{
    if (s->n == 0) return 0;
    if (!(q > 0)) return s->min;
    if (q >= 1) return s->max;
    double pos = q * (double)(s->n - 1);
    uint64_t lo = (uint64_t)floor(pos);
    double f = pos - (double)lo;
    size_t b = 0;
    uint64_t below = s->under;
    double a = rank_value(s, lo, &b, &below);
    if (f == 0 || lo + 1 >= s->n) return a;
    double z = rank_value(s, lo + 1, &b, &below);
    return a + (z - a) * f;
}

void tdm_sim_sketch_stat(const tdm_sim_sketch *s, tdm_sim_stat *st)
{
    memset(st, 0, sizeof *st);
    st->n = (size_t)s->n;
    if (!s->n) return;
    st->mean = s->sum / (double)s->n;
    st->p50 = tdm_sim_sketch_quantile(s, 0.50);
    st->p90 = tdm_sim_sketch_quantile(s, 0.90);
    st->p99 = tdm_sim_sketch_quantile(s, 0.99);
    st->max = s->max;
}
