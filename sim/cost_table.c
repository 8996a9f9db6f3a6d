/*
 * cost_table.c -- the table cost model: the step time as the sum of measured operator
 * times, the way Vidur and aiconfigurator price a batch, and the process-wide cache of
 * loaded table sets. Per step, with T = prefill tokens + decode tokens on one rank:
 *   GEMMs        per layer QKV (m=T, n=(heads+2 kv_heads) d/tp, k=H), O (T, H, heads d/tp),
 *                up/gate (T, (2|1) I/tp, H), down (T, H, I/tp); the LM head (sampling
 *                sequences, V/tp, H) once
 *   element-wise per layer (width H + I/tp, T): norms, activation, rope, residual adds
 *   context attn per layer (heads/tp, kv_heads/tp, d, batch = prefill chunks, isl = the
 *                causal length with the same work, sqrt(2 sum c (p + c/2) / batch))
 *   decode attn  per layer (heads/tp, kv_heads/tp, d, batch = decode requests, ctx = their
 *                mean context), as Vidur summarizes a decode batch
 *   all-reduce   2 per layer of T * H * 2 bytes at the pool's TP degree
 *   overhead     hw.step_overhead_us
 * A GEMM wider (n) or taller (m) than the profiled range runs as equal slices that fit it
 * (the LM head of a 128k vocabulary as two n = 64k GEMMs), as a library would tile it.
 * An operator without a table falls back to its roofline term (sim/cost.c's formulas).
 * Lookups go through a direct-mapped memo per table set (steps repeat their shapes).
 * Every lookup outside the profiled range is counted (tdm_sim_cost.extrapolated_*).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

static tdm_sim_tableset *g_sets; /* kept for the life of the process */

const tdm_sim_tableset *tdm_sim_tableset_get(const char *const paths[TDM_SIM_OP_COUNT],
                                             const char *dir, char *err, size_t errlen)
{
    char full[TDM_SIM_OP_COUNT][512];
    char key[1024];
    size_t kl = 0;
    key[0] = '\0';
    int any = 0;
    for (int i = 0; i < TDM_SIM_OP_COUNT; i++) {
        full[i][0] = '\0';
        if (!paths[i]) continue;
        any = 1;
        int n = paths[i][0] == '/' || !dir || !*dir
                    ? snprintf(full[i], sizeof full[i], "%s", paths[i])
                    : snprintf(full[i], sizeof full[i], "%s/%s", dir, paths[i]);
        if (n < 0 || (size_t)n >= sizeof full[i]) {
            snprintf(err, errlen, "table path too long: %s", paths[i]);
            return NULL;
        }
        int w = snprintf(key + kl, sizeof key - kl, "%d=%s;", i, full[i]);
        if (w < 0 || (size_t)w >= sizeof key - kl) {
            snprintf(err, errlen, "table paths too long");
            return NULL;
        }
        kl += (size_t)w;
    }
    if (!any) {
        snprintf(err, errlen, "\"cost_model\": \"table\" needs at least one table in \"tables\"");
        return NULL;
    }
    for (tdm_sim_tableset *s = g_sets; s; s = s->next)
        if (!strcmp(s->key, key)) return s;
    tdm_sim_tableset *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    snprintf(s->key, sizeof s->key, "%s", key);
    for (int i = 0; i < TDM_SIM_OP_COUNT; i++) {
        if (!full[i][0]) continue;
        if (tdm_sim_table_load(full[i], &s->op[i], err, errlen) != 0) goto fail;
        if ((int)s->op[i].op != i) {
            snprintf(err, errlen, "%s: an \"%s\" table given as \"%s\"", full[i],
                     tdm_sim_op_name(s->op[i].op), tdm_sim_op_name((tdm_sim_op)i));
            goto fail;
        }
        s->have[i] = 1;
    }
    s->next = g_sets;
    g_sets = s;
    return s;
fail:
    for (int i = 0; i < TDM_SIM_OP_COUNT; i++) tdm_sim_table_free(&s->op[i]);
    free(s);
    return NULL;
}

#define ACT_BYTES 2.0
#define ELEM_PASSES 8.0 /* as in cost.c */

#define MEMO_BITS 13

struct tdm_sim_memo {
    double k[TDM_SIM_TABLE_MAXDIM], us;
    int op, dt, ex, valid;
};

static uint64_t memo_hash(int op, int dt, const double *k, int nd)
{
    uint64_t h = (uint64_t)(op * 2 + dt) * 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < nd; i++) {
        uint64_t b;
        memcpy(&b, &k[i], sizeof b);
        h = tdm_sim_mix64(h ^ b);
    }
    return h >> (64 - MEMO_BITS);
}

enum { PRE_QKV, PRE_O, PRE_UP, PRE_DOWN, PRE_LM, PRE_CTX, PRE_GEN, PRE_NONE = -1 };

/* One lookup in microseconds, or -1 when the set has no such table (or no usable row);
 * pre: the slot of c->pre whose exact prefix these keys may share, or PRE_NONE. */
static double look(const tdm_sim_cost *c, tdm_sim_op op, tdm_sim_dtype dt, const double *k,
                   int pre)
{
    tdm_sim_tableset *s = (tdm_sim_tableset *)c->tables; /* the memo; see sim.h */
    if (!s->have[op]) return -1;
    tdm_sim_cost *mc = (tdm_sim_cost *)c; /* the counters; see sim.h */
    int nd = s->op[op].ndim, ex = 0;
    if (!s->memo) s->memo = calloc((size_t)1 << MEMO_BITS, sizeof *s->memo);
    struct tdm_sim_memo *e = s->memo ? &s->memo[memo_hash(op, dt, k, nd)] : NULL;
    double us;
    if (e && e->valid && e->op == (int)op && e->dt == (int)dt &&
        !memcmp(e->k, k, (size_t)nd * sizeof *k)) {
        us = e->us;
        ex = e->ex;
    } else {
        int np = op == TDM_SIM_OP_GEMM ? 2 : 3;
        if (pre != PRE_NONE && c->pre[pre].ok && !memcmp(c->pre[pre].key, k, (size_t)np * sizeof *k))
            us = tdm_sim_table_lookup_in(&s->op[op], c->pre[pre].lo, c->pre[pre].hi, np, k, &ex);
        else us = tdm_sim_table_lookup(&s->op[op], dt, k, &ex);
        if (e) {
            memcpy(e->k, k, (size_t)nd * sizeof *k);
            e->us = us;
            e->op = (int)op;
            e->dt = (int)dt;
            e->ex = ex;
            e->valid = 1;
        }
    }
    mc->lookups++;
    if (ex) mc->extrapolated_lookups++;
    return us;
}

/* The GEMM's n split into slices no wider than the table (1 when it fits). */
static double n_slices(const tdm_sim_cost *c, double n)
{
    const tdm_sim_table *t = &c->tables->op[TDM_SIM_OP_GEMM];
    return n > t->kmax[0] ? ceil(n / t->kmax[0]) : 1;
}

/* Seconds of one GEMM y[m,n] = x[m,k] W[k,n]. */
static double gemm(const tdm_sim_cost *c, double m, double n, double k, int pre)
{
    if (m <= 0) return 0;
    if (c->tables->have[TDM_SIM_OP_GEMM]) {
        const tdm_sim_table *t = &c->tables->op[TDM_SIM_OP_GEMM];
        double sn = n_slices(c, n);
        double sm = m > t->kmax[2] ? ceil(m / t->kmax[2]) : 1;
        double key[3] = {n / sn, k, ceil(m / sm)};
        double us = look(c, TDM_SIM_OP_GEMM, c->gemm_dt, key, pre);
        if (us >= 0) return sn * sm * us * 1e-6;
    }
    double fl = 2 * m * n * k / c->flop_rate;
    double by = (n * k * c->model.bytes_per_param + (m * k + m * n) * ACT_BYTES) / c->byte_rate;
    return fl > by ? fl : by;
}

/* Per-rank attention heads of the model. */
static void attn_heads(const tdm_sim_model *m, double *heads, double *kvh)
{
    double tp = m->tp ? m->tp : 1;
    *heads = m->heads / tp;
    *kvh = m->kv_heads / tp;
    if (*heads < 1) *heads = 1;
    if (*kvh < 1) *kvh = 1;
}

void tdm_sim__cost_table_init(tdm_sim_cost *c)
{
    const tdm_sim_model *m = &c->model;
    const tdm_sim_tableset *s = c->tables;
    double tp = m->tp ? m->tp : 1, H = m->hidden, d = m->head_dim;
    double q = m->heads * d, kv = m->kv_heads * d, I = m->ffn;
    memset(c->pre, 0, sizeof c->pre);
    if (s->have[TDM_SIM_OP_GEMM]) {
        const double nk[5][2] = {{(q + 2 * kv) / tp, H}, {H, q / tp},
                                 {(m->gated ? 2 : 1) * I / tp, H}, {H, I / tp},
                                 {m->vocab / tp, H}};
        for (int i = 0; i < 5; i++) {
            c->pre[i].key[0] = nk[i][0] / n_slices(c, nk[i][0]);
            c->pre[i].key[1] = nk[i][1];
            c->pre[i].ok = tdm_sim_table_prefix(&s->op[TDM_SIM_OP_GEMM], c->gemm_dt,
                                                c->pre[i].key, 2, &c->pre[i].lo,
                                                &c->pre[i].hi) == 0;
        }
    }
    double heads, kvh;
    attn_heads(m, &heads, &kvh);
    for (int i = PRE_CTX; i <= PRE_GEN; i++) {
        tdm_sim_op op = i == PRE_CTX ? TDM_SIM_OP_ATTN_CTX : TDM_SIM_OP_ATTN_GEN;
        if (!s->have[op]) continue;
        c->pre[i].key[0] = heads;
        c->pre[i].key[1] = kvh;
        c->pre[i].key[2] = d;
        c->pre[i].ok = tdm_sim_table_prefix(&s->op[op], c->kv_dt, c->pre[i].key, 3,
                                            &c->pre[i].lo, &c->pre[i].hi) == 0;
    }
}

double tdm_sim_cost_table_step(const tdm_sim_cost *c, const tdm_sim_shape *s,
                               tdm_sim_cost_terms *t)
{
    const tdm_sim_model *m = &c->model;
    double T = (double)s->prefill_tokens + s->decode_reqs;
    if (t) memset(t, 0, sizeof *t);
    if (T <= 0) return 0;
    double tp = m->tp ? m->tp : 1, L = m->layers, H = m->hidden, d = m->head_dim;
    double q = m->heads * d, kv = m->kv_heads * d, I = m->ffn;
    double heads, kvh;
    attn_heads(m, &heads, &kvh);
    /* GEMMs */
    double per_layer = gemm(c, T, (q + 2 * kv) / tp, H, PRE_QKV) + gemm(c, T, H, q / tp, PRE_O) +
                       gemm(c, T, (m->gated ? 2 : 1) * I / tp, H, PRE_UP) +
                       gemm(c, T, H, I / tp, PRE_DOWN);
    double lm = m->vocab && s->emit_seqs ? gemm(c, s->emit_seqs, m->vocab / tp, H, PRE_LM) : 0;
    /* element-wise */
    double ek[2] = {H + I / tp, T};
    double ew = look(c, TDM_SIM_OP_ELEMWISE, TDM_SIM_DT_BF16, ek, PRE_NONE);
    ew = ew >= 0 ? ew * 1e-6
                 : ELEM_PASSES * (H + I / tp) * ACT_BYTES * T / c->byte_rate;
    double lin = L * (per_layer + ew) + lm;
    /* context attention */
    double ap = 0;
    if (s->prefill_reqs && s->prefill_attn > 0) {
        double b = s->prefill_reqs, isl = sqrt(2 * s->prefill_attn / b);
        double k[5] = {heads, kvh, d, b, isl < 1 ? 1 : isl};
        double us = look(c, TDM_SIM_OP_ATTN_CTX, c->kv_dt, k, PRE_CTX);
        if (us >= 0) ap = L * us * 1e-6;
        else {
            double pc = c->attn_flops_per_unit * s->prefill_attn / c->attn_flop_rate;
            double pm = c->kv_bytes_per_token * (double)s->prefill_kv_read / c->byte_rate;
            ap = pc > pm ? pc : pm;
        }
    }
    /* decode attention */
    double ad = 0;
    if (s->decode_reqs && s->decode_ctx) {
        double b = s->decode_reqs, ctx = (double)s->decode_ctx / b;
        double k[5] = {heads, kvh, d, b, ctx < 1 ? 1 : ctx};
        double us = look(c, TDM_SIM_OP_ATTN_GEN, c->kv_dt, k, PRE_GEN);
        if (us >= 0) ad = L * us * 1e-6;
        else {
            double dc = c->attn_flops_per_unit * (double)s->decode_ctx / c->attn_flop_rate;
            double dm = c->kv_bytes_per_token * (double)s->decode_ctx / c->byte_rate;
            ad = dc > dm ? dc : dm;
        }
    }
    /* all-reduce */
    double ar = 0;
    if (tp > 1) {
        double k[2] = {tp, T * H * ACT_BYTES};
        double us = look(c, TDM_SIM_OP_ALLREDUCE, TDM_SIM_DT_BF16, k, PRE_NONE);
        ar = us >= 0 ? 2 * L * us * 1e-6
                     : c->ar_count * c->ar_alpha_s + c->ar_bytes_per_token * T / c->ar_bw;
    }
    double ov = c->hw.step_overhead_us * 1e-6;
    double total = lin + ap + ad + ar + ov;
    if (t) {
        t->total_s = total;
        t->linear_s = lin;
        t->attn_prefill_s = ap;
        t->attn_decode_s = ad;
        t->allreduce_s = ar;
        t->overhead_s = ov;
    }
    return total;
}
