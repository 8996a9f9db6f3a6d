/*
 * update.c -- applying the host's report of a step (vLLM's update_from_output): sampled
 * tokens are appended one by one with the stop checks (length, min_tokens, EOS, stop
 * tokens) and trimmed after a stop; rejected drafts take back num_computed_tokens; timings
 * are recorded; finished requests free (or hold) their blocks. The whole report is
 * validated before anything is applied.
 *
 * Which entries a report may hold: every scheduled step of a request is recorded when the
 * batch is returned (tdm__pend_push) and consumed by the update that reports it, in step
 * order. An entry for a request with no step awaiting its output (unknown, never scheduled
 * since its last update, or a replayed update) is refused with TDM_E_STATE, and so are
 * sampled tokens for a step that neither completed the prompt nor decoded (a non-final
 * prefill chunk). A host that does not pipeline steps therefore reports exactly the requests
 * of the step just returned; one that keeps two batches in flight reports each batch once.
 * A request finished (aborted) after it was scheduled still consumes its step: its output is
 * skipped, as in vLLM, and a finished request already reported is freed by the update of its
 * last awaited step. With async scheduling the returned tokens resolve output placeholders.
 */
#include <math.h>
#include <string.h>

#include "sched_internal.h"

static bool takes_output(const tdm__req *r)
{
    /* A preempted request's late output is still applied (vLLM test_preempt_during_execution). */
    return r->tokens && (r->state == TDM_STATE_RUNNING || r->state == TDM_STATE_PREEMPTED);
}

/* Whether the oldest awaited step of r may bring sampled tokens (r->pend_n > 0). A step
 * more than 64 steps old is a non-final prefill chunk: only the newest step of a request
 * can reach the end of its tokens, unless it was preempted and rescheduled with 64 chunks
 * in flight, where a late token is refused rather than misapplied. */
static bool pend_oldest_samples(const tdm__req *r)
{
    uint32_t i = r->pend_n - 1;
    return i < 64 && ((r->pend_bits >> i) & 1u);
}

static void pend_pop(tdm__req *r)
{
    r->pend_n--;
    if (r->pend_n < 64) r->pend_bits &= ~(1ull << r->pend_n);
}

/* Validate the whole report; remember each request record in upd_reqs. */
static int validate(tdm_sched *s, const tdm_step_output *o)
{
    if (!TDM_STRUCT_OK(o, sizeof(tdm_step_output)))
        return tdm__fail(&s->err, TDM_E_INVAL, "update: output is NULL or its struct_size is too small");
    if (!isfinite(o->now) || o->now < 0)
        return tdm__fail(&s->err, TDM_E_INVAL, "update: now (%g) must be finite and >= 0", o->now);
    if (o->num_reqs == 0) return TDM_OK;
    if (!o->req_ids || !o->token_offsets)
        return tdm__fail(&s->err, TDM_E_INVAL, "update: req_ids or token_offsets is NULL");
    if (o->token_offsets[0] != 0)
        return tdm__fail(&s->err, TDM_E_INVAL, "update: token_offsets[0] must be 0");
    if (o->token_offsets[o->num_reqs] && !o->tokens)
        return tdm__fail(&s->err, TDM_E_INVAL, "update: tokens is NULL");
    if (tdm__vec_reserve(&s->upd_reqs, o->num_reqs, sizeof(tdm__req *)))
        return tdm__fail(&s->err, TDM_E_NOMEM, "update: out of memory");
    tdm__req **found = s->upd_reqs.data;
    uint64_t stamp = ++s->update_no;
    for (uint32_t i = 0; i < o->num_reqs; i++) {
        uint32_t a = o->token_offsets[i], b = o->token_offsets[i + 1];
        if (b < a)
            return tdm__fail(&s->err, TDM_E_INVAL, "update: token_offsets decrease at %u", i);
        for (uint32_t k = a; k < b; k++)
            if (o->tokens[k] < 0)
                return tdm__fail(&s->err, TDM_E_INVAL, "update: request %llu token %u is negative (%d)",
                                 (unsigned long long)o->req_ids[i], k - a, o->tokens[k]);
        /* Hosts report in batch order: the step's entry gives the record without a lookup.
         * (Entries stay valid until the next step: nothing scheduled in it is freed before.) */
        tdm__req *r = i < s->num_entries && s->entries[i].req->id == o->req_ids[i]
                          ? s->entries[i].req
                          : tdm__map_get(s, o->req_ids[i]);
        if (!r)
            return tdm__fail(&s->err, TDM_E_STATE, "update: request %llu is unknown (never added, or "
                             "finished and reported)", (unsigned long long)o->req_ids[i]);
        if (r->update_stamp == stamp)
            return tdm__fail(&s->err, TDM_E_INVAL, "update: request %llu is reported twice",
                             (unsigned long long)r->id);
        r->update_stamp = stamp;
        if (!r->pend_n)
            return tdm__fail(&s->err, TDM_E_STATE, "update: request %llu has no scheduled step awaiting "
                             "its output (a replayed update, or not scheduled since its last update)",
                             (unsigned long long)r->id);
        if (b > a && !pend_oldest_samples(r))
            return tdm__fail(&s->err, TDM_E_STATE, "update: request %llu: %u sampled token(s) for a "
                             "prefill chunk that does not complete its prompt (none may be reported)",
                             (unsigned long long)r->id, b - a);
        found[i] = r;
        if (b - a > 1 + r->num_spec_sched && takes_output(r))
            return tdm__fail(&s->err, TDM_E_INVAL,
                             "update: request %llu has %u sampled tokens but only %u draft(s) were scheduled",
                             (unsigned long long)r->id, b - a, r->num_spec_sched);
    }
    return TDM_OK;
}

/* vLLM's check_stop after each appended token: EOS (unless ignored) and the stop token ids
 * first, so that a stop token that is also the max_tokens-th token reports STOP (vLLM 0.33),
 * then the length cap. Stops before min_tokens are not stops (vLLM's sampler never produces
 * them; the library does not rely on the host for that). */
static uint32_t check_stop(const tdm_sched *s, const tdm__req *r, tdm_token t)
{
    uint32_t out = r->num_tokens - r->num_prompt;
    if (out >= r->min_tokens) {
        if (!(r->flags & TDM_REQ_IGNORE_EOS) && r->eos >= 0 && t == r->eos) return TDM_FINISH_STOP;
        for (uint32_t i = 0; i < r->num_stop; i++)
            if (r->stop_ids[i] == t) return TDM_FINISH_STOP;
    }
    if (r->num_tokens >= (uint64_t)s->prm.max_model_len || out >= r->max_tokens) return TDM_FINISH_LENGTH;
    return TDM_FINISH_NONE;
}

static void compact_running(tdm_sched *s)
{
    if (!s->running_holes) return;
    uint32_t w = 0;
    for (uint32_t i = 0; i < s->num_running; i++) {
        tdm__req *r = s->running[i];
        if (!r) continue;
        r->run_index = w;
        s->running[w++] = r;
    }
    s->num_running = w;
    s->running_holes = 0;
}

int tdm_sched_update(tdm_sched *s, const tdm_step_output *o, tdm_update_result *res)
{
    if (!s) return TDM_E_INVAL;
    if (res && !TDM_STRUCT_OK(res, sizeof(tdm_update_result)))
        return tdm__fail(&s->err, TDM_E_INVAL, "update: result struct_size is too small");
    int rc = validate(s, o);
    if (rc) return rc;
    uint32_t n = o->num_reqs;
    if (tdm__vec_reserve(&s->upd_ids, n, sizeof(uint64_t)) || tdm__vec_reserve(&s->upd_new, n, sizeof(uint32_t)) ||
        tdm__vec_reserve(&s->upd_reason, n, 1) || tdm__vec_reserve(&s->upd_stop, n, sizeof(int32_t)))
        return tdm__fail(&s->err, TDM_E_NOMEM, "update: out of memory");
    if (o->now > s->now) s->now = o->now;
    double now = o->now;
    uint32_t m = 0, skipped = 0;
    bool async = s->prm.async_scheduling != 0;
    s->in_update = true;
    tdm__req **found = s->upd_reqs.data;
    uint64_t *ids = s->upd_ids.data;
    uint32_t *nnew = s->upd_new.data;
    uint8_t *reasons = s->upd_reason.data;
    int32_t *stops = s->upd_stop.data;
    for (uint32_t i = 0; i < n; i++) {
        tdm__req *r = found[i]; /* finishing another request cannot change r */
        bool samples = pend_oldest_samples(r);
        pend_pop(r);
        if (!takes_output(r)) { /* finished since it was scheduled: skipped, as in vLLM */
            skipped++;
            continue;
        }
        uint32_t a = o->token_offsets[i], k = o->token_offsets[i + 1] - a;
        bool running = r->state == TDM_STATE_RUNNING; /* else preempted: a stale output */
        if ((r->num_spec_sched | r->num_placeholders) && running) { /* drafts, async scheduling */
            if (k && r->num_spec_sched) {
                uint32_t rejected = r->num_spec_sched - (k - 1);
                r->num_computed = r->num_computed > rejected ? r->num_computed - rejected : 0;
                r->num_placeholders = r->num_placeholders > rejected ? r->num_placeholders - rejected : 0;
            }
            /* Async scheduling: the returned tokens resolve their placeholders (all of them,
             * those trimmed at a stop too, as vLLM 0.33 does). */
            if (r->num_placeholders) r->num_placeholders = r->num_placeholders > k ? r->num_placeholders - k : 0;
        }
        r->num_spec_sched = 0;
        r->in_flight = r->pend_bits != 0; /* a later step in flight may still bring a token */
        /* No sample for a step that reached the end of its tokens (a decode, or the chunk that
         * completed the prompt): its last token must be computed again to get one; otherwise
         * the request would never be scheduled again. With async scheduling its placeholder
         * goes, and the positions computed past the known tokens plus the remaining
         * placeholders are computed again. */
        if (!k && samples && running) {
            if (r->num_placeholders) r->num_placeholders--;
            uint64_t end = (uint64_t)r->num_tokens + r->num_placeholders;
            if (r->num_computed >= end) r->num_computed = (uint32_t)end - 1;
        }
        uint32_t appended = 0, reason = TDM_FINISH_NONE;
        int32_t stop_tok = -1;
        for (uint32_t j = 0; j < k && r->num_tokens < r->cap_tokens; j++) {
            tdm_token t = o->tokens[a + j];
            r->tokens[r->num_tokens++] = t;
            appended++;
            reason = check_stop(s, r, t);
            if (reason) {
                if (reason == TDM_FINISH_STOP) stop_tok = t;
                break; /* the tokens after a stop are trimmed */
            }
        }
        if (appended) {
            if (r->first_token < 0) r->first_token = now;
            else if (now - r->last_token > r->max_gap) r->max_gap = now - r->last_token;
            r->last_token = now;
        }
        /* Async scheduling: the blocks the returned tokens complete, up to the positions whose
         * KV is computed (all but those of the steps still in flight), join the prefix cache
         * now, before a stop frees them (vLLM's AsyncScheduler caches them in the update). */
        if (k && running && async && r->num_computed > r->num_placeholders)
            tdm__cache_full_blocks(s, r, r->num_computed - r->num_placeholders);
        ids[m] = r->id;
        nnew[m] = appended;
        reasons[m] = (uint8_t)reason;
        stops[m] = stop_tok;
        m++;
        if (reason) tdm__finish(s, r, reason, now);
    }
    s->in_update = false;
    /* Finished requests already reported in a batch were kept for the update of a step they
     * were in (async scheduling, pipelining): the last such update frees them. (Only the
     * skipped ones can be: a request finished by this update is reported by the next step.) */
    for (uint32_t i = 0; skipped && i < n; i++) {
        tdm__req *r = found[i];
        if (!r->pend_n && r->reported && r->state == TDM_STATE_FINISHED) {
            tdm__map_del(s, r->id);
            tdm__req_destroy(s, r);
        }
    }
    compact_running(s);
    if (s->prm.policy == TDM_POLICY_SLO_ADAPTIVE) tdm__ad_observe_step(s, now);
    s->upd_ids.len = m;
    if (res) {
        tdm_update_result out;
        memset(&out, 0, sizeof(out));
        out.struct_size = TDM_MIN(res->struct_size, (uint32_t)sizeof(out));
        out.num_reqs = m;
        out.req_ids = s->upd_ids.data;
        out.num_new_tokens = s->upd_new.data;
        out.finish_reasons = s->upd_reason.data;
        out.stop_tokens = s->upd_stop.data;
        memcpy(res, &out, TDM_MIN(res->struct_size, (uint32_t)sizeof(out)));
    }
    return TDM_OK;
}
