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
    if (s->block_size != d->block_size)
        REFUSE("block_size differs (sender %u, receiver %u) and block-size conversion is not "
               "available", s->block_size, d->block_size);
    if (doff < soff || (uint64_t)doff + d->num_kv_heads > (uint64_t)soff + s->num_kv_heads)
        REFUSE("receiver heads [%u,%u) are not within the sender's [%u,%u)", doff,
               doff + d->num_kv_heads, soff, soff + s->num_kv_heads);
    if (s->dtype != d->dtype)
        REFUSE("dtype differs (sender %u, receiver %u) and dtype conversion is not available",
               s->dtype, d->dtype);
    if (s->num_kv_heads != d->num_kv_heads)
        REFUSE("num_kv_heads differ (sender %u, receiver %u) and head-split conversion is not "
               "available", s->num_kv_heads, d->num_kv_heads);
    return 0;
#undef REFUSE
}

/* Copies one block of one layer between the paged tensor and the packed unit. */
static void copy_unit(const tdm_kv_layout *l, uint8_t *base, uint32_t block, uint8_t *packed, int to_packed)
{
    size_t e = tdm__kvx_elem_size(l->dtype);
    size_t row = (size_t)l->head_dim * e;
    size_t tok = (size_t)l->num_kv_heads * row;
    int contiguous = l->stride_head == (int64_t)l->head_dim &&
                     l->stride_token == (int64_t)l->head_dim * l->num_kv_heads;
    for (int kv = 0; kv < 2; kv++) {
        uint8_t *b = base + ((size_t)kv * (size_t)l->stride_kv + (size_t)block * (size_t)l->stride_block) * e;
        if (contiguous) {
            size_t n = tok * l->block_size;
            if (to_packed) memcpy(packed, b, n);
            else memcpy(b, packed, n);
            packed += n;
            continue;
        }
        for (uint32_t t = 0; t < l->block_size; t++)
            for (uint32_t h = 0; h < l->num_kv_heads; h++) {
                uint8_t *src = b + ((size_t)t * (size_t)l->stride_token + (size_t)h * (size_t)l->stride_head) * e;
                if (to_packed) memcpy(packed, src, row);
                else memcpy(src, packed, row);
                packed += row;
            }
    }
}

int tdm__kvx_pack(const tdm_kvx *k, const uint32_t *ids, uint32_t n, uint32_t lb, uint32_t le,
                  void *dst, size_t dst_size)
{
    size_t u = k->unit_bytes;
    if ((size_t)(le - lb) * n * u != dst_size) return TDM_E_INTERNAL;
    uint8_t *p = dst;
    for (uint32_t l = lb; l < le; l++)
        for (uint32_t i = 0; i < n; i++, p += u)
            copy_unit(&k->layout, k->bases[l], ids[i], p, 1);
    return TDM_OK;
}

int tdm__kvx_unpack(const tdm_kvx *k, const kvx_peer *peer, const void *src, size_t src_size,
                    const uint32_t *ids, uint32_t n, uint32_t lb, uint32_t le)
{
    (void)peer;
    size_t u = k->unit_bytes;
    if ((size_t)(le - lb) * n * u != src_size) return TDM_E_PROTOCOL;
    uint8_t *p = (uint8_t *)src;
    for (uint32_t l = lb; l < le; l++)
        for (uint32_t i = 0; i < n; i++, p += u)
            copy_unit(&k->layout, k->bases[l], ids[i], p, 0);
    return TDM_OK;
}
