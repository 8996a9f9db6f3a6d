/*
 * cache_aware.c -- cache-aware admission (vLLM 0.34's cache_aware_admission_window): before
 * the waiting pass of a step, the first `cache_aware_window` waiting requests are reordered
 * so that those whose prompt prefix is already in the prefix cache come first, deepest
 * cached prefix first, arrival order breaking ties. Only requests that are merely waiting
 * (state WAITING, nothing computed) move, and only among the positions such requests hold:
 * a preempted request, or one holding received KV, keeps its exact place. Applied with the
 * FCFS policy and prefix caching only, and only once the KV cache usage reaches
 * `cache_aware_threshold`. The cost is one prefix-cache probe per request in the window
 * (no block is taken, no reference, no event); the scratch array grows to the window once.
 */
#include <string.h>

#include "sched_internal.h"

typedef struct ca_slot {
    tdm__req *req;
    uint32_t depth; /* cached prefix, in tokens */
    uint32_t pos;   /* position in the window */
} ca_slot;

/* vLLM's kv_cache_manager.get_num_cached_tokens: the cached full blocks prefixing the
 * request's tokens, capped so that the last token is recomputed, ignoring a hit limit other
 * than 0 (a request that reads nothing from the cache probes nothing). */
static uint32_t cached_depth(const tdm_sched *s, const tdm__req *r)
{
    if ((r->flags & TDM_REQ_SKIP_PREFIX_CACHE) || ((r->flags & TDM_REQ_PREFIX_HIT_LIMIT) && !r->hit_limit))
        return 0;
    uint32_t bs = (uint32_t)s->prm.block_size;
    uint32_t max_blocks = (r->num_tokens - 1) / bs;
    uint32_t h = 0;
    for (; h < max_blocks && h < r->num_hashes; h++)
        if (tdm__pool_lookup(&s->pool, *tdm__req_digest(r, h)) == TDM__NO_BLOCK) break;
    return h * bs;
}

/* Whether x goes before y: deeper cached prefix first, then window position (a total order:
 * positions differ). */
static inline bool before(const ca_slot *x, const ca_slot *y)
{
    return x->depth != y->depth ? x->depth > y->depth : x->pos < y->pos;
}

/* Sort v[0..n) by `before` with tmp[0..n) as room: a bottom-up merge sort, so that a step
 * never allocates (glibc's qsort mallocs its own buffer from 1 KiB, 64 slots, up). The
 * result is in v. */
static void sort_slots(ca_slot *v, ca_slot *tmp, uint32_t n)
{
    ca_slot *src = v, *dst = tmp;
    for (uint32_t w = 1; w < n; w *= 2) {
        for (uint32_t lo = 0; lo < n; lo += 2 * w) {
            uint32_t mid = TDM_MIN(lo + w, n), hi = TDM_MIN(lo + 2 * w, n), i = lo, j = mid, k = lo;
            while (i < mid && j < hi) dst[k++] = before(&src[j], &src[i]) ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        ca_slot *t = src;
        src = dst;
        dst = t;
    }
    if (src != v) memcpy(v, src, (size_t)n * sizeof(*v));
}

void tdm__cache_aware_reorder(tdm_sched *s)
{
    uint32_t window = (uint32_t)s->prm.cache_aware_window;
    if (!window || s->prm.policy != TDM_POLICY_FCFS || !s->prm.enable_prefix_caching ||
        s->waiting.len < 2)
        return;
    uint32_t total = s->pool.num_blocks - 1; /* the null block is not counted (vLLM) */
    double usage = total ? 1.0 - (double)s->pool.num_free / (double)total : 0.0;
    if (usage < (double)s->prm.cache_aware_threshold_ppm / 1e6) return;
    uint32_t n = TDM_MIN(window, s->waiting.len);
    /* The scratch holds the window three times: the slots, the requests in their new order,
     * and the sort's room. It only grows (to the largest window seen); failing that, nothing
     * is reordered. */
    if (tdm__vec_reserve(&s->ca_scratch, 3 * n, sizeof(ca_slot))) return;
    ca_slot *slots = s->ca_scratch.data;
    ca_slot *head = slots + n;
    uint32_t nslots = 0, i = 0;
    for (tdm__req *r = s->waiting.head; r && i < n; r = r->link.next, i++) {
        head[i].req = r;
        if (r->state == TDM_STATE_WAITING && r->num_computed == 0 && !r->num_blocks)
            slots[nslots++] = (ca_slot){ r, 0, i };
    }
    if (nslots < 2) return;
    bool moved = false;
    for (uint32_t k = 0; k < nslots; k++) slots[k].depth = cached_depth(s, slots[k].req);
    for (uint32_t k = 1; k < nslots && !moved; k++) moved = slots[k].depth > slots[k - 1].depth;
    if (!moved) return; /* already deepest first */
    /* The slots' window positions, in order (head[k].pos is free for it), then the slots
     * sorted by depth go to those positions. */
    for (uint32_t k = 0; k < nslots; k++) head[k].pos = slots[k].pos;
    sort_slots(slots, slots + 2 * (size_t)n, nslots);
    for (uint32_t k = 0; k < nslots; k++) head[head[k].pos].req = slots[k].req;
    /* Relink: the window's nodes out, then back at the front in the new order. */
    for (uint32_t k = 0; k < n; k++) tdm__list_remove(&s->waiting, s->waiting.head);
    for (uint32_t k = n; k-- > 0;) tdm__list_push_front(&s->waiting, head[k].req);
}
