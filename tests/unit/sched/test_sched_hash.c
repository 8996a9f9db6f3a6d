/*
 * test_sched_hash.c -- the prefix cache's block digests: known answers for SHA-256 and
 * XXH3-128 over the documented byte format (chained blocks, the cache salt's digest as the
 * first block's extra key), digests that agree on their first 64 bits (or more) and differ
 * after never sharing KV, host-supplied digests hitting across requests (given at add and
 * appended during decode), Tandem's digests equal to the same digests computed by a host,
 * the "prefix_hash" parameter and the validation of host digests; tdm_prefix_digests() and
 * digests handed over with TDM_REQ_PRECOMPUTED_DIGESTS (the same cache entries as computed ones,
 * refused when they are not this scheduler's).
 *
 * The expected digests were computed independently when this test was written, with Python's
 * hashlib.sha256 and the xxhash wheel (4.1.0, which bundles its own xxHash 0.8.4, not
 * Debian's libxxhash), from the format in docs/scheduler.md:
 *     parent (L bytes, zero for the first block) | u32le n | n x u32le token |
 *     u32le extra_len | extra            (L = 32 for sha256, 16 for xxh3_128)
 * with block 0 = tokens 1000..1015, block 1 = tokens 2000..2015 (parent: block 0's digest),
 * and the salt "tenant-a" whose digest H(b"tenant-a") is block 0's extra key.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_driver.h"

#if TDM_HAVE_SCHED_IMPL

#include "../../../sched/block_pool.h"
#include "../../../sched/hash.h"

typedef struct known {
    const char *algo;
    int key;
    uint32_t len;
    const char *d0, *d1, *salt, *s0, *s1;
} known;

static const known KNOWN[] = {
    { "sha256", TDM_PREFIX_HASH_SHA256, 32,
      "a79314b9c10a8966d97734d03916bf630c7675daf0419f1c9d69a005cf30836a",
      "075e1838ea35bc20155c07baba4e65d6634c2e6b3be1122d4539b1215d0d4d48",
      "80a707af7dc77ee1228f9127180f3964835e5beb4c4ab0d812f0fe7593579b3a",
      "141c17fab127f5d1bc385f882780d2b9ae6ad03db89e5c16d132c6a73af8bb90",
      "b7ea7eb22285dbc43fb873b3015c2c218e149acc30954f00be54521a73b00381" },
    { "xxh3_128", TDM_PREFIX_HASH_XXH3_128, 16,
      "ebad181d76f22febd323ac5d8aea3295",
      "b7b251e368924b3004f00ed7f9aca265",
      "840d4cd48986a98b18ab3e02a86ce641",
      "18bfb4ad8fc56251182ab29f0e7b725c",
      "1ce034e7816431ebb9ddc02b0f9db4a7" },
};

static void unhex(const char *hex, unsigned char *out, size_t n)
{
    assert_int_equal(strlen(hex), 2 * n);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
        out[i] = (unsigned char)v;
    }
}

/* A digest as the library stores it: the bytes, zero-padded to 32. */
static tdm__digest digest_of_hex(const char *hex, uint32_t len)
{
    tdm__digest d;
    memset(&d, 0, sizeof(d));
    unhex(hex, (unsigned char *)&d, len);
    return d;
}

static void known_tokens(tdm_token *b0, tdm_token *b1)
{
    for (int i = 0; i < 16; i++) {
        b0[i] = 1000 + i;
        b1[i] = 2000 + i;
    }
}

static void assert_digest(const tdm__digest *got, const char *hex, uint32_t len)
{
    tdm__digest want = digest_of_hex(hex, len);
    if (memcmp(got, &want, sizeof(want))) {
        char buf[65];
        for (uint32_t i = 0; i < len; i++) snprintf(buf + 2 * i, 3, "%02x", ((const unsigned char *)got)[i]);
        fail_msg("digest %s, expected %s", buf, hex);
    }
}

/* ---- known answers (the internal hasher, then end to end through the public API) ---- */

static void hash__known_answers_for_each_algorithm(void **state)
{
    (void)state;
    tdm__hasher h;
    assert_int_equal(tdm__hasher_init(&h), TDM_OK);
    assert_int_equal(tdm__hasher_reserve(&h, 16), TDM_OK);
    tdm_token b0[16], b1[16];
    known_tokens(b0, b1);
    for (size_t k = 0; k < sizeof(KNOWN) / sizeof(KNOWN[0]); k++) {
        const known *e = &KNOWN[k];
        assert_int_equal(tdm__hash_len(e->key), e->len);
        tdm__digest d0, d1, salt, s0, s1;
        assert_int_equal(tdm__hash_block(&h, e->key, NULL, b0, 16, NULL, &d0), TDM_OK);
        assert_digest(&d0, e->d0, e->len);
        assert_int_equal(tdm__hash_block(&h, e->key, &d0, b1, 16, NULL, &d1), TDM_OK);
        assert_digest(&d1, e->d1, e->len);
        assert_int_equal(tdm__hash_bytes(&h, e->key, "tenant-a", 8, &salt), TDM_OK);
        assert_digest(&salt, e->salt, e->len);
        assert_int_equal(tdm__hash_block(&h, e->key, NULL, b0, 16, &salt, &s0), TDM_OK);
        assert_digest(&s0, e->s0, e->len);
        assert_int_equal(tdm__hash_block(&h, e->key, &s0, b1, 16, NULL, &s1), TDM_OK);
        assert_digest(&s1, e->s1, e->len);
    }
    /* A block larger than the reserved buffer is refused, not overrun. */
    tdm_token big[17] = { 0 };
    tdm__digest d;
    assert_int_equal(tdm__hash_block(&h, TDM_PREFIX_HASH_SHA256, NULL, big, 17, NULL, &d), TDM_E_INTERNAL);
    tdm__hasher_free(&h);
}

/* The memo of prompt digests (tdm_sched_add's path) returns exactly the digests of
 * tdm__hash_block: known answers on first sight, on the sight that stores them and on memo
 * hits; a block that differs from a remembered one in one token, in its parent or in its
 * extra key gets its own digest; unique blocks past a filter reset still hash right; blocks
 * of another size after a re-reserve too. */
static void hash__memo_returns_the_digests_of_hashing(void **state)
{
    (void)state;
    tdm__hasher h;
    assert_int_equal(tdm__hasher_init(&h), TDM_OK);
    assert_int_equal(tdm__hasher_reserve(&h, 16), TDM_OK);
    tdm_token b0[16], b1[16];
    known_tokens(b0, b1);
    for (size_t k = 0; k < sizeof(KNOWN) / sizeof(KNOWN[0]); k++) {
        const known *e = &KNOWN[k];
        tdm__digest salt;
        assert_int_equal(tdm__hash_bytes(&h, e->key, "tenant-a", 8, &salt), TDM_OK);
        for (int round = 0; round < 4; round++) { /* first sight, stored, then hits */
            tdm__digest d0, d1, s0, s1;
            assert_int_equal(tdm__hash_block_memo(&h, e->key, NULL, b0, 16, NULL, &d0), TDM_OK);
            assert_digest(&d0, e->d0, e->len);
            assert_int_equal(tdm__hash_block_memo(&h, e->key, &d0, b1, 16, NULL, &d1), TDM_OK);
            assert_digest(&d1, e->d1, e->len);
            assert_int_equal(tdm__hash_block_memo(&h, e->key, NULL, b0, 16, &salt, &s0), TDM_OK);
            assert_digest(&s0, e->s0, e->len);
            assert_int_equal(tdm__hash_block_memo(&h, e->key, &s0, b1, 16, NULL, &s1), TDM_OK);
            assert_digest(&s1, e->s1, e->len);
        }
    }
    assert_true(h.memo_hits > 0); /* the SHA-256 rounds after the second came from the memo */
    /* Near misses of a remembered block: one token, the parent, the extra key. */
    tdm__digest d0, want, got, other_parent;
    memset(&other_parent, 0x5a, sizeof(other_parent));
    for (int round = 0; round < 3; round++)
        assert_int_equal(tdm__hash_block_memo(&h, TDM_PREFIX_HASH_SHA256, NULL, b0, 16, NULL, &d0), TDM_OK);
    tdm_token t[16];
    memcpy(t, b0, sizeof(t));
    t[15]++;
    assert_int_equal(tdm__hash_block(&h, TDM_PREFIX_HASH_SHA256, NULL, t, 16, NULL, &want), TDM_OK);
    for (int round = 0; round < 3; round++) {
        assert_int_equal(tdm__hash_block_memo(&h, TDM_PREFIX_HASH_SHA256, NULL, t, 16, NULL, &got), TDM_OK);
        assert_memory_equal(&got, &want, sizeof(want));
    }
    assert_int_equal(tdm__hash_block(&h, TDM_PREFIX_HASH_SHA256, &other_parent, b0, 16, NULL, &want), TDM_OK);
    assert_int_equal(tdm__hash_block_memo(&h, TDM_PREFIX_HASH_SHA256, &other_parent, b0, 16, NULL, &got), TDM_OK);
    assert_memory_equal(&got, &want, sizeof(want));
    assert_int_equal(tdm__hash_block(&h, TDM_PREFIX_HASH_SHA256, NULL, b0, 16, &other_parent, &want), TDM_OK);
    assert_int_equal(tdm__hash_block_memo(&h, TDM_PREFIX_HASH_SHA256, NULL, b0, 16, &other_parent, &got), TDM_OK);
    assert_memory_equal(&got, &want, sizeof(want));
    /* Many unique blocks (the filter resets several times), each twice: memo and plain agree. */
    for (uint32_t i = 0; i < 200000; i++) {
        t[0] = (tdm_token)i;
        t[1] = (tdm_token)(i % 7);
        assert_int_equal(tdm__hash_block_memo(&h, TDM_PREFIX_HASH_SHA256, &d0, t, 16, NULL, &got), TDM_OK);
        if (i % 997 == 0) {
            assert_int_equal(tdm__hash_block(&h, TDM_PREFIX_HASH_SHA256, &d0, t, 16, NULL, &want), TDM_OK);
            assert_memory_equal(&got, &want, sizeof(want));
            assert_int_equal(tdm__hash_block_memo(&h, TDM_PREFIX_HASH_SHA256, &d0, t, 16, NULL, &got), TDM_OK);
            assert_memory_equal(&got, &want, sizeof(want));
        }
    }
    /* Another block size: the memo is sized again and a block of 8 tokens hashes as plain. */
    assert_int_equal(tdm__hasher_reserve(&h, 32), TDM_OK);
    for (int round = 0; round < 3; round++) {
        assert_int_equal(tdm__hash_block_memo(&h, TDM_PREFIX_HASH_SHA256, NULL, b0, 8, NULL, &got), TDM_OK);
        assert_int_equal(tdm__hash_block(&h, TDM_PREFIX_HASH_SHA256, NULL, b0, 8, NULL, &want), TDM_OK);
        assert_memory_equal(&got, &want, sizeof(want));
    }
    /* A block larger than the reserved buffer is refused, not overrun. */
    tdm_token big[33] = { 0 };
    assert_int_equal(tdm__hash_block_memo(&h, TDM_PREFIX_HASH_SHA256, NULL, big, 33, NULL, &got), TDM_E_INTERNAL);
    tdm__hasher_free(&h);
}

static tdm_sched *sched_with_hash(const char *algo)
{
    char json[160];
    snprintf(json, sizeof(json), "{\"prefix_hash\": \"%s\", \"block_size\": 16, \"num_blocks\": 64}", algo);
    return tsd_new(json);
}

static int add_req(tdm_sched *s, uint64_t id, const tdm_token *p, uint32_t n, uint32_t max_tokens,
                   const char *salt, const void *hashes, uint32_t nh, uint32_t hsize)
{
    tdm_request_desc d;
    tsd_desc(&d, id, p, n, max_tokens);
    d.cache_salt = salt;
    d.cache_salt_len = salt ? (uint32_t)strlen(salt) : 0;
    d.block_hashes = hashes;
    d.num_block_hashes = nh;
    d.block_hash_size = hsize;
    return tdm_sched_add(s, &d);
}

/* Run request `id` (already added) to its end. */
static void run_one(tdm_sched *s, double *now)
{
    tsd_run(s, 200, now);
}

/* Tokens computed for `id` when first scheduled in the next step (its prefix hit). */
static uint32_t first_hit(tdm_sched *s, uint64_t id, double *now)
{
    tdm_batch b;
    tsd_step(s, *now, &b);
    int k = tsd_find(&b, id);
    if (k < 0) fail_msg("request %llu not scheduled", (unsigned long long)id);
    uint32_t c = b.num_computed[k];
    tsd_update(s, &b, 7, *now + 0.001, NULL);
    *now += 0.01;
    return c;
}

/* Tandem's own digests equal the independently computed ones: a host that passes them
 * (unsalted, and salted with "tenant-a") hits the blocks Tandem hashed itself; a digest one
 * bit off misses. */
static void hash__tandem_digests_equal_the_documented_format(void **state)
{
    (void)state;
    for (size_t k = 0; k < (sizeof(KNOWN) / sizeof(KNOWN[0])); k++) {
        const known *e = &KNOWN[k];
        tdm_sched *s = sched_with_hash(e->algo);
        tdm_token p[33];
        known_tokens(p, p + 16);
        p[32] = 5;
        double now = 1.0;
        assert_int_equal(add_req(s, 1, p, 33, 1, NULL, NULL, 0, 0), TDM_OK);
        assert_int_equal(add_req(s, 2, p, 33, 1, "tenant-a", NULL, 0, 0), TDM_OK);
        run_one(s, &now);
        unsigned char plain[2 * 32], salted[2 * 32];
        unhex(e->d0, plain, e->len);
        unhex(e->d1, plain + e->len, e->len);
        unhex(e->s0, salted, e->len);
        unhex(e->s1, salted + e->len, e->len);
        assert_int_equal(add_req(s, 3, p, 33, 1, NULL, plain, 2, e->len), TDM_OK);
        assert_int_equal(first_hit(s, 3, &now), 32);
        assert_int_equal(add_req(s, 4, p, 33, 1, NULL, salted, 2, e->len), TDM_OK);
        assert_int_equal(first_hit(s, 4, &now), 32);
        /* one bit off in the second digest: only the first block hits; in the first: none */
        salted[2 * e->len - 1] ^= 1;
        assert_int_equal(add_req(s, 5, p, 33, 1, NULL, salted, 2, e->len), TDM_OK);
        assert_int_equal(first_hit(s, 5, &now), 16);
        plain[e->len - 1] ^= 1;
        assert_int_equal(add_req(s, 6, p, 33, 1, NULL, plain, 2, e->len), TDM_OK);
        assert_int_equal(first_hit(s, 6, &now), 0);
        run_one(s, &now);
        tsd_done(s);
    }
}

/* A block that fills during decode is hashed in the step, chained from the prompt digest
 * computed at add (the prompt's digests stay in the request record, the later ones in the
 * run arrays): a request whose prompt is the first one's tokens hits both blocks, salted
 * alike too; with another salt, none. */
static void hash__decode_block_chains_from_the_prompt_digests(void **state)
{
    (void)state;
    const char *algos[] = {"sha256", "xxh3_128"};
    for (size_t k = 0; k < 2; k++) {
        for (int salted = 0; salted < 2; salted++) {
            tdm_sched *s = sched_with_hash(algos[k]);
            const char *salt = salted ? "tenant-b" : NULL;
            tdm_token p[33];
            tsd_prompt(21, 20, p);
            for (int i = 20; i < 32; i++) p[i] = 7; /* the outputs tsd_update samples */
            p[32] = 9;
            double now = 1.0;
            assert_int_equal(add_req(s, 1, p, 20, 16, salt, NULL, 0, 0), TDM_OK);
            run_one(s, &now); /* 36 tokens: block 1 filled by decode */
            assert_int_equal(add_req(s, 2, p, 33, 1, salt, NULL, 0, 0), TDM_OK);
            assert_int_equal(first_hit(s, 2, &now), 32);
            run_one(s, &now);
            assert_int_equal(add_req(s, 3, p, 33, 1, salted ? NULL : "tenant-c", NULL, 0, 0), TDM_OK);
            assert_int_equal(first_hit(s, 3, &now), 0);
            run_one(s, &now);
            tsd_done(s);
        }
    }
}

/* ---- digests agreeing on a prefix of their bits ---- */

/* Host digests equal on their first 8 bytes (64 bits), or on all but one byte further on,
 * never share KV; identical ones do. */
static void hash__digests_differing_past_64_bits_never_share(void **state)
{
    (void)state;
    static const uint32_t sizes[] = { 16, 32 };
    for (size_t z = 0; z < (sizeof(sizes) / sizeof(sizes[0])); z++) {
        uint32_t hs = sizes[z];
        tdm_sched *s = sched_with_hash("sha256");
        tdm_token p[17];
        tsd_prompt(9, 17, p);
        unsigned char base[32];
        for (uint32_t i = 0; i < 32; i++) base[i] = (unsigned char)(0xa5 ^ (i * 37));
        double now = 1.0;
        assert_int_equal(add_req(s, 1, p, 17, 1, NULL, base, 1, hs), TDM_OK);
        run_one(s, &now);
        uint64_t id = 2;
        for (uint32_t byte = 8; byte < hs; byte++) {
            unsigned char h[32];
            memcpy(h, base, sizeof(h));
            h[byte] ^= 0x01; /* one bit, past the first 64 */
            assert_int_equal(add_req(s, id, p, 17, 1, NULL, h, 1, hs), TDM_OK);
            if (first_hit(s, id, &now) != 0)
                fail_msg("digests differing only in byte %u (of %u) shared a block", byte, hs);
            run_one(s, &now);
            id++;
        }
        assert_int_equal(add_req(s, id, p, 17, 1, NULL, base, 1, hs), TDM_OK);
        assert_int_equal(first_hit(s, id, &now), 16);
        run_one(s, &now);
        tsd_done(s);
    }
}

/* The same at the block pool: its index compares all 32 bytes, whatever the slot hash. */
static void pool__digests_equal_on_64_bits_are_distinct_entries(void **state)
{
    (void)state;
    tdm__pool p;
    assert_int_equal(tdm__pool_init(&p, 64), TDM_OK);
    uint32_t blocks[40];
    tdm__pool_alloc(&p, blocks, 40);
    tdm__digest d[40];
    for (uint32_t i = 0; i < 40; i++) {
        memset(&d[i], 0, sizeof(d[i]));
        d[i].w[0] = 0x0123456789abcdefULL; /* the same first 64 bits for all */
        ((unsigned char *)&d[i])[8 + i % 24] = (unsigned char)(1 + i / 24);
        assert_int_equal(tdm__pool_cache(&p, blocks[i], d[i]), 1);
    }
    for (uint32_t i = 0; i < 40; i++) assert_int_equal(tdm__pool_lookup(&p, d[i]), blocks[i]);
    tdm__digest other = d[0];
    other.w[3] ^= 1ULL << 63; /* the very last bit */
    assert_int_equal(tdm__pool_lookup(&p, other), TDM__NO_BLOCK);
    tdm__pool_release(&p, blocks, 40);
    tdm__pool_free(&p);
}

/* ---- host-supplied digests across requests ---- */

/* Host digests given at add hit across requests: the longest run of equal digests, capped
 * so the last prompt token is recomputed; a different first digest means no hit at all. */
static void host_hashes__hit_across_requests(void **state)
{
    (void)state;
    tdm_sched *s = sched_with_hash("sha256");
    tdm_token p[49];
    tsd_prompt(3, 49, p);
    unsigned char h[3 * 32];
    for (uint32_t i = 0; i < sizeof(h); i++) h[i] = (unsigned char)(i * 7 + 1);
    double now = 1.0;
    assert_int_equal(add_req(s, 1, p, 49, 2, NULL, h, 3, 32), TDM_OK);
    run_one(s, &now);
    assert_int_equal(add_req(s, 2, p, 49, 2, NULL, h, 3, 32), TDM_OK);
    assert_int_equal(first_hit(s, 2, &now), 48);
    run_one(s, &now);
    /* fewer digests given: the hit stops where they stop */
    assert_int_equal(add_req(s, 3, p, 49, 2, NULL, h, 2, 32), TDM_OK);
    assert_int_equal(first_hit(s, 3, &now), 32);
    run_one(s, &now);
    /* the host's digests decide, not the tokens: other tokens, same digests, a hit */
    tdm_token q[49];
    tsd_prompt(4, 49, q);
    assert_int_equal(add_req(s, 4, q, 49, 2, NULL, h, 1, 32), TDM_OK);
    assert_int_equal(first_hit(s, 4, &now), 16);
    run_one(s, &now);
    /* and Tandem's own digests of the same tokens are another namespace */
    assert_int_equal(add_req(s, 5, p, 49, 2, NULL, NULL, 0, 0), TDM_OK);
    assert_int_equal(first_hit(s, 5, &now), 0);
    run_one(s, &now);
    tsd_done(s);
}

/* Blocks that fill during decode are cached once the host appends their digest (before
 * the step that completes them, or later while the request runs); a block whose digest
 * never comes is not cached. */
static void host_hashes__appended_during_decode_are_cached(void **state)
{
    (void)state;
    for (int mode = 0; mode < 3; mode++) { /* 0: append at once, 1: append late, 2: never */
        tdm_sched *s = sched_with_hash("sha256");
        tdm_token p[33];
        tsd_prompt(11, 20, p);
        for (int i = 20; i < 32; i++) p[i] = 7; /* the outputs tsd_update samples */
        p[32] = 9;
        unsigned char h[2 * 32];
        for (uint32_t i = 0; i < sizeof(h); i++) h[i] = (unsigned char)(i * 13 + 5);
        double now = 1.0;
        assert_int_equal(add_req(s, 1, p, 20, 16, NULL, h, 1, 32), TDM_OK);
        /* not yet full: block 1 has 4 of its 16 tokens */
        assert_int_equal(tdm_sched_append_block_hashes(s, 1, h + 32, 1, 32), TDM_E_RANGE);
        tsd_assert_msg_has(s, "full blocks");
        bool appended = false;
        for (int step = 0; step < 40 && tsd_unfinished(s); step++) {
            tdm_batch b;
            tsd_step(s, now, &b);
            tsd_update(s, &b, 7, now + 0.001, NULL);
            now += 0.01;
            tdm_request_info info;
            tsd_info(s, 1, &info);
            uint32_t ntok = info.num_prompt_tokens + info.num_output_tokens;
            bool due = ntok >= 32 && (mode == 0 || (mode == 1 && ntok >= 34));
            if (!appended && due && info.state != TDM_STATE_FINISHED) {
                assert_int_equal(tdm_sched_append_block_hashes(s, 1, h + 32, 1, 32), TDM_OK);
                appended = true;
            }
        }
        assert_true(mode == 2 || appended);
        assert_int_equal(add_req(s, 2, p, 33, 1, NULL, h, 2, 32), TDM_OK);
        assert_int_equal(first_hit(s, 2, &now), mode == 2 ? 16 : 32);
        run_one(s, &now);
        tsd_done(s);
    }
}

/* Digests appended before the request is first scheduled count like those given at add. */
static void host_hashes__appended_before_admission(void **state)
{
    (void)state;
    tdm_sched *s = sched_with_hash("xxh3_128");
    tdm_token p[33];
    tsd_prompt(12, 33, p);
    unsigned char h[2 * 16];
    for (uint32_t i = 0; i < sizeof(h); i++) h[i] = (unsigned char)(i + 1);
    double now = 1.0;
    assert_int_equal(add_req(s, 1, p, 33, 1, NULL, NULL, 0, 16), TDM_OK);
    assert_int_equal(tdm_sched_append_block_hashes(s, 1, h, 0, 16), TDM_OK);
    assert_int_equal(tdm_sched_append_block_hashes(s, 1, h, 1, 16), TDM_OK);
    assert_int_equal(tdm_sched_append_block_hashes(s, 1, h + 16, 1, 16), TDM_OK);
    assert_int_equal(tdm_sched_append_block_hashes(s, 1, h, 1, 16), TDM_E_RANGE); /* 3 > 2 */
    run_one(s, &now);
    assert_int_equal(add_req(s, 2, p, 33, 1, NULL, h, 2, 16), TDM_OK);
    assert_int_equal(first_hit(s, 2, &now), 32);
    run_one(s, &now);
    tsd_done(s);
}

/* ---- configuration and validation ---- */

static void prefix_hash__config_key_and_setter(void **state)
{
    (void)state;
    tdm_sched *s = tsd_new(NULL);
    int64_t v = -1;
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_PREFIX_HASH, &v), TDM_OK);
    assert_int_equal(v, TDM_PREFIX_HASH_SHA256);
    char *cfg = tsd_config(s);
    assert_non_null(strstr(cfg, "\"prefix_hash\":\"sha256\""));
    free(cfg);
    assert_int_equal(tdm_sched_configure(s, "{\"prefix_hash\": \"md5\"}"), TDM_E_CONFIG);
    tsd_assert_msg_has(s, "prefix_hash");
    tsd_assert_msg_has(s, "\"sha256\", \"xxh3_128\"");
    assert_int_equal(tdm_sched_configure(s, "{\"prefix_hash\": 1}"), TDM_E_CONFIG);
    tsd_assert_msg_has(s, "prefix_hash");
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_PREFIX_HASH, 2), TDM_E_CONFIG);
    tsd_assert_msg_has(s, "prefix_hash");
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_PREFIX_HASH, TDM_PREFIX_HASH_XXH3_128), TDM_OK);
    cfg = tsd_config(s);
    assert_non_null(strstr(cfg, "\"prefix_hash\":\"xxh3_128\""));
    free(cfg);
    /* changing it drops what is cached under the other digest */
    double now = 1.0;
    assert_int_equal(tsd_add(s, 1, 40, 1), TDM_OK);
    assert_int_equal(tdm_sched_set_param(s, TDM_SCHED_PREFIX_HASH, 0), TDM_E_STATE);
    tsd_assert_msg_has(s, "prefix_hash");
    run_one(s, &now);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_cached_blocks, 2);
    assert_int_equal(tdm_sched_configure(s, "{\"prefix_hash\": \"sha256\"}"), TDM_OK);
    tsd_stats(s, &st);
    assert_int_equal(st.num_cached_blocks, 0);
    tsd_done(s);
}

static void host_hashes__validation(void **state)
{
    (void)state;
    tdm_sched *s = sched_with_hash("sha256");
    tdm_token p[40];
    tsd_prompt(21, 40, p);
    unsigned char h[3 * 32] = { 1 };
    assert_int_equal(add_req(s, 1, p, 40, 4, NULL, h, 1, 8), TDM_E_RANGE);
    tsd_assert_msg_has(s, "block_hash_size 8");
    assert_int_equal(add_req(s, 1, p, 40, 4, NULL, h, 1, 15), TDM_E_RANGE);
    assert_int_equal(add_req(s, 1, p, 40, 4, NULL, h, 1, 33), TDM_E_RANGE);
    assert_int_equal(add_req(s, 1, p, 40, 4, NULL, h, 3, 32), TDM_E_RANGE); /* 2 full blocks */
    tsd_assert_msg_has(s, "3 block hashes for 2 full prompt blocks");
    assert_int_equal(add_req(s, 1, p, 40, 4, NULL, NULL, 1, 32), TDM_E_INVAL);
    tsd_assert_msg_has(s, "block_hashes is NULL");
    assert_int_equal(add_req(s, 1, p, 40, 4, NULL, h, 1, 0), TDM_E_INVAL);
    tsd_assert_msg_has(s, "block_hash_size 0");
    assert_int_equal(add_req(s, 1, p, 40, 4, "tenant", h, 1, 32), TDM_E_INVAL);
    tsd_assert_msg_has(s, "exclusive");
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_waiting, 0); /* nothing was added */
    /* A caller built against the first tdm_request_desc (no hash fields) is accepted, and
     * the bytes past its struct_size are not read. */
    struct {
        tdm_request_desc d;
        unsigned char junk[8];
    } old;
    memset(&old, 0xee, sizeof(old));
    tdm_request_desc_init(&old.d);
    old.d.id = 9;
    old.d.prompt = p;
    old.d.num_prompt_tokens = 40;
    old.d.max_tokens = 2;
    old.d.struct_size = (uint32_t)offsetof(tdm_request_desc, block_hashes);
    memset(&old.d.block_hashes, 0xee, sizeof(old) - offsetof(tdm_request_desc, block_hashes));
    assert_int_equal(tdm_sched_add(s, &old.d), TDM_OK);
    old.d.struct_size = (uint32_t)offsetof(tdm_request_desc, block_hashes) - 4;
    old.d.id = 10;
    assert_int_equal(tdm_sched_add(s, &old.d), TDM_E_INVAL);
    /* append */
    assert_int_equal(add_req(s, 1, p, 40, 4, NULL, h, 1, 32), TDM_OK);
    assert_int_equal(tdm_sched_append_block_hashes(s, 1, h, 1, 16), TDM_E_INVAL);
    tsd_assert_msg_has(s, "differs");
    assert_int_equal(tdm_sched_append_block_hashes(s, 1, NULL, 1, 32), TDM_E_INVAL);
    assert_int_equal(tdm_sched_append_block_hashes(s, 1, h, 2, 32), TDM_E_RANGE);
    assert_int_equal(tdm_sched_append_block_hashes(s, 9, h, 1, 32), TDM_E_INVAL);
    tsd_assert_msg_has(s, "without block hashes");
    assert_int_equal(tdm_sched_append_block_hashes(s, 77, h, 1, 32), TDM_E_NOT_FOUND);
    assert_int_equal(tdm_sched_append_block_hashes(NULL, 1, h, 1, 32), TDM_E_INVAL);
    assert_int_equal(tdm_sched_append_block_hashes(s, 1, h + 32, 1, 32), TDM_OK);
    double now = 1.0;
    run_one(s, &now);
    assert_int_equal(tdm_sched_append_block_hashes(s, 1, h, 1, 32), TDM_E_NOT_FOUND); /* finished */
    tsd_done(s);
}

/* ---- tdm_prefix_digests and TDM_REQ_PRECOMPUTED_DIGESTS (issue 26) ---- */

/* The public function gives the documented digests (the known answers), salted or not, and
 * stops at the full blocks that fit in out. */
static void prefix_digests__known_answers(void **state)
{
    (void)state;
    for (size_t k = 0; k < (sizeof(KNOWN) / sizeof(KNOWN[0])); k++) {
        const known *e = &KNOWN[k];
        tdm_token p[40];
        known_tokens(p, p + 16);
        for (int i = 32; i < 40; i++) p[i] = 9;
        unsigned char out[3 * 32], want[2 * 32];
        uint32_t n = 77;
        memset(out, 0xaa, sizeof(out));
        assert_int_equal(tdm_prefix_digests(e->key, 16, NULL, 0, p, 40, out, sizeof(out), &n), TDM_OK);
        assert_int_equal(n, 2); /* 40 tokens: two full blocks */
        unhex(e->d0, want, e->len);
        unhex(e->d1, want + e->len, e->len);
        assert_memory_equal(out, want, 2 * e->len);
        assert_int_equal(out[2 * e->len], 0xaa); /* nothing written past them */
        assert_int_equal(tdm_prefix_digests(e->key, 16, "tenant-a", 8, p, 40, out, sizeof(out), &n), TDM_OK);
        unhex(e->s0, want, e->len);
        unhex(e->s1, want + e->len, e->len);
        assert_memory_equal(out, want, 2 * e->len);
        /* room for one digest only */
        assert_int_equal(tdm_prefix_digests(e->key, 16, NULL, 0, p, 40, out, e->len + 1, &n), TDM_OK);
        assert_int_equal(n, 1);
        assert_int_equal(tdm_prefix_digests(e->key, 16, NULL, 0, p, 15, out, sizeof(out), &n), TDM_OK);
        assert_int_equal(n, 0);
    }
}

static void prefix_digests__bad_arguments(void **state)
{
    (void)state;
    tdm_token p[32] = { 0 };
    unsigned char out[64];
    uint32_t n = 77;
    static char salt[4097];
    assert_int_equal(tdm_prefix_digests(7, 16, NULL, 0, p, 32, out, 64, &n), TDM_E_INVAL);
    assert_non_null(strstr(tdm_prefix_errmsg(), "unknown algo 7"));
    assert_int_equal(tdm_prefix_digests(0, 0, NULL, 0, p, 32, out, 64, &n), TDM_E_INVAL);
    assert_non_null(strstr(tdm_prefix_errmsg(), "block_size 0"));
    assert_int_equal(tdm_prefix_digests(0, 70000, NULL, 0, p, 32, out, 64, &n), TDM_E_INVAL);
    assert_int_equal(tdm_prefix_digests(0, 16, NULL, 0, NULL, 32, out, 64, &n), TDM_E_INVAL);
    assert_non_null(strstr(tdm_prefix_errmsg(), "tokens is NULL"));
    assert_int_equal(tdm_prefix_digests(0, 16, NULL, 0, p, 32, NULL, 64, &n), TDM_E_INVAL);
    assert_int_equal(tdm_prefix_digests(0, 16, NULL, 0, p, 32, out, 64, NULL), TDM_E_INVAL);
    assert_int_equal(tdm_prefix_digests(0, 16, NULL, 3, p, 32, out, 64, &n), TDM_E_INVAL);
    assert_non_null(strstr(tdm_prefix_errmsg(), "cache_salt is NULL"));
    assert_int_equal(tdm_prefix_digests(0, 16, salt, 4097, p, 32, out, 64, &n), TDM_E_RANGE);
    p[20] = -3;
    assert_int_equal(tdm_prefix_digests(0, 16, NULL, 0, p, 32, out, 64, &n), TDM_E_INVAL);
    assert_non_null(strstr(tdm_prefix_errmsg(), "token 20 is negative"));
    assert_int_equal(n, 77); /* untouched on failure */
    /* a negative token past the last full block is not hashed: fine */
    p[20] = 0;
    tdm_token q[33] = { 0 };
    q[32] = -1;
    assert_int_equal(tdm_prefix_digests(0, 16, NULL, 0, q, 33, out, 64, &n), TDM_OK);
    assert_int_equal(n, 2);
    assert_string_equal(tdm_prefix_errmsg(), "");
}

static int add_pre(tdm_sched *s, uint64_t id, const tdm_token *p, uint32_t n, const char *salt,
                   const void *hashes, uint32_t nh, uint32_t hsize)
{
    tdm_request_desc d;
    tsd_desc(&d, id, p, n, 1);
    d.flags |= TDM_REQ_PRECOMPUTED_DIGESTS;
    d.cache_salt = salt;
    d.cache_salt_len = salt ? (uint32_t)strlen(salt) : 0;
    d.block_hashes = hashes;
    d.num_block_hashes = nh;
    d.block_hash_size = hsize;
    return tdm_sched_add(s, &d);
}

/* Digests computed ahead by tdm_prefix_digests and handed over with the flag are the ones the
 * scheduler would compute: a request added without them hits the blocks of one added with
 * them and the other way round, salted or not, and with only some of them given (the rest
 * computed at add). The request is not in host-digest mode (no appends). */
static void precomputed__same_cache_as_computed(void **state)
{
    (void)state;
    for (size_t k = 0; k < (sizeof(KNOWN) / sizeof(KNOWN[0])); k++) {
        const known *e = &KNOWN[k];
        for (int salted = 0; salted < 2; salted++) {
            const char *salt = salted ? "tenant-a" : NULL;
            tdm_sched *s = sched_with_hash(e->algo);
            tdm_token p[49];
            tsd_prompt(31, 49, p);
            unsigned char h[3 * 32];
            uint32_t n = 0;
            assert_int_equal(tdm_prefix_digests(e->key, 16, salt, salt ? 8 : 0, p, 49, h, sizeof(h), &n),
                             TDM_OK);
            assert_int_equal(n, 3);
            double now = 1.0;
            assert_int_equal(add_pre(s, 1, p, 49, salt, h, 3, e->len), TDM_OK);
            assert_int_equal(tdm_sched_append_block_hashes(s, 1, h, 1, e->len), TDM_E_INVAL);
            tsd_assert_msg_has(s, "without block hashes");
            run_one(s, &now);
            assert_int_equal(add_req(s, 2, p, 49, 1, salt, NULL, 0, 0), TDM_OK);
            assert_int_equal(first_hit(s, 2, &now), 48);
            run_one(s, &now);
            /* the other way round, in a fresh scheduler: computed first, then given */
            tsd_done(s);
            s = sched_with_hash(e->algo);
            assert_int_equal(add_req(s, 3, p, 49, 1, salt, NULL, 0, 0), TDM_OK);
            run_one(s, &now);
            assert_int_equal(add_pre(s, 4, p, 49, salt, h, 3, e->len), TDM_OK);
            assert_int_equal(first_hit(s, 4, &now), 48);
            run_one(s, &now);
            assert_int_equal(add_pre(s, 5, p, 49, salt, h, 1, e->len), TDM_OK); /* 2 computed */
            assert_int_equal(first_hit(s, 5, &now), 48);
            run_one(s, &now);
            /* without a salt where the digests had one (or the reverse): refused */
            assert_int_equal(add_pre(s, 6, p, 49, salted ? NULL : "tenant-a", h, 3, e->len), TDM_E_INVAL);
            tsd_assert_msg_has(s, "precomputed digest 0 is not");
            tsd_done(s);
        }
    }
}

/* Digests that are not this scheduler's are refused and nothing is added: another block
 * size, another algorithm's size, a forged last digest, a wrong count, the flag without a
 * size. Without prefix caching they are ignored. */
static void precomputed__validation(void **state)
{
    (void)state;
    tdm_sched *s = sched_with_hash("sha256");
    tdm_token p[64];
    tsd_prompt(5, 64, p);
    unsigned char h[8 * 32];
    uint32_t n;
    assert_int_equal(tdm_prefix_digests(TDM_PREFIX_HASH_SHA256, 8, NULL, 0, p, 64, h, sizeof(h), &n), TDM_OK);
    assert_int_equal(add_pre(s, 1, p, 64, NULL, h, 4, 32), TDM_E_INVAL); /* block size 8, not 16 */
    tsd_assert_msg_has(s, "precomputed digest 0 is not");
    assert_int_equal(tdm_prefix_digests(TDM_PREFIX_HASH_XXH3_128, 16, NULL, 0, p, 64, h, sizeof(h), &n), TDM_OK);
    assert_int_equal(add_pre(s, 1, p, 64, NULL, h, 4, 16), TDM_E_INVAL);
    tsd_assert_msg_has(s, "makes 32-byte digests");
    assert_int_equal(tdm_prefix_digests(TDM_PREFIX_HASH_SHA256, 16, NULL, 0, p, 64, h, sizeof(h), &n), TDM_OK);
    assert_int_equal(n, 4);
    h[3 * 32 + 5] ^= 1; /* the last one forged */
    assert_int_equal(add_pre(s, 1, p, 64, NULL, h, 4, 32), TDM_E_INVAL);
    tsd_assert_msg_has(s, "precomputed digest 3 is not");
    h[3 * 32 + 5] ^= 1;
    assert_int_equal(add_pre(s, 1, p, 64, NULL, h, 5, 32), TDM_E_RANGE);
    tsd_assert_msg_has(s, "5 precomputed digests for 4 full prompt blocks");
    assert_int_equal(add_pre(s, 1, p, 64, NULL, h, 4, 0), TDM_E_INVAL);
    tsd_assert_msg_has(s, "block_hash_size 0");
    assert_int_equal(add_pre(s, 1, p, 64, NULL, NULL, 4, 32), TDM_E_INVAL);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_int_equal(st.num_waiting, 0); /* nothing was added */
    assert_int_equal(add_pre(s, 1, p, 64, NULL, h, 4, 32), TDM_OK);
    double now = 1.0;
    run_one(s, &now);
    tsd_done(s);
    s = tsd_new("{\"block_size\": 16, \"num_blocks\": 64, \"enable_prefix_caching\": false}");
    h[0] ^= 1; /* not looked at */
    assert_int_equal(add_pre(s, 1, p, 64, NULL, h, 4, 32), TDM_OK);
    run_one(s, &now);
    tsd_done(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TSD_TEST(hash__known_answers_for_each_algorithm),
        TSD_TEST(hash__memo_returns_the_digests_of_hashing),
        TSD_TEST(hash__tandem_digests_equal_the_documented_format),
        TSD_TEST(hash__decode_block_chains_from_the_prompt_digests),
        TSD_TEST(hash__digests_differing_past_64_bits_never_share),
        TSD_TEST(pool__digests_equal_on_64_bits_are_distinct_entries),
        TSD_TEST(host_hashes__hit_across_requests),
        TSD_TEST(host_hashes__appended_during_decode_are_cached),
        TSD_TEST(host_hashes__appended_before_admission),
        TSD_TEST(prefix_hash__config_key_and_setter),
        TSD_TEST(host_hashes__validation),
        TSD_TEST(prefix_digests__known_answers),
        TSD_TEST(prefix_digests__bad_arguments),
        TSD_TEST(precomputed__same_cache_as_computed),
        TSD_TEST(precomputed__validation),
    };
    return cmocka_run_group_tests_name("sched_hash", tests, NULL, NULL);
}

#else
TSD_SKIP_MAIN("sched_hash")
#endif
