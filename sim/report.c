/*
 * report.c -- a run's outputs: the readable table on stdout, the JSON summary (key names
 * fixed by the issue: requests, completed, duration_s, request_throughput,
 * output_throughput_tok_s, ttft_s/tpot_s/itl_s/e2e_s {mean,p50,p90,p99}, slo {ttft_s,
 * tpot_s, attainment}, goodput_req_s, preemptions, prefix_hit_rate, steps, wall_s, ...),
 * the per-request CSV, and the side-by-side A/B table with ratios to the first config.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sim.h"

const tdm_sim_metric_def tdm_sim_ab_metrics[] = {
    {"ttft_mean", "TTFT mean (ms)", 0},   {"ttft_p50", "TTFT p50 (ms)", 0},
    {"ttft_p90", "TTFT p90 (ms)", 0},     {"ttft_p99", "TTFT p99 (ms)", 0},
    {"tpot_mean", "TPOT mean (ms)", 0},   {"tpot_p50", "TPOT p50 (ms)", 0},
    {"tpot_p90", "TPOT p90 (ms)", 0},     {"tpot_p99", "TPOT p99 (ms)", 0},
    {"itl_p50", "ITL p50 (ms)", 0},       {"itl_p99", "ITL p99 (ms)", 0},
    {"e2e_mean", "E2E mean (s)", 0},      {"e2e_p99", "E2E p99 (s)", 0},
    {"request_throughput", "throughput (req/s)", 1},
    {"output_throughput_tok_s", "output tok/s", 1},
    {"attainment", "SLO attainment (both)", 1},
    {"goodput_req_s", "goodput (req/s)", 1},
    {"completed", "completed", 1},        {"preemptions", "preemptions", 0},
    {"prefix_hit_rate", "prefix hit rate", 1},
    {"kv_usage_mean", "KV usage mean", 0}, {"steps", "steps", 0},
    {"mean_batch_tokens", "tokens per step", 1},
    {"duration_s", "simulated time (s)", 0},
};
const size_t tdm_sim_ab_num_metrics = sizeof tdm_sim_ab_metrics / sizeof tdm_sim_ab_metrics[0];

static double stat_field(const tdm_sim_stat *s, const char *f, double scale)
{
    if (!strcmp(f, "mean")) return s->mean * scale;
    if (!strcmp(f, "p50")) return s->p50 * scale;
    if (!strcmp(f, "p90")) return s->p90 * scale;
    if (!strcmp(f, "p99")) return s->p99 * scale;
    if (!strcmp(f, "max")) return s->max * scale;
    return NAN;
}

double tdm_sim_metric(const tdm_sim_summary *s, const char *key)
{
    if (!strncmp(key, "ttft_", 5)) return stat_field(&s->ttft, key + 5, 1e3);
    if (!strncmp(key, "tpot_", 5)) return stat_field(&s->tpot, key + 5, 1e3);
    if (!strncmp(key, "itl_", 4)) return stat_field(&s->itl, key + 4, 1e3);
    if (!strncmp(key, "e2e_", 4)) return stat_field(&s->e2e, key + 4, 1.0);
    if (!strcmp(key, "request_throughput")) return s->request_throughput;
    if (!strcmp(key, "output_throughput_tok_s")) return s->output_throughput_tok_s;
    if (!strcmp(key, "attainment")) return s->attainment;
    if (!strcmp(key, "goodput_req_s")) return s->goodput_req_s;
    if (!strcmp(key, "completed")) return (double)s->completed;
    if (!strcmp(key, "preemptions")) return (double)s->preemptions;
    if (!strcmp(key, "prefix_hit_rate")) return s->prefix_hit_rate;
    if (!strcmp(key, "kv_usage_mean")) return s->kv_usage_mean;
    if (!strcmp(key, "steps")) return (double)s->steps;
    if (!strcmp(key, "mean_batch_tokens")) return s->mean_batch_tokens;
    if (!strcmp(key, "duration_s")) return s->duration_s;
    if (!strcmp(key, "wall_s")) return s->wall_s;
    return NAN;
}

static void row(FILE *f, const char *name, const tdm_sim_stat *s, double scale)
{
    fprintf(f, "  %-12s %10.2f %10.2f %10.2f %10.2f %10.2f\n", name, s->mean * scale,
            s->p50 * scale, s->p90 * scale, s->p99 * scale, s->max * scale);
}

void tdm_sim_print_table(FILE *f, const tdm_sim_result *r)
{
    const tdm_sim_summary *s = &r->sum;
    fprintf(f, "  %-12s %10s %10s %10s %10s %10s\n", "", "mean", "p50", "p90", "p99", "max");
    row(f, "TTFT (ms)", &s->ttft, 1e3);
    row(f, "TPOT (ms)", &s->tpot, 1e3);
    row(f, "ITL (ms)", &s->itl, 1e3);
    row(f, "E2E (s)", &s->e2e, 1.0);
    fprintf(f, "  requests        %zu completed of %zu (%zu rejected, %zu unfinished)\n",
            s->completed, s->requests, s->rejected, s->requests - s->completed - s->rejected);
    if (s->concurrency || s->warmup)
        fprintf(f, "  load            %s%u, first %zu requests excluded as warm-up\n",
                s->concurrency ? "closed loop, concurrency " : "open loop", s->concurrency,
                s->warmup);
    fprintf(f, "  throughput      %.3f req/s, %.1f output tok/s (%.1f per GPU), %.1f total tok/s\n",
            s->request_throughput, s->output_throughput_tok_s,
            s->output_throughput_tok_s / (s->gpus ? s->gpus : 1), s->total_throughput_tok_s);
    if (r->n_classes)
        fprintf(f, "  SLO             each request its class's (without one: TTFT <= %.0f ms, TPOT <= "
                   "%.0f ms): TTFT %.1f%%   TPOT %.1f%%   both %.1f%%\n",
                s->slo_ttft_s * 1e3, s->slo_tpot_s * 1e3, 100 * s->attain_ttft,
                100 * s->attain_tpot, 100 * s->attainment);
    else
        fprintf(f, "  SLO             TTFT <= %.0f ms: %.1f%%   TPOT <= %.0f ms: %.1f%%   both: %.1f%%\n",
                s->slo_ttft_s * 1e3, 100 * s->attain_ttft, s->slo_tpot_s * 1e3,
                100 * s->attain_tpot, 100 * s->attainment);
    for (uint32_t k = 0; k < r->n_classes; k++) {
        const tdm_sim_slo_class *c = &r->classes[k];
        if (c->ttft_s > 0 || c->tpot_s > 0)
            fprintf(f, "  class %-9s TTFT <= %.0f ms, TPOT <= %.0f ms: TTFT %.1f%%, both %.1f%% of %zu\n",
                    c->name, c->ttft_s * 1e3, c->tpot_s * 1e3, 100 * s->class_attain_ttft[k],
                    100 * s->class_attain[k], s->class_n[k]);
        else
            fprintf(f, "  class %-9s best effort (no SLO): %zu requests\n", c->name, s->class_n[k]);
    }
    if (s->goodput_req_s > 0)
        fprintf(f, "  goodput         %.3f req/s (%.3f per GPU; rate scale %.3f)\n",
                s->goodput_req_s, s->goodput_req_s / (s->gpus ? s->gpus : 1), s->goodput_scale);
    else if (s->goodput_req_s == 0)
        fprintf(f, "  goodput         0 req/s: no rate down to 1/2048 of the trace's meets the target; "
                   "best attainment %.1f%% (rate scale %.4g): the SLOs are out of reach here\n",
                100 * s->goodput_best_attainment, s->goodput_best_scale);
    fprintf(f, "  preemptions     %llu\n", (unsigned long long)s->preemptions);
    fprintf(f, "  prefix hits     %.1f%% of prompt tokens looked up\n", 100 * s->prefix_hit_rate);
    fprintf(f, "  KV usage        mean %.1f%%, max %.1f%%\n", 100 * s->kv_usage_mean,
            100 * s->kv_usage_max);
    if (s->kv_transfers)
        fprintf(f, "  KV transfers    %llu, %.2f GB, mean %.2f ms (incl. queueing on the link)\n",
                (unsigned long long)s->kv_transfers, s->kv_transfer_bytes / 1e9,
                s->kv_transfer_mean_s * 1e3);
    fprintf(f, "  steps           %llu (%.1f tokens per step), %u GPU%s\n",
            (unsigned long long)s->steps, s->mean_batch_tokens, s->gpus, s->gpus == 1 ? "" : "s");
    if (s->table_model)
        fprintf(f, "  cost model      measured tables; %llu step%s extrapolated beyond them\n",
                (unsigned long long)s->extrapolated_steps, s->extrapolated_steps == 1 ? "" : "s");
    fprintf(f, "  simulated       %.1f s in %.2f s of wall time\n", s->duration_s, s->wall_s);
}

static void jnum(FILE *f, double v)
{
    if (isfinite(v)) fprintf(f, "%.10g", v);
    else fputs("null", f);
}

static void jstat(FILE *f, const char *key, const tdm_sim_stat *s)
{
    fprintf(f, "  \"%s\": {\"mean\": ", key);
    jnum(f, s->mean);
    fputs(", \"p50\": ", f);
    jnum(f, s->p50);
    fputs(", \"p90\": ", f);
    jnum(f, s->p90);
    fputs(", \"p99\": ", f);
    jnum(f, s->p99);
    fputs(", \"max\": ", f);
    jnum(f, s->max);
    fprintf(f, ", \"n\": %zu},\n", s->n);
}

static void jkey(FILE *f, const char *k, double v)
{
    fprintf(f, "  \"%s\": ", k);
    jnum(f, v);
    fputs(",\n", f);
}

static void json_escape(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void write_body(FILE *f, const tdm_sim_result *r, const char *extra)
{
    const tdm_sim_summary *s = &r->sum;
    fputs("{\n  \"name\": ", f);
    json_escape(f, r->name);
    fputs(",\n", f);
    if (extra && *extra) fprintf(f, "  %s,\n", extra);
    fprintf(f, "  \"requests\": %zu,\n  \"completed\": %zu,\n  \"rejected\": %zu,\n",
            s->requests, s->completed, s->rejected);
    jkey(f, "duration_s", s->duration_s);
    jkey(f, "request_throughput", s->request_throughput);
    jkey(f, "output_throughput_tok_s", s->output_throughput_tok_s);
    jkey(f, "total_throughput_tok_s", s->total_throughput_tok_s);
    jkey(f, "output_throughput_tok_s_per_gpu", s->output_throughput_tok_s / (s->gpus ? s->gpus : 1));
    fprintf(f, "  \"concurrency\": %u,\n  \"warmup_requests\": %zu,\n", s->concurrency, s->warmup);
    jstat(f, "ttft_s", &s->ttft);
    jstat(f, "tpot_s", &s->tpot);
    jstat(f, "itl_s", &s->itl);
    jstat(f, "e2e_s", &s->e2e);
    fputs("  \"slo\": {\"ttft_s\": ", f);
    jnum(f, s->slo_ttft_s);
    fputs(", \"tpot_s\": ", f);
    jnum(f, s->slo_tpot_s);
    fputs(", \"attainment\": ", f);
    jnum(f, s->attainment);
    fputs(", \"ttft_attainment\": ", f);
    jnum(f, s->attain_ttft);
    fputs(", \"tpot_attainment\": ", f);
    jnum(f, s->attain_tpot);
    fputs("},\n", f);
    if (r->n_classes) {
        fputs("  \"slo_classes\": [", f);
        for (uint32_t k = 0; k < r->n_classes; k++) {
            fputs(k ? ", {\"name\": " : "{\"name\": ", f);
            json_escape(f, r->classes[k].name);
            fputs(", \"ttft_s\": ", f);
            jnum(f, r->classes[k].ttft_s);
            fputs(", \"tpot_s\": ", f);
            jnum(f, r->classes[k].tpot_s);
            fprintf(f, ", \"requests\": %zu, \"ttft_attainment\": ", s->class_n[k]);
            jnum(f, s->class_attain_ttft[k]);
            fputs(", \"attainment\": ", f);
            jnum(f, s->class_attain[k]);
            fputs("}", f);
        }
        fputs("],\n", f);
    }
    if (s->goodput_req_s >= 0) {
        jkey(f, "goodput_req_s", s->goodput_req_s);
        jkey(f, "goodput_req_s_per_gpu", s->goodput_req_s / (s->gpus ? s->gpus : 1));
        jkey(f, "goodput_rate_scale", s->goodput_scale);
        jkey(f, "goodput_best_attainment", s->goodput_best_attainment);
        jkey(f, "goodput_best_rate_scale", s->goodput_best_scale);
    }
    fprintf(f, "  \"preemptions\": %llu,\n", (unsigned long long)s->preemptions);
    jkey(f, "prefix_hit_rate", s->prefix_hit_rate);
    fputs("  \"kv_usage\": {\"mean\": ", f);
    jnum(f, s->kv_usage_mean);
    fputs(", \"max\": ", f);
    jnum(f, s->kv_usage_max);
    fputs("},\n", f);
    fprintf(f, "  \"kv_transfers\": %llu,\n", (unsigned long long)s->kv_transfers);
    jkey(f, "kv_transfer_bytes", s->kv_transfer_bytes);
    fprintf(f, "  \"steps\": %llu,\n", (unsigned long long)s->steps);
    fprintf(f, "  \"cost_model\": \"%s\",\n", s->table_model ? "table" : "roofline");
    fprintf(f, "  \"extrapolated_steps\": %llu,\n", (unsigned long long)s->extrapolated_steps);
    jkey(f, "mean_batch_tokens", s->mean_batch_tokens);
    fprintf(f, "  \"gpus\": %u,\n", s->gpus);
    fputs("  \"wall_s\": ", f);
    jnum(f, s->wall_s);
    fputs("\n}", f);
}

int tdm_sim_write_json_f(FILE *f, const tdm_sim_result *r)
{
    write_body(f, r, NULL);
    return ferror(f) ? -1 : 0;
}

int tdm_sim_write_json(const char *path, const tdm_sim_result *r, const char *extra)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    write_body(f, r, extra);
    fputc('\n', f);
    return fclose(f) == 0 ? 0 : -1;
}

int tdm_sim_write_requests_csv(const char *path, const tdm_sim_result *r)
{
    if (!r->reqs) return -1; /* the run did not keep them (keep_requests) */
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs("id,arrival_s,prompt_tokens,output_tokens,generated,status,ttft_s,tpot_s,e2e_s,"
          "preemptions,instance,prefill_instance\n", f);
    static const char *const ST[] = {"unfinished", "finished", "rejected"};
    for (size_t i = 0; i < r->n; i++) {
        const tdm_sim_req_out *q = &r->reqs[i];
        double tp = tdm_sim_req_tpot(q);
        fprintf(f, "%zu,%.6f,%u,%u,%u,%s,", i, q->arrival, q->prompt_len, q->output_len,
                q->generated, ST[q->status < 3 ? q->status : 0]);
        if (q->first_token >= 0) fprintf(f, "%.6f", q->first_token - q->arrival);
        fputc(',', f);
        if (tp >= 0) fprintf(f, "%.6f", tp);
        fputc(',', f);
        if (q->status == 1) fprintf(f, "%.6f", q->finish - q->arrival);
        fprintf(f, ",%u,%d,%d\n", q->preemptions, q->instance, q->prefill_instance);
    }
    return fclose(f) == 0 ? 0 : -1;
}

/* When some config's goodput is 0: every config's highest attainment in its search (the
 * SLOs are out of reach for that one at any load), so a row of zeros says how far off. */
static void print_goodput_ceiling(FILE *f, const tdm_sim_result *const *rs, size_t n)
{
    size_t zeros = 0;
    for (size_t j = 0; j < n; j++) zeros += rs[j]->sum.goodput_req_s == 0;
    if (!zeros) return;
    fprintf(f, "  %-24s", "best attainment (%)");
    for (size_t j = 0; j < n; j++) {
        char cell[64];
        snprintf(cell, sizeof cell, "%.1f @%.3g", 100 * rs[j]->sum.goodput_best_attainment,
                 rs[j]->sum.goodput_best_scale);
        fprintf(f, " %22s", cell);
    }
    fputc('\n', f);
}

void tdm_sim_print_ab(FILE *f, const tdm_sim_result *const *rs, size_t n)
{
    fprintf(f, "  %-24s", "metric");
    for (size_t j = 0; j < n; j++) fprintf(f, " %22.22s", rs[j]->name);
    fputc('\n', f);
    for (size_t i = 0; i < tdm_sim_ab_num_metrics; i++) {
        const tdm_sim_metric_def *m = &tdm_sim_ab_metrics[i];
        double v0 = tdm_sim_metric(&rs[0]->sum, m->key);
        if (!strcmp(m->key, "goodput_req_s") && v0 < 0) continue;
        fprintf(f, "  %-24s", m->label);
        for (size_t j = 0; j < n; j++) {
            double v = tdm_sim_metric(&rs[j]->sum, m->key);
            char cell[64];
            int w = snprintf(cell, sizeof cell, "%.*f", fabs(v) >= 100 ? 1 : 3, v);
            if (j > 0) {
                if (v0 != 0) snprintf(cell + w, sizeof cell - (size_t)w, " (%.2fx)", v / v0);
                else snprintf(cell + w, sizeof cell - (size_t)w, v == 0 ? " (1.00x)" : " (-)");
            }
            fprintf(f, " %22s", cell);
        }
        fputc('\n', f);
        if (!strcmp(m->key, "goodput_req_s")) print_goodput_ceiling(f, rs, n);
    }
    fprintf(f, "  %-24s", "wall time (s)");
    for (size_t j = 0; j < n; j++) fprintf(f, " %22.2f", rs[j]->sum.wall_s);
    fputc('\n', f);
}
