/*
 * deferred_free.c -- vLLM 0.33+'s defer_block_free (vllm/v1/core/sched/scheduler.py,
 * _free_request_blocks and _drain_deferred_frees): with steps in flight (async scheduling or
 * pipeline parallelism) and a KV connector that loads KV into this engine (a consumer), a
 * step may still be writing the KV blocks of a request that finishes or is preempted, and a
 * load into those blocks, once reallocated, would not be ordered against that write. So the
 * blocks of a request freed while a step of it is in flight do not go back to the pool at
 * once: they wait, with the count of non-empty batches returned so far as their fence, until
 * that many batches have been reported by an update. Then they go back in the order vLLM
 * frees them: run after run in the order they were freed, each request's blocks tail first
 * (its last blocks are evicted first), hashed ones to the tail of the free queue and others
 * to its head, as an immediate free would have put them.
 *
 * With the parameter on, a running request with a step in flight is also never preempted:
 * when the victim is one, the running pass ends without scheduling the request that needed
 * the blocks (step.c), since a deferred free gives no block now.
 *
 * A batch counts when it schedules at least one token (vLLM advances its sequence only for
 * non-empty steps); an update counts as the report of the oldest batch not yet reported when
 * it lists at least one request or names a batch (vLLM's update_from_output of a non-empty
 * step). The rings never grow inside the calls that fill them: each public call that may free
 * blocks first reserves room for every reference the pool holds (no request can drop more),
 * so a free never fails. O(blocks freed) per free and per release; nothing allocated in
 * steady state.
 */
#include <string.h>

#include "sched_internal.h"

/* Grow the ring at *mem (capacity *cap, len elements from *head) to hold need elements,
 * unrolled so that it starts at 0. */
static int grow(void **mem, uint32_t *cap, uint32_t *head, uint32_t len, uint64_t need, size_t elem)
{
    if (need <= *cap) return TDM_OK;
    if (need > UINT32_MAX / 2) return TDM_E_NOMEM;
    uint32_t ncap = *cap ? *cap : 64;
    while (ncap < need) ncap *= 2;
    char *n = tdm__malloc((size_t)ncap * elem);
    if (!n) return TDM_E_NOMEM;
    /* unroll the ring: its elements from head on, then those that wrapped */
    char *o = *mem;
    uint32_t first = TDM_MIN(len, *cap - *head);
    if (first) memcpy(n, o + (size_t)*head * elem, (size_t)first * elem);
    if (len > first) memcpy(n + (size_t)first * elem, o, (size_t)(len - first) * elem);
    tdm__free(o);
    *mem = n;
    *cap = ncap;
    *head = 0;
    return TDM_OK;
}

int tdm__dfr_reserve(tdm_sched *s)
{
    if (!s->prm.defer_block_free) return TDM_OK;
    tdm__dfr *d = &s->dfr;
    /* Every deferred block holds one of the pool's references: num_refs bounds the ring. The
     * runs have distinct fences in (reported, batches] after merging, plus the new one. */
    void *b = d->blocks, *r = d->runs;
    int rc = grow(&b, &d->cap, &d->head, d->len, s->pool.num_refs, sizeof(uint32_t));
    d->blocks = b;
    if (!rc) rc = grow(&r, &d->rcap, &d->rhead, d->rlen, (d->batches - d->reported) + 1,
                       sizeof(tdm__dfr_run));
    d->runs = r;
    return rc;
}

/* Free the rings (the counters stay). */
void tdm__dfr_free(tdm__dfr *d)
{
    tdm__free(d->blocks);
    tdm__free(d->runs);
    d->blocks = NULL;
    d->runs = NULL;
    d->cap = d->head = d->len = d->rcap = d->rhead = d->rlen = 0;
}

/* Defer blocks[0..n) of a request freed while a step of it is in flight. False when they
 * should go back at once instead: every batch is reported, or (never, once reserved) no
 * room. */
bool tdm__dfr_defer(tdm_sched *s, const uint32_t *blocks, uint32_t n)
{
    tdm__dfr *d = &s->dfr;
    if (!n) return true;
    if (d->batches <= d->reported) return false; /* no batch in flight: free at once */
    bool merge = d->rlen && d->runs[(d->rhead + d->rlen - 1) % d->rcap].fence == d->batches;
    if ((uint64_t)d->len + n > d->cap || (!merge && d->rlen == d->rcap)) return false; /* not reserved */
    /* Stored in release order: the request's tail block first. */
    uint32_t at = (d->head + d->len) % d->cap;
    for (uint32_t k = n; k-- > 0;) {
        d->blocks[at] = blocks[k];
        if (++at == d->cap) at = 0;
    }
    d->len += n;
    if (merge) {
        d->runs[(d->rhead + d->rlen - 1) % d->rcap].count += n;
    } else {
        tdm__dfr_run *run = &d->runs[(d->rhead + d->rlen) % d->rcap];
        run->fence = d->batches;
        run->count = n;
        d->rlen++;
    }
    return true;
}

void tdm__dfr_batch_returned(tdm_sched *s) { s->dfr.batches++; }

void tdm__dfr_batch_reported(tdm_sched *s)
{
    tdm__dfr *d = &s->dfr;
    if (d->reported < d->batches) d->reported++;
    /* Fences are non-decreasing: stop at the first run still fenced. */
    while (d->rlen && d->runs[d->rhead].fence <= d->reported) {
        uint32_t n = d->runs[d->rhead].count;
        uint32_t first = TDM_MIN(n, d->cap - d->head);
        tdm__pool_release_in_order(&s->pool, d->blocks + d->head, first);
        if (n > first) tdm__pool_release_in_order(&s->pool, d->blocks, n - first);
        d->head = (d->head + n) % d->cap;
        d->len -= n;
        d->rhead = (d->rhead + 1) % d->rcap;
        d->rlen--;
    }
    if (!d->len) d->head = 0;
    if (!d->rlen) d->rhead = 0;
}
