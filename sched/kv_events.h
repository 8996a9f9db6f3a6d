/*
 * kv_events.h -- the KV cache event queue of one scheduler (tdm_sched_kv_events): the blocks
 * the pool indexes (STORED), the cached blocks it evicts (REMOVED) and cache resets
 * (ALL_CLEARED), recorded where vLLM's BlockPool emits BlockStored, BlockRemoved and
 * AllBlocksCleared. Two preallocated buffers: the host reads one (the last drain) while the
 * scheduler writes the other, so nothing allocates in steady state and drained arrays stay
 * valid until the next drain. A full buffer stops recording (the batch then holds the events
 * up to the overflow) and counts what was lost.
 */
#ifndef TANDEM_SCHED_KV_EVENTS_H
#define TANDEM_SCHED_KV_EVENTS_H

#include <stdbool.h>
#include <stdint.h>

#include "hash.h"
#include "tandem.h"

typedef struct tdm__kv_buf {
    uint32_t num_events, num_hashes, num_tokens;
    bool open;                 /* the last event is a STORED event still taking blocks */
    bool overflowed;
    uint64_t dropped;
    uint8_t *kinds, *hash_sizes, *has_parent;
    uint32_t *hash_offsets, *token_offsets, *first_blocks;
    uint8_t *hashes, *parents; /* TDM_KV_EVENT_HASH_STRIDE bytes per digest */
    tdm_token *tokens;
    uint64_t *req_ids;
} tdm__kv_buf;

typedef struct tdm__kv_events {
    tdm__kv_buf buf[2];
    uint32_t cur;              /* the buffer being written */
    uint32_t cap, block_size, num_blocks;
    uint8_t *block_hash_size;  /* per block id: bytes of the digest it is indexed by */
    bool ready;                /* buffers allocated (events enabled) */
    uint64_t dropped_total;    /* kept across reallocations (stats) */
} tdm__kv_events;

/* Allocate the queue for `cap` events of blocks of block_size tokens in a pool of num_blocks
 * blocks. TDM_OK or TDM_E_NOMEM (then *ev is unallocated). */
int tdm__kv_init(tdm__kv_events *ev, uint32_t cap, uint32_t block_size, uint32_t num_blocks);
/* Free the buffers (dropped_total is kept). */
void tdm__kv_free(tdm__kv_events *ev);

/* Pool hooks. */
void tdm__kv_removed(tdm__kv_events *ev, uint32_t block, const tdm__digest *h);
void tdm__kv_cleared(tdm__kv_events *ev);
/* Whether a reset of pool p drops every cached block (none is in use): then it is one
 * ALL_CLEARED event, as vLLM's reset_prefix_cache, instead of a REMOVED event per block. */
struct tdm__pool;
bool tdm__kv_reset_is_clear(const struct tdm__pool *p);

/* Scheduler hook: index r's blocks [from, to) in the prefix cache (tdm__pool_cache) and record
 * the blocks indexed as STORED events (one per contiguous run, as vLLM's cache_full_blocks). */
struct tdm_sched;
struct tdm__req;
void tdm__kv_cache_blocks(struct tdm_sched *s, struct tdm__req *r, uint32_t from, uint32_t to);

/* Fill *out with the write buffer and switch buffers (see tdm_sched_kv_events). */
void tdm__kv_drain(tdm__kv_events *ev, tdm_kv_event_batch *b);

#endif
