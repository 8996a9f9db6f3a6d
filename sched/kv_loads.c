/*
 * kv_loads.c -- the remote-KV load queues of vLLM 0.33/0.34 (reference: vLLM 0.34's
 * vllm/v1/core/sched/scheduler.py, kv_holding_waiting, async_kv_waiting,
 * max_num_inflight_kv_loads, _inflight_prefill_reserved_blocks).
 *
 * With kv_load_queues on, a request whose remote KV has arrived (or failed) waits in
 * `kv_hold`, which each step drains before the waiting queue, in the order the loads started
 * (FCFS) or in priority order; and a load starts only if the blocks it takes fit in the free
 * blocks less the blocks still needed, for their whole prompt, by the running requests that
 * are prefilling and by the other loads (receiving, or received and not yet running), so
 * that a load, which cannot be preempted, never takes blocks an admitted prefill relies on.
 *
 * With max_inflight_kv_loads N > 0 (which implies the above), requests added with
 * TDM_REQ_MAY_LOAD_ASYNC wait in `kv_async` instead of the waiting queue; each step takes
 * the head of the waiting queue or of kv_async, whichever arrived first (priority order with
 * the PRIORITY policy); and once no running slot or token is left, the step still starts
 * the loads at the head of kv_async, since a load takes neither until its KV has arrived.
 * A load starts only while fewer than N loads hold blocks without running (receiving,
 * received and waiting for a running slot, or aborted while receiving).
 *
 * Both lists are short (loads), kept sorted by insertion from the tail; the reservation is
 * summed over the running requests when a load is considered, as vLLM sums it.
 */
#include "sched_internal.h"

uint32_t tdm__kvl_waiting(const tdm_sched *s) { return s->kv_hold.len + s->kv_async.len; }

/* a before b under a policy other than FCFS: the policy's order, then the order added */
static bool policy_before(const tdm_sched *s, const tdm__req *a, const tdm__req *b)
{
    int c = tdm__policy_compare(s, a, b);
    return c < 0 || (c == 0 && a->seq < b->seq);
}

/* a before b in queue q */
static bool goes_before(const tdm_sched *s, const tdm__req *a, const tdm__req *b, int q)
{
    if (s->prm.policy == TDM_POLICY_FCFS)
        return q == TDM__Q_HOLD ? a->load_seq < b->load_seq : a->seq < b->seq;
    return policy_before(s, a, b);
}

void tdm__kvl_push(tdm_sched *s, tdm__req *r, int q)
{
    tdm__list *l = q == TDM__Q_HOLD ? &s->kv_hold : &s->kv_async;
    tdm__req *after = l->tail;
    while (after && goes_before(s, r, after, q)) after = after->link.prev;
    r->queue = (uint8_t)q;
    if (!after) {
        tdm__list_push_front(l, r);
        return;
    }
    r->link.prev = after;
    r->link.next = after->link.next;
    if (after->link.next) after->link.next->link.prev = r;
    else l->tail = r;
    after->link.next = r;
    l->len++;
}

void tdm__kvl_remove(tdm_sched *s, tdm__req *r)
{
    tdm__list_remove(r->queue == TDM__Q_HOLD ? &s->kv_hold : &s->kv_async, r);
    r->queue = 0;
}

/* vLLM's choice per admission: kv_holding_waiting while it holds any; else the waiting
 * queue or the load queue, whichever head goes first; with no running slot or token left,
 * the load queue only (its loads take neither). */
int tdm__kvl_next_queue(const tdm_sched *s, bool loads_only, bool take_async)
{
    if (loads_only) return take_async && s->kv_async.len ? TDM__Q_ASYNC : TDM__Q_NONE;
    if (s->kv_hold.len) return TDM__Q_HOLD;
    bool wait = tdm__waiting_len(s) != 0;
    if (!take_async || !s->kv_async.len) return wait ? TDM__Q_WAIT : TDM__Q_NONE;
    if (!wait) return TDM__Q_ASYNC;
    const tdm__req *a = s->kv_async.head, *w = tdm__waiting_peek(s);
    if (s->prm.policy == TDM_POLICY_FCFS) return a->arrival < w->arrival ? TDM__Q_ASYNC : TDM__Q_WAIT;
    return policy_before(s, a, w) ? TDM__Q_ASYNC : TDM__Q_WAIT;
}

tdm__req *tdm__kvl_peek(const tdm_sched *s, int q)
{
    if (q == TDM__Q_HOLD) return s->kv_hold.head;
    if (q == TDM__Q_ASYNC) return s->kv_async.head;
    return tdm__waiting_peek(s);
}

void tdm__kvl_pop(tdm_sched *s, int q)
{
    if (q == TDM__Q_WAIT) tdm__waiting_pop(s);
    else tdm__kvl_remove(s, q == TDM__Q_HOLD ? s->kv_hold.head : s->kv_async.head);
}

bool tdm__kvl_admits_load(const tdm_sched *s)
{
    int64_t cap = s->prm.max_inflight_kv_loads;
    /* the remote list: receiving, and aborted while receiving; kv_hold: received */
    return cap == 0 || (int64_t)s->remote.len + (int64_t)s->kv_hold.len < cap;
}

/* Blocks r still needs to hold its whole sequence (vLLM's _request_remaining_blocks). */
static uint32_t remaining_blocks(const tdm_sched *s, const tdm__req *r)
{
    uint32_t full = tdm__cdiv(TDM_MIN((uint64_t)r->num_tokens, (uint64_t)s->prm.max_model_len),
                              (uint64_t)s->prm.block_size);
    return full > r->num_blocks ? full - r->num_blocks : 0;
}

uint64_t tdm__kvl_reserved_blocks(const tdm_sched *s)
{
    if (!tdm__kvl_on(s)) return 0;
    uint64_t n = 0;
    for (uint32_t i = 0; i < s->num_running; i++)
        if (s->running[i] && s->running[i]->kvl_prefill) n += remaining_blocks(s, s->running[i]);
    for (const tdm__req *r = s->remote.head; r; r = r->link.next)
        if (r->state == TDM_STATE_WAITING_REMOTE_KV) n += remaining_blocks(s, r);
    for (const tdm__req *r = s->kv_hold.head; r; r = r->link.next) n += remaining_blocks(s, r);
    return n;
}

void tdm__kvl_received(tdm_sched *s, tdm__req *r, uint32_t cache_upto)
{
    r->kvl_promote = true;
    r->kvl_cache_upto = cache_upto;
    tdm__kvl_push(s, r, TDM__Q_HOLD);
}

/* vLLM's _update_waiting_for_remote_kv, run when the waiting pass first reaches the request:
 * the blocks that arrived join the prefix cache (all the tokens received, the last prompt
 * token included); a failed load with no valid token gives its blocks back, so that the
 * request looks the prefix cache up again. */
void tdm__kvl_promote(tdm_sched *s, tdm__req *r)
{
    r->kvl_promote = false;
    if (r->kvl_cache_upto) tdm__cache_full_blocks(s, r, r->kvl_cache_upto);
    else tdm__req_free_blocks(s, r);
}
