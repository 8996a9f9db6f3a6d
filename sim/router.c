/*
 * router.c -- which instance of a pool gets a request: round robin, least load (fewest
 * outstanding requests, then tokens), or KV-aware as Dynamo's router scores it: for each
 * instance, cost = overlap_weight * (prompt blocks it would have to prefill) + (blocks of
 * its active requests), lowest wins. Prefix overlap is read from an approximate per-instance
 * index of chained block hashes (XXH3-64 from libxxhash, seeded with the parent's hash;
 * an approximate routing index, not a KV-sharing decision) that the router fills as it routes.
 */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "engine.h"

int tdm_sim_blockset_init(tdm_sim_blockset *b, size_t expected)
{
    size_t cap = 1024;
    while (cap < expected * 2) cap *= 2;
    b->slots = calloc(cap, sizeof *b->slots);
    b->cap = b->slots ? cap : 0;
    b->used = 0;
    return b->slots ? 0 : -1;
}

void tdm_sim_blockset_free(tdm_sim_blockset *b)
{
    free(b->slots);
    memset(b, 0, sizeof *b);
}

static int bs_has(const tdm_sim_blockset *b, uint64_t h)
{
    if (!b->cap) return 0;
    size_t m = b->cap - 1, i = (size_t)h & m;
    while (b->slots[i]) {
        if (b->slots[i] == h) return 1;
        i = (i + 1) & m;
    }
    return 0;
}

static void bs_add(tdm_sim_blockset *b, uint64_t h)
{
    if (!b->cap) return;
    if (b->used * 10 >= b->cap * 7) {
        memset(b->slots, 0, b->cap * sizeof *b->slots);
        b->used = 0;
    }
    size_t m = b->cap - 1, i = (size_t)h & m;
    while (b->slots[i]) {
        if (b->slots[i] == h) return;
        i = (i + 1) & m;
    }
    b->slots[i] = h;
    b->used++;
}

static uint64_t block_hash(uint64_t parent, const tdm_token *t, uint32_t n)
{
    return XXH3_64bits_withSeed(t, (size_t)n * sizeof(*t), parent) | 1; /* never 0 (the empty slot) */
}

int tdm_sim_route(tdm_sim_inst *in, size_t first, size_t count, tdm_sim_router router,
                  double overlap_weight, uint32_t *rr, const tdm_token *toks, uint32_t ntok,
                  int learn)
{
    if (count == 1) {
        if (learn && router == TDM_SIM_ROUTER_KV_AWARE) goto learn_only;
        return (int)first;
    }
    if (router == TDM_SIM_ROUTER_ROUND_ROBIN) return (int)(first + (*rr)++ % count);
    size_t best = first;
    if (router == TDM_SIM_ROUTER_LEAST_LOAD || !toks) {
        for (size_t i = first + 1; i < first + count; i++)
            if (in[i].outstanding < in[best].outstanding ||
                (in[i].outstanding == in[best].outstanding &&
                 in[i].outstanding_tokens < in[best].outstanding_tokens))
                best = i;
        return (int)best;
    }
    {
        uint32_t bsz = in[first].block_size ? in[first].block_size : 16;
        uint32_t nblk = ntok / bsz, need = (ntok + bsz - 1) / bsz;
        double best_cost = 0;
        for (size_t i = first; i < first + count; i++) {
            uint32_t overlap = 0;
            uint64_t h = 0;
            for (uint32_t b = 0; b < nblk; b++) {
                h = block_hash(h, toks + (size_t)b * bsz, bsz);
                if (!bs_has(&in[i].blocks, h)) break;
                overlap++;
            }
            double active = (double)in[i].outstanding_tokens / bsz;
            double cost = overlap_weight * (double)(need - overlap) + active;
            if (i == first || cost < best_cost) {
                best_cost = cost;
                best = i;
            }
        }
    }
    first = best;
learn_only:
    if (learn) {
        uint32_t bsz = in[first].block_size ? in[first].block_size : 16;
        uint64_t h = 0;
        for (uint32_t b = 0; b < ntok / bsz; b++) {
            h = block_hash(h, toks + (size_t)b * bsz, bsz);
            bs_add(&in[first].blocks, h);
        }
    }
    return (int)first;
}
