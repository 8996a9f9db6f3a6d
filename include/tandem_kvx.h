/*
 * tandem_kvx.h -- the KV transfer engine (tdm_kvx): peers, handshake, transfers of paged
 * KV blocks between a prefill and a decode engine, completion events.
 * Part of Tandem's public ABI; included by tandem.h.
 *
 * Model. Each engine owns one tdm_kvx. It registers its paged KV cache (a tdm_kv_layout and
 * one base pointer per layer), listens on a ZeroMQ endpoint and connects to peers. A
 * handshake (once per peer) exchanges engine ids, the protocol version, the layouts, the
 * memory kinds, the transports and fp8 KV scales; after it, a transfer names only a
 * request id, a transfer id and block counts. Data always flows from the sending side (prefill) to the receiving
 * side (decode), and only after the receiver has reserved its destination blocks:
 *
 *   receiver: tdm_kvx_recv()  reserves dst blocks, skips the leading prefix-cached ones,
 *                              and sends a transfer request (PULL or PUSH, see below);
 *   sender:   tdm_kvx_send()  names the request's source blocks and how many are ready;
 *             tdm_kvx_send_ready() announces more computed blocks / layers (streaming).
 *   both:     tdm_kvx_poll() / tdm_kvx_get_fd() deliver DONE, FAILED, CANCELLED events.
 *
 * Threading. A tdm_kvx runs one background I/O thread (plus a ZAP thread when CURVE is
 * configured). Every function below is thread-safe unless it says otherwise (calls are
 * serialised by the handle's lock, which the I/O thread also holds while it packs or unpacks
 * one chunk, so a call may wait that long); create/destroy are not, and destroy must not race
 * with any other call on the same handle. tdm_kvx_connect and tdm_kvx_poll block (up to the
 * handshake timeout / the given timeout) without holding the lock.
 *
 * Conversion. The receiver converts while unpacking when the sender's dtype, head split
 * (tensor parallelism: the receiver's heads [head_offset, +num_kv_heads) must lie within the
 * sender's) or block size differ (tokens are re-blocked; the transfer moves
 * min(receiver blocks * its block size, sender blocks * its block size) tokens, which must
 * reach into the receiver's last block) or the fp8 scales differ (tdm_kvx_set_kv_scales).
 * num_layers and head_dim must be equal.
 * docs/protocol.md describes the wire protocol.
 */
#ifndef TANDEM_KVX_H
#define TANDEM_KVX_H

#include "tandem.h"

/* The layout descriptor is defined in tandem_kernels.h (which may be the header being
 * included first, hence the tag here). */
struct tdm_kv_layout;

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdm_kvx tdm_kvx;

/* The wire protocol version (docs/protocol.md). */
#define TDM_KVX_PROTOCOL_VERSION 1

typedef enum tdm_kvx_role {
    TDM_KVX_ROLE_BOTH = 0,     /* sends and receives */
    TDM_KVX_ROLE_PREFILL = 1,  /* sends KV */
    TDM_KVX_ROLE_DECODE = 2    /* receives KV */
} tdm_kvx_role;

typedef enum tdm_mem_kind {
    TDM_MEM_HOST = 0,
    TDM_MEM_CUDA = 1
} tdm_mem_kind;

/* Transports (bit mask). ZMQ (tcp or ipc, given by the endpoint) is always available. */
#define TDM_KVX_TRANSPORT_ZMQ      (1u << 0)
#define TDM_KVX_TRANSPORT_SHM      (1u << 1)   /* same host: one copy through a shared segment */
#define TDM_KVX_TRANSPORT_CUDA_IPC (1u << 2)   /* same node GPUs; needs libtandem_cuda.so */
/* NIXL (UCX: RDMA, EFA, tcp, shared memory; GPUDirect for CUDA caches): the receiver READs
 * the bytes. libnixl_capi is loaded at run time (TANDEM_NIXL_LIB, TANDEM_NIXL_DIR, the
 * library path, or an installed nixl-cu12/-cu13 wheel in $VIRTUAL_ENV); tdm_kvx_create fails
 * with TDM_E_UNSUPPORTED, saying what it tried, when it is asked for and cannot be loaded.
 * tdm_kvx_register then registers the KV cache and a host staging ring of
 * 2 * shm_slots * max_chunk_bytes bytes with NIXL (docs/protocol.md §5.2). */
#define TDM_KVX_TRANSPORT_NIXL     (1u << 3)

/* Engine configuration. Pointers are read during tdm_kvx_create() only (copied). */
typedef struct tdm_kvx_config {
    uint32_t struct_size;           /* sizeof(tdm_kvx_config) */
    uint32_t role;                  /* tdm_kvx_role; default BOTH */
    const char *engine_id;          /* 1..63 printable chars; required */
    const char *listen_endpoint;    /* "tcp://127.0.0.1:PORT" (PORT may be "*"), "ipc:///path"
                                       (refused if the path exists), "ipc://@name" (abstract),
                                       "ipc://" + "*" (a socket in a new 0700 directory);
                                       NULL: do not listen (connect only) */
    const char *curve_secret_key;   /* Z85 (40 chars): this engine's CURVE secret key; NULL = no CURVE */
    const char *curve_public_key;   /* Z85: its public key (derived from the secret when NULL) */
    const char *const *curve_allowed_clients; /* Z85 public keys allowed to connect to us */
    uint32_t num_curve_allowed_clients;       /* 0 with a secret key: no client is allowed */
    uint32_t transports;            /* TDM_KVX_TRANSPORT_* offered; default ZMQ|SHM */
    uint32_t heartbeat_ms;          /* ping interval; default 1000 */
    uint32_t peer_timeout_ms;       /* a peer silent this long is dead; default 5000 */
    uint32_t handshake_timeout_ms;  /* tdm_kvx_connect() gives up after; default 5000 */
    uint32_t transfer_timeout_ms;   /* a transfer without progress this long fails; default 30000 */
    uint32_t cancel_timeout_ms;     /* CANCELLED without the peer's ack after; default 5000 */
    uint32_t max_chunk_bytes;       /* largest data message; default 8 MiB (>= 4 KiB) */
    uint32_t shm_slots;             /* one shared-memory segment per peer and direction sent:
                                       shm_slots * max_chunk_bytes; default 8 */
} tdm_kvx_config;

/* Fill *c with the defaults above (engine_id NULL). Errors: TDM_E_INVAL (NULL). */
TDM_API int tdm_kvx_config_init(tdm_kvx_config *c);

/* Create an engine: validates the configuration, binds the listen endpoint, starts the I/O
 * thread (and the CURVE ZAP handler). *out receives the handle. First it removes what dead
 * engines of this user left behind: /dev/shm segments and private ipc directories whose
 * owner pid (in their name) is no longer alive. An ipc path is never replaced: if anything
 * exists there, create fails; destroy removes the socket only while the path is still it.
 * Errors: TDM_E_INVAL, TDM_E_CONFIG (bad key, CURVE not built into libzmq), TDM_E_EXISTS
 * (the ipc path exists), TDM_E_IO (bind failed: the message gives zmq's reason), TDM_E_NOMEM. */
TDM_API int tdm_kvx_create(const tdm_kvx_config *cfg, tdm_kvx **out);

/* The same from a JSON object with the keys engine_id, role ("prefill"|"decode"|"both"),
 * listen, curve: {secret_key, public_key, allowed_clients: [...]}, transports: ["zmq","shm",
 * "cuda_ipc","nixl"], heartbeat_ms, peer_timeout_ms, handshake_timeout_ms, transfer_timeout_ms,
 * cancel_timeout_ms, max_chunk_bytes, shm_slots. Unknown keys are errors (TDM_E_CONFIG).
 * Also, through JSON only (tdm_kvx_create gives their defaults): max_peers_per_source and
 * max_peers_per_key (accepted peers from one source address / of one CURVE key; default 64
 * of the 256 slots each), peer_idle_ms (an accepted peer that started no transfer this long
 * after its HELLO gives its slot to a new peer when all are taken; default 10000) and
 * nixl_require_curve (bool, default false: NIXL only with peers authenticated by CURVE).
 * docs/protocol.md section 7. */
TDM_API int tdm_kvx_create_json(const char *json, tdm_kvx **out);

/* Stop the I/O thread, tell connected peers goodbye, close sockets, unmap shared memory and
 * free everything. Transfers still active are dropped without events. NULL is a no-op. */
TDM_API void tdm_kvx_destroy(tdm_kvx *kvx);

/* The message of the last failed call on kvx ("" if none), valid until the next call on kvx
 * from the same thread. With kvx NULL: the last tdm_kvx_create*() failure of this thread. */
TDM_API const char *tdm_kvx_errmsg(const tdm_kvx *kvx);

/* The endpoint actually bound (a "*" port resolved), NUL-terminated, into buf.
 * Errors: TDM_E_STATE (not listening), TDM_E_TRUNCATED. */
TDM_API int tdm_kvx_get_endpoint(tdm_kvx *kvx, char *buf, size_t buf_size);

/* This engine's CURVE public key (Z85, 40 chars + NUL) into buf[41].
 * Errors: TDM_E_STATE (no CURVE keys). */
TDM_API int tdm_kvx_get_public_key(tdm_kvx *kvx, char buf[41]);

/* Generate a CURVE key pair (Z85, 40 chars + NUL each). Errors: TDM_E_UNSUPPORTED (libzmq
 * without CURVE). Thread-safe. */
TDM_API int tdm_kvx_curve_keypair(char public_key[41], char secret_key[41]);

/* Allocate `bytes` of host memory that same-host peers can map read-only (a POSIX shared-
 * memory segment, mode 0600, under a name this engine generates ("/tdm-kvx-NS-PID-kv-RAND"),
 * named in the handshake, removed by tdm_kvx_destroy, or at the next engine's start-up on
 * this host if this process dies). A KV cache
 * registered inside it lets a same-host receiver with the identical packed format (dtype,
 * heads, block size) copy blocks straight from this engine's cache: one copy instead of pack
 * + unpack ("direct" shared-memory transfers). At most once per engine, before
 * tdm_kvx_register; *ptr is page-aligned, zero-filled, owned by kvx and valid until
 * tdm_kvx_destroy. Only peers of the same user on the same host can open it; they are
 * trusted not to shrink it. Errors: TDM_E_INVAL, TDM_E_STATE (already allocated or
 * registered), TDM_E_IO (shm_open / mmap failed). */
TDM_API int tdm_kvx_alloc_shared(tdm_kvx *kvx, size_t bytes, void **ptr);

/* Register the local KV cache: the layout (copied) and one base pointer per layer
 * (layer_bases[num_layers], copied; the memory stays owned by the caller and must outlive
 * kvx). head_offset: the first KV head this rank holds in the model's numbering (tensor-
 * parallel slice; 0 without TP). Exactly once, before tdm_kvx_connect() and before peers
 * connect (their handshake is refused until then). mem_kind TDM_MEM_CUDA needs
 * libtandem_cuda.so and a device (TDM_E_NO_CUDA otherwise): chunks are then packed and
 * unpacked by the CUDA kernels into a device staging buffer of max_chunk_bytes (allocated
 * here) and staged through host memory for the ZeroMQ and shared-memory transports; peers
 * must not use a larger max_chunk_bytes.
 * Errors: TDM_E_INVAL (bad layout, NULL base), TDM_E_STATE (already registered),
 * TDM_E_NO_CUDA. */
TDM_API int tdm_kvx_register(tdm_kvx *kvx, const struct tdm_kv_layout *layout,
                             void *const *layer_bases, uint32_t mem_kind, uint32_t head_offset);

/* Declare the quantization scales of this engine's fp8-e4m3 KV cache, which the handshake
 * sends to every peer: a receiver decodes the sender's values as fp8 * sender scale and, when
 * its own cache is fp8, stores value / its own scale (vLLM's k_scale / v_scale). scale_kind is
 * a tdm_kv_scale_kind (tandem_kernels.h): NONE (the default: scale 1; count_per_layer 0,
 * k_scales / v_scales ignored and may be NULL), TENSOR (one K and one V scale per layer:
 * count_per_layer 1) or HEAD (one per KV head of this rank, in the order of its heads
 * [head_offset, head_offset + num_kv_heads): count_per_layer = the layout's num_kv_heads).
 * k_scales and v_scales hold num_layers * count_per_layer floats, layer-major (scale of
 * layer l, head h at [l * count_per_layer + h]); each must be finite and > 0; both are copied
 * (the caller keeps ownership) and at most 16384 per array. Call after tdm_kvx_register and
 * before tdm_kvx_connect or any peer's handshake; it may be called again until then (the
 * last call wins). Equal dtypes with equal scales on both sides keep the plain byte copy.
 * Thread-safe.
 * Errors: TDM_E_INVAL (NULL engine or arrays, unknown kind, count not matching the kind and
 * the registered layout, a non-fp8 cache with a kind other than NONE, a value that is NaN,
 * infinite, zero or negative: the message names it), TDM_E_STATE (not registered, or a
 * handshake has begun or completed), TDM_E_NOMEM. On error the scales are unchanged. */
TDM_API int tdm_kvx_set_kv_scales(tdm_kvx *kvx, uint32_t scale_kind, const float *k_scales,
                                  const float *v_scales, uint32_t count_per_layer);

/* Connect to a peer's endpoint and run the handshake, waiting up to handshake_timeout_ms.
 * server_public_key: the peer's CURVE key (Z85) when it uses CURVE, else NULL (our own key
 * pair from the config is used as the client key; one is generated when absent).
 * *peer receives the peer's id (small integer, stable for the life of kvx).
 * Errors: TDM_E_STATE (not registered), TDM_E_LAYOUT (layouts cannot be converted: the
 * message says which field), TDM_E_VERSION, TDM_E_AUTH (CURVE refused, or no answer within
 * the timeout while CURVE is in use), TDM_E_TIMEOUT, TDM_E_EXISTS (already connected or
 * connecting to that endpoint: answered without contacting the peer, the live connection
 * untouched; or already connected to that engine id), TDM_E_PROTOCOL (the peer's answer is malformed, e.g. invalid KV scales, or it
 * refused our HELLO as malformed), TDM_E_IO. */
TDM_API int tdm_kvx_connect(tdm_kvx *kvx, const char *endpoint, const char *server_public_key,
                            uint32_t *peer);

/* Look up a connected (either direction) peer by its engine id. Errors: TDM_E_NOT_FOUND. */
TDM_API int tdm_kvx_find_peer(tdm_kvx *kvx, const char *engine_id, uint32_t *peer);

#define TDM_KVX_PEER_ANY 0xFFFFFFFFu

typedef enum tdm_kvx_mode {
    TDM_KVX_PULL = 1,  /* the receiver asks by request id; any sender that exported the request
                          (tdm_kvx_send with peer ANY or this peer) serves it */
    TDM_KVX_PUSH = 2   /* the receiver announces its blocks for a transfer id; the sender named
                          this receiver and that transfer id and writes into them */
} tdm_kvx_mode;

/* Receiving side of one transfer. Pointers are read during the call only. */
typedef struct tdm_kvx_recv_desc {
    uint32_t struct_size;            /* sizeof(tdm_kvx_recv_desc) */
    uint32_t mode;                   /* tdm_kvx_mode */
    uint32_t peer;                   /* the sending peer's id */
    uint32_t num_blocks;             /* the request's blocks (prefix included), >= 1 */
    uint64_t request_id;
    uint64_t transfer_id;            /* unique per (peer, request) among live transfers */
    const uint32_t *block_ids;       /* [num_blocks] local destination block ids, distinct */
    uint32_t num_skip;               /* leading blocks already held (prefix cache): not sent */
    uint32_t timeout_ms;             /* no-progress timeout; 0 = the config's */
} tdm_kvx_recv_desc;

TDM_API int tdm_kvx_recv_desc_init(tdm_kvx_recv_desc *d);

/* Reserve block_ids[num_skip..num_blocks) for this transfer and send the transfer request.
 * A reserved block cannot be reserved again until the transfer's final event. *handle gets
 * the transfer's local handle (events carry it). With num_skip == num_blocks nothing moves:
 * DONE is queued at once.
 * Errors: TDM_E_INVAL (bad desc), TDM_E_RANGE (block id out of the layout), TDM_E_EXISTS
 * (a block already reserved, or the transfer id already live with that peer), TDM_E_PEER
 * (unknown or dead peer), TDM_E_STATE (not registered). */
TDM_API int tdm_kvx_recv(tdm_kvx *kvx, const tdm_kvx_recv_desc *d, uint64_t *handle);

/* Sending side of one transfer. */
typedef struct tdm_kvx_send_desc {
    uint32_t struct_size;            /* sizeof(tdm_kvx_send_desc) */
    uint32_t mode;                   /* PULL: peer may be TDM_KVX_PEER_ANY, transfer_id ignored;
                                        PUSH: peer and transfer_id name the receiver's request */
    uint32_t peer;
    uint32_t num_blocks;             /* the request's blocks (prefix included), >= 1 */
    uint64_t request_id;
    uint64_t transfer_id;
    const uint32_t *block_ids;       /* [num_blocks] local source block ids */
    uint32_t num_blocks_ready;       /* leading blocks already computed for every layer */
    uint32_t timeout_ms;             /* no-progress timeout; 0 = the config's */
} tdm_kvx_send_desc;

TDM_API int tdm_kvx_send_desc_init(tdm_kvx_send_desc *d);

/* Declare the source blocks of a request; they are sent once the receiver's request has
 * arrived and as they become ready. The caller must not free or overwrite them before this
 * transfer's final event. Errors: TDM_E_INVAL, TDM_E_RANGE, TDM_E_EXISTS (same request
 * already exported / same transfer live), TDM_E_PEER, TDM_E_STATE. */
TDM_API int tdm_kvx_send(tdm_kvx *kvx, const tdm_kvx_send_desc *d, uint64_t *handle);

/* Streaming: blocks [0, num_blocks_ready) of layers [layer_begin, layer_end) are computed
 * and may be sent. Readiness only grows (a smaller value is ignored).
 * Errors: TDM_E_NOT_FOUND (unknown or finished handle), TDM_E_INVAL (range). */
TDM_API int tdm_kvx_send_ready(tdm_kvx *kvx, uint64_t handle, uint32_t layer_begin,
                               uint32_t layer_end, uint32_t num_blocks_ready);

/* Cancel a transfer (either side). The CANCELLED event comes only after the peer
 * acknowledged (so no write for it can still land) or after cancel_timeout_ms; blocks stay
 * reserved until then. Errors: TDM_E_NOT_FOUND (unknown or already final). */
TDM_API int tdm_kvx_cancel(tdm_kvx *kvx, uint64_t handle);

typedef enum tdm_kvx_event_type {
    TDM_KVX_EV_DONE = 1,        /* every block arrived (receiver) / was acknowledged (sender) */
    TDM_KVX_EV_FAILED = 2,      /* status and reason say why; blocks are released */
    TDM_KVX_EV_CANCELLED = 3    /* after tdm_kvx_cancel() (ours or the peer's) */
} tdm_kvx_event_type;

typedef enum tdm_kvx_side {
    TDM_KVX_SIDE_SEND = 1,
    TDM_KVX_SIDE_RECV = 2
} tdm_kvx_side;

/* A completion event. tdm_kvx_poll() reads events[0].struct_size as the size of each
 * element (set it with tdm_kvx_event_init) and writes only that much of each. */
typedef struct tdm_kvx_event {
    uint32_t struct_size;            /* sizeof(tdm_kvx_event) */
    uint32_t type;                   /* tdm_kvx_event_type */
    uint32_t side;                   /* tdm_kvx_side */
    int32_t status;                  /* TDM_OK, or why it failed (TDM_E_PEER, _TIMEOUT, ...) */
    uint64_t handle;
    uint64_t request_id;
    uint64_t transfer_id;
    uint32_t peer;
    uint32_t num_blocks_done;        /* receiver: leading blocks complete in every layer */
    uint64_t bytes;                  /* payload bytes moved */
    char reason[128];                /* "" or a human-readable reason */
} tdm_kvx_event;

TDM_API int tdm_kvx_event_init(tdm_kvx_event *e);

/* Take up to max queued events (oldest first), waiting up to timeout_ms (0: no wait, < 0:
 * forever) for the first. *n receives the count (0 on timeout, which is not an error).
 * Errors: TDM_E_INVAL. */
TDM_API int tdm_kvx_poll(tdm_kvx *kvx, tdm_kvx_event *events, uint32_t max, uint32_t *n,
                         int timeout_ms);

/* A file descriptor that is readable while events are queued (an eventfd; do not read or
 * close it). Owned by kvx. */
TDM_API int tdm_kvx_get_fd(tdm_kvx *kvx, int *fd);

typedef struct tdm_kvx_stats {
    uint32_t struct_size;
    uint32_t num_peers;              /* handshaken and alive */
    uint32_t num_send_active;        /* send transfers not yet final */
    uint32_t num_recv_active;
    uint32_t num_reserved_blocks;    /* destination blocks reserved by live receives */
    uint32_t num_queued_events;
    uint64_t bytes_sent;             /* payload */
    uint64_t bytes_received;
    uint64_t msgs_rejected;          /* malformed / out-of-range / unexpected messages dropped */
    uint64_t transfers_done;
    uint64_t transfers_failed;
    uint64_t transfers_cancelled;
    uint64_t chunks_sent;            /* data messages sent */
    uint64_t chunks_sent_shm;        /* of which through shared memory */
    uint64_t chunks_read_nixl;       /* data chunks this engine READ over NIXL */
} tdm_kvx_stats;

TDM_API int tdm_kvx_stats_init(tdm_kvx_stats *s);
TDM_API int tdm_kvx_get_stats(tdm_kvx *kvx, tdm_kvx_stats *s);

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_KVX_H */
