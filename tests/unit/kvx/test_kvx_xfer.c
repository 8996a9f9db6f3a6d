/*
 * test_kvx_xfer.c -- two transfer engines in one process over ipc and tcp loopback and over
 * shared memory: pull and push moving random blocks (every byte checked), the prefix skip,
 * streaming before the prompt is complete, layout conversion-free arrangement changes,
 * layout refusal, CURVE refusal, cancel with acknowledgement, timeouts, reservations, the
 * event fd, and configuration checks.
 */
#include <poll.h>

#include "kvx_testutil.h"
#include "../../../kv_transfer/kvx_internal.h"

#define ZMQ_ONLY TDM_KVX_TRANSPORT_ZMQ
#define WITH_SHM (TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_SHM)

typedef struct pair {
    eng p, d;
    uint32_t peer_on_d;   /* P as seen by D */
    uint32_t peer_on_p;   /* D as seen by P */
} pair;

/* P listens on ep, D connects. */
static void pair_up(pair *x, const char *ep, uint32_t transports)
{
    t_engine(&x->p, "prefill-0", TDM_KVX_ROLE_PREFILL, ep, transports, 11);
    t_engine(&x->d, "decode-0", TDM_KVX_ROLE_DECODE, NULL, transports, 22);
    char real[256];
    assert_int_equal(tdm_kvx_get_endpoint(x->p.kvx, real, sizeof(real)), TDM_OK);
    int rc = tdm_kvx_connect(x->d.kvx, real, NULL, &x->peer_on_d);
    if (rc) fail_msg("connect: %s", tdm_kvx_errmsg(x->d.kvx));
    /* the server learns about the peer when the HELLO arrives, before the ACK */
    assert_int_equal(tdm_kvx_find_peer(x->p.kvx, "decode-0", &x->peer_on_p), TDM_OK);
}

/* pair_up on a fresh ipc endpoint (`tag`). */
static void pair_up_ipc(pair *x, const char *tag, uint32_t transports)
{
    char ep[128];
    t_ipc(ep, sizeof(ep), tag);
    pair_up(x, ep, transports);
}

/* Waits (up to 5 s) until e has received at least `bytes` bytes. */
static void wait_received(eng *e, uint64_t bytes)
{
    for (int i = 0; i < 1000 && t_stats(e).bytes_received < bytes; i++) t_sleep_ms(5);
}

static void pair_down(pair *x)
{
    t_free(&x->d);
    t_free(&x->p);
}

static void check_idle(eng *e)
{
    tdm_kvx_stats st = t_stats(e);
    assert_int_equal(st.num_reserved_blocks, 0);
    assert_int_equal(st.num_send_active, 0);
    assert_int_equal(st.num_recv_active, 0);
}

/* Neither engine of the pair holds a reservation or a transfer. */
static void check_pair_idle(pair *x)
{
    check_idle(&x->d);
    check_idle(&x->p);
}

/* A full pull of n blocks, skipping `skip`; returns after both DONE events. */
static void run_pull(pair *x, uint32_t n, uint32_t skip, uint64_t seed)
{
    uint32_t src[T_BLOCKS], dst[T_BLOCKS];
    t_ids(src, n, T_BLOCKS, seed);
    t_ids(dst, n, T_BLOCKS, seed * 7 + 3);
    tdm_kvx_send_desc sd;
    t_send_desc(&sd, seed, src, n, n);
    uint64_t hs, hr;
    assert_int_equal(tdm_kvx_send(x->p.kvx, &sd, &hs), TDM_OK);
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, x->peer_on_d, seed, dst, n, skip);
    rd.transfer_id = 1;
    assert_int_equal(tdm_kvx_recv(x->d.kvx, &rd, &hr), TDM_OK);
    tdm_kvx_event ev = t_wait(&x->d);
    if (ev.type != TDM_KVX_EV_DONE) fail_msg("receiver event %u status %d: %s", ev.type, ev.status, ev.reason);
    assert_int_equal(ev.handle, hr);
    assert_int_equal(ev.num_blocks_done, n);
    size_t unit = (size_t)2 * T_BS * T_HEADS * T_DIM * 2;
    assert_int_equal(ev.bytes, (uint64_t)(n - skip) * T_LAYERS * unit);
    ev = t_wait(&x->p);
    assert_int_equal(ev.type, TDM_KVX_EV_DONE);
    assert_int_equal(ev.handle, hs);
    assert_int_equal(ev.side, TDM_KVX_SIDE_SEND);
    assert_int_equal(t_compare(&x->p, src, &x->d, dst, skip, n), 0);
    check_pair_idle(x);
    assert_int_equal(t_stats(&x->d).msgs_rejected, 0);   /* a clean exchange */
    assert_int_equal(t_stats(&x->p).msgs_rejected, 0);
}

static void pull__ipc_zmq_moves_every_byte(void **state)
{
    (void)state;
    pair x;
    pair_up_ipc(&x, "pull", ZMQ_ONLY);
    run_pull(&x, 16, 0, 101);
    run_pull(&x, 33, 0, 102);
    pair_down(&x);
}

static void pull__tcp_loopback_moves_every_byte(void **state)
{
    (void)state;
    pair x;
    pair_up(&x, "tcp://127.0.0.1:*", ZMQ_ONLY);
    run_pull(&x, 20, 0, 201);
    assert_int_equal(t_stats(&x.p).chunks_sent_shm, 0);
    pair_down(&x);
}

static void pull__shared_memory_moves_every_byte(void **state)
{
    (void)state;
    pair x;
    pair_up_ipc(&x, "shm", WITH_SHM);
    /* 4 slots of 16 KiB and 40 blocks of 2 KiB: the slots are reused through credits */
    run_pull(&x, 40, 0, 301);
    run_pull(&x, 7, 0, 302);
    tdm_kvx_stats st = t_stats(&x.p);
    assert_true(st.chunks_sent > 0);
    assert_int_equal(st.chunks_sent_shm, st.chunks_sent);
    pair_down(&x);
}

static void pull__prefix_skip_sends_only_the_rest(void **state)
{
    (void)state;
    pair x;
    pair_up_ipc(&x, "skip", ZMQ_ONLY);
    uint32_t src[T_BLOCKS], dst[T_BLOCKS];
    t_ids(src, 12, T_BLOCKS, 5);
    t_ids(dst, 12, T_BLOCKS, 5 * 7 + 3);   /* as run_pull picks them */
    /* the receiver's held prefix blocks must stay untouched */
    uint8_t before[3][64];
    for (int i = 0; i < 3; i++) memcpy(before[i], t_row(&x.d, 0, 0, dst[i], 0, 0), 64);
    run_pull(&x, 12, 3, 5);
    for (int i = 0; i < 3; i++) assert_memory_equal(before[i], t_row(&x.d, 0, 0, dst[i], 0, 0), 64);
    pair_down(&x);
}

/* An engine whose KV cache lives in its shared segment (tdm_kvx_alloc_shared). */
static void engine_shared(eng *e, const char *id, uint32_t role, const char *ep, uint64_t seed)
{
    tdm_kvx_config c;
    t_config(&c, id, role, ep);
    memset(e, 0, sizeof(*e));
    t_layout(&e->lay, 1, T_LAYERS, T_BLOCKS, T_BS, T_HEADS, T_DIM, TDM_DTYPE_FP16);
    e->layer_bytes = (size_t)2 * T_BLOCKS * T_BS * T_HEADS * T_DIM * 2;
    assert_int_equal(tdm_kvx_create(&c, &e->kvx), TDM_OK);
    void *mem = NULL;
    assert_int_equal(tdm_kvx_alloc_shared(e->kvx, e->layer_bytes * T_LAYERS, &mem), TDM_OK);
    assert_int_equal(tdm_kvx_alloc_shared(e->kvx, 4096, &mem), TDM_E_STATE);
    e->mem = mem;
    for (uint32_t l = 0; l < T_LAYERS; l++) e->bases[l] = e->mem + l * e->layer_bytes;
    t_fill(e, seed);
    assert_int_equal(tdm_kvx_register(e->kvx, &e->lay, e->bases, TDM_MEM_HOST, 0), TDM_OK);
}

static void shm__direct_reads_from_a_shared_cache(void **state)
{
    (void)state;
    char ep[128];
    t_ipc(ep, sizeof(ep), "direct");
    pair x;
    engine_shared(&x.p, "prefill-0", TDM_KVX_ROLE_PREFILL, ep, 11);
    t_engine(&x.d, "decode-0", TDM_KVX_ROLE_DECODE, NULL, WITH_SHM, 22);
    assert_int_equal(tdm_kvx_connect(x.d.kvx, ep, NULL, &x.peer_on_d), TDM_OK);
    assert_int_equal(tdm_kvx_find_peer(x.p.kvx, "decode-0", &x.peer_on_p), TDM_OK);
    assert_non_null(x.d.kvx->peers[x.peer_on_d & 0xffff].rkv);   /* mapped read-only */
    run_pull(&x, 40, 0, 401);
    run_pull(&x, 17, 5, 402);
    tdm_kvx_stats st = t_stats(&x.p);
    assert_true(st.chunks_sent > 0);
    assert_int_equal(st.chunks_sent_shm, st.chunks_sent);
    assert_int_equal(st.msgs_rejected, 0);
    assert_int_equal(t_stats(&x.d).msgs_rejected, 0);
    t_free(&x.d);
    tdm_kvx_destroy(x.p.kvx);   /* owns the shared memory */
    /* a receiver without shared memory gets the bytes as usual */
    engine_shared(&x.p, "prefill-0", TDM_KVX_ROLE_PREFILL, ep, 11);
    t_engine(&x.d, "decode-0", TDM_KVX_ROLE_DECODE, NULL, ZMQ_ONLY, 22);
    assert_int_equal(tdm_kvx_connect(x.d.kvx, ep, NULL, &x.peer_on_d), TDM_OK);
    assert_null(x.d.kvx->peers[x.peer_on_d & 0xffff].rkv);
    run_pull(&x, 9, 1, 403);
    t_free(&x.d);
    tdm_kvx_destroy(x.p.kvx);
}

static void push__tcp_sender_first_then_announce(void **state)
{
    (void)state;
    pair x;
    pair_up(&x, "tcp://127.0.0.1:*", WITH_SHM);
    uint32_t src[T_BLOCKS], dst[T_BLOCKS];
    uint32_t n = 24;
    t_ids(src, n, T_BLOCKS, 8);
    t_ids(dst, n, T_BLOCKS, 9);
    tdm_kvx_send_desc sd;
    t_send_desc(&sd, 42, src, n, n);
    sd.mode = TDM_KVX_PUSH;
    sd.peer = x.peer_on_p;
    sd.transfer_id = 3;
    uint64_t hs, hr;
    assert_int_equal(tdm_kvx_send(x.p.kvx, &sd, &hs), TDM_OK);
    /* a PUSH needs the receiving peer */
    sd.peer = TDM_KVX_PEER_ANY;
    assert_int_equal(tdm_kvx_send(x.p.kvx, &sd, &hs), TDM_E_INVAL);
    t_sleep_ms(20);
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, x.peer_on_d, 42, dst, n, 0);
    rd.mode = TDM_KVX_PUSH;
    rd.transfer_id = 3;
    assert_int_equal(tdm_kvx_recv(x.d.kvx, &rd, &hr), TDM_OK);
    tdm_kvx_event ev = t_wait(&x.d);
    assert_int_equal(ev.type, TDM_KVX_EV_DONE);
    assert_int_equal(ev.transfer_id, 3);
    ev = t_wait(&x.p);
    assert_int_equal(ev.type, TDM_KVX_EV_DONE);
    assert_int_equal(t_compare(&x.p, src, &x.d, dst, 0, n), 0);
    check_idle(&x.d);
    pair_down(&x);
}

static void stream__blocks_flow_before_the_prompt_is_complete(void **state)
{
    (void)state;
    pair x;
    pair_up_ipc(&x, "stream", WITH_SHM);
    uint32_t n = 10, src[T_BLOCKS], dst[T_BLOCKS];
    t_ids(src, n, T_BLOCKS, 77);
    t_ids(dst, n, T_BLOCKS, 78);
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, x.peer_on_d, 9, dst, n, 0);
    rd.transfer_id = 1;
    uint64_t hs, hr;
    assert_int_equal(tdm_kvx_recv(x.d.kvx, &rd, &hr), TDM_OK);
    tdm_kvx_send_desc sd;
    t_send_desc(&sd, 9, src, n, 0);   /* nothing computed yet */
    assert_int_equal(tdm_kvx_send(x.p.kvx, &sd, &hs), TDM_OK);
    /* first prefill chunk: 3 blocks of the first two layers */
    assert_int_equal(tdm_kvx_send_ready(x.p.kvx, hs, 0, 2, 3), TDM_OK);
    size_t unit = (size_t)2 * T_BS * T_HEADS * T_DIM * 2;
    uint64_t want = 2 * 3 * unit;
    wait_received(&x.d, want);
    assert_int_equal(t_stats(&x.d).bytes_received, want);
    uint32_t got = 0;
    tdm_kvx_event ev;
    tdm_kvx_event_init(&ev);
    assert_int_equal(tdm_kvx_poll(x.d.kvx, &ev, 1, &got, 0), TDM_OK);
    assert_int_equal(got, 0);   /* not done: the prompt is still being prefilled */
    assert_int_equal(tdm_kvx_send_ready(x.p.kvx, hs, 2, 4, 6), TDM_OK);
    assert_int_equal(tdm_kvx_send_ready(x.p.kvx, hs, 0, 4, 2), TDM_OK);   /* smaller: ignored */
    assert_int_equal(tdm_kvx_send_ready(x.p.kvx, hs, 0, 5, 2), TDM_E_INVAL);
    assert_int_equal(tdm_kvx_send_ready(x.p.kvx, hs, 0, 4, n), TDM_OK);
    ev = t_wait(&x.d);
    assert_int_equal(ev.type, TDM_KVX_EV_DONE);
    ev = t_wait(&x.p);
    assert_int_equal(ev.type, TDM_KVX_EV_DONE);
    assert_int_equal(tdm_kvx_send_ready(x.p.kvx, hs, 0, 4, n), TDM_E_NOT_FOUND);
    assert_int_equal(t_compare(&x.p, src, &x.d, dst, 0, n), 0);
    pair_down(&x);
}

/* A decode engine `id` over layout l (seed 2); transports 0: the default ones. */
static void decode_with_layout(eng *d, const char *id, uint32_t transports, const tdm_kv_layout *l)
{
    tdm_kvx_config c;
    t_config(&c, id, TDM_KVX_ROLE_DECODE, NULL);
    if (transports) c.transports = transports;
    t_engine_cfg(d, &c, l, 2);
}

static void layout__different_arrangement_same_format_is_accepted(void **state)
{
    (void)state;
    char ep[128];
    t_ipc(ep, sizeof(ep), "fi");
    eng p, d;
    tdm_kv_layout l;
    t_engine(&p, "p", TDM_KVX_ROLE_PREFILL, ep, ZMQ_ONLY, 1);
    t_layout(&l, 3, T_LAYERS, 40, T_BS, T_HEADS, T_DIM, TDM_DTYPE_FP16);   /* FlashInfer, fewer blocks */
    decode_with_layout(&d, "d", ZMQ_ONLY, &l);
    uint32_t peer;
    assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &peer), TDM_OK);
    uint32_t src[8] = { 60, 1, 2, 33, 4, 5, 63, 7 }, dst[8] = { 39, 0, 12, 13, 20, 21, 3, 8 };
    tdm_kvx_send_desc sd;
    t_send_desc(&sd, 1, src, 8, 8);
    uint64_t h;
    assert_int_equal(tdm_kvx_send(p.kvx, &sd, &h), TDM_OK);
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, peer, 1, dst, 8, 0);
    assert_int_equal(tdm_kvx_recv(d.kvx, &rd, &h), TDM_OK);
    assert_int_equal(t_wait(&d).type, TDM_KVX_EV_DONE);
    assert_int_equal(t_compare(&p, src, &d, dst, 0, 8), 0);
    /* a block id beyond the receiver's 40 blocks is refused before anything moves */
    dst[0] = 40;
    rd.transfer_id = 2;
    assert_int_equal(tdm_kvx_recv(d.kvx, &rd, &h), TDM_E_RANGE);
    assert_int_equal(t_stats(&d).num_reserved_blocks, 0);
    t_free(&d);
    t_free(&p);
}

static void layout__mismatch_is_refused_with_the_reason(void **state)
{
    (void)state;
    char ep[128];
    t_ipc(ep, sizeof(ep), "mis");
    eng p, d;
    tdm_kv_layout l;
    t_engine(&p, "p", TDM_KVX_ROLE_PREFILL, ep, ZMQ_ONLY, 1);
    t_layout(&l, 1, T_LAYERS + 1, T_BLOCKS, T_BS, T_HEADS, T_DIM, TDM_DTYPE_FP16);
    decode_with_layout(&d, "d", 0, &l);
    uint32_t peer = 777;
    assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &peer), TDM_E_LAYOUT);
    assert_non_null(strstr(tdm_kvx_errmsg(d.kvx), "num_layers"));
    assert_int_equal(peer, 777);
    assert_int_equal(t_stats(&p).num_peers, 0);
    t_free(&d);
    t_free(&p);
}

static void curve__unknown_client_is_refused_allowed_one_works(void **state)
{
    (void)state;
    char spub[41], ssec[41], cpub[41], csec[41], opub[41], osec[41];
    if (tdm_kvx_curve_keypair(spub, ssec) == TDM_E_UNSUPPORTED) skip();
    assert_int_equal(tdm_kvx_curve_keypair(cpub, csec), TDM_OK);
    assert_int_equal(tdm_kvx_curve_keypair(opub, osec), TDM_OK);
    const char *allowed[1] = { cpub };
    tdm_kvx_config c;
    tdm_kv_layout l;
    t_layout(&l, 1, T_LAYERS, T_BLOCKS, T_BS, T_HEADS, T_DIM, TDM_DTYPE_FP16);
    eng p, good, bad;
    t_config(&c, "p", TDM_KVX_ROLE_PREFILL, "tcp://127.0.0.1:*");
    c.curve_secret_key = ssec;
    c.curve_allowed_clients = allowed;
    c.num_curve_allowed_clients = 1;
    t_engine_cfg(&p, &c, &l, 1);
    char ep[256], pk[41];
    assert_int_equal(tdm_kvx_get_endpoint(p.kvx, ep, sizeof(ep)), TDM_OK);
    assert_int_equal(tdm_kvx_get_public_key(p.kvx, pk), TDM_OK);
    assert_string_equal(pk, spub);

    t_config(&c, "bad", TDM_KVX_ROLE_DECODE, NULL);
    c.curve_secret_key = osec;
    c.handshake_timeout_ms = 1000;
    t_engine_cfg(&bad, &c, &l, 2);
    uint32_t peer;
    assert_int_equal(tdm_kvx_connect(bad.kvx, ep, spub, &peer), TDM_E_AUTH);
    /* and without CURVE at all: the security handshake fails (reported by ZeroMQ's monitor,
     * or, on a loaded machine, noticed only by the handshake timeout) */
    int rc = tdm_kvx_connect(bad.kvx, ep, NULL, &peer);
    assert_true(rc == TDM_E_AUTH || rc == TDM_E_TIMEOUT);

    t_config(&c, "good", TDM_KVX_ROLE_DECODE, NULL);
    c.curve_secret_key = csec;
    t_engine_cfg(&good, &c, &l, 3);
    assert_int_equal(tdm_kvx_connect(good.kvx, ep, spub, &peer), TDM_OK);
    uint32_t src[4] = { 1, 2, 3, 4 }, dst[4] = { 9, 8, 7, 6 };
    tdm_kvx_send_desc sd;
    t_send_desc(&sd, 5, src, 4, 4);
    uint64_t h;
    assert_int_equal(tdm_kvx_send(p.kvx, &sd, &h), TDM_OK);
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, peer, 5, dst, 4, 0);
    assert_int_equal(tdm_kvx_recv(good.kvx, &rd, &h), TDM_OK);
    assert_int_equal(t_wait(&good).type, TDM_KVX_EV_DONE);
    assert_int_equal(t_compare(&p, src, &good, dst, 0, 4), 0);
    assert_int_equal(t_stats(&p).num_peers, 1);
    t_free(&good);
    t_free(&bad);
    t_free(&p);
}

static void cancel__by_receiver_waits_for_the_ack(void **state)
{
    (void)state;
    pair x;
    pair_up_ipc(&x, "cancel", ZMQ_ONLY);
    uint32_t src[6] = { 1, 2, 3, 4, 5, 6 }, dst[6] = { 6, 5, 4, 3, 2, 1 };
    tdm_kvx_send_desc sd;
    t_send_desc(&sd, 3, src, 6, 1);   /* the rest never becomes ready */
    uint64_t hs, hr;
    assert_int_equal(tdm_kvx_send(x.p.kvx, &sd, &hs), TDM_OK);
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, x.peer_on_d, 3, dst, 6, 0);
    assert_int_equal(tdm_kvx_recv(x.d.kvx, &rd, &hr), TDM_OK);
    wait_received(&x.d, 1);
    assert_int_equal(tdm_kvx_cancel(x.d.kvx, hr), TDM_OK);
    tdm_kvx_event ev = t_wait(&x.d);
    assert_int_equal(ev.type, TDM_KVX_EV_CANCELLED);
    assert_int_equal(ev.status, TDM_E_CANCELLED);
    assert_non_null(strstr(ev.reason, "acknowledged"));
    assert_int_equal(ev.num_blocks_done, 1);
    ev = t_wait(&x.p);
    assert_int_equal(ev.type, TDM_KVX_EV_CANCELLED);
    assert_int_equal(ev.handle, hs);
    assert_int_equal(tdm_kvx_cancel(x.d.kvx, hr), TDM_E_NOT_FOUND);
    check_pair_idle(&x);
    pair_down(&x);
}

static void cancel__by_sender_and_before_any_request(void **state)
{
    (void)state;
    pair x;
    pair_up_ipc(&x, "cancel2", WITH_SHM);
    uint32_t src[3] = { 1, 2, 3 }, dst[3] = { 4, 5, 6 };
    tdm_kvx_send_desc sd;
    t_send_desc(&sd, 4, src, 3, 0);
    uint64_t hs, hr;
    /* not yet asked for: cancelled at once */
    assert_int_equal(tdm_kvx_send(x.p.kvx, &sd, &hs), TDM_OK);
    assert_int_equal(tdm_kvx_cancel(x.p.kvx, hs), TDM_OK);
    tdm_kvx_event ev = t_wait(&x.p);
    assert_int_equal(ev.type, TDM_KVX_EV_CANCELLED);
    /* matched: the receiver must acknowledge */
    sd.num_blocks_ready = 1;
    assert_int_equal(tdm_kvx_send(x.p.kvx, &sd, &hs), TDM_OK);
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, x.peer_on_d, 4, dst, 3, 0);
    assert_int_equal(tdm_kvx_recv(x.d.kvx, &rd, &hr), TDM_OK);
    /* one ready block flows: once it has landed, the request has matched */
    wait_received(&x.d, 1);
    assert_int_not_equal(t_stats(&x.d).bytes_received, 0);
    assert_int_equal(tdm_kvx_cancel(x.p.kvx, hs), TDM_OK);
    ev = t_wait(&x.p);
    assert_int_equal(ev.type, TDM_KVX_EV_CANCELLED);
    ev = t_wait(&x.d);
    assert_int_equal(ev.type, TDM_KVX_EV_CANCELLED);
    check_pair_idle(&x);
    pair_down(&x);
}

static void timeout__receiver_without_sender_fails_and_releases(void **state)
{
    (void)state;
    pair x;
    pair_up_ipc(&x, "tmo", ZMQ_ONLY);
    uint32_t dst[5] = { 10, 11, 12, 13, 14 };
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, x.peer_on_d, 99, dst, 5, 0);
    rd.timeout_ms = 150;
    uint64_t h, h2;
    assert_int_equal(tdm_kvx_recv(x.d.kvx, &rd, &h), TDM_OK);
    assert_int_equal(t_stats(&x.d).num_reserved_blocks, 5);
    /* the same blocks cannot be reserved twice */
    rd.transfer_id = 2;
    assert_int_equal(tdm_kvx_recv(x.d.kvx, &rd, &h2), TDM_E_EXISTS);
    uint32_t twice[2] = { 20, 20 };
    rd.block_ids = twice;
    rd.num_blocks = 2;
    assert_int_equal(tdm_kvx_recv(x.d.kvx, &rd, &h2), TDM_E_EXISTS);
    assert_int_equal(t_stats(&x.d).num_reserved_blocks, 5);
    tdm_kvx_event ev = t_wait(&x.d);
    assert_int_equal(ev.type, TDM_KVX_EV_FAILED);
    assert_int_equal(ev.status, TDM_E_TIMEOUT);
    assert_int_equal(ev.handle, h);
    check_idle(&x.d);
    pair_down(&x);
}

static void recv__all_blocks_held_is_done_at_once(void **state)
{
    (void)state;
    pair x;
    pair_up_ipc(&x, "held", ZMQ_ONLY);
    uint32_t dst[2] = { 1, 2 };
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, x.peer_on_d, 0, dst, 2, 2);
    uint64_t h;
    assert_int_equal(tdm_kvx_recv(x.d.kvx, &rd, &h), TDM_OK);
    int fd = -1;
    assert_int_equal(tdm_kvx_get_fd(x.d.kvx, &fd), TDM_OK);
    struct pollfd pfd = { fd, POLLIN, 0 };
    assert_int_equal(poll(&pfd, 1, 5000), 1);
    tdm_kvx_event ev = t_wait(&x.d);
    assert_int_equal(ev.type, TDM_KVX_EV_DONE);
    assert_int_equal(poll(&pfd, 1, 0), 0);   /* drained */
    pair_down(&x);
}

static void api__rejects_bad_arguments(void **state)
{
    (void)state;
    pair x;
    pair_up_ipc(&x, "api", ZMQ_ONLY);
    uint64_t h = 0;
    uint32_t ids[2] = { 1, 2 };
    tdm_kvx_recv_desc rd;
    tdm_kvx_recv_desc_init(&rd);
    assert_int_equal(tdm_kvx_recv(x.d.kvx, NULL, &h), TDM_E_INVAL);
    assert_int_equal(tdm_kvx_recv(x.d.kvx, &rd, &h), TDM_E_INVAL);   /* no blocks */
    rd.block_ids = ids;
    rd.num_blocks = 2;
    rd.num_skip = 3;
    assert_int_equal(tdm_kvx_recv(x.d.kvx, &rd, &h), TDM_E_INVAL);
    rd.num_skip = 0;
    rd.peer = 12345;
    assert_int_equal(tdm_kvx_recv(x.d.kvx, &rd, &h), TDM_E_PEER);
    rd.peer = x.peer_on_d;
    rd.struct_size = 4;
    assert_int_equal(tdm_kvx_recv(x.d.kvx, &rd, &h), TDM_E_INVAL);
    /* a prefill engine does not receive, a decode engine does not send */
    rd.struct_size = sizeof(rd);
    rd.peer = x.peer_on_p;
    assert_int_equal(tdm_kvx_recv(x.p.kvx, &rd, &h), TDM_E_STATE);
    tdm_kvx_send_desc sd;
    tdm_kvx_send_desc_init(&sd);
    sd.block_ids = ids;
    sd.num_blocks = 2;
    assert_int_equal(tdm_kvx_send(x.d.kvx, &sd, &h), TDM_E_STATE);
    ids[1] = T_BLOCKS;
    assert_int_equal(tdm_kvx_send(x.p.kvx, &sd, &h), TDM_E_RANGE);
    ids[1] = 2;
    sd.num_blocks_ready = 3;
    assert_int_equal(tdm_kvx_send(x.p.kvx, &sd, &h), TDM_E_INVAL);
    assert_int_equal(h, 0);
    assert_int_equal(tdm_kvx_cancel(x.p.kvx, 424242), TDM_E_NOT_FOUND);
    assert_int_equal(tdm_kvx_register(x.p.kvx, &x.p.lay, x.p.bases, TDM_MEM_HOST, 0), TDM_E_STATE);
    tdm_kvx_event ev[2];
    uint32_t n;
    memset(ev, 0, sizeof(ev));
    assert_int_equal(tdm_kvx_poll(x.p.kvx, ev, 2, &n, 0), TDM_E_INVAL);   /* struct_size 0 */
    assert_int_equal(tdm_kvx_connect(x.d.kvx, "bogus://x", NULL, &n), TDM_E_INVAL);
    pair_down(&x);
}

static void peers__slots_are_reused_ids_are_not(void **state)
{
    (void)state;
    char ep[128];
    t_ipc(ep, sizeof(ep), "churn");
    eng p, bad;
    tdm_kv_layout l;
    t_engine(&p, "p", TDM_KVX_ROLE_PREFILL, ep, ZMQ_ONLY, 1);
    t_layout(&l, 1, T_LAYERS + 1, 8, T_BS, T_HEADS, T_DIM, TDM_DTYPE_FP16);
    decode_with_layout(&bad, "bad", 0, &l);
    uint32_t peer, last = 0, first = 0;
    /* more refused handshakes than there are peer slots (256) */
    for (int i = 0; i < 300; i++) assert_int_equal(tdm_kvx_connect(bad.kvx, ep, NULL, &peer), TDM_E_LAYOUT);
    t_free(&bad);
    /* and more clients that come and go than there are slots on the server */
    for (int i = 0; i < 260; i++) {
        eng d;
        t_engine(&d, "churn-decode", TDM_KVX_ROLE_DECODE, NULL, ZMQ_ONLY, 3);
        assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &peer), TDM_OK);
        assert_int_equal(tdm_kvx_find_peer(p.kvx, "churn-decode", &peer), TDM_OK);
        if (i == 0) first = peer;
        else assert_int_not_equal(peer, last);
        last = peer;
        t_free(&d);   /* says BYE */
        for (int j = 0; j < 1000 && t_stats(&p).num_peers; j++) t_sleep_ms(1);
    }
    assert_int_not_equal(first, last);
    /* an old id no longer names anybody */
    uint32_t ids[1] = { 1 };
    tdm_kvx_send_desc sd;
    tdm_kvx_send_desc_init(&sd);
    sd.peer = first;
    sd.num_blocks = 1;
    sd.block_ids = ids;
    uint64_t h;
    assert_int_equal(tdm_kvx_send(p.kvx, &sd, &h), TDM_E_PEER);
    t_free(&p);
}

void tdm__alloc_fail_after(long n);

static void alloc__failures_are_reported_and_leave_no_state(void **state)
{
    (void)state;
    tdm_kvx_config c;
    t_config(&c, "inj", TDM_KVX_ROLE_BOTH, "tcp://127.0.0.1:*");
    /* create: every allocation in turn fails; nothing may leak (ASan checks) */
    int ok = 0;
    for (long n = 1; n < 40 && !ok; n++) {
        tdm_kvx *k = NULL;
        tdm__alloc_fail_after(n);
        int rc = tdm_kvx_create(&c, &k);
        tdm__alloc_fail_after(0);
        if (rc == TDM_OK) { ok = 1; tdm_kvx_destroy(k); }
        else { assert_int_equal(rc, TDM_E_NOMEM); assert_null(k); }
    }
    assert_true(ok);
    /* recv/send under injected failures: an error leaves no reservation behind */
    pair x;
    pair_up_ipc(&x, "inj", ZMQ_ONLY);
    uint32_t ids[4] = { 1, 2, 3, 4 };
    for (long n = 1; n < 8; n++) {
        tdm_kvx_recv_desc rd;
        t_recv_desc(&rd, x.peer_on_d, (uint64_t)n, ids, 4, 0);
        rd.timeout_ms = 50;
        uint64_t h = 0;
        tdm__alloc_fail_after(n);
        int rc = tdm_kvx_recv(x.d.kvx, &rd, &h);
        tdm__alloc_fail_after(0);
        if (rc) {
            assert_int_equal(rc, TDM_E_NOMEM);
            assert_int_equal(h, 0);
            assert_int_equal(t_stats(&x.d).num_reserved_blocks, 0);
        } else {
            tdm_kvx_event ev = t_wait(&x.d);   /* nobody sends: it times out */
            assert_int_equal(ev.type, TDM_KVX_EV_FAILED);
        }
        tdm_kvx_send_desc sd;
        t_send_desc(&sd, 1000 + (uint64_t)n, ids, 4, 0);
        h = 0;
        tdm__alloc_fail_after(n);
        rc = tdm_kvx_send(x.p.kvx, &sd, &h);
        tdm__alloc_fail_after(0);
        if (rc) assert_int_equal(rc, TDM_E_NOMEM);
        else {
            assert_int_equal(tdm_kvx_cancel(x.p.kvx, h), TDM_OK);
            assert_int_equal(t_wait(&x.p).type, TDM_KVX_EV_CANCELLED);
        }
    }
    /* still fine afterwards */
    run_pull(&x, 5, 0, 4242);
    pair_down(&x);
}

static void create__validates_config_and_json(void **state)
{
    (void)state;
    tdm_kvx *k = NULL;
    tdm_kvx_config c;
    tdm_kvx_config_init(&c);
    assert_int_equal(tdm_kvx_create(&c, &k), TDM_E_CONFIG);   /* no engine id */
    c.engine_id = "bad id";
    assert_int_equal(tdm_kvx_create(&c, &k), TDM_E_CONFIG);
    c.engine_id = "ok";
    c.listen_endpoint = "udp://1.2.3.4:5";
    assert_int_equal(tdm_kvx_create(&c, &k), TDM_E_CONFIG);
    c.listen_endpoint = NULL;
    c.max_chunk_bytes = 10;
    assert_int_equal(tdm_kvx_create(&c, &k), TDM_E_CONFIG);
    c.max_chunk_bytes = 1 << 20;
    c.curve_secret_key = "short";
    assert_int_equal(tdm_kvx_create(&c, &k), TDM_E_CONFIG);
    assert_null(k);
    assert_int_equal(tdm_kvx_create_json("{\"engine_id\": \"j\", \"bogus\": 1}", &k), TDM_E_CONFIG);
    assert_non_null(strstr(tdm_kvx_errmsg(NULL), "bogus"));
    assert_int_equal(tdm_kvx_create_json("{\"engine_id\": \"j\", \"role\": \"middle\"}", &k), TDM_E_CONFIG);
    assert_int_equal(tdm_kvx_create_json("[1", &k), TDM_E_CONFIG);
    assert_int_equal(tdm_kvx_create_json("{\"engine_id\": \"j\", \"role\": \"decode\", \"listen\": "
                                         "\"tcp://127.0.0.1:*\", \"transports\": [\"zmq\", \"shm\"], "
                                         "\"heartbeat_ms\": 100, \"peer_timeout_ms\": 1000, "
                                         "\"max_chunk_bytes\": 65536, \"shm_slots\": 2}", &k), TDM_OK);
    char ep[128];
    assert_int_equal(tdm_kvx_get_endpoint(k, ep, sizeof(ep)), TDM_OK);
    assert_non_null(strstr(ep, "tcp://127.0.0.1:"));
    assert_int_equal(tdm_kvx_get_endpoint(k, ep, 4), TDM_E_TRUNCATED);
    uint32_t peer;
    assert_int_equal(tdm_kvx_connect(k, ep, NULL, &peer), TDM_E_STATE);   /* not registered */
    tdm_kv_layout l;
    t_layout(&l, 1, 2, 8, 4, 2, 16, TDM_DTYPE_FP16);
    void *bases[2] = { NULL, NULL };
    assert_int_equal(tdm_kvx_register(k, &l, bases, TDM_MEM_HOST, 0), TDM_E_INVAL);
    static uint8_t mem[2][8 * 2 * 4 * 2 * 16 * 2];
    bases[0] = mem[0];
    bases[1] = mem[1];
    assert_int_equal(tdm_kvx_register(k, &l, bases, TDM_MEM_CUDA, 0), TDM_E_NO_CUDA);
    l.head_dim = 0;
    assert_int_equal(tdm_kvx_register(k, &l, bases, TDM_MEM_HOST, 0), TDM_E_INVAL);
    tdm_kvx_destroy(k);
    tdm_kvx_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pull__ipc_zmq_moves_every_byte),
        cmocka_unit_test(pull__tcp_loopback_moves_every_byte),
        cmocka_unit_test(pull__shared_memory_moves_every_byte),
        cmocka_unit_test(pull__prefix_skip_sends_only_the_rest),
        cmocka_unit_test(shm__direct_reads_from_a_shared_cache),
        cmocka_unit_test(push__tcp_sender_first_then_announce),
        cmocka_unit_test(stream__blocks_flow_before_the_prompt_is_complete),
        cmocka_unit_test(layout__different_arrangement_same_format_is_accepted),
        cmocka_unit_test(layout__mismatch_is_refused_with_the_reason),
        cmocka_unit_test(curve__unknown_client_is_refused_allowed_one_works),
        cmocka_unit_test(cancel__by_receiver_waits_for_the_ack),
        cmocka_unit_test(cancel__by_sender_and_before_any_request),
        cmocka_unit_test(timeout__receiver_without_sender_fails_and_releases),
        cmocka_unit_test(recv__all_blocks_held_is_done_at_once),
        cmocka_unit_test(api__rejects_bad_arguments),
        cmocka_unit_test(peers__slots_are_reused_ids_are_not),
        cmocka_unit_test(alloc__failures_are_reported_and_leave_no_state),
        cmocka_unit_test(create__validates_config_and_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
