/*
 * test_kvx_proc.c -- transfers between two processes: a forked prefill engine serving a pull
 * over ipc and over shared memory (every byte checked against the child's deterministic
 * cache), and a prefill child SIGKILLed mid-transfer: the receiver's transfer fails with
 * TDM_E_PEER through the heartbeat, every reservation is released and the engine still works.
 */
#include <signal.h>
#include <sys/wait.h>

#include "kvx_testutil.h"

#define N 24

/* The child: a prefill engine that exports request 1 (ready blocks given) and waits. */
static void child(const char *ep, uint32_t transports, uint32_t ready, int wait_done, int shared)
{
    eng p;
    tdm_kvx_config c;
    t_config(&c, "child-prefill", TDM_KVX_ROLE_PREFILL, ep);
    c.transports = transports;
    c.peer_timeout_ms = 3000;
    tdm_kv_layout l;
    t_layout(&l, 1, T_LAYERS, T_BLOCKS, T_BS, T_HEADS, T_DIM, TDM_DTYPE_FP16);
    /* no cmocka asserts in the child: exit codes say what went wrong */
    memset(&p, 0, sizeof(p));
    p.lay = l;
    p.layer_bytes = (size_t)2 * T_BLOCKS * T_BS * T_HEADS * T_DIM * 2;
    if (tdm_kvx_create(&c, &p.kvx)) _exit(11);
    void *mem = NULL;
    if (shared && tdm_kvx_alloc_shared(p.kvx, p.layer_bytes * T_LAYERS, &mem)) _exit(15);
    p.mem = shared ? mem : malloc(p.layer_bytes * T_LAYERS);
    if (!p.mem) _exit(10);
    for (uint32_t i = 0; i < T_LAYERS; i++) p.bases[i] = p.mem + i * p.layer_bytes;
    t_fill(&p, 1234);
    if (tdm_kvx_register(p.kvx, &l, p.bases, TDM_MEM_HOST, 0)) _exit(11);
    uint32_t src[N];
    t_ids(src, N, T_BLOCKS, 55);
    tdm_kvx_send_desc sd;
    t_send_desc(&sd, 1, src, N, ready);
    uint64_t h;
    if (tdm_kvx_send(p.kvx, &sd, &h)) _exit(12);
    if (!wait_done) for (;;) pause();
    tdm_kvx_event ev;
    tdm_kvx_event_init(&ev);
    uint32_t n = 0;
    if (tdm_kvx_poll(p.kvx, &ev, 1, &n, 10000) || n != 1) _exit(13);
    int code = ev.type == TDM_KVX_EV_DONE ? 0 : 14;
    tdm_kvx_destroy(p.kvx);
    if (!shared) free(p.mem);
    _exit(code);
}

/* the child may not be listening (TIMEOUT) or registered (STATE) yet: 50 tries, 20 ms apart */
static void connect_retry(eng *d, const char *ep, uint32_t *peer)
{
    t_connect_retry(d, ep, peer, 50, 20);
}

static void two_processes(uint32_t transports, int shared)
{
    char ep[128];
    t_ipc(ep, sizeof(ep), "proc");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) child(ep, transports, N, 1, shared);
    eng d, ref;
    t_engine(&d, "parent-decode", TDM_KVX_ROLE_DECODE, NULL, transports, 99);
    uint32_t peer;
    connect_retry(&d, ep, &peer);
    uint32_t src[N], dst[N];
    t_ids(src, N, T_BLOCKS, 55);
    t_ids(dst, N, T_BLOCKS, 66);
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, peer, 1, dst, N, 0);
    uint64_t h;
    assert_int_equal(tdm_kvx_recv(d.kvx, &rd, &h), TDM_OK);
    tdm_kvx_event ev = t_wait(&d);
    if (ev.type != TDM_KVX_EV_DONE) fail_msg("event %u: %s", ev.type, ev.reason);
    /* the child's cache, rebuilt here from its seed */
    tdm_kvx_config c;
    t_config(&c, "ref", TDM_KVX_ROLE_BOTH, NULL);
    tdm_kv_layout l;
    t_layout(&l, 1, T_LAYERS, T_BLOCKS, T_BS, T_HEADS, T_DIM, TDM_DTYPE_FP16);
    t_engine_cfg(&ref, &c, &l, 1234);
    assert_int_equal(t_compare(&ref, src, &d, dst, 0, N), 0);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    t_free(&ref);
    t_free(&d);
}

static void proc__pull_over_ipc_between_processes(void **state)
{
    (void)state;
    two_processes(TDM_KVX_TRANSPORT_ZMQ, 0);
}

static void proc__pull_over_shared_memory_between_processes(void **state)
{
    (void)state;
    two_processes(TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_SHM, 0);
}

static void proc__direct_reads_from_another_process_cache(void **state)
{
    (void)state;
    two_processes(TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_SHM, 1);
}

static void proc__killed_sender_fails_transfer_and_releases_blocks(void **state)
{
    (void)state;
    char ep[128];
    t_ipc(ep, sizeof(ep), "kill");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) child(ep, TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_SHM, 2, 0, 1);   /* 2 of N ready, then stalls */
    eng d;
    tdm_kvx_config c;
    t_config(&c, "victim-decode", TDM_KVX_ROLE_DECODE, NULL);
    c.peer_timeout_ms = 300;
    tdm_kv_layout l;
    t_layout(&l, 1, T_LAYERS, T_BLOCKS, T_BS, T_HEADS, T_DIM, TDM_DTYPE_FP16);
    t_engine_cfg(&d, &c, &l, 7);
    uint32_t peer;
    connect_retry(&d, ep, &peer);
    uint32_t dst[N], dst2[4] = { 60, 61, 62, 63 };
    t_ids(dst, N, 56, 66);
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, peer, 1, dst, N, 0);
    uint64_t h, h2;
    assert_int_equal(tdm_kvx_recv(d.kvx, &rd, &h), TDM_OK);
    /* a second transfer with the same peer that has not started */
    rd.request_id = 2;
    rd.num_blocks = 4;
    rd.block_ids = dst2;
    assert_int_equal(tdm_kvx_recv(d.kvx, &rd, &h2), TDM_OK);
    for (int i = 0; i < 2000 && t_stats(&d).bytes_received == 0; i++) t_sleep_ms(5);
    assert_int_not_equal(t_stats(&d).bytes_received, 0);
    assert_int_equal(t_stats(&d).num_reserved_blocks, N + 4);
    kill(pid, SIGKILL);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    unlink(ep + 6);   /* the killed child's socket file (its segments: swept by the next engine) */
    for (int i = 0; i < 2; i++) {
        tdm_kvx_event ev = t_wait(&d);
        assert_int_equal(ev.type, TDM_KVX_EV_FAILED);
        assert_int_equal(ev.status, TDM_E_PEER);
        if (ev.handle == h) assert_int_equal(ev.num_blocks_done, 2);
        else assert_int_equal(ev.handle, h2);
    }
    tdm_kvx_stats s = t_stats(&d);
    assert_int_equal(s.num_reserved_blocks, 0);
    assert_int_equal(s.num_recv_active, 0);
    assert_int_equal(s.num_peers, 0);
    /* the engine still works: a new receive towards a dead peer is refused cleanly */
    rd.request_id = 3;
    assert_int_equal(tdm_kvx_recv(d.kvx, &rd, &h), TDM_E_PEER);
    t_free(&d);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(proc__pull_over_ipc_between_processes),
        cmocka_unit_test(proc__pull_over_shared_memory_between_processes),
        cmocka_unit_test(proc__direct_reads_from_another_process_cache),
        cmocka_unit_test(proc__killed_sender_fails_transfer_and_releases_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
