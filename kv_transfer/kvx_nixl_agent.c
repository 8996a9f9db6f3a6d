/*
 * kvx_nixl_agent.c -- the NIXL transport's setup and its sending side (the READs are in
 * kvx_tp_nixl.c; docs/protocol.md §5.2). At tdm_kvx_create an agent named after the engine
 * gets a UCX backend (with one UCX worker per copying thread when the engine READs with
 * several, kvx_nixl_pool.c); at registration every layer of the KV cache (host DRAM, or VRAM
 * for a CUDA cache) and a staging ring are registered with it, and its metadata plus a region
 * table (layer bases, ring address) travel in HELLO / HELLO_ACK; a peer's are checked and
 * loaded at the handshake. The sender packs chunks that cannot be READ as they are into slots
 * of the ring's send half, which the peer returns with CREDIT. Every call here runs with
 * kvx->mu held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvx_nixl_priv.h"

static void put_u64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

/* Several copying threads need backend parameters and per-request worker choice. */
static int e_can_pool(const tdm_kvx *k)
{
    return k->nixl->a->params_add && k->nixl->a->opt_args_set_custom_param;
}

/* The copying threads of an engine that READs: TANDEM_NIXL_THREADS (1 .. MAX_THREADS), else
 * min(DEFAULT_THREADS, online CPUs); an engine that only is READ from (prefill) copies nothing. */
static int copy_threads(const tdm_kvx *k, uint32_t *out)
{
    const char *v = getenv("TANDEM_NIXL_THREADS");
    if (v && v[0]) {
        char *end = NULL;
        unsigned long n = strtoul(v, &end, 10);
        if (*end || n < 1 || n > MAX_THREADS)
            return tdm__kvx_fail(TDM_E_CONFIG, "TANDEM_NIXL_THREADS='%.32s': a number of threads, 1 .. %d", v,
                                 MAX_THREADS);
        *out = (uint32_t)n;
    } else {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        *out = cpus < 1 ? 1 : cpus < DEFAULT_THREADS ? (uint32_t)cpus : DEFAULT_THREADS;
    }
    if (k->cfg.role == TDM_KVX_ROLE_PREFILL || !e_can_pool(k)) *out = 1;
    return TDM_OK;
}

/* The UCX backend; with threads > 1 one shared UCX worker per copying thread (backend
 * parameter num_workers). A library that refuses it gets a plain backend and one thread. */
static int make_backend(tdm__kvx_nixl *e)
{
    const tdm__nx_api *a = e->a;
    int rc = -1;
    for (int pool = e->threads > 1 && a->params_add; pool >= 0; pool--) {
        tdm__nx_mems mems = NULL;
        tdm__nx_params params = NULL;
        char nt[16];
        snprintf(nt, sizeof(nt), "%u", e->threads);
        rc = a->get_plugin_params(e->agent, "UCX", &mems, &params);
        if (rc == TDM__NX_OK && pool && a->params_add(params, "num_workers", nt) != TDM__NX_OK) rc = -1;
        if (rc == TDM__NX_OK) rc = a->create_backend(e->agent, "UCX", params, &e->be);
        if (mems) a->destroy_mem_list(mems);
        if (params) a->destroy_params(params);
        if (rc == TDM__NX_OK) {
            if (!pool) e->threads = 1;
            break;
        }
        e->be = NULL;
    }
    return rc;
}

int tdm__kvx_nixl_create(tdm_kvx *k)
{
    char why[512];
    const tdm__nx_api *a = tdm__nx_load(why, sizeof(why));
    if (!a) return tdm__kvx_fail(TDM_E_UNSUPPORTED, "NIXL transport: %s", why);
    tdm__kvx_nixl *e = tdm__calloc(1, sizeof(*e));
    if (!e) return tdm__kvx_fail(TDM_E_NOMEM, "out of memory");
    e->a = a;
    e->waiting_tail = &e->waiting;
    /* unique per process and engine: two engines of one process are two agents */
    snprintf(e->name, sizeof(e->name), "%.40s-%d-%lx", k->engine_id, (int)getpid(),
             (unsigned long)((uintptr_t)k >> 4) & 0xfffffful);
    k->nixl = e;
    int made = copy_threads(k, &e->threads);
    if (made) return made;
    if (a->create_configured_agent) {
        tdm__nx_agent_cfg c = { 0 };
        const char *dl = getenv("TANDEM_NIXL_PTHR_DELAY_US");
        char *end = NULL;
        unsigned long long us = dl && dl[0] ? strtoull(dl, &end, 10) : PTHR_DELAY_US;
        if (dl && dl[0] && (*end || us > 1000000))
            return tdm__kvx_fail(TDM_E_CONFIG, "TANDEM_NIXL_PTHR_DELAY_US='%.32s': a number of microseconds, "
                                 "at most 1000000", dl);
        /* A side that is READ from needs a progress thread (UCX over tcp answers READs in
         * software). A decode engine only READs: its I/O thread progresses its worker while
         * READs are out, and a second thread on the same worker would only contend for its
         * lock (TANDEM_NIXL_PROGRESS_THREAD=1 keeps one anyway). */
        const char *pt = getenv("TANDEM_NIXL_PROGRESS_THREAD");
        c.prog_thread = k->cfg.role != TDM_KVX_ROLE_DECODE || (pt && pt[0] == '1');
        c.pthr_delay_us = us;
        c.thread_sync = e->threads > 1 ? 2 : 0;   /* RW: the copying threads call the agent too */
        c.lthr_delay_us = 100000;
        made = a->create_configured_agent(e->name, &c, &e->agent);
    } else {
        made = a->create_agent(e->name, &e->agent);   /* an older library: its defaults */
    }
    if (made != TDM__NX_OK) {
        e->agent = NULL;
        return tdm__kvx_fail(TDM_E_IO, "NIXL: cannot create agent %s", e->name);
    }
    int rc = make_backend(e);
    if (rc == TDM__NX_OK && e->threads > 1 && !a->create_configured_agent) e->threads = 1;
    if (rc == TDM__NX_OK && e->threads > 1) {   /* even a single-descriptor READ splits */
        uint64_t piece = ((uint64_t)k->cfg.max_chunk_bytes / e->threads + 4095) & ~(uint64_t)4095;
        e->piece = piece < MIN_PIECE ? MIN_PIECE : piece;
        e->worker_opt = tdm__calloc(e->threads, sizeof(tdm__nx_opt));
        if (!e->worker_opt) return tdm__kvx_fail(TDM_E_NOMEM, "out of memory");
        for (uint32_t i = 0; i < e->threads; i++) {
            char w[32];
            int n = snprintf(w, sizeof(w), "worker_id=%u", i);
            if (a->create_opt_args(&e->worker_opt[i]) != TDM__NX_OK) { e->worker_opt[i] = NULL; rc = -1; break; }
            if (a->opt_args_set_custom_param(e->worker_opt[i], w, (size_t)n) != TDM__NX_OK) { rc = -1; break; }
        }
        if (rc == TDM__NX_OK && tdm__nx_pool_start(a, e->agent, e->threads, k->wake_fd, &e->pool) != 0)
            return tdm__kvx_fail(TDM_E_NOMEM, "NIXL: cannot start %u copying threads", e->threads);
        if (rc != TDM__NX_OK) return tdm__kvx_fail(TDM_E_IO, "NIXL: cannot make per-worker transfer options");
    }
    if (rc != TDM__NX_OK) {
        return tdm__kvx_fail(TDM_E_UNSUPPORTED, "NIXL: cannot create the UCX backend (status %d): no UCX plug-in beside libnixl.so, or UCX_TLS without an active-message transport such as tcp", rc);
    }
    return TDM_OK;
}

void tdm__kvx_nixl_unregister(tdm__kvx_nixl *e)
{
    const tdm__nx_api *a = e->a;
    if (e->kv_on) a->deregister_mem(e->agent, e->kv_reg, NULL);
    if (e->ring_on) a->deregister_mem(e->agent, e->ring_reg, NULL);
    if (e->kv_reg) a->destroy_reg_dlist(e->kv_reg);
    if (e->ring_reg) a->destroy_reg_dlist(e->ring_reg);
    free(e->md);
    tdm__free(e->ring);
    tdm__free(e->send_owner);
    tdm__free(e->recv_busy);
    tdm__free(e->rgn);
    e->kv_on = e->ring_on = 0;
    e->kv_reg = e->ring_reg = NULL;
    e->md = NULL;
    e->ring = NULL;
    e->send_owner = NULL;
    e->recv_busy = NULL;
    e->rgn = NULL;
}

static int do_register(tdm_kvx *k);

/* Registers the KV layers and the staging ring, then takes the agent's metadata. */
int tdm__kvx_nixl_register(tdm_kvx *k)
{
    int rc = do_register(k);
    if (rc) tdm__kvx_nixl_unregister(k->nixl);
    return rc;
}

static int do_register(tdm_kvx *k)
{
    tdm__kvx_nixl *e = k->nixl;
    const tdm__nx_api *a = e->a;
    size_t lbytes;
    if (tdm_kv_layout_layer_bytes(&k->layout, &lbytes) != TDM_OK)
        return tdm__kvx_fail(TDM_E_INVAL, "NIXL: cannot size a layer");
    e->slot_bytes = k->cfg.max_chunk_bytes;
    e->slots = k->cfg.shm_slots;
    size_t ring = 2 * e->slot_bytes * e->slots;
    e->ring = tdm__malloc(ring);
    e->send_owner = tdm__calloc(e->slots, sizeof(uint32_t));
    e->recv_busy = tdm__calloc(e->slots, 1);
    e->rgn_len = 8 * ((size_t)TDM__KVX_NIXL_RGN_HDR + k->layout.num_layers);
    e->rgn = tdm__calloc(1, e->rgn_len);
    if (!e->ring || !e->send_owner || !e->recv_busy || !e->rgn) return tdm__kvx_fail(TDM_E_NOMEM, "out of memory");
    uint64_t dev = 0;   /* the CUDA device of a VRAM cache: the current one (0) */
    if (a->create_reg_dlist(tdm__nx_mem_kind(k), &e->kv_reg) != TDM__NX_OK) { e->kv_reg = NULL; goto nixl_fail; }
    for (uint32_t l = 0; l < k->layout.num_layers; l++)
        if (a->reg_dlist_add_desc(e->kv_reg, (uintptr_t)k->bases[l], lbytes, dev, NULL, 0) != TDM__NX_OK) goto nixl_fail;
    if (a->register_mem(e->agent, e->kv_reg, NULL) != TDM__NX_OK)
        return tdm__kvx_fail(TDM_E_IO, "NIXL: cannot register the KV cache (%u layers of %zu bytes)",
                             k->layout.num_layers, lbytes);
    e->kv_on = 1;
    if (a->create_reg_dlist(TDM__NX_DRAM, &e->ring_reg) != TDM__NX_OK) { e->ring_reg = NULL; goto nixl_fail; }
    if (a->reg_dlist_add_desc(e->ring_reg, (uintptr_t)e->ring, ring, 0, NULL, 0) != TDM__NX_OK ||
        a->register_mem(e->agent, e->ring_reg, NULL) != TDM__NX_OK)
        goto nixl_fail;
    e->ring_on = 1;
    if (a->get_local_md(e->agent, &e->md, &e->md_len) != TDM__NX_OK || !e->md) { e->md = NULL; goto nixl_fail; }
    if (e->md_len == 0 || e->md_len > TDM__KVX_MAX_NIXL_MD)
        return tdm__kvx_fail(TDM_E_UNSUPPORTED, "NIXL metadata of %zu bytes (at most %u fit a HELLO)", e->md_len,
                             TDM__KVX_MAX_NIXL_MD);
    put_u64(e->rgn, (uint64_t)k->mem_kind);
    put_u64(e->rgn + 8, dev);
    put_u64(e->rgn + 16, (uint64_t)(uintptr_t)e->ring);
    put_u64(e->rgn + 24, e->slot_bytes);
    put_u64(e->rgn + 32, e->slots);
    for (uint32_t l = 0; l < k->layout.num_layers; l++)
        put_u64(e->rgn + 8 * ((size_t)TDM__KVX_NIXL_RGN_HDR + l), (uint64_t)(uintptr_t)k->bases[l]);
    return TDM_OK;
nixl_fail:
    return tdm__kvx_fail(TDM_E_IO, "NIXL: memory registration failed");
}

void tdm__kvx_nixl_fill_hello(const tdm_kvx *k, tdm__kvx_hello *h)
{
    const tdm__kvx_nixl *e = k->nixl;
    if (!e || !e->md) return;
    snprintf(h->nixl_agent, sizeof(h->nixl_agent), "%s", e->name);
    h->nixl_md = e->md;
    h->nixl_md_len = (uint32_t)e->md_len;
    h->nixl_rgn = e->rgn;
    h->nixl_rgn_len = (uint32_t)e->rgn_len;
}

/* K (and V) of one block is one contiguous run: its extent equals its element count. */
static int block_dense(const tdm_kv_layout *l)
{
    int64_t ext = l->stride_token * (int64_t)(l->block_size - 1) + l->stride_head * (int64_t)(l->num_kv_heads - 1) +
                  (int64_t)l->head_dim;
    return ext == (int64_t)l->block_size * l->num_kv_heads * l->head_dim;
}

int tdm__kvx_nixl_peer_open(tdm_kvx *k, kvx_peer *p, const tdm__kvx_hello *h, char *why, size_t why_len)
{
    tdm__kvx_nixl *e = k->nixl;
    if (!e || !e->md || !h->nixl_agent[0] || !(h->transports & TDM_KVX_TRANSPORT_NIXL)) {
        snprintf(why, why_len, "NIXL not offered by both ends");
        return TDM_E_UNSUPPORTED;
    }
    if (h->layout.num_layers != k->layout.num_layers) {
        snprintf(why, why_len, "NIXL: layer counts differ");
        return TDM_E_LAYOUT;
    }
    uint64_t slot_bytes = tdm__kvx_hello_nixl_u64(h, 3);
    if (slot_bytes > e->slot_bytes) {
        snprintf(why, why_len, "NIXL: the peer's ring slots (%llu bytes) exceed ours (%zu)",
                 (unsigned long long)slot_bytes, e->slot_bytes);
        return TDM_E_CONFIG;
    }
    tdm__kvx_nixl_peer *x = tdm__calloc(1, sizeof(*x));
    uint64_t *bases = tdm__calloc(h->layout.num_layers, sizeof(uint64_t));
    if (!x || !bases) {
        tdm__free(x);
        tdm__free(bases);
        snprintf(why, why_len, "out of memory");
        return TDM_E_NOMEM;
    }
    char *name = NULL;
    if (e->a->load_remote_md(e->agent, h->nixl_md, h->nixl_md_len, &name) != TDM__NX_OK || !name) {
        tdm__free(x);
        tdm__free(bases);
        snprintf(why, why_len, "NIXL: the peer's metadata does not load");
        return TDM_E_PROTOCOL;
    }
    if (strcmp(name, h->nixl_agent) != 0) {
        /* the metadata must be the agent the HELLO names */
        e->a->invalidate_remote_md(e->agent, name);
        free(name);
        tdm__free(x);
        tdm__free(bases);
        snprintf(why, why_len, "NIXL: metadata of another agent than '%.40s'", h->nixl_agent);
        return TDM_E_PROTOCOL;
    }
    x->e = e;
    x->peer = p->id;
    x->agent = name;
    x->mem = (uint32_t)tdm__kvx_hello_nixl_u64(h, 0);
    x->dev = tdm__kvx_hello_nixl_u64(h, 1);
    x->stage = tdm__kvx_hello_nixl_u64(h, 2);
    x->slot_bytes = slot_bytes;
    x->slots = (uint32_t)tdm__kvx_hello_nixl_u64(h, 4);
    x->layers = h->layout.num_layers;
    for (uint32_t l = 0; l < x->layers; l++) bases[l] = tdm__kvx_hello_nixl_u64(h, TDM__KVX_NIXL_RGN_HDR + l);
    x->bases = bases;
    const tdm_kv_layout *r = &h->layout, *o = &k->layout;
    x->direct = tdm__kvx_compat(r, h->head_offset, o, k->head_offset, NULL, 0) == 0 &&
                h->head_offset == k->head_offset && p->scales_same && r->stride_token == o->stride_token &&
                r->stride_head == o->stride_head && block_dense(r) && block_dense(o);
    p->nx = x;
    return TDM_OK;
}

int tdm__kvx_nixl_peer_direct(const kvx_peer *p) { return p->nx && p->nx->direct; }

/* ---- the sender's side: a transport over the send half of the ring ------------------------- */

static int nixl_acquire(void *ctx, size_t nbytes, void **buf, uint32_t *slot)
{
    tdm__kvx_nixl_peer *q = ctx;
    tdm__kvx_nixl *e = q->e;
    if (nbytes > e->slot_bytes) return TDM_E_INTERNAL;
    if (e->send_busy == e->slots) return TDM_E_AGAIN;
    for (uint32_t i = 0; i < e->slots; i++) {
        if (e->send_owner[i]) continue;
        e->send_owner[i] = q->peer + 1;
        e->send_busy++;
        *buf = e->ring + (size_t)i * e->slot_bytes;
        *slot = i;
        return TDM_OK;
    }
    return TDM_E_AGAIN;
}

static void nixl_abandon(void *ctx, void *buf, uint32_t slot)
{
    (void)buf;
    tdm__kvx_nixl_peer *q = ctx;
    tdm__kvx_nixl *e = q->e;
    if (slot < e->slots && e->send_owner[slot] == q->peer + 1) { e->send_owner[slot] = 0; e->send_busy--; }
}

/* Only the peer a slot was handed to may return it. */
static int nixl_credit(void *ctx, uint32_t slot)
{
    tdm__kvx_nixl_peer *q = ctx;
    tdm__kvx_nixl *e = q->e;
    if (slot >= e->slots || e->send_owner[slot] != q->peer + 1) return TDM_E_PROTOCOL;
    e->send_owner[slot] = 0;
    e->send_busy--;
    return TDM_OK;
}

/* Chunks from a NIXL peer are READ (tdm__kvx_nixl_read), never resolved in place. */
static int nixl_resolve(void *ctx, zmq_msg_t *frame, uint32_t slot, size_t nbytes, const void **bytes)
{
    (void)ctx; (void)frame; (void)slot; (void)nbytes; (void)bytes;
    return TDM_E_PROTOCOL;
}

const tdm__kvx_transport tdm__kvx_nixl_transport = {
    .version = TDM__KVX_TRANSPORT_VERSION,
    .name = "nixl",
    .kind = TDM_KVX_TRANSPORT_NIXL,
    .acquire = nixl_acquire,
    .make_frame = NULL,
    .abandon = nixl_abandon,
    .credit = nixl_credit,
    .resolve = nixl_resolve,
    .destroy = NULL,
};
