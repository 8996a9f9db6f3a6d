/*
 * kv_stubs.c -- temporary stubs of the pack/unpack/convert and CUDA entry points
 * (TDM_E_UNSUPPORTED) so that the header's final signatures can be linked against while
 * the implementations land. Removed as each implementation arrives.
 */
#include "kv_internal.h"

#define STUB(name) return tdm__kv_fail(TDM_E_UNSUPPORTED, name ": not implemented yet")

int tdm_cuda_available(char *msg, size_t len) { STUB("tdm_cuda_available"); }
int tdm_cuda_malloc(void **p, size_t s) { STUB("tdm_cuda_malloc"); }
int tdm_cuda_free(void *p) { STUB("tdm_cuda_free"); }
int tdm_cuda_memcpy(void *d, const void *s, size_t n, tdm_cuda_copy_kind k) { STUB("tdm_cuda_memcpy"); }
int tdm_cuda_memset(void *d, int v, size_t n) { STUB("tdm_cuda_memset"); }
int tdm_cuda_stream_sync(void *s) { STUB("tdm_cuda_stream_sync"); }
int tdm_kv_pack_cuda(const tdm_kv_layout *l, void *const *b, const uint32_t *ids, uint32_t n,
                     uint32_t lb, uint32_t le, void *dst, size_t ds, void *st) { STUB("tdm_kv_pack_cuda"); }
int tdm_kv_unpack_cuda(const tdm_kv_layout *l, void *const *b, const uint32_t *ids, uint32_t n,
                       uint32_t lb, uint32_t le, const void *src, size_t ss, void *st)
{ STUB("tdm_kv_unpack_cuda"); }
int tdm_kv_unpack_convert_cuda(const tdm_kv_layout *sl, const void *src, size_t ss, uint32_t nsb,
                               uint32_t nt, const tdm_kv_layout *dl, void *const *db,
                               const uint32_t *dids, uint32_t ndb, const tdm_kv_convert_opts *o,
                               void *st) { STUB("tdm_kv_unpack_convert_cuda"); }
int tdm_kv_pack_convert_cuda(const tdm_kv_layout *sl, void *const *sb, const uint32_t *ids,
                             uint32_t n, const tdm_kv_layout *pl, void *dst, size_t ds,
                             const tdm_kv_convert_opts *o, void *st) { STUB("tdm_kv_pack_convert_cuda"); }
int tdm_profile_spec_init(tdm_profile_spec *s) { STUB("tdm_profile_spec_init"); }
int tdm_cuda_profile(const tdm_profile_spec *s, char *j, size_t js, size_t *jl) { STUB("tdm_cuda_profile"); }
