/*
 * fit.h -- the table cost model fitted to measured steps (sim/fit.c, `tandem fit`): a steps
 * CSV (the columns `tandem sim --steps-csv` and the vLLM adapter's recorder write) is read,
 * a step-time model linear in the table model's terms is fitted on most rows, written as a
 * table set (hw.json and its operator tables) that `tandem sim --hw` loads, and scored on
 * the rows held out of the fit through the table cost model itself.
 */
#ifndef TANDEM_SIM_FIT_H
#define TANDEM_SIM_FIT_H

#include <stddef.h>
#include <stdint.h>

#include "sim.h"

/* One measured step: its wall time and its shape (as sim/engine.c classifies a batch). */
typedef struct tdm_sim_fit_row {
    double dur_s;
    uint64_t prefill_tokens;
    uint32_t prefill_reqs, decode_reqs, emit_seqs;
    uint64_t decode_ctx;          /* sum of decode contexts */
    double prefill_attn;          /* sum of chunk * (context + chunk / 2) */
} tdm_sim_fit_row;

/* The fitted step time, in the table model's terms:
 *   step_us = overhead_us + token_us * T + seq_us * (emit_seqs + lm_shared * T)
 *             + ctx_ns / 1000 * decode_ctx + attn_ps / 1e6 * prefill_attn
 * with T = prefill tokens + decode requests. lm_shared is the number of decoder-layer GEMMs
 * (times the layer count) whose table row is the LM head's (same n and k): their time is
 * the LM head's function of their m, so that term is shared (0 for most models). */
typedef struct tdm_sim_fit {
    double overhead_us, token_us, seq_us, ctx_ns, attn_ps;
    double lm_shared;
    size_t n_rows, n_fit, n_held, n_trimmed;
    double fit_mape;              /* on the fitted rows (after trimming) */
    double held_mape, held_median_ape, held_p90_ape, held_bias; /* held-out rows, fractions;
                                                                    bias: mean signed error */
    double held_total_ratio;      /* held-out rows: sum of predicted / sum of measured times */
} tdm_sim_fit;

/* Read a steps CSV: a header naming at least duration_s, prefill_tokens, prefill_reqs,
 * decode_reqs and decode_context_tokens (emit_seqs and prefill_attn when present; without
 * them emit_seqs = prefill_reqs + decode_reqs and prefill_attn = tokens^2 / (2 requests));
 * rows with no tokens are skipped. *rows is malloc'ed (free it). Errors name the file, the
 * line and the column. */
int tdm_sim_fit_read_csv(const char *path, tdm_sim_fit_row **rows, size_t *n, char *err,
                         size_t errlen);

/* The same from a buffer (name: for messages). */
int tdm_sim_fit_parse_csv(const char *buf, size_t len, const char *name, tdm_sim_fit_row **rows,
                          size_t *n, char *err, size_t errlen);

/* Fit rows[0..n) except every holdout-th row (index % holdout == holdout - 1; holdout >= 2),
 * which are scored with tdm_sim_fit_predict. Non-negative coefficients of the mean step time
 * under multiplicative noise (squared error relative to the prediction, by iteratively
 * reweighted least squares). trim: rows of the fit whose error exceeds 5x the median (and
 * 10%) are dropped once and the fit repeated (a model of the undisturbed engine; without it
 * slow steps count, as they do in serving). m: the model whose table rows will be written
 * (for lm_shared). */
int tdm_sim_fit_rows(const tdm_sim_fit_row *rows, size_t n, unsigned holdout, int trim,
                     const tdm_sim_model *m, tdm_sim_fit *out, char *err, size_t errlen);

/* The fitted model's step time (seconds). */
double tdm_sim_fit_predict(const tdm_sim_fit *f, const tdm_sim_model *m, const tdm_sim_fit_row *r);

/* Write DIR/hw.json ("cost_model": "table") and DIR/{gemm,elementwise,attn_context,
 * attn_generation}.txt, whose lookups for model m give the fitted step time; DIR must exist. */
int tdm_sim_fit_write_tables(const tdm_sim_fit *f, const tdm_sim_model *m, const char *dir,
                             const char *source, char *err, size_t errlen);

/* The shape the simulator's cost model takes for a row. */
void tdm_sim_fit_shape(const tdm_sim_fit_row *r, tdm_sim_shape *sh);

#endif
