/*
 * test_kvx_nixl.c -- KV transfers over NIXL (UCX) between two processes on host memory: the
 * prefill side is this binary re-executed as a child (a fresh process: no UCX state inherited
 * through fork), the decode side READs its blocks. Byte-exact direct READs (identical
 * layouts), streaming readiness, conversion through the staging rings (other block size,
 * head split), prefix skip, fallback to the other transports for a peer without NIXL, cancel,
 * and a sender SIGKILLed mid-transfer (the transfer fails
 * with TDM_E_PEER, every reservation is released, the engine still works), also in the middle
 * of a 128 MiB transfer whose READs are still running. The same large READs with several
 * copying threads (TANDEM_NIXL_THREADS: NIXL's UCX thread pool splits each READ): byte-exact
 * direct and staged, a sender killed mid-READ, a cancel mid-READ after which nothing more
 * lands in the receiver's cache. Run by
 * `make test-nixl`, which installs the nixl-cu12 wheel and sets TANDEM_NIXL_DIR; without
 * NIXL every test skips with the reason, unless TANDEM_NIXL_REQUIRED=1 (then it fails).
 */
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

#include "kvx_testutil.h"

#define N 24
#define TP (TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_NIXL)
/* the "big" case: 4 layers of 512 blocks of 64 KiB (16 tokens x 8 heads x 128 fp16, K and V) */
#define BIG_BLOCKS 512
#define BIG_N 512

static char self_exe[1024];

/* Mode "runs": block ids in contiguous runs that break at different places on the two ends
 * (so READs coalesce into runs, and the breaks must split them): sender side 0, receiver 1. */
static void run_ids(uint32_t *ids, int side)
{
    for (uint32_t i = 0; i < N; i++)
        ids[i] = side == 0 ? (i < 10 ? 3 + i : 30 + i)           /* 3..12, 40..53 */
                           : (i < 16 ? 20 + i : 40 + i);         /* 20..35, 56..63 */
}

/* ---- the child: a prefill engine exporting request 1 -------------------------------------- */

static int child_main(const char *ep, const char *mode)
{
    eng p;
    tdm_kvx_config c;
    t_config(&c, "nixl-prefill", TDM_KVX_ROLE_PREFILL, ep);
    c.transports = TP;
    c.peer_timeout_ms = 3000;
    memset(&p, 0, sizeof(p));
    tdm_kv_layout l;
    int die = !strcmp(mode, "bigdie"), cancel = !strcmp(mode, "bigcancel");
    int big = die || cancel || !strcmp(mode, "big");
    uint32_t nb = big ? BIG_BLOCKS : T_BLOCKS, bs = big ? 16 : T_BS, hh = big ? 8 : T_HEADS, dd = big ? 128 : T_DIM;
    uint32_t nreq = big ? BIG_N : N;
    if (big) c.max_chunk_bytes = 8u << 20;
    if (tdm_kv_layout_init(&l, TDM_KV_LAYOUT_VLLM_NHD, T_LAYERS, nb, bs, hh, dd, TDM_DTYPE_FP16)) return 10;
    p.lay = l;
    p.layer_bytes = (size_t)2 * nb * bs * hh * dd * 2;
    p.mem = malloc(p.layer_bytes * T_LAYERS);
    if (!p.mem) return 10;
    for (uint32_t i = 0; i < T_LAYERS; i++) p.bases[i] = p.mem + i * p.layer_bytes;
    t_fill(&p, 1234);
    if (tdm_kvx_create(&c, &p.kvx)) { fprintf(stderr, "child: %s\n", tdm_kvx_errmsg(NULL)); return 11; }
    if (tdm_kvx_register(p.kvx, &l, p.bases, TDM_MEM_HOST, 0)) { fprintf(stderr, "child: %s\n", tdm_kvx_errmsg(p.kvx)); return 11; }
    static uint32_t src[BIG_N];
    t_ids(src, nreq, nb, 55);
    if (!strcmp(mode, "runs")) run_ids(src, 0);
    int stream = !strcmp(mode, "stream"), stall = !strcmp(mode, "stall");
    tdm_kvx_send_desc sd;
    uint32_t ready = stream ? 0 : stall ? 2 : cancel ? nreq / 2 : nreq;   /* bigcancel: never done */
    t_send_desc(&sd, 1, src, nreq, ready);
    uint64_t h;
    if (tdm_kvx_send(p.kvx, &sd, &h)) return 12;
    if (stall) for (;;) pause();
    if (die) {
        /* request 2 (4 blocks) first, so that UCX is connected; then die while the receiver
         * READs request 1: 2 ms after its first block ids went out */
        uint64_t h2;
        sd.request_id = 2;
        sd.num_blocks = sd.num_blocks_ready = 4;
        if (tdm_kvx_send(p.kvx, &sd, &h2)) return 12;
        tdm_kvx_event e2;
        tdm_kvx_event_init(&e2);
        uint32_t n2 = 0;
        if (tdm_kvx_poll(p.kvx, &e2, 1, &n2, 20000) || n2 != 1 || e2.type != TDM_KVX_EV_DONE) return 17;
        tdm_kvx_stats st;
        tdm_kvx_stats_init(&st);
        if (tdm_kvx_get_stats(p.kvx, &st)) return 18;
        uint64_t before = st.chunks_sent;
        for (int i = 0; i < 100000 && !tdm_kvx_get_stats(p.kvx, &st) && st.chunks_sent == before; i++) usleep(100);
        usleep(2000);
        raise(SIGKILL);
    }
    tdm_kvx_event ev;
    tdm_kvx_event_init(&ev);
    uint32_t n = 0;
    for (uint32_t b = 1; stream && b <= N; b++) {   /* one more block of every layer each 10 ms */
        usleep(10000);
        for (uint32_t l0 = 0; l0 < T_LAYERS; l0++)
            if (tdm_kvx_send_ready(p.kvx, h, l0, l0 + 1, b)) return 16;
    }
    if (tdm_kvx_poll(p.kvx, &ev, 1, &n, 20000) || n != 1) return 13;
    int code = ev.type == (cancel ? TDM_KVX_EV_CANCELLED : TDM_KVX_EV_DONE) ? 0 : 14;   /* bigcancel: cancelled */
    if (code) fprintf(stderr, "child: event %u status %d: %s\n", ev.type, ev.status, ev.reason);
    tdm_kvx_destroy(p.kvx);
    free(p.mem);
    return code;
}

/* ---- the parent: the decode side ------------------------------------------------------------ */

static pid_t spawn(const char *ep, const char *mode)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(self_exe, self_exe, "--child", ep, mode, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int nixl_missing(char *why, size_t n)
{
    tdm_kvx_config c;
    t_config(&c, "nixl-probe", TDM_KVX_ROLE_DECODE, NULL);
    c.transports = TP;
    tdm_kvx *k = NULL;
    int rc = tdm_kvx_create(&c, &k);
    if (rc) snprintf(why, n, "%s", tdm_kvx_errmsg(NULL));
    tdm_kvx_destroy(k);
    return rc != TDM_OK;
}

static int setup(void **state)
{
    (void)state;
    char why[600];
    if (!nixl_missing(why, sizeof(why))) return 0;
    const char *req = getenv("TANDEM_NIXL_REQUIRED");
    if (req && req[0] == '1') { fprintf(stderr, "NIXL required but unavailable: %s\n", why); return -1; }
    fprintf(stderr, "[  SKIP    ] NIXL unavailable: %s\n", why);
    return 0;
}

#define NEED_NIXL()                                                                    \
    do {                                                                               \
        char why_[600];                                                                \
        if (nixl_missing(why_, sizeof(why_))) { skip(); }                              \
    } while (0)

/* the child may not be listening or registered yet: 100 tries, 50 ms apart */
static void connect_retry(eng *d, const char *ep, uint32_t *peer)
{
    t_connect_retry(d, ep, peer, 100, 50);
}

static void decoder(eng *d, const tdm_kv_layout *l, uint32_t head_offset, uint32_t peer_timeout_ms)
{
    tdm_kvx_config c;
    t_config(&c, "nixl-decode", TDM_KVX_ROLE_DECODE, NULL);
    c.transports = TP;
    c.peer_timeout_ms = peer_timeout_ms;
    t_engine_off(d, &c, l, 99, head_offset);
}

/* The small cache's layout in arrangement `kind` (1: NHD as the sender's, 2: HND). */
static void small_layout(tdm_kv_layout *l, uint32_t kind)
{
    t_layout(l, kind, T_LAYERS, T_BLOCKS, T_BS, T_HEADS, T_DIM, TDM_DTYPE_FP16);
}

static void reference(eng *ref)
{
    tdm_kvx_config c;
    t_config(&c, "ref", TDM_KVX_ROLE_BOTH, NULL);
    c.transports = TDM_KVX_TRANSPORT_ZMQ;
    tdm_kv_layout l;
    small_layout(&l, 1);
    t_engine_cfg(ref, &c, &l, 1234);
}

static void reap_child(pid_t pid, int want)
{
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), want);
}

static uint64_t recv_req(eng *d, uint32_t peer, uint32_t *dst, uint32_t n, uint32_t skip)
{
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, peer, 1, dst, n, skip);
    uint64_t h;
    assert_int_equal(tdm_kvx_recv(d->kvx, &rd, &h), TDM_OK);
    return h;
}

/* The two ends of a small transfer: the sender (child pid, endpoint ep) and the decode
 * engine d, connected to it as `peer`. */
typedef struct pair {
    eng d;
    pid_t pid;
    uint32_t peer;
    char ep[128];
} pair;

/* Starts the sender `mode` on a fresh ipc endpoint (`name`) and a decode engine over layout
 * l (NULL: an engine without NIXL, ZeroMQ and shared memory only), and connects them. */
static void pair_start(pair *p, const char *name, const char *mode, const tdm_kv_layout *l,
                       uint32_t head_offset, uint32_t peer_timeout_ms)
{
    t_ipc(p->ep, sizeof(p->ep), name);
    p->pid = spawn(p->ep, mode);
    if (l) decoder(&p->d, l, head_offset, peer_timeout_ms);
    else t_engine(&p->d, "plain-decode", TDM_KVX_ROLE_DECODE, NULL,
                  TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_SHM, 99);
    connect_retry(&p->d, p->ep, &p->peer);
}

/* The sender exited with 0; the decode engine is freed. */
static void pair_end(pair *p)
{
    reap_child(p->pid, 0);
    t_free(&p->d);
}

/* The (killed) sender's process is gone and its endpoint removed. */
static void wait_gone(pid_t pid, const char *ep)
{
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    unlink(ep + 6);
}

/* No reservation and no receive left. */
static void expect_released(const tdm_kvx_stats *s)
{
    assert_int_equal(s->num_reserved_blocks, 0);
    assert_int_equal(s->num_recv_active, 0);
}

/* Receives request 1's N blocks (src: the sender's ids, seed 55; dst: scattered, seed 66; in
 * runs when `runs`), the first `skip` of them not transferred, and checks the received blocks
 * byte for byte against ref, the sender's cache rebuilt here. */
static void recv_exact(pair *p, int runs, uint32_t skip, uint32_t *src, uint32_t *dst, eng *ref)
{
    t_ids(src, N, T_BLOCKS, 55);
    t_ids(dst, N, T_BLOCKS, 66);
    if (runs) { run_ids(src, 0); run_ids(dst, 1); }
    recv_req(&p->d, p->peer, dst, N, skip);
    t_wait_done(&p->d);
    reference(ref);
    assert_int_equal(t_compare(ref, src, &p->d, dst, skip, N), 0);
}

/* Same layouts: the receiver READs the sender's blocks straight into its own. */
static void pull(const char *mode, uint32_t skip)
{
    NEED_NIXL();
    tdm_kv_layout l;
    small_layout(&l, 1);
    pair p;
    pair_start(&p, mode, mode, &l, 0, 3000);
    eng *d = &p.d, ref, before;
    uint32_t src[N], dst[N];
    recv_exact(&p, !strcmp(mode, "runs"), skip, src, dst, &ref);
    tdm_kvx_config c;
    t_config(&c, "before", TDM_KVX_ROLE_BOTH, NULL);
    c.transports = TDM_KVX_TRANSPORT_ZMQ;
    t_engine_cfg(&before, &c, &l, 99);
    if (skip) {
        /* the skipped prefix was not written: it still holds the receiver's own bytes */
        assert_int_equal(t_compare(&before, dst, d, dst, 0, skip), 0);
        assert_int_not_equal(t_compare(&ref, src, d, dst, 0, skip), 0);
    }
    /* no READ spilled past its blocks: every other block still holds the receiver's bytes */
    uint32_t other[T_BLOCKS], n_other = 0;
    for (uint32_t b = 0; b < T_BLOCKS; b++) {
        int mine = 0;
        for (uint32_t i = 0; i < N; i++) mine |= dst[i] == b;
        if (!mine) other[n_other++] = b;
    }
    assert_int_equal(t_compare(&before, other, d, other, 0, n_other), 0);
    t_free(&before);
    tdm_kvx_stats s = t_stats(d);
    assert_true(s.chunks_read_nixl > 0);   /* the bytes came over NIXL */
    assert_int_equal(s.num_reserved_blocks, 0);
    t_free(&ref);
    pair_end(&p);
}

static void nixl__direct_read_between_processes_is_byte_exact(void **state) { (void)state; pull("same", 0); }
static void nixl__streamed_blocks_arrive_as_they_become_ready(void **state) { (void)state; pull("stream", 0); }
static void nixl__prefix_skip_is_not_transferred(void **state) { (void)state; pull("same", 8); }
/* contiguous runs of blocks (coalesced descriptors) with breaks on either end, and a skip
 * that starts inside a run */
static void nixl__block_runs_are_byte_exact(void **state) { (void)state; pull("runs", 0); pull("runs", 5); }

/* Same packed format, other arrangement (NHD sender, HND receiver): not READ as they are,
 * but staged and unpacked into the receiver's strides. */
static void nixl__other_block_arrangement_is_staged(void **state)
{
    (void)state;
    NEED_NIXL();
    tdm_kv_layout l;
    small_layout(&l, 2);
    pair p;
    pair_start(&p, "hnd", "same", &l, 0, 3000);
    eng ref;
    uint32_t src[N], dst[N];
    recv_exact(&p, 0, 0, src, dst, &ref);
    assert_true(t_stats(&p.d).chunks_read_nixl > 0);
    t_free(&ref);
    pair_end(&p);
}

/* A receiver that does not offer NIXL still gets the blocks (over ZeroMQ / shared memory). */
static void nixl__peer_without_nixl_falls_back(void **state)
{
    (void)state;
    NEED_NIXL();
    pair p;
    pair_start(&p, "fallback", "same", NULL, 0, 0);
    eng ref;
    uint32_t src[N], dst[N];
    recv_exact(&p, 0, 0, src, dst, &ref);
    assert_int_equal(t_stats(&p.d).chunks_read_nixl, 0);
    t_free(&ref);
    pair_end(&p);
}

/* Receiver with twice the block size and one of the sender's two heads: staged READs, converted. */
static void nixl__conversion_through_staging_rings(void **state)
{
    (void)state;
    NEED_NIXL();
    tdm_kv_layout l;
    t_layout(&l, 1, T_LAYERS, T_BLOCKS, T_BS * 2, 1, T_DIM, TDM_DTYPE_FP16);
    pair p;
    pair_start(&p, "conv", "same", &l, 1, 3000);
    eng *d = &p.d, ref;
    uint32_t src[N], dst[N / 2];
    t_ids(src, N, T_BLOCKS, 55);
    t_ids(dst, N / 2, T_BLOCKS, 77);
    recv_req(d, p.peer, dst, N / 2, 0);
    t_wait_done(d);
    reference(&ref);
    size_t row = (size_t)T_DIM * 2;
    for (uint32_t layer = 0; layer < T_LAYERS; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (uint32_t t = 0; t < N * T_BS; t++)
                assert_memory_equal(t_row(&ref, layer, kv, src[t / T_BS], t % T_BS, 1),
                                    t_row(d, layer, kv, dst[t / (2 * T_BS)], t % (2 * T_BS), 0), row);
    assert_true(t_stats(d).chunks_read_nixl > 0);
    t_free(&ref);
    pair_end(&p);
}

/* Starts a sender that makes 2 blocks of request 1 ready and stalls, and receives its N
 * blocks into dst (seed 66); returns the receive's handle once the first bytes arrived. */
static uint64_t stalled_recv(pair *p, const char *name, uint32_t peer_timeout_ms, uint32_t *dst)
{
    tdm_kv_layout l;
    small_layout(&l, 1);
    pair_start(p, name, "stall", &l, 0, peer_timeout_ms);
    t_ids(dst, N, T_BLOCKS, 66);
    uint64_t h = recv_req(&p->d, p->peer, dst, N, 0);
    for (int i = 0; i < 2000 && t_stats(&p->d).bytes_received == 0; i++) t_sleep_ms(5);
    assert_int_not_equal(t_stats(&p->d).bytes_received, 0);
    return h;
}

static void kill_sender(pair *p)
{
    kill(p->pid, SIGKILL);
    wait_gone(p->pid, p->ep);
}

static void nixl__cancel_mid_transfer_releases_blocks(void **state)
{
    (void)state;
    NEED_NIXL();
    pair p;
    uint32_t dst[N];
    uint64_t h = stalled_recv(&p, "cancel", 3000, dst);
    assert_int_equal(tdm_kvx_cancel(p.d.kvx, h), TDM_OK);
    tdm_kvx_event ev = t_wait(&p.d);
    assert_int_equal(ev.type, TDM_KVX_EV_CANCELLED);
    assert_int_equal(ev.num_blocks_done, 2);
    tdm_kvx_stats s = t_stats(&p.d);
    expect_released(&s);
    assert_int_equal(s.num_peers, 1);   /* the peer is still there */
    kill_sender(&p);
    t_free(&p.d);
}

static void nixl__killed_sender_fails_transfer_and_releases_blocks(void **state)
{
    (void)state;
    NEED_NIXL();
    pair p;
    uint32_t dst[N];
    uint64_t h = stalled_recv(&p, "kill", 300, dst);
    assert_int_equal(t_stats(&p.d).num_reserved_blocks, N);
    kill_sender(&p);
    tdm_kvx_event ev = t_wait(&p.d);
    assert_int_equal(ev.type, TDM_KVX_EV_FAILED);
    assert_int_equal(ev.status, TDM_E_PEER);
    assert_int_equal(ev.handle, h);
    assert_int_equal(ev.num_blocks_done, 2);
    tdm_kvx_stats s = t_stats(&p.d);
    expect_released(&s);
    assert_int_equal(s.num_peers, 0);
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, p.peer, 3, dst, 4, 0);
    assert_int_equal(tdm_kvx_recv(p.d.kvx, &rd, &h), TDM_E_PEER);
    t_free(&p.d);
}

/* The copying threads of the engines created next (NULL: the library's default). */
static void set_threads(const char *n)
{
    if (n) setenv("TANDEM_NIXL_THREADS", n, 1);
    else unsetenv("TANDEM_NIXL_THREADS");
}

/* A decode engine over the big cache: kind 1 (as the sender: direct READs) or 2 (HND: staged). */
static void big_decoder(eng *d, uint32_t kind, uint32_t peer_timeout_ms)
{
    tdm_kv_layout l;
    t_layout(&l, kind, T_LAYERS, BIG_BLOCKS, 16, 8, 128, TDM_DTYPE_FP16);
    tdm_kvx_config c;
    t_config(&c, "nixl-decode", TDM_KVX_ROLE_DECODE, NULL);
    c.transports = TP;
    c.peer_timeout_ms = peer_timeout_ms;
    c.max_chunk_bytes = 8u << 20;
    t_engine_cfg(d, &c, &l, 99);
}

/* Starts the sender `mode` on a fresh ipc endpoint (`name`), a decode engine over the big
 * cache with `threads` copying threads, connects them, and fills rd for request 1: all BIG_N
 * blocks into dst (scattered, seed 66); ep gets the endpoint. Returns the sender's pid. */
static pid_t big_start(eng *d, const char *threads, const char *name, const char *mode, uint32_t kind,
                       uint32_t peer_timeout_ms, uint32_t *dst, tdm_kvx_recv_desc *rd, char ep[128])
{
    set_threads(threads);
    t_ipc(ep, 128, name);
    pid_t pid = spawn(ep, mode);
    big_decoder(d, kind, peer_timeout_ms);
    set_threads(NULL);
    uint32_t peer;
    connect_retry(d, ep, &peer);
    t_ids(dst, BIG_N, BIG_BLOCKS, 66);
    t_recv_desc(rd, peer, 1, dst, BIG_N, 0);
    return pid;
}

/* The sender dies 2 ms after its first chunk went out, while 128 MiB are being READ by
 * `threads` copying threads: whatever was in flight, the transfer ends cleanly (failed with
 * TDM_E_PEER, or done if it finished), every reservation released. */
static void big_kill(const char *threads)
{
    eng d;
    static uint32_t dst[BIG_N];
    tdm_kvx_recv_desc rd;
    char ep[128];
    pid_t pid = big_start(&d, threads, "bigkill", "bigdie", 1, 300, dst, &rd, ep);
    uint64_t h;
    rd.request_id = 2;   /* a small one first: the connection is up when the big one runs */
    rd.num_blocks = 4;
    assert_int_equal(tdm_kvx_recv(d.kvx, &rd, &h), TDM_OK);
    tdm_kvx_event ev = t_wait(&d);
    assert_int_equal(ev.type, TDM_KVX_EV_DONE);
    uint64_t small = t_stats(&d).bytes_received;
    rd.request_id = 1;
    rd.num_blocks = BIG_N;
    rd.block_ids = dst;   /* request 2 is done: its blocks are free again */
    assert_int_equal(tdm_kvx_recv(d.kvx, &rd, &h), TDM_OK);
    wait_gone(pid, ep);
    ev = t_wait(&d);
    tdm_kvx_stats s = t_stats(&d);
    fprintf(stderr, "  %s copying threads: killed after %llu of %llu bytes: event %u (%s)\n", threads ? threads : "default",
            (unsigned long long)(s.bytes_received - small), (unsigned long long)BIG_N * T_LAYERS * 65536, ev.type, ev.reason);
    if (ev.type == TDM_KVX_EV_FAILED) {
        assert_int_equal(ev.status, TDM_E_PEER);
    } else {
        assert_int_equal(ev.type, TDM_KVX_EV_DONE);   /* the kill came after the last READ */
    }
    expect_released(&s);
    t_free(&d);
}

static void nixl__sender_killed_during_large_read_fails_cleanly(void **state)
{
    (void)state;
    NEED_NIXL();
    big_kill(NULL);
}

static void nixl__threads_sender_killed_during_large_read_fails_cleanly(void **state)
{
    (void)state;
    NEED_NIXL();
    big_kill("1");
    big_kill("4");
}

/* 128 MiB of scattered 64 KiB blocks READ by `threads` copying threads, every byte checked. */
static void big_pull(const char *threads, uint32_t kind)
{
    eng d, ref;
    static uint32_t src[BIG_N], dst[BIG_N];
    tdm_kvx_recv_desc rd;
    char ep[128];
    pid_t pid = big_start(&d, threads, "bigpull", "big", kind, 3000, dst, &rd, ep);
    t_ids(src, BIG_N, BIG_BLOCKS, 55);
    uint64_t h;
    assert_int_equal(tdm_kvx_recv(d.kvx, &rd, &h), TDM_OK);
    tdm_kvx_event ev = t_wait(&d);
    if (ev.type != TDM_KVX_EV_DONE) fail_msg("%s threads: event %u (%d): %s", threads, ev.type, ev.status, ev.reason);
    tdm_kvx_config c;
    t_config(&c, "ref", TDM_KVX_ROLE_BOTH, NULL);
    c.transports = TDM_KVX_TRANSPORT_ZMQ;
    c.max_chunk_bytes = 8u << 20;   /* a 64 KiB block must fit a chunk */
    tdm_kv_layout l;
    t_layout(&l, 1, T_LAYERS, BIG_BLOCKS, 16, 8, 128, TDM_DTYPE_FP16);
    t_engine_cfg(&ref, &c, &l, 1234);   /* the child's cache */
    assert_int_equal(t_compare(&ref, src, &d, dst, 0, BIG_N), 0);
    tdm_kvx_stats s = t_stats(&d);
    assert_true(s.chunks_read_nixl > 0);
    assert_int_equal(s.num_reserved_blocks, 0);
    reap_child(pid, 0);
    t_free(&ref);
    t_free(&d);
}

static void nixl__threads_large_direct_read_is_byte_exact(void **state)
{
    (void)state;
    NEED_NIXL();
    big_pull("1", 1);
    big_pull("2", 1);
    big_pull("4", 1);
}

static void nixl__threads_large_staged_read_is_byte_exact(void **state)
{
    (void)state;
    NEED_NIXL();
    big_pull("3", 2);   /* each 8 MiB slot READ cut into pieces across the threads */
}

/* Cancelled while 4 threads READ the 64 MiB of a 128 MiB transfer that are ready: the event
 * comes once every READ of it has ended, so nothing lands in the receiver's cache afterwards. */
static void nixl__threads_cancel_mid_read_lands_nothing_after(void **state)
{
    (void)state;
    NEED_NIXL();
    eng d;
    static uint32_t dst[BIG_N];
    tdm_kvx_recv_desc rd;
    char ep[128];
    pid_t pid = big_start(&d, "4", "bigcancel", "bigcancel", 1, 3000, dst, &rd, ep);
    uint64_t h;
    assert_int_equal(tdm_kvx_recv(d.kvx, &rd, &h), TDM_OK);
    for (long i = 0; i < 100000000L && t_stats(&d).chunks_read_nixl == 0; i++) {}   /* the first chunk landed */
    assert_int_equal(tdm_kvx_cancel(d.kvx, h), TDM_OK);   /* half its blocks are ready: never done */
    tdm_kvx_event ev = t_wait(&d);
    tdm_kvx_stats s = t_stats(&d);
    fprintf(stderr, "  cancelled after %llu bytes: event %u (%s)\n", (unsigned long long)s.bytes_received, ev.type,
            ev.reason);
    assert_int_equal(ev.type, TDM_KVX_EV_CANCELLED);
    assert_true(ev.num_blocks_done < BIG_N);
    expect_released(&s);
    size_t all = d.layer_bytes * T_LAYERS;
    uint8_t *snap = malloc(all);
    assert_non_null(snap);
    memcpy(snap, d.mem, all);
    t_sleep_ms(100);
    assert_memory_equal(snap, d.mem, all);   /* no READ landed after the event */
    free(snap);
    reap_child(pid, 0);
    t_free(&d);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc == 4 && !strcmp(argv[1], "--child")) return child_main(argv[2], argv[3]);
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
    if (n <= 0) return 1;
    self_exe[n] = '\0';
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nixl__direct_read_between_processes_is_byte_exact),
        cmocka_unit_test(nixl__streamed_blocks_arrive_as_they_become_ready),
        cmocka_unit_test(nixl__prefix_skip_is_not_transferred),
        cmocka_unit_test(nixl__block_runs_are_byte_exact),
        cmocka_unit_test(nixl__conversion_through_staging_rings),
        cmocka_unit_test(nixl__other_block_arrangement_is_staged),
        cmocka_unit_test(nixl__peer_without_nixl_falls_back),
        cmocka_unit_test(nixl__cancel_mid_transfer_releases_blocks),
        cmocka_unit_test(nixl__killed_sender_fails_transfer_and_releases_blocks),
        cmocka_unit_test(nixl__sender_killed_during_large_read_fails_cleanly),
        cmocka_unit_test(nixl__threads_large_direct_read_is_byte_exact),
        cmocka_unit_test(nixl__threads_large_staged_read_is_byte_exact),
        cmocka_unit_test(nixl__threads_sender_killed_during_large_read_fails_cleanly),
        cmocka_unit_test(nixl__threads_cancel_mid_read_lands_nothing_after),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
