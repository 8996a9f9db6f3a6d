/*
 * block_pool.c -- implementation of the paged KV block pool and its prefix-cache index
 * (see block_pool.h). All operations are O(1) except the bulk ones, which are O(n) in the
 * blocks they touch; nothing allocates after tdm__pool_init.
 */
#include <stdbool.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <xxhash.h>

#include "block_pool.h"
#include "internal.h"

/* The key of the index's slot hash: from the kernel's random pool, or (if that fails) from
 * the clock and an address, which is weaker but only affects probe lengths, never results. */
static uint64_t slot_seed(const void *where)
{
    uint64_t seed;
    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) == (ssize_t)sizeof(seed)) return seed;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return tdm__mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)(uintptr_t)where);
}

static inline uint32_t sentinel(const tdm__pool *p) { return p->num_blocks; }

static void q_unlink(tdm__pool *p, uint32_t b)
{
    tdm__pool_block *k = p->blk;
    k[k[b].prev].next = k[b].next;
    k[k[b].next].prev = k[b].prev;
    p->num_free--;
}

static void q_append(tdm__pool *p, uint32_t b)
{
    tdm__pool_block *k = p->blk;
    uint32_t s = sentinel(p), last = k[s].prev;
    k[last].next = b;
    k[b].prev = last;
    k[b].next = s;
    k[s].prev = b;
    p->num_free++;
}

static void q_prepend(tdm__pool *p, uint32_t b)
{
    tdm__pool_block *k = p->blk;
    uint32_t s = sentinel(p), first = k[s].next;
    k[first].prev = b;
    k[b].next = first;
    k[b].prev = s;
    k[s].next = b;
    p->num_free++;
}

int tdm__pool_init(tdm__pool *p, uint32_t num_blocks)
{
    memset(p, 0, sizeof(*p));
    uint32_t cap = 16;
    while (cap < 2u * num_blocks) cap <<= 1;
    p->num_blocks = num_blocks;
    /* one record per block and the sentinel's, aligned to a cache line */
    p->blk_mem = tdm__calloc((size_t)num_blocks + 2, sizeof(tdm__pool_block));
    p->slots = tdm__malloc((size_t)cap * sizeof(tdm__pool_slot));
    if (!p->blk_mem || !p->slots) {
        tdm__pool_free(p);
        return TDM_E_NOMEM;
    }
    p->blk = (tdm__pool_block *)(((uintptr_t)p->blk_mem + sizeof(tdm__pool_block) - 1) &
                                 ~(uintptr_t)(sizeof(tdm__pool_block) - 1));
    p->slot_mask = cap - 1;
    p->seed = slot_seed(p);
    memset(p->slots, 0xff, (size_t)cap * sizeof(tdm__pool_slot));
    uint32_t s = sentinel(p);
    p->blk[s].next = p->blk[s].prev = s;
    p->blk[0].refcnt = 1; /* the null block is never free and never handed out */
    for (uint32_t b = 1; b < num_blocks; b++) q_append(p, b);
    return TDM_OK;
}

void tdm__pool_free(tdm__pool *p)
{
    tdm__free(p->blk_mem);
    tdm__free(p->slots);
    memset(p, 0, sizeof(*p));
}

/* The slot key of a digest: the low 32 bits of a keyed hash of all its bytes; its low bits
 * pick the home slot. Keyed, so that digests an attacker can compute (they may choose
 * prompts) do not let them pick slots. */
static inline uint32_t slot_key(const tdm__pool *p, const tdm__digest *h)
{
    return (uint32_t)XXH3_64bits_withSeed(h, sizeof(*h), p->seed);
}

uint32_t tdm__pool_lookup(const tdm__pool *p, tdm__digest h)
{
    uint32_t key = slot_key(p, &h);
    for (uint32_t i = key & p->slot_mask;; i = (i + 1) & p->slot_mask) {
        tdm__pool_slot e = p->slots[i];
        if (e.block == TDM__NO_BLOCK) return TDM__NO_BLOCK;
        if (e.key == key && tdm__digest_eq(&p->blk[e.block].hash, &h)) return e.block;
    }
}

int tdm__pool_indexed(const tdm__pool *p, uint32_t b)
{
    uint32_t key = slot_key(p, &p->blk[b].hash);
    for (uint32_t i = key & p->slot_mask;; i = (i + 1) & p->slot_mask) {
        if (p->slots[i].block == b) return p->slots[i].key == key && p->blk[b].key == key;
        if (p->slots[i].block == TDM__NO_BLOCK) return 0;
    }
}

/* Remove block b's entry from the index (backward-shift deletion keeps probes short and
 * needs no tombstones). The homes come from the slot keys: no digest is read or hashed. */
static void index_remove(tdm__pool *p, uint32_t b)
{
    uint32_t i = p->blk[b].key & p->slot_mask;
    while (p->slots[i].block != b) i = (i + 1) & p->slot_mask;
    for (;;) {
        p->slots[i].block = TDM__NO_BLOCK;
        uint32_t j = i;
        for (;;) {
            j = (j + 1) & p->slot_mask;
            tdm__pool_slot c = p->slots[j];
            if (c.block == TDM__NO_BLOCK) return;
            uint32_t home = c.key & p->slot_mask;
            /* c may move to i if its home is not in the cyclic range (i, j]. */
            if (((j - home) & p->slot_mask) >= ((j - i) & p->slot_mask)) {
                p->slots[i] = c;
                i = j;
                break;
            }
        }
    }
}

static void unhash(tdm__pool *p, uint32_t b)
{
    index_remove(p, b);
    p->blk[b].hashed = 0;
    p->num_hashed--;
}

/* Lazy eviction of a cached block that is being reused. */
static void evict(tdm__pool *p, uint32_t b)
{
    if (p->ev) tdm__kv_removed(p->ev, b, &p->blk[b].hash);
    unhash(p, b);
    p->evictions++;
}

/* A block whose hash is already indexed is indexed too, after the earlier copies (vLLM maps
 * a hash to several blocks): lookups find the earliest surviving copy first, and the prefix
 * stays cached while any copy lives. Probing keeps equal hashes in insertion order, and the
 * backward-shift deletion never reorders entries of one home slot. */
int tdm__pool_cache(tdm__pool *p, uint32_t b, tdm__digest h)
{
    tdm__pool_block *k = &p->blk[b];
    if (k->hashed) return 0;
    uint32_t key = slot_key(p, &h);
    uint32_t i = key & p->slot_mask;
    while (p->slots[i].block != TDM__NO_BLOCK) i = (i + 1) & p->slot_mask;
    p->slots[i].block = b;
    p->slots[i].key = key;
    k->key = key;
    k->hash = h;
    k->hashed = 1;
    p->num_hashed++;
    return 1;
}

void tdm__pool_alloc(tdm__pool *p, uint32_t *out, uint32_t n)
{
    uint32_t s = sentinel(p);
    for (uint32_t k = 0; k < n; k++) {
        uint32_t b = p->blk[s].next;
        q_unlink(p, b);
        if (p->blk[b].hashed) evict(p, b);
        p->blk[b].refcnt = 1;
        out[k] = b;
    }
    p->num_refs += n;
}

void tdm__pool_touch(tdm__pool *p, uint32_t b)
{
    p->num_refs++;
    if (p->blk[b].refcnt++ == 0) q_unlink(p, b);
}

static inline void release_one(tdm__pool *p, uint32_t b)
{
    if (--p->blk[b].refcnt != 0) return;
    if (p->blk[b].hashed) q_append(p, b);
    else q_prepend(p, b);
}

void tdm__pool_release(tdm__pool *p, const uint32_t *blocks, uint32_t n)
{
    p->num_refs -= n;
    for (uint32_t k = n; k-- > 0;) release_one(p, blocks[k]);
}

void tdm__pool_release_in_order(tdm__pool *p, const uint32_t *blocks, uint32_t n)
{
    p->num_refs -= n;
    for (uint32_t k = 0; k < n; k++) release_one(p, blocks[k]);
}

void tdm__pool_reset_cache(tdm__pool *p)
{
    bool all = p->ev && tdm__kv_reset_is_clear(p);
    if (all) tdm__kv_cleared(p->ev);
    for (uint32_t b = 1; b < p->num_blocks; b++)
        if (p->blk[b].hashed && p->blk[b].refcnt == 0) {
            if (p->ev && !all) tdm__kv_removed(p->ev, b, &p->blk[b].hash);
            unhash(p, b);
        }
}
