/*
 * fit.c -- the table cost model fitted to measured steps (`tandem fit`, fit.h). A step's
 * time is modelled in the table model's own terms (sim/cost_table.c): a fixed overhead, a
 * per-token time of the decoder layers (T = prefill tokens + decode requests), the LM head
 * per sampling sequence, decode attention per context token and prefill attention per unit
 * of chunk * (context + chunk / 2). The five non-negative coefficients fit the mean step
 * time under multiplicative noise over the rows not held out: squared errors relative to the
 * prediction, by iteratively reweighted least squares, each round an exact NNLS (every subset
 * of the five terms solved by its normal equations, the best with no negative coefficient
 * wins); on request, timing outliers are dropped once and the fit repeated. The written table
 * set puts
 * each term into the operator the table model looks it up in: element-wise rows (per token
 * and layer), the LM head's GEMM rows (per sequence), generation and context attention rows
 * (per layer), step_overhead_us; the decoder-layer GEMM rows hold 1e-6 us (the per-token
 * time is all in the element-wise rows: a step-level fit cannot split it between kernels).
 * Every term is a power law in its keys, which the table's log-log interpolation reproduces
 * exactly between rows, and the grids reach 2^24 tokens.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "fit.h"

#define NF 5
#define GRID_TOKENS 24   /* powers of two 1 .. 2^24 */
#define GRID_BATCH 12  /* 1 .. 4096 sequences */
#define GRID_CTX 20    /* 1 .. 2^20 tokens of context (fewer when a row would pass 1e11 us) */
#define TINY_US 1e-6

/* ---- the CSV ---- */

enum { C_DUR, C_PT, C_PR, C_DR, C_DCTX, C_EMIT, C_ATTN, C_NCOL };
static const char *const COLS[C_NCOL] = {"duration_s", "prefill_tokens", "prefill_reqs",
                                         "decode_reqs", "decode_context_tokens", "emit_seqs",
                                         "prefill_attn"};

static void chomp(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = '\0';
}

static int parse_header(char *line, int idx[C_NCOL], const char *path, char *err, size_t errlen)
{
    for (int i = 0; i < C_NCOL; i++) idx[i] = -1;
    int col = 0;
    for (char *save = NULL, *tok = strtok_r(line, ",", &save); tok; tok = strtok_r(NULL, ",", &save), col++)
        for (int i = 0; i < C_NCOL; i++)
            if (!strcmp(tok, COLS[i])) idx[i] = col;
    for (int i = 0; i < C_EMIT; i++)
        if (idx[i] < 0) {
            snprintf(err, errlen, "%s:1: no column \"%s\" (a steps CSV of tandem sim --steps-csv "
                                  "or the vLLM adapter's steps_csv)", path, COLS[i]);
            return -1;
        }
    return 0;
}

static int num(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_stream(FILE *f, const char *path, tdm_sim_fit_row **rows, size_t *n,
                        char *err, size_t errlen);

int tdm_sim_fit_read_csv(const char *path, tdm_sim_fit_row **rows, size_t *n, char *err,
                         size_t errlen)
{
    *rows = NULL;
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    int rc = parse_stream(f, path, rows, n, err, errlen);
    fclose(f);
    return rc;
}

int tdm_sim_fit_parse_csv(const char *buf, size_t len, const char *name, tdm_sim_fit_row **rows,
                          size_t *n, char *err, size_t errlen)
{
    *rows = NULL;
    *n = 0;
    if (!len) {
        snprintf(err, errlen, "%s: empty file", name);
        return -1;
    }
    FILE *f = fmemopen((void *)buf, len, "r");
    if (!f) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = parse_stream(f, name, rows, n, err, errlen);
    fclose(f);
    return rc;
}

static int parse_stream(FILE *f, const char *path, tdm_sim_fit_row **rows, size_t *n,
                        char *err, size_t errlen)
{
    char *line = NULL;
    size_t cap = 0, nr = 0, rcap = 0;
    tdm_sim_fit_row *r = NULL;
    int idx[C_NCOL], rc = -1, maxcol = 0;
    if (getline(&line, &cap, f) < 0) {
        snprintf(err, errlen, "%s: empty file", path);
        goto fail;
    }
    chomp(line);
    if (parse_header(line, idx, path, err, errlen)) goto fail;
    for (int i = 0; i < C_NCOL; i++)
        if (idx[i] + 1 > maxcol) maxcol = idx[i] + 1;
    for (size_t ln = 2; getline(&line, &cap, f) >= 0; ln++) {
        chomp(line);
        if (!line[0]) continue;
        char *fld[64];
        int nf = tdm_sim__csv_fields(line, fld, 64);
        if (nf < maxcol) {
            snprintf(err, errlen, "%s:%zu: %d fields, the header names %d", path, ln, nf, maxcol);
            goto fail;
        }
        double v[C_NCOL] = {0};
        for (int i = 0; i < C_NCOL; i++) {
            if (idx[i] < 0) continue;
            double hi = i == C_DUR ? 3600.0 : 1e15;
            if (num(fld[idx[i]], 0, hi, &v[i])) {
                snprintf(err, errlen, "%s:%zu: column %s: bad value '%s'", path, ln, COLS[i],
                         fld[idx[i]]);
                goto fail;
            }
        }
        if (v[C_PT] + v[C_DR] <= 0) continue;   /* an empty step: nothing to time */
        if (!(v[C_DUR] > 0)) {
            snprintf(err, errlen, "%s:%zu: column duration_s: a step with tokens must take time",
                     path, ln);
            goto fail;
        }
        if (nr == rcap) {
            size_t nc = rcap ? 2 * rcap : 1024;
            tdm_sim_fit_row *nrw = realloc(r, nc * sizeof *r);
            if (!nrw) {
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
            r = nrw;
            rcap = nc;
        }
        tdm_sim_fit_row *w = &r[nr++];
        w->dur_s = v[C_DUR];
        w->prefill_tokens = (uint64_t)v[C_PT];
        w->prefill_reqs = (uint32_t)fmin(v[C_PR], 4294967295.0);
        w->decode_reqs = (uint32_t)fmin(v[C_DR], 4294967295.0);
        w->decode_ctx = (uint64_t)v[C_DCTX];
        w->emit_seqs = idx[C_EMIT] >= 0 ? (uint32_t)fmin(v[C_EMIT], 4294967295.0)
                                        : w->prefill_reqs + w->decode_reqs;
        w->prefill_attn = idx[C_ATTN] >= 0 ? v[C_ATTN]
                          : w->prefill_reqs ? v[C_PT] * v[C_PT] / (2.0 * v[C_PR]) : 0;
    }
    if (!nr) {
        snprintf(err, errlen, "%s: no step with tokens", path);
        goto fail;
    }
    *rows = r;
    *n = nr;
    r = NULL;
    rc = 0;
fail:
    free(line);
    free(r);
    return rc;
}

/* ---- the fit ---- */

/* The decoder-layer GEMM shapes (n, k) per rank and the LM head's, as cost_table.c. */
static void gemm_shapes(const tdm_sim_model *m, double nk[5][2])
{
    double tp = m->tp ? m->tp : 1, H = m->hidden, d = m->head_dim;
    double q = m->heads * d, kv = m->kv_heads * d, I = m->ffn;
    const double s[5][2] = {{(q + 2 * kv) / tp, H}, {H, q / tp},
                            {(m->gated ? 2 : 1) * I / tp, H}, {H, I / tp}, {m->vocab / tp, H}};
    memcpy(nk, s, sizeof s);
}

static double lm_shared_of(const tdm_sim_model *m)
{
    double nk[5][2];
    gemm_shapes(m, nk);
    int c = 0;
    for (int i = 0; i < 4; i++) c += nk[i][0] == nk[4][0] && nk[i][1] == nk[4][1];
    return (double)c * m->layers;
}

static void features(const tdm_sim_fit_row *r, double lm_shared, double x[NF])
{
    double T = (double)r->prefill_tokens + r->decode_reqs;
    x[0] = 1;
    x[1] = T;
    x[2] = r->emit_seqs + lm_shared * T;
    x[3] = (double)r->decode_ctx;
    x[4] = r->prefill_attn;
}

/* Solve the s x s system a c = b (row-major, destroyed) by elimination with partial
 * pivoting; -1 when singular. */
static int solve(double *a, double *b, int s, double *c)
{
    for (int i = 0; i < s; i++) {
        int p = i;
        for (int j = i + 1; j < s; j++)
            if (fabs(a[j * s + i]) > fabs(a[p * s + i])) p = j;
        if (!(fabs(a[p * s + i]) > 1e-12)) return -1;
        if (p != i) {
            for (int k = 0; k < s; k++) {
                double t = a[i * s + k];
                a[i * s + k] = a[p * s + k];
                a[p * s + k] = t;
            }
            double t = b[i];
            b[i] = b[p];
            b[p] = t;
        }
        for (int j = i + 1; j < s; j++) {
            double f = a[j * s + i] / a[i * s + i];
            for (int k = i; k < s; k++) a[j * s + k] -= f * a[i * s + k];
            b[j] -= f * b[i];
        }
    }
    for (int i = s - 1; i >= 0; i--) {
        double v = b[i];
        for (int k = i + 1; k < s; k++) v -= a[i * s + k] * c[k];
        c[i] = v / a[i * s + i];
    }
    return 0;
}

/* Non-negative weighted least squares of y_us over the rows with use[i] set, weights
 * 1/y^2 (relative error); coef in us per unit of each feature. */
static double predict_us(const double coef[NF], const tdm_sim_fit_row *r, double lm_shared);

/* The weight of a row: 1 / mu^2, mu the step time predicted by ref (the measured time when
 * ref is NULL or predicts nothing). */
static double weight(const tdm_sim_fit_row *r, const double *ref, double lm_shared)
{
    double mu = ref ? predict_us(ref, r, lm_shared) : 0;
    if (!(mu > 0)) mu = r->dur_s * 1e6;
    return 1.0 / (mu * mu);
}

static int nnls(const tdm_sim_fit_row *rows, size_t n, const unsigned char *use, double lm_shared,
                const double *ref, double coef[NF])
{
    /* the normal equations of all features, on columns scaled to unit RMS */
    double G[NF][NF] = {{0}}, g[NF] = {0}, sc[NF] = {0}, yy = 0;
    size_t cnt = 0;
    for (size_t i = 0; i < n; i++) {
        if (!use[i]) continue;
        double x[NF], w = weight(&rows[i], ref, lm_shared);
        features(&rows[i], lm_shared, x);
        for (int a = 0; a < NF; a++) sc[a] += x[a] * x[a] * w;
        cnt++;
    }
    if (!cnt) return -1;
    for (int a = 0; a < NF; a++) sc[a] = sc[a] > 0 ? sqrt(sc[a] / (double)cnt) : 0;
    for (size_t i = 0; i < n; i++) {
        if (!use[i]) continue;
        double x[NF], y = rows[i].dur_s * 1e6, w = weight(&rows[i], ref, lm_shared);
        features(&rows[i], lm_shared, x);
        for (int a = 0; a < NF; a++) {
            double xa = sc[a] > 0 ? x[a] / sc[a] : 0;
            g[a] += w * xa * y;
            for (int b = 0; b < NF; b++) G[a][b] += w * xa * (sc[b] > 0 ? x[b] / sc[b] : 0);
        }
        yy += w * y * y;
    }
    double best = INFINITY, bc[NF] = {0};
    for (unsigned mask = 1; mask < (1u << NF); mask++) {
        int id[NF], s = 0;
        for (int a = 0; a < NF; a++)
            if (mask >> a & 1) {
                if (sc[a] <= 0) goto next;
                id[s++] = a;
            }
        double A[NF * NF], b[NF], c[NF];
        for (int i = 0; i < s; i++) {
            b[i] = g[id[i]];
            for (int j = 0; j < s; j++) A[i * s + j] = G[id[i]][id[j]];
        }
        if (solve(A, b, s, c)) continue;
        for (int i = 0; i < s; i++)
            if (c[i] < 0) goto next;
        /* objective: sum w (y - x.c)^2 = yy - 2 c.g + c.G.c */
        double obj = yy;
        for (int i = 0; i < s; i++) {
            obj -= 2 * c[i] * g[id[i]];
            for (int j = 0; j < s; j++) obj += c[i] * G[id[i]][id[j]] * c[j];
        }
        if (obj < best) {
            best = obj;
            memset(bc, 0, sizeof bc);
            for (int i = 0; i < s; i++) bc[id[i]] = c[i];
        }
    next:;
    }
    if (!isfinite(best)) return -1;
    for (int a = 0; a < NF; a++) coef[a] = sc[a] > 0 ? bc[a] / sc[a] : 0;
    return 0;
}

static double predict_us(const double coef[NF], const tdm_sim_fit_row *r, double lm_shared)
{
    double x[NF], t = 0;
    features(r, lm_shared, x);
    for (int a = 0; a < NF; a++) t += coef[a] * x[a];
    return t;
}

/* The fit of the mean step time under multiplicative noise (a gamma GLM with the identity
 * link, by iteratively reweighted least squares): weights 1 / y^2 first, then 1 / mu^2 with
 * mu the current prediction, so that slow steps pull the fit up as much as fast ones pull
 * it down (1 / y^2 alone favours the fast ones: predictions biased low). */
static int fit_irls(const tdm_sim_fit_row *rows, size_t n, const unsigned char *use,
                    double lm_shared, double coef[NF])
{
    if (nnls(rows, n, use, lm_shared, NULL, coef)) return -1;
    for (int it = 0; it < 6; it++) {
        double ref[NF];
        memcpy(ref, coef, sizeof ref);
        if (nnls(rows, n, use, lm_shared, ref, coef)) return -1;
    }
    return 0;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double tdm_sim_fit_predict(const tdm_sim_fit *f, const tdm_sim_model *m, const tdm_sim_fit_row *r)
{
    (void)m;
    const double coef[NF] = {f->overhead_us, f->token_us, f->seq_us, f->ctx_ns * 1e-3,
                             f->attn_ps * 1e-6};
    return predict_us(coef, r, f->lm_shared) * 1e-6;
}

int tdm_sim_fit_rows(const tdm_sim_fit_row *rows, size_t n, unsigned holdout, int trim,
                     const tdm_sim_model *m, tdm_sim_fit *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (holdout < 2) {
        snprintf(err, errlen, "holdout must be >= 2 (every holdout-th row is held out)");
        return -1;
    }
    unsigned char *use = calloc(n ? n : 1, 1);
    double *ape = malloc((n ? n : 1) * sizeof *ape);
    int rc = -1;
    if (!use || !ape) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    double ls = lm_shared_of(m), coef[NF];
    size_t nfit = 0;
    for (size_t i = 0; i < n; i++) nfit += use[i] = i % holdout != holdout - 1;
    if (nfit < NF * 2) {
        snprintf(err, errlen, "%zu rows to fit: at least %d needed", nfit, NF * 2);
        goto fail;
    }
    if (fit_irls(rows, n, use, ls, coef)) {
        snprintf(err, errlen, "the fit failed (the rows do not determine the model)");
        goto fail;
    }
    if (trim) {
        /* drop the timing outliers of the fitted rows once, then fit again */
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (use[i]) ape[k++] = fabs(predict_us(coef, &rows[i], ls) / (rows[i].dur_s * 1e6) - 1);
        qsort(ape, k, sizeof *ape, cmp_dbl);
        double cut = fmax(5 * tdm_sim_percentile_sorted(ape, k, 0.5), 0.10);
        for (size_t i = 0; i < n; i++)
            if (use[i] && fabs(predict_us(coef, &rows[i], ls) / (rows[i].dur_s * 1e6) - 1) > cut) {
                use[i] = 0;
                out->n_trimmed++;
            }
        if (out->n_trimmed && fit_irls(rows, n, use, ls, coef)) {
            snprintf(err, errlen, "the fit failed after dropping %zu outliers", out->n_trimmed);
            goto fail;
        }
    }
    out->overhead_us = coef[0];
    out->token_us = coef[1];
    out->seq_us = coef[2];
    out->ctx_ns = coef[3] * 1e3;
    out->attn_ps = coef[4] * 1e6;
    out->lm_shared = ls;
    out->n_rows = n;
    double s = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (use[i]) {
            s += fabs(predict_us(coef, &rows[i], ls) / (rows[i].dur_s * 1e6) - 1);
            k++;
        }
    out->n_fit = k;
    out->fit_mape = k ? s / (double)k : 0;
    double bias = 0, sp = 0, sm = 0;
    k = 0;
    s = 0;
    for (size_t i = holdout - 1; i < n; i += holdout) {
        double e = predict_us(coef, &rows[i], ls) / (rows[i].dur_s * 1e6) - 1;
        sp += predict_us(coef, &rows[i], ls);
        sm += rows[i].dur_s * 1e6;
        ape[k++] = fabs(e);
        s += fabs(e);
        bias += e;
    }
    out->n_held = k;
    if (k) {
        out->held_mape = s / (double)k;
        out->held_bias = bias / (double)k;
        out->held_total_ratio = sp / sm;
        qsort(ape, k, sizeof *ape, cmp_dbl);
        out->held_median_ape = tdm_sim_percentile_sorted(ape, k, 0.5);
        out->held_p90_ape = tdm_sim_percentile_sorted(ape, k, 0.9);
    }
    rc = 0;
fail:
    free(use);
    free(ape);
    return rc;
}

void tdm_sim_fit_shape(const tdm_sim_fit_row *r, tdm_sim_shape *sh)
{
    memset(sh, 0, sizeof *sh);
    sh->prefill_tokens = r->prefill_tokens;
    sh->prefill_reqs = r->prefill_reqs;
    sh->decode_reqs = r->decode_reqs;
    sh->emit_seqs = r->emit_seqs;
    sh->decode_ctx = r->decode_ctx;
    sh->prefill_attn = r->prefill_attn;
}

/* ---- the table set ---- */

static int add(tdm_sim_table *t, const double *keys, double us, char *err, size_t errlen)
{
    if (tdm_sim_table_add(t, TDM_SIM_DT_BF16, keys, us > TINY_US ? us : TINY_US)) {
        snprintf(err, errlen, "%s: cannot add a row (%g us)", t->name, us);
        return -1;
    }
    return 0;
}

static int write_one(tdm_sim_table *t, const char *dir, const char *source, char *err,
                     size_t errlen)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.txt", dir, tdm_sim_op_name(t->op));
    return tdm_sim_table_write(t, path, source, err, errlen);
}

int tdm_sim_fit_write_tables(const tdm_sim_fit *f, const tdm_sim_model *m, const char *dir,
                             const char *source, char *err, size_t errlen)
{
    tdm_sim_table t[5];
    tdm_sim_table_init(&t[4], TDM_SIM_OP_ALLREDUCE, "allreduce");
    tdm_sim_table_init(&t[0], TDM_SIM_OP_GEMM, "gemm");
    tdm_sim_table_init(&t[1], TDM_SIM_OP_ELEMWISE, "elementwise");
    tdm_sim_table_init(&t[2], TDM_SIM_OP_ATTN_CTX, "attn_context");
    tdm_sim_table_init(&t[3], TDM_SIM_OP_ATTN_GEN, "attn_generation");
    int rc = -1;
    double L = m->layers, tp = m->tp ? m->tp : 1;
    double nk[5][2];
    gemm_shapes(m, nk);
    double heads = m->heads / tp, kvh = m->kv_heads / tp;
    if (heads < 1) heads = 1;
    if (kvh < 1) kvh = 1;
    for (int e = 0; e <= GRID_TOKENS; e++) {
        double x = ldexp(1, e);
        /* GEMMs: the LM head's shape per sequence (a layer GEMM of the same shape reads
         * the same row: lm_shared); the other layer shapes carry nothing */
        for (int sh = 0; sh < 5; sh++) {
            int dup = 0;
            for (int p = 0; p < sh; p++) dup |= nk[p][0] == nk[sh][0] && nk[p][1] == nk[sh][1];
            if (dup) continue;
            int lm = nk[sh][0] == nk[4][0] && nk[sh][1] == nk[4][1];
            double k3[3] = {nk[sh][0], nk[sh][1], x};
            if (add(&t[0], k3, lm ? f->seq_us * x : 0, err, errlen)) goto fail;
        }
        double k2[2] = {m->hidden + m->ffn / tp, x};
        if (add(&t[1], k2, f->token_us * x / L, err, errlen)) goto fail;
    }
    /* beyond the grid the tables extrapolate along the last segment (slope 1 and 2: exact
     * for these power laws), counted as extrapolated; rows must stay under 1e12 us */
    int cmax = GRID_CTX;
    while (cmax > 4 && (f->attn_ps * 1e-6 * ldexp(1, GRID_BATCH) * ldexp(1, 2 * cmax) / 2 / L > 1e11 ||
                        f->ctx_ns * 1e-3 * ldexp(1, GRID_BATCH + cmax) / L > 1e11))
        cmax--;
    for (int b = 0; b <= GRID_BATCH; b++)
        for (int c = 0; c <= cmax; c++) {
            double B = ldexp(1, b), X = ldexp(1, c);
            double k5[5] = {heads, kvh, m->head_dim, B, X};
            /* per layer: batch * isl^2 / 2 units of prefill attention, batch * ctx of decode */
            if (add(&t[2], k5, f->attn_ps * 1e-6 * B * X * X / 2 / L, err, errlen) ||
                add(&t[3], k5, f->ctx_ns * 1e-3 * B * X / L, err, errlen))
                goto fail;
        }
    for (int e = 0; tp > 1 && e <= 40; e++) {
        double k2[2] = {tp, ldexp(1, e)};
        if (add(&t[4], k2, 0, err, errlen)) goto fail;
    }
    for (int i = 0; i < (tp > 1 ? 5 : 4); i++)
        if (write_one(&t[i], dir, source, err, errlen)) goto fail;
    /* the roofline numbers price nothing here (every operator of a one-rank step has a
     * table; the all-reduces of a TP engine are in the fitted per-token time, so their rows
     * are empty too); they only have to be valid */
    json_t *tabs = json_pack("{s:s, s:s, s:s, s:s}", "gemm", "gemm.txt", "elementwise",
                             "elementwise.txt", "attn_context", "attn_context.txt",
                             "attn_generation", "attn_generation.txt");
    if (tabs && tp > 1) json_object_set_new(tabs, "allreduce", json_string("allreduce.txt"));
    json_t *hw = tabs ? json_pack("{s:s, s:s, s:s, s:o, s:f, s:i, s:i, s:i, s:i, s:i}",
                                  "name", "fitted", "source", source ? source : "tandem fit",
                                  "cost_model", "table", "tables", tabs,
                                  "step_overhead_us", f->overhead_us, "peak_tflops", 1,
                                  "hbm_gbps", 1, "eff_compute", 1, "eff_memory", 1,
                                  "interconnect_gbps", 0)
                      : NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/hw.json", dir);
    int wr = hw ? json_dump_file(hw, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : -1;
    json_decref(hw);
    if (wr) {
        snprintf(err, errlen, "%s: cannot write", path);
        goto fail;
    }
    rc = 0;
fail:
    for (int i = 0; i < 5; i++) tdm_sim_table_free(&t[i]);
    return rc;
}
