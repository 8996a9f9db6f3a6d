/*
 * calib_table.c -- the table cost model against measured data, on held-out rows only, so
 * that the errors in docs/cost_model.md say how well the model predicts points it has not
 * seen (`make calibrate`, `tandem cost --calibrate --tables DIR`, test_calibration):
 *   vidur      per-layer operator medians (../shared/profiles/vidur/<gpu>_<model>_mlp.csv): for each TP
 *              degree the distinct token counts are ranked; GEMM and element-wise tables are
 *              built from the even ranks and the linear part of a layer is scored on the odd;
 *   attention  aiconfigurator's context / generation attention (build/tables/<hw>/attn_*.txt
 *              from `make tables`): the distinct sequence lengths ranked the same way;
 *   DistServe  the fitted A100 step-latency models (OPT-13B/66B, TP 1-8) sampled on a grid,
 *              against the a100-80g tables with one per-step overhead fitted on the even grid
 *              points, scored on the odd;
 *   Splitwise  measured Llama-2-70B prompt and token times (A100/H100, TP 2/4/8): the
 *              distinct configurations ranked, one overhead per GPU fitted on the even ones.
 * An overhead that minimizes the mean absolute percentage error is the weighted median of
 * the residuals (measured - predicted) with weights 1/measured.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "sim.h"

#define MAXF 128

typedef struct vrow {
    double tp, tokens, H, heads, kvh, I, gemm[4], ew, meas;
    int rank;
} vrow;

static int vrow_cmp(const void *a, const void *b)
{
    const vrow *x = a, *y = b;
    if (x->tp != y->tp) return x->tp < y->tp ? -1 : 1;
    if (x->tokens != y->tokens) return x->tokens < y->tokens ? -1 : 1;
    return 0;
}

static const char *base(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* GEMM keys (n, k) of a layer's QKV, O, up/gate and down projections at this TP shard. */
static void vgemm_keys(const vrow *r, double nk[4][2])
{
    double hd = r->H / r->heads;
    nk[0][0] = (r->heads + 2 * r->kvh) * hd / r->tp, nk[0][1] = r->H;
    nk[1][0] = r->H, nk[1][1] = r->heads * hd / r->tp;
    nk[2][0] = 2 * r->I / r->tp, nk[2][1] = r->H;
    nk[3][0] = r->H, nk[3][1] = r->I / r->tp;
}

static int vidur_file(const char *path, const char *hwname, FILE *out, double *sum, size_t *cnt)
{
    tdm_sim__vidur_row *raw;
    size_t nraw;
    if (tdm_sim__vidur_rows(path, &raw, &nraw) != 0) return -1;
    int ok = 1;
    size_t n = 0;
    vrow *rows = nraw ? malloc(nraw * sizeof *rows) : NULL;
    if (nraw && !rows) ok = 0;
    for (size_t q = 0; ok && q < nraw; q++) {
        const tdm_sim__vidur_row *v = &raw[q];
        vrow r;
        memset(&r, 0, sizeof r);
        r.tp = v->tp, r.tokens = v->tokens, r.H = v->H;
        r.heads = v->heads, r.kvh = v->kvh, r.I = v->I;
        for (int i = 0; i < 4; i++) r.gemm[i] = v->gemm_ms[i] * 1e3;
        r.ew = v->ew_ms * 1e3;
        r.meas = r.ew;
        for (int i = 0; i < 4; i++) r.meas += r.gemm[i];
        int good = r.tp >= 1 && r.tokens >= 1 && r.H >= 1 && r.heads >= 1 && r.kvh >= 1 &&
                   r.I >= 1 && r.ew > 0;
        for (int i = 0; i < 4; i++) good = good && r.gemm[i] > 0;
        if (good) rows[n++] = r;
    }
    free(raw);
    int rc = -1;
    tdm_sim_tableset set;
    memset(&set, 0, sizeof set);
    tdm_sim_table_init(&set.op[TDM_SIM_OP_GEMM], TDM_SIM_OP_GEMM, path);
    tdm_sim_table_init(&set.op[TDM_SIM_OP_ELEMWISE], TDM_SIM_OP_ELEMWISE, path);
    if (!ok || !n) goto done;
    qsort(rows, n, sizeof *rows, vrow_cmp);
    for (size_t i = 0; i < n; i++) /* rank of the token count within its TP degree */
        rows[i].rank = i == 0 || rows[i].tp != rows[i - 1].tp ? 0
                       : rows[i].tokens == rows[i - 1].tokens ? rows[i - 1].rank
                                                              : rows[i - 1].rank + 1;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].rank % 2) continue;
        double nk[4][2];
        vgemm_keys(&rows[i], nk);
        for (int g = 0; g < 4; g++) {
            double k[3] = {nk[g][0], nk[g][1], rows[i].tokens};
            if (tdm_sim_table_add(&set.op[TDM_SIM_OP_GEMM], TDM_SIM_DT_BF16, k, rows[i].gemm[g]))
                goto done;
        }
        double k[2] = {rows[i].H + rows[i].I / rows[i].tp, rows[i].tokens};
        if (tdm_sim_table_add(&set.op[TDM_SIM_OP_ELEMWISE], TDM_SIM_DT_BF16, k, rows[i].ew))
            goto done;
    }
    if (tdm_sim_table_merge(&set.op[TDM_SIM_OP_GEMM]) ||
        tdm_sim_table_merge(&set.op[TDM_SIM_OP_ELEMWISE]))
        goto done;
    set.have[TDM_SIM_OP_GEMM] = set.have[TDM_SIM_OP_ELEMWISE] = 1;
    size_t ntrain = set.op[TDM_SIM_OP_GEMM].n;
    const tdm_sim_tableset *ts = &set; /* used only within this function, then freed */
    tdm_sim_hw hw;
    tdm_sim_hw_preset(hwname, &hw);
    hw.step_overhead_us = 0;
    hw.cost_model = TDM_SIM_COST_TABLE;
    hw.tables = ts;
    double s = 0, worst = 0;
    size_t k = 0, ex = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(rows[i].rank % 2)) continue;
        tdm_sim_model m;
        memset(&m, 0, sizeof m);
        m.layers = 1;
        m.hidden = (uint32_t)rows[i].H;
        m.heads = (uint32_t)rows[i].heads;
        m.kv_heads = (uint32_t)rows[i].kvh;
        m.head_dim = m.hidden / m.heads;
        m.ffn = (uint32_t)rows[i].I;
        m.gated = 1;
        m.tp = (uint32_t)rows[i].tp;
        m.bytes_per_param = m.bytes_per_kv = 2;
        tdm_sim_cost c;
        tdm_sim_cost_init(&c, &m, &hw);
        tdm_sim_shape sh;
        memset(&sh, 0, sizeof sh);
        sh.decode_reqs = (uint32_t)rows[i].tokens;
        tdm_sim_cost_terms t;
        tdm_sim_cost_step(&c, &sh, &t);
        double e = fabs(t.linear_s * 1e6 - rows[i].meas) / rows[i].meas;
        if (e > worst) worst = e;
        s += e;
        k++;
        ex += c.extrapolated_lookups > 0;
    }
    if (out && k)
        fprintf(out, "  vidur %-26s train %4zu GEMM rows, test %4zu rows: MAPE %5.2f%% (worst %5.1f%%"
                ", %zu extrapolated)\n", base(path), ntrain, k, 100 * s / (double)k, 100 * worst, ex);
    *sum += s;
    *cnt += k;
    rc = 0;
done:
    tdm_sim_table_free(&set.op[TDM_SIM_OP_GEMM]);
    tdm_sim_table_free(&set.op[TDM_SIM_OP_ELEMWISE]);
    free(set.memo);
    free(rows);
    return rc;
}

/* Held-out score of one attention table: train on even ranks of the sequence key. */
static int attn_file(const char *path, const char *hwname, FILE *out, double *sum, size_t *cnt,
                     uint64_t *extrap, double *roof_sum)
{
    tdm_sim_hw hw;
    tdm_sim_hw_preset(hwname, &hw);
    double F = hw.peak_tflops * 1e12 * hw.eff_compute, B = hw.hbm_gbps * 1e9 * hw.eff_memory;
    double rs = 0;
    char err[TDM_SIM_ERRLEN];
    tdm_sim_table all, train;
    if (tdm_sim_table_load(path, &all, err, sizeof err) != 0) return -1;
    int sk = all.ndim - 1; /* isl or ctx: the last key */
    size_t st = (size_t)all.ndim + 2;
    double *vals = malloc(all.n * sizeof *vals);
    int rc = -1;
    tdm_sim_table_init(&train, all.op, path);
    if (!vals) goto done;
    for (size_t i = 0; i < all.n; i++) vals[i] = all.rows[i * st + (size_t)sk + 1];
    /* distinct values, sorted */
    size_t nv = 0;
    for (size_t i = 0; i < all.n; i++) {
        size_t j = 0;
        while (j < nv && vals[j] != vals[i]) j++;
        if (j == nv) vals[nv++] = vals[i];
    }
    for (size_t i = 1; i < nv; i++)
        for (size_t j = i; j > 0 && vals[j] < vals[j - 1]; j--) {
            double x = vals[j];
            vals[j] = vals[j - 1];
            vals[j - 1] = x;
        }
    for (size_t i = 0; i < all.n; i++) {
        const double *r = all.rows + i * st;
        size_t rk = 0;
        while (rk < nv && vals[rk] != r[sk + 1]) rk++;
        if (rk % 2 == 0 &&
            tdm_sim_table_add(&train, (tdm_sim_dtype)r[0], r + 1, r[all.ndim + 1]))
            goto done;
    }
    if (tdm_sim_table_finish(&train, err, sizeof err)) goto done;
    double s = 0;
    size_t k = 0, ex = 0;
    for (size_t i = 0; i < all.n; i++) {
        const double *r = all.rows + i * st;
        size_t rk = 0;
        while (rk < nv && vals[rk] != r[sk + 1]) rk++;
        if (rk % 2 == 0) continue;
        int e = 0;
        double p = tdm_sim_table_lookup(&train, (tdm_sim_dtype)r[0], r + 1, &e);
        if (p < 0) continue;
        s += fabs(p - r[all.ndim + 1]) / r[all.ndim + 1];
        k++;
        ex += (size_t)e;
        /* the roofline's attention terms of one layer on the same row, for comparison */
        double heads = r[1], kvh = r[2], hd = r[3], b = r[4], len = r[5];
        double work = all.op == TDM_SIM_OP_ATTN_CTX ? b * len * len / 2 : b * len;
        double kvb = 2 * kvh * hd * (r[0] == TDM_SIM_DT_FP8 ? 1 : 2) * b * len;
        double fl = 4 * heads * hd * work / F, by = kvb / B;
        double roof = (fl > by ? fl : by) * 1e6;
        rs += fabs(roof - r[all.ndim + 1]) / r[all.ndim + 1];
    }
    if (out && k)
        fprintf(out, "  attention %-34s train %5zu, test %5zu rows: MAPE %5.2f%% (%zu extrapolated;"
                " roofline %.1f%%)\n", path, train.n, k, 100 * s / (double)k, ex,
                100 * rs / (double)k);
    *roof_sum += rs;
    *sum += s;
    *cnt += k;
    *extrap += ex;
    rc = 0;
done:
    free(vals);
    tdm_sim_table_free(&all);
    tdm_sim_table_free(&train);
    return rc;
}

/* Points of a stack-level comparison: the prediction without overhead, and the half. */
#define NGROUP 16

typedef struct pt {
    double meas, pred;
    int train, phase, group;   /* group: the per-step overhead it shares (a TP degree) */
} pt;

typedef struct pts {
    pt *v;
    size_t n, cap;
} pts;

static int pts_push(pts *p, double meas, double pred, int train, int phase, int group)
{
    if (group < 0 || group >= NGROUP) return 0;
    if (!(meas > 0) || !(pred >= 0)) return 0;
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 256;
        pt *nv = realloc(p->v, nc * sizeof *nv);
        if (!nv) return -1;
        p->v = nv;
        p->cap = nc;
    }
    p->v[p->n++] = (pt){meas, pred, train, phase, group};
    return 0;
}

static int res_cmp(const void *a, const void *b)
{
    const double *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* The overhead of one group minimizing its training MAPE at kernel factor a: the weighted
 * median of meas - a * pred with weights 1/meas (0 when negative or without points). */
static double fit_beta(const pts *p, int g, double a, double *r)
{
    double tw = 0, acc = 0, ov = 0;
    size_t k = 0;
    for (size_t i = 0; i < p->n; i++)
        if (p->v[i].train && p->v[i].group == g) {
            r[2 * k] = p->v[i].meas - a * p->v[i].pred;
            r[2 * k + 1] = 1 / p->v[i].meas;
            tw += r[2 * k + 1];
            k++;
        }
    qsort(r, k, 2 * sizeof *r, res_cmp);
    for (size_t i = 0; i < k; i++) {
        acc += r[2 * i + 1];
        if (acc >= tw / 2) {
            ov = r[2 * i];
            break;
        }
    }
    return ov > 0 ? ov : 0;
}

static double mape(const pts *p, int train, int phase, double a, const double *beta, size_t *n)
{
    double s = 0;
    size_t k = 0;
    for (size_t i = 0; i < p->n; i++) {
        const pt *q = &p->v[i];
        if (q->train != train || (phase >= 0 && q->phase != phase)) continue;
        s += fabs(a * q->pred + beta[q->group] - q->meas) / q->meas;
        k++;
    }
    if (n) *n = k;
    return k ? s / (double)k : -1;
}

/* The serving stack's calibration on the training points: meas = a * pred + beta[group]
 * (a: how much slower that stack's kernels ran than the profiled ones; beta: its per-step
 * overhead per TP degree). a on a grid of 0.01 in [0.5, 2.5], the betas by weighted median. */
static double fit_stack(const pts *p, double beta[NGROUP])
{
    double *r = malloc((p->n + 1) * 2 * sizeof *r), best = INFINITY, ba = 1;
    double b[NGROUP];
    if (!r) return 1;
    for (int ai = 50; ai <= 250; ai++) {
        double a = ai / 100.0;
        for (int g = 0; g < NGROUP; g++) b[g] = fit_beta(p, g, a, r);
        double e = mape(p, 1, -1, a, b, NULL);
        if (e >= 0 && e < best) {
            best = e;
            ba = a;
            memcpy(beta, b, sizeof b);
        }
    }
    free(r);
    return ba;
}

static void print_groups(FILE *out, const pts *p, const double *beta)
{
    for (int g = 0; g < NGROUP; g++)
        for (size_t i = 0; i < p->n; i++)
            if (p->v[i].group == g) {
                fprintf(out, " %d:%.1f", g, beta[g]);
                break;
            }
    fprintf(out, "\n");
}

static int table_hw(const char *tables, const char *hw, tdm_sim_hw *h)
{
    char path[1024], err[TDM_SIM_ERRLEN];
    snprintf(path, sizeof path, "%s/%s.json", tables, hw);
    if (tdm_sim_hw_load(path, h, err, sizeof err) != 0) return -1;
    h->step_overhead_us = 0;
    return 0;
}

static double step_ms(const tdm_sim_model *m, const tdm_sim_hw *h, const tdm_sim_shape *s)
{
    tdm_sim_cost c;
    tdm_sim_cost_init(&c, m, h);
    return tdm_sim_cost_step(&c, s, NULL) * 1e3;
}

static void distserve(const char *path, const char *tables, FILE *out, tdm_sim_calib_table *cal)
{
    tdm_sim_hw h;
    if (table_hw(tables, "a100-80g", &h) != 0) return;
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) return;
    pts p = {0};
    const char *mname, *tpk;
    json_t *mv, *tv;
    json_object_foreach(o, mname, mv) {
        const char *preset = strstr(mname, "opt-13b") ? "opt-13b"
                             : strstr(mname, "opt-66b") ? "opt-66b" : NULL;
        if (!preset || !json_is_object(mv)) continue;
        json_object_foreach(mv, tpk, tv) {
            tdm_sim_model m;
            tdm_sim_model_preset(preset, &m);
            m.tp = (uint32_t)atoi(tpk);
            json_t *pf = json_object_get(tv, "prefill"), *ds = json_object_get(tv, "decoding_smallbs"),
                   *dl = json_object_get(tv, "decoding_largebs"),
                   *th = json_object_get(tv, "decoding_large_small_bs_threshold");
            if (!m.tp || !json_is_array(pf) || !json_is_array(ds) || !json_is_array(dl)) continue;
            double thr = json_is_number(th) ? json_number_value(th) : 95;
            double a = json_number_value(json_array_get(pf, 0)),
                   b = json_number_value(json_array_get(pf, 1)),
                   cc = json_number_value(json_array_get(pf, 2));
            int i = 0;
            for (double l = 64; l <= 2048; l += 32, i++) {
                tdm_sim_shape s = {0};
                s.prefill_tokens = (uint64_t)l;
                s.prefill_reqs = s.emit_seqs = 1;
                s.prefill_attn = l * l / 2;
                s.prefill_kv_read = (uint64_t)l;
                if (pts_push(&p, a + b * l + cc * l * l, step_ms(&m, &h, &s), i % 2 == 0, 0,
                             (int)m.tp))
                    goto done;
            }
            static const double B[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256};
            static const double C[] = {128, 192, 256, 384, 512, 768, 1024, 1536};
            for (size_t bi = 0; bi < sizeof B / sizeof B[0]; bi++)
                for (size_t ci = 0; ci < sizeof C / sizeof C[0]; ci++) {
                    json_t *co = B[bi] < thr ? ds : dl;
                    double meas = json_number_value(json_array_get(co, 0)) +
                                  json_number_value(json_array_get(co, 1)) * B[bi] * C[ci] +
                                  json_number_value(json_array_get(co, 2)) * B[bi];
                    tdm_sim_shape s = {0};
                    s.decode_reqs = s.emit_seqs = (uint32_t)B[bi];
                    s.decode_ctx = (uint64_t)(B[bi] * C[ci]);
                    if (pts_push(&p, meas, step_ms(&m, &h, &s), (bi + ci) % 2 == 0, 1,
                                 (int)m.tp))
                        goto done;
                }
        }
    }
    double beta[NGROUP] = {0};
    double al = fit_stack(&p, beta);
    cal->ds_alpha = al;
    memcpy(cal->ds_overhead_ms, beta, sizeof cal->ds_overhead_ms);
    cal->ds_prefill_mape = mape(&p, 0, 0, al, beta, &cal->ds_prefill_n);
    cal->ds_decode_mape = mape(&p, 0, 1, al, beta, &cal->ds_decode_n);
    if (out && cal->ds_prefill_n) {
        fprintf(out, "  distserve a100-80g tables, fitted on the even points: kernels x%.2f, "
                "overhead ms by TP", al);
        print_groups(out, &p, beta);
        fprintf(out, "  distserve held out: prefill MAPE %5.2f%% (%zu pts), decode MAPE %5.2f%% "
                "(%zu pts)\n", 100 * cal->ds_prefill_mape, cal->ds_prefill_n,
                100 * cal->ds_decode_mape, cal->ds_decode_n);
    }
done:
    free(p.v);
    json_decref(o);
}

typedef struct swcfg {
    double hw, tp, bs, ts, ps, prompt, token;
    int n;
} swcfg;

static int sw_cmp(const void *a, const void *b)
{
    const swcfg *x = a, *y = b;
    const double kx[5] = {x->hw, x->tp, x->bs, x->ts, x->ps}, ky[5] = {y->hw, y->tp, y->bs, y->ts, y->ps};
    for (int i = 0; i < 5; i++)
        if (kx[i] != ky[i]) return kx[i] < ky[i] ? -1 : 1;
    return 0;
}

static void splitwise(const char *path, const char *tables, FILE *out, tdm_sim_calib_table *cal)
{
    tdm_sim_hw hws[2];
    if (table_hw(tables, "a100-80g", &hws[0]) || table_hw(tables, "h100-sxm", &hws[1])) return;
    size_t len;
    char *buf = tdm_sim__slurp(path, &len);
    if (!buf) return;
    char *save = NULL, *line = strtok_r(buf, "\n", &save);
    char *hdr[32], *f[32];
    char *hl = line ? strdup(line) : NULL;
    int nh = hl ? tdm_sim__csv_fields(hl, hdr, 32) : 0;
    int cm = tdm_sim__csv_col(hdr, nh, "model"), chw = tdm_sim__csv_col(hdr, nh, "hardware"),
        cps = tdm_sim__csv_col(hdr, nh, "prompt_size"), cbs = tdm_sim__csv_col(hdr, nh, "batch_size"),
        cts = tdm_sim__csv_col(hdr, nh, "token_size"), cpt = tdm_sim__csv_col(hdr, nh, "prompt_time"),
        ctt = tdm_sim__csv_col(hdr, nh, "token_time"), ctp = tdm_sim__csv_col(hdr, nh, "tensor_parallel");
    swcfg *cf = NULL;
    size_t n = 0, cap = 0;
    pts p[2] = {{0}, {0}};
    while (cm >= 0 && chw >= 0 && cps >= 0 && cbs >= 0 && cts >= 0 && cpt >= 0 && ctt >= 0 &&
           ctp >= 0 && (line = strtok_r(NULL, "\n", &save))) {
        if (tdm_sim__csv_fields(line, f, 32) != nh || strcmp(f[cm], "llama2-70b")) continue;
        int h100 = !strcmp(f[chw], "h100-80gb");
        if (!h100 && strcmp(f[chw], "a100-80gb")) continue;
        swcfg c = {h100, atof(f[ctp]), atof(f[cbs]), atof(f[cts]), atof(f[cps]), atof(f[cpt]),
                   atof(f[ctt]), 1};
        if (c.tp < 1 || c.bs < 1 || c.ps < 1 || c.prompt <= 0 || c.token <= 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            swcfg *nc = realloc(cf, cap * sizeof *nc);
            if (!nc) goto done;
            cf = nc;
        }
        cf[n++] = c;
    }
    qsort(cf, n, sizeof *cf, sw_cmp);
    size_t w = 0; /* repeated measurements of one configuration: their mean */
    for (size_t i = 0; i < n; i++) {
        if (w && sw_cmp(&cf[w - 1], &cf[i]) == 0) {
            cf[w - 1].prompt += cf[i].prompt;
            cf[w - 1].token += cf[i].token;
            cf[w - 1].n++;
        } else cf[w++] = cf[i];
    }
    for (size_t i = 0; i < w; i++) {
        cf[i].prompt /= cf[i].n;
        cf[i].token /= cf[i].n;
    }
    size_t dropped = 0;
    for (size_t i = 0; i < w; i++) {
        swcfg *c = &cf[i];
        /* a batch's prompts ran one per step (prompt time ~ batch x one prompt); a batch
         * that took under half of that did not run as measured (the two bs-64 TP-2 rows) */
        double one = -1;
        for (size_t j = 0; j < w; j++)
            if (cf[j].hw == c->hw && cf[j].tp == c->tp && cf[j].bs == 1 && cf[j].ps == c->ps &&
                cf[j].ts == c->ts)
                one = cf[j].prompt;
        if (one > 0 && c->prompt < 0.5 * c->bs * one) {
            dropped++;
            continue;
        }
        tdm_sim_model m;
        tdm_sim_model_preset("llama-2-70b", &m);
        m.tp = (uint32_t)c->tp;
        const tdm_sim_hw *h = &hws[(int)c->hw];
        tdm_sim_shape s = {0}, d = {0};
        s.prefill_tokens = (uint64_t)c->ps;
        s.prefill_reqs = s.emit_seqs = 1;
        s.prefill_attn = c->ps * c->ps / 2;
        s.prefill_kv_read = s.prefill_tokens;
        d.decode_reqs = d.emit_seqs = (uint32_t)c->bs;
        d.decode_ctx = (uint64_t)(c->bs * (c->ps + c->ts / 2));
        pts *q = &p[(int)c->hw];
        if (pts_push(q, c->prompt / c->bs, step_ms(&m, h, &s), i % 2 == 0, 0, (int)c->tp) ||
            pts_push(q, c->token, step_ms(&m, h, &d), i % 2 == 0, 1, (int)c->tp))
            goto done;
    }
    double sp = 0, st = 0;
    size_t np = 0;
    for (int k = 0; k < 2; k++) {
        double beta[NGROUP] = {0};
        double al = fit_stack(&p[k], beta);
        size_t a, b;
        double mp = mape(&p[k], 0, 0, al, beta, &a), mt = mape(&p[k], 0, 1, al, beta, &b);
        cal->sw_alpha[k] = al;
        memcpy(cal->sw_overhead_ms[k], beta, sizeof cal->sw_overhead_ms[k]);
        if (!a) continue;
        if (out) {
            fprintf(out, "  splitwise llama2-70b %s tables, fitted on the even configs: kernels "
                    "x%.2f, overhead ms by TP", k ? "h100-sxm" : "a100-80g", al);
            print_groups(out, &p[k], beta);
            fprintf(out, "  splitwise %s held out: prompt MAPE %5.2f%%, token MAPE %5.2f%% "
                    "(%zu configs)\n", k ? "h100-sxm" : "a100-80g", 100 * mp, 100 * mt, a);
        }
        sp += mp * (double)a;
        st += mt * (double)a;
        np += a;
    }
    if (out && np)
        fprintf(out, "  splitwise: %zu configurations dropped as failed runs (a batch's prompts in "
                "under half the time of batch x one prompt)\n", dropped);
    if (np) {
        cal->sw_prompt_mape = sp / (double)np;
        cal->sw_token_mape = st / (double)np;
        cal->sw_n = np;
    }
done:
    free(p[0].v);
    free(p[1].v);
    free(cf);
    free(hl);
    free(buf);
}

int tdm_sim_calibrate_table(const char *dir, const char *tables, FILE *out,
                            tdm_sim_calib_table *cal)
{
    memset(cal, 0, sizeof *cal);
    cal->vidur_mape = cal->attn_mape = cal->ds_prefill_mape = cal->ds_decode_mape = -1;
    cal->attn_roofline_mape = -1;
    cal->sw_prompt_mape = cal->sw_token_mape = -1;
    char path[1024];
    if (out) fprintf(out, "table cost model, held-out rows (profiles under %s, tables under %s)\n",
                     dir, tables ? tables : "(none)");
    static const char *const VF[3][2] = {{"a100_llama2_7b_mlp.csv", "a100-80g"},
                                         {"h100_llama2_7b_mlp.csv", "h100-sxm"},
                                         {"h100_llama2_70b_mlp.csv", "h100-sxm"}};
    double s = 0;
    size_t k = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/profiles/vidur/%s", dir, VF[i][0]);
        vidur_file(path, VF[i][1], out, &s, &k);
    }
    if (k) cal->vidur_mape = s / (double)k, cal->vidur_n = k;
    if (tables) {
        static const char *const HW[3] = {"a100-80g", "h100-sxm", "h200"};
        static const char *const OPS[2] = {"attn_context", "attn_generation"};
        double rs = 0;
        s = 0;
        k = 0;
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 2; j++) {
                snprintf(path, sizeof path, "%s/%s/%s.txt", tables, HW[i], OPS[j]);
                attn_file(path, HW[i], out, &s, &k, &cal->attn_extrapolated, &rs);
            }
        if (k) {
            cal->attn_mape = s / (double)k, cal->attn_n = k;
            cal->attn_roofline_mape = rs / (double)k;
            if (out)
                fprintf(out, "  attention: table %.2f%%, the roofline's attention terms %.1f%% on "
                        "the same %zu rows\n", 100 * cal->attn_mape, 100 * cal->attn_roofline_mape,
                        k);
        }
        snprintf(path, sizeof path, "%s/profiles/distserve/profiler-a100-80g.distserve.json", dir);
        distserve(path, tables, out, cal);
        snprintf(path, sizeof path, "%s/profiles/splitwise/perf_model.csv", dir);
        splitwise(path, tables, out, cal);
    }
    int n = 0;
    const double v[6] = {cal->vidur_mape, cal->attn_mape, cal->ds_prefill_mape,
                         cal->ds_decode_mape, cal->sw_prompt_mape, cal->sw_token_mape};
    for (int i = 0; i < 6; i++) n += v[i] >= 0;
    return n;
}

void tdm_sim_calib_table_line(FILE *f, const tdm_sim_calib_table *c)
{
    const double v[6] = {c->vidur_mape, c->attn_mape, c->ds_prefill_mape, c->ds_decode_mape,
                         c->sw_prompt_mape, c->sw_token_mape};
    static const char *const K[6] = {"vidur_mape", "attention_mape", "distserve_prefill_mape",
                                     "distserve_decode_mape", "splitwise_prompt_mape",
                                     "splitwise_token_mape"};
    fprintf(f, "calibrate");
    for (int i = 0; i < 6; i++) {
        if (v[i] >= 0) fprintf(f, " %s=%.2f", K[i], 100 * v[i]);
        else fprintf(f, " %s=na", K[i]);
    }
    if (c->silicon_n)
        fprintf(f, " silicon_ttft_mape=%.2f silicon_tpot_mape=%.2f", 100 * c->silicon_ttft_mape,
                100 * c->silicon_tpot_mape);
    else
        fprintf(f, " silicon_ttft_mape=na silicon_tpot_mape=na");
    fprintf(f, "\n");
}
