/*
 * kvx_tp_nixl.c -- the NIXL transport's READs: ZeroMQ keeps the control plane, NIXL (UCX,
 * libfabric, GDS underneath) carries the bytes, and the receiver pulls them with one-sided
 * READs, as vLLM's NixlConnector does (the agent, registration and the handshake are in
 * kvx_nixl_agent.c; docs/protocol.md §5.2). Two ways a chunk moves: identical block formats
 * on both ends -> DATA lists the sender's block ids and the receiver READs those blocks
 * straight into its reserved ones (runs of blocks contiguous on both ends as one descriptor);
 * different formats -> the sender packs into a slot of its registered ring, DATA names the
 * slot, the receiver READs it into a slot of its own ring, unpacks (converting) and returns
 * the sender's slot with CREDIT. READs are asynchronous: the I/O thread polls them
 * (tdm__kvx_nixl_progress); a transfer that ends while READs are outstanding cancels them
 * before its blocks are released, so nothing lands in blocks it no longer owns. An engine that
 * READs with several copying threads (TANDEM_NIXL_THREADS, kvx_nixl_pool.c) cuts every READ
 * into one part per thread, each part a transfer request on that thread's own UCX worker; the
 * READ lands only when every part has (failed when any part failed), and a READ whose
 * transfer ends is waited for part by part, never withdrawn while active. Every call here
 * runs with kvx->mu held; NIXL is entered by the I/O thread and, for the parts they were
 * handed, the copying threads (the agent then locks reader-writer).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvx_nixl_priv.h"

/* ---- READs --------------------------------------------------------------------------------- */

/* Releases a READ of the I/O thread (cancelling it if still active; a backend that cannot
 * cancel is waited for, up to REAP_WAIT_S). TDM_OK when it completed, else why it did not. */
static int reap(tdm__kvx_nixl *e, nread *r, int cancel)
{
    if (!r->req) return TDM_E_CANCELLED;
    const tdm__nx_api *a = e->a;
    int st = a->get_xfer_status(e->agent, r->req);
    double until = tdm__now() + REAP_WAIT_S;
    while (a->release_xfer_req(e->agent, r->req) != TDM__NX_OK) {
        if (tdm__now() > until) {
            r->req = NULL;   /* leaked rather than freed while NIXL may still use it */
            e->n_posted--;
            return TDM_E_IO;
        }
        usleep(1000);
        st = a->get_xfer_status(e->agent, r->req);
    }
    a->destroy_xfer_req(r->req);
    r->req = NULL;
    e->n_posted--;
    if (cancel) return TDM_E_CANCELLED;
    return st == TDM__NX_OK ? TDM_OK : TDM_E_PEER;
}

static void free_read(tdm__kvx_nixl *e, nread *r)
{
    tdm__free(r->jobs);
    if (r->slot != TDM__KVX_DIRECT_SLOT && r->lslot < e->slots && e->recv_busy[r->lslot]) e->recv_busy[r->lslot] = 0;
    tdm__free(r);
}

/* The descriptor lists of a READ: one pair, or with copying threads one pair per part. */
typedef struct dlists {
    tdm__nx_dlist loc[MAX_THREADS], rem[MAX_THREADS];
    uint64_t bytes[MAX_THREADS];
    uint32_t n, next;
} dlists;

/* Adds one range to the lists (ours at la, the peer's at ra on device dev); with several
 * copying threads cut into pieces of at most e->piece bytes, dealt to the parts in turn, so
 * that every thread gets a share of even a single large range. 0, or -1 when NIXL refused. */
static int add(const tdm__kvx_nixl *e, dlists *d, uint64_t la, uint64_t ra, uint64_t len, uint64_t dev)
{
    const tdm__nx_api *a = e->a;
    for (uint64_t off = 0; off < len;) {
        uint64_t n = e->piece && len - off > e->piece ? e->piece : len - off;
        uint32_t j = d->next;
        d->next = (j + 1) % d->n;
        if (a->xfer_dlist_add_desc(d->loc[j], (uintptr_t)(la + off), (size_t)n, 0) != TDM__NX_OK ||
            a->xfer_dlist_add_desc(d->rem[j], (uintptr_t)(ra + off), (size_t)n, dev) != TDM__NX_OK)
            return -1;
        d->bytes[j] += n;
        off += n;
    }
    return 0;
}

/* The descriptors of a direct READ: per layer, the K and V halves of each block, where a
 * half that follows the previous one in both caches (adjacent block ids on both ends, or K
 * and V adjacent in a block) extends it, so a run of contiguous blocks is one descriptor.
 * Never across layers: each layer is its own registration. 0, or -1 when NIXL refused one. */
static int add_blocks(const tdm_kvx *k, const kvx_peer *p, const kvx_xfer *x, const nread *r, dlists *d)
{
    const tdm__kvx_nixl *e = k->nixl;
    const tdm__kvx_nixl_peer *q = p->nx;
    const tdm_kv_layout *o = &k->layout, *rl = &p->remote.layout;
    uint64_t es = tdm__kvx_elem_size(o->dtype), half = k->unit_bytes / 2;
    /* K and V of a block side by side on both ends: walk blocks outside, halves inside */
    int kv_inner = (uint64_t)o->stride_kv * es == half && (uint64_t)rl->stride_kv * es == half;
    for (uint32_t l = r->lb; l < r->le; l++) {
        uint64_t la = 0, ra = 0, len = 0;   /* the descriptor being grown */
        for (uint32_t outer = 0; outer < (kv_inner ? r->n_ids : 2); outer++)
            for (uint32_t inner = 0; inner < (kv_inner ? 2 : r->n_ids); inner++) {
                uint32_t i = kv_inner ? outer : inner;
                uint64_t kv = kv_inner ? inner : outer;
                uint64_t lo = (kv * (uint64_t)o->stride_kv + (uint64_t)x->blocks[r->d0 + i] * (uint64_t)o->stride_block) * es;
                uint64_t ro = (kv * (uint64_t)rl->stride_kv + (uint64_t)r->src_ids[i] * (uint64_t)rl->stride_block) * es;
                uint64_t lb = (uint64_t)(uintptr_t)k->bases[l] + lo, rb = q->bases[l] + ro;
                if (len && lb == la + len && rb == ra + len) { len += half; continue; }
                if (len && add(e, d, la, ra, len, q->dev)) return -1;
                la = lb;
                ra = rb;
                len = half;
            }
        if (len && add(e, d, la, ra, len, q->dev)) return -1;
    }
    return 0;
}

/* Builds and posts the READ of r. TDM_E_AGAIN: no receive slot free now. */
static int post(tdm_kvx *k, nread *r)
{
    tdm__kvx_nixl *e = k->nixl;
    const tdm__nx_api *a = e->a;
    kvx_peer *p = tdm__kvx_peer(k, r->peer);
    kvx_xfer *x = tdm__kvx_find_handle(k, r->xfer);
    if (!p || !p->nx || !x) return TDM_E_PEER;
    tdm__kvx_nixl_peer *q = p->nx;
    int direct = r->slot == TDM__KVX_DIRECT_SLOT;
    if (!direct) {
        uint32_t j;
        for (j = 0; j < e->slots && e->recv_busy[j]; j++) {}
        if (j == e->slots) return TDM_E_AGAIN;
        e->recv_busy[j] = 1;
        r->lslot = j;
    }
    dlists d;
    d.n = e->pool ? e->threads : 1;
    d.next = 0;
    memset(d.loc, 0, sizeof(d.loc));
    memset(d.rem, 0, sizeof(d.rem));
    memset(d.bytes, 0, sizeof(d.bytes));
    int rc = TDM_E_IO;
    /* direct: cache to cache (DRAM or VRAM); staged: the host rings of both ends */
    for (uint32_t j = 0; j < d.n; j++) {
        if (a->create_xfer_dlist(direct ? tdm__nx_mem_kind(k) : TDM__NX_DRAM, &d.loc[j]) != TDM__NX_OK) { d.loc[j] = NULL; goto out; }
        if (a->create_xfer_dlist(direct ? (int)q->mem : TDM__NX_DRAM, &d.rem[j]) != TDM__NX_OK) { d.rem[j] = NULL; goto out; }
    }
    if (direct && add_blocks(k, p, x, r, &d)) goto out;
    if (!direct) {
        uint8_t *dst = e->ring + (e->slots + (size_t)r->lslot) * e->slot_bytes;
        if (add(e, &d, (uint64_t)(uintptr_t)dst, q->stage + (uint64_t)r->slot * q->slot_bytes, r->nbytes, 0)) goto out;
    }
    if (!e->pool) {
        if (a->create_xfer_req(e->agent, TDM__NX_READ, d.loc[0], d.rem[0], q->agent, &r->req, NULL) != TDM__NX_OK) {
            r->req = NULL;
            rc = TDM_E_PROTOCOL;   /* NIXL refused the descriptors: outside the peer's registration */
            goto out;
        }
        e->n_posted++;
        int st = a->post_xfer_req(e->agent, r->req, NULL);
        if (st != TDM__NX_OK && st != TDM__NX_IN_PROG) {
            reap(e, r, 1);
            rc = TDM_E_PEER;
            goto out;
        }
        rc = TDM_OK;
        goto out;
    }
    /* copying threads: part j is a request on worker j, created here (so that a refused
     * descriptor fails the chunk now), posted and polled by thread j */
    r->jobs = tdm__calloc(d.n, sizeof(tdm__nx_job));
    if (!r->jobs) { rc = TDM_E_NOMEM; goto out; }
    r->n_jobs = 0;
    uint32_t wk[MAX_THREADS];   /* the thread (worker) of each part */
    for (uint32_t j = 0; j < d.n; j++) {
        if (!d.bytes[j]) continue;
        tdm__nx_job *jb = &r->jobs[r->n_jobs];
        if (a->create_xfer_req(e->agent, TDM__NX_READ, d.loc[j], d.rem[j], q->agent, &jb->req, e->worker_opt[j]) !=
            TDM__NX_OK) {
            jb->req = NULL;
            for (uint32_t i = 0; i < r->n_jobs; i++) {   /* never posted: released at once */
                a->release_xfer_req(e->agent, r->jobs[i].req);
                a->destroy_xfer_req(r->jobs[i].req);
            }
            r->n_jobs = 0;
            rc = TDM_E_PROTOCOL;
            goto out;
        }
        jb->owner = r;
        jb->st = TDM__NX_OK;
        wk[r->n_jobs++] = j;
    }
    r->parts_left = r->n_jobs;
    r->part_st = TDM__NX_OK;
    e->n_posted++;
    for (uint32_t i = 0; i < r->n_jobs; i++) tdm__nx_pool_submit(e->pool, wk[i], &r->jobs[i]);
    rc = TDM_OK;
out:
    for (uint32_t j = 0; j < d.n; j++) {
        if (d.loc[j]) a->destroy_xfer_dlist(d.loc[j]);
        if (d.rem[j]) a->destroy_xfer_dlist(d.rem[j]);
    }
    if (rc && !direct && r->lslot < e->slots) { e->recv_busy[r->lslot] = 0; r->lslot = UINT32_MAX; }
    if (rc && r->jobs && !r->n_jobs) { tdm__free(r->jobs); r->jobs = NULL; }
    return rc;
}

int tdm__kvx_nixl_read(tdm_kvx *k, kvx_peer *p, kvx_xfer *x, const tdm__kvx_msg *m, const uint32_t *src_ids,
                       uint32_t d0, uint32_t d1, uint32_t tokens)
{
    tdm__kvx_nixl *e = k->nixl;
    tdm__kvx_nixl_peer *q = p->nx;
    int direct = m->slot == TDM__KVX_DIRECT_SLOT;
    if (!e || !q) return TDM_E_PROTOCOL;
    if (!direct && (m->slot >= q->slots || m->nbytes > q->slot_bytes || m->nbytes > e->slot_bytes))
        return TDM_E_PROTOCOL;
    uint32_t n = direct ? d1 - d0 : 0;
    nread *r = tdm__calloc(1, sizeof(*r) + sizeof(uint32_t) * n);
    if (!r) return TDM_E_NOMEM;
    r->xfer = x->handle;
    r->peer = p->id;
    r->lb = m->layer_begin;
    r->le = m->layer_end;
    r->d0 = d0;
    r->d1 = d1;
    r->src_blocks = m->block_count;
    r->tokens = tokens;
    r->slot = m->slot;
    r->lslot = UINT32_MAX;
    r->nbytes = m->nbytes;
    r->n_ids = n;
    if (n) memcpy(r->src_ids, src_ids, sizeof(uint32_t) * n);
    int rc = e->n_posted < MAX_INFLIGHT && !e->waiting ? post(k, r) : TDM_E_AGAIN;
    if (rc == TDM_E_AGAIN) {   /* in order, when a slot or a place frees */
        *e->waiting_tail = r;
        e->waiting_tail = &r->next;
        return TDM_OK;
    }
    if (rc) { free_read(e, r); return rc; }
    r->next = e->posted;
    e->posted = r;
    return TDM_OK;
}

/* Clears the arrival bits of a READ that did not land (the event counts landed blocks). */
static void unmark(tdm_kvx *k, kvx_xfer *x, const nread *r)
{
    for (uint32_t l = r->lb; l < r->le; l++)
        for (uint32_t b = r->d0; b < r->d1; b++) {
            size_t i = (size_t)l * x->n + b;
            x->got[i >> 3] &= (uint8_t)~(1u << (i & 7));
        }
    (void)k;
}

/* A READ ended: unpack (staged), account, credit the sender's slot. */
static void landed(tdm_kvx *k, nread *r, int st)
{
    tdm__kvx_nixl *e = k->nixl;
    kvx_xfer *x = tdm__kvx_find_handle(k, r->xfer);
    kvx_peer *p = tdm__kvx_peer(k, r->peer);
    int direct = r->slot == TDM__KVX_DIRECT_SLOT;
    if (x && x->state == XS_ACTIVE && st == TDM_OK && !direct) {
        const uint8_t *src = e->ring + (e->slots + (size_t)r->lslot) * e->slot_bytes;
        st = tdm__kvx_unpack(k, p, src, r->nbytes, r->src_blocks, r->tokens, x->blocks + r->d0, r->d1 - r->d0,
                             r->lb, r->le);
    }
    uint32_t slot = r->slot, lb = r->lb, le = r->le, d0 = r->d0, d1 = r->d1;
    uint64_t nbytes = r->nbytes;
    if (x && st != TDM_OK) unmark(k, x, r);
    free_read(e, r);
    if (p && !direct) tdm__kvx_credit(k, p, slot);
    if (!x || x->state != XS_ACTIVE) return;
    if (st != TDM_OK) {
        char why[96];
        snprintf(why, sizeof(why), "NIXL READ of layers [%u,%u) failed: %s", lb, le, tdm_strerror(st));
        tdm__kvx_finish(k, x, TDM_KVX_EV_FAILED, st == TDM_E_PROTOCOL ? st : TDM_E_PEER, why, 1);
        return;
    }
    k->st.chunks_read_nixl++;
    tdm__kvx_landed(k, x, p, (uint64_t)(le - lb) * (d1 - d0), nbytes);
}

/* Unlinks r from the posted list. */
static void unlink_posted(tdm__kvx_nixl *e, const nread *r)
{
    for (nread **pp = &e->posted; *pp; pp = &(*pp)->next)
        if (*pp == r) { *pp = r->next; return; }
}

/* Counts the ended parts in list js against their READs; returns the READs whose last part
 * ended (unlinked from the posted list, linked through next), dying ones included. */
static nread *count_parts(tdm__kvx_nixl *e, tdm__nx_job *js)
{
    nread *ended = NULL;
    while (js) {
        tdm__nx_job *j = js;
        js = j->next;
        nread *r = j->owner;
        if (j->st != TDM__NX_OK && r->part_st == TDM__NX_OK) r->part_st = j->st;
        if (--r->parts_left) continue;
        unlink_posted(e, r);
        e->n_posted--;
        r->next = ended;
        ended = r;
    }
    return ended;
}

/* With copying threads: land the READs whose parts have all ended. */
static int pool_progress(tdm_kvx *k)
{
    tdm__kvx_nixl *e = k->nixl;
    tdm__nx_job *js = tdm__nx_pool_take(e->pool, 0);
    while (e->deferred) {
        tdm__nx_job *j = e->deferred;
        e->deferred = j->next;
        j->next = js;
        js = j;
    }
    for (nread *r = count_parts(e, js), *nx; r; r = nx) {
        nx = r->next;
        int st = r->part_st == TDM__NX_OK ? TDM_OK : r->part_st == TDM__NX_POOL_GAVE_UP ? TDM_E_IO : TDM_E_PEER;
        landed(k, r, st);   /* may end transfers: their READs are waited for in abort_where */
    }
    return 0;
}

int tdm__kvx_nixl_progress(tdm_kvx *k)
{
    tdm__kvx_nixl *e = k->nixl;
    if (!e) return 0;
    for (int again = 1; again;) {
        again = 0;
        if (e->pool) pool_progress(k);
        else for (nread **pp = &e->posted; *pp;) {
            nread *r = *pp;
            int st = e->a->get_xfer_status(e->agent, r->req);
            if (st == TDM__NX_IN_PROG) { pp = &r->next; continue; }
            *pp = r->next;   /* unlinked first: landed() may end transfers and reap others */
            st = reap(e, r, 0);
            landed(k, r, st);
            again = 1;
            break;
        }
        while (e->waiting && e->n_posted < MAX_INFLIGHT) {
            nread *r = e->waiting;
            int rc = post(k, r);
            if (rc == TDM_E_AGAIN) break;
            e->waiting = r->next;
            if (!e->waiting) e->waiting_tail = &e->waiting;
            if (rc) { landed(k, r, rc); again = 1; break; }
            r->next = e->posted;
            e->posted = r;
        }
    }
    /* with copying threads the I/O thread sleeps: a done part wakes it (the wake eventfd) */
    return e->pool ? e->deferred != NULL : e->posted || e->waiting;
}

/* A READ that will not land: its arrival bits cleared, the sender's slot returned. */
static void drop_read(tdm_kvx *k, nread *r)
{
    kvx_xfer *x = tdm__kvx_find_handle(k, r->xfer);
    if (x) unmark(k, x, r);
    kvx_peer *p = tdm__kvx_peer(k, r->peer);
    uint32_t slot = r->slot;
    free_read(k->nixl, r);
    if (p && slot != TDM__KVX_DIRECT_SLOT) tdm__kvx_credit(k, p, slot);   /* it will not be read again */
}

/* With copying threads: the posted READs of a transfer (or a peer) are waited for, part by
 * part (an active part is never withdrawn: only an ended one cannot land later); parts of
 * other READs that end meanwhile are kept for tdm__kvx_nixl_progress. */
static void abort_parts(tdm_kvx *k, uint64_t xfer, uint32_t peer)
{
    tdm__kvx_nixl *e = k->nixl;
    uint32_t left = 0;
    for (nread *r = e->posted; r; r = r->next)
        if (!r->dying && (r->xfer == xfer || r->peer == peer)) {
            r->dying = 1;
            left++;
            for (uint32_t i = 0; i < r->n_jobs; i++) tdm__nx_pool_abandon(&r->jobs[i]);
        }
    tdm__nx_job *js = e->deferred;
    e->deferred = NULL;
    while (left) {
        if (!js) js = tdm__nx_pool_take(e->pool, 0.05);
        tdm__nx_job *mine = NULL;
        while (js) {
            tdm__nx_job *j = js;
            js = j->next;
            tdm__nx_job **to = ((nread *)j->owner)->dying ? &mine : &e->deferred;
            j->next = *to;
            *to = j;
        }
        for (nread *r = count_parts(e, mine), *nx; r; r = nx) {
            nx = r->next;
            left--;
            drop_read(k, r);
        }
    }
    if (e->deferred) tdm__kvx_wake(k);
}

/* Ends every READ of a transfer (or of a peer) before its blocks or slots are released. */
static void abort_where(tdm_kvx *k, uint64_t xfer, uint32_t peer)
{
    tdm__kvx_nixl *e = k->nixl;
    if (e->pool) abort_parts(k, xfer, peer);
    nread **lists[2] = { &e->posted, &e->waiting };
    for (int i = 0; i < 2; i++) {
        for (nread **pp = lists[i]; *pp;) {
            nread *r = *pp;
            if (r->xfer != xfer && r->peer != peer) { pp = &r->next; continue; }
            *pp = r->next;
            reap(e, r, 1);
            kvx_xfer *x = tdm__kvx_find_handle(k, r->xfer);
            if (x) unmark(k, x, r);
            kvx_peer *p = tdm__kvx_peer(k, r->peer);
            uint32_t slot = r->slot;
            free_read(e, r);
            if (p && slot != TDM__KVX_DIRECT_SLOT) tdm__kvx_credit(k, p, slot);   /* it will not be read again */
        }
    }
    e->waiting_tail = &e->waiting;
    while (*e->waiting_tail) e->waiting_tail = &(*e->waiting_tail)->next;
}

void tdm__kvx_nixl_abort_xfer(tdm_kvx *k, const kvx_xfer *x)
{
    if (k->nixl) abort_where(k, x->handle, UINT32_MAX);
}

void tdm__kvx_nixl_peer_close(tdm_kvx *k, kvx_peer *p)
{
    tdm__kvx_nixl *e = k->nixl;
    tdm__kvx_nixl_peer *q = p->nx;
    if (!e || !q) return;
    abort_where(k, 0, p->id);
    for (uint32_t i = 0; i < e->slots; i++)   /* its unread send slots */
        if (e->send_owner[i] == p->id + 1) { e->send_owner[i] = 0; e->send_busy--; }
    if (q->agent) {
        e->a->invalidate_remote_md(e->agent, q->agent);
        free(q->agent);
    }
    tdm__free(q->bases);
    tdm__free(q);
    p->nx = NULL;
}

void tdm__kvx_nixl_destroy(tdm_kvx *k)
{
    tdm__kvx_nixl *e = k->nixl;
    if (!e) return;
    for (uint32_t i = 0; k->peers && i < k->num_peers; i++) tdm__kvx_nixl_peer_close(k, &k->peers[i]);
    while (e->pool && e->posted) abort_parts(k, e->posted->xfer, UINT32_MAX);   /* the peers' are gone */
    while (e->posted) { nread *r = e->posted; e->posted = r->next; reap(e, r, 1); free_read(e, r); }
    while (e->waiting) { nread *r = e->waiting; e->waiting = r->next; free_read(e, r); }
    const tdm__nx_api *a = e->a;
    tdm__nx_pool_stop(e->pool);   /* before the agent: the threads call it */
    e->pool = NULL;
    for (uint32_t i = 0; e->worker_opt && i < e->threads; i++)
        if (e->worker_opt[i]) a->destroy_opt_args(e->worker_opt[i]);
    tdm__free(e->worker_opt);
    tdm__kvx_nixl_unregister(e);
    if (e->be) a->destroy_backend(e->be);
    if (e->agent) a->destroy_agent(e->agent);
    tdm__free(e);
    k->nixl = NULL;
}
