/*
 * engine.h -- internals shared by engine.c (the event loop), router.c (request routing
 * and the KV-aware router's per-instance block index) and steptrace.c (per-step traces).
 * Not used outside sim/.
 */
#ifndef TANDEM_SIM_ENGINE_H
#define TANDEM_SIM_ENGINE_H

#include "sim.h"

/* An approximate index of the prefix blocks an instance holds (open addressing; cleared
 * when it fills, a coarse stand-in for the evictions Dynamo learns from KV events). */
typedef struct tdm_sim_blockset {
    uint64_t *slots;
    size_t cap, used;
} tdm_sim_blockset;

typedef struct tdm_sim_inst {
    tdm_sched *s;
    tdm_sim_cost cost;
    tdm_cost_model cm;
    int role;                 /* TDM_ROLE_* */
    int pool;
    int busy;
    double step_start, step_end;
    tdm_batch batch;
    /* step-output scratch (grown only when a batch is larger than ever before) */
    uint64_t *out_ids;
    uint32_t *out_offs;
    tdm_token *out_toks;
    size_t out_cap;
    /* requests to add / remote-KV completions to report before the next step */
    uint64_t *pend_add, *pend_done;
    size_t n_add, cap_add, n_done, cap_done;
    uint64_t outstanding;     /* routed here and not finished */
    uint64_t outstanding_tokens;
    double link_free;         /* prefill side: when the outgoing KV link is free */
    uint32_t block_size;
    tdm_sim_blockset blocks;
    uint64_t steps, tokens, req_steps;
    double kv_sum, kv_max;
} tdm_sim_inst;

int tdm_sim_route(tdm_sim_inst *insts, size_t first, size_t count, tdm_sim_router router,
                  double overlap_weight, uint32_t *rr, const tdm_token *toks, uint32_t ntok,
                  int learn);
void tdm_sim_blockset_free(tdm_sim_blockset *b);
int tdm_sim_blockset_init(tdm_sim_blockset *b, size_t expected);

/* Per-step traces (steptrace.c): the CSV and Chrome trace files of tdm_sim_run_opts. */
void tdm_sim_steptrace_begin(const tdm_sim_run_opts *o, const char *config, const tdm_sim_inst *in,
                             size_t ninst);
void tdm_sim_steptrace_step(const tdm_sim_run_opts *o, const tdm_sim_inst *in, size_t idx,
                            double t, double dt, const tdm_sim_shape *sh, const tdm_batch *b);
void tdm_sim_steptrace_xfer(const tdm_sim_run_opts *o, size_t pre, size_t dec, uint64_t id,
                            double start, double end, double bytes);
void tdm_sim_steptrace_end(const tdm_sim_run_opts *o);

#endif
