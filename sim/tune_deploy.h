/*
 * tune_deploy.h -- the deployment search of `tandem tune --gpus N` (sim/tune_deploy.c): for a
 * GPU budget and an SLO pair, which deployment serves the most: colocated (aggregated)
 * replicas of one TP degree, or disaggregated xPyD pools (x prefill instances of TP p, y
 * decode instances of TP d), and each pool's batch limits (max_num_seqs,
 * max_num_batched_tokens). aiconfigurator's `cli default` answers the same question with a
 * static model of each worker; here every candidate runs through the real scheduler in the
 * simulator, queueing included, and is scored by its goodput (the highest arrival rate at
 * which the target share of requests meets both SLOs, tdm_sim_goodput) per GPU.
 *
 * Enumeration: every TP degree of the list that divides the model's heads; colocated: as many
 * replicas as the budget holds; disaggregated: every (x, p, y, d) with x*p + y*d <= budget
 * that leaves fewer GPUs over than the smaller pool's TP (no further instance of either pool
 * fits). A pool whose weights, activations and one longest request do not fit its GPUs'
 * memory (vLLM's accounting, tdm_sim_cost_num_blocks) or whose scheduler config the library
 * refuses is infeasible: listed with the reason, never simulated.
 *
 * Search: every feasible topology at the base's batch limits; then, for the best `refine`
 * topologies, a pattern search over the two limit axes (colocated: max_num_seqs and
 * max_num_batched_tokens of the pool; disaggregated: the decode pool's max_num_seqs and the
 * prefill pool's max_num_batched_tokens), moving to the best neighbour while one improves,
 * within `budget` evaluations. Every evaluation is deterministic, so the result does not
 * depend on the number of worker processes.
 */
#ifndef TANDEM_SIM_TUNE_DEPLOY_H
#define TANDEM_SIM_TUNE_DEPLOY_H

#include "sim.h"

#define TDM_SIM_DEPLOY_MAXTP 8    /* TP degrees in the list */
#define TDM_SIM_DEPLOY_MAXV 16    /* values of a batch-limit axis */

typedef struct tdm_sim_deploy_space {
    uint32_t gpus;                              /* the budget (>= 1) */
    uint32_t tp[TDM_SIM_DEPLOY_MAXTP];          /* TP degrees a pool may have */
    int ntp;
    int agg, disagg;                            /* serving modes searched (1 = yes) */
    uint32_t seqs[TDM_SIM_DEPLOY_MAXV];         /* max_num_seqs values, ascending */
    int nseqs;
    uint32_t tokens[TDM_SIM_DEPLOY_MAXV];       /* max_num_batched_tokens values, ascending */
    int ntokens;
} tdm_sim_deploy_space;

/* One candidate deployment. Colocated: pool 0 only (n[0] replicas of TP tp[0]); the axes
 * is (index into seqs) and it (index into tokens) set pool 0's limits. Disaggregated: pool 0
 * prefill, pool 1 decode; is sets the decode pool's max_num_seqs, it the prefill pool's
 * max_num_batched_tokens; the other limit of each pool is the base's. */
typedef struct tdm_sim_deploy {
    int disagg;
    uint32_t n[2], tp[2];
    int is, it;
} tdm_sim_deploy;

typedef struct tdm_sim_deploy_point {
    tdm_sim_deploy d;
    uint32_t gpus;               /* GPUs it uses (<= the budget) */
    int phase;                   /* 0: topology at the base limits, 1: limit refinement */
    int infeasible;              /* not simulated: why says what does not fit or is refused */
    int ok;                      /* evaluated (0 with infeasible = 0: the run failed: why) */
    double goodput_req_s;        /* 0 when no rate meets the target (best_attainment says how
                                    far off) */
    double per_gpu;              /* goodput_req_s / gpus: the ranking */
    double scale;                /* the rate scale of the goodput */
    double best_attainment;
    /* one run at the goodput rate (or, when goodput is 0, at the best attainment's rate) */
    double ttft_p50, ttft_p90, ttft_p99, tpot_p50, tpot_p90, tpot_p99;   /* seconds */
    double attainment, out_tok_s, out_tok_s_per_gpu, req_s;   /* measured over the run's
                                    window (its start and drain included) */
    double goodput_tok_s_per_gpu; /* goodput x the trace's mean output length / gpus: the
                                    output rate served in steady state (aiconfigurator's
                                    tokens/s/gpu) */
    int runs;
    char label[96];
    char why[200];
} tdm_sim_deploy_point;

typedef struct tdm_sim_deploy_opts {
    int budget;                  /* evaluations (simulated points; infeasible ones are free) */
    int refine;                  /* topologies whose limits are refined (0 = none) */
    int jobs;                    /* worker processes (1 = in this process) */
    FILE *progress;              /* one line per evaluation (NULL = quiet) */
} tdm_sim_deploy_opts;

typedef struct tdm_sim_deploy_result {
    tdm_sim_deploy_point *pts;   /* topologies first (enumeration order), then refinements */
    size_t n;
    size_t best;                 /* the ok point of the highest per_gpu (first among equals) */
    int have_best;               /* 0: nothing feasible met the target at any rate, or nothing
                                    was feasible */
    int evaluated;
    uint64_t runs;
    double wall_s;
} tdm_sim_deploy_result;

void tdm_sim_deploy_opts_init(tdm_sim_deploy_opts *o);
/* The default space for a budget: TP 1, 2, 4, 8 (those <= gpus), both modes, max_num_seqs
 * 16 .. 512, max_num_batched_tokens 1024 .. 16384. */
void tdm_sim_deploy_space_default(tdm_sim_deploy_space *s, uint32_t gpus);
/* "1,2,4" into a sorted, de-duplicated list of positive integers (at most max). */
int tdm_sim_deploy_parse_list(const char *what, const char *list, uint32_t *out, int max, int *n,
                              char *err, size_t errlen);
/* "agg", "disagg" or "agg,disagg" ("both", "auto"). */
int tdm_sim_deploy_parse_modes(const char *s, tdm_sim_deploy_space *sp, char *err, size_t errlen);

/* The topologies of the space, at limit indices (is, it), into out (malloc'ed; *n of them),
 * in a fixed order: colocated by TP, then disaggregated by (p, d, x). Topologies that cannot
 * exist (a TP above the budget, a TP that does not divide the model's heads) are not
 * enumerated; memory is checked by tdm_sim_deploy_check. */
int tdm_sim_deploy_enumerate(const tdm_sim_deploy_space *s, const tdm_sim_model *m, int is, int it,
                             tdm_sim_deploy **out, size_t *n, char *err, size_t errlen);
uint32_t tdm_sim_deploy_gpus(const tdm_sim_deploy *d);
void tdm_sim_deploy_label(const tdm_sim_deploy_space *s, const tdm_sim_deploy *d, char *out, size_t n);

/* The config document of a candidate (a wrapper JSON that `tandem sim --config` reads): the
 * base document (NULL: library defaults) with its deployment replaced by the candidate's,
 * the base's router, KV link and pool hardware kept. Malloc'ed text, NULL when out of
 * memory or the base is not a JSON object. */
char *tdm_sim_deploy_json(const char *base_json, const tdm_sim_deploy_space *s,
                          const tdm_sim_deploy *d, const char *name, const char *description);
/* The document of one engine of the candidate (pool 0 or 1): a colocated single-instance
 * wrapper with that pool's scheduler keys, for vLLM's --additional-config
 * '{"tandem": {"config": FILE}}' (one vLLM engine is one instance). */
char *tdm_sim_deploy_engine_json(const char *base_json, const tdm_sim_deploy_space *s,
                                 const tdm_sim_deploy *d, int pool, const char *description);
/* The base's max_num_seqs and max_num_batched_tokens (library defaults where it omits them),
 * added to the space's lists if absent; *is, *it their indices. */
int tdm_sim_deploy_base_limits(const char *base_json, tdm_sim_deploy_space *s, int *is, int *it,
                               char *err, size_t errlen);

/* Would this candidate run? 0 when every pool's weights, activations and one longest request
 * (max_len tokens: prompt + output; a prefill pool: prompt + 1 = prefill_len) fit its GPUs'
 * memory at mem_util and the library accepts its scheduler configs; -1 with the reason. */
int tdm_sim_deploy_check(const char *base_json, const tdm_sim_deploy_space *s,
                         const tdm_sim_deploy *d, const tdm_sim_model *m, const tdm_sim_hw *h,
                         double mem_util, uint32_t max_len, uint32_t prefill_len, char *why,
                         size_t whylen);

/* Search. The result owns pts. Fails (with a message) on bad arguments or when no topology
 * is feasible (the message lists each one and why). */
int tdm_sim_deploy_search(const tdm_sim_trace *t, const char *base_json, const tdm_sim_model *m,
                          const tdm_sim_hw *h, const tdm_sim_run_opts *ro,
                          tdm_sim_deploy_space *s, const tdm_sim_deploy_opts *o,
                          tdm_sim_deploy_result *res, char *err, size_t errlen);
void tdm_sim_deploy_result_free(tdm_sim_deploy_result *r);

/* Internal (tune_deploy*.c): tp shards the model's attention heads as vLLM requires (query
 * heads divide; KV heads divide or are replicated). */
int tdm_sim__deploy_tp_fits(const tdm_sim_model *m, uint32_t tp);

#endif
