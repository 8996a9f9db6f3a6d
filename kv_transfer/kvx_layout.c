/*
 * kvx_layout.c -- what the transfer engine needs to know about KV layouts: whether a
 * sender's layout can be received into ours (identical packed format, convertible, or
 * refused with the reason), the size of the canonical packed unit (one block of one layer:
 * K [block_size][heads][dim] then V), and the pack / unpack calls into the kernels.
 */
#include <stdio.h>
#include <string.h>

#include "kvx_internal.h"

size_t tdm__kvx_elem_size(uint32_t dtype)
{
    switch (dtype) {
    case TDM_DTYPE_FP16: case TDM_DTYPE_BF16: return 2;
    case TDM_DTYPE_FP32: return 4;
    case TDM_DTYPE_FP8_E4M3: return 1;
    default: return 0;
    }
}

size_t tdm__kvx_unit_bytes(const tdm_kv_layout *l)
{
    size_t e = tdm__kvx_elem_size(l->dtype);
    return 2u * (size_t)l->block_size * l->num_kv_heads * l->head_dim * e;
}

int tdm__kvx_compat(const tdm_kv_layout *s, uint32_t soff, const tdm_kv_layout *d, uint32_t doff,
                    char *why, size_t why_len)
{
#define REFUSE(...) do { if (why && why_len) snprintf(why, why_len, __VA_ARGS__); return TDM_E_LAYOUT; } while (0)
    if (s->num_layers != d->num_layers)
        REFUSE("num_layers differ (sender %u, receiver %u)", s->num_layers, d->num_layers);
    if (s->head_dim != d->head_dim)
        REFUSE("head_dim differs (sender %u, receiver %u)", s->head_dim, d->head_dim);
    if (doff < soff || (uint64_t)doff + d->num_kv_heads > (uint64_t)soff + s->num_kv_heads)
        REFUSE("receiver heads [%u,%u) are not within the sender's [%u,%u)", doff,
               doff + d->num_kv_heads, soff, soff + s->num_kv_heads);
    if (s->dtype != d->dtype || s->num_kv_heads != d->num_kv_heads || s->block_size != d->block_size)
        return 1;   /* converted by the receiver */
    return 0;
#undef REFUSE
}

int tdm__kvx_pack(const tdm_kvx *k, const uint32_t *ids, uint32_t n, uint32_t lb, uint32_t le,
                  void *dst, size_t dst_size)
{
    if ((size_t)(le - lb) * n * k->unit_bytes != dst_size) return TDM_E_INTERNAL;
    if (k->mem_kind != TDM_MEM_CUDA) return tdm_kv_pack(&k->layout, k->bases, ids, n, lb, le, dst, dst_size);
    /* CUDA memory: one pack kernel into the device staging buffer, then one copy to the host
     * buffer the transport sends (GPUDirect / CUDA IPC would skip this copy) */
    int rc = tdm_kv_pack_cuda(&k->layout, k->bases, ids, n, lb, le, k->dev_stage, dst_size, NULL);
    if (!rc) rc = tdm_cuda_memcpy(dst, k->dev_stage, dst_size, TDM_CUDA_COPY_DEVICE_TO_HOST);
    return rc;
}

int tdm__kvx_unpack(const tdm_kvx *k, const kvx_peer *p, const void *src, size_t src_size,
                    uint32_t src_blocks, uint32_t tokens, const uint32_t *ids, uint32_t n,
                    uint32_t lb, uint32_t le)
{
    const tdm_kv_layout *r = &p->remote.layout;
    if ((size_t)(le - lb) * src_blocks * tdm__kvx_unit_bytes(r) != src_size) return TDM_E_PROTOCOL;
    int cuda = k->mem_kind == TDM_MEM_CUDA;
    if (cuda) {   /* to the device first; src_size <= max_chunk_bytes (checked by the caller) */
        if (src_size > k->cfg.max_chunk_bytes) return TDM_E_PROTOCOL;
        int rc = tdm_cuda_memcpy(k->dev_stage, src, src_size, TDM_CUDA_COPY_HOST_TO_DEVICE);
        if (rc) return rc;
        src = k->dev_stage;
    }
    if (r->dtype == k->layout.dtype && r->num_kv_heads == k->layout.num_kv_heads &&
        r->block_size == k->layout.block_size && p->remote.head_offset == k->head_offset &&
        src_blocks == n && p->scales_same) {
        if (!cuda) return tdm_kv_unpack(&k->layout, k->bases, ids, n, lb, le, src, src_size);
        int rc = tdm_kv_unpack_cuda(&k->layout, k->bases, ids, n, lb, le, src, src_size, NULL);
        return rc ? rc : tdm_cuda_stream_sync(NULL);
    }
    /* a different dtype, head split, block size or KV scales: convert while unpacking (the
     * sender's scales decode, ours encode) */
    tdm_kv_convert_opts o;
    tdm_kv_convert_opts_init(&o);
    o.layer_begin = lb;
    o.layer_end = le;
    o.src_head_offset = k->head_offset - p->remote.head_offset;
    o.dst_head_offset = 0;
    o.num_heads = k->layout.num_kv_heads;
    tdm__kvx_scale_opts(k, p, &o);
    if (!cuda) return tdm_kv_unpack_convert(r, src, src_size, src_blocks, tokens, &k->layout, k->bases, ids, n, &o);
    int rc = tdm_kv_unpack_convert_cuda(r, src, src_size, src_blocks, tokens, &k->layout, k->bases, ids, n, &o, NULL);
    return rc ? rc : tdm_cuda_stream_sync(NULL);
}

/* True when K (and V) of one block is one contiguous run of block_size * heads * dim
 * elements (token-major, as the packed format): NHD arrangements. */
static int block_contiguous(const tdm_kv_layout *l)
{
    return l->stride_head == (int64_t)l->head_dim &&
           l->stride_token == (int64_t)l->head_dim * l->num_kv_heads;
}

int tdm__kvx_copy_direct(tdm_kvx *k, const kvx_peer *p, const uint32_t *src_ids, const uint32_t *ids,
                         uint32_t n, uint32_t lb, uint32_t le)
{
    size_t unit = k->unit_bytes;
    const tdm_kv_layout *r = &p->remote.layout, *o = &k->layout;
    if (block_contiguous(r) && block_contiguous(o)) {
        /* the single copy: K and V of each block straight from the peer's cache into ours */
        size_t e = tdm__kvx_elem_size(o->dtype), half = unit / 2;
        for (uint32_t l = lb; l < le; l++) {
            const uint8_t *sb = p->rkv_bases[l];
            uint8_t *db = k->bases[l];
            for (uint32_t i = 0; i < n; i++)
                for (int kv = 0; kv < 2; kv++)
                    memcpy(db + ((size_t)kv * (size_t)o->stride_kv + (size_t)ids[i] * (size_t)o->stride_block) * e,
                           sb + ((size_t)kv * (size_t)r->stride_kv + (size_t)src_ids[i] * (size_t)r->stride_block) * e,
                           half);
        }
        return TDM_OK;
    }
    if (!k->bounce) {
        /* small enough to stay in the cache between the gather and the scatter */
        size_t sz = TDM_MAX(unit, (size_t)512 << 10) / unit * unit;
        k->bounce = tdm__malloc(sz);
        if (!k->bounce) return TDM_E_NOMEM;
        k->bounce_size = sz;
    }
    uint32_t g = (uint32_t)(k->bounce_size / unit);
    for (uint32_t l = lb; l < le; l++)
        for (uint32_t i = 0; i < n; i += g) {
            uint32_t c = TDM_MIN(g, n - i);
            int rc = tdm_kv_pack(&p->remote.layout, p->rkv_bases, src_ids + i, c, l, l + 1, k->bounce, c * unit);
            if (!rc) rc = tdm_kv_unpack(&k->layout, k->bases, ids + i, c, l, l + 1, k->bounce, c * unit);
            if (rc) return rc;
        }
    return TDM_OK;
}
