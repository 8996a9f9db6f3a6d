/*
 * test_kvx_nixl_absent.c -- without NIXL the library still links and runs: asking for the
 * NIXL transport fails at tdm_kvx_create with TDM_E_UNSUPPORTED and a message naming what
 * was tried, every other transport still works, and the JSON configuration knows "nixl".
 * The search is pointed at directories that do not exist before anything loads.
 */
#include "kvx_testutil.h"

static void nixl_absent__create_fails_with_unsupported_and_says_why(void **state)
{
    (void)state;
    tdm_kvx_config c;
    t_config(&c, "no-nixl", TDM_KVX_ROLE_DECODE, NULL);
    c.transports = TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_NIXL;
    tdm_kvx *k = NULL;
    int rc = tdm_kvx_create(&c, &k);
    if (rc == TDM_OK) {   /* the dynamic linker's own path has it: nothing to check here */
        tdm_kvx_destroy(k);
        skip();
    }
    assert_int_equal(rc, TDM_E_UNSUPPORTED);
    assert_null(k);
    const char *why = tdm_kvx_errmsg(NULL);
    assert_non_null(strstr(why, "libnixl_capi"));
    assert_non_null(strstr(why, "/nonexistent-tdm/libnixl_capi.so.0"));
    /* without it the engine works as before */
    c.transports = TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_SHM;
    assert_int_equal(tdm_kvx_create(&c, &k), TDM_OK);
    tdm_kvx_destroy(k);
    /* an unknown transport bit is a configuration error */
    c.transports = TDM_KVX_TRANSPORT_ZMQ | (1u << 4);
    assert_int_equal(tdm_kvx_create(&c, &k), TDM_E_CONFIG);
    k = NULL;
    assert_int_equal(tdm_kvx_create_json("{\"engine_id\": \"j\", \"transports\": [\"zmq\", \"nixl\"]}", &k),
                     TDM_E_UNSUPPORTED);
    assert_null(k);
}

int main(void)
{
    setenv("TANDEM_NIXL_DIR", "/nonexistent-tdm", 1);
    unsetenv("TANDEM_NIXL_LIB");
    unsetenv("VIRTUAL_ENV");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nixl_absent__create_fails_with_unsupported_and_says_why),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
