/*
 * heap.h -- the scheduler's binary heaps of requests (the waiting queue of a heap-ordered
 * policy in containers.c, SLO_ADAPTIVE's longest-prefill heap in slo_adaptive.c): one
 * implementation for both. A heap is an array of request pointers and its length, plus an
 * order (tdm__heap_order): `before(ctx, a, b)` says that a comes out before b, and each
 * request keeps its position in a uint32_t field of tdm__req (at index_off), so that it can
 * be removed from anywhere in O(log n). Element 0 is the first out. An element moves only
 * past one it is strictly before, so equal elements keep their places.
 *
 * Everything is static inline and each heap's order is a static const object: at every call
 * site the compiler knows the order function and the index field, and the sifts compile to
 * the code a heap written for that one order would be (no indirect call on the hot path).
 * The caller owns the array and its capacity: insert assumes room for one more.
 */
#ifndef TANDEM_SCHED_HEAP_H
#define TANDEM_SCHED_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tdm__req tdm__req;

typedef struct tdm__heap_order {
    /* true when a must come out before b (a strict order: false for equal elements) */
    bool (*before)(const void *ctx, const tdm__req *a, const tdm__req *b);
    size_t index_off; /* offsetof(tdm__req, the uint32_t field holding the position) */
} tdm__heap_order;

/* The position field of r under the order o. */
static inline uint32_t *tdm__heap_index(const tdm__heap_order *o, tdm__req *r)
{
    return (uint32_t *)(void *)((char *)r + o->index_off);
}

/* Put r at position i (and record i in r). */
static inline void tdm__heap_set(const tdm__heap_order *o, tdm__req **h, uint32_t i, tdm__req *r)
{
    h[i] = r;
    *tdm__heap_index(o, r) = i;
}

/* Move the element at i towards the root while it comes out before its parent. */
static inline void tdm__heap_up(const tdm__heap_order *o, const void *ctx, tdm__req **h, uint32_t i)
{
    tdm__req *r = h[i];
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!o->before(ctx, r, h[p])) break;
        tdm__heap_set(o, h, i, h[p]);
        i = p;
    }
    tdm__heap_set(o, h, i, r);
}

/* Move the element at i towards the leaves while a child comes out before it (the left
 * child first; the right one replaces it only when strictly before it). */
static inline void tdm__heap_down(const tdm__heap_order *o, const void *ctx, tdm__req **h, uint32_t len,
                                  uint32_t i)
{
    tdm__req *r = h[i];
    for (;;) {
        uint32_t l = 2 * i + 1, m = l + 1, best = i;
        tdm__req *bv = r;
        if (l < len && o->before(ctx, h[l], bv)) best = l, bv = h[l];
        if (m < len && o->before(ctx, h[m], bv)) best = m, bv = h[m];
        if (best == i) break;
        tdm__heap_set(o, h, i, bv);
        i = best;
    }
    tdm__heap_set(o, h, i, r);
}

/* Add r to the heap of *len elements (the array has room for one more). */
static inline void tdm__heap_insert(const tdm__heap_order *o, const void *ctx, tdm__req **h, uint32_t *len,
                                    tdm__req *r)
{
    uint32_t i = (*len)++;
    h[i] = r;
    tdm__heap_up(o, ctx, h, i);
}

/* Remove the element at position i (< *len): the last element takes its place and moves up
 * or down to where it belongs. The removed element's position field is left as it was. */
static inline void tdm__heap_remove(const tdm__heap_order *o, const void *ctx, tdm__req **h, uint32_t *len,
                                    uint32_t i)
{
    tdm__req *last = h[--*len];
    if (i == *len) return;
    tdm__heap_set(o, h, i, last);
    tdm__heap_up(o, ctx, h, i);
    tdm__heap_down(o, ctx, h, *len, *tdm__heap_index(o, last));
}

#endif
