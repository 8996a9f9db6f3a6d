/*
 * steptrace.c -- the per-step traces of a simulation run: a CSV with one row per step of
 * every instance (start, duration, prefill and decode tokens and requests, KV usage,
 * preemptions, sampling sequences and prefill attention work; --steps-csv: what `tandem fit`
 * reads, as the vLLM adapter's recorder writes it) and a Chrome trace-event JSON that Perfetto and
 * chrome://tracing load (--chrome-trace): one process, one track (thread) per instance with
 * each step as a complete ("X") slice, counter ("C") tracks of each instance's KV usage and
 * running/waiting requests, and one track per prefill instance's outgoing KV link with each
 * transfer as a slice. Rows are written as the run goes, so memory stays flat.
 */
#include <stdio.h>
#include <string.h>

#include "engine.h"

#define KV_TRACK_BASE 100000

static const char *role_name(int role)
{
    return role == TDM_ROLE_PREFILL ? "prefill" : role == TDM_ROLE_DECODE ? "decode" : "colocated";
}

/* JSON string body of s (names come from config files: escape what must be). */
static void jstr(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
}

void tdm_sim_steptrace_begin(const tdm_sim_run_opts *o, const char *config, const tdm_sim_inst *in,
                             size_t ninst)
{
    if (o->steps_csv)
        fputs("instance,role,step,start_s,duration_s,prefill_tokens,prefill_reqs,decode_reqs,"
              "decode_context_tokens,batch_tokens,running,waiting,kv_usage,preemptions,emit_seqs,"
              "prefill_attn\n",
              o->steps_csv);
    FILE *f = o->chrome_trace;
    if (!f) return;
    fputs("{\"displayTimeUnit\": \"ms\", \"otherData\": {\"generator\": \"tandem sim\"},\n"
          "\"traceEvents\": [\n", f);
    fputs("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 0, \"args\": "
          "{\"name\": \"tandem sim: ", f);
    jstr(f, config);
    fputs("\"}}", f);
    for (size_t i = 0; i < ninst; i++) {
        fprintf(f, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %zu, "
                   "\"args\": {\"name\": \"instance %zu (%s)\"}}", i, i, role_name(in[i].role));
        fprintf(f, ",\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 1, \"tid\": %zu, "
                   "\"args\": {\"sort_index\": %zu}}", i, i);
        if (in[i].role == TDM_ROLE_PREFILL)
            fprintf(f, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %zu, "
                       "\"args\": {\"name\": \"KV link of instance %zu\"}}", KV_TRACK_BASE + i, i);
    }
}

void tdm_sim_steptrace_step(const tdm_sim_run_opts *o, const tdm_sim_inst *in, size_t idx,
                            double t, double dt, const tdm_sim_shape *sh, const tdm_batch *b)
{
    tdm_sched_stats st;
    tdm_sched_stats_init(&st);
    if (tdm_sched_get_stats(in->s, &st) != TDM_OK) memset(&st, 0, sizeof st);
    if (o->steps_csv)
        fprintf(o->steps_csv, "%zu,%s,%llu,%.6f,%.6f,%llu,%u,%u,%llu,%u,%u,%u,%.4f,%u,%u,%.0f\n",
                idx, role_name(in->role), (unsigned long long)b->step, t, dt,
                (unsigned long long)sh->prefill_tokens, sh->prefill_reqs, sh->decode_reqs,
                (unsigned long long)sh->decode_ctx, b->total_tokens, st.num_running,
                st.num_waiting, st.kv_usage, b->num_preempted, sh->emit_seqs, sh->prefill_attn);
    FILE *f = o->chrome_trace;
    if (!f) return;
    const char *name = !sh->prefill_reqs ? "decode" : !sh->decode_reqs ? "prefill" : "mixed";
    fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"step\", \"ph\": \"X\", \"pid\": 1, \"tid\": %zu, "
               "\"ts\": %.3f, \"dur\": %.3f, \"args\": {\"step\": %llu, \"prefill_tokens\": %llu, "
               "\"prefill_reqs\": %u, \"decode_reqs\": %u, \"batch_tokens\": %u, "
               "\"kv_usage\": %.4f, \"preemptions\": %u}}",
            name, idx, t * 1e6, dt * 1e6, (unsigned long long)b->step,
            (unsigned long long)sh->prefill_tokens, sh->prefill_reqs, sh->decode_reqs,
            b->total_tokens, st.kv_usage, b->num_preempted);
    /* counter tracks of the instance: KV usage and the queues */
    fprintf(f, ",\n{\"name\": \"instance %zu KV usage\", \"ph\": \"C\", \"pid\": 1, \"ts\": %.3f, "
               "\"args\": {\"kv_usage\": %.4f}}", idx, t * 1e6, st.kv_usage);
    fprintf(f, ",\n{\"name\": \"instance %zu requests\", \"ph\": \"C\", \"pid\": 1, \"ts\": %.3f, "
               "\"args\": {\"running\": %u, \"waiting\": %u}}", idx, t * 1e6, st.num_running,
            st.num_waiting);
}

void tdm_sim_steptrace_xfer(const tdm_sim_run_opts *o, size_t pre, size_t dec, uint64_t id,
                            double start, double end, double bytes)
{
    FILE *f = o->chrome_trace;
    if (!f) return;
    fprintf(f, ",\n{\"name\": \"kv %llu\", \"cat\": \"kv_transfer\", \"ph\": \"X\", \"pid\": 1, "
               "\"tid\": %zu, \"ts\": %.3f, \"dur\": %.3f, \"args\": {\"request\": %llu, "
               "\"bytes\": %.0f, \"from\": %zu, \"to\": %zu}}",
            (unsigned long long)id, KV_TRACK_BASE + pre, start * 1e6, (end - start) * 1e6,
            (unsigned long long)id, bytes, pre, dec);
}

void tdm_sim_steptrace_end(const tdm_sim_run_opts *o)
{
    if (o->chrome_trace) fputs("\n]}\n", o->chrome_trace);
}
