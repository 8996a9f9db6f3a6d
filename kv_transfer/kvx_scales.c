/*
 * kvx_scales.c -- the KV quantization scales of the transfer engine. An engine whose cache is
 * fp8-e4m3 declares how its values are scaled (tdm_kvx_set_kv_scales: per tensor or per head,
 * one set per layer for K and for V; default none = scale 1); the handshake carries them to
 * the peer (docs/protocol.md, the optional scale fields of HELLO), and a receiver decodes a
 * sender's chunk with the sender's scales and re-encodes it with its own. When both sides
 * store the same dtype with the same effective scales nothing is rescaled, so identical
 * formats keep the plain byte copy (and same-host direct reads).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kvx_internal.h"

int tdm_kvx_set_kv_scales(tdm_kvx *k, uint32_t kind, const float *ks, const float *vs, uint32_t count)
{
    if (!k) return tdm__kvx_fail(TDM_E_INVAL, "NULL engine");
    if (kind > TDM_KV_SCALE_HEAD) return tdm__kvx_fail(TDM_E_INVAL, "unknown scale kind %u", kind);
    if (kind != TDM_KV_SCALE_NONE && (!ks || !vs))
        return tdm__kvx_fail(TDM_E_INVAL, "k_scales or v_scales is NULL");
    pthread_mutex_lock(&k->mu);
    int rc = TDM_OK;
    float *copy = NULL;
    if (!k->registered) { rc = tdm__kvx_fail(TDM_E_STATE, "register the KV cache before setting its scales"); goto out; }
    if (k->handshaken) {
        rc = tdm__kvx_fail(TDM_E_STATE, "a peer has already handshaken: set the KV scales before connecting");
        goto out;
    }
    const tdm_kv_layout *l = &k->layout;
    if (kind == TDM_KV_SCALE_NONE) {
        if (count != 0) { rc = tdm__kvx_fail(TDM_E_INVAL, "count_per_layer must be 0 for scale kind NONE (got %u)", count); goto out; }
    } else {
        if (l->dtype != TDM_DTYPE_FP8_E4M3) {
            rc = tdm__kvx_fail(TDM_E_INVAL, "KV scales apply to an fp8-e4m3 cache only (registered dtype %u)", l->dtype);
            goto out;
        }
        uint32_t want = kind == TDM_KV_SCALE_TENSOR ? 1 : l->num_kv_heads;
        if (count != want) {
            rc = tdm__kvx_fail(TDM_E_INVAL, "count_per_layer %u does not match the scale kind (%s: %u)", count,
                               kind == TDM_KV_SCALE_TENSOR ? "TENSOR needs 1" : "HEAD needs num_kv_heads", want);
            goto out;
        }
        uint64_t n = (uint64_t)l->num_layers * count;
        if (n > TDM__KVX_MAX_SCALES) {
            rc = tdm__kvx_fail(TDM_E_INVAL, "%llu scales per K and V exceed the limit %u",
                               (unsigned long long)n, TDM__KVX_MAX_SCALES);
            goto out;
        }
        for (uint32_t i = 0; i < (uint32_t)n; i++)
            for (int kv = 0; kv < 2; kv++) {
                float f = (kv ? vs : ks)[i];
                if (!isfinite(f) || !(f > 0.0f)) {
                    rc = tdm__kvx_fail(TDM_E_INVAL, "%s_scales[%u] (layer %u, index %u) = %g is not finite and > 0",
                                       kv ? "v" : "k", i, i / count, i % count, (double)f);
                    goto out;
                }
            }
        copy = tdm__malloc(2 * (size_t)n * sizeof(float));
        if (!copy) { rc = tdm__kvx_fail(TDM_E_NOMEM, "out of memory"); goto out; }
        memcpy(copy, ks, (size_t)n * sizeof(float));
        memcpy(copy + n, vs, (size_t)n * sizeof(float));
    }
    tdm__free(k->scales);
    k->scales = copy;
    k->scale_kind = kind;
    k->scale_count = kind == TDM_KV_SCALE_NONE ? 0 : count;
out:
    pthread_mutex_unlock(&k->mu);
    return rc;
}

void tdm__kvx_fill_scales(const tdm_kvx *k, tdm__kvx_hello *h)
{
    if (k->scale_kind == TDM_KV_SCALE_NONE || !k->scales) return;
    h->scale_kind = k->scale_kind;
    h->scale_count = k->scale_count;
    h->k_scales = k->scales;
    h->v_scales = k->scales + (size_t)k->layout.num_layers * k->scale_count;
    h->k_scales_le = h->v_scales_le = NULL;
}

/* The effective scale of one side (1 without scales). */
static float eff(uint32_t kind, const float *a, uint32_t count, uint32_t layer, uint32_t head)
{
    if (kind == TDM_KV_SCALE_NONE) return 1.0f;
    return a[(size_t)layer * count + (kind == TDM_KV_SCALE_HEAD ? head : 0)];
}

/* Receiving from the peer needs no rescaling: the same dtype, and (fp8) the same effective
 * scale for every layer and every head we take from it. */
static int same_scales(const tdm_kvx *k, const kvx_peer *p)
{
    const tdm__kvx_hello *r = &p->remote;
    const tdm_kv_layout *s = &r->layout, *d = &k->layout;
    if (s->dtype != d->dtype) return 0;
    if (d->dtype != TDM_DTYPE_FP8_E4M3) return 1;
    if (s->num_layers != d->num_layers || k->head_offset < r->head_offset ||
        (uint64_t)k->head_offset + d->num_kv_heads > (uint64_t)r->head_offset + s->num_kv_heads)
        return 0;   /* not a direction we receive in */
    uint32_t off = k->head_offset - r->head_offset;
    const float *dk = k->scales, *dv = k->scales ? k->scales + (size_t)d->num_layers * k->scale_count : NULL;
    for (uint32_t l = 0; l < d->num_layers; l++)
        for (uint32_t h = 0; h < d->num_kv_heads; h++)
            if (eff(r->scale_kind, r->k_scales, r->scale_count, l, off + h) != eff(k->scale_kind, dk, k->scale_count, l, h) ||
                eff(r->scale_kind, r->v_scales, r->scale_count, l, off + h) != eff(k->scale_kind, dv, k->scale_count, l, h))
                return 0;
    return 1;
}

void tdm__kvx_peer_scales_free(kvx_peer *p)
{
    tdm__free(p->rscales);
    p->rscales = NULL;
    p->remote.k_scales = p->remote.v_scales = NULL;
    p->remote.k_scales_le = p->remote.v_scales_le = NULL;
}

int tdm__kvx_peer_scales(tdm_kvx *k, kvx_peer *p, const tdm__kvx_hello *h, char *why, size_t why_len)
{
    tdm__kvx_peer_scales_free(p);
    p->remote.scale_kind = TDM_KV_SCALE_NONE;
    p->remote.scale_count = 0;
    if (h->scale_kind != TDM_KV_SCALE_NONE) {
        size_t n = (size_t)h->layout.num_layers * h->scale_count;
        float *a = tdm__malloc(2 * n * sizeof(float));
        if (!a) {
            if (why && why_len) snprintf(why, why_len, "out of memory for the peer's KV scales");
            return TDM_E_NOMEM;
        }
        for (size_t i = 0; i < n; i++) {
            a[i] = tdm__kvx_hello_scale(h, 0, (uint32_t)i);
            a[n + i] = tdm__kvx_hello_scale(h, 1, (uint32_t)i);
        }
        p->rscales = a;
        p->remote.scale_kind = h->scale_kind;
        p->remote.scale_count = h->scale_count;
        p->remote.k_scales = a;
        p->remote.v_scales = a + n;
    }
    p->scales_same = same_scales(k, p);
    return TDM_OK;
}

void tdm__kvx_scale_opts(const tdm_kvx *k, const kvx_peer *p, tdm_kv_convert_opts *o)
{
    if (p->scales_same) return;   /* decode and encode with scale 1: values pass unchanged */
    const tdm__kvx_hello *r = &p->remote;
    if (r->layout.dtype == TDM_DTYPE_FP8_E4M3 && r->scale_kind != TDM_KV_SCALE_NONE) {
        /* the sender's scales index the sender's heads: the kernel adds src_head_offset */
        o->src_scale_kind = r->scale_kind;
        o->src_k_scale = r->k_scales;
        o->src_v_scale = r->v_scales;
        o->src_scale_layer_stride = r->scale_count;
    }
    if (k->layout.dtype == TDM_DTYPE_FP8_E4M3 && k->scale_kind != TDM_KV_SCALE_NONE) {
        o->dst_scale_kind = k->scale_kind;
        o->dst_k_scale = k->scales;
        o->dst_v_scale = k->scales + (size_t)k->layout.num_layers * k->scale_count;
        o->dst_scale_layer_stride = k->scale_count;
    }
}
