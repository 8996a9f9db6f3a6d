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
#include "kv_dtype.h"

namespace {

constexpr int kThreads = 256;

/* n elements of T from s to d by lanes lane, lane+G, ..., four in flight. */
template <typename T, int G>
__device__ __forceinline__ void copy_vec(char *__restrict__ dst, const char *__restrict__ src,
                                         size_t n, unsigned lane)
{
    const T *__restrict__ s = reinterpret_cast<const T *>(src);
    T *__restrict__ d = reinterpret_cast<T *>(dst);
    size_t i = lane;
#pragma unroll 1
    for (; i + 3 * G < n; i += 4 * G) {
        T a = s[i], b = s[i + G], c = s[i + 2 * G], e = s[i + 3 * G];
        d[i] = a;
        d[i + G] = b;
        d[i + 2 * G] = c;
        d[i + 3 * G] = e;
    }
#pragma unroll 1
    for (; i < n; i += G) d[i] = s[i];
}

template <int G>
__global__ void __launch_bounds__(kThreads) kv_copy_kernel(const __grid_constant__ tdm__kv_plan p)
{
    const unsigned lane = threadIdx.x % G;
    const uint64_t ngroups = (uint64_t)gridDim.x * (kThreads / G);
    const size_t elem = p.src.elem;
#pragma unroll 1
    for (uint64_t r = (uint64_t)blockIdx.x * (kThreads / G) + threadIdx.x / G; r < p.num_runs;
         r += ngroups) {
        tdm__kv_run run;
        tdm__kv_locate(&p, r, &run);
        const size_t bytes = (size_t)run.elems * elem;
        const uintptr_t mask = (uintptr_t)run.src | (uintptr_t)run.dst | (uintptr_t)bytes;
        if ((mask & 15u) == 0) copy_vec<uint4, G>(run.dst, run.src, bytes / 16, lane);
        else if ((mask & 7u) == 0) copy_vec<uint2, G>(run.dst, run.src, bytes / 8, lane);
        else if ((mask & 3u) == 0) copy_vec<uint32_t, G>(run.dst, run.src, bytes / 4, lane);
        else if ((mask & 1u) == 0) copy_vec<uint16_t, G>(run.dst, run.src, bytes / 2, lane);
        else copy_vec<uint8_t, G>(run.dst, run.src, bytes, lane);
    }
}

template <int G>
__global__ void __launch_bounds__(kThreads) kv_convert_kernel(const __grid_constant__ tdm__kv_plan p)
{
    const unsigned lane = threadIdx.x % G;
    const uint64_t ngroups = (uint64_t)gridDim.x * (kThreads / G);
    const bool src_scaled = p.src.scale_kind != 0, dst_scaled = p.dst.scale_kind != 0;
    const uint32_t sdt = p.src.dtype, ddt = p.dst.dtype;
#pragma unroll 1
    for (uint64_t r = (uint64_t)blockIdx.x * (kThreads / G) + threadIdx.x / G; r < p.num_runs;
         r += ngroups) {
        tdm__kv_run run;
        tdm__kv_locate(&p, r, &run);
        const float ss = tdm__kv_side_scale(&p.src, run.layer, run.kv, run.head);
        const float ds = tdm__kv_side_scale(&p.dst, run.layer, run.kv, run.head);
#pragma unroll 4
        for (uint32_t i = lane; i < run.elems; i += G) {
            float x = tdm__load_elem(run.src, sdt, i);
            /* NaNs pass unscaled so that their bits survive (as on the CPU) */
            if (src_scaled && x == x) x = __fmul_rn(x, ss);
            if (dst_scaled && x == x) x = __fdiv_rn(x, ds);
            tdm__store_elem(run.dst, ddt, i, x);
        }
    }
}

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
cudaError_t launch_g(const tdm__kv_plan &p, cudaStream_t stream)
{
    void (*kernel)(const tdm__kv_plan) = p.copy ? kv_copy_kernel<G> : kv_convert_kernel<G>;
    int dev = 0, sms = 0, per_sm = 0;
    cudaError_t e;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess ||
        (e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0)) != cudaSuccess)
        return e;
    const uint64_t groups_per_cta = kThreads / G;
    uint64_t ctas = (p.num_runs + groups_per_cta - 1) / groups_per_cta;
    uint64_t cap = (uint64_t)(sms > 0 ? sms : 1) * (uint64_t)(per_sm > 0 ? per_sm : 1);
    if (ctas > cap) ctas = cap;
    kernel<<<(unsigned)ctas, kThreads, 0, stream>>>(p);
    return cudaGetLastError();
}

/* The group size: lanes per run, from the longest run's vector (or element) count. */
cudaError_t launch(const tdm__kv_plan &p, cudaStream_t stream)
{
    uint64_t elems = (uint64_t)p.run_tokens * p.run_heads * p.head_dim;
    uint64_t units = p.copy ? elems * p.src.elem / 16 : elems;
    if (units >= 32) return launch_g<32>(p, stream);
    if (units >= 16) return launch_g<16>(p, stream);
    if (units >= 8) return launch_g<8>(p, stream);
    return launch_g<4>(p, stream);
}

}  // namespace

int tdm__cu_kv_run(const tdm__kv_plan *plan, const void *meta, size_t meta_size, void *stream_v,
                   char *msg, size_t msg_len)
{
    TDM_CU_TRY
    cudaStream_t stream = (cudaStream_t)stream_v;
    tdm__kv_plan p = *plan;
    if (p.num_runs == 0) return TDM_OK;
    char *dmeta = nullptr;
    if (meta_size) {
        TDM_CU_CHECK(cudaMallocAsync((void **)&dmeta, meta_size, stream));
        cudaError_t e = cudaMemcpyAsync(dmeta, meta, meta_size, cudaMemcpyHostToDevice, stream);
        if (e != cudaSuccess) {
            cudaFreeAsync(dmeta, stream);
            return tdm__cu_fail(e, "cudaMemcpyAsync(metadata)", msg, msg_len);
        }
    }
    resolve_side(p.src, dmeta);
    resolve_side(p.dst, dmeta);
    cudaError_t e = launch(p, stream);
    cudaError_t f = dmeta ? cudaFreeAsync(dmeta, stream) : cudaSuccess;
    if (e != cudaSuccess) return tdm__cu_fail(e, "kernel launch", msg, msg_len);
    if (f != cudaSuccess) return tdm__cu_fail(f, "cudaFreeAsync(metadata)", msg, msg_len);
    return TDM_OK;
    TDM_CU_CATCH
}
