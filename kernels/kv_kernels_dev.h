/*
 * kv_kernels_dev.h -- the device code of the pack / unpack / convert kernels (CUDA C++
 * only; included by kv_kernels.cu). Kept apart from the launch code so that the kernel
 * bodies can also be compiled as plain C++ with a few shims and run thread by thread on
 * the CPU (tests/unit/kernels/kernel_emul.cpp checks them against the CPU implementation
 * on machines without a GPU).
 *
 * Each kernel walks the runs of a plan in a grid-stride loop, one run per group of G lanes
 * (G = 4 .. 256, a template parameter): copies move 16-byte vectors when both run addresses
 * and its length allow (8, 4, 2, 1-byte fallbacks), four loads in flight per lane;
 * conversions decode to float, scale and encode with kv_dtype.h, as the CPU does.
 */
#ifndef TANDEM_KV_KERNELS_DEV_H
#define TANDEM_KV_KERNELS_DEV_H

#include "kv_dtype.h"
#include "kv_plan.h"

namespace tdm_kv_dev {

constexpr int kThreads = 256;

/* Metadata up to this size (layer bases, block ids, scales) travels inside the kernel's
 * parameters, so that a launch needs no allocation and no copy; the whole argument block
 * stays under the classic 4 KiB parameter limit. */
constexpr unsigned kInlineMeta = 3584;

/* The kernels' one parameter. With meta_bytes != 0 the plan's ids / bases / scale fields
 * are TDM__META_REF offsets into meta; with 0 they are device pointers. */
struct kv_args {
    tdm__kv_plan p;
    uint64_t meta_bytes;
    alignas(16) char meta[kInlineMeta];
};
static_assert(sizeof(kv_args) <= 4096, "kernel parameters must stay within 4 KiB");

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
__global__ void __launch_bounds__(kThreads) kv_copy_kernel(const __grid_constant__ kv_args a)
{
    const tdm__kv_plan &p = a.p;
    const char *meta = a.meta_bytes ? a.meta : nullptr;
    const unsigned lane = threadIdx.x % G;
    const uint64_t ngroups = (uint64_t)gridDim.x * (kThreads / G);
    const size_t elem = p.src.elem;
#pragma unroll 1
    for (uint64_t r = (uint64_t)blockIdx.x * (kThreads / G) + threadIdx.x / G; r < p.num_runs;
         r += ngroups) {
        tdm__kv_run run;
        tdm__kv_locate(&p, meta, r, &run);
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
__global__ void __launch_bounds__(kThreads) kv_convert_kernel(const __grid_constant__ kv_args a)
{
    const tdm__kv_plan &p = a.p;
    const char *meta = a.meta_bytes ? a.meta : nullptr;
    const unsigned lane = threadIdx.x % G;
    const uint64_t ngroups = (uint64_t)gridDim.x * (kThreads / G);
    const bool src_scaled = p.src.scale_kind != 0, dst_scaled = p.dst.scale_kind != 0;
    const uint32_t sdt = p.src.dtype, ddt = p.dst.dtype;
#pragma unroll 1
    for (uint64_t r = (uint64_t)blockIdx.x * (kThreads / G) + threadIdx.x / G; r < p.num_runs;
         r += ngroups) {
        tdm__kv_run run;
        tdm__kv_locate(&p, meta, r, &run);
        const float ss = tdm__kv_side_scale(&p.src, meta, run.layer, run.kv, run.head);
        const float ds = tdm__kv_side_scale(&p.dst, meta, run.layer, run.kv, run.head);
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

}  // namespace tdm_kv_dev

#endif /* TANDEM_KV_KERNELS_DEV_H */
