/*
 * kernel_emul.cpp -- runs the CUDA kernel bodies (kernels/kv_kernels_dev.h) on the CPU,
 * compiled as plain C++ with shims for the CUDA keywords, one thread after another (the
 * kernels share nothing between threads: no shared memory, no barriers), and compares
 * their output byte for byte with the CPU implementation, for random plans of every kind
 * (pack, unpack, unpack_convert, pack_convert; every layout kind, dtype pair, odd sizes
 * that force the unaligned fallbacks) and every lane-group size G = 4..256 with one CTA
 * (metadata as pointers) and three (metadata inline in the parameter block, references
 * resolved by the kernel, as the launcher passes it). This checks the kernels' indexing and vector paths on machines without a
 * GPU; scripts/gpu-check.sh checks the real thing on a device.
 * Usage: kernel_emul [COUNTS_FILE]  (writes "passed failed skipped" for make test: one test
 * per operation, passed when all its comparisons are equal)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(x)
struct emu_dim3 {
    unsigned x, y, z;
};
static emu_dim3 threadIdx, blockIdx, gridDim, blockDim;
struct uint4 {
    uint32_t x, y, z, w;
};
struct uint2 {
    uint32_t x, y;
};
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }

extern "C" {
#include "kv_internal.h"
}
#include "kv_kernels_dev.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)((rng >> 16) % n);
}

static int passed, failed;     /* comparisons */
static int op_failed[4];       /* per operation: pack, unpack, unpack_convert, pack_convert */
static int cur_op;

static tdm_kv_dev::kv_args g_args;

template <int G>
static void emulate(unsigned ctas)
{
    gridDim = {ctas, 1, 1};
    blockDim = {256, 1, 1};
    for (unsigned b = 0; b < ctas; b++)
        for (unsigned t = 0; t < 256; t++) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            if (g_args.p.copy) tdm_kv_dev::kv_copy_kernel<G>(g_args);
            else tdm_kv_dev::kv_convert_kernel<G>(g_args);
        }
}

/* Runs plan p through the kernel with group size g on ctas CTAs; with inline_meta, the
 * way the launcher passes small metadata (references into the parameter block). */
static void emulate_g(unsigned g, const tdm__kv_plan &p, unsigned ctas, bool inline_meta)
{
    g_args.p = p;
    g_args.meta_bytes = 0;
    size_t n = tdm__kv_meta_size(&p);
    if (inline_meta && n && n <= tdm_kv_dev::kInlineMeta) {
        tdm__kv_meta_build(&g_args.p, g_args.meta);
        g_args.meta_bytes = n;
    }
    switch (g) {
    case 4: emulate<4>(ctas); break;
    case 8: emulate<8>(ctas); break;
    case 16: emulate<16>(ctas); break;
    case 32: emulate<32>(ctas); break;
    case 64: emulate<64>(ctas); break;
    case 128: emulate<128>(ctas); break;
    default: emulate<256>(ctas); break;
    }
}

/* A paged cache (per-layer buffers, each with a little slack to catch overruns). */
struct cache {
    tdm_kv_layout l;
    size_t bytes;
    void *bases[8];
};

static void cache_make(cache *c, const tdm_kv_layout *l)
{
    memset(c, 0, sizeof *c);
    c->l = *l;
    tdm_kv_layout_layer_bytes(l, &c->bytes);
    for (uint32_t i = 0; i < l->num_layers; i++) c->bases[i] = malloc(c->bytes + 64);
}

static void cache_free(cache *c)
{
    for (void *p : c->bases) free(p);
}

static void cache_poison(cache *c)
{
    for (uint32_t i = 0; i < c->l.num_layers; i++) memset(c->bases[i], 0xA5, c->bytes + 64);
}

static void fill(void *p, size_t n, tdm_dtype dt)
{
    uint8_t *b = (uint8_t *)p;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rnd(256);
    if (dt == TDM_DTYPE_FP32) /* keep fp32 values mostly finite and varied */
        for (size_t i = 0; i + 4 <= n; i += 4) {
            float f = ((float)rnd(1u << 20) / (1u << 19) - 1.0f) * (float)(1u << rnd(12));
            memcpy(b + i, &f, 4);
        }
}

static void layout(tdm_kv_layout *l, uint32_t kind, uint32_t layers, uint32_t blocks, uint32_t bs,
                   uint32_t heads, uint32_t dim, uint32_t dt)
{
    tdm_kv_layout_init(l, (tdm_kv_layout_kind)kind, layers, blocks, bs, heads, dim, (tdm_dtype)dt);
    if (kind == TDM_KV_LAYOUT_CUSTOM) {
        l->stride_head = dim + 1;
        l->stride_kv = (int64_t)heads * l->stride_head + 3;
        l->stride_token = 2 * l->stride_kv + 1;
        l->stride_block = (int64_t)bs * l->stride_token + 5;
    }
}

static bool same_caches(const cache &a, const cache &b)
{
    for (uint32_t i = 0; i < a.l.num_layers; i++)
        if (memcmp(a.bases[i], b.bases[i], a.bytes + 64)) return false;
    return true;
}

static void report(bool ok, const char *what, unsigned g, unsigned ctas)
{
    if (ok) {
        passed++;
    } else {
        failed++;
        op_failed[cur_op]++;
        printf("FAIL %s (G %u, %u CTAs)\n", what, g, ctas);
    }
}

static const unsigned gs[] = {4, 8, 16, 32, 64, 128, 256};

static void one_case(int idx)
{
    static const uint32_t dims[] = {1, 3, 8, 16, 64, 128};
    uint32_t kind = rnd(5), dim = dims[rnd(6)], heads = 1 + rnd(4), bs = 1 + rnd(20);
    uint32_t layers = 1 + rnd(3), dt = 1 + rnd(4), dt2 = 1 + rnd(4), op = rnd(4);
    uint32_t n = 1 + rnd(6), blocks = n + rnd(6);
    cur_op = (int)op;
    char what[160];
    snprintf(what, sizeof what, "case %d: op %u kind %u dtypes %u->%u layers %u bs %u heads %u dim %u n %u",
             idx, op, kind, dt, dt2, layers, bs, heads, dim, n);
    tdm_kv_layout l;
    layout(&l, kind, layers, blocks, bs, heads, dim, dt);
    uint32_t ids[16];
    for (uint32_t i = 0; i < n; i++) ids[i] = rnd(blocks);   /* repeats allowed (pack) */
    tdm__kv_plan pa, pb;
    int rc1 = 0, rc2 = 0;
    if (op == 0 || op == 3) {         /* pack / pack_convert: cache -> buffer */
        cache c;
        cache_make(&c, &l);
        for (uint32_t i = 0; i < layers; i++) fill(c.bases[i], c.bytes, (tdm_dtype)dt);
        tdm_kv_layout pl;
        uint32_t pheads = op == 3 ? 1 + rnd(heads) : heads;
        layout(&pl, TDM_KV_LAYOUT_VLLM_NHD, layers, 1, bs, pheads, dim, op == 3 ? dt2 : dt);
        size_t bytes;
        tdm_kv_packed_size(&pl, n, 0, layers, &bytes);
        uint8_t *a = (uint8_t *)malloc(bytes + 64), *b = (uint8_t *)malloc(bytes + 64);
        tdm_kv_convert_opts o;
        tdm_kv_convert_opts_init(&o);
        o.src_head_offset = heads - pheads > 0 ? rnd(heads - pheads + 1) : 0;
        o.num_heads = pheads;
        float ks[8] = {0.5f, 2, 3, 0.25f, 1, 7, 0.125f, 5}, vs[8] = {1, 0.5f, 4, 2, 0.75f, 3, 1.5f, 6};
        if (op == 3 && dt2 == TDM_DTYPE_FP8_E4M3 && rnd(2)) {
            o.dst_scale_kind = 1 + rnd(2);
            o.dst_k_scale = ks;
            o.dst_v_scale = vs;
        }
        if (op == 3 && dt == TDM_DTYPE_FP8_E4M3 && rnd(2)) {
            o.src_scale_kind = 1 + rnd(2);
            o.src_k_scale = vs;
            o.src_v_scale = ks;
        }
        memset(a, 0xA5, bytes + 64);
        if (op == 0) {
            rc1 = tdm__kv_plan_copy(&pa, "pack", 0, &l, c.bases, ids, n, 0, layers, a, bytes);
        } else {
            rc1 = tdm__kv_plan_pack_convert(&pa, "pack_convert", &l, c.bases, ids, n, &pl, a, bytes, &o);
        }
        if (rc1) {
            printf("FAIL %s: plan: %s\n", what, tdm_kv_errmsg());
            failed++;
            op_failed[cur_op]++;
        } else {
            tdm__kv_exec_cpu(&pa);
            for (unsigned g : gs)
                for (unsigned ctas = 1; ctas <= 3; ctas += 2) {
                    memset(b, 0xA5, bytes + 64);
                    if (op == 0) rc2 = tdm__kv_plan_copy(&pb, "pack", 0, &l, c.bases, ids, n, 0, layers, b, bytes);
                    else rc2 = tdm__kv_plan_pack_convert(&pb, "pack_convert", &l, c.bases, ids, n, &pl, b, bytes, &o);
                    if (!rc2) emulate_g(g, pb, ctas, ctas > 1);
                    report(!rc2 && !memcmp(a, b, bytes + 64), what, g, ctas);
                }
        }
        free(a);
        free(b);
        cache_free(&c);
        return;
    }
    /* unpack / unpack_convert: buffer -> cache */
    for (uint32_t i = 0; i < n; i++) ids[i] = i;                 /* distinct ids */
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = rnd(i), t = ids[i - 1];
        ids[i - 1] = ids[j];
        ids[j] = t;
    }
    tdm_kv_layout sl = l;
    uint32_t nsrc = n, ntok = n * bs;
    tdm_kv_convert_opts o;
    tdm_kv_convert_opts_init(&o);
    float ks[8] = {0.5f, 2, 3, 0.25f, 1, 7, 0.125f, 5}, vs[8] = {1, 0.5f, 4, 2, 0.75f, 3, 1.5f, 6};
    if (op == 2) {                    /* different block size, heads, dtype */
        uint32_t sbs = 1 + rnd(20), sheads = 1 + rnd(4);
        layout(&sl, TDM_KV_LAYOUT_VLLM_NHD, layers, 1, sbs, sheads, dim, dt2);
        ntok = rnd(n * bs + 1);
        nsrc = (ntok + sbs - 1) / sbs + rnd(2);
        uint32_t nh = 1 + rnd(heads < sheads ? heads : sheads);
        o.num_heads = nh;
        o.src_head_offset = rnd(sheads - nh + 1);
        o.dst_head_offset = rnd(heads - nh + 1);
        if (dt2 == TDM_DTYPE_FP8_E4M3 && rnd(2)) {
            o.src_scale_kind = 1 + rnd(2);
            o.src_k_scale = ks;
            o.src_v_scale = vs;
        }
        if (dt == TDM_DTYPE_FP8_E4M3 && rnd(2)) {
            o.dst_scale_kind = 1 + rnd(2);
            o.dst_k_scale = vs;
            o.dst_v_scale = ks;
        }
    }
    size_t bytes;
    tdm_kv_packed_size(&sl, nsrc, 0, layers, &bytes);
    uint8_t *src = (uint8_t *)malloc(bytes + 1);
    fill(src, bytes, (tdm_dtype)sl.dtype);
    cache a, b;
    cache_make(&a, &l);
    cache_make(&b, &l);
    cache_poison(&a);
    uint32_t ndst = (ntok + bs - 1) / bs;
    if (op == 1) rc1 = tdm__kv_plan_copy(&pa, "unpack", 1, &l, a.bases, ids, n, 0, layers, src, bytes);
    else rc1 = tdm__kv_plan_unpack_convert(&pa, "unpack_convert", &sl, src, bytes, nsrc, ntok, &l,
                                           a.bases, ids, ndst, &o);
    if (rc1) {
        printf("FAIL %s: plan: %s\n", what, tdm_kv_errmsg());
        failed++;
        op_failed[cur_op]++;
    } else {
        tdm__kv_exec_cpu(&pa);
        for (unsigned g : gs)
            for (unsigned ctas = 1; ctas <= 3; ctas += 2) {
                cache_poison(&b);
                if (op == 1) rc2 = tdm__kv_plan_copy(&pb, "unpack", 1, &l, b.bases, ids, n, 0, layers, src, bytes);
                else rc2 = tdm__kv_plan_unpack_convert(&pb, "unpack_convert", &sl, src, bytes, nsrc, ntok,
                                                       &l, b.bases, ids, ndst, &o);
                if (!rc2) emulate_g(g, pb, ctas, ctas > 1);
                report(!rc2 && same_caches(a, b), what, g, ctas);
            }
    }
    free(src);
    cache_free(&a);
    cache_free(&b);
}

int main(int argc, char **argv)
{
    static const char *names[4] = {"pack", "unpack", "unpack_convert", "pack_convert"};
    for (int i = 0; i < 300; i++) one_case(i);
    /* one test per operation: it passes when every comparison of it did */
    int tests_passed = 0, tests_failed = 0;
    for (int i = 0; i < 4; i++) {
        printf("[%s] kernel_emul %s\n", op_failed[i] ? "  FAILED  " : "       OK ", names[i]);
        if (op_failed[i]) tests_failed++;
        else tests_passed++;
    }
    printf("kernel_emul: %d comparisons passed, %d failed (CUDA kernel bodies run on the CPU "
           "vs the CPU implementation, every group size)\n", passed, failed);
    if (argc > 1) {
        FILE *f = fopen(argv[1], "w");
        if (f) {
            fprintf(f, "%d %d 0\n", tests_passed, tests_failed);
            fclose(f);
        }
    }
    return failed ? 1 : 0;
}
