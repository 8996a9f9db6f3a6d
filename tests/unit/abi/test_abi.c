/*
 * test_abi.c -- the library-wide ABI: versions, status names, the allocator hook (refused
 * while a handle exists), the struct init functions and the struct_size contract.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "internal.h"
#include "tandem.h"

static void version__matches_header(void **state)
{
    (void)state;
    assert_int_equal(tdm_version_number(), TDM_VERSION_NUMBER);
    assert_string_equal(tdm_version_string(), TDM_VERSION_STRING);
    assert_int_equal(tdm_abi_version(), TDM_ABI_VERSION);
}

/* The string and the number name the same release (they once drifted: 0.2.0 vs 30000). */
static void version__string_agrees_with_number(void **state)
{
    (void)state;
    unsigned maj = 0, min = 0, pat = 0;
    char tail = 0;
    assert_int_equal(sscanf(tdm_version_string(), "%u.%u.%u%c", &maj, &min, &pat, &tail), 3);
    assert_int_equal(maj * 10000 + min * 100 + pat, tdm_version_number());
}

static void strerror__every_code_has_a_distinct_name(void **state)
{
    (void)state;
    const char *seen[32] = { 0 };
    for (int c = 0; c >= TDM_E_PLUGIN; c--) {
        const char *s = tdm_strerror(c);
        assert_non_null(s);
        assert_string_not_equal(s, "unknown error");
        for (int k = 0; k < -c; k++) assert_string_not_equal(seen[k], s);
        seen[-c] = s;
    }
    assert_string_equal(tdm_strerror(-9999), "unknown error");
    assert_string_equal(tdm_strerror(5), "unknown error");
}

static size_t g_allocs;
static void *count_malloc(void *ctx, size_t n) { (void)ctx; g_allocs++; return malloc(n); }
static void *count_realloc(void *ctx, void *p, size_t n) { (void)ctx; g_allocs++; return realloc(p, n); }
static void count_free(void *ctx, void *p) { (void)ctx; free(p); }

static void set_allocator__used_then_refused_while_a_handle_lives(void **state)
{
    (void)state;
    tdm_allocator a;
    assert_int_equal(tdm_allocator_init(&a), TDM_OK);
    a.malloc_fn = count_malloc;
    a.realloc_fn = count_realloc;
    a.free_fn = count_free;
    assert_int_equal(tdm_set_allocator(&a), TDM_OK);
    g_allocs = 0;
    tdm_sched *s = NULL;
    assert_int_equal(tdm_sched_create(&s), TDM_OK);
    assert_true(g_allocs > 0);
    assert_int_equal(tdm_set_allocator(NULL), TDM_E_STATE);
    tdm_sched_destroy(s);
    assert_int_equal(tdm_set_allocator(NULL), TDM_OK);
}

static void set_allocator__rejects_null_functions(void **state)
{
    (void)state;
    tdm_allocator a;
    tdm_allocator_init(&a);
    a.free_fn = NULL;
    assert_int_equal(tdm_set_allocator(&a), TDM_E_INVAL);
    a.struct_size = 4;
    assert_int_equal(tdm_set_allocator(&a), TDM_E_INVAL);
    assert_int_equal(tdm_allocator_init(NULL), TDM_E_INVAL);
}

static void init_functions__set_struct_size_and_reject_null(void **state)
{
    (void)state;
    tdm_batch b;
    tdm_step_output o;
    tdm_update_result r;
    tdm_sched_stats st;
    tdm_request_desc d;
    tdm_request_info i;
    memset(&b, 0xab, sizeof(b));
    assert_int_equal(tdm_batch_init(&b), TDM_OK);
    assert_int_equal(b.struct_size, sizeof(b));
    assert_int_equal(b.num_reqs, 0);
    assert_int_equal(tdm_step_output_init(&o), TDM_OK);
    assert_int_equal(o.struct_size, sizeof(o));
    assert_int_equal(tdm_update_result_init(&r), TDM_OK);
    assert_int_equal(tdm_sched_stats_init(&st), TDM_OK);
    assert_int_equal(tdm_request_desc_init(&d), TDM_OK);
    assert_int_equal(d.struct_size, sizeof(d));
    assert_int_equal(d.eos_token_id, -1);
    assert_int_equal(tdm_request_info_init(&i), TDM_OK);
    assert_int_equal(tdm_batch_init(NULL), TDM_E_INVAL);
    assert_int_equal(tdm_step_output_init(NULL), TDM_E_INVAL);
    assert_int_equal(tdm_update_result_init(NULL), TDM_E_INVAL);
    assert_int_equal(tdm_sched_stats_init(NULL), TDM_E_INVAL);
    assert_int_equal(tdm_request_desc_init(NULL), TDM_E_INVAL);
    assert_int_equal(tdm_request_info_init(NULL), TDM_E_INVAL);
}

/* A caller compiled against an older, shorter tdm_sched_stats: the library writes only what
 * struct_size covers. */
static void struct_size__library_writes_only_what_the_caller_covers(void **state)
{
    (void)state;
    tdm_sched *s;
    assert_int_equal(tdm_sched_create(&s), TDM_OK);
    unsigned char buf[sizeof(tdm_sched_stats) + 16];
    memset(buf, 0x5a, sizeof(buf));
    tdm_sched_stats *st = (tdm_sched_stats *)buf;
    uint32_t short_size = (uint32_t)offsetof(tdm_sched_stats, prefix_queries) + 8;
    st->struct_size = sizeof(tdm_sched_stats);
    assert_int_equal(tdm_sched_get_stats(s, st), TDM_OK); /* full size: fine */
    memset(buf, 0x5a, sizeof(buf));
    st->struct_size = short_size;
    /* Shorter than the first version: refused, nothing written past the size field. */
    assert_int_equal(tdm_sched_get_stats(s, st), TDM_E_INVAL);
    for (size_t k = sizeof(uint32_t); k < sizeof(buf); k++) assert_int_equal(buf[k], 0x5a);
    tdm_sched_destroy(s);
}

static void alloc_fail_after__fails_exactly_the_nth_allocation(void **state)
{
    (void)state;
    tdm__alloc_fail_after(2);
    void *a = tdm__malloc(8);
    void *b = tdm__malloc(8);
    void *c = tdm__malloc(8);
    assert_non_null(a);
    assert_null(b);
    assert_non_null(c);
    tdm__free(a);
    tdm__free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(version__matches_header),
        cmocka_unit_test(version__string_agrees_with_number),
        cmocka_unit_test(strerror__every_code_has_a_distinct_name),
        cmocka_unit_test(set_allocator__used_then_refused_while_a_handle_lives),
        cmocka_unit_test(set_allocator__rejects_null_functions),
        cmocka_unit_test(init_functions__set_struct_size_and_reject_null),
        cmocka_unit_test(struct_size__library_writes_only_what_the_caller_covers),
        cmocka_unit_test(alloc_fail_after__fails_exactly_the_nth_allocation),
    };
    return cmocka_run_group_tests_name("abi", tests, NULL, NULL);
}
