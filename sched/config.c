/*
 * config.c -- the scheduler's parameters: defaults, validation (per key and across keys),
 * the enum-keyed setters, the JSON configuration (all or nothing, unknown keys rejected)
 * and its JSON dump. One table describes every integer parameter once: its enum key, its
 * JSON name, its kind and its range.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"

enum kind { K_INT, K_BOOL, K_FRACTION_PPM, K_MS_TO_US, K_ENUM };

typedef struct param_desc {
    tdm_sched_param key;
    const char *name;
    enum kind kind;
    int64_t lo, hi;
    size_t off;                   /* offsetof(tdm__params, field) */
    const char *const *names;     /* K_ENUM: value names, index = value */
    bool shapes;                  /* changes only while the scheduler holds no request */
} param_desc;

static const char *const policy_names[] = { "fcfs", "priority", "custom", "slo", "slo_adaptive", NULL };
static const char *const mode_names[] = { "vllm", "decode_first", "prefill_first", NULL };
static const char *const role_names[] = { "both", "prefill", "decode", NULL };
static const char *const failure_names[] = { "recompute", "fail", NULL };
static const char *const hash_names[] = { "sha256", "xxh3_128", NULL };

#define OFF(f) offsetof(tdm__params, f)
#define I32MAX 2147483647LL

static const param_desc PARAMS[] = {
    { TDM_SCHED_MAX_NUM_BATCHED_TOKENS, "max_num_batched_tokens", K_INT, 1, I32MAX, OFF(max_num_batched_tokens), NULL, false },
    { TDM_SCHED_MAX_NUM_SEQS, "max_num_seqs", K_INT, 1, 1 << 20, OFF(max_num_seqs), NULL, false },
    { TDM_SCHED_MAX_MODEL_LEN, "max_model_len", K_INT, 2, 1 << 26, OFF(max_model_len), NULL, true },
    { TDM_SCHED_LONG_PREFILL_TOKEN_THRESHOLD, "long_prefill_token_threshold", K_INT, 0, I32MAX, OFF(long_prefill_token_threshold), NULL, false },
    { TDM_SCHED_ENABLE_CHUNKED_PREFILL, "enable_chunked_prefill", K_BOOL, 0, 1, OFF(enable_chunked_prefill), NULL, false },
    { TDM_SCHED_NUM_BLOCKS, "num_blocks", K_INT, 2, 1 << 28, OFF(num_blocks), NULL, true },
    { TDM_SCHED_BLOCK_SIZE, "block_size", K_INT, 1, 1 << 16, OFF(block_size), NULL, true },
    { TDM_SCHED_ENABLE_PREFIX_CACHING, "enable_prefix_caching", K_BOOL, 0, 1, OFF(enable_prefix_caching), NULL, true },
    { TDM_SCHED_WATERMARK_PPM, "watermark", K_FRACTION_PPM, 0, 999999, OFF(watermark_ppm), NULL, false },
    { TDM_SCHED_POLICY, "policy", K_ENUM, 0, 4, OFF(policy), policy_names, false },
    { TDM_SCHED_MODE, "mode", K_ENUM, 0, 2, OFF(mode), mode_names, false },
    { TDM_SCHED_TBT_TARGET_US, "tbt_target_ms", K_MS_TO_US, 0, 3600000000LL, OFF(tbt_target_us), NULL, false },
    { TDM_SCHED_NUM_LOOKAHEAD_TOKENS, "num_lookahead_tokens", K_INT, 0, 1024, OFF(num_lookahead_tokens), NULL, true },
    { TDM_SCHED_ROLE, "role", K_ENUM, 0, 2, OFF(role), role_names, false },
    { TDM_SCHED_REMOTE_KV_FAILURE, "remote_kv_failure", K_ENUM, 0, 1, OFF(remote_kv_failure), failure_names, false },
    { TDM_SCHED_REMOTE_KV_TIMEOUT_MS, "remote_kv_timeout_ms", K_INT, 0, 86400000LL * 365, OFF(remote_kv_timeout_ms), NULL, false },
    { TDM_SCHED_DELAY_FREE_TIMEOUT_MS, "delay_free_timeout_ms", K_INT, 0, 86400000LL * 365, OFF(delay_free_timeout_ms), NULL, false },
    { TDM_SCHED_MAX_NUM_PARTIAL_PREFILLS, "max_num_partial_prefills", K_INT, 0, 1 << 20, OFF(max_num_partial_prefills), NULL, false },
    { TDM_SCHED_PREFIX_HASH, "prefix_hash", K_ENUM, 0, 1, OFF(prefix_hash), hash_names, true },
    { TDM_SCHED_RESERVE_FULL_PROMPT, "reserve_full_prompt", K_BOOL, 0, 1, OFF(reserve_full_prompt), NULL, false },
    { TDM_SCHED_CONTINUE_AFTER_SELF_PREEMPTION, "continue_after_self_preemption", K_BOOL, 0, 1, OFF(continue_after_self_preemption), NULL, false },
    { TDM_SCHED_ENABLE_KV_EVENTS, "enable_kv_events", K_BOOL, 0, 1, OFF(enable_kv_events), NULL, false },
    { TDM_SCHED_KV_EVENTS_CAPACITY, "kv_events_capacity", K_INT, 1, 1 << 24, OFF(kv_events_capacity), NULL, false },
    { TDM_SCHED_ASYNC_SCHEDULING, "async_scheduling", K_BOOL, 0, 1, OFF(async_scheduling), NULL, true },
    { TDM_SCHED_SLO_TTFT_US, "slo_ttft_ms", K_MS_TO_US, 0, 3600000000LL, OFF(slo_ttft_us), NULL, false },
    { TDM_SCHED_SLO_TPOT_US, "slo_tpot_ms", K_MS_TO_US, 0, 3600000000LL, OFF(slo_tpot_us), NULL, false },
    { TDM_SCHED_LONG_PREFILL_NEEDS_CHUNKING, "long_prefill_needs_chunking", K_BOOL, 0, 1, OFF(long_prefill_needs_chunking), NULL, false },
    { TDM_SCHED_CACHE_AWARE_WINDOW, "cache_aware_window", K_INT, 0, 1 << 20, OFF(cache_aware_window), NULL, false },
    { TDM_SCHED_CACHE_AWARE_THRESHOLD_PPM, "cache_aware_threshold", K_FRACTION_PPM, 0, 1000000, OFF(cache_aware_threshold_ppm), NULL, false },
    { TDM_SCHED_MAX_INFLIGHT_KV_LOADS, "max_inflight_kv_loads", K_INT, 0, 1 << 24, OFF(max_inflight_kv_loads), NULL, true },
    { TDM_SCHED_KV_LOAD_QUEUES, "kv_load_queues", K_BOOL, 0, 1, OFF(kv_load_queues), NULL, true },
    { TDM_SCHED_DEFER_BLOCK_FREE, "defer_block_free", K_BOOL, 0, 1, OFF(defer_block_free), NULL, true },
    { TDM_SCHED_DECODE_STAGGER, "decode_stagger", K_INT, 1, 1024, OFF(decode_stagger), NULL, false },
};

static const struct { const char *name; size_t off; } COST_KEYS[] = {
    { "base_us", OFF(cost_base_us) },
    { "per_prefill_token_us", OFF(cost_prefill_token_us) },
    { "per_decode_req_us", OFF(cost_decode_req_us) },
    { "per_context_token_ns", OFF(cost_context_token_ns) },
    { "per_attn_token2_ps", OFF(cost_attn_token2_ps) },
};

static inline int64_t *field(tdm__params *p, const param_desc *d) { return (int64_t *)((char *)p + d->off); }
static inline int64_t cfield(const tdm__params *p, const param_desc *d) { return *(const int64_t *)((const char *)p + d->off); }
static inline double *dfield(tdm__params *p, size_t off) { return (double *)((char *)p + off); }

void tdm__params_default(tdm__params *p)
{
    memset(p, 0, sizeof(*p));
    p->max_num_batched_tokens = 2048;
    p->max_num_seqs = 128;
    p->max_model_len = 8192;
    p->enable_chunked_prefill = 1;
    p->num_blocks = 10000;
    p->block_size = 16;
    p->enable_prefix_caching = 1;
    p->policy = TDM_POLICY_FCFS;
    p->mode = TDM_MODE_VLLM;
    p->role = TDM_ROLE_BOTH;
    p->remote_kv_failure = TDM_REMOTE_KV_RECOMPUTE;
    p->delay_free_timeout_ms = 120000;
    p->continue_after_self_preemption = 1;
    p->decode_stagger = 1;
    p->kv_events_capacity = 4096;
    p->cache_aware_threshold_ppm = 500000; /* vLLM's cache_aware_admission_threshold 0.5 */
    /* A Llama-3-8B-on-H100-like default; hosts and the simulator install their own. */
    p->cost_base_us = 5000.0;
    p->cost_prefill_token_us = 27.0;
    p->cost_decode_req_us = 25.0;
    p->cost_context_token_ns = 40.0;
    p->cost_attn_token2_ps = 0.9;
}

static const param_desc *find_key(tdm_sched_param key)
{
    for (size_t i = 0; i < TDM_ARRAY_LEN(PARAMS); i++)
        if (PARAMS[i].key == key) return &PARAMS[i];
    return NULL;
}

static const param_desc *find_name(const char *name)
{
    for (size_t i = 0; i < TDM_ARRAY_LEN(PARAMS); i++)
        if (!strcmp(PARAMS[i].name, name)) return &PARAMS[i];
    return NULL;
}

/* Constraints across keys (vLLM's SchedulerConfig checks, plus ours). */
static int validate_cross(tdm_sched *s, const tdm__params *p)
{
    if (p->max_num_batched_tokens < p->max_num_seqs)
        return tdm__fail(&s->err, TDM_E_CONFIG,
                         "max_num_batched_tokens (%lld) must be >= max_num_seqs (%lld)",
                         (long long)p->max_num_batched_tokens, (long long)p->max_num_seqs);
    if (!p->enable_chunked_prefill && p->max_num_batched_tokens < p->max_model_len)
        return tdm__fail(&s->err, TDM_E_CONFIG,
                         "with enable_chunked_prefill false, max_num_batched_tokens (%lld) must be "
                         ">= max_model_len (%lld)",
                         (long long)p->max_num_batched_tokens, (long long)p->max_model_len);
    if (p->policy == TDM_POLICY_CUSTOM && s->prm.policy != TDM_POLICY_CUSTOM)
        return tdm__fail(&s->err, TDM_E_CONFIG,
                         "policy \"custom\" is set by tdm_sched_set_policy or \"policy_plugin\"");
    if ((p->kv_load_queues || p->max_inflight_kv_loads) && p->policy == TDM_POLICY_SLO_ADAPTIVE)
        return tdm__fail(&s->err, TDM_E_CONFIG,
                         "kv_load_queues and max_inflight_kv_loads (vLLM's load queues) do not "
                         "combine with policy \"slo_adaptive\"");
    return TDM_OK;
}

/* Apply validated parameters: rebuild the pool when a shaping key changed (only allowed
 * while empty), switch the waiting-queue structure when the policy changed. */
static int commit(tdm_sched *s, const tdm__params *np)
{
    bool reshape = np->num_blocks != s->prm.num_blocks || np->block_size != s->prm.block_size ||
                   np->enable_prefix_caching != s->prm.enable_prefix_caching ||
                   np->max_model_len != s->prm.max_model_len ||
                   np->num_lookahead_tokens != s->prm.num_lookahead_tokens ||
                   np->prefix_hash != s->prm.prefix_hash;
    if (reshape && s->map_len)
        return tdm__fail(&s->err, TDM_E_STATE,
                         "num_blocks, block_size, enable_prefix_caching, max_model_len, "
                         "num_lookahead_tokens and prefix_hash can only change while the scheduler "
                         "holds no request (%u held)", s->map_len);
    if ((reshape || np->defer_block_free != s->prm.defer_block_free) && (s->map_len || s->dfr.len))
        return tdm__fail(&s->err, TDM_E_STATE,
                         "%s can only change while the scheduler holds no request (%u held) and no "
                         "block waits in the deferred-free queue (%u waiting)",
                         reshape ? "the KV pool's shape" : "defer_block_free", s->map_len, s->dfr.len);
    if (np->async_scheduling != s->prm.async_scheduling && s->map_len)
        return tdm__fail(&s->err, TDM_E_STATE,
                         "async_scheduling can only change while the scheduler holds no request "
                         "(%u held)", s->map_len);
    if ((np->max_inflight_kv_loads != s->prm.max_inflight_kv_loads ||
         np->kv_load_queues != s->prm.kv_load_queues) && s->map_len)
        return tdm__fail(&s->err, TDM_E_STATE,
                         "max_inflight_kv_loads and kv_load_queues can only change while the "
                         "scheduler holds no request (%u held)", s->map_len);
    if (tdm__hasher_reserve(&s->hasher, (uint32_t)np->block_size))
        return tdm__fail(&s->err, TDM_E_NOMEM, "out of memory for hashing blocks of %lld tokens",
                         (long long)np->block_size);
    if (np->max_num_seqs > (int64_t)s->cap_entries && tdm__sched_grow(s, (uint32_t)np->max_num_seqs))
        return tdm__fail(&s->err, TDM_E_NOMEM, "out of memory for max_num_seqs %lld",
                         (long long)np->max_num_seqs);
    bool repolicy = np->policy != s->prm.policy;
    /* A heap-ordered policy needs room for every live request; reserve before any change. */
    if (np->policy != TDM_POLICY_FCFS && tdm__heap_reserve(s, s->map_len + 1))
        return tdm__fail(&s->err, TDM_E_NOMEM, "out of memory for the waiting queue");
    if (repolicy && tdm__waiting_len(s) + tdm__kvl_waiting(s))
        return tdm__fail(&s->err, TDM_E_STATE,
                         "the policy can only change while the waiting queue is empty (%u waiting)",
                         tdm__waiting_len(s));
    /* The KV event queue: (re)allocated only here, before anything changes. */
    bool kv_new = np->enable_kv_events &&
                  (!s->kv.ready || s->kv.cap != (uint32_t)np->kv_events_capacity ||
                   s->kv.block_size != (uint32_t)np->block_size || s->kv.num_blocks != (uint32_t)np->num_blocks);
    tdm__kv_events nkv = { .dropped_total = s->kv.dropped_total };
    if (kv_new && tdm__kv_init(&nkv, (uint32_t)np->kv_events_capacity, (uint32_t)np->block_size,
                               (uint32_t)np->num_blocks))
        return tdm__fail(&s->err, TDM_E_NOMEM, "out of memory for %lld KV events",
                         (long long)np->kv_events_capacity);
    bool emit_clear = false;
    if (np->num_blocks != s->prm.num_blocks || !s->pool_ready) {
        tdm__pool np_pool;
        if (tdm__pool_init(&np_pool, (uint32_t)np->num_blocks)) {
            if (kv_new) tdm__kv_free(&nkv);
            return tdm__fail(&s->err, TDM_E_NOMEM, "out of memory for %lld KV blocks",
                             (long long)np->num_blocks);
        }
        bool had_cache = s->pool_ready && s->pool.num_hashed;
        if (s->pool_ready) tdm__pool_free(&s->pool);
        s->pool = np_pool;
        s->pool_ready = true;
        emit_clear = had_cache; /* the cached blocks are gone */
    } else if (reshape) {
        emit_clear = s->pool.num_hashed > 0; /* no request holds a block: a full clear */
        s->pool.ev = NULL;
        tdm__pool_reset_cache(&s->pool); /* block size, caching or hash changed: hashes are stale */
    }
    if (kv_new) {
        tdm__kv_free(&s->kv);
        s->kv = nkv;
    } else if (!np->enable_kv_events && s->kv.ready) {
        tdm__kv_free(&s->kv);
    }
    s->pool.ev = s->kv.ready ? &s->kv : NULL;
    if (emit_clear && s->pool.ev) tdm__kv_cleared(s->pool.ev);
    if (repolicy && s->prm.policy == TDM_POLICY_CUSTOM) tdm__policy_drop(s);
    if (np->defer_block_free != s->prm.defer_block_free) s->dfr.batches = s->dfr.reported = 0;
    s->prm = *np;
    s->run_cache_max = (uint32_t)TDM_MIN((int64_t)1 << 16, 2 * np->max_num_seqs);
    return TDM_OK;
}

int tdm__sched_apply_shape(tdm_sched *s, const tdm__params *np) { return commit(s, np); }

static int set_one(tdm_sched *s, tdm__params *p, const param_desc *d, int64_t v)
{
    if (v < d->lo || v > d->hi)
        return tdm__fail(&s->err, TDM_E_CONFIG, "%s: %lld is out of range [%lld, %lld]", d->name,
                         (long long)v, (long long)d->lo, (long long)d->hi);
    *field(p, d) = v;
    return TDM_OK;
}

int tdm_sched_set_param(tdm_sched *s, tdm_sched_param key, int64_t value)
{
    if (!s) return TDM_E_INVAL;
    const param_desc *d = find_key(key);
    if (!d) return tdm__fail(&s->err, TDM_E_INVAL, "unknown scheduler parameter %d", (int)key);
    tdm__params np = s->prm;
    int rc = set_one(s, &np, d, value);
    if (!rc) rc = validate_cross(s, &np);
    if (!rc) rc = commit(s, &np);
    return rc;
}

int tdm_sched_get_param(const tdm_sched *s, tdm_sched_param key, int64_t *value)
{
    if (!s || !value) return TDM_E_INVAL;
    const param_desc *d = find_key(key);
    if (!d) return tdm__fail((tdm__err *)&s->err, TDM_E_INVAL, "unknown scheduler parameter %d", (int)key);
    *value = cfield(&s->prm, d);
    return TDM_OK;
}

/* ---- JSON ---- */

static int json_value(tdm_sched *s, tdm__params *p, const param_desc *d, json_t *v)
{
    int64_t x;
    switch (d->kind) {
    case K_BOOL:
        if (!json_is_boolean(v))
            return tdm__fail(&s->err, TDM_E_CONFIG, "%s: expected true or false", d->name);
        x = json_is_true(v);
        break;
    case K_INT:
        if (!json_is_integer(v))
            return tdm__fail(&s->err, TDM_E_CONFIG, "%s: expected an integer", d->name);
        x = json_integer_value(v);
        break;
    case K_FRACTION_PPM: {
        if (!json_is_number(v))
            return tdm__fail(&s->err, TDM_E_CONFIG, "%s: expected a number in [0, 1)", d->name);
        double f = json_number_value(v);
        bool closed = d->hi >= 1000000; /* [0, 1] rather than [0, 1) */
        if (!(f >= 0.0 && (f < 1.0 || (closed && f == 1.0))))
            return tdm__fail(&s->err, TDM_E_CONFIG, "%s: %g is not in [0, 1%s", d->name, f, closed ? "]" : ")");
        x = (int64_t)llround(f * 1e6);
        break;
    }
    case K_MS_TO_US: {
        if (!json_is_number(v))
            return tdm__fail(&s->err, TDM_E_CONFIG, "%s: expected a number of milliseconds", d->name);
        double ms = json_number_value(v);
        if (!(ms >= 0.0 && ms <= 3.6e6))
            return tdm__fail(&s->err, TDM_E_CONFIG, "%s: %g ms is out of range [0, 3600000]", d->name, ms);
        x = (int64_t)llround(ms * 1000.0);
        break;
    }
    case K_ENUM: {
        if (!json_is_string(v))
            return tdm__fail(&s->err, TDM_E_CONFIG, "%s: expected a string", d->name);
        const char *str = json_string_value(v);
        x = -1;
        for (int i = 0; d->names[i]; i++)
            if (!strcmp(d->names[i], str) && i <= d->hi) x = i;
        if (x < 0) {
            char allowed[128] = "";
            for (int i = 0; d->names[i] && i <= d->hi; i++) {
                strncat(allowed, i ? ", \"" : "\"", sizeof(allowed) - strlen(allowed) - 1);
                strncat(allowed, d->names[i], sizeof(allowed) - strlen(allowed) - 1);
                strncat(allowed, "\"", sizeof(allowed) - strlen(allowed) - 1);
            }
            return tdm__fail(&s->err, TDM_E_CONFIG, "%s: \"%s\" is not one of %s", d->name, str, allowed);
        }
        break;
    }
    default:
        return TDM_E_INTERNAL;
    }
    return set_one(s, p, d, x);
}

static int json_cost(tdm_sched *s, tdm__params *p, json_t *obj)
{
    if (!json_is_object(obj))
        return tdm__fail(&s->err, TDM_E_CONFIG, "cost_model: expected an object");
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        size_t i = 0;
        while (i < TDM_ARRAY_LEN(COST_KEYS) && strcmp(COST_KEYS[i].name, k)) i++;
        if (i == TDM_ARRAY_LEN(COST_KEYS))
            return tdm__fail(&s->err, TDM_E_CONFIG, "cost_model.%s: unknown key", k);
        double x = json_is_number(v) ? json_number_value(v) : -1.0;
        if (!json_is_number(v) || !(x >= 0.0 && x < 1e12))
            return tdm__fail(&s->err, TDM_E_CONFIG, "cost_model.%s: expected a number >= 0", k);
        *dfield(p, COST_KEYS[i].off) = x;
    }
    return TDM_OK;
}

int tdm_sched_configure(tdm_sched *s, const char *text)
{
    if (!s) return TDM_E_INVAL;
    if (!text) return tdm__fail(&s->err, TDM_E_INVAL, "tdm_sched_configure: json is NULL");
    json_error_t je;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return tdm__fail(&s->err, TDM_E_CONFIG, "config: invalid JSON at line %d column %d: %s",
                         je.line, je.column, je.text);
    int rc = TDM_OK;
    const char *plugin_path = NULL, *plugin_sym = NULL;
    tdm__params np = s->prm;
    if (!json_is_object(root)) {
        rc = tdm__fail(&s->err, TDM_E_CONFIG, "config: expected a JSON object");
        goto out;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        const param_desc *d = find_name(k);
        if (d) rc = json_value(s, &np, d, v);
        else if (!strcmp(k, "cost_model")) rc = json_cost(s, &np, v);
        else if (!strcmp(k, "policy_plugin")) {
            json_t *pp = json_is_object(v) ? json_object_get(v, "path") : NULL;
            json_t *ps = json_is_object(v) ? json_object_get(v, "symbol") : NULL;
            size_t nkeys = json_is_object(v) ? json_object_size(v) : 0;
            if (!pp || !json_is_string(pp) || (ps && !json_is_string(ps)) || nkeys != 1u + (ps != NULL))
                rc = tdm__fail(&s->err, TDM_E_CONFIG,
                               "policy_plugin: expected {\"path\": string, \"symbol\": string (optional)}");
            else {
                plugin_path = json_string_value(pp);
                plugin_sym = ps ? json_string_value(ps) : NULL;
            }
        } else
            rc = tdm__fail(&s->err, TDM_E_CONFIG, "config: unknown key \"%s\"", k);
        if (rc) goto out;
    }
    if (plugin_path) {
        json_t *pol = json_object_get(root, "policy");
        if (pol && !(json_is_string(pol) && !strcmp(json_string_value(pol), "custom"))) {
            rc = tdm__fail(&s->err, TDM_E_CONFIG, "policy_plugin: conflicts with \"policy\": %s",
                           json_is_string(pol) ? json_string_value(pol) : "(not a string)");
            goto out;
        }
        np.policy = s->prm.policy; /* set by the load below */
    } else if (np.policy == TDM_POLICY_CUSTOM && s->prm.policy != TDM_POLICY_CUSTOM) {
        rc = tdm__fail(&s->err, TDM_E_CONFIG, "policy: \"custom\" needs \"policy_plugin\" or tdm_sched_set_policy");
        goto out;
    }
    if ((rc = validate_cross(s, &np))) goto out;
    if (plugin_path && tdm__waiting_len(s)) {
        rc = tdm__fail(&s->err, TDM_E_STATE, "policy_plugin: the waiting queue must be empty");
        goto out;
    }
    /* Load the plug-in before committing so that a failure changes nothing. */
    tdm_policy loaded;
    void *handle = NULL;
    if (plugin_path && (rc = tdm__policy_load(s, plugin_path, plugin_sym, &loaded, &handle))) goto out;
    if ((rc = commit(s, &np))) {
        if (handle) tdm__policy_unload(&loaded, handle);
        goto out;
    }
    if (handle) tdm__policy_install(s, &loaded, handle);
out:
    json_decref(root);
    return rc;
}

int tdm_sched_get_config(const tdm_sched *s, char *buf, size_t buf_size, size_t *len)
{
    if (!s || !len || (!buf && buf_size)) return TDM_E_INVAL;
    json_t *o = json_object();
    if (!o) return TDM_E_NOMEM;
    int rc = TDM_OK;
    for (size_t i = 0; i < TDM_ARRAY_LEN(PARAMS) && !rc; i++) {
        const param_desc *d = &PARAMS[i];
        int64_t x = cfield(&s->prm, d);
        json_t *v;
        switch (d->kind) {
        case K_BOOL: v = json_boolean(x); break;
        case K_FRACTION_PPM: v = json_real((double)x / 1e6); break;
        case K_MS_TO_US: v = json_real((double)x / 1000.0); break;
        case K_ENUM: v = json_string(d->names[x]); break;
        default: v = json_integer(x); break;
        }
        if (!v || json_object_set_new(o, d->name, v)) rc = TDM_E_NOMEM;
    }
    json_t *cm = rc ? NULL : json_object();
    if (!rc && !cm) rc = TDM_E_NOMEM;
    for (size_t i = 0; !rc && i < TDM_ARRAY_LEN(COST_KEYS); i++)
        if (json_object_set_new(cm, COST_KEYS[i].name,
                                json_real(*(const double *)((const char *)&s->prm + COST_KEYS[i].off))))
            rc = TDM_E_NOMEM;
    if (!rc && json_object_set_new(o, "cost_model", cm)) rc = TDM_E_NOMEM;
    char *text = rc ? NULL : json_dumps(o, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(o);
    if (!text) return TDM_E_NOMEM;
    size_t n = strlen(text);
    if (n + 1 > buf_size) {
        free(text);
        *len = n;
        return buf ? TDM_E_TRUNCATED : TDM_OK;
    }
    memcpy(buf, text, n + 1);
    free(text);
    *len = n;
    return TDM_OK;
}
