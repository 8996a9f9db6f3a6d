/*
 * test_kv_pack.c -- layouts, the packed format, pack and unpack on the CPU: strides of the
 * well-known layouts, validation, packed sizes, pack of random data checked element by
 * element against the layout formula for every layout kind and dtype, layer subsets,
 * round trips through unpack (listed blocks restored, others untouched), and bad input
 * (a status, a message, and no byte written).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>

#include "kv_test_util.h"

static const tdm_kv_layout_kind kinds[] = {
    TDM_KV_LAYOUT_VLLM_NHD, TDM_KV_LAYOUT_VLLM_HND, TDM_KV_LAYOUT_FLASHINFER,
    TDM_KV_LAYOUT_FLASHINFER_HND, TDM_KV_LAYOUT_CUSTOM};
static const tdm_dtype dtypes[] = {TDM_DTYPE_FP16, TDM_DTYPE_BF16, TDM_DTYPE_FP32,
                                   TDM_DTYPE_FP8_E4M3};

static void make_layout(tdm_kv_layout *l, tdm_kv_layout_kind k, uint32_t layers, uint32_t blocks,
                        uint32_t bs, uint32_t heads, uint32_t dim, tdm_dtype dt)
{
    if (k == TDM_KV_LAYOUT_CUSTOM) custom_layout(l, layers, blocks, bs, heads, dim, dt);
    else assert_int_equal(tdm_kv_layout_init(l, k, layers, blocks, bs, heads, dim, dt), TDM_OK);
    assert_int_equal(tdm_kv_layout_validate(l), TDM_OK);
}

/* Every element of packed equals the formula's element of the cache. */
static void check_packed(const test_cache *c, const uint32_t *ids, uint32_t n, uint32_t lb,
                         uint32_t le, const uint8_t *packed)
{
    const tdm_kv_layout *l = &c->l;
    size_t e = tdm_dtype_size((tdm_dtype)l->dtype), row = (size_t)l->head_dim * e, off = 0;
    for (uint32_t layer = lb; layer < le; layer++)
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t kv = 0; kv < 2; kv++)
                for (uint32_t t = 0; t < l->block_size; t++)
                    for (uint32_t h = 0; h < l->num_kv_heads; h++, off += row) {
                        const uint8_t *src = (const uint8_t *)c->bases[layer] +
                                             elem_index(l, kv, ids[i], t, h) * e;
                        assert_memory_equal(packed + off, src, row);
                    }
}

static void layout_init__derives_vllm_strides(void **state)
{
    (void)state;
    tdm_kv_layout l;
    assert_int_equal(tdm_kv_layout_init(&l, TDM_KV_LAYOUT_VLLM_NHD, 2, 10, 16, 8, 128, TDM_DTYPE_FP16), TDM_OK);
    assert_int_equal(l.stride_head, 128);
    assert_int_equal(l.stride_token, 8 * 128);
    assert_int_equal(l.stride_block, 16 * 8 * 128);
    assert_int_equal(l.stride_kv, 10 * 16 * 8 * 128);
    assert_int_equal(tdm_kv_layout_init(&l, TDM_KV_LAYOUT_VLLM_HND, 2, 10, 16, 8, 128, TDM_DTYPE_FP16), TDM_OK);
    assert_int_equal(l.stride_token, 128);
    assert_int_equal(l.stride_head, 16 * 128);
    assert_int_equal(tdm_kv_layout_init(&l, TDM_KV_LAYOUT_FLASHINFER, 2, 10, 16, 8, 128, TDM_DTYPE_FP16), TDM_OK);
    assert_int_equal(l.stride_kv, 16 * 8 * 128);
    assert_int_equal(l.stride_block, 2 * 16 * 8 * 128);
    size_t b;
    assert_int_equal(tdm_kv_layout_block_bytes(&l, &b), TDM_OK);
    assert_int_equal(b, 2 * 16 * 8 * 128 * 2);
    assert_int_equal(tdm_kv_layout_layer_bytes(&l, &b), TDM_OK);
    assert_int_equal(b, 10 * 2 * 16 * 8 * 128 * 2);
}

static void layout_init__rejects_bad_arguments(void **state)
{
    (void)state;
    tdm_kv_layout l;
    memset(&l, 0x5A, sizeof l);
    tdm_kv_layout copy = l;
    assert_int_equal(tdm_kv_layout_init(NULL, TDM_KV_LAYOUT_VLLM_NHD, 1, 1, 1, 1, 1, TDM_DTYPE_FP16), TDM_E_INVAL);
    assert_int_equal(tdm_kv_layout_init(&l, TDM_KV_LAYOUT_VLLM_NHD, 1, 0, 1, 1, 1, TDM_DTYPE_FP16), TDM_E_INVAL);
    assert_int_equal(tdm_kv_layout_init(&l, TDM_KV_LAYOUT_VLLM_NHD, 1, 1, 1, 1, 1, (tdm_dtype)9), TDM_E_INVAL);
    assert_int_equal(tdm_kv_layout_init(&l, (tdm_kv_layout_kind)7, 1, 1, 1, 1, 1, TDM_DTYPE_FP16), TDM_E_INVAL);
    assert_int_equal(tdm_kv_layout_init(&l, TDM_KV_LAYOUT_VLLM_NHD, 1, UINT32_MAX, UINT32_MAX, UINT32_MAX, 8, TDM_DTYPE_FP16), TDM_E_INVAL);
    assert_memory_equal(&l, &copy, sizeof l);
    assert_true(strlen(tdm_kv_errmsg()) > 0);
}

static void layout_validate__rejects_overlap_and_mismatch(void **state)
{
    (void)state;
    tdm_kv_layout l;
    assert_int_equal(tdm_kv_layout_validate(NULL), TDM_E_INVAL);
    /* CUSTOM with zero strides overlaps */
    tdm_kv_layout_init(&l, TDM_KV_LAYOUT_CUSTOM, 1, 4, 4, 2, 8, TDM_DTYPE_FP16);
    assert_int_equal(tdm_kv_layout_validate(&l), TDM_E_INVAL);
    /* heads closer than head_dim */
    custom_layout(&l, 1, 4, 4, 2, 8, TDM_DTYPE_FP16);
    assert_int_equal(tdm_kv_layout_validate(&l), TDM_OK);
    l.stride_head = 7;
    assert_int_equal(tdm_kv_layout_validate(&l), TDM_E_INVAL);
    assert_non_null(strstr(tdm_kv_errmsg(), "stride_head"));
    custom_layout(&l, 1, 4, 4, 2, 8, TDM_DTYPE_FP16);
    l.stride_block = -1;
    assert_int_equal(tdm_kv_layout_validate(&l), TDM_E_INVAL);
    /* a well-known kind with other strides */
    tdm_kv_layout_init(&l, TDM_KV_LAYOUT_VLLM_NHD, 1, 4, 4, 2, 8, TDM_DTYPE_FP16);
    l.stride_kv += 1;
    assert_int_equal(tdm_kv_layout_validate(&l), TDM_E_INVAL);
    tdm_kv_layout_init(&l, TDM_KV_LAYOUT_VLLM_NHD, 1, 4, 4, 2, 8, TDM_DTYPE_FP16);
    l.struct_size = 8;
    assert_int_equal(tdm_kv_layout_validate(&l), TDM_E_INVAL);
    /* extent 1 dimensions may have any stride */
    custom_layout(&l, 1, 1, 1, 1, 8, TDM_DTYPE_FP16);
    l.stride_block = 0;
    l.stride_token = 0;
    l.stride_head = 0;
    assert_int_equal(tdm_kv_layout_validate(&l), TDM_OK);
}

static void packed_size__is_layers_times_blocks_times_block_bytes(void **state)
{
    (void)state;
    tdm_kv_layout l;
    size_t sz = 7;
    tdm_kv_layout_init(&l, TDM_KV_LAYOUT_VLLM_HND, 32, 100, 16, 8, 128, TDM_DTYPE_BF16);
    assert_int_equal(tdm_kv_packed_size(&l, 5, 2, 10, &sz), TDM_OK);
    assert_int_equal(sz, (size_t)8 * 5 * 2 * 16 * 8 * 128 * 2);
    assert_int_equal(tdm_kv_packed_size(&l, 0, 0, 32, &sz), TDM_OK);
    assert_int_equal(sz, 0);
    sz = 7;
    assert_int_equal(tdm_kv_packed_size(&l, 5, 3, 3, &sz), TDM_E_INVAL);
    assert_int_equal(tdm_kv_packed_size(&l, 5, 0, 33, &sz), TDM_E_INVAL);
    assert_int_equal(tdm_kv_packed_size(&l, 5, 0, 1, NULL), TDM_E_INVAL);
    assert_int_equal(sz, 7);
}

/* Pack then unpack into a poisoned cache, for one layout; checks everything. */
static void round_trip(tdm_kv_layout_kind k, tdm_dtype dt, uint32_t bs, uint32_t lb, uint32_t le)
{
    tdm_kv_layout l;
    make_layout(&l, k, 4, 12, bs, 3, 8, dt);
    test_cache a, b;
    assert_int_equal(cache_alloc(&a, &l), 0);
    assert_int_equal(cache_alloc(&b, &l), 0);
    cache_fill_random(&a);
    uint32_t ids[7];
    random_ids(ids, 7, l.num_blocks);
    size_t need;
    assert_int_equal(tdm_kv_packed_size(&l, 7, lb, le, &need), TDM_OK);
    uint8_t *buf = malloc(need + 64);
    memset(buf, POISON, need + 64);
    assert_int_equal(tdm_kv_pack(&l, a.bases, ids, 7, lb, le, buf, need + 64), TDM_OK);
    check_packed(&a, ids, 7, lb, le, buf);
    for (size_t i = need; i < need + 64; i++) assert_int_equal(buf[i], POISON);

    cache_poison(&b);
    assert_int_equal(tdm_kv_unpack(&l, b.bases, ids, 7, lb, le, buf, need), TDM_OK);
    size_t e = tdm_dtype_size(dt), row = (size_t)l.head_dim * e;
    uint8_t poison_row[4 * 64];
    memset(poison_row, POISON, sizeof poison_row);
    for (uint32_t layer = 0; layer < l.num_layers; layer++)
        for (uint32_t blk = 0; blk < l.num_blocks; blk++) {
            int listed = 0;
            for (uint32_t i = 0; i < 7; i++) listed |= ids[i] == blk;
            listed &= layer >= lb && layer < le;
            for (uint32_t kv = 0; kv < 2; kv++)
                for (uint32_t t = 0; t < l.block_size; t++)
                    for (uint32_t h = 0; h < l.num_kv_heads; h++) {
                        size_t o = elem_index(&l, kv, blk, t, h) * e;
                        const uint8_t *got = (const uint8_t *)b.bases[layer] + o;
                        if (listed) assert_memory_equal(got, (const uint8_t *)a.bases[layer] + o, row);
                        else assert_memory_equal(got, poison_row, row);
                    }
        }
    /* padding of the custom layout is never written either */
    if (k == TDM_KV_LAYOUT_CUSTOM) {
        const uint8_t *p = b.bases[lb];
        size_t pad = elem_index(&l, 0, ids[0], 0, 0) * e + row; /* after head 0's row */
        for (size_t i = 0; i < 4 * e; i++) assert_int_equal(p[pad + i], POISON);
    }
    free(buf);
    cache_free(&a);
    cache_free(&b);
}

static void pack__round_trip_every_layout_and_dtype(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
            round_trip(kinds[k], dtypes[d], 4, 0, 4);
            round_trip(kinds[k], dtypes[d], 16, 0, 4);
        }
}

static void pack__layer_subset(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        round_trip(kinds[k], TDM_DTYPE_FP16, 16, 1, 3);
        round_trip(kinds[k], TDM_DTYPE_FP8_E4M3, 5, 3, 4);
    }
}

/* >= 16 MiB with block-sized runs: the streaming-store path; dst deliberately unaligned. */
static void pack__large_transfer_streaming_path(void **state)
{
    (void)state;
    tdm_kv_layout l;
    make_layout(&l, TDM_KV_LAYOUT_VLLM_NHD, 4, 80, 16, 8, 128, TDM_DTYPE_FP16);
    test_cache a, b;
    assert_int_equal(cache_alloc(&a, &l), 0);
    assert_int_equal(cache_alloc(&b, &l), 0);
    cache_fill_random(&a);
    uint32_t ids[64];
    random_ids(ids, 64, l.num_blocks);
    size_t need;
    assert_int_equal(tdm_kv_packed_size(&l, 64, 0, 4, &need), TDM_OK);
    assert_true(need >= (16u << 20));
    uint8_t *mem = malloc(need + 32), *buf = mem + 3;
    memset(mem, POISON, need + 32);
    assert_int_equal(tdm_kv_pack(&l, a.bases, ids, 64, 0, 4, buf, need), TDM_OK);
    check_packed(&a, ids, 64, 0, 4, buf);
    for (size_t i = 0; i < 3; i++) assert_int_equal(mem[i], POISON);
    for (size_t i = need + 3; i < need + 32; i++) assert_int_equal(mem[i], POISON);
    cache_poison(&b);
    assert_int_equal(tdm_kv_unpack(&l, b.bases, ids, 64, 0, 4, buf, need), TDM_OK);
    for (uint32_t layer = 0; layer < 4; layer++)
        for (uint32_t i = 0; i < 64; i++) {
            size_t o = elem_index(&l, 0, ids[i], 0, 0) * 2, half = (size_t)16 * 8 * 128 * 2;
            assert_memory_equal((uint8_t *)b.bases[layer] + o, (uint8_t *)a.bases[layer] + o, half);
            o = elem_index(&l, 1, ids[i], 0, 0) * 2;
            assert_memory_equal((uint8_t *)b.bases[layer] + o, (uint8_t *)a.bases[layer] + o, half);
        }
    free(mem);
    cache_free(&a);
    cache_free(&b);
}

static void pack__zero_blocks_is_a_no_op(void **state)
{
    (void)state;
    tdm_kv_layout l;
    make_layout(&l, TDM_KV_LAYOUT_VLLM_NHD, 2, 4, 4, 2, 8, TDM_DTYPE_FP16);
    test_cache a;
    assert_int_equal(cache_alloc(&a, &l), 0);
    assert_int_equal(tdm_kv_pack(&l, a.bases, NULL, 0, 0, 2, NULL, 0), TDM_OK);
    assert_int_equal(tdm_kv_unpack(&l, a.bases, NULL, 0, 0, 2, NULL, 0), TDM_OK);
    cache_free(&a);
}

static void unpack__duplicate_ids_last_chunk_wins(void **state)
{
    (void)state;
    tdm_kv_layout l;
    make_layout(&l, TDM_KV_LAYOUT_VLLM_NHD, 1, 4, 4, 2, 8, TDM_DTYPE_FP16);
    test_cache a;
    assert_int_equal(cache_alloc(&a, &l), 0);
    size_t bb;
    tdm_kv_layout_block_bytes(&l, &bb);
    uint8_t *buf = malloc(2 * bb);
    memset(buf, 1, bb);
    memset(buf + bb, 2, bb);
    uint32_t ids[2] = {3, 3};
    assert_int_equal(tdm_kv_unpack(&l, a.bases, ids, 2, 0, 1, buf, 2 * bb), TDM_OK);
    assert_int_equal(((uint8_t *)a.bases[0])[elem_index(&l, 1, 3, 3, 1) * 2], 2);
    free(buf);
    cache_free(&a);
}

static void pack__bad_input_gives_status_and_writes_nothing(void **state)
{
    (void)state;
    tdm_kv_layout l;
    make_layout(&l, TDM_KV_LAYOUT_VLLM_NHD, 3, 8, 4, 2, 8, TDM_DTYPE_FP16);
    test_cache a;
    assert_int_equal(cache_alloc(&a, &l), 0);
    cache_fill_random(&a);
    size_t need;
    tdm_kv_packed_size(&l, 3, 0, 3, &need);
    uint8_t *buf = malloc(need), *ref = malloc(need);
    memset(buf, POISON, need);
    memset(ref, POISON, need);
    uint32_t ids[3] = {1, 2, 3}, bad[3] = {1, 8, 3};
    void *holes[3] = {a.bases[0], NULL, a.bases[2]};

    assert_int_equal(tdm_kv_pack(NULL, a.bases, ids, 3, 0, 3, buf, need), TDM_E_INVAL);
    assert_int_equal(tdm_kv_pack(&l, NULL, ids, 3, 0, 3, buf, need), TDM_E_INVAL);
    assert_int_equal(tdm_kv_pack(&l, holes, ids, 3, 0, 3, buf, need), TDM_E_INVAL);
    assert_non_null(strstr(tdm_kv_errmsg(), "layer_bases[1]"));
    assert_int_equal(tdm_kv_pack(&l, a.bases, NULL, 3, 0, 3, buf, need), TDM_E_INVAL);
    assert_int_equal(tdm_kv_pack(&l, a.bases, bad, 3, 0, 3, buf, need), TDM_E_INVAL);
    assert_non_null(strstr(tdm_kv_errmsg(), "block_ids[1]"));
    assert_int_equal(tdm_kv_pack(&l, a.bases, ids, 3, 0, 3, buf, need - 1), TDM_E_TRUNCATED);
    assert_int_equal(tdm_kv_pack(&l, a.bases, ids, 3, 0, 3, NULL, need), TDM_E_INVAL);
    assert_int_equal(tdm_kv_pack(&l, a.bases, ids, 3, 2, 2, buf, need), TDM_E_INVAL);
    assert_int_equal(tdm_kv_pack(&l, a.bases, ids, 3, 0, 4, buf, need), TDM_E_INVAL);
    assert_memory_equal(buf, ref, need);
    /* the layer outside the range may be NULL */
    assert_int_equal(tdm_kv_pack(&l, holes, ids, 3, 2, 3, buf, need), TDM_OK);

    /* unpack: short source, bad id: cache untouched */
    test_cache b;
    assert_int_equal(cache_alloc(&b, &l), 0);
    cache_poison(&b);
    assert_int_equal(tdm_kv_unpack(&l, b.bases, ids, 3, 0, 3, buf, need - 1), TDM_E_INVAL);
    assert_int_equal(tdm_kv_unpack(&l, b.bases, bad, 3, 0, 3, buf, need), TDM_E_INVAL);
    assert_int_equal(tdm_kv_unpack(&l, b.bases, ids, 3, 0, 3, NULL, need), TDM_E_INVAL);
    for (uint32_t i = 0; i < 3; i++)
        for (size_t j = 0; j < b.layer_bytes; j++)
            assert_int_equal(((uint8_t *)b.bases[i])[j], POISON);
    free(buf);
    free(ref);
    cache_free(&a);
    cache_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(layout_init__derives_vllm_strides),
        cmocka_unit_test(layout_init__rejects_bad_arguments),
        cmocka_unit_test(layout_validate__rejects_overlap_and_mismatch),
        cmocka_unit_test(packed_size__is_layers_times_blocks_times_block_bytes),
        cmocka_unit_test(pack__round_trip_every_layout_and_dtype),
        cmocka_unit_test(pack__layer_subset),
        cmocka_unit_test(pack__large_transfer_streaming_path),
        cmocka_unit_test(pack__zero_blocks_is_a_no_op),
        cmocka_unit_test(unpack__duplicate_ids_last_chunk_wins),
        cmocka_unit_test(pack__bad_input_gives_status_and_writes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
