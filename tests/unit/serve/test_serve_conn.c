/*
 * test_serve_conn.c -- the connection table of `tandem serve` (tools/serve_conn.c, compiled in
 * directly: it lives in tools/, not in the library), on real loopback TCP connections from
 * distinct source addresses (127.0.0.2, 127.0.0.3, ...): pending connections never take a
 * slot; beyond --max-pending the oldest pending connection of the source holding the most is
 * ended, passing over one that is receiving a large first request; the per-source pending
 * cap; slot accounting (pending + admitted = tracked, counters); the per-key and per-source
 * slot caps; a full table refuses a newcomer unless a slot is idle beyond --idle-ms, which
 * is then taken over; the --idle-ms deadline of pending connections; a descriptor whose peer
 * changed is never shut down. Ending a connection is recorded by a replaced kill hook, except
 * where the real shutdown(2) is the subject.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../../tools/serve_conn.c"

/* ---- fixtures: a loopback listener, connections from chosen source addresses ------------ */

static int listener = -1;
static struct sockaddr_in laddr;
static int clients[512], servers[512], nconn;
static int killed[512], nkilled;

static int record_kill(const tdm__serve_conn *c)
{
    if (nkilled < 512) killed[nkilled++] = c->fd;
    return 0;
}

static int was_killed(int fd)
{
    for (int i = 0; i < nkilled; i++)
        if (killed[i] == fd) return 1;
    return 0;
}

static int setup(void **state)
{
    (void)state;
    listener = socket(AF_INET, SOCK_STREAM, 0);
    memset(&laddr, 0, sizeof laddr);
    laddr.sin_family = AF_INET;
    laddr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof laddr;
    if (listener < 0 || bind(listener, (struct sockaddr *)&laddr, sizeof laddr) ||
        listen(listener, 512) || getsockname(listener, (struct sockaddr *)&laddr, &len))
        return -1;
    nconn = nkilled = 0;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < nconn; i++) {
        close(clients[i]);
        close(servers[i]);
    }
    nconn = 0;
    close(listener);
    return 0;
}

/* A TCP connection from src (127.0.0.x) to the listener: the accepted (service-side) fd. */
static int conn_from(const char *src)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(c >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    assert_int_equal(inet_pton(AF_INET, src, &a.sin_addr), 1);
    assert_int_equal(bind(c, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(connect(c, (struct sockaddr *)&laddr, sizeof laddr), 0);
    int s = accept(listener, NULL, NULL);
    assert_true(s >= 0);
    assert_true(nconn < 512);
    clients[nconn] = c;
    servers[nconn++] = s;
    return s;
}

static int client_of(int server_fd)
{
    for (int i = 0; i < nconn; i++)
        if (servers[i] == server_fd) return clients[i];
    fail_msg("no client for fd %d", server_fd);
    return -1;
}

static tdm__serve_limits limits(uint64_t slots, uint64_t pending, uint64_t pending_per_src)
{
    tdm__serve_limits l;
    memset(&l, 0, sizeof l);
    l.max_connections = slots;
    l.max_connections_per_source = slots;
    l.max_connections_per_key = slots;
    l.max_pending = pending;
    l.max_pending_per_source = pending_per_src;
    l.handshake_ms = 3000;
    l.idle_ms = 1000;
    return l;
}

static void init(tdm__serve_conns *cs, tdm__serve_limits l)
{
    tdm__serve_conns_init(cs, &l);
    cs->kill = record_kill;
}

/* Invariants of the table: pending + admitted = tracked, and they match the records. */
static void check(const tdm__serve_conns *cs)
{
    uint64_t p = 0, a = 0;
    for (uint32_t i = 0; i < cs->n; i++) {
        if (cs->c[i].admitted) a++;
        else p++;
        for (uint32_t j = i + 1; j < cs->n; j++) assert_int_not_equal(cs->c[i].fd, cs->c[j].fd);
    }
    assert_int_equal(p, cs->pending);
    assert_int_equal(a, cs->admitted);
    assert_int_equal(cs->n, cs->pending + cs->admitted);
}

static tdm__serve_conn *rec(tdm__serve_conns *cs, int fd) { return find(cs, fd); }

/* ---- tests --------------------------------------------------------------------------------- */

static void conns__pending_never_take_slots_and_a_request_admits(void **state)
{
    (void)state;
    tdm__serve_conns cs;
    init(&cs, limits(2, 64, 64));
    int fd[6];
    for (int i = 0; i < 6; i++) {
        fd[i] = conn_from("127.0.0.2");
        tdm__serve_conns_accepted(&cs, fd[i], 1.0 + i * 0.01);
    }
    check(&cs);
    assert_int_equal(cs.pending, 6);
    assert_int_equal(cs.admitted, 0); /* six accepted, none holds one of the 2 slots */
    assert_string_equal(rec(&cs, fd[0])->src, "127.0.0.2");
    assert_true(rec(&cs, fd[0])->local);
    char why[200];
    assert_int_equal(tdm__serve_conns_request(&cs, fd[3], NULL, 2.0, why, sizeof why), 0);
    assert_int_equal(tdm__serve_conns_request(&cs, fd[4], NULL, 2.0, why, sizeof why), 0);
    assert_int_equal(tdm__serve_conns_request(&cs, fd[3], NULL, 2.1, why, sizeof why), 0); /* again */
    check(&cs);
    assert_int_equal(cs.admitted, 2);
    assert_int_equal(cs.pending, 4);
    /* every slot taken by clients active within --idle-ms: a third is refused and ended */
    assert_int_equal(tdm__serve_conns_request(&cs, fd[5], NULL, 2.2, why, sizeof why), -1);
    assert_non_null(strstr(why, "--max-connections"));
    assert_true(was_killed(fd[5]));
    assert_int_equal(cs.refused, 1);
    check(&cs);
    /* closed: forgotten, its slot free again */
    tdm__serve_conns_closed(&cs, fd[3]);
    check(&cs);
    assert_int_equal(cs.admitted, 1);
    assert_int_equal(tdm__serve_conns_request(&cs, fd[0], NULL, 2.3, why, sizeof why), 0);
    assert_int_equal(cs.admitted, 2);
    assert_int_equal(cs.accepted, 6);
    tdm__serve_conns_free(&cs);
}

static void conns__idle_slot_is_taken_over_after_idle_ms(void **state)
{
    (void)state;
    tdm__serve_conns cs;
    init(&cs, limits(2, 64, 64));
    int a = conn_from("127.0.0.2"), b = conn_from("127.0.0.2"), c = conn_from("127.0.0.3");
    char why[200];
    tdm__serve_conns_accepted(&cs, a, 1.0);
    tdm__serve_conns_accepted(&cs, b, 1.0);
    tdm__serve_conns_accepted(&cs, c, 1.0);
    assert_int_equal(tdm__serve_conns_request(&cs, a, NULL, 1.0, why, sizeof why), 0);
    assert_int_equal(tdm__serve_conns_request(&cs, b, NULL, 1.5, why, sizeof why), 0);
    /* at 1.9 s nobody has been idle for 1 s: refused */
    assert_int_equal(tdm__serve_conns_request(&cs, c, NULL, 1.9, why, sizeof why), -1);
    assert_false(was_killed(a) || was_killed(b));
    c = conn_from("127.0.0.3");
    tdm__serve_conns_accepted(&cs, c, 2.0);
    /* at 2.2 s, a (last request at 1.0) is idle beyond --idle-ms: it gives its slot */
    assert_int_equal(tdm__serve_conns_request(&cs, c, NULL, 2.2, why, sizeof why), 0);
    assert_true(was_killed(a));
    assert_false(was_killed(b));
    assert_int_equal(cs.evicted, 1);
    assert_null(rec(&cs, a));
    assert_true(rec(&cs, c)->admitted);
    check(&cs);
    tdm__serve_conns_free(&cs);
}

/* Beyond --max-pending, the oldest pending connection of the source holding the most goes:
 * a flood from one address churns itself, the other address's pending one stays. */
static void conns__flood_evicts_its_own_oldest_pending(void **state)
{
    (void)state;
    tdm__serve_conns cs;
    init(&cs, limits(4, 4, 64));
    int other = conn_from("127.0.0.3");
    tdm__serve_conns_accepted(&cs, other, 1.0); /* the oldest of all */
    int flood[10];
    for (int i = 0; i < 10; i++) {
        flood[i] = conn_from("127.0.0.2");
        tdm__serve_conns_accepted(&cs, flood[i], 1.1 + i * 0.01);
        check(&cs);
        assert_true(cs.pending <= 4);
    }
    assert_false(was_killed(other));
    assert_non_null(rec(&cs, other));
    for (int i = 0; i < 7; i++) assert_true(was_killed(flood[i])); /* oldest first */
    for (int i = 7; i < 10; i++) assert_false(was_killed(flood[i]));
    assert_int_equal(cs.evicted, 7);
    /* the other source's client speaks and is admitted */
    char why[200];
    assert_int_equal(tdm__serve_conns_request(&cs, other, NULL, 1.5, why, sizeof why), 0);
    check(&cs);
    tdm__serve_conns_free(&cs);
}

/* A pending connection receiving more than a handshake's bytes (its large first request is
 * arriving) is passed over while its source has another pending one to end. */
static void conns__pending_receiving_a_request_is_passed_over(void **state)
{
    (void)state;
    tdm__serve_conns cs;
    init(&cs, limits(4, 3, 64));
    int busy = conn_from("127.0.0.2");
    tdm__serve_conns_accepted(&cs, busy, 1.0);
    char buf[8192];
    memset(buf, 'x', sizeof buf);
    assert_int_equal(write(client_of(busy), buf, sizeof buf), (ssize_t)sizeof buf);
    usleep(20000); /* received by the kernel (TCP_INFO counts it) */
    int idle[3];
    for (int i = 0; i < 3; i++) {
        idle[i] = conn_from("127.0.0.2");
        tdm__serve_conns_accepted(&cs, idle[i], 1.1 + i * 0.01);
    }
    /* 4 pending, cap 3: the oldest is `busy`, but it is receiving: idle[0] goes */
    assert_false(was_killed(busy));
    assert_true(was_killed(idle[0]));
    check(&cs);
    tdm__serve_conns_free(&cs);
}

static void conns__per_source_pending_cap(void **state)
{
    (void)state;
    tdm__serve_conns cs;
    init(&cs, limits(8, 64, 2));
    int a[3], b = conn_from("127.0.0.3");
    tdm__serve_conns_accepted(&cs, b, 1.0);
    for (int i = 0; i < 3; i++) {
        a[i] = conn_from("127.0.0.2");
        tdm__serve_conns_accepted(&cs, a[i], 1.1 + i * 0.01);
    }
    assert_true(was_killed(a[0]));
    assert_false(was_killed(a[1]) || was_killed(a[2]) || was_killed(b));
    assert_int_equal(cs.pending, 3);
    check(&cs);
    tdm__serve_conns_free(&cs);
}

/* Slots per key (CURVE) and per non-loopback source. */
static void conns__per_key_and_per_source_slot_caps(void **state)
{
    (void)state;
    tdm__serve_conns cs;
    tdm__serve_limits l = limits(8, 64, 64);
    l.max_connections_per_key = 2;
    l.max_connections_per_source = 3;
    init(&cs, l);
    char why[200];
    int k[3];
    for (int i = 0; i < 3; i++) {
        k[i] = conn_from("127.0.0.2");
        tdm__serve_conns_accepted(&cs, k[i], 1.0);
    }
    assert_int_equal(tdm__serve_conns_request(&cs, k[0], "KEY-A", 1.1, why, sizeof why), 0);
    assert_int_equal(tdm__serve_conns_request(&cs, k[1], "KEY-A", 1.1, why, sizeof why), 0);
    assert_int_equal(tdm__serve_conns_request(&cs, k[2], "KEY-A", 1.1, why, sizeof why), -1);
    assert_non_null(strstr(why, "--max-connections-per-key"));
    int kb = conn_from("127.0.0.2");
    tdm__serve_conns_accepted(&cs, kb, 1.2);
    assert_int_equal(tdm__serve_conns_request(&cs, kb, "KEY-B", 1.2, why, sizeof why), 0);
    check(&cs);
    /* a source taken as non-loopback (as a remote address would be): 3 slots at most */
    int s[4];
    for (int i = 0; i < 4; i++) {
        s[i] = conn_from("127.0.0.5");
        tdm__serve_conns_accepted(&cs, s[i], 1.3);
        rec(&cs, s[i])->local = 0;
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(tdm__serve_conns_request(&cs, s[i], NULL, 1.4, why, sizeof why), 0);
    assert_int_equal(tdm__serve_conns_request(&cs, s[3], NULL, 1.4, why, sizeof why), -1);
    assert_non_null(strstr(why, "--max-connections-per-source"));
    assert_non_null(strstr(why, "127.0.0.5"));
    assert_int_equal(cs.refused, 2);
    check(&cs);
    tdm__serve_conns_free(&cs);
}

/* --idle-ms: pending connections are ended once that old; admitted ones never by the tick. */
static void conns__pending_deadline(void **state)
{
    (void)state;
    tdm__serve_conns cs;
    init(&cs, limits(8, 64, 64));
    int a = conn_from("127.0.0.2"), b = conn_from("127.0.0.2"), c = conn_from("127.0.0.3");
    tdm__serve_conns_accepted(&cs, a, 1.0);
    tdm__serve_conns_accepted(&cs, b, 1.5);
    tdm__serve_conns_accepted(&cs, c, 1.0);
    char why[200];
    assert_int_equal(tdm__serve_conns_request(&cs, c, NULL, 1.1, why, sizeof why), 0);
    tdm__serve_conns_tick(&cs, 1.99);
    assert_int_equal(nkilled, 0);
    tdm__serve_conns_tick(&cs, 2.0); /* a: 1 s old */
    assert_true(was_killed(a));
    assert_false(was_killed(b));
    tdm__serve_conns_tick(&cs, 10.0);
    assert_true(was_killed(b));
    assert_false(was_killed(c)); /* admitted: idle ones lose their slot only to a newcomer */
    assert_int_equal(cs.expired, 2);
    assert_int_equal(cs.pending, 0);
    assert_int_equal(cs.admitted, 1);
    check(&cs);
    tdm__serve_conns_free(&cs);
}

/* A request on a descriptor whose ACCEPTED event has not come yet is tracked from it; an
 * ACCEPTED for a number still recorded replaces the stale record. */
static void conns__request_before_accepted_and_reused_numbers(void **state)
{
    (void)state;
    tdm__serve_conns cs;
    init(&cs, limits(4, 64, 64));
    int a = conn_from("127.0.0.2");
    char why[200];
    assert_int_equal(tdm__serve_conns_request(&cs, a, NULL, 1.0, why, sizeof why), 0);
    assert_int_equal(cs.admitted, 1);
    tdm__serve_conns_accepted(&cs, a, 1.1); /* the same number again: a fresh pending one */
    assert_false(rec(&cs, a)->admitted);
    check(&cs);
    assert_int_equal(cs.n, 1);
    tdm__serve_conns_free(&cs);
}

/* The real shutdown: only a descriptor that still has the recorded peer is shut down. */
static void conns__shutdown_checks_the_peer(void **state)
{
    (void)state;
    tdm__serve_conns cs;
    init(&cs, limits(4, 64, 64));
    int a = conn_from("127.0.0.2"), b = conn_from("127.0.0.3");
    tdm__serve_conns_accepted(&cs, a, 1.0);
    tdm__serve_conn copy = *rec(&cs, a);
    copy.fd = b; /* the number now names another connection */
    assert_int_equal(tdm__serve_conn_shutdown(&copy), -1);
    char ch;
    assert_int_equal(recv(client_of(b), &ch, 1, MSG_DONTWAIT), -1); /* b untouched */
    assert_int_equal(errno, EAGAIN);
    assert_int_equal(tdm__serve_conn_shutdown(rec(&cs, a)), 0);
    assert_int_equal(recv(client_of(a), &ch, 1, 0), 0); /* a's client sees the end */
    tdm__serve_conns_free(&cs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(conns__pending_never_take_slots_and_a_request_admits, setup, teardown),
        cmocka_unit_test_setup_teardown(conns__idle_slot_is_taken_over_after_idle_ms, setup, teardown),
        cmocka_unit_test_setup_teardown(conns__flood_evicts_its_own_oldest_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(conns__pending_receiving_a_request_is_passed_over, setup, teardown),
        cmocka_unit_test_setup_teardown(conns__per_source_pending_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(conns__per_key_and_per_source_slot_caps, setup, teardown),
        cmocka_unit_test_setup_teardown(conns__pending_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(conns__request_before_accepted_and_reused_numbers, setup, teardown),
        cmocka_unit_test_setup_teardown(conns__shutdown_checks_the_peer, setup, teardown),
    };
    return cmocka_run_group_tests_name("serve_conn", tests, NULL, NULL);
}
