/*
 * hash.c -- the prefix cache's block digests from libraries (see hash.h): SHA-256 from
 * OpenSSL's libcrypto (the default; collision-resistant) and XXH3-128 from libxxhash (fast, not
 * collision-resistant against a chosen-prompt attacker). A block is serialized into the
 * hasher's buffer as
 *     parent digest (L bytes; L zero bytes for the first block)
 *     u32le token count, the token ids as u32le
 *     u32le extra-key length (0 or L), the extra key (the cache salt's digest)
 * and that buffer is digested in one call, L being the algorithm's digest length (32 or 16).
 * XXH3-128 digests are stored in xxHash's canonical (big-endian) byte order, the bytes
 * `xxhsum -H2` and Python's xxhash.xxh3_128_digest print.
 *
 * The cost: SHA-256 is taken with libcrypto's SHA256_Init/Update/Final on a stack context
 * (deprecated in 3.0 but shipped by every 3.x). That is libcrypto's fast path: no provider
 * look-up, no context set-up or allocation per digest (OpenSSL 3.0's EVP_DigestInit frees
 * and allocates the provider's context on every call; 3.1+ still dispatches through the
 * provider per call), and the block function is the one libcrypto picks for the CPU at load
 * time (the SHA extensions where the CPU has them, else AVX2/SSSE3 code). The digest is
 * written straight into its 32-byte slot. EVP is used once, at init, to check that the
 * library provides SHA-256 at all (a FIPS-only configuration, say, may not).
 */
#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256_Init & co. (see above) */
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdbool.h>
#include <sys/random.h>
#include <time.h>
#include <xxhash.h>

#include "hash.h"
#include "internal.h"
#include "tandem.h"

/* The memo of block digests: memo_n entries (a power of two) of memo_stride bytes, each
 *     u32 algorithm + 1 (0: empty), u32 message length, the digest (32 bytes), the message
 * (the serialized block, up to the buffer's capacity). A message goes to the pair of entries
 * (a two-way set) its keyed hash picks; the older of the two makes room. About 1 MiB,
 * allocated at the first memoized digest. */
#define MEMO_BYTES ((size_t)1 << 20)
#define MEMO_HDR (8 + sizeof(tdm__digest))
/* The filter of blocks seen: 2^18 bits (32 KiB), reset once an eighth of them is set, so
 * that a new block finds its bit already set (and pays a memo probe) at most 1 time in 8. */
#define SEEN_BITS ((uint32_t)1 << 18)

int tdm__hasher_init(tdm__hasher *h)
{
    memset(h, 0, sizeof(*h));
    EVP_MD *md = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (!md) return TDM_E_INTERNAL;
    EVP_MD_free(md);
    /* The memo's key: only the memo's hit rate depends on it, never a digest. */
    uint64_t seed;
    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t)sizeof(seed)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        seed = tdm__mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)(uintptr_t)h);
    }
    h->memo_seed = seed;
    return TDM_OK;
}

void tdm__hasher_free(tdm__hasher *h)
{
    tdm__free(h->buf);
    tdm__free(h->memo);
    tdm__free(h->seen);
    memset(h, 0, sizeof(*h));
}

int tdm__hasher_reserve(tdm__hasher *h, uint32_t block_size)
{
    size_t need = TDM__DIGEST_MAX + 4 + (size_t)block_size * 4 + 4 + TDM__DIGEST_MAX;
    if (need <= h->cap) return TDM_OK;
    unsigned char *b = tdm__malloc(need);
    if (!b) return TDM_E_NOMEM;
    tdm__free(h->buf);
    h->buf = b;
    h->cap = need;
    /* The memo's entries are sized for the buffer: a new one is made at its next use. */
    tdm__free(h->memo);
    h->memo = NULL;
    h->memo_n = 0;
    return TDM_OK;
}

/* Allocate the memo (entries sized for the buffer) and the filter at their first use, so that
 * a scheduler that never hashes prompts (host digests, no prefix caching, XXH3-128) holds
 * neither. False when out of memory: the caller hashes without the memo. */
static bool memo_ready(tdm__hasher *h)
{
    if (h->memo) return true;
    size_t stride = (MEMO_HDR + h->cap + 7) & ~(size_t)7;
    uint32_t n = 2; /* one two-way set at least */
    while ((size_t)n * 2 * stride <= MEMO_BYTES) n *= 2;
    if (!h->seen) {
        h->seen = tdm__calloc(SEEN_BITS / 64, sizeof(uint64_t));
        h->seen_n = 0;
        if (!h->seen) return false;
    }
    h->memo = tdm__calloc(n, stride);
    if (!h->memo) return false;
    h->memo_n = n;
    h->memo_stride = stride;
    return true;
}

uint32_t tdm__hash_len(int algo) { return algo == TDM_PREFIX_HASH_XXH3_128 ? 16u : 32u; }

static inline unsigned char *put_u32le(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
    return p + 4;
}

static int digest(const tdm__hasher *h, int algo, const void *data, size_t len, tdm__digest *out)
{
    (void)h;
    if (algo == TDM_PREFIX_HASH_XXH3_128) {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits(data, len));
        memcpy(out, c.digest, sizeof(c.digest));
        memset((unsigned char *)out + sizeof(c.digest), 0, sizeof(*out) - sizeof(c.digest));
        return TDM_OK;
    }
    _Static_assert(sizeof(tdm__digest) == SHA256_DIGEST_LENGTH, "a SHA-256 digest fills a tdm__digest");
    SHA256_CTX c;
    if (!SHA256_Init(&c) || !SHA256_Update(&c, data, len) || !SHA256_Final((unsigned char *)out, &c)) {
        memset(out, 0, sizeof(*out));
        return TDM_E_INTERNAL;
    }
    return TDM_OK;
}

/* Serialize a block into h->buf (the bytes its digest covers); their length, or 0 when the
 * buffer is too small (not reserved for this block size). */
static size_t serialize(const tdm__hasher *h, int algo, const tdm__digest *parent, const int32_t *tokens,
                        uint32_t n, const tdm__digest *extra)
{
    uint32_t L = tdm__hash_len(algo);
    size_t need = 2u * L + 8u + (size_t)n * 4u;
    if (!h->buf || need > h->cap) return 0;
    unsigned char *p = h->buf;
    if (parent) memcpy(p, parent, L);
    else memset(p, 0, L);
    p = put_u32le(p + L, n);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, tokens, (size_t)n * 4u);
    p += (size_t)n * 4u;
#else
    for (uint32_t i = 0; i < n; i++) p = put_u32le(p, (uint32_t)tokens[i]);
#endif
    p = put_u32le(p, extra ? L : 0u);
    if (extra) {
        memcpy(p, extra, L);
        p += L;
    }
    return (size_t)(p - h->buf);
}

int tdm__hash_block(const tdm__hasher *h, int algo, const tdm__digest *parent,
                    const int32_t *tokens, uint32_t n, const tdm__digest *extra, tdm__digest *out)
{
    size_t len = serialize(h, algo, parent, tokens, n, extra);
    if (!len) {
        memset(out, 0, sizeof(*out));
        return TDM_E_INTERNAL;
    }
    return digest(h, algo, h->buf, len, out);
}

/* Entry e becomes the set's newer way holding (hdr, out, the serialized block); the entry
 * that was there moves to the older way e2, whose entry is dropped. */
static void memo_put_front(const tdm__hasher *h, unsigned char *e, unsigned char *e2,
                           const unsigned char hdr[8], const tdm__digest *out, size_t len)
{
    memcpy(e2, e, MEMO_HDR + h->cap);
    memcpy(e, hdr, 8);
    memcpy(e + 8, out, sizeof(*out));
    memcpy(e + MEMO_HDR, h->buf, len);
}

int tdm__hash_block_memo(tdm__hasher *h, int algo, const tdm__digest *parent, const int32_t *tokens,
                         uint32_t n, const tdm__digest *extra, tdm__digest *out)
{
    size_t len = serialize(h, algo, parent, tokens, n, extra);
    if (!len) {
        memset(out, 0, sizeof(*out));
        return TDM_E_INTERNAL;
    }
    if (algo != TDM_PREFIX_HASH_SHA256 || !memo_ready(h)) return digest(h, algo, h->buf, len, out);
    uint64_t k = XXH3_64bits_withSeed(h->buf, len, h->memo_seed);
    uint32_t bit = (uint32_t)(k >> 40) & (SEEN_BITS - 1);
    uint64_t mask = 1ull << (bit & 63);
    if (!(h->seen[bit / 64] & mask)) { /* first sight (since the reset): hash, store nothing */
        h->seen[bit / 64] |= mask;
        if (++h->seen_n >= SEEN_BITS / 8) {
            memset(h->seen, 0, SEEN_BITS / 8);
            h->seen_n = 0;
        }
        return digest(h, algo, h->buf, len, out);
    }
    /* Two ways per set: the newer entry first. A hit in the second way swaps it to the front;
     * a new entry pushes the first way's entry to the second (whose entry is dropped). */
    unsigned char *e = h->memo + (size_t)(k & (h->memo_n - 2)) * h->memo_stride, *e2 = e + h->memo_stride;
    uint32_t tag = (uint32_t)algo + 1, elen = (uint32_t)len;
    unsigned char hdr[8];
    memcpy(hdr, &tag, 4);
    memcpy(hdr + 4, &elen, 4);
    for (int way = 0; way < 2; way++) {
        unsigned char *w = way ? e2 : e;
        if (memcmp(w, hdr, 8) || memcmp(w + MEMO_HDR, h->buf, len)) continue;
        memcpy(out, w + 8, sizeof(*out));
        if (way) memo_put_front(h, e, e2, hdr, out, len); /* the first way's entry goes second */
        h->memo_hits++;
        return TDM_OK;
    }
    int rc = digest(h, algo, h->buf, len, out);
    if (rc) return rc;
    memo_put_front(h, e, e2, hdr, out, len);
    return TDM_OK;
}

int tdm__hash_bytes(const tdm__hasher *h, int algo, const void *data, size_t len, tdm__digest *out)
{
    return digest(h, algo, data, len, out);
}
