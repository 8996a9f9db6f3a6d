/*
 * test_kvx_convert.c -- transfers whose receiver converts while unpacking: a tensor-parallel
 * head split (the receiver holds a slice of the sender's heads) combined with a dtype change
 * (fp16 to fp32 and to bf16), every element checked against the kernels' own conversion;
 * and a block-size difference, which the handshake refuses with the reason.
 */
#include "kvx_testutil.h"

#define L 3
#define NB 32
#define BS 4
#define D 8

/* Fill the sender's fp16 cache with finite values. */
static void fill_fp16(eng *e, uint64_t seed)
{
    uint64_t s = seed | 1;
    size_t n = e->layer_bytes * e->lay.num_layers / 2;
    uint16_t *p = (uint16_t *)e->mem;
    for (size_t i = 0; i < n; i++) p[i] = tdm_fp16_from_float((float)((int)(t_rand(&s) % 2001) - 1000) / 64.0f);
}

static void check_converted(eng *p, const uint32_t *src, eng *d, const uint32_t *dst, uint32_t n, uint32_t head_off)
{
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t i = 0; i < n; i++)
            for (int kv = 0; kv < 2; kv++)
                for (uint32_t t = 0; t < BS; t++)
                    for (uint32_t h = 0; h < d->lay.num_kv_heads; h++) {
                        const uint16_t *a = (const uint16_t *)t_row(p, l, kv, src[i], t, h + head_off);
                        const uint8_t *b = t_row(d, l, kv, dst[i], t, h);
                        for (uint32_t x = 0; x < D; x++) {
                            float want = tdm_fp16_to_float(a[x]);
                            float got;
                            if (d->lay.dtype == TDM_DTYPE_FP32) memcpy(&got, b + 4 * x, 4);
                            else if (d->lay.dtype == TDM_DTYPE_FP16) {
                                uint16_t v;
                                memcpy(&v, b + 2 * x, 2);
                                got = tdm_fp16_to_float(v);
                            } else {
                                uint16_t v;
                                memcpy(&v, b + 2 * x, 2);
                                got = tdm_bf16_to_float(v);
                                want = tdm_bf16_to_float(tdm_bf16_from_float(want));
                            }
                            if (got != want) fail_msg("layer %u block %u kv %d t %u h %u d %u: %g != %g", l, i, kv, t, h, x, got, want);
                        }
                    }
}

static void run(uint32_t dst_dtype, uint32_t dst_heads, uint32_t head_off)
{
    char ep[128];
    t_ipc(ep, sizeof(ep), "conv");
    tdm_kvx_config c;
    tdm_kv_layout lp, ld;
    eng p, d;
    t_config(&c, "p", TDM_KVX_ROLE_PREFILL, ep);
    t_layout(&lp, 1, L, NB, BS, 4, D, TDM_DTYPE_FP16);
    t_engine_off(&p, &c, &lp, 1, 0);
    fill_fp16(&p, 5);
    t_config(&c, "d", TDM_KVX_ROLE_DECODE, NULL);
    t_layout(&ld, 3, L, NB, BS, dst_heads, D, dst_dtype);
    t_engine_off(&d, &c, &ld, 2, head_off);
    uint32_t peer;
    int rc = tdm_kvx_connect(d.kvx, ep, NULL, &peer);
    if (rc) fail_msg("connect: %s", tdm_kvx_errmsg(d.kvx));
    uint32_t n = 9, src[NB], dst[NB];
    t_ids(src, n, NB, 3);
    t_ids(dst, n, NB, 4);
    tdm_kvx_send_desc sd;
    tdm_kvx_send_desc_init(&sd);
    sd.request_id = 1;
    sd.num_blocks = n;
    sd.block_ids = src;
    sd.num_blocks_ready = n;
    uint64_t h;
    assert_int_equal(tdm_kvx_send(p.kvx, &sd, &h), TDM_OK);
    tdm_kvx_recv_desc rd;
    tdm_kvx_recv_desc_init(&rd);
    rd.peer = peer;
    rd.request_id = 1;
    rd.num_blocks = n;
    rd.block_ids = dst;
    assert_int_equal(tdm_kvx_recv(d.kvx, &rd, &h), TDM_OK);
    tdm_kvx_event ev = t_wait(&d);
    if (ev.type != TDM_KVX_EV_DONE) fail_msg("event %u: %s", ev.type, ev.reason);
    check_converted(&p, src, &d, dst, n, head_off);
    assert_int_equal(t_wait(&p).type, TDM_KVX_EV_DONE);
    t_free(&d);
    t_free(&p);
}

static void convert__head_slice_to_fp32(void **state) { (void)state; run(TDM_DTYPE_FP32, 2, 2); }
static void convert__all_heads_to_bf16(void **state) { (void)state; run(TDM_DTYPE_BF16, 4, 0); }
static void convert__head_slice_same_dtype(void **state) { (void)state; run(TDM_DTYPE_FP16, 1, 3); }

static void convert__heads_outside_the_sender_are_refused(void **state)
{
    (void)state;
    char ep[128];
    t_ipc(ep, sizeof(ep), "conv-bad");
    tdm_kvx_config c;
    tdm_kv_layout lp, ld;
    eng p, d;
    t_config(&c, "p", TDM_KVX_ROLE_PREFILL, ep);
    t_layout(&lp, 1, L, NB, BS, 4, D, TDM_DTYPE_FP16);
    t_engine_off(&p, &c, &lp, 1, 0);
    t_config(&c, "d", TDM_KVX_ROLE_DECODE, NULL);
    t_layout(&ld, 1, L, NB, BS, 2, D, TDM_DTYPE_FP16);
    t_engine_off(&d, &c, &ld, 2, 3);   /* heads [3,5) but the sender has [0,4) */
    uint32_t peer;
    assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &peer), TDM_E_LAYOUT);
    assert_non_null(strstr(tdm_kvx_errmsg(d.kvx), "heads"));
    t_free(&d);
    t_layout(&ld, 1, L, NB, BS * 2, 4, D, TDM_DTYPE_FP16);
    t_engine_off(&d, &c, &ld, 2, 0);
    assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &peer), TDM_E_LAYOUT);
    assert_non_null(strstr(tdm_kvx_errmsg(d.kvx), "block_size"));
    t_free(&d);
    t_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(convert__head_slice_to_fp32),
        cmocka_unit_test(convert__all_heads_to_bf16),
        cmocka_unit_test(convert__head_slice_same_dtype),
        cmocka_unit_test(convert__heads_outside_the_sender_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
