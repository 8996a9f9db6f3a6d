/*
 * sched_internal.h -- the scheduler's internal types: the request record, the queues, the
 * parameters and the tdm_sched handle itself, plus the functions the sched/ files share.
 *
 * Where a request lives, by state:
 *   WAITING, PREEMPTED   the waiting queue (an intrusive deque for FCFS, a binary heap for
 *                        priority and custom policies)
 *   RUNNING              the running array, in admission order
 *   WAITING_REMOTE_KV    the remote list (admission order = deadline order)
 *   WAITING (kv_load_queues) a request whose remote KV arrived or failed: the kv_hold list,
 *                        drained before the waiting queue; with max_inflight_kv_loads, a
 *                        MAY_LOAD_ASYNC request not yet loading: the kv_async list
 *                        (kv_loads.c; `queue` says which)
 *   FINISHED_HELD        the held list (finish order = deadline order) when holding blocks
 *                        for a remote decode; the remote list when aborted while receiving
 *   FINISHED             the finished array until the next step reports and frees it
 */
#ifndef TANDEM_SCHED_INTERNAL_H
#define TANDEM_SCHED_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "block_pool.h"
#include "hash.h"
#include "internal.h"
#include "kv_events.h"
#include "tandem.h"

typedef struct tdm__req tdm__req;

/* An intrusive doubly linked list node / list head. */
typedef struct tdm__link {
    tdm__req *prev, *next;
} tdm__link;

typedef struct tdm__list {
    tdm__req *head, *tail;
    uint32_t len;
} tdm__list;

enum { HOLD_NONE = 0, HOLD_SEND = 1, HOLD_RECV = 2 };

struct tdm__req {
    /* ---- hot: read or written for every scheduled request in every step and update, in
     * three cache lines: the record is allocated on a 64-byte boundary (TDM__REQ_ALIGN).
     * Line 1 holds what the update's validation pass reads (the id, the stamp and the
     * awaited steps: that pass runs over the whole report before anything is applied, so it
     * touches one line of each request) and the counters that every step and update read;
     * line 2 the rest of what a step reads, so that a step touches two lines of a request;
     * line 3 what only the update (stop checks, timings), SLO_ADAPTIVE's per-step target
     * and rarer paths use. ---- */
    uint64_t id;
    uint64_t update_stamp;     /* duplicate detection within one update */
    /* Scheduled steps whose update has not come yet, oldest first (updates arrive in step
     * order): pend_n of them; bit i of pend_bits says whether the i-th newest one reached the
     * end of the request's tokens (a decode, or the chunk completing the prompt) and so may
     * bring sampled tokens. Steps older than the newest 64 never do (see update.c). */
    uint64_t pend_bits;
    uint32_t pend_n;
    uint32_t state;            /* tdm_req_state */
    uint32_t flags;            /* TDM_REQ_* */
    uint32_t num_spec_sched;   /* drafts scheduled in the last step (verified by update) */
    uint32_t num_tokens;       /* prompt + outputs */
    uint32_t num_computed;
    uint32_t num_placeholders; /* async scheduling: tokens of steps in flight whose samples
                                  have not come (vLLM's num_output_placeholders) */
    uint32_t num_prompt;
    uint32_t cap_tokens;
    uint32_t max_tokens;
    /* line 2 */
    uint64_t sched_step;       /* step in which it was last scheduled */
    uint64_t pend_step;        /* the step of the newest awaited one */
    double first_sched;
    tdm_token *tokens;         /* NULL until admitted; capacity cap_tokens */
    uint32_t *blocks;
    uint32_t num_spec;         /* drafts waiting to be scheduled */
    uint32_t num_blocks, cap_blocks;
    uint32_t num_cached_blocks; /* leading blocks already offered to the prefix cache */
    uint32_t entry;            /* its index in the step's entries when sched_step == step */
    bool in_flight;            /* scheduled to produce a token whose update has not come */
    bool kvl_prefill;          /* kv_load_queues: admitted and still prefilling (its remaining
                                  blocks are reserved against new remote-KV loads) */
    /* line 3 */
    uint32_t min_tokens;
    int32_t eos;
    uint32_t num_stop;
    uint32_t run_index;        /* position in the running array */
    bool ever_admitted;
    bool remote_done;          /* remote KV received (or given up) */
    bool reported;             /* its finish was reported in a batch (it may be destroyed) */
    uint8_t queue;             /* TDM__Q_*: the waiting container of a WAITING/PREEMPTED request */
    bool kvl_promote;          /* kv_load_queues: its load ended, not yet seen by a step */
    uint64_t batch_mark;       /* update stamp: in the batch a named update reports */
    double first_token, last_token, max_gap;
    double tpot_slo;           /* next to first_token: SLO_ADAPTIVE's target pass reads both
                                  for every running decode, every step */

    /* ---- cold ---- */
    uint64_t decode_step;      /* async: the last step that scheduled it to sample (read by a
                                  step only with decode_stagger, i.e. pipeline parallelism) */
    uint32_t finish_reason;    /* tdm_finish_reason */
    uint32_t hold;             /* HOLD_*: why a finished request still holds blocks */
    const tdm_token *prompt;   /* points into this allocation; `tokens` once admitted */
    const tdm_token *stop_ids;
    tdm_token *spec;           /* capacity = the scheduler's lookahead */
    /* The digests of the full blocks of tokens[0..num_tokens), num_hashes of them: the
     * first num_host_hashes in host_hashes, the rest in hashes (read them through
     * tdm__req_digest). */
    tdm__digest *hashes;       /* digest num_host_hashes + i is hashes[i] (run arrays: room
                                  for cap_blocks - num_host_hashes); NULL until admitted */
    uint32_t num_hashes;       /* all digests known (>= num_host_hashes) */
    tdm__digest *host_hashes;  /* prompt digests known before admission (in this
                                  allocation, where tdm_sched_add put them, never copied):
                                  the host's, or Tandem's own computed at add */
    uint32_t num_host_hashes;  /* digests in host_hashes (capacity: full prompt blocks);
                                  fixed once admitted (later ones go to `hashes`) */
    uint32_t host_hash_size;   /* bytes per host digest; 0 = Tandem computes them */
    uint32_t num_cached;       /* prefix hit at the first admission */
    uint32_t hit_limit;        /* TDM_REQ_PREFIX_HIT_LIMIT: most tokens a prefix hit may cover */
    uint32_t num_remote;       /* REMOTE_PREFILL: tokens whose KV arrives from the peer */
    uint32_t num_preemptions;
    uint32_t kvl_cache_upto;   /* kv_load_queues: when its load ended, its blocks are cached up
                                  to this token (0: freed) */
    tdm__digest salt;          /* digest of the cache salt (the first block's extra key) */
    bool has_salt;
    uint8_t run_class;         /* size class of run_mem in the scheduler's buffer cache */
    int32_t priority;
    uint32_t tenant;
    uint32_t heap_index;       /* position in the waiting heap */
    double arrival;
    double ttft_slo;
    uint64_t seq;              /* add order: the final tie-break */
    uint64_t admit_seq;        /* order of (re)admission to running */
    uint64_t load_seq;         /* order in which its remote-KV load started (kv_hold order) */
    tdm__link link;            /* waiting deque, remote list or held list */
    double finish_time;
    double deadline;           /* remote-KV wait or held-block deadline */
    double ad_key;             /* SLO_ADAPTIVE: least-laxity key while waiting */
    bool ad_late;              /* SLO_ADAPTIVE: demoted, its TTFT can no longer be met */
    uint32_t ad_qtok;          /* SLO_ADAPTIVE: prefill tokens it adds to ad_wait_tokens */
    uint32_t ad_long_index;    /* SLO_ADAPTIVE: position in the longest-prefill heap */
    bool ad_in_long;           /* SLO_ADAPTIVE: in that heap (flagged, on time, no token yet) */
    void *run_mem;             /* the allocation holding tokens, blocks, hashes, spec */
    void *alloc;               /* the allocation holding this record (freed by tdm__req_destroy) */
};

#define TDM__REQ_ALIGN 64u     /* the record's alignment: its hot part in three cache lines */
_Static_assert(offsetof(tdm__req, sched_step) == 64 && offsetof(tdm__req, min_tokens) == 128 &&
               offsetof(tdm__req, tpot_slo) + sizeof(double) <= 192,
               "tdm__req: the hot fields' cache lines moved (see the struct's comment)");

/* Digest i (< r->num_hashes) of r's blocks: a prompt digest stays where tdm_sched_add put it
 * (copying them into the run arrays at admission cost a cold write per digest). */
static inline tdm__digest *tdm__req_digest(const tdm__req *r, uint32_t i)
{
    return i < r->num_host_hashes ? &r->host_hashes[i] : &r->hashes[i - r->num_host_hashes];
}

typedef struct tdm__params {
    int64_t max_num_batched_tokens;
    int64_t max_num_seqs;
    int64_t max_model_len;
    int64_t long_prefill_token_threshold;
    int64_t enable_chunked_prefill;
    int64_t num_blocks;
    int64_t block_size;
    int64_t enable_prefix_caching;
    int64_t watermark_ppm;
    int64_t policy;
    int64_t mode;
    int64_t tbt_target_us;
    int64_t num_lookahead_tokens;
    int64_t role;
    int64_t remote_kv_failure;
    int64_t remote_kv_timeout_ms;
    int64_t delay_free_timeout_ms;
    int64_t max_num_partial_prefills;
    int64_t prefix_hash;       /* tdm_prefix_hash */
    int64_t reserve_full_prompt;
    int64_t continue_after_self_preemption;
    int64_t enable_kv_events;
    int64_t kv_events_capacity;
    int64_t async_scheduling;
    int64_t slo_ttft_us;       /* SLO_ADAPTIVE targets of requests without their own */
    int64_t slo_tpot_us;
    int64_t long_prefill_needs_chunking; /* the threshold only with chunked prefill (vLLM 0.34) */
    int64_t cache_aware_window;          /* waiting requests reordered by cached prefix */
    int64_t cache_aware_threshold_ppm;   /* ... once KV usage reaches this */
    int64_t max_inflight_kv_loads;       /* vLLM 0.34's load cap and load queue; 0 = none */
    int64_t kv_load_queues;              /* vLLM 0.33+'s received-KV queue and load gate */
    int64_t defer_block_free;            /* vLLM 0.33+'s defer_block_free (deferred_free.c) */
    int64_t decode_stagger;              /* async: steps between a request's sampling steps */
    /* the built-in linear step-cost model (decode-first TBT budget) */
    double cost_base_us, cost_prefill_token_us, cost_decode_req_us, cost_context_token_ns,
        cost_attn_token2_ps;
} tdm__params;

/* One scheduled request of the current step. */
typedef struct tdm__entry {
    tdm__req *req;
    uint32_t num_tokens;
    uint32_t num_computed;     /* before the step */
    uint32_t first_new_block;  /* blocks[first_new_block..] are new this step */
    uint8_t kind;
    uint32_t num_spec;
} tdm__entry;

/* A growable array of POD elements (grows geometrically, never shrinks). */
typedef struct tdm__vec {
    void *data;
    uint32_t len, cap;
} tdm__vec;

/* The deferred-free queue (deferred_free.c): the blocks of requests freed while a step
 * of theirs was in flight, in the order they will go back to the pool, each run of them
 * fenced by the count of non-empty batches returned when it was freed. Two rings that grow
 * only when reserved (tdm__dfr_reserve), before the call that may fill them. */
typedef struct tdm__dfr_run {
    uint64_t fence;            /* released once this many non-empty batches are reported */
    uint32_t count;            /* blocks of the ring's next `count` */
} tdm__dfr_run;

typedef struct tdm__dfr {
    uint32_t *blocks;          /* ring of block ids */
    uint32_t cap, head, len;
    tdm__dfr_run *runs;        /* ring of runs, fences non-decreasing */
    uint32_t rcap, rhead, rlen;
    uint64_t batches;          /* non-empty batches returned (vLLM's sched_step_seq) */
    uint64_t reported;         /* of those, reported by an update (processed_step_seq) */
} tdm__dfr;

/* A batch awaiting a named report (tdm_sched_update_step), kept past the step that made
 * it: its step and request ids. */
#define TDM__KEPT_BATCHES 8u
typedef struct tdm__kept_batch {
    uint64_t step;
    tdm__vec ids;              /* uint64_t */
} tdm__kept_batch;

struct tdm_sched {
    tdm__err err;
    tdm__params prm;
    tdm__pool pool;
    bool pool_ready;
    tdm__hasher hasher;        /* block digests (prm.prefix_hash) */
    tdm__kv_events kv;         /* KV event queue (prm.enable_kv_events) */
    tdm__dfr dfr;              /* deferred block frees (prm.defer_block_free) */

    /* id -> request: open addressing, linear probing, backward-shift deletion */
    tdm__req **map;
    uint32_t map_mask, map_len;

    /* waiting: FCFS deque or heap */
    tdm__list waiting;
    tdm__req **heap;
    uint32_t heap_len, heap_cap;

    tdm__req **running;
    uint32_t num_running, cap_running;

    tdm__list remote;   /* WAITING_REMOTE_KV, admission (= deadline) order */
    tdm__list kv_hold;  /* kv_load_queues: KV received or failed, not yet running (kv_loads.c) */
    tdm__list kv_async; /* max_inflight_kv_loads: MAY_LOAD_ASYNC requests not yet loading */
    uint64_t next_load; /* load_seq counter */
    tdm__list held;     /* FINISHED_HELD for a remote decode, finish (= deadline) order */
    uint32_t remote_aborted; /* FINISHED_HELD requests still in `remote` (aborted receives) */
    tdm__vec finished;  /* tdm__req *: finished since the last step */
    tdm__vec lingering; /* tdm__req *: finished and reported, kept for a step awaiting its
                           update (freed by update.c once none is owed) */
    uint64_t reported_step; /* the newest step an update is known to have reported */
    /* batches awaiting a named report: the latest (the step's entries), then older ones */
    bool latest_awaited;
    tdm__kept_batch kept[TDM__KEPT_BATCHES]; /* ring, oldest at kept_head */
    uint32_t kept_head, kept_len;

    /* policy */
    tdm_policy policy;  /* valid when prm.policy == TDM_POLICY_CUSTOM */
    char policy_name[64];
    void *plugin;       /* dlopen handle of a loaded policy */
    tdm_request_view *victim_views;      /* scratch for pick_victim: cap_running views */
    const tdm_request_view **victim_ptrs;

    tdm_cost_model cost;  /* installed callback, or version 0 for the built-in model */

    /* SLO_ADAPTIVE observations (slo_adaptive.c) */
    double ad_ratio;           /* measured / predicted step time, smoothed; 1 until measured */
    double ad_pred, ad_pred_start; /* prediction and start of the last step */
    uint64_t ad_pred_step;     /* its step number (0: nothing to measure) */
    double ad_out_sum;         /* outputs of finished requests, for the mean output length */
    uint64_t ad_out_n;
    double ad_soft;            /* this step's soft target (what decodes can recover) */
    double ad_full;            /* this step's longest target every decode can recover in full */
    uint64_t ad_wait_tokens;   /* prefill tokens of the waiting requests not demoted */
    uint64_t ad_run_tokens;    /* prefill tokens left of the running partial prefills */
    double ad_rate;            /* prefill tokens per second of the backlogged steps, smoothed */
    double ad_free_at;         /* predicted end of the last step */
    tdm__req **ad_long;        /* max-heap by ad_qtok of the flagged on-time waiting requests
                                  without a first token (capacity heap_cap) */
    uint32_t ad_long_len;

    /* step outputs (valid until the next step) */
    tdm__entry *entries;
    uint32_t num_entries, cap_entries;
    uint64_t *out_ids;
    uint32_t *out_num_tokens, *out_num_computed, *out_num_spec, *out_block_offsets;
    uint8_t *out_kinds;
    tdm__vec out_blocks;       /* uint32_t */
    tdm__vec out_preempted;    /* uint64_t */
    tdm__vec out_finished;     /* uint64_t */
    tdm__vec out_recv_ready;   /* uint64_t */

    /* update outputs (valid until the next update or step) */
    tdm__vec upd_ids;          /* uint64_t */
    tdm__vec upd_new;          /* uint32_t */
    tdm__vec upd_reason;       /* uint8_t */
    tdm__vec ca_scratch;       /* cache_aware.c: twice the admission window */
    tdm__vec upd_stop;         /* int32_t */
    tdm__vec upd_reqs;         /* tdm__req *: the records found while validating */

    /* Run buffers of destroyed requests, kept by power-of-two size class for the next
     * admissions, so that steady-state steps do not call the allocator. */
    void *run_cache[40];
    uint32_t run_cached, run_cache_max;

    uint64_t step_no, next_seq, next_admit, update_no;
    bool in_update;            /* finishing running requests leaves holes, compacted at the end */
    uint32_t running_holes;
    double now;                /* latest host time seen */

    /* stats */
    uint64_t prefix_queries, prefix_hits, preemptions, scheduled_tokens, num_finished;
};

/* ---- helpers shared by the files of sched/ ---- */

/* vec */
int tdm__vec_reserve(tdm__vec *v, uint32_t n, size_t elem);
void tdm__vec_free(tdm__vec *v);
#define TDM_VEC_AT(v, T, i) (((T *)(v)->data)[i])

/* lists */
void tdm__list_push_back(tdm__list *l, tdm__req *r);
void tdm__list_push_front(tdm__list *l, tdm__req *r);
void tdm__list_remove(tdm__list *l, tdm__req *r);

/* id map */
tdm__req *tdm__map_get(const tdm_sched *s, uint64_t id);
int tdm__map_put(tdm_sched *s, tdm__req *r);
void tdm__map_del(tdm_sched *s, uint64_t id);

/* waiting queue */
bool tdm__waiting_uses_heap(const tdm_sched *s);
uint32_t tdm__waiting_len(const tdm_sched *s);
tdm__req *tdm__waiting_peek(const tdm_sched *s);
void tdm__waiting_pop(tdm_sched *s);
int tdm__waiting_push(tdm_sched *s, tdm__req *r);    /* a new request */
int tdm__waiting_requeue(tdm_sched *s, tdm__req *r); /* preempted: front */
int tdm__waiting_requeue_received(tdm_sched *s, tdm__req *r); /* back from a remote receive */
void tdm__waiting_remove(tdm_sched *s, tdm__req *r);
/* Cache-aware admission: reorder the head of the FCFS waiting list (cache_aware.c). */
void tdm__cache_aware_reorder(tdm_sched *s);
int tdm__waiting_reserve(tdm_sched *s, uint32_t n);  /* heap room when the policy uses one */
int tdm__heap_reserve(tdm_sched *s, uint32_t n);     /* heap room, whatever the policy */

/* the remote-KV load queues (kv_loads.c); TDM__Q_WAIT: the waiting queue above */
enum { TDM__Q_NONE = 0, TDM__Q_WAIT = 1, TDM__Q_HOLD = 2, TDM__Q_ASYNC = 3 };
static inline bool tdm__kvl_on(const tdm_sched *s)
{
    return s->prm.kv_load_queues || s->prm.max_inflight_kv_loads;
}
uint32_t tdm__kvl_waiting(const tdm_sched *s);              /* requests in kv_hold and kv_async */
void tdm__kvl_push(tdm_sched *s, tdm__req *r, int q);       /* into kv_hold or kv_async, in order */
void tdm__kvl_remove(tdm_sched *s, tdm__req *r);            /* out of whichever holds it */
int tdm__kvl_next_queue(const tdm_sched *s, bool loads_only, bool take_async);
tdm__req *tdm__kvl_peek(const tdm_sched *s, int q);
void tdm__kvl_pop(tdm_sched *s, int q);
bool tdm__kvl_admits_load(const tdm_sched *s);              /* under max_inflight_kv_loads */
uint64_t tdm__kvl_reserved_blocks(const tdm_sched *s);      /* blocks a new load must leave */
/* A load ended (ok: cache_upto = the tokens that arrived; failed: the valid ones, 0 = none):
 * into kv_hold. The blocks are cached (or, none valid, freed) when a step first takes the
 * request from kv_hold (tdm__kvl_promote), as vLLM does at that point. */
void tdm__kvl_received(tdm_sched *s, tdm__req *r, uint32_t cache_upto);
void tdm__kvl_promote(tdm_sched *s, tdm__req *r);

/* deferred block frees (deferred_free.c) */
int tdm__dfr_reserve(tdm_sched *s);                 /* room for every reference held */
void tdm__dfr_batch_returned(tdm_sched *s);         /* a non-empty batch was returned */
void tdm__dfr_batch_reported(tdm_sched *s);         /* an update reported one */
bool tdm__dfr_defer(tdm_sched *s, const uint32_t *blocks, uint32_t n);
void tdm__dfr_free(tdm__dfr *d);
/* Whether r's blocks may go back to the pool now: no step of r is in flight, or blocks are
 * not deferred (vLLM's _request_blocks_can_be_freed). */
static inline bool tdm__dfr_can_free(const tdm_sched *s, const tdm__req *r)
{
    return !s->prm.defer_block_free || !r->pend_n;
}

/* policy */
void tdm__policy_view(const tdm__req *r, tdm_request_view *v);
int tdm__policy_compare(const tdm_sched *s, const tdm__req *a, const tdm__req *b);
uint32_t tdm__policy_victim(tdm_sched *s);
void tdm__policy_drop(tdm_sched *s);
void tdm__policy_install(tdm_sched *s, const tdm_policy *p, void *plugin);
void tdm__policy_unload(tdm_policy *p, void *plugin);
int tdm__policy_load(tdm_sched *s, const char *path, const char *symbol, tdm_policy *out,
                     void **handle);

/* the SLO-adaptive policy (slo_adaptive.c) */
double tdm__ad_ttft(const tdm_sched *s, const tdm__req *r);
double tdm__ad_tpot(const tdm_sched *s, const tdm__req *r);
void tdm__ad_set_key(tdm_sched *s, tdm__req *r);
void tdm__ad_queued(tdm_sched *s, tdm__req *r, bool in);
int tdm__ad_compare(const tdm__req *a, const tdm__req *b);
uint32_t tdm__ad_victim(tdm_sched *s);
void tdm__ad_demote(tdm_sched *s, double now);
void tdm__ad_arrived(tdm_sched *s, tdm__req *r);
void tdm__ad_after_step(tdm_sched *s, const tdm_step_shape *sh);
void tdm__ad_observe_finish(tdm_sched *s, const tdm__req *r);
void tdm__ad_observe_step(tdm_sched *s, double now);
void tdm__ad_record_step(tdm_sched *s, const tdm_step_shape *sh, double now);
double tdm__ad_target(tdm_sched *s, double now, const tdm_step_shape *dec);
double tdm__ad_widen(tdm_sched *s, double now, double target, const tdm_step_shape *sh);

/* requests */
void tdm__req_destroy(tdm_sched *s, tdm__req *r);
void tdm__run_cache_free(tdm_sched *s);
int tdm__req_prepare_run(tdm_sched *s, tdm__req *r);
void tdm__req_hash_blocks(const tdm_sched *s, tdm__req *r);
void tdm__req_free_blocks(tdm_sched *s, tdm__req *r);
void tdm__finish(tdm_sched *s, tdm__req *r, uint32_t reason, double now);
void tdm__running_remove_at(tdm_sched *s, uint32_t idx);
int tdm__running_append(tdm_sched *s, tdm__req *r);
void tdm__preempt(tdm_sched *s, tdm__req *r);
void tdm__remote_failed(tdm_sched *s, tdm__req *r, uint32_t num_valid);
void tdm__release_held(tdm_sched *s, tdm__req *r);

/* config */
void tdm__params_default(tdm__params *p);
int tdm__sched_apply_shape(tdm_sched *s, const tdm__params *np);
int tdm__sched_grow(tdm_sched *s, uint32_t max_num_seqs);

/* step: offer r's full blocks of its first upto_tokens tokens to the prefix cache. Most
 * steps complete no block: that is decided inline, without a call or a division; the rest
 * goes to tdm__cache_new_blocks. */
void tdm__cache_new_blocks(tdm_sched *s, tdm__req *r, uint32_t upto_tokens);
static inline void tdm__cache_full_blocks(tdm_sched *s, tdm__req *r, uint32_t upto_tokens)
{
    if (!s->prm.enable_prefix_caching) return;
    if (upto_tokens < (uint64_t)(r->num_cached_blocks + 1) * (uint64_t)s->prm.block_size) return;
    tdm__cache_new_blocks(s, r, upto_tokens);
}

/* update: the batches awaiting a named report. Before a step: room to keep the latest
 * batch (TDM_E_NOMEM), then keep it; once a named update has taken a batch: drop it. */
int tdm__batch_reserve(tdm_sched *s);
void tdm__batch_keep(tdm_sched *s);
void tdm__batch_reported(tdm_sched *s, bool kept);

/* update: record a scheduled step whose output is awaited (finalize of each step) */
static inline void tdm__pend_push(tdm__req *r, bool samples, uint64_t step)
{
    r->pend_bits = (r->pend_bits << 1) | (samples ? 1u : 0u);
    if (r->pend_n < UINT32_MAX) r->pend_n++;
    r->pend_step = step;
}

/* cost model */
double tdm__cost_estimate(const tdm_sched *s, const tdm_step_shape *sh);

static inline uint32_t tdm__cdiv(uint64_t a, uint64_t b) { return (uint32_t)((a + b - 1) / b); }

/* A deadline `ms` after `now` (seconds); no deadline (infinity) when ms is 0. */
static inline double tdm__deadline_after(double now, int64_t ms)
{
    return ms > 0 ? now + (double)ms / 1000.0 : INFINITY;
}

#endif
