/*
 * kv_check.c -- the device check program that scripts/gpu-check.sh runs (built by
 * `make kv-check` into build/kv_check; public API only). Three parts:
 *   1. CPU: pack and unpack throughput against memcpy of the same bytes (host memory).
 *   2. GPU correctness: every CUDA call (pack, unpack, unpack_convert, pack_convert; each
 *      kernel and lane-group size; aligned and unaligned runs) against the CPU implementation
 *      on fresh random data, destinations poisoned first, every byte compared.
 *   3. GPU timing: pack and unpack against cudaMemcpy device-to-device of the same bytes, in
 *      the same run, for several block shapes and transfer sizes.
 * Prints a short table last. Exit: 0 all correct, 1 a mismatch or error, 3 no GPU (after
 * the CPU part). Options: --probe (only say whether a GPU is usable), --cpu-only, --quick
 * (smaller sizes).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv_test_util.h"

static int g_fail, g_checks, g_quick;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CHECK_OK(call)                                                                   \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ != TDM_OK) {                                                             \
            fprintf(stderr, "FAIL %s:%d: %s -> %d (%s)\n", __FILE__, __LINE__, #call, rc_, \
                    tdm_kv_errmsg());                                                    \
            g_fail++;                                                                    \
            return -1;                                                                   \
        }                                                                                \
    } while (0)

/* ------------------------------------------------------------------ table rows ------ */

typedef struct row {
    char what[64];
    double mib, tdm_gbps, base_gbps;
} row;

static row g_rows[64];
static int g_nrows;

static void add_row(const char *what, double bytes, double t_tdm, double t_base)
{
    if (g_nrows >= 64) return;
    row *r = &g_rows[g_nrows++];
    snprintf(r->what, sizeof r->what, "%s", what);
    r->mib = bytes / (1 << 20);
    r->tdm_gbps = bytes / t_tdm / 1e9;
    r->base_gbps = bytes / t_base / 1e9;
}

/* ------------------------------------------------------------------ CPU part -------- */

static void cpu_bench(void)
{
    const size_t sizes[] = {16u << 20, 64u << 20, 256u << 20};
    for (size_t si = 0; si < (g_quick ? 1 : 3); si++) {
        tdm_kv_layout l;
        uint32_t layers = 32, bs = 16, heads = 8, dim = 128;
        size_t bb = (size_t)2 * bs * heads * dim * 2;
        uint32_t n = (uint32_t)(sizes[si] / (bb * layers));
        tdm_kv_layout_init(&l, TDM_KV_LAYOUT_VLLM_NHD, layers, 2 * n, bs, heads, dim, TDM_DTYPE_FP16);
        test_cache c;
        if (cache_alloc(&c, &l)) { fprintf(stderr, "cpu bench: out of memory\n"); return; }
        cache_fill_random(&c);
        uint32_t *ids = malloc(n * sizeof *ids);
        random_ids(ids, n, l.num_blocks);
        size_t bytes;
        tdm_kv_packed_size(&l, n, 0, layers, &bytes);
        char *buf = malloc(bytes), *copy = malloc(bytes), *src = malloc(bytes);
        fill_random_bytes(src, bytes);
        memset(buf, 1, bytes);
        memset(copy, 1, bytes);
        int reps = (int)(1024u * 1024 * 1024 / bytes) + 2;
        double best_p = 1e9, best_u = 1e9, best_m = 1e9;
        for (int rep = 0; rep < reps; rep++) {
            double t0 = now_s();
            tdm_kv_pack(&l, c.bases, ids, n, 0, layers, buf, bytes);
            double t1 = now_s();
            memcpy(copy, src, bytes);
            double t2 = now_s();
            tdm_kv_unpack(&l, c.bases, ids, n, 0, layers, buf, bytes);
            double t3 = now_s();
            if (t1 - t0 < best_p) best_p = t1 - t0;
            if (t2 - t1 < best_m) best_m = t2 - t1;
            if (t3 - t2 < best_u) best_u = t3 - t2;
        }
        char what[64];
        snprintf(what, sizeof what, "cpu pack   16x8x128 fp16");
        add_row(what, (double)bytes, best_p, best_m);
        snprintf(what, sizeof what, "cpu unpack 16x8x128 fp16");
        add_row(what, (double)bytes, best_u, best_m);
        free(ids);
        free(buf);
        free(copy);
        free(src);
        cache_free(&c);
    }
}

/* ------------------------------------------------------------------ GPU helpers ----- */

typedef struct dev_cache {
    tdm_kv_layout l;
    size_t layer_bytes;
    void *bases[64];
} dev_cache;

static int dev_alloc(dev_cache *d, const test_cache *h)
{
    memset(d, 0, sizeof *d);
    d->l = h->l;
    d->layer_bytes = h->layer_bytes;
    for (uint32_t i = 0; i < h->l.num_layers; i++) {
        CHECK_OK(tdm_cuda_malloc(&d->bases[i], h->layer_bytes));
        CHECK_OK(tdm_cuda_memcpy(d->bases[i], h->bases[i], h->layer_bytes,
                                 TDM_CUDA_COPY_HOST_TO_DEVICE));
    }
    return 0;
}

static void dev_free(dev_cache *d)
{
    for (uint32_t i = 0; i < 64; i++) tdm_cuda_free(d->bases[i]);
    memset(d, 0, sizeof *d);
}

/* Compares n bytes of device memory with host memory; counts one check. */
static int compare(const char *what, const void *dev, const void *host, size_t n)
{
    uint8_t *tmp = malloc(n ? n : 1);
    g_checks++;
    if (tdm_cuda_memcpy(tmp, dev, n, TDM_CUDA_COPY_DEVICE_TO_HOST) != TDM_OK) {
        fprintf(stderr, "FAIL %s: download: %s\n", what, tdm_kv_errmsg());
        free(tmp);
        g_fail++;
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (tmp[i] != ((const uint8_t *)host)[i]) {
            fprintf(stderr, "FAIL %s: byte %zu of %zu: gpu 0x%02X cpu 0x%02X\n", what, i, n, tmp[i],
                    ((const uint8_t *)host)[i]);
            free(tmp);
            g_fail++;
            return -1;
        }
    free(tmp);
    return 0;
}

static int compare_cache(const char *what, const dev_cache *d, const test_cache *h)
{
    for (uint32_t i = 0; i < h->l.num_layers; i++)
        if (compare(what, d->bases[i], h->bases[i], h->layer_bytes)) return -1;
    return 0;
}

/* Poison a host cache and its device twin. */
static int poison_both(dev_cache *d, test_cache *h)
{
    cache_poison(h);
    for (uint32_t i = 0; i < h->l.num_layers; i++)
        CHECK_OK(tdm_cuda_memset(d->bases[i], POISON, h->layer_bytes));
    return 0;
}

static void make_layout(tdm_kv_layout *l, tdm_kv_layout_kind k, uint32_t layers, uint32_t blocks,
                        uint32_t bs, uint32_t heads, uint32_t dim, tdm_dtype dt)
{
    if (k == TDM_KV_LAYOUT_CUSTOM) custom_layout(l, layers, blocks, bs, heads, dim, dt);
    else tdm_kv_layout_init(l, k, layers, blocks, bs, heads, dim, dt);
}

/* ------------------------------------------------------------------ GPU correctness - */

/* Pack and unpack of one layout on GPU vs CPU. */
static int check_copy(tdm_kv_layout_kind kind, tdm_dtype dt, uint32_t bs, uint32_t heads, uint32_t dim)
{
    char what[96];
    snprintf(what, sizeof what, "pack/unpack kind %d dtype %d %ux%ux%u", kind, dt, bs, heads, dim);
    tdm_kv_layout l;
    make_layout(&l, kind, 3, 40, bs, heads, dim, dt);
    test_cache h, h2;
    dev_cache d;
    if (cache_alloc(&h, &l) || cache_alloc(&h2, &l)) return -1;
    cache_fill_random(&h);
    if (dev_alloc(&d, &h)) return -1;
    uint32_t ids[17];
    random_ids(ids, 17, l.num_blocks);
    size_t bytes;
    tdm_kv_packed_size(&l, 17, 0, 3, &bytes);
    uint8_t *cpu = malloc(bytes + 64);
    void *dbuf;
    CHECK_OK(tdm_cuda_malloc(&dbuf, bytes + 64));
    /* pack all layers, then layers [1, 3) */
    for (uint32_t lb = 0; lb < 2; lb++) {
        size_t b;
        tdm_kv_packed_size(&l, 17, lb, 3, &b);
        memset(cpu, POISON, bytes + 64);
        CHECK_OK(tdm_cuda_memset(dbuf, POISON, bytes + 64));
        CHECK_OK(tdm_kv_pack(&l, h.bases, ids, 17, lb, 3, cpu, b));
        CHECK_OK(tdm_kv_pack_cuda(&l, d.bases, ids, 17, lb, 3, dbuf, b, NULL));
        CHECK_OK(tdm_cuda_stream_sync(NULL));
        if (compare(what, dbuf, cpu, bytes + 64)) break;
    }
    /* unpack fresh random packed data into poisoned caches */
    fill_random_bytes(cpu, bytes);
    CHECK_OK(tdm_cuda_memcpy(dbuf, cpu, bytes, TDM_CUDA_COPY_HOST_TO_DEVICE));
    if (poison_both(&d, &h2)) return -1;
    CHECK_OK(tdm_kv_unpack(&l, h2.bases, ids, 17, 0, 3, cpu, bytes));
    CHECK_OK(tdm_kv_unpack_cuda(&l, d.bases, ids, 17, 0, 3, dbuf, bytes, NULL));
    CHECK_OK(tdm_cuda_stream_sync(NULL));
    compare_cache(what, &d, &h2);
    tdm_cuda_free(dbuf);
    free(cpu);
    dev_free(&d);
    cache_free(&h);
    cache_free(&h2);
    return 0;
}

typedef struct conv_spec {
    const char *name;
    tdm_dtype sdt, ddt;
    uint32_t sbs, dbs, sheads, dheads, dim, nsrc, ntok;
    tdm_kv_layout_kind dkind;
    uint32_t so, dof, nh;
    int scale;              /* 0 none, 1 tensor, 2 head */
} conv_spec;

static float g_scales[2][64];

static void set_scales(tdm_kv_convert_opts *o, const conv_spec *c)
{
    if (!c->scale) return;
    uint32_t kind = c->scale == 1 ? TDM_KV_SCALE_TENSOR : TDM_KV_SCALE_HEAD;
    if (c->sdt == TDM_DTYPE_FP8_E4M3) {
        o->src_scale_kind = kind;
        o->src_k_scale = g_scales[0];
        o->src_v_scale = g_scales[1];
        o->src_scale_layer_stride = 16;
    }
    if (c->ddt == TDM_DTYPE_FP8_E4M3) {
        o->dst_scale_kind = kind;
        o->dst_k_scale = g_scales[1];
        o->dst_v_scale = g_scales[0];
        o->dst_scale_layer_stride = 16;
    }
}

static int check_unpack_convert(const conv_spec *c)
{
    char what[128];
    snprintf(what, sizeof what, "unpack_convert %s", c->name);
    tdm_kv_layout sl, dl;
    tdm_kv_layout_init(&sl, TDM_KV_LAYOUT_VLLM_NHD, 3, 1, c->sbs, c->sheads, c->dim, c->sdt);
    uint32_t ndst = (c->ntok + c->dbs - 1) / c->dbs;
    make_layout(&dl, c->dkind, 3, ndst + 5, c->dbs, c->dheads, c->dim, c->ddt);
    size_t bytes;
    tdm_kv_packed_size(&sl, c->nsrc, 0, 3, &bytes);
    uint8_t *src = malloc(bytes);
    size_t se = tdm_dtype_size(c->sdt);
    for (size_t i = 0; i < bytes / se; i++) put_elem(src, c->sdt, i, rng_float(200.0f));
    /* a few special values: NaN, inf, huge, tiny */
    if (bytes / se > 8) {
        put_elem(src, c->sdt, 1, NAN);
        put_elem(src, c->sdt, 2, 1e30f);
        put_elem(src, c->sdt, 3, -1e-6f);
    }
    void *dsrc;
    CHECK_OK(tdm_cuda_malloc(&dsrc, bytes));
    CHECK_OK(tdm_cuda_memcpy(dsrc, src, bytes, TDM_CUDA_COPY_HOST_TO_DEVICE));
    test_cache h;
    dev_cache d;
    if (cache_alloc(&h, &dl) || dev_alloc(&d, &h) || poison_both(&d, &h)) return -1;
    uint32_t ids[64];
    random_ids(ids, ndst, dl.num_blocks);
    tdm_kv_convert_opts o;
    tdm_kv_convert_opts_init(&o);
    o.src_head_offset = c->so;
    o.dst_head_offset = c->dof;
    o.num_heads = c->nh;
    set_scales(&o, c);
    CHECK_OK(tdm_kv_unpack_convert(&sl, src, bytes, c->nsrc, c->ntok, &dl, h.bases, ids, ndst, &o));
    CHECK_OK(tdm_kv_unpack_convert_cuda(&sl, dsrc, bytes, c->nsrc, c->ntok, &dl, d.bases, ids, ndst,
                                        &o, NULL));
    CHECK_OK(tdm_cuda_stream_sync(NULL));
    compare_cache(what, &d, &h);
    tdm_cuda_free(dsrc);
    free(src);
    dev_free(&d);
    cache_free(&h);
    return 0;
}

static int check_pack_convert(const conv_spec *c)
{
    char what[128];
    snprintf(what, sizeof what, "pack_convert %s", c->name);
    tdm_kv_layout sl, pl;
    make_layout(&sl, c->dkind, 3, 30, c->sbs, c->sheads, c->dim, c->sdt);
    tdm_kv_layout_init(&pl, TDM_KV_LAYOUT_VLLM_NHD, 3, 1, c->sbs, c->dheads, c->dim, c->ddt);
    test_cache h;
    dev_cache d;
    if (cache_alloc(&h, &sl)) return -1;
    cache_fill_values(&h, 300.0f);
    if (dev_alloc(&d, &h)) return -1;
    uint32_t ids[11];
    random_ids(ids, 11, sl.num_blocks);
    size_t bytes;
    tdm_kv_packed_size(&pl, 11, 0, 3, &bytes);
    uint8_t *cpu = malloc(bytes);
    void *dbuf;
    memset(cpu, POISON, bytes);
    CHECK_OK(tdm_cuda_malloc(&dbuf, bytes));
    CHECK_OK(tdm_cuda_memset(dbuf, POISON, bytes));
    tdm_kv_convert_opts o;
    tdm_kv_convert_opts_init(&o);
    o.src_head_offset = c->so;
    o.dst_head_offset = c->dof;
    o.num_heads = c->nh;
    set_scales(&o, c);
    CHECK_OK(tdm_kv_pack_convert(&sl, h.bases, ids, 11, &pl, cpu, bytes, &o));
    CHECK_OK(tdm_kv_pack_convert_cuda(&sl, d.bases, ids, 11, &pl, dbuf, bytes, &o, NULL));
    CHECK_OK(tdm_cuda_stream_sync(NULL));
    compare(what, dbuf, cpu, bytes);
    tdm_cuda_free(dbuf);
    free(cpu);
    dev_free(&d);
    cache_free(&h);
    return 0;
}

static void gpu_correctness(void)
{
    const tdm_kv_layout_kind kinds[] = {TDM_KV_LAYOUT_VLLM_NHD, TDM_KV_LAYOUT_VLLM_HND,
                                        TDM_KV_LAYOUT_FLASHINFER, TDM_KV_LAYOUT_FLASHINFER_HND,
                                        TDM_KV_LAYOUT_CUSTOM};
    const tdm_dtype dts[] = {TDM_DTYPE_FP16, TDM_DTYPE_BF16, TDM_DTYPE_FP32, TDM_DTYPE_FP8_E4M3};
    const uint32_t dims[] = {8, 64, 128};
    for (int i = 0; i < 64; i++) {
        g_scales[0][i] = 0.05f + (float)rng_below(1000) / 250.0f;
        g_scales[1][i] = 0.05f + (float)rng_below(1000) / 250.0f;
    }
    for (size_t k = 0; k < 5; k++)
        for (size_t t = 0; t < 4; t++)
            for (size_t d = 0; d < 3; d++) check_copy(kinds[k], dts[t], 16, 4, dims[d]);
    check_copy(TDM_KV_LAYOUT_VLLM_NHD, TDM_DTYPE_FP16, 16, 8, 128);
    check_copy(TDM_KV_LAYOUT_VLLM_HND, TDM_DTYPE_BF16, 32, 8, 128);
    check_copy(TDM_KV_LAYOUT_FLASHINFER, TDM_DTYPE_FP8_E4M3, 5, 3, 24);
    const conv_spec cs[] = {
        {"16->32 partial fp16 NHD", TDM_DTYPE_FP16, TDM_DTYPE_FP16, 16, 32, 4, 4, 64, 5, 70, TDM_KV_LAYOUT_VLLM_NHD, 0, 0, 0, 0},
        {"32->16 partial bf16 HND", TDM_DTYPE_BF16, TDM_DTYPE_BF16, 32, 16, 4, 4, 128, 3, 77, TDM_KV_LAYOUT_VLLM_HND, 0, 0, 0, 0},
        {"12->8 fp32 custom", TDM_DTYPE_FP32, TDM_DTYPE_FP32, 12, 8, 2, 2, 8, 4, 41, TDM_KV_LAYOUT_CUSTOM, 0, 0, 0, 0},
        {"tp2->tp1 upper half", TDM_DTYPE_FP16, TDM_DTYPE_FP16, 16, 16, 4, 8, 128, 4, 64, TDM_KV_LAYOUT_VLLM_NHD, 0, 4, 4, 0},
        {"tp1->tp2 rank1 HND", TDM_DTYPE_BF16, TDM_DTYPE_BF16, 16, 16, 8, 4, 128, 4, 60, TDM_KV_LAYOUT_VLLM_HND, 4, 0, 4, 0},
        {"fp16->fp8 tensor scale", TDM_DTYPE_FP16, TDM_DTYPE_FP8_E4M3, 16, 16, 4, 4, 128, 4, 64, TDM_KV_LAYOUT_VLLM_NHD, 0, 0, 0, 1},
        {"bf16->fp8 head scale 16->32", TDM_DTYPE_BF16, TDM_DTYPE_FP8_E4M3, 16, 32, 4, 4, 64, 4, 50, TDM_KV_LAYOUT_FLASHINFER, 0, 0, 0, 2},
        {"fp8->fp16 head scale", TDM_DTYPE_FP8_E4M3, TDM_DTYPE_FP16, 16, 16, 4, 4, 128, 4, 64, TDM_KV_LAYOUT_VLLM_HND, 0, 0, 0, 2},
        {"fp8->bf16 tensor scale tp", TDM_DTYPE_FP8_E4M3, TDM_DTYPE_BF16, 16, 16, 8, 4, 16, 4, 64, TDM_KV_LAYOUT_VLLM_NHD, 2, 0, 4, 1},
        {"fp8->fp8 rescale", TDM_DTYPE_FP8_E4M3, TDM_DTYPE_FP8_E4M3, 16, 16, 4, 4, 64, 4, 64, TDM_KV_LAYOUT_CUSTOM, 0, 0, 0, 1},
        {"fp32->fp16 no scale", TDM_DTYPE_FP32, TDM_DTYPE_FP16, 16, 16, 4, 4, 8, 4, 64, TDM_KV_LAYOUT_FLASHINFER_HND, 0, 0, 0, 0},
        {"fp16->bf16 no scale", TDM_DTYPE_FP16, TDM_DTYPE_BF16, 16, 16, 4, 4, 32, 4, 64, TDM_KV_LAYOUT_VLLM_NHD, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) check_unpack_convert(&cs[i]);
    const conv_spec ps[] = {
        {"fp16->fp8 tensor, heads 2..4 of 4 NHD", TDM_DTYPE_FP16, TDM_DTYPE_FP8_E4M3, 16, 16, 4, 2, 128, 0, 0, TDM_KV_LAYOUT_VLLM_NHD, 2, 0, 2, 1},
        {"bf16->fp8 head HND", TDM_DTYPE_BF16, TDM_DTYPE_FP8_E4M3, 16, 16, 4, 4, 64, 0, 0, TDM_KV_LAYOUT_VLLM_HND, 0, 0, 0, 2},
        {"fp16 same dtype head slice custom", TDM_DTYPE_FP16, TDM_DTYPE_FP16, 16, 16, 4, 2, 8, 0, 0, TDM_KV_LAYOUT_CUSTOM, 1, 0, 2, 0},
        {"fp8->fp16 tensor FlashInfer", TDM_DTYPE_FP8_E4M3, TDM_DTYPE_FP16, 16, 16, 4, 4, 128, 0, 0, TDM_KV_LAYOUT_FLASHINFER, 0, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) check_pack_convert(&ps[i]);
}

/* ------------------------------------------------------------------ GPU timing ------ */

static int gpu_bench_one(tdm_kv_layout_kind kind, uint32_t bs, uint32_t heads, uint32_t dim,
                         size_t target)
{
    const uint32_t layers = 32;
    size_t bb = (size_t)2 * bs * heads * dim * 2;
    uint32_t n = (uint32_t)(target / (bb * layers));
    if (!n) return 0;
    tdm_kv_layout l;
    tdm_kv_layout_init(&l, kind, layers, 2 * n, bs, heads, dim, TDM_DTYPE_FP16);
    size_t layer_bytes, bytes;
    tdm_kv_layout_layer_bytes(&l, &layer_bytes);
    tdm_kv_packed_size(&l, n, 0, layers, &bytes);
    void *bases[32] = {0}, *buf = NULL, *copy = NULL;
    uint32_t *ids = malloc(n * sizeof *ids);
    random_ids(ids, n, l.num_blocks);
    int rc = 0;
    for (uint32_t i = 0; i < layers && !rc; i++)
        rc = tdm_cuda_malloc(&bases[i], layer_bytes) || tdm_cuda_memset(bases[i], 0x3C, layer_bytes);
    rc = rc || tdm_cuda_malloc(&buf, bytes) || tdm_cuda_malloc(&copy, bytes) ||
         tdm_cuda_memset(buf, 1, bytes) || tdm_cuda_memset(copy, 2, bytes);
    if (rc) {
        fprintf(stderr, "bench: %s\n", tdm_kv_errmsg());
        g_fail++;
        goto out;
    }
    int reps = (int)(((size_t)8 << 30) / bytes);
    if (reps < 5) reps = 5;
    if (reps > 200) reps = 200;
    double t[3] = {0, 0, 0};
    for (int which = 0; which < 3; which++) {
        for (int w = 0; w < 2; w++) {          /* warm-up */
            if (which == 0) rc = tdm_kv_pack_cuda(&l, bases, ids, n, 0, layers, buf, bytes, NULL);
            else if (which == 1) rc = tdm_kv_unpack_cuda(&l, bases, ids, n, 0, layers, buf, bytes, NULL);
            else rc = tdm_cuda_memcpy_async(copy, buf, bytes, TDM_CUDA_COPY_DEVICE_TO_DEVICE, NULL);
        }
        rc = rc || tdm_cuda_stream_sync(NULL);
        double t0 = now_s();
        for (int r = 0; r < reps && !rc; r++) {
            if (which == 0) rc = tdm_kv_pack_cuda(&l, bases, ids, n, 0, layers, buf, bytes, NULL);
            else if (which == 1) rc = tdm_kv_unpack_cuda(&l, bases, ids, n, 0, layers, buf, bytes, NULL);
            else rc = tdm_cuda_memcpy_async(copy, buf, bytes, TDM_CUDA_COPY_DEVICE_TO_DEVICE, NULL);
        }
        rc = rc || tdm_cuda_stream_sync(NULL);
        t[which] = (now_s() - t0) / reps;
        if (rc) {
            fprintf(stderr, "bench: %s\n", tdm_kv_errmsg());
            g_fail++;
            goto out;
        }
    }
    const char *kn = kind == TDM_KV_LAYOUT_VLLM_NHD ? "NHD" : kind == TDM_KV_LAYOUT_VLLM_HND ? "HND" : "FI";
    char what[64];
    snprintf(what, sizeof what, "gpu pack   %s %ux%ux%u fp16", kn, bs, heads, dim);
    add_row(what, (double)bytes, t[0], t[2]);
    snprintf(what, sizeof what, "gpu unpack %s %ux%ux%u fp16", kn, bs, heads, dim);
    add_row(what, (double)bytes, t[1], t[2]);
out:
    for (uint32_t i = 0; i < layers; i++) tdm_cuda_free(bases[i]);
    tdm_cuda_free(buf);
    tdm_cuda_free(copy);
    free(ids);
    return rc;
}

static void gpu_bench(void)
{
    const size_t sizes[] = {16u << 20, 64u << 20, 256u << 20, 1024u << 20};
    for (size_t s = 0; s < (g_quick ? 2 : 4); s++) gpu_bench_one(TDM_KV_LAYOUT_VLLM_NHD, 16, 8, 128, sizes[s]);
    gpu_bench_one(TDM_KV_LAYOUT_VLLM_NHD, 32, 8, 128, 256u << 20);
    gpu_bench_one(TDM_KV_LAYOUT_VLLM_NHD, 16, 32, 128, 256u << 20);
    gpu_bench_one(TDM_KV_LAYOUT_FLASHINFER, 16, 8, 128, 256u << 20);
    gpu_bench_one(TDM_KV_LAYOUT_VLLM_HND, 16, 8, 128, 256u << 20);
}

static void print_table(void)
{
    printf("\n%-32s %9s %12s %14s %7s\n", "kv copy (baseline: memcpy)", "MiB", "tandem GB/s",
           "baseline GB/s", "ratio");
    for (int i = 0; i < g_nrows; i++)
        printf("%-32s %9.1f %12.1f %14.1f %7.3f\n", g_rows[i].what, g_rows[i].mib,
               g_rows[i].tdm_gbps, g_rows[i].base_gbps, g_rows[i].tdm_gbps / g_rows[i].base_gbps);
}

int main(int argc, char **argv)
{
    int cpu_only = 0;
    char msg[256];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--probe")) {         /* is a GPU usable? 0 yes, 3 no */
            int rc = tdm_cuda_available(msg, sizeof msg);
            printf("%s\n", msg);
            return rc == TDM_OK ? 0 : 3;
        }
        if (!strcmp(argv[i], "--cpu-only")) cpu_only = 1;
        else if (!strcmp(argv[i], "--quick")) g_quick = 1;
        else {
            fprintf(stderr, "usage: kv_check [--probe | --cpu-only] [--quick]\n");
            return 2;
        }
    }
    rng_state ^= (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull;   /* fresh data each run */
    cpu_bench();
    if (cpu_only) {
        print_table();
        return 0;
    }
    if (tdm_cuda_available(msg, sizeof msg) != TDM_OK) {
        print_table();
        printf("\nno GPU: %s\n", msg);
        return 3;
    }
    gpu_correctness();
    printf("gpu correctness: %d comparisons, %d failures\n", g_checks, g_fail);
    gpu_bench();
    print_table();
    printf("\nkv_check: %s (%d comparisons, %d failures)\n", g_fail ? "FAILED" : "ok", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
