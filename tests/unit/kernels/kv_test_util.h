/*
 * kv_test_util.h -- helpers of the kernels tests (header-only, static): a deterministic
 * random generator, paged KV caches allocated from a layout, a naive element address
 * (written from the layout formula, independent of the library's plan code), random finite
 * values per dtype, and poisoning.
 */
#ifndef TANDEM_KV_TEST_UTIL_H
#define TANDEM_KV_TEST_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tandem.h"

#define POISON 0xA5

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static inline uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static inline uint32_t rng_below(uint32_t n) { return (uint32_t)(rng_next() % n); }

static inline void fill_random_bytes(void *p, size_t n)
{
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(rng_next() >> 32);
}

/* A float in [-range, range) with 12 random mantissa-ish bits. */
static inline float rng_float(float range)
{
    return ((float)(rng_next() >> 40) / (float)(1u << 24) * 2.0f - 1.0f) * range;
}

/* Store x into element i of a buffer of dtype dt (using the library's encoders). */
static inline void put_elem(void *p, tdm_dtype dt, size_t i, float x)
{
    switch (dt) {
    case TDM_DTYPE_FP16: ((uint16_t *)p)[i] = tdm_fp16_from_float(x); break;
    case TDM_DTYPE_BF16: ((uint16_t *)p)[i] = tdm_bf16_from_float(x); break;
    case TDM_DTYPE_FP32: ((float *)p)[i] = x; break;
    default: ((uint8_t *)p)[i] = tdm_fp8_e4m3_from_float(x); break;
    }
}

static inline float get_elem(const void *p, tdm_dtype dt, size_t i)
{
    switch (dt) {
    case TDM_DTYPE_FP16: return tdm_fp16_to_float(((const uint16_t *)p)[i]);
    case TDM_DTYPE_BF16: return tdm_bf16_to_float(((const uint16_t *)p)[i]);
    case TDM_DTYPE_FP32: return ((const float *)p)[i];
    default: return tdm_fp8_e4m3_to_float(((const uint8_t *)p)[i]);
    }
}

/* Element index (in elements) of (kv, block, token, head, 0) in a layer, from the formula. */
static inline size_t elem_index(const tdm_kv_layout *l, uint32_t kv, uint32_t block, uint32_t tok,
                                uint32_t head)
{
    return (size_t)((int64_t)kv * l->stride_kv + (int64_t)block * l->stride_block +
                    (int64_t)tok * l->stride_token + (int64_t)head * l->stride_head);
}

/* Per-layer buffers of one paged cache. */
typedef struct test_cache {
    tdm_kv_layout l;
    size_t layer_bytes;
    void *bases[64];
} test_cache;

static inline int cache_alloc(test_cache *c, const tdm_kv_layout *l)
{
    memset(c, 0, sizeof *c);
    c->l = *l;
    if (tdm_kv_layout_layer_bytes(l, &c->layer_bytes) != TDM_OK || l->num_layers > 64) return -1;
    for (uint32_t i = 0; i < l->num_layers; i++) {
        c->bases[i] = malloc(c->layer_bytes);
        if (!c->bases[i]) return -1;
    }
    return 0;
}

static inline void cache_free(test_cache *c)
{
    for (uint32_t i = 0; i < 64; i++) free(c->bases[i]);
    memset(c, 0, sizeof *c);
}

static inline void cache_fill_random(test_cache *c)
{
    for (uint32_t i = 0; i < c->l.num_layers; i++) fill_random_bytes(c->bases[i], c->layer_bytes);
}

/* Random finite values (|x| < range) in every element position of the cache. */
static inline void cache_fill_values(test_cache *c, float range)
{
    size_t elem = tdm_dtype_size((tdm_dtype)c->l.dtype);
    for (uint32_t i = 0; i < c->l.num_layers; i++) {
        size_t n = c->layer_bytes / elem;
        for (size_t j = 0; j < n; j++) put_elem(c->bases[i], (tdm_dtype)c->l.dtype, j, rng_float(range));
    }
}

static inline void cache_poison(test_cache *c)
{
    for (uint32_t i = 0; i < c->l.num_layers; i++) memset(c->bases[i], POISON, c->layer_bytes);
}

/* A CUSTOM layout with padding everywhere: [block][token][kv][head(+pad)][dim]. */
static inline void custom_layout(tdm_kv_layout *l, uint32_t layers, uint32_t blocks, uint32_t bs,
                                 uint32_t heads, uint32_t dim, tdm_dtype dt)
{
    tdm_kv_layout_init(l, TDM_KV_LAYOUT_CUSTOM, layers, blocks, bs, heads, dim, dt);
    l->stride_head = dim + 4;
    l->stride_kv = (int64_t)heads * l->stride_head + 3;
    l->stride_token = 2 * l->stride_kv + 5;
    l->stride_block = (int64_t)bs * l->stride_token + 7;
}

/* Distinct random block ids (a permutation prefix) of n out of num_blocks. */
static inline void random_ids(uint32_t *ids, uint32_t n, uint32_t num_blocks)
{
    uint32_t *perm = malloc(num_blocks * sizeof *perm);
    for (uint32_t i = 0; i < num_blocks; i++) perm[i] = i;
    for (uint32_t i = num_blocks; i > 1; i--) {
        uint32_t j = rng_below(i), t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    memcpy(ids, perm, n * sizeof *ids);
    free(perm);
}

#endif
