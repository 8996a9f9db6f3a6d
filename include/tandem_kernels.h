/*
 * tandem_kernels.h -- KV layout descriptors and the pack / unpack / convert kernels
 * (CPU implementations always; CUDA ones when libtandem_cuda.so and a device are present).
 * Part of Tandem's public ABI; included by tandem.h.
 */
#ifndef TANDEM_KERNELS_H
#define TANDEM_KERNELS_H

#include "tandem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of KV caches. */
typedef enum tdm_dtype {
    TDM_DTYPE_FP16 = 1,
    TDM_DTYPE_BF16 = 2,
    TDM_DTYPE_FP32 = 3,
    TDM_DTYPE_FP8_E4M3 = 4
} tdm_dtype;

/* Bytes per element of a dtype (0 for an unknown one). */
TDM_API size_t tdm_dtype_size(tdm_dtype dt);

/* Well-known arrangements of one layer's KV tensor. */
typedef enum tdm_kv_layout_kind {
    TDM_KV_LAYOUT_CUSTOM = 0,      /* strides given explicitly */
    TDM_KV_LAYOUT_VLLM_NHD = 1,    /* vLLM flash: [2, num_blocks, block_size, kv_heads, head_dim] */
    TDM_KV_LAYOUT_VLLM_HND = 2,    /* vLLM flash, HND stride order: [2, num_blocks, kv_heads, block_size, head_dim] */
    TDM_KV_LAYOUT_FLASHINFER = 3   /* FlashInfer: [num_blocks, 2, block_size, kv_heads, head_dim] */
} tdm_kv_layout_kind;

/* A description of a paged KV cache: one tensor per layer (each layer has its own base
 * pointer), all layers alike. Element (kv, block, token, head, d) of a layer lies at
 *   base + (kv*stride_kv + block*stride_block + token*stride_token + head*stride_head + d) * elem
 * with strides in elements and head_dim contiguous. kv is 0 for K and 1 for V. */
typedef struct tdm_kv_layout {
    uint32_t struct_size;      /* sizeof(tdm_kv_layout) */
    uint32_t kind;             /* tdm_kv_layout_kind */
    uint32_t num_layers;
    uint32_t num_blocks;       /* blocks per layer tensor */
    uint32_t block_size;       /* tokens per block */
    uint32_t num_kv_heads;     /* heads held by this rank */
    uint32_t head_dim;
    uint32_t dtype;            /* tdm_dtype */
    int64_t stride_kv;
    int64_t stride_block;
    int64_t stride_token;
    int64_t stride_head;
} tdm_kv_layout;

/* Fill *l for a well-known kind (strides derived) or CUSTOM (strides zero: set them).
 * Errors: TDM_E_INVAL (zero dimension, unknown kind or dtype). */
TDM_API int tdm_kv_layout_init(tdm_kv_layout *l, tdm_kv_layout_kind kind, uint32_t num_layers,
                               uint32_t num_blocks, uint32_t block_size, uint32_t num_kv_heads,
                               uint32_t head_dim, tdm_dtype dtype);

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_KERNELS_H */
