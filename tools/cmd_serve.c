/*
 * cmd_serve.c -- `tandem serve`: the scheduler ABI as a ZeroMQ + msgpack service that any
 * language can drive (docs/service.md). One ROUTER socket; each request is one msgpack map
 * in the last frame of a DEALER ([payload]) or REQ ([empty, payload]) envelope, and gets
 * exactly one reply in the same envelope. The service is single-threaded: requests are
 * handled in arrival order, so named instances need no locking. SIGINT/SIGTERM or the
 * "shutdown" op end it cleanly.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "commands.h"
#include "serve.h"

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void usage(FILE *o)
{
    fprintf(o,
            "usage: tandem serve [--bind ENDPOINT] [--max-msg BYTES] [--max-instances N]\n"
            "                    [--max-kvx-bytes BYTES]\n"
            "                    [--create NAME [--config JSON|@FILE]]\n"
            "  --bind        tcp://127.0.0.1:PORT (PORT may be *) or ipc:///path;\n"
            "                default tcp://127.0.0.1:5557\n"
            "  --max-msg     largest request accepted (default %u); larger ones get an\n"
            "                error reply (beyond 4x the limit the connection is dropped)\n"
            "  --max-instances  named scheduler instances at most (default %u)\n"
            "  --max-kvx-bytes  host KV cache one transfer engine may allocate (default %u)\n"
            "  --create      create an instance at start-up, configured by --config\n"
            "Prints 'tandem serve: listening on ENDPOINT' once bound. docs/service.md has the\n"
            "protocol.\n",
            TDM_SERVE_DEFAULT_MAX_MSG, TDM_SERVE_DEFAULT_MAX_INSTANCES,
            TDM_SERVE_DEFAULT_MAX_KVX_BYTES);
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

static int protocol_error(tdm__serve_state *st, msgpack_sbuffer *out, const char *what)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
    st->requests++;
    st->errors++;
    msgpack_pack_map(&pk, 4);
    tdm__serve_kv_bool(&pk, "ok", 0);
    tdm__serve_kv_i64(&pk, "status", TDM_E_PROTOCOL);
    tdm__serve_kv_str(&pk, "error", tdm_strerror(TDM_E_PROTOCOL));
    tdm__serve_kv_str(&pk, "message", what);
    return 0;
}

int tdm_cmd_serve(int argc, char **argv)
{
    const char *bind = "tcp://127.0.0.1:5557", *create = NULL, *config_arg = NULL;
    tdm__serve_state st;
    tdm__serve_init(&st);
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

    void *ctx = zmq_ctx_new();
    void *sock = ctx ? zmq_socket(ctx, ZMQ_ROUTER) : NULL;
    int rc = 1;
    if (!sock) {
        fprintf(stderr, "tandem serve: zmq: %s\n", zmq_strerror(zmq_errno()));
        goto out;
    }
    int64_t hard = (int64_t)st.max_msg_bytes * 4 + 4096;
    int linger = 0;
    zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &hard, sizeof hard);
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(sock, bind) != 0) {
        fprintf(stderr, "tandem serve: cannot bind %s: %s\n", bind, zmq_strerror(zmq_errno()));
        goto out;
    }
    char ep[512];
    size_t eplen = sizeof ep;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &eplen) != 0) snprintf(ep, sizeof ep, "%s", bind);
    printf("tandem serve: listening on %s\n", ep);
    fflush(stdout);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    while (!stop_flag && !st.shutdown) {
        zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
        int pr = zmq_poll(&it, 1, 200);
        if (pr < 0) {
            if (zmq_errno() == EINTR) continue;
            fprintf(stderr, "tandem serve: poll: %s\n", zmq_strerror(zmq_errno()));
            goto out;
        }
        if (pr == 0) continue;
        zmq_msg_t frames[3];
        int extra = 0;
        int n = recv_frames(sock, frames, 3, &extra);
        if (n < 0) {
            if (zmq_errno() == EINTR) continue;
            fprintf(stderr, "tandem serve: recv: %s\n", zmq_strerror(zmq_errno()));
            goto out;
        }
        msgpack_sbuffer reply;
        msgpack_sbuffer_init(&reply);
        int nenv = 1; /* identity; plus the empty delimiter of a REQ client */
        if (n == 3 && zmq_msg_size(&frames[1]) == 0 && !extra) {
            nenv = 2;
            tdm__serve_handle(&st, zmq_msg_data(&frames[2]), zmq_msg_size(&frames[2]), &reply);
        } else if (n == 2 && !extra) {
            tdm__serve_handle(&st, zmq_msg_data(&frames[1]), zmq_msg_size(&frames[1]), &reply);
        } else if (n >= 2) {
            nenv = (zmq_msg_size(&frames[1]) == 0) ? 2 : 1;
            protocol_error(&st, &reply, "a request is one msgpack frame (after an optional "
                                        "empty delimiter)");
        } else {
            nenv = 1;
            protocol_error(&st, &reply, "empty message");
        }
        if (reply.size) send_reply(sock, frames, nenv, &reply);
        msgpack_sbuffer_destroy(&reply);
        for (int i = 0; i < n; i++) zmq_msg_close(&frames[i]);
    }
    rc = 0;
    fprintf(stderr, "tandem serve: stopped after %llu requests (%llu errors)\n",
            (unsigned long long)st.requests, (unsigned long long)st.errors);
out:
    if (sock) zmq_close(sock);
    if (ctx) zmq_ctx_term(ctx);
    tdm__serve_free(&st);
    return rc;
}
