/*
 * bench_host.c -- the benchmarks' tiny host (see bench_host.h): the failure exit, bookkeeping
 * arrays, request descriptors, the fake model's step output and the accounting of update results.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_host.h"

void bench_die(const char *prog, const char *what, int rc, const tdm_sched *s)
{
    fprintf(stderr, "%s: %s failed: %d (%s)\n", prog, what, rc, s ? tdm_sched_errmsg(s) : "");
    exit(1);
}

int bench_host_init(bench_host *h, tdm_sched *s, uint32_t cap, uint32_t max_entries)
{
    memset(h, 0, sizeof(*h));
    h->s = s;
    h->cap = cap;
    h->prompt_len = calloc(cap, sizeof(uint32_t));
    h->out_len = calloc(cap, sizeof(uint32_t));
    h->done = calloc(cap, 1);
    h->ids = calloc((size_t)max_entries + 1, sizeof(uint64_t));
    h->offs = calloc((size_t)max_entries + 2, sizeof(uint32_t));
    h->toks = calloc((size_t)max_entries + 1, sizeof(tdm_token));
    if (!h->prompt_len || !h->out_len || !h->done || !h->ids || !h->offs || !h->toks) {
        bench_host_free(h);
        return -1;
    }
    return 0;
}

void bench_host_free(bench_host *h)
{
    free(h->prompt_len);
    free(h->out_len);
    free(h->done);
    free(h->ids);
    free(h->offs);
    free(h->toks);
    h->prompt_len = h->out_len = h->offs = NULL;
    h->done = NULL;
    h->ids = NULL;
    h->toks = NULL;
}

void bench_host_desc(bench_host *h, tdm_request_desc *d, uint32_t id, const tdm_token *prompt, uint32_t n,
                     uint32_t max_tokens)
{
    tdm_request_desc_init(d);
    d->id = id;
    d->prompt = prompt;
    d->num_prompt_tokens = n;
    d->max_tokens = max_tokens;
    d->arrival_time = h->clock;
    if (h->slo) {
        d->priority = (int32_t)(id % 3);
        d->ttft_slo = (id & 1) ? 2.0 : 0.0;
        d->flags = (id & 2) ? TDM_REQ_SLO_DEPRIORITIZE : 0;
    }
    h->prompt_len[id] = n;
}

void bench_host_output(bench_host *h, const tdm_batch *b, tdm_token (*sample)(void *ctx, uint64_t id),
                       void *ctx, tdm_step_output *o)
{
    uint32_t nt = 0;
    for (uint32_t i = 0; i < b->num_reqs; i++) {
        uint64_t id = b->req_ids[i];
        h->ids[i] = id;
        h->offs[i] = nt;
        if ((uint64_t)b->num_computed[i] + b->num_tokens[i] >= (uint64_t)h->prompt_len[id] + h->out_len[id])
            h->toks[nt++] = sample(ctx, id);
    }
    h->offs[b->num_reqs] = nt;
    tdm_step_output_init(o);
    o->num_reqs = b->num_reqs;
    o->req_ids = h->ids;
    o->token_offsets = h->offs;
    o->tokens = h->toks;
    o->now = h->clock + 0.01;
}

void bench_host_account(bench_host *h, const tdm_update_result *r)
{
    for (uint32_t i = 0; i < r->num_reqs; i++) {
        uint64_t id = r->req_ids[i];
        h->out_len[id] += r->num_new_tokens[i];
        if (r->finish_reasons[i] != TDM_FINISH_NONE && !h->done[id]) {
            h->done[id] = 1;
            h->finished_since++;
        }
    }
}
