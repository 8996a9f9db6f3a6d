/*
 * debug.c -- tdm__sched_check: a full audit of the scheduler's internal invariants, used by
 * the tests after every step (O(requests + blocks); never called by the library itself).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_debug.h"
#include "sched_internal.h"

#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (!(cond)) {                                     \
            if (msg && msg_len) snprintf(msg, msg_len, __VA_ARGS__); \
            rc = TDM_E_INTERNAL;                           \
            goto out;                                      \
        }                                                  \
    } while (0)

uint32_t tdm__sched_blocks_in_use(const tdm_sched *s)
{
    uint32_t n = 0;
    for (uint32_t b = 1; b < s->pool.num_blocks; b++) n += s->pool.blk[b].refcnt != 0;
    return n;
}

static bool in_list(const tdm__list *l, const tdm__req *r)
{
    for (const tdm__req *x = l->head; x; x = x->link.next)
        if (x == r) return true;
    return false;
}

int tdm__sched_check(const tdm_sched *s, char *msg, size_t msg_len)
{
    int rc = TDM_OK;
    const tdm__pool *p = &s->pool;
    uint32_t nb = p->num_blocks;
    uint32_t *refs = calloc(nb, sizeof(uint32_t));
    uint8_t *seen = calloc(nb + 1, 1);
    if (!refs || !seen) {
        free(refs);
        free(seen);
        return TDM_E_NOMEM;
    }
    if (msg && msg_len) msg[0] = '\0';

    /* Every live request: state, container, block table. */
    uint32_t live = 0, n_kvl = 0, n_wait = 0, n_run = 0, n_remote = 0, n_held = 0, n_fin = 0, n_long = 0;
    for (uint32_t i = 0; s->map && i <= s->map_mask; i++) {
        const tdm__req *r = s->map[i];
        if (!r) continue;
        live++;
        CHECK(tdm__map_get(s, r->id) == r, "request %llu is not reachable through the id map",
              (unsigned long long)r->id);
        CHECK(r->num_blocks <= r->cap_blocks || !r->blocks, "request %llu: %u blocks > capacity %u",
              (unsigned long long)r->id, r->num_blocks, r->cap_blocks);
        CHECK(r->num_tokens >= r->num_prompt, "request %llu: fewer tokens than its prompt", (unsigned long long)r->id);
        for (uint32_t k = 0; k < r->num_blocks; k++) {
            uint32_t b = r->blocks[k];
            CHECK(b > 0 && b < nb, "request %llu holds invalid block %u", (unsigned long long)r->id, b);
            refs[b]++;
            if (refs[b] > 1)
                CHECK(p->blk[b].hashed, "block %u is held by two requests but is not a cached (hashed) block", b);
        }
        switch (r->state) {
        case TDM_STATE_WAITING:
        case TDM_STATE_PREEMPTED:
            if (r->queue) {
                n_kvl++;
                CHECK(in_list(r->queue == TDM__Q_HOLD ? &s->kv_hold : &s->kv_async, r),
                      "request %llu is not in its load queue", (unsigned long long)r->id);
                CHECK(r->queue == TDM__Q_HOLD || r->num_blocks == 0,
                      "request %llu waits to load but holds %u blocks", (unsigned long long)r->id, r->num_blocks);
                break;
            }
            n_wait++;
            if (tdm__waiting_uses_heap(s))
                CHECK(r->heap_index < s->heap_len && s->heap[r->heap_index] == r,
                      "waiting request %llu is not in the heap", (unsigned long long)r->id);
            else
                CHECK(in_list(&s->waiting, r), "waiting request %llu is not in the deque", (unsigned long long)r->id);
            if (r->ad_in_long) {
                n_long++;
                CHECK(r->ad_long_index < s->ad_long_len && s->ad_long[r->ad_long_index] == r,
                      "waiting request %llu is not at its place in the longest-prefill heap",
                      (unsigned long long)r->id);
                CHECK(r->ad_long_index == 0 || s->ad_long[(r->ad_long_index - 1) / 2]->ad_qtok >= r->ad_qtok,
                      "longest-prefill heap out of order at request %llu", (unsigned long long)r->id);
                CHECK(!r->ad_late, "demoted request %llu is in the longest-prefill heap", (unsigned long long)r->id);
            }
            CHECK(r->num_blocks == 0 || r->remote_done, "waiting request %llu holds %u blocks",
                  (unsigned long long)r->id, r->num_blocks);
            CHECK(!r->num_placeholders, "waiting request %llu holds %u output placeholders",
                  (unsigned long long)r->id, r->num_placeholders);
            break;
        case TDM_STATE_RUNNING:
            n_run++;
            CHECK(r->run_index < s->num_running && s->running[r->run_index] == r,
                  "running request %llu is not at its running index", (unsigned long long)r->id);
            CHECK((uint64_t)r->num_computed <= (uint64_t)r->num_tokens + r->num_placeholders + r->num_spec_sched,
                  "running request %llu: %u computed > %u tokens + %u placeholders + %u scheduled drafts",
                  (unsigned long long)r->id, r->num_computed, r->num_tokens, r->num_placeholders,
                  r->num_spec_sched);
            CHECK(!r->num_placeholders || (s->prm.async_scheduling && r->pend_n),
                  "running request %llu: %u output placeholders without async scheduling or a step "
                  "in flight", (unsigned long long)r->id, r->num_placeholders);
            CHECK((uint64_t)r->num_blocks * s->prm.block_size >= TDM_MIN(r->num_computed, (uint32_t)s->prm.max_model_len),
                  "running request %llu: %u blocks cannot hold %u computed tokens", (unsigned long long)r->id,
                  r->num_blocks, r->num_computed);
            break;
        case TDM_STATE_WAITING_REMOTE_KV:
            n_remote++;
            CHECK(in_list(&s->remote, r), "remote-KV request %llu is not in the remote list", (unsigned long long)r->id);
            break;
        case TDM_STATE_FINISHED_HELD:
            if (r->hold == HOLD_RECV) {
                n_remote++;
                CHECK(in_list(&s->remote, r), "aborted receive %llu is not in the remote list", (unsigned long long)r->id);
            } else {
                n_held++;
                CHECK(r->hold == HOLD_SEND && in_list(&s->held, r), "held request %llu is not in the held list",
                      (unsigned long long)r->id);
            }
            break;
        case TDM_STATE_FINISHED:
            n_fin++;
            CHECK(r->num_blocks == 0, "finished request %llu still holds %u blocks", (unsigned long long)r->id,
                  r->num_blocks);
            break;
        default:
            CHECK(0, "request %llu has invalid state %u", (unsigned long long)r->id, r->state);
        }
    }
    /* Blocks waiting in the deferred-free queue each hold one reference. */
    const tdm__dfr *d = &s->dfr;
    CHECK(!d->len || s->prm.defer_block_free, "%u deferred blocks with defer_block_free off", d->len);
    CHECK(d->reported <= d->batches, "%llu batches reported of %llu returned",
          (unsigned long long)d->reported, (unsigned long long)d->batches);
    uint64_t run_blocks = 0, prev_fence = 0;
    for (uint32_t i = 0; i < d->rlen; i++) {
        const tdm__dfr_run *run = &d->runs[(d->rhead + i) % d->rcap];
        CHECK(run->count > 0 && run->fence > d->reported && run->fence >= prev_fence && run->fence <= d->batches,
              "deferred run %u: %u blocks fenced at %llu (reported %llu, returned %llu, previous fence %llu)",
              i, run->count, (unsigned long long)run->fence, (unsigned long long)d->reported,
              (unsigned long long)d->batches, (unsigned long long)prev_fence);
        prev_fence = run->fence;
        run_blocks += run->count;
    }
    CHECK(run_blocks == d->len, "deferred runs hold %llu blocks, the ring %u", (unsigned long long)run_blocks,
          d->len);
    for (uint32_t i = 0; i < d->len; i++) {
        uint32_t b = d->blocks[(d->head + i) % d->cap];
        CHECK(b > 0 && b < nb, "the deferred-free queue holds invalid block %u", b);
        refs[b]++;
        if (refs[b] > 1)
            CHECK(p->blk[b].hashed, "deferred block %u has another holder but is not a cached (hashed) block", b);
    }
    CHECK(live == s->map_len, "id map counts %u requests, %u found", s->map_len, live);
    CHECK(n_wait == tdm__waiting_len(s), "%u waiting requests, queue length %u", n_wait, tdm__waiting_len(s));
    CHECK(n_kvl == tdm__kvl_waiting(s), "%u requests in load queues, their lengths %u", n_kvl,
          tdm__kvl_waiting(s));
    CHECK(n_long == s->ad_long_len, "%u requests in the longest-prefill heap, its length %u", n_long, s->ad_long_len);
    CHECK(n_run == s->num_running, "%u running requests, running array %u", n_run, s->num_running);
    CHECK(s->num_running <= (uint64_t)s->prm.max_num_seqs || s->num_running <= s->cap_running,
          "running %u exceeds capacity", s->num_running);
    CHECK(n_remote == s->remote.len && n_held == s->held.len, "remote/held list lengths disagree");

    /* Blocks: refcounts equal holders; the free queue is exactly the unreferenced blocks. */
    CHECK(p->blk[0].refcnt == 1, "the null block's refcount is %u", p->blk[0].refcnt);
    for (uint32_t b = 1; b < nb; b++)
        CHECK(p->blk[b].refcnt == refs[b], "block %u: refcount %u but %u holders", b, p->blk[b].refcnt, refs[b]);
    uint32_t nfree = 0;
    for (uint32_t b = p->blk[nb].next; b != nb; b = p->blk[b].next) {
        CHECK(b > 0 && b < nb && !seen[b], "free queue is corrupt at block %u", b);
        seen[b] = 1;
        CHECK(p->blk[b].refcnt == 0, "free block %u has refcount %u", b, p->blk[b].refcnt);
        CHECK(p->blk[p->blk[b].prev].next == b, "free queue links broken at %u", b);
        nfree++;
    }
    CHECK(nfree == p->num_free, "free queue holds %u blocks, counter says %u", nfree, p->num_free);
    uint32_t in_use = 0;
    uint64_t total_refs = 0;
    for (uint32_t b = 1; b < nb; b++) {
        in_use += p->blk[b].refcnt != 0;
        total_refs += p->blk[b].refcnt;
    }
    CHECK(total_refs == p->num_refs, "blocks hold %llu references, the pool counts %llu",
          (unsigned long long)total_refs, (unsigned long long)p->num_refs);
    CHECK(nfree + in_use == nb - 1, "free %u + in use %u != total %u", nfree, in_use, nb - 1);

    /* The hash index maps only to hashed blocks, and every hashed block is indexed. */
    uint32_t indexed = 0;
    for (uint32_t i = 0; i <= p->slot_mask; i++) {
        uint32_t b = p->slots[i].block;
        if (b == TDM__NO_BLOCK) continue;
        CHECK(b > 0 && b < nb && p->blk[b].hashed, "index slot %u names unhashed block %u", i, b);
        CHECK(tdm__pool_indexed(p, b), "block %u is not found by its own hash (or its slot key is stale)", b);
        indexed++;
    }
    uint32_t hashed = 0;
    for (uint32_t b = 1; b < nb; b++) hashed += p->blk[b].hashed;
    CHECK(indexed == hashed && hashed == p->num_hashed, "%u indexed, %u hashed, counter %u", indexed, hashed,
          p->num_hashed);
out:
    free(refs);
    free(seen);
    return rc;
}

uint32_t tdm__sched_num_cached(const tdm_sched *s) { return s->pool_ready ? s->pool.num_hashed : 0; }

int tdm__sched_is_cached(const tdm_sched *s, const uint8_t digest[32])
{
    if (!s->pool_ready) return 0;
    tdm__digest d;
    memcpy(&d, digest, sizeof(d));
    return tdm__pool_lookup(&s->pool, d) != TDM__NO_BLOCK;
}
