/*
 * kvx_io.c -- the engine's I/O thread and its CURVE ZAP handler. The I/O thread owns every
 * socket: the ROUTER it listens on, one DEALER (plus a monitor) per outgoing connection. It
 * opens connections asked for by tdm_kvx_connect, runs both ends of the handshake (layout,
 * version and transport negotiation, shared-memory setup), receives and dispatches every
 * message (dropping and counting anything malformed or unexpected), flushes the control
 * messages API threads queued, sends data chunks and runs the timers (heartbeats, dead
 * peers, timeouts). It holds kvx->mu except while it waits in zmq_poll.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvx_internal.h"

#define MAX_FRAMES 4

kvx_peer *tdm__kvx_peer_any(tdm_kvx *k, uint32_t id)
{
    uint32_t i = id & 0xffffu;
    if (i >= k->num_peers || k->peers[i].id != id) return NULL;
    return &k->peers[i];
}

kvx_peer *tdm__kvx_peer(tdm_kvx *k, uint32_t id)
{
    kvx_peer *p = tdm__kvx_peer_any(k, id);
    return p && p->state == PEER_ALIVE ? p : NULL;
}

/* A fresh slot: a dead one nobody refers to any more (next generation), or a new one. */
kvx_peer *tdm__kvx_peer_new(tdm_kvx *k)
{
    uint32_t i, gen = 0;
    for (i = 0; i < k->num_peers; i++) {
        kvx_peer *p = &k->peers[i];
        if (p->state == PEER_DEAD && !p->sock && !p->mon && !p->hs_waiting) break;
    }
    if (i == k->num_peers) {
        if (k->num_peers >= k->cap_peers) return NULL;
        k->num_peers++;
    } else {
        gen = (k->peers[i].gen + 1) & 0x7fffu;
    }
    kvx_peer *p = &k->peers[i];
    tdm__kvx_peer_scales_free(p);
    memset(p, 0, sizeof(*p));
    p->gen = gen;
    p->id = (gen << 16) | i;
    return p;
}

int tdm__kvx_queue_msg(tdm_kvx *k, uint32_t peer, const tdm__kvx_msg *m)
{
    uint8_t buf[TDM__KVX_MAX_HEADER];
    size_t len;
    if (tdm__kvx_msg_encode(m, buf, sizeof(buf), &len)) return TDM_E_INTERNAL;
    kvx_out *o = tdm__malloc(sizeof(*o) + len);
    if (!o) return TDM_E_NOMEM;
    o->next = NULL;
    o->peer = peer;
    o->len = len;
    memcpy(o->data, buf, len);
    *k->outbox_tail = o;
    k->outbox_tail = &o->next;
    return TDM_OK;
}

/* Sends [routing id,] header [, payload]. TDM_E_AGAIN: nothing was sent. */
static int send_raw(tdm_kvx *k, kvx_peer *p, const void *hdr, size_t len, zmq_msg_t *payload)
{
    void *s = p->outgoing ? p->sock : k->router;
    if (!s) return TDM_E_PEER;
    int more = payload ? ZMQ_SNDMORE : 0;
    if (!p->outgoing && zmq_send(s, p->rtid, p->rtid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return errno == EAGAIN ? TDM_E_AGAIN : TDM_E_PEER;
    if (zmq_send(s, hdr, len, ZMQ_DONTWAIT | more) < 0) {
        if (!p->outgoing) zmq_send(s, "", 0, ZMQ_DONTWAIT);   /* unreachable: routing done */
        return errno == EAGAIN ? TDM_E_AGAIN : TDM_E_PEER;
    }
    if (payload && zmq_msg_send(payload, s, ZMQ_DONTWAIT) < 0) return TDM_E_IO;
    p->last_tx = tdm__now();
    return TDM_OK;
}

int tdm__kvx_send_frames(tdm_kvx *k, kvx_peer *p, const tdm__kvx_msg *m, zmq_msg_t *payload)
{
    uint8_t buf[TDM__KVX_MAX_HEADER];
    size_t len;
    if (m->type == TDM__KVX_HELLO || m->type == TDM__KVX_HELLO_ACK) {
        /* a handshake may carry KV scales: up to TDM__KVX_MAX_HELLO bytes */
        uint8_t *big = tdm__malloc(TDM__KVX_MAX_HELLO);
        if (!big) return TDM_E_NOMEM;
        int rc = tdm__kvx_msg_encode(m, big, TDM__KVX_MAX_HELLO, &len) ? TDM_E_INTERNAL
                                                                        : send_raw(k, p, big, len, payload);
        tdm__free(big);
        return rc;
    }
    if (tdm__kvx_msg_encode(m, buf, sizeof(buf), &len)) return TDM_E_INTERNAL;
    return send_raw(k, p, buf, len, payload);
}

static void flush_outbox(tdm_kvx *k)
{
    while (k->outbox) {
        kvx_out *o = k->outbox;
        kvx_peer *p = tdm__kvx_peer_any(k, o->peer);
        if (p && (p->state == PEER_ALIVE || (p->state == PEER_HANDSHAKE && p->sock))) {
            if (send_raw(k, p, o->data, o->len, NULL) == TDM_E_AGAIN) return;
        }
        k->outbox = o->next;
        if (!k->outbox) k->outbox_tail = &k->outbox;
        tdm__free(o);
    }
}

/* ---- handshake ----------------------------------------------------------------------------- */

static void fill_hello(tdm_kvx *k, tdm__kvx_hello *h)
{
    snprintf(h->engine_id, sizeof(h->engine_id), "%s", k->engine_id);
    h->role = k->cfg.role;
    h->layout = k->layout;
    h->mem_kind = k->mem_kind;
    h->head_offset = k->head_offset;
    h->transports = k->cfg.transports & (TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_SHM |
                                         (tdm__kvx_cuda_ipc_available() ? TDM_KVX_TRANSPORT_CUDA_IPC : 0));
    tdm__kvx_nixl_fill_hello(k, h);
    if (h->nixl_agent[0]) h->transports |= TDM_KVX_TRANSPORT_NIXL;
    snprintf(h->host_id, sizeof(h->host_id), "%s", k->host_id);
    if (k->kv_direct && (k->cfg.transports & TDM_KVX_TRANSPORT_SHM)) {
        snprintf(h->kv_name, sizeof(h->kv_name), "%s", k->kvseg_name);
        h->kv_size = k->kvseg_size;
        h->kv_layers = k->layout.num_layers;
        memcpy(h->kv_off, k->kv_off, sizeof(uint64_t) * h->kv_layers);
    }
    tdm__kvx_fill_scales(k, h);
}

void tdm__kvx_unmap_remote(kvx_peer *p)
{
    if (p->rkv) munmap(p->rkv, p->rkv_size);
    tdm__free(p->rkv_bases);
    p->rkv = NULL;
    p->rkv_bases = NULL;
}

/* Maps a same-host peer's shared KV read-only when we can read its blocks directly: it
 * offers one, we receive from it, the packed formats are identical, and every layer's
 * extent lies inside the segment. A segment that cannot be opened only means no direct
 * reads; one that opens but fails the checks of tdm__kvx_seg_open_ro (not our uid, not 0600,
 * another size) refuses the handshake: TDM_E_PROTOCOL with why. */
static int map_remote_kv(tdm_kvx *k, kvx_peer *p, const tdm__kvx_hello *h, char *why, size_t why_len)
{
    size_t lbytes;
    if (p->nx || !h->kv_name[0] || !p->scales_same || !(k->cfg.transports & TDM_KVX_TRANSPORT_SHM) || strcmp(h->host_id, k->host_id) ||
        k->cfg.role == TDM_KVX_ROLE_PREFILL || h->role == TDM_KVX_ROLE_DECODE || k->mem_kind != TDM_MEM_HOST ||
        tdm__kvx_compat(&h->layout, h->head_offset, &k->layout, k->head_offset, NULL, 0) != 0 ||
        tdm_kv_layout_layer_bytes(&h->layout, &lbytes) != TDM_OK)
        return TDM_OK;
    for (uint32_t l = 0; l < h->kv_layers; l++)
        if (h->kv_off[l] > h->kv_size || lbytes > h->kv_size - h->kv_off[l]) return TDM_OK;
    const uint8_t *m = NULL;
    char w[TDM__KVX_REASON_LEN];
    int rc = tdm__kvx_seg_open_ro(h->kv_name, 'k', h->kv_size, &m, w, sizeof(w));
    if (rc == TDM_E_PROTOCOL) {
        snprintf(why, why_len, "shared KV offer refused: %.90s", w);
        return rc;
    }
    if (rc) return TDM_OK;
    p->rkv_bases = tdm__calloc(h->kv_layers, sizeof(void *));
    if (!p->rkv_bases) { munmap((void *)m, h->kv_size); return TDM_OK; }
    p->rkv = (uint8_t *)m;
    p->rkv_size = h->kv_size;
    for (uint32_t l = 0; l < h->kv_layers; l++) p->rkv_bases[l] = p->rkv + h->kv_off[l];
    return TDM_OK;
}

/* Checks each direction the roles allow. */
static int check_peer_layout(tdm_kvx *k, const tdm__kvx_hello *r, char *why, size_t n)
{
    int we_send = k->cfg.role != TDM_KVX_ROLE_DECODE && r->role != TDM_KVX_ROLE_PREFILL;
    int we_recv = k->cfg.role != TDM_KVX_ROLE_PREFILL && r->role != TDM_KVX_ROLE_DECODE;
    if (we_recv && tdm__kvx_compat(&r->layout, r->head_offset, &k->layout, k->head_offset, why, n) < 0)
        return TDM_E_LAYOUT;
    if (we_send && tdm__kvx_compat(&k->layout, k->head_offset, &r->layout, r->head_offset, why, n) < 0)
        return TDM_E_LAYOUT;
    return TDM_OK;
}

static void use_zmq(tdm_kvx *k, kvx_peer *p)
{
    p->tx = p->rx = &tdm__kvx_zmq_transport;
    p->tx_ctx = p->rx_ctx = k->pool;
}

/* Takes the peer's handshake (layout, scales: copied) before it comes up. */
static int peer_adopt(tdm_kvx *k, kvx_peer *p, const tdm__kvx_hello *h, char *why, size_t why_len)
{
    p->remote = *h;
    return tdm__kvx_peer_scales(k, p, h, why, why_len);
}

/* A peer that negotiated NIXL uses it both ways. Otherwise each direction uses shared memory
 * when its segment is mapped by both sides: chunks we send go into our segment, chunks we
 * receive come from the peer's. */
static void peer_up(tdm_kvx *k, kvx_peer *p)
{
    k->handshaken = 1;
    p->state = PEER_ALIVE;
    p->last_rx = p->last_tx = tdm__now();
    if (p->nx) {
        p->tx = p->rx = &tdm__kvx_nixl_transport;
        p->tx_ctx = p->rx_ctx = p->nx;
        return;
    }
    use_zmq(k, p);
    if (tdm__kvx_shm_can_send(p->shm)) { p->tx = &tdm__kvx_shm_transport; p->tx_ctx = p->shm; }
    if (tdm__kvx_shm_can_recv(p->shm)) { p->rx = &tdm__kvx_shm_transport; p->rx_ctx = p->shm; }
}

/* The server's side of shared memory for a HELLO h: map the client's segment read-only if it
 * offers one for chunks we receive, create our own for chunks we send and name it in the ACK.
 * Bit 2 of the ACK's transports says the client's segment is mapped. A segment that opens but
 * fails a check refuses the handshake (TDM_E_PROTOCOL, why). */
static int server_shm(tdm_kvx *k, kvx_peer *p, const tdm__kvx_hello *h, tdm__kvx_hello *ack, char *why, size_t why_len)
{
    ack->transports &= ~(uint32_t)TDM_KVX_TRANSPORT_SHM;
    if (!(k->cfg.transports & TDM_KVX_TRANSPORT_SHM) || !(h->transports & TDM_KVX_TRANSPORT_SHM) ||
        strcmp(h->host_id, k->host_id))
        return TDM_OK;
    int we_recv = k->cfg.role != TDM_KVX_ROLE_PREFILL && h->role != TDM_KVX_ROLE_DECODE;
    int we_send = k->cfg.role != TDM_KVX_ROLE_DECODE && h->role != TDM_KVX_ROLE_PREFILL;
    int theirs = h->shm_name[0] && we_recv && h->slot_bytes == k->cfg.max_chunk_bytes;
    if (!theirs && !we_send) return TDM_OK;
    if (tdm__kvx_shm_new(&p->shm)) { snprintf(why, why_len, "out of memory"); return TDM_E_NOMEM; }
    if (theirs) {
        char w[TDM__KVX_REASON_LEN];
        int rc = tdm__kvx_shm_attach(p->shm, h->shm_name, h->shm_size, h->slot_bytes, w, sizeof(w));
        if (rc == TDM_E_PROTOCOL) {
            snprintf(why, why_len, "shared-memory offer refused: %.90s", w);
            return rc;
        }
        if (rc == TDM_OK) {
            ack->transports |= TDM_KVX_TRANSPORT_SHM;
            tdm__kvx_stage(k, TDM__KVX_STAGE_SERVER_MAPPED);
        }
    }
    if (we_send && tdm__kvx_shm_create(p->shm, k->cfg.max_chunk_bytes, k->cfg.shm_slots, k->shm_seq++) == TDM_OK) {
        snprintf(ack->shm_name, sizeof(ack->shm_name), "%s", tdm__kvx_shm_name(p->shm));
        ack->shm_size = tdm__kvx_shm_size(p->shm);
        ack->slot_bytes = k->cfg.max_chunk_bytes;
        tdm__kvx_stage(k, TDM__KVX_STAGE_SERVER_CREATED);
    }
    if (!tdm__kvx_shm_can_send(p->shm) && !tdm__kvx_shm_can_recv(p->shm)) {
        tdm__kvx_shm_destroy(p->shm);
        p->shm = NULL;
    }
    return TDM_OK;
}

/* The server's side of NIXL: used when both offer it and the client's agent loads here; it
 * then carries every chunk. Otherwise the ACK drops the NIXL offer. */
static void server_nixl(tdm_kvx *k, kvx_peer *p, const tdm__kvx_hello *h, tdm__kvx_hello *ack)
{
    char nwhy[TDM__KVX_REASON_LEN];
    /* nixl_require_curve: an accepted NIXL peer may read our whole registered region, so
     * only a peer whose CURVE key we allowed gets it (docs/protocol.md section 7) */
    int allowed = !k->lim.nixl_require_curve || (k->curve && p->key[0]);
    if (allowed && (ack->transports & TDM_KVX_TRANSPORT_NIXL) &&
        tdm__kvx_nixl_peer_open(k, p, h, nwhy, sizeof(nwhy)) == TDM_OK)
        return;
    ack->transports &= ~(uint32_t)TDM_KVX_TRANSPORT_NIXL;
    ack->nixl_agent[0] = '\0';
    ack->nixl_md_len = ack->nixl_rgn_len = 0;
}

static int engine_taken(tdm_kvx *k, const char *id, uint32_t except, int *outgoing)
{
    for (uint32_t i = 0; i < k->num_peers; i++)
        if (i != except && k->peers[i].state == PEER_ALIVE && !strcmp(k->peers[i].remote.engine_id, id)) {
            *outgoing = k->peers[i].outgoing;
            return (int)i;
        }
    return -1;
}

/* Accepted peers from src (and of key, when not "") other than slot except: 0 or the reason
 * why one more would exceed max_peers_per_source / max_peers_per_key. */
static int peer_caps(tdm_kvx *k, const char *src, const char *key, int except, char *why, size_t n)
{
    uint32_t from_src = 0, of_key = 0;
    for (uint32_t i = 0; i < k->num_peers; i++) {
        const kvx_peer *q = &k->peers[i];
        if ((int)i == except || q->outgoing || q->state != PEER_ALIVE) continue;
        from_src += !strcmp(q->src, src);
        of_key += key[0] && !strcmp(q->key, key);
    }
    if (from_src >= k->lim.max_peers_per_source) {
        snprintf(why, n, "too many peers from %.40s (max_peers_per_source %u)", src[0] ? src : "ipc",
                 k->lim.max_peers_per_source);
        return TDM_E_NO_SPACE;
    }
    if (of_key >= k->lim.max_peers_per_key) {
        snprintf(why, n, "too many peers of this CURVE key (max_peers_per_key %u)", k->lim.max_peers_per_key);
        return TDM_E_NO_SPACE;
    }
    return TDM_OK;
}

/* All slots taken: the accepted peer that has started no transfer for the longest time, at
 * least peer_idle_ms after its HELLO, gives up its slot. 1 when one did. */
static int reclaim_idle_peer(tdm_kvx *k)
{
    double now = tdm__now(), idle = k->lim.peer_idle_ms / 1000.0;
    kvx_peer *best = NULL;
    for (uint32_t i = 0; i < k->num_peers; i++) {
        kvx_peer *q = &k->peers[i];
        if (q->outgoing || q->state != PEER_ALIVE || q->used || now - q->t_hello < idle) continue;
        int busy = 0;
        for (kvx_xfer *x = k->xfers; x && !busy; x = x->next) busy = x->peer == q->id;
        if (!busy && (!best || q->t_hello < best->t_hello)) best = q;
    }
    if (!best) return 0;
    tdm__kvx_peer_lost(k, best, TDM_E_PEER, "slot reclaimed: no transfer since its HELLO");
    k->peers_reclaimed++;
    return 1;
}

/* Whether a live incoming peer was heard from within two heartbeat intervals: a HELLO
 * in its name then comes from a second connection of a running engine, not a restart. */
static int peer_heard_lately(const tdm_kvx *k, const kvx_peer *p)
{
    return tdm__now() - p->last_rx <= 2.0 * k->cfg.heartbeat_ms / 1000.0;
}

static void on_hello(tdm_kvx *k, const uint8_t *rtid, size_t rtid_len, const tdm__kvx_msg *m, int decode_rc,
                     const char *decode_why, const char *src, const char *key)
{
    tdm__kvx_msg a;
    tdm__kvx_msg_init(&a, TDM__KVX_HELLO_ACK);
    kvx_peer tmp;
    memset(&tmp, 0, sizeof(tmp));
    memcpy(tmp.rtid, rtid, rtid_len);
    tmp.rtid_len = rtid_len;
    if (k->registered) fill_hello(k, &a.hello);
    else snprintf(a.hello.engine_id, sizeof(a.hello.engine_id), "%s", k->engine_id);
    if (!k->registered) {
        /* a complete but dummy layout keeps the answer decodable */
        tdm_kv_layout_init(&a.hello.layout, TDM_KV_LAYOUT_VLLM_NHD, 1, 1, 1, 1, 1, TDM_DTYPE_FP16);
        snprintf(a.hello.host_id, sizeof(a.hello.host_id), "%s", k->host_id);
    }
    int st = TDM_OK;
    char why[TDM__KVX_REASON_LEN] = "";
    int other_out = 0, other = -1;
    if (decode_rc == TDM_E_VERSION) { st = TDM_E_VERSION; snprintf(why, sizeof(why), "%s", decode_why); }
    else if (decode_rc) { st = TDM_E_PROTOCOL; snprintf(why, sizeof(why), "malformed HELLO: %.100s", decode_why); }
    else if (!k->registered) { st = TDM_E_STATE; snprintf(why, sizeof(why), "the server has not registered its KV cache"); }
    else if (check_peer_layout(k, &m->hello, why, sizeof(why))) st = TDM_E_LAYOUT;
    else if ((other = engine_taken(k, m->hello.engine_id, UINT32_MAX, &other_out)) >= 0 &&
             (other_out || peer_heard_lately(k, &k->peers[other]))) {
        /* we connected to it, or its live connection still talks: a duplicate HELLO, refused
         * without touching the live connection; a restarted engine's old connection falls
         * silent, and its HELLO is taken as a reconnect once it has */
        st = TDM_E_EXISTS;
        snprintf(why, sizeof(why), "already connected to engine '%s'", m->hello.engine_id);
    }
    if (!st) st = peer_caps(k, src, key, other, why, sizeof(why));
    kvx_peer *p = NULL;
    if (!st) {
        if (other >= 0) tdm__kvx_peer_lost(k, &k->peers[other], TDM_E_PEER, "the peer reconnected");
        p = tdm__kvx_peer_new(k);
        if (!p && reclaim_idle_peer(k)) p = tdm__kvx_peer_new(k);
        if (p) {
            snprintf(p->src, sizeof(p->src), "%s", src);   /* before server_nixl reads it */
            snprintf(p->key, sizeof(p->key), "%s", key);
        }
        if (!p) { st = TDM_E_NO_SPACE; snprintf(why, sizeof(why), "too many peers"); }
        else if (!(st = peer_adopt(k, p, &m->hello, why, sizeof(why)))) {
            server_nixl(k, p, &m->hello, &a.hello);
            if (p->nx) a.hello.transports &= ~(uint32_t)TDM_KVX_TRANSPORT_SHM;
            else if (!(st = map_remote_kv(k, p, &m->hello, why, sizeof(why))))
                st = server_shm(k, p, &m->hello, &a.hello, why, sizeof(why));
        }
        if (st && p) {
            tdm__kvx_shm_destroy(p->shm);
            p->shm = NULL;
            tdm__kvx_unmap_remote(p);
            tdm__kvx_nixl_peer_close(k, p);
            p->state = PEER_DEAD;
        }
    }
    if (st) {
        if (st == TDM_E_NO_SPACE) k->peers_refused++;
        a.status = st;
        snprintf(a.reason, sizeof(a.reason), "%s", why);
        a.hello.scale_kind = TDM_KV_SCALE_NONE;   /* a refusal needs no scales, segment */
        a.hello.shm_name[0] = '\0';               /* or NIXL metadata */
        a.hello.shm_size = a.hello.slot_bytes = 0;
        a.hello.nixl_agent[0] = '\0';
        a.hello.nixl_md_len = a.hello.nixl_rgn_len = 0;
        tdm__kvx_send_frames(k, &tmp, &a, NULL);
        return;
    }
    memcpy(p->rtid, rtid, rtid_len);
    p->rtid_len = rtid_len;
    p->t_hello = tdm__now();
    peer_up(k, p);
    tdm__kvx_send_frames(k, p, &a, NULL);
}

static void hs_finish(tdm_kvx *k, kvx_peer *p, int status, const char *reason)
{
    if (status) {
        if (p->mon) { zmq_close(p->mon); p->mon = NULL; }
        if (p->sock) { zmq_close(p->sock); p->sock = NULL; }
        tdm__kvx_shm_destroy(p->shm);
        p->shm = NULL;
        tdm__kvx_nixl_peer_close(k, p);
        p->state = PEER_DEAD;
    }
    p->hs_status = status;
    snprintf(p->hs_reason, sizeof(p->hs_reason), "%s", reason);
    p->hs_done = 1;
    pthread_cond_broadcast(&k->cond);
}

static void send_ping(tdm_kvx *k, kvx_peer *p, double now);

static void on_hello_ack(tdm_kvx *k, kvx_peer *p, const tdm__kvx_msg *m)
{
    char why[TDM__KVX_REASON_LEN];
    int other_out;
    tdm__kvx_stage(k, TDM__KVX_STAGE_CLIENT_ACK);
    tdm__kvx_shm_unlink(p->shm);   /* the server has mapped our segment, or never will */
    if (m->status) { hs_finish(k, p, m->status, m->reason); return; }
    if (check_peer_layout(k, &m->hello, why, sizeof(why))) { hs_finish(k, p, TDM_E_LAYOUT, why); return; }
    if (engine_taken(k, m->hello.engine_id, p->id & 0xffffu, &other_out) >= 0) {
        hs_finish(k, p, TDM_E_EXISTS, "already connected to that engine");
        return;
    }
    if (!(m->hello.transports & TDM_KVX_TRANSPORT_SHM)) tdm__kvx_shm_drop_tx(p->shm);
    int rc = peer_adopt(k, p, &m->hello, why, sizeof(why));
    /* the server selected NIXL: its agent must load here too */
    if (!rc && (m->hello.transports & TDM_KVX_TRANSPORT_NIXL))
        rc = tdm__kvx_nixl_peer_open(k, p, &m->hello, why, sizeof(why));
    if (!rc) rc = map_remote_kv(k, p, &m->hello, why, sizeof(why));
    if (rc) { hs_finish(k, p, rc, why); return; }
    /* the server's segment, for the chunks it sends us: only if we offered shared memory */
    const tdm__kvx_hello *h = &m->hello;
    if (!p->nx && h->shm_name[0] && p->shm && k->cfg.role != TDM_KVX_ROLE_PREFILL && h->role != TDM_KVX_ROLE_DECODE) {
        char w[TDM__KVX_REASON_LEN];
        rc = tdm__kvx_shm_attach(p->shm, h->shm_name, h->shm_size, h->slot_bytes, w, sizeof(w));
        if (rc) {
            snprintf(why, sizeof(why), "the server's shared-memory segment: %.90s", w);
            hs_finish(k, p, rc == TDM_E_PROTOCOL ? TDM_E_PROTOCOL : TDM_E_IO, why);
            return;
        }
        tdm__kvx_stage(k, TDM__KVX_STAGE_CLIENT_MAPPED);
    }
    if (!tdm__kvx_shm_can_send(p->shm) && !tdm__kvx_shm_can_recv(p->shm)) {
        tdm__kvx_shm_destroy(p->shm);
        p->shm = NULL;
    }
    peer_up(k, p);
    /* tells the server we have mapped its segment: it unlinks the name on our first message */
    if (tdm__kvx_shm_can_recv(p->shm)) send_ping(k, p, tdm__now());
    hs_finish(k, p, TDM_OK, "");
}

static void open_dealer(tdm_kvx *k, kvx_peer *p)
{
    char mon_ep[96];
    int zero = 0, hwm = 4096, ivl = (int)k->cfg.handshake_timeout_ms;
    p->sock = zmq_socket(k->zctx, ZMQ_DEALER);
    if (!p->sock) { hs_finish(k, p, TDM_E_IO, zmq_strerror(errno)); return; }
    zmq_setsockopt(p->sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(p->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(p->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(p->sock, ZMQ_HANDSHAKE_IVL, &ivl, sizeof(ivl));
    if (p->srvkey[0]) {
        zmq_setsockopt(p->sock, ZMQ_CURVE_SERVERKEY, p->srvkey, 40);
        zmq_setsockopt(p->sock, ZMQ_CURVE_PUBLICKEY, k->pub, 40);
        zmq_setsockopt(p->sock, ZMQ_CURVE_SECRETKEY, k->sec, 40);
    }
    snprintf(mon_ep, sizeof(mon_ep), "inproc://tdm-kvx-mon-%p-%u", (void *)k, p->id);
    if (zmq_socket_monitor(p->sock, mon_ep, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                                ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                                ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) == 0) {
        p->mon = zmq_socket(k->zctx, ZMQ_PAIR);
        if (p->mon && zmq_connect(p->mon, mon_ep) != 0) { zmq_close(p->mon); p->mon = NULL; }
    }
    if (zmq_connect(p->sock, p->ep) != 0) {
        char why[160];
        snprintf(why, sizeof(why), "zmq_connect: %s", zmq_strerror(errno));
        hs_finish(k, p, TDM_E_IO, why);
        return;
    }
    tdm__kvx_msg h;
    tdm__kvx_msg_init(&h, TDM__KVX_HELLO);
    fill_hello(k, &h.hello);
    k->handshaken = 1;   /* our scales are on their way: fixed from now on */
    /* shared memory: our segment for the chunks we may send; the server creates its own */
    if ((k->cfg.transports & TDM_KVX_TRANSPORT_SHM) && tdm__kvx_shm_new(&p->shm) != TDM_OK)
        h.hello.transports &= ~(uint32_t)TDM_KVX_TRANSPORT_SHM;
    if (p->shm && k->cfg.role != TDM_KVX_ROLE_DECODE &&
        tdm__kvx_shm_create(p->shm, k->cfg.max_chunk_bytes, k->cfg.shm_slots, k->shm_seq++) == TDM_OK) {
        snprintf(h.hello.shm_name, sizeof(h.hello.shm_name), "%s", tdm__kvx_shm_name(p->shm));
        h.hello.shm_size = tdm__kvx_shm_size(p->shm);
        h.hello.slot_bytes = k->cfg.max_chunk_bytes;
        tdm__kvx_stage(k, TDM__KVX_STAGE_CLIENT_CREATED);
    }
    if (tdm__kvx_send_frames(k, p, &h, NULL) != TDM_OK) hs_finish(k, p, TDM_E_IO, "cannot send HELLO");
}

static void on_monitor(tdm_kvx *k, kvx_peer *p)
{
    zmq_msg_t f;
    for (;;) {
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, p->mon, ZMQ_DONTWAIT) < 0) { zmq_msg_close(&f); return; }
        uint16_t ev = 0;
        if (zmq_msg_size(&f) >= 2) memcpy(&ev, zmq_msg_data(&f), 2);
        int more = zmq_msg_more(&f);
        zmq_msg_close(&f);
        while (more) {
            zmq_msg_init(&f);
            if (zmq_msg_recv(&f, p->mon, 0) < 0) { zmq_msg_close(&f); break; }
            more = zmq_msg_more(&f);
            zmq_msg_close(&f);
        }
        if (p->state == PEER_HANDSHAKE && ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
            hs_finish(k, p, TDM_E_AUTH, "the server refused our CURVE key");
            return;
        }
        if (p->state == PEER_HANDSHAKE && ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
            hs_finish(k, p, TDM_E_AUTH, "ZeroMQ security handshake failed (CURVE required by one side only?)");
            return;
        }
    }
}

/* ---- receive and dispatch ------------------------------------------------------------------ */

static kvx_peer *peer_by_rtid(tdm_kvx *k, const void *rtid, size_t len)
{
    for (uint32_t i = 0; i < k->num_peers; i++) {
        kvx_peer *p = &k->peers[i];
        if (!p->outgoing && p->state == PEER_ALIVE && p->rtid_len == len && !memcmp(p->rtid, rtid, len)) return p;
    }
    return NULL;
}

/* frames[0] is the header, frames[1] the optional payload. p NULL: from the ROUTER, unknown. */
static void dispatch(tdm_kvx *k, kvx_peer *p, const zmq_msg_t *rt, zmq_msg_t *frames, int nf)
{
    tdm__kvx_msg m;
    char why[TDM__KVX_REASON_LEN];
    int rc = tdm__kvx_msg_decode(zmq_msg_data(&frames[0]), zmq_msg_size(&frames[0]), &m, why, sizeof(why));
    if (!p && rt) {
        /* unknown routing id: only a HELLO (or a HELLO of another version) is acceptable */
        size_t rl = zmq_msg_size(rt);
        const char *src = zmq_msg_gets(&frames[0], "Peer-Address");
        const char *key = zmq_msg_gets(&frames[0], "User-Id");
        if (!src) src = "";
        if (!key) key = "";
        if (rl == 0 || rl > sizeof(p->rtid)) { k->st.msgs_rejected++; return; }
        if ((rc == TDM_OK && m.type == TDM__KVX_HELLO && nf == 1) || rc == TDM_E_VERSION) {
            on_hello(k, zmq_msg_data((zmq_msg_t *)rt), rl, &m, rc, why, src, key);
            return;
        }
        if (rc == TDM_E_PROTOCOL && m.type == TDM__KVX_HELLO && nf == 1) {
            /* a malformed HELLO is refused with the reason (and counted) */
            k->st.msgs_rejected++;
            on_hello(k, zmq_msg_data((zmq_msg_t *)rt), rl, &m, rc, why, src, key);
            return;
        }
        k->st.msgs_rejected++;
        return;
    }
    if (rc == TDM_E_PROTOCOL && p->state == PEER_HANDSHAKE && m.type == TDM__KVX_HELLO_ACK) {
        /* a malformed answer (e.g. invalid KV scales) fails the handshake with the reason */
        char r[TDM__KVX_REASON_LEN];
        snprintf(r, sizeof(r), "malformed HELLO_ACK: %.100s", why);
        k->st.msgs_rejected++;
        hs_finish(k, p, TDM_E_PROTOCOL, r);
        return;
    }
    if (rc != TDM_OK || (nf == 2 && m.type != TDM__KVX_DATA)) { k->st.msgs_rejected++; return; }
    if (p->state == PEER_HANDSHAKE) {
        if (m.type == TDM__KVX_HELLO_ACK) on_hello_ack(k, p, &m);
        else k->st.msgs_rejected++;
        return;
    }
    if (p->state != PEER_ALIVE) { k->st.msgs_rejected++; return; }
    if (m.type != TDM__KVX_PING && m.type != TDM__KVX_BYE) p->used = 1; /* keeps its slot */
    p->last_rx = tdm__now();
    if (!p->outgoing && tdm__kvx_shm_named(p->shm)) {
        /* the client's first message after our HELLO_ACK: it has mapped our segment */
        tdm__kvx_stage(k, TDM__KVX_STAGE_SERVER_CONFIRM);
        tdm__kvx_shm_unlink(p->shm);
    }
    switch (m.type) {
    case TDM__KVX_XFER_REQ: tdm__kvx_on_xfer_req(k, p, &m); break;
    case TDM__KVX_DATA: tdm__kvx_on_data(k, p, &m, nf == 2 ? &frames[1] : NULL); break;
    case TDM__KVX_CREDIT:
        if (!p->tx->credit || p->tx->credit(p->tx_ctx, m.slot) != TDM_OK) k->st.msgs_rejected++;
        else p->tx_blocked = 0;
        break;
    case TDM__KVX_DONE: case TDM__KVX_FAIL: case TDM__KVX_CANCEL: case TDM__KVX_CANCEL_ACK:
        tdm__kvx_on_control(k, p, &m);
        break;
    case TDM__KVX_PING: break;
    case TDM__KVX_BYE: {
        char r[TDM__KVX_REASON_LEN + 32];
        snprintf(r, sizeof(r), "peer left: %s", m.reason);
        tdm__kvx_peer_lost(k, p, TDM_E_PEER, r);
        break;
    }
    default: k->st.msgs_rejected++; break;   /* HELLO / HELLO_ACK after the handshake */
    }
}

/* Reads up to `budget` messages from a socket. */
static void drain(tdm_kvx *k, void *s, kvx_peer *from, int router, int budget)
{
    zmq_msg_t rt, frames[MAX_FRAMES];
    while (budget-- > 0) {
        zmq_msg_init(&rt);
        if (router) {
            if (zmq_msg_recv(&rt, s, ZMQ_DONTWAIT) < 0) { zmq_msg_close(&rt); return; }
        }
        int nf = 0, more = 1, bad = 0;
        while (more) {
            zmq_msg_t *f = nf < MAX_FRAMES ? &frames[nf] : NULL;
            zmq_msg_t junk;
            if (!f) { f = &junk; bad = 1; }
            zmq_msg_init(f);
            if (zmq_msg_recv(f, s, nf == 0 && !router ? ZMQ_DONTWAIT : 0) < 0) {
                zmq_msg_close(f);
                if (nf == 0 && !router) { zmq_msg_close(&rt); return; }
                bad = 1;
                break;
            }
            more = zmq_msg_more(f);
            if (f == &junk) zmq_msg_close(f);
            else nf++;
        }
        if (bad || nf == 0 || nf > 2 || zmq_msg_size(&frames[0]) > TDM__KVX_MAX_HELLO) k->st.msgs_rejected++;
        else {
            kvx_peer *p = from;
            if (router) p = peer_by_rtid(k, zmq_msg_data(&rt), zmq_msg_size(&rt));
            if (from && from->state != PEER_HANDSHAKE && from->state != PEER_ALIVE) k->st.msgs_rejected++;
            else dispatch(k, p, router ? &rt : NULL, frames, nf);
        }
        for (int i = 0; i < nf; i++) zmq_msg_close(&frames[i]);
        zmq_msg_close(&rt);
        if (from && !from->sock) return;   /* closed while dispatching */
    }
}

/* ---- the loop ------------------------------------------------------------------------------ */

static void send_ping(tdm_kvx *k, kvx_peer *p, double now)
{
    tdm__kvx_msg m;
    tdm__kvx_msg_init(&m, TDM__KVX_PING);
    m.time_ms = (uint64_t)(now * 1000.0);
    tdm__kvx_send_frames(k, p, &m, NULL);
}

static void io_timers(tdm_kvx *k, double now)
{
    double hb = k->cfg.heartbeat_ms / 1000.0, dead = k->cfg.peer_timeout_ms / 1000.0;
    /* The loop runs its timers at least every 50 ms. A longer gap is a stall of this thread
     * (descheduled on a loaded host, or the engine's lock held): the peers' messages of that
     * time may still be queued unread, so their silence during it is not counted. */
    double stall = k->io_last_timers > 0 ? now - k->io_last_timers : 0;
    k->io_last_timers = now;
    if (stall > hb && stall > 0.25)
        for (uint32_t i = 0; i < k->num_peers; i++)
            if (k->peers[i].state == PEER_ALIVE) k->peers[i].last_rx = TDM_MIN(now, k->peers[i].last_rx + stall);
    for (uint32_t i = 0; i < k->num_peers; i++) {
        kvx_peer *p = &k->peers[i];
        if (p->state == PEER_HANDSHAKE && p->sock && now > p->hs_deadline)
            hs_finish(k, p, p->srvkey[0] ? TDM_E_AUTH : TDM_E_TIMEOUT,
                      p->srvkey[0] ? "no answer within the handshake timeout (CURVE key refused?)"
                                   : "no answer within the handshake timeout");
        if (p->state != PEER_ALIVE) continue;
        if (now - p->last_rx > dead) {
            char r[96];
            snprintf(r, sizeof(r), "no message from the peer for %u ms", k->cfg.peer_timeout_ms);
            tdm__kvx_peer_lost(k, p, TDM_E_PEER, r);
            continue;
        }
        if (now - p->last_tx >= hb) send_ping(k, p, now);
    }
    tdm__kvx_timers(k, now);
}

static void io_shutdown(tdm_kvx *k)
{
    tdm__kvx_msg m;
    tdm__kvx_msg_init(&m, TDM__KVX_BYE);
    snprintf(m.reason, sizeof(m.reason), "engine destroyed");
    int linger = 200;
    for (uint32_t i = 0; i < k->num_peers; i++) {
        kvx_peer *p = &k->peers[i];
        if (p->state == PEER_ALIVE) tdm__kvx_send_frames(k, p, &m, NULL);
        if (p->mon) zmq_close(p->mon);
        if (p->sock) {
            zmq_setsockopt(p->sock, ZMQ_LINGER, &linger, sizeof(linger));
            zmq_close(p->sock);
        }
        p->mon = p->sock = NULL;
    }
    if (k->router) {
        zmq_setsockopt(k->router, ZMQ_LINGER, &linger, sizeof(linger));
        zmq_close(k->router);
        k->router = NULL;
    }
}

void *tdm__kvx_io_main(void *arg)
{
    tdm_kvx *k = arg;
    zmq_pollitem_t items[2 + 2 * 256];
    uint32_t owner[2 + 2 * 256];
    pthread_mutex_lock(&k->mu);
    while (!k->stop) {
        for (uint32_t i = 0; i < k->num_peers; i++) {
            kvx_peer *p = &k->peers[i];
            if (p->state == PEER_HANDSHAKE && p->outgoing && !p->sock && !p->hs_done) open_dealer(k, p);
        }
        flush_outbox(k);
        int more = tdm__kvx_pump(k, 4);
        more |= tdm__kvx_nixl_progress(k);
        int n = 0;
        items[n] = (zmq_pollitem_t){ NULL, k->wake_fd, ZMQ_POLLIN, 0 };
        owner[n++] = UINT32_MAX;
        if (k->router) {
            items[n] = (zmq_pollitem_t){ k->router, 0, ZMQ_POLLIN, 0 };
            owner[n++] = UINT32_MAX - 1;
        }
        for (uint32_t i = 0; i < k->num_peers; i++) {
            kvx_peer *p = &k->peers[i];
            if (p->sock) { items[n] = (zmq_pollitem_t){ p->sock, 0, ZMQ_POLLIN, 0 }; owner[n++] = i; }
            if (p->mon) { items[n] = (zmq_pollitem_t){ p->mon, 0, ZMQ_POLLIN, 0 }; owner[n++] = i | 0x80000000u; }
        }
        long tmo = more || k->outbox ? 0 : TDM_MIN(50, (long)k->cfg.heartbeat_ms / 4 + 1);
        pthread_mutex_unlock(&k->mu);
        int r = zmq_poll(items, n, tmo);
        pthread_mutex_lock(&k->mu);
        if (r < 0 && errno == ETERM) break;
        for (int i = 0; r > 0 && i < n; i++) {
            if (!(items[i].revents & ZMQ_POLLIN)) continue;
            if (owner[i] == UINT32_MAX) {
                uint64_t v;
                ssize_t rr = read(k->wake_fd, &v, sizeof(v));
                (void)rr;
                for (uint32_t j = 0; j < k->num_peers; j++) k->peers[j].tx_blocked = 0;
            } else if (owner[i] == UINT32_MAX - 1) {
                drain(k, k->router, NULL, 1, 64);
            } else if (owner[i] & 0x80000000u) {
                kvx_peer *p = &k->peers[owner[i] & 0x7fffffffu];
                if (p->mon == items[i].socket) on_monitor(k, p);
            } else {
                kvx_peer *p = &k->peers[owner[i]];
                if (p->sock == items[i].socket) drain(k, p->sock, p, 0, 64);
            }
        }
        if (k->test_stall_ms) {   /* tests: the thread descheduled before its timers */
            useconds_t us = (useconds_t)k->test_stall_ms * 1000;
            k->test_stall_ms = 0;
            pthread_mutex_unlock(&k->mu);
            usleep(us);
            pthread_mutex_lock(&k->mu);
        }
        io_timers(k, tdm__now());
    }
    io_shutdown(k);
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

/* ---- ZAP (CURVE authentication) ------------------------------------------------------------ */

int tdm__kvx_zap_bind(tdm_kvx *k)
{
    void *s = zmq_socket(k->zctx, ZMQ_REP);
    if (!s) return tdm__kvx_fail(TDM_E_IO, "zap socket: %s", zmq_strerror(errno));
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(s, "inproc://zeromq.zap.01") != 0) {
        zmq_close(s);
        return tdm__kvx_fail(TDM_E_IO, "zap bind: %s", zmq_strerror(errno));
    }
    k->zap_sock = s;
    if (pthread_create(&k->zap_thread, NULL, tdm__kvx_zap_main, k) != 0) {
        zmq_close(s);
        k->zap_sock = NULL;
        return tdm__kvx_fail(TDM_E_IO, "cannot start the ZAP thread");
    }
    k->zap_started = 1;
    return TDM_OK;
}

void *tdm__kvx_zap_main(void *arg)
{
    tdm_kvx *k = arg;
    void *s = k->zap_sock;
    for (;;) {
        zmq_msg_t f[8];
        int nf = 0, more = 1, err = 0;
        while (more) {
            zmq_msg_t junk, *m = nf < 8 ? &f[nf] : &junk;
            zmq_msg_init(m);
            if (zmq_msg_recv(m, s, 0) < 0) { zmq_msg_close(m); err = 1; break; }
            more = zmq_msg_more(m);
            if (m == &junk) zmq_msg_close(m);
            else nf++;
        }
        if (err && errno == ETERM) {
            for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
            break;
        }
        const char *code = "400", *text = "not allowed";
        char user[41] = "";
        if (nf >= 7 && zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) &&
            zmq_msg_size(&f[6]) == 32) {
            char z[41];
            zmq_z85_encode(z, zmq_msg_data(&f[6]), 32);
            for (uint32_t i = 0; i < k->num_allowed; i++)
                if (!memcmp(z, k->allowed[i], 40)) { code = "200"; text = "OK"; }
            if (code[0] == '2') memcpy(user, z, sizeof(user)); /* User-Id: per-key peer caps */
        }
        if (nf >= 2) {
            zmq_send(s, "1.0", 3, ZMQ_SNDMORE);
            zmq_send(s, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
            zmq_send(s, code, 3, ZMQ_SNDMORE);
            zmq_send(s, text, strlen(text), ZMQ_SNDMORE);
            zmq_send(s, user, strlen(user), ZMQ_SNDMORE);
            zmq_send(s, "", 0, 0);
        }
        for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
    }
    zmq_close(s);
    return NULL;
}
