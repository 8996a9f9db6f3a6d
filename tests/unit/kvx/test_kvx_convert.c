/*
 * test_kvx_convert.c -- transfers whose receiver converts while unpacking: a tensor-parallel
 * head split (the receiver holds a slice of the sender's heads) combined with a dtype change
 * (fp16 to fp32 and to bf16), every element checked against the kernels' own conversion;
 * block-size differences (re-blocking by tokens, also while streaming) checked token by token;
 * and the differences that are refused.
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

/* A prefill engine p (layout lp, seed 1) listening on a fresh endpoint `tag` (written to ep)
 * and a decode engine d (layout ld, seed 2, heads from head_off of the sender's on). */
static void two_engines(eng *p, eng *d, char ep[128], const char *tag, const tdm_kv_layout *lp,
                        const tdm_kv_layout *ld, uint32_t head_off)
{
    t_ipc(ep, 128, tag);
    tdm_kvx_config c;
    t_config(&c, "p", TDM_KVX_ROLE_PREFILL, ep);
    t_engine_off(p, &c, lp, 1, 0);
    t_config(&c, "d", TDM_KVX_ROLE_DECODE, NULL);
    t_engine_off(d, &c, ld, 2, head_off);
}

/* Request `req`: p sends blocks src[0..ns) (the first `ready` of them ready) and d receives
 * into dst[0..nd), skipping `skip`; *hs and *hr get the handles. */
static void send_and_recv(eng *p, eng *d, uint32_t peer, uint64_t req, const uint32_t *src, uint32_t ns,
                          uint32_t ready, const uint32_t *dst, uint32_t nd, uint32_t skip, uint64_t *hs,
                          uint64_t *hr)
{
    tdm_kvx_send_desc sd;
    t_send_desc(&sd, req, src, ns, ready);
    assert_int_equal(tdm_kvx_send(p->kvx, &sd, hs), TDM_OK);
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, peer, req, dst, nd, skip);
    assert_int_equal(tdm_kvx_recv(d->kvx, &rd, hr), TDM_OK);
}

static void run(uint32_t dst_dtype, uint32_t dst_heads, uint32_t head_off)
{
    char ep[128];
    tdm_kv_layout lp, ld;
    eng p, d;
    t_layout(&lp, 1, L, NB, BS, 4, D, TDM_DTYPE_FP16);
    t_layout(&ld, 3, L, NB, BS, dst_heads, D, dst_dtype);
    two_engines(&p, &d, ep, "conv", &lp, &ld, head_off);
    fill_fp16(&p, 5);
    uint32_t peer;
    int rc = tdm_kvx_connect(d.kvx, ep, NULL, &peer);
    if (rc) fail_msg("connect: %s", tdm_kvx_errmsg(d.kvx));
    uint32_t n = 9, src[NB], dst[NB];
    t_ids(src, n, NB, 3);
    t_ids(dst, n, NB, 4);
    uint64_t hs, hr;
    send_and_recv(&p, &d, peer, 1, src, n, n, dst, n, 0, &hs, &hr);
    t_wait_done(&d);
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
    tdm_kv_layout lp, ld;
    eng p, d;
    t_layout(&lp, 1, L, NB, BS, 4, D, TDM_DTYPE_FP16);
    t_layout(&ld, 1, L, NB, BS, 2, D, TDM_DTYPE_FP16);
    two_engines(&p, &d, ep, "conv-bad", &lp, &ld, 3);   /* heads [3,5) but the sender has [0,4) */
    uint32_t peer;
    assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &peer), TDM_E_LAYOUT);
    assert_non_null(strstr(tdm_kvx_errmsg(d.kvx), "heads"));
    t_free(&d);
    t_layout(&ld, 1, L, NB, BS, 4, D * 2, TDM_DTYPE_FP16);
    tdm_kvx_config c;
    t_config(&c, "d", TDM_KVX_ROLE_DECODE, NULL);
    t_engine_off(&d, &c, &ld, 2, 0);
    assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &peer), TDM_E_LAYOUT);
    assert_non_null(strstr(tdm_kvx_errmsg(d.kvx), "head_dim"));
    t_free(&d);
    t_free(&p);
}

/* Sender blocks of sbs tokens, receiver blocks of dbs: tokens [skip*dbs, tokens) move, token t
 * of the sequence being at (src[t / sbs], t % sbs) and (dst[t / dbs], t % dbs). */
static void reblock(uint32_t sbs, uint32_t dbs, uint32_t tokens, uint32_t skip, int streaming)
{
    char ep[128];
    tdm_kv_layout lp, ld;
    eng p, d;
    t_layout(&lp, 1, L, NB, sbs, 2, D, TDM_DTYPE_FP16);
    t_layout(&ld, 3, L, NB, dbs, 2, D, TDM_DTYPE_FP16);
    two_engines(&p, &d, ep, "reblock", &lp, &ld, 0);
    uint32_t peer;
    assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &peer), TDM_OK);
    uint32_t ns = (tokens + sbs - 1) / sbs, nd = (tokens + dbs - 1) / dbs, src[NB], dst[NB];
    t_ids(src, ns, NB, 8);
    t_ids(dst, nd, NB, 9);
    uint8_t tail[64];
    size_t row = D * 2;
    /* the sender moves what it holds, up to our capacity */
    tokens = ns * sbs < nd * dbs ? ns * sbs : nd * dbs;
    uint32_t last_t = tokens % dbs;   /* first untouched slot of the last dst block, if any */
    if (last_t) memcpy(tail, t_row(&d, 0, 1, dst[nd - 1], last_t, 0), row);
    uint64_t hs, hr;
    send_and_recv(&p, &d, peer, 5, src, ns, streaming ? 0 : ns, dst, nd, skip, &hs, &hr);
    if (streaming) {
        for (uint32_t r = 1; r < ns; r += 3) {
            assert_int_equal(tdm_kvx_send_ready(p.kvx, hs, 0, L, r), TDM_OK);
            t_sleep_ms(2);
        }
        assert_int_equal(tdm_kvx_send_ready(p.kvx, hs, 0, L, ns), TDM_OK);
    }
    t_wait_done(&d);
    assert_int_equal(t_wait(&p).type, TDM_KVX_EV_DONE);
    for (uint32_t l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++)
            for (uint32_t t = skip * dbs; t < tokens; t++)
                for (uint32_t h = 0; h < 2; h++)
                    if (memcmp(t_row(&p, l, kv, src[t / sbs], t % sbs, h), t_row(&d, l, kv, dst[t / dbs], t % dbs, h), row))
                        fail_msg("layer %u kv %d token %u head %u differs", l, kv, t, h);
    if (last_t) assert_memory_equal(tail, t_row(&d, 0, 1, dst[nd - 1], last_t, 0), row);
    t_free(&d);
    t_free(&p);
}

static void reblock__small_sender_blocks_into_large(void **state) { (void)state; reblock(4, 8, 37, 1, 0); }
static void reblock__large_sender_blocks_into_small(void **state) { (void)state; reblock(8, 2, 45, 4, 0); }
static void reblock__coprime_sizes_while_streaming(void **state) { (void)state; reblock(4, 6, 50, 2, 1); }

static void reblock__unaligned_prefix_skip_fails_cleanly(void **state)
{
    (void)state;
    char ep[128];
    tdm_kv_layout lp, ld;
    eng p, d;
    t_layout(&lp, 1, L, NB, 8, 2, D, TDM_DTYPE_FP16);
    t_layout(&ld, 1, L, NB, 4, 2, D, TDM_DTYPE_FP16);
    two_engines(&p, &d, ep, "reblock-bad", &lp, &ld, 0);
    uint32_t peer, src[4] = { 1, 2, 3, 4 }, dst[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &peer), TDM_OK);
    uint64_t hs, hr;
    send_and_recv(&p, &d, peer, 1, src, 4, 4, dst, 8, 1, &hs, &hr);   /* skip 4 tokens: half a sender block */
    tdm_kvx_event ev = t_wait(&d);
    assert_int_equal(ev.type, TDM_KVX_EV_FAILED);
    assert_int_equal(ev.status, TDM_E_RANGE);
    assert_int_equal(t_wait(&p).type, TDM_KVX_EV_FAILED);
    assert_int_equal(t_stats(&d).num_reserved_blocks, 0);
    /* 32 tokens held by the sender cannot fill 9 blocks of 4 */
    uint32_t dst9[9] = { 1, 2, 3, 4, 5, 6, 7, 8, 9 };
    send_and_recv(&p, &d, peer, 2, src, 4, 4, dst9, 9, 0, &hs, &hr);
    ev = t_wait(&d);
    assert_int_equal(ev.type, TDM_KVX_EV_FAILED);
    assert_non_null(strstr(ev.reason, "tokens"));
    assert_int_equal(t_wait(&p).type, TDM_KVX_EV_FAILED);
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
        cmocka_unit_test(reblock__small_sender_blocks_into_large),
        cmocka_unit_test(reblock__large_sender_blocks_into_small),
        cmocka_unit_test(reblock__coprime_sizes_while_streaming),
        cmocka_unit_test(reblock__unaligned_prefix_skip_fails_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
