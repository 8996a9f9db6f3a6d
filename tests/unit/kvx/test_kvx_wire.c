/*
 * test_kvx_wire.c -- a raw ZeroMQ socket speaks to an engine the way a foreign (pyzmq +
 * msgpack) client would: garbage, empty, oversized and many-framed messages and transfer
 * messages before the handshake are dropped and counted; after a valid HELLO, DATA chunks
 * with out-of-range blocks or layers, a payload that does not match its header, a duplicate
 * chunk and an unknown transfer are refused (the transfer fails, its blocks are released,
 * the peer is told); then a correct chunk completes the transfer with the right bytes.
 */
#include <zmq.h>

#include "kvx_testutil.h"
#include "../../../kv_transfer/kvx_msg.h"

typedef struct raw {
    void *ctx, *sock;
} raw;

/* A decode engine d on an ephemeral tcp port and a raw DEALER socket r connected to it. */
static void raw_open(eng *d, raw *r)
{
    t_engine(d, "decode", TDM_KVX_ROLE_DECODE, "tcp://127.0.0.1:*", TDM_KVX_TRANSPORT_ZMQ, 3);
    char ep[256];
    assert_int_equal(tdm_kvx_get_endpoint(d->kvx, ep, sizeof(ep)), TDM_OK);
    r->ctx = zmq_ctx_new();
    r->sock = zmq_socket(r->ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(r->sock, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_connect(r->sock, ep), 0);
}

static void raw_close(eng *d, raw *r)
{
    zmq_close(r->sock);
    zmq_ctx_term(r->ctx);
    t_free(d);
}

static void raw_send(raw *r, const tdm__kvx_msg *m, const void *payload, size_t plen)
{
    uint8_t buf[TDM__KVX_MAX_HEADER];
    size_t len;
    assert_int_equal(tdm__kvx_msg_encode(m, buf, sizeof(buf), &len), TDM_OK);
    assert_true(zmq_send(r->sock, buf, len, payload ? ZMQ_SNDMORE : 0) >= 0);
    if (payload) assert_true(zmq_send(r->sock, payload, plen, 0) >= 0);
}

/* Receives the next message that is not a PING. */
static tdm__kvx_msg raw_recv(raw *r)
{
    tdm__kvx_msg m;
    uint8_t buf[TDM__KVX_MAX_HEADER];
    int timeo = 5000;
    zmq_setsockopt(r->sock, ZMQ_RCVTIMEO, &timeo, sizeof(timeo));
    for (;;) {
        int n = zmq_recv(r->sock, buf, sizeof(buf), 0);
        if (n < 0) fail_msg("raw client: nothing received");
        char why[128];
        assert_int_equal(tdm__kvx_msg_decode(buf, (size_t)n, &m, why, sizeof(why)), TDM_OK);
        if (m.type != TDM__KVX_PING) return m;
    }
}

static void wait_rejected(eng *e, uint64_t n)
{
    for (int i = 0; i < 1000 && t_stats(e).msgs_rejected < n; i++) t_sleep_ms(5);
    assert_true(t_stats(e).msgs_rejected >= n);
}

static uint64_t start_recv(eng *d, uint32_t peer, uint64_t rid, const uint32_t *dst, raw *r)
{
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, peer, rid, dst, 4, 0);
    rd.transfer_id = 1;
    uint64_t h;
    assert_int_equal(tdm_kvx_recv(d->kvx, &rd, &h), TDM_OK);
    tdm__kvx_msg m = raw_recv(r);
    assert_int_equal(m.type, TDM__KVX_XFER_REQ);
    assert_int_equal(m.rid, rid);
    assert_int_equal(m.num_blocks, 4);
    return h;
}

static tdm__kvx_msg data_msg(uint64_t rid, uint32_t lb, uint32_t le, uint32_t bb, uint32_t cnt, size_t unit)
{
    tdm__kvx_msg m;
    tdm__kvx_msg_init(&m, TDM__KVX_DATA);
    m.rid = rid;
    m.xid = 1;
    m.layer_begin = lb;
    m.layer_end = le;
    m.block_begin = bb;
    m.block_count = cnt;
    m.nbytes = (uint64_t)(le - lb) * cnt * unit;
    m.slot = TDM__KVX_NO_SLOT;
    m.num_tokens = 4 * T_BS;
    return m;
}

static void expect_failure(eng *d, raw *r, uint64_t h, const char *what)
{
    tdm_kvx_event ev = t_wait(d);
    assert_int_equal(ev.type, TDM_KVX_EV_FAILED);
    assert_int_equal(ev.handle, h);
    assert_int_equal(ev.status, TDM_E_PROTOCOL);
    if (!strstr(ev.reason, what)) fail_msg("reason '%s' lacks '%s'", ev.reason, what);
    tdm__kvx_msg m = raw_recv(r);
    assert_int_equal(m.type, TDM__KVX_FAIL);
    assert_int_equal(m.to_side, TDM_KVX_SIDE_SEND);
    assert_int_equal(t_stats(d).num_reserved_blocks, 0);
}

static void wire__malformed_messages_are_refused_engine_keeps_working(void **state)
{
    (void)state;
    eng d;
    raw r;
    raw_open(&d, &r);

    /* before any handshake */
    uint8_t junk[3000];
    uint64_t s = 5;
    for (size_t i = 0; i < sizeof(junk); i++) junk[i] = (uint8_t)t_rand(&s);
    zmq_send(r.sock, junk, 100, 0);                       /* garbage */
    zmq_send(r.sock, junk, 0, 0);                         /* empty */
    zmq_send(r.sock, junk, sizeof(junk), 0);              /* oversized header */
    for (int i = 0; i < 4; i++) zmq_send(r.sock, junk, 10, ZMQ_SNDMORE);
    zmq_send(r.sock, junk, 10, 0);                        /* five frames */
    tdm__kvx_msg m;
    tdm__kvx_msg_init(&m, TDM__KVX_XFER_REQ);
    m.rid = 1; m.mode = 1; m.num_blocks = 1;
    raw_send(&r, &m, NULL, 0);                            /* valid, but no handshake */
    uint8_t hdr[TDM__KVX_MAX_HEADER];
    size_t hl;
    assert_int_equal(tdm__kvx_msg_encode(&m, hdr, sizeof(hdr), &hl), TDM_OK);
    zmq_send(r.sock, hdr, hl - 1, 0);                     /* truncated */
    wait_rejected(&d, 6);
    assert_int_equal(t_stats(&d).num_peers, 0);

    /* a handshake as a prefill engine with the same layout */
    tdm__kvx_msg_init(&m, TDM__KVX_HELLO);
    snprintf(m.hello.engine_id, sizeof(m.hello.engine_id), "raw");
    m.hello.role = TDM_KVX_ROLE_PREFILL;
    m.hello.layout = d.lay;
    m.hello.transports = TDM_KVX_TRANSPORT_ZMQ;
    snprintf(m.hello.host_id, sizeof(m.hello.host_id), "elsewhere");
    raw_send(&r, &m, NULL, 0);
    m = raw_recv(&r);
    assert_int_equal(m.type, TDM__KVX_HELLO_ACK);
    assert_int_equal(m.status, 0);
    assert_string_equal(m.hello.engine_id, "decode");
    uint32_t peer;
    assert_int_equal(tdm_kvx_find_peer(d.kvx, "raw", &peer), TDM_OK);

    size_t unit = (size_t)2 * T_BS * T_HEADS * T_DIM * 2;
    uint8_t payload[4 * T_LAYERS * 2 * T_BS * T_HEADS * T_DIM * 2];
    for (size_t i = 0; i < sizeof(payload); i++) payload[i] = (uint8_t)t_rand(&s);
    uint32_t dst[4] = { 5, 9, 2, 40 };

    uint64_t h = start_recv(&d, peer, 10, dst, &r);
    m = data_msg(10, 0, T_LAYERS, 2, 3, unit);            /* blocks [2,5) of 4 */
    raw_send(&r, &m, payload, m.nbytes);
    expect_failure(&d, &r, h, "outside");

    h = start_recv(&d, peer, 11, dst, &r);
    m = data_msg(11, 0, 1, 0, 1, unit);
    raw_send(&r, &m, payload, m.nbytes - 1);               /* payload shorter than announced */
    expect_failure(&d, &r, h, "payload");

    h = start_recv(&d, peer, 12, dst, &r);
    m = data_msg(12, 0, T_LAYERS + 1, 0, 1, unit);         /* one layer too many */
    raw_send(&r, &m, payload, m.nbytes);
    expect_failure(&d, &r, h, "layer");

    h = start_recv(&d, peer, 13, dst, &r);
    m = data_msg(13, 0, 1, 0, 1, unit);
    m.nbytes += 2;                                          /* wrong size for the range */
    raw_send(&r, &m, payload, m.nbytes);
    expect_failure(&d, &r, h, "expected");

    h = start_recv(&d, peer, 14, dst, &r);
    m = data_msg(14, 0, 1, 0, 2, unit);
    raw_send(&r, &m, payload, m.nbytes);
    m = data_msg(14, 0, 1, 1, 1, unit);                     /* block 1 again */
    raw_send(&r, &m, payload, m.nbytes);
    expect_failure(&d, &r, h, "twice");

    /* an unknown transfer: dropped and counted, no event */
    uint64_t rej = t_stats(&d).msgs_rejected;
    m = data_msg(999, 0, 1, 0, 1, unit);
    raw_send(&r, &m, payload, m.nbytes);
    wait_rejected(&d, rej + 1);

    /* and a correct transfer completes, byte for byte */
    h = start_recv(&d, peer, 15, dst, &r);
    m = data_msg(15, 0, T_LAYERS, 0, 4, unit);
    raw_send(&r, &m, payload, m.nbytes);
    tdm_kvx_event ev = t_wait(&d);
    assert_int_equal(ev.type, TDM_KVX_EV_DONE);
    assert_int_equal(ev.handle, h);
    m = raw_recv(&r);
    assert_int_equal(m.type, TDM__KVX_DONE);
    assert_int_equal(m.nbytes, sizeof(payload));
    uint8_t back[sizeof(payload)];
    assert_int_equal(tdm_kv_pack(&d.lay, d.bases, dst, 4, 0, T_LAYERS, back, sizeof(back)), TDM_OK);
    assert_memory_equal(back, payload, sizeof(payload));
    assert_int_equal(t_stats(&d).num_reserved_blocks, 0);

    /* goodbye: the peer is gone at once */
    tdm__kvx_msg_init(&m, TDM__KVX_BYE);
    raw_send(&r, &m, NULL, 0);
    for (int i = 0; i < 1000 && t_stats(&d).num_peers; i++) t_sleep_ms(5);
    assert_int_equal(t_stats(&d).num_peers, 0);
    raw_close(&d, &r);
}

static void wire__other_protocol_version_gets_a_version_refusal(void **state)
{
    (void)state;
    eng d;
    raw r;
    raw_open(&d, &r);
    tdm__kvx_msg m;
    tdm__kvx_msg_init(&m, TDM__KVX_HELLO);
    m.version = 7;
    snprintf(m.hello.engine_id, sizeof(m.hello.engine_id), "future");
    m.hello.layout = d.lay;
    raw_send(&r, &m, NULL, 0);
    m = raw_recv(&r);
    assert_int_equal(m.type, TDM__KVX_HELLO_ACK);
    assert_int_equal(m.status, TDM_E_VERSION);
    assert_int_equal(t_stats(&d).num_peers, 0);
    raw_close(&d, &r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(wire__malformed_messages_are_refused_engine_keeps_working),
        cmocka_unit_test(wire__other_protocol_version_gets_a_version_refusal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
