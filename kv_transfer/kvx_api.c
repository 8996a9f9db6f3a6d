/*
 * kvx_api.c -- the transfer calls of the public API (recv, send, send_ready, cancel), which
 * validate the caller's descriptor, reserve destination blocks, create the transfer's state
 * and hand it to the I/O thread; and tdm_kvx_create_json, the JSON form of the config.
 */
#include <string.h>

#include <jansson.h>

#include "kvx_internal.h"

static kvx_xfer *xfer_new(tdm_kvx *k, uint32_t side, uint32_t n, const uint32_t *ids)
{
    kvx_xfer *x = tdm__calloc(1, sizeof(*x));
    if (!x) return NULL;
    x->side = side;
    x->n = n;
    x->blocks = tdm__malloc((size_t)n * sizeof(uint32_t));
    if (!x->blocks) { tdm__free(x); return NULL; }
    memcpy(x->blocks, ids, (size_t)n * sizeof(uint32_t));
    uint32_t L = k->layout.num_layers;
    if (side == TDM_KVX_SIDE_SEND) {
        x->ready = tdm__calloc(L, sizeof(uint32_t));
        x->sent = tdm__calloc(L, sizeof(uint32_t));
        if (!x->ready || !x->sent) { tdm__kvx_xfer_free(k, x); return NULL; }
    } else {
        x->got = tdm__calloc(((size_t)L * n + 7) / 8, 1);
        if (!x->got) { tdm__kvx_xfer_free(k, x); return NULL; }
    }
    return x;
}

static void xfer_link(tdm_kvx *k, kvx_xfer *x)
{
    x->handle = k->next_handle++;
    x->next = k->xfers;
    k->xfers = x;
}

int tdm_kvx_recv(tdm_kvx *k, const tdm_kvx_recv_desc *d, uint64_t *handle)
{
    if (!k || !handle || !TDM_STRUCT_OK(d, sizeof(tdm_kvx_recv_desc)))
        return tdm__kvx_fail(TDM_E_INVAL, "NULL argument or desc struct_size too small");
    if (d->mode != TDM_KVX_PULL && d->mode != TDM_KVX_PUSH) return tdm__kvx_fail(TDM_E_INVAL, "unknown mode %u", d->mode);
    if (d->num_blocks == 0 || d->num_blocks > TDM__KVX_MAX_BLOCKS || !d->block_ids)
        return tdm__kvx_fail(TDM_E_INVAL, "num_blocks must be in [1, %u] with block_ids", TDM__KVX_MAX_BLOCKS);
    if (d->num_skip > d->num_blocks) return tdm__kvx_fail(TDM_E_INVAL, "num_skip %u > num_blocks %u", d->num_skip, d->num_blocks);
    pthread_mutex_lock(&k->mu);
    int rc = TDM_OK;
    if (!k->registered) { rc = tdm__kvx_fail(TDM_E_STATE, "KV cache not registered"); goto out; }
    /* the capacity; the sender says how many tokens it actually has (DATA.tokens) */
    uint32_t tok = (uint32_t)((uint64_t)d->num_blocks * k->layout.block_size);
    if (!tdm__kvx_peer(k, d->peer)) { rc = tdm__kvx_fail(TDM_E_PEER, "peer %u unknown or dead", d->peer); goto out; }
    if (k->cfg.role == TDM_KVX_ROLE_PREFILL) { rc = tdm__kvx_fail(TDM_E_STATE, "a prefill-role engine does not receive"); goto out; }
    if (tdm__kvx_find(k, TDM_KVX_SIDE_RECV, d->peer, d->request_id, d->transfer_id)) {
        rc = tdm__kvx_fail(TDM_E_EXISTS, "transfer (%llu, %llu) already live with peer %u",
                           (unsigned long long)d->request_id, (unsigned long long)d->transfer_id, d->peer);
        goto out;
    }
    uint32_t i;
    for (i = d->num_skip; i < d->num_blocks; i++) {
        uint32_t b = d->block_ids[i];
        if (b >= k->layout.num_blocks) { rc = tdm__kvx_fail(TDM_E_RANGE, "block id %u out of range (%u blocks)", b, k->layout.num_blocks); break; }
        if (k->owner[b]) { rc = tdm__kvx_fail(TDM_E_EXISTS, "block %u is already reserved (or listed twice)", b); break; }
        k->owner[b] = 1;
    }
    if (rc) {   /* undo the partial reservation */
        for (uint32_t j = d->num_skip; j < i; j++) k->owner[d->block_ids[j]] = 0;
        goto out;
    }
    kvx_xfer *x = xfer_new(k, TDM_KVX_SIDE_RECV, d->num_blocks, d->block_ids);
    if (!x) {
        for (uint32_t j = d->num_skip; j < d->num_blocks; j++) k->owner[d->block_ids[j]] = 0;
        rc = tdm__kvx_fail(TDM_E_NOMEM, "out of memory");
        goto out;
    }
    x->mode = d->mode;
    x->peer = d->peer;
    x->rid = d->request_id;
    x->xid = d->transfer_id;
    x->skip = d->num_skip;
    x->tok = tok;
    x->timeout_ms = d->timeout_ms ? d->timeout_ms : k->cfg.transfer_timeout_ms;
    x->deadline = tdm__now() + x->timeout_ms / 1000.0;
    x->units_need = (uint64_t)k->layout.num_layers * (d->num_blocks - d->num_skip);
    x->state = XS_ACTIVE;
    xfer_link(k, x);
    uint64_t hid = x->handle;
    if (x->units_need == 0) {
        tdm__kvx_finish(k, x, TDM_KVX_EV_DONE, TDM_OK, "every block was already held", 0);
        *handle = hid;
        goto out;
    }
    tdm__kvx_msg m;
    tdm__kvx_msg_init(&m, TDM__KVX_XFER_REQ);
    m.rid = x->rid;
    m.xid = x->xid;
    kvx_peer *pp = tdm__kvx_peer(k, x->peer);
    x->direct = pp && (pp->rkv || tdm__kvx_nixl_peer_direct(pp));
    m.mode = x->mode | (x->direct ? TDM__KVX_MODE_DIRECT : 0);
    m.num_blocks = x->n;
    m.num_skip = x->skip;
    m.num_tokens = x->tok;
    if (tdm__kvx_queue_msg(k, x->peer, &m) != TDM_OK) {
        /* undone without an event: the caller gets the error instead */
        for (uint32_t j = x->skip; j < x->n; j++) k->owner[x->blocks[j]] = 0;
        k->xfers = x->next;
        tdm__kvx_xfer_free(k, x);
        rc = tdm__kvx_fail(TDM_E_NOMEM, "out of memory");
        goto out;
    }
    *handle = hid;
    tdm__kvx_wake(k);
out:
    pthread_mutex_unlock(&k->mu);
    return rc;
}

/* A queued request from the receiver that this new send satisfies, if any. */
static kvx_pending *take_pending(tdm_kvx *k, const kvx_xfer *x)
{
    for (kvx_pending **pp = &k->pending; *pp; pp = &(*pp)->next) {
        kvx_pending *p = *pp;
        if (p->rid != x->rid || (p->mode & 0xffu) != x->mode) continue;
        if (x->peer != TDM_KVX_PEER_ANY && p->peer != x->peer) continue;
        if (x->mode == TDM_KVX_PUSH && p->xid != x->xid) continue;
        *pp = p->next;
        return p;
    }
    return NULL;
}

int tdm_kvx_send(tdm_kvx *k, const tdm_kvx_send_desc *d, uint64_t *handle)
{
    if (!k || !handle || !TDM_STRUCT_OK(d, sizeof(tdm_kvx_send_desc)))
        return tdm__kvx_fail(TDM_E_INVAL, "NULL argument or desc struct_size too small");
    if (d->mode != TDM_KVX_PULL && d->mode != TDM_KVX_PUSH) return tdm__kvx_fail(TDM_E_INVAL, "unknown mode %u", d->mode);
    if (d->num_blocks == 0 || d->num_blocks > TDM__KVX_MAX_BLOCKS || !d->block_ids)
        return tdm__kvx_fail(TDM_E_INVAL, "num_blocks must be in [1, %u] with block_ids", TDM__KVX_MAX_BLOCKS);
    if (d->num_blocks_ready > d->num_blocks) return tdm__kvx_fail(TDM_E_INVAL, "num_blocks_ready > num_blocks");
    if (d->mode == TDM_KVX_PUSH && d->peer == TDM_KVX_PEER_ANY)
        return tdm__kvx_fail(TDM_E_INVAL, "a PUSH names its receiving peer");
    pthread_mutex_lock(&k->mu);
    int rc = TDM_OK;
    if (!k->registered) { rc = tdm__kvx_fail(TDM_E_STATE, "KV cache not registered"); goto out; }
    if (k->cfg.role == TDM_KVX_ROLE_DECODE) { rc = tdm__kvx_fail(TDM_E_STATE, "a decode-role engine does not send"); goto out; }
    if (d->peer != TDM_KVX_PEER_ANY && !tdm__kvx_peer(k, d->peer)) {
        rc = tdm__kvx_fail(TDM_E_PEER, "peer %u unknown or dead", d->peer);
        goto out;
    }
    for (uint32_t i = 0; i < d->num_blocks; i++)
        if (d->block_ids[i] >= k->layout.num_blocks) {
            rc = tdm__kvx_fail(TDM_E_RANGE, "block id %u out of range (%u blocks)", d->block_ids[i], k->layout.num_blocks);
            goto out;
        }
    for (kvx_xfer *o = k->xfers; o; o = o->next) {
        if (o->side != TDM_KVX_SIDE_SEND || o->rid != d->request_id) continue;
        if (d->mode == TDM_KVX_PULL ? o->state == XS_WAIT && o->mode == TDM_KVX_PULL
                                    : o->peer == d->peer && o->xid == d->transfer_id) {
            rc = tdm__kvx_fail(TDM_E_EXISTS, "request %llu is already being sent", (unsigned long long)d->request_id);
            goto out;
        }
    }
    kvx_xfer *x = xfer_new(k, TDM_KVX_SIDE_SEND, d->num_blocks, d->block_ids);
    if (!x) { rc = tdm__kvx_fail(TDM_E_NOMEM, "out of memory"); goto out; }
    x->mode = d->mode;
    x->peer = d->peer;
    x->rid = d->request_id;
    x->xid = d->mode == TDM_KVX_PUSH ? d->transfer_id : 0;
    x->timeout_ms = d->timeout_ms ? d->timeout_ms : k->cfg.transfer_timeout_ms;
    x->deadline = tdm__now() + x->timeout_ms / 1000.0;
    for (uint32_t l = 0; l < k->layout.num_layers; l++) x->ready[l] = d->num_blocks_ready;
    x->state = XS_WAIT;
    xfer_link(k, x);
    *handle = x->handle;
    kvx_pending *p = take_pending(k, x);
    if (p) {
        tdm__kvx_bind(k, x, p->peer, p->xid, p->n, p->skip, p->tok, (p->mode & TDM__KVX_MODE_DIRECT) != 0);
        tdm__free(p);
    }
    tdm__kvx_wake(k);
out:
    pthread_mutex_unlock(&k->mu);
    return rc;
}

int tdm_kvx_send_ready(tdm_kvx *k, uint64_t handle, uint32_t lb, uint32_t le, uint32_t nready)
{
    if (!k) return tdm__kvx_fail(TDM_E_INVAL, "kvx is NULL");
    pthread_mutex_lock(&k->mu);
    int rc = TDM_OK;
    kvx_xfer *x = tdm__kvx_find_handle(k, handle);
    if (!x || x->side != TDM_KVX_SIDE_SEND) { rc = tdm__kvx_fail(TDM_E_NOT_FOUND, "no live send transfer %llu", (unsigned long long)handle); goto out; }
    if (lb >= le || le > k->layout.num_layers || nready > x->n) {
        rc = tdm__kvx_fail(TDM_E_INVAL, "layers [%u,%u) or %u ready blocks out of range", lb, le, nready);
        goto out;
    }
    for (uint32_t l = lb; l < le; l++)
        if (x->ready[l] < nready) x->ready[l] = nready;
    x->deadline = tdm__now() + x->timeout_ms / 1000.0;
    tdm__kvx_wake(k);
out:
    pthread_mutex_unlock(&k->mu);
    return rc;
}

int tdm_kvx_cancel(tdm_kvx *k, uint64_t handle)
{
    if (!k) return tdm__kvx_fail(TDM_E_INVAL, "kvx is NULL");
    pthread_mutex_lock(&k->mu);
    int rc = TDM_OK;
    kvx_xfer *x = tdm__kvx_find_handle(k, handle);
    if (!x) { rc = tdm__kvx_fail(TDM_E_NOT_FOUND, "no live transfer %llu", (unsigned long long)handle); goto out; }
    if (x->state == XS_CANCELLING) goto out;
    if (x->side == TDM_KVX_SIDE_SEND && x->state == XS_WAIT) {
        /* not matched yet: the peer holds nothing of ours */
        tdm__kvx_finish(k, x, TDM_KVX_EV_CANCELLED, TDM_E_CANCELLED, "cancelled before a receiver asked", 0);
        goto out;
    }
    tdm__kvx_msg m;
    tdm__kvx_msg_init(&m, TDM__KVX_CANCEL);
    m.rid = x->rid;
    m.xid = x->xid;
    m.to_side = x->side == TDM_KVX_SIDE_SEND ? TDM_KVX_SIDE_RECV : TDM_KVX_SIDE_SEND;
    x->state = XS_CANCELLING;
    x->deadline = tdm__now() + k->cfg.cancel_timeout_ms / 1000.0;
    tdm__kvx_queue_msg(k, x->peer, &m);   /* if it cannot be queued, the timeout ends it */
    tdm__kvx_wake(k);
out:
    pthread_mutex_unlock(&k->mu);
    return rc;
}

/* ---- JSON configuration ------------------------------------------------------------------- */

static int json_u32(json_t *v, const char *key, uint32_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
        return tdm__kvx_fail(TDM_E_CONFIG, "\"%s\" must be a non-negative integer", key);
    *out = (uint32_t)json_integer_value(v);
    return TDM_OK;
}

int tdm_kvx_create_json(const char *json, tdm_kvx **out)
{
    tdm__kvx_err_clear();
    if (!json || !out) return tdm__kvx_fail(TDM_E_INVAL, "NULL argument");
    json_error_t jerr;
    json_t *root = json_loads(json, 0, &jerr);
    if (!root) return tdm__kvx_fail(TDM_E_CONFIG, "JSON error at line %d: %s", jerr.line, jerr.text);
    int rc = TDM_OK;
    const char *allowed[64];
    tdm_kvx_config c;
    tdm_kvx_config_init(&c);
    tdm__kvx_limits lim;
    memset(&lim, 0, sizeof(lim));
    if (!json_is_object(root)) { rc = tdm__kvx_fail(TDM_E_CONFIG, "the config must be a JSON object"); goto out; }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "engine_id")) {
            if (!json_is_string(v)) { rc = tdm__kvx_fail(TDM_E_CONFIG, "\"engine_id\" must be a string"); break; }
            c.engine_id = json_string_value(v);
        } else if (!strcmp(key, "listen")) {
            if (!json_is_string(v) && !json_is_null(v)) { rc = tdm__kvx_fail(TDM_E_CONFIG, "\"listen\" must be a string"); break; }
            c.listen_endpoint = json_is_string(v) ? json_string_value(v) : NULL;
        } else if (!strcmp(key, "role")) {
            const char *s = json_string_value(v);
            if (s && !strcmp(s, "prefill")) c.role = TDM_KVX_ROLE_PREFILL;
            else if (s && !strcmp(s, "decode")) c.role = TDM_KVX_ROLE_DECODE;
            else if (s && !strcmp(s, "both")) c.role = TDM_KVX_ROLE_BOTH;
            else { rc = tdm__kvx_fail(TDM_E_CONFIG, "\"role\" must be \"prefill\", \"decode\" or \"both\""); break; }
        } else if (!strcmp(key, "transports")) {
            size_t i;
            json_t *e;
            c.transports = 0;
            if (!json_is_array(v)) { rc = tdm__kvx_fail(TDM_E_CONFIG, "\"transports\" must be an array"); break; }
            json_array_foreach(v, i, e) {
                const char *s = json_string_value(e);
                if (s && !strcmp(s, "zmq")) c.transports |= TDM_KVX_TRANSPORT_ZMQ;
                else if (s && !strcmp(s, "shm")) c.transports |= TDM_KVX_TRANSPORT_SHM;
                else if (s && !strcmp(s, "cuda_ipc")) c.transports |= TDM_KVX_TRANSPORT_CUDA_IPC;
                else if (s && !strcmp(s, "nixl")) c.transports |= TDM_KVX_TRANSPORT_NIXL;
                else { rc = tdm__kvx_fail(TDM_E_CONFIG, "unknown transport in \"transports\""); break; }
            }
            if (rc) break;
        } else if (!strcmp(key, "curve")) {
            json_t *sk = json_object_get(v, "secret_key"), *pk = json_object_get(v, "public_key");
            json_t *al = json_object_get(v, "allowed_clients");
            if (!json_is_object(v) || !json_is_string(sk) || (pk && !json_is_string(pk)) ||
                (al && !json_is_array(al)) || json_object_size(v) != 1u + !!pk + !!al) {
                rc = tdm__kvx_fail(TDM_E_CONFIG, "\"curve\" must be {secret_key, public_key?, allowed_clients?}");
                break;
            }
            c.curve_secret_key = json_string_value(sk);
            c.curve_public_key = pk ? json_string_value(pk) : NULL;
            size_t n = al ? json_array_size(al) : 0;
            if (n > 64) { rc = tdm__kvx_fail(TDM_E_CONFIG, "at most 64 allowed clients in JSON"); break; }
            for (size_t i = 0; i < n; i++) {
                allowed[i] = json_string_value(json_array_get(al, i));
                if (!allowed[i]) { rc = tdm__kvx_fail(TDM_E_CONFIG, "allowed_clients must be strings"); break; }
            }
            c.curve_allowed_clients = allowed;
            c.num_curve_allowed_clients = (uint32_t)n;
        } else if (!strcmp(key, "heartbeat_ms")) rc = json_u32(v, key, &c.heartbeat_ms);
        else if (!strcmp(key, "peer_timeout_ms")) rc = json_u32(v, key, &c.peer_timeout_ms);
        else if (!strcmp(key, "handshake_timeout_ms")) rc = json_u32(v, key, &c.handshake_timeout_ms);
        else if (!strcmp(key, "transfer_timeout_ms")) rc = json_u32(v, key, &c.transfer_timeout_ms);
        else if (!strcmp(key, "cancel_timeout_ms")) rc = json_u32(v, key, &c.cancel_timeout_ms);
        else if (!strcmp(key, "max_chunk_bytes")) rc = json_u32(v, key, &c.max_chunk_bytes);
        else if (!strcmp(key, "shm_slots")) rc = json_u32(v, key, &c.shm_slots);
        else if (!strcmp(key, "max_peers_per_source")) rc = json_u32(v, key, &lim.max_peers_per_source);
        else if (!strcmp(key, "max_peers_per_key")) rc = json_u32(v, key, &lim.max_peers_per_key);
        else if (!strcmp(key, "peer_idle_ms")) rc = json_u32(v, key, &lim.peer_idle_ms);
        else if (!strcmp(key, "nixl_require_curve")) {
            if (!json_is_boolean(v)) rc = tdm__kvx_fail(TDM_E_CONFIG, "\"nixl_require_curve\" must be a boolean");
            else lim.nixl_require_curve = json_is_true(v);
        }
        else rc = tdm__kvx_fail(TDM_E_CONFIG, "unknown key \"%s\"", key);
        if (rc) break;
    }
    if (!rc) rc = tdm__kvx_create_lim(&c, &lim, out);
out:
    json_decref(root);
    return rc;
}
