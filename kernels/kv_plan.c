/*
 * kv_plan.c -- builds the execution plan (kv_plan.h) of pack, unpack and the converting
 * calls, after validating every argument: layouts, layer ranges, base pointers, block ids
 * (each < num_blocks), buffer sizes, head ranges, scales. The CPU functions (kv_cpu.c) and
 * the CUDA wrappers (kv_cuda.c) share these builders, so both refuse the same inputs with
 * the same status and message, before any memory is touched.
 */
#include <math.h>
#include <string.h>

#include "kv_internal.h"

static int check_range(const char *fn, uint32_t lb, uint32_t le, uint32_t num_layers)
{
    if (lb >= le || le > num_layers)
        return tdm__kv_fail(TDM_E_INVAL, "%s: layer range [%u, %u) is empty or beyond %u layers",
                            fn, lb, le, num_layers);
    return TDM_OK;
}

static int check_bases(const char *fn, void *const *bases, uint32_t lb, uint32_t le)
{
    if (!bases) return tdm__kv_fail(TDM_E_INVAL, "%s: layer_bases is NULL", fn);
    for (uint32_t i = lb; i < le; i++)
        if (!bases[i]) return tdm__kv_fail(TDM_E_INVAL, "%s: layer_bases[%u] is NULL", fn, i);
    return TDM_OK;
}

static int check_ids(const char *fn, const uint32_t *ids, uint32_t n, uint32_t num_blocks)
{
    if (n && !ids) return tdm__kv_fail(TDM_E_INVAL, "%s: block_ids is NULL", fn);
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= num_blocks)
            return tdm__kv_fail(TDM_E_INVAL, "%s: block_ids[%u] = %u is out of range (%u blocks)",
                                fn, i, ids[i], num_blocks);
    return TDM_OK;
}

static void side_paged(tdm__kv_side *s, const tdm_kv_layout *l, void *const *bases, uint32_t lb,
                       const uint32_t *ids, uint32_t n)
{
    memset(s, 0, sizeof *s);
    s->stride_kv = l->stride_kv;
    s->stride_block = l->stride_block;
    s->stride_token = l->stride_token;
    s->stride_head = l->stride_head;
    s->ids = ids;
    s->num_ids = n;
    s->bases = bases + lb;
    s->block_size = l->block_size;
    s->dtype = l->dtype;
    s->elem = (uint32_t)tdm_dtype_size((tdm_dtype)l->dtype);
}

/* A packed side of n blocks per layer; the caller has checked the sizes. */
static void side_packed(tdm__kv_side *s, const tdm_kv_layout *l, void *buf, uint32_t n)
{
    memset(s, 0, sizeof *s);
    int64_t hd = (int64_t)l->num_kv_heads * l->head_dim, bhd = hd * l->block_size;
    s->stride_head = l->head_dim;
    s->stride_token = hd;
    s->stride_kv = bhd;
    s->stride_block = 2 * bhd;
    s->base = (char *)buf;
    s->block_size = l->block_size;
    s->dtype = l->dtype;
    s->elem = (uint32_t)tdm_dtype_size((tdm_dtype)l->dtype);
    s->layer_bytes = (uint64_t)n * 2u * (uint64_t)bhd * s->elem;
}

static uint32_t gcd32(uint32_t a, uint32_t b)
{
    while (b) {
        uint32_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Chooses the runs: heads merge when both sides store them adjacently (and no per-head scale
 * applies), tokens merge within gcd(block sizes) when both sides store them adjacently. */
static void plan_finish(tdm__kv_plan *p)
{
    const uint64_t d = p->head_dim;
    const int per_head = p->src.scale_kind == TDM_KV_SCALE_HEAD ||
                         p->dst.scale_kind == TDM_KV_SCALE_HEAD;
    p->run_heads = 1;
    if (p->num_heads > 1 && !per_head && (uint64_t)p->src.stride_head == d &&
        (uint64_t)p->dst.stride_head == d && (uint64_t)p->num_heads * d <= (1u << 30))
        p->run_heads = p->num_heads;
    uint32_t g = gcd32(p->src.block_size, p->dst.block_size);
    uint64_t row = (uint64_t)p->run_heads * d;
    p->run_tokens = 1;
    if (g > 1 && (uint64_t)p->src.stride_token == row && (uint64_t)p->dst.stride_token == row &&
        row * g <= (1u << 30))
        p->run_tokens = g;
    p->head_segs = p->num_heads / p->run_heads;
    p->token_segs = (uint32_t)(((uint64_t)p->num_tokens + p->run_tokens - 1) / p->run_tokens);
    p->num_runs = (uint64_t)p->num_layers * 2u * p->token_segs * p->head_segs;
    p->copy = p->src.dtype == p->dst.dtype && p->src.scale_kind == TDM_KV_SCALE_NONE &&
              p->dst.scale_kind == TDM_KV_SCALE_NONE;
}

int tdm__kv_plan_copy(tdm__kv_plan *p, const char *fn, int unpack, const tdm_kv_layout *l,
                      void *const *layer_bases, const uint32_t *block_ids, uint32_t num_blocks,
                      uint32_t layer_begin, uint32_t layer_end, void *buf, size_t buf_size)
{
    int rc = tdm_kv_layout_validate(l);
    if (rc) return tdm__kv_fail_prefix(rc, fn, NULL);
    if ((rc = check_range(fn, layer_begin, layer_end, l->num_layers)) ||
        (rc = check_bases(fn, layer_bases, layer_begin, layer_end)) ||
        (rc = check_ids(fn, block_ids, num_blocks, l->num_blocks)))
        return rc;
    if ((uint64_t)num_blocks * l->block_size > UINT32_MAX)
        return tdm__kv_fail(TDM_E_INVAL, "%s: %u blocks of %u tokens exceed 2^32 tokens", fn,
                            num_blocks, l->block_size);
    size_t need;
    if ((rc = tdm_kv_packed_size(l, num_blocks, layer_begin, layer_end, &need)))
        return tdm__kv_fail_prefix(rc, fn, NULL);
    if (need && !buf) return tdm__kv_fail(TDM_E_INVAL, "%s: %s is NULL", fn, unpack ? "src" : "dst");
    if (buf_size < need)
        return tdm__kv_fail(unpack ? TDM_E_INVAL : TDM_E_TRUNCATED,
                            "%s: %s_size %zu < %zu bytes of %u blocks x %u layers", fn,
                            unpack ? "src" : "dst", buf_size, need, num_blocks,
                            layer_end - layer_begin);
    tdm__kv_plan t;
    memset(&t, 0, sizeof t);
    tdm__kv_side *paged = unpack ? &t.dst : &t.src, *packed = unpack ? &t.src : &t.dst;
    side_paged(paged, l, layer_bases, layer_begin, block_ids, num_blocks);
    side_packed(packed, l, buf, num_blocks);
    t.layer_begin = layer_begin;
    t.num_layers = layer_end - layer_begin;
    t.num_tokens = num_blocks * l->block_size;
    t.num_heads = l->num_kv_heads;
    t.head_dim = l->head_dim;
    plan_finish(&t);
    *p = t;
    return TDM_OK;
}

/* Reads opts (NULL: defaults) into *o. */
static int read_opts(const char *fn, const tdm_kv_convert_opts *opts, tdm_kv_convert_opts *o)
{
    tdm_kv_convert_opts_init(o);
    if (!opts) return TDM_OK;
    if (opts->struct_size < sizeof(tdm_kv_convert_opts))
        return tdm__kv_fail(TDM_E_INVAL, "%s: opts->struct_size %u < %zu (call "
                            "tdm_kv_convert_opts_init)", fn, opts->struct_size,
                            sizeof(tdm_kv_convert_opts));
    *o = *opts;
    o->struct_size = sizeof *o;
    return TDM_OK;
}

/* Resolves the layer and head ranges of a conversion between heads sh (source) and dh. */
static int resolve_ranges(const char *fn, tdm_kv_convert_opts *o, uint32_t src_layers,
                          uint32_t dst_layers, uint32_t sh, uint32_t dh, uint32_t src_dim,
                          uint32_t dst_dim)
{
    if (src_dim != dst_dim)
        return tdm__kv_fail(TDM_E_LAYOUT, "%s: head_dim differs (%u vs %u)", fn, src_dim, dst_dim);
    if (o->layer_begin == 0 && o->layer_end == 0)
        o->layer_end = src_layers < dst_layers ? src_layers : dst_layers;
    if (o->layer_begin >= o->layer_end || o->layer_end > src_layers || o->layer_end > dst_layers)
        return tdm__kv_fail(TDM_E_INVAL, "%s: layer range [%u, %u) is empty or beyond the "
                            "layouts' layers (%u, %u)", fn, o->layer_begin, o->layer_end,
                            src_layers, dst_layers);
    if (o->src_head_offset >= sh || o->dst_head_offset >= dh)
        return tdm__kv_fail(TDM_E_LAYOUT, "%s: head offsets %u / %u beyond the heads (%u / %u)",
                            fn, o->src_head_offset, o->dst_head_offset, sh, dh);
    if (o->num_heads == 0) {
        uint32_t a = sh - o->src_head_offset, b = dh - o->dst_head_offset;
        o->num_heads = a < b ? a : b;
    }
    if ((uint64_t)o->src_head_offset + o->num_heads > sh ||
        (uint64_t)o->dst_head_offset + o->num_heads > dh)
        return tdm__kv_fail(TDM_E_LAYOUT, "%s: heads [%u, +%u) -> [%u, +%u) do not fit %u source "
                            "/ %u destination heads", fn, o->src_head_offset, o->num_heads,
                            o->dst_head_offset, o->num_heads, sh, dh);
    return TDM_OK;
}

/* Validates and records one side's scales. */
static int side_scales(const char *fn, const char *which, tdm__kv_side *s, uint32_t kind,
                       const float *k, const float *v, uint32_t lstride, uint32_t lb, uint32_t le,
                       uint32_t nh)
{
    if (kind == TDM_KV_SCALE_NONE) return TDM_OK;
    if (kind > TDM_KV_SCALE_HEAD)
        return tdm__kv_fail(TDM_E_INVAL, "%s: unknown %s_scale_kind %u", fn, which, kind);
    if (s->dtype != TDM_DTYPE_FP8_E4M3)
        return tdm__kv_fail(TDM_E_INVAL, "%s: a %s scale is given but the %s dtype is not fp8",
                            fn, which, which);
    if (!k || !v) return tdm__kv_fail(TDM_E_INVAL, "%s: %s_k_scale or %s_v_scale is NULL", fn,
                                      which, which);
    uint64_t h0 = kind == TDM_KV_SCALE_HEAD ? s->head_offset : 0;
    uint64_t h1 = kind == TDM_KV_SCALE_HEAD ? s->head_offset + nh : 1;
    uint64_t count = (uint64_t)(le - 1) * lstride + h1;
    if (count > UINT32_MAX)
        return tdm__kv_fail(TDM_E_INVAL, "%s: %s scale indices exceed 2^32", fn, which);
    for (uint64_t layer = lb; layer < le; layer++)
        for (uint64_t h = h0; h < h1; h++) {
            uint64_t i = layer * lstride + h;
            if (!isfinite(k[i]) || !(k[i] > 0.0f) || !isfinite(v[i]) || !(v[i] > 0.0f))
                return tdm__kv_fail(TDM_E_INVAL, "%s: %s scale [%llu] of layer %llu is not finite "
                                    "and > 0 (k %g, v %g)", fn, which, (unsigned long long)i,
                                    (unsigned long long)layer, (double)k[i], (double)v[i]);
        }
    s->scale_kind = kind;
    s->k_scale = k;
    s->v_scale = v;
    s->scale_layer_stride = lstride;
    s->scale_count = (uint32_t)count;
    return TDM_OK;
}

static int conv_finish(const char *fn, tdm__kv_plan *t, const tdm_kv_convert_opts *o)
{
    int rc;
    t->src.head_offset = o->src_head_offset;
    t->dst.head_offset = o->dst_head_offset;
    if ((rc = side_scales(fn, "src", &t->src, o->src_scale_kind, o->src_k_scale, o->src_v_scale,
                          o->src_scale_layer_stride, o->layer_begin, o->layer_end, o->num_heads)) ||
        (rc = side_scales(fn, "dst", &t->dst, o->dst_scale_kind, o->dst_k_scale, o->dst_v_scale,
                          o->dst_scale_layer_stride, o->layer_begin, o->layer_end, o->num_heads)))
        return rc;
    t->layer_begin = o->layer_begin;
    t->num_layers = o->layer_end - o->layer_begin;
    t->num_heads = o->num_heads;
    plan_finish(t);
    return TDM_OK;
}

int tdm__kv_plan_unpack_convert(tdm__kv_plan *p, const char *fn, const tdm_kv_layout *src_layout,
                                const void *src, size_t src_size, uint32_t num_src_blocks,
                                uint32_t num_tokens, const tdm_kv_layout *dst_layout,
                                void *const *dst_bases, const uint32_t *dst_block_ids,
                                uint32_t num_dst_blocks, const tdm_kv_convert_opts *opts)
{
    int rc;
    tdm_kv_convert_opts o;
    if ((rc = tdm__kv_check_packed_desc(src_layout, "src_layout")))
        return tdm__kv_fail_prefix(rc, fn, NULL);
    if ((rc = tdm_kv_layout_validate(dst_layout)))
        return tdm__kv_fail_prefix(rc, fn, "dst_layout");
    if ((rc = read_opts(fn, opts, &o)) ||
        (rc = resolve_ranges(fn, &o, src_layout->num_layers, dst_layout->num_layers,
                             src_layout->num_kv_heads, dst_layout->num_kv_heads,
                             src_layout->head_dim, dst_layout->head_dim)) ||
        (rc = check_bases(fn, dst_bases, o.layer_begin, o.layer_end)) ||
        (rc = check_ids(fn, dst_block_ids, num_dst_blocks, dst_layout->num_blocks)))
        return rc;
    if ((uint64_t)num_tokens > (uint64_t)num_src_blocks * src_layout->block_size)
        return tdm__kv_fail(TDM_E_INVAL, "%s: num_tokens %u > %u source blocks x %u tokens", fn,
                            num_tokens, num_src_blocks, src_layout->block_size);
    uint64_t need_dst = ((uint64_t)num_tokens + dst_layout->block_size - 1) / dst_layout->block_size;
    if (need_dst > num_dst_blocks)
        return tdm__kv_fail(TDM_E_INVAL, "%s: %u tokens need %llu destination blocks of %u, got %u",
                            fn, num_tokens, (unsigned long long)need_dst, dst_layout->block_size,
                            num_dst_blocks);
    size_t need;
    if ((rc = tdm_kv_packed_size(src_layout, num_src_blocks, o.layer_begin, o.layer_end, &need)))
        return tdm__kv_fail_prefix(rc, fn, NULL);
    if (need && !src) return tdm__kv_fail(TDM_E_INVAL, "%s: src is NULL", fn);
    if (src_size < need)
        return tdm__kv_fail(TDM_E_INVAL, "%s: src_size %zu < %zu bytes of %u blocks x %u layers",
                            fn, src_size, need, num_src_blocks, o.layer_end - o.layer_begin);
    tdm__kv_plan t;
    memset(&t, 0, sizeof t);
    side_packed(&t.src, src_layout, (void *)(uintptr_t)src, num_src_blocks);
    side_paged(&t.dst, dst_layout, dst_bases, o.layer_begin, dst_block_ids, num_dst_blocks);
    t.num_tokens = num_tokens;
    t.head_dim = dst_layout->head_dim;
    if ((rc = conv_finish(fn, &t, &o))) return rc;
    *p = t;
    return TDM_OK;
}

int tdm__kv_plan_pack_convert(tdm__kv_plan *p, const char *fn, const tdm_kv_layout *src_layout,
                              void *const *src_bases, const uint32_t *block_ids,
                              uint32_t num_blocks, const tdm_kv_layout *packed_layout, void *dst,
                              size_t dst_size, const tdm_kv_convert_opts *opts)
{
    int rc;
    tdm_kv_convert_opts o;
    if ((rc = tdm_kv_layout_validate(src_layout)))
        return tdm__kv_fail_prefix(rc, fn, "src_layout");
    if ((rc = tdm__kv_check_packed_desc(packed_layout, "packed_layout")))
        return tdm__kv_fail_prefix(rc, fn, NULL);
    if (packed_layout->block_size != src_layout->block_size)
        return tdm__kv_fail(TDM_E_LAYOUT, "%s: packed block_size %u differs from the source's %u",
                            fn, packed_layout->block_size, src_layout->block_size);
    if ((rc = read_opts(fn, opts, &o)) ||
        (rc = resolve_ranges(fn, &o, src_layout->num_layers, packed_layout->num_layers,
                             src_layout->num_kv_heads, packed_layout->num_kv_heads,
                             src_layout->head_dim, packed_layout->head_dim)) ||
        (rc = check_bases(fn, src_bases, o.layer_begin, o.layer_end)) ||
        (rc = check_ids(fn, block_ids, num_blocks, src_layout->num_blocks)))
        return rc;
    if ((uint64_t)num_blocks * src_layout->block_size > UINT32_MAX)
        return tdm__kv_fail(TDM_E_INVAL, "%s: %u blocks of %u tokens exceed 2^32 tokens", fn,
                            num_blocks, src_layout->block_size);
    size_t need;
    if ((rc = tdm_kv_packed_size(packed_layout, num_blocks, o.layer_begin, o.layer_end, &need)))
        return tdm__kv_fail_prefix(rc, fn, NULL);
    if (need && !dst) return tdm__kv_fail(TDM_E_INVAL, "%s: dst is NULL", fn);
    if (dst_size < need)
        return tdm__kv_fail(TDM_E_TRUNCATED, "%s: dst_size %zu < %zu bytes of %u blocks x %u "
                            "layers", fn, dst_size, need, num_blocks, o.layer_end - o.layer_begin);
    tdm__kv_plan t;
    memset(&t, 0, sizeof t);
    side_paged(&t.src, src_layout, src_bases, o.layer_begin, block_ids, num_blocks);
    side_packed(&t.dst, packed_layout, dst, num_blocks);
    t.num_tokens = num_blocks * src_layout->block_size;
    t.head_dim = src_layout->head_dim;
    if ((rc = conv_finish(fn, &t, &o))) return rc;
    *p = t;
    return TDM_OK;
}
