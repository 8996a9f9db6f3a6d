/*
 * kv_cpu.c -- the CPU implementation of pack, unpack and the converting calls: it walks the
 * runs of a plan (kv_plan.h), copying each run with one memcpy when the dtypes match (a whole
 * block's K or V for NHD layouts and equal block sizes) and converting element by element
 * through a small float buffer otherwise. It is the reference the CUDA kernels are checked
 * against, and the path CPU hosts and the transfer engine use for host memory. Also the
 * exported element-conversion helpers.
 */
#include <string.h>
#if defined(__SSE2__)
#  include <emmintrin.h>
#endif

#include "kv_dtype.h"
#include "kv_internal.h"

#define CHUNK 512

/* Convert one run (elems elements) with the scales of its layer / kv / head. */
static void convert_run(const tdm__kv_plan *p, const tdm__kv_run *r)
{
    const int src_scaled = p->src.scale_kind != TDM_KV_SCALE_NONE;
    const int dst_scaled = p->dst.scale_kind != TDM_KV_SCALE_NONE;
    const float ss = tdm__kv_side_scale(&p->src, NULL, r->layer, r->kv, r->head);
    const float ds = tdm__kv_side_scale(&p->dst, NULL, r->layer, r->kv, r->head);
    const uint32_t sdt = p->src.dtype, ddt = p->dst.dtype;
    float buf[CHUNK];
    for (uint32_t off = 0; off < r->elems; off += CHUNK) {
        uint32_t n = r->elems - off < CHUNK ? r->elems - off : CHUNK;
        const char *s = r->src + (size_t)off * p->src.elem;
        char *d = r->dst + (size_t)off * p->dst.elem;
        switch (sdt) {
        case TDM_DTYPE_FP16:
            for (uint32_t i = 0; i < n; i++) buf[i] = tdm__f16_to_f32(((const uint16_t *)s)[i]);
            break;
        case TDM_DTYPE_BF16:
            for (uint32_t i = 0; i < n; i++) buf[i] = tdm__bf16_to_f32(((const uint16_t *)s)[i]);
            break;
        case TDM_DTYPE_FP32:
            memcpy(buf, s, (size_t)n * sizeof(float));
            break;
        default:
            for (uint32_t i = 0; i < n; i++) buf[i] = tdm__fp8_to_f32(((const uint8_t *)s)[i]);
            break;
        }
        /* NaNs pass unscaled so that their bits survive exactly as on the GPU. */
        if (src_scaled)
            for (uint32_t i = 0; i < n; i++)
                if (buf[i] == buf[i]) buf[i] *= ss;
        if (dst_scaled)
            for (uint32_t i = 0; i < n; i++)
                if (buf[i] == buf[i]) buf[i] /= ds;
        switch (ddt) {
        case TDM_DTYPE_FP16:
            for (uint32_t i = 0; i < n; i++) ((uint16_t *)d)[i] = tdm__f16_from_f32(buf[i]);
            break;
        case TDM_DTYPE_BF16:
            for (uint32_t i = 0; i < n; i++) ((uint16_t *)d)[i] = tdm__bf16_from_f32(buf[i]);
            break;
        case TDM_DTYPE_FP32:
            memcpy(d, buf, (size_t)n * sizeof(float));
            break;
        default:
            for (uint32_t i = 0; i < n; i++) ((uint8_t *)d)[i] = tdm__fp8_from_f32(buf[i]);
            break;
        }
    }
}

/* Transfers at least this large are written with non-temporal stores: the destination
 * would not fit in the caches anyway, and streaming stores skip the read-for-ownership
 * that costs a third of the memory traffic of a cached copy (memcpy does the same for
 * large sizes, but a pack is many block-sized memcpys). */
#define NT_MIN_TOTAL ((uint64_t)16 << 20)
#define NT_MIN_RUN 2048

#if defined(__SSE2__)
static void copy_nt(char *dst, const char *src, size_t n)
{
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + i, src + i, n - i);
}
#endif

void tdm__kv_exec_cpu(const tdm__kv_plan *p)
{
    tdm__kv_run r;
    if (!p->copy) {
        for (uint64_t i = 0; i < p->num_runs; i++) {
            tdm__kv_locate(p, NULL, i, &r);
            convert_run(p, &r);
        }
        return;
    }
    const size_t elem = p->src.elem;
#if defined(__SSE2__)
    const uint64_t run_bytes = (uint64_t)p->run_tokens * p->run_heads * p->head_dim * elem;
    if (run_bytes >= NT_MIN_RUN && p->num_runs * run_bytes >= NT_MIN_TOTAL) {
        for (uint64_t i = 0; i < p->num_runs; i++) {
            tdm__kv_locate(p, NULL, i, &r);
            copy_nt(r.dst, r.src, (size_t)r.elems * elem);
        }
        _mm_sfence();
        return;
    }
#endif
    for (uint64_t i = 0; i < p->num_runs; i++) {
        tdm__kv_locate(p, NULL, i, &r);
        memcpy(r.dst, r.src, (size_t)r.elems * elem);
    }
}

int tdm_kv_pack(const tdm_kv_layout *l, void *const *layer_bases, const uint32_t *block_ids,
                uint32_t num_blocks, uint32_t layer_begin, uint32_t layer_end, void *dst,
                size_t dst_size)
{
    tdm__kv_plan p;
    int rc = tdm__kv_plan_copy(&p, "tdm_kv_pack", 0, l, layer_bases, block_ids, num_blocks,
                               layer_begin, layer_end, dst, dst_size);
    if (rc) return rc;
    tdm__kv_exec_cpu(&p);
    return TDM_OK;
}

int tdm_kv_unpack(const tdm_kv_layout *l, void *const *layer_bases, const uint32_t *block_ids,
                  uint32_t num_blocks, uint32_t layer_begin, uint32_t layer_end, const void *src,
                  size_t src_size)
{
    tdm__kv_plan p;
    int rc = tdm__kv_plan_copy(&p, "tdm_kv_unpack", 1, l, layer_bases, block_ids, num_blocks,
                               layer_begin, layer_end, (void *)(uintptr_t)src, src_size);
    if (rc) return rc;
    tdm__kv_exec_cpu(&p);
    return TDM_OK;
}

int tdm_kv_unpack_convert(const tdm_kv_layout *src_layout, const void *src, size_t src_size,
                          uint32_t num_src_blocks, uint32_t num_tokens,
                          const tdm_kv_layout *dst_layout, void *const *dst_bases,
                          const uint32_t *dst_block_ids, uint32_t num_dst_blocks,
                          const tdm_kv_convert_opts *opts)
{
    tdm__kv_plan p;
    int rc = tdm__kv_plan_unpack_convert(&p, "tdm_kv_unpack_convert", src_layout, src, src_size,
                                         num_src_blocks, num_tokens, dst_layout, dst_bases,
                                         dst_block_ids, num_dst_blocks, opts);
    if (rc) return rc;
    tdm__kv_exec_cpu(&p);
    return TDM_OK;
}

int tdm_kv_pack_convert(const tdm_kv_layout *src_layout, void *const *src_bases,
                        const uint32_t *block_ids, uint32_t num_blocks,
                        const tdm_kv_layout *packed_layout, void *dst, size_t dst_size,
                        const tdm_kv_convert_opts *opts)
{
    tdm__kv_plan p;
    int rc = tdm__kv_plan_pack_convert(&p, "tdm_kv_pack_convert", src_layout, src_bases,
                                       block_ids, num_blocks, packed_layout, dst, dst_size, opts);
    if (rc) return rc;
    tdm__kv_exec_cpu(&p);
    return TDM_OK;
}

uint8_t tdm_fp8_e4m3_from_float(float x) { return tdm__fp8_from_f32(x); }
float tdm_fp8_e4m3_to_float(uint8_t v) { return tdm__fp8_to_f32(v); }
uint16_t tdm_fp16_from_float(float x) { return tdm__f16_from_f32(x); }
float tdm_fp16_to_float(uint16_t v) { return tdm__f16_to_f32(v); }
uint16_t tdm_bf16_from_float(float x) { return tdm__bf16_from_f32(x); }
float tdm_bf16_to_float(uint16_t v) { return tdm__bf16_to_f32(v); }
