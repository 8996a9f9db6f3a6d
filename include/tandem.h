/*
 * tandem.h -- the public, stable C ABI of Tandem.
 *
 * Tandem is the scheduling and KV-transfer layer of an LLM serving engine: the host
 * framework keeps the weights and runs the forward passes; Tandem decides, step by step,
 * which tokens of which requests run next, owns the paged KV block tables, and moves KV
 * blocks between prefill and decode workers.
 *
 * Conventions (docs/ABI.md states the compatibility promise):
 *   - Every function returns an int status: TDM_OK (0) or a negative TDM_E_* code whose
 *     value is never reused. tdm_strerror() names a code; tdm_<handle>_errmsg() gives the
 *     detailed message of the last failure on that handle.
 *   - Out-parameters are left untouched on failure.
 *   - Opaque handles come in create/destroy pairs; destroy(NULL) is a no-op.
 *   - Structs that cross the ABI begin with `uint32_t struct_size` and have an *_init()
 *     function; the library reads and writes only what the caller's struct_size covers, so
 *     fields can be appended in later minor versions.
 *   - Arrays the library returns are owned by the handle; each function says how long they
 *     stay valid.
 *   - No variadic functions; no CUDA types (streams are void *).
 *   - Thread safety: a handle is not thread-safe unless its section says otherwise; distinct
 *     handles may be used from distinct threads concurrently.
 *
 * This header is the umbrella: it also includes tandem_kernels.h (KV layouts and the
 * pack/unpack/convert kernels) and tandem_kvx.h (the KV transfer engine).
 */
#ifndef TANDEM_H
#define TANDEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  define TDM_API
#elif defined(__GNUC__) && (__GNUC__ >= 4)
#  define TDM_API __attribute__((visibility("default")))
#else
#  define TDM_API
#endif

/* ------------------------------------------------------------------------------------ */
/* Versions                                                                              */
/* ------------------------------------------------------------------------------------ */

#define TDM_VERSION_MAJOR 0
#define TDM_VERSION_MINOR 5
#define TDM_VERSION_PATCH 0
#define TDM_VERSION_NUMBER (TDM_VERSION_MAJOR * 10000 + TDM_VERSION_MINOR * 100 + TDM_VERSION_PATCH)
/* The string is built from the three numbers above, so the two cannot disagree. */
#define TDM__STR_(x) #x
#define TDM__STR(x) TDM__STR_(x)
#define TDM_VERSION_STRING \
    TDM__STR(TDM_VERSION_MAJOR) "." TDM__STR(TDM_VERSION_MINOR) "." TDM__STR(TDM_VERSION_PATCH)

/* The ABI version: bumped only on an incompatible change; it is the SONAME's number
 * (libtandem.so.<TDM_ABI_VERSION>). Bindings compare tdm_abi_version() with the value
 * they were written for and refuse to load on a mismatch. */
#define TDM_ABI_VERSION 1

/* The library's version as TDM_VERSION_NUMBER encodes it (major*10000 + minor*100 + patch). */
TDM_API unsigned tdm_version_number(void);
/* The library's version as a static string, "major.minor.patch". */
TDM_API const char *tdm_version_string(void);
/* The ABI version of the loaded library (TDM_ABI_VERSION of the header it was built with). */
TDM_API unsigned tdm_abi_version(void);

/* ------------------------------------------------------------------------------------ */
/* Status codes                                                                          */
/* Values are explicit and never reused; new codes may be added in later versions.       */
/* ------------------------------------------------------------------------------------ */

#define TDM_OK              0
#define TDM_E_INVAL        (-1)   /* an argument is NULL, out of range or malformed */
#define TDM_E_NOMEM        (-2)   /* an allocation failed */
#define TDM_E_NOT_FOUND    (-3)   /* unknown request id, key or name */
#define TDM_E_EXISTS       (-4)   /* duplicate request id or name */
#define TDM_E_STATE        (-5)   /* the call is not valid in the object's current state */
#define TDM_E_RANGE        (-6)   /* a value exceeds a configured limit */
#define TDM_E_CONFIG       (-7)   /* a configuration document or parameter is invalid */
#define TDM_E_NO_SPACE     (-8)   /* not enough free KV blocks / buffer space */
#define TDM_E_AGAIN        (-9)   /* nothing available now; try again later */
#define TDM_E_TIMEOUT      (-10)  /* a deadline passed */
#define TDM_E_PROTOCOL     (-11)  /* a malformed, truncated or out-of-range message */
#define TDM_E_IO           (-12)  /* a socket, file or system call failed */
#define TDM_E_NO_CUDA      (-13)  /* CUDA is not available (no library, no device) */
#define TDM_E_CUDA         (-14)  /* a CUDA call failed */
#define TDM_E_VERSION      (-15)  /* incompatible version (ABI, protocol, plug-in table) */
#define TDM_E_LAYOUT       (-16)  /* KV layouts differ in a way that cannot be converted */
#define TDM_E_AUTH         (-17)  /* authentication refused */
#define TDM_E_CANCELLED    (-18)  /* the operation was cancelled */
#define TDM_E_PEER         (-19)  /* the peer is unknown, unreachable or dead */
#define TDM_E_UNSUPPORTED  (-20)  /* the feature is not built in or not supported */
#define TDM_E_INTERNAL     (-21)  /* an internal invariant failed (a bug: please report) */
#define TDM_E_TRUNCATED    (-22)  /* an output buffer was too small */
#define TDM_E_PLUGIN       (-23)  /* a plug-in could not be loaded or misbehaved */

/* A static, human-readable name for a status code ("invalid argument", ...).
 * Unknown codes give "unknown error". Never NULL. Thread-safe. */
TDM_API const char *tdm_strerror(int status);

/* ------------------------------------------------------------------------------------ */
/* Allocator                                                                             */
/* ------------------------------------------------------------------------------------ */

typedef struct tdm_allocator {
    uint32_t struct_size;                              /* sizeof(tdm_allocator) */
    void *(*malloc_fn)(void *ctx, size_t size);
    void *(*realloc_fn)(void *ctx, void *ptr, size_t size);
    void (*free_fn)(void *ctx, void *ptr);
    void *ctx;
} tdm_allocator;

/* Initialise *a to the default allocator (malloc/realloc/free). Returns TDM_E_INVAL on NULL. */
TDM_API int tdm_allocator_init(tdm_allocator *a);

/* Replace the allocator every handle uses for host memory. NULL restores the default.
 * Refused with TDM_E_STATE while any Tandem handle exists (the allocator cannot change under
 * live memory); TDM_E_INVAL if a function pointer is NULL. Not thread-safe: call it once at
 * start-up. This is the only global mutable state of the library. */
TDM_API int tdm_set_allocator(const tdm_allocator *a);

/* ------------------------------------------------------------------------------------ */
/* Scheduler                                                                             */
/*                                                                                       */
/* One tdm_sched schedules one engine (one data-parallel rank). The host calls, each     */
/* model step: tdm_sched_step() -> runs the model on the batch -> tdm_sched_update().    */
/* Between steps it may add, abort and finish requests. The model follows vLLM v1: no     */
/* prefill/decode phases; each request advances num_computed_tokens towards its token    */
/* count under a per-step token budget; KV memory is paged in fixed-size blocks.         */
/*                                                                                       */
/* Thread safety: a tdm_sched is not thread-safe; serialise calls on one handle.         */
/* ------------------------------------------------------------------------------------ */

typedef struct tdm_sched tdm_sched;

/* Token ids are int32 (vLLM's). Block ids are uint32; block 0 is the null block and is
 * never handed to a request. */
typedef int32_t tdm_token;

/* Parameters settable with tdm_sched_set_param() (and by name in the JSON config, given
 * in brackets). Values are int64. Parameters that shape the KV pool (NUM_BLOCKS,
 * BLOCK_SIZE, ENABLE_PREFIX_CACHING) can only change while the scheduler holds no request. */
typedef enum tdm_sched_param {
    TDM_SCHED_MAX_NUM_BATCHED_TOKENS = 1,  /* ["max_num_batched_tokens"] token budget per step; default 2048 */
    TDM_SCHED_MAX_NUM_SEQS = 2,            /* ["max_num_seqs"] max running requests; default 128.
                                              Lowered below the running count, the running
                                              requests keep running; none is admitted until
                                              fewer run than the cap */
    TDM_SCHED_MAX_MODEL_LEN = 3,           /* ["max_model_len"] max tokens per request; default 8192 */
    TDM_SCHED_LONG_PREFILL_TOKEN_THRESHOLD = 4, /* ["long_prefill_token_threshold"] per-request chunk cap, 0 = none */
    TDM_SCHED_ENABLE_CHUNKED_PREFILL = 5,  /* ["enable_chunked_prefill"] 0/1; default 1 */
    TDM_SCHED_NUM_BLOCKS = 6,              /* ["num_blocks"] KV blocks incl. the null block; default 10000 */
    TDM_SCHED_BLOCK_SIZE = 7,              /* ["block_size"] tokens per block; default 16 */
    TDM_SCHED_ENABLE_PREFIX_CACHING = 8,   /* ["enable_prefix_caching"] 0/1; default 1 */
    TDM_SCHED_WATERMARK_PPM = 9,           /* ["watermark"] free-block watermark for admission, parts per
                                              million of num_blocks (JSON: a fraction); default 0 */
    TDM_SCHED_POLICY = 10,                 /* ["policy"] a tdm_policy_kind ("fcfs", "priority",
                                              "slo"); default FCFS */
    TDM_SCHED_MODE = 11,                   /* ["mode"] a tdm_sched_mode; default VLLM */
    TDM_SCHED_TBT_TARGET_US = 12,          /* ["tbt_target_ms" in JSON, float] time-between-tokens
                                              target; 0 = fixed token budget */
    TDM_SCHED_NUM_LOOKAHEAD_TOKENS = 13,   /* ["num_lookahead_tokens"] slots reserved for speculative
                                              tokens of running requests; default 0 */
    TDM_SCHED_ROLE = 14,                   /* ["role"] a tdm_sched_role; default BOTH */
    TDM_SCHED_REMOTE_KV_FAILURE = 15,      /* ["remote_kv_failure"] a tdm_remote_kv_failure; default RECOMPUTE */
    TDM_SCHED_REMOTE_KV_TIMEOUT_MS = 16,   /* ["remote_kv_timeout_ms"] a remote-KV wait that exceeds it
                                              fails; 0 = never; default 0 */
    TDM_SCHED_DELAY_FREE_TIMEOUT_MS = 17,  /* ["delay_free_timeout_ms"] held blocks of a finished
                                              prefill-side request are freed after it; default 120000 */
    TDM_SCHED_MAX_NUM_PARTIAL_PREFILLS = 18, /* ["max_num_partial_prefills"] in DECODE_FIRST mode, the
                                              most prefills in progress at once; 0 = no limit */
    TDM_SCHED_PREFIX_HASH = 19,            /* ["prefix_hash"] a tdm_prefix_hash: the block digest of
                                              the prefix cache ("sha256", "xxh3_128"); default SHA256.
                                              Changing it drops the cached blocks; only while the
                                              scheduler holds no request */
    TDM_SCHED_RESERVE_FULL_PROMPT = 20,    /* ["reserve_full_prompt"] 0/1: admit a waiting request only
                                              when blocks for all its tokens (not just the first
                                              chunk) are free, as vLLM's scheduler_reserve_full_isl
                                              (on by default in vLLM 0.31-0.33); default 0 */
    TDM_SCHED_CONTINUE_AFTER_SELF_PREEMPTION = 21, /* ["continue_after_self_preemption"] 0/1: when
                                              the request being scheduled is itself the victim,
                                              go on with the running requests after it (vLLM
                                              0.33) instead of ending the running pass (0.32 and
                                              older); default 1 */
    TDM_SCHED_ENABLE_KV_EVENTS = 22,       /* ["enable_kv_events"] 0/1: record KV cache events for
                                              tdm_sched_kv_events(); default 0 */
    TDM_SCHED_KV_EVENTS_CAPACITY = 23,     /* ["kv_events_capacity"] events (and block digests) the
                                              queue holds between drains; default 4096 */
    TDM_SCHED_ASYNC_SCHEDULING = 24,       /* ["async_scheduling"] 0/1: a request scheduled to
                                              sample holds an output placeholder, so the next step
                                              schedules it again before that step's update comes
                                              (vLLM's AsyncScheduler); default 0. Only while the
                                              scheduler holds no request */
    TDM_SCHED_SLO_TTFT_US = 25,            /* ["slo_ttft_ms" in JSON, float] SLO_ADAPTIVE: the TTFT
                                              target of requests without their own ttft_slo;
                                              0 = none (default) */
    TDM_SCHED_SLO_TPOT_US = 26,            /* ["slo_tpot_ms" in JSON, float] SLO_ADAPTIVE: the TPOT
                                              target of requests without their own tpot_slo;
                                              0 = none (default) */
    TDM_SCHED_LONG_PREFILL_NEEDS_CHUNKING = 27, /* ["long_prefill_needs_chunking"] 0/1: apply
                                              long_prefill_token_threshold only with chunked
                                              prefill on (vLLM 0.34); 0 (default): always
                                              (vLLM 0.33 and older) */
    TDM_SCHED_CACHE_AWARE_WINDOW = 28,     /* ["cache_aware_window"] cache-aware admission: before
                                              admitting, the first N waiting requests that are
                                              merely waiting are reordered by cached-prefix
                                              depth, deepest first (vLLM 0.34's
                                              cache_aware_admission_window); FCFS with prefix
                                              caching only; 0 = off (default) */
    TDM_SCHED_CACHE_AWARE_THRESHOLD_PPM = 29, /* ["cache_aware_threshold" in JSON, float 0..1] the
                                              KV usage below which the window is not applied,
                                              in millionths; default 500000 (0.5) */
    TDM_SCHED_MAX_INFLIGHT_KV_LOADS = 30,  /* ["max_inflight_kv_loads"] vLLM 0.34's
                                              max_num_inflight_kv_loads: the most remote-KV
                                              loads holding blocks before they run (receiving,
                                              or received and waiting for a running slot,
                                              aborted receives included); requests added with
                                              TDM_REQ_MAY_LOAD_ASYNC wait in a queue of their
                                              own whose loads start even while the running
                                              batch or the token budget is full. 0 = no cap
                                              and no such queue (default). Implies
                                              KV_LOAD_QUEUES. Only while the scheduler holds
                                              no request */
    TDM_SCHED_KV_LOAD_QUEUES = 31,         /* ["kv_load_queues"] 0/1: vLLM 0.33+'s remote-KV
                                              admission: a request whose KV arrived (or failed)
                                              waits in a queue drained before the waiting
                                              queue, in load-start order (priority order with
                                              the PRIORITY policy); a load starts only if its
                                              blocks fit in the free blocks less those that
                                              prefilling running requests and other loads still
                                              need for their whole prompt; a failed load with
                                              no valid block frees its blocks and looks the
                                              prefix cache up again. Default 0. Only while the
                                              scheduler holds no request */
    TDM_SCHED_DEFER_BLOCK_FREE = 32,       /* ["defer_block_free"] 0/1: vLLM 0.33+'s
                                              defer_block_free (async scheduling or pipeline
                                              parallelism with a KV consumer connector): the
                                              blocks of a request finished or preempted while
                                              a step of it is in flight go back to the pool
                                              only once every batch returned so far has been
                                              reported by an update, in the order freed (tail
                                              blocks first); a running request with a step in
                                              flight is never preempted (the running pass ends
                                              instead). An update counts as one batch's report
                                              when it lists a request or names a batch: report
                                              each batch in one update. Default 0. Only while
                                              the scheduler holds no request and no block
                                              waits */
    TDM_SCHED_DECODE_STAGGER = 33          /* ["decode_stagger"] async scheduling only: a
                                              request scheduled in step t in a step that
                                              samples (a decode, or the chunk completing its
                                              prompt) is not scheduled again from the running
                                              queue before step t + N (vLLM's AsyncScheduler
                                              with N = pipeline_parallel_size:
                                              next_decode_eligible_step); steps are counted
                                              by tdm_sched_step calls, empty ones included.
                                              1..1024; default 1 (no gate) */
} tdm_sched_param;

/* The block digest of the prefix cache (see docs/scheduler.md, "Block hashes"). */
typedef enum tdm_prefix_hash {
    TDM_PREFIX_HASH_SHA256 = 0,   /* SHA-256 (OpenSSL libcrypto): collision-resistant */
    TDM_PREFIX_HASH_XXH3_128 = 1  /* XXH3-128 (libxxhash): faster, but a tenant who chooses
                                     prompts can search for collisions; trusted tenants only */
} tdm_prefix_hash;

typedef enum tdm_policy_kind {
    TDM_POLICY_FCFS = 0,      /* arrival order; preempt the most recently admitted running request */
    TDM_POLICY_PRIORITY = 1,  /* lowest priority value first, then arrival; preempt the worst */
    TDM_POLICY_CUSTOM = 2,    /* set by tdm_sched_set_policy() / tdm_sched_load_policy() */
    TDM_POLICY_SLO = 3,       /* earliest TTFT deadline (arrival_time + ttft_slo) first, then
                                 requests without a TTFT SLO by arrival; preempt the request
                                 with the latest deadline */
    TDM_POLICY_SLO_ADAPTIVE = 4 /* configured by SLOs (ttft_slo/tpot_slo per request, else
                                 SLO_TTFT_US/SLO_TPOT_US), whatever the mode: decode-first
                                 steps sized online so running decodes keep their TPOT (cost
                                 model x measured step time), longer only when that saves an
                                 urgent TTFT; least laxity first with bounded starvation;
                                 preempts a request that lost its SLO first, else the latest
                                 admitted; see docs/scheduler.md */
} tdm_policy_kind;

typedef enum tdm_sched_mode {
    TDM_MODE_VLLM = 0,         /* vLLM v1: running requests in list order, then waiting */
    TDM_MODE_DECODE_FIRST = 1, /* stall-free (Sarathi-Serve): running decodes, then partial
                                  prefills, then new prefills; budget from the TBT target */
    TDM_MODE_PREFILL_FIRST = 2 /* baseline (vLLM v0, TGI): prompts (running prefills, then
                                  waiting) in prefill-only steps; decodes only in steps where
                                  no prompt can run */
} tdm_sched_mode;

typedef enum tdm_sched_role {
    TDM_ROLE_BOTH = 0,     /* colocated engine */
    TDM_ROLE_PREFILL = 1,  /* disaggregated prefill engine */
    TDM_ROLE_DECODE = 2    /* disaggregated decode engine */
} tdm_sched_role;

typedef enum tdm_remote_kv_failure {
    TDM_REMOTE_KV_RECOMPUTE = 0,  /* a failed remote-KV receive is recomputed locally */
    TDM_REMOTE_KV_FAIL = 1        /* the request finishes with TDM_FINISH_ERROR */
} tdm_remote_kv_failure;

/* Create a scheduler with default parameters. *out receives the handle.
 * Errors: TDM_E_INVAL (out NULL), TDM_E_NOMEM. */
TDM_API int tdm_sched_create(tdm_sched **out);

/* Destroy a scheduler and every request it holds. NULL is a no-op. */
TDM_API void tdm_sched_destroy(tdm_sched *s);

/* The message of the last failed call on s ("" if none). Owned by s, valid until the next
 * call on s. With s NULL, a static message saying so (tdm_sched_create fails only with
 * TDM_E_INVAL for a NULL out or TDM_E_NOMEM). */
TDM_API const char *tdm_sched_errmsg(const tdm_sched *s);

/* Apply a JSON configuration document (an object whose keys are the names in brackets
 * above, plus "policy_plugin": {"path": "...", "symbol": "..."} and "cost_model":
 * {"base_us", "per_prefill_token_us", "per_decode_req_us", "per_context_token_ns",
 * "per_attn_token2_ps"}). All or nothing: on any error nothing changes and the message names the key
 * and the reason. Unknown keys are errors. Errors: TDM_E_INVAL, TDM_E_CONFIG, TDM_E_STATE
 * (a pool-shaping key while requests exist), TDM_E_PLUGIN, TDM_E_NOMEM. */
TDM_API int tdm_sched_configure(tdm_sched *s, const char *json);

/* Write the full current configuration as a JSON object into buf (NUL-terminated).
 * *len receives the length needed without the NUL; TDM_E_TRUNCATED if buf is too small
 * (buf may be NULL with buf_size 0 to ask for the length). */
TDM_API int tdm_sched_get_config(const tdm_sched *s, char *buf, size_t buf_size, size_t *len);

/* Set or read one parameter. Errors: TDM_E_INVAL (unknown key), TDM_E_CONFIG (bad value,
 * the message says why), TDM_E_STATE (pool-shaping key while requests exist). */
TDM_API int tdm_sched_set_param(tdm_sched *s, tdm_sched_param key, int64_t value);
TDM_API int tdm_sched_get_param(const tdm_sched *s, tdm_sched_param key, int64_t *value);

/* Request flags. */
#define TDM_REQ_IGNORE_EOS    (1u << 0)  /* do not stop on eos_token_id */
#define TDM_REQ_REMOTE_PREFILL (1u << 1) /* decode side: the prompt's KV arrives from a remote
                                            prefill; blocks are reserved, the request waits until
                                            tdm_sched_remote_kv_done() */
#define TDM_REQ_REMOTE_DECODE (1u << 2)  /* prefill side: when finished, keep the blocks ("delayed
                                            free") until tdm_sched_release() or the timeout */
#define TDM_REQ_SKIP_PREFIX_CACHE (1u << 3) /* do not read the prefix cache (e.g. prompt logprobs) */
#define TDM_REQ_SLO_DEPRIORITIZE (1u << 4) /* SLO_ADAPTIVE: once the request can no longer meet its
                                            TTFT it waits behind every request that still can,
                                            and its TPOT no longer limits step size (it is still
                                            served, never dropped); other policies ignore it */
#define TDM_REQ_PREFIX_HIT_LIMIT (1u << 5) /* read at most prefix_hit_limit tokens from the prefix
                                            cache (whole blocks within them); 0 = no reads, as
                                            SKIP_PREFIX_CACHE (vLLM 0.34's
                                            Request.prefix_cache_hit_limit) */
#define TDM_REQ_MAY_LOAD_ASYNC (1u << 6) /* with MAX_INFLIGHT_KV_LOADS: the request may load its
                                            KV from a remote peer (vLLM's
                                            KVConnector.may_load_async), so it waits in the
                                            load queue, whose loads start while the batch is
                                            full; without REMOTE_PREFILL it is admitted as any
                                            other once a running slot is free */
#define TDM_REQ_PRECOMPUTED_DIGESTS (1u << 7) /* block_hashes hold Tandem's own digests of the
                                            first num_block_hashes full prompt blocks, computed
                                            ahead (e.g. on another thread) by
                                            tdm_prefix_digests() with this scheduler's
                                            prefix_hash and block_size and the request's
                                            cache_salt; block_hash_size must be that
                                            algorithm's digest size (32 SHA-256, 16 XXH3-128).
                                            The scheduler recomputes the first and the last of
                                            them to check (TDM_E_INVAL on a mismatch), computes
                                            any the caller left out, and hashes later blocks
                                            itself as without the flag (the request is not in
                                            host-digest mode; cache_salt is allowed). Ignored
                                            digests when prefix caching is off. (ABI 1.3) */

/* A request to add. Pointers are read during the call only (the library copies). */
typedef struct tdm_request_desc {
    uint32_t struct_size;          /* sizeof(tdm_request_desc) */
    uint32_t flags;                /* TDM_REQ_* */
    uint64_t id;                   /* unique among live requests of this scheduler */
    const tdm_token *prompt;       /* prompt token ids */
    uint32_t num_prompt_tokens;    /* >= 1 */
    uint32_t max_tokens;           /* max output tokens, >= 1 */
    uint32_t min_tokens;           /* EOS and stop tokens are ignored before this many outputs */
    int32_t eos_token_id;          /* < 0: none */
    const tdm_token *stop_token_ids;
    uint32_t num_stop_token_ids;
    int32_t priority;              /* PRIORITY policy: lower value runs first */
    double arrival_time;           /* seconds, on the clock the host passes to step/update */
    double ttft_slo;               /* seconds, 0 = none (for SLO-aware policies and stats) */
    double tpot_slo;               /* seconds, 0 = none */
    const void *cache_salt;        /* bytes mixed into the first block's hash; NULL = none */
    uint32_t cache_salt_len;
    uint32_t num_remote_tokens;    /* REMOTE_PREFILL: tokens whose KV arrives (0 = the whole
                                      prompt); the rest is computed locally */
    uint32_t tenant;               /* an opaque tenant id available to policies */
    /* Host-supplied block hashes (appended fields; see docs/ABI.md). With block_hash_size
     * non-zero, the prefix cache uses the host's digest of each full block instead of
     * computing one: block_hashes holds num_block_hashes digests of block_hash_size bytes
     * (16..32), one per full prompt block in order (at most num_prompt_tokens / block_size).
     * The digests of blocks that fill later are given with tdm_sched_append_block_hashes();
     * a full block without a digest is neither looked up nor cached. Exclusive with
     * cache_salt: the host's digests must already cover it. */
    const void *block_hashes;
    uint32_t num_block_hashes;
    uint32_t block_hash_size;      /* bytes per digest; 0 = Tandem computes the digests */
    /* Appended in ABI 1.2: with TDM_REQ_PREFIX_HIT_LIMIT, the most tokens a prefix-cache hit
     * may cover (the last token is always recomputed whatever the limit). */
    uint32_t prefix_hit_limit;
} tdm_request_desc;

/* Fill *d with defaults: struct_size set, eos_token_id -1, max_tokens 16 (vLLM's default),
 * everything else 0. */
TDM_API int tdm_request_desc_init(tdm_request_desc *d);

/* Add a request to the waiting queue. Errors: TDM_E_INVAL (bad field), TDM_E_EXISTS
 * (duplicate id), TDM_E_RANGE (prompt longer than max_model_len - 1 or needing more blocks
 * than the pool has), TDM_E_NOMEM. On failure nothing is added. */
TDM_API int tdm_sched_add(tdm_sched *s, const tdm_request_desc *d);

/* Tandem's own prefix-cache digests of the full blocks of a prompt (docs/scheduler.md,
 * "Block hashes"): what a scheduler with prefix_hash `algo` (a tdm_prefix_hash) and block
 * size `block_size` computes for a request with that cache salt (NULL/0: none). Writes the
 * digests of the first min(num_tokens / block_size, out_size / size) full blocks into out,
 * packed, `size` bytes each (32 SHA-256, 16 XXH3-128), and their count in *num_digests. For
 * TDM_REQ_PRECOMPUTED_DIGESTS: a host computes them on any thread (the function touches no
 * handle and no shared state; it is thread-safe) and tdm_sched_add then only checks and
 * stores them. Errors (tdm_prefix_errmsg() says which argument): TDM_E_INVAL (tokens, out or
 * num_digests NULL with a non-zero size, an unknown algo, block_size 0 or above 65536, a
 * negative token id), TDM_E_RANGE (cache_salt over 4096 bytes), TDM_E_NOMEM, TDM_E_INTERNAL
 * (libcrypto failed). On failure *num_digests is untouched. (TANDEM_1.3) */
TDM_API int tdm_prefix_digests(int algo, uint32_t block_size, const void *cache_salt,
                               uint32_t cache_salt_len, const tdm_token *tokens,
                               uint32_t num_tokens, void *out, size_t out_size,
                               uint32_t *num_digests);

/* The message of the calling thread's last failed tdm_prefix_digests() ("" if none). */
TDM_API const char *tdm_prefix_errmsg(void);

/* Append host-supplied digests (see tdm_request_desc.block_hashes) for the request's next
 * full blocks, e.g. those that filled during decode once tdm_sched_update() reported their
 * tokens. hashes holds count digests of hash_size bytes, which must equal the request's
 * block_hash_size; the total may not exceed the full blocks of the request's known tokens.
 * Read during the call only. Errors: TDM_E_NOT_FOUND (no unfinished request), TDM_E_INVAL
 * (the request was added without host hashes, hash_size differs, hashes NULL),
 * TDM_E_RANGE (more digests than full blocks). On failure nothing is appended. */
TDM_API int tdm_sched_append_block_hashes(tdm_sched *s, uint64_t id, const void *hashes,
                                          uint32_t count, uint32_t hash_size);

/* Finish reasons. */
typedef enum tdm_finish_reason {
    TDM_FINISH_NONE = 0,     /* not finished */
    TDM_FINISH_STOP = 1,     /* EOS or a stop token (or the host's stop string) */
    TDM_FINISH_LENGTH = 2,   /* max_tokens or max_model_len */
    TDM_FINISH_ABORT = 3,    /* aborted by the host */
    TDM_FINISH_ERROR = 4     /* failed (remote KV lost with the FAIL policy, ...) */
} tdm_finish_reason;

/* Abort a request in any state (same as tdm_sched_finish(s, id, TDM_FINISH_ABORT)). Its
 * blocks are freed, except while a remote-KV receive may still write into them: those are
 * freed when tdm_sched_remote_kv_done() reports or the remote-KV timeout passes.
 * Errors: TDM_E_NOT_FOUND. */
TDM_API int tdm_sched_abort(tdm_sched *s, uint64_t id);

/* Finish a request for a host-side reason (stop string, client gone). reason is STOP,
 * LENGTH, ABORT or ERROR. The id appears in the next batch's finished list.
 * Errors: TDM_E_NOT_FOUND, TDM_E_INVAL (reason). */
TDM_API int tdm_sched_finish(tdm_sched *s, uint64_t id, tdm_finish_reason reason);

/* Kinds of batch entries. */
#define TDM_ENTRY_NEW       0  /* first scheduling: blocks is the whole block table */
#define TDM_ENTRY_RESUMED   1  /* rescheduled after preemption: blocks replaces the table */
#define TDM_ENTRY_CONTINUING 2 /* scheduled last time too: blocks are appended */

/* The batch for one model step, filled by tdm_sched_step(); struct of arrays, one element
 * per scheduled request, in scheduling order. Every array is owned by the scheduler and
 * valid until the next tdm_sched_step(), tdm_sched_reset_prefix_cache() or destroy. */
typedef struct tdm_batch {
    uint32_t struct_size;         /* set by the caller: sizeof(tdm_batch) */
    uint32_t num_reqs;
    uint64_t step;                /* step counter, from 1 */
    uint32_t total_tokens;        /* sum of num_tokens */
    uint32_t num_prefill_reqs;    /* entries still in their prompt after this step's chunk
                                     or computing prompt tokens */
    const uint64_t *req_ids;
    const uint32_t *num_tokens;    /* tokens to compute this step (incl. draft tokens) */
    const uint32_t *num_computed;  /* num_computed_tokens before this step */
    const uint8_t *kinds;          /* TDM_ENTRY_* */
    const uint32_t *num_spec;      /* draft tokens among num_tokens */
    const uint32_t *block_offsets; /* num_reqs + 1 offsets into blocks */
    const uint32_t *blocks;        /* new block ids per entry (see TDM_ENTRY_*) */
    uint32_t num_preempted;        /* preempted in this step (their KV is gone) */
    const uint64_t *preempted_ids;
    uint32_t num_finished;         /* finished since the previous step (workers free state) */
    const uint64_t *finished_ids;
    uint32_t num_recv_ready;       /* REMOTE_PREFILL requests whose blocks were reserved in this
                                      step: the host starts their KV receive now */
    const uint64_t *recv_ready_ids;
} tdm_batch;

TDM_API int tdm_batch_init(tdm_batch *b);

/* Schedule one step at host time `now` (seconds). Fills *out (up to out->struct_size).
 * An empty batch (num_reqs 0) is valid. Expires delayed frees and remote-KV waits whose
 * timeout passed. Errors: TDM_E_INVAL. */
TDM_API int tdm_sched_step(tdm_sched *s, double now, tdm_batch *out);

/* The host's report of one step, struct of arrays over num_reqs requests that were
 * scheduled, in any order (see tdm_sched_update and tdm_sched_update_step for which). */
typedef struct tdm_step_output {
    uint32_t struct_size;           /* sizeof(tdm_step_output) */
    uint32_t num_reqs;
    const uint64_t *req_ids;
    const uint32_t *token_offsets;  /* num_reqs + 1 offsets into tokens */
    const tdm_token *tokens;        /* sampled tokens: none for a prompt chunk that did not
                                       finish the prompt; 1 + accepted drafts with spec decode */
    double now;                     /* host time of the step's end, seconds */
} tdm_step_output;

TDM_API int tdm_step_output_init(tdm_step_output *o);

/* What tdm_sched_update() did, per reported request that is still known. Owned by the
 * scheduler, valid until the next tdm_sched_update(), tdm_sched_step() or destroy. */
typedef struct tdm_update_result {
    uint32_t struct_size;
    uint32_t num_reqs;
    const uint64_t *req_ids;
    const uint32_t *num_new_tokens;  /* tokens appended after stop trimming */
    const uint8_t *finish_reasons;   /* tdm_finish_reason */
    const int32_t *stop_tokens;      /* the stop token that ended it, or -1 */
} tdm_update_result;

TDM_API int tdm_update_result_init(tdm_update_result *r);

/* Apply a step's output: append the sampled tokens, correct num_computed_tokens for
 * rejected drafts, apply max_tokens / max_model_len / EOS / stop tokens with trimming, free
 * finished requests' blocks (or hold them: REMOTE_DECODE), record timings. result may be NULL.
 * Each entry reports the oldest step of that request that was scheduled and not yet
 * reported (in step order when the host keeps several batches in flight; without pipelining:
 * exactly the requests of the step just returned); tokens only for a step that completed the
 * prompt or decoded. A request left out is not reported: its step stays owed, and a later
 * report of that request is taken as the report of that older step, so a host must report
 * every scheduled request, prefill chunks that sampled nothing included (with no tokens).
 * A host that reports only the requests that sampled uses tdm_sched_update_step instead.
 * A request finished after it was scheduled is skipped (vLLM). Errors, with
 * nothing applied: TDM_E_INVAL (malformed arrays, a duplicate id, now negative or not finite),
 * TDM_E_STATE (an unknown id, a request with no step awaiting its output such as a replayed
 * update, tokens for a non-final prefill chunk; the message names the request). */
TDM_API int tdm_sched_update(tdm_sched *s, const tdm_step_output *out, tdm_update_result *result);

/* Apply the output of the whole batch of step `step` (tdm_batch.step), as vLLM's
 * update_from_output does: `out` lists the requests of that batch that have something to
 * report, and a request of the batch it leaves out reports no tokens (a prefill chunk that
 * did not complete its prompt, or a step whose samples the host discarded: its last token is
 * computed again). Each batch with entries is reported once, in step order (the oldest first
 * when several are in flight); the last 8 batches awaiting a report are kept, older ones can
 * no longer be reported. A host uses this function for every batch or for none (per-request
 * reports through tdm_sched_update do not retire batches). An empty report of a step that
 * awaits none (an empty batch) is accepted and changes nothing but the clock. Otherwise as
 * tdm_sched_update(); errors, with nothing applied: TDM_E_INVAL as there, TDM_E_STATE when
 * `step` is not the oldest batch awaiting its report (the message names the step expected)
 * or `out` names a request that was not in that batch (the message names it). */
TDM_API int tdm_sched_update_step(tdm_sched *s, uint64_t step, const tdm_step_output *out,
                                  tdm_update_result *result);

/* Store speculative draft tokens for the next step of request id (replacing earlier ones);
 * they are scheduled with it and verified by the next update. Errors: TDM_E_NOT_FOUND,
 * TDM_E_STATE (not running), TDM_E_RANGE (more than num_lookahead_tokens). */
TDM_API int tdm_sched_set_draft_tokens(tdm_sched *s, uint64_t id, const tdm_token *tokens, uint32_t n);

/* Request states. */
typedef enum tdm_req_state {
    TDM_STATE_WAITING = 0,
    TDM_STATE_WAITING_REMOTE_KV = 1,  /* blocks reserved, KV being received */
    TDM_STATE_RUNNING = 2,
    TDM_STATE_PREEMPTED = 3,          /* waiting again after preemption */
    TDM_STATE_FINISHED_HELD = 4,      /* finished, blocks held for a remote decode */
    TDM_STATE_FINISHED = 5            /* finished; only visible until the next step */
} tdm_req_state;

typedef struct tdm_request_info {
    uint32_t struct_size;
    uint32_t state;                  /* tdm_req_state */
    uint32_t finish_reason;          /* tdm_finish_reason */
    uint32_t num_prompt_tokens;
    uint32_t num_output_tokens;
    uint32_t num_computed_tokens;
    uint32_t num_cached_tokens;      /* prefix-cache hit at first admission */
    uint32_t num_blocks;
    uint32_t num_preemptions;
    int32_t priority;
    double arrival_time;
    double first_scheduled_time;     /* -1 until scheduled */
    double first_token_time;         /* -1 until the first output token */
    double last_token_time;          /* -1 until the first output token */
    double finish_time;              /* -1 until finished */
    double max_token_gap;            /* largest gap between output tokens, seconds */
} tdm_request_info;

TDM_API int tdm_request_info_init(tdm_request_info *i);

/* Query a request. FINISHED requests stay queryable until the next tdm_sched_step() (or, if a
 * step they were scheduled in still awaits its update then, until that update),
 * FINISHED_HELD ones until released. Errors: TDM_E_NOT_FOUND. */
TDM_API int tdm_sched_request_info(const tdm_sched *s, uint64_t id, tdm_request_info *info);

/* The request's block table (*blocks owned by s, valid until the next call that changes
 * the request). Errors: TDM_E_NOT_FOUND. */
TDM_API int tdm_sched_request_blocks(const tdm_sched *s, uint64_t id, const uint32_t **blocks,
                                     uint32_t *num_blocks);

/* All token ids of the request (prompt then outputs), owned by s, valid until the next
 * update or step. Errors: TDM_E_NOT_FOUND. */
TDM_API int tdm_sched_request_tokens(const tdm_sched *s, uint64_t id, const tdm_token **tokens,
                                     uint32_t *num_tokens);

/* Decode side: the remote KV of a REMOTE_PREFILL request has arrived (ok != 0) or failed
 * (ok == 0). num_valid_tokens: on failure, how many leading tokens did arrive intact (0 if
 * unknown); they are kept and the rest recomputed (RECOMPUTE policy). On success the request
 * becomes schedulable with the received tokens computed (the last prompt token is always
 * recomputed, for its logits). If the request was aborted while waiting, its blocks are freed
 * now. Errors: TDM_E_NOT_FOUND, TDM_E_STATE (not waiting for remote KV). */
TDM_API int tdm_sched_remote_kv_done(tdm_sched *s, uint64_t id, int ok, uint32_t num_valid_tokens);

/* Prefill side: the KV of a finished REMOTE_DECODE request has been sent (or is no longer
 * needed): free its held blocks. Errors: TDM_E_NOT_FOUND, TDM_E_STATE (not held). */
TDM_API int tdm_sched_release(tdm_sched *s, uint64_t id);

/* Drop every cached (free, hashed) block from the prefix cache. With reset_running, every
 * running request is preempted first (moved to waiting, in order). Errors: TDM_E_STATE when
 * blocks are still in use and reset_running is 0. */
TDM_API int tdm_sched_reset_prefix_cache(tdm_sched *s, int reset_running);

typedef struct tdm_sched_stats {
    uint32_t struct_size;
    uint32_t num_running;
    uint32_t num_waiting;            /* incl. preempted and remote-KV waits */
    uint32_t num_waiting_remote_kv;
    uint32_t num_held;               /* finished, blocks held for a remote decode */
    uint32_t num_total_blocks;       /* usable blocks (the null block excluded) */
    uint32_t num_free_blocks;        /* incl. cached blocks that can be evicted */
    uint32_t num_cached_blocks;      /* hashed blocks in the prefix cache */
    double kv_usage;                 /* 1 - free/total */
    uint64_t prefix_queries;         /* tokens looked up in the prefix cache */
    uint64_t prefix_hits;            /* tokens found */
    double prefix_hit_rate;          /* hits / queries (0 if none) */
    uint64_t evictions;              /* cached blocks evicted for reuse */
    uint64_t preemptions;
    uint64_t steps;
    uint64_t scheduled_tokens;       /* over all steps */
    uint64_t finished;               /* requests finished (any reason) */
    uint64_t kv_events_dropped;      /* KV events lost to a full queue (appended field) */
} tdm_sched_stats;

TDM_API int tdm_sched_stats_init(tdm_sched_stats *st);
TDM_API int tdm_sched_get_stats(const tdm_sched *s, tdm_sched_stats *st);

/* ---- KV cache events (see docs/scheduler.md, "KV events") ----
 * With TDM_SCHED_ENABLE_KV_EVENTS the block pool records, in order, the blocks it indexes
 * in the prefix cache (STORED), the cached blocks it evicts (REMOVED, one digest per event)
 * and cache resets (ALL_CLEARED), at the points where vLLM's BlockPool emits BlockStored,
 * BlockRemoved and AllBlocksCleared. The digests are the ones the pool indexes: the host's
 * own when it passed block_hashes, else Tandem's SHA-256 / XXH3-128. */
typedef enum tdm_kv_event_kind {
    TDM_KV_EVENT_STORED = 1,       /* blocks joined the prefix cache */
    TDM_KV_EVENT_REMOVED = 2,      /* a cached block was evicted */
    TDM_KV_EVENT_ALL_CLEARED = 3   /* every cached block was dropped (reset) */
} tdm_kv_event_kind;

#define TDM_KV_EVENT_HASH_STRIDE 32 /* bytes between digests in the event arrays */

/* The events recorded since the previous drain, struct of arrays over num_events events in
 * emission order. Digests are TDM_KV_EVENT_HASH_STRIDE bytes apart; hash_sizes[i] of them are
 * meaningful (16..32). Every array is owned by the scheduler and valid until the next
 * tdm_sched_kv_events() call, a change of the KV events parameters, or destroy. */
typedef struct tdm_kv_event_batch {
    uint32_t struct_size;          /* set by the caller: sizeof(tdm_kv_event_batch) */
    uint32_t num_events;
    const uint8_t *kinds;          /* tdm_kv_event_kind */
    const uint8_t *hash_sizes;     /* bytes per digest of the event (0 for ALL_CLEARED) */
    const uint32_t *hash_offsets;  /* num_events + 1 offsets (in digests) into hashes */
    const uint8_t *hashes;         /* the events' block digests, TDM_KV_EVENT_HASH_STRIDE apart */
    const uint8_t *has_parent;     /* STORED: 1 if the first block has a parent block */
    const uint8_t *parent_hashes;  /* STORED: num_events digests (the parent of the first block) */
    const uint32_t *token_offsets; /* num_events + 1 offsets into token_ids */
    const tdm_token *token_ids;    /* STORED: the tokens of the stored blocks */
    const uint64_t *req_ids;       /* STORED: the request whose blocks were stored (hosts add
                                      their LoRA and extra keys from it); else 0 */
    const uint32_t *first_blocks;  /* STORED: index of the first stored block in the request */
    uint32_t block_size;           /* tokens per block */
    uint32_t overflowed;           /* 1 if the queue filled: the events after these were lost
                                      (the host's view of the cache is incomplete) */
    uint64_t num_dropped;          /* events lost since the previous drain */
} tdm_kv_event_batch;

TDM_API int tdm_kv_event_batch_init(tdm_kv_event_batch *b);

/* Drain the KV events recorded since the previous call into *out (up to out->struct_size);
 * the queue starts empty again. Call it after each step (vLLM publishes once per step).
 * Allocates nothing: the queue is preallocated when events are enabled. With events
 * disabled, returns an empty batch. Not thread-safe (like every call on the handle).
 * Errors: TDM_E_INVAL (s NULL, out NULL or too small). */
TDM_API int tdm_sched_kv_events(tdm_sched *s, tdm_kv_event_batch *out);

/* Convenience counts (vLLM's get_num_unfinished_requests / get_request_counts). */
TDM_API int tdm_sched_num_unfinished(const tdm_sched *s, uint32_t *n);

/* ---- Step-cost estimate (for the TBT-sized budget in DECODE_FIRST mode) ---- */

/* The shape of a prospective step. */
typedef struct tdm_step_shape {
    uint32_t struct_size;
    uint32_t num_prefill_tokens;     /* prompt tokens computed this step */
    uint32_t num_prefill_reqs;
    uint32_t num_decode_reqs;        /* requests computing output tokens (1 + drafts each) */
    uint32_t num_decode_tokens;
    uint64_t decode_context_tokens;  /* sum of the decode requests' context lengths */
    uint64_t prefill_attn_work;      /* sum over prefill chunks of chunk*(context + chunk/2) */
} tdm_step_shape;

#define TDM_COST_MODEL_VERSION 1
/* A step-cost estimator the host or simulator supplies: estimate() returns the predicted
 * step time in seconds. Append-only; version first. */
typedef struct tdm_cost_model {
    uint32_t version;                /* TDM_COST_MODEL_VERSION */
    void *ctx;
    double (*estimate)(void *ctx, const tdm_step_shape *shape);
} tdm_cost_model;

/* Install (or with NULL, remove) a cost-model callback; without one, the linear model of the
 * "cost_model" JSON key is used. The table is copied; ctx must outlive s. */
TDM_API int tdm_sched_set_cost_model(tdm_sched *s, const tdm_cost_model *cm);

/* ---- Policies ---- */

/* What a policy sees of a request. */
typedef struct tdm_request_view {
    uint32_t struct_size;
    uint32_t state;                  /* tdm_req_state */
    uint64_t id;
    int32_t priority;
    uint32_t tenant;
    double arrival_time;
    double ttft_slo;
    double tpot_slo;
    uint32_t num_prompt_tokens;
    uint32_t num_output_tokens;
    uint32_t num_computed_tokens;
    uint32_t num_preemptions;
    uint32_t max_tokens;
    uint32_t reserved0;
    uint64_t admit_seq;              /* order of (re)admission to running */
} tdm_request_view;

#define TDM_POLICY_VERSION 1
/* A scheduling policy: the order of the waiting queue and the preemption victim. Append-only
 * vtable, version first; optional methods may be NULL. A policy must be a strict weak
 * ordering that does not change while a request waits (it is used as a heap key). */
typedef struct tdm_policy {
    uint32_t version;                /* TDM_POLICY_VERSION */
    const char *name;                /* shown in stats and A/B tables; copied */
    void *ctx;
    /* < 0 when a should be admitted before b, > 0 after, 0 if equal (then arrival order). */
    int (*compare)(void *ctx, const tdm_request_view *a, const tdm_request_view *b);
    /* Optional: the index in running[0..n) of the request to preempt. NULL: the request that
     * compare() ranks last (ties: the most recently admitted). */
    uint32_t (*pick_victim)(void *ctx, const tdm_request_view *const *running, uint32_t n);
    /* Optional: called when the scheduler drops the policy. */
    void (*destroy)(void *ctx);
} tdm_policy;

/* Install a custom policy (the table is copied; destroy(ctx) is called when replaced or on
 * tdm_sched_destroy). Only while the waiting queue is empty (TDM_E_STATE otherwise).
 * Errors: TDM_E_INVAL (compare NULL), TDM_E_VERSION. */
TDM_API int tdm_sched_set_policy(tdm_sched *s, const tdm_policy *p);

/* The plug-in entry point a policy shared object exports: it fills *out (version first). */
typedef int (*tdm_policy_entry_fn)(tdm_policy *out, uint32_t abi_version);

/* Load a policy from a shared object: dlopen(path), dlsym(symbol, default
 * "tdm_policy_entry"), call it and install the policy as tdm_sched_set_policy() does.
 * Errors: TDM_E_PLUGIN (message from dlerror or the entry point), TDM_E_VERSION. */
TDM_API int tdm_sched_load_policy(tdm_sched *s, const char *path, const char *symbol);

#ifdef __cplusplus
}
#endif

#include "tandem_kernels.h"
#include "tandem_kvx.h"

#endif /* TANDEM_H */
