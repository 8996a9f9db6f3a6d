/*
 * serve_kvx.c -- the KV transfer engine ops of `tandem serve` (docs/service.md, "KV
 * transfer"): named tdm_kvx engines whose paged KV caches are host memory owned by the
 * service. A client writes and reads the cache bytes (kvx_write / kvx_read), connects engines
 * (of this or another service), and moves requests' blocks between them (kvx_send / kvx_recv,
 * PULL or PUSH) with completion events from kvx_poll. As everywhere in the service, each op
 * validates all of its input before its first library call; an error reply changes nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "serve.h"

typedef struct tdm__serve_kvx {
    char name[TDM_SERVE_NAME_MAX + 1];
    tdm_kvx *kvx;
    tdm_kv_layout layout;
    size_t layer_bytes;
    uint8_t *mem;                 /* num_layers * layer_bytes */
    uint32_t connecting;          /* connect workers running on it (destroy waits for none) */
    char owner[TDM_SERVE_USER_MAX + 1]; /* under CURVE: the creator's key (as for instances) */
    int shared;
    struct tdm__serve_kvx *next;
} tdm__serve_kvx;

/* A reply owed to a client: a kvx_connect running on a worker thread (tdm_kvx_connect blocks
 * for up to the handshake timeout; the tdm_kvx handle is thread-safe), or a kvx_poll waiting
 * for events until its deadline, re-checked by the service loop. */
enum { PEND_CONNECT = 1, PEND_POLL = 2 };
typedef struct tdm__serve_pending {
    uint64_t token;
    int kind;
    tdm__serve_kvx *k;            /* NULL once the engine is gone (a poll then fails) */
    char seq[300];
    size_t seq_len;
    /* connect */
    pthread_t thread;
    int wake;                     /* write end of the service's wake pipe */
    char ep[512], pub[64];
    atomic_int done;
    int rc;
    uint32_t peer;
    char msg[256];
    /* poll */
    uint64_t max;
    double deadline;
    struct tdm__serve_pending *next;
} tdm__serve_pending;

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}


static tdm__serve_kvx *find_kvx(tdm__serve_state *st, const char *name)
{
    for (tdm__serve_kvx *k = st->kvxs; k; k = k->next)
        if (!strcmp(k->name, name)) return k;
    return NULL;
}

static int get_kvx(tdm__serve_state *st, const msgpack_object *m, tdm__serve_kvx **out,
                   tdm__serve_err *e)
{
    char name[TDM_SERVE_NAME_MAX + 1];
    int rc = tdm__serve_get_str(m, "name", 1, name, sizeof name, e);
    if (rc) return rc;
    if (!(*out = find_kvx(st, name)))
        return tdm__serve_fail(e, TDM_E_NOT_FOUND, "no transfer engine \"%s\"", name);
    const tdm__serve_kvx *k = *out;
    if (st->curve && !k->shared && !st->caller->admin && strcmp(k->owner, st->caller->user))
        return tdm__serve_fail(e, TDM_E_AUTH, "transfer engine \"%s\" belongs to another client "
                               "(create it with \"shared\": true to share it)", name);
    return 0;
}

static int kvx_fail(tdm__serve_err *e, int rc, const tdm_kvx *k, const char *what)
{
    const char *m = tdm_kvx_errmsg(k);
    return tdm__serve_fail(e, rc, "%s: %s", what, (m && *m) ? m : tdm_strerror(rc));
}

static void free_one(tdm__serve_kvx *k)
{
    tdm_kvx_destroy(k->kvx);
    free(k->mem);
    free(k);
}

void tdm__serve_kvx_free_all(tdm__serve_state *st)
{
    /* Connect workers end within the handshake timeout (capped): wait for them first. */
    tdm__serve_pending *p = st->pending;
    while (p) {
        tdm__serve_pending *next = p->next;
        if (p->kind == PEND_CONNECT) pthread_join(p->thread, NULL);
        free(p);
        p = next;
    }
    st->pending = NULL;
    st->num_pending = 0;
    for (int i = 0; i < 2; i++)
        if (st->wake_fd[i] >= 0) {
            close(st->wake_fd[i]);
            st->wake_fd[i] = -1;
        }
    tdm__serve_kvx *k = st->kvxs;
    while (k) {
        tdm__serve_kvx *next = k->next;
        free_one(k);
        k = next;
    }
    st->kvxs = NULL;
    st->num_kvxs = 0;
}

/* Block ids as uint32 (malloc'ed). */
static int get_blocks(const msgpack_object *m, const char *k, uint32_t **out, uint32_t *n,
                      tdm__serve_err *e)
{
    int32_t *t = NULL;
    int rc = tdm__serve_get_tokens(m, k, 1, &t, n, e);
    if (rc) return rc;
    for (uint32_t i = 0; i < *n; i++)
        if (t[i] < 0) {
            free(t);
            return tdm__serve_fail(e, TDM_E_INVAL, "\"%s\"[%u] is negative", k, i);
        }
    *out = (uint32_t *)t; /* same size, non-negative */
    return 0;
}

/* The caps the service puts on a kvx config a client chose (docs/service.md, "Limits"), and
 * where it may listen: beyond loopback only for an admin client. */
static int check_kvx_config(tdm__serve_state *st, const char *json, tdm__serve_err *e)
{
    json_error_t je;
    json_t *root = json_loads(json, 0, &je);
    if (!root) return 0; /* tdm_kvx_create_json reports the syntax error */
    int rc = 0;
    static const struct { const char *key; uint64_t cap; } caps[] = {
        {"handshake_timeout_ms", TDM_SERVE_MAX_HANDSHAKE_MS},
        {"transfer_timeout_ms", TDM_SERVE_MAX_KVX_TIMEOUT_MS},
        {"peer_timeout_ms", TDM_SERVE_MAX_KVX_TIMEOUT_MS},
        {"cancel_timeout_ms", TDM_SERVE_MAX_KVX_TIMEOUT_MS},
        {"heartbeat_ms", TDM_SERVE_MAX_KVX_TIMEOUT_MS},
        {"max_chunk_bytes", TDM_SERVE_MAX_KVX_CHUNK},
        {"shm_slots", TDM_SERVE_MAX_KVX_SHM_SLOTS},
    };
    for (size_t i = 0; !rc && i < sizeof caps / sizeof caps[0]; i++) {
        json_t *v = json_is_object(root) ? json_object_get(root, caps[i].key) : NULL;
        if (v && json_is_integer(v) && (json_integer_value(v) < 0 ||
                                        (uint64_t)json_integer_value(v) > caps[i].cap))
            rc = tdm__serve_fail(e, TDM_E_RANGE, "kvx config \"%s\" is capped at %llu by the service",
                                 caps[i].key, (unsigned long long)caps[i].cap);
    }
    if (!rc && json_is_object(root)) { /* the shared-memory segment: slots x chunk */
        json_t *c = json_object_get(root, "max_chunk_bytes"), *n = json_object_get(root, "shm_slots");
        uint64_t chunk = json_is_integer(c) ? (uint64_t)json_integer_value(c) : 8u << 20;
        uint64_t slots = json_is_integer(n) ? (uint64_t)json_integer_value(n) : 8;
        if (chunk * slots > TDM_SERVE_MAX_KVX_SHM_BYTES)
            rc = tdm__serve_fail(e, TDM_E_RANGE, "kvx config shm_slots x max_chunk_bytes (%llu bytes) is "
                                 "capped at %llu by the service", (unsigned long long)(chunk * slots),
                                 (unsigned long long)TDM_SERVE_MAX_KVX_SHM_BYTES);
    }
    json_t *l = json_is_object(root) ? json_object_get(root, "listen") : NULL;
    if (!rc && l && json_is_string(l) && !tdm__serve_endpoint_is_local(json_string_value(l)) && !st->caller->admin)
        rc = tdm__serve_fail(e, TDM_E_AUTH, "kvx config \"listen\" beyond loopback (%.200s) needs an "
                             "admin key (CURVE, --admin-key)", json_string_value(l));
    json_decref(root);
    return rc;
}

/* {"op": "kvx_create", "name", "config": {tdm_kvx_create_json keys}, "layout": {num_layers,
 *  num_blocks, block_size, num_kv_heads, head_dim, dtype (1 fp16, 2 bf16, 3 fp32, 4 fp8),
 *  kind (1 vLLM NHD, 2 vLLM HND, 3 FlashInfer)}} -> {"endpoint": str or nil} */
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_create)
{
    char name[TDM_SERVE_NAME_MAX + 1];
    int rc = tdm__serve_get_str(m, "name", 1, name, sizeof name, e);
    if (rc) return rc;
    if (find_kvx(st, name)) return tdm__serve_fail(e, TDM_E_EXISTS, "transfer engine \"%s\" exists", name);
    int shared = 0;
    if ((rc = tdm__serve_get_bool(m, "shared", &shared, e))) return rc;
    if (st->num_kvxs >= TDM_SERVE_MAX_KVXS)
        return tdm__serve_fail(e, TDM_E_RANGE, "at most %d transfer engines", TDM_SERVE_MAX_KVXS);
    const msgpack_object *lo = tdm__serve_field(m, "layout");
    if (!lo || lo->type != MSGPACK_OBJECT_MAP)
        return tdm__serve_fail(e, TDM_E_INVAL, "\"layout\" must be a map");
    uint64_t nl = 0, nb = 0, bs = 0, nh = 0, hd = 0, dt = TDM_DTYPE_FP16, kind = TDM_KV_LAYOUT_VLLM_NHD;
    if ((rc = tdm__serve_get_u64(lo, "num_layers", 1, 4096, &nl, e)) ||
        (rc = tdm__serve_get_u64(lo, "num_blocks", 1, 1u << 24, &nb, e)) ||
        (rc = tdm__serve_get_u64(lo, "block_size", 1, 1u << 16, &bs, e)) ||
        (rc = tdm__serve_get_u64(lo, "num_kv_heads", 1, 4096, &nh, e)) ||
        (rc = tdm__serve_get_u64(lo, "head_dim", 1, 1u << 16, &hd, e)) ||
        (rc = tdm__serve_get_u64(lo, "dtype", 0, 4, &dt, e)) ||
        (rc = tdm__serve_get_u64(lo, "kind", 0, 3, &kind, e)))
        return rc;
    if (kind == TDM_KV_LAYOUT_CUSTOM)
        return tdm__serve_fail(e, TDM_E_INVAL, "\"kind\" must be 1 (vLLM NHD), 2 (vLLM HND) or 3 (FlashInfer)");
    tdm_kv_layout lay;
    if ((rc = tdm_kv_layout_init(&lay, (tdm_kv_layout_kind)kind, (uint32_t)nl, (uint32_t)nb,
                                 (uint32_t)bs, (uint32_t)nh, (uint32_t)hd, (tdm_dtype)dt)) != 0)
        return tdm__serve_fail(e, rc, "bad layout");
    /* The product of the bounded factors could overflow 64 bits: multiply one at a time and
       compare with the cap (at most 2^31) after each step. */
    const uint64_t cap = st->max_kvx_bytes, factors[] = {bs, nh, hd, tdm_dtype_size((tdm_dtype)dt), nl};
    uint64_t total = 2 * nb;
    for (size_t i = 0; i < sizeof factors / sizeof factors[0] && total <= cap; i++) total *= factors[i];
    if (total > cap)
        return tdm__serve_fail(e, TDM_E_RANGE, "the cache would take more than %zu bytes",
                               st->max_kvx_bytes);
    const uint64_t lb = total / nl;
    char *json = NULL;
    const msgpack_object *cfg = tdm__serve_field(m, "config");
    if (!cfg) return tdm__serve_fail(e, TDM_E_INVAL, "missing key \"config\" (engine_id, ...)");
    if ((rc = tdm__serve_config_json(cfg, &json, e))) return rc;
    if ((rc = check_kvx_config(st, json, e))) {
        free(json);
        return rc;
    }
    tdm__serve_kvx *k = calloc(1, sizeof *k);
    if (k) k->mem = calloc((size_t)total, 1);
    if (!k || !k->mem) {
        free(json);
        if (k) free(k);
        return tdm__serve_fail(e, TDM_E_NOMEM, "out of memory for the cache");
    }
    k->layout = lay;
    k->layer_bytes = (size_t)lb;
    if ((rc = tdm_kvx_create_json(json, &k->kvx)) != 0) {
        rc = kvx_fail(e, rc, NULL, "kvx_create");
        free(json);
        free(k->mem);
        free(k);
        return rc;
    }
    free(json);
    void **bases = malloc(nl * sizeof *bases);
    if (!bases) {
        free_one(k);
        return tdm__serve_fail(e, TDM_E_NOMEM, "out of memory");
    }
    for (uint64_t l = 0; l < nl; l++) bases[l] = k->mem + l * k->layer_bytes;
    rc = tdm_kvx_register(k->kvx, &lay, bases, TDM_MEM_HOST, 0);
    free(bases);
    if (rc) {
        rc = kvx_fail(e, rc, k->kvx, "kvx_register");
        free_one(k);
        return rc;
    }
    memcpy(k->name, name, sizeof name);
    memcpy(k->owner, st->caller->user, sizeof k->owner);
    k->shared = shared || !st->curve;
    k->next = st->kvxs;
    st->kvxs = k;
    st->num_kvxs++;
    char ep[512];
    msgpack_packer *pk = tdm__serve_key(r, "endpoint");
    if (tdm_kvx_get_endpoint(k->kvx, ep, sizeof ep) == 0) tdm__serve_pack_str(pk, ep);
    else msgpack_pack_nil(pk);
    msgpack_pack_uint64(tdm__serve_key(r, "layer_bytes"), k->layer_bytes);
    return 0;
}

TDM__SERVE_KVX_OP(tdm__serve_op_kvx_destroy)
{
    tdm__serve_kvx *k;
    int rc = get_kvx(st, m, &k, e);
    if (rc) return rc;
    if (k->connecting)
        return tdm__serve_fail(e, TDM_E_STATE, "transfer engine \"%s\" has %u kvx_connect in progress; "
                               "destroy it once they have replied", k->name, k->connecting);
    for (tdm__serve_pending *p = st->pending; p; p = p->next)
        if (p->k == k) p->k = NULL; /* its waiting polls fail at the next progress */
    for (tdm__serve_kvx **p = &st->kvxs; *p; p = &(*p)->next)
        if (*p == k) {
            *p = k->next;
            break;
        }
    st->num_kvxs--;
    free_one(k);
    return 0;
}

/* A pending record for the request being handled, or NULL with e set (too many). */
static tdm__serve_pending *new_pending(tdm__serve_state *st, int kind, tdm__serve_kvx *k,
                                       tdm__serve_err *e)
{
    if (st->num_pending >= TDM_SERVE_MAX_PENDING) {
        tdm__serve_fail(e, TDM_E_RANGE, "%u operations are already waiting for their reply "
                        "(the cap); retry later", st->num_pending);
        return NULL;
    }
    if (st->wake_fd[0] < 0 && pipe2(st->wake_fd, O_NONBLOCK | O_CLOEXEC) != 0) {
        st->wake_fd[0] = st->wake_fd[1] = -1;
        tdm__serve_fail(e, TDM_E_IO, "pipe: %s", strerror(errno));
        return NULL;
    }
    tdm__serve_pending *p = calloc(1, sizeof *p);
    if (!p) {
        tdm__serve_fail(e, TDM_E_NOMEM, "out of memory");
        return NULL;
    }
    p->token = ++st->next_token;
    p->kind = kind;
    p->k = k;
    memcpy(p->seq, st->seq, st->seq_len);
    p->seq_len = st->seq_len;
    p->next = st->pending;
    st->pending = p;
    st->num_pending++;
    st->deferred = p->token;
    return p;
}

static void drop_pending(tdm__serve_state *st, tdm__serve_pending *p)
{
    for (tdm__serve_pending **q = &st->pending; *q; q = &(*q)->next)
        if (*q == p) {
            *q = p->next;
            break;
        }
    st->num_pending--;
    if (st->deferred == p->token) st->deferred = 0;
    free(p);
}

static void *connect_worker(void *arg)
{
    tdm__serve_pending *p = arg;
    p->rc = tdm_kvx_connect(p->k->kvx, p->ep, p->pub[0] ? p->pub : NULL, &p->peer);
    if (p->rc) {
        const char *m = tdm_kvx_errmsg(p->k->kvx);
        snprintf(p->msg, sizeof p->msg, "kvx_connect: %s", (m && *m) ? m : tdm_strerror(p->rc));
    }
    atomic_store(&p->done, 1);
    char b = 1;
    ssize_t w = write(p->wake, &b, 1); /* a full pipe already wakes the loop */
    (void)w;
    return NULL;
}

static int poll_events(tdm__serve_kvx *k, uint64_t max, int to, tdm__serve_reply *r,
                       tdm__serve_err *e, uint32_t *got);

int tdm__serve_kvx_timeout_ms(const tdm__serve_state *st)
{
    for (const tdm__serve_pending *p = st->pending; p; p = p->next)
        if (p->kind == PEND_POLL) return 5; /* waiting polls are re-checked this often */
    return -1;
}

int tdm__serve_kvx_progress(tdm__serve_state *st, uint64_t *token, msgpack_sbuffer *out)
{
    if (st->wake_fd[0] >= 0) {
        char buf[64];
        while (read(st->wake_fd[0], buf, sizeof buf) > 0) {}
    }
    double now = mono_s();
    for (tdm__serve_pending *p = st->pending; p; p = p->next) {
        tdm__serve_reply r;
        tdm__serve_err e;
        memset(&e, 0, sizeof e);
        msgpack_sbuffer_init(&r.body);
        msgpack_packer_init(&r.pk, &r.body, msgpack_sbuffer_write);
        r.pairs = 0;
        int rc;
        if (p->kind == PEND_CONNECT) {
            if (!atomic_load(&p->done)) {
                msgpack_sbuffer_destroy(&r.body);
                continue;
            }
            pthread_join(p->thread, NULL);
            p->k->connecting--;
            rc = p->rc;
            if (rc) tdm__serve_fail(&e, rc, "%s", p->msg);
            else msgpack_pack_uint32(tdm__serve_key(&r, "peer"), p->peer);
        } else if (!p->k) {
            rc = tdm__serve_fail(&e, TDM_E_NOT_FOUND, "the transfer engine was destroyed while kvx_poll waited");
        } else {
            uint32_t got = 0;
            rc = poll_events(p->k, p->max, 0, &r, &e, &got);
            if (!rc && !got && now < p->deadline) {
                msgpack_sbuffer_destroy(&r.body);
                r.pairs = 0;
                continue;
            }
        }
        if (rc) st->errors++;
        tdm__serve_pack_reply(out, rc, p->seq, p->seq_len, &r.body, r.pairs, e.msg);
        msgpack_sbuffer_destroy(&r.body);
        *token = p->token;
        drop_pending(st, p);
        return 1;
    }
    return 0;
}

TDM__SERVE_KVX_OP(tdm__serve_op_kvx_connect)
{
    tdm__serve_kvx *k;
    char ep[512], pub[64] = "";
    int rc = get_kvx(st, m, &k, e);
    if (!rc) rc = tdm__serve_get_str(m, "endpoint", 1, ep, sizeof ep, e);
    if (!rc) rc = tdm__serve_get_str(m, "server_public_key", 0, pub, sizeof pub, e);
    if (rc) return rc;
    if (!st->can_defer) { /* start-up or a test harness: nobody else to serve */
        uint32_t peer = 0;
        rc = tdm_kvx_connect(k->kvx, ep, pub[0] ? pub : NULL, &peer);
        if (rc) return kvx_fail(e, rc, k->kvx, "kvx_connect");
        msgpack_pack_uint32(tdm__serve_key(r, "peer"), peer);
        return 0;
    }
    tdm__serve_pending *p = new_pending(st, PEND_CONNECT, k, e);
    if (!p) return e->status;
    memcpy(p->ep, ep, sizeof ep);
    memcpy(p->pub, pub, sizeof pub);
    p->wake = st->wake_fd[1];
    if (pthread_create(&p->thread, NULL, connect_worker, p) != 0) {
        drop_pending(st, p);
        return tdm__serve_fail(e, TDM_E_NOMEM, "cannot start a connect worker");
    }
    k->connecting++;
    return TDM_SERVE_DEFERRED;
}

/* Common fields of kvx_send / kvx_recv. A transfer names a request's blocks, distinct ones
 * of the engine's cache: more ids than the cache has blocks is refused before any is decoded
 * (4 M ids used to cost the loop tens of milliseconds, and the engine their memory). */
static int xfer_fields(const msgpack_object *m, uint32_t num_blocks, uint64_t *mode,
                       uint64_t *peer, uint64_t *rid, uint64_t *tid, uint64_t *timeout,
                       uint32_t **blocks, uint32_t *n, tdm__serve_err *e)
{
    int rc;
    const msgpack_object *b = tdm__serve_field(m, "block_ids");
    uint32_t count = 0;
    if (b && !tdm__serve_tokens_count(b, "\"block_ids\"", &count, e) && count > num_blocks)
        return tdm__serve_fail(e, TDM_E_RANGE, "\"block_ids\" has %u entries; the engine's cache "
                               "has %u blocks", count, num_blocks);
    if ((rc = tdm__serve_get_u64(m, "mode", 0, 2, mode, e)) ||
        (rc = tdm__serve_get_u64(m, "peer", 0, UINT32_MAX, peer, e)) ||
        (rc = tdm__serve_get_u64(m, "request_id", 1, UINT64_MAX, rid, e)) ||
        (rc = tdm__serve_get_u64(m, "transfer_id", 0, UINT64_MAX, tid, e)) ||
        (rc = tdm__serve_get_u64(m, "timeout_ms", 0, TDM_SERVE_MAX_KVX_TIMEOUT_MS, timeout, e)))
        return rc;
    return get_blocks(m, "block_ids", blocks, n, e);
}

/* kvx_send and kvx_recv share every field but one: the sender's "num_blocks_ready" (default:
 * all) and the receiver's "num_skip" (default: none). */
static int xfer_op(tdm__serve_state *st, const msgpack_object *m, tdm__serve_reply *r,
                   struct tdm__serve_err *e, bool send)
{
    tdm__serve_kvx *k;
    uint64_t mode = TDM_KVX_PULL, peer = send ? TDM_KVX_PEER_ANY : 0, rid = 0, tid = send ? 0 : 1, to = 0;
    uint32_t *blocks = NULL, n = 0;
    int rc = get_kvx(st, m, &k, e);
    if (!rc) rc = xfer_fields(m, k->layout.num_blocks, &mode, &peer, &rid, &tid, &to, &blocks, &n, e);
    if (rc) return rc;
    uint64_t count = send ? n : 0;
    if ((rc = tdm__serve_get_u64(m, send ? "num_blocks_ready" : "num_skip", 0, n, &count, e))) {
        free(blocks);
        return rc;
    }
    uint64_t h = 0;
    if (send) {
        tdm_kvx_send_desc d;
        tdm_kvx_send_desc_init(&d);
        if (mode) d.mode = (uint32_t)mode;
        d.peer = (uint32_t)peer;
        d.num_blocks = n;
        d.request_id = rid;
        d.transfer_id = tid;
        d.block_ids = blocks;
        d.num_blocks_ready = (uint32_t)count;
        d.timeout_ms = (uint32_t)to;
        rc = tdm_kvx_send(k->kvx, &d, &h);
    } else {
        tdm_kvx_recv_desc d;
        tdm_kvx_recv_desc_init(&d);
        if (mode) d.mode = (uint32_t)mode;
        d.peer = (uint32_t)peer;
        d.num_blocks = n;
        d.request_id = rid;
        d.transfer_id = tid;
        d.block_ids = blocks;
        d.num_skip = (uint32_t)count;
        d.timeout_ms = (uint32_t)to;
        rc = tdm_kvx_recv(k->kvx, &d, &h);
    }
    free(blocks);
    if (rc) return kvx_fail(e, rc, k->kvx, send ? "kvx_send" : "kvx_recv");
    msgpack_pack_uint64(tdm__serve_key(r, "handle"), h);
    return 0;
}

TDM__SERVE_KVX_OP(tdm__serve_op_kvx_send)
{
    (void)unused;
    return xfer_op(st, m, r, e, true);
}

TDM__SERVE_KVX_OP(tdm__serve_op_kvx_recv)
{
    (void)unused;
    return xfer_op(st, m, r, e, false);
}

/* {"name", "handle", "num_blocks_ready", optional "layer_begin" (0), "layer_end" (all)}:
 * streaming readiness of a send. */
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_send_ready)
{
    tdm__serve_kvx *k;
    uint64_t h = 0, ready = 0, lb = 0, le = 0;
    int rc = get_kvx(st, m, &k, e);
    if (!rc) le = k->layout.num_layers;
    if (!rc) rc = tdm__serve_get_u64(m, "handle", 1, UINT64_MAX, &h, e);
    if (!rc) rc = tdm__serve_get_u64(m, "num_blocks_ready", 1, UINT32_MAX, &ready, e);
    if (!rc) rc = tdm__serve_get_u64(m, "layer_begin", 0, UINT32_MAX, &lb, e);
    if (!rc) rc = tdm__serve_get_u64(m, "layer_end", 0, UINT32_MAX, &le, e);
    if (rc) return rc;
    rc = tdm_kvx_send_ready(k->kvx, h, (uint32_t)lb, (uint32_t)le, (uint32_t)ready);
    return rc ? kvx_fail(e, rc, k->kvx, "kvx_send_ready") : 0;
}

TDM__SERVE_KVX_OP(tdm__serve_op_kvx_cancel)
{
    tdm__serve_kvx *k;
    uint64_t h = 0;
    int rc = get_kvx(st, m, &k, e);
    if (!rc) rc = tdm__serve_get_u64(m, "handle", 1, UINT64_MAX, &h, e);
    if (rc) return rc;
    rc = tdm_kvx_cancel(k->kvx, h);
    return rc ? kvx_fail(e, rc, k->kvx, "kvx_cancel") : 0;
}

/* Takes up to max events (waiting up to `to` ms) and packs them as "events" into r. */
static int poll_events(tdm__serve_kvx *k, uint64_t max, int to, tdm__serve_reply *r,
                       tdm__serve_err *e, uint32_t *got)
{
    if (max == 0) max = 1;
    tdm_kvx_event *ev = calloc(max, sizeof *ev);
    if (!ev) return tdm__serve_fail(e, TDM_E_NOMEM, "out of memory");
    tdm_kvx_event_init(&ev[0]);
    for (uint64_t i = 1; i < max; i++) ev[i].struct_size = ev[0].struct_size;
    uint32_t n = 0;
    int rc = tdm_kvx_poll(k->kvx, ev, (uint32_t)max, &n, to);
    if (rc) {
        free(ev);
        return kvx_fail(e, rc, k->kvx, "kvx_poll");
    }
    *got = n;
    msgpack_packer *pk = tdm__serve_key(r, "events");
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) {
        ev[i].reason[sizeof ev[i].reason - 1] = '\0';
        msgpack_pack_map(pk, 10);
        tdm__serve_kv_u64(pk, "type", ev[i].type);
        tdm__serve_kv_u64(pk, "side", ev[i].side);
        tdm__serve_kv_i64(pk, "status", ev[i].status);
        tdm__serve_kv_u64(pk, "handle", ev[i].handle);
        tdm__serve_kv_u64(pk, "request_id", ev[i].request_id);
        tdm__serve_kv_u64(pk, "transfer_id", ev[i].transfer_id);
        tdm__serve_kv_u64(pk, "peer", ev[i].peer);
        tdm__serve_kv_u64(pk, "num_blocks_done", ev[i].num_blocks_done);
        tdm__serve_kv_u64(pk, "bytes", ev[i].bytes);
        tdm__serve_kv_str(pk, "reason", ev[i].reason);
    }
    free(ev);
    return 0;
}

/* {"name", "max" (default 64), "timeout_ms" (default 0, at most 10000)} -> {"events": [...]}.
 * With a timeout and no event queued, the reply is deferred (other clients are served
 * meanwhile) until an event arrives or the timeout passes. */
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_poll)
{
    tdm__serve_kvx *k;
    uint64_t max = 64, to = 0;
    int rc = get_kvx(st, m, &k, e);
    if (!rc) rc = tdm__serve_get_u64(m, "max", 0, 1024, &max, e);
    if (!rc) rc = tdm__serve_get_u64(m, "timeout_ms", 0, TDM_SERVE_MAX_POLL_MS, &to, e);
    if (rc) return rc;
    if (!to || !st->can_defer) {
        uint32_t got = 0;
        return poll_events(k, max, (int)to, r, e, &got);
    }
    /* Nothing taken yet: an event that is already queued is delivered by the first progress
     * call, right after this request. */
    tdm__serve_pending *p = new_pending(st, PEND_POLL, k, e);
    if (!p) return e->status;
    p->max = max;
    p->deadline = mono_s() + (double)to / 1000.0;
    return TDM_SERVE_DEFERRED;
}

/* A byte range [offset, offset+len) of one layer's tensor. */
static int get_range(tdm__serve_kvx *k, const msgpack_object *m, uint64_t len_given,
                     uint64_t *layer, uint64_t *off, uint64_t *len, tdm__serve_err *e)
{
    int rc;
    if ((rc = tdm__serve_get_u64(m, "layer", 1, k->layout.num_layers - 1, layer, e)) ||
        (rc = tdm__serve_get_u64(m, "offset", 1, k->layer_bytes, off, e)))
        return rc;
    if (len_given == UINT64_MAX &&
        (rc = tdm__serve_get_u64(m, "length", 1, TDM_SERVE_DEFAULT_MAX_MSG / 2, len, e)))
        return rc;
    if (len_given != UINT64_MAX) *len = len_given;
    if (*len > k->layer_bytes - *off)
        return tdm__serve_fail(e, TDM_E_RANGE, "bytes [%llu, %llu) are outside the layer's %zu",
                               (unsigned long long)*off, (unsigned long long)(*off + *len),
                               k->layer_bytes);
    return 0;
}

/* {"name", "layer", "offset", "data": bin} writes the bytes into the cache. The host must not
 * write blocks that a live transfer is reading or writing. */
TDM__SERVE_KVX_OP(tdm__serve_op_kvx_write)
{
    tdm__serve_kvx *k;
    int rc = get_kvx(st, m, &k, e);
    if (rc) return rc;
    const msgpack_object *d = tdm__serve_field(m, "data");
    if (!d || d->type != MSGPACK_OBJECT_BIN)
        return tdm__serve_fail(e, TDM_E_INVAL, "\"data\" must be binary");
    uint64_t layer, off, len;
    if ((rc = get_range(k, m, d->via.bin.size, &layer, &off, &len, e))) return rc;
    if (len) memcpy(k->mem + layer * k->layer_bytes + off, d->via.bin.ptr, len);
    return 0;
}

TDM__SERVE_KVX_OP(tdm__serve_op_kvx_read)
{
    tdm__serve_kvx *k;
    uint64_t layer, off, len;
    int rc = get_kvx(st, m, &k, e);
    if (!rc) rc = get_range(k, m, UINT64_MAX, &layer, &off, &len, e);
    if (rc) return rc;
    msgpack_packer *pk = tdm__serve_key(r, "data");
    msgpack_pack_bin(pk, len);
    msgpack_pack_bin_body(pk, k->mem + layer * k->layer_bytes + off, len);
    return 0;
}

TDM__SERVE_KVX_OP(tdm__serve_op_kvx_stats)
{
    tdm__serve_kvx *k;
    int rc = get_kvx(st, m, &k, e);
    if (rc) return rc;
    tdm_kvx_stats s;
    tdm_kvx_stats_init(&s);
    if ((rc = tdm_kvx_get_stats(k->kvx, &s))) return kvx_fail(e, rc, k->kvx, "kvx_stats");
    msgpack_packer *pk = tdm__serve_key(r, "stats");
    msgpack_pack_map(pk, 13);
    tdm__serve_kv_u64(pk, "num_peers", s.num_peers);
    tdm__serve_kv_u64(pk, "num_send_active", s.num_send_active);
    tdm__serve_kv_u64(pk, "num_recv_active", s.num_recv_active);
    tdm__serve_kv_u64(pk, "num_reserved_blocks", s.num_reserved_blocks);
    tdm__serve_kv_u64(pk, "num_queued_events", s.num_queued_events);
    tdm__serve_kv_u64(pk, "bytes_sent", s.bytes_sent);
    tdm__serve_kv_u64(pk, "bytes_received", s.bytes_received);
    tdm__serve_kv_u64(pk, "msgs_rejected", s.msgs_rejected);
    tdm__serve_kv_u64(pk, "transfers_done", s.transfers_done);
    tdm__serve_kv_u64(pk, "transfers_failed", s.transfers_failed);
    tdm__serve_kv_u64(pk, "transfers_cancelled", s.transfers_cancelled);
    tdm__serve_kv_u64(pk, "chunks_sent", s.chunks_sent);
    tdm__serve_kv_u64(pk, "chunks_sent_shm", s.chunks_sent_shm);
    return 0;
}
