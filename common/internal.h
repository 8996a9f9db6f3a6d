/*
 * internal.h -- helpers shared by every module of libtandem and never exported:
 * the allocator wrappers (tdm__malloc & co., which count live handles so that
 * tdm_set_allocator can refuse to run under live memory), the per-handle error
 * message buffer, and small utilities. Internal non-static names use the tdm__ prefix.
 */
#ifndef TANDEM_INTERNAL_H
#define TANDEM_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "tandem.h"

#if defined(__GNUC__)
#  define TDM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#  define TDM_LIKELY(x) __builtin_expect(!!(x), 1)
#  define TDM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#  define TDM_PRINTF(a, b)
#  define TDM_LIKELY(x) (x)
#  define TDM_UNLIKELY(x) (x)
#endif

/* TDM__COMPAT_SYMBOL(impl, name, node): export the function impl as the older version
 * name@node of a public symbol (tandem.map), beside the current name@@<newest node>. Used
 * for the initialisers of structs that grew: the old version writes only the layout that
 * binaries linked against that node know. ELF (GNU as) only; elsewhere nothing is bound
 * and those binaries cannot exist. impl must be declared TDM_API. Such a name is listed in
 * both nodes of tandem.map and has no plain definition: its current version is defined
 * under an internal name too and bound as name@@node with TDM__DEFAULT_SYMBOL(impl, name,
 * node) (a static link resolves `name` to that default version); without symbol versions
 * (TDM__HAVE_SYMVER 0) the source defines the plain name as a call to impl instead. */
#if defined(__ELF__) && defined(__GNUC__)
#  define TDM__HAVE_SYMVER 1
#  define TDM__COMPAT_SYMBOL(impl, name, node) __asm__(".symver " #impl "," #name "@" #node)
#  define TDM__DEFAULT_SYMBOL(impl, name, node) __asm__(".symver " #impl "," #name "@@" #node)
#else
#  define TDM__HAVE_SYMVER 0
#  define TDM__COMPAT_SYMBOL(impl, name, node)
#  define TDM__DEFAULT_SYMBOL(impl, name, node)
#endif

#define TDM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define TDM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TDM_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Host-memory allocation through the installed allocator. tdm__malloc/calloc return NULL
 * on failure (and for size 0 they allocate 1 byte so that NULL always means failure). */
void *tdm__malloc(size_t size);
void *tdm__calloc(size_t n, size_t size);
void *tdm__realloc(void *ptr, size_t size);
void tdm__free(void *ptr);
char *tdm__strdup(const char *s);

/* Every handle type calls these in create/destroy, so tdm_set_allocator can see whether
 * memory from the current allocator is live. */
void tdm__handle_acquire(void);
void tdm__handle_release(void);

/* Test hook: make the n-th allocation from now fail (n >= 1), or disable with 0.
 * Counts only tdm__ allocations. Used by the failure-injection tests. */
void tdm__alloc_fail_after(long n);
/* Number of tdm__ allocations so far (malloc, calloc, realloc that allocate). */
uint64_t tdm__alloc_count(void);

/* An error-message buffer embedded in each handle. */
#define TDM_ERRMSG_LEN 256
typedef struct tdm__err {
    char msg[TDM_ERRMSG_LEN];
} tdm__err;

/* Format a message into e (e may be NULL) and return status, so that a function can end
 * with `return tdm__fail(&h->err, TDM_E_INVAL, "...", ...);`. */
int tdm__fail(tdm__err *e, int status, const char *fmt, ...) TDM_PRINTF(3, 4);
int tdm__vfail(tdm__err *e, int status, const char *fmt, va_list ap);
static inline void tdm__err_clear(tdm__err *e) { if (e) e->msg[0] = '\0'; }

/* Checks that a caller's versioned struct covers at least `min` bytes (the size of the
 * first version of that struct). */
#define TDM_STRUCT_OK(p, min) ((p) != NULL && (p)->struct_size >= (uint32_t)(min))
/* True when the caller's struct (struct_size) covers the field `f` of type T. */
#define TDM_HAS_FIELD(p, T, f) ((p)->struct_size >= offsetof(T, f) + sizeof(((T *)0)->f))

/* Monotonic clock, seconds. */
double tdm__now(void);

#endif /* TANDEM_INTERNAL_H */
