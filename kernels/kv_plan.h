/*
 * kv_plan.h -- the execution plan of one pack / unpack / convert, shared by the CPU
 * implementation (kv_cpu.c) and the CUDA kernels (kv_kernels.cu), so that both walk the
 * same runs in the same way. A plan moves, for every layer of a range, K and V of tokens
 * [0, num_tokens) and heads [0, num_heads) (offset per side) from a source side to a
 * destination side. Each side is paged (a block-id list and per-layer bases) or packed
 * (identity ids, one base plus a per-layer stride). The work is cut into "runs": element
 * ranges contiguous on both sides (a head row, a token's heads, or a whole block's tokens),
 * enumerated as (layer, kv, token segment, head segment). Valid C11 and CUDA C++.
 */
#ifndef TANDEM_KV_PLAN_H
#define TANDEM_KV_PLAN_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#  define TDM_HD static inline __host__ __device__
#else
#  define TDM_HD static inline
#endif

/* One side of a plan. Pointers are host pointers in a CPU plan; in the copy sent to the
 * CUDA library, ids/bases/k_scale/v_scale hold TDM__META_REF offsets into the metadata
 * blob instead (base stays a device pointer): the kernel resolves them against its inline
 * copy of the blob, or the launcher replaces them with device pointers. */
typedef struct tdm__kv_side {
    int64_t stride_kv;            /* elements */
    int64_t stride_block;
    int64_t stride_token;
    int64_t stride_head;
    const uint32_t *ids;          /* block of list index i (NULL: i, the packed side) */
    void *const *bases;           /* per RELATIVE layer (layer - layer_begin); NULL: packed */
    char *base;                   /* packed side: base of layer_begin */
    const float *k_scale;         /* fp8 scales (NULL: 1), indexed by ABSOLUTE layer */
    const float *v_scale;
    uint64_t layer_bytes;         /* packed side: bytes from one layer to the next */
    uint32_t num_ids;             /* entries of ids (metadata sizing) */
    uint32_t block_size;
    uint32_t head_offset;         /* first head of this side moved */
    uint32_t dtype;               /* tdm_dtype */
    uint32_t elem;                /* bytes per element */
    uint32_t scale_kind;          /* tdm_kv_scale_kind (NONE unless dtype is fp8) */
    uint32_t scale_layer_stride;
    uint32_t scale_count;         /* floats of k_scale / v_scale read (metadata sizing) */
} tdm__kv_side;

typedef struct tdm__kv_plan {
    tdm__kv_side src;
    tdm__kv_side dst;
    uint64_t num_runs;
    uint32_t layer_begin;         /* absolute index of the first layer */
    uint32_t num_layers;
    uint32_t num_tokens;
    uint32_t num_heads;           /* heads moved */
    uint32_t head_dim;
    uint32_t run_heads;           /* heads per run: 1 or num_heads */
    uint32_t run_tokens;          /* tokens per run (divides both block sizes) */
    uint32_t head_segs;           /* num_heads / run_heads */
    uint32_t token_segs;          /* ceil(num_tokens / run_tokens) */
    uint32_t copy;                /* 1: bytes are copied (same dtype, no scale) */
} tdm__kv_plan;

/* The metadata references of a plan sent to the CUDA library: offset + 1 (0 = NULL). */
#define TDM__META_REF(off) ((uintptr_t)(off) + 1u)

/* Where run r lies. */
typedef struct tdm__kv_run {
    const char *src;
    char *dst;
    uint32_t elems;               /* elements in the run */
    uint32_t layer;               /* absolute layer */
    uint32_t kv;                  /* 0 K, 1 V */
    uint32_t head;                /* first head of the run, relative to the moved range */
} tdm__kv_run;

/* A metadata field: the pointer itself, or, when meta is not NULL, the TDM__META_REF
 * offset it holds resolved against meta (the CUDA kernels' inline metadata). */
TDM_HD const void *tdm__kv_ref(const void *field, const char *meta)
{
    if (!meta || !field) return field;
    return meta + ((uintptr_t)field - 1u);
}

TDM_HD char *tdm__kv_side_ptr(const tdm__kv_side *s, const char *meta, uint32_t li, uint32_t kv,
                              uint32_t t, uint32_t h)
{
    uint32_t bi = t / s->block_size, tok = t - bi * s->block_size;
    const uint32_t *ids = (const uint32_t *)tdm__kv_ref(s->ids, meta);
    void *const *bases = (void *const *)tdm__kv_ref(s->bases, meta);
    uint64_t block = ids ? ids[bi] : bi;
    int64_t off = (int64_t)kv * s->stride_kv + (int64_t)block * s->stride_block +
                  (int64_t)tok * s->stride_token + (int64_t)(s->head_offset + h) * s->stride_head;
    char *base = bases ? (char *)bases[li] : s->base + (uint64_t)li * s->layer_bytes;
    return base + off * (int64_t)s->elem;
}

/* Where run r lies (meta: NULL, or the inline metadata the plan's references point into). */
TDM_HD void tdm__kv_locate(const tdm__kv_plan *p, const char *meta, uint64_t r, tdm__kv_run *out)
{
    uint32_t hs, ts, kv, li;
    if (r <= 0xFFFFFFFFu) {          /* 32-bit divisions: much cheaper on the GPU */
        uint32_t q = (uint32_t)r;
        hs = q % p->head_segs;
        q /= p->head_segs;
        ts = q % p->token_segs;
        q /= p->token_segs;
        kv = q & 1u;
        li = q >> 1;
    } else {
        hs = (uint32_t)(r % p->head_segs);
        r /= p->head_segs;
        ts = (uint32_t)(r % p->token_segs);
        r /= p->token_segs;
        kv = (uint32_t)(r & 1u);
        li = (uint32_t)(r >> 1);
    }
    uint32_t t0 = ts * p->run_tokens;
    uint32_t nt = p->num_tokens - t0 < p->run_tokens ? p->num_tokens - t0 : p->run_tokens;
    uint32_t h = hs * p->run_heads;
    out->src = tdm__kv_side_ptr(&p->src, meta, li, kv, t0, h);
    out->dst = tdm__kv_side_ptr(&p->dst, meta, li, kv, t0, h);
    out->elems = nt * p->run_heads * p->head_dim;
    out->layer = p->layer_begin + li;
    out->kv = kv;
    out->head = h;
}

/* The scale of a side for run (layer, kv, head relative to the moved range); 1 if none. */
TDM_HD float tdm__kv_side_scale(const tdm__kv_side *s, const char *meta, uint32_t layer,
                                uint32_t kv, uint32_t h)
{
    if (s->scale_kind == 0) return 1.0f;
    const float *a = (const float *)tdm__kv_ref(kv ? s->v_scale : s->k_scale, meta);
    uint64_t i = (uint64_t)layer * s->scale_layer_stride;
    if (s->scale_kind == 2) i += s->head_offset + h;
    return a[i];
}

#endif /* TANDEM_KV_PLAN_H */
