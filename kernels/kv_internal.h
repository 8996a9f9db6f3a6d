/*
 * kv_internal.h -- what the kernels module shares between its C files (never exported):
 * the per-thread error message of the tdm_kv_* / tdm_cuda_* functions, checked size
 * arithmetic, and the validation of layouts and of the "packed" side descriptions.
 */
#ifndef TANDEM_KV_INTERNAL_H
#define TANDEM_KV_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"
#include "tandem_kernels.h"

/* Record a message for tdm_kv_errmsg() on this thread and return status. */
int tdm__kv_fail(int status, const char *fmt, ...) TDM_PRINTF(2, 3);
/* Prefix this thread's current message with "fn: " (and "what: " when what is not NULL). */
int tdm__kv_fail_prefix(int status, const char *fn, const char *what);
/* Clear this thread's message (successful calls do not clear it). */
void tdm__kv_err_clear(void);

/* a * b into *out; 0 on overflow of size_t. */
static inline int tdm__mul_ok(size_t a, size_t b, size_t *out)
{
    if (a && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* Checks the fields of a layout that describe a packed side (num_layers, block_size,
 * num_kv_heads, head_dim, dtype, struct_size); what = "src_layout" etc. for messages. */
int tdm__kv_check_packed_desc(const tdm_kv_layout *l, const char *what);

#include "kv_plan.h"

/* Plan builders: validate every argument (recording the message) and fill *p; nothing is
 * touched on failure. fn names the public function for messages. */
int tdm__kv_plan_copy(tdm__kv_plan *p, const char *fn, int unpack, const tdm_kv_layout *l,
                      void *const *layer_bases, const uint32_t *block_ids, uint32_t num_blocks,
                      uint32_t layer_begin, uint32_t layer_end, void *buf, size_t buf_size);
int tdm__kv_plan_unpack_convert(tdm__kv_plan *p, const char *fn, const tdm_kv_layout *src_layout,
                                const void *src, size_t src_size, uint32_t num_src_blocks,
                                uint32_t num_tokens, const tdm_kv_layout *dst_layout,
                                void *const *dst_bases, const uint32_t *dst_block_ids,
                                uint32_t num_dst_blocks, const tdm_kv_convert_opts *opts);
int tdm__kv_plan_pack_convert(tdm__kv_plan *p, const char *fn, const tdm_kv_layout *src_layout,
                              void *const *src_bases, const uint32_t *block_ids,
                              uint32_t num_blocks, const tdm_kv_layout *packed_layout, void *dst,
                              size_t dst_size, const tdm_kv_convert_opts *opts);

/* The metadata blob of a plan for the CUDA library: its size, and the blob itself written
 * into blob (meta_size bytes) while q (a copy of the plan) gets TDM__META_REF references
 * to it in place of its ids / bases / scale pointers. */
size_t tdm__kv_meta_size(const tdm__kv_plan *p);
void tdm__kv_meta_build(tdm__kv_plan *q, char *blob);

/* Run a plan on the host. */
void tdm__kv_exec_cpu(const tdm__kv_plan *p);

#endif /* TANDEM_KV_INTERNAL_H */
