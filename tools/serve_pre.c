/*
 * serve_pre.c -- the linear part of an "add" done on `tandem serve`'s decoding thread
 * (docs/service.md, "Large requests"). An in-limit add of 2^20 tokens used to cost the loop
 * tens of milliseconds: converting a million msgpack objects to int32 ids, then 65,536
 * SHA-256 block digests in tdm_sched_add. Now the worker, once it has decoded a queued
 * "add", converts the prompt and computes Tandem's digests of it with tdm_prefix_digests(),
 * using the named instance's hashing settings (prefix_hash, block_size, prefix caching) as
 * the loop last published them; the loop's op_add passes both to tdm_sched_add with
 * TDM_REQ_PRECOMPUTED_DIGESTS, which checks two of them and stores the rest: O(blocks).
 * The loop publishes the settings after every create, configure, set_param and destroy (the
 * worker never reads an instance); if the instance changed between the worker's look and
 * the op, op_add sees that its settings differ and lets the library hash as usual; if
 * anything here fails, op_add decodes the request itself and reports the error as before.
 * Likewise a queued "update" has its outputs decoded here (tdm__serve_outputs_parse, which
 * op_update runs itself for a small one), so the loop only runs tdm_sched_update.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

void tdm__serve_hashcfgs_init(tdm__serve_hashcfgs *h)
{
    memset(h, 0, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
}

void tdm__serve_hashcfgs_free(tdm__serve_hashcfgs *h)
{
    if (!h) return;
    free(h->v);
    pthread_mutex_destroy(&h->mu);
    memset(h, 0, sizeof *h);
}

void tdm__serve_pre_publish(tdm__serve_state *st)
{
    tdm__serve_hashcfgs *h = st->hashcfgs;
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    if (h->cap < st->num_instances) {
        tdm__serve_hashcfg *nv = realloc(h->v, (size_t)st->num_instances * sizeof *nv);
        if (!nv) { /* the worker just does not help */
            h->n = 0;
            pthread_mutex_unlock(&h->mu);
            return;
        }
        h->v = nv;
        h->cap = st->num_instances;
    }
    h->n = 0;
    for (const tdm__serve_instance *in = st->instances; in && h->n < h->cap; in = in->next) {
        tdm__serve_hashcfg *c = &h->v[h->n];
        if (tdm_sched_get_param(in->sched, TDM_SCHED_PREFIX_HASH, &c->algo) ||
            tdm_sched_get_param(in->sched, TDM_SCHED_BLOCK_SIZE, &c->block_size) ||
            tdm_sched_get_param(in->sched, TDM_SCHED_ENABLE_PREFIX_CACHING, &c->caching))
            continue;
        memcpy(c->name, in->name, sizeof c->name);
        h->n++;
    }
    pthread_mutex_unlock(&h->mu);
}

static int hashcfg_lookup(tdm__serve_hashcfgs *h, const char *name, tdm__serve_hashcfg *out)
{
    int found = 0;
    pthread_mutex_lock(&h->mu);
    for (uint32_t i = 0; i < h->n && !found; i++)
        if (!strcmp(h->v[i].name, name)) {
            *out = h->v[i];
            found = 1;
        }
    pthread_mutex_unlock(&h->mu);
    return found;
}

void tdm__serve_outputs_free(tdm__serve_outputs *u)
{
    free(u->ids);
    free(u->offs);
    free(u->all);
    memset(u, 0, sizeof *u);
}

int tdm__serve_outputs_parse(const msgpack_object *m, tdm__serve_outputs *u, tdm__serve_err *e)
{
    memset(u, 0, sizeof *u);
    const msgpack_object *outs = tdm__serve_field(m, "outputs");
    const msgpack_object *ids_o = tdm__serve_field(m, "req_ids");
    const msgpack_object *toks_o = tdm__serve_field(m, "tokens");
    uint32_t n;
    if (outs) {
        if (outs->type != MSGPACK_OBJECT_MAP)
            return tdm__serve_fail(e, TDM_E_INVAL, "\"outputs\" must be a map {id: [tokens]}");
        n = outs->via.map.size;
    } else if (ids_o && toks_o) {
        if (ids_o->type != MSGPACK_OBJECT_ARRAY || toks_o->type != MSGPACK_OBJECT_ARRAY ||
            ids_o->via.array.size != toks_o->via.array.size)
            return tdm__serve_fail(e, TDM_E_INVAL, "\"req_ids\" and \"tokens\" must be arrays "
                                   "of the same length");
        n = ids_o->via.array.size;
    } else {
        return tdm__serve_fail(e, TDM_E_INVAL, "missing \"outputs\" (or \"req_ids\" + \"tokens\")");
    }
    if (n > TDM_SERVE_MAX_ARRAY) return tdm__serve_fail(e, TDM_E_INVAL, "too many outputs");
    /* two passes: validate and count, then decode every output straight into one array */
    uint64_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    uint32_t *offs = malloc(((size_t)n + 1) * sizeof *offs);
    int32_t *all = NULL;
    uint64_t len = 0;
    int rc = (ids && offs) ? 0 : tdm__serve_fail(e, TDM_E_NOMEM, "out of memory");
    if (offs) offs[0] = 0;
    char what[48];
    for (uint32_t i = 0; !rc && i < n; i++) {
        const msgpack_object *ko = outs ? &outs->via.map.ptr[i].key : &ids_o->via.array.ptr[i];
        const msgpack_object *vo = outs ? &outs->via.map.ptr[i].val : &toks_o->via.array.ptr[i];
        uint32_t nt = 0;
        snprintf(what, sizeof what, "the tokens of output %u", i);
        if ((rc = tdm__serve_as_u64(ko, "an output's request id", &ids[i], e)) ||
            (rc = tdm__serve_tokens_count(vo, what, &nt, e)))
            break;
        if (nt > TDM_SERVE_MAX_OUTPUT_TOKENS) { /* refused before any is decoded */
            rc = tdm__serve_fail(e, TDM_E_INVAL, "%s: %u tokens (an output holds at most %u: one "
                                 "sampled and up to num_lookahead_tokens accepted drafts)", what,
                                 nt, TDM_SERVE_MAX_OUTPUT_TOKENS);
            break;
        }
        if (len + nt > TDM_SERVE_MAX_ARRAY) {
            rc = tdm__serve_fail(e, TDM_E_INVAL, "more than %u output tokens", TDM_SERVE_MAX_ARRAY);
            break;
        }
        len += nt;
        offs[i + 1] = (uint32_t)len;
    }
    if (!rc && len && !(all = malloc((size_t)len * sizeof *all)))
        rc = tdm__serve_fail(e, TDM_E_NOMEM, "out of memory");
    for (uint32_t i = 0; !rc && i < n; i++) {
        const msgpack_object *vo = outs ? &outs->via.map.ptr[i].val : &toks_o->via.array.ptr[i];
        snprintf(what, sizeof what, "the tokens of output %u", i);
        rc = tdm__serve_tokens_into(vo, what, all + offs[i], e);
    }
    u->ids = ids;
    u->offs = offs;
    u->all = all;
    if (rc) {
        tdm__serve_outputs_free(u);
        return rc;
    }
    u->n = n;
    u->done = 1;
    return 0;
}

void tdm__serve_pre_run(tdm__serve_hashcfgs *h, const msgpack_object *m, tdm__serve_pre *p)
{
    tdm__serve_err e;
    char op[8], name[TDM_SERVE_NAME_MAX + 1];
    if (p->done || p->outs.done || tdm__serve_get_str(m, "op", 1, op, sizeof op, &e)) return;
    if (!strcmp(op, "update")) { /* no instance state needed; a failure: op_update reports it */
        if (tdm__serve_outputs_parse(m, &p->outs, &e)) memset(&p->outs, 0, sizeof p->outs);
        return;
    }
    if (!h || strcmp(op, "add") ||
        tdm__serve_get_str(m, "name", 1, name, sizeof name, &e) || !hashcfg_lookup(h, name, &p->cfg))
        return;
    const msgpack_object *so = tdm__serve_field(m, "cache_salt");
    const void *salt = NULL;
    uint32_t salt_len = 0;
    if (so && so->type != MSGPACK_OBJECT_NIL) {
        if ((so->type != MSGPACK_OBJECT_STR && so->type != MSGPACK_OBJECT_BIN) ||
            so->via.str.size > 4096)
            return; /* op_add refuses it */
        salt = so->via.str.ptr;
        salt_len = so->via.str.size;
    }
    if (tdm__serve_get_tokens(m, "prompt", 1, &p->prompt, &p->np, &e)) return;
    const tdm__serve_hashcfg *c = &p->cfg;
    if (c->caching && c->block_size > 0 && p->np / (uint64_t)c->block_size > 0) {
        uint32_t L = c->algo == TDM_PREFIX_HASH_XXH3_128 ? 16 : 32;
        uint32_t n = p->np / (uint32_t)c->block_size;
        p->digests = malloc((size_t)n * L);
        if (!p->digests ||
            tdm_prefix_digests((int)c->algo, (uint32_t)c->block_size, salt, salt_len, p->prompt,
                               p->np, p->digests, (size_t)n * L, &p->nd) != TDM_OK) {
            free(p->digests); /* e.g. a negative token id: op_add names it */
            p->digests = NULL;
            p->nd = 0;
        } else {
            p->dsize = L;
        }
    }
    p->done = 1;
}

int tdm__serve_pre_usable(const tdm__serve_pre *p, const tdm__serve_instance *in)
{
    int64_t algo, bs, caching;
    if (!p || !p->done || !p->digests || strcmp(p->cfg.name, in->name)) return 0;
    return !tdm_sched_get_param(in->sched, TDM_SCHED_PREFIX_HASH, &algo) &&
           !tdm_sched_get_param(in->sched, TDM_SCHED_BLOCK_SIZE, &bs) &&
           !tdm_sched_get_param(in->sched, TDM_SCHED_ENABLE_PREFIX_CACHING, &caching) &&
           algo == p->cfg.algo && bs == p->cfg.block_size && caching == p->cfg.caching;
}

void tdm__serve_pre_free(tdm__serve_pre *p)
{
    tdm__serve_outputs_free(&p->outs);
    free(p->prompt);
    free(p->digests);
    memset(p, 0, sizeof *p);
}
