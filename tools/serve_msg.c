/*
 * serve_msg.c -- decoding and encoding helpers of `tandem serve`: typed, bounds-checked
 * getters over a decoded msgpack map (every failure gives TDM_E_INVAL and a message naming
 * the key and what was wrong), token arrays, the conversion of a config value (msgpack map
 * or JSON string) to JSON text and of JSON text back to msgpack, and packing shorthands.
 * Nothing here trusts the input: lengths, types, ranges and nesting depth are all checked.
 * At the end, tdm__serve_handle_as: one message in (early check, pre-check, decode, "seq"), one
 * reply out, or a deferred one; split in two (decode, then handle) so that the transport can
 * decode a large message on a worker thread (serve_check.c has the checks).
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "serve.h"

int tdm__serve_fail(tdm__serve_err *e, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    /* Messages may quote client bytes: keep them printable ASCII (valid UTF-8). */
    for (char *c = e->msg; *c; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e) *c = '?';
    e->status = status;
    return status;
}

static int key_is(const msgpack_object *k, const char *key)
{
    size_t n = strlen(key);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
           memcmp(k->via.str.ptr, key, n) == 0;
}

const msgpack_object *tdm__serve_field(const msgpack_object *map, const char *key)
{
    if (!map || map->type != MSGPACK_OBJECT_MAP) return NULL;
    for (uint32_t i = 0; i < map->via.map.size; i++)
        if (key_is(&map->via.map.ptr[i].key, key)) return &map->via.map.ptr[i].val;
    return NULL;
}

static const char *type_name(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "a boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return "a positive integer";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "a negative integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "a float";
    case MSGPACK_OBJECT_STR: return "a string";
    case MSGPACK_OBJECT_ARRAY: return "an array";
    case MSGPACK_OBJECT_MAP: return "a map";
    case MSGPACK_OBJECT_BIN: return "binary";
    case MSGPACK_OBJECT_EXT: return "an extension";
    default: return "unknown";
    }
}

static const msgpack_object *lookup(const msgpack_object *m, const char *key, int required,
                                    tdm__serve_err *e, int *rc)
{
    const msgpack_object *v = tdm__serve_field(m, key);
    *rc = 0;
    if (!v && required) *rc = tdm__serve_fail(e, TDM_E_INVAL, "missing key \"%s\"", key);
    return v;
}

int tdm__serve_as_u64(const msgpack_object *o, const char *what, uint64_t *out,
                      tdm__serve_err *e)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return tdm__serve_fail(e, TDM_E_INVAL, "%s must be a non-negative integer, not %s", what,
                               type_name(o));
    *out = o->via.u64;
    return 0;
}

int tdm__serve_get_u64(const msgpack_object *m, const char *key, int required, uint64_t max,
                       uint64_t *out, tdm__serve_err *e)
{
    int rc;
    const msgpack_object *v = lookup(m, key, required, e, &rc);
    if (!v) return rc;
    uint64_t x;
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return tdm__serve_fail(e, TDM_E_INVAL, "\"%s\" must be a non-negative integer, not %s",
                               key, type_name(v));
    x = v->via.u64;
    if (x > max)
        return tdm__serve_fail(e, TDM_E_INVAL, "\"%s\" = %" PRIu64 " exceeds %" PRIu64, key, x, max);
    *out = x;
    return 0;
}

int tdm__serve_get_i64(const msgpack_object *m, const char *key, int required, int64_t min,
                       int64_t max, int64_t *out, tdm__serve_err *e)
{
    int rc;
    const msgpack_object *v = lookup(m, key, required, e, &rc);
    if (!v) return rc;
    int64_t x;
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (v->via.u64 > (uint64_t)INT64_MAX)
            return tdm__serve_fail(e, TDM_E_INVAL, "\"%s\" is out of range", key);
        x = (int64_t)v->via.u64;
    } else if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        x = v->via.i64;
    } else {
        return tdm__serve_fail(e, TDM_E_INVAL, "\"%s\" must be an integer, not %s", key,
                               type_name(v));
    }
    if (x < min || x > max)
        return tdm__serve_fail(e, TDM_E_INVAL, "\"%s\" = %" PRId64 " is outside [%" PRId64
                               ", %" PRId64 "]", key, x, min, max);
    *out = x;
    return 0;
}

int tdm__serve_get_double(const msgpack_object *m, const char *key, int required, double *out,
                          tdm__serve_err *e)
{
    int rc;
    const msgpack_object *v = lookup(m, key, required, e, &rc);
    if (!v) return rc;
    double x;
    switch (v->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER: x = (double)v->via.u64; break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: x = (double)v->via.i64; break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: x = v->via.f64; break;
    default:
        return tdm__serve_fail(e, TDM_E_INVAL, "\"%s\" must be a number, not %s", key,
                               type_name(v));
    }
    if (!isfinite(x)) return tdm__serve_fail(e, TDM_E_INVAL, "\"%s\" must be finite", key);
    *out = x;
    return 0;
}

int tdm__serve_get_bool(const msgpack_object *m, const char *key, int *out, tdm__serve_err *e)
{
    const msgpack_object *v = tdm__serve_field(m, key);
    if (!v) return 0;
    if (v->type == MSGPACK_OBJECT_BOOLEAN) *out = v->via.boolean ? 1 : 0;
    else if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 <= 1) *out = (int)v->via.u64;
    else
        return tdm__serve_fail(e, TDM_E_INVAL, "\"%s\" must be a boolean, not %s", key,
                               type_name(v));
    return 0;
}

int tdm__serve_get_str(const msgpack_object *m, const char *key, int required, char *buf,
                       size_t buf_size, tdm__serve_err *e)
{
    int rc;
    const msgpack_object *v = lookup(m, key, required, e, &rc);
    if (!v) return rc;
    if (v->type != MSGPACK_OBJECT_STR)
        return tdm__serve_fail(e, TDM_E_INVAL, "\"%s\" must be a string, not %s", key,
                               type_name(v));
    if (v->via.str.size >= buf_size)
        return tdm__serve_fail(e, TDM_E_INVAL, "\"%s\" is longer than %zu bytes", key,
                               buf_size - 1);
    if (memchr(v->via.str.ptr, '\0', v->via.str.size))
        return tdm__serve_fail(e, TDM_E_INVAL, "\"%s\" contains a NUL byte", key);
    memcpy(buf, v->via.str.ptr, v->via.str.size);
    buf[v->via.str.size] = '\0';
    return 0;
}

int tdm__serve_tokens_count(const msgpack_object *o, const char *what, uint32_t *n,
                            tdm__serve_err *e)
{
    uint64_t len;
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        len = o->via.array.size;
    } else if (o->type == MSGPACK_OBJECT_BIN) { /* compact: packed little-endian int32 */
        if (o->via.bin.size % 4)
            return tdm__serve_fail(e, TDM_E_INVAL, "%s: a bin of packed int32 token ids must "
                                   "have a multiple of 4 bytes, not %u", what, o->via.bin.size);
        len = o->via.bin.size / 4;
    } else {
        return tdm__serve_fail(e, TDM_E_INVAL, "%s must be an array of token ids (or a bin of "
                               "packed little-endian int32), not %s", what, type_name(o));
    }
    if (len > TDM_SERVE_MAX_ARRAY)
        return tdm__serve_fail(e, TDM_E_INVAL, "%s has %llu elements (at most %u)", what,
                               (unsigned long long)len, TDM_SERVE_MAX_ARRAY);
    *n = (uint32_t)len;
    return 0;
}

int tdm__serve_tokens_into(const msgpack_object *o, const char *what, int32_t *dst,
                           tdm__serve_err *e)
{
    if (o->type == MSGPACK_OBJECT_BIN) {
        const unsigned char *b = (const unsigned char *)o->via.bin.ptr;
        uint32_t len = o->via.bin.size / 4;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (len) memcpy(dst, b, (size_t)len * 4);
#else
        for (uint32_t i = 0; i < len; i++, b += 4)
            dst[i] = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                               (uint32_t)b[3] << 24);
#endif
        return 0;
    }
    uint32_t len = o->via.array.size;
    for (uint32_t i = 0; i < len; i++) {
        const msgpack_object *x = &o->via.array.ptr[i];
        if (x->type == MSGPACK_OBJECT_POSITIVE_INTEGER && x->via.u64 <= INT32_MAX)
            dst[i] = (int32_t)x->via.u64;
        else if (x->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && x->via.i64 >= INT32_MIN)
            dst[i] = (int32_t)x->via.i64;
        else
            return tdm__serve_fail(e, TDM_E_INVAL, "%s[%u] is not an int32 token id (%s)", what,
                                   i, type_name(x));
    }
    return 0;
}

int tdm__serve_tokens(const msgpack_object *arr, const char *what, int32_t **out, uint32_t *n,
                      tdm__serve_err *e)
{
    uint32_t len;
    int rc = tdm__serve_tokens_count(arr, what, &len, e);
    if (rc) return rc;
    int32_t *t = NULL;
    if (len) {
        t = malloc((size_t)len * sizeof *t);
        if (!t) return tdm__serve_fail(e, TDM_E_NOMEM, "out of memory for %s", what);
        if ((rc = tdm__serve_tokens_into(arr, what, t, e))) {
            free(t);
            return rc;
        }
    }
    *out = t;
    *n = len;
    return 0;
}

int tdm__serve_get_tokens(const msgpack_object *m, const char *key, int required,
                          int32_t **out, uint32_t *n, tdm__serve_err *e)
{
    int rc;
    const msgpack_object *v = lookup(m, key, required, e, &rc);
    if (!v) {
        *out = NULL;
        *n = 0;
        return rc;
    }
    char what[48];
    snprintf(what, sizeof what, "\"%s\"", key);
    return tdm__serve_tokens(v, what, out, n, e);
}

/* ---- msgpack <-> JSON ---------------------------------------------------------------------- */

static json_t *to_json(const msgpack_object *o, int depth, tdm__serve_err *e)
{
    if (depth > TDM_SERVE_MAX_DEPTH) {
        tdm__serve_fail(e, TDM_E_INVAL, "config nests deeper than %d levels", TDM_SERVE_MAX_DEPTH);
        return NULL;
    }
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return json_null();
    case MSGPACK_OBJECT_BOOLEAN: return json_boolean(o->via.boolean);
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (o->via.u64 > (uint64_t)INT64_MAX) break;
        return json_integer((json_int_t)o->via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return json_integer((json_int_t)o->via.i64);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (!isfinite(o->via.f64)) break;
        return json_real(o->via.f64);
    case MSGPACK_OBJECT_STR: return json_stringn(o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_ARRAY: {
        json_t *a = json_array();
        for (uint32_t i = 0; a && i < o->via.array.size; i++) {
            json_t *v = to_json(&o->via.array.ptr[i], depth + 1, e);
            if (!v || json_array_append_new(a, v)) { json_decref(a); return NULL; }
        }
        return a;
    }
    case MSGPACK_OBJECT_MAP: {
        json_t *m = json_object();
        for (uint32_t i = 0; m && i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            if (kv->key.type != MSGPACK_OBJECT_STR || kv->key.via.str.size > 255 ||
                memchr(kv->key.via.str.ptr, '\0', kv->key.via.str.size)) {
                tdm__serve_fail(e, TDM_E_INVAL, "config keys must be strings of 1..255 bytes");
                json_decref(m);
                return NULL;
            }
            char key[256];
            memcpy(key, kv->key.via.str.ptr, kv->key.via.str.size);
            key[kv->key.via.str.size] = '\0';
            json_t *v = to_json(&kv->val, depth + 1, e);
            if (!v || json_object_set_new(m, key, v)) { json_decref(m); return NULL; }
        }
        return m;
    }
    default: break;
    }
    tdm__serve_fail(e, TDM_E_INVAL, "config holds %s, which JSON cannot express", type_name(o));
    return NULL;
}

/* Counts o's elements against *budget: -1 as soon as it is exceeded (never walks more). */
static int count_elements(const msgpack_object *o, uint64_t *budget)
{
    if (*budget == 0) return -1;
    (*budget)--;
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < o->via.array.size; i++)
            if (count_elements(&o->via.array.ptr[i], budget)) return -1;
    } else if (o->type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < o->via.map.size; i++)
            if (count_elements(&o->via.map.ptr[i].key, budget) ||
                count_elements(&o->via.map.ptr[i].val, budget))
                return -1;
    }
    return 0;
}

int tdm__serve_config_json(const msgpack_object *o, char **json, tdm__serve_err *e)
{
    if (o->type == MSGPACK_OBJECT_STR) {
        if (memchr(o->via.str.ptr, '\0', o->via.str.size))
            return tdm__serve_fail(e, TDM_E_INVAL, "\"config\" contains a NUL byte");
        char *s = malloc((size_t)o->via.str.size + 1);
        if (!s) return tdm__serve_fail(e, TDM_E_NOMEM, "out of memory");
        memcpy(s, o->via.str.ptr, o->via.str.size);
        s[o->via.str.size] = '\0';
        *json = s;
        return 0;
    }
    if (o->type != MSGPACK_OBJECT_MAP)
        return tdm__serve_fail(e, TDM_E_INVAL, "\"config\" must be a map or a JSON string, not %s",
                               type_name(o));
    uint64_t budget = TDM_SERVE_MAX_CONFIG_ELEMENTS; /* bounds the JSON work on the loop */
    if (count_elements(o, &budget))
        return tdm__serve_fail(e, TDM_E_RANGE, "\"config\" holds more than %u msgpack elements",
                               TDM_SERVE_MAX_CONFIG_ELEMENTS);
    e->status = 0;
    json_t *j = to_json(o, 0, e);
    if (!j) return e->status ? e->status : tdm__serve_fail(e, TDM_E_NOMEM, "out of memory");
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return tdm__serve_fail(e, TDM_E_NOMEM, "out of memory");
    *json = s;
    return 0;
}

static void pack_json(msgpack_packer *pk, const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *v;
        msgpack_pack_map(pk, json_object_size(j));
        json_object_foreach((json_t *)j, k, v) {
            tdm__serve_pack_str(pk, k);
            pack_json(pk, v);
        }
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *v;
        msgpack_pack_array(pk, json_array_size(j));
        json_array_foreach(j, i, v) pack_json(pk, v);
        break;
    }
    case JSON_STRING:
        msgpack_pack_str(pk, json_string_length(j));
        msgpack_pack_str_body(pk, json_string_value(j), json_string_length(j));
        break;
    case JSON_INTEGER: msgpack_pack_int64(pk, json_integer_value(j)); break;
    case JSON_REAL: msgpack_pack_double(pk, json_real_value(j)); break;
    case JSON_TRUE: msgpack_pack_true(pk); break;
    case JSON_FALSE: msgpack_pack_false(pk); break;
    default: msgpack_pack_nil(pk); break;
    }
}

int tdm__serve_pack_json(msgpack_packer *pk, const char *json)
{
    json_error_t err;
    json_t *j = json_loads(json, JSON_DECODE_ANY, &err);
    if (!j) return -1;
    pack_json(pk, j);
    json_decref(j);
    return 0;
}

/* ---- packing shorthands --------------------------------------------------------------------- */

void tdm__serve_pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

void tdm__serve_kv_str(msgpack_packer *pk, const char *k, const char *v)
{
    tdm__serve_pack_str(pk, k);
    tdm__serve_pack_str(pk, v);
}

void tdm__serve_kv_u64(msgpack_packer *pk, const char *k, uint64_t v)
{
    tdm__serve_pack_str(pk, k);
    msgpack_pack_uint64(pk, v);
}

void tdm__serve_kv_i64(msgpack_packer *pk, const char *k, int64_t v)
{
    tdm__serve_pack_str(pk, k);
    msgpack_pack_int64(pk, v);
}

void tdm__serve_kv_double(msgpack_packer *pk, const char *k, double v)
{
    tdm__serve_pack_str(pk, k);
    msgpack_pack_double(pk, v);
}

void tdm__serve_kv_bool(msgpack_packer *pk, const char *k, int v)
{
    tdm__serve_pack_str(pk, k);
    if (v) msgpack_pack_true(pk);
    else msgpack_pack_false(pk);
}

void tdm__serve_kv_u64s(msgpack_packer *pk, const char *k, const uint64_t *v, uint32_t n)
{
    tdm__serve_pack_str(pk, k);
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) msgpack_pack_uint64(pk, v[i]);
}

void tdm__serve_kv_u32s(msgpack_packer *pk, const char *k, const uint32_t *v, uint32_t n)
{
    tdm__serve_pack_str(pk, k);
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) msgpack_pack_uint32(pk, v[i]);
}

void tdm__serve_kv_i32s(msgpack_packer *pk, const char *k, const int32_t *v, uint32_t n)
{
    tdm__serve_pack_str(pk, k);
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) msgpack_pack_int32(pk, v[i]);
}

void tdm__serve_kv_u8s(msgpack_packer *pk, const char *k, const uint8_t *v, uint32_t n)
{
    tdm__serve_pack_str(pk, k);
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) msgpack_pack_uint8(pk, v[i]);
}

/* ---- one request, one reply --------------------------------------------------------------- */

/* The correlation value a client may send as "seq" (an integer, or a string of at most 256
 * bytes) is echoed back. *bad is set when "seq" is present but malformed: the op must not run
 * (a client matching replies by seq could not tell which request failed). */
static const msgpack_object *seq_of(const msgpack_object *m, int *bad)
{
    *bad = 0;
    if (m->type != MSGPACK_OBJECT_MAP) return NULL;
    const msgpack_object *s = tdm__serve_field(m, "seq");
    if (!s) return NULL;
    switch (s->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return s;
    case MSGPACK_OBJECT_STR:
        if (s->via.str.size <= 256) return s;
        break;
    default:
        break;
    }
    *bad = 1;
    return NULL;
}

void tdm__serve_pack_reply(msgpack_sbuffer *out, int rc, const char *seq, size_t seq_len,
                           const msgpack_sbuffer *body, uint32_t pairs, const char *msg)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
    uint32_t extra = seq_len ? 1 : 0;
    if (rc == 0) {
        msgpack_pack_map(&pk, 1 + extra + pairs);
        tdm__serve_kv_bool(&pk, "ok", 1);
    } else {
        msgpack_pack_map(&pk, 4 + extra);
        tdm__serve_kv_bool(&pk, "ok", 0);
    }
    if (seq_len) {
        tdm__serve_pack_str(&pk, "seq");
        msgpack_sbuffer_write(out, seq, seq_len);
    }
    if (rc == 0) {
        if (body && body->size) msgpack_sbuffer_write(out, body->data, body->size);
    } else {
        tdm__serve_kv_i64(&pk, "status", rc);
        tdm__serve_kv_str(&pk, "error", tdm_strerror(rc));
        tdm__serve_kv_str(&pk, "message", msg);
    }
}

int tdm__serve_handle(tdm__serve_state *st, const char *msg, size_t len, msgpack_sbuffer *out)
{
    return tdm__serve_handle_as(st, NULL, msg, len, out, NULL);
}

int tdm__serve_decode(const char *msg, size_t len, msgpack_unpacked *up, tdm__serve_err *e)
{
    if (len == 0) return tdm__serve_fail(e, TDM_E_PROTOCOL, "empty message");
    int rc = tdm__serve_precheck(msg, len, e);
    if (rc) return rc;
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack_next(up, msg, len, &off);
    if (ur == MSGPACK_UNPACK_SUCCESS && off == len) return 0;
    if (ur == MSGPACK_UNPACK_SUCCESS)
        return tdm__serve_fail(e, TDM_E_PROTOCOL, "%zu trailing bytes after the request", len - off);
    if (ur == MSGPACK_UNPACK_CONTINUE)
        return tdm__serve_fail(e, TDM_E_PROTOCOL, "truncated msgpack message");
    if (ur == MSGPACK_UNPACK_NOMEM_ERROR)
        return tdm__serve_fail(e, TDM_E_NOMEM, "out of memory decoding the message");
    return tdm__serve_fail(e, TDM_E_PROTOCOL, "malformed msgpack message");
}

int tdm__serve_handle_as(tdm__serve_state *st, const tdm__serve_caller *c, const char *msg,
                         size_t len, msgpack_sbuffer *out, uint64_t *deferred)
{
    tdm__serve_err e;
    memset(&e, 0, sizeof e);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    int rc = tdm__serve_early_check(st, msg, len, &e);
    if (!rc) rc = tdm__serve_decode(msg, len, &up, &e);
    int r = tdm__serve_handle_decoded(st, c, rc, &e, &up, out, deferred);
    msgpack_unpacked_destroy(&up);
    return r;
}

int tdm__serve_handle_decoded(tdm__serve_state *st, const tdm__serve_caller *c, int rc,
                              const tdm__serve_err *derr, const msgpack_unpacked *up,
                              msgpack_sbuffer *out, uint64_t *deferred)
{
    static const tdm__serve_caller local = {"", 1, 1};
    tdm__serve_reply r;
    tdm__serve_err e = *derr;
    msgpack_sbuffer_init(&r.body);
    msgpack_packer_init(&r.pk, &r.body, msgpack_sbuffer_write);
    r.pairs = 0;
    st->requests++;
    st->caller = c ? c : &local;
    st->can_defer = deferred != NULL;
    st->deferred = 0;
    st->seq_len = 0;
    if (deferred) *deferred = 0;
    if (!rc) {
        int bad_seq;
        const msgpack_object *seq = seq_of(&up->data, &bad_seq);
        if (seq) { /* packed once: echoed now or in a deferred reply */
            msgpack_sbuffer sb;
            msgpack_packer sp;
            msgpack_sbuffer_init(&sb);
            msgpack_packer_init(&sp, &sb, msgpack_sbuffer_write);
            msgpack_pack_object(&sp, *seq);
            if (sb.data && sb.size <= sizeof st->seq) {
                memcpy(st->seq, sb.data, sb.size);
                st->seq_len = sb.size;
            }
            msgpack_sbuffer_destroy(&sb);
        }
        rc = bad_seq ? tdm__serve_fail(&e, TDM_E_INVAL, "\"seq\" must be an integer or a string "
                                       "of at most 256 bytes; the op was not run")
                     : tdm__serve_dispatch(st, &up->data, &r, &e);
    }

    if (rc == TDM_SERVE_DEFERRED && deferred && st->deferred) {
        *deferred = st->deferred; /* the reply comes later */
    } else {
        if (rc == TDM_SERVE_DEFERRED) rc = tdm__serve_fail(&e, TDM_E_INTERNAL, "reply deferred without a token");
        if (rc) st->errors++;
        tdm__serve_pack_reply(out, rc, st->seq, st->seq_len, &r.body, r.pairs, e.msg);
    }
    st->caller = &local;
    msgpack_sbuffer_destroy(&r.body);
    return (deferred && *deferred) || out->data ? 0 : -1;
}
