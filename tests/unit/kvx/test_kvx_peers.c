/*
 * test_kvx_peers.c -- the life of a connection between two engines when a peer is named
 * twice: a second tdm_kvx_connect() to an endpoint already connected, a HELLO from a second
 * socket of an engine whose connection is alive (another spelling of the same endpoint), and
 * an engine that died without a goodbye and comes back under the same engine id. The live
 * connection must survive the duplicates on both sides (a transfer over it still moves every
 * byte), and the restarted engine must be accepted once its old connection has fallen silent.
 * And a stall of an engine's own I/O thread (a starved host) must not declare live peers dead.
 */
#include <signal.h>
#include <sys/wait.h>

#include "kvx_testutil.h"
#include "../../../kv_transfer/kvx_internal.h"

#define ZMQ_ONLY TDM_KVX_TRANSPORT_ZMQ

/* One pull of n blocks (request req) from p to d over d's peer id `peer`; both events DONE
 * and every byte equal. */
static void pull_ok(eng *p, eng *d, uint32_t peer, uint64_t req, uint32_t n)
{
    uint32_t src[T_BLOCKS], dst[T_BLOCKS];
    t_ids(src, n, T_BLOCKS, req);
    t_ids(dst, n, T_BLOCKS, req * 7 + 3);
    tdm_kvx_send_desc sd;
    t_send_desc(&sd, req, src, n, n);
    uint64_t hs, hr;
    assert_int_equal(tdm_kvx_send(p->kvx, &sd, &hs), TDM_OK);
    tdm_kvx_recv_desc rd;
    t_recv_desc(&rd, peer, req, dst, n, 0);
    rd.transfer_id = req;
    int rc = tdm_kvx_recv(d->kvx, &rd, &hr);
    if (rc) fail_msg("recv: %s", tdm_kvx_errmsg(d->kvx));
    t_wait_done(d);
    t_wait_done(p);
    assert_int_equal(t_compare(p, src, d, dst, 0, n), 0);
}

/* P listens on tcp loopback; its bound endpoint into ep, the port into *port. */
static void prefill_tcp(eng *p, char *ep, size_t n, int *port)
{
    t_engine(p, "prefill-0", TDM_KVX_ROLE_PREFILL, "tcp://127.0.0.1:*", ZMQ_ONLY, 11);
    assert_int_equal(tdm_kvx_get_endpoint(p->kvx, ep, n), TDM_OK);
    const char *colon = strrchr(ep, ':');
    assert_non_null(colon);
    *port = atoi(colon + 1);
}

static void peers__second_connect_to_the_same_endpoint_keeps_the_live_one(void **state)
{
    (void)state;
    eng p, d;
    char ep[256];
    int port;
    prefill_tcp(&p, ep, sizeof(ep), &port);
    t_engine(&d, "decode-0", TDM_KVX_ROLE_DECODE, NULL, ZMQ_ONLY, 22);
    uint32_t peer, again = 0;
    assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &peer), TDM_OK);
    assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &again), TDM_E_EXISTS);
    assert_non_null(strstr(tdm_kvx_errmsg(d.kvx), "already connected"));
    /* longer than two heartbeats and than a handshake: nothing was torn down */
    t_sleep_ms(300);
    pull_ok(&p, &d, peer, 1, 12);
    assert_int_equal(t_stats(&p).num_peers, 1);
    assert_int_equal(t_stats(&d).num_peers, 1);
    uint32_t found;
    assert_int_equal(tdm_kvx_find_peer(d.kvx, "prefill-0", &found), TDM_OK);
    assert_int_equal(found, peer);
    t_free(&d);
    t_free(&p);
}

static void peers__hello_from_a_second_socket_of_a_live_engine_is_refused(void **state)
{
    (void)state;
    eng p, d;
    char ep[256], alias[256];
    int port;
    prefill_tcp(&p, ep, sizeof(ep), &port);
    snprintf(alias, sizeof(alias), "tcp://localhost:%d", port);   /* the same listener */
    t_engine(&d, "decode-0", TDM_KVX_ROLE_DECODE, NULL, ZMQ_ONLY, 22);
    uint32_t peer, again = 0, on_p, on_p2;
    assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &peer), TDM_OK);
    assert_int_equal(tdm_kvx_find_peer(p.kvx, "decode-0", &on_p), TDM_OK);
    assert_int_equal(tdm_kvx_connect(d.kvx, alias, NULL, &again), TDM_E_EXISTS);
    t_sleep_ms(300);
    /* the server kept the live connection: same peer id, and it still carries transfers */
    assert_int_equal(tdm_kvx_find_peer(p.kvx, "decode-0", &on_p2), TDM_OK);
    assert_int_equal(on_p2, on_p);
    pull_ok(&p, &d, peer, 2, 9);
    pull_ok(&p, &d, peer, 3, 30);
    assert_int_equal(t_stats(&p).num_peers, 1);
    assert_int_equal(t_stats(&d).num_peers, 1);
    t_free(&d);
    t_free(&p);
}

/* A decode engine in a child process: connects to ep, says so on the pipe, then waits to be
 * killed (no goodbye reaches the server). */
static void silent_child(const char *ep, int wfd)
{
    eng d;
    t_engine(&d, "decode-0", TDM_KVX_ROLE_DECODE, NULL, ZMQ_ONLY, 33);
    uint32_t peer;
    char ok = tdm_kvx_connect(d.kvx, ep, NULL, &peer) == TDM_OK ? 'y' : 'n';
    if (write(wfd, &ok, 1) != 1) _exit(2);
    for (;;) pause();
}

static void peers__restarted_engine_is_accepted_once_its_old_connection_is_silent(void **state)
{
    (void)state;
    eng p;
    char ep[256];
    int port, fds[2];
    prefill_tcp(&p, ep, sizeof(ep), &port);
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { close(fds[0]); silent_child(ep, fds[1]); }
    close(fds[1]);
    char ok = 0;
    assert_int_equal(read(fds[0], &ok, 1), 1);
    close(fds[0]);
    assert_int_equal(ok, 'y');
    uint32_t old_on_p, new_on_p;
    assert_int_equal(tdm_kvx_find_peer(p.kvx, "decode-0", &old_on_p), TDM_OK);
    kill(pid, SIGKILL);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    /* the same engine id comes back at once; its HELLO is refused while the old connection
     * may still be alive, accepted within a few heartbeats (well before peer_timeout_ms) */
    eng d;
    t_engine(&d, "decode-0", TDM_KVX_ROLE_DECODE, NULL, ZMQ_ONLY, 44);
    uint32_t peer = 0;
    int rc = TDM_E_EXISTS, tries = 0;
    for (; tries < 200 && rc == TDM_E_EXISTS; tries++) {
        rc = tdm_kvx_connect(d.kvx, ep, NULL, &peer);
        if (rc == TDM_E_EXISTS) t_sleep_ms(10);
    }
    if (rc) fail_msg("reconnect: %s", tdm_kvx_errmsg(d.kvx));
    assert_int_equal(tdm_kvx_find_peer(p.kvx, "decode-0", &new_on_p), TDM_OK);
    assert_int_not_equal(new_on_p, old_on_p);
    pull_ok(&p, &d, peer, 4, 16);
    assert_int_equal(t_stats(&p).num_peers, 1);
    t_free(&d);
    t_free(&p);
}

static void peers__a_stall_of_our_own_io_thread_does_not_kill_live_peers(void **state)
{
    (void)state;
    eng p, d;
    tdm_kvx_config pc, dc;
    t_config(&pc, "prefill-0", TDM_KVX_ROLE_PREFILL, "tcp://127.0.0.1:*");
    pc.transports = ZMQ_ONLY;
    pc.peer_timeout_ms = 20000;   /* P is patient: only D's own stall is at stake */
    t_config(&dc, "decode-0", TDM_KVX_ROLE_DECODE, NULL);
    dc.transports = ZMQ_ONLY;
    dc.peer_timeout_ms = 500;
    t_engine_default_cache(&p, &pc, 11);
    t_engine_default_cache(&d, &dc, 22);
    char ep[256];
    assert_int_equal(tdm_kvx_get_endpoint(p.kvx, ep, sizeof(ep)), TDM_OK);
    uint32_t peer, again;
    assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &peer), TDM_OK);
    /* D's I/O thread is descheduled for three peer timeouts between reading its sockets
     * and running its timers (as on a starved host); P's pings pile up unread meanwhile */
    pthread_mutex_lock(&d.kvx->mu);
    d.kvx->test_stall_ms = 1500;
    pthread_mutex_unlock(&d.kvx->mu);
    t_sleep_ms(1800);
    assert_int_equal(tdm_kvx_find_peer(d.kvx, "prefill-0", &again), TDM_OK);
    assert_int_equal(again, peer);
    pull_ok(&p, &d, peer, 5, 10);
    t_free(&d);
    t_free(&p);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(peers__second_connect_to_the_same_endpoint_keeps_the_live_one),
        cmocka_unit_test(peers__hello_from_a_second_socket_of_a_live_engine_is_refused),
        cmocka_unit_test(peers__restarted_engine_is_accepted_once_its_old_connection_is_silent),
        cmocka_unit_test(peers__a_stall_of_our_own_io_thread_does_not_kill_live_peers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
