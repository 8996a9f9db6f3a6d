/*
 * fuzz_serve_msg.c -- fuzz harness for the request decoder of `tandem serve`: each input is
 * one request message handled against a fresh service state holding instance "s" (a small
 * pool and one running request). Properties: a reply is always produced and is a msgpack map
 * with a boolean "ok"; an error reply leaves the instance's stats and request and the
 * service's counters (blocks, queued tokens, instances) unchanged; the same message from a
 * CURVE client that does not own the instance never changes it nor stops the service; the
 * peek of serve_check.c never reports more elements than the input has bytes; handled the
 * way a large request is (decoded, an add's prompt converted and its block digests computed
 * as on the decoding thread, serve_pre.c), the reply and the instance's stats are exactly
 * those of the inline path. Token arrays may also come as a bin of packed int32.
 * The service sources are compiled in directly (they live in tools/, not in the library).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The transfer-engine ops bind sockets and start threads: not part of this harness. */
#define TDM_SERVE_NO_KVX 1
#include "../../tools/serve_msg.c"
#include "../../tools/serve_check.c"
#include "../../tools/serve_limits.c"
#include "../../tools/serve_ops.c"
#include "../../tools/serve_pre.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run(tdm__serve_state *st, const char *msg, size_t len, int *ok)
{
    msgpack_sbuffer out;
    msgpack_sbuffer_init(&out);
    if (tdm__serve_handle(st, msg, len, &out) != 0) abort();
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    if (msgpack_unpack_next(&up, out.data, out.size, &off) != MSGPACK_UNPACK_SUCCESS ||
        off != out.size)
        abort();
    const msgpack_object *o = tdm__serve_field(&up.data, "ok");
    if (!o || o->type != MSGPACK_OBJECT_BOOLEAN) abort();
    *ok = o->via.boolean;
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&out);
    return 0;
}

static void pack_call(msgpack_sbuffer *sb, const char *op, int with_req)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, with_req ? 4 : 3);
    tdm__serve_kv_str(&pk, "op", op);
    tdm__serve_kv_str(&pk, "name", "s");
    if (!strcmp(op, "create")) {
        tdm__serve_kv_str(&pk, "config", "{\"block_size\":4,\"num_blocks\":64,"
                                         "\"max_num_batched_tokens\":64,\"max_num_seqs\":8}");
    } else {
        tdm__serve_kv_double(&pk, "now", 1.0);
    }
    if (with_req) tdm__serve_kv_u64(&pk, "id", 1);
}

static void setup(tdm__serve_state *st)
{
    tdm__serve_init(st);
    st->max_msg_bytes = 1 << 20;
    int ok = 0;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_call(&sb, "create", 0);
    run(st, sb.data, sb.size, &ok);
    if (!ok) abort();
    msgpack_sbuffer_clear(&sb);
    /* add request 1 with prompt [1..5] */
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 5);
    tdm__serve_kv_str(&pk, "op", "add");
    tdm__serve_kv_str(&pk, "name", "s");
    tdm__serve_kv_u64(&pk, "id", 1);
    tdm__serve_kv_u64(&pk, "max_tokens", 4);
    static const int32_t prompt[] = {1, 2, 3, 4, 5};
    tdm__serve_kv_i32s(&pk, "prompt", prompt, 5);
    run(st, sb.data, sb.size, &ok);
    if (!ok) abort();
    msgpack_sbuffer_clear(&sb);
    pack_call(&sb, "step", 0);
    run(st, sb.data, sb.size, &ok);
    if (!ok) abort();
    msgpack_sbuffer_destroy(&sb);
}

/* Two replies say the same: byte for byte, except that "info" holds times of the clock (the
 * requests' arrival), so there the rest of the reply must be equal. */
static int same_reply(const msgpack_sbuffer *a, const msgpack_sbuffer *b)
{
    if (a->size == b->size && !memcmp(a->data, b->data, a->size)) return 1;
    msgpack_unpacked ua, ub;
    msgpack_unpacked_init(&ua);
    msgpack_unpacked_init(&ub);
    size_t oa = 0, ob = 0;
    int same = msgpack_unpack_next(&ua, a->data, a->size, &oa) == MSGPACK_UNPACK_SUCCESS &&
               msgpack_unpack_next(&ub, b->data, b->size, &ob) == MSGPACK_UNPACK_SUCCESS &&
               ua.data.type == MSGPACK_OBJECT_MAP && ub.data.type == MSGPACK_OBJECT_MAP &&
               ua.data.via.map.size == ub.data.via.map.size && tdm__serve_field(&ua.data, "info");
    for (uint32_t i = 0; same && i < ua.data.via.map.size; i++) {
        const msgpack_object_kv *x = &ua.data.via.map.ptr[i], *y = &ub.data.via.map.ptr[i];
        same = msgpack_object_equal(x->key, y->key) &&
               (key_is(&x->key, "info") || msgpack_object_equal(x->val, y->val));
    }
    msgpack_unpacked_destroy(&ua);
    msgpack_unpacked_destroy(&ub);
    return same;
}

/* The message handled as the decoding thread and the loop handle a large one: peek and plan,
 * decode, the add's prompt work, then the op with st->pre. The reply bytes in *out. */
static void run_queued(tdm__serve_state *st, const char *msg, size_t len, msgpack_sbuffer *out)
{
    tdm__serve_hashcfgs h;
    tdm__serve_pre pre;
    tdm__serve_err e;
    memset(&e, 0, sizeof e);
    memset(&pre, 0, sizeof pre);
    tdm__serve_hashcfgs_init(&h);
    st->hashcfgs = &h;
    tdm__serve_pre_publish(st);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    int rc = tdm__serve_early_check(st, msg, len, &e);
    if (!rc) rc = tdm__serve_decode(msg, len, &up, &e);
    if (!rc) tdm__serve_pre_run(&h, &up.data, &pre);
    st->pre = &pre;
    uint64_t deferred = 0;
    if (tdm__serve_handle_decoded(st, NULL, rc, &e, &up, out, &deferred) != 0 || deferred) abort();
    st->pre = NULL;
    st->hashcfgs = NULL;
    tdm__serve_pre_free(&pre);
    tdm__serve_hashcfgs_free(&h);
    msgpack_unpacked_destroy(&up);
}

static void snapshot(tdm__serve_state *st, tdm_sched_stats *s, tdm_request_info *i,
                     uint32_t *ntok)
{
    tdm__serve_instance *in = find(st, "s");
    memset(s, 0, sizeof *s);
    memset(i, 0, sizeof *i);
    *ntok = 0;
    if (!in) return;
    tdm_sched_stats_init(s);
    tdm_sched_get_stats(in->sched, s);
    tdm_request_info_init(i);
    tdm_sched_request_info(in->sched, 1, i);
    const tdm_token *t;
    if (tdm_sched_request_tokens(in->sched, 1, &t, ntok)) *ntok = 0;
}

/* The message from another CURVE client (not an admin, not the owner of "s"). */
static void run_as_stranger(tdm__serve_state *st, const char *msg, size_t len, int *ok)
{
    static const tdm__serve_caller stranger = {"0123456789012345678901234567890123456789", 0, 0};
    msgpack_sbuffer out;
    msgpack_sbuffer_init(&out);
    uint64_t deferred = 0;
    if (tdm__serve_handle_as(st, &stranger, msg, len, &out, &deferred) != 0 || deferred) abort();
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    if (msgpack_unpack_next(&up, out.data, out.size, &off) != MSGPACK_UNPACK_SUCCESS) abort();
    const msgpack_object *o = tdm__serve_field(&up.data, "ok");
    if (!o || o->type != MSGPACK_OBJECT_BOOLEAN) abort();
    *ok = o->via.boolean;
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tdm__serve_state st;
    setup(&st);
    tdm_sched_stats s0, s1;
    tdm_request_info i0, i1;
    uint32_t n0, n1;
    snapshot(&st, &s0, &i0, &n0);
    uint64_t blocks0 = st.total_blocks, tokens0 = st.queued_tokens, inst0 = st.num_instances;
    int ok = 0;
    /* the peek reads what it may of any input, and never more than a well-formed map holds */
    tdm__serve_peek_info pi;
    if (tdm__serve_peek((const char *)data, size, &pi) == 0) {
        if (pi.have_op && strlen(pi.op) >= sizeof pi.op) abort();
        if (pi.max_array > size || (pi.prompt_n >= 0 && (uint64_t)pi.prompt_n > size)) abort();
    }
    run(&st, (const char *)data, size, &ok);
    if (!ok) {
        snapshot(&st, &s1, &i1, &n1);
        if (memcmp(&s0, &s1, sizeof s0) || memcmp(&i0, &i1, sizeof i0) || n0 != n1 ||
            st.total_blocks != blocks0 || st.queued_tokens != tokens0 || st.num_instances != inst0) {
            fprintf(stderr, "fuzz_serve_msg: an error reply changed the service's state\n");
            abort();
        }
    }
    tdm__serve_free(&st);

    /* Handled as a large request is (the add's prompt work on the decoding thread): the same
     * reply and the same instance stats as inline. */
    {
        tdm__serve_state a, b;
        setup(&a);
        setup(&b);
        msgpack_sbuffer ra, rb;
        msgpack_sbuffer_init(&ra);
        msgpack_sbuffer_init(&rb);
        if (tdm__serve_handle(&a, (const char *)data, size, &ra) != 0) abort();
        run_queued(&b, (const char *)data, size, &rb);
        tdm_sched_stats sa, sb;
        snapshot(&a, &sa, &i0, &n0);
        snapshot(&b, &sb, &i1, &n1);
        if (!same_reply(&ra, &rb) || memcmp(&sa, &sb, sizeof sa) ||
            n0 != n1 || i0.num_prompt_tokens != i1.num_prompt_tokens ||
            a.queued_tokens != b.queued_tokens || a.shutdown != b.shutdown) {
            fprintf(stderr, "fuzz_serve_msg: the queued path (prompt work on the worker) differs "
                            "from the inline path\n");
            abort();
        }
        msgpack_sbuffer_destroy(&ra);
        msgpack_sbuffer_destroy(&rb);
        tdm__serve_free(&a);
        tdm__serve_free(&b);
    }

    /* Under CURVE a stranger can neither change "s" (owned by the local creator) nor stop
     * the service, whatever it sends; its error replies change nothing either. */
    setup(&st);
    st.curve = 1;
    find(&st, "s")->shared = 0; /* created before CURVE was on: make it private */
    snapshot(&st, &s0, &i0, &n0);
    run_as_stranger(&st, (const char *)data, size, &ok);
    snapshot(&st, &s1, &i1, &n1);
    if (memcmp(&s0, &s1, sizeof s0) || memcmp(&i0, &i1, sizeof i0) || n0 != n1 || st.shutdown ||
        !find(&st, "s")) {
        fprintf(stderr, "fuzz_serve_msg: a client that does not own \"s\" changed it\n");
        abort();
    }
    tdm__serve_free(&st);
    return 0;
}
