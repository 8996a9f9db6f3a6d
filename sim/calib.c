/*
 * calib.c -- the cost model against measured tables (../shared/profiles), so that the
 * errors quoted in docs/cost_model.md are reproducible (`tandem cost --calibrate`, and the
 * test test_calibration). Three sources:
 *   Vidur      per-operator medians per layer (Llama-2-7B on A100 and H100, Llama-2-70B on
 *              H100, TP 1/2/4/8) vs tokens: the GEMMs and element-wise ops of one layer
 *              against the model's linear term for one layer;
 *   DistServe  fitted A100 latency models (ms): prefill a + b*l + c*l^2 for one prompt of l
 *              tokens, decode a + b*sum(ctx) + c*batch (small/large batch fits), for OPT-13B
 *              and OPT-66B at several TP degrees, sampled on a grid;
 *   Splitwise  measured vLLM prompt and per-token times (ms) of Llama-2-70B on A100/H100,
 *              TP 2/4/8, batch 1-64, prompts 128-8192.
 * Each error is a mean absolute percentage error over the rows or grid points.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

char *tdm_sim__slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = '\0';
        *len = (size_t)n;
    }
    return b;
}

/* Split a CSV line in place; returns the field count. */
int tdm_sim__csv_fields(char *line, char **f, int max)
{
    int n = 0;
    char *p = line;
    while (n < max) {
        f[n++] = p;
        char *c = strchr(p, ',');
        if (!c) break;
        *c = '\0';
        p = c + 1;
    }
    return n;
}

int tdm_sim__csv_col(char **hdr, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(hdr[i], name)) return i;
    return -1;
}

#define MAXF 128

int tdm_sim__vidur_rows(const char *path, tdm_sim__vidur_row **rows, size_t *count)
{
    size_t len;
    *rows = NULL;
    *count = 0;
    char *buf = tdm_sim__slurp(path, &len);
    if (!buf) return -1;
    char *save = NULL, *line = strtok_r(buf, "\n", &save);
    char *hdr[MAXF], *f[MAXF];
    char *hline = line ? strdup(line) : NULL;
    int nh = hline ? tdm_sim__csv_fields(hline, hdr, MAXF) : 0;
    static const char *const GEMM[4] = {"attn_pre_proj", "attn_post_proj", "mlp_up_proj",
                                        "mlp_down_proj"};
    static const char *const EW[5] = {"input_layernorm", "post_attention_layernorm", "attn_rope",
                                      "mlp_act", "add"};
    int gc[4], ec[5], ce = tdm_sim__csv_col(hdr, nh, "n_embd"), ch = tdm_sim__csv_col(hdr, nh, "n_head"),
        ck = tdm_sim__csv_col(hdr, nh, "n_kv_head"), ci = tdm_sim__csv_col(hdr, nh, "n_expanded_embd"),
        ct = tdm_sim__csv_col(hdr, nh, "num_tokens"), cp = tdm_sim__csv_col(hdr, nh, "num_tensor_parallel_workers");
    char name[64];
    int ok = ce >= 0 && ch >= 0 && ck >= 0 && ci >= 0 && ct >= 0 && cp >= 0;
    for (int i = 0; i < 4 && ok; i++) {
        snprintf(name, sizeof name, "time_stats.%s.median", GEMM[i]);
        ok = (gc[i] = tdm_sim__csv_col(hdr, nh, name)) >= 0;
    }
    for (int i = 0; i < 5 && ok; i++) {
        snprintf(name, sizeof name, "time_stats.%s.median", EW[i]);
        ok = (ec[i] = tdm_sim__csv_col(hdr, nh, name)) >= 0;
    }
    size_t n = 0, cap = 0;
    tdm_sim__vidur_row *out = NULL;
    while (ok && (line = strtok_r(NULL, "\n", &save))) {
        if (tdm_sim__csv_fields(line, f, MAXF) != nh) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            tdm_sim__vidur_row *nr = realloc(out, cap * sizeof *nr);
            if (!nr) {
                ok = 0;
                break;
            }
            out = nr;
        }
        tdm_sim__vidur_row *r = &out[n++];
        r->tp = atof(f[cp]);
        r->tokens = atof(f[ct]);
        r->H = atof(f[ce]);
        r->heads = atof(f[ch]);
        r->kvh = atof(f[ck]);
        r->I = atof(f[ci]);
        r->ew_ms = 0;
        for (int i = 0; i < 4; i++) r->gemm_ms[i] = atof(f[gc[i]]);
        for (int i = 0; i < 5; i++) r->ew_ms += atof(f[ec[i]]);
    }
    free(hline);
    free(buf);
    if (!ok) {
        free(out);
        return -1;
    }
    *rows = out;
    *count = n;
    return 0;
}

static double vidur_file(const char *path, const char *hwname, FILE *out, size_t *count)
{
    tdm_sim__vidur_row *rows;
    size_t nrows;
    tdm_sim_hw hw;
    *count = 0;
    if (tdm_sim_hw_preset(hwname, &hw) != 0 || tdm_sim__vidur_rows(path, &rows, &nrows) != 0) return -1;
    double sum = 0, worst = 0;
    size_t n = 0;
    for (size_t k = 0; k < nrows; k++) {
        const tdm_sim__vidur_row *r = &rows[k];
        tdm_sim_model m;
        memset(&m, 0, sizeof m);
        m.layers = 1;
        m.hidden = (uint32_t)r->H;
        m.heads = (uint32_t)r->heads;
        m.kv_heads = (uint32_t)r->kvh;
        m.head_dim = m.hidden / (m.heads ? m.heads : 1);
        m.ffn = (uint32_t)r->I;
        m.vocab = 0;
        m.gated = 1;
        m.tp = (uint32_t)r->tp;
        m.bytes_per_param = m.bytes_per_kv = 2;
        double meas = r->ew_ms;
        for (int i = 0; i < 4; i++) meas += r->gemm_ms[i];
        if (r->tokens <= 0 || meas <= 0 || !m.tp) continue;
        tdm_sim_cost c;
        tdm_sim_hw h0 = hw;
        h0.step_overhead_us = 0;
        tdm_sim_cost_init(&c, &m, &h0);
        c.ar_count = 0; /* all-reduce is not in these rows */
        tdm_sim_shape s = {0};
        s.decode_reqs = (uint32_t)r->tokens;
        double pred = tdm_sim_cost_step(&c, &s, NULL) * 1e3;
        double e = fabs(pred - meas) / meas;
        if (e > worst) worst = e;
        sum += e;
        n++;
    }
    free(rows);
    if (out && n)
        fprintf(out, "  vidur %-28s %4zu rows  MAPE %5.1f%%  (worst %5.1f%%)\n", path + (strrchr(path, '/') ? strrchr(path, '/') - path + 1 : 0),
                n, 100 * sum / (double)n, 100 * worst);
    *count = n;
    return n ? sum : -1;
}

static void distserve(const char *path, FILE *out, tdm_sim_calib *cal)
{
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) return;
    double sp = 0, sd = 0;
    size_t np = 0, nd = 0;
    const char *mname;
    json_t *mv;
    json_object_foreach(o, mname, mv) {
        const char *preset = strstr(mname, "opt-13b") ? "opt-13b" : strstr(mname, "opt-66b") ? "opt-66b" : NULL;
        if (!preset) continue;
        const char *tpk;
        json_t *tv;
        json_object_foreach(mv, tpk, tv) {
            tdm_sim_model m;
            tdm_sim_hw h;
            tdm_sim_model_preset(preset, &m);
            tdm_sim_hw_preset("a100-80g", &h);
            m.tp = (uint32_t)atoi(tpk);
            if (!m.tp) continue;
            tdm_sim_cost c;
            tdm_sim_cost_init(&c, &m, &h);
            json_t *pf = json_object_get(tv, "prefill"), *ds = json_object_get(tv, "decoding_smallbs"),
                   *dl = json_object_get(tv, "decoding_largebs");
            json_t *th = json_object_get(tv, "decoding_large_small_bs_threshold");
            if (!json_is_array(pf) || !json_is_array(ds) || !json_is_array(dl)) continue;
            double thr = th ? json_number_value(th) : 95;
            double a = json_number_value(json_array_get(pf, 0)), b = json_number_value(json_array_get(pf, 1)),
                   cc = json_number_value(json_array_get(pf, 2));
            double lp = 0, ld = 0;
            size_t kp = 0, kd = 0;
            static const double L[] = {128, 256, 512, 1024, 1536, 2000};
            for (size_t i = 0; i < sizeof L / sizeof L[0]; i++) {
                double l = L[i], meas = a + b * l + cc * l * l;
                tdm_sim_shape s = {0};
                s.prefill_tokens = (uint64_t)l;
                s.prefill_reqs = 1;
                s.emit_seqs = 1;
                s.prefill_attn = l * l / 2;
                s.prefill_kv_read = (uint64_t)l;
                double pred = tdm_sim_cost_step(&c, &s, NULL) * 1e3;
                lp += fabs(pred - meas) / meas;
                kp++;
            }
            static const double B[] = {1, 8, 32, 64, 128, 256};
            static const double C[] = {256, 512, 1024};
            for (size_t i = 0; i < sizeof B / sizeof B[0]; i++)
                for (size_t j = 0; j < sizeof C / sizeof C[0]; j++) {
                    json_t *co = B[i] < thr ? ds : dl;
                    double meas = json_number_value(json_array_get(co, 0)) +
                                  json_number_value(json_array_get(co, 1)) * B[i] * C[j] +
                                  json_number_value(json_array_get(co, 2)) * B[i];
                    tdm_sim_shape s = {0};
                    s.decode_reqs = (uint32_t)B[i];
                    s.emit_seqs = (uint32_t)B[i];
                    s.decode_ctx = (uint64_t)(B[i] * C[j]);
                    double pred = tdm_sim_cost_step(&c, &s, NULL) * 1e3;
                    ld += fabs(pred - meas) / meas;
                    kd++;
                }
            if (out)
                fprintf(out, "  distserve %-8s tp%-2s prefill MAPE %5.1f%% (%zu pts), decode MAPE "
                             "%5.1f%% (%zu pts)\n", preset, tpk, 100 * lp / kp, kp, 100 * ld / kd, kd);
            sp += lp;
            np += kp;
            sd += ld;
            nd += kd;
        }
    }
    json_decref(o);
    cal->ds_prefill_mape = np ? sp / np : -1;
    cal->ds_prefill_n = np;
    cal->ds_decode_mape = nd ? sd / nd : -1;
    cal->ds_decode_n = nd;
}

static void splitwise(const char *path, FILE *out, tdm_sim_calib *cal)
{
    size_t len;
    char *buf = tdm_sim__slurp(path, &len);
    if (!buf) return;
    char *save = NULL, *line = strtok_r(buf, "\n", &save);
    char *hdr[32], *f[32];
    char *hl = line ? strdup(line) : NULL;
    int nh = hl ? tdm_sim__csv_fields(hl, hdr, 32) : 0;
    int cm = tdm_sim__csv_col(hdr, nh, "model"), chw = tdm_sim__csv_col(hdr, nh, "hardware"), cps = tdm_sim__csv_col(hdr, nh, "prompt_size"),
        cbs = tdm_sim__csv_col(hdr, nh, "batch_size"), cts = tdm_sim__csv_col(hdr, nh, "token_size"),
        cpt = tdm_sim__csv_col(hdr, nh, "prompt_time"), ctt = tdm_sim__csv_col(hdr, nh, "token_time"),
        ctp = tdm_sim__csv_col(hdr, nh, "tensor_parallel");
    double sp = 0, st = 0;
    size_t n = 0;
    double per[2][2] = {{0}};
    size_t pn[2] = {0};
    size_t cap = 1024, nr = 0;
    double *rows = malloc(cap * 5 * sizeof *rows); /* hw, pred prompt, meas, pred token, meas (no overhead) */
    while (cm >= 0 && chw >= 0 && cps >= 0 && cbs >= 0 && cts >= 0 && cpt >= 0 && ctt >= 0 &&
           ctp >= 0 && (line = strtok_r(NULL, "\n", &save))) {
        if (tdm_sim__csv_fields(line, f, 32) != nh) continue;
        if (strcmp(f[cm], "llama2-70b")) continue;
        int h100 = !strcmp(f[chw], "h100-80gb");
        if (!h100 && strcmp(f[chw], "a100-80gb")) continue;
        tdm_sim_model m;
        tdm_sim_hw h;
        tdm_sim_model_preset("llama-2-70b", &m);
        tdm_sim_hw_preset(h100 ? "h100-sxm" : "a100-80g", &h);
        m.tp = (uint32_t)atoi(f[ctp]);
        double ps = atof(f[cps]), bs = atof(f[cbs]), ts = atof(f[cts]);
        double mp = atof(f[cpt]), mt = atof(f[ctt]);
        if (!m.tp || ps <= 0 || bs <= 0 || mp <= 0 || mt <= 0) continue;
        tdm_sim_cost c;
        tdm_sim_cost_init(&c, &m, &h);
        tdm_sim_shape s = {0};
        s.prefill_tokens = (uint64_t)(ps * bs);
        s.prefill_reqs = (uint32_t)bs;
        s.emit_seqs = (uint32_t)bs;
        s.prefill_attn = bs * ps * ps / 2;
        s.prefill_kv_read = (uint64_t)(ps * bs);
        double pp = tdm_sim_cost_step(&c, &s, NULL) * 1e3;
        tdm_sim_shape d = {0};
        d.decode_reqs = (uint32_t)bs;
        d.emit_seqs = (uint32_t)bs;
        d.decode_ctx = (uint64_t)(bs * (ps + ts / 2));
        double pt = tdm_sim_cost_step(&c, &d, NULL) * 1e3;
        double ep = fabs(pp - mp) / mp, et = fabs(pt - mt) / mt;
        if (rows && nr == cap) {
            double *nrw = realloc(rows, cap * 2 * 5 * sizeof *rows);
            if (!nrw) {
                free(rows);
                rows = NULL;
            } else {
                rows = nrw;
                cap *= 2;
            }
        }
        if (rows) {
            double ov = h.step_overhead_us * 1e-3;
            double *q = rows + nr++ * 5;
            q[0] = h100;
            q[1] = pp - ov;
            q[2] = mp;
            q[3] = pt - ov;
            q[4] = mt;
        }
        sp += ep;
        st += et;
        per[h100][0] += ep;
        per[h100][1] += et;
        pn[h100]++;
        n++;
    }
    free(hl);
    free(buf);
    for (int k = 0; k < 2 && out; k++)
        if (pn[k])
            fprintf(out, "  splitwise llama2-70b %s  %4zu rows  prompt MAPE %5.1f%%, token MAPE %5.1f%%\n",
                    k ? "h100" : "a100", pn[k], 100 * per[k][0] / pn[k], 100 * per[k][1] / pn[k]);
    /* The same form with the per-step overhead refitted to this software stack (2023 vLLM
     * with Ray workers): the median residual of every prompt and token time per GPU. */
    for (int k = 0; k < 2 && rows && nr; k++) {
        double *res = malloc(nr * 2 * sizeof *res);
        size_t m = 0;
        for (size_t i = 0; res && i < nr; i++)
            if ((int)rows[i * 5] == k) {
                res[m++] = rows[i * 5 + 2] - rows[i * 5 + 1];
                res[m++] = rows[i * 5 + 4] - rows[i * 5 + 3];
            }
        if (!res || !m) {
            free(res);
            continue;
        }
        for (size_t i = 1; i < m; i++)
            for (size_t j = i; j > 0 && res[j] < res[j - 1]; j--) {
                double x = res[j];
                res[j] = res[j - 1];
                res[j - 1] = x;
            }
        double ov = res[m / 2], ep = 0, et = 0;
        size_t c = 0;
        for (size_t i = 0; i < nr; i++)
            if ((int)rows[i * 5] == k) {
                ep += fabs(rows[i * 5 + 1] + ov - rows[i * 5 + 2]) / rows[i * 5 + 2];
                et += fabs(rows[i * 5 + 3] + ov - rows[i * 5 + 4]) / rows[i * 5 + 4];
                c++;
            }
        if (out)
            fprintf(out, "  splitwise llama2-70b %s  with step_overhead_us refitted to %.0f: prompt "
                         "MAPE %5.1f%%, token MAPE %5.1f%%\n",
                    k ? "h100" : "a100", ov * 1e3, 100 * ep / c, 100 * et / c);
        if (k == 1) {
            cal->sw_refit_overhead_ms = ov;
            cal->sw_refit_prompt_mape = ep / c;
            cal->sw_refit_token_mape = et / c;
        }
        free(res);
    }
    free(rows);
    cal->sw_prompt_mape = n ? sp / n : -1;
    cal->sw_token_mape = n ? st / n : -1;
    cal->sw_prompt_n = cal->sw_token_n = n;
}

int tdm_sim_calibrate(const char *dir, FILE *out, tdm_sim_calib *cal)
{
    memset(cal, 0, sizeof *cal);
    cal->vidur_linear_mape = cal->ds_prefill_mape = cal->ds_decode_mape = -1;
    cal->sw_prompt_mape = cal->sw_token_mape = -1;
    char path[1024];
    int tables = 0;
    if (out) fprintf(out, "cost model vs measured tables under %s/profiles\n", dir);
    static const char *const VF[3][2] = {{"a100_llama2_7b_mlp.csv", "a100-80g"},
                                         {"h100_llama2_7b_mlp.csv", "h100-sxm"},
                                         {"h100_llama2_70b_mlp.csv", "h100-sxm"}};
    double vs = 0;
    size_t vn = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/profiles/vidur/%s", dir, VF[i][0]);
        size_t k = 0;
        double s = vidur_file(path, VF[i][1], out, &k);
        if (s >= 0) {
            vs += s;
            vn += k;
            tables++;
        }
    }
    cal->vidur_linear_mape = vn ? vs / vn : -1;
    cal->vidur_n = vn;
    snprintf(path, sizeof path, "%s/profiles/distserve/profiler-a100-80g.distserve.json", dir);
    distserve(path, out, cal);
    tables += cal->ds_prefill_n > 0;
    snprintf(path, sizeof path, "%s/profiles/splitwise/perf_model.csv", dir);
    splitwise(path, out, cal);
    tables += cal->sw_prompt_n > 0;
    if (out && tables) {
        fprintf(out, "summary (MAPE): vidur linear %.1f%% (%zu rows); distserve prefill %.1f%%, "
                     "decode %.1f%%; splitwise prompt %.1f%%, token %.1f%% (%zu rows)\n",
                100 * cal->vidur_linear_mape, cal->vidur_n, 100 * cal->ds_prefill_mape,
                100 * cal->ds_decode_mape, 100 * cal->sw_prompt_mape, 100 * cal->sw_token_mape,
                cal->sw_prompt_n);
    }
    return tables;
}
