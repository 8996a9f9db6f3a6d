/*
 * tandem_kernels.h -- KV layout descriptors and the pack / unpack / convert kernels
 * (CPU implementations always; CUDA ones when libtandem_cuda.so and a device are present),
 * plus the cuBLAS roofline profiler behind `tandem profile`.
 * Part of Tandem's public ABI; included by tandem.h. docs/kernels.md has the details.
 *
 * Thread safety: every function here is thread-safe; none keeps state between calls except
 * the lazily loaded CUDA library (loaded once, guarded) and the per-thread error message.
 * Errors: every function returns TDM_OK or a negative TDM_E_* status, leaves its outputs
 * (out-parameters and destination memory) untouched on failure, and records a message that
 * tdm_kv_errmsg() returns on the same thread.
 */
#ifndef TANDEM_KERNELS_H
#define TANDEM_KERNELS_H

#include "tandem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------ */
/* Element types                                                                         */
/* ------------------------------------------------------------------------------------ */

/* Element types of KV caches. FP8_E4M3 is the OCP "E4M3FN" format used by NVIDIA and vLLM:
 * 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinities, NaN = S.1111.111, largest
 * finite value 448, smallest subnormal 2^-9. */
typedef enum tdm_dtype {
    TDM_DTYPE_FP16 = 1,
    TDM_DTYPE_BF16 = 2,
    TDM_DTYPE_FP32 = 3,
    TDM_DTYPE_FP8_E4M3 = 4
} tdm_dtype;

/* Bytes per element of a dtype (0 for an unknown one). */
TDM_API size_t tdm_dtype_size(tdm_dtype dt);

/* The message of the last failed call of this header's functions on the calling thread
 * ("" if none). Valid until the next failing call on this thread. Never NULL. */
TDM_API const char *tdm_kv_errmsg(void);

/* ------------------------------------------------------------------------------------ */
/* Layouts                                                                               */
/* ------------------------------------------------------------------------------------ */

/* Well-known arrangements of one layer's KV tensor. */
typedef enum tdm_kv_layout_kind {
    TDM_KV_LAYOUT_CUSTOM = 0,        /* strides given explicitly */
    TDM_KV_LAYOUT_VLLM_NHD = 1,      /* vLLM flash: [2, num_blocks, block_size, kv_heads, head_dim] */
    TDM_KV_LAYOUT_VLLM_HND = 2,      /* vLLM flash, HND stride order: [2, num_blocks, kv_heads, block_size, head_dim] */
    TDM_KV_LAYOUT_FLASHINFER = 3,    /* FlashInfer NHD: [num_blocks, 2, block_size, kv_heads, head_dim] */
    TDM_KV_LAYOUT_FLASHINFER_HND = 4 /* FlashInfer HND: [num_blocks, 2, kv_heads, block_size, head_dim] */
} tdm_kv_layout_kind;

/* A description of a paged KV cache: one tensor per layer (each layer has its own base
 * pointer), all layers alike. Element (kv, block, token, head, d) of a layer lies at
 *   base + (kv*stride_kv + block*stride_block + token*stride_token + head*stride_head + d) * elem
 * with strides in elements and head_dim contiguous. kv is 0 for K and 1 for V.
 * A valid layout (tdm_kv_layout_validate) has non-negative strides that nest: sorted by
 * stride, each dimension of extent > 1 steps over the whole span of the smaller ones, so no
 * two elements share an address (padding between rows, heads or blocks is allowed). */
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

/* Fill *l for a well-known kind (strides derived) or CUSTOM (strides zero: set them, then
 * call tdm_kv_layout_validate). *l is untouched on failure.
 * Errors: TDM_E_INVAL (l NULL, zero dimension, unknown kind or dtype, sizes that overflow). */
TDM_API int tdm_kv_layout_init(tdm_kv_layout *l, tdm_kv_layout_kind kind, uint32_t num_layers,
                               uint32_t num_blocks, uint32_t block_size, uint32_t num_kv_heads,
                               uint32_t head_dim, tdm_dtype dtype);

/* Check a layout: struct_size, non-zero dimensions, known kind and dtype, strides as the
 * kind prescribes (for a well-known kind) or nesting without overlap (CUSTOM), and a layer
 * extent that fits in memory. Errors: TDM_E_INVAL (the message names the field). */
TDM_API int tdm_kv_layout_validate(const tdm_kv_layout *l);

/* Bytes of K plus V of one block of one layer: 2 * block_size * num_kv_heads * head_dim *
 * dtype size (what one block of one layer occupies in the packed format).
 * Errors: TDM_E_INVAL (invalid layout or bytes NULL). */
TDM_API int tdm_kv_layout_block_bytes(const tdm_kv_layout *l, size_t *bytes);

/* Bytes spanned by one layer's tensor (from its base to one past its last element),
 * i.e. the size of the region the host must provide per layer.
 * Errors: TDM_E_INVAL. */
TDM_API int tdm_kv_layout_layer_bytes(const tdm_kv_layout *l, size_t *bytes);

/* ------------------------------------------------------------------------------------ */
/* The packed format                                                                     */
/*                                                                                       */
/* The contiguous buffer that pack writes, unpack reads and the transfer engine sends.   */
/* It is independent of the paged layout (only block_size, num_kv_heads, head_dim and    */
/* dtype matter): for each layer in [layer_begin, layer_end), in increasing order, for   */
/* each listed block in list order: K as [block_size][num_kv_heads][head_dim], then V    */
/* the same, elements in the dtype, little-endian, no padding anywhere. So the chunk of  */
/* (layer L, list index i) starts at byte ((L - layer_begin) * n + i) * block_bytes and  */
/* its V part block_bytes / 2 later, with n the number of listed blocks and block_bytes  */
/* = tdm_kv_layout_block_bytes(). Token t of a chunk, head h, dim d, is element          */
/* (t * num_kv_heads + h) * head_dim + d of the K (or V) part.                            */
/* ------------------------------------------------------------------------------------ */

/* Bytes of the packed form of num_blocks blocks over layers [layer_begin, layer_end).
 * Errors: TDM_E_INVAL (invalid layout, layer range empty or beyond num_layers, bytes NULL,
 * overflow). num_blocks may be 0 (size 0). */
TDM_API int tdm_kv_packed_size(const tdm_kv_layout *l, uint32_t num_blocks, uint32_t layer_begin,
                               uint32_t layer_end, size_t *bytes);

/* Pack: gather the listed blocks of layers [layer_begin, layer_end) into dst, in the packed
 * format. layer_bases[L] is layer L's tensor base (num_layers entries; entries outside the
 * range are not read and may be NULL). Every block id must be < l->num_blocks; ids may
 * repeat. dst_size must be at least the packed size (bytes after it are not written).
 * The caller keeps ownership of everything. Host memory only (see tdm_kv_pack_cuda).
 * Errors: TDM_E_INVAL (NULL pointer, invalid layout, bad layer range, block id out of range,
 * overflow), TDM_E_TRUNCATED (dst_size too small). Nothing is written on failure. */
TDM_API int tdm_kv_pack(const tdm_kv_layout *l, void *const *layer_bases,
                        const uint32_t *block_ids, uint32_t num_blocks, uint32_t layer_begin,
                        uint32_t layer_end, void *dst, size_t dst_size);

/* Unpack: scatter src (packed format, same layout, blocks in list order) into the listed
 * blocks of layers [layer_begin, layer_end). src_size must be at least the packed size
 * (extra bytes are ignored). If an id is listed twice, the later chunk wins.
 * Errors: TDM_E_INVAL (as pack; also src_size too small). Nothing is written on failure. */
TDM_API int tdm_kv_unpack(const tdm_kv_layout *l, void *const *layer_bases,
                          const uint32_t *block_ids, uint32_t num_blocks, uint32_t layer_begin,
                          uint32_t layer_end, const void *src, size_t src_size);

/* ------------------------------------------------------------------------------------ */
/* Conversion                                                                            */
/*                                                                                       */
/* Convert while unpacking (or packing) when the two sides differ in block size (tokens   */
/* are re-blocked: token t of the sequence lives in block t / block_size at t %          */
/* block_size on each side), in heads (tensor parallelism: the receiver takes heads       */
/* [src_head_offset, src_head_offset + num_heads) of the sender's heads and stores them   */
/* at [dst_head_offset, dst_head_offset + num_heads) of its own, so a receiver with more  */
/* heads than one sender is filled by several calls with different dst_head_offset), or   */
/* in dtype (fp16 / bf16 / fp32 / fp8-e4m3 in any direction). head_dim must be equal.    */
/*                                                                                       */
/* Values: x = decode(src) * src_scale when the source is fp8 (else decode(src)); the     */
/* destination gets encode(x / dst_scale) when it is fp8 (else encode(x)). Encoding      */
/* rounds to nearest even; fp8 saturates to +-448 (also for +-inf) and maps NaN to NaN   */
/* (0x7F with the sign); fp16 overflows to inf; bf16 keeps NaN quiet. A plain copy is     */
/* made when both dtypes are equal and no scale applies (bit-exact, NaNs included).       */
/* ------------------------------------------------------------------------------------ */

/* How an fp8 side's scales are given. */
typedef enum tdm_kv_scale_kind {
    TDM_KV_SCALE_NONE = 0,   /* scale 1 */
    TDM_KV_SCALE_TENSOR = 1, /* one float for K and one for V: k_scale[layer * layer_stride] */
    TDM_KV_SCALE_HEAD = 2    /* one per head of that side: k_scale[layer * layer_stride + head] */
} tdm_kv_scale_kind;

/* Options of the converting calls. Absolute layer and head indices throughout: heads index
 * the side the scale belongs to (the sender's packed heads for src scales, the receiver's
 * heads for dst scales). A layer_stride of 0 uses the same scales for every layer. */
typedef struct tdm_kv_convert_opts {
    uint32_t struct_size;             /* sizeof(tdm_kv_convert_opts) */
    uint32_t layer_begin;             /* layers [layer_begin, layer_end); 0, 0 = all layers */
    uint32_t layer_end;
    uint32_t src_head_offset;         /* first source head moved */
    uint32_t dst_head_offset;         /* where it lands among the destination's heads */
    uint32_t num_heads;               /* heads moved; 0 = as many as fit on both sides */
    uint32_t src_scale_kind;          /* tdm_kv_scale_kind; only when the source is fp8 */
    uint32_t dst_scale_kind;          /* tdm_kv_scale_kind; only when the destination is fp8 */
    const float *src_k_scale;         /* finite and > 0; read during the call only */
    const float *src_v_scale;
    const float *dst_k_scale;
    const float *dst_v_scale;
    uint32_t src_scale_layer_stride;  /* floats between consecutive layers' scales */
    uint32_t dst_scale_layer_stride;
} tdm_kv_convert_opts;

/* Defaults: all layers, all heads from head 0 to head 0, no scales. Errors: TDM_E_INVAL. */
TDM_API int tdm_kv_convert_opts_init(tdm_kv_convert_opts *o);

/* Unpack with conversion. src is in the packed format of src_layout (only its num_layers,
 * block_size, num_kv_heads, head_dim and dtype are read; strides and num_blocks are not)
 * holding num_src_blocks blocks per layer, of which the first num_tokens tokens are valid
 * (num_tokens <= num_src_blocks * src block_size; layers [layer_begin, layer_end) of opts,
 * which must lie within both layouts). Those tokens are written into dst_block_ids (which
 * must hold ceil(num_tokens / dst block_size) ids at least; num_dst_blocks counts them) of
 * dst_layout's paged cache; tokens after num_tokens in the last destination block and heads
 * outside the moved range are not touched. opts may be NULL (defaults).
 * Errors: TDM_E_INVAL (NULL, out-of-range id, short src, bad scale, bad opts),
 * TDM_E_LAYOUT (head_dim differs, head range beyond either side). Nothing is written on
 * failure. */
TDM_API int tdm_kv_unpack_convert(const tdm_kv_layout *src_layout, const void *src,
                                  size_t src_size, uint32_t num_src_blocks, uint32_t num_tokens,
                                  const tdm_kv_layout *dst_layout, void *const *dst_bases,
                                  const uint32_t *dst_block_ids, uint32_t num_dst_blocks,
                                  const tdm_kv_convert_opts *opts);

/* Pack with conversion (sender-side head split and quantization): gather the listed blocks
 * of src_layout's paged cache into dst in the packed format of packed_layout (only its
 * num_layers, block_size, num_kv_heads, head_dim and dtype are read; block_size must equal
 * the source's: TDM_E_LAYOUT otherwise). Heads [src_head_offset, +num_heads) go to packed
 * heads [dst_head_offset, +num_heads); other packed heads are not written. dst_size must be
 * at least tdm_kv_packed_size(packed_layout, num_blocks, layer_begin, layer_end).
 * Errors: as tdm_kv_unpack_convert, TDM_E_TRUNCATED (dst_size). Nothing is written on failure. */
TDM_API int tdm_kv_pack_convert(const tdm_kv_layout *src_layout, void *const *src_bases,
                                const uint32_t *block_ids, uint32_t num_blocks,
                                const tdm_kv_layout *packed_layout, void *dst, size_t dst_size,
                                const tdm_kv_convert_opts *opts);

/* Element conversion helpers (the exact rounding the kernels use), for tests and hosts. */
TDM_API uint8_t tdm_fp8_e4m3_from_float(float x);
TDM_API float tdm_fp8_e4m3_to_float(uint8_t v);
TDM_API uint16_t tdm_fp16_from_float(float x);
TDM_API float tdm_fp16_to_float(uint16_t v);
TDM_API uint16_t tdm_bf16_from_float(float x);
TDM_API float tdm_bf16_to_float(uint16_t v);

/* ------------------------------------------------------------------------------------ */
/* CUDA                                                                                  */
/*                                                                                       */
/* The CUDA kernels live in libtandem_cuda.so, which libtandem opens with dlopen() the   */
/* first time one of these functions is called: $TANDEM_CUDA_LIB if set, else the file   */
/* next to libtandem.so, else "libtandem_cuda.so" on the loader's search path. Without   */
/* it, or without a device, they return TDM_E_NO_CUDA (tdm_kv_errmsg() says which).     */
/* Device pointers are raw CUDA device (or managed) addresses; streams are cudaStream_t  */
/* passed as void * (NULL = the legacy default stream).                                  */
/*                                                                                       */
/* The kernel calls are asynchronous on the stream: they validate everything on the host  */
/* first (same rules and errors as the CPU functions), pass the host arrays (layer bases, */
/* block ids, scales) inside the kernel's parameters when they fit in 3.5 KiB (e.g. 32    */
/* layers and 800 blocks), else through a stream-ordered device scratch allocation        */
/* (cudaMallocAsync + cudaMemcpyAsync, cudaFreeAsync after the kernel; on a device        */
/* without memory pools, cudaMalloc and the call waits for the kernel), and launch ONE    */
/* kernel. The host arrays may be reused as soon as the call returns; the data is ready   */
/* after the stream syncs.                                                                */
/* ------------------------------------------------------------------------------------ */

/* TDM_OK when libtandem_cuda.so is loaded and a device is usable; else TDM_E_NO_CUDA with
 * the reason in msg (NUL-terminated, truncated to msg_len; msg may be NULL). */
TDM_API int tdm_cuda_available(char *msg, size_t msg_len);

/* Device memory helpers (for tests, benchmarks and the transfer engine). Synchronous.
 * Errors: TDM_E_INVAL, TDM_E_NO_CUDA, TDM_E_CUDA (the message names the CUDA error). */
typedef enum tdm_cuda_copy_kind {
    TDM_CUDA_COPY_DEFAULT = 0,        /* inferred from the pointers (unified addressing) */
    TDM_CUDA_COPY_HOST_TO_DEVICE = 1,
    TDM_CUDA_COPY_DEVICE_TO_HOST = 2,
    TDM_CUDA_COPY_DEVICE_TO_DEVICE = 3
} tdm_cuda_copy_kind;

TDM_API int tdm_cuda_malloc(void **ptr, size_t size);
TDM_API int tdm_cuda_free(void *ptr);   /* NULL is a no-op */
TDM_API int tdm_cuda_memcpy(void *dst, const void *src, size_t size, tdm_cuda_copy_kind kind);
TDM_API int tdm_cuda_memset(void *dst, int value, size_t size);
TDM_API int tdm_cuda_stream_sync(void *stream);
/* cudaMemcpyAsync on the stream (for host memory, pinned memory makes it truly async). */
TDM_API int tdm_cuda_memcpy_async(void *dst, const void *src, size_t size,
                                  tdm_cuda_copy_kind kind, void *stream);

/* The CUDA versions of pack, unpack and the converting calls: same arguments and rules as
 * the CPU functions, with layer bases and dst/src device pointers (the arrays of bases, ids
 * and scales themselves are host memory), plus the stream. One kernel launch each. */
TDM_API int tdm_kv_pack_cuda(const tdm_kv_layout *l, void *const *layer_bases,
                             const uint32_t *block_ids, uint32_t num_blocks,
                             uint32_t layer_begin, uint32_t layer_end, void *dst,
                             size_t dst_size, void *stream);
TDM_API int tdm_kv_unpack_cuda(const tdm_kv_layout *l, void *const *layer_bases,
                               const uint32_t *block_ids, uint32_t num_blocks,
                               uint32_t layer_begin, uint32_t layer_end, const void *src,
                               size_t src_size, void *stream);
TDM_API int tdm_kv_unpack_convert_cuda(const tdm_kv_layout *src_layout, const void *src,
                                       size_t src_size, uint32_t num_src_blocks,
                                       uint32_t num_tokens, const tdm_kv_layout *dst_layout,
                                       void *const *dst_bases, const uint32_t *dst_block_ids,
                                       uint32_t num_dst_blocks, const tdm_kv_convert_opts *opts,
                                       void *stream);
TDM_API int tdm_kv_pack_convert_cuda(const tdm_kv_layout *src_layout, void *const *src_bases,
                                     const uint32_t *block_ids, uint32_t num_blocks,
                                     const tdm_kv_layout *packed_layout, void *dst,
                                     size_t dst_size, const tdm_kv_convert_opts *opts,
                                     void *stream);

/* ------------------------------------------------------------------------------------ */
/* Profiler (`tandem profile`)                                                           */
/* ------------------------------------------------------------------------------------ */

/* The model shapes to measure (a transformer with grouped-query attention and a gated MLP). */
typedef struct tdm_profile_spec {
    uint32_t struct_size;        /* sizeof(tdm_profile_spec) */
    uint32_t hidden;             /* hidden size */
    uint32_t intermediate;       /* MLP intermediate size */
    uint32_t num_heads;          /* attention heads */
    uint32_t num_kv_heads;
    uint32_t head_dim;
    uint32_t num_layers;
    uint32_t vocab;
    uint32_t tp;                 /* tensor-parallel degree the shapes are divided by; >= 1 */
    uint32_t min_tokens;         /* prefill token counts min_tokens..max_tokens (x2 steps) */
    uint32_t max_tokens;
    uint32_t max_batch;          /* decode batches 1..max_batch (x2 steps) */
    uint32_t reps;               /* timed repetitions per shape */
    const char *model_name;      /* recorded in the JSON; may be NULL */
} tdm_profile_spec;

/* Defaults: llama-3-8b shapes, tp 1, tokens 128..8192, batches 1..256, 10 repetitions. */
TDM_API int tdm_profile_spec_init(tdm_profile_spec *s);

/* Run the cuBLAS profile on the current device and write the hardware JSON document
 * ({"name", "peak_tflops", "hbm_gbps", "eff_compute", "eff_memory", "step_overhead_us",
 * "interconnect_gbps", "measured": {...}}; docs/kernels.md) into json (NUL-terminated).
 * *json_len receives its length without the NUL. Synchronous; takes seconds.
 * Errors: TDM_E_INVAL, TDM_E_NO_CUDA, TDM_E_CUDA, TDM_E_NOMEM (device memory),
 * TDM_E_TRUNCATED (json too small: *json_len still receives the length needed). */
TDM_API int tdm_cuda_profile(const tdm_profile_spec *spec, char *json, size_t json_size,
                             size_t *json_len);

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_KERNELS_H */
