/*
 * kvx.c -- the public face of the transfer engine: configuration (struct or JSON), create and
 * destroy (sockets, threads, eventfds), registration of the local KV cache, connect, the
 * send / receive / streaming / cancel calls that set up transfer state for the I/O thread,
 * and the event queue (poll + eventfd). Every call validates first, then takes kvx->mu.
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "kvx_internal.h"

#define MAX_PEERS 256

static _Thread_local char tl_err[256];

int tdm__kvx_fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_err, sizeof(tl_err), fmt, ap);
    va_end(ap);
    return status;
}

void tdm__kvx_err_clear(void) { tl_err[0] = '\0'; }

const char *tdm_kvx_errmsg(const tdm_kvx *kvx)
{
    (void)kvx;
    return tl_err;
}

void tdm__kvx_stage(tdm_kvx *k, int stage)
{
    if (k->test_stop == stage) {
        k->test_stop = 0;
        raise(SIGSTOP);
    }
}

void tdm__kvx_wake(tdm_kvx *k)
{
    uint64_t one = 1;
    ssize_t r = write(k->wake_fd, &one, sizeof(one));
    (void)r;
}

int tdm_kvx_config_init(tdm_kvx_config *c)
{
    if (!c) return TDM_E_INVAL;
    memset(c, 0, sizeof(*c));
    c->struct_size = sizeof(*c);
    c->role = TDM_KVX_ROLE_BOTH;
    c->transports = TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_SHM;
    c->heartbeat_ms = 1000;
    c->peer_timeout_ms = 5000;
    c->handshake_timeout_ms = 5000;
    c->transfer_timeout_ms = 30000;
    c->cancel_timeout_ms = 5000;
    c->max_chunk_bytes = 8u << 20;
    c->shm_slots = 8;
    return TDM_OK;
}

int tdm_kvx_recv_desc_init(tdm_kvx_recv_desc *d)
{
    if (!d) return TDM_E_INVAL;
    memset(d, 0, sizeof(*d));
    d->struct_size = sizeof(*d);
    d->mode = TDM_KVX_PULL;
    return TDM_OK;
}

int tdm_kvx_send_desc_init(tdm_kvx_send_desc *d)
{
    if (!d) return TDM_E_INVAL;
    memset(d, 0, sizeof(*d));
    d->struct_size = sizeof(*d);
    d->mode = TDM_KVX_PULL;
    d->peer = TDM_KVX_PEER_ANY;
    return TDM_OK;
}

int tdm_kvx_event_init(tdm_kvx_event *e)
{
    if (!e) return TDM_E_INVAL;
    memset(e, 0, sizeof(*e));
    e->struct_size = sizeof(*e);
    return TDM_OK;
}

/* tdm_kvx_stats grew (chunks_read_nixl) after ABI 1 was first published: the default
 * initialiser, @@TANDEM_1.1, fills the current struct; @TANDEM_1, for binaries linked
 * before, only the layout they know (docs/ABI.md). */
#define KVX_STATS_V1_SIZE offsetof(tdm_kvx_stats, chunks_read_nixl)
TDM_API int tdm__kvx_stats_init_v1_1(tdm_kvx_stats *s);
TDM_API int tdm__kvx_stats_init_v1(tdm_kvx_stats *s);
TDM__DEFAULT_SYMBOL(tdm__kvx_stats_init_v1_1, tdm_kvx_stats_init, TANDEM_1.1);
TDM__COMPAT_SYMBOL(tdm__kvx_stats_init_v1, tdm_kvx_stats_init, TANDEM_1);

static int kvx_stats_init_size(tdm_kvx_stats *s, size_t size)
{
    if (!s) return TDM_E_INVAL;
    memset(s, 0, size);
    s->struct_size = (uint32_t)size;
    return TDM_OK;
}

int tdm__kvx_stats_init_v1_1(tdm_kvx_stats *s) { return kvx_stats_init_size(s, sizeof(*s)); }
int tdm__kvx_stats_init_v1(tdm_kvx_stats *s) { return kvx_stats_init_size(s, KVX_STATS_V1_SIZE); }
#if !TDM__HAVE_SYMVER
int tdm_kvx_stats_init(tdm_kvx_stats *s) { return tdm__kvx_stats_init_v1_1(s); }
#endif

int tdm_kvx_curve_keypair(char public_key[41], char secret_key[41])
{
    if (!public_key || !secret_key) return tdm__kvx_fail(TDM_E_INVAL, "NULL key buffer");
    if (!zmq_has("curve")) return tdm__kvx_fail(TDM_E_UNSUPPORTED, "libzmq was built without CURVE");
    char p[41], s[41];
    if (zmq_curve_keypair(p, s) != 0) return tdm__kvx_fail(TDM_E_IO, "zmq_curve_keypair: %s", zmq_strerror(errno));
    memcpy(public_key, p, 41);
    memcpy(secret_key, s, 41);
    return TDM_OK;
}

static int z85_ok(const char *s)
{
    uint8_t raw[32];
    return s && strlen(s) == 40 && zmq_z85_decode(raw, s) != NULL;
}

static int valid_id(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n >= TDM__KVX_ID_LEN) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x21 || s[i] > 0x7e) return 0;
    return 1;
}

static void make_host_id(char *out, size_t len)
{
    char host[64] = "host", boot[40] = "";
    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof(boot), f)) boot[0] = '\0';
        fclose(f);
    }
    boot[8] = '\0';
    snprintf(out, len, "%.40s/%s", host, boot);
    for (char *p = out; *p; p++)
        if (*p < 0x21 || *p > 0x7e) *p = '_';
}

static int check_config(const tdm_kvx_config *c)
{
    if (!TDM_STRUCT_OK(c, sizeof(tdm_kvx_config))) return tdm__kvx_fail(TDM_E_INVAL, "config NULL or struct_size too small");
    if (!valid_id(c->engine_id)) return tdm__kvx_fail(TDM_E_CONFIG, "engine_id must be 1..63 printable characters");
    if (c->role > TDM_KVX_ROLE_DECODE) return tdm__kvx_fail(TDM_E_CONFIG, "unknown role %u", c->role);
    if (c->listen_endpoint && strncmp(c->listen_endpoint, "tcp://", 6) != 0 &&
        strncmp(c->listen_endpoint, "ipc://", 6) != 0)
        return tdm__kvx_fail(TDM_E_CONFIG, "listen endpoint must be tcp:// or ipc://");
    if (c->listen_endpoint && strlen(c->listen_endpoint) >= 200) return tdm__kvx_fail(TDM_E_CONFIG, "listen endpoint too long");
    if (!(c->transports & TDM_KVX_TRANSPORT_ZMQ) || c->transports > 15)
        return tdm__kvx_fail(TDM_E_CONFIG, "transports must include zmq and only known bits");
    if (c->heartbeat_ms == 0 || c->peer_timeout_ms < c->heartbeat_ms)
        return tdm__kvx_fail(TDM_E_CONFIG, "heartbeat_ms must be > 0 and <= peer_timeout_ms");
    if (c->handshake_timeout_ms == 0 || c->transfer_timeout_ms == 0 || c->cancel_timeout_ms == 0)
        return tdm__kvx_fail(TDM_E_CONFIG, "timeouts must be > 0");
    if (c->max_chunk_bytes < 4096 || c->max_chunk_bytes > (1u << 30))
        return tdm__kvx_fail(TDM_E_CONFIG, "max_chunk_bytes must be in [4 KiB, 1 GiB]");
    if (c->shm_slots == 0 || c->shm_slots > 1024) return tdm__kvx_fail(TDM_E_CONFIG, "shm_slots must be in [1, 1024]");
    if (c->curve_secret_key) {
        if (!zmq_has("curve")) return tdm__kvx_fail(TDM_E_CONFIG, "CURVE requested but libzmq has no CURVE");
        if (!z85_ok(c->curve_secret_key)) return tdm__kvx_fail(TDM_E_CONFIG, "curve secret key is not 40 Z85 chars");
        if (c->curve_public_key && !z85_ok(c->curve_public_key))
            return tdm__kvx_fail(TDM_E_CONFIG, "curve public key is not 40 Z85 chars");
        if (c->num_curve_allowed_clients && !c->curve_allowed_clients)
            return tdm__kvx_fail(TDM_E_CONFIG, "allowed client list is NULL");
        for (uint32_t i = 0; i < c->num_curve_allowed_clients; i++)
            if (!z85_ok(c->curve_allowed_clients[i]))
                return tdm__kvx_fail(TDM_E_CONFIG, "allowed client key %u is not 40 Z85 chars", i);
    } else if (c->curve_public_key || c->num_curve_allowed_clients) {
        return tdm__kvx_fail(TDM_E_CONFIG, "curve keys given without a secret key");
    }
    return TDM_OK;
}

/* The file an ipc:// endpoint binds: NULL for tcp and the abstract namespace ("ipc://@name"). */
static const char *ipc_file(const char *ep)
{
    if (strncmp(ep, "ipc://", 6) != 0 || ep[6] == '@') return NULL;
    return ep + 6;
}

static const char *tmp_dir(void)
{
    const char *t = getenv("TMPDIR");
    return t && t[0] == '/' && strlen(t) < 64 ? t : "/tmp";
}

/* Removes the private ipc directories of dead engines: TMPDIR/tdm-kvx-PID-XXXXXX of our uid
 * whose PID is not alive, and the socket inside. */
static void ipc_sweep(void)
{
    DIR *d = opendir(tmp_dir());
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end;
        if (strncmp(e->d_name, "tdm-kvx-", 8) != 0 || e->d_name[8] < '1' || e->d_name[8] > '9') continue;
        long pid = strtol(e->d_name + 8, &end, 10);
        if (*end != '-' || strlen(end) != 7 || pid <= 0 || pid > 0x7fffffffL || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) ||
            st.st_uid != geteuid())
            continue;
        int dfd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd < 0) continue;
        if (fstatat(dfd, "kvx.sock", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(st.st_mode))
            unlinkat(dfd, "kvx.sock", 0);
        close(dfd);
        unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR);   /* only if now empty */
    }
    closedir(d);
}

static int start(tdm_kvx *k)
{
    const tdm_kvx_config *c = &k->cfg;
    k->zctx = zmq_ctx_new();
    if (!k->zctx) return tdm__kvx_fail(TDM_E_IO, "zmq_ctx_new: %s", zmq_strerror(errno));
    if (k->curve) {
        int rc = tdm__kvx_zap_bind(k);
        if (rc) return rc;
    }
    int rc = tdm__kvx_pool_create(c->max_chunk_bytes, c->shm_slots, k->wake_fd, &k->pool);
    if (rc) return tdm__kvx_fail(rc, "out of memory");
    if (c->listen_endpoint) {
        k->router = zmq_socket(k->zctx, ZMQ_ROUTER);
        if (!k->router) return tdm__kvx_fail(TDM_E_IO, "zmq_socket: %s", zmq_strerror(errno));
        int one = 1, zero = 0, hwm = 4096;
        zmq_setsockopt(k->router, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
        zmq_setsockopt(k->router, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_setsockopt(k->router, ZMQ_SNDHWM, &hwm, sizeof(hwm));
        zmq_setsockopt(k->router, ZMQ_RCVHWM, &hwm, sizeof(hwm));
        if (k->curve) {
            zmq_setsockopt(k->router, ZMQ_CURVE_SERVER, &one, sizeof(one));
            zmq_setsockopt(k->router, ZMQ_CURVE_SECRETKEY, k->sec, 40);
            zmq_setsockopt(k->router, ZMQ_ZAP_DOMAIN, "tandem", 6);
        }
        /* ZeroMQ replaces whatever is at an ipc path: never let it (docs/protocol.md §1).
         * The wildcard ("ipc://" then "*"): a socket in a directory of our own (mode 0700). */
        const char *bind_ep = c->listen_endpoint;
        char own[256];
        if (!strcmp(bind_ep, "ipc://*")) {
            snprintf(k->ipc_dir, sizeof(k->ipc_dir), "%s/tdm-kvx-%d-XXXXXX", tmp_dir(), (int)getpid());
            if (!mkdtemp(k->ipc_dir)) {
                int err = errno;
                k->ipc_dir[0] = '\0';
                return tdm__kvx_fail(TDM_E_IO, "cannot create a private ipc directory in %s: %s", tmp_dir(), strerror(err));
            }
            snprintf(own, sizeof(own), "ipc://%s/kvx.sock", k->ipc_dir);
            bind_ep = own;
        }
        const char *path = ipc_file(bind_ep);
        struct stat st;
        if (path && lstat(path, &st) == 0)
            return tdm__kvx_fail(TDM_E_EXISTS, "ipc path %s already exists (%s): refusing to replace it "
                                 "(remove it first if it is the socket of a stopped engine)", path,
                                 S_ISSOCK(st.st_mode) ? "a socket" : S_ISREG(st.st_mode) ? "a regular file" : "not a socket");
        if (path && errno != ENOENT) return tdm__kvx_fail(TDM_E_CONFIG, "ipc path %s: %s", path, strerror(errno));
        if (zmq_bind(k->router, bind_ep) != 0)
            return tdm__kvx_fail(TDM_E_IO, "cannot bind %s: %s", c->listen_endpoint, zmq_strerror(errno));
        size_t len = sizeof(k->endpoint);
        zmq_getsockopt(k->router, ZMQ_LAST_ENDPOINT, k->endpoint, &len);
        if (path && lstat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
            /* our socket: destroy unlinks this path only while it is still this one */
            snprintf(k->ipc_path, sizeof(k->ipc_path), "%s", path);
            k->ipc_dev = (uint64_t)st.st_dev;
            k->ipc_ino = (uint64_t)st.st_ino;
        }
    }
    if (pthread_create(&k->io_thread, NULL, tdm__kvx_io_main, k) != 0)
        return tdm__kvx_fail(TDM_E_IO, "cannot start the I/O thread");
    k->io_started = 1;
    return TDM_OK;
}

int tdm_kvx_create(const tdm_kvx_config *cfg, tdm_kvx **out)
{
    return tdm__kvx_create_lim(cfg, NULL, out);
}

int tdm__kvx_create_lim(const tdm_kvx_config *cfg, const tdm__kvx_limits *lim, tdm_kvx **out)
{
    tdm__kvx_err_clear();
    if (!out) return tdm__kvx_fail(TDM_E_INVAL, "out is NULL");
    int rc = check_config(cfg);
    if (rc) return rc;
    tdm_kvx *k = tdm__calloc(1, sizeof(*k));
    if (!k) return tdm__kvx_fail(TDM_E_NOMEM, "out of memory");
    tdm__handle_acquire();
    k->wake_fd = k->ev_fd = -1;
    memcpy(&k->cfg, cfg, TDM_MIN(sizeof(k->cfg), cfg->struct_size));
    k->cfg.struct_size = sizeof(k->cfg);
    if (lim) k->lim = *lim;
    if (!k->lim.max_peers_per_source) k->lim.max_peers_per_source = MAX_PEERS / 4;
    if (!k->lim.max_peers_per_key) k->lim.max_peers_per_key = MAX_PEERS / 4;
    if (!k->lim.peer_idle_ms) k->lim.peer_idle_ms = 10000;
    k->cfg.listen_endpoint = NULL;
    k->cfg.engine_id = k->engine_id;
    k->cfg.curve_secret_key = k->cfg.curve_public_key = NULL;
    k->cfg.curve_allowed_clients = NULL;
    snprintf(k->engine_id, sizeof(k->engine_id), "%s", cfg->engine_id);
    make_host_id(k->host_id, sizeof(k->host_id));
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cond, NULL);
    const char *stop = getenv("TDM_KVX_TEST_STOP_AT");
    k->test_stop = stop ? atoi(stop) : 0;
    tdm__kvx_shm_sweep();   /* segments and ipc directories of dead engines */
    ipc_sweep();
    k->outbox_tail = &k->outbox;
    k->ev_tail = &k->ev_head;
    k->next_handle = 1;
    k->cap_peers = MAX_PEERS;
    k->peers = tdm__calloc(MAX_PEERS, sizeof(kvx_peer));
    if (!k->peers) { rc = tdm__kvx_fail(TDM_E_NOMEM, "out of memory"); goto fail; }
    if (cfg->curve_secret_key) {
        k->curve = 1;
        memcpy(k->sec, cfg->curve_secret_key, 41);
        if (cfg->curve_public_key) memcpy(k->pub, cfg->curve_public_key, 41);
        else if (zmq_curve_public(k->pub, k->sec) != 0) {
            rc = tdm__kvx_fail(TDM_E_CONFIG, "cannot derive the CURVE public key");
            goto fail;
        }
        k->num_allowed = cfg->num_curve_allowed_clients;
        k->allowed = tdm__calloc(k->num_allowed ? k->num_allowed : 1, 41);
        if (!k->allowed) { rc = tdm__kvx_fail(TDM_E_NOMEM, "out of memory"); goto fail; }
        for (uint32_t i = 0; i < k->num_allowed; i++) memcpy(k->allowed[i], cfg->curve_allowed_clients[i], 41);
    }
    k->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    k->ev_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (k->wake_fd < 0 || k->ev_fd < 0) { rc = tdm__kvx_fail(TDM_E_IO, "eventfd: %s", strerror(errno)); goto fail; }
    if (cfg->listen_endpoint) snprintf(k->endpoint, sizeof(k->endpoint), "%s", cfg->listen_endpoint);
    k->cfg.listen_endpoint = cfg->listen_endpoint ? k->endpoint : NULL;
    if (cfg->transports & TDM_KVX_TRANSPORT_NIXL) {
        rc = tdm__kvx_nixl_create(k);
        if (rc) goto fail;
    }
    rc = start(k);
    if (rc) goto fail;
    *out = k;
    return TDM_OK;
fail: {
        char keep[256];
        snprintf(keep, sizeof(keep), "%s", tl_err);
        tdm_kvx_destroy(k);
        snprintf(tl_err, sizeof(tl_err), "%s", keep);
    }
    return rc;
}

void tdm_kvx_destroy(tdm_kvx *k)
{
    if (!k) return;
    if (k->io_started) {
        pthread_mutex_lock(&k->mu);
        k->stop = 1;
        pthread_mutex_unlock(&k->mu);
        tdm__kvx_wake(k);
        pthread_join(k->io_thread, NULL);
    } else if (k->router) {
        zmq_close(k->router);
    }
    if (k->zctx) {
        zmq_ctx_shutdown(k->zctx);
        if (k->zap_started) pthread_join(k->zap_thread, NULL);
        zmq_ctx_term(k->zctx);   /* the listening socket is closed from here on */
    }
    struct stat st;
    if (k->ipc_path[0] && lstat(k->ipc_path, &st) == 0 && S_ISSOCK(st.st_mode) &&
        (uint64_t)st.st_dev == k->ipc_dev && (uint64_t)st.st_ino == k->ipc_ino)
        unlink(k->ipc_path);   /* still the socket we bound */
    if (k->ipc_dir[0]) rmdir(k->ipc_dir);
    while (k->xfers) {
        kvx_xfer *x = k->xfers;
        k->xfers = x->next;
        tdm__kvx_xfer_free(k, x);
    }
    while (k->pending) { kvx_pending *p = k->pending; k->pending = p->next; tdm__free(p); }
    while (k->outbox) { kvx_out *o = k->outbox; k->outbox = o->next; tdm__free(o); }
    while (k->ev_head) { kvx_event_node *e = k->ev_head; k->ev_head = e->next; tdm__free(e); }
    if (k->peers)
        for (uint32_t i = 0; i < k->num_peers; i++) {
            tdm__kvx_shm_destroy(k->peers[i].shm);
            tdm__kvx_unmap_remote(&k->peers[i]);
            tdm__kvx_peer_scales_free(&k->peers[i]);
        }
    tdm__kvx_nixl_destroy(k);   /* before the cache and the peers go */
    tdm__kvx_pool_destroy(k->pool);
    tdm__free(k->peers);
    tdm__free(k->allowed);
    tdm__free(k->bases);
    tdm__free(k->owner);
    if (k->dev_stage) tdm_cuda_free(k->dev_stage);
    if (k->kvseg) {
        munmap(k->kvseg, k->kvseg_size);
        shm_unlink(k->kvseg_name);
    }
    tdm__free(k->bounce);
    tdm__free(k->scales);
    if (k->wake_fd >= 0) close(k->wake_fd);
    if (k->ev_fd >= 0) close(k->ev_fd);
    pthread_cond_destroy(&k->cond);
    pthread_mutex_destroy(&k->mu);
    tdm__free(k);
    tdm__handle_release();
}

int tdm_kvx_get_endpoint(tdm_kvx *k, char *buf, size_t size)
{
    if (!k || !buf) return tdm__kvx_fail(TDM_E_INVAL, "NULL argument");
    if (!k->router) return tdm__kvx_fail(TDM_E_STATE, "this engine does not listen");
    size_t n = strlen(k->endpoint);
    if (n + 1 > size) return tdm__kvx_fail(TDM_E_TRUNCATED, "buffer too small (%zu needed)", n + 1);
    memcpy(buf, k->endpoint, n + 1);
    return TDM_OK;
}

int tdm_kvx_get_public_key(tdm_kvx *k, char buf[41])
{
    if (!k || !buf) return tdm__kvx_fail(TDM_E_INVAL, "NULL argument");
    pthread_mutex_lock(&k->mu);
    int have = k->pub[0] != '\0';
    if (have) memcpy(buf, k->pub, 41);
    pthread_mutex_unlock(&k->mu);
    return have ? TDM_OK : tdm__kvx_fail(TDM_E_STATE, "no CURVE key pair");
}

int tdm_kvx_alloc_shared(tdm_kvx *k, size_t bytes, void **ptr)
{
    if (!k || !ptr || bytes == 0 || bytes > ((size_t)1 << 40)) return tdm__kvx_fail(TDM_E_INVAL, "bad argument");
    pthread_mutex_lock(&k->mu);
    int rc = TDM_OK;
    if (k->kvseg || k->registered) { rc = tdm__kvx_fail(TDM_E_STATE, "already allocated or registered"); goto out; }
    uint8_t *m;
    rc = tdm__kvx_seg_create("kv", bytes, k->kvseg_name, sizeof(k->kvseg_name), &m);
    if (rc) goto out;
    k->kvseg = m;
    k->kvseg_size = bytes;
    *ptr = m;
out:
    pthread_mutex_unlock(&k->mu);
    return rc;
}

int tdm_kvx_register(tdm_kvx *k, const tdm_kv_layout *l, void *const *bases, uint32_t mem_kind,
                     uint32_t head_offset)
{
    char why[128];
    if (!k || !l || !bases) return tdm__kvx_fail(TDM_E_INVAL, "NULL argument");
    if (!TDM_STRUCT_OK(l, sizeof(tdm_kv_layout))) return tdm__kvx_fail(TDM_E_INVAL, "layout struct_size too small");
    if (tdm__kvx_layout_check(l, why, sizeof(why))) return tdm__kvx_fail(TDM_E_INVAL, "layout: %s", why);
    if (mem_kind > TDM_MEM_CUDA) return tdm__kvx_fail(TDM_E_INVAL, "unknown memory kind %u", mem_kind);
    if (head_offset > (1u << 20)) return tdm__kvx_fail(TDM_E_INVAL, "head_offset out of range");
    for (uint32_t i = 0; i < l->num_layers; i++)
        if (!bases[i]) return tdm__kvx_fail(TDM_E_INVAL, "layer %u base is NULL", i);
    char cmsg[160];
    if (mem_kind == TDM_MEM_CUDA && tdm_cuda_available(cmsg, sizeof(cmsg)) != TDM_OK)
        return tdm__kvx_fail(TDM_E_NO_CUDA, "CUDA memory: %s", cmsg);
    size_t unit = tdm__kvx_unit_bytes(l);
    if (unit > k->cfg.max_chunk_bytes)
        return tdm__kvx_fail(TDM_E_CONFIG, "one block of one layer (%zu bytes) exceeds max_chunk_bytes", unit);
    void **b = tdm__calloc(l->num_layers, sizeof(void *));
    uint32_t *owner = tdm__calloc(l->num_blocks, sizeof(uint32_t));
    if (!b || !owner) { tdm__free(b); tdm__free(owner); return tdm__kvx_fail(TDM_E_NOMEM, "out of memory"); }
    void *dev = NULL;   /* CUDA: the device staging buffer of one chunk */
    if (mem_kind == TDM_MEM_CUDA) {
        int rc = tdm_cuda_malloc(&dev, k->cfg.max_chunk_bytes);
        if (rc) {
            tdm__free(b);
            tdm__free(owner);
            return tdm__kvx_fail(rc, "CUDA staging buffer: %s", tdm_kv_errmsg());
        }
    }
    memcpy(b, bases, l->num_layers * sizeof(void *));
    pthread_mutex_lock(&k->mu);
    if (k->registered) {
        pthread_mutex_unlock(&k->mu);
        tdm__free(b);
        tdm__free(owner);
        tdm_cuda_free(dev);
        return tdm__kvx_fail(TDM_E_STATE, "KV cache already registered");
    }
    k->dev_stage = dev;
    /* a cache entirely inside our shared segment can be read directly by same-host peers */
    size_t lbytes = 0;
    k->kv_direct = k->kvseg && mem_kind == TDM_MEM_HOST && l->num_layers <= TDM__KVX_MAX_KV_LAYERS &&
                   tdm_kv_layout_layer_bytes(l, &lbytes) == TDM_OK;
    for (uint32_t i = 0; k->kv_direct && i < l->num_layers; i++) {
        uint8_t *bp = bases[i];
        if (bp < k->kvseg || (size_t)(bp - k->kvseg) > k->kvseg_size || lbytes > k->kvseg_size - (size_t)(bp - k->kvseg))
            k->kv_direct = 0;
        else
            k->kv_off[i] = (uint64_t)(bp - k->kvseg);
    }
    k->layout = *l;
    k->layout.struct_size = sizeof(tdm_kv_layout);
    k->bases = b;
    k->owner = owner;
    k->mem_kind = mem_kind;
    k->head_offset = head_offset;
    k->unit_bytes = unit;
    if (k->nixl) {
        int rc = tdm__kvx_nixl_register(k);
        if (rc) {   /* left unregistered: the caller may fix and retry on a new engine */
            k->bases = NULL;
            k->owner = NULL;
            k->dev_stage = NULL;
            pthread_mutex_unlock(&k->mu);
            tdm__free(b);
            tdm__free(owner);
            tdm_cuda_free(dev);
            return rc;
        }
    }
    k->registered = 1;
    pthread_mutex_unlock(&k->mu);
    return TDM_OK;
}

int tdm_kvx_connect(tdm_kvx *k, const char *endpoint, const char *server_key, uint32_t *peer)
{
    if (!k || !endpoint || !peer) return tdm__kvx_fail(TDM_E_INVAL, "NULL argument");
    if ((strncmp(endpoint, "tcp://", 6) && strncmp(endpoint, "ipc://", 6)) || strlen(endpoint) >= 200)
        return tdm__kvx_fail(TDM_E_INVAL, "endpoint must be tcp:// or ipc:// (< 200 chars)");
    if (server_key && !z85_ok(server_key)) return tdm__kvx_fail(TDM_E_INVAL, "server key is not 40 Z85 chars");
    if (server_key && !zmq_has("curve")) return tdm__kvx_fail(TDM_E_UNSUPPORTED, "libzmq has no CURVE");
    pthread_mutex_lock(&k->mu);
    if (!k->registered) {
        pthread_mutex_unlock(&k->mu);
        return tdm__kvx_fail(TDM_E_STATE, "register the KV cache before connecting");
    }
    if (server_key && !k->pub[0] && zmq_curve_keypair(k->pub, k->sec) != 0) {
        pthread_mutex_unlock(&k->mu);
        return tdm__kvx_fail(TDM_E_IO, "cannot generate a CURVE key pair");
    }
    /* a second connect to an endpoint we are connected (or connecting) to sends no HELLO:
     * the server would take it for a reconnect of the live connection */
    for (uint32_t i = 0; i < k->num_peers; i++) {
        const kvx_peer *q = &k->peers[i];
        if (q->outgoing && (q->state == PEER_ALIVE || q->state == PEER_HANDSHAKE) && !strcmp(q->ep, endpoint)) {
            uint32_t qid = q->id;
            int alive = q->state == PEER_ALIVE;
            pthread_mutex_unlock(&k->mu);
            return tdm__kvx_fail(TDM_E_EXISTS, "connect %s: already %s that endpoint (peer %u)", endpoint,
                                 alive ? "connected to" : "connecting to", qid);
        }
    }
    kvx_peer *p = tdm__kvx_peer_new(k);
    if (!p) {
        pthread_mutex_unlock(&k->mu);
        return tdm__kvx_fail(TDM_E_NO_SPACE, "too many peers");
    }
    p->state = PEER_HANDSHAKE;
    p->outgoing = 1;
    k->handshaken = 1;   /* the HELLO will carry our KV scales: fixed from now on */
    p->hs_deadline = tdm__now() + k->cfg.handshake_timeout_ms / 1000.0;
    snprintf(p->ep, sizeof(p->ep), "%s", endpoint);
    if (server_key) memcpy(p->srvkey, server_key, 41);
    p->hs_waiting = 1;
    uint32_t id = p->id, idx = id & 0xffffu;
    tdm__kvx_wake(k);
    while (!k->peers[idx].hs_done) pthread_cond_wait(&k->cond, &k->mu);
    p = &k->peers[idx];
    int rc = p->hs_status;
    char reason[TDM__KVX_REASON_LEN];
    snprintf(reason, sizeof(reason), "%s", p->hs_reason);
    p->hs_waiting = 0;
    pthread_mutex_unlock(&k->mu);
    if (rc) return tdm__kvx_fail(rc, "connect %s: %s", endpoint, reason);
    *peer = id;
    return TDM_OK;
}

int tdm_kvx_find_peer(tdm_kvx *k, const char *engine_id, uint32_t *peer)
{
    if (!k || !engine_id || !peer) return tdm__kvx_fail(TDM_E_INVAL, "NULL argument");
    pthread_mutex_lock(&k->mu);
    for (uint32_t i = 0; i < k->num_peers; i++) {
        if (k->peers[i].state == PEER_ALIVE && strcmp(k->peers[i].remote.engine_id, engine_id) == 0) {
            uint32_t id = k->peers[i].id;
            pthread_mutex_unlock(&k->mu);
            *peer = id;
            return TDM_OK;
        }
    }
    pthread_mutex_unlock(&k->mu);
    return tdm__kvx_fail(TDM_E_NOT_FOUND, "no live peer with engine id '%s'", engine_id);
}

int tdm_kvx_get_fd(tdm_kvx *k, int *fd)
{
    if (!k || !fd) return tdm__kvx_fail(TDM_E_INVAL, "NULL argument");
    *fd = k->ev_fd;
    return TDM_OK;
}

int tdm_kvx_poll(tdm_kvx *k, tdm_kvx_event *events, uint32_t max, uint32_t *n, int timeout_ms)
{
    if (!k || !n || (max && !events)) return tdm__kvx_fail(TDM_E_INVAL, "NULL argument");
    size_t stride = sizeof(tdm_kvx_event);
    if (max) {
        if (events[0].struct_size < offsetof(tdm_kvx_event, reason))
            return tdm__kvx_fail(TDM_E_INVAL, "events[0].struct_size too small (use tdm_kvx_event_init)");
        stride = events[0].struct_size;
    }
    pthread_mutex_lock(&k->mu);
    if (!k->ev_head && timeout_ms != 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        if (timeout_ms > 0) {
            ts.tv_sec += timeout_ms / 1000;
            ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        }
        while (!k->ev_head) {
            int r = timeout_ms > 0 ? pthread_cond_timedwait(&k->cond, &k->mu, &ts)
                                   : pthread_cond_wait(&k->cond, &k->mu);
            if (r == ETIMEDOUT) break;
        }
    }
    uint32_t got = 0;
    while (got < max && k->ev_head) {
        kvx_event_node *e = k->ev_head;
        k->ev_head = e->next;
        if (!k->ev_head) k->ev_tail = &k->ev_head;
        k->ev_count--;
        uint8_t *dst = (uint8_t *)events + (size_t)got * stride;
        e->ev.struct_size = (uint32_t)TDM_MIN(stride, sizeof(tdm_kvx_event));
        memcpy(dst, &e->ev, TDM_MIN(stride, sizeof(tdm_kvx_event)));
        tdm__free(e);
        got++;
    }
    if (!k->ev_head) {
        uint64_t v;
        ssize_t r = read(k->ev_fd, &v, sizeof(v));
        (void)r;
    }
    pthread_mutex_unlock(&k->mu);
    *n = got;
    return TDM_OK;
}

int tdm_kvx_get_stats(tdm_kvx *k, tdm_kvx_stats *s)
{
    if (!k || !TDM_STRUCT_OK(s, offsetof(tdm_kvx_stats, transfers_cancelled) + sizeof(uint64_t)))
        return tdm__kvx_fail(TDM_E_INVAL, "NULL argument or struct_size too small");
    pthread_mutex_lock(&k->mu);
    tdm_kvx_stats st = k->st;
    st.num_peers = st.num_send_active = st.num_recv_active = st.num_reserved_blocks = 0;
    for (uint32_t i = 0; i < k->num_peers; i++) st.num_peers += k->peers[i].state == PEER_ALIVE;
    for (kvx_xfer *x = k->xfers; x; x = x->next) {
        if (x->side == TDM_KVX_SIDE_SEND) st.num_send_active++;
        else st.num_recv_active++;
    }
    if (k->owner)
        for (uint32_t b = 0; b < k->layout.num_blocks; b++) st.num_reserved_blocks += k->owner[b] != 0;
    st.num_queued_events = k->ev_count;
    pthread_mutex_unlock(&k->mu);
    uint32_t sz = s->struct_size;
    st.struct_size = (uint32_t)TDM_MIN(sz, sizeof(st));
    memcpy(s, &st, TDM_MIN(sz, sizeof(st)));
    return TDM_OK;
}
