/*
 * kvx_nixl_priv.h -- what the two halves of the NIXL transport share: kvx_nixl_agent.c (the
 * agent, its UCX backend and copying threads, registration, the handshake fields, the
 * sender's ring) and kvx_tp_nixl.c (the READs). Internal to libtandem.
 */
#ifndef TANDEM_KVX_NIXL_PRIV_H
#define TANDEM_KVX_NIXL_PRIV_H

#include "kvx_internal.h"
#include "kvx_nixl_api.h"
#include "kvx_nixl_pool.h"

#define MAX_INFLIGHT 64          /* READs posted at once per engine */
#define REAP_WAIT_S 5.0          /* longest wait for a READ that cannot be cancelled */
/* NIXL's progress thread polls the UCX workers' event descriptors with this timeout. The C
 * API's plain create_agent leaves it at 0, and then the thread never sleeps: it spins on the
 * worker's lock while our I/O thread posts, which on a small machine took ~0.9 of the READ
 * bandwidth (docs/protocol.md §5.3). Events still wake it at once; TANDEM_NIXL_PTHR_DELAY_US
 * overrides. Only engines that are READ from run the thread (tdm__kvx_nixl_create). */
#define PTHR_DELAY_US 1000
/* The threads that copy a READ (TANDEM_NIXL_THREADS overrides): on one host UCX's cma copies
 * in the thread that progresses the worker, one process_vm_readv per descriptor, so a single
 * thread caps scattered blocks well below memcpy (docs/protocol.md §5.2). */
#define MAX_THREADS 64
#define DEFAULT_THREADS 4        /* at most; never more than the online CPUs */
#define MIN_PIECE (64u << 10)    /* with several threads a descriptor is cut into pieces >= this */

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
    tdm__nx_job *jobs;           /* with copying threads: its parts (n_jobs), parts_left of them out */
    uint32_t n_jobs, parts_left;
    int part_st;                 /* the first failure among its parts (TDM__NX_OK) */
    int dying;                   /* its transfer ended: waited for, not landed */
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
    uint32_t threads;            /* copying threads: 1 = the I/O thread, N > 1 = the pool's */
    uint64_t piece;              /* the longest descriptor (threads > 1), else 0 */
    tdm__nx_pool *pool;          /* threads > 1 */
    tdm__nx_opt *worker_opt;     /* [threads]: "worker_id=i" */
    tdm__nx_job *deferred;       /* done parts taken while waiting for others (abort_where) */
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

static inline int tdm__nx_mem_kind(const tdm_kvx *k) { return k->mem_kind == TDM_MEM_CUDA ? TDM__NX_VRAM : TDM__NX_DRAM; }

/* kvx_nixl_agent.c: undoes tdm__kvx_nixl_register (also after a partial one). */
void tdm__kvx_nixl_unregister(tdm__kvx_nixl *e);

#endif /* TANDEM_KVX_NIXL_PRIV_H */
