/*
 * test_serve_pre.c -- an add's prompt work on `tandem serve`'s decoding thread
 * (tools/serve_pre.c, compiled in with the service sources it uses): the digests the worker
 * computes are used (TDM_REQ_PRECOMPUTED_DIGESTS) when the instance still hashes as the loop
 * published, and not when it was reconfigured, replaced or destroyed in between (the add then
 * hashes on the loop and still succeeds, or fails as it would have); an instance the loop has
 * not published gets no help; an update's outputs decoded by the worker give the inline reply.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define TDM_SERVE_NO_KVX 1
#include "../../../tools/serve_msg.c"
#include "../../../tools/serve_check.c"
#include "../../../tools/serve_limits.c"
#include "../../../tools/serve_ops.c"
#include "../../../tools/serve_pre.c"

static msgpack_sbuffer req;

static void begin(const char *op, uint32_t pairs)
{
    msgpack_sbuffer_clear(&req);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &req, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, pairs + 1);
    tdm__serve_kv_str(&pk, "op", op);
}

static msgpack_packer packer(void)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, &req, msgpack_sbuffer_write);
    return pk;
}

/* Handles req inline; returns "ok". */
static int run(tdm__serve_state *st)
{
    msgpack_sbuffer out;
    msgpack_sbuffer_init(&out);
    assert_int_equal(tdm__serve_handle(st, req.data, req.size, &out), 0);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&up, out.data, out.size, &off), MSGPACK_UNPACK_SUCCESS);
    const msgpack_object *o = tdm__serve_field(&up.data, "ok");
    assert_non_null(o);
    int ok = o->via.boolean;
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&out);
    return ok;
}

static void create(tdm__serve_state *st, const char *name, const char *config)
{
    begin("create", 2);
    msgpack_packer pk = packer();
    tdm__serve_kv_str(&pk, "name", name);
    tdm__serve_kv_str(&pk, "config", config);
    assert_true(run(st));
}

static void add_msg(uint64_t id, uint32_t n)
{
    static int32_t prompt[4096];
    for (uint32_t i = 0; i < n; i++) prompt[i] = (int32_t)(1000 + i);
    begin("add", 3);
    msgpack_packer pk = packer();
    tdm__serve_kv_str(&pk, "name", "s");
    tdm__serve_kv_u64(&pk, "id", id);
    tdm__serve_kv_i32s(&pk, "prompt", prompt, n);
}

/* The message the worker decoded (its strings point into it): kept until the loop's part, as
 * the service keeps a queued request's frames. */
static char *held;

/* The worker's part on the message now in req: decoded, prompt work done into *pre. */
static void worker(tdm__serve_state *st, msgpack_unpacked *up, tdm__serve_pre *pre)
{
    tdm__serve_err e;
    memset(pre, 0, sizeof *pre);
    msgpack_unpacked_init(up);
    held = malloc(req.size);
    assert_non_null(held);
    memcpy(held, req.data, req.size);
    assert_int_equal(tdm__serve_decode(held, req.size, up, &e), 0);
    tdm__serve_pre_run(st->hashcfgs, &up->data, pre);
}

/* The loop's part: the op with the worker's work; returns "ok". */
static int loop(tdm__serve_state *st, msgpack_unpacked *up, tdm__serve_pre *pre)
{
    tdm__serve_err e;
    memset(&e, 0, sizeof e);
    msgpack_sbuffer out;
    msgpack_sbuffer_init(&out);
    st->pre = pre;
    assert_int_equal(tdm__serve_handle_decoded(st, NULL, 0, &e, up, &out, NULL), 0);
    st->pre = NULL;
    msgpack_unpacked o;
    msgpack_unpacked_init(&o);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&o, out.data, out.size, &off), MSGPACK_UNPACK_SUCCESS);
    int ok = tdm__serve_field(&o.data, "ok")->via.boolean;
    const msgpack_object *msg = tdm__serve_field(&o.data, "message");
    if (!ok && msg) print_message("op failed: %.*s\n", (int)msg->via.str.size, msg->via.str.ptr);
    msgpack_unpacked_destroy(&o);
    msgpack_sbuffer_destroy(&out);
    tdm__serve_pre_free(pre);
    msgpack_unpacked_destroy(up);
    free(held);
    held = NULL;
    return ok;
}

static tdm__serve_hashcfgs hc;

static void setup(tdm__serve_state *st)
{
    tdm__serve_init(st);
    tdm__serve_hashcfgs_init(&hc);
    st->hashcfgs = &hc;
    msgpack_sbuffer_init(&req);
}

static void teardown(tdm__serve_state *st)
{
    st->hashcfgs = NULL;
    tdm__serve_free(st);
    tdm__serve_hashcfgs_free(&hc);
    msgpack_sbuffer_destroy(&req);
}

static void pre__digests_used_when_the_instance_is_unchanged(void **state)
{
    (void)state;
    tdm__serve_state st;
    setup(&st);
    create(&st, "s", "{\"block_size\": 16, \"num_blocks\": 512}");
    msgpack_unpacked up;
    tdm__serve_pre pre;
    add_msg(1, 1000);
    worker(&st, &up, &pre);
    assert_true(pre.done);
    assert_int_equal(pre.nd, 62); /* 1000 / 16 full blocks */
    assert_int_equal(pre.dsize, 32);
    assert_true(loop(&st, &up, &pre));
    assert_int_equal(st.adds_precomputed, 1);
    teardown(&st);
}

static void pre__reconfigured_or_replaced_instance_hashes_on_the_loop(void **state)
{
    (void)state;
    tdm__serve_state st;
    setup(&st);
    create(&st, "s", "{\"block_size\": 16, \"num_blocks\": 512}");
    msgpack_unpacked up;
    tdm__serve_pre pre;
    /* block_size changed between the worker and the op */
    add_msg(1, 1000);
    worker(&st, &up, &pre);
    begin("configure", 2);
    msgpack_packer pk = packer();
    tdm__serve_kv_str(&pk, "name", "s");
    tdm__serve_kv_str(&pk, "config", "{\"block_size\": 32}");
    assert_true(run(&st));
    assert_true(loop(&st, &up, &pre)); /* added, hashed by the library */
    assert_int_equal(st.adds_precomputed, 0);
    /* replaced by one with another algorithm (same name) */
    add_msg(2, 1000);
    worker(&st, &up, &pre);
    begin("destroy", 1);
    pk = packer();
    tdm__serve_kv_str(&pk, "name", "s");
    assert_true(run(&st));
    create(&st, "s", "{\"block_size\": 32, \"num_blocks\": 512, \"prefix_hash\": \"xxh3_128\"}");
    assert_true(loop(&st, &up, &pre));
    assert_int_equal(st.adds_precomputed, 0);
    /* destroyed: the op fails as it always did */
    add_msg(3, 1000);
    worker(&st, &up, &pre);
    begin("destroy", 1);
    pk = packer();
    tdm__serve_kv_str(&pk, "name", "s");
    assert_true(run(&st));
    assert_false(loop(&st, &up, &pre));
    /* unchanged again: used */
    create(&st, "s", "{\"block_size\": 32, \"num_blocks\": 512, \"prefix_hash\": \"xxh3_128\"}");
    add_msg(4, 1000);
    worker(&st, &up, &pre);
    assert_int_equal(pre.dsize, 16);
    assert_true(loop(&st, &up, &pre));
    assert_int_equal(st.adds_precomputed, 1);
    teardown(&st);
}

static void pre__unpublished_instance_gets_no_help(void **state)
{
    (void)state;
    tdm__serve_state st;
    setup(&st);
    st.hashcfgs = NULL; /* created while nothing was published */
    create(&st, "s", "{\"block_size\": 16, \"num_blocks\": 512}");
    st.hashcfgs = &hc;
    msgpack_unpacked up;
    tdm__serve_pre pre;
    add_msg(1, 1000);
    worker(&st, &up, &pre);
    assert_false(pre.done);
    assert_true(loop(&st, &up, &pre));
    assert_int_equal(st.adds_precomputed, 0);
    teardown(&st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pre__digests_used_when_the_instance_is_unchanged),
        cmocka_unit_test(pre__reconfigured_or_replaced_instance_hashes_on_the_loop),
        cmocka_unit_test(pre__unpublished_instance_gets_no_help),
    };
    return cmocka_run_group_tests_name("serve_pre", tests, NULL, NULL);
}
