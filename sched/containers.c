/*
 * containers.c -- the scheduler's containers: growable arrays, intrusive request lists, the
 * request-id map (open addressing with backward-shift deletion) and the waiting queue (an
 * intrusive deque for FCFS, a binary heap ordered by the policy otherwise).
 */
#include <stddef.h>
#include <string.h>

#include "heap.h"
#include "sched_internal.h"

/* ---- growable arrays ---- */

int tdm__vec_reserve(tdm__vec *v, uint32_t n, size_t elem)
{
    if (n <= v->cap) return TDM_OK;
    uint32_t cap = v->cap ? v->cap : 16;
    while (cap < n) cap = cap > UINT32_MAX / 2 ? n : cap * 2;
    void *d = tdm__realloc(v->data, (size_t)cap * elem);
    if (!d) return TDM_E_NOMEM;
    v->data = d;
    v->cap = cap;
    return TDM_OK;
}

void tdm__vec_free(tdm__vec *v)
{
    tdm__free(v->data);
    memset(v, 0, sizeof(*v));
}

/* ---- intrusive lists ---- */

void tdm__list_push_back(tdm__list *l, tdm__req *r)
{
    r->link.next = NULL;
    r->link.prev = l->tail;
    if (l->tail) l->tail->link.next = r;
    else l->head = r;
    l->tail = r;
    l->len++;
}

void tdm__list_push_front(tdm__list *l, tdm__req *r)
{
    r->link.prev = NULL;
    r->link.next = l->head;
    if (l->head) l->head->link.prev = r;
    else l->tail = r;
    l->head = r;
    l->len++;
}

void tdm__list_remove(tdm__list *l, tdm__req *r)
{
    if (r->link.prev) r->link.prev->link.next = r->link.next;
    else l->head = r->link.next;
    if (r->link.next) r->link.next->link.prev = r->link.prev;
    else l->tail = r->link.prev;
    r->link.prev = r->link.next = NULL;
    l->len--;
}

/* ---- id map ---- */

static inline uint32_t map_home(const tdm_sched *s, uint64_t id)
{
    return (uint32_t)tdm__mix64(id) & s->map_mask;
}

tdm__req *tdm__map_get(const tdm_sched *s, uint64_t id)
{
    if (!s->map) return NULL;
    for (uint32_t i = map_home(s, id);; i = (i + 1) & s->map_mask) {
        tdm__req *r = s->map[i];
        if (!r) return NULL;
        if (r->id == id) return r;
    }
}

static void map_insert(tdm__req **map, uint32_t mask, tdm__req *r)
{
    uint32_t i = (uint32_t)tdm__mix64(r->id) & mask;
    while (map[i]) i = (i + 1) & mask;
    map[i] = r;
}

int tdm__map_put(tdm_sched *s, tdm__req *r)
{
    if (!s->map || (uint64_t)(s->map_len + 1) * 2 > (uint64_t)s->map_mask + 1) {
        uint32_t cap = s->map ? (s->map_mask + 1) * 2 : 64;
        tdm__req **nm = tdm__calloc(cap, sizeof(*nm));
        if (!nm) return TDM_E_NOMEM;
        if (s->map) {
            for (uint32_t i = 0; i <= s->map_mask; i++)
                if (s->map[i]) map_insert(nm, cap - 1, s->map[i]);
            tdm__free(s->map);
        }
        s->map = nm;
        s->map_mask = cap - 1;
    }
    map_insert(s->map, s->map_mask, r);
    s->map_len++;
    return TDM_OK;
}

void tdm__map_del(tdm_sched *s, uint64_t id)
{
    uint32_t i = map_home(s, id);
    while (s->map[i] && s->map[i]->id != id) i = (i + 1) & s->map_mask;
    if (!s->map[i]) return;
    s->map_len--;
    for (;;) {
        s->map[i] = NULL;
        uint32_t j = i;
        for (;;) {
            j = (j + 1) & s->map_mask;
            tdm__req *c = s->map[j];
            if (!c) return;
            uint32_t home = map_home(s, c->id);
            if (((j - home) & s->map_mask) >= ((j - i) & s->map_mask)) {
                s->map[i] = c;
                i = j;
                break;
            }
        }
    }
}

/* ---- waiting queue ---- */

bool tdm__waiting_uses_heap(const tdm_sched *s) { return s->prm.policy != TDM_POLICY_FCFS; }

uint32_t tdm__waiting_len(const tdm_sched *s)
{
    return tdm__waiting_uses_heap(s) ? s->heap_len : s->waiting.len;
}

tdm__req *tdm__waiting_peek(const tdm_sched *s)
{
    if (tdm__waiting_uses_heap(s)) return s->heap_len ? s->heap[0] : NULL;
    return s->waiting.head;
}

/* The waiting heap's order: the policy's, ties by arrival, then add order. */
static bool waiting_before(const void *ctx, const tdm__req *a, const tdm__req *b)
{
    int c = tdm__policy_compare(ctx, a, b);
    if (c) return c < 0;
    if (a->arrival != b->arrival) return a->arrival < b->arrival;
    return a->seq < b->seq;
}

static const tdm__heap_order WAITING_ORDER = { waiting_before, offsetof(tdm__req, heap_index) };

int tdm__heap_reserve(tdm_sched *s, uint32_t n)
{
    if (n <= s->heap_cap) return TDM_OK;
    uint32_t cap = s->heap_cap ? s->heap_cap : 64;
    while (cap < n) cap *= 2;
    tdm__req **h = tdm__realloc(s->heap, (size_t)cap * sizeof(*h));
    if (!h) return TDM_E_NOMEM;
    s->heap = h;
    /* SLO_ADAPTIVE's second heap (the longest waiting prefill) holds a subset of the waiting
     * heap: the same capacity. A failure here leaves heap_cap, so the next call retries. */
    tdm__req **l = tdm__realloc(s->ad_long, (size_t)cap * sizeof(*l));
    if (!l) return TDM_E_NOMEM;
    s->ad_long = l;
    s->heap_cap = cap;
    return TDM_OK;
}

int tdm__waiting_reserve(tdm_sched *s, uint32_t n)
{
    return tdm__waiting_uses_heap(s) ? tdm__heap_reserve(s, n) : TDM_OK;
}

static int heap_push(tdm_sched *s, tdm__req *r)
{
    int rc = tdm__waiting_reserve(s, s->heap_len + 1);
    if (rc) return rc;
    if (s->prm.policy == TDM_POLICY_SLO_ADAPTIVE) tdm__ad_queued(s, r, true);
    tdm__heap_insert(&WAITING_ORDER, s, s->heap, &s->heap_len, r);
    return TDM_OK;
}

static void heap_remove(tdm_sched *s, tdm__req *r)
{
    uint32_t i = r->heap_index;
    if (s->prm.policy == TDM_POLICY_SLO_ADAPTIVE) tdm__ad_queued(s, r, false);
    tdm__heap_remove(&WAITING_ORDER, s, s->heap, &s->heap_len, i);
}

void tdm__waiting_pop(tdm_sched *s)
{
    if (tdm__waiting_uses_heap(s)) heap_remove(s, s->heap[0]);
    else tdm__list_remove(&s->waiting, s->waiting.head);
}

int tdm__waiting_push(tdm_sched *s, tdm__req *r)
{
    if (tdm__waiting_uses_heap(s)) return heap_push(s, r);
    tdm__list_push_back(&s->waiting, r);
    return TDM_OK;
}

/* A preempted request goes back to the front (FCFS) or into the heap by its key, as vLLM's
 * prepend_request does. The heap has room: it held the request once and capacity never
 * shrinks, and requeued requests come from running (bounded by max_num_seqs, reserved). */
int tdm__waiting_requeue(tdm_sched *s, tdm__req *r)
{
    if (tdm__waiting_uses_heap(s)) return heap_push(s, r);
    tdm__list_push_front(&s->waiting, r);
    return TDM_OK;
}

/* A request whose remote KV arrived (or failed and will be recomputed). In vLLM it never left
 * the waiting queue: skipped while receiving, it is prepended back each step, so received
 * requests sit at the front in their original order. Here: after the received requests at the
 * front that were added before it. The heap orders it by its key. */
int tdm__waiting_requeue_received(tdm_sched *s, tdm__req *r)
{
    if (tdm__waiting_uses_heap(s)) return heap_push(s, r);
    tdm__req *after = NULL;
    for (tdm__req *x = s->waiting.head; x && x->remote_done && x->num_blocks && x->seq < r->seq;
         x = x->link.next)
        after = x;
    if (!after) {
        tdm__list_push_front(&s->waiting, r);
        return TDM_OK;
    }
    r->link.prev = after;
    r->link.next = after->link.next;
    if (after->link.next) after->link.next->link.prev = r;
    else s->waiting.tail = r;
    after->link.next = r;
    s->waiting.len++;
    return TDM_OK;
}

void tdm__waiting_remove(tdm_sched *s, tdm__req *r)
{
    if (tdm__waiting_uses_heap(s)) heap_remove(s, r);
    else tdm__list_remove(&s->waiting, r);
}
