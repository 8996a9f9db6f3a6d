/*
 * request.c -- the life of a request record: creation from a tdm_request_desc, the run
 * arrays allocated at first admission (tokens, block table, block hashes, drafts), block
 * hashing, freeing blocks, preemption, finishing (with the delayed-free holds of P/D roles)
 * and destruction. Moving between containers happens only through these functions.
 */
#include <string.h>

#include "sched_internal.h"

/* ---- the run-buffer cache ---- */

static uint8_t size_class(size_t bytes)
{
    uint8_t c = 8; /* 256 bytes at least */
    while (((size_t)1 << c) < bytes) c++;
    return c;
}

static void *run_buf_get(tdm_sched *s, uint8_t cls)
{
    void *m = s->run_cache[cls];
    if (m) {
        memcpy(&s->run_cache[cls], m, sizeof(void *)); /* next link lives in the buffer */
        s->run_cached--;
        return m;
    }
    return tdm__malloc((size_t)1 << cls);
}

static void run_buf_put(tdm_sched *s, void *m, uint8_t cls)
{
    if (s->run_cached >= s->run_cache_max) {
        tdm__free(m);
        return;
    }
    memcpy(m, &s->run_cache[cls], sizeof(void *));
    s->run_cache[cls] = m;
    s->run_cached++;
}

void tdm__run_cache_free(tdm_sched *s)
{
    for (size_t c = 0; c < TDM_ARRAY_LEN(s->run_cache); c++) {
        void *m = s->run_cache[c];
        while (m) {
            void *next;
            memcpy(&next, m, sizeof(void *));
            tdm__free(m);
            m = next;
        }
        s->run_cache[c] = NULL;
    }
    s->run_cached = 0;
}

void tdm__req_destroy(tdm_sched *s, tdm__req *r)
{
    if (r->run_mem) run_buf_put(s, r->run_mem, r->run_class);
    tdm__free(r->alloc);
}

/* Allocate the arrays a request needs once admitted, sized for its whole life so that no
 * step allocates: tokens up to min(prompt + max_tokens, max_model_len), blocks and hashes to
 * cover them plus the lookahead, and the draft buffer. */
int tdm__req_prepare_run(tdm_sched *s, tdm__req *r)
{
    if (r->run_mem) return TDM_OK;
    uint64_t bs = (uint64_t)s->prm.block_size;
    uint64_t look = (uint64_t)s->prm.num_lookahead_tokens;
    uint64_t cap_tokens = TDM_MIN((uint64_t)r->num_prompt + r->max_tokens, (uint64_t)s->prm.max_model_len);
    uint64_t cap_blocks = tdm__cdiv(TDM_MIN(cap_tokens + look, (uint64_t)s->prm.max_model_len + look), bs);
    /* the prompt digests known now stay in the record's allocation (tdm__req_digest) */
    size_t sz_hash = (size_t)(cap_blocks - TDM_MIN(cap_blocks, (uint64_t)r->num_host_hashes)) * sizeof(tdm__digest);
    size_t sz_tok = (size_t)cap_tokens * sizeof(tdm_token);
    size_t sz_blk = (size_t)cap_blocks * sizeof(uint32_t);
    size_t sz_spec = (size_t)look * sizeof(tdm_token);
    size_t total = sz_hash + sz_tok + sz_blk + sz_spec;
    if (total >= ((size_t)1 << 39)) return TDM_E_NOMEM;
    uint8_t cls = size_class(total);
    char *m = run_buf_get(s, cls);
    if (!m) return TDM_E_NOMEM;
    r->run_mem = m;
    r->run_class = cls;
    r->hashes = (tdm__digest *)m;
    r->tokens = (tdm_token *)(m + sz_hash);
    r->blocks = (uint32_t *)(m + sz_hash + sz_tok);
    r->spec = (tdm_token *)(m + sz_hash + sz_tok + sz_blk);
    r->cap_tokens = (uint32_t)cap_tokens;
    r->cap_blocks = (uint32_t)cap_blocks;
    memcpy(r->tokens, r->prompt, (size_t)r->num_prompt * sizeof(tdm_token));
    return TDM_OK;
}

/* Extend the request's block digests over every full block of its known tokens (host
 * digests: take those the host gave; a block without one stays unhashed). A failing
 * library call stops the extension: those blocks are simply not cached. Only once admitted
 * (before, the prompt's digests are computed at add). */
void tdm__req_hash_blocks(const tdm_sched *s, tdm__req *r)
{
    if (!s->prm.enable_prefix_caching || r->host_hash_size || !r->hashes) return;
    uint32_t bs = (uint32_t)s->prm.block_size;
    uint32_t full = r->num_tokens / bs;
    int algo = (int)s->prm.prefix_hash;
    while (r->num_hashes < full) {
        uint32_t i = r->num_hashes;
        if (tdm__hash_block(&s->hasher, algo, i ? tdm__req_digest(r, i - 1) : NULL, r->tokens + (size_t)i * bs,
                            bs, (i == 0 && r->has_salt) ? &r->salt : NULL, &r->hashes[i - r->num_host_hashes]))
            return;
        r->num_hashes++;
    }
}

/* Release the request's blocks (tail first: its last blocks are evicted first); with
 * defer_block_free, those of a request with a step in flight wait in the deferred-free queue
 * until every batch returned so far is reported (deferred_free.c). */
void tdm__req_free_blocks(tdm_sched *s, tdm__req *r)
{
    if (tdm__dfr_can_free(s, r) || !tdm__dfr_defer(s, r->blocks, r->num_blocks))
        tdm__pool_release(&s->pool, r->blocks, r->num_blocks);
    r->num_blocks = 0;
    r->num_cached_blocks = 0;
}

void tdm__running_remove_at(tdm_sched *s, uint32_t idx)
{
    memmove(&s->running[idx], &s->running[idx + 1],
            (size_t)(s->num_running - idx - 1) * sizeof(tdm__req *));
    s->num_running--;
    for (uint32_t i = idx; i < s->num_running; i++) s->running[i]->run_index = i;
}

int tdm__running_append(tdm_sched *s, tdm__req *r)
{
    if (s->num_running >= s->cap_running) return TDM_E_INTERNAL; /* cap = max_num_seqs */
    r->run_index = s->num_running;
    s->running[s->num_running++] = r;
    r->admit_seq = ++s->next_admit;
    return TDM_OK;
}

/* Recompute preemption: drop the KV, go back to the front of the waiting queue. The caller
 * has removed r from running. */
void tdm__preempt(tdm_sched *s, tdm__req *r)
{
    tdm__req_free_blocks(s, r);
    r->num_computed = 0;
    r->num_spec = 0;
    r->num_placeholders = 0; /* the output in flight is stale: it no longer counts */
    /* num_spec_sched stays: a late output of the step in flight may still report drafts. */
    r->num_preemptions++;
    r->kvl_prefill = false;
    r->state = TDM_STATE_PREEMPTED;
    s->preemptions++;
    /* Never fails: the heap holds room for every live request (reserved at add). */
    (void)tdm__waiting_requeue(s, r);
}

/* Detach r from whatever container holds it (finished requests are in none). */
static void detach(tdm_sched *s, tdm__req *r)
{
    switch (r->state) {
    case TDM_STATE_WAITING:
    case TDM_STATE_PREEMPTED:
        if (r->queue) tdm__kvl_remove(s, r); /* kv_hold or kv_async */
        else tdm__waiting_remove(s, r);
        break;
    case TDM_STATE_RUNNING:
        r->kvl_prefill = false;
        if (s->in_update) { /* compacted once at the end of the update */
            s->running[r->run_index] = NULL;
            s->running_holes++;
        } else {
            tdm__running_remove_at(s, r->run_index);
        }
        break;
    case TDM_STATE_WAITING_REMOTE_KV: tdm__list_remove(&s->remote, r); break;
    case TDM_STATE_FINISHED_HELD: tdm__list_remove(r->hold == HOLD_RECV ? &s->remote : &s->held, r); break;
    default: break;
    }
}

/* Finish r for `reason`. Its blocks are freed unless a remote decode will read them
 * (REMOTE_DECODE finishing normally: held until release or timeout) or a remote receive may
 * still write them (aborted while WAITING_REMOTE_KV: held until remote_kv_done or timeout).
 * The id is reported in the next batch's finished list. The finished array has room: it is
 * reserved at add for every live request. */
void tdm__finish(tdm_sched *s, tdm__req *r, uint32_t reason, double now)
{
    r->finish_reason = reason;
    r->finish_time = now;
    r->num_spec = 0;
    s->num_finished++;
    if (s->prm.policy == TDM_POLICY_SLO_ADAPTIVE) tdm__ad_observe_finish(s, r);
    TDM_VEC_AT(&s->finished, tdm__req *, s->finished.len++) = r;
    if (r->state == TDM_STATE_WAITING_REMOTE_KV) {
        /* Stays in the remote list, in deadline order, until the receive ends or times out. */
        r->hold = HOLD_RECV;
        r->state = TDM_STATE_FINISHED_HELD;
        s->remote_aborted++;
        return;
    }
    detach(s, r);
    if ((r->flags & TDM_REQ_REMOTE_DECODE) && r->num_blocks &&
        (reason == TDM_FINISH_STOP || reason == TDM_FINISH_LENGTH)) {
        r->hold = HOLD_SEND;
        r->state = TDM_STATE_FINISHED_HELD;
        r->deadline = tdm__deadline_after(now, s->prm.delay_free_timeout_ms);
        tdm__list_push_back(&s->held, r);
        return;
    }
    tdm__req_free_blocks(s, r);
    r->state = TDM_STATE_FINISHED;
}

/* A remote receive failed or timed out (r is WAITING_REMOTE_KV, or held after an abort). */
void tdm__remote_failed(tdm_sched *s, tdm__req *r, uint32_t num_valid)
{
    if (r->state == TDM_STATE_FINISHED_HELD) { /* aborted while receiving: now safe to free */
        tdm__release_held(s, r);
        return;
    }
    if (s->prm.remote_kv_failure == TDM_REMOTE_KV_FAIL) {
        /* The receive is over (reported or timed out): the blocks can be freed at once. */
        tdm__list_remove(&s->remote, r);
        r->state = TDM_STATE_FINISHED; /* in no container: tdm__finish detaches nothing */
        tdm__finish(s, r, TDM_FINISH_ERROR, s->now);
        return;
    }
    /* Recompute locally: keep the blocks that arrived intact (whole blocks only). */
    uint32_t bs = (uint32_t)s->prm.block_size;
    uint32_t keep_tokens = TDM_MIN(num_valid, r->num_computed + r->num_remote);
    uint32_t keep = keep_tokens / bs;
    if (keep >= r->num_blocks) keep = r->num_blocks;
    uint32_t computed = TDM_MIN(keep * bs, r->num_tokens - 1);
    tdm__list_remove(&s->remote, r);
    r->num_computed = computed;
    r->num_remote = 0;
    r->remote_done = true;
    r->state = r->ever_admitted ? TDM_STATE_PREEMPTED : TDM_STATE_WAITING;
    if (tdm__kvl_on(s)) {
        /* vLLM 0.33+: the valid blocks join the prefix cache; with none valid, the blocks
         * are freed and the request looks the prefix cache up again (kv_loads.c). */
        tdm__kvl_received(s, r, computed);
        return;
    }
    (void)tdm__waiting_requeue_received(s, r);
}

/* Free the blocks of a FINISHED_HELD request. If its finish was already reported it is
 * destroyed now; otherwise the next step reports and destroys it. */
void tdm__release_held(tdm_sched *s, tdm__req *r)
{
    if (r->hold == HOLD_RECV) {
        tdm__list_remove(&s->remote, r);
        s->remote_aborted--;
    } else {
        tdm__list_remove(&s->held, r);
    }
    tdm__req_free_blocks(s, r);
    r->hold = HOLD_NONE;
    r->state = TDM_STATE_FINISHED;
    if (r->reported) {
        tdm__map_del(s, r->id);
        tdm__req_destroy(s, r);
    }
}
