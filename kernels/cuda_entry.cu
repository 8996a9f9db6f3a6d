/*
 * cuda_entry.cu -- the entry of libtandem_cuda.so: its only exported symbol,
 * tdm_cuda_get_table_v1(), returns the versioned function table (cuda_table.h) that
 * libtandem's loader uses; plus the table's small functions (device check, device memory,
 * stream sync). The pack/unpack kernels are in kv_kernels.cu, the profiler in profile.cu.
 */
#include "cuda_impl.h"

static int dev_check(char *msg, size_t msg_len)
{
    TDM_CU_TRY
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(msg, msg_len, "no CUDA device: %s", cudaGetErrorString(e));
        return TDM_E_NO_CUDA;
    }
    if (n <= 0) {
        snprintf(msg, msg_len, "no CUDA device: cudaGetDeviceCount() found none");
        return TDM_E_NO_CUDA;
    }
    return TDM_OK;
    TDM_CU_CATCH
}

static int dev_malloc(void **ptr, size_t size, char *msg, size_t msg_len)
{
    TDM_CU_TRY
    TDM_CU_CHECK(cudaMalloc(ptr, size));
    return TDM_OK;
    TDM_CU_CATCH
}

static int dev_free(void *ptr, char *msg, size_t msg_len)
{
    TDM_CU_TRY
    TDM_CU_CHECK(cudaFree(ptr));
    return TDM_OK;
    TDM_CU_CATCH
}

static int dev_memcpy(void *dst, const void *src, size_t size, int kind, char *msg, size_t msg_len)
{
    TDM_CU_TRY
    static const cudaMemcpyKind kinds[] = {cudaMemcpyDefault, cudaMemcpyHostToDevice,
                                           cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice};
    if (kind < 0 || kind > 3) {
        snprintf(msg, msg_len, "unknown copy kind %d", kind);
        return TDM_E_INVAL;
    }
    TDM_CU_CHECK(cudaMemcpy(dst, src, size, kinds[kind]));
    return TDM_OK;
    TDM_CU_CATCH
}

static int dev_memcpy_async(void *dst, const void *src, size_t size, int kind, void *stream,
                            char *msg, size_t msg_len)
{
    TDM_CU_TRY
    static const cudaMemcpyKind kinds[] = {cudaMemcpyDefault, cudaMemcpyHostToDevice,
                                           cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice};
    if (kind < 0 || kind > 3) {
        snprintf(msg, msg_len, "unknown copy kind %d", kind);
        return TDM_E_INVAL;
    }
    TDM_CU_CHECK(cudaMemcpyAsync(dst, src, size, kinds[kind], (cudaStream_t)stream));
    return TDM_OK;
    TDM_CU_CATCH
}

static int dev_memset(void *dst, int value, size_t size, char *msg, size_t msg_len)
{
    TDM_CU_TRY
    TDM_CU_CHECK(cudaMemset(dst, value, size));
    TDM_CU_CHECK(cudaDeviceSynchronize());
    return TDM_OK;
    TDM_CU_CATCH
}

static int stream_sync(void *stream, char *msg, size_t msg_len)
{
    TDM_CU_TRY
    TDM_CU_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
    return TDM_OK;
    TDM_CU_CATCH
}

extern "C" __attribute__((visibility("default"))) const tdm__cuda_table *tdm_cuda_get_table_v1(void)
{
    static const tdm__cuda_table table = {
        TDM__CUDA_TABLE_VERSION,
        (uint32_t)sizeof(tdm__cuda_table),
        (uint32_t)sizeof(tdm__kv_plan),
        0,
        dev_check,
        dev_malloc,
        dev_free,
        dev_memcpy,
        dev_memset,
        stream_sync,
        tdm__cu_kv_run,
        tdm__cu_profile,
        dev_memcpy_async,
    };
    return &table;
}
