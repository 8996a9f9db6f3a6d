/*
 * serve_ops.c -- the operations of `tandem serve` (docs/service.md): decode one msgpack
 * request {"op": ..., "seq": ..., ...}, validate every field, run it on the named scheduler
 * instance and build one reply {"ok": true|false, "seq": <echo>, ...}. Each operation decodes
 * and checks all of its input before the first library call, and the library's calls are
 * all-or-nothing, so an error reply means that nothing changed.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

typedef tdm__serve_reply reply;

typedef int (*op_fn)(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                     reply *r, tdm__serve_err *e);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

msgpack_packer *tdm__serve_key(tdm__serve_reply *r, const char *k)
{
    r->pairs++;
    tdm__serve_pack_str(&r->pk, k);
    return &r->pk;
}


/* A library failure: status and the handle's message. */
static int lib_fail(tdm__serve_err *e, int rc, const tdm_sched *s, const char *what)
{
    const char *m = s ? tdm_sched_errmsg(s) : tdm_sched_errmsg(NULL);
    return tdm__serve_fail(e, rc, "%s: %s", what, (m && *m) ? m : tdm_strerror(rc));
}

static int get_id(const msgpack_object *m, uint64_t *id, tdm__serve_err *e)
{
    return tdm__serve_get_u64(m, "id", 1, UINT64_MAX, id, e);
}

/* ---- instances ------------------------------------------------------------------------------ */

void tdm__serve_init(tdm__serve_state *st)
{
    memset(st, 0, sizeof *st);
    st->max_instances = TDM_SERVE_DEFAULT_MAX_INSTANCES;
    st->max_msg_bytes = TDM_SERVE_DEFAULT_MAX_MSG;
    st->max_kvx_bytes = TDM_SERVE_DEFAULT_MAX_KVX_BYTES;
    st->lim.max_blocks_per_instance = TDM_SERVE_DEFAULT_MAX_BLOCKS_PER_INSTANCE;
    st->lim.max_total_blocks = TDM_SERVE_DEFAULT_MAX_TOTAL_BLOCKS;
    st->lim.max_queued_requests = TDM_SERVE_DEFAULT_MAX_QUEUED_REQUESTS;
    st->lim.max_queued_tokens = TDM_SERVE_DEFAULT_MAX_QUEUED_TOKENS;
    st->lim.max_prompt_tokens = TDM_SERVE_DEFAULT_MAX_PROMPT_TOKENS;
    st->lim.max_connections = TDM_SERVE_DEFAULT_MAX_CONNECTIONS;
    st->lim.max_pending = TDM_SERVE_DEFAULT_MAX_PENDING;
    st->lim.max_pending_per_source = TDM_SERVE_DEFAULT_MAX_PENDING_PER_SOURCE;
    st->lim.handshake_ms = TDM_SERVE_DEFAULT_HANDSHAKE_MS;
    st->lim.idle_ms = TDM_SERVE_DEFAULT_IDLE_MS;
    /* max_connections_per_source / _per_key: 0 = half of max_connections (cmd_serve.c) */
    st->wake_fd[0] = st->wake_fd[1] = -1;
}

void tdm__serve_free(tdm__serve_state *st)
{
#ifndef TDM_SERVE_NO_KVX
    tdm__serve_kvx_free_all(st);
#endif
    tdm__serve_instance *in = st->instances;
    while (in) {
        tdm__serve_instance *next = in->next;
        tdm_sched_destroy(in->sched);
        free(in->tok_ids);
        free(in->tok_n);
        free(in);
        in = next;
    }
    st->instances = NULL;
    st->num_instances = 0;
}

static tdm__serve_instance *find(tdm__serve_state *st, const char *name)
{
    for (tdm__serve_instance *in = st->instances; in; in = in->next)
        if (!strcmp(in->name, name)) return in;
    return NULL;
}

static int valid_name(const char *s)
{
    if (!*s) return 0;
    for (; *s; s++)
        if ((unsigned char)*s < 0x21 || (unsigned char)*s > 0x7e) return 0;
    return 1;
}

static int op_ping(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                   reply *r, tdm__serve_err *e)
{
    tdm__serve_pack_str(tdm__serve_key(r, "version"), tdm_version_string());
    msgpack_pack_uint32(tdm__serve_key(r, "abi"), tdm_abi_version());
    msgpack_pack_uint64(tdm__serve_key(r, "requests"), st->requests);
    msgpack_pack_uint32(tdm__serve_key(r, "instances"), st->num_instances);
    return 0;
}

static int op_create(tdm__serve_state *st, tdm__serve_instance *unused, const msgpack_object *m,
                     reply *r, tdm__serve_err *e)
{
    char name[TDM_SERVE_NAME_MAX + 1];
    int rc = tdm__serve_get_str(m, "name", 1, name, sizeof name, e);
    if (rc) return rc;
    if (!valid_name(name))
        return tdm__serve_fail(e, TDM_E_INVAL, "\"name\" must be 1..%d printable ASCII characters",
                               TDM_SERVE_NAME_MAX);
    if (find(st, name)) return tdm__serve_fail(e, TDM_E_EXISTS, "instance \"%s\" exists", name);
    if (st->num_instances >= st->max_instances)
        return tdm__serve_fail(e, TDM_E_RANGE, "at most %u instances", st->max_instances);
    int shared = 0;
    if ((rc = tdm__serve_get_bool(m, "shared", &shared, e))) return rc;
    char *json = NULL;
    const msgpack_object *cfg = tdm__serve_field(m, "config");
    if (cfg && cfg->type != MSGPACK_OBJECT_NIL && (rc = tdm__serve_config_json(cfg, &json, e)))
        return rc;
    if ((rc = tdm__serve_check_blocks(st, tdm__serve_blocks_after(NULL, json), 0, e))) {
        free(json);
        return rc;
    }
    tdm__serve_instance *in = calloc(1, sizeof *in);
    if (!in) {
        free(json);
        return tdm__serve_fail(e, TDM_E_NOMEM, "out of memory");
    }
    rc = tdm_sched_create(&in->sched);
    if (rc) {
        rc = lib_fail(e, rc, NULL, "tdm_sched_create");
    } else if (json && (rc = tdm_sched_configure(in->sched, json)) != 0) {
        rc = lib_fail(e, rc, in->sched, "config");
        tdm_sched_destroy(in->sched);
    }
    free(json);
    if (rc) {
        free(in);
        return rc;
    }
    int64_t nb = 0;
    tdm_sched_get_param(in->sched, TDM_SCHED_NUM_BLOCKS, &nb);
    if ((rc = tdm__serve_check_blocks(st, nb, 0, e))) { /* the guess from the JSON text was wrong */
        tdm_sched_destroy(in->sched);
        free(in);
        return rc;
    }
    memcpy(in->name, name, sizeof name);
    memcpy(in->owner, st->caller->user, sizeof in->owner);
    in->shared = shared || !st->curve;
    in->num_blocks = (uint64_t)nb;
    st->total_blocks += in->num_blocks;
    in->next = st->instances;
    st->instances = in;
    st->num_instances++;
    tdm__serve_pack_str(tdm__serve_key(r, "name"), name);
    return 0;
}

static int op_destroy(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                      reply *r, tdm__serve_err *e)
{
    for (tdm__serve_instance **p = &st->instances; *p; p = &(*p)->next) {
        if (*p != in) continue;
        *p = in->next;
        st->total_blocks -= in->num_blocks;
        st->queued_tokens -= in->queued_tokens;
        tdm_sched_destroy(in->sched);
        free(in->tok_ids);
        free(in->tok_n);
        free(in);
        st->num_instances--;
        return 0;
    }
    return tdm__serve_fail(e, TDM_E_INTERNAL, "instance vanished");
}

static int op_list(tdm__serve_state *st, tdm__serve_instance *unused, const msgpack_object *m,
                   reply *r, tdm__serve_err *e)
{
    uint32_t n = 0;
    for (tdm__serve_instance *in = st->instances; in; in = in->next) n += tdm__serve_may_use(st, in) ? 1u : 0u;
    msgpack_packer *pk = tdm__serve_key(r, "names");
    msgpack_pack_array(pk, n);
    for (tdm__serve_instance *in = st->instances; in; in = in->next)
        if (tdm__serve_may_use(st, in)) tdm__serve_pack_str(pk, in->name);
    return 0;
}

static int op_configure(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                        reply *r, tdm__serve_err *e)
{
    const msgpack_object *cfg = tdm__serve_field(m, "config");
    if (!cfg) return tdm__serve_fail(e, TDM_E_INVAL, "missing key \"config\"");
    char *json = NULL;
    int rc = tdm__serve_config_json(cfg, &json, e);
    if (rc) return rc;
    if ((rc = tdm__serve_check_blocks(st, tdm__serve_blocks_after(in->sched, json), in->num_blocks, e))) {
        free(json);
        return rc;
    }
    rc = tdm_sched_configure(in->sched, json);
    free(json);
    if (rc) return lib_fail(e, rc, in->sched, "config");
    tdm__serve_recount_blocks(st, in);
    return 0;
}

static int op_get_config(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                         reply *r, tdm__serve_err *e)
{
    size_t len = 0;
    int rc = tdm_sched_get_config(in->sched, NULL, 0, &len);
    if (rc && rc != TDM_E_TRUNCATED) return lib_fail(e, rc, in->sched, "get_config");
    char *buf = malloc(len + 1);
    if (!buf) return tdm__serve_fail(e, TDM_E_NOMEM, "out of memory");
    rc = tdm_sched_get_config(in->sched, buf, len + 1, &len);
    if (rc) {
        free(buf);
        return lib_fail(e, rc, in->sched, "get_config");
    }
    /* Pack into a scratch buffer first so that a bad document cannot leave half a pair. */
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    rc = tdm__serve_pack_json(&pk, buf);
    free(buf);
    if (rc == 0) {
        tdm__serve_key(r, "config");
        if (sb.size) msgpack_sbuffer_write(&r->body, sb.data, sb.size);
    }
    msgpack_sbuffer_destroy(&sb);
    return rc ? tdm__serve_fail(e, TDM_E_INTERNAL, "the library's config is not valid JSON") : 0;
}

static const char *const param_names[] = {
    NULL, "max_num_batched_tokens", "max_num_seqs", "max_model_len",
    "long_prefill_token_threshold", "enable_chunked_prefill", "num_blocks", "block_size",
    "enable_prefix_caching", "watermark_ppm", "policy", "mode", "tbt_target_us",
    "num_lookahead_tokens", "role", "remote_kv_failure", "remote_kv_timeout_ms",
    "delay_free_timeout_ms", "max_num_partial_prefills", "prefix_hash", "reserve_full_prompt",
    "continue_after_self_preemption", "enable_kv_events", "kv_events_capacity",
    "async_scheduling", "slo_ttft_us", "slo_tpot_us",
};
#define NUM_PARAMS ((int)(sizeof param_names / sizeof param_names[0]))

static int get_param_key(const msgpack_object *m, int *out, tdm__serve_err *e)
{
    const msgpack_object *k = tdm__serve_field(m, "key");
    if (!k) return tdm__serve_fail(e, TDM_E_INVAL, "missing key \"key\"");
    if (k->type == MSGPACK_OBJECT_POSITIVE_INTEGER && k->via.u64 < 1024) {
        *out = (int)k->via.u64;
        return 0;
    }
    if (k->type == MSGPACK_OBJECT_STR) {
        for (int i = 1; i < NUM_PARAMS; i++) {
            if (!param_names[i]) continue;
            size_t n = strlen(param_names[i]);
            if (k->via.str.size == n && !memcmp(k->via.str.ptr, param_names[i], n)) {
                *out = i;
                return 0;
            }
        }
        return tdm__serve_fail(e, TDM_E_INVAL, "unknown parameter name \"%.*s\"",
                               (int)(k->via.str.size > 64 ? 64 : k->via.str.size), k->via.str.ptr);
    }
    return tdm__serve_fail(e, TDM_E_INVAL, "\"key\" must be a parameter name or number");
}

static int op_set_param(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                        reply *r, tdm__serve_err *e)
{
    int k;
    int64_t v = 0;
    int rc = get_param_key(m, &k, e);
    if (!rc) rc = tdm__serve_get_i64(m, "value", 1, INT64_MIN, INT64_MAX, &v, e);
    if (rc) return rc;
    if (k == TDM_SCHED_NUM_BLOCKS && (rc = tdm__serve_check_blocks(st, v, in->num_blocks, e))) return rc;
    rc = tdm_sched_set_param(in->sched, (tdm_sched_param)k, v);
    if (rc) return lib_fail(e, rc, in->sched, "set_param");
    tdm__serve_recount_blocks(st, in);
    return 0;
}

static int op_get_param(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                        reply *r, tdm__serve_err *e)
{
    int k;
    int64_t v = 0;
    int rc = get_param_key(m, &k, e);
    if (rc) return rc;
    rc = tdm_sched_get_param(in->sched, (tdm_sched_param)k, &v);
    if (rc) return lib_fail(e, rc, in->sched, "get_param");
    msgpack_pack_int64(tdm__serve_key(r, "value"), v);
    return 0;
}

static int op_add(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                  reply *r, tdm__serve_err *e)
{
    tdm_request_desc d;
    tdm_request_desc_init(&d);
    uint64_t id = 0, max_tokens = 16, min_tokens = 0, flags = 0, remote = 0, tenant = 0;
    int64_t eos = -1, prio = 0;
    double arrival = now_s(), ttft = 0, tpot = 0;
    int b_ie = 0, b_rp = 0, b_rd = 0, b_sp = 0, b_sd = 0;
    int32_t *prompt = NULL, *stops = NULL;
    uint32_t np = 0, ns = 0;
    char salt[4097];
    uint32_t salt_len = 0;
    int rc;
    const msgpack_object *eo = tdm__serve_field(m, "eos_token_id");
    if ((rc = get_id(m, &id, e)) ||
        (rc = tdm__serve_get_u64(m, "max_tokens", 0, UINT32_MAX, &max_tokens, e)) ||
        (rc = tdm__serve_get_u64(m, "min_tokens", 0, UINT32_MAX, &min_tokens, e)) ||
        (rc = tdm__serve_get_u64(m, "flags", 0, 0xFu, &flags, e)) ||
        (rc = tdm__serve_get_u64(m, "num_remote_tokens", 0, UINT32_MAX, &remote, e)) ||
        (rc = tdm__serve_get_u64(m, "tenant", 0, UINT32_MAX, &tenant, e)) ||
        (rc = (eo && eo->type == MSGPACK_OBJECT_NIL) ? 0
              : tdm__serve_get_i64(m, "eos_token_id", 0, -1, INT32_MAX, &eos, e)) ||
        (rc = tdm__serve_get_i64(m, "priority", 0, INT32_MIN, INT32_MAX, &prio, e)) ||
        (rc = tdm__serve_get_double(m, "arrival_time", 0, &arrival, e)) ||
        (rc = tdm__serve_get_double(m, "ttft_slo", 0, &ttft, e)) ||
        (rc = tdm__serve_get_double(m, "tpot_slo", 0, &tpot, e)) ||
        (rc = tdm__serve_get_bool(m, "ignore_eos", &b_ie, e)) ||
        (rc = tdm__serve_get_bool(m, "remote_prefill", &b_rp, e)) ||
        (rc = tdm__serve_get_bool(m, "remote_decode", &b_rd, e)) ||
        (rc = tdm__serve_get_bool(m, "skip_prefix_cache", &b_sp, e)) ||
        (rc = tdm__serve_get_bool(m, "slo_deprioritize", &b_sd, e)))
        return rc;
    const msgpack_object *so = tdm__serve_field(m, "cache_salt");
    if (so && so->type != MSGPACK_OBJECT_NIL) {
        if ((so->type != MSGPACK_OBJECT_STR && so->type != MSGPACK_OBJECT_BIN) ||
            so->via.str.size > 4096)
            return tdm__serve_fail(e, TDM_E_INVAL, "\"cache_salt\" must be a string or bytes of "
                                   "at most 4096 bytes");
        salt_len = so->via.str.size; /* str and bin share the layout */
        memcpy(salt, so->via.str.ptr, salt_len);
    }
    /* a large add's prompt was converted (and hashed) on the decoding thread (serve_pre.c) */
    const tdm__serve_pre *pre = st->pre && st->pre->done ? st->pre : NULL;
    if (pre) {
        prompt = pre->prompt;
        np = pre->np;
    } else if ((rc = tdm__serve_get_tokens(m, "prompt", 1, &prompt, &np, e))) {
        return rc;
    }
    if ((rc = tdm__serve_get_tokens(m, "stop_token_ids", 0, &stops, &ns, e))) {
        if (!pre) free(prompt);
        return rc;
    }
    d.flags = (uint32_t)flags | (b_ie ? TDM_REQ_IGNORE_EOS : 0) |
              (b_rp ? TDM_REQ_REMOTE_PREFILL : 0) | (b_rd ? TDM_REQ_REMOTE_DECODE : 0) |
              (b_sp ? TDM_REQ_SKIP_PREFIX_CACHE : 0) | (b_sd ? TDM_REQ_SLO_DEPRIORITIZE : 0);
    d.id = id;
    d.prompt = prompt;
    d.num_prompt_tokens = np;
    d.max_tokens = (uint32_t)max_tokens;
    d.min_tokens = (uint32_t)min_tokens;
    d.eos_token_id = (int32_t)eos;
    d.stop_token_ids = stops;
    d.num_stop_token_ids = ns;
    d.priority = (int32_t)prio;
    d.arrival_time = arrival;
    d.ttft_slo = ttft;
    d.tpot_slo = tpot;
    d.cache_salt = salt_len ? salt : NULL;
    d.cache_salt_len = salt_len;
    d.num_remote_tokens = (uint32_t)remote;
    d.tenant = (uint32_t)tenant;
    if (tdm__serve_pre_usable(pre, in)) { /* the library checks two and stores the rest */
        d.flags |= TDM_REQ_PRECOMPUTED_DIGESTS;
        d.block_hashes = pre->digests;
        d.num_block_hashes = pre->nd;
        d.block_hash_size = pre->dsize;
    }
    rc = tdm__serve_admit(st, in, np, e);
    if (rc) {
        if (!pre) free(prompt);
        free(stops);
        return rc;
    }
    rc = tdm_sched_add(in->sched, &d);
    if (!pre) free(prompt);
    free(stops);
    if (rc) return lib_fail(e, rc, in->sched, "add");
    if (d.flags & TDM_REQ_PRECOMPUTED_DIGESTS) st->adds_precomputed++;
    tdm__serve_admitted(st, in, id, np);
    msgpack_pack_uint64(tdm__serve_key(r, "id"), id);
    return 0;
}

static int op_abort(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                    reply *r, tdm__serve_err *e)
{
    uint64_t id;
    int rc = get_id(m, &id, e);
    if (rc) return rc;
    rc = tdm_sched_abort(in->sched, id);
    return rc ? lib_fail(e, rc, in->sched, "abort") : 0;
}

static int op_finish(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                     reply *r, tdm__serve_err *e)
{
    uint64_t id, reason = TDM_FINISH_STOP;
    int rc = get_id(m, &id, e);
    if (!rc) rc = tdm__serve_get_u64(m, "reason", 0, 255, &reason, e);
    if (rc) return rc;
    rc = tdm_sched_finish(in->sched, id, (tdm_finish_reason)reason);
    return rc ? lib_fail(e, rc, in->sched, "finish") : 0;
}

static int op_step(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                   reply *r, tdm__serve_err *e)
{
    double now = now_s();
    int rc = tdm__serve_get_double(m, "now", 0, &now, e);
    if (rc) return rc;
    tdm_batch b;
    tdm_batch_init(&b);
    rc = tdm_sched_step(in->sched, now, &b);
    if (rc) return lib_fail(e, rc, in->sched, "step");
    msgpack_packer *pk = tdm__serve_key(r, "batch");
    msgpack_pack_map(pk, 13);
    tdm__serve_kv_u64(pk, "step", b.step);
    tdm__serve_kv_u64(pk, "total_tokens", b.total_tokens);
    tdm__serve_kv_u64(pk, "num_prefill_reqs", b.num_prefill_reqs);
    tdm__serve_kv_u64s(pk, "req_ids", b.req_ids, b.num_reqs);
    tdm__serve_kv_u32s(pk, "num_tokens", b.num_tokens, b.num_reqs);
    tdm__serve_kv_u32s(pk, "num_computed", b.num_computed, b.num_reqs);
    tdm__serve_kv_u8s(pk, "kinds", b.kinds, b.num_reqs);
    tdm__serve_kv_u32s(pk, "num_spec", b.num_spec, b.num_reqs);
    tdm__serve_kv_u32s(pk, "block_offsets", b.block_offsets, b.num_reqs ? b.num_reqs + 1 : 0);
    tdm__serve_kv_u32s(pk, "blocks", b.blocks, b.num_reqs ? b.block_offsets[b.num_reqs] : 0);
    tdm__serve_kv_u64s(pk, "preempted", b.preempted_ids, b.num_preempted);
    tdm__serve_kv_u64s(pk, "finished", b.finished_ids, b.num_finished);
    tdm__serve_kv_u64s(pk, "recv_ready", b.recv_ready_ids, b.num_recv_ready);
    return 0;
}

/* "outputs": {id: [tokens]} or "req_ids": [ids] with "tokens": [[tokens], ...]. */
static int op_update(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                     reply *r, tdm__serve_err *e)
{
    double now = now_s();
    int rc = tdm__serve_get_double(m, "now", 0, &now, e);
    if (rc) return rc;
    /* a large update's outputs were decoded on the decoding thread (serve_pre.c) */
    tdm__serve_outputs own;
    const tdm__serve_outputs *u = st->pre && st->pre->outs.done ? &st->pre->outs : &own;
    if (u == &own && (rc = tdm__serve_outputs_parse(m, &own, e))) return rc;
    tdm_update_result res;
    tdm_update_result_init(&res);
    if (!rc) {
        tdm_step_output o;
        tdm_step_output_init(&o);
        o.num_reqs = u->n;
        o.req_ids = u->ids;
        o.token_offsets = u->offs;
        o.tokens = u->all;
        o.now = now;
        rc = tdm_sched_update(in->sched, &o, &res);
        if (rc) rc = lib_fail(e, rc, in->sched, "update");
    }
    if (u == &own) tdm__serve_outputs_free(&own);
    if (rc) return rc;
    msgpack_packer *pk = tdm__serve_key(r, "results");
    msgpack_pack_map(pk, 4);
    tdm__serve_kv_u64s(pk, "req_ids", res.req_ids, res.num_reqs);
    tdm__serve_kv_u32s(pk, "num_new_tokens", res.num_new_tokens, res.num_reqs);
    tdm__serve_kv_u8s(pk, "finish_reasons", res.finish_reasons, res.num_reqs);
    tdm__serve_kv_i32s(pk, "stop_tokens", res.stop_tokens, res.num_reqs);
    return 0;
}

static int op_draft(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                    reply *r, tdm__serve_err *e)
{
    uint64_t id;
    int32_t *t = NULL;
    uint32_t n = 0;
    int rc = get_id(m, &id, e);
    if (!rc) rc = tdm__serve_get_tokens(m, "tokens", 1, &t, &n, e);
    if (rc) return rc;
    rc = tdm_sched_set_draft_tokens(in->sched, id, t, n);
    free(t);
    return rc ? lib_fail(e, rc, in->sched, "draft") : 0;
}

static int op_info(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                   reply *r, tdm__serve_err *e)
{
    uint64_t id;
    int want_blocks = 0, want_tokens = 0;
    int rc = get_id(m, &id, e);
    if (!rc) rc = tdm__serve_get_bool(m, "blocks", &want_blocks, e);
    if (!rc) rc = tdm__serve_get_bool(m, "tokens", &want_tokens, e);
    if (rc) return rc;
    tdm_request_info i;
    tdm_request_info_init(&i);
    const uint32_t *blocks = NULL;
    uint32_t nb = 0, nt = 0;
    const tdm_token *toks = NULL;
    if ((rc = tdm_sched_request_info(in->sched, id, &i)) ||
        (want_blocks && (rc = tdm_sched_request_blocks(in->sched, id, &blocks, &nb))) ||
        (want_tokens && (rc = tdm_sched_request_tokens(in->sched, id, &toks, &nt))))
        return lib_fail(e, rc, in->sched, "info");
    msgpack_packer *pk = tdm__serve_key(r, "info");
    msgpack_pack_map(pk, 15);
    tdm__serve_kv_u64(pk, "state", i.state);
    tdm__serve_kv_u64(pk, "finish_reason", i.finish_reason);
    tdm__serve_kv_u64(pk, "num_prompt_tokens", i.num_prompt_tokens);
    tdm__serve_kv_u64(pk, "num_output_tokens", i.num_output_tokens);
    tdm__serve_kv_u64(pk, "num_computed_tokens", i.num_computed_tokens);
    tdm__serve_kv_u64(pk, "num_cached_tokens", i.num_cached_tokens);
    tdm__serve_kv_u64(pk, "num_blocks", i.num_blocks);
    tdm__serve_kv_u64(pk, "num_preemptions", i.num_preemptions);
    tdm__serve_kv_i64(pk, "priority", i.priority);
    tdm__serve_kv_double(pk, "arrival_time", i.arrival_time);
    tdm__serve_kv_double(pk, "first_scheduled_time", i.first_scheduled_time);
    tdm__serve_kv_double(pk, "first_token_time", i.first_token_time);
    tdm__serve_kv_double(pk, "last_token_time", i.last_token_time);
    tdm__serve_kv_double(pk, "finish_time", i.finish_time);
    tdm__serve_kv_double(pk, "max_token_gap", i.max_token_gap);
    if (want_blocks) {
        r->pairs++;
        tdm__serve_kv_u32s(&r->pk, "blocks", blocks, nb);
    }
    if (want_tokens) {
        r->pairs++;
        tdm__serve_kv_i32s(&r->pk, "tokens", toks, nt);
    }
    return 0;
}

static int op_remote_kv_done(tdm__serve_state *st, tdm__serve_instance *in,
                             const msgpack_object *m, reply *r, tdm__serve_err *e)
{
    uint64_t id, valid = 0;
    int ok = 1;
    int rc = get_id(m, &id, e);
    if (!rc) rc = tdm__serve_get_bool(m, "ok", &ok, e);
    if (!rc) rc = tdm__serve_get_u64(m, "num_valid_tokens", 0, UINT32_MAX, &valid, e);
    if (rc) return rc;
    rc = tdm_sched_remote_kv_done(in->sched, id, ok, (uint32_t)valid);
    return rc ? lib_fail(e, rc, in->sched, "remote_kv_done") : 0;
}

static int op_release(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                      reply *r, tdm__serve_err *e)
{
    uint64_t id;
    int rc = get_id(m, &id, e);
    if (rc) return rc;
    rc = tdm_sched_release(in->sched, id);
    return rc ? lib_fail(e, rc, in->sched, "release") : 0;
}

static int op_reset_prefix_cache(tdm__serve_state *st, tdm__serve_instance *in,
                                 const msgpack_object *m, reply *r, tdm__serve_err *e)
{
    int reset_running = 0;
    int rc = tdm__serve_get_bool(m, "reset_running", &reset_running, e);
    if (rc) return rc;
    rc = tdm_sched_reset_prefix_cache(in->sched, reset_running);
    return rc ? lib_fail(e, rc, in->sched, "reset_prefix_cache") : 0;
}

static int op_stats(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                    reply *r, tdm__serve_err *e)
{
    tdm_sched_stats s;
    uint32_t unfinished = 0;
    tdm_sched_stats_init(&s);
    int rc = tdm_sched_get_stats(in->sched, &s);
    if (!rc) rc = tdm_sched_num_unfinished(in->sched, &unfinished);
    if (rc) return lib_fail(e, rc, in->sched, "stats");
    msgpack_packer *pk = tdm__serve_key(r, "stats");
    msgpack_pack_map(pk, 17);
    tdm__serve_kv_u64(pk, "num_running", s.num_running);
    tdm__serve_kv_u64(pk, "num_waiting", s.num_waiting);
    tdm__serve_kv_u64(pk, "num_waiting_remote_kv", s.num_waiting_remote_kv);
    tdm__serve_kv_u64(pk, "num_held", s.num_held);
    tdm__serve_kv_u64(pk, "num_total_blocks", s.num_total_blocks);
    tdm__serve_kv_u64(pk, "num_free_blocks", s.num_free_blocks);
    tdm__serve_kv_u64(pk, "num_cached_blocks", s.num_cached_blocks);
    tdm__serve_kv_double(pk, "kv_usage", s.kv_usage);
    tdm__serve_kv_u64(pk, "prefix_queries", s.prefix_queries);
    tdm__serve_kv_u64(pk, "prefix_hits", s.prefix_hits);
    tdm__serve_kv_double(pk, "prefix_hit_rate", s.prefix_hit_rate);
    tdm__serve_kv_u64(pk, "evictions", s.evictions);
    tdm__serve_kv_u64(pk, "preemptions", s.preemptions);
    tdm__serve_kv_u64(pk, "steps", s.steps);
    tdm__serve_kv_u64(pk, "scheduled_tokens", s.scheduled_tokens);
    tdm__serve_kv_u64(pk, "finished", s.finished);
    tdm__serve_kv_u64(pk, "num_unfinished", unfinished);
    return 0;
}

static int op_shutdown(tdm__serve_state *st, tdm__serve_instance *in, const msgpack_object *m,
                       reply *r, tdm__serve_err *e)
{
    if (!st->caller->admin && !st->caller->local)
        return tdm__serve_fail(e, TDM_E_AUTH, "shutdown needs an admin key (--admin-key), or a "
                               "loopback service without CURVE");
    st->shutdown = 1;
    return 0;
}

static const struct op {
    const char *name;
    op_fn fn;
    int needs_instance;
} ops[] = {
    {"ping", op_ping, 0},
    {"create", op_create, 0},
    {"destroy", op_destroy, 1},
    {"list", op_list, 0},
    {"configure", op_configure, 1},
    {"get_config", op_get_config, 1},
    {"set_param", op_set_param, 1},
    {"get_param", op_get_param, 1},
    {"add", op_add, 1},
    {"abort", op_abort, 1},
    {"finish", op_finish, 1},
    {"step", op_step, 1},
    {"update", op_update, 1},
    {"draft", op_draft, 1},
    {"info", op_info, 1},
    {"remote_kv_done", op_remote_kv_done, 1},
    {"release", op_release, 1},
    {"reset_prefix_cache", op_reset_prefix_cache, 1},
    {"stats", op_stats, 1},
    {"shutdown", op_shutdown, 0},
#ifndef TDM_SERVE_NO_KVX
    /* the KV transfer engine (serve_kvx.c): named engines with service-owned host caches */
    {"kvx_create", tdm__serve_op_kvx_create, 0},
    {"kvx_destroy", tdm__serve_op_kvx_destroy, 0},
    {"kvx_connect", tdm__serve_op_kvx_connect, 0},
    {"kvx_send", tdm__serve_op_kvx_send, 0},
    {"kvx_recv", tdm__serve_op_kvx_recv, 0},
    {"kvx_send_ready", tdm__serve_op_kvx_send_ready, 0},
    {"kvx_cancel", tdm__serve_op_kvx_cancel, 0},
    {"kvx_poll", tdm__serve_op_kvx_poll, 0},
    {"kvx_write", tdm__serve_op_kvx_write, 0},
    {"kvx_read", tdm__serve_op_kvx_read, 0},
    {"kvx_stats", tdm__serve_op_kvx_stats, 0},
#endif
};

/* Runs the request; fills r (success) or e (failure). */
int tdm__serve_dispatch(tdm__serve_state *st, const msgpack_object *m, tdm__serve_reply *r,
                        tdm__serve_err *e)
{
    if (m->type != MSGPACK_OBJECT_MAP)
        return tdm__serve_fail(e, TDM_E_PROTOCOL, "a request must be a msgpack map, not another type");
    char opname[32];
    int rc = tdm__serve_get_str(m, "op", 1, opname, sizeof opname, e);
    if (rc) return rc;
    const struct op *op = NULL;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!strcmp(ops[i].name, opname)) op = &ops[i];
    if (!op) return tdm__serve_fail(e, TDM_E_INVAL, "unknown op \"%s\"", opname);
    tdm__serve_instance *in = NULL;
    if (op->needs_instance) {
        char name[TDM_SERVE_NAME_MAX + 1];
        if ((rc = tdm__serve_get_str(m, "name", 1, name, sizeof name, e))) return rc;
        if (!(in = find(st, name)))
            return tdm__serve_fail(e, TDM_E_NOT_FOUND, "no instance \"%s\"", name);
        if (!tdm__serve_may_use(st, in))
            return tdm__serve_fail(e, TDM_E_AUTH, "instance \"%s\" belongs to another client "
                                   "(create it with \"shared\": true to share it)", name);
    }
    rc = op->fn(st, in, m, r, e);
    if (!rc && st->hashcfgs && (op->fn == op_create || op->fn == op_configure ||
                                op->fn == op_set_param || op->fn == op_destroy))
        tdm__serve_pre_publish(st); /* the decoding thread hashes prompts as they now do */
    return rc;
}
