/*
 * kv_layout.c -- KV layout descriptors: dtype sizes, the well-known layouts' strides,
 * validation (strides that nest without overlap, extents that fit in memory), the byte
 * sizes of a block, a layer and a packed buffer, the default conversion options, and the
 * per-thread error message that every function of tandem_kernels.h records.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kv_internal.h"

static _Thread_local char t_errmsg[TDM_ERRMSG_LEN];

const char *tdm_kv_errmsg(void) { return t_errmsg; }

void tdm__kv_err_clear(void) { t_errmsg[0] = '\0'; }

int tdm__kv_fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_errmsg, sizeof t_errmsg, fmt, ap);
    va_end(ap);
    return status;
}

/* Appends str to t_errmsg at *pos, truncating. */
static void msg_append(size_t *pos, const char *str)
{
    size_t n = strlen(str), room = sizeof t_errmsg - 1 - *pos;
    if (n > room) n = room;
    memmove(t_errmsg + *pos, str, n);
    *pos += n;
    t_errmsg[*pos] = '\0';
}

int tdm__kv_fail_prefix(int status, const char *fn, const char *what)
{
    char tmp[TDM_ERRMSG_LEN];
    memcpy(tmp, t_errmsg, sizeof tmp);
    tmp[sizeof tmp - 1] = '\0';
    size_t pos = 0;
    t_errmsg[0] = '\0';
    msg_append(&pos, fn);
    msg_append(&pos, ": ");
    if (what) {
        msg_append(&pos, what);
        msg_append(&pos, ": ");
    }
    msg_append(&pos, tmp);
    return status;
}

size_t tdm_dtype_size(tdm_dtype dt)
{
    switch (dt) {
    case TDM_DTYPE_FP16: return 2;
    case TDM_DTYPE_BF16: return 2;
    case TDM_DTYPE_FP32: return 4;
    case TDM_DTYPE_FP8_E4M3: return 1;
    default: return 0;
    }
}

/* Unsigned 64-bit products that refuse to overflow int64. */
static int mul64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a && b > (uint64_t)INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

static int add64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (b > (uint64_t)INT64_MAX - a) return 0;
    *out = a + b;
    return 1;
}

/* The strides of a well-known kind (elements); 0 when they overflow. */
static int derive_strides(uint32_t kind, uint64_t n, uint64_t b, uint64_t h, uint64_t d,
                          int64_t st[4] /* kv, block, token, head */)
{
    uint64_t bhd, nbhd;
    if (!mul64(b, h, &bhd) || !mul64(bhd, d, &bhd) || !mul64(bhd, n, &nbhd) ||
        !mul64(nbhd, 2, &(uint64_t){0}))
        return 0;
    switch (kind) {
    case TDM_KV_LAYOUT_VLLM_NHD:
        st[3] = (int64_t)d; st[2] = (int64_t)(h * d); st[1] = (int64_t)bhd; st[0] = (int64_t)nbhd;
        return 1;
    case TDM_KV_LAYOUT_VLLM_HND:
        st[2] = (int64_t)d; st[3] = (int64_t)(b * d); st[1] = (int64_t)bhd; st[0] = (int64_t)nbhd;
        return 1;
    case TDM_KV_LAYOUT_FLASHINFER:
        st[3] = (int64_t)d; st[2] = (int64_t)(h * d); st[0] = (int64_t)bhd; st[1] = (int64_t)(2 * bhd);
        return 1;
    case TDM_KV_LAYOUT_FLASHINFER_HND:
        st[2] = (int64_t)d; st[3] = (int64_t)(b * d); st[0] = (int64_t)bhd; st[1] = (int64_t)(2 * bhd);
        return 1;
    default:
        return 0;
    }
}

int tdm_kv_layout_init(tdm_kv_layout *l, tdm_kv_layout_kind kind, uint32_t num_layers,
                       uint32_t num_blocks, uint32_t block_size, uint32_t num_kv_heads,
                       uint32_t head_dim, tdm_dtype dtype)
{
    if (!l) return tdm__kv_fail(TDM_E_INVAL, "tdm_kv_layout_init: layout is NULL");
    if (!num_layers || !num_blocks || !block_size || !num_kv_heads || !head_dim)
        return tdm__kv_fail(TDM_E_INVAL, "tdm_kv_layout_init: a dimension is zero "
                            "(layers %u, blocks %u, block_size %u, heads %u, head_dim %u)",
                            num_layers, num_blocks, block_size, num_kv_heads, head_dim);
    if (!tdm_dtype_size(dtype))
        return tdm__kv_fail(TDM_E_INVAL, "tdm_kv_layout_init: unknown dtype %d", (int)dtype);
    tdm_kv_layout t;
    memset(&t, 0, sizeof t);
    t.struct_size = sizeof t;
    t.kind = (uint32_t)kind;
    t.num_layers = num_layers;
    t.num_blocks = num_blocks;
    t.block_size = block_size;
    t.num_kv_heads = num_kv_heads;
    t.head_dim = head_dim;
    t.dtype = (uint32_t)dtype;
    if (kind != TDM_KV_LAYOUT_CUSTOM) {
        int64_t st[4];
        if ((unsigned)kind > TDM_KV_LAYOUT_FLASHINFER_HND)
            return tdm__kv_fail(TDM_E_INVAL, "tdm_kv_layout_init: unknown kind %d", (int)kind);
        if (!derive_strides(kind, num_blocks, block_size, num_kv_heads, head_dim, st))
            return tdm__kv_fail(TDM_E_INVAL, "tdm_kv_layout_init: layer size overflows");
        t.stride_kv = st[0];
        t.stride_block = st[1];
        t.stride_token = st[2];
        t.stride_head = st[3];
        size_t bytes;
        int rc = tdm_kv_layout_layer_bytes(&t, &bytes);
        if (rc) return rc;
    }
    *l = t;
    return TDM_OK;
}

/* Layer extent in elements (one past the last); 0 on overflow or overlap (msg set). */
static int layer_extent(const tdm_kv_layout *l, uint64_t *out)
{
    struct { uint64_t ext; int64_t stride; const char *name; } dims[4] = {
        {2, l->stride_kv, "stride_kv"},
        {l->num_blocks, l->stride_block, "stride_block"},
        {l->block_size, l->stride_token, "stride_token"},
        {l->num_kv_heads, l->stride_head, "stride_head"},
    };
    for (int i = 0; i < 4; i++)
        if (dims[i].stride < 0)
            return tdm__kv_fail(TDM_E_INVAL, "layout: %s is negative (%lld)", dims[i].name,
                                (long long)dims[i].stride);
    /* insertion sort by stride */
    for (int i = 1; i < 4; i++)
        for (int j = i; j > 0 && dims[j].stride < dims[j - 1].stride; j--) {
            __typeof__(dims[0]) tmp = dims[j];
            dims[j] = dims[j - 1];
            dims[j - 1] = tmp;
        }
    uint64_t span = l->head_dim;
    for (int i = 0; i < 4; i++) {
        if (dims[i].ext <= 1) continue;
        if ((uint64_t)dims[i].stride < span)
            return tdm__kv_fail(TDM_E_INVAL, "layout: %s (%lld) overlaps the %llu elements "
                                "spanned by the smaller strides", dims[i].name,
                                (long long)dims[i].stride, (unsigned long long)span);
        uint64_t add;
        if (!mul64(dims[i].ext - 1, (uint64_t)dims[i].stride, &add) || !add64(span, add, &span))
            return tdm__kv_fail(TDM_E_INVAL, "layout: layer extent overflows");
    }
    *out = span;
    return TDM_OK;
}

int tdm_kv_layout_validate(const tdm_kv_layout *l)
{
    if (!l) return tdm__kv_fail(TDM_E_INVAL, "layout is NULL");
    if (l->struct_size < sizeof(tdm_kv_layout))
        return tdm__kv_fail(TDM_E_INVAL, "layout: struct_size %u < %zu (call tdm_kv_layout_init)",
                            l->struct_size, sizeof(tdm_kv_layout));
    if (!l->num_layers || !l->num_blocks || !l->block_size || !l->num_kv_heads || !l->head_dim)
        return tdm__kv_fail(TDM_E_INVAL, "layout: a dimension is zero (layers %u, blocks %u, "
                            "block_size %u, heads %u, head_dim %u)", l->num_layers,
                            l->num_blocks, l->block_size, l->num_kv_heads, l->head_dim);
    if (!tdm_dtype_size((tdm_dtype)l->dtype))
        return tdm__kv_fail(TDM_E_INVAL, "layout: unknown dtype %u", l->dtype);
    if (l->kind > TDM_KV_LAYOUT_FLASHINFER_HND)
        return tdm__kv_fail(TDM_E_INVAL, "layout: unknown kind %u", l->kind);
    if (l->kind != TDM_KV_LAYOUT_CUSTOM) {
        int64_t st[4];
        if (!derive_strides(l->kind, l->num_blocks, l->block_size, l->num_kv_heads, l->head_dim, st))
            return tdm__kv_fail(TDM_E_INVAL, "layout: layer size overflows");
        if (st[0] != l->stride_kv || st[1] != l->stride_block || st[2] != l->stride_token ||
            st[3] != l->stride_head)
            return tdm__kv_fail(TDM_E_INVAL, "layout: strides do not match kind %u (use "
                                "TDM_KV_LAYOUT_CUSTOM for other strides)", l->kind);
    }
    uint64_t ext, bytes;
    int rc = layer_extent(l, &ext);
    if (rc) return rc;
    if (!mul64(ext, tdm_dtype_size((tdm_dtype)l->dtype), &bytes) || bytes > SIZE_MAX)
        return tdm__kv_fail(TDM_E_INVAL, "layout: layer size overflows");
    size_t bb;
    if (!tdm__mul_ok((size_t)2 * l->block_size, l->num_kv_heads, &bb) ||
        !tdm__mul_ok(bb, l->head_dim, &bb) ||
        !tdm__mul_ok(bb, tdm_dtype_size((tdm_dtype)l->dtype), &bb))
        return tdm__kv_fail(TDM_E_INVAL, "layout: block size in bytes overflows");
    return TDM_OK;
}

int tdm__kv_check_packed_desc(const tdm_kv_layout *l, const char *what)
{
    if (!l) return tdm__kv_fail(TDM_E_INVAL, "%s is NULL", what);
    if (l->struct_size < sizeof(tdm_kv_layout))
        return tdm__kv_fail(TDM_E_INVAL, "%s: struct_size %u < %zu", what, l->struct_size,
                            sizeof(tdm_kv_layout));
    if (!l->num_layers || !l->block_size || !l->num_kv_heads || !l->head_dim)
        return tdm__kv_fail(TDM_E_INVAL, "%s: a dimension is zero (layers %u, block_size %u, "
                            "heads %u, head_dim %u)", what, l->num_layers, l->block_size,
                            l->num_kv_heads, l->head_dim);
    if (!tdm_dtype_size((tdm_dtype)l->dtype))
        return tdm__kv_fail(TDM_E_INVAL, "%s: unknown dtype %u", what, l->dtype);
    size_t bb;
    if (!tdm__mul_ok((size_t)2 * l->block_size, l->num_kv_heads, &bb) ||
        !tdm__mul_ok(bb, l->head_dim, &bb) ||
        !tdm__mul_ok(bb, tdm_dtype_size((tdm_dtype)l->dtype), &bb))
        return tdm__kv_fail(TDM_E_INVAL, "%s: block size in bytes overflows", what);
    return TDM_OK;
}

int tdm_kv_layout_block_bytes(const tdm_kv_layout *l, size_t *bytes)
{
    int rc = tdm_kv_layout_validate(l);
    if (rc) return rc;
    if (!bytes) return tdm__kv_fail(TDM_E_INVAL, "tdm_kv_layout_block_bytes: bytes is NULL");
    *bytes = (size_t)2 * l->block_size * l->num_kv_heads * l->head_dim *
             tdm_dtype_size((tdm_dtype)l->dtype);
    return TDM_OK;
}

int tdm_kv_layout_layer_bytes(const tdm_kv_layout *l, size_t *bytes)
{
    int rc = tdm_kv_layout_validate(l);
    if (rc) return rc;
    if (!bytes) return tdm__kv_fail(TDM_E_INVAL, "tdm_kv_layout_layer_bytes: bytes is NULL");
    uint64_t ext;
    rc = layer_extent(l, &ext);
    if (rc) return rc;
    *bytes = (size_t)(ext * tdm_dtype_size((tdm_dtype)l->dtype));
    return TDM_OK;
}

int tdm_kv_packed_size(const tdm_kv_layout *l, uint32_t num_blocks, uint32_t layer_begin,
                       uint32_t layer_end, size_t *bytes)
{
    int rc = tdm__kv_check_packed_desc(l, "layout");
    if (rc) return rc;
    if (!bytes) return tdm__kv_fail(TDM_E_INVAL, "tdm_kv_packed_size: bytes is NULL");
    if (layer_begin >= layer_end || layer_end > l->num_layers)
        return tdm__kv_fail(TDM_E_INVAL, "layer range [%u, %u) is empty or beyond %u layers",
                            layer_begin, layer_end, l->num_layers);
    size_t bb = (size_t)2 * l->block_size * l->num_kv_heads * l->head_dim *
                tdm_dtype_size((tdm_dtype)l->dtype), total;
    if (!tdm__mul_ok(bb, num_blocks, &total) || !tdm__mul_ok(total, layer_end - layer_begin, &total))
        return tdm__kv_fail(TDM_E_INVAL, "packed size overflows");
    *bytes = total;
    return TDM_OK;
}

int tdm_kv_convert_opts_init(tdm_kv_convert_opts *o)
{
    if (!o) return tdm__kv_fail(TDM_E_INVAL, "tdm_kv_convert_opts_init: opts is NULL");
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    return TDM_OK;
}
