/*
 * hash.h -- the chained block hash of the prefix cache, computed by well-kept libraries
 * (SHA-256 from OpenSSL's libcrypto, or XXH3-128 from libxxhash), and
 * the digest type the block pool indexes. A block's digest covers its parent block's digest,
 * its token ids and an extra key (the digest of the cache salt, first block only), so equal
 * digests mean equal prefixes up to the algorithm's collision resistance. Hosts may supply
 * their own digests instead (16 to 32 bytes each); every digest is stored in full, zero-padded
 * to 32 bytes. The byte format hashed is documented in docs/scheduler.md.
 *
 * tdm__mix64 (the splitmix64 finaliser) stays: it spreads the host's 64-bit request ids over
 * the id table, a bijection on integers the host chooses anyway, not a content hash.
 */
#ifndef TANDEM_SCHED_HASH_H
#define TANDEM_SCHED_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define TDM__DIGEST_MAX 32u   /* bytes stored per digest (SHA-256's size) */
#define TDM__HOST_HASH_MIN 16u /* the shortest host digest accepted (128 bits) */

/* A digest as bytes, zero-padded to TDM__DIGEST_MAX (the words only make it aligned). */
typedef struct tdm__digest {
    uint64_t w[TDM__DIGEST_MAX / 8];
} tdm__digest;

static inline int tdm__digest_eq(const tdm__digest *a, const tdm__digest *b)
{
    return ((a->w[0] ^ b->w[0]) | (a->w[1] ^ b->w[1]) | (a->w[2] ^ b->w[2]) | (a->w[3] ^ b->w[3])) == 0;
}

/* The hashing state of one scheduler: a serialization buffer sized for one block (the
 * SHA-256 context lives on the stack of each digest; see hash.c) and the memo of prompt
 * block digests (tdm__hash_block_memo). Not thread-safe (one per scheduler). */
typedef struct tdm__hasher {
    unsigned char *buf;     /* parent | n | tokens | extra_len | extra */
    size_t cap;             /* bytes of buf */
    unsigned char *memo;    /* memo_n entries of memo_stride bytes (see hash.c), or NULL
                               until the first memoized digest */
    uint32_t memo_n;        /* a power of two */
    size_t memo_stride;
    uint64_t memo_seed;     /* key of the memo's slot hash, random per hasher */
    uint64_t *seen;         /* bit filter of the blocks seen since its last reset */
    uint32_t seen_n;        /* bits set in it */
    uint64_t memo_hits;     /* digests the memo returned (tests) */
} tdm__hasher;

/* Check that libcrypto provides SHA-256. TDM_OK or TDM_E_INTERNAL (it does not: a broken
 * or FIPS-restricted installation). */
int tdm__hasher_init(tdm__hasher *h);
void tdm__hasher_free(tdm__hasher *h);

/* Size the serialization buffer for blocks of block_size tokens (a memo sized for a smaller
 * one is dropped, to be made again at its next use). TDM_OK or TDM_E_NOMEM (then the hasher
 * is unchanged). */
int tdm__hasher_reserve(tdm__hasher *h, uint32_t block_size);

/* Digest length of an algorithm (a tdm_prefix_hash value): 32 or 16. */
uint32_t tdm__hash_len(int algo);

/* Digest of one full block: parent (NULL for the first block), n token ids (n <= the
 * reserved block size) and an optional extra key. Returns TDM_OK or TDM_E_INTERNAL when the
 * library call fails (then *out is all zero, which no lookup of a real digest matches). */
int tdm__hash_block(const tdm__hasher *h, int algo, const tdm__digest *parent,
                    const int32_t *tokens, uint32_t n, const tdm__digest *extra, tdm__digest *out);

/* The same digest as tdm__hash_block, through the memo of SHA-256 block digests: a block
 * whose serialized bytes (parent digest, token ids, extra key: everything the digest covers)
 * equal those of a block digested before, and still remembered, takes that digest instead of
 * hashing again. Requests sharing a prefix (a system prompt, a few-shot header) thus hash
 * each shared block about once, not once per request. The memo is a fixed table of about
 * 1 MiB, allocated at the first call (out of memory: the digest is computed without it),
 * whose slot is a keyed hash of the bytes; entries are compared in full, so a memo hit
 * returns exactly the digest hashing would. Only blocks seen before (a
 * bit filter, reset as it fills) are stored, so that prompts sharing nothing pay the keyed
 * hash and a bit test, not a memo entry each. XXH3-128 digests are not memoized (the memo's
 * key costs about as much as the digest). */
int tdm__hash_block_memo(tdm__hasher *h, int algo, const tdm__digest *parent, const int32_t *tokens,
                         uint32_t n, const tdm__digest *extra, tdm__digest *out);

/* Digest of arbitrary bytes (the cache salt). Same errors as tdm__hash_block. */
int tdm__hash_bytes(const tdm__hasher *h, int algo, const void *data, size_t len, tdm__digest *out);

/* splitmix64 finaliser: spreads integer keys (request ids) over a table. */
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
