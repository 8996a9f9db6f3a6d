/*
 * sched.c -- the tdm_sched handle: create and destroy, the init functions of the ABI
 * structs, adding, aborting and finishing requests, queries, stats, the P/D entry points
 * (remote KV done, release), drafts, the cost-model hook and the prefix-cache reset.
 * The step lives in step.c, the update in update.c.
 */
#include <math.h>
#include <string.h>

#include "sched_internal.h"

#define INIT_STRUCT(p, T)                   \
    do {                                    \
        if (!(p)) return TDM_E_INVAL;       \
        memset((p), 0, sizeof(T));          \
        (p)->struct_size = sizeof(T);       \
    } while (0)

int tdm_batch_init(tdm_batch *b) { INIT_STRUCT(b, tdm_batch); return TDM_OK; }
int tdm_step_output_init(tdm_step_output *o) { INIT_STRUCT(o, tdm_step_output); return TDM_OK; }
int tdm_update_result_init(tdm_update_result *r) { INIT_STRUCT(r, tdm_update_result); return TDM_OK; }
/* tdm_sched_stats and tdm_request_desc grew after ABI 1 was first published (docs/ABI.md):
 * their initialisers have two versions. The default, @@TANDEM_1.1, fills the current struct;
 * @TANDEM_1, what binaries linked before the growth call, fills only the first published
 * layout and so never writes past their struct. */
#define DESC_V1_SIZE offsetof(tdm_request_desc, block_hashes)
#define DESC_V1_1_SIZE offsetof(tdm_request_desc, prefix_hit_limit) /* grew again in TANDEM_1.2 */
#define STATS_V1_SIZE offsetof(tdm_sched_stats, kv_events_dropped)

#define INIT_PREFIX(p, size)                 \
    do {                                     \
        if (!(p)) return TDM_E_INVAL;        \
        memset((p), 0, (size));              \
        (p)->struct_size = (uint32_t)(size); \
    } while (0)

static void request_desc_defaults(tdm_request_desc *d)
{
    d->eos_token_id = -1;
    d->max_tokens = 16;
}

TDM_API int tdm__sched_stats_init_v1_1(tdm_sched_stats *st);
TDM_API int tdm__sched_stats_init_v1(tdm_sched_stats *st);
TDM_API int tdm__request_desc_init_v1_2(tdm_request_desc *d);
TDM_API int tdm__request_desc_init_v1_1(tdm_request_desc *d);
TDM_API int tdm__request_desc_init_v1(tdm_request_desc *d);
TDM__DEFAULT_SYMBOL(tdm__sched_stats_init_v1_1, tdm_sched_stats_init, TANDEM_1.1);
TDM__COMPAT_SYMBOL(tdm__sched_stats_init_v1, tdm_sched_stats_init, TANDEM_1);
TDM__DEFAULT_SYMBOL(tdm__request_desc_init_v1_2, tdm_request_desc_init, TANDEM_1.2);
TDM__COMPAT_SYMBOL(tdm__request_desc_init_v1_1, tdm_request_desc_init, TANDEM_1.1);
TDM__COMPAT_SYMBOL(tdm__request_desc_init_v1, tdm_request_desc_init, TANDEM_1);

int tdm__sched_stats_init_v1_1(tdm_sched_stats *st) { INIT_STRUCT(st, tdm_sched_stats); return TDM_OK; }
int tdm__sched_stats_init_v1(tdm_sched_stats *st) { INIT_PREFIX(st, STATS_V1_SIZE); return TDM_OK; }

int tdm__request_desc_init_v1_2(tdm_request_desc *d)
{
    INIT_STRUCT(d, tdm_request_desc);
    request_desc_defaults(d);
    return TDM_OK;
}

int tdm__request_desc_init_v1_1(tdm_request_desc *d)
{
    INIT_PREFIX(d, DESC_V1_1_SIZE);
    request_desc_defaults(d);
    return TDM_OK;
}

int tdm__request_desc_init_v1(tdm_request_desc *d)
{
    INIT_PREFIX(d, DESC_V1_SIZE);
    request_desc_defaults(d);
    return TDM_OK;
}

#if !TDM__HAVE_SYMVER
int tdm_sched_stats_init(tdm_sched_stats *st) { return tdm__sched_stats_init_v1_1(st); }
int tdm_request_desc_init(tdm_request_desc *d) { return tdm__request_desc_init_v1_2(d); }
#endif

int tdm_request_info_init(tdm_request_info *i)
{
    INIT_STRUCT(i, tdm_request_info);
    return TDM_OK;
}

/* Size the per-step arrays for max_num_seqs entries (called when it grows). */
static int size_step_arrays(tdm_sched *s, uint32_t n)
{
    if (n <= s->cap_entries) return TDM_OK;
#define GROW(ptr, T)                                                   \
    do {                                                               \
        T *np_ = tdm__realloc((ptr), (size_t)n * sizeof(T));           \
        if (!np_) return TDM_E_NOMEM;                                  \
        (ptr) = np_;                                                   \
    } while (0)
    GROW(s->entries, tdm__entry);
    GROW(s->out_ids, uint64_t);
    GROW(s->out_num_tokens, uint32_t);
    GROW(s->out_num_computed, uint32_t);
    GROW(s->out_num_spec, uint32_t);
    GROW(s->out_kinds, uint8_t);
    GROW(s->running, tdm__req *);
    GROW(s->victim_views, tdm_request_view);
    GROW(s->victim_ptrs, const tdm_request_view *);
    {
        uint32_t *np_ = tdm__realloc(s->out_block_offsets, ((size_t)n + 1) * sizeof(uint32_t));
        if (!np_) return TDM_E_NOMEM;
        s->out_block_offsets = np_;
    }
#undef GROW
    s->cap_entries = n;
    s->cap_running = n;
    return TDM_OK;
}

int tdm__sched_grow(tdm_sched *s, uint32_t max_num_seqs) { return size_step_arrays(s, max_num_seqs); }

int tdm_sched_create(tdm_sched **out)
{
    if (!out) return TDM_E_INVAL;
    tdm_sched *s = tdm__calloc(1, sizeof(*s));
    if (!s) return TDM_E_NOMEM;
    tdm__params_default(&s->prm);
    s->ad_ratio = 1.0;
    tdm__params p = s->prm;
    int rc = tdm__hasher_init(&s->hasher);
    if (!rc && (tdm__sched_apply_shape(s, &p) || size_step_arrays(s, (uint32_t)s->prm.max_num_seqs)))
        rc = TDM_E_NOMEM;
    if (rc) {
        tdm__handle_acquire();
        tdm_sched_destroy(s);
        return rc;
    }
    s->now = 0.0;
    tdm__handle_acquire();
    *out = s;
    return TDM_OK;
}

void tdm_sched_destroy(tdm_sched *s)
{
    if (!s) return;
    if (s->map)
        for (uint32_t i = 0; i <= s->map_mask; i++)
            if (s->map[i]) tdm__req_destroy(s, s->map[i]);
    tdm__run_cache_free(s);
    tdm__hasher_free(&s->hasher);
    tdm__free(s->map);
    tdm__free(s->heap);
    tdm__free(s->ad_long);
    tdm__free(s->running);
    tdm__vec_free(&s->finished);
    tdm__vec_free(&s->lingering);
    for (uint32_t i = 0; i < TDM__KEPT_BATCHES; i++) tdm__vec_free(&s->kept[i].ids);
    tdm__policy_drop(s);
    tdm__free(s->victim_views);
    tdm__free(s->victim_ptrs);
    tdm__free(s->entries);
    tdm__free(s->out_ids);
    tdm__free(s->out_num_tokens);
    tdm__free(s->out_num_computed);
    tdm__free(s->out_num_spec);
    tdm__free(s->out_block_offsets);
    tdm__free(s->out_kinds);
    tdm__vec_free(&s->out_blocks);
    tdm__vec_free(&s->out_preempted);
    tdm__vec_free(&s->out_finished);
    tdm__vec_free(&s->out_recv_ready);
    tdm__vec_free(&s->upd_ids);
    tdm__vec_free(&s->upd_new);
    tdm__vec_free(&s->upd_reason);
    tdm__vec_free(&s->ca_scratch);
    tdm__vec_free(&s->upd_stop);
    tdm__vec_free(&s->upd_reqs);
    if (s->pool_ready) tdm__pool_free(&s->pool);
    tdm__dfr_free(&s->dfr);
    tdm__kv_free(&s->kv);
    tdm__free(s);
    tdm__handle_release();
}

const char *tdm_sched_errmsg(const tdm_sched *s)
{
    if (!s) return "no scheduler handle (NULL)";
    return s->err.msg;
}

static bool finite_nonneg(double x) { return isfinite(x) && x >= 0.0; }

#define ALL_REQ_FLAGS \
    (TDM_REQ_IGNORE_EOS | TDM_REQ_REMOTE_PREFILL | TDM_REQ_REMOTE_DECODE | TDM_REQ_SKIP_PREFIX_CACHE | \
     TDM_REQ_SLO_DEPRIORITIZE | TDM_REQ_PREFIX_HIT_LIMIT | TDM_REQ_MAY_LOAD_ASYNC | \
     TDM_REQ_PRECOMPUTED_DIGESTS)
#define MAX_STOP_IDS 4096u
#define MAX_SALT 4096u

/* TDM_REQ_PRECOMPUTED_DIGESTS: Tandem's own digests computed by the caller. Their size is the
 * algorithm's; the first and the last are recomputed (two blocks: O(block_size)), which
 * catches digests of another block size, algorithm, salt or prompt. */
static int check_precomputed(tdm_sched *s, const tdm_request_desc *d)
{
    unsigned long long id = (unsigned long long)d->id;
    int algo = (int)s->prm.prefix_hash;
    uint32_t L = tdm__hash_len(algo), bs = (uint32_t)s->prm.block_size;
    if (d->block_hash_size != L)
        return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: PRECOMPUTED_DIGESTS of %u bytes, but this "
                         "scheduler's prefix_hash makes %u-byte digests", id, d->block_hash_size, L);
    if (d->num_block_hashes > d->num_prompt_tokens / bs)
        return tdm__fail(&s->err, TDM_E_RANGE, "add %llu: %u precomputed digests for %u full prompt blocks",
                         id, d->num_block_hashes, d->num_prompt_tokens / bs);
    if (!d->num_block_hashes || !s->prm.enable_prefix_caching) return TDM_OK;
    if (!d->block_hashes) return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: block_hashes is NULL", id);
    tdm__digest salt, parent, got;
    const unsigned char *h = d->block_hashes;
    if (d->cache_salt_len &&
        tdm__hash_bytes(&s->hasher, algo, d->cache_salt, d->cache_salt_len, &salt))
        return tdm__fail(&s->err, TDM_E_INTERNAL, "add %llu: hashing the cache salt failed (libcrypto)", id);
    uint32_t check[2] = {0, d->num_block_hashes - 1};
    for (int k = 0; k < (check[1] ? 2 : 1); k++) {
        uint32_t i = check[k];
        for (uint32_t j = 0; j < bs; j++)
            if (d->prompt[(size_t)i * bs + j] < 0) return TDM_OK; /* validate_desc names it */
        memset(&parent, 0, sizeof(parent));
        if (i) memcpy(&parent, h + (size_t)(i - 1) * L, L);
        if (tdm__hash_block(&s->hasher, algo, i ? &parent : NULL, d->prompt + (size_t)i * bs, bs,
                            (i == 0 && d->cache_salt_len) ? &salt : NULL, &got))
            return tdm__fail(&s->err, TDM_E_INTERNAL, "add %llu: hashing block %u failed (libcrypto)", id, i);
        if (memcmp(&got, h + (size_t)i * L, L))
            return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: precomputed digest %u is not this scheduler's "
                             "digest of the block (another prefix_hash, block_size, cache_salt or prompt?)",
                             id, i);
    }
    return TDM_OK;
}

/* Host-supplied block digests: sizes, count, and no cache_salt beside them. */
static int validate_host_hashes(tdm_sched *s, const tdm_request_desc *d)
{
    unsigned long long id = (unsigned long long)d->id;
    if (d->flags & TDM_REQ_PRECOMPUTED_DIGESTS) {
        if (!d->block_hash_size)
            return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: PRECOMPUTED_DIGESTS with block_hash_size 0", id);
        return check_precomputed(s, d);
    }
    if (!d->block_hash_size) {
        if (d->num_block_hashes || d->block_hashes)
            return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: block_hashes given with block_hash_size 0", id);
        return TDM_OK;
    }
    if (d->block_hash_size < TDM__HOST_HASH_MIN || d->block_hash_size > TDM__DIGEST_MAX)
        return tdm__fail(&s->err, TDM_E_RANGE, "add %llu: block_hash_size %u is not in [%u, %u] bytes",
                         id, d->block_hash_size, TDM__HOST_HASH_MIN, TDM__DIGEST_MAX);
    if (d->num_block_hashes && !d->block_hashes)
        return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: block_hashes is NULL", id);
    if (d->cache_salt_len)
        return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: cache_salt and block_hashes are exclusive "
                         "(the host's block hashes must already cover the salt)", id);
    uint32_t full = d->num_prompt_tokens / (uint32_t)s->prm.block_size;
    if (d->num_block_hashes > full)
        return tdm__fail(&s->err, TDM_E_RANGE, "add %llu: %u block hashes for %u full prompt blocks",
                         id, d->num_block_hashes, full);
    return TDM_OK;
}

/* d: the caller's desc copied into a full-size one (struct_size already checked). */
static int validate_desc(tdm_sched *s, const tdm_request_desc *d)
{
    if (d->flags & ~ALL_REQ_FLAGS)
        return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: unknown flags 0x%x",
                         (unsigned long long)d->id, d->flags & ~ALL_REQ_FLAGS);
    if ((d->flags & TDM_REQ_REMOTE_PREFILL) && (d->flags & TDM_REQ_REMOTE_DECODE))
        return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: REMOTE_PREFILL and REMOTE_DECODE are exclusive",
                         (unsigned long long)d->id);
    if (!d->prompt || d->num_prompt_tokens == 0)
        return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: the prompt is empty or NULL",
                         (unsigned long long)d->id);
    if (d->num_prompt_tokens > (uint64_t)s->prm.max_model_len - 1)
        return tdm__fail(&s->err, TDM_E_RANGE, "add %llu: prompt of %u tokens exceeds max_model_len - 1 (%lld)",
                         (unsigned long long)d->id, d->num_prompt_tokens, (long long)s->prm.max_model_len - 1);
    if (d->max_tokens == 0)
        return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: max_tokens must be >= 1", (unsigned long long)d->id);
    if (d->num_stop_token_ids && !d->stop_token_ids)
        return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: stop_token_ids is NULL", (unsigned long long)d->id);
    if (d->num_stop_token_ids > MAX_STOP_IDS)
        return tdm__fail(&s->err, TDM_E_RANGE, "add %llu: more than %u stop token ids",
                         (unsigned long long)d->id, MAX_STOP_IDS);
    if (d->cache_salt_len && !d->cache_salt)
        return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: cache_salt is NULL", (unsigned long long)d->id);
    if (d->cache_salt_len > MAX_SALT)
        return tdm__fail(&s->err, TDM_E_RANGE, "add %llu: cache_salt longer than %u bytes",
                         (unsigned long long)d->id, MAX_SALT);
    if (d->min_tokens > d->max_tokens)
        return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: min_tokens %u > max_tokens %u",
                         (unsigned long long)d->id, d->min_tokens, d->max_tokens);
    if (!finite_nonneg(d->arrival_time) || !finite_nonneg(d->ttft_slo) || !finite_nonneg(d->tpot_slo))
        return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: arrival_time (%g), ttft_slo and tpot_slo must be "
                         "finite and >= 0", (unsigned long long)d->id, d->arrival_time);
    if (d->prefix_hit_limit && !(d->flags & TDM_REQ_PREFIX_HIT_LIMIT))
        return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: prefix_hit_limit %u given without the flag "
                         "TDM_REQ_PREFIX_HIT_LIMIT", (unsigned long long)d->id, d->prefix_hit_limit);
    int rc = validate_host_hashes(s, d);
    if (rc) return rc;
    if (d->num_remote_tokens > d->num_prompt_tokens)
        return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: num_remote_tokens %u > prompt length %u",
                         (unsigned long long)d->id, d->num_remote_tokens, d->num_prompt_tokens);
    for (uint32_t i = 0; i < d->num_prompt_tokens; i++)
        if (d->prompt[i] < 0)
            return tdm__fail(&s->err, TDM_E_INVAL, "add %llu: prompt token %u is negative (%d)",
                             (unsigned long long)d->id, i, d->prompt[i]);
    uint64_t need = tdm__cdiv(d->num_prompt_tokens, (uint64_t)s->prm.block_size);
    if (need > s->pool.num_blocks - 1)
        return tdm__fail(&s->err, TDM_E_RANGE, "add %llu: the prompt needs %llu blocks, the pool has %u",
                         (unsigned long long)d->id, (unsigned long long)need, s->pool.num_blocks - 1);
    if (tdm__map_get(s, d->id))
        return tdm__fail(&s->err, TDM_E_EXISTS, "add: request id %llu already exists",
                         (unsigned long long)d->id);
    return TDM_OK;
}

int tdm_sched_add(tdm_sched *s, const tdm_request_desc *desc)
{
    if (!s) return TDM_E_INVAL;
    if (!TDM_STRUCT_OK(desc, DESC_V1_SIZE))
        return tdm__fail(&s->err, TDM_E_INVAL, "add: desc is NULL or struct_size %u is too small",
                         desc ? desc->struct_size : 0);
    /* Read only what the caller's struct covers; later fields are zero. */
    tdm_request_desc dc;
    memset(&dc, 0, sizeof(dc));
    memcpy(&dc, desc, TDM_MIN((size_t)desc->struct_size, sizeof(dc)));
    const tdm_request_desc *d = &dc;
    int rc = validate_desc(s, d);
    if (rc) return rc;
    /* Reserve first so that nothing after the map insert can fail: the finished and
     * lingering arrays and the heap hold room for every live request. */
    if (tdm__vec_reserve(&s->finished, s->map_len + 1, sizeof(tdm__req *)) ||
        tdm__vec_reserve(&s->lingering, s->map_len + 1, sizeof(tdm__req *)) ||
        tdm__waiting_reserve(s, s->map_len + 1))
        return tdm__fail(&s->err, TDM_E_NOMEM, "add %llu: out of memory", (unsigned long long)d->id);
    /* One allocation: the record, the prompt digests (room for every full prompt block: the
     * host's, or Tandem's computed below), the prompt and the stop ids. */
    bool pre = (d->flags & TDM_REQ_PRECOMPUTED_DIGESTS) != 0; /* Tandem's digests, computed ahead */
    uint32_t nhost = ((d->block_hash_size && !pre) || s->prm.enable_prefix_caching)
                         ? d->num_prompt_tokens / (uint32_t)s->prm.block_size : 0;
    size_t sz_host = (size_t)nhost * sizeof(tdm__digest);
    size_t sz = TDM__REQ_ALIGN - 1 + sizeof(tdm__req) + sz_host +
                ((size_t)d->num_prompt_tokens + d->num_stop_token_ids) * sizeof(tdm_token);
    /* Only the record and the host digests need zeros: the prompt and stop ids are copied
     * over their room, and Tandem's own digests are written whole (not zeroing a prompt's
     * kilobytes saves the add about a tenth of its instructions without digests). */
    void *mem = tdm__malloc(sz);
    if (!mem) return tdm__fail(&s->err, TDM_E_NOMEM, "add %llu: out of memory", (unsigned long long)d->id);
    tdm__req *r = (tdm__req *)(((uintptr_t)mem + TDM__REQ_ALIGN - 1) & ~(uintptr_t)(TDM__REQ_ALIGN - 1));
    memset(r, 0, sizeof(*r));
    r->alloc = mem;
    tdm__digest *host = (tdm__digest *)(r + 1);
    tdm_token *prompt = (tdm_token *)((char *)(r + 1) + sz_host);
    if (d->block_hash_size && (nhost || !pre)) { /* precomputed ones only with prefix caching */
        memset(host, 0, sz_host);
        for (uint32_t i = 0; i < d->num_block_hashes; i++)
            memcpy(&host[i], (const unsigned char *)d->block_hashes + (size_t)i * d->block_hash_size,
                   d->block_hash_size); /* the rest stays zero, as hash.c pads */
        r->host_hashes = host;
        r->num_host_hashes = d->num_block_hashes;
        if (!pre) r->host_hash_size = d->block_hash_size; /* precomputed: Tandem's digests, size 0 */
    }
    memcpy(prompt, d->prompt, (size_t)d->num_prompt_tokens * sizeof(tdm_token));
    if (d->num_stop_token_ids)
        memcpy(prompt + d->num_prompt_tokens, d->stop_token_ids, (size_t)d->num_stop_token_ids * sizeof(tdm_token));
    r->id = d->id;
    r->state = TDM_STATE_WAITING;
    r->flags = d->flags;
    r->hit_limit = d->prefix_hit_limit;
    r->prompt = prompt;
    r->num_prompt = r->num_tokens = d->num_prompt_tokens;
    r->max_tokens = d->max_tokens;
    r->min_tokens = d->min_tokens;
    r->eos = d->eos_token_id;
    r->stop_ids = prompt + d->num_prompt_tokens;
    r->num_stop = d->num_stop_token_ids;
    r->priority = d->priority;
    r->tenant = d->tenant;
    r->arrival = d->arrival_time;
    r->ttft_slo = d->ttft_slo;
    r->tpot_slo = d->tpot_slo;
    r->seq = ++s->next_seq;
    if (d->cache_salt_len) {
        if (tdm__hash_bytes(&s->hasher, (int)s->prm.prefix_hash, d->cache_salt, d->cache_salt_len, &r->salt)) {
            tdm__req_destroy(s, r);
            return tdm__fail(&s->err, TDM_E_INTERNAL, "add %llu: hashing the cache salt failed (libcrypto)",
                             (unsigned long long)d->id);
        }
        r->has_salt = true;
    }
    if ((!d->block_hash_size || pre) && nhost) {
        /* The prompt's block digests are computed here, as vLLM computes Request.block_hashes
         * when the request is made, so that steps never hash prompts; blocks that earlier
         * prompts shared (same parent and tokens) come from the hasher's memo. A failure stops the
         * chain: those blocks are hashed again at admission (and, failing that, not cached). */
        r->host_hashes = host;
        while (r->num_host_hashes < nhost) {
            uint32_t i = r->num_host_hashes;
            if (tdm__hash_block_memo(&s->hasher, (int)s->prm.prefix_hash, i ? &host[i - 1] : NULL,
                                prompt + (size_t)i * (uint32_t)s->prm.block_size, (uint32_t)s->prm.block_size,
                                (i == 0 && r->has_salt) ? &r->salt : NULL, &host[i]))
                break;
            r->num_host_hashes++;
        }
    }
    r->num_hashes = r->num_host_hashes; /* read in place from now on (tdm__req_digest) */
    if (d->flags & TDM_REQ_REMOTE_PREFILL)
        r->num_remote = d->num_remote_tokens ? d->num_remote_tokens : d->num_prompt_tokens;
    r->first_sched = r->first_token = r->last_token = r->finish_time = -1.0;
    if ((rc = tdm__map_put(s, r))) {
        tdm__req_destroy(s, r);
        return tdm__fail(&s->err, rc, "add %llu: out of memory", (unsigned long long)d->id);
    }
    if (s->prm.max_inflight_kv_loads && (r->flags & TDM_REQ_MAY_LOAD_ASYNC))
        tdm__kvl_push(s, r, TDM__Q_ASYNC); /* the load queue (kv_loads.c) */
    else
        (void)tdm__waiting_push(s, r); /* cannot fail: reserved above */
    if (s->prm.policy == TDM_POLICY_SLO_ADAPTIVE) tdm__ad_arrived(s, r);
    return TDM_OK;
}

/* A live request that the host may still act on (not yet finished). */
static tdm__req *live(tdm_sched *s, uint64_t id, const char *what)
{
    tdm__req *r = tdm__map_get(s, id);
    if (!r || r->state == TDM_STATE_FINISHED || r->state == TDM_STATE_FINISHED_HELD) {
        tdm__fail(&s->err, TDM_E_NOT_FOUND, "%s: no unfinished request %llu", what, (unsigned long long)id);
        return NULL;
    }
    return r;
}

int tdm_sched_append_block_hashes(tdm_sched *s, uint64_t id, const void *hashes, uint32_t count,
                                  uint32_t hash_size)
{
    if (!s) return TDM_E_INVAL;
    tdm__req *r = live(s, id, "append_block_hashes");
    if (!r) return TDM_E_NOT_FOUND;
    unsigned long long uid = (unsigned long long)id;
    if (!r->host_hash_size)
        return tdm__fail(&s->err, TDM_E_INVAL, "append_block_hashes %llu: the request was added "
                         "without block hashes (block_hash_size 0)", uid);
    if (hash_size != r->host_hash_size)
        return tdm__fail(&s->err, TDM_E_INVAL, "append_block_hashes %llu: hash_size %u differs from "
                         "the request's block_hash_size %u", uid, hash_size, r->host_hash_size);
    if (count && !hashes)
        return tdm__fail(&s->err, TDM_E_INVAL, "append_block_hashes %llu: hashes is NULL", uid);
    /* Before admission the digests go to the request record (room for every full prompt
     * block, and no other block can fill yet); after it, to the run arrays. */
    uint32_t have = r->num_hashes;
    uint32_t full = r->num_tokens / (uint32_t)s->prm.block_size;
    if (count > full - have)
        return tdm__fail(&s->err, TDM_E_RANGE, "append_block_hashes %llu: %u + %u block hashes for "
                         "%u full blocks", uid, have, count, full);
    tdm__digest *dst = r->hashes ? r->hashes + (have - r->num_host_hashes) : r->host_hashes + have;
    for (uint32_t i = 0; i < count; i++) {
        memset(&dst[i], 0, sizeof(dst[i]));
        memcpy(&dst[i], (const unsigned char *)hashes + (size_t)i * hash_size, hash_size);
    }
    r->num_hashes += count;
    if (!r->hashes) r->num_host_hashes += count;
    return TDM_OK;
}

int tdm_sched_finish(tdm_sched *s, uint64_t id, tdm_finish_reason reason)
{
    if (!s) return TDM_E_INVAL;
    if (reason < TDM_FINISH_STOP || reason > TDM_FINISH_ERROR)
        return tdm__fail(&s->err, TDM_E_INVAL, "finish %llu: invalid reason %d", (unsigned long long)id, (int)reason);
    tdm__req *r = live(s, id, "finish");
    if (!r) return TDM_E_NOT_FOUND;
    if (tdm__dfr_reserve(s)) return tdm__fail(&s->err, TDM_E_NOMEM, "finish: out of memory for the deferred-free queue");
    /* A host-finished request never hands its blocks to a remote decode unless it stopped. */
    tdm__finish(s, r, (uint32_t)reason, s->now);
    return TDM_OK;
}

int tdm_sched_abort(tdm_sched *s, uint64_t id)
{
    if (!s) return TDM_E_INVAL;
    tdm__req *r = live(s, id, "abort");
    if (!r) return TDM_E_NOT_FOUND;
    if (tdm__dfr_reserve(s)) return tdm__fail(&s->err, TDM_E_NOMEM, "abort: out of memory for the deferred-free queue");
    tdm__finish(s, r, TDM_FINISH_ABORT, s->now);
    return TDM_OK;
}

int tdm_sched_request_info(const tdm_sched *cs, uint64_t id, tdm_request_info *info)
{
    tdm_sched *s = (tdm_sched *)cs;
    if (!s) return TDM_E_INVAL;
    if (!TDM_STRUCT_OK(info, sizeof(tdm_request_info)))
        return tdm__fail(&s->err, TDM_E_INVAL, "request_info: info is NULL or too small");
    tdm__req *r = tdm__map_get(s, id);
    if (!r) return tdm__fail(&s->err, TDM_E_NOT_FOUND, "request_info: no request %llu", (unsigned long long)id);
    tdm_request_info i;
    memset(&i, 0, sizeof(i));
    i.struct_size = info->struct_size < sizeof(i) ? info->struct_size : sizeof(i);
    i.state = r->state;
    i.finish_reason = r->finish_reason;
    i.num_prompt_tokens = r->num_prompt;
    i.num_output_tokens = r->num_tokens - r->num_prompt;
    i.num_computed_tokens = r->num_computed;
    i.num_cached_tokens = r->num_cached;
    i.num_blocks = r->num_blocks;
    i.num_preemptions = r->num_preemptions;
    i.priority = r->priority;
    i.arrival_time = r->arrival;
    i.first_scheduled_time = r->first_sched;
    i.first_token_time = r->first_token;
    i.last_token_time = r->last_token;
    i.finish_time = r->finish_time;
    i.max_token_gap = r->max_gap;
    memcpy(info, &i, i.struct_size);
    return TDM_OK;
}

int tdm_sched_request_blocks(const tdm_sched *cs, uint64_t id, const uint32_t **blocks, uint32_t *num_blocks)
{
    tdm_sched *s = (tdm_sched *)cs;
    if (!s) return TDM_E_INVAL;
    if (!blocks || !num_blocks) return tdm__fail(&s->err, TDM_E_INVAL, "request_blocks: NULL output");
    tdm__req *r = tdm__map_get(s, id);
    if (!r) return tdm__fail(&s->err, TDM_E_NOT_FOUND, "request_blocks: no request %llu", (unsigned long long)id);
    *blocks = r->blocks;
    *num_blocks = r->num_blocks;
    return TDM_OK;
}

int tdm_sched_request_tokens(const tdm_sched *cs, uint64_t id, const tdm_token **tokens, uint32_t *num_tokens)
{
    tdm_sched *s = (tdm_sched *)cs;
    if (!s) return TDM_E_INVAL;
    if (!tokens || !num_tokens) return tdm__fail(&s->err, TDM_E_INVAL, "request_tokens: NULL output");
    tdm__req *r = tdm__map_get(s, id);
    if (!r) return tdm__fail(&s->err, TDM_E_NOT_FOUND, "request_tokens: no request %llu", (unsigned long long)id);
    *tokens = r->tokens ? r->tokens : r->prompt;
    *num_tokens = r->num_tokens;
    return TDM_OK;
}

int tdm_sched_remote_kv_done(tdm_sched *s, uint64_t id, int ok, uint32_t num_valid_tokens)
{
    if (!s) return TDM_E_INVAL;
    tdm__req *r = tdm__map_get(s, id);
    if (!r) return tdm__fail(&s->err, TDM_E_NOT_FOUND, "remote_kv_done: no request %llu", (unsigned long long)id);
    bool aborted_recv = r->state == TDM_STATE_FINISHED_HELD && r->hold == HOLD_RECV;
    if (r->state != TDM_STATE_WAITING_REMOTE_KV && !aborted_recv)
        return tdm__fail(&s->err, TDM_E_STATE, "remote_kv_done: request %llu is not waiting for remote KV",
                         (unsigned long long)id);
    if (tdm__dfr_reserve(s))
        return tdm__fail(&s->err, TDM_E_NOMEM, "remote_kv_done: out of memory for the deferred-free queue");
    if (aborted_recv) {
        tdm__release_held(s, r);
        return TDM_OK;
    }
    if (!ok) {
        tdm__remote_failed(s, r, num_valid_tokens);
        return TDM_OK;
    }
    /* Received: every token whose KV arrived is computed, but the last prompt token is always
     * recomputed for its logits. The received blocks join the prefix cache. */
    uint32_t bs = (uint32_t)s->prm.block_size;
    uint32_t arrived = TDM_MIN(r->num_computed + r->num_remote, r->num_tokens);
    uint32_t computed = arrived == r->num_tokens ? arrived - 1 : arrived;
    tdm__list_remove(&s->remote, r);
    r->num_computed = computed;
    r->num_remote = 0;
    r->remote_done = true;
    if (tdm__kvl_on(s)) { /* kv_hold; cached when a step reaches it (kv_loads.c) */
        r->state = TDM_STATE_WAITING;
        tdm__kvl_received(s, r, arrived);
        return TDM_OK;
    }
    if (s->prm.enable_prefix_caching) {
        uint32_t full = computed / bs;
        tdm__req_hash_blocks(s, r);
        full = TDM_MIN(full, r->num_hashes); /* host-supplied digests may lag */
        tdm__kv_cache_blocks(s, r, r->num_cached_blocks, full);
        if (full > r->num_cached_blocks) r->num_cached_blocks = full;
    }
    r->state = TDM_STATE_WAITING;
    (void)tdm__waiting_requeue_received(s, r);
    return TDM_OK;
}

int tdm_sched_release(tdm_sched *s, uint64_t id)
{
    if (!s) return TDM_E_INVAL;
    tdm__req *r = tdm__map_get(s, id);
    if (!r) return tdm__fail(&s->err, TDM_E_NOT_FOUND, "release: no request %llu", (unsigned long long)id);
    if (r->state != TDM_STATE_FINISHED_HELD || r->hold != HOLD_SEND)
        return tdm__fail(&s->err, TDM_E_STATE, "release: request %llu does not hold blocks for a remote decode",
                         (unsigned long long)id);
    if (tdm__dfr_reserve(s)) return tdm__fail(&s->err, TDM_E_NOMEM, "release: out of memory for the deferred-free queue");
    tdm__release_held(s, r);
    return TDM_OK;
}

int tdm_sched_set_draft_tokens(tdm_sched *s, uint64_t id, const tdm_token *tokens, uint32_t n)
{
    if (!s) return TDM_E_INVAL;
    if (n && !tokens) return tdm__fail(&s->err, TDM_E_INVAL, "set_draft_tokens: tokens is NULL");
    tdm__req *r = live(s, id, "set_draft_tokens");
    if (!r) return TDM_E_NOT_FOUND;
    if (r->state != TDM_STATE_RUNNING)
        return tdm__fail(&s->err, TDM_E_STATE, "set_draft_tokens: request %llu is not running", (unsigned long long)id);
    if (r->in_flight)
        return tdm__fail(&s->err, TDM_E_STATE, "set_draft_tokens: request %llu has a step in flight "
                         "(drafts follow the token its update brings)", (unsigned long long)id);
    if (n > (uint64_t)s->prm.num_lookahead_tokens)
        return tdm__fail(&s->err, TDM_E_RANGE, "set_draft_tokens: %u drafts exceed num_lookahead_tokens %lld",
                         n, (long long)s->prm.num_lookahead_tokens);
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0)
            return tdm__fail(&s->err, TDM_E_INVAL, "set_draft_tokens: token %u is negative", i);
    memcpy(r->spec, tokens, (size_t)n * sizeof(tdm_token));
    r->num_spec = n;
    return TDM_OK;
}

int tdm_sched_set_cost_model(tdm_sched *s, const tdm_cost_model *cm)
{
    if (!s) return TDM_E_INVAL;
    if (!cm) {
        memset(&s->cost, 0, sizeof(s->cost));
        return TDM_OK;
    }
    if (cm->version < 1 || cm->version > TDM_COST_MODEL_VERSION)
        return tdm__fail(&s->err, TDM_E_VERSION, "cost model version %u is not supported (1..%u)",
                         cm->version, TDM_COST_MODEL_VERSION);
    if (!cm->estimate) return tdm__fail(&s->err, TDM_E_INVAL, "cost model: estimate is NULL");
    s->cost = *cm;
    return TDM_OK;
}

int tdm_sched_reset_prefix_cache(tdm_sched *s, int reset_running)
{
    if (!s) return TDM_E_INVAL;
    if (s->num_running && !reset_running)
        return tdm__fail(&s->err, TDM_E_STATE, "reset_prefix_cache: %u requests are running "
                         "(pass reset_running to preempt them)", s->num_running);
    if (s->remote.len || s->held.len)
        return tdm__fail(&s->err, TDM_E_STATE, "reset_prefix_cache: %u requests hold blocks for a KV transfer",
                         s->remote.len + s->held.len);
    if (s->prm.defer_block_free) {
        /* vLLM fails the reset while blocks wait for steps in flight; so does Tandem, before
         * preempting anything */
        uint32_t in_flight = 0;
        for (uint32_t i = 0; i < s->num_running; i++) in_flight += s->running[i]->pend_n != 0;
        if (s->dfr.len || in_flight)
            return tdm__fail(&s->err, TDM_E_STATE, "reset_prefix_cache: %u blocks wait for steps in "
                             "flight (defer_block_free) and %u running requests have a step in flight; "
                             "report every batch first", s->dfr.len, in_flight);
    }
    /* Preempt running requests from the tail so that, prepended one by one, they end up in
     * the waiting queue in their running order. */
    while (s->num_running) {
        tdm__req *r = s->running[s->num_running - 1];
        tdm__running_remove_at(s, s->num_running - 1);
        tdm__preempt(s, r);
    }
    tdm__pool_reset_cache(&s->pool);
    return TDM_OK;
}

int tdm_sched_get_stats(const tdm_sched *s, tdm_sched_stats *out)
{
    if (!s) return TDM_E_INVAL;
    /* Callers built before kv_events_dropped was appended pass the older, shorter size. */
    if (!TDM_STRUCT_OK(out, STATS_V1_SIZE))
        return tdm__fail((tdm__err *)&s->err, TDM_E_INVAL, "get_stats: stats is NULL or too small");
    tdm_sched_stats st;
    memset(&st, 0, sizeof(st));
    st.struct_size = sizeof(st);
    st.num_running = s->num_running;
    st.num_waiting_remote_kv = s->remote.len - s->remote_aborted;
    st.num_waiting = tdm__waiting_len(s) + tdm__kvl_waiting(s) + st.num_waiting_remote_kv;
    st.num_held = s->held.len + s->remote_aborted;
    st.num_total_blocks = s->pool.num_blocks - 1;
    st.num_free_blocks = s->pool.num_free;
    st.num_cached_blocks = s->pool.num_hashed;
    st.kv_usage = 1.0 - (double)st.num_free_blocks / (double)st.num_total_blocks;
    st.prefix_queries = s->prefix_queries;
    st.prefix_hits = s->prefix_hits;
    st.prefix_hit_rate = s->prefix_queries ? (double)s->prefix_hits / (double)s->prefix_queries : 0.0;
    st.evictions = s->pool.evictions;
    st.preemptions = s->preemptions;
    st.steps = s->step_no;
    st.scheduled_tokens = s->scheduled_tokens;
    st.finished = s->num_finished;
    st.kv_events_dropped = s->kv.dropped_total;
    /* struct_size becomes what was written: never more than the caller's struct holds, and
     * less when the caller's header is newer than this library. */
    st.struct_size = TDM_MIN(out->struct_size, (uint32_t)sizeof(st));
    memcpy(out, &st, TDM_MIN(out->struct_size, (uint32_t)sizeof(st)));
    return TDM_OK;
}

int tdm_sched_num_unfinished(const tdm_sched *s, uint32_t *n)
{
    if (!s || !n) return TDM_E_INVAL;
    *n = s->num_running + tdm__waiting_len(s) + tdm__kvl_waiting(s) + s->remote.len - s->remote_aborted;
    return TDM_OK;
}

int tdm_kv_event_batch_init(tdm_kv_event_batch *b)
{
    if (!b) return TDM_E_INVAL;
    memset(b, 0, sizeof(*b));
    b->struct_size = sizeof(*b);
    return TDM_OK;
}

int tdm_sched_kv_events(tdm_sched *s, tdm_kv_event_batch *out)
{
    if (!s) return TDM_E_INVAL;
    if (!TDM_STRUCT_OK(out, sizeof(tdm_kv_event_batch)))
        return tdm__fail(&s->err, TDM_E_INVAL, "kv_events: batch is NULL or too small");
    tdm_kv_event_batch b;
    memset(&b, 0, sizeof(b));
    b.struct_size = TDM_MIN(out->struct_size, (uint32_t)sizeof(b));
    b.block_size = (uint32_t)s->prm.block_size;
    if (s->kv.ready) tdm__kv_drain(&s->kv, &b);
    memcpy(out, &b, TDM_MIN(out->struct_size, (uint32_t)sizeof(b)));
    return TDM_OK;
}
