/*
 * serve_limits.c -- the global limits of `tandem serve` and who may use an instance
 * (docs/service.md, "Limits" and "Trust model"): KV blocks per instance and in total, the
 * unfinished requests and their prompt tokens over all instances, and instance ownership
 * under CURVE. The prompt tokens are counted per request at add and dropped, by a sweep that
 * asks each instance, once the request has finished; the sweep runs only when the count
 * reaches its limit (or the record arrays grow past twice the request limit), so an add costs
 * O(1) until then.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "serve.h"

/* Under CURVE an instance is used only by the client that created it (or an admin), unless
 * it was created shared. Without CURVE every client is the same anonymous one. */
int tdm__serve_may_use(const tdm__serve_state *st, const tdm__serve_instance *in)
{
    return !st->curve || in->shared || st->caller->admin || !strcmp(in->owner, st->caller->user);
}

/* The KV pool an instance's configuration asks for: its num_blocks after config json (the
 * current value when json does not set it; the library refuses a value of the wrong type). */
int64_t tdm__serve_blocks_after(const tdm_sched *s, const char *json)
{
    int64_t cur = 10000; /* the library's default */
    if (s) tdm_sched_get_param(s, TDM_SCHED_NUM_BLOCKS, &cur);
    json_error_t je;
    json_t *root = json ? json_loads(json, 0, &je) : NULL;
    json_t *v = json_is_object(root) ? json_object_get(root, "num_blocks") : NULL;
    if (v && json_is_integer(v)) cur = (int64_t)json_integer_value(v);
    json_decref(root);
    return cur;
}

/* The service's limits on KV blocks: per instance and over all of them. */
int tdm__serve_check_blocks(tdm__serve_state *st, int64_t want, uint64_t have, tdm__serve_err *e)
{
    if (want <= 0) return 0; /* the library refuses it */
    if ((uint64_t)want > st->lim.max_blocks_per_instance)
        return tdm__serve_fail(e, TDM_E_RANGE, "num_blocks %lld exceeds the service's limit of %llu "
                               "per instance (--max-blocks-per-instance)", (long long)want,
                               (unsigned long long)st->lim.max_blocks_per_instance);
    if (st->total_blocks - have + (uint64_t)want > st->lim.max_total_blocks)
        return tdm__serve_fail(e, TDM_E_RANGE, "num_blocks %lld would bring the service to %llu KV "
                               "blocks, over its limit of %llu (--max-total-blocks)", (long long)want,
                               (unsigned long long)(st->total_blocks - have + (uint64_t)want),
                               (unsigned long long)st->lim.max_total_blocks);
    return 0;
}

/* After a configuration change: the instance's pool as the library has it. */
void tdm__serve_recount_blocks(tdm__serve_state *st, tdm__serve_instance *in)
{
    int64_t nb = 0;
    if (tdm_sched_get_param(in->sched, TDM_SCHED_NUM_BLOCKS, &nb) == 0 && nb >= 0) {
        st->total_blocks = st->total_blocks - in->num_blocks + (uint64_t)nb;
        in->num_blocks = (uint64_t)nb;
    }
}

static int grow_tokens(tdm__serve_instance *in)
{
    uint32_t nc = in->tok_cap ? in->tok_cap * 2 : 64;
    uint64_t *ids = realloc(in->tok_ids, nc * sizeof *ids);
    if (ids) in->tok_ids = ids;
    uint32_t *n = ids ? realloc(in->tok_n, nc * sizeof *n) : NULL;
    if (n) in->tok_n = n;
    if (!ids || !n) return -1;
    in->tok_cap = nc;
    return 0;
}

/* Drops the token counts of requests that have finished (or are gone). A re-added id keeps
 * its old count until both have finished: the total is an upper bound. */
static void sweep_tokens(tdm__serve_state *st)
{
    for (tdm__serve_instance *in = st->instances; in; in = in->next) {
        uint32_t w = 0;
        for (uint32_t i = 0; i < in->tok_len; i++) {
            tdm_request_info info;
            tdm_request_info_init(&info);
            int live = tdm_sched_request_info(in->sched, in->tok_ids[i], &info) == 0 &&
                       info.state != TDM_STATE_FINISHED && info.state != TDM_STATE_FINISHED_HELD;
            if (live) {
                in->tok_ids[w] = in->tok_ids[i];
                in->tok_n[w++] = in->tok_n[i];
            } else {
                in->queued_tokens -= in->tok_n[i];
                st->queued_tokens -= in->tok_n[i];
            }
        }
        in->tok_len = w;
    }
}

int tdm__serve_admit(tdm__serve_state *st, tdm__serve_instance *in, uint32_t np, tdm__serve_err *e)
{
    int rc = 0;
    uint64_t queued = 0;
    for (tdm__serve_instance *q = st->instances; q; q = q->next) {
        uint32_t u = 0;
        if (tdm_sched_num_unfinished(q->sched, &u) == 0) queued += u;
    }
    if (st->queued_tokens + np > st->lim.max_queued_tokens ||
        in->tok_len >= 2 * st->lim.max_queued_requests) /* keeps the arrays bounded too */
        sweep_tokens(st);
    if (queued >= st->lim.max_queued_requests)
        rc = tdm__serve_fail(e, TDM_E_RANGE, "the service holds %llu unfinished requests, its limit "
                             "(--max-queued-requests); retry when some have finished",
                             (unsigned long long)queued);
    else if (np > st->lim.max_prompt_tokens)
        rc = tdm__serve_fail(e, TDM_E_RANGE, "a prompt of %u tokens exceeds the service's limit of "
                             "%llu (--max-prompt-tokens)", np, (unsigned long long)st->lim.max_prompt_tokens);
    else if (st->queued_tokens + np > st->lim.max_queued_tokens)
        rc = tdm__serve_fail(e, TDM_E_RANGE, "the unfinished requests hold %llu prompt tokens; %u more "
                             "would pass the limit of %llu (--max-queued-tokens)",
                             (unsigned long long)st->queued_tokens, np,
                             (unsigned long long)st->lim.max_queued_tokens);
    else if (in->tok_len == in->tok_cap && grow_tokens(in))
        rc = tdm__serve_fail(e, TDM_E_NOMEM, "out of memory");
    return rc;
}

void tdm__serve_admitted(tdm__serve_state *st, tdm__serve_instance *in, uint64_t id, uint32_t np)
{
    in->tok_ids[in->tok_len] = id; /* room: tdm__serve_admit grew the arrays */
    in->tok_n[in->tok_len++] = np;
    in->queued_tokens += np;
    st->queued_tokens += np;
}
