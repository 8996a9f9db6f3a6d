/*
 * alloc_count.c -- the libc allocation counter of the benchmarks (see alloc_count.h): with
 * glibc and without AddressSanitizer, malloc, calloc and realloc are defined here, counted
 * with a relaxed atomic and forwarded to glibc's __libc_malloc/__libc_calloc/__libc_realloc;
 * free forwards to __libc_free. Linked only into the benchmarks that count allocations.
 */
#include <stdatomic.h>
#include <stddef.h>

#include "alloc_count.h"

#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
static atomic_ullong g_libc_allocs;
void *malloc(size_t n);
void *calloc(size_t n, size_t m);
void *realloc(void *p, size_t n);
void free(void *p);

void *malloc(size_t n)
{
    atomic_fetch_add_explicit(&g_libc_allocs, 1, memory_order_relaxed);
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t m)
{
    atomic_fetch_add_explicit(&g_libc_allocs, 1, memory_order_relaxed);
    return __libc_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
    atomic_fetch_add_explicit(&g_libc_allocs, 1, memory_order_relaxed);
    return __libc_realloc(p, n);
}

void free(void *p) { __libc_free(p); }

uint64_t tdm_bench_libc_allocs(void) { return atomic_load(&g_libc_allocs); }
int tdm_bench_libc_counting(void) { return 1; }
#else
uint64_t tdm_bench_libc_allocs(void) { return 0; }
int tdm_bench_libc_counting(void) { return 0; }
#endif
