/*
 * cmd_demo.c -- `tandem demo`: a small built-in scheduling demo. Four requests of different
 * lengths go to one scheduler (token budget 64, chunked prefill) on the llama-3-8b / h100-sxm
 * cost model; every step prints which requests ran, how many tokens each computed, whether
 * it was a prefill chunk or a decode, the step's predicted time and what finished.
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "../sim/sim.h"

int tdm_cmd_demo(int argc, char **argv)
{
    int quiet = argc > 1 && !strcmp(argv[1], "--quiet");
    tdm_sim_model m;
    tdm_sim_hw h;
    tdm_sim_model_preset("llama-3-8b", &m);
    tdm_sim_hw_preset("h100-sxm", &h);
    tdm_sim_cost cost;
    tdm_sim_cost_init(&cost, &m, &h);
    tdm_sched *s;
    int rc = tdm_sched_create(&s);
    if (rc != TDM_OK) {
        fprintf(stderr, "tandem demo: %s\n", tdm_strerror(rc));
        return 1;
    }
    rc = tdm_sched_configure(s, "{\"max_num_batched_tokens\": 64, \"max_num_seqs\": 4, "
                                "\"num_blocks\": 64, \"block_size\": 16}");
    if (rc != TDM_OK) {
        fprintf(stderr, "tandem demo: configure: %s\n", tdm_sched_errmsg(s));
        tdm_sched_destroy(s);
        return 1;
    }
    static const uint32_t plen[4] = {100, 20, 40, 20}, olen[4] = {3, 5, 2, 4};
    static const double arr[4] = {0, 0, 0.002, 0.004};
    tdm_token toks[128];
    uint32_t total[4] = {0}, done = 0, added = 0;
    double now = 0;
    printf("tandem demo: 4 requests, token budget 64, llama-3-8b on h100-sxm cost model\n");
    for (int step = 0; step < 64 && done < 4; step++) {
        while (added < 4 && arr[added] <= now) {
            for (uint32_t k = 0; k < plen[added]; k++)
                toks[k] = (tdm_token)(k < 16 && added >= 2 ? 7 + k : 100 * (added + 1) + k);
            tdm_request_desc d;
            tdm_request_desc_init(&d);
            d.id = added;
            d.prompt = toks;
            d.num_prompt_tokens = plen[added];
            d.max_tokens = olen[added];
            d.arrival_time = arr[added];
            if ((rc = tdm_sched_add(s, &d)) != TDM_OK) {
                fprintf(stderr, "tandem demo: add: %s\n", tdm_sched_errmsg(s));
                tdm_sched_destroy(s);
                return 1;
            }
            total[added] = plen[added];
            printf("t=%7.2f ms  + request %u arrives: %u prompt tokens, %u to generate\n",
                   now * 1e3, added, plen[added], olen[added]);
            added++;
        }
        tdm_batch b;
        tdm_batch_init(&b);
        if ((rc = tdm_sched_step(s, now, &b)) != TDM_OK) break;
        if (b.num_reqs == 0) {
            if (added < 4) now = arr[added];
            continue;
        }
        tdm_sim_shape sh = {0};
        uint64_t ids[8];
        uint32_t offs[9], nt = 0;
        tdm_token out[8];
        char line[512];
        int w = snprintf(line, sizeof line, "t=%7.2f ms  step %2llu:", now * 1e3,
                         (unsigned long long)b.step);
        for (uint32_t i = 0; i < b.num_reqs && i < 8; i++) {
            uint64_t id = b.req_ids[i];
            uint32_t n = b.num_tokens[i], c = b.num_computed[i];
            int emits = c + n >= total[id];
            int decode = n == 1 && emits && total[id] > plen[id];
            if (decode) {
                sh.decode_reqs++;
                sh.decode_ctx += c + 1;
            } else {
                sh.prefill_tokens += n;
                sh.prefill_attn += n * (c + n / 2.0);
                sh.prefill_kv_read += c + n;
            }
            sh.emit_seqs += emits;
            ids[i] = id;
            offs[i] = nt;
            if (emits) out[nt++] = 5;
            if (w < (int)sizeof line)
                w += snprintf(line + w, sizeof line - (size_t)w, "  r%llu %s %u tok%s",
                              (unsigned long long)id, decode ? "decode" : "prefill", n,
                              b.kinds[i] == TDM_ENTRY_NEW ? " (new)" : "");
        }
        offs[b.num_reqs] = nt;
        double dt = tdm_sim_cost_step(&cost, &sh, NULL);
        if (!quiet) printf("%s   [%.2f ms]\n", line, dt * 1e3);
        now += dt;
        tdm_step_output so;
        tdm_step_output_init(&so);
        so.num_reqs = b.num_reqs;
        so.req_ids = ids;
        so.token_offsets = offs;
        so.tokens = out;
        so.now = now;
        tdm_update_result ur;
        tdm_update_result_init(&ur);
        if ((rc = tdm_sched_update(s, &so, &ur)) != TDM_OK) break;
        for (uint32_t j = 0; j < ur.num_reqs; j++) {
            total[ur.req_ids[j]] += ur.num_new_tokens[j];
            if (ur.finish_reasons[j] != TDM_FINISH_NONE) {
                printf("t=%7.2f ms  - request %llu finished (%u tokens generated)\n", now * 1e3,
                       (unsigned long long)ur.req_ids[j], total[ur.req_ids[j]] - plen[ur.req_ids[j]]);
                done++;
            }
        }
    }
    if (rc != TDM_OK) fprintf(stderr, "tandem demo: %s\n", tdm_sched_errmsg(s));
    tdm_sched_stats st;
    tdm_sched_stats_init(&st);
    tdm_sched_get_stats(s, &st);
    printf("done: %u of 4 requests in %.2f ms, %llu steps, prefix-cache hits %llu of %llu tokens\n",
           done, now * 1e3, (unsigned long long)st.steps, (unsigned long long)st.prefix_hits,
           (unsigned long long)st.prefix_queries);
    tdm_sched_destroy(s);
    return rc == TDM_OK && done == 4 ? 0 : 1;
}
