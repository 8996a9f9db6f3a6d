/*
 * cmd_serve.c -- `tandem serve`: the scheduler ABI as a ZeroMQ + msgpack service that any
 * language can drive (docs/service.md). One ROUTER socket; each request is one msgpack map
 * in the last frame of a DEALER ([payload]) or REQ ([empty, payload]) envelope, and gets
 * exactly one reply in the same envelope. Requests are handled in arrival order on this one
 * thread, so named instances need no locking; an op that would wait (kvx_connect, a kvx_poll
 * with a timeout) defers its reply, which is sent in the client's saved envelope when ready.
 * The socket may use CURVE (serve_auth.c); its monitor and the source descriptor of each
 * request feed the connection slots (serve_conn.c).
 * SIGINT/SIGTERM or the "shutdown" op end it cleanly.
 */
#include <errno.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "commands.h"
#include "serve.h"

/* 5575: clear of vLLM's KV-events publisher (5557, every interface), its NIXL and P2P side
 * channels (5600, 5710), Mooncake's bootstrap (8998) and Dynamo's forward-pass metrics (20380);
 * 5557 until library 0.3.0. */
#define SERVE_DEFAULT_BIND "tcp://127.0.0.1:5575"

static volatile sig_atomic_t stop_flag;

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void usage(FILE *o)
{
    fprintf(o,
            "usage: tandem serve [--bind ENDPOINT] [--max-msg BYTES] [--max-instances N]\n"
            "                    [--max-kvx-bytes BYTES] [limits] [--curve-secret KEY|@FILE\n"
            "                    [--curve-allow KEY|@FILE]... [--admin-key KEY|@FILE]...]\n"
            "                    [--insecure] [--create NAME [--config JSON|@FILE]]\n"
            "  --bind        tcp://127.0.0.1:PORT (PORT may be *) or ipc:///path;\n"
            "                default " SERVE_DEFAULT_BIND ". Beyond loopback only with CURVE\n"
            "                (or --insecure)\n"
            "  --curve-secret  the service's CURVE secret key (Z85); clients must then use\n"
            "                CURVE with an allowed key; instances belong to their creator\n"
            "  --curve-allow   a client public key allowed to connect (repeatable)\n"
            "  --admin-key     an allowed key that may also shutdown and let engines listen\n"
            "                beyond loopback (repeatable)\n"
            "  --insecure    allow a non-loopback --bind without CURVE (anyone may connect)\n"
            "  limits: --max-blocks-per-instance N (default %u), --max-total-blocks N (%u),\n"
            "          --max-queued-requests N (%u), --max-queued-tokens N (%u),\n"
            "          --max-prompt-tokens N (%u)\n"
            "  connections (docs/service.md, \"Connections\"): --max-connections N (%u slots,\n"
            "          taken by a connection's first request), --max-connections-per-source N\n"
            "          and --max-connections-per-key N (default half the slots),\n"
            "          --max-pending N (%u accepted without a request yet; the oldest goes),\n"
            "          --max-pending-per-source N (%u), --handshake-ms MS (%u),\n"
            "          --idle-ms MS (%u: a connection with no request by then is ended)\n"
            "  --max-msg     largest request accepted (default %u); larger ones get an\n"
            "                error reply (beyond 4x the limit the connection is dropped)\n"
            "  --max-instances  named scheduler instances at most (default %u)\n"
            "  --max-kvx-bytes  host KV cache one transfer engine may allocate (default %u)\n"
            "  --create      create an instance at start-up, configured by --config\n"
            "Prints 'tandem serve: listening on ENDPOINT' once bound. docs/service.md has the\n"
            "protocol.\n",
            TDM_SERVE_DEFAULT_MAX_BLOCKS_PER_INSTANCE, TDM_SERVE_DEFAULT_MAX_TOTAL_BLOCKS,
            TDM_SERVE_DEFAULT_MAX_QUEUED_REQUESTS, TDM_SERVE_DEFAULT_MAX_QUEUED_TOKENS,
            TDM_SERVE_DEFAULT_MAX_PROMPT_TOKENS, TDM_SERVE_DEFAULT_MAX_CONNECTIONS,
            TDM_SERVE_DEFAULT_MAX_PENDING, TDM_SERVE_DEFAULT_MAX_PENDING_PER_SOURCE,
            TDM_SERVE_DEFAULT_HANDSHAKE_MS, TDM_SERVE_DEFAULT_IDLE_MS,
            TDM_SERVE_DEFAULT_MAX_MSG,
            TDM_SERVE_DEFAULT_MAX_INSTANCES, TDM_SERVE_DEFAULT_MAX_KVX_BYTES);
}

/* Replies owed to clients (deferred ops): the envelope to send each one in. */
typedef struct owed {
    uint64_t token;
    int nenv;
    size_t len[2];
    char env[2][256];
} owed;

static owed owed_tab[TDM_SERVE_MAX_PENDING];

static void owe(uint64_t token, zmq_msg_t *frames, int nenv)
{
    for (int i = 0; i < TDM_SERVE_MAX_PENDING; i++) {
        if (owed_tab[i].token) continue;
        owed_tab[i].token = token;
        owed_tab[i].nenv = nenv;
        for (int j = 0; j < nenv; j++) {
            size_t n = zmq_msg_size(&frames[j]);
            owed_tab[i].len[j] = n < sizeof owed_tab[i].env[j] ? n : sizeof owed_tab[i].env[j];
            memcpy(owed_tab[i].env[j], zmq_msg_data(&frames[j]), owed_tab[i].len[j]);
        }
        return;
    }
}

/* Sends every reply that has become ready (a finished connect, a poll with events). */
static void pay(tdm__serve_state *st, void *sock)
{
    uint64_t token;
    for (;;) {
        msgpack_sbuffer reply;
        msgpack_sbuffer_init(&reply);
        if (!tdm__serve_kvx_progress(st, &token, &reply)) {
            msgpack_sbuffer_destroy(&reply);
            return;
        }
        for (int i = 0; i < TDM_SERVE_MAX_PENDING; i++) {
            owed *o = &owed_tab[i];
            if (o->token != token) continue;
            int ok = 1;
            for (int j = 0; j < o->nenv && ok; j++)
                ok = zmq_send(sock, o->env[j], o->len[j], ZMQ_SNDMORE) >= 0;
            if (ok && reply.data) zmq_send(sock, reply.data, reply.size, 0);
            o->token = 0;
        }
        msgpack_sbuffer_destroy(&reply);
    }
}

/* The ROUTER socket's monitor feeds the connection table (serve_conn.c). */
typedef struct conn_guard {
    void *mon;
    tdm__serve_conns conns;
    uint64_t handshakes; /* ZMTP/CURVE handshakes completed (the event names no connection) */
} conn_guard;

static int guard_start(conn_guard *g, void *ctx, void *sock)
{
    if (zmq_socket_monitor(sock, "inproc://tandem-serve-monitor",
                           ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED) != 0)
        return -1;
    g->mon = zmq_socket(ctx, ZMQ_PAIR);
    int linger = 0;
    if (!g->mon) return -1;
    zmq_setsockopt(g->mon, ZMQ_LINGER, &linger, sizeof linger);
    return zmq_connect(g->mon, "inproc://tandem-serve-monitor");
}

static void guard_events(conn_guard *g)
{
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, g->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        uint16_t type = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&type, zmq_msg_data(&ev), 2);
            memcpy(&value, (const char *)zmq_msg_data(&ev) + 2, 4);
        }
        int more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        if (more) { /* the endpoint frame */
            zmq_msg_init(&addr);
            zmq_msg_recv(&addr, g->mon, 0);
            zmq_msg_close(&addr);
        }
        if (type == ZMQ_EVENT_ACCEPTED) tdm__serve_conns_accepted(&g->conns, (int)value, mono_s());
        else if (type == ZMQ_EVENT_DISCONNECTED) tdm__serve_conns_closed(&g->conns, (int)value);
        else if (type == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) g->handshakes++;
    }
}

static int parse_u64(const char *opt, const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || !*v || v[0] == '-' || x < lo || x > hi) {
        fprintf(stderr, "tandem serve: %s must be %llu..%llu\n", opt, (unsigned long long)lo,
                (unsigned long long)hi);
        return -1;
    }
    *out = x;
    return 0;
}

static char *read_config_arg(const char *arg)
{
    if (arg[0] != '@') return strdup(arg);
    FILE *f = fopen(arg + 1, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, n;
    char chunk[4096];
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); fclose(f); return NULL; }
            buf = nb;
        }
        memcpy(buf + len, chunk, n);
        len += n;
    }
    fclose(f);
    if (!buf) buf = calloc(1, 1);
    else buf[len] = '\0';
    return buf;
}

/* Creates an instance through the same path a client would use. */
static int create_instance(tdm__serve_state *st, const char *name, const char *config)
{
    msgpack_sbuffer in, out;
    msgpack_packer pk;
    msgpack_sbuffer_init(&in);
    msgpack_sbuffer_init(&out);
    msgpack_packer_init(&pk, &in, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, config ? 3 : 2);
    tdm__serve_kv_str(&pk, "op", "create");
    tdm__serve_kv_str(&pk, "name", name);
    if (config) tdm__serve_kv_str(&pk, "config", config);
    int rc = tdm__serve_handle(st, in.data, in.size, &out);
    int ok = 0;
    if (rc == 0) {
        msgpack_unpacked up;
        msgpack_unpacked_init(&up);
        size_t off = 0;
        if (msgpack_unpack_next(&up, out.data, out.size, &off) == MSGPACK_UNPACK_SUCCESS) {
            const msgpack_object *okv = tdm__serve_field(&up.data, "ok");
            const msgpack_object *msg = tdm__serve_field(&up.data, "message");
            ok = okv && okv->type == MSGPACK_OBJECT_BOOLEAN && okv->via.boolean;
            if (!ok && msg && msg->type == MSGPACK_OBJECT_STR)
                fprintf(stderr, "tandem serve: cannot create \"%s\": %.*s\n", name,
                        (int)msg->via.str.size, msg->via.str.ptr);
        }
        msgpack_unpacked_destroy(&up);
    }
    msgpack_sbuffer_destroy(&in);
    msgpack_sbuffer_destroy(&out);
    return ok ? 0 : -1;
}

/* Receives the rest of a multipart message into frames[] (at most max); returns the count
 * or -1. Frames beyond max are received and dropped (counted in *extra). */
static int recv_frames(void *sock, zmq_msg_t *frames, int max, int *extra)
{
    int n = 0, more = 1;
    *extra = 0;
    while (more) {
        zmq_msg_t tmp;
        zmq_msg_t *f = n < max ? &frames[n] : &tmp;
        zmq_msg_init(f);
        if (zmq_msg_recv(f, sock, 0) < 0) {
            zmq_msg_close(f);
            for (int i = 0; i < n && i < max; i++) zmq_msg_close(&frames[i]);
            return -1;
        }
        more = zmq_msg_more(f);
        if (n < max) n++;
        else { zmq_msg_close(f); (*extra)++; }
    }
    return n;
}

static int send_reply(void *sock, zmq_msg_t *frames, int nenv, const msgpack_sbuffer *reply)
{
    for (int i = 0; i < nenv; i++)
        if (zmq_send(sock, zmq_msg_data(&frames[i]), zmq_msg_size(&frames[i]), ZMQ_SNDMORE) < 0)
            return -1;
    return zmq_send(sock, reply->data, reply->size, 0) < 0 ? -1 : 0;
}

static void error_reply(tdm__serve_state *st, msgpack_sbuffer *out, int status, const char *what)
{
    st->requests++;
    st->errors++;
    tdm__serve_pack_reply(out, status, NULL, 0, NULL, 0, what);
}

/* Answers the queued requests the worker has decoded, in their order. */
static void answer_queued(tdm__serve_state *st, void *sock, tdm__serve_queue *q)
{
    tdm__serve_item *it;
    while ((it = tdm__serve_queue_pop(q)) != NULL) {
        msgpack_sbuffer reply;
        msgpack_sbuffer_init(&reply);
        uint64_t token = 0;
        st->pre = &it->pre; /* an add's prompt and digests, computed by the worker */
        tdm__serve_handle_decoded(st, &it->who, it->rc, &it->e, &it->up, &reply, &token);
        st->pre = NULL;
        if (token) owe(token, it->frames, it->nenv);
        else if (reply.size) send_reply(sock, it->frames, it->nenv, &reply);
        msgpack_sbuffer_destroy(&reply);
        tdm__serve_queue_recycle(q, it); /* freed by the worker: large frees unmap pages */
        if (st->pending) pay(st, sock);
    }
}

int tdm_cmd_serve(int argc, char **argv)
{
    const char *bind = SERVE_DEFAULT_BIND, *create = NULL, *config_arg = NULL;
    int insecure = 0;
    tdm__serve_state st;
    tdm__serve_init(&st);
    static tdm__serve_auth auth_store; /* key lists: too large for the stack */
    tdm__serve_auth *auth = &auth_store;
    memset(auth, 0, sizeof *auth);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--bind") && v) {
            bind = v; i++;
        } else if (!strcmp(a, "--max-msg") && v) {
            char *end;
            unsigned long long x = strtoull(v, &end, 10);
            if (*end || x < 64 || x > (1ull << 31)) {
                fprintf(stderr, "tandem serve: --max-msg must be 64..2^31 bytes\n");
                return 2;
            }
            st.max_msg_bytes = (size_t)x; i++;
        } else if (!strcmp(a, "--max-instances") && v) {
            char *end;
            unsigned long x = strtoul(v, &end, 10);
            if (*end || x < 1 || x > 100000) {
                fprintf(stderr, "tandem serve: --max-instances must be 1..100000\n");
                return 2;
            }
            st.max_instances = (uint32_t)x; i++;
        } else if (!strcmp(a, "--max-kvx-bytes") && v) {
            char *end;
            unsigned long long x = strtoull(v, &end, 10);
            if (*end || x < 4096 || x > (1ull << 31)) {
                fprintf(stderr, "tandem serve: --max-kvx-bytes must be 4096..2^31\n");
                return 2;
            }
            st.max_kvx_bytes = (size_t)x; i++;
        } else if (!strcmp(a, "--curve-secret") && v) {
            tdm__serve_keys one;
            one.n = 0;
            char err[256];
            if (tdm__serve_keys_add(&one, v, err, sizeof err) || one.n != 1) {
                fprintf(stderr, "tandem serve: --curve-secret: %s\n", one.n > 1 ? "one key only" : err);
                return 2;
            }
            memcpy(auth->secret, one.key[0], sizeof auth->secret);
            st.curve = 1; i++;
        } else if ((!strcmp(a, "--curve-allow") || !strcmp(a, "--admin-key")) && v) {
            char err[256];
            if (tdm__serve_keys_add(a[2] == 'c' ? &auth->allowed : &auth->admins, v, err, sizeof err)) {
                fprintf(stderr, "tandem serve: %s: %s\n", a, err);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--insecure")) {
            insecure = 1;
        } else if (!strcmp(a, "--max-blocks-per-instance") && v) {
            if (parse_u64(a, v, 2, 1u << 28, &st.lim.max_blocks_per_instance)) return 2;
            i++;
        } else if (!strcmp(a, "--max-total-blocks") && v) {
            if (parse_u64(a, v, 2, 1ull << 32, &st.lim.max_total_blocks)) return 2;
            i++;
        } else if (!strcmp(a, "--max-queued-requests") && v) {
            if (parse_u64(a, v, 1, 1u << 24, &st.lim.max_queued_requests)) return 2;
            i++;
        } else if (!strcmp(a, "--max-queued-tokens") && v) {
            if (parse_u64(a, v, 1, 1ull << 32, &st.lim.max_queued_tokens)) return 2;
            i++;
        } else if (!strcmp(a, "--max-connections") && v) {
            if (parse_u64(a, v, 1, 1u << 20, &st.lim.max_connections)) return 2;
            i++;
        } else if (!strcmp(a, "--max-connections-per-source") && v) {
            if (parse_u64(a, v, 1, 1u << 20, &st.lim.max_connections_per_source)) return 2;
            i++;
        } else if (!strcmp(a, "--max-connections-per-key") && v) {
            if (parse_u64(a, v, 1, 1u << 20, &st.lim.max_connections_per_key)) return 2;
            i++;
        } else if (!strcmp(a, "--max-pending") && v) {
            if (parse_u64(a, v, 1, 1u << 20, &st.lim.max_pending)) return 2;
            i++;
        } else if (!strcmp(a, "--max-pending-per-source") && v) {
            if (parse_u64(a, v, 1, 1u << 20, &st.lim.max_pending_per_source)) return 2;
            i++;
        } else if (!strcmp(a, "--handshake-ms") && v) {
            if (parse_u64(a, v, 100, 600000, &st.lim.handshake_ms)) return 2;
            i++;
        } else if (!strcmp(a, "--idle-ms") && v) {
            if (parse_u64(a, v, 100, 86400000, &st.lim.idle_ms)) return 2;
            i++;
        } else if (!strcmp(a, "--max-prompt-tokens") && v) {
            if (parse_u64(a, v, 1, UINT32_MAX, &st.lim.max_prompt_tokens)) return 2;
            i++;
        } else if (!strcmp(a, "--create") && v) {
            create = v; i++;
        } else if (!strcmp(a, "--config") && v) {
            config_arg = v; i++;
        } else {
            fprintf(stderr, "tandem serve: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    int local = tdm__serve_endpoint_is_local(bind);
    if (!local && !st.curve && !insecure) {
        fprintf(stderr, "tandem serve: --bind %s is reachable beyond this machine: give "
                        "--curve-secret (and the clients' keys), or --insecure to allow anyone\n", bind);
        return 2;
    }
    /* ZeroMQ's ipc bind unlinks whatever is at the path: never let it replace a file */
    if (!strncmp(bind, "ipc://", 6) && bind[6] != '@' && strcmp(bind + 6, "*")) {
        struct stat sb;
        if (lstat(bind + 6, &sb) == 0) {
            fprintf(stderr, "tandem serve: --bind %s: the path already exists (%s); remove it "
                            "first if it is a stale socket of this service\n", bind,
                    S_ISSOCK(sb.st_mode) ? "a socket" : S_ISREG(sb.st_mode) ? "a regular file" : "not a socket");
            return 2;
        }
    }
    if (!st.curve && (auth->allowed.n || auth->admins.n)) {
        fprintf(stderr, "tandem serve: --curve-allow and --admin-key need --curve-secret\n");
        return 2;
    }
    if (create) {
        char *cfg = config_arg ? read_config_arg(config_arg) : NULL;
        if (config_arg && !cfg) {
            fprintf(stderr, "tandem serve: cannot read %s\n", config_arg + 1);
            return 1;
        }
        int rc = create_instance(&st, create, cfg);
        free(cfg);
        if (rc) return 1;
    }

    conn_guard guard;
    memset(&guard, 0, sizeof guard);
    tdm__serve_queue queue;
    memset(&queue, 0, sizeof queue);
    void *ctx = zmq_ctx_new();
    /* two I/O threads: one connection's large frame (read, CURVE-decrypted) does not hold
     * the frames of every other connection behind it */
    if (ctx) zmq_ctx_set(ctx, ZMQ_IO_THREADS, 2);
    void *sock = ctx ? zmq_socket(ctx, ZMQ_ROUTER) : NULL;
    int rc = 1;
    if (!sock) {
        fprintf(stderr, "tandem serve: zmq: %s\n", zmq_strerror(zmq_errno()));
        goto out;
    }
    int64_t hard = (int64_t)st.max_msg_bytes * 4 + 4096;
    int linger = 0, hs_ms = (int)st.lim.handshake_ms;
    /* heartbeats: a peer that answers nothing for 5 s is dropped (a raw socket that
     * completed the greeting and then went silent, a dead client) */
    int hb_ivl = 1000, hb_timeout = 5000, hb_ttl = 10000;
    zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &hard, sizeof hard);
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sock, ZMQ_HANDSHAKE_IVL, &hs_ms, sizeof hs_ms);
    zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
    zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout);
    zmq_setsockopt(sock, ZMQ_HEARTBEAT_TTL, &hb_ttl, sizeof hb_ttl);
    if (st.curve) {
        char err[256];
        if (tdm__serve_auth_start(auth, ctx, sock, err, sizeof err)) {
            fprintf(stderr, "tandem serve: CURVE: %s\n", err);
            goto out;
        }
        fprintf(stderr, "tandem serve: CURVE on; public key %s; %u client key(s), %u admin key(s)\n",
                auth->pub, auth->allowed.n, auth->admins.n);
    }
    if (!st.lim.max_connections_per_source)
        st.lim.max_connections_per_source = (st.lim.max_connections + 1) / 2;
    if (!st.lim.max_connections_per_key)
        st.lim.max_connections_per_key = (st.lim.max_connections + 1) / 2;
    tdm__serve_conns_init(&guard.conns, &st.lim);
    if (tdm__serve_queue_start(&queue, st.max_msg_bytes * 2) != 0) {
        fprintf(stderr, "tandem serve: cannot start the decoding thread\n");
        goto out;
    }
    st.hashcfgs = queue.hashcfgs; /* the instances' hashing settings, for an add's prompt work */
    tdm__serve_pre_publish(&st);
    if (guard_start(&guard, ctx, sock) != 0) {
        fprintf(stderr, "tandem serve: socket monitor: %s\n", zmq_strerror(zmq_errno()));
        goto out;
    }
    if (zmq_bind(sock, bind) != 0) {
        fprintf(stderr, "tandem serve: cannot bind %s: %s\n", bind, zmq_strerror(zmq_errno()));
        goto out;
    }
    char ep[512];
    size_t eplen = sizeof ep;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &eplen) != 0) snprintf(ep, sizeof ep, "%s", bind);
    struct sigaction sa; /* before the line a supervisor waits for */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    printf("tandem serve: listening on %s\n", ep);
    fflush(stdout);

    while (!stop_flag && !st.shutdown) {
        zmq_pollitem_t it[4] = {{sock, 0, ZMQ_POLLIN, 0}, {guard.mon, 0, ZMQ_POLLIN, 0},
                                {NULL, queue.wake[0], ZMQ_POLLIN, 0},
                                {NULL, st.wake_fd[0], ZMQ_POLLIN, 0}};
        int wait = tdm__serve_kvx_timeout_ms(&st);
        int pr = zmq_poll(it, st.wake_fd[0] >= 0 ? 4 : 3, wait < 0 || wait > 200 ? 200 : wait);
        if (pr < 0) {
            if (zmq_errno() == EINTR) continue;
            fprintf(stderr, "tandem serve: poll: %s\n", zmq_strerror(zmq_errno()));
            goto out;
        }
        guard_events(&guard); /* before any request: its connection is known */
        tdm__serve_conns_tick(&guard.conns, mono_s());
        answer_queued(&st, sock, &queue);
        if (st.pending) pay(&st, sock);
        if (!(it[0].revents & ZMQ_POLLIN)) continue;
        zmq_msg_t frames[3];
        int extra = 0;
        int n = recv_frames(sock, frames, 3, &extra);
        if (n < 0) {
            if (zmq_errno() == EINTR) continue;
            fprintf(stderr, "tandem serve: recv: %s\n", zmq_strerror(zmq_errno()));
            goto out;
        }
        tdm__serve_caller who;
        tdm__serve_caller_of(auth, st.curve, local, &frames[n - 1], &who);
        char why[200];
        int fd = zmq_msg_get(&frames[n - 1], ZMQ_SRCFD);
        if (fd >= 0 && tdm__serve_conns_request(&guard.conns, fd, st.curve ? who.user : NULL,
                                                mono_s(), why, sizeof why) != 0) {
            /* no reply: the connection is already being shut down (as a refused one
             * always was); the client's ZeroMQ socket reconnects and retries */
            for (int i = 0; i < n; i++) zmq_msg_close(&frames[i]);
            continue;
        }
        /* the request frame, after the identity and a REQ client's empty delimiter */
        int body = n == 3 && zmq_msg_size(&frames[1]) == 0 && !extra ? 2 : n == 2 && !extra ? 1 : 0;
        int nenv = body ? body : n >= 2 && zmq_msg_size(&frames[1]) == 0 ? 2 : 1;
        msgpack_sbuffer reply;
        msgpack_sbuffer_init(&reply);
        uint64_t token = 0;
        if (body && (zmq_msg_size(&frames[body]) > TDM_SERVE_SMALL_MSG ||
                     tdm__serve_queue_has(&queue, zmq_msg_data(&frames[0]), zmq_msg_size(&frames[0])))) {
            /* large, or its client has one queued: decoded by the worker, answered in order */
            tdm__serve_err e;
            memset(&e, 0, sizeof e);
            int erc = tdm__serve_early_check(&st, zmq_msg_data(&frames[body]),
                                             zmq_msg_size(&frames[body]), &e);
            int qrc = tdm__serve_queue_push(&queue, frames, n, nenv, &who, erc, &e);
            if (qrc == 0) n = 0; /* the frames moved into the queue */
            else
                error_reply(&st, &reply, qrc, qrc == TDM_E_AGAIN
                            ? "the service is decoding other large requests; retry"
                            : "out of memory queueing the request");
        } else if (body) {
            /* a deferred reply needs a free envelope slot (the ops cap pending ones alike) */
            tdm__serve_handle_as(&st, &who, zmq_msg_data(&frames[body]),
                                 zmq_msg_size(&frames[body]), &reply, &token);
        } else {
            error_reply(&st, &reply, TDM_E_PROTOCOL, n >= 2 ? "a request is one msgpack frame "
                        "(after an optional empty delimiter)" : "empty message");
        }
        if (token) owe(token, frames, nenv);
        else if (reply.size) send_reply(sock, frames, nenv, &reply);
        msgpack_sbuffer_destroy(&reply);
        for (int i = 0; i < n; i++) zmq_msg_close(&frames[i]);
        answer_queued(&st, sock, &queue);
        if (st.pending) pay(&st, sock); /* e.g. a poll whose events were already queued */
    }
    rc = 0;
    fprintf(stderr, "tandem serve: stopped after %llu requests (%llu errors); connections: "
            "%llu accepted, %llu handshakes, %llu refused, %llu evicted, %llu expired; "
            "%llu adds hashed off the loop\n",
            (unsigned long long)st.requests, (unsigned long long)st.errors,
            (unsigned long long)guard.conns.accepted, (unsigned long long)guard.handshakes,
            (unsigned long long)guard.conns.refused, (unsigned long long)guard.conns.evicted,
            (unsigned long long)guard.conns.expired, (unsigned long long)st.adds_precomputed);
out:
    st.hashcfgs = NULL;
    tdm__serve_queue_stop(&queue);
    tdm__serve_free(&st); /* joins connect workers (bounded by the handshake cap) */
    if (guard.mon) {
        zmq_socket_monitor(sock, NULL, 0);
        zmq_close(guard.mon);
    }
    tdm__serve_conns_free(&guard.conns);
    if (sock) zmq_close(sock);
    if (ctx) zmq_ctx_term(ctx);
    tdm__serve_auth_join(auth);
    return rc;
}
