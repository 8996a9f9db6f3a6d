/*
 * gen_kvx_msg_corpus.c -- writes the seed corpus of fuzz_kvx_msg: one valid header frame of
 * every message type (tests/fuzz/corpus/kvx_msg/valid_<type>) and a few broken ones (a
 * truncated HELLO, HELLOs with fp8 KV scales, valid and broken, HELLOs naming segments that are
 * not engine-generated or whose size is not a whole number of slots, a HELLO_ACK naming the
 * server's own segment, a DATA with a bad range, another protocol version, trailing bytes, an
 * unknown type, deep nesting in an extra field), HELLOs offering NIXL (agent metadata and the
 * region table), valid and broken. Run by `make kvx-corpus`; its output is
 * committed.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../../kv_transfer/kvx_msg.h"

static const char *dir;

static void put(const char *name, const void *b, size_t n)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n) { perror(path); return; }
    fclose(f);
}

static size_t enc(const tdm__kvx_msg *m, uint8_t *buf)
{
    size_t len = 0;
    if (tdm__kvx_msg_encode(m, buf, TDM__KVX_MAX_HEADER, &len)) fprintf(stderr, "encode failed\n");
    return len;
}

int main(int argc, char **argv)
{
    dir = argc > 1 ? argv[1] : "tests/fuzz/corpus/kvx_msg";
    static const char *names[] = { "", "hello", "hello_ack", "xfer_req", "data", "credit", "done",
                                   "fail", "cancel", "cancel_ack", "ping", "bye" };
    uint8_t buf[TDM__KVX_MAX_HEADER];
    tdm__kvx_msg m;
    char name[64];
    for (uint32_t t = 1; t <= TDM__KVX_MSG_MAX; t++) {
        tdm__kvx_msg_init(&m, t);
        snprintf(m.hello.engine_id, sizeof(m.hello.engine_id), "prefill-0");
        m.hello.role = 1;
        tdm_kv_layout_init(&m.hello.layout, TDM_KV_LAYOUT_VLLM_NHD, 32, 1024, 16, 8, 128, TDM_DTYPE_FP16);
        m.hello.transports = 3;
        snprintf(m.hello.host_id, sizeof(m.hello.host_id), "host/1234abcd");
        if (t == TDM__KVX_HELLO) {
            snprintf(m.hello.shm_name, sizeof(m.hello.shm_name), "/tdm-kvx-4026531836-4242-tx0-0123456789abcdef");
            m.hello.shm_size = 2 * 8 * 8388608ull;
            m.hello.slot_bytes = 8388608;
        }
        m.rid = 123456789012ull;
        m.xid = 1;
        m.mode = 1;
        m.num_blocks = 12;
        m.num_skip = 2;
        m.num_tokens = 190;
        m.layer_begin = 0;
        m.layer_end = 32;
        m.block_begin = 2;
        m.block_count = 4;
        m.nbytes = t == TDM__KVX_DATA ? 32ull * 4 * 65536 : 1000;
        m.slot = t == TDM__KVX_CREDIT ? 3 : TDM__KVX_NO_SLOT;
        m.to_side = 2;
        m.status = t == TDM__KVX_FAIL ? TDM_E_TIMEOUT : 0;
        snprintf(m.reason, sizeof(m.reason), "%s", t == TDM__KVX_FAIL ? "no progress" : "");
        m.time_ms = 1700000000000ull;
        size_t n = enc(&m, buf);
        snprintf(name, sizeof(name), "valid_%s", names[t]);
        put(name, buf, n);
        if (t == TDM__KVX_HELLO) {
            put("broken_hello_truncated", buf, n / 2);
            snprintf(m.hello.kv_name, sizeof(m.hello.kv_name), "/tdm-kvx-4026531836-4242-kv-fedcba9876543210");
            m.hello.kv_layers = 32;
            m.hello.kv_size = 32ull << 26;
            for (uint32_t l = 0; l < 32; l++) m.hello.kv_off[l] = (uint64_t)l << 26;
            put("valid_hello_shared_kv", buf, enc(&m, buf));
            m.hello.kv_off[3] = m.hello.kv_size;   /* beyond the segment */
            put("broken_hello_kv_offset", buf, enc(&m, buf));
            /* an fp8 cache with KV scales: per tensor, then per head (a smaller model) */
            static float ks[256], vs[256];
            for (int i = 0; i < 256; i++) { ks[i] = 0.01f * (float)(i + 1); vs[i] = 0.02f * (float)(i + 1); }
            m.hello.kv_name[0] = '\0';
            m.hello.kv_size = 0;
            m.hello.kv_layers = 0;
            tdm_kv_layout_init(&m.hello.layout, TDM_KV_LAYOUT_VLLM_NHD, 32, 1024, 16, 8, 128, TDM_DTYPE_FP8_E4M3);
            m.hello.scale_kind = TDM_KV_SCALE_TENSOR;
            m.hello.scale_count = 1;
            m.hello.k_scales = ks;
            m.hello.v_scales = vs;
            put("valid_hello_kv_scales", buf, enc(&m, buf));
            ks[7] = NAN;
            put("broken_hello_kv_scale_nan", buf, enc(&m, buf));
            ks[7] = 0.0f;
            put("broken_hello_kv_scale_zero", buf, enc(&m, buf));
            ks[7] = 0.08f;
            m.hello.scale_count = 2;   /* twice the floats the layout calls for */
            put("broken_hello_kv_scale_count", buf, enc(&m, buf));
            tdm_kv_layout_init(&m.hello.layout, TDM_KV_LAYOUT_VLLM_NHD, 4, 64, 16, 8, 64, TDM_DTYPE_FP8_E4M3);
            m.hello.scale_kind = TDM_KV_SCALE_HEAD;
            m.hello.scale_count = 8;
            put("valid_hello_kv_scales_head", buf, enc(&m, buf));
            /* hostile shared-memory offers: foreign names, wrong tags, sizes that are not slots */
            m.hello.scale_kind = TDM_KV_SCALE_NONE;
            m.hello.scale_count = 0;
            static const char *foreign[] = { "/victim", "/tdm-kvx-1-0-abc", "/tdm-kvx-1-2-kv-0123456789abcdef",
                                             "/tdm-kvx-1-2-tx0-0123456789ABCDEF", "/tdm-kvx-1-2-tx0-0123456789abcdef0",
                                             "/../dev/shm/tdm-kvx-1-2-tx0-0123456789abcdef" };
            for (int i = 0; i < 6; i++) {
                snprintf(m.hello.shm_name, sizeof(m.hello.shm_name), "%s", foreign[i]);
                snprintf(name, sizeof(name), "broken_hello_shm_name_%d", i);
                put(name, buf, enc(&m, buf));
            }
            snprintf(m.hello.shm_name, sizeof(m.hello.shm_name), "/tdm-kvx-4026531836-4242-tx7-0123456789abcdef");
            m.hello.shm_size = 1048576 + 1;
            m.hello.slot_bytes = 65536;
            put("broken_hello_shm_size_not_slots", buf, enc(&m, buf));
            m.hello.shm_size = 1025ull * 65536;
            put("broken_hello_shm_too_many_slots", buf, enc(&m, buf));
            m.hello.shm_size = 1024ull * 65536;
            put("valid_hello_shm_max_slots", buf, enc(&m, buf));
            m.hello.shm_name[0] = '\0';
            m.hello.shm_size = 0;
            m.hello.slot_bytes = 0;
            snprintf(m.hello.kv_name, sizeof(m.hello.kv_name), "/tdm-kvx-4026531836-4242-tx1-0123456789abcdef");
            m.hello.kv_layers = 4;
            m.hello.kv_size = 1 << 20;
            for (uint32_t l = 0; l < 4; l++) m.hello.kv_off[l] = (uint64_t)l << 18;
            put("broken_hello_kv_name_tx_tag", buf, enc(&m, buf));
            snprintf(m.hello.kv_name, sizeof(m.hello.kv_name), "/dev-shm-victim");
            put("broken_hello_kv_name_foreign", buf, enc(&m, buf));
            m.hello.kv_name[0] = '\0';
            m.hello.kv_layers = 0;
            m.hello.kv_size = 0;
        }
        if (t == TDM__KVX_HELLO_ACK) {
            /* the server names its own segment for the chunks it sends */
            snprintf(m.hello.shm_name, sizeof(m.hello.shm_name), "/tdm-kvx-4026531836-777-tx3-00000000deadbeef");
            m.hello.shm_size = 8 * 8388608ull;
            m.hello.slot_bytes = 8388608;
            put("valid_hello_ack_shm", buf, enc(&m, buf));
            snprintf(m.hello.shm_name, sizeof(m.hello.shm_name), "/psm_victim");
            put("broken_hello_ack_shm_name", buf, enc(&m, buf));
        }
        if (t == TDM__KVX_DATA) {
            buf[n++] = 0xc0;
            put("broken_data_trailing_byte", buf, n);
            m.layer_begin = 5;
            m.layer_end = 5;
            n = enc(&m, buf);
            put("broken_data_empty_layers", buf, n);
        }
        if (t == TDM__KVX_PING) {
            m.version = 9;
            n = enc(&m, buf);
            put("broken_ping_version", buf, n);
        }
    }
    /* NIXL offers: a valid one, then one broken field at a time */
    {
        static uint8_t md[456], rgn[8 * (TDM__KVX_NIXL_RGN_HDR + 4)], big[4096];
        for (size_t i = 0; i < sizeof(md); i++) md[i] = (uint8_t)(i * 31 + 7);
        uint64_t v[TDM__KVX_NIXL_RGN_HDR + 4] = { 0, 0, 0x7f0000000000ull, 8388608, 8,
                                                  0x7f1000000000ull, 0x7f1100000000ull, 0x7f1200000000ull,
                                                  0x7f1300000000ull };
        for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
            for (int b = 0; b < 8; b++) rgn[8 * i + (size_t)b] = (uint8_t)(v[i] >> (8 * b));
        tdm__kvx_msg_init(&m, TDM__KVX_HELLO);
        snprintf(m.hello.engine_id, sizeof(m.hello.engine_id), "decode-0");
        m.hello.role = 2;
        tdm_kv_layout_init(&m.hello.layout, TDM_KV_LAYOUT_VLLM_NHD, 4, 64, 16, 8, 64, TDM_DTYPE_FP16);
        m.hello.transports = 9;
        snprintf(m.hello.host_id, sizeof(m.hello.host_id), "host/1234abcd");
        snprintf(m.hello.nixl_agent, sizeof(m.hello.nixl_agent), "decode-0-4242-abc");
        m.hello.nixl_md = md;
        m.hello.nixl_md_len = sizeof(md);
        m.hello.nixl_rgn = rgn;
        m.hello.nixl_rgn_len = sizeof(rgn);
        size_t len = 0;
#define NIXL_PUT(nm)                                                                         \
        do {                                                                                 \
            if (tdm__kvx_msg_encode(&m, big, sizeof(big), &len)) fprintf(stderr, "encode failed\n"); \
            else put(nm, big, len);                                                          \
        } while (0)
        NIXL_PUT("valid_hello_nixl");
        m.type = TDM__KVX_HELLO_ACK;
        NIXL_PUT("valid_hello_ack_nixl");
        m.type = TDM__KVX_HELLO;
        m.hello.nixl_rgn_len -= 8;   /* one layer base missing */
        NIXL_PUT("broken_hello_nixl_regions_short");
        m.hello.nixl_rgn_len += 8;
        rgn[32] = 0;   /* zero ring slots */
        NIXL_PUT("broken_hello_nixl_slots_zero");
        rgn[32] = 8;
        memset(rgn + 8 * TDM__KVX_NIXL_RGN_HDR, 0, 8);   /* a NULL layer base */
        NIXL_PUT("broken_hello_nixl_null_base");
        m.hello.nixl_rgn_len = 0;
        m.hello.nixl_md_len = 0;
        NIXL_PUT("broken_hello_nixl_no_metadata");
#undef NIXL_PUT
    }
    /* an unknown type; an extra field nested 20 deep; a map instead of an array */
    const uint8_t unknown[] = { 0x93, 0x01, 0x33, 0x00 };
    put("broken_unknown_type", unknown, sizeof(unknown));
    uint8_t deep[64] = { 0x94, 0x01, TDM__KVX_PING, 0x05 };
    size_t n = 4;
    for (int i = 0; i < 20; i++) deep[n++] = 0x91;
    deep[n++] = 0x00;
    put("broken_deep_extra_field", deep, n);
    const uint8_t map[] = { 0x82, 0xa1, 'v', 0x01, 0xa1, 't', 0x0a };
    put("broken_map", map, sizeof(map));
    return 0;
}
