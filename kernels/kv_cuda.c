/*
 * kv_cuda.c -- the public CUDA entry points of libtandem: device memory helpers and the
 * CUDA pack / unpack / convert calls. Each validates its arguments with the same plan
 * builders as the CPU functions (same statuses and messages), packs the plan's host arrays
 * (layer bases, block ids, scales) into one metadata blob, and hands plan and blob to
 * libtandem_cuda.so through the loader's table (cuda_loader.c), which launches one kernel.
 */
#include <string.h>

#include "cuda_table.h"
#include "kv_internal.h"

#define ALIGN8(x) (((x) + 7u) & ~(size_t)7u)

/* Gets the table or fails with the loader's message. */
#define GET_TABLE(t)                                  \
    const tdm__cuda_table *t;                         \
    do {                                              \
        int rc_ = tdm__cuda_table_get(&t);            \
        if (rc_) return rc_;                          \
    } while (0)

static int cuda_fail(int rc, const char *fn, const char *msg)
{
    return tdm__kv_fail(rc, "%s: %s", fn, msg[0] ? msg : tdm_strerror(rc));
}

/* Copies n bytes of src into the blob at *off and returns the reference to it. */
static uintptr_t put(char *blob, size_t *off, const void *src, size_t n)
{
    if (!n || !src) return 0;
    size_t at = *off;
    memcpy(blob + at, src, n);
    *off = ALIGN8(at + n);
    return TDM__META_REF(at);
}

static size_t side_meta_bytes(const tdm__kv_side *s, uint32_t num_layers)
{
    size_t n = 0;
    if (s->bases) n += ALIGN8((size_t)num_layers * sizeof(void *));
    if (s->ids) n += ALIGN8((size_t)s->num_ids * sizeof(uint32_t));
    if (s->k_scale) n += 2 * ALIGN8((size_t)s->scale_count * sizeof(float));
    return n;
}

static void side_meta_put(tdm__kv_side *s, uint32_t num_layers, char *blob, size_t *off)
{
    s->bases = (void *const *)put(blob, off, s->bases, (size_t)num_layers * sizeof(void *));
    s->ids = (const uint32_t *)put(blob, off, s->ids, (size_t)s->num_ids * sizeof(uint32_t));
    if (s->k_scale) {
        s->k_scale = (const float *)put(blob, off, s->k_scale, (size_t)s->scale_count * sizeof(float));
        s->v_scale = (const float *)put(blob, off, s->v_scale, (size_t)s->scale_count * sizeof(float));
    }
}

size_t tdm__kv_meta_size(const tdm__kv_plan *p)
{
    return side_meta_bytes(&p->src, p->num_layers) + side_meta_bytes(&p->dst, p->num_layers);
}

void tdm__kv_meta_build(tdm__kv_plan *q, char *blob)
{
    size_t off = 0;
    side_meta_put(&q->src, q->num_layers, blob, &off);
    side_meta_put(&q->dst, q->num_layers, blob, &off);
}

static int run_plan(const tdm__cuda_table *t, const char *fn, const tdm__kv_plan *p, void *stream)
{
    if (p->num_runs == 0) return TDM_OK;
    size_t total = tdm__kv_meta_size(p);
    char *blob = tdm__malloc(total);
    if (!blob) return tdm__kv_fail(TDM_E_NOMEM, "%s: no memory for %zu bytes of metadata", fn, total);
    tdm__kv_plan q = *p;
    tdm__kv_meta_build(&q, blob);
    char msg[TDM_ERRMSG_LEN] = "";
    int rc = t->kv_run(&q, blob, total, stream, msg, sizeof msg);
    tdm__free(blob);
    return rc ? cuda_fail(rc, fn, msg) : TDM_OK;
}

int tdm_kv_pack_cuda(const tdm_kv_layout *l, void *const *layer_bases, const uint32_t *block_ids,
                     uint32_t num_blocks, uint32_t layer_begin, uint32_t layer_end, void *dst,
                     size_t dst_size, void *stream)
{
    static const char fn[] = "tdm_kv_pack_cuda";
    tdm__kv_plan p;
    int rc = tdm__kv_plan_copy(&p, fn, 0, l, layer_bases, block_ids, num_blocks, layer_begin,
                               layer_end, dst, dst_size);
    if (rc) return rc;
    GET_TABLE(t);
    return run_plan(t, fn, &p, stream);
}

int tdm_kv_unpack_cuda(const tdm_kv_layout *l, void *const *layer_bases, const uint32_t *block_ids,
                       uint32_t num_blocks, uint32_t layer_begin, uint32_t layer_end,
                       const void *src, size_t src_size, void *stream)
{
    static const char fn[] = "tdm_kv_unpack_cuda";
    tdm__kv_plan p;
    int rc = tdm__kv_plan_copy(&p, fn, 1, l, layer_bases, block_ids, num_blocks, layer_begin,
                               layer_end, (void *)(uintptr_t)src, src_size);
    if (rc) return rc;
    GET_TABLE(t);
    return run_plan(t, fn, &p, stream);
}

int tdm_kv_unpack_convert_cuda(const tdm_kv_layout *src_layout, const void *src, size_t src_size,
                               uint32_t num_src_blocks, uint32_t num_tokens,
                               const tdm_kv_layout *dst_layout, void *const *dst_bases,
                               const uint32_t *dst_block_ids, uint32_t num_dst_blocks,
                               const tdm_kv_convert_opts *opts, void *stream)
{
    static const char fn[] = "tdm_kv_unpack_convert_cuda";
    tdm__kv_plan p;
    int rc = tdm__kv_plan_unpack_convert(&p, fn, src_layout, src, src_size, num_src_blocks,
                                         num_tokens, dst_layout, dst_bases, dst_block_ids,
                                         num_dst_blocks, opts);
    if (rc) return rc;
    GET_TABLE(t);
    return run_plan(t, fn, &p, stream);
}

int tdm_kv_pack_convert_cuda(const tdm_kv_layout *src_layout, void *const *src_bases,
                             const uint32_t *block_ids, uint32_t num_blocks,
                             const tdm_kv_layout *packed_layout, void *dst, size_t dst_size,
                             const tdm_kv_convert_opts *opts, void *stream)
{
    static const char fn[] = "tdm_kv_pack_convert_cuda";
    tdm__kv_plan p;
    int rc = tdm__kv_plan_pack_convert(&p, fn, src_layout, src_bases, block_ids, num_blocks,
                                       packed_layout, dst, dst_size, opts);
    if (rc) return rc;
    GET_TABLE(t);
    return run_plan(t, fn, &p, stream);
}

int tdm_cuda_malloc(void **ptr, size_t size)
{
    if (!ptr) return tdm__kv_fail(TDM_E_INVAL, "tdm_cuda_malloc: ptr is NULL");
    GET_TABLE(t);
    char msg[TDM_ERRMSG_LEN] = "";
    void *p = NULL;
    int rc = t->dev_malloc(&p, size, msg, sizeof msg);
    if (rc) return cuda_fail(rc, "tdm_cuda_malloc", msg);
    *ptr = p;
    return TDM_OK;
}

int tdm_cuda_free(void *ptr)
{
    if (!ptr) return TDM_OK;
    GET_TABLE(t);
    char msg[TDM_ERRMSG_LEN] = "";
    int rc = t->dev_free(ptr, msg, sizeof msg);
    return rc ? cuda_fail(rc, "tdm_cuda_free", msg) : TDM_OK;
}

int tdm_cuda_memcpy(void *dst, const void *src, size_t size, tdm_cuda_copy_kind kind)
{
    if ((size && (!dst || !src)) || (unsigned)kind > TDM_CUDA_COPY_DEVICE_TO_DEVICE)
        return tdm__kv_fail(TDM_E_INVAL, "tdm_cuda_memcpy: NULL pointer or unknown kind %d",
                            (int)kind);
    GET_TABLE(t);
    if (!size) return TDM_OK;
    char msg[TDM_ERRMSG_LEN] = "";
    int rc = t->dev_memcpy(dst, src, size, (int)kind, msg, sizeof msg);
    return rc ? cuda_fail(rc, "tdm_cuda_memcpy", msg) : TDM_OK;
}

int tdm_cuda_memcpy_async(void *dst, const void *src, size_t size, tdm_cuda_copy_kind kind,
                          void *stream)
{
    if ((size && (!dst || !src)) || (unsigned)kind > TDM_CUDA_COPY_DEVICE_TO_DEVICE)
        return tdm__kv_fail(TDM_E_INVAL, "tdm_cuda_memcpy_async: NULL pointer or unknown kind %d",
                            (int)kind);
    GET_TABLE(t);
    if (!size) return TDM_OK;
    char msg[TDM_ERRMSG_LEN] = "";
    int rc = t->dev_memcpy_async(dst, src, size, (int)kind, stream, msg, sizeof msg);
    return rc ? cuda_fail(rc, "tdm_cuda_memcpy_async", msg) : TDM_OK;
}

int tdm_cuda_memset(void *dst, int value, size_t size)
{
    if (size && !dst) return tdm__kv_fail(TDM_E_INVAL, "tdm_cuda_memset: dst is NULL");
    GET_TABLE(t);
    if (!size) return TDM_OK;
    char msg[TDM_ERRMSG_LEN] = "";
    int rc = t->dev_memset(dst, value, size, msg, sizeof msg);
    return rc ? cuda_fail(rc, "tdm_cuda_memset", msg) : TDM_OK;
}

int tdm_cuda_stream_sync(void *stream)
{
    GET_TABLE(t);
    char msg[TDM_ERRMSG_LEN] = "";
    int rc = t->stream_sync(stream, msg, sizeof msg);
    return rc ? cuda_fail(rc, "tdm_cuda_stream_sync", msg) : TDM_OK;
}

int tdm_profile_spec_init(tdm_profile_spec *s)
{
    if (!s) return tdm__kv_fail(TDM_E_INVAL, "tdm_profile_spec_init: spec is NULL");
    memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
    s->hidden = 4096;            /* llama-3-8b */
    s->intermediate = 14336;
    s->num_heads = 32;
    s->num_kv_heads = 8;
    s->head_dim = 128;
    s->num_layers = 32;
    s->vocab = 128256;
    s->tp = 1;
    s->min_tokens = 128;
    s->max_tokens = 8192;
    s->max_batch = 256;
    s->reps = 10;
    s->model_name = "llama-3-8b";
    return TDM_OK;
}

int tdm_cuda_profile(const tdm_profile_spec *spec, char *json, size_t json_size, size_t *json_len)
{
    static const char fn[] = "tdm_cuda_profile";
    if (!spec || spec->struct_size < sizeof(tdm_profile_spec) || !json_len)
        return tdm__kv_fail(TDM_E_INVAL, "%s: spec (initialised with tdm_profile_spec_init) and "
                            "json_len are required", fn);
    if (json_size && !json) return tdm__kv_fail(TDM_E_INVAL, "%s: json is NULL", fn);
    if (!spec->hidden || !spec->intermediate || !spec->num_heads || !spec->num_kv_heads ||
        !spec->head_dim || !spec->tp || spec->num_heads % spec->tp ||
        spec->intermediate % spec->tp || !spec->min_tokens || spec->min_tokens > spec->max_tokens ||
        !spec->max_batch || !spec->reps || spec->max_tokens > (1u << 20) ||
        spec->max_batch > (1u << 16) || spec->hidden > (1u << 18) || spec->intermediate > (1u << 20))
        return tdm__kv_fail(TDM_E_INVAL, "%s: invalid model shape (hidden %u, intermediate %u, "
                            "heads %u/%u, head_dim %u, tp %u, tokens %u..%u, batch %u, reps %u)",
                            fn, spec->hidden, spec->intermediate, spec->num_heads,
                            spec->num_kv_heads, spec->head_dim, spec->tp, spec->min_tokens,
                            spec->max_tokens, spec->max_batch, spec->reps);
    GET_TABLE(t);
    char msg[TDM_ERRMSG_LEN] = "";
    int rc = t->profile(spec, json, json_size, json_len, msg, sizeof msg);
    return rc ? cuda_fail(rc, fn, msg) : TDM_OK;
}
