/*
 * serve_auth.c -- who may talk to `tandem serve` (docs/service.md, "Trust model"): the CURVE
 * keys of the service socket, the allow-list of client public keys (and the admin keys among
 * them), the ZAP handler that checks a connecting client against that list and names it by
 * its public key (the "User-Id" of each of its messages, which the ops use for ownership),
 * and the rule that a socket bound beyond loopback needs CURVE unless --insecure.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "serve.h"

/* A Z85 key: exactly 40 characters of the Z85 alphabet. */
static int z85_key(const char *k)
{
    static const char alpha[] =
        "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
    if (strlen(k) != TDM_SERVE_USER_MAX) return 0;
    for (const char *p = k; *p; p++)
        if (!strchr(alpha, *p)) return 0;
    return 1;
}

static int push_key(tdm__serve_keys *l, const char *k)
{
    if (!z85_key(k)) return -1;
    if (l->n >= TDM_SERVE_MAX_KEYS) return -2;
    memcpy(l->key[l->n++], k, TDM_SERVE_USER_MAX + 1);
    return 0;
}

int tdm__serve_keys_add(tdm__serve_keys *l, const char *arg, char *err, size_t err_size)
{
    /* '@' is a Z85 character: a 40-character Z85 key that starts with it is a key, not a
     * file name. */
    if (arg[0] != '@' || z85_key(arg)) {
        int rc = push_key(l, arg);
        if (rc == -1) snprintf(err, err_size, "not a Z85 key of 40 characters: \"%.60s\"", arg);
        else if (rc) snprintf(err, err_size, "more than %d keys", TDM_SERVE_MAX_KEYS);
        return rc ? -1 : 0;
    }
    FILE *f = fopen(arg + 1, "r");
    if (!f) {
        snprintf(err, err_size, "cannot open %s: %s", arg + 1, strerror(errno));
        return -1;
    }
    char line[256];
    int lineno = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        size_t n = strcspn(line, "\r\n");
        line[n] = '\0';
        if (!n || line[0] == '#') continue;
        if (push_key(l, line)) {
            snprintf(err, err_size, "%s:%d: not a Z85 key of 40 characters (or more than %d keys)",
                     arg + 1, lineno, TDM_SERVE_MAX_KEYS);
            rc = -1;
        }
    }
    fclose(f);
    return rc;
}

int tdm__serve_keys_has(const tdm__serve_keys *l, const char *k)
{
    for (uint32_t i = 0; i < l->n; i++)
        if (!strcmp(l->key[i], k)) return 1;
    return 0;
}

int tdm__serve_endpoint_is_local(const char *ep)
{
    if (!strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9)) return 1;
    if (strncmp(ep, "tcp://", 6)) return 0;
    const char *h = ep + 6;
    static const char *const lo[] = {"127.0.0.1:", "localhost:", "[::1]:", "lo:"};
    for (size_t i = 0; i < sizeof lo / sizeof lo[0]; i++)
        if (!strncmp(h, lo[i], strlen(lo[i]))) return 1;
    return 0;
}

/* The ZAP handler (RFC 27): CURVE clients whose public key is allowed get status 200 and
 * their Z85 key as User-Id; everything else 400. Ends when the context terminates. */
static void *zap_main(void *arg)
{
    tdm__serve_auth *a = arg;
    void *s = a->zap;
    for (;;) {
        zmq_msg_t f[8];
        int nf = 0, more = 1, err = 0;
        while (more) {
            zmq_msg_t junk, *m = nf < 8 ? &f[nf] : &junk;
            zmq_msg_init(m);
            if (zmq_msg_recv(m, s, 0) < 0) {
                zmq_msg_close(m);
                err = 1;
                break;
            }
            more = zmq_msg_more(m);
            if (m == &junk) zmq_msg_close(m);
            else nf++;
        }
        if (err && zmq_errno() == ETERM) {
            for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
            break;
        }
        const char *code = "400", *text = "not allowed";
        char z[TDM_SERVE_USER_MAX + 1] = "";
        if (nf >= 7 && zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) &&
            zmq_msg_size(&f[6]) == 32) {
            zmq_z85_encode(z, zmq_msg_data(&f[6]), 32);
            if (tdm__serve_keys_has(&a->allowed, z) || tdm__serve_keys_has(&a->admins, z)) {
                code = "200";
                text = "OK";
            } else {
                z[0] = '\0';
            }
        }
        if (nf >= 2 && !err) {
            zmq_send(s, "1.0", 3, ZMQ_SNDMORE);
            zmq_send(s, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
            zmq_send(s, code, 3, ZMQ_SNDMORE);
            zmq_send(s, text, strlen(text), ZMQ_SNDMORE);
            zmq_send(s, z, strlen(z), ZMQ_SNDMORE);
            zmq_send(s, "", 0, 0);
        }
        for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
    }
    zmq_close(s);
    return NULL;
}

int tdm__serve_auth_start(tdm__serve_auth *a, void *ctx, void *sock, char *err, size_t err_size)
{
    if (!zmq_has("curve")) {
        snprintf(err, err_size, "this libzmq was built without CURVE");
        return -1;
    }
    if (zmq_curve_public(a->pub, a->secret) != 0) {
        snprintf(err, err_size, "--curve-secret is not a valid Z85 secret key");
        return -1;
    }
    a->zap = zmq_socket(ctx, ZMQ_REP);
    if (!a->zap || zmq_bind(a->zap, "inproc://zeromq.zap.01") != 0) {
        snprintf(err, err_size, "ZAP socket: %s", zmq_strerror(zmq_errno()));
        if (a->zap) zmq_close(a->zap);
        a->zap = NULL;
        return -1;
    }
    if (pthread_create(&a->thread, NULL, zap_main, a) != 0) {
        zmq_close(a->zap);
        a->zap = NULL;
        snprintf(err, err_size, "cannot start the ZAP thread");
        return -1;
    }
    a->started = 1;
    int one = 1;
    zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one);
    zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, a->secret, TDM_SERVE_USER_MAX);
    zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, "tandem-serve", 12);
    return 0;
}

void tdm__serve_auth_join(tdm__serve_auth *a)
{
    if (a->started) pthread_join(a->thread, NULL);
    a->started = 0;
}

void tdm__serve_caller_of(const tdm__serve_auth *a, int curve, int local, zmq_msg_t *frame,
                          tdm__serve_caller *c)
{
    memset(c, 0, sizeof *c);
    if (!curve) {
        c->local = local; /* loopback without CURVE: every local client is trusted alike */
        return;
    }
    const char *u = zmq_msg_gets(frame, "User-Id");
    if (u && strlen(u) == TDM_SERVE_USER_MAX) memcpy(c->user, u, TDM_SERVE_USER_MAX + 1);
    c->admin = c->user[0] && tdm__serve_keys_has(&a->admins, c->user);
}
