/*
 * kvx_internal.h -- the insides of a tdm_kvx shared by the files of kv_transfer/: the handle,
 * peers, transfers, the transport vtable and the helpers each file provides. One lock
 * (kvx->mu) guards all of it; sockets belong to the I/O thread alone. Internal to libtandem.
 */
#ifndef TANDEM_KVX_INTERNAL_H
#define TANDEM_KVX_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include <zmq.h>

#include "internal.h"
#include "kvx_msg.h"
#include "tandem.h"

/* ---- transports --------------------------------------------------------------------------- */

#define TDM__KVX_TRANSPORT_VERSION 1

/* A transport moves the packed bytes of one chunk from sender to receiver; control always
 * goes over ZeroMQ. Append-only table, version first; optional methods may be NULL. */
typedef struct tdm__kvx_transport {
    uint32_t version;                 /* TDM__KVX_TRANSPORT_VERSION */
    const char *name;
    uint32_t kind;                    /* TDM_KVX_TRANSPORT_* */
    /* Sender: a buffer for nbytes of packed data. TDM_E_AGAIN when none is free now (the I/O
     * thread is woken when one frees). *slot is TDM__KVX_NO_SLOT when the bytes travel as a
     * ZeroMQ frame. */
    int (*acquire)(void *ctx, size_t nbytes, void **buf, uint32_t *slot);
    /* Sender, optional: wrap buf into a (zero-copy) payload frame; NULL: no payload frame. */
    int (*make_frame)(void *ctx, void *buf, size_t nbytes, zmq_msg_t *frame);
    /* Sender: give back a buffer that was acquired but not sent. */
    void (*abandon)(void *ctx, void *buf, uint32_t slot);
    /* Sender, optional: the receiver is done with slot (CREDIT message). */
    int (*credit)(void *ctx, uint32_t slot);
    /* Receiver: the bytes of a chunk, from its payload frame (NULL if none) or its slot.
     * Checks that they cover exactly nbytes. */
    int (*resolve)(void *ctx, zmq_msg_t *frame, uint32_t slot, size_t nbytes, const void **bytes);
    /* Optional: release ctx. */
    void (*destroy)(void *ctx);
} tdm__kvx_transport;

/* ZeroMQ frames from a pool of max_chunk-sized buffers returned by zmq's free callback. */
typedef struct tdm__kvx_pool tdm__kvx_pool;
int tdm__kvx_pool_create(size_t buf_bytes, uint32_t count, int wake_fd, tdm__kvx_pool **out);
void tdm__kvx_pool_destroy(tdm__kvx_pool *p);
extern const tdm__kvx_transport tdm__kvx_zmq_transport;   /* ctx: tdm__kvx_pool */

/* Shared memory (kvx_tp_shm.c; trust model in docs/protocol.md §5). A segment is created by
 * the side that writes it, under a name it generates; a peer's segment is only ever opened
 * read-only after checks; only the creator unlinks. */
/* Creates "/tdm-kvx-NS-PID-<tag>-RAND" (O_EXCL, 0600) of size bytes, mapped read-write. */
int tdm__kvx_seg_create(const char *tag, size_t size, char *name, size_t name_len, uint8_t **map);
/* Maps a peer-named segment read-only after checking the name pattern (kind 'k' or 't'), and
 * with fstat that it is a regular object of our uid, mode 0600, of exactly size bytes.
 * TDM_E_NOT_FOUND: it cannot be opened (absent, no permission); TDM_E_PROTOCOL: a check
 * failed; why says which. Never writes or unlinks anything. */
int tdm__kvx_seg_open_ro(const char *name, int kind, uint64_t size, const uint8_t **map, char *why, size_t why_len);
/* Unlinks the segments of dead owners: our uid and pid namespace, pid no longer alive. */
void tdm__kvx_shm_sweep(void);
/* A peer pair's segments: ours (tx, created) and the peer's (rx, mapped read-only). */
typedef struct tdm__kvx_shm tdm__kvx_shm;
int tdm__kvx_shm_new(tdm__kvx_shm **out);
int tdm__kvx_shm_create(tdm__kvx_shm *s, size_t slot_bytes, uint32_t slots, unsigned seq);
int tdm__kvx_shm_attach(tdm__kvx_shm *s, const char *name, uint64_t size, size_t slot_bytes, char *why, size_t why_len);
const char *tdm__kvx_shm_name(const tdm__kvx_shm *s);   /* ours, "" if none */
uint64_t tdm__kvx_shm_size(const tdm__kvx_shm *s);      /* ours */
int tdm__kvx_shm_can_send(const tdm__kvx_shm *s);
int tdm__kvx_shm_can_recv(const tdm__kvx_shm *s);
int tdm__kvx_shm_named(const tdm__kvx_shm *s);           /* our name still in /dev/shm */
/* Our name leaves /dev/shm (the peer has mapped it, or never will); idempotent. */
void tdm__kvx_shm_unlink(tdm__kvx_shm *s);
/* Our segment is not used (the peer did not map it): unlink and unmap it. */
void tdm__kvx_shm_drop_tx(tdm__kvx_shm *s);
void tdm__kvx_shm_destroy(tdm__kvx_shm *s);
extern const tdm__kvx_transport tdm__kvx_shm_transport;   /* ctx: tdm__kvx_shm */

/* NIXL (kvx_tp_nixl.c): one agent per engine, the KV cache and a staging ring registered;
 * a peer that negotiated NIXL has p->nx (its agent, regions) and uses this transport for the
 * chunks it sends (staged: slots of our ring, returned by CREDIT). */
typedef struct tdm__kvx_nixl tdm__kvx_nixl;
typedef struct tdm__kvx_nixl_peer tdm__kvx_nixl_peer;
extern const tdm__kvx_transport tdm__kvx_nixl_transport;   /* ctx: tdm__kvx_nixl_peer */

/* CUDA IPC: a capability only; without libtandem_cuda.so and a device it reports NO_CUDA. */
int tdm__kvx_cuda_ipc_available(void);
extern const tdm__kvx_transport tdm__kvx_cuda_ipc_transport;

/* ---- peers and transfers ------------------------------------------------------------------ */

enum { PEER_FREE = 0, PEER_HANDSHAKE, PEER_ALIVE, PEER_DEAD };

/* Settings that tdm_kvx_create_json accepts beyond tdm_kvx_config (0 = the default). */
typedef struct tdm__kvx_limits {
    uint32_t max_peers_per_source;  /* accepted peers from one Peer-Address; default 64 */
    uint32_t max_peers_per_key;     /* of one CURVE key; default 64 */
    uint32_t peer_idle_ms;          /* no transfer this long after HELLO: slot reclaimable */
    uint32_t nixl_require_curve;    /* NIXL only with CURVE-authenticated peers */
} tdm__kvx_limits;

/* tdm_kvx_create with those settings (lim NULL: the defaults). */
int tdm__kvx_create_lim(const tdm_kvx_config *cfg, const tdm__kvx_limits *lim, tdm_kvx **out);

typedef struct kvx_peer {
    uint32_t id;                   /* (generation << 16) | slot index: ids are never reused */
    uint32_t gen;
    int state;
    int outgoing;                  /* we connected (own DEALER) */
    void *sock;                    /* DEALER when outgoing */
    void *mon;                     /* its monitor socket */
    uint8_t rtid[256];             /* ROUTER routing id when incoming */
    size_t rtid_len;
    tdm__kvx_hello remote;
    double last_rx, last_tx;
    const tdm__kvx_transport *tx;  /* for the chunks we send */
    void *tx_ctx;
    const tdm__kvx_transport *rx;  /* for the chunks we receive */
    void *rx_ctx;
    tdm__kvx_shm *shm;             /* the pair's segments, if any */
    uint8_t *rkv;                  /* the peer's KV segment mapped read-only (direct reads) */
    size_t rkv_size;
    void **rkv_bases;              /* its layer bases in our address space */
    int tx_blocked;                /* the tx transport said AGAIN */
    float *rscales;                /* the peer's KV scales: K then V (remote.k_scales / v_scales) */
    int scales_same;               /* receiving from it needs no rescaling (equal dtypes and scales) */
    tdm__kvx_nixl_peer *nx;        /* NIXL negotiated: the peer's agent and regions */
    /* handshake of an outgoing connection */
    char ep[256];
    char srvkey[41];
    double hs_deadline;
    int hs_done, hs_status;
    int hs_waiting;                /* tdm_kvx_connect still reads this slot */
    char hs_reason[TDM__KVX_REASON_LEN];
    /* an accepted peer: where from, and whether it has done more than HELLO and PING */
    char src[48];                  /* ZeroMQ Peer-Address ("" over ipc) */
    char key[41];                  /* its CURVE key (Z85), "" without CURVE */
    double t_hello;
    int used;
} kvx_peer;

enum { XS_WAIT = 1, XS_ACTIVE, XS_DRAIN, XS_CANCELLING };

typedef struct kvx_xfer {
    struct kvx_xfer *next;
    uint64_t handle;
    uint32_t side;                 /* TDM_KVX_SIDE_* */
    uint32_t state;
    uint32_t mode;
    uint32_t peer;                 /* TDM_KVX_PEER_ANY: a PULL export not yet matched */
    uint64_t rid, xid;
    uint32_t n, skip;              /* own blocks; skip: leading ones not moved */
    uint32_t tok;                  /* tokens of the transfer */
    int tok_known;                 /* receiver: the sender's count arrived */
    int direct;                    /* the receiver reads our blocks from our shared KV segment */
    uint32_t n_eff;                /* sender: blocks to send (those holding tokens) */
    uint32_t gran;                 /* sender: chunks start at multiples of this many blocks */
    uint32_t *blocks;
    double deadline;
    uint32_t timeout_ms;
    uint64_t bytes;
    /* sender */
    uint32_t *ready;               /* per layer: blocks ready */
    uint32_t *sent;                /* per layer: blocks sent (from skip) */
    uint32_t seq;
    /* receiver */
    uint8_t *got;                  /* bitmap [layer][block] */
    uint64_t units_need, units_got;
} kvx_xfer;

/* A transfer request that reached a sender before its tdm_kvx_send(). */
typedef struct kvx_pending {
    struct kvx_pending *next;
    uint32_t peer, mode, n, skip, tok;   /* mode with the DIRECT flag */
    uint64_t rid, xid;
    double deadline;
} kvx_pending;

typedef struct kvx_event_node {
    struct kvx_event_node *next;
    tdm_kvx_event ev;
} kvx_event_node;

/* A control message queued by an API thread for the I/O thread. */
typedef struct kvx_out {
    struct kvx_out *next;
    uint32_t peer;
    size_t len;
    uint8_t data[];
} kvx_out;

struct tdm_kvx {
    tdm_kvx_config cfg;
    char engine_id[TDM__KVX_ID_LEN];
    char host_id[TDM__KVX_ID_LEN];
    char endpoint[256];
    char pub[41], sec[41];
    int curve;                     /* server-side CURVE configured */
    char (*allowed)[41];
    uint32_t num_allowed;

    void *zctx;
    void *router;
    void *zap_sock;
    pthread_t io_thread, zap_thread;
    int io_started, zap_started;
    int stop;
    int wake_fd, ev_fd;

    pthread_mutex_t mu;
    pthread_cond_t cond;           /* events queued, handshakes finished */
    double io_last_timers;         /* when the I/O thread last ran its timers (0: never) */

    /* registration */
    int registered;
    tdm_kv_layout layout;
    void **bases;
    uint32_t mem_kind, head_offset;
    uint32_t *owner;               /* [num_blocks] receive reservations: 0 or xfer handle slot */
    size_t unit_bytes;             /* packed bytes of one block of one layer */
    void *dev_stage;               /* CUDA memory: device staging buffer (max_chunk_bytes) */
    uint8_t *kvseg;                /* tdm_kvx_alloc_shared: the shareable KV segment */
    size_t kvseg_size;
    char kvseg_name[TDM__KVX_ID_LEN];
    /* an ipc:// endpoint we bound: its path and the socket's identity, unlinked on destroy
     * only if that path is still this socket */
    char ipc_path[256];
    uint64_t ipc_dev, ipc_ino;
    char ipc_dir[200];             /* wildcard "ipc://" + "*": the private directory (0700) we made */
    int kv_direct;                 /* every registered layer lies in kvseg */
    uint64_t kv_off[TDM__KVX_MAX_KV_LAYERS];
    uint8_t *bounce;               /* direct reads: cache-sized bounce buffer */
    uint32_t scale_kind;           /* tdm_kvx_set_kv_scales: tdm_kv_scale_kind, NONE by default */
    uint32_t scale_count;          /* floats per layer (1 or num_kv_heads) */
    float *scales;                 /* [2][num_layers * scale_count]: K then V */
    int handshaken;                /* a handshake has begun or completed: scales are fixed */
    size_t bounce_size;

    kvx_peer *peers;
    uint32_t num_peers, cap_peers;
    kvx_xfer *xfers;
    kvx_pending *pending;
    kvx_out *outbox, **outbox_tail;
    kvx_event_node *ev_head, **ev_tail;
    uint32_t ev_count;
    uint64_t next_handle;
    tdm__kvx_pool *pool;
    uint32_t shm_seq;
    int test_stop;                 /* TDM_KVX_TEST_STOP_AT, 0 = none */
    uint32_t test_stall_ms;        /* tests: the I/O thread sleeps this long once, unlocked,
                                      between reading messages and its timers; then 0 */
    tdm__kvx_nixl *nixl;           /* TDM_KVX_TRANSPORT_NIXL configured: agent, registrations */
    tdm_kvx_stats st;
    tdm__kvx_limits lim;           /* peer slots and NIXL policy (JSON-only settings) */
    uint64_t peers_refused, peers_reclaimed;
};

/* Test hook: stages of the handshake and transfer at which a test can stop this process.
 * With TDM_KVX_TEST_STOP_AT=<stage> in the environment when an engine is created, that engine
 * stops its process (SIGSTOP) the first time it reaches the stage, so that a test can SIGKILL
 * it exactly there; otherwise nothing happens. Called with mu held. (kvx.c) */
enum {
    TDM__KVX_STAGE_CLIENT_CREATED = 1,   /* client: own segment created, HELLO not sent */
    TDM__KVX_STAGE_CLIENT_ACK,           /* client: HELLO_ACK received, not processed */
    TDM__KVX_STAGE_CLIENT_MAPPED,        /* client: server's segment mapped, no confirmation sent */
    TDM__KVX_STAGE_SERVER_MAPPED,        /* server: client's segment mapped, own not created */
    TDM__KVX_STAGE_SERVER_CREATED,       /* server: own segment created, HELLO_ACK not sent */
    TDM__KVX_STAGE_SERVER_CONFIRM,       /* server: client's first message, own name not unlinked */
    TDM__KVX_STAGE_SEND_DATA,            /* sender: first chunk sent */
    TDM__KVX_STAGE_RECV_DATA,            /* receiver: first chunk received, not unpacked */
    TDM__KVX_STAGE_MAX = TDM__KVX_STAGE_RECV_DATA
};
void tdm__kvx_stage(tdm_kvx *k, int stage);

/* kvx.c */
void tdm__kvx_wake(tdm_kvx *k);
/* Thread-local error buffer used by every tdm_kvx call. */
int tdm__kvx_fail(int status, const char *fmt, ...) TDM_PRINTF(2, 3);
void tdm__kvx_err_clear(void);

/* kvx_io.c: the I/O thread and the ZAP handler. */
void *tdm__kvx_io_main(void *arg);
void *tdm__kvx_zap_main(void *arg);
int tdm__kvx_zap_bind(tdm_kvx *k);
/* Queue an encoded control message to a peer (any thread, mu held). */
int tdm__kvx_queue_msg(tdm_kvx *k, uint32_t peer, const tdm__kvx_msg *m);
kvx_peer *tdm__kvx_peer(tdm_kvx *k, uint32_t id);   /* NULL unless ALIVE */
kvx_peer *tdm__kvx_peer_any(tdm_kvx *k, uint32_t id); /* any state, NULL if unknown */
kvx_peer *tdm__kvx_peer_new(tdm_kvx *k);
void tdm__kvx_unmap_remote(kvx_peer *p);

/* kvx_xfer.c: the transfer state machines (mu held). */
void tdm__kvx_event(tdm_kvx *k, kvx_xfer *x, uint32_t type, int status, const char *reason);
void tdm__kvx_finish(tdm_kvx *k, kvx_xfer *x, uint32_t type, int status, const char *reason,
                     int tell_peer);
kvx_xfer *tdm__kvx_find(tdm_kvx *k, uint32_t side, uint32_t peer, uint64_t rid, uint64_t xid);
kvx_xfer *tdm__kvx_find_handle(tdm_kvx *k, uint64_t handle);
void tdm__kvx_bind(tdm_kvx *k, kvx_xfer *x, uint32_t peer, uint64_t xid, uint32_t n, uint32_t skip, uint32_t tok,
                   int direct);
void tdm__kvx_on_xfer_req(tdm_kvx *k, kvx_peer *p, const tdm__kvx_msg *m);
void tdm__kvx_on_data(tdm_kvx *k, kvx_peer *p, const tdm__kvx_msg *m, zmq_msg_t *payload);
void tdm__kvx_on_control(tdm_kvx *k, kvx_peer *p, const tdm__kvx_msg *m);
void tdm__kvx_peer_lost(tdm_kvx *k, kvx_peer *p, int status, const char *reason);
void tdm__kvx_timers(tdm_kvx *k, double now);
/* Sends ready chunks; returns 1 when more work is immediately possible. */
int tdm__kvx_pump(tdm_kvx *k, int budget);
int tdm__kvx_send_frames(tdm_kvx *k, kvx_peer *p, const tdm__kvx_msg *m, zmq_msg_t *payload);
void tdm__kvx_xfer_free(tdm_kvx *k, kvx_xfer *x);

/* Receiver: a chunk has landed in our blocks (units = layers x our blocks): count it, extend
 * the deadline, and finish with DONE after the last one. */
void tdm__kvx_landed(tdm_kvx *k, kvx_xfer *x, kvx_peer *p, uint64_t units, uint64_t nbytes);
/* Receiver: give the sender back a staging slot (CREDIT), if its transport uses slots. */
void tdm__kvx_credit(tdm_kvx *k, kvx_peer *p, uint32_t slot);

/* kvx_tp_nixl.c (mu held). create: load NIXL, make the agent and its UCX backend
 * (TDM_E_UNSUPPORTED with why when NIXL is absent); register: the KV layers and the ring. */
int tdm__kvx_nixl_create(tdm_kvx *k);
int tdm__kvx_nixl_register(tdm_kvx *k);
void tdm__kvx_nixl_destroy(tdm_kvx *k);
void tdm__kvx_nixl_fill_hello(const tdm_kvx *k, tdm__kvx_hello *h);
/* Loads the peer's agent metadata from its HELLO and keeps its regions in p->nx. */
int tdm__kvx_nixl_peer_open(tdm_kvx *k, kvx_peer *p, const tdm__kvx_hello *h, char *why, size_t why_len);
void tdm__kvx_nixl_peer_close(tdm_kvx *k, kvx_peer *p);
/* Whether the peer's blocks can be READ into ours as they are (identical block formats). */
int tdm__kvx_nixl_peer_direct(const kvx_peer *p);
/* Receiver: READ a checked DATA chunk (direct: src_ids are the sender's blocks) into our
 * blocks [d0, d1) of x; it lands later (tdm__kvx_nixl_progress). The arrival bits are set. */
int tdm__kvx_nixl_read(tdm_kvx *k, kvx_peer *p, kvx_xfer *x, const tdm__kvx_msg *m, const uint32_t *src_ids,
                       uint32_t d0, uint32_t d1, uint32_t tokens);
/* Polls the posted READs and posts waiting ones; 1 while any remain. */
int tdm__kvx_nixl_progress(tdm_kvx *k);
/* Ends (cancels) every READ of a receiving transfer that is finishing. */
void tdm__kvx_nixl_abort_xfer(tdm_kvx *k, const kvx_xfer *x);

/* kvx_scales.c: the KV quantization scales exchanged in the handshake (mu held). */
void tdm__kvx_fill_scales(const tdm_kvx *k, tdm__kvx_hello *h);
/* Adopt the peer's scales from its decoded HELLO (copied: h points into a frame) and decide
 * whether receiving from it needs rescaling. TDM_E_NOMEM with why. */
int tdm__kvx_peer_scales(tdm_kvx *k, kvx_peer *p, const tdm__kvx_hello *h, char *why, size_t why_len);
void tdm__kvx_peer_scales_free(kvx_peer *p);
/* Set the scale fields of the options converting chunks from p into our cache. */
void tdm__kvx_scale_opts(const tdm_kvx *k, const kvx_peer *p, tdm_kv_convert_opts *o);

/* kvx_layout.c: compatibility and (un)packing through the kernels. */
int tdm__kvx_compat(const tdm_kv_layout *src, uint32_t src_head_off, const tdm_kv_layout *dst,
                    uint32_t dst_head_off, char *why, size_t why_len);
size_t tdm__kvx_unit_bytes(const tdm_kv_layout *l);
size_t tdm__kvx_elem_size(uint32_t dtype);
int tdm__kvx_pack(const tdm_kvx *k, const uint32_t *block_ids, uint32_t n, uint32_t lb, uint32_t le,
                  void *dst, size_t dst_size);
/* Unpack a chunk of src_blocks sender blocks holding `tokens` tokens into our blocks
 * ids[0..n), converting when the peer's packed format differs from ours. */
/* Direct read: copy our blocks ids[0..n) of layers [lb, le) from the peer's mapped cache,
 * sender blocks src_ids[0..n) (identical packed formats), through the bounce buffer. */
int tdm__kvx_copy_direct(tdm_kvx *k, const kvx_peer *p, const uint32_t *src_ids, const uint32_t *ids,
                         uint32_t n, uint32_t lb, uint32_t le);
int tdm__kvx_unpack(const tdm_kvx *k, const kvx_peer *p, const void *src, size_t src_size,
                    uint32_t src_blocks, uint32_t tokens, const uint32_t *ids, uint32_t n,
                    uint32_t lb, uint32_t le);

#endif /* TANDEM_KVX_INTERNAL_H */
