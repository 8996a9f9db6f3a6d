/*
 * bench_host.h -- the tiny host the scheduler benchmarks (sched_bench, bench/ir/sched_ir)
 * drive the library with: per-request bookkeeping (prompt and output lengths, finished
 * flags), the output arrays of one step, and the fake model, which samples one token for
 * every scheduled request that reached the end of its known tokens. The benchmarks add their
 * own timing or counting around the library calls.
 */
#ifndef TANDEM_BENCH_HOST_H
#define TANDEM_BENCH_HOST_H

#include <stdint.h>

#include "tandem.h"

/* Print "PROG: WHAT failed: RC (the scheduler's message)" and exit(1). */
void bench_die(const char *prog, const char *what, int rc, const tdm_sched *s);

/* Run a library call; on failure call die(text of the call, status, s). */
#define BENCH_CHECK(die, call, s)                      \
    do {                                               \
        int rc_ = (call);                              \
        if (rc_ != TDM_OK) die(#call, rc_, (s));       \
    } while (0)

typedef struct bench_host {
    tdm_sched *s;
    uint32_t cap;            /* ids are 0..cap-1 */
    uint32_t *prompt_len;
    uint32_t *out_len;
    uint8_t *done;
    uint64_t *ids;           /* output arrays, sized for max_entries entries */
    uint32_t *offs;
    tdm_token *toks;
    uint32_t finished_since; /* requests finished since the caller last looked */
    double clock;            /* the host clock passed to step/update */
    int slo;                 /* requests get priorities, a 2 s TTFT SLO on odd ids, and
                                TDM_REQ_SLO_DEPRIORITIZE on ids with bit 1 set */
    double t_lib;            /* sched_bench: seconds spent in step + update */
    double t_step, t_update; /* the same, split */
    double t_add;            /* seconds spent in tdm_sched_add (prompt digests are made there) */
} bench_host;

/* Zero *h and allocate its arrays for ids 0..cap-1 and batches of max_entries; h->s = s.
 * Returns 0, or -1 when out of memory (then nothing is held). */
int bench_host_init(bench_host *h, tdm_sched *s, uint32_t cap, uint32_t max_entries);

/* Free the arrays (not the scheduler). */
void bench_host_free(bench_host *h);

/* Fill *d for request id with its prompt, max_tokens, arrival at h->clock and, with h->slo,
 * its priority, SLO and flags; remember its prompt length. */
void bench_host_desc(bench_host *h, tdm_request_desc *d, uint32_t id, const tdm_token *prompt, uint32_t n,
                     uint32_t max_tokens);

/* The fake model's output of batch b into *o (initialised here; o->now = h->clock + 0.01):
 * every entry, with one token, sample(ctx, id), for those that reached the end of their
 * known tokens. The arrays are h's. */
void bench_host_output(bench_host *h, const tdm_batch *b, tdm_token (*sample)(void *ctx, uint64_t id),
                       void *ctx, tdm_step_output *o);

/* Book an update's result: output lengths, and finished requests (h->finished_since). */
void bench_host_account(bench_host *h, const tdm_update_result *r);

#endif
