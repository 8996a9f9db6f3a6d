/*
 * sched_ir.c -- the scheduler's instruction-count benchmark (`make bench-ir`, driven by
 * scripts/bench-ir under valgrind's callgrind). Each run plays one fixed, deterministic
 * scenario (argv[1]) through the public API: a warm-up that is not measured, then measured
 * cycles whose library calls go through the ir_* functions below. Those are the only
 * functions callgrind collects (--toggle-collect=ir_*), so the count covers exactly the
 * library's work in the measured cycles: tdm_sched_step, tdm_sched_update, and where the
 * scenario has them tdm_sched_add (prompt digests are computed there) and tdm_sched_kv_events.
 * The host's own bookkeeping (the fake model) is not counted. No valgrind header or client
 * request is used: run natively, the program just plays the scenario.
 *
 * Scenarios:
 *   decode256, decode1024, decode4096   N running requests in steady decode
 *   mixed_fcfs     ~1024 running + 4000 waiting, shared prefixes, chunked prefills under a
 *                  token budget, finished requests replaced (sha256, FCFS)
 *   mixed_slo      the same under the slo_adaptive policy (TTFT 2 s, TPOT 50 ms)
 *   update_stops   mixed_fcfs with EOS, 8 stop ids and min_tokens on every request; about one
 *                  sampled token in 40 is a stop id, which finishes its request (a new one
 *                  replaces it): the update's stop checks and the finishing path
 *   prefix         128 prompts of 1024 tokens, 8 families sharing 960: add + step + update
 *   kv_events      mixed_fcfs with KV events on, drained after every step
 * The last line is machine-readable:
 *   sched_ir scenario=NAME steps=S req_steps=R blocks=B
 * (steps measured, scheduled request-steps in them, prompt blocks added in them).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/bench_host.h"
#include "tandem.h"

/* ---- the measured calls (callgrind collects these and what they call) ---- */

#define IR_FN static __attribute__((noinline, noclone, used))
IR_FN int ir_step(tdm_sched *s, double now, tdm_batch *b) { return tdm_sched_step(s, now, b); }
IR_FN int ir_update(tdm_sched *s, const tdm_step_output *o, tdm_update_result *r)
{
    return tdm_sched_update(s, o, r);
}
IR_FN int ir_add(tdm_sched *s, const tdm_request_desc *d) { return tdm_sched_add(s, d); }
IR_FN int ir_drain(tdm_sched *s, tdm_kv_event_batch *b) { return tdm_sched_kv_events(s, b); }

static void die(const char *what, int rc, const tdm_sched *s) { bench_die("sched_ir", what, rc, s); }

#define CHECK(call, s) BENCH_CHECK(die, call, s)

/* ---- the host (bench/common/bench_host.c), calling through ir_* while measuring ---- */

typedef struct host {
    bench_host b;
    int measuring;              /* calls go through ir_* */
    int stops;                  /* EOS, stop ids and min_tokens on the requests */
    int drain;                  /* KV events drained after each step */
    uint64_t rs;                /* xorshift state of the fake model and the workload */
    uint64_t steps, req_steps, blocks;
} host;

static uint64_t rnd(host *h)
{
    h->rs ^= h->rs << 13;
    h->rs ^= h->rs >> 7;
    h->rs ^= h->rs << 17;
    return h->rs;
}

static const tdm_token stop_ids[8] = { 7, 11, 13, 17, 19, 23, 29, 31 };

/* Keeps the scenario's flags (slo, stops, drain). */
static void host_init(host *h, tdm_sched *s, uint32_t cap, uint32_t max_entries)
{
    int slo = h->b.slo;
    if (bench_host_init(&h->b, s, cap, max_entries)) die("calloc", -2, NULL);
    h->b.slo = slo;
    h->rs = 88172645463325252ull;
}

static void host_free(host *h)
{
    bench_host_free(&h->b);
    tdm_sched_destroy(h->b.s);
}

static void host_add(host *h, uint32_t id, const tdm_token *prompt, uint32_t n, uint32_t max_tokens)
{
    tdm_request_desc d;
    bench_host_desc(&h->b, &d, id, prompt, n, max_tokens);
    if (h->stops) {
        d.eos_token_id = 2;
        d.stop_token_ids = stop_ids;
        d.num_stop_token_ids = 8;
        d.min_tokens = 4;
    }
    if (h->measuring) {
        CHECK(ir_add(h->b.s, &d), h->b.s);
        h->blocks += n / 16;
    } else {
        CHECK(tdm_sched_add(h->b.s, &d), h->b.s);
    }
}

/* The sampled token of a request that reached the end of its tokens. */
static tdm_token sample(void *ctx, uint64_t id)
{
    host *h = ctx;
    if (h->stops && rnd(h) % 40 == 0) return stop_ids[rnd(h) % 8];
    return (tdm_token)(100 + (id & 1023));
}

/* One cycle: step, (drain), fake outputs, update. */
static void host_cycle(host *h)
{
    tdm_sched *s = h->b.s;
    tdm_batch b;
    tdm_batch_init(&b);
    h->b.clock += 0.02;
    if (h->measuring) CHECK(ir_step(s, h->b.clock, &b), s);
    else CHECK(tdm_sched_step(s, h->b.clock, &b), s);
    if (h->drain) {
        tdm_kv_event_batch ev;
        tdm_kv_event_batch_init(&ev);
        if (h->measuring) CHECK(ir_drain(s, &ev), s);
        else CHECK(tdm_sched_kv_events(s, &ev), s);
    }
    tdm_step_output o;
    bench_host_output(&h->b, &b, sample, h, &o);
    tdm_update_result r;
    tdm_update_result_init(&r);
    if (h->measuring) {
        CHECK(ir_update(s, &o, &r), s);
        h->steps++;
        h->req_steps += b.num_reqs;
    } else {
        CHECK(tdm_sched_update(s, &o, &r), s);
    }
    bench_host_account(&h->b, &r);
}

static tdm_sched *make_sched(const char *json)
{
    tdm_sched *s = NULL;
    CHECK(tdm_sched_create(&s), NULL);
    CHECK(tdm_sched_configure(s, json), s);
    return s;
}

/* ---- scenarios ---- */

static void run_decode(host *h, uint32_t n)
{
    char json[512];
    snprintf(json, sizeof(json),
             "{\"max_num_seqs\": %u, \"max_num_batched_tokens\": %u, \"num_blocks\": %u,"
             " \"max_model_len\": 2048, \"block_size\": 16}", n, n * 32 < 8192 ? 8192 : n * 32, n * 28 + 64);
    host_init(h, make_sched(json), n, n);
    tdm_token prompt[32];
    for (uint32_t id = 0; id < n; id++) {
        for (int i = 0; i < 32; i++) prompt[i] = (tdm_token)(1000 + id * 37 + (uint32_t)i);
        host_add(h, id, prompt, 32, 1000);
    }
    for (int k = 0; k < 20; k++) host_cycle(h);
    h->measuring = 1;
    for (int k = 0; k < 10; k++) host_cycle(h);
}

/* A prompt of the mixed workload: half share one of 16 prefixes of 256 tokens. */
static uint32_t mixed_prompt(host *h, tdm_token *prompt)
{
    uint32_t fam = (uint32_t)(rnd(h) % 16), pre = (uint32_t)(rnd(h) % 2) ? 256 : 0;
    uint32_t n = pre + 16 + (uint32_t)(rnd(h) % 300);
    for (uint32_t i = 0; i < n; i++)
        prompt[i] = i < pre ? (tdm_token)(500 + fam * 1000 + i) : (tdm_token)(100000 + (rnd(h) % 50000));
    return n;
}

static void run_mixed(host *h, const char *extra, uint32_t warm, uint32_t cycles)
{
    const uint32_t initial = 1024 + 4000;
    const uint32_t cap = initial + 64 * (warm + cycles) + 4096;
    char json[640];
    snprintf(json, sizeof(json), "{\"max_num_seqs\": 1024, \"max_num_batched_tokens\": 8192,"
             " \"long_prefill_token_threshold\": 512, \"num_blocks\": 60000,"
             " \"max_model_len\": 4096, \"block_size\": 16, \"prefix_hash\": \"sha256\"%s}", extra);
    host_init(h, make_sched(json), cap, 1024);
    tdm_token prompt[600];
    uint32_t next = 0;
    for (; next < initial; next++) {
        uint32_t n = mixed_prompt(h, prompt);
        host_add(h, next, prompt, n, 16 + (uint32_t)(rnd(h) % 200));
    }
    for (uint32_t k = 0; k < warm + cycles; k++) {
        if (k == warm) h->measuring = 1;
        host_cycle(h);
        while (h->b.finished_since > 0 && next < cap) {
            uint32_t n = mixed_prompt(h, prompt);
            host_add(h, next++, prompt, n, 16 + (uint32_t)(rnd(h) % 200));
            h->b.finished_since--;
        }
    }
}

static void run_prefix(host *h)
{
    enum { NREQ = 128, LEN = 1024, SHARED = 960, FAMILIES = 8 };
    host_init(h, make_sched("{\"max_num_seqs\": 256, \"max_num_batched_tokens\": 65536,"
                            " \"num_blocks\": 40000, \"max_model_len\": 2048, \"block_size\": 16,"
                            " \"prefix_hash\": \"sha256\"}"), NREQ, 256);
    static tdm_token prompt[LEN];
    h->measuring = 1;
    for (uint32_t id = 0; id < NREQ; id++) {
        for (uint32_t i = 0; i < LEN; i++)
            prompt[i] = i < SHARED ? (tdm_token)(500 + (id % FAMILIES) * 4096 + i)
                                   : (tdm_token)(200000 + id * 64 + i);
        host_add(h, id, prompt, LEN, 1);
    }
    while (h->b.finished_since < NREQ) host_cycle(h);
}

int main(int argc, char **argv)
{
    const char *sc = argc > 1 ? argv[1] : "";
    host h;
    memset(&h, 0, sizeof(h));
    if (!strcmp(sc, "decode256")) run_decode(&h, 256);
    else if (!strcmp(sc, "decode1024")) run_decode(&h, 1024);
    else if (!strcmp(sc, "decode4096")) run_decode(&h, 4096);
    else if (!strcmp(sc, "mixed_fcfs")) run_mixed(&h, "", 150, 30);
    else if (!strcmp(sc, "mixed_slo")) {
        h.b.slo = 1;
        run_mixed(&h, ", \"policy\": \"slo_adaptive\", \"slo_ttft_ms\": 2000, \"slo_tpot_ms\": 50", 150, 30);
    } else if (!strcmp(sc, "update_stops")) {
        h.stops = 1;
        run_mixed(&h, "", 150, 30);
    } else if (!strcmp(sc, "kv_events")) {
        h.drain = 1;
        run_mixed(&h, ", \"enable_kv_events\": true, \"kv_events_capacity\": 65536", 150, 30);
    } else if (!strcmp(sc, "prefix")) run_prefix(&h);
    else {
        fprintf(stderr, "usage: sched_ir decode256|decode1024|decode4096|mixed_fcfs|mixed_slo|"
                        "update_stops|prefix|kv_events\n");
        return 2;
    }
    printf("sched_ir scenario=%s steps=%llu req_steps=%llu blocks=%llu\n", sc, (unsigned long long)h.steps,
           (unsigned long long)h.req_steps, (unsigned long long)h.blocks);
    host_free(&h);
    return 0;
}
