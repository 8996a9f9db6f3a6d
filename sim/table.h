/*
 * table.h -- measured-operator tables for the table cost model (sim/table.c): one table per
 * operator (GEMM, context attention, generation attention, all-reduce, element-wise ops),
 * rows of (dtype, keys..., microseconds) read from the compact text format of
 * docs/cost_model.md, looked up by multilinear interpolation in log-log space between the
 * profiled points. A query outside the profiled range is extrapolated and flagged.
 * Depends on libc and libm only (the fuzz harness compiles it in).
 */
#ifndef TANDEM_SIM_TABLE_H
#define TANDEM_SIM_TABLE_H

#include <stddef.h>
#include <stdint.h>

typedef enum tdm_sim_op {
    TDM_SIM_OP_GEMM = 0,     /* keys n k m: y[m,n] = x[m,k] W[k,n], one kernel */
    TDM_SIM_OP_ATTN_CTX,     /* keys heads kv_heads head_dim batch isl: causal prefill, per layer */
    TDM_SIM_OP_ATTN_GEN,     /* keys heads kv_heads head_dim batch ctx: one decode token, per layer */
    TDM_SIM_OP_ALLREDUCE,    /* keys tp bytes: one all-reduce */
    TDM_SIM_OP_ELEMWISE,     /* keys width tokens: norms, activation, rope, adds of a layer;
                              * width = hidden + ffn/tp activation elements per token */
    TDM_SIM_OP_COUNT
} tdm_sim_op;

typedef enum tdm_sim_dtype {
    TDM_SIM_DT_BF16 = 0,
    TDM_SIM_DT_FP8 = 1
} tdm_sim_dtype;

#define TDM_SIM_TABLE_MAXDIM 5

typedef struct tdm_sim_table {
    tdm_sim_op op;
    int ndim;                 /* numeric keys of the op (TDM_SIM_TABLE_MAXDIM at most) */
    size_t n, cap;
    double *rows;             /* n rows of (dtype, keys in the op's order, us) */
    int sorted;
    double kmin[TDM_SIM_TABLE_MAXDIM], kmax[TDM_SIM_TABLE_MAXDIM]; /* profiled range (sorted) */
    char name[160];           /* file name or a label, for messages */
} tdm_sim_table;

/* The op's name in files ("gemm", "attn_context", ...) and its key names in lookup order. */
const char *tdm_sim_op_name(tdm_sim_op op);
int tdm_sim_op_from_name(const char *s, tdm_sim_op *op);
int tdm_sim_op_keys(tdm_sim_op op, const char *const **names);

void tdm_sim_table_init(tdm_sim_table *t, tdm_sim_op op, const char *name);
void tdm_sim_table_free(tdm_sim_table *t);
/* Append one row (keys in the op's order, each > 0; us > 0). -1 on bad values or memory. */
int tdm_sim_table_add(tdm_sim_table *t, tdm_sim_dtype dt, const double *keys, double us);
/* Sort the rows; -1 with "name: duplicate row ..." in err when two rows share dtype and keys. */
int tdm_sim_table_finish(tdm_sim_table *t, char *err, size_t errlen);
/* Sort the rows and replace rows sharing dtype and keys by one with their geometric-mean
 * time (for tables built from repeated measurements). -1 when the table is empty. */
int tdm_sim_table_merge(tdm_sim_table *t);
/* Parse the text format; errors "name:line: what". The table is empty on error. */
int tdm_sim_table_parse(const char *buf, size_t len, const char *name, tdm_sim_table *t,
                        char *err, size_t errlen);
int tdm_sim_table_load(const char *path, tdm_sim_table *t, char *err, size_t errlen);
/* Write the text format (the same one the reader takes). */
int tdm_sim_table_write(const tdm_sim_table *t, const char *path, const char *source,
                        char *err, size_t errlen);
/* Time in microseconds at keys (the op's order); *extrap is set to 1 when some key lay
 * outside the profiled range (or a dtype had to fall back to bf16), else left alone.
 * Returns -1 when the table has no row at all of a usable dtype. */
double tdm_sim_table_lookup(const tdm_sim_table *t, tdm_sim_dtype dt, const double *keys,
                            int *extrap);

/* The rows [*lo, *hi) whose dtype and first np keys equal dt and keys exactly; -1 when there
 * are none. tdm_sim_table_lookup_in() then interpolates over the remaining keys only (a
 * caller that asks the same prefix many times skips its searches). */
int tdm_sim_table_prefix(const tdm_sim_table *t, tdm_sim_dtype dt, const double *keys, int np,
                         size_t *lo, size_t *hi);
double tdm_sim_table_lookup_in(const tdm_sim_table *t, size_t lo, size_t hi, int np,
                               const double *keys, int *extrap);

#endif /* TANDEM_SIM_TABLE_H */
