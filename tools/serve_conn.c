/*
 * serve_conn.c -- the connection slots of `tandem serve` (docs/service.md, "Connections").
 * ZeroMQ accepts TCP and ipc connections on its own I/O thread; the ROUTER socket's monitor
 * tells this table about each one (ACCEPTED with its descriptor, DISCONNECTED), and every
 * request received names the descriptor it came through (ZMQ_SRCFD). A connection is
 * *pending* from its acceptance until its first request: that request proves the ZMTP
 * handshake completed and, under CURVE, that the ZAP handler allowed the client's key. Only
 * then does it take one of the --max-connections slots, which pending connections can never
 * take: the slots are the reserve of clients that have authenticated and spoken.
 *
 * Pending connections are capped in number (--max-pending, and per source address) and in
 * time (--idle-ms, after ZeroMQ's own handshake deadline, --handshake-ms): a new one beyond a
 * cap evicts the oldest pending one of its own source (over --max-pending: of the source with
 * the most pending connections),
 * passing over those receiving more than a handshake (TCP_INFO), so that a flood of idle
 * sockets churns itself while a real client, whose first request follows its handshake within
 * milliseconds or is on its way, gets through. An admitted connection beyond a per-source
 * (non-loopback) or per-key (CURVE) cap, or with every slot taken by connections active within
 * --idle-ms, is refused; otherwise the connection idle the longest gives up its slot.
 *
 * A connection is ended with shutdown(2) on ZeroMQ's descriptor (never close: ZeroMQ owns it),
 * after checking that the descriptor still has the peer address it was accepted with (so a
 * number reused by another socket is never touched). ZeroMQ then sees the end of the stream and
 * drops the connection; a ZeroMQ client reconnects by itself.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <linux/tcp.h> /* struct tcp_info with tcpi_bytes_received */

#include "serve.h"

void tdm__serve_conns_init(tdm__serve_conns *cs, const tdm__serve_limits *lim)
{
    memset(cs, 0, sizeof *cs);
    cs->lim = *lim;
    cs->kill = tdm__serve_conn_shutdown;
}

void tdm__serve_conns_free(tdm__serve_conns *cs)
{
    free(cs->c);
    cs->c = NULL;
    cs->n = cs->cap = 0;
}

/* The descriptor's peer, as a comparable address and a source name ("ip" or "uid:N"). */
static void peer_of(int fd, tdm__serve_conn *c)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    memset(&ss, 0, sizeof ss);
    c->local = 1;
    snprintf(c->src, sizeof c->src, "?");
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) return;
    memcpy(&c->addr, &ss, sizeof ss);
    c->addr_len = len;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &a->sin_addr, c->src, sizeof c->src);
        c->local = (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    } else if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &a->sin6_addr, c->src, sizeof c->src);
        c->local = IN6_IS_ADDR_LOOPBACK(&a->sin6_addr) ||
                   (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127);
    } else if (ss.ss_family == AF_UNIX) {
        struct ucred cr;
        socklen_t cl = sizeof cr;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0)
            snprintf(c->src, sizeof c->src, "uid:%u", (unsigned)cr.uid);
    }
}

int tdm__serve_conn_shutdown(const tdm__serve_conn *c)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    memset(&ss, 0, sizeof ss);
    if (getpeername(c->fd, (struct sockaddr *)&ss, &len) != 0 || len != c->addr_len ||
        memcmp(&ss, &c->addr, len) != 0)
        return -1; /* gone, or the number now names another socket: not ours to end */
    return shutdown(c->fd, SHUT_RDWR);
}

static tdm__serve_conn *find(tdm__serve_conns *cs, int fd)
{
    for (uint32_t i = 0; i < cs->n; i++)
        if (cs->c[i].fd == fd) return &cs->c[i];
    return NULL;
}

static void drop(tdm__serve_conns *cs, tdm__serve_conn *c)
{
    if (c->admitted) cs->admitted--;
    else cs->pending--;
    *c = cs->c[--cs->n];
}

/* Ends connection c (shutdown; its DISCONNECTED event will find no record) and forgets it. */
static void end_conn(tdm__serve_conns *cs, tdm__serve_conn *c)
{
    cs->kill(c);
    drop(cs, c);
}

static uint32_t count(const tdm__serve_conns *cs, int admitted, const char *src, const char *key)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < cs->n; i++) {
        const tdm__serve_conn *c = &cs->c[i];
        if (c->admitted != admitted) continue;
        if (src && strcmp(c->src, src)) continue;
        if (key && strcmp(c->key, key)) continue;
        k++;
    }
    return k;
}

/* Bytes the kernel has received on a TCP connection (0 for other sockets): a pending
 * connection that has received more than a handshake is sending its first request. */
#define TDM_SERVE_HANDSHAKE_BYTES 2048 /* a NULL greeting + READY: ~100; CURVE: ~700 */
static uint64_t rx_bytes(const tdm__serve_conn *c)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (c->addr.ss_family != AF_INET && c->addr.ss_family != AF_INET6) return 0;
    if (getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
        return 0;
    return ti.tcpi_bytes_received;
}

/* The pending connection to end (of source src when not NULL): the oldest one, passing over
 * those that have received more than any handshake takes (TCP_INFO; they are sending a large
 * first request) unless all are such. */
static tdm__serve_conn *oldest_pending(tdm__serve_conns *cs, const char *src, int except)
{
    tdm__serve_conn *best = NULL, *busy = NULL;
    for (uint32_t i = 0; i < cs->n; i++) {
        tdm__serve_conn *c = &cs->c[i];
        if (c->admitted || c->fd == except || (src && strcmp(c->src, src))) continue;
        if (rx_bytes(c) > TDM_SERVE_HANDSHAKE_BYTES) {
            if (!busy || c->t_open < busy->t_open) busy = c;
        } else if (!best || c->t_open < best->t_open) {
            best = c;
        }
    }
    return best ? best : busy;
}

/* The source with the most pending connections (one pass, a few distinct sources at a
 * time), or NULL when there are too many distinct ones to tell cheaply. */
static const char *top_source(const tdm__serve_conns *cs)
{
    const char *src[32];
    uint32_t n[32], k = 0, best = 0;
    for (uint32_t i = 0; i < cs->n; i++) {
        if (cs->c[i].admitted) continue;
        uint32_t j = 0;
        while (j < k && strcmp(src[j], cs->c[i].src)) j++;
        if (j == k) {
            if (k == 32) return NULL;
            src[k] = cs->c[i].src;
            n[k++] = 0;
        }
        if (++n[j] > n[best]) best = j;
    }
    return k ? src[best] : NULL;
}

void tdm__serve_conns_accepted(tdm__serve_conns *cs, int fd, double now)
{
    tdm__serve_conn *c = find(cs, fd);
    if (c) drop(cs, c); /* a stale record: the number was reused */
    if (cs->n == cs->cap) {
        uint32_t cap = cs->cap ? cs->cap * 2 : 64;
        tdm__serve_conn *nc = realloc(cs->c, cap * sizeof *nc);
        if (!nc) { /* cannot track it: refuse it */
            tdm__serve_conn tmp;
            memset(&tmp, 0, sizeof tmp);
            tmp.fd = fd;
            peer_of(fd, &tmp);
            cs->kill(&tmp);
            cs->refused++;
            return;
        }
        cs->c = nc;
        cs->cap = cap;
    }
    c = &cs->c[cs->n++];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->t_open = c->t_last = now;
    peer_of(fd, c);
    cs->pending++;
    cs->accepted++;
    /* over the per-source cap: that source's oldest pending one goes (possibly this one) */
    if (cs->lim.max_pending_per_source &&
        count(cs, 0, c->src, NULL) > cs->lim.max_pending_per_source) {
        char src[sizeof c->src];
        memcpy(src, c->src, sizeof src);
        end_conn(cs, oldest_pending(cs, src, -1));
        cs->evicted++;
    }
    if (cs->pending > cs->lim.max_pending) {
        /* from the source with the most pending connections: a flood from one address
         * evicts its own, not the other sources' */
        char src[sizeof c->src];
        const char *top = top_source(cs);
        snprintf(src, sizeof src, "%s", top ? top : "");
        tdm__serve_conn *v = oldest_pending(cs, top ? src : NULL, -1);
        end_conn(cs, v);
        cs->evicted++;
    }
}

void tdm__serve_conns_closed(tdm__serve_conns *cs, int fd)
{
    tdm__serve_conn *c = find(cs, fd);
    if (c) drop(cs, c);
}

int tdm__serve_conns_request(tdm__serve_conns *cs, int fd, const char *key, double now,
                             char *why, size_t why_size)
{
    tdm__serve_conn *c = find(cs, fd);
    if (!c) { /* its ACCEPTED event is still on the way (or it was never a tracked socket) */
        tdm__serve_conns_accepted(cs, fd, now);
        c = find(cs, fd);
        if (!c) {
            snprintf(why, why_size, "the service cannot track another connection");
            return -1;
        }
    }
    c->t_last = now;
    if (c->admitted) return 0;
    const tdm__serve_limits *l = &cs->lim;
    snprintf(c->key, sizeof c->key, "%s", key ? key : "");
    if (key && key[0] && l->max_connections_per_key &&
        count(cs, 1, NULL, c->key) >= l->max_connections_per_key) {
        snprintf(why, why_size, "this key already has %llu connections "
                 "(--max-connections-per-key)", (unsigned long long)l->max_connections_per_key);
        goto refuse;
    }
    if (!c->local && l->max_connections_per_source &&
        count(cs, 1, c->src, NULL) >= l->max_connections_per_source) {
        snprintf(why, why_size, "source %s already has %llu connections "
                 "(--max-connections-per-source)", c->src,
                 (unsigned long long)l->max_connections_per_source);
        goto refuse;
    }
    if (cs->admitted >= l->max_connections) {
        /* the connection idle the longest gives its slot, if idle beyond --idle-ms */
        tdm__serve_conn *idle = NULL;
        for (uint32_t i = 0; i < cs->n; i++)
            if (cs->c[i].admitted && (!idle || cs->c[i].t_last < idle->t_last)) idle = &cs->c[i];
        if (!idle || (now - idle->t_last) * 1000.0 < (double)l->idle_ms) {
            snprintf(why, why_size, "all %llu connection slots are in use by active clients "
                     "(--max-connections)", (unsigned long long)l->max_connections);
            goto refuse;
        }
        int keep = c->fd;
        end_conn(cs, idle); /* moves the last record: find c again */
        cs->evicted++;
        c = find(cs, keep);
    }
    c->admitted = 1;
    cs->pending--;
    cs->admitted++;
    return 0;
refuse:
    end_conn(cs, c);
    cs->refused++;
    return -1;
}

void tdm__serve_conns_tick(tdm__serve_conns *cs, double now)
{
    for (uint32_t i = 0; i < cs->n;) {
        tdm__serve_conn *c = &cs->c[i];
        if (!c->admitted && (now - c->t_open) * 1000.0 >= (double)cs->lim.idle_ms) {
            end_conn(cs, c); /* the last record moved to i */
            cs->expired++;
        } else {
            i++;
        }
    }
}
