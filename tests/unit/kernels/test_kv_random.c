/*
 * test_kv_random.c -- randomized invariants of unpack_convert and pack_convert against a
 * naive reference written here from the documented semantics (one element at a time):
 * random layouts (every kind), block sizes, head slices, layer ranges, dtypes and scales,
 * and random corruptions of the arguments (out-of-range ids, short buffers, bad ranges,
 * bad scales, NULLs). Every call either succeeds and equals the reference on every byte of
 * the destination (moved elements converted, everything else still poisoned), or fails
 * with a status and leaves every byte untouched. Buffers are sized exactly, so the
 * sanitizers of `make check` see any overrun.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>

#include "kv_test_util.h"

typedef struct side {
    tdm_kv_layout l;          /* paged layout, or packed description */
    int packed;
    uint32_t nblocks;         /* packed: blocks per layer */
    const uint32_t *ids;      /* paged: list */
    void **bases;             /* paged */
    uint8_t *buf;             /* packed */
    uint32_t lb;              /* packed: first layer held */
} side;

/* Byte address of element (layer, kv, token t of the sequence, head h, d) of a side. */
static uint8_t *addr(const side *s, uint32_t layer, uint32_t kv, uint32_t t, uint32_t h, uint32_t d)
{
    size_t e = tdm_dtype_size((tdm_dtype)s->l.dtype);
    uint32_t bi = t / s->l.block_size, tok = t % s->l.block_size;
    if (s->packed) {
        size_t hd = (size_t)s->l.num_kv_heads * s->l.head_dim, half = s->l.block_size * hd;
        size_t i = ((size_t)(layer - s->lb) * s->nblocks + bi) * 2 * half + kv * half +
                   tok * hd + (size_t)h * s->l.head_dim + d;
        return s->buf + i * e;
    }
    return (uint8_t *)s->bases[layer] + (elem_index(&s->l, kv, s->ids[bi], tok, h) + d) * e;
}

static float scale_at(uint32_t kind, const float *a, uint32_t stride, uint32_t layer, uint32_t head)
{
    if (kind == TDM_KV_SCALE_NONE) return 1.0f;
    return a[(size_t)layer * stride + (kind == TDM_KV_SCALE_HEAD ? head : 0)];
}

/* The documented semantics, one element at a time. */
static void reference(const side *src, const side *dst, uint32_t ntok, const tdm_kv_convert_opts *o)
{
    int same = src->l.dtype == dst->l.dtype && !o->src_scale_kind && !o->dst_scale_kind;
    size_t de = tdm_dtype_size((tdm_dtype)dst->l.dtype);
    for (uint32_t layer = o->layer_begin; layer < o->layer_end; layer++)
        for (uint32_t kv = 0; kv < 2; kv++)
            for (uint32_t t = 0; t < ntok; t++)
                for (uint32_t j = 0; j < o->num_heads; j++)
                    for (uint32_t d = 0; d < dst->l.head_dim; d++) {
                        uint32_t sh = o->src_head_offset + j, dh = o->dst_head_offset + j;
                        const uint8_t *sp = addr(src, layer, kv, t, sh, d);
                        uint8_t *dp = addr(dst, layer, kv, t, dh, d);
                        if (same) {
                            memcpy(dp, sp, de);
                            continue;
                        }
                        float x = get_elem(sp, (tdm_dtype)src->l.dtype, 0);
                        if (!isnan(x) && o->src_scale_kind)
                            x *= scale_at(o->src_scale_kind, kv ? o->src_v_scale : o->src_k_scale,
                                          o->src_scale_layer_stride, layer, sh);
                        if (!isnan(x) && o->dst_scale_kind)
                            x /= scale_at(o->dst_scale_kind, kv ? o->dst_v_scale : o->dst_k_scale,
                                          o->dst_scale_layer_stride, layer, dh);
                        put_elem(dp, (tdm_dtype)dst->l.dtype, 0, x);
                    }
}

static const tdm_kv_layout_kind kinds[] = {
    TDM_KV_LAYOUT_VLLM_NHD, TDM_KV_LAYOUT_VLLM_HND, TDM_KV_LAYOUT_FLASHINFER,
    TDM_KV_LAYOUT_FLASHINFER_HND, TDM_KV_LAYOUT_CUSTOM};

static void rand_layout(tdm_kv_layout *l, uint32_t layers, uint32_t blocks, uint32_t bs,
                        uint32_t heads, uint32_t dim, tdm_dtype dt)
{
    tdm_kv_layout_kind k = kinds[rng_below(5)];
    if (k == TDM_KV_LAYOUT_CUSTOM) custom_layout(l, layers, blocks, bs, heads, dim, dt);
    else tdm_kv_layout_init(l, k, layers, blocks, bs, heads, dim, dt);
}

static uint8_t *dup_bytes(const void *p, size_t n)
{
    uint8_t *d = malloc(n ? n : 1);
    memcpy(d, p, n);
    return d;
}

static int g_ok, g_err;

/* One random unpack_convert (dir 0) or pack_convert (dir 1), maybe corrupted. */
static void one(int dir)
{
    uint32_t layers = 1 + rng_below(3), dim = 1 + rng_below(9) * (rng_below(2) ? 1 : 8);
    uint32_t sheads = 1 + rng_below(4), dheads = 1 + rng_below(4);
    uint32_t sbs = 1 + rng_below(9), dbs = dir ? sbs : 1 + rng_below(9);
    tdm_dtype sdt = (tdm_dtype)(1 + rng_below(4)), ddt = (tdm_dtype)(1 + rng_below(4));
    tdm_kv_convert_opts o;
    tdm_kv_convert_opts_init(&o);
    o.layer_begin = rng_below(layers);
    o.layer_end = o.layer_begin + 1 + rng_below(layers - o.layer_begin);
    uint32_t maxh = sheads < dheads ? sheads : dheads;
    o.num_heads = 1 + rng_below(maxh);
    o.src_head_offset = rng_below(sheads - o.num_heads + 1);
    o.dst_head_offset = rng_below(dheads - o.num_heads + 1);
    float sk[16], sv[16], dk[16], dv[16];
    for (int i = 0; i < 16; i++) {
        sk[i] = 0.125f * (1 + rng_below(40));
        sv[i] = 0.125f * (1 + rng_below(40));
        dk[i] = 0.125f * (1 + rng_below(40));
        dv[i] = 0.125f * (1 + rng_below(40));
    }
    if (sdt == TDM_DTYPE_FP8_E4M3 && rng_below(2)) {
        o.src_scale_kind = 1 + rng_below(2);
        o.src_k_scale = sk;
        o.src_v_scale = sv;
        o.src_scale_layer_stride = rng_below(2) ? 4 : 0;
    }
    if (ddt == TDM_DTYPE_FP8_E4M3 && rng_below(2)) {
        o.dst_scale_kind = 1 + rng_below(2);
        o.dst_k_scale = dk;
        o.dst_v_scale = dv;
        o.dst_scale_layer_stride = rng_below(2) ? 4 : 0;
    }

    /* the paged side and the packed side */
    uint32_t n = 1 + rng_below(5), pblocks = n + rng_below(4);
    tdm_kv_layout paged, packed;
    if (dir == 0) {
        rand_layout(&paged, layers, pblocks, dbs, dheads, dim, ddt);
        tdm_kv_layout_init(&packed, TDM_KV_LAYOUT_VLLM_NHD, layers, 1, sbs, sheads, dim, sdt);
    } else {
        rand_layout(&paged, layers, pblocks, sbs, sheads, dim, sdt);
        tdm_kv_layout_init(&packed, TDM_KV_LAYOUT_VLLM_NHD, layers, 1, sbs, dheads, dim, ddt);
    }
    test_cache c;
    assert_int_equal(cache_alloc(&c, &paged), 0);
    uint32_t ids[8];
    random_ids(ids, n, pblocks);
    uint32_t nsrc = 0, ntok;
    size_t bytes;
    if (dir == 0) {
        ntok = rng_below(n * dbs + 1);
        nsrc = (ntok + sbs - 1) / sbs + rng_below(2);
        tdm_kv_packed_size(&packed, nsrc, o.layer_begin, o.layer_end, &bytes);
    } else {
        ntok = n * sbs;
        tdm_kv_packed_size(&packed, n, o.layer_begin, o.layer_end, &bytes);
    }
    uint8_t *buf = malloc(bytes ? bytes : 1);
    if (dir == 0) {
        for (size_t i = 0; i < bytes / tdm_dtype_size(sdt); i++) put_elem(buf, sdt, i, rng_float(500));
        cache_poison(&c);
    } else {
        cache_fill_values(&c, 500);
        memset(buf, POISON, bytes);
    }
    uint32_t ndst = dir == 0 ? (ntok + dbs - 1) / dbs : n;

    /* corruptions */
    int corrupt = rng_below(3) == 0 ? 1 + (int)rng_below(7) : 0;
    size_t pass_bytes = bytes;
    uint32_t pass_n = dir == 0 ? ndst : n, pass_ntok = ntok;
    tdm_kv_convert_opts po = o;
    uint32_t bad_ids[8];
    memcpy(bad_ids, ids, sizeof ids);
    const uint32_t *pass_ids = ids;
    switch (corrupt) {
    case 1: if (bytes) pass_bytes = bytes - 1 - rng_below((uint32_t)(bytes < 8 ? bytes : 8)); break;
    case 2: bad_ids[rng_below(pass_n ? pass_n : 1)] = pblocks + rng_below(3); pass_ids = bad_ids; break;
    case 3: po.layer_end = layers + 1; break;
    case 4: po.src_head_offset = sheads; break;
    case 5: po.num_heads = maxh + 1; break;
    case 6: po.dst_scale_kind = TDM_KV_SCALE_TENSOR; po.dst_k_scale = po.dst_v_scale = NULL; break;
    case 7: if (dir == 0) pass_ntok = nsrc * sbs + 1; else pass_ids = NULL; break;
    default: break;
    }
    if (corrupt == 2 && pass_n == 0) corrupt = 0;

    /* expected: the reference applied to a copy of the destination */
    uint8_t *exp_buf = dup_bytes(buf, bytes);
    uint8_t *exp_layers[4] = {0};
    void *exp_bases[4] = {0};
    for (uint32_t i = 0; i < layers; i++) {
        exp_layers[i] = dup_bytes(c.bases[i], c.layer_bytes);
        exp_bases[i] = exp_layers[i];
    }
    side ps = {packed, 1, dir == 0 ? nsrc : n, NULL, NULL, dir == 0 ? buf : exp_buf, o.layer_begin};
    side gs = {paged, 0, 0, ids, dir == 0 ? exp_bases : c.bases, NULL, 0};
    if (dir == 0) reference(&ps, &gs, ntok, &o);
    else reference(&gs, &ps, ntok, &o);

    int rc;
    if (dir == 0)
        rc = tdm_kv_unpack_convert(&packed, buf, pass_bytes, nsrc, pass_ntok, &paged, c.bases,
                                   pass_ids, pass_n, &po);
    else
        rc = tdm_kv_pack_convert(&paged, c.bases, pass_ids, pass_n, &packed, buf, pass_bytes, &po);
    if (corrupt && !(corrupt == 1 && bytes == 0)) {
        if (rc == TDM_OK) fail_msg("corruption %d accepted (dir %d)", corrupt, dir);
        assert_true(strlen(tdm_kv_errmsg()) > 0);
        g_err++;
        /* untouched: the destination equals its state before the call */
        if (dir == 0) {
            for (uint32_t i = 0; i < layers; i++)
                for (size_t j = 0; j < c.layer_bytes; j++)
                    assert_int_equal(((uint8_t *)c.bases[i])[j], POISON);
        } else {
            for (size_t j = 0; j < bytes; j++) assert_int_equal(buf[j], POISON);
        }
    } else {
        if (rc != TDM_OK) fail_msg("dir %d: %d %s", dir, rc, tdm_kv_errmsg());
        g_ok++;
        if (dir == 0) {
            for (uint32_t i = 0; i < layers; i++)
                assert_memory_equal(c.bases[i], exp_layers[i], c.layer_bytes);
        } else {
            assert_memory_equal(buf, exp_buf, bytes);
        }
    }
    for (uint32_t i = 0; i < layers; i++) free(exp_layers[i]);
    free(exp_buf);
    free(buf);
    cache_free(&c);
}

static void unpack_convert__random_cases_match_reference_or_touch_nothing(void **state)
{
    (void)state;
    g_ok = g_err = 0;
    for (int i = 0; i < 1500; i++) one(0);
    assert_true(g_ok > 500 && g_err > 100);
}

static void pack_convert__random_cases_match_reference_or_touch_nothing(void **state)
{
    (void)state;
    g_ok = g_err = 0;
    for (int i = 0; i < 1500; i++) one(1);
    assert_true(g_ok > 500 && g_err > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(unpack_convert__random_cases_match_reference_or_touch_nothing),
        cmocka_unit_test(pack_convert__random_cases_match_reference_or_touch_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
