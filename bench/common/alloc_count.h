/*
 * alloc_count.h -- counting the process's libc heap allocations, for benchmarks that check
 * "no allocation in steady state". alloc_count.c interposes malloc, calloc and realloc
 * (glibc only; forwarding to glibc's __libc_* entry points) and counts every call. It is a
 * test-only trick: only the benchmark binaries that count allocations link it, never the
 * library. Without glibc, or under AddressSanitizer (which owns malloc), nothing is
 * interposed and tdm_bench_libc_counting() says so.
 */
#ifndef TANDEM_BENCH_ALLOC_COUNT_H
#define TANDEM_BENCH_ALLOC_COUNT_H

#include <stdint.h>

/* Allocation calls (malloc + calloc + realloc) made by the process so far; 0 when not counting. */
uint64_t tdm_bench_libc_allocs(void);

/* Whether allocations are counted in this build (1) or not (0). */
int tdm_bench_libc_counting(void);

#endif
