/*
 * tune.h -- the search behind `tandem tune` (sim/tune.c): the static scheduler parameters
 * (mode, token budget, TBT target, long-prefill threshold, sequence cap, partial prefills,
 * chunked prefill) searched for the best objective (goodput as `tandem ab --goodput`
 * measures it, SLO attainment, or output throughput) on one trace. The base config is
 * evaluated as it is; then a coarse grid over mode x token budget x TBT target; then a
 * pattern search (coordinate moves to the neighbouring values of every parameter around the
 * best point, moving to the best neighbour while one improves) until no neighbour improves
 * or the budget of evaluations is spent. Evaluations are deterministic, so the result does
 * not depend on the number of worker processes.
 */
#ifndef TANDEM_SIM_TUNE_H
#define TANDEM_SIM_TUNE_H

#include "sim.h"

#define TDM_SIM_TUNE_MAXV 16     /* values per parameter */
#define TDM_SIM_TUNE_MAXAXES 8   /* parameters */
#define TDM_SIM_TUNE_VLEN 24     /* characters of one value */

typedef enum tdm_sim_tune_objective {
    TDM_SIM_TUNE_GOODPUT = 0,    /* req/s: the highest rate with attainment >= target */
    TDM_SIM_TUNE_ATTAINMENT,     /* fraction of requests meeting both SLOs at the trace rate */
    TDM_SIM_TUNE_THROUGHPUT      /* output tok/s at the trace rate (or closed loop) */
} tdm_sim_tune_objective;

typedef struct tdm_sim_tune_axis {
    const char *key;             /* the scheduler JSON key (static string) */
    int kind;                    /* TDM_SIM_TUNE_{INT,NUM,BOOL,MODE} */
    char vals[TDM_SIM_TUNE_MAXV][TDM_SIM_TUNE_VLEN];
    int n;
    int start;                   /* index of the base's value (set by tdm_sim_tune_run) */
} tdm_sim_tune_axis;

enum { TDM_SIM_TUNE_INT = 0, TDM_SIM_TUNE_NUM, TDM_SIM_TUNE_BOOL, TDM_SIM_TUNE_MODE };

typedef struct tdm_sim_tune_space {
    tdm_sim_tune_axis ax[TDM_SIM_TUNE_MAXAXES];
    int n;
} tdm_sim_tune_space;

/* One evaluated point. idx[a] is the value index of axis a, or -1 where the parameter does
 * not apply (tbt_target_ms and max_num_partial_prefills outside decode_first) and the base's
 * value stands. */
typedef struct tdm_sim_tune_point {
    int idx[TDM_SIM_TUNE_MAXAXES];
    int is_base;                 /* the base config as given (all idx -1) */
    int ok;                      /* 0: refused, or the run failed (err says why) */
    int refused;                 /* the library refuses the config: not simulated, not counted */
    double value;                /* the objective (-1 when !ok) */
    double scale;                /* goodput: the rate scale found */
    int runs;                    /* simulations this evaluation took */
    int phase;                   /* 0 base, 1 grid, 2 refinement */
    char label[192];
    char err[160];
} tdm_sim_tune_point;

typedef struct tdm_sim_tune_opts {
    tdm_sim_tune_objective objective;
    int budget;                  /* evaluations, base included (>= 1); refused configs are
                                    recorded but not counted */
    int jobs;                    /* worker processes (1 = in this process) */
    FILE *progress;              /* one line per evaluation (NULL = quiet) */
} tdm_sim_tune_opts;

typedef struct tdm_sim_tune_result {
    tdm_sim_tune_point *pts;     /* in evaluation order; pts[0] is the base */
    size_t n;
    size_t best;                 /* index of the best ok point (the first among equals) */
    int evaluated;               /* points simulated (the budget's count: refused excluded) */
    uint64_t runs;               /* simulations in all */
    double wall_s;
} tdm_sim_tune_result;

void tdm_sim_tune_opts_init(tdm_sim_tune_opts *o);
/* The default space: mode vllm,decode_first,prefill_first; max_num_batched_tokens
 * 256..8192; tbt_target_ms 0,15,20,30,50,100; long_prefill_token_threshold 0..2048;
 * max_num_seqs 32..512; max_num_partial_prefills 0,1,2,4; enable_chunked_prefill. */
void tdm_sim_tune_space_default(tdm_sim_tune_space *s);
/* Replace (or pin, with one value) one parameter's values: "key=v1,v2,...". Errors name
 * the key or the value and list the known keys. */
int tdm_sim_tune_space_set(tdm_sim_tune_space *s, const char *spec, char *err, size_t errlen);
/* The space as "key=v1,v2 key=..." for the log. */
void tdm_sim_tune_space_print(FILE *f, const tdm_sim_tune_space *s);
const char *tdm_sim_tune_objective_name(tdm_sim_tune_objective o);
int tdm_sim_tune_objective_parse(const char *s, tdm_sim_tune_objective *o);

/* Search. base_json is the base config's text (a scheduler JSON or a wrapper; NULL = the
 * library defaults); m and h are the defaults of its pools. s->ax[].start is set from the
 * base (its value is added to an axis that lacks it). The result owns pts. */
int tdm_sim_tune_run(const tdm_sim_trace *t, const char *base_json, const tdm_sim_model *m,
                     const tdm_sim_hw *h, const tdm_sim_run_opts *ro, tdm_sim_tune_space *s,
                     const tdm_sim_tune_opts *o, tdm_sim_tune_result *res, char *err,
                     size_t errlen);
void tdm_sim_tune_result_free(tdm_sim_tune_result *r);
/* The config document of a point: the base document with the point's values set in its
 * scheduler objects, named name (NULL = the point's label). Malloc'ed JSON text (a wrapper
 * that `tandem sim --config` and `tandem ab` read), NULL when out of memory. */
char *tdm_sim_tune_point_json(const char *base_json, const tdm_sim_tune_space *s,
                              const tdm_sim_tune_point *p, const char *name,
                              const char *description);

/* Internal (tune.c and tune_space.c): the keys the space knows. */
typedef struct tdm_sim__tune_keydef {
    const char *key, *tag;       /* tag: the label's prefix */
    int kind;
    double lo;                   /* the smallest value */
    const char *defaults;        /* the default values */
    const char *libdef;          /* the library's default, the start when the base omits it */
    int df_only;                 /* 1: only means something in decode_first mode */
} tdm_sim__tune_keydef;
const tdm_sim__tune_keydef *tdm_sim__tune_key(const char *key);
int tdm_sim__tune_axis_of(const tdm_sim_tune_space *s, const char *key);
/* Validate and normalise one value into out (TDM_SIM_TUNE_VLEN bytes). */
int tdm_sim__tune_norm(const tdm_sim__tune_keydef *k, const char *v, char *out, char *err,
                       size_t errlen);
int tdm_sim__tune_value_eq(const tdm_sim_tune_axis *a, const char *x, const char *y);

#endif
