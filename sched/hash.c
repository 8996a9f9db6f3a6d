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
#include <xxhash.h>

#include "hash.h"
#include "internal.h"
#include "tandem.h"

int tdm__hasher_init(tdm__hasher *h)
{
    memset(h, 0, sizeof(*h));
    EVP_MD *md = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (!md) return TDM_E_INTERNAL;
    EVP_MD_free(md);
    return TDM_OK;
}

void tdm__hasher_free(tdm__hasher *h)
{
    tdm__free(h->buf);
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
    return TDM_OK;
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

int tdm__hash_block(const tdm__hasher *h, int algo, const tdm__digest *parent,
                    const int32_t *tokens, uint32_t n, const tdm__digest *extra, tdm__digest *out)
{
    uint32_t L = tdm__hash_len(algo);
    size_t need = 2u * L + 8u + (size_t)n * 4u;
    if (!h->buf || need > h->cap) {
        memset(out, 0, sizeof(*out));
        return TDM_E_INTERNAL;
    }
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
    return digest(h, algo, h->buf, (size_t)(p - h->buf), out);
}

int tdm__hash_bytes(const tdm__hasher *h, int algo, const void *data, size_t len, tdm__digest *out)
{
    return digest(h, algo, data, len, out);
}
