/*
 * alloc.c -- the replaceable host allocator, the live-handle count that guards it, the
 * allocation-failure injection hook for tests, error-message formatting and the clock.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

static void *def_malloc(void *ctx, size_t n) { (void)ctx; return malloc(n); }
static void *def_realloc(void *ctx, void *p, size_t n) { (void)ctx; return realloc(p, n); }
static void def_free(void *ctx, void *p) { (void)ctx; free(p); }

static tdm_allocator g_alloc = { sizeof(tdm_allocator), def_malloc, def_realloc, def_free, NULL };
static atomic_long g_live_handles;
static atomic_long g_fail_after;     /* 0 = off; n = fail the n-th allocation from now */
static atomic_ullong g_alloc_count;

int tdm_allocator_init(tdm_allocator *a)
{
    if (!a) return TDM_E_INVAL;
    a->struct_size = sizeof(*a);
    a->malloc_fn = def_malloc;
    a->realloc_fn = def_realloc;
    a->free_fn = def_free;
    a->ctx = NULL;
    return TDM_OK;
}

int tdm_set_allocator(const tdm_allocator *a)
{
    if (a && (!TDM_STRUCT_OK(a, sizeof(tdm_allocator)) || !a->malloc_fn || !a->realloc_fn ||
              !a->free_fn))
        return TDM_E_INVAL;
    if (atomic_load(&g_live_handles) != 0) return TDM_E_STATE;
    if (a) g_alloc = *a;
    else tdm_allocator_init(&g_alloc);
    return TDM_OK;
}

void tdm__handle_acquire(void) { atomic_fetch_add(&g_live_handles, 1); }
void tdm__handle_release(void) { atomic_fetch_sub(&g_live_handles, 1); }

void tdm__alloc_fail_after(long n) { atomic_store(&g_fail_after, n); }
uint64_t tdm__alloc_count(void) { return atomic_load(&g_alloc_count); }

/* True when the injection hook says this allocation must fail. */
static int inject_failure(void)
{
    long n = atomic_load(&g_fail_after);
    if (n <= 0) return 0;
    if (n == 1) {
        atomic_store(&g_fail_after, 0);
        return 1;
    }
    atomic_fetch_sub(&g_fail_after, 1);
    return 0;
}

void *tdm__malloc(size_t size)
{
    if (inject_failure()) return NULL;
    atomic_fetch_add(&g_alloc_count, 1);
    return g_alloc.malloc_fn(g_alloc.ctx, size ? size : 1);
}

void *tdm__calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) return NULL;
    void *p = tdm__malloc(n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

void *tdm__realloc(void *ptr, size_t size)
{
    if (inject_failure()) return NULL;
    atomic_fetch_add(&g_alloc_count, 1);
    return g_alloc.realloc_fn(g_alloc.ctx, ptr, size ? size : 1);
}

void tdm__free(void *ptr)
{
    if (ptr) g_alloc.free_fn(g_alloc.ctx, ptr);
}

char *tdm__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = tdm__malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

int tdm__vfail(tdm__err *e, int status, const char *fmt, va_list ap)
{
    if (e) vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    return status;
}

int tdm__fail(tdm__err *e, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tdm__vfail(e, status, fmt, ap);
    va_end(ap);
    return status;
}

double tdm__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
