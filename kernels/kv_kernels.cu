/*
 * kv_kernels.cu -- the CUDA pack / unpack / convert kernels of libtandem_cuda.so. One
 * launch runs a whole plan (kv_plan.h, built and validated by libtandem): a grid-stride
 * loop hands each run (a stretch contiguous on both sides: a head row, a token's heads or
 * a block's tokens) to a group of G lanes. Copies use 16-byte vectors when both addresses
 * and the length allow (8, 4, 2, 1-byte fallbacks otherwise) with 4 loads in flight per
 * lane; conversions decode to float, scale and encode with the same code as the CPU
 * (kv_dtype.h), so results are bit-identical. The plan's host arrays arrive as one
 * metadata blob, uploaded to a stream-ordered scratch allocation freed after the kernel.
 */
#include "cuda_impl.h"
#include "kv_kernels_dev.h"

namespace {

using namespace tdm_kv_dev;

/* Replace a metadata reference (offset + 1, or 0) with a device pointer. */
template <typename T>
void resolve(T *&field, char *dmeta)
{
    uintptr_t ref = (uintptr_t)field;
    field = ref ? reinterpret_cast<T *>(dmeta + (ref - 1)) : nullptr;
}

void resolve_side(tdm__kv_side &s, char *dmeta)
{
    resolve(s.ids, dmeta);
    resolve(s.bases, dmeta);
    resolve(s.k_scale, dmeta);
    resolve(s.v_scale, dmeta);
}

template <int G>
cudaError_t launch_g(const tdm__kv_plan &p, cudaStream_t stream, int sms)
{
    void (*kernel)(const tdm__kv_plan) = p.copy ? kv_copy_kernel<G> : kv_convert_kernel<G>;
    int per_sm = 0;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
    if (e != cudaSuccess) return e;
    const uint64_t groups_per_cta = kThreads / G;
    uint64_t ctas = (p.num_runs + groups_per_cta - 1) / groups_per_cta;
    uint64_t cap = (uint64_t)(sms > 0 ? sms : 1) * (uint64_t)(per_sm > 0 ? per_sm : 1);
    if (ctas > cap) ctas = cap;
    kernel<<<(unsigned)ctas, kThreads, 0, stream>>>(p);
    return cudaGetLastError();
}

/* The group size: lanes per run. From the longest run's vector (or element) count, up to
 * a warp; then, while the runs are too few to fill the device and each lane would still
 * move several units, more lanes per run (up to the whole CTA). */
cudaError_t launch(const tdm__kv_plan &p, cudaStream_t stream)
{
    int dev = 0, sms = 0;
    cudaError_t e;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
        return e;
    const uint64_t elems = (uint64_t)p.run_tokens * p.run_heads * p.head_dim;
    const uint64_t units = p.copy ? (elems * p.src.elem + 15) / 16 : elems;
    const uint64_t want_threads = (uint64_t)(sms > 0 ? sms : 1) * 2048;
    unsigned g = 4;
    while (g < 32 && units >= 2ull * g) g *= 2;
    while (g < (unsigned)kThreads && p.num_runs * g < want_threads && units >= 8ull * g) g *= 2;
    switch (g) {
    case 4: return launch_g<4>(p, stream, sms);
    case 8: return launch_g<8>(p, stream, sms);
    case 16: return launch_g<16>(p, stream, sms);
    case 32: return launch_g<32>(p, stream, sms);
    case 64: return launch_g<64>(p, stream, sms);
    case 128: return launch_g<128>(p, stream, sms);
    default: return launch_g<256>(p, stream, sms);
    }
}

}  // namespace

int tdm__cu_kv_run(const tdm__kv_plan *plan, const void *meta, size_t meta_size, void *stream_v,
                   char *msg, size_t msg_len)
{
    TDM_CU_TRY
    cudaStream_t stream = (cudaStream_t)stream_v;
    tdm__kv_plan p = *plan;
    if (p.num_runs == 0) return TDM_OK;
    /* Stream-ordered scratch when the device has memory pools; else (some virtualized
     * hosts) cudaMalloc, and the call waits for the kernel before freeing it. */
    int dev = 0, pools = 0;
    TDM_CU_CHECK(cudaGetDevice(&dev));
    if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev) != cudaSuccess) {
        pools = 0;
        (void)cudaGetLastError();
    }
    char *dmeta = nullptr;
    if (meta_size) {
        if (pools) TDM_CU_CHECK(cudaMallocAsync((void **)&dmeta, meta_size, stream));
        else TDM_CU_CHECK(cudaMalloc((void **)&dmeta, meta_size));
        /* from pageable memory: returns once the bytes are staged, so meta may be freed */
        cudaError_t e = cudaMemcpyAsync(dmeta, meta, meta_size, cudaMemcpyHostToDevice, stream);
        if (e != cudaSuccess) {
            if (pools) cudaFreeAsync(dmeta, stream);
            else cudaFree(dmeta);
            return tdm__cu_fail(e, "cudaMemcpyAsync(metadata)", msg, msg_len);
        }
    }
    resolve_side(p.src, dmeta);
    resolve_side(p.dst, dmeta);
    cudaError_t e = launch(p, stream), f = cudaSuccess;
    if (dmeta && pools) {
        f = cudaFreeAsync(dmeta, stream);
    } else if (dmeta) {
        cudaError_t s = cudaStreamSynchronize(stream);
        f = cudaFree(dmeta);
        if (e == cudaSuccess) e = s;
    }
    if (e != cudaSuccess) return tdm__cu_fail(e, "kernel launch", msg, msg_len);
    if (f != cudaSuccess) return tdm__cu_fail(f, "free(metadata)", msg, msg_len);
    return TDM_OK;
    TDM_CU_CATCH
}
