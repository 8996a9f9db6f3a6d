/*
 * hash.h -- the 128-bit chained block hash of the prefix cache and the 64-bit mixers used
 * by the scheduler's hash tables. A block's hash covers its parent block's hash, its token
 * ids and an extra key (the cache salt, first block only), so equal hashes mean equal
 * prefixes (up to a 2^-128 collision chance).
 */
#ifndef TANDEM_SCHED_HASH_H
#define TANDEM_SCHED_HASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct tdm__h128 {
    uint64_t lo, hi;
} tdm__h128;

/* The parent hash of a request's first block (a fixed, documented constant, so that hashes
 * are reproducible across processes, unlike vLLM's per-process random NONE_HASH). */
extern const tdm__h128 tdm__hash_root;

/* Hash of one full block: parent, `n` token ids, and an optional extra key. */
tdm__h128 tdm__hash_block(tdm__h128 parent, const int32_t *tokens, uint32_t n,
                          const tdm__h128 *extra);

/* Hash of arbitrary bytes (for the cache salt). */
tdm__h128 tdm__hash_bytes(const void *data, size_t len);

static inline int tdm__h128_eq(tdm__h128 a, tdm__h128 b) { return a.lo == b.lo && a.hi == b.hi; }

/* splitmix64 finaliser: a fast bijective mixer for 64-bit keys. */
static inline uint64_t tdm__mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

#endif
