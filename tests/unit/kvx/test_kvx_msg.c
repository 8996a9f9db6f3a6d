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
    assert_int_equal(tdm__kvx_msg_encode(&x, buf, sizeof(buf), &len), TDM_OK);
    assert_int_equal(tdm__kvx_msg_decode(buf, len, &m, why, sizeof(why)), TDM_E_PROTOCOL);
    tdm__kvx_msg_init(&x, TDM__KVX_XFER_REQ);
    x.mode = 1;
    x.num_blocks = 2;
    x.num_skip = 3;
    assert_int_equal(tdm__kvx_msg_encode(&x, buf, sizeof(buf), &len), TDM_OK);
    assert_int_equal(tdm__kvx_msg_decode(buf, len, &m, why, sizeof(why)), TDM_E_PROTOCOL);
    tdm__kvx_msg_init(&x, TDM__KVX_FAIL);
    x.to_side = 1;
    x.status = 0;
    assert_int_equal(tdm__kvx_msg_encode(&x, buf, sizeof(buf), &len), TDM_OK);
    assert_int_equal(tdm__kvx_msg_decode(buf, len, &m, why, sizeof(why)), TDM_E_PROTOCOL);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(msg__every_type_round_trips),
        cmocka_unit_test(msg__truncations_and_corruptions_are_safe),
        cmocka_unit_test(msg__bad_shapes_are_refused),
        cmocka_unit_test(msg__hostile_segment_names_and_sizes_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
