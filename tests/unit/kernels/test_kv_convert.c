/*
 * test_kv_convert.c -- conversions: the fp8-e4m3, fp16 and bf16 encoders against known
 * encodings and against an exhaustive nearest-value search; unpack with conversion across
 * block sizes (partial last block), head splits for different tensor parallelism (TP2->TP1
 * filled by two senders, TP1->TP2), dtypes with per-tensor and per-head scales, pack-side
 * quantization; every destination element is checked (moved ones against the formula,
 * the rest still poisoned); bad input leaves the destination untouched.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>

#include "kv_test_util.h"

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---------------------------------------------------------------- element encoders ---- */

static void fp8_encode__known_values(void **state)
{
    (void)state;
    struct { float x; uint8_t code; } cases[] = {
        {0.0f, 0x00}, {-0.0f, 0x80}, {1.0f, 0x38}, {-2.0f, 0xC0}, {448.0f, 0x7E},
        {-448.0f, 0xFE}, {240.0f, 0x77}, {0.015625f /* 2^-6 */, 0x08},
        {0.001953125f /* 2^-9 */, 0x01}, {7 * 0.001953125f, 0x07},
        {0.0009765625f /* 2^-10: tie -> 0 */, 0x00}, {3 * 0.0009765625f /* 1.5 -> 2 */, 0x02},
        {5 * 0.0009765625f /* 2.5 -> 2 */, 0x02}, {1.0625f /* tie -> even 1.0 */, 0x38},
        {1.1875f /* tie -> 1.25 */, 0x3A}, {1.07f, 0x39}, {1.05f * 4, 0x48},
        {464.0f /* tie -> 448 */, 0x7E}, {500.0f, 0x7E}, {1e30f, 0x7E}, {-1e30f, 0xFE},
        {INFINITY, 0x7E}, {-INFINITY, 0xFE}, {1e-30f, 0x00}, {-1e-30f, 0x80},
        {u2f(1), 0x00} /* float subnormal */,
        {15.5f * 0.0009765625f * 0.5f /* 7.75 * 2^-10 = 3.875 * 2^-9 -> 4 */, 0x04},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t got = tdm_fp8_e4m3_from_float(cases[i].x);
        if (got != cases[i].code)
            fail_msg("fp8(%a) = 0x%02X, expected 0x%02X", (double)cases[i].x, got, cases[i].code);
    }
    assert_int_equal(tdm_fp8_e4m3_from_float(NAN), 0x7F);
    assert_int_equal(tdm_fp8_e4m3_from_float(-NAN), 0xFF);
    assert_true(isnan(tdm_fp8_e4m3_to_float(0x7F)));
    assert_true(isnan(tdm_fp8_e4m3_to_float(0xFF)));
    assert_true(signbit(tdm_fp8_e4m3_to_float(0xFF)));
    assert_true(tdm_fp8_e4m3_to_float(0x7E) == 448.0f);
    assert_true(tdm_fp8_e4m3_to_float(0x01) == 0.001953125f);
    assert_true(tdm_fp8_e4m3_to_float(0x08) == 0.015625f);
    assert_true(tdm_fp8_e4m3_to_float(0xB8) == -1.0f);
    /* every finite code decodes and encodes back to itself */
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7F) == 0x7F) continue;
        float v = tdm_fp8_e4m3_to_float((uint8_t)c);
        assert_false(isnan(v));
        assert_int_equal(tdm_fp8_e4m3_from_float(v), c);
    }
}

/* The nearest finite e4m3 code by exhaustive search (ties to the even code), saturating. */
static uint8_t fp8_reference(float x)
{
    if (isnan(x)) return signbit(x) ? 0xFF : 0x7F;
    double a = fabs((double)x);
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (a >= 448.0) return sign | 0x7E;
    int best = 0;
    double best_d = INFINITY;
    for (int c = 0; c <= 0x7E; c++) {
        double d = fabs((double)tdm_fp8_e4m3_to_float((uint8_t)c) - a);
        if (d < best_d || (d == best_d && (c & 1) == 0)) {
            best = c;
            best_d = d;
        }
    }
    return sign | (uint8_t)best;
}

static void fp8_encode__matches_exhaustive_nearest(void **state)
{
    (void)state;
    for (int i = 0; i < 20000; i++) {
        /* random magnitudes over the whole e4m3 range and beyond, plus exact midpoints */
        float x;
        if (i % 4 == 0) {
            int c = (int)rng_below(0x7E);
            x = (tdm_fp8_e4m3_to_float((uint8_t)c) + tdm_fp8_e4m3_to_float((uint8_t)(c + 1))) / 2;
        } else {
            x = ldexpf(1.0f + rng_float(1.0f), (int)rng_below(24) - 14);
        }
        if (rng_next() & 1) x = -x;
        uint8_t got = tdm_fp8_e4m3_from_float(x), want = fp8_reference(x);
        if (got != want) fail_msg("fp8(%a) = 0x%02X, reference 0x%02X", (double)x, got, want);
    }
}

static void fp16_encode__known_values_and_reference(void **state)
{
    (void)state;
    assert_int_equal(tdm_fp16_from_float(1.0f), 0x3C00);
    assert_int_equal(tdm_fp16_from_float(-2.0f), 0xC000);
    assert_int_equal(tdm_fp16_from_float(65504.0f), 0x7BFF);
    assert_int_equal(tdm_fp16_from_float(65519.0f), 0x7BFF);
    assert_int_equal(tdm_fp16_from_float(65520.0f), 0x7C00);
    assert_int_equal(tdm_fp16_from_float(INFINITY), 0x7C00);
    assert_int_equal(tdm_fp16_from_float(ldexpf(1, -24)), 0x0001);
    assert_int_equal(tdm_fp16_from_float(ldexpf(1, -25)), 0x0000);
    assert_int_equal(tdm_fp16_from_float(ldexpf(3, -25)), 0x0002);
    assert_int_equal(tdm_fp16_from_float(ldexpf(1, -14)), 0x0400);
    assert_int_equal(tdm_fp16_from_float(1.0f + ldexpf(1, -11)), 0x3C00); /* tie -> even */
    assert_int_equal(tdm_fp16_from_float(1.0f + ldexpf(3, -11)), 0x3C02);
    assert_true((tdm_fp16_from_float(NAN) & 0x7C00) == 0x7C00 && (tdm_fp16_from_float(NAN) & 0x3FF));
    assert_true(isnan(tdm_fp16_to_float(0x7E00)));
    assert_true(tdm_fp16_to_float(0x0001) == ldexpf(1, -24));
    assert_true(tdm_fp16_to_float(0xFBFF) == -65504.0f);
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;
        assert_int_equal(tdm_fp16_from_float(tdm_fp16_to_float((uint16_t)h)), h);
    }
#ifdef __FLT16_MAX__
    for (int i = 0; i < 100000; i++) {
        float x = ldexpf(1.0f + rng_float(1.0f), (int)rng_below(44) - 28);
        _Float16 r = (_Float16)x;
        uint16_t want;
        memcpy(&want, &r, 2);
        assert_int_equal(tdm_fp16_from_float(x), want);
    }
#endif
}

static void bf16_encode__rounds_to_nearest_even(void **state)
{
    (void)state;
    assert_int_equal(tdm_bf16_from_float(1.0f), 0x3F80);
    assert_int_equal(tdm_bf16_from_float(u2f(0x3F808000)), 0x3F80); /* tie -> even */
    assert_int_equal(tdm_bf16_from_float(u2f(0x3F818000)), 0x3F82); /* tie -> even (up) */
    assert_int_equal(tdm_bf16_from_float(u2f(0x3F808001)), 0x3F81);
    assert_int_equal(tdm_bf16_from_float(-INFINITY), 0xFF80);
    assert_int_equal(tdm_bf16_from_float(u2f(0x7F7FFFFF)), 0x7F80); /* rounds to inf */
    uint16_t n = tdm_bf16_from_float(u2f(0x7F800001));           /* signalling NaN */
    assert_true((n & 0x7F80) == 0x7F80 && (n & 0x7F));
    assert_true(tdm_bf16_to_float(0x4049) == u2f(0x40490000));
    for (int i = 0; i < 100000; i++) {
        float x = ldexpf(1.0f + rng_float(1.0f), (int)rng_below(200) - 100);
        uint16_t b = tdm_bf16_from_float(x);
        double lo = tdm_bf16_to_float(b), err = fabs(lo - x);
        /* no bf16 neighbour is closer */
        double up = tdm_bf16_to_float((uint16_t)(b + 1)), dn = tdm_bf16_to_float((uint16_t)(b - 1));
        assert_true(err <= fabs(up - x) && err <= fabs(dn - x));
        (void)f2u;
    }
}

/* ------------------------------------------------------------------ conversions ------- */

typedef struct conv_case {
    tdm_kv_layout src;        /* packed description */
    uint32_t nsrc;            /* source blocks */
    uint32_t ntok;
    uint32_t lb, le, so, dof, nh;
    const float *sk, *sv, *dk, *dv; /* scales or NULL */
    uint32_t s_per_head, d_per_head, s_lstride, d_lstride;
} conv_case;

static float scale_of(const float *a, uint32_t per_head, uint32_t lstride, uint32_t layer, uint32_t head)
{
    if (!a) return 1.0f;
    return a[(size_t)layer * lstride + (per_head ? head : 0)];
}

/* Checks every element of the destination cache after an unpack_convert. */
static void check_convert(const conv_case *cc, const uint8_t *src, const test_cache *d,
                          const uint32_t *dids, uint32_t ndst)
{
    const tdm_kv_layout *sl = &cc->src, *dl = &d->l;
    size_t se = tdm_dtype_size((tdm_dtype)sl->dtype), de = tdm_dtype_size((tdm_dtype)dl->dtype);
    size_t chunk = (size_t)2 * sl->block_size * sl->num_kv_heads * sl->head_dim;
    int same = sl->dtype == dl->dtype && !cc->sk && !cc->dk;
    for (uint32_t layer = 0; layer < dl->num_layers; layer++)
        for (uint32_t blk = 0; blk < dl->num_blocks; blk++) {
            int j = -1;
            for (uint32_t i = 0; i < ndst; i++)
                if (dids[i] == blk) j = (int)i;
            for (uint32_t kv = 0; kv < 2; kv++)
                for (uint32_t tok = 0; tok < dl->block_size; tok++)
                    for (uint32_t h = 0; h < dl->num_kv_heads; h++)
                        for (uint32_t dd = 0; dd < dl->head_dim; dd++) {
                            const uint8_t *got = (const uint8_t *)d->bases[layer] +
                                                 (elem_index(dl, kv, blk, tok, h) + dd) * de;
                            uint64_t t = (uint64_t)(j < 0 ? 0 : j) * dl->block_size + tok;
                            int moved = j >= 0 && t < cc->ntok && layer >= cc->lb &&
                                        layer < cc->le && h >= cc->dof && h < cc->dof + cc->nh;
                            if (!moved) {
                                for (size_t b = 0; b < de; b++) assert_int_equal(got[b], POISON);
                                continue;
                            }
                            uint32_t sh = h - cc->dof + cc->so, sb = (uint32_t)(t / sl->block_size),
                                     st = (uint32_t)(t % sl->block_size);
                            size_t si = (size_t)(layer - cc->lb) * cc->nsrc * chunk + sb * chunk +
                                        kv * (chunk / 2) +
                                        ((size_t)st * sl->num_kv_heads + sh) * sl->head_dim + dd;
                            const uint8_t *sp = src + si * se;
                            if (same) {
                                assert_memory_equal(got, sp, de);
                                continue;
                            }
                            float x = get_elem(sp, (tdm_dtype)sl->dtype, 0);
                            const float *ssa = kv ? cc->sv : cc->sk, *dsa = kv ? cc->dv : cc->dk;
                            if (ssa && !isnan(x)) x *= scale_of(ssa, cc->s_per_head, cc->s_lstride, layer, sh);
                            if (dsa && !isnan(x)) x /= scale_of(dsa, cc->d_per_head, cc->d_lstride, layer, h);
                            uint8_t want[4];
                            put_elem(want, (tdm_dtype)dl->dtype, 0, x);
                            if (memcmp(got, want, de) != 0)
                                fail_msg("layer %u kv %u token %llu head %u dim %u: got 0x%02X.. want 0x%02X..",
                                         layer, kv, (unsigned long long)t, h, dd, got[0], want[0]);
                        }
        }
}

/* Builds a random packed source for cc, runs unpack_convert into a poisoned cache of layout
 * dl with random ids, checks everything. */
static void run_case(conv_case *cc, const tdm_kv_layout *dl, float range, uint8_t **keep_src)
{
    size_t need;
    assert_int_equal(tdm_kv_packed_size(&cc->src, cc->nsrc, cc->lb, cc->le, &need), TDM_OK);
    uint8_t *src = malloc(need ? need : 1);
    size_t se = tdm_dtype_size((tdm_dtype)cc->src.dtype);
    for (size_t i = 0; i < need / se; i++) put_elem(src, (tdm_dtype)cc->src.dtype, i, rng_float(range));
    test_cache d;
    assert_int_equal(cache_alloc(&d, dl), 0);
    cache_poison(&d);
    uint32_t ndst = (cc->ntok + dl->block_size - 1) / dl->block_size, dids[64];
    random_ids(dids, ndst, dl->num_blocks);
    tdm_kv_convert_opts o;
    tdm_kv_convert_opts_init(&o);
    o.layer_begin = cc->lb;
    o.layer_end = cc->le;
    o.src_head_offset = cc->so;
    o.dst_head_offset = cc->dof;
    o.num_heads = cc->nh;
    if (cc->sk) {
        o.src_scale_kind = cc->s_per_head ? TDM_KV_SCALE_HEAD : TDM_KV_SCALE_TENSOR;
        o.src_k_scale = cc->sk;
        o.src_v_scale = cc->sv;
        o.src_scale_layer_stride = cc->s_lstride;
    }
    if (cc->dk) {
        o.dst_scale_kind = cc->d_per_head ? TDM_KV_SCALE_HEAD : TDM_KV_SCALE_TENSOR;
        o.dst_k_scale = cc->dk;
        o.dst_v_scale = cc->dv;
        o.dst_scale_layer_stride = cc->d_lstride;
    }
    int rc = tdm_kv_unpack_convert(&cc->src, src, need, cc->nsrc, cc->ntok, dl, d.bases, dids,
                                   ndst, &o);
    if (rc) fail_msg("unpack_convert: %d %s", rc, tdm_kv_errmsg());
    check_convert(cc, src, &d, dids, ndst);
    cache_free(&d);
    if (keep_src) *keep_src = src;
    else free(src);
}

static void conv_init(conv_case *cc, uint32_t layers, uint32_t bs, uint32_t heads, uint32_t dim,
                      tdm_dtype dt, uint32_t nsrc, uint32_t ntok)
{
    memset(cc, 0, sizeof *cc);
    assert_int_equal(tdm_kv_layout_init(&cc->src, TDM_KV_LAYOUT_VLLM_NHD, layers, 1, bs, heads, dim, dt), TDM_OK);
    cc->nsrc = nsrc;
    cc->ntok = ntok;
    cc->le = layers;
    cc->nh = heads;
}

static void unpack_convert__block_size_16_to_32_partial_last_block(void **state)
{
    (void)state;
    const tdm_kv_layout_kind ks[] = {TDM_KV_LAYOUT_VLLM_NHD, TDM_KV_LAYOUT_VLLM_HND,
                                     TDM_KV_LAYOUT_FLASHINFER, TDM_KV_LAYOUT_CUSTOM};
    for (size_t k = 0; k < 4; k++) {
        conv_case cc;
        conv_init(&cc, 2, 16, 3, 8, TDM_DTYPE_FP16, 5, 70);
        tdm_kv_layout dl;
        if (ks[k] == TDM_KV_LAYOUT_CUSTOM) custom_layout(&dl, 2, 6, 32, 3, 8, TDM_DTYPE_FP16);
        else tdm_kv_layout_init(&dl, ks[k], 2, 6, 32, 3, 8, TDM_DTYPE_FP16);
        run_case(&cc, &dl, 4.0f, NULL);
    }
}

static void unpack_convert__block_size_32_to_16_and_odd_sizes(void **state)
{
    (void)state;
    conv_case cc;
    conv_init(&cc, 2, 32, 2, 8, TDM_DTYPE_BF16, 3, 77);
    tdm_kv_layout dl;
    tdm_kv_layout_init(&dl, TDM_KV_LAYOUT_VLLM_HND, 2, 8, 16, 2, 8, TDM_DTYPE_BF16);
    run_case(&cc, &dl, 4.0f, NULL);
    conv_init(&cc, 1, 12, 2, 8, TDM_DTYPE_FP32, 4, 41);   /* gcd(12, 8) = 4 */
    tdm_kv_layout_init(&dl, TDM_KV_LAYOUT_VLLM_NHD, 1, 9, 8, 2, 8, TDM_DTYPE_FP32);
    run_case(&cc, &dl, 4.0f, NULL);
    conv_init(&cc, 1, 16, 2, 8, TDM_DTYPE_FP16, 2, 0);    /* zero tokens: nothing written */
    run_case(&cc, &dl, 4.0f, NULL);
}

static void unpack_convert__tp2_to_tp1_two_senders_fill_the_heads(void **state)
{
    (void)state;
    /* receiver has 8 heads; each of two senders has 4: one cache filled by two calls */
    tdm_kv_layout dl;
    tdm_kv_layout_init(&dl, TDM_KV_LAYOUT_VLLM_NHD, 2, 5, 16, 8, 8, TDM_DTYPE_FP16);
    test_cache d;
    assert_int_equal(cache_alloc(&d, &dl), 0);
    cache_poison(&d);
    uint32_t dids[2] = {4, 1};
    conv_case cc[2];
    uint8_t *src[2];
    size_t need;
    for (int r = 0; r < 2; r++) {
        conv_init(&cc[r], 2, 16, 4, 8, TDM_DTYPE_FP16, 2, 30);
        cc[r].dof = 4u * (uint32_t)r;
        tdm_kv_packed_size(&cc[r].src, 2, 0, 2, &need);
        src[r] = malloc(need);
        for (size_t i = 0; i < need / 2; i++) put_elem(src[r], TDM_DTYPE_FP16, i, rng_float(8));
        tdm_kv_convert_opts o;
        tdm_kv_convert_opts_init(&o);
        o.dst_head_offset = cc[r].dof;
        assert_int_equal(tdm_kv_unpack_convert(&cc[r].src, src[r], need, 2, 30, &dl, d.bases,
                                               dids, 2, &o), TDM_OK);
    }
    /* check each sender's half with the other's heads treated as "moved by someone": verify
     * per half by comparing against a cache where only that half is considered */
    for (int r = 0; r < 2; r++) {
        test_cache view = d;
        /* heads of the other sender: poison them in a copy so check_convert sees poison */
        test_cache copy;
        assert_int_equal(cache_alloc(&copy, &dl), 0);
        for (uint32_t li = 0; li < dl.num_layers; li++) {
            memcpy(copy.bases[li], d.bases[li], d.layer_bytes);
            for (uint32_t b = 0; b < 2; b++)
                for (uint32_t kv = 0; kv < 2; kv++)
                    for (uint32_t t = 0; t < 16; t++)
                        for (uint32_t h = 4u * (uint32_t)(1 - r); h < 4u * (uint32_t)(2 - r); h++)
                            memset((uint8_t *)copy.bases[li] + elem_index(&dl, kv, dids[b], t, h) * 2,
                                   POISON, 8 * 2);
        }
        (void)view;
        cc[r].nh = 4;
        check_convert(&cc[r], src[r], &copy, dids, 2);
        cache_free(&copy);
        free(src[r]);
    }
    cache_free(&d);
}

static void unpack_convert__tp1_to_tp2_takes_a_head_slice(void **state)
{
    (void)state;
    for (uint32_t rank = 0; rank < 2; rank++) {
        conv_case cc;
        conv_init(&cc, 3, 16, 8, 16, TDM_DTYPE_BF16, 3, 48);
        cc.so = 4 * rank;
        cc.nh = 4;
        cc.lb = 1;                      /* and a layer subset */
        cc.le = 3;
        tdm_kv_layout dl;
        tdm_kv_layout_init(&dl, TDM_KV_LAYOUT_VLLM_HND, 3, 4, 16, 4, 16, TDM_DTYPE_BF16);
        run_case(&cc, &dl, 2.0f, NULL);
    }
}

static void unpack_convert__fp16_bf16_to_fp8_and_back(void **state)
{
    (void)state;
    const tdm_dtype hi[] = {TDM_DTYPE_FP16, TDM_DTYPE_BF16, TDM_DTYPE_FP32};
    float kscale[2 * 4] = {0.5f, 1.5f, 2.0f, 0.25f, 3.0f, 0.75f, 1.0f, 2.5f};
    float vscale[2 * 4] = {1.0f, 2.0f, 0.125f, 4.0f, 1.25f, 0.5f, 6.0f, 1.0f};
    for (size_t i = 0; i < 3; i++)
        for (int per_head = 0; per_head < 2; per_head++) {
            /* quantize: hi -> fp8 with dst scales (per layer: stride 4) */
            conv_case q;
            conv_init(&q, 2, 16, 4, 8, hi[i], 2, 29);
            q.dk = kscale;
            q.dv = vscale;
            q.d_per_head = (uint32_t)per_head;
            q.d_lstride = 4;
            tdm_kv_layout fp8;
            tdm_kv_layout_init(&fp8, TDM_KV_LAYOUT_FLASHINFER, 2, 4, 16, 4, 8, TDM_DTYPE_FP8_E4M3);
            uint8_t *src = NULL;
            run_case(&q, &fp8, 300.0f, &src);
            free(src);
            /* dequantize: fp8 -> hi with src scales */
            conv_case dq;
            conv_init(&dq, 2, 16, 4, 8, TDM_DTYPE_FP8_E4M3, 2, 29);
            dq.sk = kscale;
            dq.sv = vscale;
            dq.s_per_head = (uint32_t)per_head;
            dq.s_lstride = 4;
            tdm_kv_layout hl;
            tdm_kv_layout_init(&hl, TDM_KV_LAYOUT_VLLM_NHD, 2, 4, 16, 4, 8, hi[i]);
            run_case(&dq, &hl, 300.0f, NULL);
        }
}

static void pack_convert__quantize_then_unpack_convert_round_trip(void **state)
{
    (void)state;
    tdm_kv_layout sl, pl, dl;
    tdm_kv_layout_init(&sl, TDM_KV_LAYOUT_VLLM_NHD, 2, 8, 16, 4, 32, TDM_DTYPE_FP16);
    tdm_kv_layout_init(&pl, TDM_KV_LAYOUT_VLLM_NHD, 2, 1, 16, 2, 32, TDM_DTYPE_FP8_E4M3);
    tdm_kv_layout_init(&dl, TDM_KV_LAYOUT_VLLM_HND, 2, 8, 16, 2, 32, TDM_DTYPE_FP16);
    test_cache a, b;
    assert_int_equal(cache_alloc(&a, &sl), 0);
    assert_int_equal(cache_alloc(&b, &dl), 0);
    cache_fill_values(&a, 20.0f);
    cache_poison(&b);
    uint32_t ids[3] = {6, 0, 3}, dids[3] = {2, 7, 5};
    float ks = 0.125f, vs = 0.0625f;
    tdm_kv_convert_opts o;
    tdm_kv_convert_opts_init(&o);
    o.src_head_offset = 2;           /* the sender's heads 2..3 for the receiving rank */
    o.dst_scale_kind = TDM_KV_SCALE_TENSOR;
    o.dst_k_scale = &ks;
    o.dst_v_scale = &vs;
    size_t need;
    tdm_kv_packed_size(&pl, 3, 0, 2, &need);
    uint8_t *buf = malloc(need + 16);
    memset(buf, POISON, need + 16);
    assert_int_equal(tdm_kv_pack_convert(&sl, a.bases, ids, 3, &pl, buf, need + 16, &o), TDM_OK);
    for (size_t i = need; i < need + 16; i++) assert_int_equal(buf[i], POISON);
    /* every packed element is the quantized source element */
    size_t off = 0;
    for (uint32_t layer = 0; layer < 2; layer++)
        for (uint32_t i = 0; i < 3; i++)
            for (uint32_t kv = 0; kv < 2; kv++)
                for (uint32_t t = 0; t < 16; t++)
                    for (uint32_t h = 0; h < 2; h++)
                        for (uint32_t d = 0; d < 32; d++, off++) {
                            float x = get_elem(a.bases[layer], TDM_DTYPE_FP16,
                                               elem_index(&sl, kv, ids[i], t, h + 2) + d);
                            assert_int_equal(buf[off], tdm_fp8_e4m3_from_float(x / (kv ? vs : ks)));
                        }
    tdm_kv_convert_opts u;
    tdm_kv_convert_opts_init(&u);
    u.src_scale_kind = TDM_KV_SCALE_TENSOR;
    u.src_k_scale = &ks;
    u.src_v_scale = &vs;
    assert_int_equal(tdm_kv_unpack_convert(&pl, buf, need, 3, 48, &dl, b.bases, dids, 3, &u), TDM_OK);
    for (uint32_t layer = 0; layer < 2; layer++)
        for (uint32_t i = 0; i < 3; i++)
            for (uint32_t kv = 0; kv < 2; kv++)
                for (uint32_t t = 0; t < 16; t++)
                    for (uint32_t h = 0; h < 2; h++)
                        for (uint32_t d = 0; d < 32; d++) {
                            float x = get_elem(a.bases[layer], TDM_DTYPE_FP16,
                                               elem_index(&sl, kv, ids[i], t, h + 2) + d);
                            float y = get_elem(b.bases[layer], TDM_DTYPE_FP16,
                                               elem_index(&dl, kv, dids[i], t, h) + d);
                            float s = kv ? vs : ks;
                            /* e4m3: relative error <= 2^-4, absolute <= 2^-10 * s near zero */
                            assert_true(fabsf(x - y) <= fmaxf(fabsf(x) * 0.0625f, s * 0.0009765625f) * 1.001f);
                        }
    free(buf);
    cache_free(&a);
    cache_free(&b);
}

static void unpack_convert__same_dtype_copies_bits_exactly(void **state)
{
    (void)state;
    tdm_kv_layout sl, dl;
    tdm_kv_layout_init(&sl, TDM_KV_LAYOUT_VLLM_NHD, 1, 1, 8, 2, 8, TDM_DTYPE_FP16);
    tdm_kv_layout_init(&dl, TDM_KV_LAYOUT_FLASHINFER_HND, 1, 3, 4, 2, 8, TDM_DTYPE_FP16);
    size_t need;
    tdm_kv_packed_size(&sl, 2, 0, 1, &need);
    uint8_t *src = malloc(need);
    fill_random_bytes(src, need);      /* NaN payloads included */
    test_cache d;
    assert_int_equal(cache_alloc(&d, &dl), 0);
    cache_poison(&d);
    uint32_t dids[3] = {2, 0, 1};
    assert_int_equal(tdm_kv_unpack_convert(&sl, src, need, 2, 11, &dl, d.bases, dids, 3, NULL), TDM_OK);
    conv_case cc;
    conv_init(&cc, 1, 8, 2, 8, TDM_DTYPE_FP16, 2, 11);
    check_convert(&cc, src, &d, dids, 3);
    free(src);
    cache_free(&d);
}

static void unpack_convert__bad_input_gives_status_and_writes_nothing(void **state)
{
    (void)state;
    tdm_kv_layout sl, dl, d2;
    tdm_kv_layout_init(&sl, TDM_KV_LAYOUT_VLLM_NHD, 2, 1, 16, 4, 8, TDM_DTYPE_FP8_E4M3);
    tdm_kv_layout_init(&dl, TDM_KV_LAYOUT_VLLM_NHD, 2, 4, 16, 4, 8, TDM_DTYPE_FP16);
    size_t need;
    tdm_kv_packed_size(&sl, 2, 0, 2, &need);
    uint8_t *src = calloc(1, need);
    test_cache d;
    assert_int_equal(cache_alloc(&d, &dl), 0);
    cache_poison(&d);
    uint32_t dids[2] = {1, 2}, bad[2] = {1, 4};
    float one = 1.0f, zero = 0.0f, nan = NAN;
    tdm_kv_convert_opts o;
#define EXPECT(rc, ...) assert_int_equal(tdm_kv_unpack_convert(__VA_ARGS__), rc)
    EXPECT(TDM_E_INVAL, NULL, src, need, 2, 32, &dl, d.bases, dids, 2, NULL);
    EXPECT(TDM_E_INVAL, &sl, NULL, need, 2, 32, &dl, d.bases, dids, 2, NULL);
    EXPECT(TDM_E_INVAL, &sl, src, need - 1, 2, 32, &dl, d.bases, dids, 2, NULL);
    EXPECT(TDM_E_INVAL, &sl, src, need, 2, 33, &dl, d.bases, dids, 2, NULL);  /* > capacity */
    EXPECT(TDM_E_INVAL, &sl, src, need, 2, 32, &dl, d.bases, dids, 1, NULL);  /* dst blocks */
    EXPECT(TDM_E_INVAL, &sl, src, need, 2, 32, &dl, d.bases, bad, 2, NULL);
    EXPECT(TDM_E_INVAL, &sl, src, need, 2, 32, &dl, NULL, dids, 2, NULL);
    tdm_kv_layout_init(&d2, TDM_KV_LAYOUT_VLLM_NHD, 2, 4, 16, 4, 16, TDM_DTYPE_FP16);
    EXPECT(TDM_E_LAYOUT, &sl, src, need, 2, 32, &d2, d.bases, dids, 2, NULL); /* head_dim */
    tdm_kv_convert_opts_init(&o);
    o.src_head_offset = 2;
    o.num_heads = 3;
    EXPECT(TDM_E_LAYOUT, &sl, src, need, 2, 32, &dl, d.bases, dids, 2, &o);
    tdm_kv_convert_opts_init(&o);
    o.dst_head_offset = 4;
    EXPECT(TDM_E_LAYOUT, &sl, src, need, 2, 32, &dl, d.bases, dids, 2, &o);
    tdm_kv_convert_opts_init(&o);
    o.layer_end = 3;
    EXPECT(TDM_E_INVAL, &sl, src, need, 2, 32, &dl, d.bases, dids, 2, &o);
    tdm_kv_convert_opts_init(&o);
    o.dst_scale_kind = TDM_KV_SCALE_TENSOR;  /* destination is fp16: no scale */
    o.dst_k_scale = o.dst_v_scale = &one;
    EXPECT(TDM_E_INVAL, &sl, src, need, 2, 32, &dl, d.bases, dids, 2, &o);
    tdm_kv_convert_opts_init(&o);
    o.src_scale_kind = TDM_KV_SCALE_TENSOR;
    o.src_k_scale = &one;
    o.src_v_scale = &zero;
    EXPECT(TDM_E_INVAL, &sl, src, need, 2, 32, &dl, d.bases, dids, 2, &o);
    o.src_v_scale = &nan;
    EXPECT(TDM_E_INVAL, &sl, src, need, 2, 32, &dl, d.bases, dids, 2, &o);
    o.src_v_scale = NULL;
    EXPECT(TDM_E_INVAL, &sl, src, need, 2, 32, &dl, d.bases, dids, 2, &o);
    o.src_scale_kind = 7;
    EXPECT(TDM_E_INVAL, &sl, src, need, 2, 32, &dl, d.bases, dids, 2, &o);
    tdm_kv_convert_opts_init(&o);
    o.struct_size = 4;
    EXPECT(TDM_E_INVAL, &sl, src, need, 2, 32, &dl, d.bases, dids, 2, &o);
#undef EXPECT
    for (uint32_t i = 0; i < 2; i++)
        for (size_t j = 0; j < d.layer_bytes; j++)
            assert_int_equal(((uint8_t *)d.bases[i])[j], POISON);
    /* pack_convert: block size must match, dst size checked */
    tdm_kv_layout pl;
    tdm_kv_layout_init(&pl, TDM_KV_LAYOUT_VLLM_NHD, 2, 1, 8, 4, 8, TDM_DTYPE_FP8_E4M3);
    uint8_t out[64];
    memset(out, POISON, sizeof out);
    assert_int_equal(tdm_kv_pack_convert(&dl, d.bases, dids, 2, &pl, out, sizeof out, NULL), TDM_E_LAYOUT);
    assert_int_equal(tdm_kv_pack_convert(&dl, d.bases, dids, 2, &sl, out, sizeof out, NULL), TDM_E_TRUNCATED);
    for (size_t i = 0; i < sizeof out; i++) assert_int_equal(out[i], POISON);
    free(src);
    cache_free(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fp8_encode__known_values),
        cmocka_unit_test(fp8_encode__matches_exhaustive_nearest),
        cmocka_unit_test(fp16_encode__known_values_and_reference),
        cmocka_unit_test(bf16_encode__rounds_to_nearest_even),
        cmocka_unit_test(unpack_convert__block_size_16_to_32_partial_last_block),
        cmocka_unit_test(unpack_convert__block_size_32_to_16_and_odd_sizes),
        cmocka_unit_test(unpack_convert__tp2_to_tp1_two_senders_fill_the_heads),
        cmocka_unit_test(unpack_convert__tp1_to_tp2_takes_a_head_slice),
        cmocka_unit_test(unpack_convert__fp16_bf16_to_fp8_and_back),
        cmocka_unit_test(pack_convert__quantize_then_unpack_convert_round_trip),
        cmocka_unit_test(unpack_convert__same_dtype_copies_bits_exactly),
        cmocka_unit_test(unpack_convert__bad_input_gives_status_and_writes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
