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

#endif /* TANDEM_KV_INTERNAL_H */
