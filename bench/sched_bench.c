/*
 * sched_bench.c -- the scheduler benchmark (`make bench`). It times the full host cycle
 * against the scheduler: tdm_sched_step, the fake model output (one sampled token per
 * request that reached the end of its tokens), tdm_sched_update.
 *   decodeN  N running requests in steady-state decode: nanoseconds per running request per
 *            cycle (step + update calls), N = 256, 1024, 4096.
 *   mixed    about 1024 running plus 10,000 waiting, prompts sharing a few long prefixes
 *            (prefix hits), chunked prefills under a token budget, requests finishing and
 *            being replaced: microseconds per cycle.
 *   hash_ALGO  the block digest alone (sched/hash.c, the prefix_hash algorithm ALGO =
 *            sha256, xxh3_128): nanoseconds per 16-token block, chained as the scheduler does.
 *   prefix_ALGO  a prefix-heavy phase: 512 requests of 1024-token prompts (8 families sharing
 *            960 tokens) admitted and finished, max_tokens 1: nanoseconds per prompt block
 *            (hashing, prefix lookup, caching and scheduling together), and the same with
 *            prefix caching off (no hashing) as the baseline of that phase.
 *            SCHED_BENCH_POLICY=priority|slo|slo_adaptive runs it under that policy (the waiting
 *            queue a heap; TTFT 2 s and TPOT 50 ms SLOs, half the requests with a priority or
 *            flagged TDM_REQ_SLO_DEPRIORITIZE) instead of FCFS (with SCHED_BENCH_ONLY=mixed).
 *   steady_allocs  heap allocations during the timed decode cycles: the library's own count
 *            (tdm__alloc_count) plus every libc malloc/calloc/realloc of the process (counted
 *            by bench/common/alloc_count.c, linked into this benchmark only).
 * A baseline measured in the same run (touching 64 bytes per request, the least a scheduler
 * must do per request per step) is printed first. The last line is machine-readable.
 * Targets (printed, never enforced): decode <= 100 ns/req, mixed <= 100 us/step, 0 allocs.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc_count.h"
#include "common/bench_host.h"
#include "internal.h"
#include "tandem.h"
#include "../sched/hash.h"

#ifndef TDM_HAVE_SCHED_IMPL
#define TDM_HAVE_SCHED_IMPL 1
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, int rc, const tdm_sched *s) { bench_die("sched_bench", what, rc, s); }

#define CHECK(call, s) BENCH_CHECK(die, call, s)

/* ---- the host (bench/common/bench_host.c), timed around the library calls ---- */

typedef bench_host host;

static void host_init(host *h, tdm_sched *s, uint32_t cap, uint32_t max_entries)
{
    if (bench_host_init(h, s, cap, max_entries)) die("calloc", -2, NULL);
}

static void host_free(host *h) { bench_host_free(h); }

static void host_add(host *h, uint32_t id, const tdm_token *prompt, uint32_t n, uint32_t max_tokens)
{
    tdm_request_desc d;
    bench_host_desc(h, &d, id, prompt, n, max_tokens);
    double t0 = now_s();
    CHECK(tdm_sched_add(h->s, &d), h->s);
    h->t_add += now_s() - t0;
}

static tdm_token sample(void *ctx, uint64_t id)
{
    (void)ctx;
    return (tdm_token)(100 + (id & 1023));
}

/* One cycle: step, fake outputs, update. Returns the number of scheduled requests. */
static uint32_t host_cycle(host *h)
{
    tdm_batch b;
    tdm_batch_init(&b);
    h->clock += 0.02;
    double t0 = now_s();
    CHECK(tdm_sched_step(h->s, h->clock, &b), h->s);
    double t1 = now_s();
    tdm_step_output o;
    bench_host_output(h, &b, sample, NULL, &o);
    tdm_update_result r;
    tdm_update_result_init(&r);
    double t2 = now_s();
    CHECK(tdm_sched_update(h->s, &o, &r), h->s);
    double t3 = now_s();
    h->t_lib += (t1 - t0) + (t3 - t2);
    h->t_step += t1 - t0;
    h->t_update += t3 - t2;
    bench_host_account(h, &r);
    return b.num_reqs;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of n values (sorted in place): robust to other processes on a shared machine. */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

enum { CHUNKS = 9 };

static tdm_sched *make_sched(const char *json)
{
    tdm_sched *s = NULL;
    CHECK(tdm_sched_create(&s), NULL);
    CHECK(tdm_sched_configure(s, json), s);
    return s;
}

/* ---- baseline: touch 64 bytes per request ---- */

static double baseline_ns_per_req(uint32_t n, int cycles)
{
    typedef struct rec {
        uint64_t id;
        uint32_t a, b, c, d;
        uint64_t pad[5];
    } rec;
    rec *v = calloc(n, sizeof(rec));
    if (!v) die("calloc", -2, NULL);
    volatile uint64_t sink = 0;
    double t0 = now_s();
    for (int k = 0; k < cycles; k++)
        for (uint32_t i = 0; i < n; i++) {
            v[i].a += 1;
            v[i].b = v[i].a + v[i].c;
            sink += v[i].b;
        }
    double t = now_s() - t0;
    free(v);
    (void)sink;
    return t * 1e9 / ((double)cycles * n);
}

/* ---- decodeN ---- */

static double bench_decode(uint32_t n, uint64_t *allocs)
{
    char json[512];
    snprintf(json, sizeof(json),
             "{\"max_num_seqs\": %u, \"max_num_batched_tokens\": %u, \"num_blocks\": %u,"
             " \"max_model_len\": 2048, \"block_size\": 16}", n, n * 32 < 8192 ? 8192 : n * 32, n * 28 + 64);
    tdm_sched *s = make_sched(json);
    host h;
    host_init(&h, s, n, n);
    tdm_token prompt[32];
    for (uint32_t id = 0; id < n; id++) {
        for (int i = 0; i < 32; i++) prompt[i] = (tdm_token)(1000 + id * 37 + (uint32_t)i);
        host_add(&h, id, prompt, 32, 1000);
    }
    for (int k = 0; k < 20; k++) host_cycle(&h); /* admit all, reach steady decode */
    const int cycles = 270;
    double per[CHUNKS];
    uint64_t a0 = tdm__alloc_count(), l0 = tdm_bench_libc_allocs();
    uint64_t sched_reqs = 0;
    h.t_step = h.t_update = 0;
    for (int c = 0; c < CHUNKS; c++) {
        h.t_lib = 0;
        uint64_t reqs = 0;
        for (int k = 0; k < cycles / CHUNKS; k++) reqs += host_cycle(&h);
        per[c] = h.t_lib * 1e9 / (double)(reqs ? reqs : 1);
        sched_reqs += reqs;
    }
    uint64_t a1 = tdm__alloc_count(), l1 = tdm_bench_libc_allocs();
    if (sched_reqs != (uint64_t)cycles * n) {
        fprintf(stderr, "sched_bench: decode%u scheduled %llu of %llu request-steps\n", n,
                (unsigned long long)sched_reqs, (unsigned long long)cycles * n);
    }
    *allocs = tdm_bench_libc_counting() ? (l1 - l0) : (a1 - a0);
    if (a1 - a0 > *allocs) *allocs = a1 - a0;
    double ns = median(per, CHUNKS);
    printf("decode%-5u %8.1f ns/req/cycle  (median of %d runs of %d cycles [%.1f .. %.1f]; step %.0f%%;"
           " %u running, %llu tdm allocs, %llu libc allocs)\n", n, ns, CHUNKS, cycles / CHUNKS, per[0],
           per[CHUNKS - 1], 100.0 * h.t_step / (h.t_step + h.t_update), n,
           (unsigned long long)(a1 - a0), (unsigned long long)(l1 - l0));
    host_free(&h);
    tdm_sched_destroy(s);
    return ns;
}

/* ---- mixed ---- */

static double bench_mixed(const char *algo, double *add_out)
{
    const uint32_t running = 1024, waiting = 10000, cycles = 270, warm = 400;
    const uint32_t cap = running + waiting + 64 * (warm + cycles) + 4096;
    const char *policy = getenv("SCHED_BENCH_POLICY");
    char json[640];
    snprintf(json, sizeof(json), "{\"max_num_seqs\": 1024, \"max_num_batched_tokens\": 8192,"
             " \"long_prefill_token_threshold\": 512, \"num_blocks\": 60000,"
             " \"max_model_len\": 4096, \"block_size\": 16, \"prefix_hash\": \"%s\"%s%s%s}", algo,
             policy ? ", \"slo_ttft_ms\": 2000, \"slo_tpot_ms\": 50, \"policy\": \"" : "",
             policy ? policy : "", policy ? "\"" : "");
    tdm_sched *s = make_sched(json);
    host h;
    host_init(&h, s, cap, running);
    h.slo = policy != NULL;
    enum { NPREFIX = 16, PREFIX_LEN = 256 };
    tdm_token prompt[PREFIX_LEN + 512];
    uint64_t rs = 12345;
    uint32_t next = 0;
#define RND() (rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17, rs)
    for (; next < running + waiting; next++) {
        uint32_t fam = (uint32_t)(RND() % NPREFIX), pre = (uint32_t)(RND() % 2) ? PREFIX_LEN : 0;
        uint32_t n = pre + 16 + (uint32_t)(RND() % 300);
        for (uint32_t i = 0; i < n; i++)
            prompt[i] = i < pre ? (tdm_token)(500 + fam * 1000 + i) : (tdm_token)(100000 + (RND() % 50000));
        host_add(&h, next, prompt, n, 16 + (uint32_t)(RND() % 200));
    }
    uint64_t a_timed = 0;
    double per[CHUNKS];
    for (uint32_t k = 0; k < warm + cycles; k++) {
        if (k == warm) {
            a_timed = tdm__alloc_count();
            h.t_step = h.t_update = h.t_add = 0;
        }
        if (k >= warm && (k - warm) % (cycles / CHUNKS) == 0) h.t_lib = 0;
        host_cycle(&h);
        if (k >= warm && (k - warm + 1) % (cycles / CHUNKS) == 0)
            per[(k - warm) / (cycles / CHUNKS)] = h.t_lib * 1e6 / (cycles / CHUNKS);
        /* keep the waiting queue topped up: one new request per finished one */
        while (h.finished_since > 0 && next < cap) {
            uint32_t fam = (uint32_t)(RND() % NPREFIX), pre = (uint32_t)(RND() % 2) ? PREFIX_LEN : 0;
            uint32_t n = pre + 16 + (uint32_t)(RND() % 300);
            for (uint32_t i = 0; i < n; i++)
                prompt[i] = i < pre ? (tdm_token)(500 + fam * 1000 + i) : (tdm_token)(100000 + (RND() % 50000));
            host_add(&h, next++, prompt, n, 16 + (uint32_t)(RND() % 200));
            h.finished_since--;
        }
    }
    a_timed = tdm__alloc_count() - a_timed;
    tdm_sched_stats st;
    tdm_sched_stats_init(&st);
    CHECK(tdm_sched_get_stats(s, &st), s);
    double us = median(per, CHUNKS);
    printf("mixed%-6s %8.1f us/cycle     (median of %d runs of %u cycles [%.1f .. %.1f]; step %.0f%%; now %u running, %u waiting; prefix hit rate %.2f;"
           " %llu preemptions; %llu tdm allocs in the timed cycles: adds and admissions; policy %s)\n",
           strcmp(algo, "sha256") ? "_xxh3" : "", us, CHUNKS, cycles / CHUNKS, per[0], per[CHUNKS - 1], 100.0 * h.t_step / (h.t_step + h.t_update),
           st.num_running, st.num_waiting, st.prefix_hit_rate, (unsigned long long)st.preemptions,
           (unsigned long long)a_timed, policy ? policy : "fcfs");
    /* The adds of the timed cycles (one per finished request: as many as the admissions of a
     * steady state) carry the prompt digests, which steps no longer compute. */
    double add_us = h.t_add * 1e6 / cycles;
    printf("mixed%-6s_add %4.1f us/cycle     (tdm_sched_add of the timed cycles, prompt digests included: step + update + add = %.1f us)\n",
           strcmp(algo, "sha256") ? "_xxh3" : "", add_us, us + add_us);
    if (add_out) *add_out = add_us;
    host_free(&h);
    tdm_sched_destroy(s);
    return us;
#undef RND
}

/* ---- the block digest alone, and a prefix-heavy phase ---- */

static double bench_hash(int algo, const char *name)
{
    enum { N = 200000, BS = 16 };
    tdm__hasher hs;
    if (tdm__hasher_init(&hs) || tdm__hasher_reserve(&hs, BS)) die("tdm__hasher_init", -1, NULL);
    tdm_token toks[BS * 64];
    for (uint32_t i = 0; i < BS * 64; i++) toks[i] = (tdm_token)(1000 + i * 7);
    tdm__digest d[2];
    double per[CHUNKS];
    for (int c = 0; c < CHUNKS; c++) {
        double t0 = now_s();
        for (uint32_t i = 0; i < N / CHUNKS; i++)
            if (tdm__hash_block(&hs, algo, i ? &d[(i - 1) & 1] : NULL, toks + (i % 64) * BS, BS, NULL, &d[i & 1]))
                die("tdm__hash_block", -1, NULL);
        per[c] = (now_s() - t0) * 1e9 / (N / CHUNKS);
    }
    double ns = median(per, CHUNKS);
    printf("hash_%-8s %6.1f ns/block     (16 tokens, chained; median of %d runs of %d blocks [%.1f .. %.1f]%s)\n",
           name, ns, CHUNKS, N / CHUNKS, per[0], per[CHUNKS - 1],
           algo == TDM_PREFIX_HASH_SHA256 ? "; libcrypto SHA256_*" : "; libxxhash");
    /* The same through the memo of prompt digests (tdm_sched_add's path): every block new (a
     * miss: the memo's cost on prompts that share nothing), then 64 blocks over and over (hits). */
    double miss[CHUNKS], hit[CHUNKS];
    for (int c = 0; c < CHUNKS && algo == TDM_PREFIX_HASH_SHA256; c++) { /* XXH3: no memo */
        double t0 = now_s();
        for (uint32_t i = 0; i < N / CHUNKS; i++) {
            toks[(i % 64) * BS] = (tdm_token)(c * N + i); /* a new block every time */
            if (tdm__hash_block_memo(&hs, algo, i ? &d[(i - 1) & 1] : NULL, toks + (i % 64) * BS, BS, NULL, &d[i & 1]))
                die("tdm__hash_block_memo", -1, NULL);
        }
        double t1 = now_s();
        for (uint32_t i = 0; i < N / CHUNKS; i++)
            if (tdm__hash_block_memo(&hs, algo, i % 64 ? &d[(i - 1) & 1] : NULL, toks + (i % 64) * BS, BS, NULL, &d[i & 1]))
                die("tdm__hash_block_memo", -1, NULL);
        double t2 = now_s();
        miss[c] = (t1 - t0) * 1e9 / (N / CHUNKS);
        hit[c] = (t2 - t1) * 1e9 / (N / CHUNKS);
    }
    if (algo == TDM_PREFIX_HASH_SHA256)
        printf("hash_%-8s memo: new block %6.1f ns, remembered block %6.1f ns (tdm_sched_add's memo of prompt"
               " digests; medians of %d runs)\n", name, median(miss, CHUNKS), median(hit, CHUNKS), CHUNKS);
    tdm__hasher_free(&hs);
    return ns;
}

/* 512 requests of 1024 tokens, 8 families sharing their first 960: ns per prompt block. */
static double bench_prefix(const char *algo, int caching)
{
    enum { NREQ = 512, LEN = 1024, SHARED = 960, FAMILIES = 8 };
    char json[512];
    snprintf(json, sizeof(json), "{\"max_num_seqs\": 256, \"max_num_batched_tokens\": 65536,"
             " \"num_blocks\": 40000, \"max_model_len\": 2048, \"block_size\": 16,"
             " \"enable_prefix_caching\": %s, \"prefix_hash\": \"%s\"}", caching ? "true" : "false", algo);
    double per[CHUNKS];
    for (int c = 0; c < CHUNKS; c++) {
        tdm_sched *s = make_sched(json);
        host h;
        host_init(&h, s, NREQ, 256);
        tdm_token prompt[LEN];
        const uint32_t per_run = NREQ;
        h.t_add = 0;
        for (uint32_t id = 0; id < per_run; id++) {
            for (uint32_t i = 0; i < LEN; i++)
                prompt[i] = i < SHARED ? (tdm_token)(500 + (id % FAMILIES) * 4096 + i)
                                       : (tdm_token)(200000 + id * 64 + i);
            host_add(&h, id, prompt, LEN, 1);
        }
        h.t_lib = 0;
        while (h.finished_since < per_run) host_cycle(&h);
        per[c] = (h.t_lib + h.t_add) * 1e9 / ((double)per_run * (LEN / 16));
        host_free(&h);
        tdm_sched_destroy(s);
    }
    double ns = median(per, CHUNKS);
    printf("prefix_%-6s %6.1f ns/block     (%s; 512 prompts of 64 blocks, 8 families sharing 60;"
           " add + step + update per prompt block, median of %d runs [%.1f .. %.1f])\n",
           caching ? algo : "off", ns, caching ? "prefix caching on" : "prefix caching off: no hashing, the baseline",
           CHUNKS, per[0], per[CHUNKS - 1]);
    return ns;
}

int main(void)
{
#if !TDM_HAVE_SCHED_IMPL
    printf("sched_bench: the scheduler implementation (sched/*.c) is not built yet: nothing to measure\n");
    return 0;
#else
    printf("baseline    %8.1f ns/req/cycle  (touching 64 B per request, 4096 requests)\n",
           baseline_ns_per_req(4096, 2000));
    uint64_t al256, al1024, al4096;
    /* Profile one part: "mixed" (SCHED_BENCH_HASH picks its prefix_hash), "hash", "prefix",
     * "prefix_off", "prefix_sha256", "prefix_xxh3_128" (e.g. under valgrind --tool=callgrind). */
    const char *only = getenv("SCHED_BENCH_ONLY");
    if (only && !strcmp(only, "mixed")) {
        bench_mixed(getenv("SCHED_BENCH_HASH") ? getenv("SCHED_BENCH_HASH") : "sha256", NULL);
        return 0;
    }
    if (only && !strncmp(only, "prefix_", 7)) {
        bench_prefix(strcmp(only, "prefix_off") ? only + 7 : "sha256", strcmp(only, "prefix_off") != 0);
        return 0;
    }
    double h_sha = bench_hash(TDM_PREFIX_HASH_SHA256, "sha256");
    double h_xxh = bench_hash(TDM_PREFIX_HASH_XXH3_128, "xxh3_128");
    if (only && !strcmp(only, "hash")) return 0;
    double p_off = bench_prefix("sha256", 0);
    double p_sha = bench_prefix("sha256", 1);
    double p_xxh = bench_prefix("xxh3_128", 1);
    if (only && !strcmp(only, "prefix")) return 0;
    uint64_t libc_before = tdm_bench_libc_allocs();
    double d256 = bench_decode(256, &al256);
    double d1024 = bench_decode(1024, &al1024);
    double d4096 = bench_decode(4096, &al4096);
    double add_sha = 0, add_xxh = 0;
    double mixed = bench_mixed("sha256", &add_sha);
    double mixed_xxh = bench_mixed("xxh3_128", &add_xxh);
    printf("libc allocations counted over the whole run: %llu (the counter works)\n",
           (unsigned long long)(tdm_bench_libc_allocs() - libc_before));
    printf("targets: decode <= 100 ns/req, mixed <= 100 us/step, steady_allocs 0%s\n",
           tdm_bench_libc_counting() ? "" : " (libc allocations not counted in this build)");
    printf("sched_bench decode256_ns_per_req=%.1f decode1024_ns_per_req=%.1f decode4096_ns_per_req=%.1f"
           " mixed_us_per_step=%.1f steady_allocs=%llu mixed_xxh3_us_per_step=%.1f"
           " hash_sha256_ns_per_block=%.1f hash_xxh3_128_ns_per_block=%.1f prefix_off_ns_per_block=%.1f"
           " prefix_sha256_ns_per_block=%.1f prefix_xxh3_128_ns_per_block=%.1f"
           " mixed_add_us_per_step=%.1f mixed_xxh3_add_us_per_step=%.1f\n",
           d256, d1024, d4096, mixed, (unsigned long long)(al256 + al1024 + al4096), mixed_xxh,
           h_sha, h_xxh, p_off, p_sha, p_xxh, add_sha, add_xxh);
    return 0;
#endif
}
