/*
 * block_pool.h -- the paged KV block pool: block 0 is the null block; every other block has
 * a refcount; free blocks sit in an intrusive doubly linked queue (O(1) pop from the head,
 * append, prepend and removal from the middle); full blocks may carry a digest (32 bytes,
 * stored in full) and be found through an open-addressing index (the prefix cache). The
 * index slot of a digest is a keyed hash (XXH3 with a per-pool random seed) of all its bytes,
 * so prompts chosen to crowd one slot cannot make probes long. Eviction is lazy: a free
 * hashed block keeps its digest until it is popped for reuse.
 */
#ifndef TANDEM_SCHED_BLOCK_POOL_H
#define TANDEM_SCHED_BLOCK_POOL_H

#include <stdint.h>

#include "hash.h"
#include "kv_events.h"

#define TDM__NO_BLOCK UINT32_MAX

typedef struct tdm__pool_slot {
    uint32_t block;        /* block id or TDM__NO_BLOCK */
    uint32_t key;          /* low 32 bits of the keyed slot hash of the block's digest */
} tdm__pool_slot;

/* Everything the pool keeps about one block, in one 64-byte cache line: an allocation, a
 * release, caching or evicting a block reads and writes this line and an index slot. */
typedef struct tdm__pool_block {
    tdm__digest hash;      /* its digest while hashed */
    uint32_t refcnt;
    uint32_t prev, next;   /* free queue links; block num_blocks is the sentinel */
    uint32_t key;          /* its slot key while hashed (found again at eviction) */
    uint8_t hashed;
    uint8_t pad_[64 - sizeof(tdm__digest) - 4 * sizeof(uint32_t) - 1];
} tdm__pool_block;

typedef struct tdm__pool {
    uint32_t num_blocks;   /* including the null block */
    uint32_t num_free;     /* blocks in the free queue */
    uint32_t num_hashed;   /* blocks carrying a hash (in use or free) */
    uint64_t num_refs;     /* references held: the sum of the refcounts, the null block's
                              excluded (bounds the deferred-free queue, deferred_free.c) */
    tdm__pool_block *blk;  /* num_blocks + 1 (the sentinel), 64-byte aligned */
    void *blk_mem;         /* the allocation holding blk */
    /* hash index: open addressing, linear probing, backward-shift deletion. A slot holds the
     * block and the low 32 bits of its digest's keyed hash (`key`): the key's low bits are
     * the home slot and the whole key filters probes, so that probing, insertion and the
     * backward shift of a deletion never read a digest nor hash one again. */
    tdm__pool_slot *slots;
    uint32_t slot_mask;
    uint64_t seed;         /* key of the slot hash, random per pool */
    uint64_t evictions;
    tdm__kv_events *ev;    /* KV event queue when events are enabled, else NULL */
} tdm__pool;

_Static_assert(sizeof(tdm__pool_block) == 64, "a block's record is one cache line");

/* Allocate a pool of num_blocks blocks (>= 2). Returns TDM_OK or TDM_E_NOMEM. */
int tdm__pool_init(tdm__pool *p, uint32_t num_blocks);
void tdm__pool_free(tdm__pool *p);

/* Pop n blocks from the head of the free queue into out (refcount 1, hash evicted).
 * The caller has checked n <= num_free. */
void tdm__pool_alloc(tdm__pool *p, uint32_t *out, uint32_t n);

/* Take a reference on a cached block found by a prefix lookup (removing it from the free
 * queue if its refcount was 0). */
void tdm__pool_touch(tdm__pool *p, uint32_t block);

/* Drop one reference on each of a block table's blocks[0..n), from the last to the first;
 * blocks reaching 0 go to the free queue: hashed ones to the tail (kept longest), others to
 * the head (reused first). Going backwards, a request's tail blocks are evicted first. */
void tdm__pool_release(tdm__pool *p, const uint32_t *blocks, uint32_t n);

/* Drop one reference on each of blocks[0..n), from the first to the last (the order in
 * which they go back to the free queue; tdm__pool_release goes backwards). */
void tdm__pool_release_in_order(tdm__pool *p, const uint32_t *blocks, uint32_t n);

/* Look up a digest (all 32 bytes compared): the cached block id, or TDM__NO_BLOCK. */
uint32_t tdm__pool_lookup(const tdm__pool *p, tdm__digest h);

/* Give block `b` hash h and index it (unless b already carries a hash). An equal hash
 * already indexed stays first: lookups return the earliest indexed copy still cached, and
 * the prefix is found while any copy survives. Returns 1 if indexed. */
int tdm__pool_cache(tdm__pool *p, uint32_t b, tdm__digest h);

/* Whether hashed block b is reachable from its hash's home slot (a check for tests). */
int tdm__pool_indexed(const tdm__pool *p, uint32_t b);

/* Drop every hash of free blocks from the index (an ALL_CLEARED event when no cached block
 * was in use, else a REMOVED event per block dropped). */
void tdm__pool_reset_cache(tdm__pool *p);

#endif
