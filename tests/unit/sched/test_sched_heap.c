/*
 * test_sched_heap.c -- the scheduler's generic binary heap (sched/heap.h) on its own: random
 * inserts and removals at any position, with the heap property and every element's stored
 * position checked after each operation, under a strict total order (the waiting heap's
 * kind: key, then add order) and under an order with ties (the longest-prefill heap's kind:
 * the key alone); two heaps over the same requests keep their positions apart; popping the
 * root drains in order; and against a reference heap written out here the way the two
 * hand-written heaps it replaced were (containers.c's waiting heap, slo_adaptive.c's
 * longest-prefill heap), every operation leaves the same array after the same sequence of
 * comparisons, so the policies' compare functions see exactly what they saw before.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../../sched/heap.h"
#include "../../../sched/sched_internal.h"

enum { N = 300, OPS = 6000, LOG_CAP = 64 };

/* Each order logs the pairs it is asked about (ids), so two heaps' comparisons can be
 * compared; the key is ad_qtok, the tie-break seq. */
typedef struct cmp_log {
    uint64_t a[LOG_CAP], b[LOG_CAP];
    uint32_t n;
} cmp_log;

static void log_pair(const void *ctx, const tdm__req *a, const tdm__req *b)
{
    cmp_log *l = (cmp_log *)ctx;
    if (!l) return;
    assert_true(l->n < LOG_CAP);
    l->a[l->n] = a->id;
    l->b[l->n] = b->id;
    l->n++;
}

/* Min by key, then by seq: a strict total order. */
static bool key_seq_before(const void *ctx, const tdm__req *a, const tdm__req *b)
{
    log_pair(ctx, a, b);
    if (a->ad_qtok != b->ad_qtok) return a->ad_qtok < b->ad_qtok;
    return a->seq < b->seq;
}

/* Max by key, ties left as they are. */
static bool key_max_before(const void *ctx, const tdm__req *a, const tdm__req *b)
{
    log_pair(ctx, a, b);
    return a->ad_qtok > b->ad_qtok;
}

static const tdm__heap_order BY_KEY_SEQ = { key_seq_before, offsetof(tdm__req, heap_index) };
static const tdm__heap_order BY_KEY_MAX = { key_max_before, offsetof(tdm__req, ad_long_index) };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static tdm__req *make_reqs(uint32_t key_range)
{
    tdm__req *r = calloc(N, sizeof(*r));
    assert_non_null(r);
    for (uint32_t i = 0; i < N; i++) {
        r[i].id = i;
        r[i].seq = i;
        r[i].ad_qtok = rnd(key_range);
    }
    return r;
}

/* The heap property, every stored position, and the members: exactly those with in[] set. */
static void check_heap(const tdm__heap_order *o, tdm__req **h, uint32_t len, const tdm__req *reqs,
                       const bool *in)
{
    uint32_t members = 0;
    for (uint32_t i = 0; i < len; i++) {
        assert_int_equal(*tdm__heap_index(o, h[i]), i);
        assert_true(in[h[i] - reqs]);
        if (i) assert_false(o->before(NULL, h[i], h[(i - 1) / 2]));
    }
    for (uint32_t i = 0; i < N; i++) members += in[i];
    assert_int_equal(members, len);
}

/* One random operation: insert a random non-member, or remove a random position (the root
 * and the last position often). */
static void random_op(const tdm__heap_order *o, tdm__req **h, uint32_t *len, tdm__req *reqs, bool *in)
{
    if (*len < N && (*len == 0 || rnd(100) < 55)) {
        uint32_t k = rnd(N);
        while (in[k]) k = (k + 1) % N;
        in[k] = true;
        tdm__heap_insert(o, NULL, h, len, &reqs[k]);
        return;
    }
    uint32_t c = rnd(10), i = c == 0 ? 0 : c == 1 ? *len - 1 : rnd(*len);
    in[h[i] - reqs] = false;
    tdm__heap_remove(o, NULL, h, len, i);
}

static void random_ops(const tdm__heap_order *o, uint32_t key_range)
{
    tdm__req *reqs = make_reqs(key_range);
    tdm__req *h[N];
    bool in[N] = { false };
    uint32_t len = 0, max_len = 0;
    for (uint32_t k = 0; k < OPS; k++) {
        random_op(o, h, &len, reqs, in);
        check_heap(o, h, len, reqs, in);
        if (len > max_len) max_len = len;
    }
    assert_true(max_len > N / 4); /* the heap grew deep enough to exercise the sifts */
    free(reqs);
}

static void heap__random_ops_strict_order(void **state)
{
    (void)state;
    random_ops(&BY_KEY_SEQ, 20);
}

static void heap__random_ops_order_with_ties(void **state)
{
    (void)state;
    random_ops(&BY_KEY_MAX, 8);
}

/* Popping the root drains a filled heap in order: by key, then seq. */
static void heap__pops_come_out_in_order(void **state)
{
    (void)state;
    tdm__req *reqs = make_reqs(50);
    tdm__req *h[N];
    uint32_t len = 0;
    for (uint32_t i = 0; i < N; i++) tdm__heap_insert(&BY_KEY_SEQ, NULL, h, &len, &reqs[(i * 7) % N]);
    const tdm__req *prev = NULL;
    for (uint32_t n = 0; n < N; n++) {
        const tdm__req *top = h[0];
        if (prev) assert_true(key_seq_before(NULL, prev, top));
        prev = top;
        tdm__heap_remove(&BY_KEY_SEQ, NULL, h, &len, 0);
    }
    assert_int_equal(len, 0);
    free(reqs);
}

/* Two heaps over the same requests (as a flagged waiting request is in both): each writes
 * its own position field only. */
static void heap__two_heaps_keep_their_own_positions(void **state)
{
    (void)state;
    tdm__req *reqs = make_reqs(30);
    tdm__req *h1[N], *h2[N];
    bool in1[N] = { false }, in2[N] = { false };
    uint32_t len1 = 0, len2 = 0;
    for (uint32_t k = 0; k < OPS; k++) {
        if (rnd(2)) random_op(&BY_KEY_SEQ, h1, &len1, reqs, in1);
        else random_op(&BY_KEY_MAX, h2, &len2, reqs, in2);
        check_heap(&BY_KEY_SEQ, h1, len1, reqs, in1);
        check_heap(&BY_KEY_MAX, h2, len2, reqs, in2);
    }
    free(reqs);
}

/* ---- the reference: the two hand-written heaps this one replaced ---- */

/* before: the waiting heap's sifts with that order; NULL: the longest-prefill heap's, with
 * its own comparisons of ad_qtok (not logged). */
typedef struct ref_heap {
    tdm__req *h[N];
    uint32_t pos[N]; /* by id */
    uint32_t len;
    bool (*before)(const void *, const tdm__req *, const tdm__req *);
    cmp_log *log;
} ref_heap;

static void ref_set(ref_heap *q, uint32_t i, tdm__req *r);

static void ref_long_up(ref_heap *q, uint32_t i)
{
    tdm__req *r = q->h[i];
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (q->h[p]->ad_qtok >= r->ad_qtok) break;
        ref_set(q, i, q->h[p]);
        i = p;
    }
    ref_set(q, i, r);
}

static void ref_long_down(ref_heap *q, uint32_t i)
{
    tdm__req *r = q->h[i];
    for (;;) {
        uint32_t l = 2 * i + 1, m = l + 1, best = i;
        uint32_t bq = r->ad_qtok;
        if (l < q->len && q->h[l]->ad_qtok > bq) best = l, bq = q->h[l]->ad_qtok;
        if (m < q->len && q->h[m]->ad_qtok > bq) best = m;
        if (best == i) break;
        ref_set(q, i, q->h[best]);
        i = best;
    }
    ref_set(q, i, r);
}

static void ref_set(ref_heap *q, uint32_t i, tdm__req *r)
{
    q->h[i] = r;
    q->pos[r->id] = i;
}

static void ref_up(ref_heap *q, uint32_t i)
{
    if (!q->before) {
        ref_long_up(q, i);
        return;
    }
    tdm__req *r = q->h[i];
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!q->before(q->log, r, q->h[p])) break;
        ref_set(q, i, q->h[p]);
        i = p;
    }
    ref_set(q, i, r);
}

static void ref_down(ref_heap *q, uint32_t i)
{
    if (!q->before) {
        ref_long_down(q, i);
        return;
    }
    tdm__req *r = q->h[i];
    for (;;) {
        uint32_t l = 2 * i + 1, m = l + 1, best = i;
        tdm__req *bv = r;
        if (l < q->len && q->before(q->log, q->h[l], bv)) { best = l; bv = q->h[l]; }
        if (m < q->len && q->before(q->log, q->h[m], bv)) { best = m; bv = q->h[m]; }
        if (best == i) break;
        ref_set(q, i, bv);
        i = best;
    }
    ref_set(q, i, r);
}

static void ref_insert(ref_heap *q, tdm__req *r)
{
    q->h[q->len] = r;
    q->pos[r->id] = q->len++;
    ref_up(q, q->pos[r->id]);
}

static void ref_remove(ref_heap *q, uint32_t i)
{
    tdm__req *last = q->h[--q->len];
    if (i == q->len) return;
    ref_set(q, i, last);
    ref_up(q, i);
    ref_down(q, q->pos[last->id]);
}

static void same_as_reference(const tdm__heap_order *o, bool literal_long, uint32_t key_range)
{
    tdm__req *reqs = make_reqs(key_range);
    tdm__req *h[N];
    bool in[N] = { false };
    uint32_t len = 0;
    ref_heap *q = calloc(1, sizeof(*q));
    cmp_log *got = calloc(1, sizeof(*got)), *want = calloc(1, sizeof(*want));
    assert_true(q && got && want);
    q->before = literal_long ? NULL : o->before;
    q->log = want;
    uint64_t compared = 0;
    for (uint32_t k = 0; k < OPS; k++) {
        got->n = want->n = 0;
        if (len < N && (len == 0 || rnd(100) < 55)) {
            uint32_t j = rnd(N);
            while (in[j]) j = (j + 1) % N;
            in[j] = true;
            tdm__heap_insert(o, got, h, &len, &reqs[j]);
            ref_insert(q, &reqs[j]);
        } else {
            uint32_t i = rnd(len);
            in[h[i] - reqs] = false;
            tdm__heap_remove(o, got, h, &len, i);
            ref_remove(q, i);
        }
        assert_int_equal(len, q->len);
        assert_memory_equal(h, q->h, len * sizeof(h[0]));
        if (!literal_long) {
            assert_int_equal(got->n, want->n);
            assert_memory_equal(got->a, want->a, got->n * sizeof(got->a[0]));
            assert_memory_equal(got->b, want->b, got->n * sizeof(got->b[0]));
        }
        compared += got->n;
        for (uint32_t i = 0; i < len; i++) assert_int_equal(*tdm__heap_index(o, h[i]), q->pos[h[i]->id]);
    }
    assert_true(compared > OPS); /* the sifts did compare */
    free(q);
    free(got);
    free(want);
    free(reqs);
}

static void heap__same_arrays_and_comparisons_as_the_hand_written_heaps(void **state)
{
    (void)state;
    same_as_reference(&BY_KEY_SEQ, false, 20); /* the waiting heap's kind */
    same_as_reference(&BY_KEY_MAX, false, 8);  /* an order with many ties, the same sifts */
    same_as_reference(&BY_KEY_MAX, true, 8);   /* the longest-prefill heap's own code */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(heap__random_ops_strict_order),
        cmocka_unit_test(heap__random_ops_order_with_ties),
        cmocka_unit_test(heap__pops_come_out_in_order),
        cmocka_unit_test(heap__two_heaps_keep_their_own_positions),
        cmocka_unit_test(heap__same_arrays_and_comparisons_as_the_hand_written_heaps),
    };
    return cmocka_run_group_tests_name("sched_heap", tests, NULL, NULL);
}
