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
 * last awaited step (it waits in the lingering list; one owed only non-final chunks is freed
 * once an update reports a later step, so hosts that leave such chunks out do not leak it).
 * With async scheduling the returned tokens resolve output placeholders.
 *
 * A named report (tdm_sched_update_step) covers a whole batch: the requests of that batch it
 * leaves out are applied as reporting no tokens. Batches are named in step order. The latest
 * batch's requests are the step's entries; before the next step overwrites them, its ids are
 * copied into a ring of TDM__KEPT_BATCHES batches (tdm__batch_keep), which named reports
 * consume oldest first.
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

/* The batch a named update reports (tdm_sched_update_step): the latest one (its records are
 * the step's entries) or one kept from an earlier step (its ids). */
typedef struct batch_ref {
    uint64_t step;
    uint32_t n;
    const uint64_t *ids;       /* a kept batch; NULL for the latest */
    uint32_t kept;             /* its index in the kept ring */
} batch_ref;

static tdm__req *batch_req(tdm_sched *s, const batch_ref *b, uint32_t j)
{
    return b->ids ? tdm__map_get(s, b->ids[j]) : s->entries[j].req;
}

/* Validate the whole report; remember each request record in upd_reqs. With a batch, mark
 * its requests and refuse a listed request outside it. */
static int validate(tdm_sched *s, const tdm_step_output *o, const batch_ref *batch)
{
    if (!TDM_STRUCT_OK(o, sizeof(tdm_step_output)))
        return tdm__fail(&s->err, TDM_E_INVAL, "update: output is NULL or its struct_size is too small");
    if (!isfinite(o->now) || o->now < 0)
        return tdm__fail(&s->err, TDM_E_INVAL, "update: now (%g) must be finite and >= 0", o->now);
    if (o->num_reqs == 0) {
        s->update_no++; /* the stamp of this update (a named one takes its whole batch) */
        return TDM_OK;
    }
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
    for (uint32_t j = 0; batch && j < batch->n; j++) {
        tdm__req *r = batch_req(s, batch, j);
        if (r) r->batch_mark = stamp;
    }
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
                             "prefill chunk that does not complete its prompt (none may be reported; "
                             "an earlier step of it awaits its report: report every request of each "
                             "batch, or name the batch with tdm_sched_update_step, which takes a "
                             "request left out as reporting no tokens)",
                             (unsigned long long)r->id, b - a);
        if (batch && r->batch_mark != stamp)
            return tdm__fail(&s->err, TDM_E_STATE, "update: request %llu was not scheduled in step %llu, "
                             "the batch this update reports", (unsigned long long)r->id,
                             (unsigned long long)batch->step);
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

/* Finished requests already reported in a batch were kept for the update of a step they
 * were in (async scheduling, pipelining): free those owed no update any more. A step left
 * to await only non-final prefill chunks is owed none once an update has reported a later
 * step (updates come in step order), so a host that leaves such chunks out frees them too. */
static void free_lingering(tdm_sched *s)
{
    tdm__req **v = s->lingering.data;
    uint32_t w = 0;
    for (uint32_t i = 0; i < s->lingering.len; i++) {
        tdm__req *r = v[i];
        if (!r->pend_n || (!r->pend_bits && r->pend_n <= 64 && r->pend_step < s->reported_step)) {
            tdm__map_del(s, r->id);
            tdm__req_destroy(s, r);
        } else {
            v[w++] = r;
        }
    }
    s->lingering.len = w;
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

/* Apply one request's report of its oldest awaited step: k tokens (none for a request a
 * named update leaves out, out NULL: it gets no result row, and with no token it cannot
 * finish). Writes its result row in *out unless it finished since it was scheduled (skipped,
 * as in vLLM). */
typedef struct rows {
    uint64_t *ids;
    uint32_t *num_new;
    uint8_t *reasons;
    int32_t *stops;
    uint32_t m;
} rows;

static inline __attribute__((always_inline)) void apply_one(tdm_sched *s, tdm__req *r, const tdm_token *toks,
                                                            uint32_t k, double now, bool async, rows *out)
{
    bool samples = pend_oldest_samples(r);
    if (r->pend_n == 1 && r->pend_step > s->reported_step) s->reported_step = r->pend_step;
    pend_pop(r);
    if (!takes_output(r)) return;
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
     * completed the prompt): its last token must be computed again to get one; otherwise the
     * request would never be scheduled again. With async scheduling its placeholder goes,
     * and the positions computed past the known tokens plus the remaining placeholders are
     * computed again. */
    if (!k && samples && running) {
        if (r->num_placeholders) r->num_placeholders--;
        uint64_t end = (uint64_t)r->num_tokens + r->num_placeholders;
        if (r->num_computed >= end) r->num_computed = (uint32_t)end - 1;
    }
    uint32_t appended = 0, reason = TDM_FINISH_NONE;
    int32_t stop_tok = -1;
    for (uint32_t j = 0; j < k && r->num_tokens < r->cap_tokens; j++) {
        tdm_token t = toks[j];
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
    /* Async scheduling: the blocks the returned tokens complete, up to the positions whose KV
     * is computed (all but those of the steps still in flight), join the prefix cache now,
     * before a stop frees them (vLLM's AsyncScheduler caches them in the update). */
    if (k && running && async && r->num_computed > r->num_placeholders)
        tdm__cache_full_blocks(s, r, r->num_computed - r->num_placeholders);
    if (!out) return;
    uint32_t i = out->m++;
    out->ids[i] = r->id;
    out->num_new[i] = appended;
    out->reasons[i] = (uint8_t)reason;
    out->stops[i] = stop_tok;
    if (reason) tdm__finish(s, r, reason, now);
}

static int update(tdm_sched *s, const tdm_step_output *o, tdm_update_result *res, const batch_ref *batch)
{
    if (res && !TDM_STRUCT_OK(res, sizeof(tdm_update_result)))
        return tdm__fail(&s->err, TDM_E_INVAL, "update: result struct_size is too small");
    int rc = validate(s, o, batch);
    if (rc) return rc;
    uint32_t n = o->num_reqs;
    if (tdm__vec_reserve(&s->upd_ids, n, sizeof(uint64_t)) || tdm__vec_reserve(&s->upd_new, n, sizeof(uint32_t)) ||
        tdm__vec_reserve(&s->upd_reason, n, 1) || tdm__vec_reserve(&s->upd_stop, n, sizeof(int32_t)))
        return tdm__fail(&s->err, TDM_E_NOMEM, "update: out of memory");
    if (o->now > s->now) s->now = o->now;
    double now = o->now;
    rows out = { s->upd_ids.data, s->upd_new.data, s->upd_reason.data, s->upd_stop.data, 0 };
    bool async = s->prm.async_scheduling != 0;
    s->in_update = true;
    tdm__req **found = s->upd_reqs.data;
    for (uint32_t i = 0; i < n; i++) { /* finishing a request cannot change another's record */
        uint32_t a = o->token_offsets[i], k = o->token_offsets[i + 1] - a;
        apply_one(s, found[i], k ? o->tokens + a : NULL, k, now, async, &out);
    }
    if (batch) {
        /* The requests of the batch the report leaves out report no tokens (vLLM's
         * update_from_output); those with no step awaiting (a report per request came
         * first) have nothing left to take. */
        uint64_t stamp = s->update_no;
        for (uint32_t j = 0; j < batch->n; j++) {
            tdm__req *r = batch_req(s, batch, j);
            if (r && r->update_stamp != stamp && r->pend_n) {
                r->update_stamp = stamp;
                apply_one(s, r, NULL, 0, now, async, NULL);
            }
        }
        tdm__batch_reported(s, batch->ids != NULL);
    }
    s->in_update = false;
    if (s->lingering.len) free_lingering(s);
    compact_running(s);
    if (s->prm.policy == TDM_POLICY_SLO_ADAPTIVE) tdm__ad_observe_step(s, now);
    uint32_t m = out.m;
    s->upd_ids.len = m;
    if (res) {
        tdm_update_result u;
        memset(&u, 0, sizeof(u));
        u.struct_size = TDM_MIN(res->struct_size, (uint32_t)sizeof(u));
        u.num_reqs = m;
        u.req_ids = s->upd_ids.data;
        u.num_new_tokens = s->upd_new.data;
        u.finish_reasons = s->upd_reason.data;
        u.stop_tokens = s->upd_stop.data;
        memcpy(res, &u, TDM_MIN(res->struct_size, (uint32_t)sizeof(u)));
    }
    return TDM_OK;
}

int tdm_sched_update(tdm_sched *s, const tdm_step_output *o, tdm_update_result *res)
{
    if (!s) return TDM_E_INVAL;
    return update(s, o, res, NULL);
}

int tdm_sched_update_step(tdm_sched *s, uint64_t step, const tdm_step_output *o, tdm_update_result *res)
{
    if (!s) return TDM_E_INVAL;
    if (!TDM_STRUCT_OK(o, sizeof(tdm_step_output)))
        return tdm__fail(&s->err, TDM_E_INVAL, "update_step: output is NULL or its struct_size is too small");
    batch_ref b;
    memset(&b, 0, sizeof(b));
    b.step = step;
    uint64_t oldest = 0;
    if (s->kept_len) { /* kept batches are older than the latest */
        uint32_t h = s->kept_head;
        oldest = s->kept[h].step;
        if (step == oldest) {
            b.ids = s->kept[h].ids.data;
            b.n = s->kept[h].ids.len;
            b.kept = h;
        }
    } else if (s->latest_awaited) {
        oldest = s->step_no;
        if (step == oldest) b.n = s->num_entries;
    }
    if (!oldest || step != oldest) {
        /* An empty batch needs no report: an empty report of a step with none awaiting is a
         * no-op (hosts that report every step); anything else is a host error. */
        bool awaited = oldest && step > oldest && step <= s->step_no &&
                       (s->latest_awaited ? step == s->step_no : false);
        for (uint32_t i = 0; i < s->kept_len && !awaited; i++)
            awaited = s->kept[(s->kept_head + i) % TDM__KEPT_BATCHES].step == step;
        if (!o->num_reqs && !awaited) return update(s, o, res, NULL);
        if (awaited)
            return tdm__fail(&s->err, TDM_E_STATE, "update_step: step %llu is reported before step %llu "
                             "(batches are reported in step order)", (unsigned long long)step,
                             (unsigned long long)oldest);
        return tdm__fail(&s->err, TDM_E_STATE, "update_step: no batch of step %llu awaits its report "
                         "(never returned, empty, already reported, or older than the %u batches kept)",
                         (unsigned long long)step, (unsigned)TDM__KEPT_BATCHES);
    }
    return update(s, o, res, &b);
}

/* ---- the batches awaiting a named report ---- */

int tdm__batch_reserve(tdm_sched *s)
{
    if (!s->latest_awaited || !s->num_entries) return TDM_OK;
    uint32_t slot = (s->kept_head + s->kept_len) % TDM__KEPT_BATCHES; /* full: the oldest's */
    return tdm__vec_reserve(&s->kept[slot].ids, s->num_entries, sizeof(uint64_t));
}

void tdm__batch_keep(tdm_sched *s)
{
    if (!s->latest_awaited) return;
    s->latest_awaited = false;
    if (!s->num_entries) return;
    if (s->kept_len == TDM__KEPT_BATCHES) { /* the oldest is dropped: it can no longer be named */
        s->kept_head = (s->kept_head + 1) % TDM__KEPT_BATCHES;
        s->kept_len--;
    }
    tdm__kept_batch *k = &s->kept[(s->kept_head + s->kept_len) % TDM__KEPT_BATCHES];
    memcpy(k->ids.data, s->out_ids, (size_t)s->num_entries * sizeof(uint64_t));
    k->ids.len = s->num_entries;
    k->step = s->step_no;
    s->kept_len++;
}

void tdm__batch_reported(tdm_sched *s, bool kept)
{
    if (kept) {
        s->kept_head = (s->kept_head + 1) % TDM__KEPT_BATCHES;
        s->kept_len--;
    } else {
        s->latest_awaited = false;
    }
}
