/*
 * cost.c -- the step-cost model: the predicted time of one model step from the batch's
 * shape, as a roofline per operator group plus a fixed overhead.
 *   linear layers   max(2 * params * tokens / (eff_c * peak), weight bytes / (eff_m * bw))
 *                   + the element-wise kernels (norms, activation, rope, residual adds),
 *                   memory-bound at ELEM_PASSES activations per token per layer, plus a
 *                   per-layer kernel floor (TDM_SIM_LAYER_FLOOR_US: launch and tail latency)
 *   prefill attn    max(4 * L * heads * head_dim * sum chunk*(ctx + chunk/2) FLOPs,
 *                       KV bytes of (ctx + chunk) tokens)
 *   decode attn     max(4 * L * heads * head_dim * sum ctx FLOPs, sum ctx * KV bytes/token)
 *   tensor parallel every term above on 1/tp of the work, plus 2 all-reduces per layer of
 *                   tokens * hidden * 2 bytes (ring: alpha + 2 (tp-1)/tp * bytes / link bw)
 *   overhead        hw.step_overhead_us per step (launches, sampling, host work)
 * fp8 (bytes_per_param 1) halves the weight bytes and runs the GEMMs at peak_fp8_tflops
 * (the bf16 peak on GPUs without fp8 tensor cores); fp8 KV halves the KV bytes. Attention's
 * FLOPs run at their own rate (bf16 tensor cores, TDM_SIM_ATTN_REL_EFF of the GEMMs').
 * A hardware with "cost_model": "table" is priced by sim/cost_table.c instead.
 * docs/cost_model.md explains the calibration against ../shared/profiles.
 */
#include <math.h>
#include <string.h>

#include "sim.h"

/* Element-wise traffic per token per layer, in units of (hidden + ffn/tp) activations: fitted
 * to the norm/act/rope/add rows of Vidur's H100 and A100 tables (about 8 passes). */
#define ELEM_PASSES 8.0
#define ACT_BYTES 2.0

void tdm_sim_cost_init(tdm_sim_cost *c, const tdm_sim_model *m, const tdm_sim_hw *h)
{
    memset(c, 0, sizeof *c);
    c->model = *m;
    c->hw = *h;
    double tp = m->tp ? m->tp : 1;
    double layer = tdm_sim_model_layer_params(m);
    double lm = (double)m->vocab * m->hidden;
    int fp8 = m->bytes_per_param > 0 && m->bytes_per_param <= 1;
    double peak = fp8 && h->peak_fp8_tflops > h->peak_tflops ? h->peak_fp8_tflops : h->peak_tflops;
    c->flop_rate = peak * 1e12 * h->eff_compute;
    /* attention runs on bf16 tensor cores whatever the weights' precision (FlashAttention on
     * a bf16 KV cache), at its own efficiency */
    c->attn_flop_rate = h->peak_tflops * 1e12 * h->eff_compute * TDM_SIM_ATTN_REL_EFF;
    c->gemm_dt = fp8 ? TDM_SIM_DT_FP8 : TDM_SIM_DT_BF16;
    c->kv_dt = m->bytes_per_kv > 0 && m->bytes_per_kv <= 1 ? TDM_SIM_DT_FP8 : TDM_SIM_DT_BF16;
    c->tables = h->cost_model == TDM_SIM_COST_TABLE ? h->tables : NULL;
    c->byte_rate = h->hbm_gbps * 1e9 * h->eff_memory;
    c->lin_flops_per_token = 2.0 * layer * m->layers / tp;
    c->lm_flops_per_seq = 2.0 * lm / tp;
    c->weight_bytes = (layer * m->layers + lm) * m->bytes_per_param / tp;
    c->attn_flops_per_unit = 4.0 * m->layers * m->heads * (double)m->head_dim / tp;
    c->kv_bytes_per_token = tdm_sim_model_kv_bytes_per_token(m) / tp;
    c->ar_count = tp > 1 ? 2.0 * m->layers : 0;
    c->ar_bytes_per_token = tp > 1 ? 2.0 * m->layers * m->hidden * ACT_BYTES : 0;
    c->ar_alpha_s = TDM_SIM_ALLREDUCE_ALPHA_S;
    /* ring all-reduce moves 2 (tp-1)/tp of the payload over each rank's link */
    /* 0 = unknown (a profile of one GPU cannot measure the link): assume NVLink3's 300 GB/s */
    double link = h->interconnect_gbps > 0 ? h->interconnect_gbps : TDM_SIM_DEFAULT_LINK_GBPS;
    c->ar_bw = tp > 1 ? link * 1e9 / (2.0 * (tp - 1) / tp) : 1;
    if (c->tables) tdm_sim__cost_table_init(c);
}

static double roofline_step(const tdm_sim_cost *c, const tdm_sim_shape *s, tdm_sim_cost_terms *t)
{
    const tdm_sim_model *m = &c->model;
    double tokens = (double)s->prefill_tokens + s->decode_reqs;
    double tp = m->tp ? m->tp : 1;
    if (tokens <= 0) {
        if (t) memset(t, 0, sizeof *t);
        return 0;
    }
    double lc = (c->lin_flops_per_token * tokens + c->lm_flops_per_seq * s->emit_seqs) /
                c->flop_rate;
    double lm = c->weight_bytes / c->byte_rate;
    double elem = ELEM_PASSES * (m->hidden + m->ffn / tp) * ACT_BYTES * m->layers * tokens /
                  c->byte_rate;
    double lin = (lc > lm ? lc : lm) + elem + TDM_SIM_LAYER_FLOOR_US * 1e-6 * m->layers;
    double pc = c->attn_flops_per_unit * s->prefill_attn / c->attn_flop_rate;
    double pm = c->kv_bytes_per_token * (double)s->prefill_kv_read / c->byte_rate;
    double dc = c->attn_flops_per_unit * (double)s->decode_ctx / c->attn_flop_rate;
    double dm = c->kv_bytes_per_token * (double)s->decode_ctx / c->byte_rate;
    double ap = pc > pm ? pc : pm, ad = dc > dm ? dc : dm;
    double ar = c->ar_count > 0 ? c->ar_count * c->ar_alpha_s +
                                      c->ar_bytes_per_token * tokens / c->ar_bw
                                : 0;
    double ov = c->hw.step_overhead_us * 1e-6;
    double total = lin + ap + ad + ar + ov;
    if (t) {
        t->total_s = total;
        t->linear_s = lin;
        t->linear_compute_s = lc;
        t->linear_memory_s = lm;
        t->linear_compute_bound = lc > lm;
        t->attn_prefill_s = ap;
        t->attn_decode_s = ad;
        t->attn_compute_s = pc + dc;
        t->attn_memory_s = pm + dm;
        t->allreduce_s = ar;
        t->overhead_s = ov;
    }
    return total;
}

/* hw.time_scale applied to a step's time and to each of its terms */
static double scaled(const tdm_sim_cost *c, double r, tdm_sim_cost_terms *t)
{
    double k = c->hw.time_scale;
    if (k <= 0 || k == 1) return r;
    if (t) {
        double *f[] = {&t->total_s, &t->linear_s, &t->linear_compute_s, &t->linear_memory_s,
                       &t->attn_prefill_s, &t->attn_decode_s, &t->attn_compute_s,
                       &t->attn_memory_s, &t->allreduce_s, &t->overhead_s};
        for (size_t i = 0; i < sizeof f / sizeof *f; i++) *f[i] *= k;
    }
    return r * k;
}

double tdm_sim_cost_step(const tdm_sim_cost *c, const tdm_sim_shape *s, tdm_sim_cost_terms *t)
{
    if (!c->tables) return scaled(c, roofline_step(c, s, t), t);
    tdm_sim_cost *mc = (tdm_sim_cost *)c; /* the counters; see sim.h */
    uint64_t ex = c->extrapolated_lookups;
    double r = tdm_sim_cost_table_step(c, s, t);
    mc->steps++;
    if (c->extrapolated_lookups != ex) mc->extrapolated_steps++;
    return scaled(c, r, t);
}

double tdm_sim_cost_estimate_cb(void *ctx, const tdm_step_shape *sh)
{
    const tdm_sim_cost *c = ctx;
    if (!c || !sh) return 0;
    tdm_sim_shape s;
    memset(&s, 0, sizeof s);
    s.prefill_tokens = sh->num_prefill_tokens;
    s.prefill_reqs = sh->num_prefill_reqs;
    s.decode_reqs = sh->num_decode_tokens > sh->num_decode_reqs ? sh->num_decode_tokens
                                                                : sh->num_decode_reqs;
    s.emit_seqs = sh->num_decode_reqs + sh->num_prefill_reqs;
    s.decode_ctx = sh->decode_context_tokens;
    s.prefill_attn = (double)sh->prefill_attn_work;
    s.prefill_kv_read = 0;
    /* the scheduler's estimates are not steps: keep the counters as they were */
    tdm_sim_cost *mc = (tdm_sim_cost *)c;
    uint64_t k[4] = {c->steps, c->extrapolated_steps, c->lookups, c->extrapolated_lookups};
    double r = tdm_sim_cost_step(c, &s, NULL);
    mc->steps = k[0];
    mc->extrapolated_steps = k[1];
    mc->lookups = k[2];
    mc->extrapolated_lookups = k[3];
    return r;
}

double tdm_sim_cost_activation_bytes(const tdm_sim_cost *c, uint32_t max_batched_tokens,
                                     uint32_t max_num_seqs)
{
    const tdm_sim_model *m = &c->model;
    double tp = m->tp ? m->tp : 1;
    /* the MLP of one layer holds the gate/up output (2 ffn/tp), the activation's output
     * (ffn/tp) and the residual stream's buffers (about 4 hidden) per token, in bf16 */
    double fwd = (double)max_batched_tokens * (3.0 * m->ffn / tp + 4.0 * m->hidden) * ACT_BYTES;
    /* the sampler's dummy run: fp32 logits and probabilities for every sequence */
    double smp = (double)max_num_seqs * m->vocab * 4.0 * 2.0;
    return fwd + smp;
}

uint32_t tdm_sim_cost_num_blocks(const tdm_sim_cost *c, uint32_t block_size, double mem_util,
                                 uint32_t max_batched_tokens, uint32_t max_num_seqs)
{
    const tdm_sim_model *m = &c->model;
    if (c->hw.mem_gib <= 0 || block_size == 0) return 0;
    double tp = m->tp ? m->tp : 1;
    double gib = 1073741824.0;
    double weights = tdm_sim_model_params(m) * m->bytes_per_param / tp;
    double non_torch = (TDM_SIM_NON_TORCH_GIB + (tp > 1 ? TDM_SIM_NCCL_GIB : 0)) * gib;
    double avail = c->hw.mem_gib * gib * mem_util - weights -
                   tdm_sim_cost_activation_bytes(c, max_batched_tokens, max_num_seqs) - non_torch;
    if (avail <= 0) return 0;
    double blocks = floor(avail / (c->kv_bytes_per_token * block_size));
    if (blocks > 4e9) blocks = 4e9;
    return (uint32_t)blocks;
}
