/*
 * kvx_xfer.c -- the per-transfer state machines (docs/protocol.md section "States").
 * Sender: WAIT (declared, no receiver request yet) -> ACTIVE (sending chunks as they become
 * ready) -> DRAIN (everything sent, waiting for DONE) -> final. Receiver: ACTIVE (request
 * sent, chunks landing) -> final. Either: CANCELLING (waiting for CANCEL_ACK) -> final.
 * Final means: one event queued, receive reservations released, the transfer freed; any later
 * message for it is dropped, so failure is sticky. Also: the chunk planner for streaming,
 * the receiver's checks of every DATA message before it touches memory, and the timers.
 * Every function here runs with kvx->mu held.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kvx_internal.h"

#define MAX_PENDING 4096

void tdm__kvx_xfer_free(tdm_kvx *k, kvx_xfer *x)
{
    (void)k;
    tdm__free(x->blocks);
    tdm__free(x->ready);
    tdm__free(x->sent);
    tdm__free(x->got);
    tdm__free(x);
}

static int got_bit(const kvx_xfer *x, uint32_t l, uint32_t b)
{
    size_t i = (size_t)l * x->n + b;
    return (x->got[i >> 3] >> (i & 7)) & 1;
}

static void set_bit(kvx_xfer *x, uint32_t l, uint32_t b)
{
    size_t i = (size_t)l * x->n + b;
    x->got[i >> 3] |= (uint8_t)(1u << (i & 7));
}

/* Leading blocks complete in every layer (the prefix that a host may keep). */
static uint32_t blocks_done(const tdm_kvx *k, const kvx_xfer *x)
{
    if (x->side == TDM_KVX_SIDE_SEND) return x->state == XS_DRAIN ? x->n : 0;
    uint32_t b = x->skip;
    for (; b < x->n; b++)
        for (uint32_t l = 0; l < k->layout.num_layers; l++)
            if (!got_bit(x, l, b)) return b;
    return b;
}

void tdm__kvx_event(tdm_kvx *k, kvx_xfer *x, uint32_t type, int status, const char *reason)
{
    kvx_event_node *e = tdm__calloc(1, sizeof(*e));
    if (!e) return;   /* out of memory: the event is lost, the transfer still ends */
    e->ev.struct_size = sizeof(e->ev);
    e->ev.type = type;
    e->ev.side = x->side;
    e->ev.status = status;
    e->ev.handle = x->handle;
    e->ev.request_id = x->rid;
    e->ev.transfer_id = x->xid;
    e->ev.peer = x->peer;
    e->ev.num_blocks_done = blocks_done(k, x);
    e->ev.bytes = x->bytes;
    snprintf(e->ev.reason, sizeof(e->ev.reason), "%s", reason ? reason : "");
    int was_empty = k->ev_head == NULL;
    *k->ev_tail = e;
    k->ev_tail = &e->next;
    k->ev_count++;
    if (was_empty) {
        uint64_t one = 1;
        ssize_t r = write(k->ev_fd, &one, sizeof(one));
        (void)r;
    }
    pthread_cond_broadcast(&k->cond);
}

static void unlink_xfer(tdm_kvx *k, kvx_xfer *x)
{
    for (kvx_xfer **pp = &k->xfers; *pp; pp = &(*pp)->next)
        if (*pp == x) { *pp = x->next; return; }
}

void tdm__kvx_finish(tdm_kvx *k, kvx_xfer *x, uint32_t type, int status, const char *reason, int tell_peer)
{
    if (tell_peer && type == TDM_KVX_EV_FAILED && tdm__kvx_peer(k, x->peer) &&
        (x->side == TDM_KVX_SIDE_RECV || x->state != XS_WAIT)) {
        tdm__kvx_msg m;
        tdm__kvx_msg_init(&m, TDM__KVX_FAIL);
        m.rid = x->rid;
        m.xid = x->xid;
        m.to_side = x->side == TDM_KVX_SIDE_SEND ? TDM_KVX_SIDE_RECV : TDM_KVX_SIDE_SEND;
        m.status = status < 0 ? status : TDM_E_INTERNAL;
        snprintf(m.reason, sizeof(m.reason), "%s", reason ? reason : "");
        tdm__kvx_queue_msg(k, x->peer, &m);
    }
    if (x->side == TDM_KVX_SIDE_RECV) {
        tdm__kvx_nixl_abort_xfer(k, x);   /* no READ may land after the blocks are released */
        for (uint32_t i = x->skip; i < x->n; i++) k->owner[x->blocks[i]] = 0;
    }
    tdm__kvx_event(k, x, type, status, reason);
    if (type == TDM_KVX_EV_DONE) k->st.transfers_done++;
    else if (type == TDM_KVX_EV_FAILED) k->st.transfers_failed++;
    else k->st.transfers_cancelled++;
    unlink_xfer(k, x);
    tdm__kvx_xfer_free(k, x);
}

kvx_xfer *tdm__kvx_find(tdm_kvx *k, uint32_t side, uint32_t peer, uint64_t rid, uint64_t xid)
{
    for (kvx_xfer *x = k->xfers; x; x = x->next)
        if (x->side == side && x->peer == peer && x->rid == rid && x->xid == xid &&
            (side == TDM_KVX_SIDE_RECV || x->state != XS_WAIT))
            return x;
    return NULL;
}

kvx_xfer *tdm__kvx_find_handle(tdm_kvx *k, uint64_t handle)
{
    for (kvx_xfer *x = k->xfers; x; x = x->next)
        if (x->handle == handle) return x;
    return NULL;
}

static void reply_fail(tdm_kvx *k, kvx_peer *p, uint64_t rid, uint64_t xid, uint32_t to_side, int status, const char *why)
{
    tdm__kvx_msg m;
    tdm__kvx_msg_init(&m, TDM__KVX_FAIL);
    m.rid = rid;
    m.xid = xid;
    m.to_side = to_side;
    m.status = status;
    snprintf(m.reason, sizeof(m.reason), "%s", why);
    tdm__kvx_queue_msg(k, p->id, &m);
}

static uint64_t gcd64(uint64_t a, uint64_t b)
{
    while (b) { uint64_t t = a % b; a = b; b = t; }
    return a;
}

/* The receiver's request (its n blocks, skip blocks and tokens, in its block size) meets this
 * send: which of our blocks to send, and in what granules so that every chunk starts on a
 * receiver block. Fails the transfer (and tells the receiver) when they cannot meet. */
void tdm__kvx_bind(tdm_kvx *k, kvx_xfer *x, uint32_t peer, uint64_t xid, uint32_t n, uint32_t skip, uint32_t tok,
                   int direct)
{
    char why[128] = "";
    kvx_peer *p = tdm__kvx_peer(k, peer);
    x->peer = peer;
    x->xid = xid;
    x->state = XS_ACTIVE;
    x->deadline = tdm__now() + x->timeout_ms / 1000.0;
    uint64_t bs = k->layout.block_size, rbs = p ? p->remote.layout.block_size : bs;
    uint64_t skip_tok = (uint64_t)skip * rbs, lcm = bs / gcd64(bs, rbs) * rbs;
    if ((uint64_t)tok > (uint64_t)x->n * bs) tok = (uint32_t)((uint64_t)x->n * bs);
    if (!p) snprintf(why, sizeof(why), "peer gone");
    else if ((uint64_t)tok > (uint64_t)n * rbs || (uint64_t)tok <= (uint64_t)(n - 1) * rbs)
        snprintf(why, sizeof(why), "the sender holds %u tokens, the receiver's %u blocks of %llu need more",
                 tok, n, (unsigned long long)rbs);
    else if (skip_tok % bs)
        snprintf(why, sizeof(why), "the prefix skip (%llu tokens) is not a whole number of sender blocks", (unsigned long long)skip_tok);
    else if (lcm / bs * k->unit_bytes > k->cfg.max_chunk_bytes)
        snprintf(why, sizeof(why), "block sizes %llu/%llu need chunks larger than max_chunk_bytes", (unsigned long long)bs, (unsigned long long)rbs);
    if (why[0]) {
        tdm__kvx_finish(k, x, TDM_KVX_EV_FAILED, TDM_E_RANGE, why, 1);
        return;
    }
    x->tok = tok;
    /* direct reads need identical formats (the receiver checked) and our shared cache */
    x->direct = direct && (k->kv_direct || (p && p->nx)) && rbs == bs;
    x->skip = (uint32_t)(skip_tok / bs);
    x->n_eff = (uint32_t)((tok + bs - 1) / bs);
    x->gran = (uint32_t)(lcm / bs);
    for (uint32_t l = 0; l < k->layout.num_layers; l++) x->sent[l] = TDM_MIN(x->skip, x->n_eff);
}

void tdm__kvx_on_xfer_req(tdm_kvx *k, kvx_peer *p, const tdm__kvx_msg *m)
{
    if (tdm__kvx_find(k, TDM_KVX_SIDE_SEND, p->id, m->rid, m->xid)) {
        k->st.msgs_rejected++;
        reply_fail(k, p, m->rid, m->xid, TDM_KVX_SIDE_RECV, TDM_E_EXISTS, "transfer already live");
        return;
    }
    for (kvx_xfer *x = k->xfers; x; x = x->next) {
        uint32_t mode = m->mode & 0xffu;
        if (x->side != TDM_KVX_SIDE_SEND || x->state != XS_WAIT || x->rid != m->rid || x->mode != mode) continue;
        if (x->peer != TDM_KVX_PEER_ANY && x->peer != p->id) continue;
        if (mode == TDM_KVX_PUSH && x->xid != m->xid) continue;
        tdm__kvx_bind(k, x, p->id, m->xid, m->num_blocks, m->num_skip, m->num_tokens,
                      (m->mode & TDM__KVX_MODE_DIRECT) != 0);
        return;
    }
    uint32_t count = 0;
    for (kvx_pending *q = k->pending; q; q = q->next) {
        if (q->peer == p->id && q->rid == m->rid && q->xid == m->xid) {
            k->st.msgs_rejected++;
            return;   /* duplicate request */
        }
        count++;
    }
    if (k->cfg.role == TDM_KVX_ROLE_DECODE || count >= MAX_PENDING) {
        reply_fail(k, p, m->rid, m->xid, TDM_KVX_SIDE_RECV, k->cfg.role == TDM_KVX_ROLE_DECODE ? TDM_E_STATE : TDM_E_NO_SPACE,
                   k->cfg.role == TDM_KVX_ROLE_DECODE ? "this engine does not send" : "too many unmatched requests");
        return;
    }
    kvx_pending *q = tdm__calloc(1, sizeof(*q));
    if (!q) { reply_fail(k, p, m->rid, m->xid, TDM_KVX_SIDE_RECV, TDM_E_NOMEM, "out of memory"); return; }
    q->peer = p->id;
    q->mode = m->mode;
    q->n = m->num_blocks;
    q->skip = m->num_skip;
    q->tok = m->num_tokens;
    q->rid = m->rid;
    q->xid = m->xid;
    q->deadline = tdm__now() + k->cfg.transfer_timeout_ms / 1000.0;
    q->next = k->pending;
    k->pending = q;
}

static void drop_pending(tdm_kvx *k, uint32_t peer, uint64_t rid, uint64_t xid, int all_of_peer)
{
    for (kvx_pending **pp = &k->pending; *pp;) {
        kvx_pending *q = *pp;
        if (q->peer == peer && (all_of_peer || (q->rid == rid && q->xid == xid))) {
            *pp = q->next;
            tdm__free(q);
        } else {
            pp = &q->next;
        }
    }
}

void tdm__kvx_credit(tdm_kvx *k, kvx_peer *p, uint32_t slot)
{
    if (slot == TDM__KVX_NO_SLOT || slot == TDM__KVX_DIRECT_SLOT || !p->rx->credit) return;
    tdm__kvx_msg c;
    tdm__kvx_msg_init(&c, TDM__KVX_CREDIT);
    c.slot = slot;
    if (tdm__kvx_send_frames(k, p, &c, NULL) != TDM_OK) tdm__kvx_queue_msg(k, p->id, &c);
}

void tdm__kvx_on_data(tdm_kvx *k, kvx_peer *p, const tdm__kvx_msg *m, zmq_msg_t *payload)
{
    char why[160];
    int status = TDM_E_PROTOCOL;
    tdm__kvx_stage(k, TDM__KVX_STAGE_RECV_DATA);
    kvx_xfer *x = tdm__kvx_find(k, TDM_KVX_SIDE_RECV, p->id, m->rid, m->xid);
    if (!x || x->state != XS_ACTIVE) {
        if (!x || x->state != XS_CANCELLING) k->st.msgs_rejected++;
        goto credit;   /* unknown, finished or being cancelled: the bytes are not written anywhere */
    }
    uint32_t L = k->layout.num_layers;
    uint64_t nl = m->layer_end - m->layer_begin;
    size_t runit = tdm__kvx_unit_bytes(&p->remote.layout);
    uint64_t sbs = p->remote.layout.block_size, bs = k->layout.block_size;
    /* the chunk's sender blocks as tokens, then as our blocks [d0, d1) */
    uint64_t t0 = (uint64_t)m->block_begin * sbs, t1 = ((uint64_t)m->block_begin + m->block_count) * sbs;
    const void *bytes = NULL;
    if (!x->tok_known) {
        /* the sender's token count: it must reach into our last block */
        if (m->num_tokens > (uint64_t)x->n * bs || m->num_tokens <= (uint64_t)(x->n - 1) * bs) {
            snprintf(why, sizeof(why), "%u tokens do not fill our %u blocks", m->num_tokens, x->n);
            goto bad;
        }
        x->tok = m->num_tokens;
        x->tok_known = 1;
    } else if (m->num_tokens != x->tok) {
        snprintf(why, sizeof(why), "token count changed (%u, was %u)", m->num_tokens, x->tok);
        goto bad;
    }
    if (m->layer_end > L) { snprintf(why, sizeof(why), "layer range [%u,%u) beyond %u layers", m->layer_begin, m->layer_end, L); goto bad; }
    if (t0 < (uint64_t)x->skip * bs || t1 - sbs >= x->tok || t0 % bs || (t1 < x->tok && t1 % bs)) {
        snprintf(why, sizeof(why), "blocks [%u,+%u) outside the transfer's or not on block bounds", m->block_begin, m->block_count);
        goto bad;
    }
    if (t1 > x->tok) t1 = x->tok;
    uint32_t d0 = (uint32_t)(t0 / bs), d1 = (uint32_t)((t1 + bs - 1) / bs);
    uint64_t units = nl * (d1 - d0);
    if (nl * m->block_count * runit != m->nbytes) {
        snprintf(why, sizeof(why), "chunk of %llu bytes, expected %llu", (unsigned long long)m->nbytes,
                 (unsigned long long)(nl * m->block_count * runit));
        goto bad;
    }
    uint32_t src_ids[256];
    int direct = m->slot == TDM__KVX_DIRECT_SLOT, nixl = p->nx != NULL;
    if (direct) {
        /* the sender's block ids, to be read from its mapped cache (or over NIXL) */
        if (!x->direct || (!p->rkv && !nixl) || !payload || m->block_count > 256 || d1 - d0 != m->block_count ||
            zmq_msg_size(payload) != 4u * m->block_count) {
            snprintf(why, sizeof(why), "direct chunk not expected or malformed");
            goto bad;
        }
        const uint8_t *ib = zmq_msg_data(payload);
        for (uint32_t i = 0; i < m->block_count; i++) {
            src_ids[i] = (uint32_t)ib[4 * i] | (uint32_t)ib[4 * i + 1] << 8 | (uint32_t)ib[4 * i + 2] << 16 |
                         (uint32_t)ib[4 * i + 3] << 24;
            if (src_ids[i] >= p->remote.layout.num_blocks) {
                snprintf(why, sizeof(why), "sender block id %u out of its range", src_ids[i]);
                goto bad;
            }
        }
    } else if (nixl) {
        if (payload) { snprintf(why, sizeof(why), "a NIXL chunk carries no payload frame"); goto bad; }
    } else if (p->rx->resolve(p->rx_ctx, payload, m->slot, m->nbytes, &bytes) != TDM_OK) {
        snprintf(why, sizeof(why), "payload does not match the header (size or slot)");
        goto bad;
    }
    for (uint32_t l = m->layer_begin; l < m->layer_end; l++)
        for (uint32_t b = d0; b < d1; b++)
            if (got_bit(x, l, b)) { snprintf(why, sizeof(why), "layer %u block %u sent twice", l, b); goto bad; }
    if (nixl) {
        /* READ asynchronously; it lands in tdm__kvx_landed. The bits are taken now so that
         * a repeated chunk is refused while the first one is still being read. */
        status = tdm__kvx_nixl_read(k, p, x, m, src_ids, d0, d1, (uint32_t)(t1 - t0));
        if (status) { snprintf(why, sizeof(why), "NIXL READ not posted: %s", tdm_strerror(status)); goto bad; }
        for (uint32_t l = m->layer_begin; l < m->layer_end; l++)
            for (uint32_t b = d0; b < d1; b++) set_bit(x, l, b);
        return;
    }
    if (direct)
        status = tdm__kvx_copy_direct(k, p, src_ids, x->blocks + d0, d1 - d0, m->layer_begin, m->layer_end);
    else
        status = tdm__kvx_unpack(k, p, bytes, m->nbytes, m->block_count, (uint32_t)(t1 - t0), x->blocks + d0,
                                 d1 - d0, m->layer_begin, m->layer_end);
    if (status) { snprintf(why, sizeof(why), "unpack failed: %s", tdm_strerror(status)); goto bad; }
    for (uint32_t l = m->layer_begin; l < m->layer_end; l++)
        for (uint32_t b = d0; b < d1; b++) set_bit(x, l, b);
    tdm__kvx_credit(k, p, m->slot);
    tdm__kvx_landed(k, x, p, units, m->nbytes);
    return;
bad:
    k->st.msgs_rejected++;
    tdm__kvx_finish(k, x, TDM_KVX_EV_FAILED, status, why, 1);
credit:
    if (m->slot != TDM__KVX_NO_SLOT && p->rx && p->rx->credit && m->slot < 0x100000) tdm__kvx_credit(k, p, m->slot);
}

void tdm__kvx_landed(tdm_kvx *k, kvx_xfer *x, kvx_peer *p, uint64_t units, uint64_t nbytes)
{
    x->units_got += units;
    x->bytes += nbytes;
    k->st.bytes_received += nbytes;
    x->deadline = tdm__now() + x->timeout_ms / 1000.0;
    if (x->units_got == x->units_need) {
        tdm__kvx_msg d;
        tdm__kvx_msg_init(&d, TDM__KVX_DONE);
        d.rid = x->rid;
        d.xid = x->xid;
        d.nbytes = x->bytes;
        if (p) tdm__kvx_queue_msg(k, p->id, &d);
        tdm__kvx_finish(k, x, TDM_KVX_EV_DONE, TDM_OK, "", 0);
    }
}

void tdm__kvx_on_control(tdm_kvx *k, kvx_peer *p, const tdm__kvx_msg *m)
{
    char why[TDM__KVX_REASON_LEN + 16];
    kvx_xfer *x;
    switch (m->type) {
    case TDM__KVX_DONE:
        x = tdm__kvx_find(k, TDM_KVX_SIDE_SEND, p->id, m->rid, m->xid);
        if (!x || (x->state != XS_DRAIN && x->state != XS_CANCELLING)) { k->st.msgs_rejected++; return; }
        tdm__kvx_finish(k, x, TDM_KVX_EV_DONE, TDM_OK, "", 0);
        return;
    case TDM__KVX_FAIL:
        if (m->to_side == TDM_KVX_SIDE_SEND) drop_pending(k, p->id, m->rid, m->xid, 0);
        x = tdm__kvx_find(k, m->to_side, p->id, m->rid, m->xid);
        if (!x) return;
        snprintf(why, sizeof(why), "peer: %s", m->reason);
        tdm__kvx_finish(k, x, TDM_KVX_EV_FAILED, m->status, why, 0);
        return;
    case TDM__KVX_CANCEL: {
        if (m->to_side == TDM_KVX_SIDE_SEND) drop_pending(k, p->id, m->rid, m->xid, 0);
        x = tdm__kvx_find(k, m->to_side, p->id, m->rid, m->xid);
        /* our side stops first; everything we sent before is ahead of the ack on the wire */
        if (x) tdm__kvx_finish(k, x, TDM_KVX_EV_CANCELLED, TDM_E_CANCELLED, "cancelled by the peer", 0);
        tdm__kvx_msg a;
        tdm__kvx_msg_init(&a, TDM__KVX_CANCEL_ACK);
        a.rid = m->rid;
        a.xid = m->xid;
        a.to_side = m->to_side == TDM_KVX_SIDE_SEND ? TDM_KVX_SIDE_RECV : TDM_KVX_SIDE_SEND;
        tdm__kvx_queue_msg(k, p->id, &a);
        return;
    }
    case TDM__KVX_CANCEL_ACK:
        x = tdm__kvx_find(k, m->to_side, p->id, m->rid, m->xid);
        if (!x || x->state != XS_CANCELLING) { k->st.msgs_rejected++; return; }
        tdm__kvx_finish(k, x, TDM_KVX_EV_CANCELLED, TDM_E_CANCELLED, "cancelled (acknowledged)", 0);
        return;
    default:
        k->st.msgs_rejected++;
    }
}

void tdm__kvx_peer_lost(tdm_kvx *k, kvx_peer *p, int status, const char *reason)
{
    p->state = PEER_DEAD;
    for (kvx_xfer *x = k->xfers, *nx; x; x = nx) {
        nx = x->next;
        if (x->peer != p->id) continue;
        if (x->state == XS_CANCELLING)   /* a dead peer cannot write any more */
            tdm__kvx_finish(k, x, TDM_KVX_EV_CANCELLED, TDM_E_CANCELLED, reason, 0);
        else
            tdm__kvx_finish(k, x, TDM_KVX_EV_FAILED, status, reason, 0);
    }
    drop_pending(k, p->id, 0, 0, 1);
    if (p->mon) { zmq_close(p->mon); p->mon = NULL; }
    if (p->sock) { zmq_close(p->sock); p->sock = NULL; }
    tdm__kvx_shm_destroy(p->shm);
    p->shm = NULL;
    p->tx = p->rx = NULL;
    tdm__kvx_unmap_remote(p);
    tdm__kvx_nixl_peer_close(k, p);
    tdm__kvx_peer_scales_free(p);
}

void tdm__kvx_timers(tdm_kvx *k, double now)
{
    for (kvx_xfer *x = k->xfers, *nx; x; x = nx) {
        nx = x->next;
        if (now <= x->deadline) continue;
        if (x->state == XS_CANCELLING)
            tdm__kvx_finish(k, x, TDM_KVX_EV_CANCELLED, TDM_E_CANCELLED, "the peer did not acknowledge the cancel in time", 0);
        else
            tdm__kvx_finish(k, x, TDM_KVX_EV_FAILED, TDM_E_TIMEOUT, "no progress within the transfer timeout", 1);
    }
    for (kvx_pending **pp = &k->pending; *pp;) {
        kvx_pending *q = *pp;
        if (now > q->deadline) {
            kvx_peer *p = tdm__kvx_peer(k, q->peer);
            if (p) reply_fail(k, p, q->rid, q->xid, TDM_KVX_SIDE_RECV, TDM_E_NOT_FOUND, "no matching send in time");
            *pp = q->next;
            tdm__free(q);
        } else {
            pp = &q->next;
        }
    }
}

/* The next chunk of a sending transfer: the lowest layers that share the same progress and
 * have more ready blocks, as many blocks as fit in max_chunk_bytes. */
static int next_chunk(const tdm_kvx *k, const kvx_xfer *x, uint32_t *lb, uint32_t *le, uint32_t *bb, uint32_t *cnt)
{
    uint32_t L = k->layout.num_layers, a, g = x->gran;
    /* ready blocks usable now: whole granules, or everything up to the end */
#define USABLE(l) (TDM_MIN(x->ready[l], x->n_eff) >= x->n_eff ? x->n_eff : TDM_MIN(x->ready[l], x->n_eff) / g * g)
    for (a = 0; a < L; a++)
        if (x->sent[a] < USABLE(a)) break;
    if (a == L) return 0;
    uint32_t s = x->sent[a], lim = USABLE(a), b = a + 1;
    while (b < L && x->sent[b] == s && USABLE(b) > s) {
        if (USABLE(b) < lim) lim = USABLE(b);
        b++;
    }
#undef USABLE
    size_t unit = k->unit_bytes, maxc = k->cfg.max_chunk_bytes;
    if (x->direct && maxc < ((size_t)32 << 20)) maxc = (size_t)32 << 20;   /* only ids travel */
    size_t maxl = maxc / (unit * g);
    if (b - a > maxl) b = a + (uint32_t)maxl;
    size_t maxb = maxc / (unit * (b - a)) / g * g;
    if (x->direct && maxb > 256) maxb = 256;   /* ids per direct chunk */
    uint32_t c = lim - s;
    if (c > maxb) c = (uint32_t)maxb;
    *lb = a;
    *le = b;
    *bb = s;
    *cnt = c;
    return 1;
}

static int all_sent(const tdm_kvx *k, const kvx_xfer *x)
{
    for (uint32_t l = 0; l < k->layout.num_layers; l++)
        if (x->sent[l] < x->n_eff) return 0;
    return 1;
}

static void chunk_sent(tdm_kvx *k, kvx_xfer *x, uint32_t lb, uint32_t le, uint32_t cnt, size_t nbytes, int shm)
{
    for (uint32_t l = lb; l < le; l++) x->sent[l] += cnt;
    k->st.chunks_sent++;
    if (shm) k->st.chunks_sent_shm++;
    x->seq++;
    x->bytes += nbytes;
    k->st.bytes_sent += nbytes;
    x->deadline = tdm__now() + x->timeout_ms / 1000.0;
    tdm__kvx_stage(k, TDM__KVX_STAGE_SEND_DATA);
    if (all_sent(k, x)) x->state = XS_DRAIN;
}

/* A direct chunk: only our block ids travel (u32 little-endian in the payload frame); the
 * receiver copies them out of our shared cache. */
static int send_direct(tdm_kvx *k, kvx_xfer *x, kvx_peer *p, uint32_t lb, uint32_t le, uint32_t bb,
                       uint32_t cnt, size_t nbytes)
{
    zmq_msg_t frame;
    if (zmq_msg_init_size(&frame, (size_t)cnt * 4) != 0) {
        tdm__kvx_finish(k, x, TDM_KVX_EV_FAILED, TDM_E_NOMEM, "cannot build a frame", 1);
        return -1;
    }
    uint8_t *d = zmq_msg_data(&frame);
    for (uint32_t i = 0; i < cnt; i++) {
        uint32_t id = x->blocks[bb + i];
        d[4 * i] = (uint8_t)id;
        d[4 * i + 1] = (uint8_t)(id >> 8);
        d[4 * i + 2] = (uint8_t)(id >> 16);
        d[4 * i + 3] = (uint8_t)(id >> 24);
    }
    tdm__kvx_msg m;
    tdm__kvx_msg_init(&m, TDM__KVX_DATA);
    m.rid = x->rid;
    m.xid = x->xid;
    m.seq = x->seq;
    m.layer_begin = lb;
    m.layer_end = le;
    m.block_begin = bb;
    m.block_count = cnt;
    m.nbytes = nbytes;
    m.slot = TDM__KVX_DIRECT_SLOT;
    m.num_tokens = x->tok;
    int rc = tdm__kvx_send_frames(k, p, &m, &frame);
    zmq_msg_close(&frame);
    if (rc == TDM_E_AGAIN) { p->tx_blocked = 1; return 0; }
    if (rc) { tdm__kvx_finish(k, x, TDM_KVX_EV_FAILED, TDM_E_PEER, "send failed", 0); return -1; }
    chunk_sent(k, x, lb, le, cnt, nbytes, p->nx == NULL); /* direct over NIXL is not shm */
    return 1;
}

/* Packs and sends one chunk. Returns 1 if sent, 0 if blocked, -1 if the transfer ended. */
static int send_chunk(tdm_kvx *k, kvx_xfer *x, kvx_peer *p)
{
    uint32_t lb, le, bb, cnt;
    if (!next_chunk(k, x, &lb, &le, &bb, &cnt)) return 0;
    size_t nbytes = (size_t)(le - lb) * cnt * k->unit_bytes;
    if (x->direct) return send_direct(k, x, p, lb, le, bb, cnt, nbytes);
    void *buf;
    uint32_t slot;
    int rc = p->tx->acquire(p->tx_ctx, nbytes, &buf, &slot);
    if (rc == TDM_E_AGAIN) { p->tx_blocked = 1; return 0; }
    if (rc) { tdm__kvx_finish(k, x, TDM_KVX_EV_FAILED, rc, "transport cannot take a chunk", 1); return -1; }
    rc = tdm__kvx_pack(k, x->blocks + bb, cnt, lb, le, buf, nbytes);
    if (rc) {
        p->tx->abandon(p->tx_ctx, buf, slot);
        tdm__kvx_finish(k, x, TDM_KVX_EV_FAILED, rc, "pack failed", 1);
        return -1;
    }
    tdm__kvx_msg m;
    tdm__kvx_msg_init(&m, TDM__KVX_DATA);
    m.rid = x->rid;
    m.xid = x->xid;
    m.seq = x->seq;
    m.layer_begin = lb;
    m.layer_end = le;
    m.block_begin = bb;
    m.block_count = cnt;
    m.nbytes = nbytes;
    m.slot = slot;
    m.num_tokens = x->tok;
    zmq_msg_t frame, *fp = NULL;
    if (p->tx->make_frame) {
        if (p->tx->make_frame(p->tx_ctx, buf, nbytes, &frame) != TDM_OK) {
            p->tx->abandon(p->tx_ctx, buf, slot);
            tdm__kvx_finish(k, x, TDM_KVX_EV_FAILED, TDM_E_IO, "cannot build a frame", 1);
            return -1;
        }
        fp = &frame;
    }
    rc = tdm__kvx_send_frames(k, p, &m, fp);
    if (rc == TDM_E_AGAIN) {
        if (fp) zmq_msg_close(fp);   /* returns the buffer through the free callback */
        else p->tx->abandon(p->tx_ctx, buf, slot);
        p->tx_blocked = 1;
        return 0;
    }
    if (fp) zmq_msg_close(fp);
    if (rc) {
        if (!fp) p->tx->abandon(p->tx_ctx, buf, slot);
        tdm__kvx_finish(k, x, TDM_KVX_EV_FAILED, TDM_E_PEER, "send failed", 0);
        return -1;
    }
    chunk_sent(k, x, lb, le, cnt, nbytes, slot != TDM__KVX_NO_SLOT && p->tx == &tdm__kvx_shm_transport);
    return 1;
}

int tdm__kvx_pump(tdm_kvx *k, int budget)
{
    int more = 0;
    for (kvx_xfer *x = k->xfers, *nx; x; x = nx) {
        nx = x->next;
        if (x->side != TDM_KVX_SIDE_SEND || x->state != XS_ACTIVE) continue;
        kvx_peer *p = tdm__kvx_peer(k, x->peer);
        if (!p || p->tx_blocked) continue;
        for (int i = 0; i < budget; i++) {
            int r = send_chunk(k, x, p);
            if (r < 0 || x->state != XS_ACTIVE) break;
            if (r == 0) {
                if (!p->tx_blocked && all_sent(k, x)) {
                    x->state = XS_DRAIN;
                    x->deadline = tdm__now() + x->timeout_ms / 1000.0;
                }
                break;
            }
            if (i == budget - 1) more = 1;
        }
    }
    return more;
}
