/*
 * table.c -- measured-operator tables: the text reader and writer and the interpolating
 * lookup behind the table cost model (docs/cost_model.md has the format). Rows are kept
 * sorted by (dtype, key 0, key 1, ...), so the rows sharing a prefix of keys form one
 * contiguous range. A lookup brackets the query between the two nearest profiled values of
 * the first key, recurses into both sub-ranges for the remaining keys and interpolates
 * log(time) linearly in log(key): exact at the profiled points, exact for any power law
 * between them. Below the smallest profiled value the time is held (kernels have a latency
 * floor); above the largest it follows the last segment's log-log slope, clamped to
 * [0, 2]. Both count as extrapolation.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "table.h"

static const char *const OP_NAMES[TDM_SIM_OP_COUNT] = {
    "gemm", "attn_context", "attn_generation", "allreduce", "elementwise"};
static const char *const K_GEMM[] = {"n", "k", "m"};
static const char *const K_CTX[] = {"heads", "kv_heads", "head_dim", "batch", "isl"};
static const char *const K_GEN[] = {"heads", "kv_heads", "head_dim", "batch", "ctx"};
static const char *const K_AR[] = {"tp", "bytes"};
static const char *const K_EW[] = {"width", "tokens"};

const char *tdm_sim_op_name(tdm_sim_op op)
{
    return (unsigned)op < TDM_SIM_OP_COUNT ? OP_NAMES[op] : "?";
}

int tdm_sim_op_from_name(const char *s, tdm_sim_op *op)
{
    for (int i = 0; i < TDM_SIM_OP_COUNT; i++)
        if (!strcmp(s, OP_NAMES[i])) {
            *op = (tdm_sim_op)i;
            return 0;
        }
    return -1;
}

int tdm_sim_op_keys(tdm_sim_op op, const char *const **names)
{
    switch (op) {
    case TDM_SIM_OP_GEMM: *names = K_GEMM; return 3;
    case TDM_SIM_OP_ATTN_CTX: *names = K_CTX; return 5;
    case TDM_SIM_OP_ATTN_GEN: *names = K_GEN; return 5;
    case TDM_SIM_OP_ALLREDUCE: *names = K_AR; return 2;
    case TDM_SIM_OP_ELEMWISE: *names = K_EW; return 2;
    default: *names = NULL; return 0;
    }
}

void tdm_sim_table_init(tdm_sim_table *t, tdm_sim_op op, const char *name)
{
    memset(t, 0, sizeof *t);
    t->op = op;
    const char *const *k;
    t->ndim = tdm_sim_op_keys(op, &k);
    snprintf(t->name, sizeof t->name, "%s", name ? name : tdm_sim_op_name(op));
}

void tdm_sim_table_free(tdm_sim_table *t)
{
    if (!t) return;
    free(t->rows);
    t->rows = NULL;
    t->n = t->cap = 0;
}

#define STRIDE(t) ((size_t)(t)->ndim + 2)

int tdm_sim_table_add(tdm_sim_table *t, tdm_sim_dtype dt, const double *keys, double us)
{
    if (!t || !keys || t->ndim <= 0 || (dt != TDM_SIM_DT_BF16 && dt != TDM_SIM_DT_FP8)) return -1;
    if (!isfinite(us) || us <= 0 || us > 1e12) return -1;
    for (int i = 0; i < t->ndim; i++)
        if (!isfinite(keys[i]) || keys[i] <= 0 || keys[i] > 1e15) return -1;
    if (t->n == t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 64;
        double *r = realloc(t->rows, nc * STRIDE(t) * sizeof *r);
        if (!r) return -1;
        t->rows = r;
        t->cap = nc;
    }
    double *r = t->rows + t->n * STRIDE(t);
    r[0] = dt;
    memcpy(r + 1, keys, (size_t)t->ndim * sizeof *keys);
    r[t->ndim + 1] = us;
    t->n++;
    t->sorted = 0;
    return 0;
}

static int g_cmp_dims; /* qsort has no context argument; set before each sort */

static void set_range(tdm_sim_table *t)
{
    for (int k = 0; k < t->ndim; k++) {
        t->kmin[k] = INFINITY;
        t->kmax[k] = 0;
    }
    for (size_t i = 0; i < t->n; i++)
        for (int k = 0; k < t->ndim; k++) {
            double v = t->rows[i * STRIDE(t) + (size_t)k + 1];
            if (v < t->kmin[k]) t->kmin[k] = v;
            if (v > t->kmax[k]) t->kmax[k] = v;
        }
}

static int row_cmp(const void *a, const void *b)
{
    const double *x = a, *y = b;
    for (int i = 0; i <= g_cmp_dims; i++)
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
}

int tdm_sim_table_finish(tdm_sim_table *t, char *err, size_t errlen)
{
    if (!t->n) {
        snprintf(err, errlen, "%s: the table has no rows", t->name);
        return -1;
    }
    g_cmp_dims = t->ndim;
    qsort(t->rows, t->n, STRIDE(t) * sizeof(double), row_cmp);
    for (size_t i = 1; i < t->n; i++) {
        const double *a = t->rows + (i - 1) * STRIDE(t), *b = a + STRIDE(t);
        if (row_cmp(a, b) == 0) {
            int o = snprintf(err, errlen, "%s: duplicate row (%s", t->name,
                             a[0] == TDM_SIM_DT_FP8 ? "fp8" : "bf16");
            for (int k = 0; k < t->ndim && o > 0 && (size_t)o < errlen; k++)
                o += snprintf(err + o, errlen - (size_t)o, " %.17g", a[k + 1]);
            if (o > 0 && (size_t)o < errlen) snprintf(err + o, errlen - (size_t)o, ")");
            return -1;
        }
    }
    set_range(t);
    t->sorted = 1;
    return 0;
}

int tdm_sim_table_merge(tdm_sim_table *t)
{
    if (!t || !t->n) return -1;
    g_cmp_dims = t->ndim;
    qsort(t->rows, t->n, STRIDE(t) * sizeof(double), row_cmp);
    size_t w = 0;
    for (size_t i = 0; i < t->n;) {
        double *a = t->rows + i * STRIDE(t), ls = 0;
        size_t j = i;
        while (j < t->n && row_cmp(a, t->rows + j * STRIDE(t)) == 0) {
            ls += log(t->rows[j * STRIDE(t) + (size_t)t->ndim + 1]);
            j++;
        }
        double *o = t->rows + w * STRIDE(t);
        memmove(o, a, STRIDE(t) * sizeof *o);
        o[t->ndim + 1] = exp(ls / (double)(j - i));
        w++;
        i = j;
    }
    t->n = w;
    set_range(t);
    t->sorted = 1;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Reader and writer                                                                          */
/* ---------------------------------------------------------------------------------------- */

#define MAXTOK 16

static int tokenize(char *line, char **tok)
{
    int n = 0;
    char *save = NULL;
    for (char *p = strtok_r(line, " \t,\r", &save); p; p = strtok_r(NULL, " \t,\r", &save)) {
        if (n == MAXTOK) return MAXTOK + 1;
        tok[n++] = p;
    }
    return n;
}

static int parse_dtype(const char *s, tdm_sim_dtype *dt)
{
    if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16") || !strcmp(s, "fp16")) *dt = TDM_SIM_DT_BF16;
    else if (!strcmp(s, "fp8")) *dt = TDM_SIM_DT_FP8;
    else return -1;
    return 0;
}

int tdm_sim_table_parse(const char *buf, size_t len, const char *name, tdm_sim_table *t,
                        char *err, size_t errlen)
{
    tdm_sim_table_init(t, TDM_SIM_OP_GEMM, name);
    if (!buf) {
        snprintf(err, errlen, "%s: no input", t->name);
        return -1;
    }
    char *text = malloc(len + 1);
    if (!text) {
        snprintf(err, errlen, "%s: out of memory", t->name);
        return -1;
    }
    memcpy(text, buf, len);
    text[len] = '\0';
    int state = 0; /* 0 magic, 1 op, 2 columns, 3 rows */
    int map[MAXTOK];  /* file column -> internal slot: -1 dtype, ndim = us, 0.. keys */
    int ncol = 0;
    size_t lineno = 0;
    int rc = -1;
    char *p = text, *end = text + len;
    while (p <= end && p) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl) *nl = '\0';
        lineno++;
        if (strlen(p) != (size_t)((nl ? nl : end) - p)) {
            snprintf(err, errlen, "%s:%zu: NUL byte in the line", t->name, lineno);
            goto done;
        }
        char *hash = strchr(p, '#');
        if (hash) *hash = '\0';
        char *tok[MAXTOK + 1];
        int nt = tokenize(p, tok);
        if (nt > MAXTOK) {
            snprintf(err, errlen, "%s:%zu: too many fields", t->name, lineno);
            goto done;
        }
        if (nt > 0) {
            if (state == 0) {
                if (nt != 2 || strcmp(tok[0], "tandem-table") || strcmp(tok[1], "1")) {
                    snprintf(err, errlen, "%s:%zu: expected \"tandem-table 1\" first", t->name,
                             lineno);
                    goto done;
                }
                state = 1;
            } else if (state == 1) {
                tdm_sim_op op;
                if (nt != 2 || strcmp(tok[0], "op") || tdm_sim_op_from_name(tok[1], &op)) {
                    snprintf(err, errlen, "%s:%zu: expected \"op gemm|attn_context|"
                             "attn_generation|allreduce|elementwise\"", t->name, lineno);
                    goto done;
                }
                char nm[sizeof t->name];
                snprintf(nm, sizeof nm, "%s", t->name);
                tdm_sim_table_init(t, op, nm);
                state = 2;
            } else if (state == 2) {
                const char *const *keys;
                int nk = tdm_sim_op_keys(t->op, &keys);
                if (strcmp(tok[0], "columns") || nt != nk + 3) {
                    snprintf(err, errlen, "%s:%zu: expected \"columns\" and dtype, us and the "
                             "%d keys of %s", t->name, lineno, nk, tdm_sim_op_name(t->op));
                    goto done;
                }
                int seen[TDM_SIM_TABLE_MAXDIM + 2] = {0};
                ncol = nt - 1;
                for (int i = 0; i < ncol; i++) {
                    const char *c = tok[i + 1];
                    int slot = -2;
                    if (!strcmp(c, "dtype")) slot = -1;
                    else if (!strcmp(c, "us")) slot = nk;
                    for (int k = 0; k < nk && slot == -2; k++)
                        if (!strcmp(c, keys[k])) slot = k;
                    if (slot == -2 || seen[slot + 1]) {
                        snprintf(err, errlen, "%s:%zu: column \"%s\" %s", t->name, lineno, c,
                                 slot == -2 ? "is not a key of this op" : "given twice");
                        goto done;
                    }
                    seen[slot + 1] = 1;
                    map[i] = slot;
                }
                state = 3;
            } else {
                if (nt != ncol) {
                    snprintf(err, errlen, "%s:%zu: %d fields, expected %d", t->name, lineno, nt,
                             ncol);
                    goto done;
                }
                double keys[TDM_SIM_TABLE_MAXDIM], us = 0;
                tdm_sim_dtype dt = TDM_SIM_DT_BF16;
                for (int i = 0; i < ncol; i++) {
                    if (map[i] == -1) {
                        if (parse_dtype(tok[i], &dt)) {
                            snprintf(err, errlen, "%s:%zu: dtype \"%s\" (bf16 or fp8)", t->name,
                                     lineno, tok[i]);
                            goto done;
                        }
                        continue;
                    }
                    char *e;
                    errno = 0;
                    double v = strtod(tok[i], &e);
                    if (*e || errno || !isfinite(v) || v <= 0 || v > 1e12) {
                        snprintf(err, errlen, "%s:%zu: field %d \"%s\" must be a positive number",
                                 t->name, lineno, i + 1, tok[i]);
                        goto done;
                    }
                    if (map[i] == t->ndim) us = v;
                    else keys[map[i]] = v;
                }
                if (tdm_sim_table_add(t, dt, keys, us)) {
                    snprintf(err, errlen, "%s:%zu: out of memory", t->name, lineno);
                    goto done;
                }
            }
        }
        if (!nl || nl + 1 == end) break; /* no empty last line after a final newline */
        p = nl + 1;
    }
    if (state < 3) {
        snprintf(err, errlen, "%s:%zu: missing %s", t->name, lineno,
                 state == 0 ? "\"tandem-table 1\"" : state == 1 ? "\"op\" line" : "\"columns\" line");
        goto done;
    }
    rc = tdm_sim_table_finish(t, err, errlen);
done:
    free(text);
    if (rc) tdm_sim_table_free(t);
    return rc;
}

int tdm_sim_table_load(const char *path, tdm_sim_table *t, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        tdm_sim_table_init(t, TDM_SIM_OP_GEMM, path);
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 30)) {
        fclose(f);
        snprintf(err, errlen, "%s: not a regular file of at most 1 GiB", path);
        tdm_sim_table_init(t, TDM_SIM_OP_GEMM, path);
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    size_t got;
    while (b && (got = fread(b + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            if (cap > ((size_t)1 << 30)) break;
            char *nb = realloc(b, cap * 2);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!b || bad) {
        free(b);
        snprintf(err, errlen, "%s: %s", path, bad ? "read error" : "out of memory");
        tdm_sim_table_init(t, TDM_SIM_OP_GEMM, path);
        return -1;
    }
    int rc = tdm_sim_table_parse(b, n, path, t, err, errlen);
    free(b);
    return rc;
}

int tdm_sim_table_write(const tdm_sim_table *t, const char *path, const char *source, char *err,
                        size_t errlen)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    const char *const *keys;
    int nk = tdm_sim_op_keys(t->op, &keys);
    fprintf(f, "# %s\ntandem-table 1\nop %s\ncolumns dtype", source ? source : "tandem",
            tdm_sim_op_name(t->op));
    for (int k = 0; k < nk; k++) fprintf(f, " %s", keys[k]);
    fprintf(f, " us\n");
    for (size_t i = 0; i < t->n; i++) {
        const double *r = t->rows + i * STRIDE(t);
        fprintf(f, "%s", r[0] == TDM_SIM_DT_FP8 ? "fp8" : "bf16");
        for (int k = 0; k < nk; k++) fprintf(f, " %.10g", r[k + 1]);
        fprintf(f, " %.6g\n", r[nk + 1]);
    }
    if (fclose(f)) {
        snprintf(err, errlen, "%s: write error", path);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Lookup                                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* First row in [lo, hi) whose column c is > v (the rows of the range share columns < c). */
static size_t upper(const tdm_sim_table *t, size_t lo, size_t hi, int c, double v)
{
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->rows[mid * STRIDE(t) + (size_t)c] <= v) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static size_t lower(const tdm_sim_table *t, size_t lo, size_t hi, int c, double v)
{
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->rows[mid * STRIDE(t) + (size_t)c] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static double colv(const tdm_sim_table *t, size_t row, int c)
{
    return t->rows[row * STRIDE(t) + (size_t)c];
}

/* log(time) over rows [lo, hi) that share dtype and keys < d; d is the key index. */
static double interp(const tdm_sim_table *t, size_t lo, size_t hi, int d, const double *q,
                     int *ex)
{
    if (d == t->ndim) return log(colv(t, lo, t->ndim + 1));
    int c = d + 1;
    double v = q[d];
    size_t pos = upper(t, lo, hi, c, v);
    if (pos > lo && colv(t, pos - 1, c) == v) {
        size_t s = lower(t, lo, pos, c, v);
        return interp(t, s, pos, d + 1, q, ex);
    }
    if (pos == lo) { /* below the smallest value: hold */
        *ex = 1;
        double v0 = colv(t, lo, c);
        return interp(t, lo, upper(t, lo, hi, c, v0), d + 1, q, ex);
    }
    double va = colv(t, pos - 1, c);
    size_t sa = lower(t, lo, pos, c, va);
    if (pos == hi) { /* above the largest: the last segment's slope, clamped */
        *ex = 1;
        double fa = interp(t, sa, pos, d + 1, q, ex);
        if (sa == lo) return fa;
        double vb = colv(t, sa - 1, c);
        size_t sb = lower(t, lo, sa, c, vb);
        double fb = interp(t, sb, sa, d + 1, q, ex);
        double slope = (fa - fb) / (log(va) - log(vb));
        if (!(slope >= 0)) slope = 0;
        if (slope > 2) slope = 2;
        return fa + slope * (log(v) - log(va));
    }
    double vb = colv(t, pos, c);
    size_t eb = upper(t, pos, hi, c, vb);
    double fa = interp(t, sa, pos, d + 1, q, ex);
    double fb = interp(t, pos, eb, d + 1, q, ex);
    double w = (log(v) - log(va)) / (log(vb) - log(va));
    return fa + w * (fb - fa);
}

double tdm_sim_table_lookup(const tdm_sim_table *t, tdm_sim_dtype dt, const double *keys,
                            int *extrap)
{
    if (!t || !t->n || !t->sorted || !keys) return -1;
    int ex = 0;
    double q[TDM_SIM_TABLE_MAXDIM];
    for (int i = 0; i < t->ndim; i++) q[i] = keys[i] >= 1e-9 ? keys[i] : 1e-9;
    size_t lo = lower(t, 0, t->n, 0, (double)dt), hi = upper(t, 0, t->n, 0, (double)dt);
    if (lo == hi && dt == TDM_SIM_DT_FP8) { /* no fp8 rows: the bf16 ones, flagged */
        ex = 1;
        lo = lower(t, 0, t->n, 0, TDM_SIM_DT_BF16);
        hi = upper(t, 0, t->n, 0, TDM_SIM_DT_BF16);
    }
    if (lo == hi) return -1;
    double r = exp(interp(t, lo, hi, 0, q, &ex));
    if (ex && extrap) *extrap = 1;
    return r;
}

int tdm_sim_table_prefix(const tdm_sim_table *t, tdm_sim_dtype dt, const double *keys, int np,
                         size_t *lo, size_t *hi)
{
    if (!t || !t->n || !t->sorted || np < 0 || np > t->ndim) return -1;
    size_t a = lower(t, 0, t->n, 0, (double)dt), b = upper(t, 0, t->n, 0, (double)dt);
    for (int d = 0; d < np && a < b; d++) {
        size_t na = lower(t, a, b, d + 1, keys[d]);
        b = upper(t, na, b, d + 1, keys[d]);
        a = na;
    }
    if (a >= b) return -1;
    *lo = a;
    *hi = b;
    return 0;
}

double tdm_sim_table_lookup_in(const tdm_sim_table *t, size_t lo, size_t hi, int np,
                               const double *keys, int *extrap)
{
    if (!t || lo >= hi || hi > t->n || np < 0 || np > t->ndim) return -1;
    int ex = 0;
    double q[TDM_SIM_TABLE_MAXDIM];
    for (int i = 0; i < t->ndim; i++) q[i] = keys[i] >= 1e-9 ? keys[i] : 1e-9;
    double r = exp(interp(t, lo, hi, np, q, &ex));
    if (ex && extrap) *extrap = 1;
    return r;
}
