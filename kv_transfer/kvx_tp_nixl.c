/*
 * kvx_tp_nixl.c -- the NIXL transport: ZeroMQ keeps the control plane, NIXL (UCX, libfabric,
 * GDS underneath) carries the bytes, and the receiver pulls them with one-sided READs, as
 * vLLM's NixlConnector does. At tdm_kvx_create an agent named after the engine gets a UCX
 * backend; at registration every layer of the KV cache (host DRAM, or VRAM for a CUDA cache)
 * and a staging ring are registered with it, and its metadata plus a region table (layer
 * bases, ring address) travel in HELLO / HELLO_ACK (docs/protocol.md §5.2). Two ways a chunk
 * moves: identical block formats on both ends -> DATA lists the sender's block ids and the
 * receiver READs those blocks straight into its reserved ones (runs of blocks contiguous on
 * both ends as one descriptor); different formats -> the
 * sender packs into a slot of its registered ring, DATA names the slot, the receiver READs it
 * into a slot of its own ring, unpacks (converting) and returns the sender's slot with
 * CREDIT. READs are asynchronous: the I/O thread polls them (tdm__kvx_nixl_progress); a
 * transfer that ends while READs are outstanding cancels them before its blocks are
 * released, so nothing lands in blocks it no longer owns. The agent of an engine that is READ
 * from runs NIXL's progress thread (sleeping between UCX events); a decode engine's agent has
 * none: its I/O thread progresses it while READs are out. Every call here runs with kvx->mu
 * held; NIXL is entered only by the I/O thread, except registration and teardown.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvx_internal.h"
#include "kvx_nixl_api.h"

#define MAX_INFLIGHT 64          /* READs posted at once per engine */
#define REAP_WAIT_S 5.0          /* longest wait for a READ that cannot be cancelled */
/* NIXL's progress thread polls the UCX workers' event descriptors with this timeout. The C
 * API's plain create_agent leaves it at 0, and then the thread never sleeps: it spins on the
 * worker's lock while our I/O thread posts, which on a small machine took ~0.9 of the READ
 * bandwidth (docs/protocol.md §5.3). Events still wake it at once; TANDEM_NIXL_PTHR_DELAY_US
 * overrides. Only engines that are READ from run the thread (tdm__kvx_nixl_create). */
#define PTHR_DELAY_US 1000

/* One chunk to READ: posted (req != NULL) or waiting for a slot / a place. */
typedef struct nread {
    struct nread *next;
    uint64_t xfer;               /* the receiving transfer's handle */
    uint32_t peer;
    tdm__nx_req req;
    uint32_t lb, le, d0, d1;     /* layers, our blocks (indices into the transfer's list) */
    uint32_t src_blocks, tokens; /* the chunk's sender blocks and tokens (staged: unpack) */
    uint32_t slot;               /* the sender's slot, or TDM__KVX_DIRECT_SLOT */
    uint32_t lslot;              /* our receive slot (staged) */
    uint64_t nbytes;
    uint32_t n_ids;
    uint32_t src_ids[];          /* direct: the sender's block ids */
} nread;

struct tdm__kvx_nixl {
    const tdm__nx_api *a;
    tdm__nx_agent agent;
    tdm__nx_backend be;
    char name[TDM__KVX_ID_LEN];
    tdm__nx_reg kv_reg, ring_reg;
    int kv_on, ring_on;
    uint8_t *ring;               /* [2][slots][slot_bytes]: send half, receive half */
    size_t slot_bytes;
    uint32_t slots;
    uint32_t *send_owner;        /* peer id + 1 holding a send slot, 0 free */
    uint32_t send_busy;
    uint8_t *recv_busy;
    void *md;                    /* our agent metadata (NIXL's malloc) */
    size_t md_len;
    uint8_t *rgn;                /* the region table, little-endian u64 */
    size_t rgn_len;
    nread *posted, *waiting, **waiting_tail;
    uint32_t n_posted;
};

struct tdm__kvx_nixl_peer {
    tdm__kvx_nixl *e;
    uint32_t peer;
    char *agent;                 /* the remote agent's name (NIXL's strdup) */
    uint32_t mem;
    uint64_t dev, stage, slot_bytes;
    uint32_t slots, layers;
    uint64_t *bases;             /* the remote layers' addresses */
    int direct;                  /* the blocks can be READ into ours as they are */
};

static int nx_mem(const tdm_kvx *k) { return k->mem_kind == TDM_MEM_CUDA ? TDM__NX_VRAM : TDM__NX_DRAM; }

static void put_u64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
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
    int made;
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
        c.lthr_delay_us = 100000;
        made = a->create_configured_agent(e->name, &c, &e->agent);
    } else {
        made = a->create_agent(e->name, &e->agent);   /* an older library: its defaults */
    }
    if (made != TDM__NX_OK) {
        e->agent = NULL;
        return tdm__kvx_fail(TDM_E_IO, "NIXL: cannot create agent %s", e->name);
    }
    tdm__nx_mems mems = NULL;
    tdm__nx_params params = NULL;
    int rc = a->get_plugin_params(e->agent, "UCX", &mems, &params);
    if (rc == TDM__NX_OK) rc = a->create_backend(e->agent, "UCX", params, &e->be);
    if (mems) a->destroy_mem_list(mems);
    if (params) a->destroy_params(params);
    if (rc != TDM__NX_OK) {
        e->be = NULL;
        return tdm__kvx_fail(TDM_E_UNSUPPORTED, "NIXL: cannot create the UCX backend (status %d): no UCX plug-in beside libnixl.so, or UCX_TLS without an active-message transport such as tcp", rc);
    }
    return TDM_OK;
}

/* Undoes tdm__kvx_nixl_register (also after a partial one). */
static void unregister(tdm__kvx_nixl *e)
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
    if (rc) unregister(k->nixl);
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
    if (a->create_reg_dlist(nx_mem(k), &e->kv_reg) != TDM__NX_OK) { e->kv_reg = NULL; goto nixl_fail; }
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

/* ---- READs --------------------------------------------------------------------------------- */

/* Releases a READ (cancelling it if still active; a backend that cannot cancel is waited
 * for, up to REAP_WAIT_S). TDM_OK when it completed, else why it did not. */
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
    if (r->slot != TDM__KVX_DIRECT_SLOT && r->lslot < e->slots && e->recv_busy[r->lslot]) e->recv_busy[r->lslot] = 0;
    tdm__free(r);
}

static int add(const tdm__nx_api *a, tdm__nx_dlist d, uint64_t addr, uint64_t len, uint64_t dev)
{
    return a->xfer_dlist_add_desc(d, (uintptr_t)addr, (size_t)len, dev) == TDM__NX_OK ? 0 : -1;
}

/* The descriptors of a direct READ: per layer, the K and V halves of each block, where a
 * half that follows the previous one in both caches (adjacent block ids on both ends, or K
 * and V adjacent in a block) extends it, so a run of contiguous blocks is one descriptor.
 * Never across layers: each layer is its own registration. 0, or -1 when NIXL refused one. */
static int add_blocks(const tdm_kvx *k, const kvx_peer *p, const kvx_xfer *x, const nread *r, tdm__nx_dlist loc,
                      tdm__nx_dlist rem)
{
    const tdm__nx_api *a = k->nixl->a;
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
                if (len && (add(a, loc, la, len, 0) || add(a, rem, ra, len, q->dev))) return -1;
                la = lb;
                ra = rb;
                len = half;
            }
        if (len && (add(a, loc, la, len, 0) || add(a, rem, ra, len, q->dev))) return -1;
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
    tdm__nx_dlist loc = NULL, rem = NULL;
    int rc = TDM_E_IO;
    /* direct: cache to cache (DRAM or VRAM); staged: the host rings of both ends */
    if (a->create_xfer_dlist(direct ? nx_mem(k) : TDM__NX_DRAM, &loc) != TDM__NX_OK) { loc = NULL; goto out; }
    if (a->create_xfer_dlist(direct ? (int)q->mem : TDM__NX_DRAM, &rem) != TDM__NX_OK) { rem = NULL; goto out; }
    if (direct && add_blocks(k, p, x, r, loc, rem)) goto out;
    if (!direct) {
        uint8_t *dst = e->ring + (e->slots + (size_t)r->lslot) * e->slot_bytes;
        if (add(a, loc, (uint64_t)(uintptr_t)dst, r->nbytes, 0) ||
            add(a, rem, q->stage + (uint64_t)r->slot * q->slot_bytes, r->nbytes, 0))
            goto out;
    }
    if (a->create_xfer_req(e->agent, TDM__NX_READ, loc, rem, q->agent, &r->req, NULL) != TDM__NX_OK) {
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
out:
    if (loc) a->destroy_xfer_dlist(loc);
    if (rem) a->destroy_xfer_dlist(rem);
    if (rc && !direct && r->lslot < e->slots) { e->recv_busy[r->lslot] = 0; r->lslot = UINT32_MAX; }
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

int tdm__kvx_nixl_progress(tdm_kvx *k)
{
    tdm__kvx_nixl *e = k->nixl;
    if (!e) return 0;
    for (int again = 1; again;) {
        again = 0;
        for (nread **pp = &e->posted; *pp;) {
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
    return e->posted || e->waiting;
}

/* Ends every READ of a transfer (or of a peer) before its blocks or slots are released. */
static void abort_where(tdm_kvx *k, uint64_t xfer, uint32_t peer)
{
    tdm__kvx_nixl *e = k->nixl;
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
    while (e->posted) { nread *r = e->posted; e->posted = r->next; reap(e, r, 1); free_read(e, r); }
    while (e->waiting) { nread *r = e->waiting; e->waiting = r->next; free_read(e, r); }
    const tdm__nx_api *a = e->a;
    unregister(e);
    if (e->be) a->destroy_backend(e->be);
    if (e->agent) a->destroy_agent(e->agent);
    tdm__free(e);
    k->nixl = NULL;
}

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
