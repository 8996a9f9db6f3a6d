/*
 * test_kvx_scales.c -- fp8 KV quantization scales across the transfer engine: two engines in
 * one process over ipc, one declaring per-tensor or per-head scales with
 * tdm_kvx_set_kv_scales. An fp8 sender with per-tensor scales into an fp16 receiver (every
 * value = decode(fp8) * scale); per-head scales into an fp8 receiver holding a tensor-parallel
 * slice with scales of its own (compared with the kernels' reference conversion of the same
 * packed bytes); equal dtypes and scales keep the bytes (and same-host direct reads, which
 * different scales turn off); bad arguments, calls after a handshake, and forged handshakes
 * with bad scales from a raw ZeroMQ socket (both directions) are refused with messages. Also
 * the wire form: round trip at the size limit, unchanged HELLO without scales, size bounds.
 */
#include <math.h>
#include <pthread.h>
#include <zmq.h>

#include "kvx_testutil.h"
#include "../../../kv_transfer/kvx_internal.h"

#define L 3
#define NB 16
#define BS 4
#define D 8
#define H 4

/* Every (layer l, block index i, K/V kv, token t, head h) of n blocks of `heads` heads. */
#define FOR_EACH_ROW(n, heads)                                                                \
    for (uint32_t l = 0; l < L; l++)                                                          \
        for (uint32_t i = 0; i < (n); i++)                                                    \
            for (int kv = 0; kv < 2; kv++)                                                    \
                for (uint32_t t = 0; t < BS; t++)                                             \
                    for (uint32_t h = 0; h < (heads); h++)

/* Random fp8 bytes without NaN (0x7f / 0xff become 1.0). */
static void fill_fp8(eng *e, uint64_t seed)
{
    uint64_t s = seed | 1;
    size_t n = e->layer_bytes * e->lay.num_layers;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)t_rand(&s);
        e->mem[i] = (b & 0x7f) == 0x7f ? 0x38 : b;
    }
}

static void make(eng *e, const char *id, uint32_t role, const char *ep, uint32_t dtype, uint32_t heads,
                 uint32_t head_off, uint64_t seed, uint32_t transports)
{
    tdm_kvx_config c;
    t_config(&c, id, role, ep);
    c.transports = transports;
    tdm_kv_layout l;
    t_layout(&l, 1, L, NB, BS, heads, D, dtype);
    t_engine_off(e, &c, &l, seed, head_off);
    if (dtype == TDM_DTYPE_FP8_E4M3) fill_fp8(e, seed);
}

/* An fp8 prefill engine p (H heads, seed p_seed) on a fresh endpoint `tag` (written to ep) and
 * a decode engine d (d_dtype, d_heads from head d_off of the sender's, seed d_seed), over ZeroMQ. */
static void make_pair(eng *p, eng *d, char ep[128], const char *tag, uint64_t p_seed, uint32_t d_dtype,
                      uint32_t d_heads, uint32_t d_off, uint64_t d_seed)
{
    t_ipc(ep, 128, tag);
    make(p, "p", TDM_KVX_ROLE_PREFILL, ep, TDM_DTYPE_FP8_E4M3, H, 0, p_seed, TDM_KVX_TRANSPORT_ZMQ);
    make(d, "d", TDM_KVX_ROLE_DECODE, NULL, d_dtype, d_heads, d_off, d_seed, TDM_KVX_TRANSPORT_ZMQ);
}

static uint32_t connect_to(eng *d, const char *ep)
{
    uint32_t peer;
    int rc = tdm_kvx_connect(d->kvx, ep, NULL, &peer);
    if (rc) fail_msg("connect: %s", tdm_kvx_errmsg(d->kvx));
    return peer;
}

static void transfer(eng *p, eng *d, uint32_t peer, uint64_t rid, const uint32_t *src, const uint32_t *dst, uint32_t n)
{
    tdm_kvx_send_desc sd;
    t_send_desc(&sd, rid, src, n, n);
    uint64_t h;
    assert_int_equal(tdm_kvx_send(p->kvx, &sd, &h), TDM_OK);
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, peer, rid, dst, n, 0);
    assert_int_equal(tdm_kvx_recv(d->kvx, &rd, &h), TDM_OK);
    t_wait_done(d);
    assert_int_equal(t_wait(p).type, TDM_KVX_EV_DONE);
}

/* transfer() of n blocks between fresh scattered ids: src (seed), dst (seed + 1). */
static void transfer_scattered(eng *p, eng *d, uint32_t peer, uint64_t rid, uint32_t *src, uint32_t *dst,
                               uint32_t n, uint64_t seed)
{
    t_ids(src, n, NB, seed);
    t_ids(dst, n, NB, seed + 1);
    transfer(p, d, peer, rid, src, dst, n);
}

/* Whether the receiver's peer found the sender's effective scales equal to its own. */
static int scales_same(const eng *d, uint32_t peer)
{
    return d->kvx->peers[peer & 0xffff].scales_same;
}

/* Conversion options from scales (kind, K, V, floats per layer) to scales of the same kind. */
static void scale_opts(tdm_kv_convert_opts *o, uint32_t kind, const float *sk, const float *sv,
                       uint32_t s_stride, const float *dk, const float *dv, uint32_t d_stride)
{
    tdm_kv_convert_opts_init(o);
    o->src_scale_kind = o->dst_scale_kind = kind;
    o->src_k_scale = sk; o->src_v_scale = sv; o->src_scale_layer_stride = s_stride;
    o->dst_k_scale = dk; o->dst_v_scale = dv; o->dst_scale_layer_stride = d_stride;
}

/* A cache without an engine, for reference conversions. */
static void ref_cache(eng *r, const tdm_kv_layout *lay)
{
    memset(r, 0, sizeof(*r));
    r->lay = *lay;
    r->layer_bytes = (size_t)2 * lay->num_blocks * lay->block_size * lay->num_kv_heads * lay->head_dim *
                     t_esize(lay->dtype);
    r->mem = calloc(lay->num_layers, r->layer_bytes);
    assert_non_null(r->mem);
    for (uint32_t l = 0; l < lay->num_layers; l++) r->bases[l] = r->mem + l * r->layer_bytes;
}

/* The kernels' conversion of the sender's packed blocks into r (blocks dst). */
static void ref_convert(const eng *p, const uint32_t *src, eng *r, const uint32_t *dst, uint32_t n,
                        const tdm_kv_convert_opts *o)
{
    size_t sz;
    assert_int_equal(tdm_kv_packed_size(&p->lay, n, 0, L, &sz), TDM_OK);
    uint8_t *buf = malloc(sz);
    assert_non_null(buf);
    assert_int_equal(tdm_kv_pack(&p->lay, p->bases, src, n, 0, L, buf, sz), TDM_OK);
    assert_int_equal(tdm_kv_unpack_convert(&p->lay, buf, sz, n, n * BS, &r->lay, r->bases, dst, n, o), TDM_OK);
    free(buf);
}

/* (a) fp8 sender with per-tensor scales -> fp16 receiver. */
static void scales__fp8_tensor_scales_into_fp16(void **state)
{
    (void)state;
    char ep[128];
    eng p, d;
    make_pair(&p, &d, ep, "sc-a", 1, TDM_DTYPE_FP16, H, 0, 2);
    float ks[L] = { 0.5f, 1.75f, 0.03125f }, vs[L] = { 3.0f, 0.25f, 1.5f };
    assert_int_equal(tdm_kvx_set_kv_scales(p.kvx, TDM_KV_SCALE_TENSOR, ks, vs, 1), TDM_OK);
    /* a failing call afterwards changes nothing (the transfer below uses ks / vs) */
    float bad[L] = { 1.0f, NAN, 1.0f };
    assert_int_equal(tdm_kvx_set_kv_scales(p.kvx, TDM_KV_SCALE_TENSOR, bad, vs, 1), TDM_E_INVAL);
    assert_non_null(strstr(tdm_kvx_errmsg(p.kvx), "k_scales[1]"));
    uint32_t peer = connect_to(&d, ep);
    uint32_t n = 7, src[NB], dst[NB];
    transfer_scattered(&p, &d, peer, 1, src, dst, n, 3);
    uint32_t scaled = 0;
    FOR_EACH_ROW(n, H) {
        const uint8_t *a = t_row(&p, l, kv, src[i], t, h);
        const uint16_t *b = (const uint16_t *)t_row(&d, l, kv, dst[i], t, h);
        for (uint32_t x = 0; x < D; x++) {
            float want = tdm_fp8_e4m3_to_float(a[x]) * (kv ? vs[l] : ks[l]);
            float got = tdm_fp16_to_float(b[x]);
            if (got != tdm_fp16_to_float(tdm_fp16_from_float(want)))
                fail_msg("layer %u block %u kv %d t %u h %u d %u: %g, want %g", l, i, kv, t, h, x,
                         (double)got, (double)want);
            if (got != tdm_fp8_e4m3_to_float(a[x])) scaled++;
        }
    }
    assert_true(scaled > 0);
    /* the scales are fixed once a handshake happened, on both ends */
    assert_int_equal(tdm_kvx_set_kv_scales(p.kvx, TDM_KV_SCALE_TENSOR, ks, ks, 1), TDM_E_STATE);
    assert_non_null(strstr(tdm_kvx_errmsg(p.kvx), "handshake"));
    assert_int_equal(tdm_kvx_set_kv_scales(d.kvx, TDM_KV_SCALE_NONE, NULL, NULL, 0), TDM_E_STATE);
    assert_true(p.kvx->scales[1] == ks[1] && p.kvx->scales[L + 1] == vs[1]);
    t_free(&d);
    t_free(&p);
}

/* (b) per-head scales, fp8 -> fp8 tensor-parallel slice (heads [2,4)) with its own scales. */
static void scales__fp8_head_scales_requantized_into_a_slice(void **state)
{
    (void)state;
    char ep[128];
    eng p, d;
    make_pair(&p, &d, ep, "sc-b", 5, TDM_DTYPE_FP8_E4M3, 2, 2, 6);
    float pk[L * H], pv[L * H], dk[L * 2], dv[L * 2];
    for (uint32_t i = 0; i < L * H; i++) { pk[i] = 0.25f + 0.5f * (float)i; pv[i] = 4.0f / (float)(i + 1); }
    for (uint32_t i = 0; i < L * 2; i++) { dk[i] = 1.5f + (float)i; dv[i] = 0.125f * (float)(i + 1); }
    assert_int_equal(tdm_kvx_set_kv_scales(p.kvx, TDM_KV_SCALE_HEAD, pk, pv, H), TDM_OK);
    assert_int_equal(tdm_kvx_set_kv_scales(d.kvx, TDM_KV_SCALE_HEAD, dk, dv, 2), TDM_OK);
    uint32_t peer = connect_to(&d, ep);
    assert_int_equal(scales_same(&d, peer), 0);
    uint32_t n = 9, src[NB], dst[NB];
    transfer_scattered(&p, &d, peer, 2, src, dst, n, 7);
    /* the reference: the kernels' conversion with the sender's heads 2, 3 and both scales */
    eng r;
    ref_cache(&r, &d.lay);
    memcpy(r.mem, d.mem, d.layer_bytes * L);   /* untouched blocks alike */
    tdm_kv_convert_opts o;
    scale_opts(&o, TDM_KV_SCALE_HEAD, pk, pv, H, dk, dv, 2);
    o.src_head_offset = 2;
    o.num_heads = 2;
    ref_convert(&p, src, &r, dst, n, &o);
    assert_int_equal(t_compare(&r, dst, &d, dst, 0, n), 0);
    /* and element by element: fp8(decode(x) * sender scale / receiver scale) */
    uint32_t changed = 0;
    FOR_EACH_ROW(n, 2) {
        const uint8_t *a = t_row(&p, l, kv, src[i], t, h + 2);
        const uint8_t *b = t_row(&d, l, kv, dst[i], t, h);
        float ss = kv ? pv[l * H + 2 + h] : pk[l * H + 2 + h];
        float ds = kv ? dv[l * 2 + h] : dk[l * 2 + h];
        for (uint32_t x = 0; x < D; x++) {
            uint8_t want = tdm_fp8_e4m3_from_float(tdm_fp8_e4m3_to_float(a[x]) * ss / ds);
            if (b[x] != want)
                fail_msg("layer %u block %u kv %d h %u: %#x, want %#x", l, i, kv, h, b[x], want);
            if (b[x] != a[x]) changed++;
        }
    }
    assert_true(changed > 0);
    free(r.mem);
    t_free(&d);
    t_free(&p);
}

/* (c) equal dtype and equal scales: the bytes arrive unchanged (NaNs included). */
static void scales__equal_scales_keep_the_bytes(void **state)
{
    (void)state;
    char ep[128];
    eng p, d;
    make_pair(&p, &d, ep, "sc-c", 9, TDM_DTYPE_FP8_E4M3, H, 0, 10);
    t_fill(&p, 11);   /* any bytes, NaNs too */
    float ks[L] = { 0.5f, 2.0f, 0.1f }, vs[L] = { 0.3f, 7.0f, 1.0f };
    assert_int_equal(tdm_kvx_set_kv_scales(p.kvx, TDM_KV_SCALE_TENSOR, ks, vs, 1), TDM_OK);
    assert_int_equal(tdm_kvx_set_kv_scales(d.kvx, TDM_KV_SCALE_TENSOR, ks, vs, 1), TDM_OK);
    uint32_t peer = connect_to(&d, ep);
    assert_int_equal(scales_same(&d, peer), 1);
    uint32_t n = 11, src[NB], dst[NB];
    transfer_scattered(&p, &d, peer, 3, src, dst, n, 12);
    assert_int_equal(t_compare(&p, src, &d, dst, 0, n), 0);
    t_free(&d);

    /* a slice (heads [1,3)) whose per-head scales equal the sender's for those heads, while the
     * sender's are per tensor: the same effective scales, so the bytes are kept too */
    make(&d, "d2", TDM_KVX_ROLE_DECODE, NULL, TDM_DTYPE_FP8_E4M3, 2, 1, 14, TDM_KVX_TRANSPORT_ZMQ);
    float dk[L * 2], dv[L * 2];
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t h = 0; h < 2; h++) { dk[l * 2 + h] = ks[l]; dv[l * 2 + h] = vs[l]; }
    assert_int_equal(tdm_kvx_set_kv_scales(d.kvx, TDM_KV_SCALE_HEAD, dk, dv, 2), TDM_OK);
    peer = connect_to(&d, ep);
    assert_int_equal(scales_same(&d, peer), 1);
    transfer(&p, &d, peer, 4, src, dst, n);
    FOR_EACH_ROW(n, 2)
        assert_memory_equal(t_row(&p, l, kv, src[i], t, h + 1), t_row(&d, l, kv, dst[i], t, h), D);
    t_free(&d);
    t_free(&p);
}

/* An fp8 engine whose cache lies in its shared segment. */
static void make_shared(eng *e, const char *ep, uint64_t seed)
{
    tdm_kvx_config c;
    t_config(&c, "p", TDM_KVX_ROLE_PREFILL, ep);
    memset(e, 0, sizeof(*e));
    t_layout(&e->lay, 1, L, NB, BS, H, D, TDM_DTYPE_FP8_E4M3);
    e->layer_bytes = (size_t)2 * NB * BS * H * D;
    assert_int_equal(tdm_kvx_create(&c, &e->kvx), TDM_OK);
    void *mem = NULL;
    assert_int_equal(tdm_kvx_alloc_shared(e->kvx, e->layer_bytes * L, &mem), TDM_OK);
    e->mem = mem;
    for (uint32_t l = 0; l < L; l++) e->bases[l] = e->mem + l * e->layer_bytes;
    fill_fp8(e, seed);
    assert_int_equal(tdm_kvx_register(e->kvx, &e->lay, e->bases, TDM_MEM_HOST, 0), TDM_OK);
}

/* Same-host direct reads copy bytes: only with equal scales; otherwise chunks are converted. */
static void scales__direct_reads_only_with_equal_scales(void **state)
{
    (void)state;
    char ep[128];
    t_ipc(ep, sizeof(ep), "sc-direct");
    const uint32_t shm = TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_SHM;
    eng p, d;
    make_shared(&p, ep, 15);
    float ks[L] = { 1.0f, 2.0f, 4.0f }, vs[L] = { 0.5f, 0.25f, 3.0f }, dk[L] = { 2.0f, 2.0f, 2.0f };
    assert_int_equal(tdm_kvx_set_kv_scales(p.kvx, TDM_KV_SCALE_TENSOR, ks, vs, 1), TDM_OK);
    make(&d, "d", TDM_KVX_ROLE_DECODE, NULL, TDM_DTYPE_FP8_E4M3, H, 0, 16, shm);
    assert_int_equal(tdm_kvx_set_kv_scales(d.kvx, TDM_KV_SCALE_TENSOR, ks, vs, 1), TDM_OK);
    uint32_t peer = connect_to(&d, ep);
    assert_non_null(d.kvx->peers[peer & 0xffff].rkv);   /* mapped: direct reads */
    uint32_t n = 6, src[NB], dst[NB];
    transfer_scattered(&p, &d, peer, 5, src, dst, n, 17);
    assert_int_equal(t_compare(&p, src, &d, dst, 0, n), 0);
    t_free(&d);
    make(&d, "d2", TDM_KVX_ROLE_DECODE, NULL, TDM_DTYPE_FP8_E4M3, H, 0, 19, shm);
    assert_int_equal(tdm_kvx_set_kv_scales(d.kvx, TDM_KV_SCALE_TENSOR, dk, vs, 1), TDM_OK);
    peer = connect_to(&d, ep);
    assert_null(d.kvx->peers[peer & 0xffff].rkv);   /* different K scales: no direct reads */
    transfer(&p, &d, peer, 6, src, dst, n);
    eng r;
    ref_cache(&r, &d.lay);
    tdm_kv_convert_opts o;
    scale_opts(&o, TDM_KV_SCALE_TENSOR, ks, vs, 1, dk, vs, 1);
    ref_convert(&p, src, &r, dst, n, &o);
    assert_int_equal(t_compare(&r, dst, &d, dst, 0, n), 0);
    assert_int_not_equal(t_compare(&p, src, &d, dst, 0, n), 0);
    free(r.mem);
    t_free(&d);
    tdm_kvx_destroy(p.kvx);   /* owns the shared cache */
}

/* (d) bad arguments: errors with messages, nothing changed. */
static void scales__bad_arguments_are_refused(void **state)
{
    (void)state;
    float one[L * H], v[L * H];
    for (uint32_t i = 0; i < L * H; i++) one[i] = v[i] = 1.0f;
    assert_int_equal(tdm_kvx_set_kv_scales(NULL, TDM_KV_SCALE_NONE, NULL, NULL, 0), TDM_E_INVAL);
    tdm_kvx_config c;
    t_config(&c, "u", TDM_KVX_ROLE_DECODE, NULL);
    tdm_kvx *u;
    assert_int_equal(tdm_kvx_create(&c, &u), TDM_OK);
    assert_int_equal(tdm_kvx_set_kv_scales(u, TDM_KV_SCALE_TENSOR, one, v, 1), TDM_E_STATE);
    assert_non_null(strstr(tdm_kvx_errmsg(u), "register"));
    tdm_kvx_destroy(u);

    eng e;
    make(&e, "e", TDM_KVX_ROLE_DECODE, NULL, TDM_DTYPE_FP8_E4M3, H, 0, 20, TDM_KVX_TRANSPORT_ZMQ);
    float good_k[L * H], good_v[L * H];
    for (uint32_t i = 0; i < L * H; i++) { good_k[i] = 0.5f + (float)i; good_v[i] = 2.0f + (float)i; }
    assert_int_equal(tdm_kvx_set_kv_scales(e.kvx, TDM_KV_SCALE_HEAD, good_k, good_v, H), TDM_OK);
    struct { uint32_t kind, count; const char *msg; } shape[] = {
        { 3, 1, "unknown scale kind" },
        { TDM_KV_SCALE_TENSOR, 0, "count_per_layer" },
        { TDM_KV_SCALE_TENSOR, 2, "count_per_layer" },
        { TDM_KV_SCALE_HEAD, H - 1, "num_kv_heads" },
        { TDM_KV_SCALE_HEAD, H + 1, "num_kv_heads" },
        { TDM_KV_SCALE_NONE, 1, "NONE" },
    };
    for (size_t i = 0; i < sizeof(shape) / sizeof(shape[0]); i++) {
        assert_int_equal(tdm_kvx_set_kv_scales(e.kvx, shape[i].kind, one, v, shape[i].count), TDM_E_INVAL);
        if (!strstr(tdm_kvx_errmsg(e.kvx), shape[i].msg))
            fail_msg("case %zu: '%s' lacks '%s'", i, tdm_kvx_errmsg(e.kvx), shape[i].msg);
    }
    assert_int_equal(tdm_kvx_set_kv_scales(e.kvx, TDM_KV_SCALE_HEAD, NULL, v, H), TDM_E_INVAL);
    assert_int_equal(tdm_kvx_set_kv_scales(e.kvx, TDM_KV_SCALE_TENSOR, one, NULL, 1), TDM_E_INVAL);
    const float badv[] = { NAN, 0.0f, -1.0f, INFINITY, -0.0f, -INFINITY };
    for (size_t b = 0; b < sizeof(badv) / sizeof(badv[0]); b++)
        for (int kv = 0; kv < 2; kv++) {
            float k2[L * H], v2[L * H];
            memcpy(k2, one, sizeof(k2));
            memcpy(v2, one, sizeof(v2));
            (kv ? v2 : k2)[L * H - 2] = badv[b];
            assert_int_equal(tdm_kvx_set_kv_scales(e.kvx, TDM_KV_SCALE_HEAD, k2, v2, H), TDM_E_INVAL);
            char want[32];
            snprintf(want, sizeof(want), "%s_scales[%u]", kv ? "v" : "k", L * H - 2);
            if (!strstr(tdm_kvx_errmsg(e.kvx), want)) fail_msg("'%s' lacks '%s'", tdm_kvx_errmsg(e.kvx), want);
        }
    /* nothing changed: still the good per-head scales */
    assert_int_equal(e.kvx->scale_kind, TDM_KV_SCALE_HEAD);
    assert_int_equal(e.kvx->scale_count, H);
    assert_memory_equal(e.kvx->scales, good_k, sizeof(good_k));
    assert_memory_equal(e.kvx->scales + L * H, good_v, sizeof(good_v));
    /* back to none, then per tensor: the last call wins */
    assert_int_equal(tdm_kvx_set_kv_scales(e.kvx, TDM_KV_SCALE_NONE, NULL, NULL, 0), TDM_OK);
    assert_int_equal(e.kvx->scale_kind, TDM_KV_SCALE_NONE);
    assert_int_equal(tdm_kvx_set_kv_scales(e.kvx, TDM_KV_SCALE_TENSOR, good_k, good_v, 1), TDM_OK);
    assert_int_equal(e.kvx->scale_count, 1);
    t_free(&e);
    /* scales belong to fp8 caches */
    make(&e, "f", TDM_KVX_ROLE_DECODE, NULL, TDM_DTYPE_FP16, H, 0, 21, TDM_KVX_TRANSPORT_ZMQ);
    assert_int_equal(tdm_kvx_set_kv_scales(e.kvx, TDM_KV_SCALE_TENSOR, one, v, 1), TDM_E_INVAL);
    assert_non_null(strstr(tdm_kvx_errmsg(e.kvx), "fp8"));
    assert_int_equal(tdm_kvx_set_kv_scales(e.kvx, TDM_KV_SCALE_NONE, NULL, NULL, 0), TDM_OK);
    t_free(&e);
}

/* ---- forged handshakes ----------------------------------------------------------------------- */

static uint8_t big[TDM__KVX_MAX_HELLO];

static void hello_of(tdm__kvx_msg *m, uint32_t type, const char *id, uint32_t role, const tdm_kv_layout *lay)
{
    tdm__kvx_msg_init(m, type);
    snprintf(m->hello.engine_id, sizeof(m->hello.engine_id), "%s", id);
    m->hello.role = role;
    m->hello.layout = *lay;
    m->hello.transports = TDM_KVX_TRANSPORT_ZMQ;
    snprintf(m->hello.host_id, sizeof(m->hello.host_id), "elsewhere");
}

/* The hello's scales: `kind`, `count` per layer, K and V. */
static void hello_scales(tdm__kvx_msg *m, uint32_t kind, uint32_t count, const float *k, const float *v)
{
    m->hello.scale_kind = kind;
    m->hello.scale_count = count;
    m->hello.k_scales = k;
    m->hello.v_scales = v;
}

static size_t enc(const tdm__kvx_msg *m)
{
    size_t len;
    assert_int_equal(tdm__kvx_msg_encode(m, big, sizeof(big), &len), TDM_OK);
    return len;
}

static tdm__kvx_msg recv_ack(void *sock)
{
    static uint8_t buf[TDM__KVX_MAX_HELLO];
    int timeo = 5000;
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeo, sizeof(timeo));
    tdm__kvx_msg m;
    for (;;) {
        int n = zmq_recv(sock, buf, sizeof(buf), 0);
        if (n < 0) fail_msg("raw client: nothing received");
        char why[128];
        assert_int_equal(tdm__kvx_msg_decode(buf, (size_t)n, &m, why, sizeof(why)), TDM_OK);
        if (m.type != TDM__KVX_PING) return m;
    }
}

static void forged__hello_with_bad_scales_is_refused(void **state)
{
    (void)state;
    eng d;
    make(&d, "decode", TDM_KVX_ROLE_DECODE, "tcp://127.0.0.1:*", TDM_DTYPE_FP8_E4M3, H, 0, 22, TDM_KVX_TRANSPORT_ZMQ);
    char ep[256];
    assert_int_equal(tdm_kvx_get_endpoint(d.kvx, ep, sizeof(ep)), TDM_OK);
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_connect(s, ep), 0);
    tdm_kv_layout fp16 = d.lay;
    fp16.dtype = TDM_DTYPE_FP16;
    float ks[2 * L * H], vs[2 * L * H];
    struct { uint32_t kind, count; int bad_index; float bad; int fp16; const char *msg; } cases[] = {
        { TDM_KV_SCALE_TENSOR, 2, -1, 0, 0, "expected 3 floats" },     /* count off the layout */
        { TDM_KV_SCALE_HEAD, H - 1, -1, 0, 0, "expected 12 floats" },
        { TDM_KV_SCALE_TENSOR, 1, 1, NAN, 0, "k[1]" },
        { TDM_KV_SCALE_TENSOR, 1, 2, 0.0f, 0, "k[2]" },
        { TDM_KV_SCALE_HEAD, H, 5, -2.0f, 0, "k[5]" },
        { TDM_KV_SCALE_HEAD, H, 0, INFINITY, 0, "k[0]" },
        { TDM_KV_SCALE_TENSOR, 1, -1, 0, 1, "not fp8" },
        { 3, 1, -1, 0, 0, "kv_scale_kind" },
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (uint32_t i = 0; i < 2 * L * H; i++) ks[i] = vs[i] = 1.0f + (float)i;
        if (cases[c].bad_index >= 0) ks[cases[c].bad_index] = cases[c].bad;
        tdm__kvx_msg m;
        hello_of(&m, TDM__KVX_HELLO, "raw", TDM_KVX_ROLE_PREFILL, cases[c].fp16 ? &fp16 : &d.lay);
        hello_scales(&m, cases[c].kind, cases[c].count, ks, vs);
        size_t len = enc(&m);
        assert_true(zmq_send(s, big, len, 0) >= 0);
        tdm__kvx_msg a = recv_ack(s);
        assert_int_equal(a.type, TDM__KVX_HELLO_ACK);
        assert_int_equal(a.status, TDM_E_PROTOCOL);
        if (!strstr(a.reason, cases[c].msg)) fail_msg("case %zu: reason '%s' lacks '%s'", c, a.reason, cases[c].msg);
        assert_int_equal(t_stats(&d).num_peers, 0);
    }
    /* valid per-head scales are accepted and kept (as floats of the sender's heads) */
    for (uint32_t i = 0; i < L * H; i++) { ks[i] = 0.5f * (float)(i + 1); vs[i] = 3.0f; }
    tdm__kvx_msg m;
    hello_of(&m, TDM__KVX_HELLO, "raw", TDM_KVX_ROLE_PREFILL, &d.lay);
    hello_scales(&m, TDM_KV_SCALE_HEAD, H, ks, vs);
    size_t len = enc(&m);
    assert_true(zmq_send(s, big, len, 0) >= 0);
    tdm__kvx_msg a = recv_ack(s);
    assert_int_equal(a.status, 0);
    assert_int_equal(a.hello.scale_kind, TDM_KV_SCALE_NONE);   /* d declared none */
    assert_int_equal(t_stats(&d).num_peers, 1);
    uint32_t peer;
    assert_int_equal(tdm_kvx_find_peer(d.kvx, "raw", &peer), TDM_OK);
    kvx_peer *kp = &d.kvx->peers[peer & 0xffff];
    assert_int_equal(kp->remote.scale_kind, TDM_KV_SCALE_HEAD);
    assert_memory_equal(kp->remote.k_scales, ks, sizeof(float) * L * H);
    assert_memory_equal(kp->remote.v_scales, vs, sizeof(float) * L * H);
    assert_int_equal(kp->scales_same, 0);
    zmq_close(s);
    zmq_ctx_term(ctx);
    t_free(&d);
}

/* A raw server answering an engine's HELLO with a HELLO_ACK whose scales are bad. */
typedef struct fake_srv {
    void *sock;
    tdm_kv_layout lay;
    float bad;
    int got_scales;          /* the engine's HELLO carried its TENSOR scales */
} fake_srv;

static void *fake_main(void *arg)
{
    fake_srv *f = arg;
    static uint8_t buf[TDM__KVX_MAX_HELLO];
    static uint8_t out[TDM__KVX_MAX_HELLO];
    uint8_t rt[256];
    int rl = zmq_recv(f->sock, rt, sizeof(rt), 0);
    int n = zmq_recv(f->sock, buf, sizeof(buf), 0);
    if (rl <= 0 || n <= 0) return NULL;
    tdm__kvx_msg m;
    if (tdm__kvx_msg_decode(buf, (size_t)n, &m, NULL, 0) == TDM_OK && m.type == TDM__KVX_HELLO)
        f->got_scales = m.hello.scale_kind == TDM_KV_SCALE_TENSOR && tdm__kvx_hello_scale(&m.hello, 1, 2) == 6.0f;
    float ks[L] = { 1.0f, f->bad, 1.0f }, vs[L] = { 1.0f, 1.0f, 1.0f };
    tdm__kvx_msg a;
    hello_of(&a, TDM__KVX_HELLO_ACK, "fake", TDM_KVX_ROLE_PREFILL, &f->lay);
    hello_scales(&a, TDM_KV_SCALE_TENSOR, 1, ks, vs);
    size_t len;
    if (tdm__kvx_msg_encode(&a, out, sizeof(out), &len) != TDM_OK) return NULL;
    zmq_send(f->sock, rt, (size_t)rl, ZMQ_SNDMORE);
    zmq_send(f->sock, out, len, 0);
    return NULL;
}

static void forged__hello_ack_with_bad_scales_fails_connect(void **state)
{
    (void)state;
    char ep[128];
    t_ipc(ep, sizeof(ep), "sc-fake");
    void *ctx = zmq_ctx_new();
    fake_srv f;
    memset(&f, 0, sizeof(f));
    f.sock = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0, timeo = 5000;
    zmq_setsockopt(f.sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(f.sock, ZMQ_RCVTIMEO, &timeo, sizeof(timeo));
    assert_int_equal(zmq_bind(f.sock, ep), 0);
    eng d;
    make(&d, "d", TDM_KVX_ROLE_DECODE, NULL, TDM_DTYPE_FP8_E4M3, H, 0, 23, TDM_KVX_TRANSPORT_ZMQ);
    float ks[L] = { 1.0f, 2.0f, 3.0f }, vs[L] = { 4.0f, 5.0f, 6.0f };
    assert_int_equal(tdm_kvx_set_kv_scales(d.kvx, TDM_KV_SCALE_TENSOR, ks, vs, 1), TDM_OK);
    f.lay = d.lay;
    f.bad = -1.0f;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fake_main, &f), 0);
    uint32_t peer = 77;
    assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &peer), TDM_E_PROTOCOL);
    pthread_join(th, NULL);
    assert_int_equal(peer, 77);
    assert_true(f.got_scales);
    const char *msg = tdm_kvx_errmsg(d.kvx);
    if (!strstr(msg, "scale") || !strstr(msg, "HELLO_ACK")) fail_msg("message '%s'", msg);
    assert_int_equal(t_stats(&d).num_peers, 0);
    zmq_close(f.sock);
    zmq_ctx_term(ctx);
    unlink(ep + 6);
    t_free(&d);
}

/* ---- the wire form --------------------------------------------------------------------------- */

static void wire__scales_round_trip_and_size_bounds(void **state)
{
    (void)state;
    /* no scales: the HELLO is as before (15 elements), and decodes to none */
    tdm_kv_layout lay;
    t_layout(&lay, 1, L, NB, BS, H, D, TDM_DTYPE_FP8_E4M3);
    tdm__kvx_msg m, m2;
    hello_of(&m, TDM__KVX_HELLO, "x", 1, &lay);
    size_t len = enc(&m);
    assert_int_equal(big[0], 0x90 | 15);
    char why[128];
    assert_int_equal(tdm__kvx_msg_decode(big, len, &m2, why, sizeof(why)), TDM_OK);
    assert_int_equal(m2.hello.scale_kind, TDM_KV_SCALE_NONE);
    /* the largest: 128 layers x 128 heads per head (16384 per K and V) */
    tdm_kv_layout wide;
    t_layout(&wide, 1, 128, 4, 16, 128, 128, TDM_DTYPE_FP8_E4M3);
    static float k[TDM__KVX_MAX_SCALES], v[TDM__KVX_MAX_SCALES];
    for (uint32_t i = 0; i < TDM__KVX_MAX_SCALES; i++) { k[i] = 1.0f / (float)(i + 1); v[i] = (float)i + 0.5f; }
    hello_of(&m, TDM__KVX_HELLO_ACK, "x", 1, &wide);
    hello_scales(&m, TDM_KV_SCALE_HEAD, 128, k, v);
    len = enc(&m);
    assert_true(len > TDM__KVX_MAX_HEADER);
    assert_int_equal(tdm__kvx_msg_decode(big, len, &m2, why, sizeof(why)), TDM_OK);
    assert_int_equal(m2.hello.scale_kind, TDM_KV_SCALE_HEAD);
    assert_int_equal(m2.hello.scale_count, 128);
    for (uint32_t i = 0; i < TDM__KVX_MAX_SCALES; i++) {
        assert_true(tdm__kvx_hello_scale(&m2.hello, 0, i) == k[i]);
        assert_true(tdm__kvx_hello_scale(&m2.hello, 1, i) == v[i]);
    }
    /* one layer more is beyond the bound: the encoder cannot even fit it, the decoder refuses
     * a frame that large */
    assert_int_equal(tdm__kvx_msg_decode(big, TDM__KVX_MAX_HELLO + 1, &m2, why, sizeof(why)), TDM_E_PROTOCOL);
    /* a large frame is a handshake privilege: a PING with a 3000-byte extra field is refused,
     * with a 100-byte one accepted */
    uint8_t ping[3100] = { 0x94, 0x01, 0x0a, 0x00, 0xc5, 0x0b, 0xb8 };
    assert_int_equal(tdm__kvx_msg_decode(ping, 7 + 3000, &m2, why, sizeof(why)), TDM_E_PROTOCOL);
    assert_non_null(strstr(why, "too large"));
    ping[5] = 0x00;
    ping[6] = 100;
    assert_int_equal(tdm__kvx_msg_decode(ping, 7 + 100, &m2, why, sizeof(why)), TDM_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(scales__fp8_tensor_scales_into_fp16),
        cmocka_unit_test(scales__fp8_head_scales_requantized_into_a_slice),
        cmocka_unit_test(scales__equal_scales_keep_the_bytes),
        cmocka_unit_test(scales__direct_reads_only_with_equal_scales),
        cmocka_unit_test(scales__bad_arguments_are_refused),
        cmocka_unit_test(forged__hello_with_bad_scales_is_refused),
        cmocka_unit_test(forged__hello_ack_with_bad_scales_fails_connect),
        cmocka_unit_test(wire__scales_round_trip_and_size_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
