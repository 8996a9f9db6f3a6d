/*
 * kvx_msg.c -- encoding and decoding of the KV transfer protocol's header frames. Every
 * message is one msgpack array [version, type, fields...] (docs/protocol.md lists the fields
 * of each type). The decoder reads outside input: it is a small strict msgpack reader that
 * never allocates, bounds every length by the bytes left, limits nesting when skipping
 * unknown trailing fields, and range-checks every field before the caller sees it. The
 * encoder uses msgpack-c's packer with a write callback into a fixed buffer.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <msgpack.h>

#include "internal.h"
#include "kvx_msg.h"

/* ---- reader ------------------------------------------------------------------------------ */

typedef struct rd {
    const uint8_t *p, *end;
    char *why;
    size_t why_len;
} rd;

static int rd_fail(rd *r, const char *what)
{
    if (r->why && r->why_len) snprintf(r->why, r->why_len, "%s", what);
    return TDM_E_PROTOCOL;
}

static int rd_bytes(rd *r, size_t n, const uint8_t **out)
{
    if ((size_t)(r->end - r->p) < n) return rd_fail(r, "truncated message");
    *out = r->p;
    r->p += n;
    return TDM_OK;
}

static uint64_t be(const uint8_t *b, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v = (v << 8) | b[i];
    return v;
}

/* Reads an integer of any msgpack integer encoding. neg is set for negative values. */
static int rd_any_int(rd *r, uint64_t *u, int *neg)
{
    const uint8_t *b;
    if (rd_bytes(r, 1, &b)) return TDM_E_PROTOCOL;
    uint8_t t = b[0];
    *neg = 0;
    if (t <= 0x7f) { *u = t; return TDM_OK; }
    if (t >= 0xe0) { *neg = 1; *u = (uint64_t)(int64_t)(int8_t)t; return TDM_OK; }
    size_t n;
    int is_signed;
    switch (t) {
    case 0xcc: n = 1; is_signed = 0; break;
    case 0xcd: n = 2; is_signed = 0; break;
    case 0xce: n = 4; is_signed = 0; break;
    case 0xcf: n = 8; is_signed = 0; break;
    case 0xd0: n = 1; is_signed = 1; break;
    case 0xd1: n = 2; is_signed = 1; break;
    case 0xd2: n = 4; is_signed = 1; break;
    case 0xd3: n = 8; is_signed = 1; break;
    default: return rd_fail(r, "expected an integer");
    }
    if (rd_bytes(r, n, &b)) return TDM_E_PROTOCOL;
    uint64_t v = be(b, n);
    if (is_signed) {
        int64_t s;
        if (n == 1) s = (int8_t)v;
        else if (n == 2) s = (int16_t)v;
        else if (n == 4) s = (int32_t)v;
        else s = (int64_t)v;
        if (s < 0) { *neg = 1; *u = (uint64_t)s; return TDM_OK; }
        v = (uint64_t)s;
    }
    *u = v;
    return TDM_OK;
}

static int rd_u64(rd *r, uint64_t *v)
{
    int neg;
    if (rd_any_int(r, v, &neg)) return TDM_E_PROTOCOL;
    if (neg) return rd_fail(r, "negative value where an unsigned one is expected");
    return TDM_OK;
}

static int rd_u32max(rd *r, uint32_t *v, uint64_t max, const char *name)
{
    uint64_t u;
    if (rd_u64(r, &u)) return TDM_E_PROTOCOL;
    if (u > max) {
        if (r->why && r->why_len) snprintf(r->why, r->why_len, "field %s out of range", name);
        return TDM_E_PROTOCOL;
    }
    *v = (uint32_t)u;
    return TDM_OK;
}

static int rd_i64(rd *r, int64_t *v)
{
    uint64_t u;
    int neg;
    if (rd_any_int(r, &u, &neg)) return TDM_E_PROTOCOL;
    if (!neg && u > (uint64_t)INT64_MAX) return rd_fail(r, "integer exceeds int64");
    *v = (int64_t)u;
    return TDM_OK;
}

static int rd_array(rd *r, uint32_t *n)
{
    const uint8_t *b;
    if (rd_bytes(r, 1, &b)) return TDM_E_PROTOCOL;
    if ((b[0] & 0xf0) == 0x90) { *n = b[0] & 0x0f; return TDM_OK; }
    if (b[0] == 0xdc) { if (rd_bytes(r, 2, &b)) return TDM_E_PROTOCOL; *n = (uint32_t)be(b, 2); }
    else if (b[0] == 0xdd) { if (rd_bytes(r, 4, &b)) return TDM_E_PROTOCOL; *n = (uint32_t)be(b, 4); }
    else return rd_fail(r, "expected an array");
    /* every element takes at least one byte */
    if (*n > (size_t)(r->end - r->p)) return rd_fail(r, "array longer than the message");
    return TDM_OK;
}

/* A string (str or bin) copied NUL-terminated into dst[cap]; printable ASCII only when ident. */
static int rd_str(rd *r, char *dst, size_t cap, int ident, const char *name)
{
    const uint8_t *b;
    if (rd_bytes(r, 1, &b)) return TDM_E_PROTOCOL;
    size_t n;
    uint8_t t = b[0];
    if ((t & 0xe0) == 0xa0) n = t & 0x1f;
    else if (t == 0xd9 || t == 0xc4) { if (rd_bytes(r, 1, &b)) return TDM_E_PROTOCOL; n = b[0]; }
    else if (t == 0xda || t == 0xc5) { if (rd_bytes(r, 2, &b)) return TDM_E_PROTOCOL; n = (size_t)be(b, 2); }
    else if (t == 0xdb || t == 0xc6) { if (rd_bytes(r, 4, &b)) return TDM_E_PROTOCOL; n = (size_t)be(b, 4); }
    else {
        if (r->why && r->why_len) snprintf(r->why, r->why_len, "field %s: expected a string", name);
        return TDM_E_PROTOCOL;
    }
    if (rd_bytes(r, n, &b)) return TDM_E_PROTOCOL;
    if (n >= cap) {
        if (r->why && r->why_len) snprintf(r->why, r->why_len, "field %s too long (%zu bytes)", name, n);
        return TDM_E_PROTOCOL;
    }
    for (size_t i = 0; i < n; i++) {
        if (b[i] == 0 || (ident && (b[i] < 0x21 || b[i] > 0x7e))) {
            if (r->why && r->why_len)
                snprintf(r->why, r->why_len, "field %s has a forbidden character", name);
            return TDM_E_PROTOCOL;
        }
    }
    memcpy(dst, b, n);
    dst[n] = '\0';
    return TDM_OK;
}

/* Skips one object of any type (for unknown trailing fields), nesting at most `depth`. */
static int rd_skip(rd *r, int depth)
{
    if (depth <= 0) return rd_fail(r, "nesting too deep");
    const uint8_t *b;
    if (r->p >= r->end) return rd_fail(r, "truncated message");
    uint8_t t = *r->p;
    uint64_t u;
    int neg;
    if (t <= 0x7f || t >= 0xe0 || (t >= 0xcc && t <= 0xd3)) return rd_any_int(r, &u, &neg);
    r->p++;
    size_t n = 0, hdr = 0;
    uint64_t elems = 0;
    int is_map = 0;
    if (t == 0xc0 || t == 0xc2 || t == 0xc3) return TDM_OK;
    if (t == 0xca) n = 4;
    else if (t == 0xcb) n = 8;
    else if ((t & 0xe0) == 0xa0) n = t & 0x1f;
    else if (t == 0xd9 || t == 0xc4) hdr = 1;
    else if (t == 0xda || t == 0xc5) hdr = 2;
    else if (t == 0xdb || t == 0xc6) hdr = 4;
    else if (t == 0xd4) n = 2;
    else if (t == 0xd5) n = 3;
    else if (t == 0xd6) n = 5;
    else if (t == 0xd7) n = 9;
    else if (t == 0xd8) n = 17;
    else if (t == 0xc7 || t == 0xc8 || t == 0xc9) {
        size_t lh = t == 0xc7 ? 1 : t == 0xc8 ? 2 : 4;
        if (rd_bytes(r, lh, &b)) return TDM_E_PROTOCOL;
        n = (size_t)be(b, lh) + 1;
    } else if ((t & 0xf0) == 0x90) elems = t & 0x0f;
    else if ((t & 0xf0) == 0x80) { elems = t & 0x0f; is_map = 1; }
    else if (t == 0xdc || t == 0xde) {
        if (rd_bytes(r, 2, &b)) return TDM_E_PROTOCOL;
        elems = be(b, 2); is_map = t == 0xde;
    } else if (t == 0xdd || t == 0xdf) {
        if (rd_bytes(r, 4, &b)) return TDM_E_PROTOCOL;
        elems = be(b, 4); is_map = t == 0xdf;
    } else return rd_fail(r, "invalid msgpack type byte");
    if (hdr) {
        if (rd_bytes(r, hdr, &b)) return TDM_E_PROTOCOL;
        n = (size_t)be(b, hdr);
    }
    if (n) return rd_bytes(r, n, &b);
    if (is_map) elems *= 2;
    if (elems > (uint64_t)(r->end - r->p)) return rd_fail(r, "container longer than the message");
    for (uint64_t i = 0; i < elems; i++)
        if (rd_skip(r, depth - 1)) return TDM_E_PROTOCOL;
    return TDM_OK;
}

/* ---- layouts ----------------------------------------------------------------------------- */

int tdm__kvx_layout_check(const tdm_kv_layout *l, char *why, size_t why_len)
{
#define LFAIL(...) do { if (why && why_len) snprintf(why, why_len, __VA_ARGS__); return TDM_E_INVAL; } while (0)
    if (!l) LFAIL("layout is NULL");
    if (l->num_layers == 0 || l->num_layers > TDM__KVX_MAX_LAYERS) LFAIL("num_layers %u out of range", l->num_layers);
    if (l->num_blocks == 0 || l->num_blocks > TDM__KVX_MAX_BLOCKS) LFAIL("num_blocks %u out of range", l->num_blocks);
    if (l->block_size == 0 || l->block_size > 4096) LFAIL("block_size %u out of range", l->block_size);
    if (l->num_kv_heads == 0 || l->num_kv_heads > 1024) LFAIL("num_kv_heads %u out of range", l->num_kv_heads);
    if (l->head_dim == 0 || l->head_dim > 4096) LFAIL("head_dim %u out of range", l->head_dim);
    if (l->dtype < TDM_DTYPE_FP16 || l->dtype > TDM_DTYPE_FP8_E4M3) LFAIL("unknown dtype %u", l->dtype);
    if (l->kind > TDM_KV_LAYOUT_FLASHINFER_HND) LFAIL("unknown layout kind %u", l->kind);
    if (l->stride_kv < 0 || l->stride_block < 0 || l->stride_token < 0 || l->stride_head < 0)
        LFAIL("negative stride");
    const int64_t lim = (int64_t)1 << 40;
    if (l->stride_kv > lim || l->stride_block > lim || l->stride_token > lim || l->stride_head > lim)
        LFAIL("stride too large");
    if (tdm_kv_layout_validate(l) != TDM_OK) LFAIL("%s", tdm_kv_errmsg());
    return TDM_OK;
#undef LFAIL
}

static int rd_layout(rd *r, tdm_kv_layout *l)
{
    uint32_t n;
    if (rd_array(r, &n)) return TDM_E_PROTOCOL;
    if (n != 11) return rd_fail(r, "layout must have 11 fields");
    memset(l, 0, sizeof(*l));
    l->struct_size = sizeof(*l);
    if (rd_u32max(r, &l->kind, 255, "layout.kind") || rd_u32max(r, &l->num_layers, UINT32_MAX, "layout.num_layers") ||
        rd_u32max(r, &l->num_blocks, UINT32_MAX, "layout.num_blocks") ||
        rd_u32max(r, &l->block_size, UINT32_MAX, "layout.block_size") ||
        rd_u32max(r, &l->num_kv_heads, UINT32_MAX, "layout.num_kv_heads") ||
        rd_u32max(r, &l->head_dim, UINT32_MAX, "layout.head_dim") || rd_u32max(r, &l->dtype, 255, "layout.dtype") ||
        rd_i64(r, &l->stride_kv) || rd_i64(r, &l->stride_block) || rd_i64(r, &l->stride_token) ||
        rd_i64(r, &l->stride_head))
        return TDM_E_PROTOCOL;
    char why[96];
    if (tdm__kvx_layout_check(l, why, sizeof(why)) != TDM_OK) {
        if (r->why && r->why_len) snprintf(r->why, r->why_len, "bad layout: %s", why);
        return TDM_E_PROTOCOL;
    }
    return TDM_OK;
}

/* A bin (or str): *b points at its n bytes inside the message (no copy). */
static int rd_bin_view(rd *r, const uint8_t **out, size_t *n, const char *name)
{
    const uint8_t *b;
    if (rd_bytes(r, 1, &b)) return TDM_E_PROTOCOL;
    size_t len;
    uint8_t t = b[0];
    if ((t & 0xe0) == 0xa0) len = t & 0x1f;
    else if (t == 0xd9 || t == 0xc4) { if (rd_bytes(r, 1, &b)) return TDM_E_PROTOCOL; len = b[0]; }
    else if (t == 0xda || t == 0xc5) { if (rd_bytes(r, 2, &b)) return TDM_E_PROTOCOL; len = (size_t)be(b, 2); }
    else if (t == 0xdb || t == 0xc6) { if (rd_bytes(r, 4, &b)) return TDM_E_PROTOCOL; len = (size_t)be(b, 4); }
    else {
        if (r->why && r->why_len) snprintf(r->why, r->why_len, "field %s: expected bytes", name);
        return TDM_E_PROTOCOL;
    }
    if (rd_bytes(r, len, out)) return TDM_E_PROTOCOL;
    *n = len;
    return TDM_OK;
}

/* A bin (or str) of n bytes copied into dst[cap]; *n receives its length. */
static int rd_bin(rd *r, uint8_t *dst, size_t cap, size_t *n, const char *name)
{
    const uint8_t *b;
    size_t len;
    if (rd_bin_view(r, &b, &len, name)) return TDM_E_PROTOCOL;
    if (len > cap) {
        if (r->why && r->why_len) snprintf(r->why, r->why_len, "field %s too long", name);
        return TDM_E_PROTOCOL;
    }
    memcpy(dst, b, len);
    *n = len;
    return TDM_OK;
}

static float le_float(const uint8_t *b)
{
    uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

float tdm__kvx_hello_scale(const tdm__kvx_hello *h, int kv, uint32_t i)
{
    if (h->k_scales_le) return le_float((kv ? h->v_scales_le : h->k_scales_le) + 4 * (size_t)i);
    return (kv ? h->v_scales : h->k_scales)[i];
}

/* The optional KV scale fields of a HELLO: kind, K scales, V scales (bins of little-endian
 * float32, layout.num_layers * (1 or num_kv_heads) each, every one finite and > 0). */
static int rd_hello_scales(rd *r, tdm__kvx_hello *h)
{
    uint32_t kind;
    const uint8_t *kb, *vb;
    size_t kn, vn;
    if (rd_u32max(r, &kind, TDM_KV_SCALE_HEAD, "kv_scale_kind") || rd_bin_view(r, &kb, &kn, "k_scales") ||
        rd_bin_view(r, &vb, &vn, "v_scales"))
        return TDM_E_PROTOCOL;
    if (kind == TDM_KV_SCALE_NONE) {
        if (kn || vn) return rd_fail(r, "kv scales given with kv_scale_kind 0 (none)");
        return TDM_OK;
    }
    if (h->layout.dtype != TDM_DTYPE_FP8_E4M3) return rd_fail(r, "kv scales given for a cache that is not fp8-e4m3");
    uint32_t per = kind == TDM_KV_SCALE_TENSOR ? 1 : h->layout.num_kv_heads;
    uint64_t count = (uint64_t)h->layout.num_layers * per;
    if (count > TDM__KVX_MAX_SCALES) return rd_fail(r, "too many kv scales");
    if (kn != 4 * count || vn != 4 * count) {
        if (r->why && r->why_len)
            snprintf(r->why, r->why_len, "kv scales: %zu and %zu bytes, expected %llu floats each (%u layers x %u)",
                     kn, vn, (unsigned long long)count, h->layout.num_layers, per);
        return TDM_E_PROTOCOL;
    }
    for (uint32_t i = 0; i < (uint32_t)count; i++)
        for (int kv = 0; kv < 2; kv++) {
            float f = le_float((kv ? vb : kb) + 4 * (size_t)i);
            if (!isfinite(f) || !(f > 0.0f)) {
                if (r->why && r->why_len)
                    snprintf(r->why, r->why_len, "kv scale %s[%u] = %g is not finite and > 0", kv ? "v" : "k", i,
                             (double)f);
                return TDM_E_PROTOCOL;
            }
        }
    h->scale_kind = kind;
    h->scale_count = per;
    h->k_scales_le = kb;
    h->v_scales_le = vb;
    return TDM_OK;
}

/* n decimal digits without a leading zero (1..10 of them), value into *v. */
static const char *name_num(const char *s, uint64_t *v)
{
    uint64_t x = 0;
    int n = 0;
    if (*s == '0' && s[1] >= '0' && s[1] <= '9') return NULL;
    while (*s >= '0' && *s <= '9' && n < 11) { x = 10 * x + (uint64_t)(*s++ - '0'); n++; }
    if (n == 0 || n > 10) return NULL;
    *v = x;
    return s;
}

int tdm__kvx_shm_name_parse(const char *name, int kind, uint64_t *ns, uint64_t *pid)
{
    static const char pre[] = "/tdm-kvx-";
    uint64_t a, b, seq;
    if (!name || strlen(name) >= TDM__KVX_ID_LEN || strncmp(name, pre, sizeof(pre) - 1)) return 0;
    const char *s = name_num(name + sizeof(pre) - 1, &a);
    if (!s || *s++ != '-' || !(s = name_num(s, &b)) || *s++ != '-' || b == 0) return 0;
    if (s[0] == 'k' && s[1] == 'v' && (kind == 0 || kind == 'k')) s += 2;
    else if (s[0] == 't' && s[1] == 'x' && (kind == 0 || kind == 't')) {
        if (!(s = name_num(s + 2, &seq))) return 0;
    } else return 0;
    if (*s++ != '-') return 0;
    for (int i = 0; i < 16; i++, s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))) return 0;
    if (*s) return 0;
    if (ns) *ns = a;
    if (pid) *pid = b;
    return 1;
}

static uint64_t le_u64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

uint64_t tdm__kvx_hello_nixl_u64(const tdm__kvx_hello *h, uint32_t i)
{
    if (!h->nixl_rgn || 8 * ((size_t)i + 1) > h->nixl_rgn_len) return 0;
    return le_u64(h->nixl_rgn + 8 * (size_t)i);
}

/* The optional NIXL fields of a HELLO: agent name, agent metadata (bin), region table (bin of
 * little-endian u64: mem_kind, dev_id, ring address, slot bytes, slots, one base per layer). */
static int rd_hello_nixl(rd *r, tdm__kvx_hello *h)
{
    const uint8_t *md, *rg;
    size_t mn, rn;
    if (rd_str(r, h->nixl_agent, sizeof(h->nixl_agent), 1, "nixl_agent") || rd_bin_view(r, &md, &mn, "nixl_md") ||
        rd_bin_view(r, &rg, &rn, "nixl_regions"))
        return TDM_E_PROTOCOL;
    if (!h->nixl_agent[0]) {
        if (mn || rn) return rd_fail(r, "NIXL fields without an agent name");
        return TDM_OK;
    }
    if (mn == 0 || mn > TDM__KVX_MAX_NIXL_MD) return rd_fail(r, "NIXL metadata empty or too large");
    if (rn != 8 * ((size_t)TDM__KVX_NIXL_RGN_HDR + h->layout.num_layers))
        return rd_fail(r, "NIXL region table does not have one base per layer");
    uint64_t mem = le_u64(rg), ring = le_u64(rg + 16), sb = le_u64(rg + 24), slots = le_u64(rg + 32);
    if (mem > TDM_MEM_CUDA) return rd_fail(r, "NIXL region table: unknown memory kind");
    if (sb < 4096 || sb > ((uint64_t)1 << 30) || slots == 0 || slots > 1024)
        return rd_fail(r, "NIXL region table: ring slot size or count out of range");
    if (ring == 0 || ring > UINT64_MAX - sb * slots) return rd_fail(r, "NIXL region table: bad ring address");
    for (uint32_t l = 0; l < h->layout.num_layers; l++)
        if (le_u64(rg + 8 * ((size_t)TDM__KVX_NIXL_RGN_HDR + l)) == 0) return rd_fail(r, "NIXL region table: a NULL layer base");
    h->nixl_md = md;
    h->nixl_md_len = (uint32_t)mn;
    h->nixl_rgn = rg;
    h->nixl_rgn_len = (uint32_t)rn;
    return TDM_OK;
}

/* The optional shared-KV fields of a HELLO: name, size, offsets (bin of u64 little-endian). */
static int rd_hello_kv(rd *r, tdm__kvx_hello *h)
{
    uint8_t raw[8 * TDM__KVX_MAX_KV_LAYERS];
    size_t n;
    if (rd_str(r, h->kv_name, sizeof(h->kv_name), 1, "kv_name") || rd_u64(r, &h->kv_size) ||
        rd_bin(r, raw, sizeof(raw), &n, "kv_offsets"))
        return TDM_E_PROTOCOL;
    if (!h->kv_name[0]) {
        if (h->kv_size || n) return rd_fail(r, "shared KV fields without a name");
        return TDM_OK;
    }
    if (!tdm__kvx_shm_name_parse(h->kv_name, 'k', NULL, NULL))
        return rd_fail(r, "shared KV name is not an engine-generated one (/tdm-kvx-NS-PID-kv-RAND)");
    if (h->kv_size == 0 || h->kv_size > ((uint64_t)1 << 40) || n != 8u * h->layout.num_layers)
        return rd_fail(r, "bad shared KV offer");
    h->kv_layers = h->layout.num_layers;
    for (uint32_t l = 0; l < h->kv_layers; l++) {
        uint64_t v = 0;
        for (int i = 7; i >= 0; i--) v = (v << 8) | raw[8 * l + (uint32_t)i];
        if (v >= h->kv_size) return rd_fail(r, "shared KV offset beyond the segment");
        h->kv_off[l] = v;
    }
    return TDM_OK;
}

static int rd_hello(rd *r, tdm__kvx_hello *h)
{
    uint64_t shm_size;
    if (rd_str(r, h->engine_id, sizeof(h->engine_id), 1, "engine_id") ||
        rd_u32max(r, &h->role, 2, "role") || rd_layout(r, &h->layout) ||
        rd_u32max(r, &h->mem_kind, 1, "mem_kind") ||
        rd_u32max(r, &h->head_offset, 1u << 20, "head_offset") ||
        rd_u32max(r, &h->transports, 0xffff, "transports") ||
        rd_str(r, h->host_id, sizeof(h->host_id), 1, "host_id") ||
        rd_str(r, h->shm_name, sizeof(h->shm_name), 1, "shm_name") || rd_u64(r, &shm_size) ||
        rd_u32max(r, &h->slot_bytes, 1u << 30, "slot_bytes"))
        return TDM_E_PROTOCOL;
    if (h->engine_id[0] == '\0') return rd_fail(r, "empty engine_id");
    if (shm_size > ((uint64_t)1 << 36)) return rd_fail(r, "shm_size out of range");
    h->shm_size = shm_size;
    if (!h->shm_name[0]) return TDM_OK;   /* no segment offered: size and slot_bytes unused */
    if (!tdm__kvx_shm_name_parse(h->shm_name, 't', NULL, NULL))
        return rd_fail(r, "shared-memory name is not an engine-generated one (/tdm-kvx-NS-PID-txSEQ-RAND)");
    if (h->slot_bytes == 0 || shm_size % h->slot_bytes || shm_size / h->slot_bytes == 0 ||
        shm_size / h->slot_bytes > TDM__KVX_MAX_SHM_SLOTS)
        return rd_fail(r, "shm_size is not 1..1024 slots of slot_bytes");
    return TDM_OK;
}

/* Fields after version and type, per message type (minimum count). */
static const uint8_t min_fields[TDM__KVX_MSG_MAX + 1] = {
    [TDM__KVX_HELLO] = 10, [TDM__KVX_HELLO_ACK] = 12, [TDM__KVX_XFER_REQ] = 6,
    [TDM__KVX_DATA] = 10, [TDM__KVX_CREDIT] = 1, [TDM__KVX_DONE] = 3, [TDM__KVX_FAIL] = 5,
    [TDM__KVX_CANCEL] = 3, [TDM__KVX_CANCEL_ACK] = 3, [TDM__KVX_PING] = 1, [TDM__KVX_BYE] = 1,
};

int tdm__kvx_msg_decode(const void *buf, size_t len, tdm__kvx_msg *m, char *why, size_t why_len)
{
    rd r = { (const uint8_t *)buf, (const uint8_t *)buf + len, why, why_len };
    if (!buf || !m) return rd_fail(&r, "no message");
    if (len > TDM__KVX_MAX_HELLO) return rd_fail(&r, "header frame too large");
    memset(m, 0, sizeof(*m));
    uint32_t n;
    if (rd_array(&r, &n)) return TDM_E_PROTOCOL;
    if (n < 2) return rd_fail(&r, "message array shorter than [version, type]");
    if (rd_u32max(&r, &m->version, UINT32_MAX, "version")) return TDM_E_PROTOCOL;
    if (m->version != TDM_KVX_PROTOCOL_VERSION) {
        if (why && why_len) snprintf(why, why_len, "protocol version %u (we speak %u)", m->version,
                                     TDM_KVX_PROTOCOL_VERSION);
        return TDM_E_VERSION;
    }
    if (rd_u32max(&r, &m->type, 255, "type")) return TDM_E_PROTOCOL;
    if (m->type == 0 || m->type > TDM__KVX_MSG_MAX) return rd_fail(&r, "unknown message type");
    if (len > TDM__KVX_MAX_HEADER && m->type != TDM__KVX_HELLO && m->type != TDM__KVX_HELLO_ACK)
        return rd_fail(&r, "header frame too large");
    uint32_t nf = n - 2;
    if (nf < min_fields[m->type]) return rd_fail(&r, "too few fields for the message type");
    int rc = TDM_OK;
    int64_t st;
    uint32_t parsed = min_fields[m->type];
    switch (m->type) {
    case TDM__KVX_HELLO:
        rc = rd_hello(&r, &m->hello);
        if (!rc && nf >= parsed + 3) { rc = rd_hello_kv(&r, &m->hello); parsed += 3; }
        if (!rc && nf >= parsed + 3) { rc = rd_hello_scales(&r, &m->hello); parsed += 3; }
        if (!rc && nf >= parsed + 3) { rc = rd_hello_nixl(&r, &m->hello); parsed += 3; }
        break;
    case TDM__KVX_HELLO_ACK:
        rc = rd_i64(&r, &st);
        if (!rc && (st > 0 || st < -1000)) rc = rd_fail(&r, "status out of range");
        if (!rc) m->status = (int32_t)st;
        if (!rc) rc = rd_str(&r, m->reason, sizeof(m->reason), 0, "reason");
        if (!rc) rc = rd_hello(&r, &m->hello);
        if (!rc && nf >= parsed + 3) { rc = rd_hello_kv(&r, &m->hello); parsed += 3; }
        if (!rc && nf >= parsed + 3) { rc = rd_hello_scales(&r, &m->hello); parsed += 3; }
        if (!rc && nf >= parsed + 3) { rc = rd_hello_nixl(&r, &m->hello); parsed += 3; }
        break;
    case TDM__KVX_XFER_REQ:
        rc = rd_u64(&r, &m->rid);
        if (!rc) rc = rd_u64(&r, &m->xid);
        if (!rc) rc = rd_u32max(&r, &m->mode, 0x1ff, "mode");
        if (!rc && ((m->mode & 0xff) == 0 || (m->mode & 0xff) > 2))
            rc = rd_fail(&r, "bad mode");
        if (!rc) rc = rd_u32max(&r, &m->num_blocks, TDM__KVX_MAX_BLOCKS, "num_blocks");
        if (!rc) rc = rd_u32max(&r, &m->num_skip, TDM__KVX_MAX_BLOCKS, "num_skip");
        if (!rc) rc = rd_u32max(&r, &m->num_tokens, UINT32_MAX, "num_tokens");
        if (!rc && (m->num_blocks == 0 || m->num_skip > m->num_blocks ||
                    m->num_tokens == 0 || m->num_tokens > (uint64_t)m->num_blocks * 4096))
            rc = rd_fail(&r, "bad transfer request counts");
        break;
    case TDM__KVX_DATA:
        rc = rd_u64(&r, &m->rid);
        if (!rc) rc = rd_u64(&r, &m->xid);
        if (!rc) rc = rd_u32max(&r, &m->seq, UINT32_MAX, "seq");
        if (!rc) rc = rd_u32max(&r, &m->layer_begin, TDM__KVX_MAX_LAYERS, "layer_begin");
        if (!rc) rc = rd_u32max(&r, &m->layer_end, TDM__KVX_MAX_LAYERS, "layer_end");
        if (!rc) rc = rd_u32max(&r, &m->block_begin, TDM__KVX_MAX_BLOCKS, "block_begin");
        if (!rc) rc = rd_u32max(&r, &m->block_count, TDM__KVX_MAX_BLOCKS, "block_count");
        if (!rc) rc = rd_u64(&r, &m->nbytes);
        if (!rc) rc = rd_u32max(&r, &m->slot, UINT32_MAX, "slot");
        if (!rc) rc = rd_u32max(&r, &m->num_tokens, UINT32_MAX, "tokens");
        if (!rc && (m->layer_begin >= m->layer_end || m->block_count == 0 ||
                    m->nbytes == 0 || m->nbytes > ((uint64_t)1 << 32) || m->num_tokens == 0))
            rc = rd_fail(&r, "bad data chunk ranges");
        break;
    case TDM__KVX_CREDIT:
        rc = rd_u32max(&r, &m->slot, 1u << 20, "slot");
        break;
    case TDM__KVX_DONE:
        rc = rd_u64(&r, &m->rid);
        if (!rc) rc = rd_u64(&r, &m->xid);
        if (!rc) rc = rd_u64(&r, &m->nbytes);
        break;
    case TDM__KVX_FAIL:
        rc = rd_u64(&r, &m->rid);
        if (!rc) rc = rd_u64(&r, &m->xid);
        if (!rc) rc = rd_u32max(&r, &m->to_side, 2, "to_side");
        if (!rc) rc = rd_i64(&r, &st);
        if (!rc && (st >= 0 || st < -1000)) rc = rd_fail(&r, "status out of range");
        if (!rc) m->status = (int32_t)st;
        if (!rc) rc = rd_str(&r, m->reason, sizeof(m->reason), 0, "reason");
        if (!rc && m->to_side == 0) rc = rd_fail(&r, "to_side must be 1 or 2");
        break;
    case TDM__KVX_CANCEL:
    case TDM__KVX_CANCEL_ACK:
        rc = rd_u64(&r, &m->rid);
        if (!rc) rc = rd_u64(&r, &m->xid);
        if (!rc) rc = rd_u32max(&r, &m->to_side, 2, "to_side");
        if (!rc && m->to_side == 0) rc = rd_fail(&r, "to_side must be 1 or 2");
        break;
    case TDM__KVX_PING:
        rc = rd_u64(&r, &m->time_ms);
        break;
    case TDM__KVX_BYE:
        rc = rd_str(&r, m->reason, sizeof(m->reason), 0, "reason");
        break;
    }
    if (rc) return rc;
    for (uint32_t i = parsed; i < nf; i++)
        if (rd_skip(&r, 8)) return TDM_E_PROTOCOL;
    if (r.p != r.end) return rd_fail(&r, "trailing bytes after the message");
    return TDM_OK;
}

/* ---- writer ------------------------------------------------------------------------------ */

typedef struct wr {
    uint8_t *buf;
    size_t cap, len;
    int overflow;
} wr;

static int wr_cb(void *data, const char *b, size_t n)
{
    wr *w = data;
    if (w->overflow || n > w->cap - w->len) { w->overflow = 1; return -1; }
    memcpy(w->buf + w->len, b, n);
    w->len += n;
    return 0;
}

static void pk_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pk_hello(msgpack_packer *pk, const tdm__kvx_hello *h)
{
    const tdm_kv_layout *l = &h->layout;
    pk_str(pk, h->engine_id);
    msgpack_pack_uint32(pk, h->role);
    msgpack_pack_array(pk, 11);
    msgpack_pack_uint32(pk, l->kind);
    msgpack_pack_uint32(pk, l->num_layers);
    msgpack_pack_uint32(pk, l->num_blocks);
    msgpack_pack_uint32(pk, l->block_size);
    msgpack_pack_uint32(pk, l->num_kv_heads);
    msgpack_pack_uint32(pk, l->head_dim);
    msgpack_pack_uint32(pk, l->dtype);
    msgpack_pack_int64(pk, l->stride_kv);
    msgpack_pack_int64(pk, l->stride_block);
    msgpack_pack_int64(pk, l->stride_token);
    msgpack_pack_int64(pk, l->stride_head);
    msgpack_pack_uint32(pk, h->mem_kind);
    msgpack_pack_uint32(pk, h->head_offset);
    msgpack_pack_uint32(pk, h->transports);
    pk_str(pk, h->host_id);
    pk_str(pk, h->shm_name);
    msgpack_pack_uint64(pk, h->shm_size);
    msgpack_pack_uint32(pk, h->slot_bytes);
}

static void pk_hello_kv(msgpack_packer *pk, const tdm__kvx_hello *h)
{
    uint8_t raw[8 * TDM__KVX_MAX_KV_LAYERS];
    uint32_t n = h->kv_name[0] ? TDM_MIN(h->kv_layers, TDM__KVX_MAX_KV_LAYERS) : 0;
    for (uint32_t l = 0; l < n; l++)
        for (int i = 0; i < 8; i++) raw[8 * l + (uint32_t)i] = (uint8_t)(h->kv_off[l] >> (8 * i));
    pk_str(pk, h->kv_name);
    msgpack_pack_uint64(pk, h->kv_name[0] ? h->kv_size : 0);
    msgpack_pack_bin(pk, 8 * n);
    msgpack_pack_bin_body(pk, raw, 8 * n);
}

/* Written only when NIXL is offered (after the scale fields, kind 0 if none). */
static void pk_hello_nixl(msgpack_packer *pk, const tdm__kvx_hello *h)
{
    pk_str(pk, h->nixl_agent);
    msgpack_pack_bin(pk, h->nixl_md_len);
    if (h->nixl_md_len) msgpack_pack_bin_body(pk, h->nixl_md, h->nixl_md_len);
    msgpack_pack_bin(pk, h->nixl_rgn_len);
    if (h->nixl_rgn_len) msgpack_pack_bin_body(pk, h->nixl_rgn, h->nixl_rgn_len);
}

/* Written only when the kind is not NONE or NIXL fields follow, so that a HELLO without
 * either stays as before. */
static void pk_hello_scales(msgpack_packer *pk, const tdm__kvx_hello *h)
{
    uint32_t n = h->scale_kind == TDM_KV_SCALE_NONE ? 0 : h->layout.num_layers * h->scale_count;
    msgpack_pack_uint32(pk, h->scale_kind);
    for (int kv = 0; kv < 2; kv++) {
        msgpack_pack_bin(pk, 4 * n);
        for (uint32_t i = 0; i < n; i++) {
            float f = tdm__kvx_hello_scale(h, kv, i);
            uint32_t u;
            memcpy(&u, &f, sizeof(u));
            uint8_t b[4] = { (uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24) };
            msgpack_pack_bin_body(pk, b, 4);
        }
    }
}

void tdm__kvx_msg_init(tdm__kvx_msg *m, uint32_t type)
{
    memset(m, 0, sizeof(*m));
    m->version = TDM_KVX_PROTOCOL_VERSION;
    m->type = type;
}

int tdm__kvx_msg_encode(const tdm__kvx_msg *m, void *buf, size_t cap, size_t *len)
{
    wr w = { buf, cap, 0, 0 };
    msgpack_packer pk;
    msgpack_packer_init(&pk, &w, wr_cb);
    uint32_t nf = m->type <= TDM__KVX_MSG_MAX ? min_fields[m->type] : 0;
    int hello = m->type == TDM__KVX_HELLO || m->type == TDM__KVX_HELLO_ACK;
    int nixl = hello && m->hello.nixl_agent[0];
    int scales = hello && (m->hello.scale_kind != TDM_KV_SCALE_NONE || nixl);
    if (hello) nf += 3 + (scales ? 3 : 0) + (nixl ? 3 : 0);
    msgpack_pack_array(&pk, 2 + nf);
    msgpack_pack_uint32(&pk, m->version);
    msgpack_pack_uint32(&pk, m->type);
    switch (m->type) {
    case TDM__KVX_HELLO:
        pk_hello(&pk, &m->hello);
        pk_hello_kv(&pk, &m->hello);
        if (scales) pk_hello_scales(&pk, &m->hello);
        if (nixl) pk_hello_nixl(&pk, &m->hello);
        break;
    case TDM__KVX_HELLO_ACK:
        msgpack_pack_int32(&pk, m->status);
        pk_str(&pk, m->reason);
        pk_hello(&pk, &m->hello);
        pk_hello_kv(&pk, &m->hello);
        if (scales) pk_hello_scales(&pk, &m->hello);
        if (nixl) pk_hello_nixl(&pk, &m->hello);
        break;
    case TDM__KVX_XFER_REQ:
        msgpack_pack_uint64(&pk, m->rid);
        msgpack_pack_uint64(&pk, m->xid);
        msgpack_pack_uint32(&pk, m->mode);
        msgpack_pack_uint32(&pk, m->num_blocks);
        msgpack_pack_uint32(&pk, m->num_skip);
        msgpack_pack_uint32(&pk, m->num_tokens);
        break;
    case TDM__KVX_DATA:
        msgpack_pack_uint64(&pk, m->rid);
        msgpack_pack_uint64(&pk, m->xid);
        msgpack_pack_uint32(&pk, m->seq);
        msgpack_pack_uint32(&pk, m->layer_begin);
        msgpack_pack_uint32(&pk, m->layer_end);
        msgpack_pack_uint32(&pk, m->block_begin);
        msgpack_pack_uint32(&pk, m->block_count);
        msgpack_pack_uint64(&pk, m->nbytes);
        msgpack_pack_uint32(&pk, m->slot);
        msgpack_pack_uint32(&pk, m->num_tokens);
        break;
    case TDM__KVX_CREDIT:
        msgpack_pack_uint32(&pk, m->slot);
        break;
    case TDM__KVX_DONE:
        msgpack_pack_uint64(&pk, m->rid);
        msgpack_pack_uint64(&pk, m->xid);
        msgpack_pack_uint64(&pk, m->nbytes);
        break;
    case TDM__KVX_FAIL:
        msgpack_pack_uint64(&pk, m->rid);
        msgpack_pack_uint64(&pk, m->xid);
        msgpack_pack_uint32(&pk, m->to_side);
        msgpack_pack_int32(&pk, m->status);
        pk_str(&pk, m->reason);
        break;
    case TDM__KVX_CANCEL:
    case TDM__KVX_CANCEL_ACK:
        msgpack_pack_uint64(&pk, m->rid);
        msgpack_pack_uint64(&pk, m->xid);
        msgpack_pack_uint32(&pk, m->to_side);
        break;
    case TDM__KVX_PING:
        msgpack_pack_uint64(&pk, m->time_ms);
        break;
    case TDM__KVX_BYE:
        pk_str(&pk, m->reason);
        break;
    default:
        break;
    }
    if (w.overflow) return TDM_E_TRUNCATED;
    *len = w.len;
    return TDM_OK;
}
