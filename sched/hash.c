/*
 * hash.c -- the 128-bit block hash: two independent 64-bit lanes, each a multiply-rotate
 * absorption of 64-bit words (two token ids per word) seeded differently, finalised with
 * cross-lane mixing. Not cryptographic; designed for speed with a negligible accidental
 * collision rate over the number of blocks a cache ever holds.
 */
#include <string.h>

#include "hash.h"

const tdm__h128 tdm__hash_root = { 0x5443444d5f524f4fULL, 0x544e44454d5f3031ULL };

#define P1 0x9e3779b97f4a7c15ULL
#define P2 0xc2b2ae3d27d4eb4fULL
#define P3 0x165667b19e3779f9ULL
#define P4 0xd6e8feb86659fd93ULL

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

typedef struct lanes {
    uint64_t a, b;
} lanes;

static inline void absorb(lanes *l, uint64_t w)
{
    l->a = rotl(l->a ^ (w * P1), 31) * P2;
    l->b = rotl(l->b ^ (w * P3), 29) * P4;
}

static inline tdm__h128 finish(lanes l, uint64_t len)
{
    uint64_t a = l.a ^ len, b = l.b ^ (len * P1);
    a += b;
    b += a;
    a = tdm__mix64(a);
    b = tdm__mix64(b ^ P3);
    a += b;
    b += a;
    tdm__h128 h = { a, b };
    return h;
}

tdm__h128 tdm__hash_block(tdm__h128 parent, const int32_t *tokens, uint32_t n,
                          const tdm__h128 *extra)
{
    lanes l = { parent.lo ^ P4, parent.hi ^ P1 };
    absorb(&l, parent.hi);
    absorb(&l, parent.lo);
    uint32_t i = 0;
    for (; i + 1 < n; i += 2)
        absorb(&l, (uint64_t)(uint32_t)tokens[i] | ((uint64_t)(uint32_t)tokens[i + 1] << 32));
    if (i < n) absorb(&l, (uint64_t)(uint32_t)tokens[i] | (1ULL << 63));
    if (extra) {
        absorb(&l, extra->lo ^ P2);
        absorb(&l, extra->hi ^ P3);
    }
    return finish(l, (uint64_t)n | (extra ? 1ULL << 40 : 0));
}

tdm__h128 tdm__hash_bytes(const void *data, size_t len)
{
    const unsigned char *p = data;
    lanes l = { P1 ^ len, P2 };
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        absorb(&l, w);
    }
    uint64_t tail = 0;
    for (size_t k = 0; i < len; i++, k++) tail |= (uint64_t)p[i] << (8 * k);
    absorb(&l, tail);
    return finish(l, len);
}
