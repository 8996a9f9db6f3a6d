/*
 * kvx_testutil.h -- helpers shared by the kvx tests: engines over a random KV cache in
 * vLLM-NHD or FlashInfer arrangement, endpoints unique per process, event waits and a
 * logical byte-by-byte comparison of blocks between two engines.
 */
#ifndef KVX_TESTUTIL_H
#define KVX_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tandem.h"

#define T_LAYERS 4
#define T_BLOCKS 64
#define T_BS 4
#define T_HEADS 2
#define T_DIM 16

typedef struct eng {
    tdm_kvx *kvx;
    tdm_kv_layout lay;
    void *bases[64];
    uint8_t *mem;
    size_t layer_bytes;
} eng;

static inline size_t t_esize(uint32_t dt) { return dt == TDM_DTYPE_FP32 ? 4 : dt == TDM_DTYPE_FP8_E4M3 ? 1 : 2; }

/* kind 1: vLLM NHD [2, nb, bs, H, D]; kind 3: FlashInfer [nb, 2, bs, H, D]. */
static inline void t_layout(tdm_kv_layout *l, uint32_t kind, uint32_t layers, uint32_t nb, uint32_t bs,
                            uint32_t heads, uint32_t dim, uint32_t dtype)
{
    assert_int_equal(tdm_kv_layout_init(l, (tdm_kv_layout_kind)kind, layers, nb, bs, heads, dim, (tdm_dtype)dtype), TDM_OK);
}

static inline uint64_t t_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static inline void t_fill(eng *e, uint64_t seed)
{
    uint64_t s = seed | 1;
    size_t n = e->layer_bytes * e->lay.num_layers;
    for (size_t i = 0; i < n; i++) e->mem[i] = (uint8_t)t_rand(&s);
}

/* An engine with a registered random cache. endpoint may be NULL. */
static inline void t_engine_off(eng *e, const tdm_kvx_config *c, const tdm_kv_layout *lay, uint64_t seed,
                                uint32_t head_offset)
{
    memset(e, 0, sizeof(*e));
    e->lay = *lay;
    size_t es = t_esize(lay->dtype);
    e->layer_bytes = (size_t)2 * lay->num_blocks * lay->block_size * lay->num_kv_heads * lay->head_dim * es;
    e->mem = malloc(e->layer_bytes * lay->num_layers);
    assert_non_null(e->mem);
    for (uint32_t l = 0; l < lay->num_layers; l++) e->bases[l] = e->mem + l * e->layer_bytes;
    t_fill(e, seed);
    int rc = tdm_kvx_create(c, &e->kvx);
    if (rc) fprintf(stderr, "create: %s\n", tdm_kvx_errmsg(NULL));
    assert_int_equal(rc, TDM_OK);
    assert_int_equal(tdm_kvx_register(e->kvx, lay, e->bases, TDM_MEM_HOST, head_offset), TDM_OK);
}

static inline void t_engine_cfg(eng *e, const tdm_kvx_config *c, const tdm_kv_layout *lay, uint64_t seed)
{
    t_engine_off(e, c, lay, seed, 0);
}

static inline void t_config(tdm_kvx_config *c, const char *id, uint32_t role, const char *ep)
{
    tdm_kvx_config_init(c);
    c->engine_id = id;
    c->role = role;
    c->listen_endpoint = ep;
    c->heartbeat_ms = 50;
    c->peer_timeout_ms = 2000;
    c->handshake_timeout_ms = 2000;
    c->transfer_timeout_ms = 5000;
    c->cancel_timeout_ms = 2000;
    c->max_chunk_bytes = 16384;
    c->shm_slots = 4;
}

/* An engine of config c over the default cache layout. */
static inline void t_engine_default_cache(eng *e, const tdm_kvx_config *c, uint64_t seed)
{
    tdm_kv_layout l;
    t_layout(&l, 1, T_LAYERS, T_BLOCKS, T_BS, T_HEADS, T_DIM, TDM_DTYPE_FP16);
    t_engine_cfg(e, c, &l, seed);
}

static inline void t_engine(eng *e, const char *id, uint32_t role, const char *ep, uint32_t transports, uint64_t seed)
{
    tdm_kvx_config c;
    t_config(&c, id, role, ep);
    c.transports = transports;
    t_engine_default_cache(e, &c, seed);
}

static inline void t_free(eng *e)
{
    tdm_kvx_destroy(e->kvx);
    free(e->mem);
    e->kvx = NULL;
    e->mem = NULL;
}

static inline void t_ipc(char *buf, size_t n, const char *tag)
{
    static unsigned seq;
    snprintf(buf, n, "ipc:///tmp/tdm-kvx-test-%d-%s-%u", (int)getpid(), tag, seq++);
}

static inline const uint8_t *t_row(const eng *e, uint32_t layer, int kv, uint32_t blk, uint32_t t, uint32_t h)
{
    const tdm_kv_layout *l = &e->lay;
    size_t es = t_esize(l->dtype);
    size_t off = ((size_t)kv * l->stride_kv + (size_t)blk * l->stride_block + (size_t)t * l->stride_token +
                  (size_t)h * l->stride_head) * es;
    return (const uint8_t *)e->bases[layer] + off;
}

/* 0 when block src_ids[i] of a equals block dst_ids[i] of b for i in [from, n), every layer. */
static inline int t_compare(const eng *a, const uint32_t *src_ids, const eng *b, const uint32_t *dst_ids,
                            uint32_t from, uint32_t n)
{
    size_t row = (size_t)a->lay.head_dim * t_esize(a->lay.dtype);
    for (uint32_t l = 0; l < a->lay.num_layers; l++)
        for (uint32_t i = from; i < n; i++)
            for (int kv = 0; kv < 2; kv++)
                for (uint32_t t = 0; t < a->lay.block_size; t++)
                    for (uint32_t h = 0; h < a->lay.num_kv_heads; h++)
                        if (memcmp(t_row(a, l, kv, src_ids[i], t, h), t_row(b, l, kv, dst_ids[i], t, h), row))
                            return 1;
    return 0;
}

/* Distinct random block ids. */
static inline void t_ids(uint32_t *ids, uint32_t n, uint32_t nb, uint64_t seed)
{
    uint32_t perm[4096];
    for (uint32_t i = 0; i < nb; i++) perm[i] = i;
    uint64_t s = seed | 1;
    for (uint32_t i = nb - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(t_rand(&s) % (i + 1));
        uint32_t tmp = perm[i]; perm[i] = perm[j]; perm[j] = tmp;
    }
    memcpy(ids, perm, n * sizeof(uint32_t));
}

/* Waits up to 10 s for one event. */
static inline tdm_kvx_event t_wait(eng *e)
{
    tdm_kvx_event ev;
    tdm_kvx_event_init(&ev);
    uint32_t n = 0;
    assert_int_equal(tdm_kvx_poll(e->kvx, &ev, 1, &n, 10000), TDM_OK);
    if (n != 1) fail_msg("no event within 10 s");
    return ev;
}

static inline void t_sleep_ms(int ms) { usleep((useconds_t)ms * 1000); }

/* Connects e to ep, retrying while the peer is not listening (TIMEOUT) or not registered
 * (STATE) yet: at most `tries` attempts, wait_ms apart. Fails the test on any other error. */
static inline void t_connect_retry(eng *e, const char *ep, uint32_t *peer, int tries, int wait_ms)
{
    int rc = TDM_E_TIMEOUT;
    for (int i = 0; i < tries && (rc == TDM_E_TIMEOUT || rc == TDM_E_STATE); i++) {
        if (i) t_sleep_ms(wait_ms);
        rc = tdm_kvx_connect(e->kvx, ep, NULL, peer);
    }
    if (rc) fail_msg("connect: %s", tdm_kvx_errmsg(e->kvx));
}

/* Waits for one event and fails the test unless it is DONE. */
static inline void t_wait_done(eng *e)
{
    tdm_kvx_event ev = t_wait(e);
    if (ev.type != TDM_KVX_EV_DONE) fail_msg("event %u (%d): %s", ev.type, ev.status, ev.reason);
}

/* A send descriptor for request `req`: blocks ids[0..n), the first `ready` of them ready. */
static inline void t_send_desc(tdm_kvx_send_desc *sd, uint64_t req, const uint32_t *ids, uint32_t n,
                               uint32_t ready)
{
    tdm_kvx_send_desc_init(sd);
    sd->request_id = req;
    sd->num_blocks = n;
    sd->block_ids = ids;
    sd->num_blocks_ready = ready;
}

/* A receive descriptor for request `req` from `peer` into blocks ids[0..n), the first `skip`
 * of them not transferred. */
static inline void t_recv_desc(tdm_kvx_recv_desc *rd, uint32_t peer, uint64_t req, const uint32_t *ids,
                               uint32_t n, uint32_t skip)
{
    tdm_kvx_recv_desc_init(rd);
    rd->peer = peer;
    rd->request_id = req;
    rd->num_blocks = n;
    rd->num_skip = skip;
    rd->block_ids = ids;
}

static inline tdm_kvx_stats t_stats(eng *e)
{
    tdm_kvx_stats st;
    tdm_kvx_stats_init(&st);
    assert_int_equal(tdm_kvx_get_stats(e->kvx, &st), TDM_OK);
    return st;
}

#endif /* KVX_TESTUTIL_H */
