/*
 * test_kvx_msg.c -- the protocol's header codec: every message type round-trips, every
 * truncation and every single-byte corruption of a valid message is refused or decoded
 * without harm, other versions, trailing bytes, unknown types, maps, bad ranges and deep
 * nesting are refused, and unknown trailing fields are skipped (forward compatibility);
 * shared-memory names that are not engine-generated, and segment sizes that are not a
 * whole number of slots, are refused.
 */
#include "kvx_testutil.h"
#include "../../../kv_transfer/kvx_msg.h"

static size_t make(uint32_t type, uint8_t *buf)
{
    tdm__kvx_msg m;
    tdm__kvx_msg_init(&m, type);
    snprintf(m.hello.engine_id, sizeof(m.hello.engine_id), "e-%u", type);
    tdm_kv_layout_init(&m.hello.layout, TDM_KV_LAYOUT_FLASHINFER, 8, 100, 16, 4, 64, TDM_DTYPE_BF16);
    snprintf(m.hello.host_id, sizeof(m.hello.host_id), "h");
    snprintf(m.hello.kv_name, sizeof(m.hello.kv_name), "/tdm-kvx-4026531836-77-kv-0123456789abcdef");
    m.hello.kv_size = 100000;
    m.hello.kv_layers = 8;
    for (uint32_t l = 0; l < 8; l++) m.hello.kv_off[l] = 1000u * l;
    m.rid = 0xfedcba9876543210ull;
    m.xid = 77;
    m.mode = 2;
    m.num_blocks = 9;
    m.num_skip = 9;
    m.num_tokens = 130;
    m.layer_begin = 1;
    m.layer_end = 8;
    m.block_begin = 3;
    m.block_count = 6;
    m.nbytes = 12345;
    m.slot = 2;
    m.to_side = 1;
    m.status = type == TDM__KVX_FAIL ? TDM_E_PEER : 0;
    snprintf(m.reason, sizeof(m.reason), "why \"not\"");
    size_t len;
    assert_int_equal(tdm__kvx_msg_encode(&m, buf, TDM__KVX_MAX_HEADER, &len), TDM_OK);
    return len;
}

static void msg__every_type_round_trips(void **state)
{
    (void)state;
    uint8_t buf[TDM__KVX_MAX_HEADER];
    for (uint32_t t = 1; t <= TDM__KVX_MSG_MAX; t++) {
        size_t n = make(t, buf);
        tdm__kvx_msg m;
        char why[128] = "";
        int rc = tdm__kvx_msg_decode(buf, n, &m, why, sizeof(why));
        if (rc) fail_msg("type %u: %s", t, why);
        assert_int_equal(m.type, t);
        if (t == TDM__KVX_DATA) {
            assert_int_equal(m.rid, 0xfedcba9876543210ull);
            assert_int_equal(m.block_count, 6);
            assert_int_equal(m.nbytes, 12345);
        }
        if (t == TDM__KVX_HELLO) {
            assert_string_equal(m.hello.engine_id, "e-1");
            assert_int_equal(m.hello.layout.stride_block, 2 * 16 * 4 * 64);
            assert_string_equal(m.hello.kv_name, "/tdm-kvx-4026531836-77-kv-0123456789abcdef");
            assert_int_equal(m.hello.kv_layers, 8);
            assert_int_equal(m.hello.kv_off[7], 7000);
        }
        if (t == TDM__KVX_FAIL) {
            assert_int_equal(m.status, TDM_E_PEER);
            assert_string_equal(m.reason, "why \"not\"");
        }
    }
}

static void msg__truncations_and_corruptions_are_safe(void **state)
{
    (void)state;
    uint8_t buf[TDM__KVX_MAX_HEADER], c[TDM__KVX_MAX_HEADER];
    tdm__kvx_msg m;
    for (uint32_t t = 1; t <= TDM__KVX_MSG_MAX; t++) {
        size_t n = make(t, buf);
        for (size_t k = 0; k < n; k++)
            assert_int_not_equal(tdm__kvx_msg_decode(buf, k, &m, NULL, 0), TDM_OK);
        for (size_t k = 0; k < n; k++)
            for (int v = 0; v < 256; v += 17) {
                memcpy(c, buf, n);
                c[k] = (uint8_t)v;
                int rc = tdm__kvx_msg_decode(c, n, &m, NULL, 0);
                if (rc == TDM_OK && m.type == TDM__KVX_DATA)
                    assert_true(m.layer_begin < m.layer_end && m.block_count > 0);
            }
    }
}

/* x encodes, but the decoder refuses what it wrote (TDM_E_PROTOCOL). */
static void encoded_is_refused(const tdm__kvx_msg *x)
{
    uint8_t buf[TDM__KVX_MAX_HEADER + 8];
    size_t len;
    tdm__kvx_msg m;
    char why[128];
    assert_int_equal(tdm__kvx_msg_encode(x, buf, sizeof(buf), &len), TDM_OK);
    assert_int_equal(tdm__kvx_msg_decode(buf, len, &m, why, sizeof(why)), TDM_E_PROTOCOL);
}

static void msg__bad_shapes_are_refused(void **state)
{
    (void)state;
    tdm__kvx_msg m;
    char why[128];
    uint8_t buf[TDM__KVX_MAX_HEADER + 8];
    size_t n = make(TDM__KVX_PING, buf);
    buf[n] = 0xc0;
    assert_int_equal(tdm__kvx_msg_decode(buf, n + 1, &m, why, sizeof(why)), TDM_E_PROTOCOL);
    assert_non_null(strstr(why, "trailing"));
    buf[1] = 0x02;   /* version 2 */
    assert_int_equal(tdm__kvx_msg_decode(buf, n, &m, why, sizeof(why)), TDM_E_VERSION);
    assert_int_equal(m.version, 2);
    const uint8_t unknown[] = { 0x93, 0x01, 0x33, 0x00 };
    assert_int_equal(tdm__kvx_msg_decode(unknown, sizeof(unknown), &m, why, sizeof(why)), TDM_E_PROTOCOL);
    const uint8_t map[] = { 0x82, 0xa1, 'v', 0x01, 0xa1, 't', 0x0a };
    assert_int_equal(tdm__kvx_msg_decode(map, sizeof(map), &m, why, sizeof(why)), TDM_E_PROTOCOL);
    /* an extra trailing field is skipped; nested too deep it is refused */
    uint8_t ok[] = { 0x94, 0x01, TDM__KVX_PING, 0x05, 0x92, 0xa1, 'x', 0xc3 };
    assert_int_equal(tdm__kvx_msg_decode(ok, sizeof(ok), &m, why, sizeof(why)), TDM_OK);
    assert_int_equal(m.time_ms, 5);
    uint8_t deep[64] = { 0x94, 0x01, TDM__KVX_PING, 0x05 };
    size_t d = 4;
    for (int i = 0; i < 20; i++) deep[d++] = 0x91;
    deep[d++] = 0x00;
    assert_int_equal(tdm__kvx_msg_decode(deep, d, &m, why, sizeof(why)), TDM_E_PROTOCOL);
    /* an array claiming more elements than bytes */
    const uint8_t huge[] = { 0xdd, 0xff, 0xff, 0xff, 0xff, 0x01 };
    assert_int_equal(tdm__kvx_msg_decode(huge, sizeof(huge), &m, why, sizeof(why)), TDM_E_PROTOCOL);
    /* DATA with an empty layer range, XFER_REQ with skip > blocks, a negative FAIL status */
    tdm__kvx_msg x;
    size_t len;
    tdm__kvx_msg_init(&x, TDM__KVX_DATA);
    x.layer_begin = x.layer_end = 3;
    x.block_count = 1;
    x.nbytes = 1;
    encoded_is_refused(&x);
    tdm__kvx_msg_init(&x, TDM__KVX_XFER_REQ);
    x.mode = 1;
    x.num_blocks = 2;
    x.num_skip = 3;
    encoded_is_refused(&x);
    tdm__kvx_msg_init(&x, TDM__KVX_FAIL);
    x.to_side = 1;
    x.status = 0;
    encoded_is_refused(&x);
    /* a too-small output buffer */
    assert_int_equal(tdm__kvx_msg_encode(&x, buf, 4, &len), TDM_E_TRUNCATED);
    assert_int_equal(tdm__kvx_msg_decode(NULL, 0, &m, why, sizeof(why)), TDM_E_PROTOCOL);
}

static int hello_with(const char *shm, uint64_t size, uint32_t slot, const char *kv, char *why)
{
    tdm__kvx_msg m, d;
    tdm__kvx_msg_init(&m, TDM__KVX_HELLO);
    snprintf(m.hello.engine_id, sizeof(m.hello.engine_id), "e");
    tdm_kv_layout_init(&m.hello.layout, TDM_KV_LAYOUT_VLLM_NHD, 2, 10, 16, 4, 64, TDM_DTYPE_FP16);
    snprintf(m.hello.host_id, sizeof(m.hello.host_id), "h");
    snprintf(m.hello.shm_name, sizeof(m.hello.shm_name), "%s", shm);
    m.hello.shm_size = size;
    m.hello.slot_bytes = slot;
    if (kv) {
        snprintf(m.hello.kv_name, sizeof(m.hello.kv_name), "%s", kv);
        m.hello.kv_size = 1 << 20;
        m.hello.kv_layers = 2;
        m.hello.kv_off[1] = 1 << 19;
    }
    uint8_t buf[TDM__KVX_MAX_HEADER];
    size_t len;
    assert_int_equal(tdm__kvx_msg_encode(&m, buf, sizeof(buf), &len), TDM_OK);
    why[0] = '\0';
    return tdm__kvx_msg_decode(buf, len, &d, why, 128);
}

static void msg__hostile_segment_names_and_sizes_are_refused(void **state)
{
    (void)state;
    char why[128];
    const char *ok = "/tdm-kvx-4026531836-4242-tx3-00ff00ff00ff00ff";
    const char *kv = "/tdm-kvx-4026531836-4242-kv-00ff00ff00ff00ff";
    assert_int_equal(hello_with(ok, 4 * 65536, 65536, kv, why), TDM_OK);
    assert_int_equal(hello_with("", 0, 0, NULL, why), TDM_OK);
    assert_int_equal(tdm__kvx_shm_name_parse(ok, 't', NULL, NULL), 1);
    uint64_t ns = 0, pid = 0;
    assert_int_equal(tdm__kvx_shm_name_parse(kv, 0, &ns, &pid), 1);
    assert_int_equal(ns, 4026531836ull);
    assert_int_equal(pid, 4242);
    static const char *bad[] = {
        "/victim", "/tdm-kvx-victim", "/tdm-kvx-1-2-tx3-00ff00ff00ff00f", "/tdm-kvx-1-2-tx3-00ff00ff00ff00ff0",
        "/tdm-kvx-1-2-tx3-00FF00FF00FF00FF", "/tdm-kvx-1-2-tx-00ff00ff00ff00ff", "/tdm-kvx-1-0-tx3-00ff00ff00ff00ff",
        "/tdm-kvx-1-02-tx3-00ff00ff00ff00ff", "/tdm-kvx-1-2-kv-00ff00ff00ff00ff", "/tdm-kvx-1-2-tx3-00ff00ff00ff00ff-",
        "/tdm-kvx-1-2-rx3-00ff00ff00ff00ff", "/tdm-kvx-1-12345678901-tx3-00ff00ff00ff00ff", "tdm-kvx-1-2-tx3-00ff00ff00ff00ff",
        "/tdm-kvx--2-tx3-00ff00ff00ff00ff",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(tdm__kvx_shm_name_parse(bad[i], 't', NULL, NULL), 0);
        int rc = hello_with(bad[i], 4 * 65536, 65536, NULL, why);
        if (rc != TDM_E_PROTOCOL) fail_msg("shm name '%s' accepted", bad[i]);
        assert_non_null(strstr(why, "engine-generated"));
    }
    /* a transfer name as the shared KV, a bare name, another tag */
    assert_int_equal(hello_with("", 0, 0, ok, why), TDM_E_PROTOCOL);
    assert_int_equal(hello_with("", 0, 0, "/kv", why), TDM_E_PROTOCOL);
    assert_non_null(strstr(why, "engine-generated"));
    /* sizes: not a whole number of slots, no slot, too many slots, no slot size */
    assert_int_equal(hello_with(ok, 4 * 65536 + 1, 65536, NULL, why), TDM_E_PROTOCOL);
    assert_non_null(strstr(why, "slots"));
    assert_int_equal(hello_with(ok, 0, 65536, NULL, why), TDM_E_PROTOCOL);
    assert_int_equal(hello_with(ok, 1025ull * 4096, 4096, NULL, why), TDM_E_PROTOCOL);
    assert_int_equal(hello_with(ok, 1024ull * 4096, 4096, NULL, why), TDM_OK);
    assert_int_equal(hello_with(ok, 65536, 0, NULL, why), TDM_E_PROTOCOL);
}

/* A HELLO offering NIXL over 4 layers (metadata and region table of the caller). */
static size_t make_nixl(uint8_t *buf, size_t cap, uint8_t *md, size_t md_len, uint8_t *rgn, size_t rgn_len)
{
    tdm__kvx_msg m;
    tdm__kvx_msg_init(&m, TDM__KVX_HELLO);
    snprintf(m.hello.engine_id, sizeof(m.hello.engine_id), "d");
    tdm_kv_layout_init(&m.hello.layout, TDM_KV_LAYOUT_VLLM_NHD, 4, 64, 16, 2, 64, TDM_DTYPE_FP16);
    snprintf(m.hello.host_id, sizeof(m.hello.host_id), "h");
    m.hello.transports = TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_NIXL;
    snprintf(m.hello.nixl_agent, sizeof(m.hello.nixl_agent), "d-1-2");
    m.hello.nixl_md = md;
    m.hello.nixl_md_len = (uint32_t)md_len;
    m.hello.nixl_rgn = rgn;
    m.hello.nixl_rgn_len = (uint32_t)rgn_len;
    size_t len;
    assert_int_equal(tdm__kvx_msg_encode(&m, buf, cap, &len), TDM_OK);
    return len;
}

static void put64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

static void msg__nixl_fields_round_trip_and_are_range_checked(void **state)
{
    (void)state;
    uint8_t md[300], rgn[8 * (TDM__KVX_NIXL_RGN_HDR + 4)], buf[4096], c[4096];
    for (size_t i = 0; i < sizeof(md); i++) md[i] = (uint8_t)(i * 13 + 1);
    uint64_t v[] = { 0, 3, 0x10000, 65536, 4, 0x20000, 0x30000, 0x40000, 0x50000 };
    for (size_t i = 0; i < 9; i++) put64(rgn + 8 * i, v[i]);
    tdm__kvx_msg m;
    char why[128] = "";
    size_t n = make_nixl(buf, sizeof(buf), md, sizeof(md), rgn, sizeof(rgn));
    if (tdm__kvx_msg_decode(buf, n, &m, why, sizeof(why))) fail_msg("%s", why);
    assert_string_equal(m.hello.nixl_agent, "d-1-2");
    assert_int_equal(m.hello.nixl_md_len, sizeof(md));
    assert_memory_equal(m.hello.nixl_md, md, sizeof(md));
    assert_int_equal(m.hello.scale_kind, TDM_KV_SCALE_NONE);   /* the scale fields written as "none" */
    for (uint32_t i = 0; i < 9; i++) assert_int_equal(tdm__kvx_hello_nixl_u64(&m.hello, i), v[i]);
    assert_int_equal(tdm__kvx_hello_nixl_u64(&m.hello, 9), 0);   /* beyond the table */
    /* every truncation is refused; corruptions decode or are refused without harm */
    for (size_t k = 0; k < n; k++) assert_int_not_equal(tdm__kvx_msg_decode(buf, k, &m, NULL, 0), TDM_OK);
    for (size_t k = 0; k < n; k++)
        for (int x = 0; x < 256; x += 51) {
            memcpy(c, buf, n);
            c[k] = (uint8_t)x;
            if (tdm__kvx_msg_decode(c, n, &m, NULL, 0) == TDM_OK && m.hello.nixl_agent[0]) {
                assert_true(m.hello.nixl_md_len > 0 && m.hello.nixl_md_len <= TDM__KVX_MAX_NIXL_MD);
                assert_int_equal(m.hello.nixl_rgn_len, 8 * (TDM__KVX_NIXL_RGN_HDR + m.hello.layout.num_layers));
                assert_true(m.hello.nixl_md >= c && m.hello.nixl_md + m.hello.nixl_md_len <= c + n);
            }
        }
    /* one base short, zero slots, slots beyond 1024, a NULL layer base, a ring that wraps */
    n = make_nixl(buf, sizeof(buf), md, sizeof(md), rgn, sizeof(rgn) - 8);
    assert_int_equal(tdm__kvx_msg_decode(buf, n, &m, why, sizeof(why)), TDM_E_PROTOCOL);
    assert_non_null(strstr(why, "one base per layer"));
    const struct { uint32_t at; uint64_t val; const char *msg; } bad[] = {
        { 4, 0, "slot size or count" }, { 4, 1025, "slot size or count" }, { 3, 100, "slot size or count" },
        { 5, 0, "NULL layer base" }, { 2, UINT64_MAX - 1000, "bad ring address" }, { 0, 2, "memory kind" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint8_t r2[sizeof(rgn)];
        memcpy(r2, rgn, sizeof(rgn));
        put64(r2 + 8 * bad[i].at, bad[i].val);
        n = make_nixl(buf, sizeof(buf), md, sizeof(md), r2, sizeof(r2));
        assert_int_equal(tdm__kvx_msg_decode(buf, n, &m, why, sizeof(why)), TDM_E_PROTOCOL);
        if (!strstr(why, bad[i].msg)) fail_msg("case %zu: '%s'", i, why);
    }
    /* metadata empty or larger than the limit */
    n = make_nixl(buf, sizeof(buf), md, 0, rgn, sizeof(rgn));
    assert_int_equal(tdm__kvx_msg_decode(buf, n, &m, why, sizeof(why)), TDM_E_PROTOCOL);
    static uint8_t huge[TDM__KVX_MAX_NIXL_MD + 1], hbuf[TDM__KVX_MAX_NIXL_MD + 4096];
    n = make_nixl(hbuf, sizeof(hbuf), huge, sizeof(huge), rgn, sizeof(rgn));
    assert_int_equal(tdm__kvx_msg_decode(hbuf, n, &m, why, sizeof(why)), TDM_E_PROTOCOL);
    assert_non_null(strstr(why, "too large"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(msg__every_type_round_trips),
        cmocka_unit_test(msg__truncations_and_corruptions_are_safe),
        cmocka_unit_test(msg__bad_shapes_are_refused),
        cmocka_unit_test(msg__hostile_segment_names_and_sizes_are_refused),
        cmocka_unit_test(msg__nixl_fields_round_trip_and_are_range_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
