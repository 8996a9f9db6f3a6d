/*
 * rng.c -- deterministic random numbers for the simulator: splitmix64 seeds a xoshiro256**
 * generator; uniform, exponential, normal (Box-Muller) and Gamma (Marsaglia-Tsang) draws.
 * The same seed gives the same stream on every platform, so runs are reproducible.
 */
#include <math.h>

#include "sim.h"

uint64_t tdm_sim_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void tdm_sim_rng_seed(tdm_sim_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) {
        x += 0x9e3779b97f4a7c15ull;
        r->s[i] = tdm_sim_mix64(x);
    }
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t tdm_sim_rng_next(tdm_sim_rng *r)
{
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

double tdm_sim_rng_uniform(tdm_sim_rng *r)
{
    return (double)(tdm_sim_rng_next(r) >> 11) * 0x1.0p-53;
}

double tdm_sim_rng_exp(tdm_sim_rng *r, double mean)
{
    return -mean * log1p(-tdm_sim_rng_uniform(r));
}

double tdm_sim_rng_normal(tdm_sim_rng *r)
{
    double u1 = tdm_sim_rng_uniform(r), u2 = tdm_sim_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

double tdm_sim_rng_gamma(tdm_sim_rng *r, double shape, double scale)
{
    if (shape < 1.0) {
        /* Gamma(a) = Gamma(a + 1) * U^(1/a) */
        double u = tdm_sim_rng_uniform(r);
        return tdm_sim_rng_gamma(r, shape + 1.0, scale) * pow(u > 0 ? u : 1e-300, 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = tdm_sim_rng_normal(r), v = 1.0 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        double u = tdm_sim_rng_uniform(r);
        if (u < 1.0 - 0.0331 * x * x * x * x) return d * v * scale;
        if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v * scale;
    }
}
