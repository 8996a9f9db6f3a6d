/*
 * serve.h -- the core of `tandem serve`, independent of the transport: a table of named
 * scheduler instances and a function that turns one msgpack request message into one
 * msgpack reply (docs/service.md is the protocol). cmd_serve.c feeds it from a ZeroMQ
 * ROUTER socket; tests/fuzz/fuzz_serve_msg.c feeds it arbitrary bytes. Every request is
 * decoded and validated completely before anything changes, so a malformed message leaves
 * every instance as it was. Also here: the caller's identity (for ownership under CURVE), the
 * global limits, and deferred replies (an op returns TDM_SERVE_DEFERRED and the transport
 * sends the reply later).
 */
#ifndef TANDEM_TOOLS_SERVE_H
#define TANDEM_TOOLS_SERVE_H

#include <pthread.h>
#include <sys/socket.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>
#include <zmq.h>

#include "tandem.h"

#define TDM_SERVE_NAME_MAX 63             /* instance names: 1..63 printable chars */
#define TDM_SERVE_DEFAULT_MAX_MSG (16u << 20)
#define TDM_SERVE_DEFAULT_MAX_INSTANCES 64u
#define TDM_SERVE_MAX_ARRAY (1u << 22)    /* longest array accepted in a request */
#define TDM_SERVE_MAX_DEPTH 16            /* deepest config document accepted */
#define TDM_SERVE_MAX_CONFIG_ELEMENTS 4096u /* msgpack elements of a config map */
#define TDM_SERVE_MAX_OUTPUT_TOKENS 1025u /* one update output: 1 + num_lookahead_tokens (<= 1024) */
#define TDM_SERVE_DEFAULT_MAX_KVX_BYTES (256u << 20)
#define TDM_SERVE_MAX_KVXS 16
/* Caps on what a client chooses (docs/service.md, "Limits"). */
#define TDM_SERVE_MAX_PENDING 64          /* deferred replies (kvx_connect, waiting kvx_poll) */
#define TDM_SERVE_MAX_HANDSHAKE_MS 10000u /* kvx config handshake_timeout_ms */
#define TDM_SERVE_MAX_KVX_TIMEOUT_MS 600000u /* other kvx timeouts (transfer, peer, cancel) */
#define TDM_SERVE_MAX_POLL_MS 10000u      /* kvx_poll timeout_ms */
#define TDM_SERVE_MAX_KVX_CHUNK (64u << 20) /* kvx config max_chunk_bytes */
#define TDM_SERVE_MAX_KVX_SHM_SLOTS 64u   /* kvx config shm_slots */
#define TDM_SERVE_MAX_KVX_SHM_BYTES (256u << 20) /* their product: one shared segment */
#define TDM_SERVE_USER_MAX 40             /* a Z85 CURVE public key */

/* Returned by an op whose reply comes later (the service goes on serving other clients). */
#define TDM_SERVE_DEFERRED 1

/* Who sent the request being handled. */
typedef struct tdm__serve_caller {
    char user[TDM_SERVE_USER_MAX + 1]; /* the client's CURVE public key (Z85); "" without CURVE */
    int admin;                         /* an admin key: any instance, shutdown, engines listening
                                          beyond loopback */
    int local;                         /* no CURVE, loopback socket: may shutdown */
} tdm__serve_caller;

typedef struct tdm__serve_instance {
    char name[TDM_SERVE_NAME_MAX + 1];
    tdm_sched *sched;
    char owner[TDM_SERVE_USER_MAX + 1]; /* the creator's key; "" = anyone */
    int shared;                          /* created with "shared": any client may use it */
    uint64_t num_blocks;                 /* its KV pool, counted in the service's total */
    /* prompt tokens of the requests added, swept when the total reaches the limit */
    uint64_t *tok_ids;
    uint32_t *tok_n;
    uint32_t tok_len, tok_cap;
    uint64_t queued_tokens;
    struct tdm__serve_instance *next;
} tdm__serve_instance;

/* Global limits; 0 = the default (tdm__serve_init sets them). */
typedef struct tdm__serve_limits {
    uint64_t max_blocks_per_instance;
    uint64_t max_total_blocks;        /* over all instances */
    uint64_t max_queued_requests;     /* unfinished requests, all instances */
    uint64_t max_queued_tokens;       /* their prompt tokens */
    uint64_t max_prompt_tokens;       /* one request's prompt */
    uint64_t max_connections;         /* admitted client connections at once (serve_conn.c) */
    uint64_t max_connections_per_source; /* admitted ones from one non-loopback address */
    uint64_t max_connections_per_key; /* admitted ones of one CURVE key */
    uint64_t max_pending;             /* accepted, no request yet (handshaking or silent) */
    uint64_t max_pending_per_source;  /* of those, from one address (or one local uid) */
    uint64_t handshake_ms;            /* ZMTP/CURVE handshake deadline (ZMQ_HANDSHAKE_IVL) */
    uint64_t idle_ms;                 /* first-request deadline; idle admitted ones may be evicted */
} tdm__serve_limits;

#define TDM_SERVE_DEFAULT_MAX_BLOCKS_PER_INSTANCE (1u << 20)
#define TDM_SERVE_DEFAULT_MAX_TOTAL_BLOCKS (1u << 22)
#define TDM_SERVE_DEFAULT_MAX_QUEUED_REQUESTS 65536u
#define TDM_SERVE_DEFAULT_MAX_QUEUED_TOKENS (64u << 20)
#define TDM_SERVE_DEFAULT_MAX_PROMPT_TOKENS (1u << 20)
#define TDM_SERVE_DEFAULT_MAX_CONNECTIONS 64u
#define TDM_SERVE_DEFAULT_MAX_PENDING 64u
#define TDM_SERVE_DEFAULT_MAX_PENDING_PER_SOURCE 64u
#define TDM_SERVE_DEFAULT_HANDSHAKE_MS 3000u
#define TDM_SERVE_DEFAULT_IDLE_MS 10000u
/* per-source and per-key caps default to half the slots */

struct tdm__serve_kvx;
struct tdm__serve_pending;

/* Work done for an "add" on the decoding thread (serve_pre.c), so that the loop's add costs
 * O(blocks): the prompt as int32 ids and Tandem's block digests of it, computed with the
 * instance's hashing settings as they were when the request was queued. */
typedef struct tdm__serve_hashcfg {
    char name[TDM_SERVE_NAME_MAX + 1]; /* an instance */
    int64_t algo, block_size, caching; /* its prefix_hash, block_size, enable_prefix_caching */
} tdm__serve_hashcfg;

/* The instances' hashing settings as the loop last published them (after every create,
 * configure, set_param and destroy), for the decoding thread: mutex-protected. */
typedef struct tdm__serve_hashcfgs {
    pthread_mutex_t mu;
    tdm__serve_hashcfg *v;
    uint32_t n, cap;
} tdm__serve_hashcfgs;

/* An update's outputs decoded into the arrays of tdm_step_output (malloc'ed). */
typedef struct tdm__serve_outputs {
    int done;
    uint32_t n;               /* outputs */
    uint64_t *ids;            /* n request ids */
    uint32_t *offs;           /* n + 1 offsets into all */
    int32_t *all;             /* every output's tokens */
} tdm__serve_outputs;

typedef struct tdm__serve_pre {
    tdm__serve_outputs outs;  /* an "update": its outputs decoded */
    tdm__serve_hashcfg cfg;   /* an "add": the instance's settings when the worker looked */
    int done;                 /* prompt (and, with caching, digests) computed */
    int32_t *prompt;          /* malloc'ed; np ids */
    uint32_t np;
    unsigned char *digests;   /* malloc'ed; nd digests of dsize bytes */
    uint32_t nd, dsize;
} tdm__serve_pre;

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
    tdm__serve_limits lim;
    uint64_t total_blocks;        /* KV blocks of all instances */
    uint64_t queued_tokens;       /* prompt tokens of the unfinished requests (an upper bound) */
    int curve;                    /* the service socket uses CURVE: instances have owners */
    /* the request being handled */
    const tdm__serve_caller *caller;
    int can_defer;                /* the transport can send a reply later */
    uint64_t deferred;            /* token of the reply an op deferred */
    char seq[300];                /* its packed "seq" (echoed in a deferred reply) */
    size_t seq_len;
    /* deferred replies (serve_kvx.c) */
    struct tdm__serve_pending *pending;
    uint32_t num_pending;
    uint64_t next_token;
    int wake_fd[2];               /* a connect worker writes a byte when it is done */
    const tdm__serve_pre *pre;    /* the request being handled: work done on the worker */
    tdm__serve_hashcfgs *hashcfgs; /* published for the worker (NULL: none runs) */
    uint64_t adds_precomputed;    /* adds whose prompt digests came from the worker */
} tdm__serve_state;

void tdm__serve_init(tdm__serve_state *st);
void tdm__serve_free(tdm__serve_state *st);

/* Handle one request message of len bytes and write exactly one reply (a msgpack map) into
 * *reply (which the caller initialised). Returns 0, or -1 if the reply could not be built
 * (out of memory). The caller is trusted as a local admin (start-up, tests, the fuzzer). */
int tdm__serve_handle(tdm__serve_state *st, const char *msg, size_t len, msgpack_sbuffer *reply);

/* The same for a request from client c. With deferred non-NULL the op may defer its reply:
 * then *deferred receives a token (non-zero), nothing is written to *reply, and the reply
 * comes later from tdm__serve_kvx_progress under that token. */
int tdm__serve_handle_as(tdm__serve_state *st, const tdm__serve_caller *c, const char *msg,
                         size_t len, msgpack_sbuffer *reply, uint64_t *deferred);

/* Packs a whole reply: {"ok": true, "seq", body...} when rc is 0, else the error map. */
void tdm__serve_pack_reply(msgpack_sbuffer *out, int rc, const char *seq, size_t seq_len,
                           const msgpack_sbuffer *body, uint32_t pairs, const char *msg);

/* Deferred replies (serve_kvx.c). progress: 1 and a reply in *out (for client *token) when
 * one is ready, else 0. timeout_ms: how long the transport may wait for a message before it
 * must call progress again (-1: until the wake fd or a message). */
int tdm__serve_kvx_progress(tdm__serve_state *st, uint64_t *token, msgpack_sbuffer *out);
int tdm__serve_kvx_timeout_ms(const tdm__serve_state *st);

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

/* Runs one decoded request (serve_ops.c): fills r on success, e on failure. */
int tdm__serve_dispatch(tdm__serve_state *st, const msgpack_object *m, tdm__serve_reply *r,
                        tdm__serve_err *e);


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
/* Token ids: a msgpack array of int32, or (compact) a bin of packed little-endian int32,
 * 4 bytes a token. count: how many (at most TDM_SERVE_MAX_ARRAY; a bin whose size is not a
 * multiple of 4 fails); into: decodes them into dst (room for count). */
int tdm__serve_tokens_count(const msgpack_object *o, const char *what, uint32_t *n,
                            tdm__serve_err *e);
int tdm__serve_tokens_into(const msgpack_object *o, const char *what, int32_t *dst,
                           tdm__serve_err *e);
/* Token ids malloc'ed into *out (caller frees; NULL with *n 0 if absent or empty). */
int tdm__serve_tokens(const msgpack_object *arr, const char *what, int32_t **out, uint32_t *n,
                      tdm__serve_err *e);
int tdm__serve_get_tokens(const msgpack_object *m, const char *key, int required,
                          int32_t **out, uint32_t *n, tdm__serve_err *e);
/* A request or instance id: a non-negative integer. */
int tdm__serve_as_u64(const msgpack_object *o, const char *what, uint64_t *out,
                      tdm__serve_err *e);

/* ---- before decoding (serve_check.c) ------------------------------------------------------- */

#define TDM_SERVE_SMALL_MSG (64u << 10)   /* larger requests only for the ops that need them */
#define TDM_SERVE_PEEK_BUDGET 4096u       /* elements the peek walks at most */
/* msgpack elements of one request: the decoder allocates one msgpack_object (24 bytes) each,
 * so one decode holds at most ~100 MiB beyond the message */
#define TDM_SERVE_MAX_ELEMENTS (TDM_SERVE_MAX_ARRAY + (1u << 16))

/* What the peek saw of a request's top-level map. */
typedef struct tdm__serve_peek_info {
    char op[32];          /* the "op" string, when seen */
    int have_op;
    int64_t prompt_n;     /* element count of "prompt" (-1: not seen) */
    uint64_t max_array;   /* the largest count of a top-level array value seen */
    int complete;         /* every top-level key was seen within the budget */
} tdm__serve_peek_info;

/* Reads the top-level keys of a request within TDM_SERVE_PEEK_BUDGET elements, without
 * allocating: 0 (what it saw in *pi, possibly incomplete), -1 when the message is not a
 * well-formed map as far as it read. */
int tdm__serve_peek(const char *msg, size_t len, tdm__serve_peek_info *pi);
/* Refusals decided before decoding: over --max-msg; over TDM_SERVE_SMALL_MSG for an op that
 * takes small requests; a prompt over --max-prompt-tokens; an array over TDM_SERVE_MAX_ARRAY.
 * Costs O(TDM_SERVE_PEEK_BUDGET) at most. 0, or the status with e filled. */
int tdm__serve_early_check(const tdm__serve_state *st, const char *msg, size_t len,
                           tdm__serve_err *e);
/* Pre-check and decode into *up (initialised by the caller): no service state is touched,
 * so any thread may run it. 0, or the status with e filled. */
int tdm__serve_decode(const char *msg, size_t len, msgpack_unpacked *up, tdm__serve_err *e);
/* The rest of tdm__serve_handle_as once decoded: rc and derr are tdm__serve_decode's. */
int tdm__serve_handle_decoded(tdm__serve_state *st, const tdm__serve_caller *c, int rc,
                              const tdm__serve_err *derr, const msgpack_unpacked *up,
                              msgpack_sbuffer *out, uint64_t *deferred);

/* ---- an add's prompt work on the decoding thread (serve_pre.c) ---------------------------- */

void tdm__serve_hashcfgs_init(tdm__serve_hashcfgs *h);
void tdm__serve_hashcfgs_free(tdm__serve_hashcfgs *h);
/* On the loop: publishes every instance's settings (no-op without st->hashcfgs; on no
 * memory the table is emptied, which only turns the worker's help off). */
void tdm__serve_pre_publish(tdm__serve_state *st);
/* On the worker, once decoded: for an "add" naming a published instance, the prompt's int32
 * ids and Tandem's digests (any failure leaves p->done 0; the op then decodes the request
 * itself and reports the error). */
void tdm__serve_pre_run(tdm__serve_hashcfgs *h, const msgpack_object *m, tdm__serve_pre *p);
/* On the loop, in op_add: the digests may be used if the instance still hashes as planned. */
int tdm__serve_pre_usable(const tdm__serve_pre *p, const tdm__serve_instance *in);
void tdm__serve_pre_free(tdm__serve_pre *p);
/* An update's "outputs" ({id: [tokens]}) or "req_ids" + "tokens" into *u (done set): each
 * output at most TDM_SERVE_MAX_OUTPUT_TOKENS tokens, every token decoded once, straight
 * into one array. 0, or the status with e filled (*u then holds nothing). */
int tdm__serve_outputs_parse(const msgpack_object *m, tdm__serve_outputs *u, tdm__serve_err *e);
void tdm__serve_outputs_free(tdm__serve_outputs *u);

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

/* ---- limits and ownership (serve_limits.c) ------------------------------------------------ */

/* Whether the caller may use instance in (always without CURVE). */
int tdm__serve_may_use(const tdm__serve_state *st, const tdm__serve_instance *in);
/* num_blocks after applying config json to s (NULL: a new instance). */
int64_t tdm__serve_blocks_after(const tdm_sched *s, const char *json);
/* An instance holding `have` blocks may hold `want`: 0, or RANGE with e naming the flag. */
int tdm__serve_check_blocks(tdm__serve_state *st, int64_t want, uint64_t have, tdm__serve_err *e);
void tdm__serve_recount_blocks(tdm__serve_state *st, tdm__serve_instance *in);
/* A request of np prompt tokens may be added to in (the queue limits; makes room to record
 * it); then tdm__serve_admitted records it once the library has taken it. */
int tdm__serve_admit(tdm__serve_state *st, tdm__serve_instance *in, uint32_t np, tdm__serve_err *e);
void tdm__serve_admitted(tdm__serve_state *st, tdm__serve_instance *in, uint64_t id, uint32_t np);

/* ---- connection slots (serve_conn.c) ------------------------------------------------------ */

typedef struct tdm__serve_conn {
    int fd;                            /* ZeroMQ's descriptor (ACCEPTED event, ZMQ_SRCFD) */
    struct sockaddr_storage addr;      /* its peer when accepted: checked before shutdown */
    socklen_t addr_len;
    char src[64];                      /* source: the peer's IP, or "uid:N" over ipc */
    char key[TDM_SERVE_USER_MAX + 1];  /* CURVE key of its first request ("" without) */
    int local;                         /* loopback or ipc: no per-source cap on its slots */
    int admitted;                      /* has sent a request: holds a slot */
    double t_open, t_last;             /* accepted; last request (monotonic seconds) */
} tdm__serve_conn;

typedef struct tdm__serve_conns {
    tdm__serve_conn *c;
    uint32_t n, cap;
    uint64_t pending, admitted;
    uint64_t accepted, refused, evicted, expired; /* counters, printed at exit */
    tdm__serve_limits lim;
    int (*kill)(const tdm__serve_conn *c);      /* ends a connection (tests replace it) */
} tdm__serve_conns;

void tdm__serve_conns_init(tdm__serve_conns *cs, const tdm__serve_limits *lim);
void tdm__serve_conns_free(tdm__serve_conns *cs);
/* The monitor's ACCEPTED fd: a pending connection (evicting the oldest pending one beyond
 * --max-pending or the per-source pending cap). */
void tdm__serve_conns_accepted(tdm__serve_conns *cs, int fd, double now);
/* DISCONNECTED fd: forgotten. */
void tdm__serve_conns_closed(tdm__serve_conns *cs, int fd);
/* A request arrived through fd from CURVE key (NULL or "" without CURVE): 0 when it may be
 * served (the connection is, or now becomes, admitted), -1 with why when the connection was
 * refused (and ended). */
int tdm__serve_conns_request(tdm__serve_conns *cs, int fd, const char *key, double now,
                             char *why, size_t why_size);
/* Ends pending connections older than --idle-ms. */
void tdm__serve_conns_tick(tdm__serve_conns *cs, double now);
/* shutdown(2) of c's descriptor if it still has c's peer; -1 when it does not. */
int tdm__serve_conn_shutdown(const tdm__serve_conn *c);

/* ---- large requests decoded on a worker thread (serve_queue.c) ---------------------------- */

#define TDM_SERVE_QUEUE_ITEMS 64u

enum { TDM__SERVE_ITEM_QUEUED, TDM__SERVE_ITEM_DECODING, TDM__SERVE_ITEM_DONE };

typedef struct tdm__serve_item {
    zmq_msg_t frames[3];      /* routing id, [empty delimiter,] request */
    int nframes, nenv, body;  /* frames held; envelope frames; the request's index */
    tdm__serve_caller who;
    int state;                /* TDM__SERVE_ITEM_*: the worker decodes QUEUED ones in order */
    int rc;                   /* tdm__serve_decode's status (or a refusal decided earlier) */
    tdm__serve_err e;
    msgpack_unpacked up;
    tdm__serve_pre pre;       /* an add's prompt and digests, computed by the worker too */
    size_t bytes;             /* counted in the queue's bytes */
    struct tdm__serve_item *next;
} tdm__serve_item;

typedef struct tdm__serve_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, stop;
    tdm__serve_item *head, *tail;  /* FIFO: answered in order from the head */
    tdm__serve_item *garbage;      /* answered: freed by the worker (large frees unmap pages) */
    uint32_t count;
    size_t bytes, max_bytes, peak_bytes;
    int wake[2];                   /* the worker writes a byte when it has decoded one */
    tdm__serve_hashcfgs *hashcfgs; /* for an add's prompt work (NULL: none) */
} tdm__serve_queue;

/* Starts the worker; max_bytes caps the request bytes queued. 0, or -1. */
int tdm__serve_queue_start(tdm__serve_queue *q, size_t max_bytes);
/* Joins the worker and frees what is queued (no replies). */
void tdm__serve_queue_stop(tdm__serve_queue *q);
/* Whether the client with this routing id has a request queued. */
int tdm__serve_queue_has(tdm__serve_queue *q, const void *rtid, size_t len);
/* Queues a request (its n frames are moved out of frames[]); rc != 0: not decoded, answered
 * with that error (e) in its turn. 0, TDM_E_AGAIN when the queue is full (frames untouched),
 * or TDM_E_NOMEM. */
int tdm__serve_queue_push(tdm__serve_queue *q, zmq_msg_t *frames, int n, int nenv,
                          const tdm__serve_caller *who, int rc, const tdm__serve_err *e);
/* The head request once decoded (the caller answers it, then frees it), or NULL. */
tdm__serve_item *tdm__serve_queue_pop(tdm__serve_queue *q);
void tdm__serve_item_free(tdm__serve_item *it);
/* Hands an answered item to the worker, which frees it off the loop. */
void tdm__serve_queue_recycle(tdm__serve_queue *q, tdm__serve_item *it);

/* ---- authentication (serve_auth.c) ----------------------------------------------------------- */

#define TDM_SERVE_MAX_KEYS 1024

typedef struct tdm__serve_keys {
    char key[TDM_SERVE_MAX_KEYS][TDM_SERVE_USER_MAX + 1];
    uint32_t n;
} tdm__serve_keys;

typedef struct tdm__serve_auth {
    char secret[TDM_SERVE_USER_MAX + 1], pub[TDM_SERVE_USER_MAX + 1];
    tdm__serve_keys allowed;  /* client keys allowed to connect */
    tdm__serve_keys admins;   /* allowed too, and admin */
    void *zap;
    pthread_t thread;
    int started;
} tdm__serve_auth;

/* Adds a Z85 key, or the keys of @FILE (one a line, '#' comments); -1 with err on error. */
int tdm__serve_keys_add(tdm__serve_keys *l, const char *arg, char *err, size_t err_size);
int tdm__serve_keys_has(const tdm__serve_keys *l, const char *k);
/* tcp://127.0.0.1, localhost, [::1] and ipc:// endpoints are local; anything else is not. */
int tdm__serve_endpoint_is_local(const char *ep);
/* Makes sock a CURVE server with a's secret key and starts the ZAP handler in ctx. */
int tdm__serve_auth_start(tdm__serve_auth *a, void *ctx, void *sock, char *err, size_t err_size);
void tdm__serve_auth_join(tdm__serve_auth *a);
/* The caller of a message from its last frame (its User-Id under CURVE). */
void tdm__serve_caller_of(const tdm__serve_auth *a, int curve, int local, zmq_msg_t *frame,
                          tdm__serve_caller *c);

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
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_send_ready);
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_cancel);
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_poll);
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_write);
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_read);
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_stats);
void tdm__serve_kvx_free_all(tdm__serve_state *st);

#endif
