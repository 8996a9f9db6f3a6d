/*
 * serve.h -- the core of `tandem serve`, independent of the transport: a table of named
 * scheduler instances and a function that turns one msgpack request message into one
 * msgpack reply (docs/service.md is the protocol). cmd_serve.c feeds it from a ZeroMQ
 * ROUTER socket; tests/fuzz/fuzz_serve_msg.c feeds it arbitrary bytes. Every request is
 * decoded and validated completely before anything changes, so a malformed message leaves
 * every instance as it was.
 */
#ifndef TANDEM_TOOLS_SERVE_H
#define TANDEM_TOOLS_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "tandem.h"

#define TDM_SERVE_NAME_MAX 63             /* instance names: 1..63 printable chars */
#define TDM_SERVE_DEFAULT_MAX_MSG (16u << 20)
#define TDM_SERVE_DEFAULT_MAX_INSTANCES 64u
#define TDM_SERVE_MAX_ARRAY (1u << 22)    /* longest array accepted in a request */
#define TDM_SERVE_MAX_DEPTH 16            /* deepest config document accepted */
#define TDM_SERVE_DEFAULT_MAX_KVX_BYTES (256u << 20)
#define TDM_SERVE_MAX_KVXS 16

typedef struct tdm__serve_instance {
    char name[TDM_SERVE_NAME_MAX + 1];
    tdm_sched *sched;
    struct tdm__serve_instance *next;
} tdm__serve_instance;

struct tdm__serve_kvx;

typedef struct tdm__serve_state {
    tdm__serve_instance *instances;
    struct tdm__serve_kvx *kvxs;  /* named transfer engines (serve_kvx.c) */
    uint32_t num_kvxs;
    size_t max_kvx_bytes;         /* host cache an engine may allocate */
    uint32_t num_instances;
    uint32_t max_instances;
    size_t max_msg_bytes;
    int shutdown;                 /* set by the "shutdown" op */
    uint64_t requests;            /* messages handled */
    uint64_t errors;              /* error replies sent */
} tdm__serve_state;

void tdm__serve_init(tdm__serve_state *st);
void tdm__serve_free(tdm__serve_state *st);

/* Handle one request message of len bytes and write exactly one reply (a msgpack map) into
 * *reply (which the caller initialised). Returns 0, or -1 if the reply could not be built
 * (out of memory). */
int tdm__serve_handle(tdm__serve_state *st, const char *msg, size_t len, msgpack_sbuffer *reply);

/* The success part of a reply: key/value pairs packed into body, counted in pairs. */
typedef struct tdm__serve_reply {
    msgpack_sbuffer body;
    msgpack_packer pk;
    uint32_t pairs;
} tdm__serve_reply;

/* Starts one key/value pair of the reply (counts it) and returns the packer for the value. */
msgpack_packer *tdm__serve_key(tdm__serve_reply *r, const char *k);

/* ---- decoding helpers (serve_msg.c) ------------------------------------------------------ */

/* A decode error: status and message, filled by the helpers below. */
typedef struct tdm__serve_err {
    int status;
    char msg[256];
} tdm__serve_err;

int tdm__serve_fail(tdm__serve_err *e, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The value of key in a msgpack map (string keys), or NULL. */
const msgpack_object *tdm__serve_field(const msgpack_object *map, const char *key);

/* Typed getters: when the key is absent, *out keeps its value and they succeed unless
 * required; a present key of the wrong type or out of range fails with TDM_E_INVAL. */
int tdm__serve_get_u64(const msgpack_object *m, const char *key, int required, uint64_t max,
                       uint64_t *out, tdm__serve_err *e);
int tdm__serve_get_i64(const msgpack_object *m, const char *key, int required, int64_t min,
                       int64_t max, int64_t *out, tdm__serve_err *e);
int tdm__serve_get_double(const msgpack_object *m, const char *key, int required, double *out,
                          tdm__serve_err *e);
int tdm__serve_get_bool(const msgpack_object *m, const char *key, int *out, tdm__serve_err *e);
/* A string copied into buf (NUL-terminated); longer than buf_size - 1 fails. */
int tdm__serve_get_str(const msgpack_object *m, const char *key, int required, char *buf,
                       size_t buf_size, tdm__serve_err *e);
/* An array of int32 token ids (malloc'ed into *out, caller frees; NULL with *n 0 if
 * absent or empty). */
int tdm__serve_tokens(const msgpack_object *arr, const char *what, int32_t **out, uint32_t *n,
                      tdm__serve_err *e);
int tdm__serve_get_tokens(const msgpack_object *m, const char *key, int required,
                          int32_t **out, uint32_t *n, tdm__serve_err *e);
/* A request or instance id: a non-negative integer. */
int tdm__serve_as_u64(const msgpack_object *o, const char *what, uint64_t *out,
                      tdm__serve_err *e);

/* Walks the msgpack structure without allocating: every length and element count must fit in
 * the remaining bytes, nesting at most TDM_SERVE_PRECHECK_DEPTH, no trailing bytes. Run before
 * msgpack-c's unpacker, whose zone would otherwise allocate what a 5-byte header claims. */
#define TDM_SERVE_PRECHECK_DEPTH 24
int tdm__serve_precheck(const char *msg, size_t len, tdm__serve_err *e);

/* A msgpack config value (map or JSON string) to a malloc'ed JSON text. */
int tdm__serve_config_json(const msgpack_object *o, char **json, tdm__serve_err *e);
/* JSON text to msgpack (objects, arrays, strings, numbers, booleans, null). */
int tdm__serve_pack_json(msgpack_packer *pk, const char *json);

/* Packing shorthands: a string key followed by a value. */
void tdm__serve_pack_str(msgpack_packer *pk, const char *s);
void tdm__serve_kv_str(msgpack_packer *pk, const char *k, const char *v);
void tdm__serve_kv_u64(msgpack_packer *pk, const char *k, uint64_t v);
void tdm__serve_kv_i64(msgpack_packer *pk, const char *k, int64_t v);
void tdm__serve_kv_double(msgpack_packer *pk, const char *k, double v);
void tdm__serve_kv_bool(msgpack_packer *pk, const char *k, int v);
void tdm__serve_kv_u64s(msgpack_packer *pk, const char *k, const uint64_t *v, uint32_t n);
void tdm__serve_kv_u32s(msgpack_packer *pk, const char *k, const uint32_t *v, uint32_t n);
void tdm__serve_kv_i32s(msgpack_packer *pk, const char *k, const int32_t *v, uint32_t n);
void tdm__serve_kv_u8s(msgpack_packer *pk, const char *k, const uint8_t *v, uint32_t n);

/* ---- the KV transfer engine ops (serve_kvx.c) --------------------------------------------- */

struct tdm__serve_err;
#define TDM__SERVE_KVX_OP(name) \
    int name(tdm__serve_state *st, tdm__serve_instance *unused, const msgpack_object *m, \
             tdm__serve_reply *r, struct tdm__serve_err *e)
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_create);
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_destroy);
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_connect);
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_send);
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_recv);
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_cancel);
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_poll);
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_write);
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_read);
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_stats);
void tdm__serve_kvx_free_all(tdm__serve_state *st);

#endif
