/*
 * kv_kernels.cu -- the CUDA pack / unpack / convert kernels of libtandem_cuda.so. One
 * launch runs a whole plan (kv_plan.h, built and validated by libtandem): a grid-stride
 * loop hands each run (a stretch contiguous on both sides: a head row, a token's heads or
 * a block's tokens) to a group of G lanes. Copies use 16-byte vectors when both addresses
 * and the length allow (8, 4, 2, 1-byte fallbacks otherwise) with 4 loads in flight per
 * lane; conversions decode to float, scale and encode with the same code as the CPU
 * (kv_dtype.h), so results are bit-identical. The plan's host arrays arrive as one
 * metadata blob: up to 3.5 KiB of it travels inside the kernel parameters (no allocation,
 * no copy: one launch and nothing else); a larger one is uploaded to a stream-ordered
 * scratch allocation freed after the kernel.
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
cudaError_t launch_g(const kv_args &a, cudaStream_t stream, int sms)
{
    void (*kernel)(const kv_args) = a.p.copy ? kv_copy_kernel<G> : kv_convert_kernel<G>;
    /* at most what fits at once (8 CTAs of 256 per SM); the grid-stride loop does the rest */
    const uint64_t groups_per_cta = kThreads / G;
    uint64_t ctas = (a.p.num_runs + groups_per_cta - 1) / groups_per_cta;
    const uint64_t cap = (uint64_t)(sms > 0 ? sms : 1) * 8;
    if (ctas > cap) ctas = cap;
    kernel<<<(unsigned)ctas, kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

/* The group size: lanes per run. From the longest run's vector (or element) count, up to
 * a warp; then, while the runs are too few to fill the device and each lane would still
 * move several units, more lanes per run (up to the whole CTA). */
cudaError_t launch(const kv_args &a, cudaStream_t stream)
{
    const tdm__kv_plan &p = a.p;
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
    case 4: return launch_g<4>(a, stream, sms);
    case 8: return launch_g<8>(a, stream, sms);
    case 16: return launch_g<16>(a, stream, sms);
    case 32: return launch_g<32>(a, stream, sms);
    case 64: return launch_g<64>(a, stream, sms);
    case 128: return launch_g<128>(a, stream, sms);
    default: return launch_g<256>(a, stream, sms);
    }
}

}  // namespace

int tdm__cu_kv_run(const tdm__kv_plan *plan, const void *meta, size_t meta_size, void *stream_v,
                   char *msg, size_t msg_len)
{
    TDM_CU_TRY
    cudaStream_t stream = (cudaStream_t)stream_v;
    if (plan->num_runs == 0) return TDM_OK;
    kv_args a;   /* ~3.9 KiB, copied into the launch */
    a.p = *plan;
    if (meta_size <= kInlineMeta) {
        /* small metadata (the usual case): inside the kernel parameters, one launch only */
        if (meta_size) memcpy(a.meta, meta, meta_size);
        a.meta_bytes = meta_size;
        cudaError_t e = launch(a, stream);
        return e == cudaSuccess ? TDM_OK : tdm__cu_fail(e, "kernel launch", msg, msg_len);
    }
    a.meta_bytes = 0;
    /* Stream-ordered scratch when the device has memory pools; else (some virtualized
     * hosts) cudaMalloc, and the call waits for the kernel before freeing it. */
    int dev = 0, pools = 0;
    TDM_CU_CHECK(cudaGetDevice(&dev));
    if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev) != cudaSuccess) {
        pools = 0;
        (void)cudaGetLastError();
    }
    char *dmeta = nullptr;
    if (pools) TDM_CU_CHECK(cudaMallocAsync((void **)&dmeta, meta_size, stream));
    else TDM_CU_CHECK(cudaMalloc((void **)&dmeta, meta_size));
    /* from pageable memory: returns once the bytes are staged, so meta may be freed */
    cudaError_t e = cudaMemcpyAsync(dmeta, meta, meta_size, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) {
        if (pools) cudaFreeAsync(dmeta, stream);
        else cudaFree(dmeta);
        return tdm__cu_fail(e, "cudaMemcpyAsync(metadata)", msg, msg_len);
    }
    resolve_side(a.p.src, dmeta);
    resolve_side(a.p.dst, dmeta);
    e = launch(a, stream);
    cudaError_t f = cudaSuccess;
    if (pools) {
        f = cudaFreeAsync(dmeta, stream);
    } else {
        cudaError_t s = cudaStreamSynchronize(stream);
        f = cudaFree(dmeta);
        if (e == cudaSuccess) e = s;
    }
    if (e != cudaSuccess) return tdm__cu_fail(e, "kernel launch", msg, msg_len);
    if (f != cudaSuccess) return tdm__cu_fail(f, "free(metadata)", msg, msg_len);
    return TDM_OK;
    TDM_CU_CATCH
}
