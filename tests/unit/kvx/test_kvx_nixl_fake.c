/*
 * test_kvx_nixl_fake.c -- the NIXL transport against a test double of libnixl_capi
 * (tests/nixl/fake_nixl_capi.c, two engines in this process), so that its code runs in every
 * `make test` and under the sanitizers of `make check`, with the faults real NIXL cannot be
 * made to produce on demand: direct and staged READs byte-exact, a READ that completes with
 * an error, a post that fails, a READ still running when the transfer is cancelled or times
 * out (released before the blocks are: none is left behind), a backend that refuses to
 * release an active READ at first, and no UCX backend at all; the agent's progress thread
 * configuration, and contiguous blocks coalesced into one descriptor per run (byte-exact
 * over contiguous, broken and scattered block lists). The real library is tested
 * between two processes by tests/nixl/test_kvx_nixl.c (`make test-nixl`).
 */
#include <dlfcn.h>
#include <signal.h>

#include "kvx_testutil.h"
#include "../../../kv_transfer/kvx_internal.h"   /* the JSON-only lim settings */

#define N 16
#define TP (TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_NIXL)

static char fake_path[1024];
static long (*live_reqs)(void);
static long (*last_descs)(void);
static int (*last_cfg)(int *prog_thread, unsigned long long *delay_us);
static int (*last_workers)(char *buf, size_t n);
static uint32_t g_kind = 1;   /* the prefill cache's layout kind (duo_open) */

static void clear_faults(void)
{
    unsetenv("FAKE_NIXL_POLLS");
    unsetenv("FAKE_NIXL_STATUS_ERR");
    unsetenv("FAKE_NIXL_POST_ERR");
    unsetenv("FAKE_NIXL_RELEASE_BUSY");
    unsetenv("FAKE_NIXL_NO_BACKEND");
}

static int setup(void **state)
{
    (void)state;
    clear_faults();
    setenv("TANDEM_NIXL_THREADS", "1", 1);   /* the I/O thread's own READs; see copying_threads */
    return 0;
}

#define NEED_FAKE()                                                                     \
    do {                                                                                \
        if (!fake_path[0]) { fprintf(stderr, "skipped: fake libnixl_capi not built\n"); skip(); } \
    } while (0)

/* A config offering ZeroMQ and NIXL. */
static void nixl_config(tdm_kvx_config *c, const char *id, uint32_t role)
{
    t_config(c, id, role, NULL);
    c->transports = TP;
}

/* An engine with that config, which must be created. */
static tdm_kvx *create_ok(const char *id, uint32_t role)
{
    tdm_kvx_config c;
    nixl_config(&c, id, role);
    tdm_kvx *k = NULL;
    assert_int_equal(tdm_kvx_create(&c, &k), TDM_OK);
    return k;
}

/* An engine with that config is refused with want_rc, the message naming `needle`. */
static void create_refused(const char *id, uint32_t role, int want_rc, const char *needle)
{
    tdm_kvx_config c;
    nixl_config(&c, id, role);
    tdm_kvx *k = NULL;
    assert_int_equal(tdm_kvx_create(&c, &k), want_rc);
    assert_null(k);
    assert_non_null(strstr(tdm_kvx_errmsg(NULL), needle));
}

typedef struct duo {
    eng p, d;
    uint32_t peer;
    char ep[128];
} duo;

static uint32_t g_nixl_require_curve;   /* the prefill (server) side's nixl_require_curve */

static void duo_open(duo *u, const tdm_kv_layout *dl, uint32_t head_offset, uint32_t xfer_timeout_ms)
{
    t_ipc(u->ep, sizeof(u->ep), "nxfake");
    tdm_kvx_config c;
    nixl_config(&c, "fake-prefill", TDM_KVX_ROLE_PREFILL);
    c.listen_endpoint = u->ep;
    tdm_kv_layout l;
    t_layout(&l, g_kind, T_LAYERS, T_BLOCKS, T_BS, T_HEADS, T_DIM, TDM_DTYPE_FP16);
    t_engine_cfg(&u->p, &c, &l, 1234);
    pthread_mutex_lock(&u->p.kvx->mu);   /* as "nixl_require_curve" in tdm_kvx_create_json */
    u->p.kvx->lim.nixl_require_curve = g_nixl_require_curve;
    pthread_mutex_unlock(&u->p.kvx->mu);
    nixl_config(&c, "fake-decode", TDM_KVX_ROLE_DECODE);
    if (xfer_timeout_ms) c.transfer_timeout_ms = xfer_timeout_ms;
    t_engine_off(&u->d, &c, dl ? dl : &l, 99, head_offset);
    char real[256];
    assert_int_equal(tdm_kvx_get_endpoint(u->p.kvx, real, sizeof(real)), TDM_OK);
    if (tdm_kvx_connect(u->d.kvx, real, NULL, &u->peer)) fail_msg("connect: %s", tdm_kvx_errmsg(u->d.kvx));
}

static void duo_close(duo *u)
{
    t_free(&u->d);
    t_free(&u->p);
    assert_int_equal(live_reqs(), 0);   /* every READ released */
}

/* Declares request 1 (src, n blocks, `ready` of them ready) and pulls it into dst. */
static uint64_t start(duo *u, const uint32_t *src, uint32_t n_src, uint32_t ready, const uint32_t *dst, uint32_t n_dst,
                      uint64_t *send_h)
{
    tdm_kvx_send_desc sd;
    t_send_desc(&sd, 1, src, n_src, ready);
    assert_int_equal(tdm_kvx_send(u->p.kvx, &sd, send_h), TDM_OK);
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, u->peer, 1, dst, n_dst, 0);
    uint64_t h;
    assert_int_equal(tdm_kvx_recv(u->d.kvx, &rd, &h), TDM_OK);
    return h;
}

/* start() for all N blocks, ready, between scattered ids (src seed 5, dst seed 6). */
static uint64_t start_scattered(duo *u, uint32_t *src, uint32_t *dst)
{
    t_ids(src, N, T_BLOCKS, 5);
    t_ids(dst, N, T_BLOCKS, 6);
    uint64_t sh;
    return start(u, src, N, N, dst, N, &sh);
}

/* Waits (up to 2 s) until a READ has been posted to the fake. */
static void wait_read_posted(void)
{
    for (int i = 0; live_reqs() == 0 && i < 2000; i++) t_sleep_ms(1);
}

/* The receiver holds no reservation and no receive. */
static void expect_released(duo *u)
{
    tdm_kvx_stats s = t_stats(&u->d);
    assert_int_equal(s.num_reserved_blocks, 0);
    assert_int_equal(s.num_recv_active, 0);
}

static void nixl_fake__direct_and_staged_reads_are_byte_exact(void **state)
{
    (void)state;
    NEED_FAKE();
    for (int staged = 0; staged < 2; staged++) {
        duo u;
        tdm_kv_layout hnd;   /* same packed format, other arrangement: staged */
        t_layout(&hnd, 2, T_LAYERS, T_BLOCKS, T_BS, T_HEADS, T_DIM, TDM_DTYPE_FP16);
        duo_open(&u, staged ? &hnd : NULL, 0, 0);
        uint32_t src[N], dst[N];
        start_scattered(&u, src, dst);
        tdm_kvx_event ev = t_wait(&u.d);
        if (ev.type != TDM_KVX_EV_DONE) fail_msg("%s: %s", staged ? "staged" : "direct", ev.reason);
        assert_int_equal(t_wait(&u.p).type, TDM_KVX_EV_DONE);
        assert_int_equal(t_compare(&u.p, src, &u.d, dst, 0, N), 0);
        assert_true(t_stats(&u.d).chunks_read_nixl > 0);
        /* the sender's chunks went over NIXL: none of them through shared memory */
        tdm_kvx_stats ps = t_stats(&u.p);
        assert_true(ps.chunks_sent > 0);
        assert_int_equal(ps.chunks_sent_shm, 0);
        duo_close(&u);
    }
}

/* nixl_require_curve on a server without CURVE: its peers are not authenticated, so NIXL
 * (which lets the peer READ the whole registered region) is not offered; the transfer still
 * completes over ZeroMQ, byte-exact, with no NIXL READ. */
static void nixl_fake__require_curve_keeps_unauthenticated_peers_off_nixl(void **state)
{
    (void)state;
    NEED_FAKE();
    duo u;
    g_nixl_require_curve = 1;
    duo_open(&u, NULL, 0, 0);
    g_nixl_require_curve = 0;
    uint32_t src[N], dst[N];
    start_scattered(&u, src, dst);
    tdm_kvx_event ev = t_wait(&u.d);
    if (ev.type != TDM_KVX_EV_DONE) fail_msg("%s", ev.reason);
    assert_int_equal(t_wait(&u.p).type, TDM_KVX_EV_DONE);
    assert_int_equal(t_compare(&u.p, src, &u.d, dst, 0, N), 0);
    assert_int_equal(t_stats(&u.d).chunks_read_nixl, 0);
    duo_close(&u);
}

static void nixl_fake__head_split_and_block_size_convert(void **state)
{
    (void)state;
    NEED_FAKE();
    duo u;
    tdm_kv_layout l;
    t_layout(&l, 1, T_LAYERS, T_BLOCKS, T_BS * 2, 1, T_DIM, TDM_DTYPE_FP16);
    duo_open(&u, &l, 1, 0);
    uint32_t src[N], dst[N / 2];
    t_ids(src, N, T_BLOCKS, 5);
    t_ids(dst, N / 2, T_BLOCKS, 6);
    uint64_t sh;
    start(&u, src, N, N, dst, N / 2, &sh);
    tdm_kvx_event ev = t_wait(&u.d);
    if (ev.type != TDM_KVX_EV_DONE) fail_msg("%s", ev.reason);
    for (uint32_t layer = 0; layer < T_LAYERS; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (uint32_t t = 0; t < N * T_BS; t++)
                assert_memory_equal(t_row(&u.p, layer, kv, src[t / T_BS], t % T_BS, 1),
                                    t_row(&u.d, layer, kv, dst[t / (2 * T_BS)], t % (2 * T_BS), 0), T_DIM * 2);
    duo_close(&u);
}

/* A fault during the READ: the transfer fails on both ends, reservations are released. */
static void fault(const char *var, const char *val, int want_status)
{
    duo u;
    duo_open(&u, NULL, 0, 0);
    setenv(var, val, 1);
    uint32_t src[N], dst[N];
    uint64_t h = start_scattered(&u, src, dst);
    tdm_kvx_event ev = t_wait(&u.d);
    assert_int_equal(ev.type, TDM_KVX_EV_FAILED);
    assert_int_equal(ev.handle, h);
    assert_int_equal(ev.status, want_status);
    assert_int_equal(ev.num_blocks_done, 0);
    ev = t_wait(&u.p);   /* the sender is told */
    assert_int_equal(ev.type, TDM_KVX_EV_FAILED);
    expect_released(&u);
    assert_int_equal(t_stats(&u.d).num_peers, 1);   /* one bad READ does not drop the peer */
    clear_faults();
    duo_close(&u);
}

static void nixl_fake__read_error_fails_the_transfer(void **state)
{
    (void)state;
    NEED_FAKE();
    fault("FAKE_NIXL_STATUS_ERR", "1", TDM_E_PEER);
}

static void nixl_fake__post_error_fails_the_transfer(void **state)
{
    (void)state;
    NEED_FAKE();
    fault("FAKE_NIXL_POST_ERR", "1", TDM_E_PEER);
}

/* READs that never finish: cancel, or the transfer timeout, releases them before the blocks. */
static void hung(int cancel)
{
    duo u;
    duo_open(&u, NULL, 0, cancel ? 0 : 300);
    setenv("FAKE_NIXL_POLLS", "1000000000", 1);
    uint32_t src[N], dst[N];
    uint64_t h = start_scattered(&u, src, dst);
    wait_read_posted();
    assert_true(live_reqs() > 0);   /* a READ is running */
    if (cancel) assert_int_equal(tdm_kvx_cancel(u.d.kvx, h), TDM_OK);
    tdm_kvx_event ev = t_wait(&u.d);
    assert_int_equal(ev.type, cancel ? TDM_KVX_EV_CANCELLED : TDM_KVX_EV_FAILED);
    if (!cancel) assert_int_equal(ev.status, TDM_E_TIMEOUT);
    assert_int_equal(ev.num_blocks_done, 0);
    assert_int_equal(live_reqs(), 0);   /* released when the transfer ended */
    assert_int_equal(t_stats(&u.d).num_reserved_blocks, 0);
    clear_faults();
    duo_close(&u);
}

static void nixl_fake__cancel_releases_running_reads_first(void **state)
{
    (void)state;
    NEED_FAKE();
    hung(1);
}

static void nixl_fake__timeout_releases_running_reads_first(void **state)
{
    (void)state;
    NEED_FAKE();
    hung(0);
}

/* A backend that refuses to release an active READ twice: it is waited for, then released. */
static void nixl_fake__release_refused_is_retried(void **state)
{
    (void)state;
    NEED_FAKE();
    duo u;
    duo_open(&u, NULL, 0, 0);
    setenv("FAKE_NIXL_POLLS", "1000000000", 1);
    setenv("FAKE_NIXL_RELEASE_BUSY", "2", 1);
    uint32_t src[N], dst[N];
    uint64_t h = start_scattered(&u, src, dst);
    wait_read_posted();
    assert_int_equal(tdm_kvx_cancel(u.d.kvx, h), TDM_OK);
    tdm_kvx_event ev = t_wait(&u.d);
    assert_int_equal(ev.type, TDM_KVX_EV_CANCELLED);
    assert_int_equal(live_reqs(), 0);
    clear_faults();
    duo_close(&u);
}

static void nixl_fake__no_backend_is_unsupported(void **state)
{
    (void)state;
    NEED_FAKE();
    setenv("FAKE_NIXL_NO_BACKEND", "1", 1);
    create_refused("fake-nobackend", TDM_KVX_ROLE_DECODE, TDM_E_UNSUPPORTED, "UCX backend");
    clear_faults();
}

/* An engine that is READ from gets a progress thread that sleeps between events (never the
 * spinning default), the delay taken from TANDEM_NIXL_PTHR_DELAY_US when set, a bad value
 * refused; a decode engine none (its I/O thread progresses), unless
 * TANDEM_NIXL_PROGRESS_THREAD=1. */
static void nixl_fake__agent_progress_thread_configured(void **state)
{
    (void)state;
    NEED_FAKE();
    if (!last_cfg) fail_msg("the fake lacks fake_nixl_last_cfg");
    const char *vals[] = { NULL, "5000", "0" };
    const unsigned long long want[] = { 1000, 5000, 0 };
    for (int i = 0; i < 3; i++) {
        if (vals[i]) setenv("TANDEM_NIXL_PTHR_DELAY_US", vals[i], 1);
        else unsetenv("TANDEM_NIXL_PTHR_DELAY_US");
        const uint32_t roles[] = { TDM_KVX_ROLE_PREFILL, TDM_KVX_ROLE_BOTH, TDM_KVX_ROLE_DECODE, TDM_KVX_ROLE_DECODE };
        for (int r = 0; r < 4; r++) {
            if (r == 3) setenv("TANDEM_NIXL_PROGRESS_THREAD", "1", 1);
            tdm_kvx *k = create_ok("fake-cfg", roles[r]);
            int prog = 0;
            unsigned long long us = 99;
            assert_true(last_cfg(&prog, &us));
            assert_int_equal(prog, r != 2);
            assert_int_equal(us, want[i]);
            tdm_kvx_destroy(k);
            unsetenv("TANDEM_NIXL_PROGRESS_THREAD");
        }
    }
    const char *bad[] = { "abc", "12x", "2000000" };
    for (int i = 0; i < 3; i++) {
        setenv("TANDEM_NIXL_PTHR_DELAY_US", bad[i], 1);
        create_refused("fake-cfg-bad", TDM_KVX_ROLE_DECODE, TDM_E_CONFIG, "TANDEM_NIXL_PTHR_DELAY_US");
    }
    unsetenv("TANDEM_NIXL_PTHR_DELAY_US");
}

/* One READ of n blocks src -> dst (direct); byte-exact; returns its descriptor count. */
static long coalesce_case(uint32_t kind, const uint32_t *src, const uint32_t *dst, uint32_t n)
{
    g_kind = kind;
    duo u;
    tdm_kv_layout same;
    t_layout(&same, kind, T_LAYERS, T_BLOCKS, T_BS, T_HEADS, T_DIM, TDM_DTYPE_FP16);
    duo_open(&u, &same, 0, 0);
    g_kind = 1;
    uint64_t sh;
    start(&u, src, n, n, dst, n, &sh);
    tdm_kvx_event ev = t_wait(&u.d);
    if (ev.type != TDM_KVX_EV_DONE) fail_msg("kind %u: %s", kind, ev.reason);
    assert_int_equal(t_wait(&u.p).type, TDM_KVX_EV_DONE);
    assert_int_equal(t_compare(&u.p, src, &u.d, dst, 0, n), 0);
    tdm_kvx_stats st = t_stats(&u.d);
    assert_int_equal(st.chunks_read_nixl, 1);   /* one READ: the count below is all of it */
    long d = last_descs();
    duo_close(&u);
    return d;
}

/* Runs of blocks adjacent on both ends are one descriptor per layer and half (K, V), or per
 * layer when K and V of a block are side by side (FlashInfer); anything else is not merged. */
static void nixl_fake__contiguous_blocks_coalesce(void **state)
{
    (void)state;
    NEED_FAKE();
    if (!last_descs) fail_msg("the fake lacks fake_nixl_last_descs");
    uint32_t src[N], dst[N];
    for (uint32_t i = 0; i < N; i++) { src[i] = 10 + i; dst[i] = 30 + i; }
    assert_int_equal(coalesce_case(1, src, dst, N), 2 * T_LAYERS);            /* NHD: K run, V run */
    assert_int_equal(coalesce_case(3, src, dst, N), T_LAYERS);                /* FlashInfer: one run */
    for (uint32_t i = 0; i < N; i++) dst[i] = 30 + (i < N / 2 ? i : i + 7);  /* broken at N/2 on our end */
    assert_int_equal(coalesce_case(1, src, dst, N), 4 * T_LAYERS);
    assert_int_equal(coalesce_case(3, src, dst, N), 2 * T_LAYERS);
    for (uint32_t i = 0; i < N; i++) { src[i] = 10 + (i < N / 2 ? i : i + 3); dst[i] = 30 + i; }   /* on theirs */
    assert_int_equal(coalesce_case(1, src, dst, N), 4 * T_LAYERS);
    for (uint32_t i = 0; i < N; i++) { src[i] = 10 + i; dst[i] = 30 + N - 1 - i; }   /* ours reversed */
    assert_int_equal(coalesce_case(1, src, dst, N), 2 * N * T_LAYERS);
    assert_int_equal(coalesce_case(3, src, dst, N), N * T_LAYERS);
    for (uint32_t i = 0; i < N; i++) { src[i] = 2 * i; dst[i] = 2 * i + 1; }   /* every other block */
    assert_int_equal(coalesce_case(1, src, dst, N), 2 * N * T_LAYERS);
}

/* With copying threads (TANDEM_NIXL_THREADS=3) the decode engine asks for one UCX worker
 * per thread, direct and staged READs stay byte-exact, a READ error fails the transfer, a
 * cancel waits for the running parts, and a bad count is refused; a prefill engine and
 * TANDEM_NIXL_THREADS=1 ask for no workers. */
static void nixl_fake__copying_threads(void **state)
{
    (void)state;
    NEED_FAKE();
    if (!last_workers) fail_msg("the fake lacks fake_nixl_last_workers");
    char w[16];
    const char *bad[] = { "0", "65", "2x" };
    for (int i = 0; i < 3; i++) {
        setenv("TANDEM_NIXL_THREADS", bad[i], 1);
        create_refused("fake-threads-bad", TDM_KVX_ROLE_DECODE, TDM_E_CONFIG, "TANDEM_NIXL_THREADS");
    }
    const uint32_t roles[] = { TDM_KVX_ROLE_PREFILL, TDM_KVX_ROLE_DECODE };
    const char *want[] = { "", "3" };
    setenv("TANDEM_NIXL_THREADS", "3", 1);
    for (int r = 0; r < 2; r++) {
        tdm_kvx *k = create_ok("fake-threads", roles[r]);
        last_workers(w, sizeof(w));
        assert_string_equal(w, want[r]);
        tdm_kvx_destroy(k);
    }
    nixl_fake__direct_and_staged_reads_are_byte_exact(state);
    nixl_fake__head_split_and_block_size_convert(state);
    fault("FAKE_NIXL_STATUS_ERR", "1", TDM_E_PEER);
    setenv("TANDEM_NIXL_THREADS", "3", 1);
    fault("FAKE_NIXL_POST_ERR", "1", TDM_E_PEER);
    setenv("TANDEM_NIXL_THREADS", "3", 1);
    /* cancelled while parts run (each reports "in progress" 300 times): waited for, then
     * every request released */
    duo u;
    duo_open(&u, NULL, 0, 0);
    setenv("FAKE_NIXL_POLLS", "300", 1);
    uint32_t src[N], dst[N];
    uint64_t h = start_scattered(&u, src, dst);
    wait_read_posted();
    int crc = tdm_kvx_cancel(u.d.kvx, h);
    tdm_kvx_event ev = t_wait(&u.d);
    if (crc == TDM_OK) assert_int_equal(ev.type, TDM_KVX_EV_CANCELLED);
    else assert_int_equal(ev.type, TDM_KVX_EV_DONE);   /* it ended first */
    expect_released(&u);
    clear_faults();
    duo_close(&u);   /* asserts no request is left */
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const char *b = getenv("TANDEM_BUILD");
    snprintf(fake_path, sizeof(fake_path), "%s/tests-nixl/fake/libnixl_capi.so.0", b ? b : "build");
    void *h = dlopen(fake_path, RTLD_NOW | RTLD_GLOBAL);
    if (h) {
        void *s = dlsym(h, "fake_nixl_live_reqs");
        memcpy(&live_reqs, &s, sizeof(s));
        s = dlsym(h, "fake_nixl_last_descs");
        memcpy(&last_descs, &s, sizeof(s));
        s = dlsym(h, "fake_nixl_last_cfg");
        memcpy(&last_cfg, &s, sizeof(s));
        s = dlsym(h, "fake_nixl_last_workers");
        memcpy(&last_workers, &s, sizeof(s));
        setenv("TANDEM_NIXL_LIB", fake_path, 1);   /* the engine opens the same library */
    }
    if (!h || !live_reqs) fake_path[0] = '\0';
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(nixl_fake__direct_and_staged_reads_are_byte_exact, setup),
        cmocka_unit_test_setup(nixl_fake__require_curve_keeps_unauthenticated_peers_off_nixl, setup),
        cmocka_unit_test_setup(nixl_fake__head_split_and_block_size_convert, setup),
        cmocka_unit_test_setup(nixl_fake__read_error_fails_the_transfer, setup),
        cmocka_unit_test_setup(nixl_fake__post_error_fails_the_transfer, setup),
        cmocka_unit_test_setup(nixl_fake__cancel_releases_running_reads_first, setup),
        cmocka_unit_test_setup(nixl_fake__timeout_releases_running_reads_first, setup),
        cmocka_unit_test_setup(nixl_fake__release_refused_is_retried, setup),
        cmocka_unit_test_setup(nixl_fake__no_backend_is_unsupported, setup),
        cmocka_unit_test_setup(nixl_fake__agent_progress_thread_configured, setup),
        cmocka_unit_test_setup(nixl_fake__contiguous_blocks_coalesce, setup),
        cmocka_unit_test_setup(nixl_fake__copying_threads, setup),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (h) dlclose(h);
    return rc;
}
