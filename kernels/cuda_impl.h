/*
 * cuda_impl.h -- shared by the .cu files of libtandem_cuda.so (C++/CUDA only): the
 * mapping of cudaError_t to TDM_* statuses with a message, the check macro every CUDA call
 * goes through, and the functions each .cu file contributes to the table (cuda_entry.cu).
 * Nothing here throws; every table function catches everything at its boundary.
 */
#ifndef TANDEM_CUDA_IMPL_H
#define TANDEM_CUDA_IMPL_H

#include <cstdio>
#include <cuda_runtime.h>

#include "cuda_table.h"

static inline int tdm__cu_status(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation: return TDM_E_NOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError: return TDM_E_NO_CUDA;
    default: return TDM_E_CUDA;
    }
}

static inline int tdm__cu_fail(cudaError_t e, const char *what, char *msg, size_t msg_len)
{
    if (msg && msg_len)
        snprintf(msg, msg_len, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return tdm__cu_status(e);
}

/* In a function with (char *msg, size_t msg_len): return the mapped status on error. */
#define TDM_CU_CHECK(call)                                                  \
    do {                                                                    \
        cudaError_t e_ = (call);                                            \
        if (e_ != cudaSuccess) return tdm__cu_fail(e_, #call, msg, msg_len); \
    } while (0)

/* Catch-all for the extern "C" boundary. */
#define TDM_CU_TRY try {
#define TDM_CU_CATCH                                                               \
    }                                                                              \
    catch (...)                                                                    \
    {                                                                              \
        if (msg && msg_len) snprintf(msg, msg_len, "unexpected C++ exception");    \
        return TDM_E_INTERNAL;                                                     \
    }

int tdm__cu_kv_run(const tdm__kv_plan *plan, const void *meta, size_t meta_size, void *stream,
                   char *msg, size_t msg_len);
int tdm__cu_profile(const tdm_profile_spec *spec, char *json, size_t json_size, size_t *json_len,
                    char *msg, size_t msg_len);

#endif /* TANDEM_CUDA_IMPL_H */
