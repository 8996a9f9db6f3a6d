/*
 * cuda_table.h -- the one interface between libtandem (cuda_loader.c, kv_cuda.c) and the
 * dlopen()ed libtandem_cuda.so: a versioned table of functions that the CUDA library hands
 * out from its only exported symbol, tdm_cuda_get_table_v1(). Every function returns a
 * TDM_* status and writes a message into (msg, msg_len) on failure; no CUDA type appears
 * here, streams are void *. Append-only: new functions go at the end and bump nothing but
 * `size`; an incompatible change gets a new getter name (_v2).
 */
#ifndef TANDEM_CUDA_TABLE_H
#define TANDEM_CUDA_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "kv_plan.h"
#include "tandem_kernels.h"

#define TDM__CUDA_TABLE_VERSION 1
#define TDM__CUDA_TABLE_SYMBOL "tdm_cuda_get_table_v1"

typedef struct tdm__cuda_table {
    uint32_t version;            /* TDM__CUDA_TABLE_VERSION */
    uint32_t size;               /* sizeof(tdm__cuda_table) as built */
    uint32_t plan_size;          /* sizeof(tdm__kv_plan) as built (layouts must agree) */
    uint32_t reserved;
    /* TDM_OK when a device is usable, else TDM_E_NO_CUDA ("no CUDA device: ..."). */
    int (*device_check)(char *msg, size_t msg_len);
    int (*dev_malloc)(void **ptr, size_t size, char *msg, size_t msg_len);
    int (*dev_free)(void *ptr, char *msg, size_t msg_len);
    int (*dev_memcpy)(void *dst, const void *src, size_t size, int kind, char *msg, size_t msg_len);
    int (*dev_memset)(void *dst, int value, size_t size, char *msg, size_t msg_len);
    int (*stream_sync)(void *stream, char *msg, size_t msg_len);
    /* Runs a plan whose ids / bases / scales fields are TDM__META_REF offsets into meta
     * (host memory, meta_size bytes, copied to the device before the call returns). */
    int (*kv_run)(const tdm__kv_plan *plan, const void *meta, size_t meta_size, void *stream,
                  char *msg, size_t msg_len);
    int (*profile)(const tdm_profile_spec *spec, char *json, size_t json_size, size_t *json_len,
                   char *msg, size_t msg_len);
    int (*dev_memcpy_async)(void *dst, const void *src, size_t size, int kind, void *stream,
                            char *msg, size_t msg_len);
} tdm__cuda_table;

typedef const tdm__cuda_table *(*tdm__cuda_get_table_fn)(void);

/* libtandem side (cuda_loader.c): the loaded table, or TDM_E_NO_CUDA / TDM_E_VERSION with
 * the message recorded for tdm_kv_errmsg(). Loads once, thread-safe. */
int tdm__cuda_table_get(const tdm__cuda_table **out);

#endif /* TANDEM_CUDA_TABLE_H */
