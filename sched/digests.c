/*
 * digests.c -- tdm_prefix_digests(): the prefix cache's block digests of a prompt computed
 * outside any scheduler, with the same chained hash the scheduler uses (hash.c), so that a
 * host can compute them on another thread and hand them to tdm_sched_add() with
 * TDM_REQ_PRECOMPUTED_DIGESTS (e.g. `tandem serve` computes them on its decoding thread while
 * its loop serves other clients). No handle, no shared state: the serialization buffer is
 * allocated per call; errors are recorded per thread (tdm_prefix_errmsg).
 */
#include <stdarg.h>
#include <stdio.h>

#include "hash.h"
#include "internal.h"
#include "tandem.h"

#define MAX_BLOCK_SIZE (1u << 16) /* the scheduler's block_size range */
#define MAX_SALT 4096u            /* as tdm_sched_add */

static _Thread_local char t_err[TDM_ERRMSG_LEN];

const char *tdm_prefix_errmsg(void) { return t_err; }

TDM_PRINTF(2, 3)
static int fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_err, sizeof t_err, fmt, ap);
    va_end(ap);
    return status;
}

int tdm_prefix_digests(int algo, uint32_t block_size, const void *cache_salt,
                       uint32_t cache_salt_len, const tdm_token *tokens, uint32_t num_tokens,
                       void *out, size_t out_size, uint32_t *num_digests)
{
    t_err[0] = '\0';
    if (algo != TDM_PREFIX_HASH_SHA256 && algo != TDM_PREFIX_HASH_XXH3_128)
        return fail(TDM_E_INVAL, "prefix_digests: unknown algo %d", algo);
    if (block_size == 0 || block_size > MAX_BLOCK_SIZE)
        return fail(TDM_E_INVAL, "prefix_digests: block_size %u is not in [1, %u]", block_size,
                    MAX_BLOCK_SIZE);
    if (!num_digests) return fail(TDM_E_INVAL, "prefix_digests: num_digests is NULL");
    if (num_tokens && !tokens) return fail(TDM_E_INVAL, "prefix_digests: tokens is NULL");
    if (out_size && !out) return fail(TDM_E_INVAL, "prefix_digests: out is NULL");
    if (cache_salt_len && !cache_salt) return fail(TDM_E_INVAL, "prefix_digests: cache_salt is NULL");
    if (cache_salt_len > MAX_SALT)
        return fail(TDM_E_RANGE, "prefix_digests: cache_salt longer than %u bytes", MAX_SALT);
    uint32_t L = tdm__hash_len(algo);
    uint64_t n = num_tokens / block_size;
    if (n > out_size / L) n = out_size / L;
    /* the tokens hashed must be those tdm_sched_add accepts */
    for (uint64_t i = 0; i < n * block_size; i++)
        if (tokens[i] < 0)
            return fail(TDM_E_INVAL, "prefix_digests: token %llu is negative (%d)",
                        (unsigned long long)i, tokens[i]);
    tdm__hasher h;
    int rc = tdm__hasher_init(&h);
    if (rc) return fail(rc, "prefix_digests: libcrypto provides no SHA-256");
    if (tdm__hasher_reserve(&h, block_size)) {
        tdm__hasher_free(&h);
        return fail(TDM_E_NOMEM, "prefix_digests: out of memory");
    }
    tdm__digest salt, prev, cur;
    if (cache_salt_len && tdm__hash_bytes(&h, algo, cache_salt, cache_salt_len, &salt)) {
        tdm__hasher_free(&h);
        return fail(TDM_E_INTERNAL, "prefix_digests: hashing the cache salt failed (libcrypto)");
    }
    unsigned char *o = out;
    for (uint64_t i = 0; i < n; i++) {
        if (tdm__hash_block(&h, algo, i ? &prev : NULL, tokens + i * block_size, block_size,
                            (i == 0 && cache_salt_len) ? &salt : NULL, &cur)) {
            tdm__hasher_free(&h);
            return fail(TDM_E_INTERNAL, "prefix_digests: hashing block %llu failed (libcrypto)",
                        (unsigned long long)i);
        }
        memcpy(o + i * L, &cur, L);
        prev = cur;
    }
    tdm__hasher_free(&h);
    *num_digests = (uint32_t)n;
    return TDM_OK;
}
