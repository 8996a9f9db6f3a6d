/*
 * step.c -- one scheduling step, following vLLM v1 (reference: vllm/v1/core/sched/scheduler.py):
 * running requests first, in list order, each advancing num_computed_tokens toward its token
 * count (+ drafts) under the token budget, with recompute preemption when blocks run out;
 * then, only if nothing was preempted, waiting requests in policy order, with prefix-cache
 * hits, all-or-nothing block allocation and no preemption on their behalf. The decode-first
 * mode (Sarathi-Serve's stall-free batching) runs decodes, then partial prefills, then new
 * prefills, and sizes prefill chunks so the predicted step time stays within the TBT target.
 * The prefill-first mode (vLLM v0, TGI) is the baseline: prompt-only steps whenever a prompt
 * can run, decode-only steps otherwise.
 * Finally the batch is written out and num_computed_tokens advanced optimistically.
 *
 * Cost: O(running + touched waiting + finished + expired) per step, no allocation once the
 * output arrays have reached their steady size.
 */
#include <math.h>
#include <string.h>

#include "sched_internal.h"

/* ---- the step-cost estimate ---- */

double tdm__cost_estimate(const tdm_sched *s, const tdm_step_shape *sh)
{
    if (s->cost.version) return s->cost.estimate(s->cost.ctx, sh);
    const tdm__params *p = &s->prm;
    if (!sh->num_prefill_tokens && !sh->num_decode_tokens) return 0.0;
    return p->cost_base_us * 1e-6 + p->cost_prefill_token_us * 1e-6 * sh->num_prefill_tokens +
           p->cost_decode_req_us * 1e-6 * sh->num_decode_tokens +
           p->cost_context_token_ns * 1e-9 * (double)sh->decode_context_tokens +
           p->cost_attn_token2_ps * 1e-12 * (double)sh->prefill_attn_work;
}

/* A decode computes only the last sampled token (plus drafts); anything else is a prefill
 * (a prompt chunk, or the recompute of a resumed request). */
static inline bool is_decode_req(const tdm__req *r, uint32_t computed)
{
    return (uint64_t)computed + 1 >= (uint64_t)r->num_tokens + r->num_placeholders;
}

static void shape_add(tdm_step_shape *sh, const tdm__req *r, uint32_t computed, uint32_t n, int sign)
{
    if (is_decode_req(r, computed)) {
        sh->num_decode_reqs += (uint32_t)sign;
        sh->num_decode_tokens += (uint32_t)(sign * (int64_t)n);
        sh->decode_context_tokens += (uint64_t)(sign * (int64_t)(computed + n));
    } else {
        sh->num_prefill_reqs += (uint32_t)sign;
        sh->num_prefill_tokens += (uint32_t)(sign * (int64_t)n);
        sh->prefill_attn_work += (uint64_t)(sign * (int64_t)((uint64_t)n * computed + (uint64_t)n * n / 2));
    }
}

/* Decode-first with a TBT target: the largest chunk n <= n_max of a prefill at context
 * `computed` that keeps the predicted step time within the target. The first request of an
 * otherwise empty step always gets at least one block's worth, so that progress is certain. */
static uint32_t tbt_fit(const tdm_sched *s, const tdm_step_shape *sh, uint32_t computed, uint32_t n_max,
                        bool step_empty, double target)
{
    if (!isfinite(target)) return n_max;
    uint32_t lo = 0, hi = n_max;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        tdm_step_shape t = *sh;
        t.num_prefill_reqs++;
        t.num_prefill_tokens += mid;
        t.prefill_attn_work += (uint64_t)mid * computed + (uint64_t)mid * mid / 2;
        if (tdm__cost_estimate(s, &t) <= target) lo = mid;
        else hi = mid - 1;
    }
    if (step_empty && lo == 0) lo = TDM_MIN(n_max, (uint32_t)s->prm.block_size);
    return lo;
}

/* ---- block allocation (vLLM's allocate_slots) ---- */

/* tdm__cache_full_blocks's slow path (sched_internal.h): upto_tokens reaches past r's
 * cached blocks (r's tokens may not). */
void tdm__cache_new_blocks(tdm_sched *s, tdm__req *r, uint32_t upto_tokens)
{
    upto_tokens = TDM_MIN(upto_tokens, r->num_tokens);
    uint32_t full = upto_tokens / (uint32_t)s->prm.block_size;
    if (full <= r->num_cached_blocks) return;
    tdm__req_hash_blocks(s, r);
    full = TDM_MIN(full, r->num_hashes); /* host-supplied digests may lag the tokens */
    tdm__kv_cache_blocks(s, r, r->num_cached_blocks, full);
    if (full > r->num_cached_blocks) r->num_cached_blocks = full;
}

/* Give r the blocks to hold its computed tokens plus `n` new ones (and `ext` arriving from a
 * remote peer, and `look` lookahead slots). The first `nhit` entries of r->blocks past
 * r->num_blocks are prefix-cache hits to take. All or nothing: false if the pool cannot
 * cover it (or, when admitting, it would dip below the watermark, or, with
 * reserve_full_prompt, the pool could not hold all of r's tokens). */
static bool allocate(tdm_sched *s, tdm__req *r, uint32_t n, uint32_t nhit, uint32_t ext, uint32_t look,
                     bool admitting, bool delay_cache, uint64_t reserve)
{
    uint32_t bs = (uint32_t)s->prm.block_size;
    uint64_t computed = (uint64_t)r->num_computed + (uint64_t)nhit * bs;
    uint64_t total = TDM_MIN(computed + ext + n + look, (uint64_t)s->prm.max_model_len);
    /* The common decode step: room already. (An admission, even of a request that holds its
     * blocks, such as one whose remote KV arrived, still checks the watermark, as vLLM does.) */
    if (!nhit && !admitting && total <= (uint64_t)r->num_blocks * bs) {
        if (!delay_cache) tdm__cache_full_blocks(s, r, (uint32_t)(computed + ext + n));
        return true;
    }
    uint32_t need = tdm__cdiv(total, bs);
    uint32_t have = r->num_blocks + nhit;
    uint32_t fresh = need > have ? need - have : 0;
    uint32_t free_hits = 0;
    for (uint32_t k = 0; k < nhit; k++) free_hits += s->pool.blk[r->blocks[r->num_blocks + k]].refcnt == 0;
    uint64_t take = (uint64_t)fresh + free_hits;
    if (take > s->pool.num_free) return false;
    if (need > r->cap_blocks) return false; /* cannot happen: capacity covers max_model_len */
    /* vLLM: watermark * num_blocks (the null block included), while any request runs. */
    uint64_t wm = 0;
    if (admitting && s->prm.watermark_ppm && s->num_running > 0)
        wm = (uint64_t)s->pool.num_blocks * (uint64_t)s->prm.watermark_ppm / 1000000u;
    /* reserve: blocks a remote-KV load must leave to others (kv_loads.c) */
    if (take + wm + reserve > s->pool.num_free) return false;
    if (admitting && s->prm.reserve_full_prompt) {
        /* vLLM's scheduler_reserve_full_isl: blocks for every token must be free, not just
         * for the first chunk (hits and the watermark are counted as in the chunk check). */
        uint32_t full = tdm__cdiv(TDM_MIN(r->num_tokens, (uint64_t)s->prm.max_model_len), bs);
        if ((uint64_t)(full > have ? full - have : 0) + free_hits + wm > s->pool.num_free) return false;
    }
    for (uint32_t k = 0; k < nhit; k++) tdm__pool_touch(&s->pool, r->blocks[r->num_blocks + k]);
    r->num_blocks += nhit;
    if (nhit) r->num_cached_blocks = TDM_MAX(r->num_cached_blocks, r->num_blocks); /* hits are cached */
    tdm__pool_alloc(&s->pool, r->blocks + r->num_blocks, fresh);
    r->num_blocks += fresh;
    if (!delay_cache) tdm__cache_full_blocks(s, r, (uint32_t)(computed + ext + n));
    return true;
}

/* The longest run of cached blocks that prefixes r's tokens, capped so that the last token is
 * always recomputed; the hit block ids are written at r->blocks[0..) (not yet taken). */
static uint32_t prefix_lookup(tdm_sched *s, tdm__req *r)
{
    if (!s->prm.enable_prefix_caching || (r->flags & TDM_REQ_SKIP_PREFIX_CACHE) || r->num_blocks ||
        ((r->flags & TDM_REQ_PREFIX_HIT_LIMIT) && r->hit_limit == 0))
        return 0;
    tdm__req_hash_blocks(s, r);
    uint32_t max_tokens = r->num_tokens - 1;
    if ((r->flags & TDM_REQ_PREFIX_HIT_LIMIT) && r->hit_limit < max_tokens) max_tokens = r->hit_limit;
    uint32_t max_blocks = max_tokens / (uint32_t)s->prm.block_size;
    uint32_t h = 0;
    for (; h < max_blocks && h < r->num_hashes; h++) {
        uint32_t b = tdm__pool_lookup(&s->pool, *tdm__req_digest(r, h));
        if (b == TDM__NO_BLOCK) break;
        r->blocks[h] = b;
    }
    return h;
}

/* ---- the batch under construction ---- */

typedef struct step_ctx {
    tdm_sched *s;
    double now;
    uint32_t budget;
    bool preempted;
    tdm_step_shape shape;      /* tracked only in decode-first mode */
    bool tbt;
    double target;             /* step-time target of the TBT fit (seconds, cost-model time) */
    bool decode_first;
    bool adaptive;             /* TDM_POLICY_SLO_ADAPTIVE: decode-first with an SLO-derived target */
    uint32_t partial_prefills; /* prefills in this step (decode-first limit) */
    uint64_t out_blocks_bound; /* upper bound of the block ids the batch will list */
    uint32_t threshold;        /* long_prefill_token_threshold, 0 when one request is eligible */
    uint32_t bs, look;         /* block_size, num_lookahead_tokens */
    uint64_t max_len;          /* max_model_len */
    bool stop_running;         /* a request preempted itself: the running pass ends (vLLM <= 0.32) */
} step_ctx;

/* Make room in the batch's block list for r's whole table before r is scheduled, so that
 * writing the batch never fails after state has changed. */
static bool reserve_blocks_for(step_ctx *c, const tdm__req *r)
{
    uint64_t need = c->out_blocks_bound + r->cap_blocks;
    if (need > c->s->out_blocks.cap &&
        (need > UINT32_MAX || tdm__vec_reserve(&c->s->out_blocks, (uint32_t)need, sizeof(uint32_t)))) {
        tdm__fail(&c->s->err, TDM_E_NOMEM, "step: out of memory for the batch's block list");
        return false;
    }
    c->out_blocks_bound = need;
    return true;
}

static inline __attribute__((always_inline)) void add_entry(step_ctx *c, tdm__req *r, uint32_t n, uint32_t computed, uint32_t first_new, uint8_t kind)
{
    tdm_sched *s = c->s;
    tdm__entry *e = &s->entries[s->num_entries];
    e->req = r;
    e->num_tokens = n;
    e->num_computed = computed;
    e->first_new_block = first_new;
    e->kind = kind;
    e->num_spec = 0;
    uint64_t end = (uint64_t)r->num_tokens + r->num_placeholders; /* placeholders: async */
    if (computed + n > end) e->num_spec = (uint32_t)(computed + n - end);
    r->entry = s->num_entries++;
    r->sched_step = s->step_no;
    c->budget -= n;
    if (c->decode_first) {
        shape_add(&c->shape, r, computed, n, +1);
        if (!is_decode_req(r, computed)) c->partial_prefills++;
    }
}

/* Undo the entry of a request scheduled earlier in this step that is being preempted. */
static void remove_entry(step_ctx *c, tdm__req *r)
{
    tdm_sched *s = c->s;
    uint32_t i = r->entry;
    tdm__entry *e = &s->entries[i];
    c->budget += e->num_tokens;
    if (c->decode_first) {
        shape_add(&c->shape, r, e->num_computed, e->num_tokens, -1);
        if (!is_decode_req(r, e->num_computed)) c->partial_prefills--;
    }
    memmove(e, e + 1, (size_t)(s->num_entries - i - 1) * sizeof(*e));
    s->num_entries--;
    for (uint32_t k = i; k < s->num_entries; k++) s->entries[k].req->entry = k;
    r->sched_step = 0;
}

static inline bool scheduled_now(const tdm_sched *s, const tdm__req *r) { return r->sched_step == s->step_no; }

static void preempt_at(step_ctx *c, uint32_t idx)
{
    tdm_sched *s = c->s;
    tdm__req *v = s->running[idx];
    if (scheduled_now(s, v)) remove_entry(c, v);
    tdm__running_remove_at(s, idx);
    tdm__preempt(s, v);
    TDM_VEC_AT(&s->out_preempted, uint64_t, s->out_preempted.len++) = v->id;
    c->preempted = true;
}

/* Schedule running request at index *i. `which`: 0 any, 1 decodes only, 2 prefills only.
 * Advances *i past it unless it was removed from running. */
static inline __attribute__((always_inline)) void schedule_running(step_ctx *c, uint32_t *i, int which)
{
    tdm_sched *s = c->s;
    tdm__req *r = s->running[*i];
    bool decode = is_decode_req(r, r->num_computed);
    if (scheduled_now(s, r) || (which == 1 && !decode) || (which == 2 && decode)) {
        (*i)++;
        return;
    }
    /* Async scheduling: no further step once the steps in flight surely reach max_tokens even
     * if all their drafts are rejected (vLLM's AsyncScheduler). */
    if (r->num_placeholders &&
        ((uint64_t)r->num_computed + 2 - r->num_placeholders >= (uint64_t)r->num_prompt + r->max_tokens ||
         r->num_spec_sched)) { /* drafts in flight: verified by their update first */
        (*i)++;
        return;
    }
    /* Async scheduling with pipeline parallelism: a request sampled in step t waits until step
     * t + decode_stagger (vLLM's next_decode_eligible_step); 1 = the next step, no gate, and
     * then the request's cold decode_step is not read (a step runs after the one that set it,
     * so step_no < decode_step + 1 never holds). */
    if (s->prm.decode_stagger > 1 && r->decode_step &&
        s->step_no < r->decode_step + (uint64_t)s->prm.decode_stagger) {
        (*i)++;
        return;
    }
    /* The tokens to compute run to the end of the known tokens plus the placeholders of the
     * steps in flight (async scheduling; none otherwise). Without placeholders, a step in
     * flight leaves nothing: drafts are verified only after the token they follow is known. */
    uint64_t end = (uint64_t)r->num_tokens + r->num_placeholders;
    uint64_t n = r->num_computed < end ? end + r->num_spec - r->num_computed : 0;
    if (c->threshold && n > c->threshold) n = c->threshold;
    n = TDM_MIN(n, (uint64_t)c->budget);
    uint64_t room = c->max_len - 1;
    n = r->num_computed >= room ? 0 : TDM_MIN(n, room - r->num_computed);
    if (!decode && c->tbt)
        n = tbt_fit(s, &c->shape, r->num_computed, (uint32_t)n, s->num_entries == 0, c->target);
    if (!decode && c->decode_first && s->prm.max_num_partial_prefills &&
        c->partial_prefills >= (uint64_t)s->prm.max_num_partial_prefills)
        n = 0;
    if (n == 0) { /* vLLM: continue, not break */
        (*i)++;
        return;
    }
    uint32_t first_new = r->num_blocks;
    uint64_t upto = (uint64_t)r->num_computed + n;
    if (TDM_MIN(upto + c->look, c->max_len) <= (uint64_t)r->num_blocks * c->bs) {
        /* The common decode step: r's blocks already hold the new tokens (and the lookahead),
         * so the batch lists no new block of r; the blocks completed join the cache
         * (allocate()'s first case, without its call). */
        tdm__cache_full_blocks(s, r, (uint32_t)upto);
    } else {
        if (!reserve_blocks_for(c, r)) {
            c->budget = 0;
            return;
        }
        for (;;) {
            if (allocate(s, r, (uint32_t)n, 0, 0, c->look, false, false, 0)) break;
            uint32_t v = tdm__policy_victim(s);
            if (!tdm__dfr_can_free(s, s->running[v])) {
                /* defer_block_free: the victim has a step in flight, so preempting it frees
                 * no block now; the running pass ends here (vLLM 0.33+) */
                c->stop_running = true;
                return;
            }
            bool self = s->running[v] == r;
            preempt_at(c, v);
            /* r preempted itself: the requests after it rank higher (priority) and may still
             * fit in the blocks it freed; *i already points at the next one (vLLM 0.33). vLLM
             * 0.32 and older end the running pass there. */
            if (self) {
                c->stop_running = !s->prm.continue_after_self_preemption;
                return;
            }
            if (v < *i) (*i)--;
        }
    }
    uint32_t drafts = r->num_computed + n > end ? (uint32_t)(r->num_computed + n - end) : 0;
    r->num_spec_sched = TDM_MIN(drafts, r->num_spec);
    r->num_spec = 0;
    add_entry(c, r, (uint32_t)n, r->num_computed, first_new, TDM_ENTRY_CONTINUING);
    (*i)++;
}

static void run_running(step_ctx *c, int which)
{
    uint32_t i = 0;
    while (i < c->s->num_running && c->budget > 0 && !c->stop_running) schedule_running(c, &i, which);
}

static void run_waiting(step_ctx *c)
{
    tdm_sched *s = c->s;
    uint32_t bs = (uint32_t)s->prm.block_size;
    tdm__list skipped = { NULL, NULL, 0 };
    bool kvl = tdm__kvl_on(s);   /* vLLM 0.33+'s load queues (kv_loads.c) */
    bool take_async = true;      /* cleared once the load queue's head cannot start a load */
    if (s->prm.cache_aware_window) tdm__cache_aware_reorder(s);
    for (;;) {
        if (c->adaptive) tdm__ad_demote(s, c->now);
        bool loads_only = s->num_running >= (uint64_t)s->prm.max_num_seqs || c->budget == 0;
        int q;
        if (!kvl) {
            if (!tdm__waiting_len(s) || loads_only) break;
            q = TDM__Q_WAIT;
        } else if ((q = tdm__kvl_next_queue(s, loads_only, take_async)) == TDM__Q_NONE) {
            break;
        }
        if (!loads_only && c->decode_first && s->prm.max_num_partial_prefills &&
            c->partial_prefills >= (uint64_t)s->prm.max_num_partial_prefills)
            break;
        tdm__req *r = tdm__kvl_peek(s, q);
        if (r->kvl_promote) tdm__kvl_promote(s, r); /* its load ended since the last step */
        if (r->state == TDM_STATE_PREEMPTED && r->pend_n) {
            /* Preempted with a step in flight: its late output is still applied, so resuming
             * now could compute a position that output brings. It waits out this step, keeping
             * its place (vLLM 0.31-0.33 skip it). */
            tdm__kvl_pop(s, q);
            tdm__list_push_back(&skipped, r);
            continue;
        }
        if (tdm__req_prepare_run(s, r)) {
            tdm__fail(&s->err, TDM_E_NOMEM, "step: out of memory admitting request %llu",
                      (unsigned long long)r->id);
            break;
        }
        uint32_t nhit = prefix_lookup(s, r);
        uint32_t hit_tokens = nhit * bs;
        uint32_t ext = 0;
        if ((r->flags & TDM_REQ_REMOTE_PREFILL) && !r->remote_done) {
            ext = r->num_remote > hit_tokens ? r->num_remote - hit_tokens : 0;
            if (!ext) r->remote_done = true; /* the local prefix cache already has it all */
        }
        if (kvl && ((ext && !tdm__kvl_admits_load(s)) || (loads_only && !ext))) {
            /* Past max_inflight_kv_loads, or it needs a running slot while none is free: it
             * waits at the head of its queue; the other queue may still admit (vLLM 0.34). */
            if (q != TDM__Q_ASYNC) break;
            take_async = false;
            continue;
        }
        if (ext) { /* reserve the blocks, then wait for the KV to arrive */
            if (!allocate(s, r, 0, nhit, ext, 0, true, true, tdm__kvl_reserved_blocks(s))) break;
            tdm__kvl_pop(s, q);
            s->prefix_queries += r->num_tokens;
            s->prefix_hits += hit_tokens;
            r->num_computed = hit_tokens;
            r->num_cached = hit_tokens;
            r->num_remote = ext;
            r->state = TDM_STATE_WAITING_REMOTE_KV;
            r->load_seq = ++s->next_load;
            r->deadline = tdm__deadline_after(c->now, s->prm.remote_kv_timeout_ms);
            tdm__list_push_back(&s->remote, r);
            TDM_VEC_AT(&s->out_recv_ready, uint64_t, s->out_recv_ready.len++) = r->id;
            continue;
        }
        uint32_t computed = r->num_computed + hit_tokens;
        uint64_t n = r->num_tokens - computed;
        if (c->threshold && n > c->threshold) n = c->threshold;
        if (!s->prm.enable_chunked_prefill && n > c->budget) break; /* head-of-line blocking */
        n = TDM_MIN(n, (uint64_t)c->budget);
        if (c->tbt) n = tbt_fit(s, &c->shape, computed, (uint32_t)n, s->num_entries == 0, c->target);
        if (n == 0) break;
        /* vLLM: no lookahead while nothing is computed yet (new or preempted), which keeps the
         * block count of a P/D pair equal; a request whose remote KV arrived gets it. */
        uint32_t look = r->num_computed ? (uint32_t)s->prm.num_lookahead_tokens : 0;
        if (!reserve_blocks_for(c, r)) break;
        if (!allocate(s, r, (uint32_t)n, nhit, 0, look, true, false, 0)) break;
        tdm__kvl_pop(s, q);
        s->prefix_queries += r->num_tokens;
        s->prefix_hits += hit_tokens;
        if (!r->ever_admitted) r->num_cached = computed;
        uint8_t kind = r->state == TDM_STATE_PREEMPTED ? TDM_ENTRY_RESUMED : TDM_ENTRY_NEW;
        r->ever_admitted = true;
        r->num_computed = computed;
        r->num_spec_sched = 0;
        r->state = TDM_STATE_RUNNING;
        /* still prefilling after this chunk: its remaining blocks are reserved against loads */
        r->kvl_prefill = kvl && computed + n < r->num_tokens;
        (void)tdm__running_append(s, r); /* room: num_running < max_num_seqs <= capacity */
        add_entry(c, r, (uint32_t)n, computed, 0, kind);
    }
    /* Back to the front, in their order (the heap orders them itself). Never fails: the heap
     * holds room for every live request. */
    while (skipped.tail) {
        tdm__req *r = skipped.tail;
        tdm__list_remove(&skipped, r);
        (void)tdm__waiting_requeue(s, r);
    }
}

/* The prefill-first baseline (vLLM v0's default scheduler, TGI): prompts run before decodes,
 * in prefill-only steps. Running requests still in their prompt (chunks, resumed recomputes)
 * and then waiting requests are scheduled first; only when that schedules nothing do the
 * running decodes get the step. */
static void run_prefill_first(step_ctx *c)
{
    run_running(c, 2);
    if (!c->preempted) run_waiting(c);
    if (c->s->num_entries == 0 && !c->stop_running) run_running(c, 1);
}

/* ---- bookkeeping before scheduling ---- */

/* Everything the step writes, reserved before it changes any state. */
static int reserve_outputs(tdm_sched *s)
{
    if (tdm__vec_reserve(&s->out_finished, s->finished.len, sizeof(uint64_t)) ||
        tdm__vec_reserve(&s->out_preempted, s->num_running, sizeof(uint64_t)) ||
        tdm__vec_reserve(&s->out_recv_ready, tdm__waiting_len(s) + tdm__kvl_waiting(s) + s->remote.len,
                         sizeof(uint64_t)))
        return TDM_E_NOMEM;
    return TDM_OK;
}

/* Report (and free) the requests finished since the last step; expire held blocks and
 * remote-KV waits whose deadline passed. */
static void flush_and_expire(tdm_sched *s, double now)
{
    s->out_finished.len = 0;
    for (uint32_t i = 0; i < s->finished.len; i++) {
        tdm__req *r = TDM_VEC_AT(&s->finished, tdm__req *, i);
        TDM_VEC_AT(&s->out_finished, uint64_t, s->out_finished.len++) = r->id;
        r->reported = true;
        /* Kept until the update of the last step it was scheduled in (freed there). */
        if (r->state == TDM_STATE_FINISHED) {
            if (!r->pend_n) {
                tdm__map_del(s, r->id);
                tdm__req_destroy(s, r);
            } else { /* room: reserved at add for every live request */
                TDM_VEC_AT(&s->lingering, tdm__req *, s->lingering.len++) = r;
            }
        }
    }
    s->finished.len = 0;
    while (s->held.head && s->held.head->deadline <= now) tdm__release_held(s, s->held.head);
    while (s->remote.head && s->remote.head->deadline <= now) {
        tdm__req *r = s->remote.head;
        if (r->state == TDM_STATE_FINISHED_HELD) tdm__release_held(s, r); /* aborted receive */
        else tdm__remote_failed(s, r, 0);
    }
}

/* Write the batch arrays and advance num_computed_tokens (optimistically, as vLLM does). */
static void finalize(tdm_sched *s, step_ctx *c, tdm_batch *out)
{
    uint32_t *blocks = s->out_blocks.data; /* room reserved while scheduling (reserve_blocks_for) */
    uint32_t pos = 0, total = 0, prefills = 0;
    for (uint32_t i = 0; i < s->num_entries; i++) {
        tdm__entry *e = &s->entries[i];
        tdm__req *r = e->req;
        uint32_t from = e->kind == TDM_ENTRY_CONTINUING ? e->first_new_block : 0;
        s->out_ids[i] = r->id;
        s->out_num_tokens[i] = e->num_tokens;
        s->out_num_computed[i] = e->num_computed;
        s->out_kinds[i] = e->kind;
        s->out_num_spec[i] = e->num_spec;
        s->out_block_offsets[i] = pos;
        if (r->num_blocks > from)
            memcpy(blocks + pos, r->blocks + from, (size_t)(r->num_blocks - from) * sizeof(uint32_t));
        pos += r->num_blocks - from;
        total += e->num_tokens;
        prefills += !is_decode_req(r, e->num_computed);
        r->num_computed += e->num_tokens;
        r->in_flight = r->num_computed >= (uint64_t)r->num_tokens + r->num_placeholders;
        if (r->in_flight) r->kvl_prefill = false;
        /* Async scheduling: a step that samples holds a placeholder per token it may bring. */
        if (r->in_flight && s->prm.async_scheduling) {
            r->num_placeholders += 1 + e->num_spec;
            r->decode_step = s->step_no;
        }
        tdm__pend_push(r, r->in_flight, s->step_no); /* the update that may report this entry */
        if (r->first_sched < 0) r->first_sched = c->now;
    }
    s->out_block_offsets[s->num_entries] = pos;
    s->latest_awaited = s->num_entries > 0;
    if (s->num_entries && s->prm.defer_block_free) tdm__dfr_batch_returned(s);
    s->out_blocks.len = pos;
    s->scheduled_tokens += total;

    tdm_batch b;
    memset(&b, 0, sizeof(b));
    b.struct_size = TDM_MIN(out->struct_size, (uint32_t)sizeof(b));
    b.num_reqs = s->num_entries;
    b.step = s->step_no;
    b.total_tokens = total;
    b.num_prefill_reqs = prefills;
    b.req_ids = s->out_ids;
    b.num_tokens = s->out_num_tokens;
    b.num_computed = s->out_num_computed;
    b.kinds = s->out_kinds;
    b.num_spec = s->out_num_spec;
    b.block_offsets = s->out_block_offsets;
    b.blocks = blocks;
    b.num_preempted = s->out_preempted.len;
    b.preempted_ids = s->out_preempted.data;
    b.num_finished = s->out_finished.len;
    b.finished_ids = s->out_finished.data;
    b.num_recv_ready = s->out_recv_ready.len;
    b.recv_ready_ids = s->out_recv_ready.data;
    memcpy(out, &b, TDM_MIN(out->struct_size, (uint32_t)sizeof(b)));
}

int tdm_sched_step(tdm_sched *s, double now, tdm_batch *out)
{
    if (!s) return TDM_E_INVAL;
    if (!TDM_STRUCT_OK(out, sizeof(tdm_batch)))
        return tdm__fail(&s->err, TDM_E_INVAL, "step: batch is NULL or its struct_size is too small");
    if (!isfinite(now) || now < 0)
        return tdm__fail(&s->err, TDM_E_INVAL, "step: now (%g) must be finite and >= 0", now);
    if (reserve_outputs(s) || tdm__batch_reserve(s) || tdm__dfr_reserve(s))
        return tdm__fail(&s->err, TDM_E_NOMEM, "step: out of memory");
    tdm__batch_keep(s); /* the last batch, if it awaits a named report, before it is overwritten */
    if (now > s->now) s->now = now;
    s->step_no++;
    flush_and_expire(s, s->now);

    step_ctx c;
    memset(&c, 0, sizeof(c));
    c.s = s;
    c.now = s->now;
    c.budget = (uint32_t)s->prm.max_num_batched_tokens;
    c.adaptive = s->prm.policy == TDM_POLICY_SLO_ADAPTIVE;
    c.decode_first = s->prm.mode == TDM_MODE_DECODE_FIRST || c.adaptive;
    c.tbt = c.decode_first && (s->prm.tbt_target_us > 0 || c.adaptive);
    c.target = (double)s->prm.tbt_target_us * 1e-6;
    c.bs = (uint32_t)s->prm.block_size;
    c.look = (uint32_t)s->prm.num_lookahead_tokens;
    c.max_len = (uint64_t)s->prm.max_model_len;
    /* The threshold keeps a long prefill from starving the others: with one eligible request
     * (running, waiting or receiving its KV) there is nobody to starve (vLLM 0.33). */
    if ((uint64_t)s->num_running + tdm__waiting_len(s) + (s->remote.len - s->remote_aborted) +
                tdm__kvl_waiting(s) > 1 &&
        (s->prm.enable_chunked_prefill || !s->prm.long_prefill_needs_chunking)) /* vLLM 0.34: only chunked */
        c.threshold = (uint32_t)s->prm.long_prefill_token_threshold;
    s->num_entries = 0;
    s->out_preempted.len = 0;
    s->out_recv_ready.len = 0;

    if (s->prm.mode == TDM_MODE_PREFILL_FIRST && !c.adaptive) {
        run_prefill_first(&c);
    } else {
        if (c.adaptive) {
            run_running(&c, 1); /* decodes, then the target they allow (slo_adaptive.c) */
            double t = tdm__ad_target(s, c.now, &c.shape);
            t = tdm__ad_widen(s, c.now, t, &c.shape);
            c.target = t / s->ad_ratio; /* the fit compares uncorrected cost-model time */
            run_running(&c, 2);
        } else if (s->prm.mode == TDM_MODE_DECODE_FIRST) {
            run_running(&c, 1); /* decodes */
            run_running(&c, 2); /* partial prefills */
        } else {
            run_running(&c, 0);
        }
        if (!c.preempted) run_waiting(&c);
    }
    if (c.adaptive) tdm__ad_record_step(s, &c.shape, c.now);
    finalize(s, &c, out);
    if (c.adaptive) tdm__ad_after_step(s, &c.shape);
    return TDM_OK;
}
