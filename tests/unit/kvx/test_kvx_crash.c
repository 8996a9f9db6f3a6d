/*
 * test_kvx_crash.c -- no /dev/shm object and no file descriptor is left behind whichever side
 * dies at whichever stage. Two forked engines on one host, both offering shared memory (the
 * client's own KV cache in a tdm_kvx_alloc_shared segment; in two runs the server's too, so
 * that chunks are direct reads), handshake and move a request; one of them is stopped at stage
 * k of the handshake or transfer (TDM_KVX_TEST_STOP_AT, kvx_internal.h) and SIGKILLed there.
 * The survivor must notice, unlink its own transfer segments while it runs, and after destroy
 * hold no more descriptors than before create and no name in /dev/shm; an engine created
 * afterwards sweeps what the dead one left, so that no name of either pid remains. Only the
 * names of this test's own processes are looked at.
 */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include "kvx_testutil.h"
#include "../../../kv_transfer/kvx_internal.h"

#define N 24
#define WITH_SHM (TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_SHM)

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Names in /dev/shm of engines of pid (tag "tx" only when tx_only). */
static int shm_names_of(pid_t pid, int tx_only)
{
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char name[TDM__KVX_ID_LEN + 1];
        uint64_t ns, owner;
        if (strlen(e->d_name) >= TDM__KVX_ID_LEN - 1) continue;
        name[0] = '/';
        memcpy(name + 1, e->d_name, strlen(e->d_name) + 1);   /* length checked above */
        if (tdm__kvx_shm_name_parse(name, tx_only ? 't' : 0, &ns, &owner) && owner == (uint64_t)pid) n++;
    }
    closedir(d);
    return n;
}

typedef struct run {
    int stage;
    int victim_server;
    int server_shared;   /* the server's cache in a shared segment: direct reads */
} run;

/* A child engine; no cmocka in children: the exit code says what went wrong. */
static void child(int server, const run *r, const char *ep, int ready_fd, int quit_fd)
{
    if (r->victim_server == server) {
        char v[8];
        snprintf(v, sizeof(v), "%d", r->stage);
        setenv("TDM_KVX_TEST_STOP_AT", v, 1);
    }
    int fds0 = count_fds();
    tdm_kvx_config c;
    t_config(&c, server ? "crash-server" : "crash-client", TDM_KVX_ROLE_BOTH, server ? ep : NULL);
    c.transports = WITH_SHM;
    c.peer_timeout_ms = 1000;        /* generous: a loaded machine must not fake a death */
    c.handshake_timeout_ms = 3000;
    tdm_kv_layout l;
    t_layout(&l, 1, T_LAYERS, T_BLOCKS, T_BS, T_HEADS, T_DIM, TDM_DTYPE_FP16);
    eng e;
    memset(&e, 0, sizeof(e));
    e.lay = l;
    e.layer_bytes = (size_t)2 * T_BLOCKS * T_BS * T_HEADS * T_DIM * 2;
    if (tdm_kvx_create(&c, &e.kvx)) _exit(20);
    void *mem = NULL;
    int shared = server ? r->server_shared : 1;
    if (shared && tdm_kvx_alloc_shared(e.kvx, e.layer_bytes * T_LAYERS, &mem)) _exit(21);
    e.mem = shared ? mem : malloc(e.layer_bytes * T_LAYERS);
    if (!e.mem) _exit(22);
    for (uint32_t i = 0; i < T_LAYERS; i++) e.bases[i] = e.mem + i * e.layer_bytes;
    t_fill(&e, server ? 1234 : 99);
    if (tdm_kvx_register(e.kvx, &l, e.bases, TDM_MEM_HOST, 0)) _exit(23);
    uint32_t ids[N];
    t_ids(ids, N, T_BLOCKS, server ? 55 : 66);
    uint64_t h;
    if (server) {
        tdm_kvx_send_desc sd;
        t_send_desc(&sd, 1, ids, N, N);
        if (tdm_kvx_send(e.kvx, &sd, &h)) _exit(24);
        if (write(ready_fd, "r", 1) != 1) _exit(25);
    } else {
        uint32_t peer;
        if (tdm_kvx_connect(e.kvx, ep, NULL, &peer) == TDM_OK) {   /* fails when the server died first */
            tdm_kvx_recv_desc rd;
            t_recv_desc(&rd, peer, 1, ids, N, 0);
            if (tdm_kvx_recv(e.kvx, &rd, &h)) _exit(26);
        }
    }
    char q;
    if (read(quit_fd, &q, 1) != 1) _exit(27);
    /* the peer is dead: it is noticed, and our transfer segments leave /dev/shm at once */
    int i;
    for (i = 0; i < 500 && (t_stats(&e).num_peers || shm_names_of(getpid(), 1)); i++) t_sleep_ms(10);
    if (i == 500) _exit(t_stats(&e).num_peers ? 28 : 29);
    tdm_kvx_destroy(e.kvx);
    if (!shared) free(e.mem);
    if (shm_names_of(getpid(), 0)) _exit(30);
    if (count_fds() != fds0) _exit(31);
    _exit(0);
}

/* waitpid with a deadline (ms); flags as waitpid's. Returns the pid or 0 on timeout. */
static pid_t wait_for(pid_t pid, int *st, int flags, int ms)
{
    for (int i = 0; i < ms; i += 5) {
        pid_t r = waitpid(pid, st, flags | WNOHANG);
        if (r != 0) return r;
        t_sleep_ms(5);
    }
    return 0;
}

static void one_run(const run *r, int idx)
{
    char ep[128];
    snprintf(ep, sizeof(ep), "ipc:///tmp/tdm-kvx-test-%d-crash-%d", (int)getpid(), idx);
    int ready[2], qs[2], qc[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(qs), 0);
    assert_int_equal(pipe(qc), 0);
    pid_t srv = fork();
    assert_true(srv >= 0);
    if (srv == 0) child(1, r, ep, ready[1], qs[0]);
    struct pollfd pf = { ready[0], POLLIN, 0 };
    char b;
    if (poll(&pf, 1, 10000) != 1 || read(ready[0], &b, 1) != 1) {
        kill(srv, SIGKILL);
        fail_msg("stage %d: the server did not come up", r->stage);
    }
    pid_t cli = fork();
    assert_true(cli >= 0);
    if (cli == 0) child(0, r, ep, -1, qc[0]);
    pid_t victim = r->victim_server ? srv : cli, survivor = r->victim_server ? cli : srv;
    int st = 0;
    if (wait_for(victim, &st, WUNTRACED, 10000) != victim || !WIFSTOPPED(st)) {
        kill(srv, SIGKILL);
        kill(cli, SIGKILL);
        waitpid(srv, NULL, 0);
        waitpid(cli, NULL, 0);
        fail_msg("stage %d: the %s never stopped there (status %#x)", r->stage, r->victim_server ? "server" : "client", st);
    }
    assert_int_equal(kill(victim, SIGKILL), 0);
    assert_int_equal(waitpid(victim, &st, 0), victim);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    assert_int_equal(write(r->victim_server ? qc[1] : qs[1], "q", 1), 1);
    if (wait_for(survivor, &st, 0, 20000) != survivor) {
        kill(survivor, SIGKILL);
        waitpid(survivor, NULL, 0);
        fail_msg("stage %d: the survivor did not finish", r->stage);
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("stage %d (%s killed): survivor exit status %d", r->stage, r->victim_server ? "server" : "client",
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    unlink(ep + 6);   /* a killed server's socket: this test's own path */
    int left = shm_names_of(victim, 0);
    tdm_kvx_config c;
    t_config(&c, "sweeper", TDM_KVX_ROLE_BOTH, NULL);
    tdm_kvx *k;
    assert_int_equal(tdm_kvx_create(&c, &k), TDM_OK);   /* sweeps dead owners' segments */
    tdm_kvx_destroy(k);
    if (shm_names_of(victim, 0) || shm_names_of(survivor, 0))
        fail_msg("stage %d: %d names of the killed pid left after the sweep (%d before)", r->stage,
                 shm_names_of(victim, 0), left);
    print_message("stage %d, %s killed: survivor clean, %d name(s) of the dead one swept\n", r->stage,
                  r->victim_server ? "server" : "client", left);
    for (int i = 0; i < 2; i++) { close(ready[i]); close(qs[i]); close(qc[i]); }
}

static void crash__either_side_killed_at_every_stage_leaves_nothing(void **state)
{
    (void)state;
    const run runs[] = {
        { TDM__KVX_STAGE_CLIENT_CREATED, 0, 0 }, { TDM__KVX_STAGE_CLIENT_ACK, 0, 0 },
        { TDM__KVX_STAGE_CLIENT_MAPPED, 0, 0 },  { TDM__KVX_STAGE_SERVER_MAPPED, 1, 0 },
        { TDM__KVX_STAGE_SERVER_CREATED, 1, 0 }, { TDM__KVX_STAGE_SERVER_CONFIRM, 1, 0 },
        { TDM__KVX_STAGE_SEND_DATA, 1, 0 },      { TDM__KVX_STAGE_RECV_DATA, 0, 0 },
        { TDM__KVX_STAGE_SEND_DATA, 1, 1 },      { TDM__KVX_STAGE_RECV_DATA, 0, 1 },
    };
    int fds0 = count_fds();
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) one_run(&runs[i], (int)i);
    assert_int_equal(count_fds(), fds0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(crash__either_side_killed_at_every_stage_leaves_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
