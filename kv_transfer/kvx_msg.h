/*
 * kvx_msg.h -- the control messages of the KV transfer protocol (docs/protocol.md): their
 * decoded form, the decoder of outside input (a strict msgpack reader that never allocates
 * and checks every type, length and range) and the encoders (msgpack-c's packer writing into
 * a caller's fixed buffer). Internal to libtandem.
 */
#ifndef TANDEM_KVX_MSG_H
#define TANDEM_KVX_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "tandem.h"

enum {
    TDM__KVX_HELLO = 1,
    TDM__KVX_HELLO_ACK = 2,
    TDM__KVX_XFER_REQ = 3,
    TDM__KVX_DATA = 4,
    TDM__KVX_CREDIT = 5,
    TDM__KVX_DONE = 6,
    TDM__KVX_FAIL = 7,
    TDM__KVX_CANCEL = 8,
    TDM__KVX_CANCEL_ACK = 9,
    TDM__KVX_PING = 10,
    TDM__KVX_BYE = 11,
    TDM__KVX_MSG_MAX = 11
};

#define TDM__KVX_ID_LEN 64          /* engine / host ids and shm names, NUL included */
#define TDM__KVX_REASON_LEN 128
#define TDM__KVX_MAX_HEADER 2048    /* a header frame longer than this is rejected ... */
#define TDM__KVX_MAX_SCALES 16384   /* KV scales per K (and per V) a HELLO may carry */
#define TDM__KVX_MAX_LAYERS 4096
#define TDM__KVX_MAX_NIXL_MD 65536  /* NIXL agent metadata a HELLO may carry */
#define TDM__KVX_NIXL_RGN_HDR 5     /* u64s before the layer bases in a NIXL region table */
/* ... except a HELLO / HELLO_ACK carrying KV scales and NIXL metadata, up to this size */
#define TDM__KVX_MAX_HELLO (TDM__KVX_MAX_HEADER + 8 * TDM__KVX_MAX_SCALES + TDM__KVX_MAX_NIXL_MD + \
                            8 * (TDM__KVX_NIXL_RGN_HDR + TDM__KVX_MAX_LAYERS) + 192)
#define TDM__KVX_MAX_BLOCKS (1u << 24)
#define TDM__KVX_NO_SLOT 0xFFFFFFFFu
#define TDM__KVX_DIRECT_SLOT 0xFFFFFFFEu  /* DATA: the payload lists the sender's block ids */
#define TDM__KVX_MODE_DIRECT 0x100u       /* XFER_REQ mode flag: the receiver mapped our KV */
#define TDM__KVX_MAX_KV_LAYERS 128        /* layers whose KV offsets a HELLO can carry */
#define TDM__KVX_MAX_SHM_SLOTS 1024       /* slots of one shared-memory segment */

/* The handshake body (HELLO and HELLO_ACK). */
typedef struct tdm__kvx_hello {
    char engine_id[TDM__KVX_ID_LEN];
    uint32_t role;
    tdm_kv_layout layout;
    uint32_t mem_kind;
    uint32_t head_offset;
    uint32_t transports;
    char host_id[TDM__KVX_ID_LEN];
    char shm_name[TDM__KVX_ID_LEN];  /* "" when the sender offers no segment */
    uint64_t shm_size;
    uint32_t slot_bytes;
    /* optional: the KV cache itself in a shared segment (same-host direct reads) */
    char kv_name[TDM__KVX_ID_LEN];   /* "" = not offered */
    uint64_t kv_size;
    uint32_t kv_layers;              /* entries in kv_off (= layout.num_layers when offered) */
    uint64_t kv_off[TDM__KVX_MAX_KV_LAYERS];
    /* optional: the quantization scales of an fp8 cache (tdm_kvx_set_kv_scales) */
    uint32_t scale_kind;             /* tdm_kv_scale_kind; NONE (0) when absent */
    uint32_t scale_count;            /* floats per layer: 1 (TENSOR), layout.num_kv_heads (HEAD) */
    const float *k_scales;           /* encoding: [num_layers * scale_count] host floats */
    const float *v_scales;
    const uint8_t *k_scales_le;      /* decoding: the same as little-endian float32, pointing */
    const uint8_t *v_scales_le;      /* into the decoded buffer (valid while it is) */
    /* optional: NIXL (docs/protocol.md §5.2); "" = not offered. The pointers refer to the
     * sender's own buffers when encoding, into the decoded buffer when decoding. */
    char nixl_agent[TDM__KVX_ID_LEN];
    const uint8_t *nixl_md;          /* the agent's metadata (NIXL's getLocalMD blob) */
    uint32_t nixl_md_len;            /* 1 .. TDM__KVX_MAX_NIXL_MD */
    const uint8_t *nixl_rgn;         /* region table: little-endian u64 mem_kind, dev_id, ring */
    uint32_t nixl_rgn_len;           /* address, slot bytes, slots, then one base per layer */
} tdm__kvx_hello;

/* One decoded message; only the fields of its type are meaningful. */
typedef struct tdm__kvx_msg {
    uint32_t version;
    uint32_t type;
    int32_t status;                    /* HELLO_ACK, FAIL */
    char reason[TDM__KVX_REASON_LEN];  /* HELLO_ACK, FAIL, BYE */
    tdm__kvx_hello hello;              /* HELLO, HELLO_ACK */
    uint64_t rid, xid;                 /* transfer messages */
    uint32_t to_side;                  /* FAIL, CANCEL, CANCEL_ACK: 1 = sender's transfer, 2 = receiver's */
    uint32_t mode, num_blocks, num_skip;   /* XFER_REQ */
    uint32_t num_tokens;               /* XFER_REQ: receiver's capacity; DATA: the transfer's tokens */
    uint32_t seq, layer_begin, layer_end, block_begin, block_count;  /* DATA */
    uint64_t nbytes;                   /* DATA: payload bytes; DONE: total bytes */
    uint32_t slot;                     /* DATA: shm slot or TDM__KVX_NO_SLOT; CREDIT */
    uint64_t time_ms;                  /* PING */
} tdm__kvx_msg;

/* Decode one header frame. Checks the msgpack structure, every field's type and range
 * (layer / block counts within TDM__KVX_MAX_*, strings within their buffers, printable ids),
 * and that nothing follows the message. Unknown trailing array elements are skipped
 * (forward compatibility); an unknown type or version is an error. Never allocates.
 * Returns TDM_OK, TDM_E_PROTOCOL (why goes to why[why_len] when why != NULL) or
 * TDM_E_VERSION (another protocol version: m->version is set). */
int tdm__kvx_msg_decode(const void *buf, size_t len, tdm__kvx_msg *m, char *why, size_t why_len);

/* Encode m (its type selects the fields) into buf; *len receives the length.
 * Returns TDM_OK or TDM_E_TRUNCATED. */
int tdm__kvx_msg_encode(const tdm__kvx_msg *m, void *buf, size_t cap, size_t *len);

/* Fill a message of a type with the current version (other fields zero). */
void tdm__kvx_msg_init(tdm__kvx_msg *m, uint32_t type);

/* Layout validity (dims non-zero, known dtype, strides non-negative and large enough that
 * elements do not overlap within a block). Returns TDM_OK or TDM_E_INVAL with why. */
int tdm__kvx_layout_check(const tdm_kv_layout *l, char *why, size_t why_len);

/* A shared-memory object name as engines generate them (docs/protocol.md §5):
 * "/tdm-kvx-NS-PID-TAG-RAND", NS the creator's pid-namespace inode and PID its pid (decimal,
 * no leading zero, PID > 0), TAG "kv" (a tdm_kvx_alloc_shared cache) or "tx" + a decimal
 * sequence number (a transfer segment), RAND 16 lowercase hex digits. kind 'k' or 't' accepts
 * only that tag, 0 either. Returns 1 (and *ns, *pid where not NULL) for such a name, else 0. */
int tdm__kvx_shm_name_parse(const char *name, int kind, uint64_t *ns, uint64_t *pid);
/* Entry i of a decoded HELLO's NIXL region table (i < TDM__KVX_NIXL_RGN_HDR + num_layers). */
uint64_t tdm__kvx_hello_nixl_u64(const tdm__kvx_hello *h, uint32_t i);

/* Scale i (0 .. num_layers * scale_count) of K (kv 0) or V (kv 1) of a decoded HELLO. */
float tdm__kvx_hello_scale(const tdm__kvx_hello *h, int kv, uint32_t i);

#endif /* TANDEM_KVX_MSG_H */
