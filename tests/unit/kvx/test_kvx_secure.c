/*
 * test_kvx_secure.c -- what a peer or a client can make the engine open, create or delete.
 * A configured ipc:// path that exists (a regular file, someone else's socket) is refused and
 * left as it was; only the engine's own socket is removed on destroy, and not once the path
 * holds something else. A raw ZeroMQ peer naming a foreign /dev/shm object in its HELLO (any
 * name, an engine-like name with the wrong size or mode) is refused and the object keeps its
 * name and every byte; a same-user segment of the right shape is only mapped read-only (its
 * bytes unchanged after a transfer), the engine's own segment carries the chunks it sends and
 * leaves /dev/shm once the peer has mapped it; a server's HELLO_ACK naming a foreign object
 * fails tdm_kvx_connect with it intact. Start-up sweeps the segments and private ipc
 * directories of dead owners and nothing else.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <zmq.h>

#include "kvx_testutil.h"
#include "../../../kv_transfer/kvx_internal.h"

#define WITH_SHM (TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_SHM)
#define SLOT 16384u

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int file_is(const char *path, const char *text)
{
    char buf[256] = "";
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strcmp(buf, text) == 0;
}

/* A unix stream socket bound at path (not listening); returns its descriptor. */
static int bind_unix(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

static void secure__existing_ipc_path_is_refused_and_left_alone(void **state)
{
    (void)state;
    char path[128], ep[160];
    tdm_kvx_config c;
    tdm_kvx *k = NULL;
    /* a regular file */
    snprintf(path, sizeof(path), "/tmp/tdm-kvx-test-%d-precious", (int)getpid());
    write_file(path, "precious data\n");
    snprintf(ep, sizeof(ep), "ipc://%s", path);
    t_config(&c, "e", TDM_KVX_ROLE_BOTH, ep);
    assert_int_equal(tdm_kvx_create(&c, &k), TDM_E_EXISTS);
    assert_null(k);
    assert_non_null(strstr(tdm_kvx_errmsg(NULL), "already exists"));
    assert_non_null(strstr(tdm_kvx_errmsg(NULL), "regular file"));
    tdm_kvx_destroy(k);
    assert_true(file_is(path, "precious data\n"));
    unlink(path);

    /* someone else's listening socket */
    snprintf(path, sizeof(path), "/tmp/tdm-kvx-test-%d-other.sock", (int)getpid());
    int fd = bind_unix(path);
    assert_int_equal(listen(fd, 1), 0);
    struct stat before, after;
    assert_int_equal(lstat(path, &before), 0);
    snprintf(ep, sizeof(ep), "ipc://%s", path);
    t_config(&c, "e", TDM_KVX_ROLE_BOTH, ep);
    assert_int_equal(tdm_kvx_create(&c, &k), TDM_E_EXISTS);
    assert_non_null(strstr(tdm_kvx_errmsg(NULL), "a socket"));
    assert_int_equal(lstat(path, &after), 0);
    assert_true(S_ISSOCK(after.st_mode) && after.st_ino == before.st_ino);
    close(fd);
    unlink(path);

    /* our own socket: created, usable, removed on destroy */
    snprintf(path, sizeof(path), "/tmp/tdm-kvx-test-%d-own.sock", (int)getpid());
    snprintf(ep, sizeof(ep), "ipc://%s", path);
    eng p, d;
    t_engine(&p, "p", TDM_KVX_ROLE_PREFILL, ep, TDM_KVX_TRANSPORT_ZMQ, 1);
    assert_int_equal(lstat(path, &after), 0);
    assert_true(S_ISSOCK(after.st_mode));
    t_engine(&d, "d", TDM_KVX_ROLE_DECODE, NULL, TDM_KVX_TRANSPORT_ZMQ, 2);
    uint32_t peer;
    assert_int_equal(tdm_kvx_connect(d.kvx, ep, NULL, &peer), TDM_OK);
    t_free(&d);
    t_free(&p);
    assert_int_equal(lstat(path, &after), -1);
    assert_int_equal(errno, ENOENT);

    /* our socket replaced by a file while we run: the file survives destroy */
    t_engine(&p, "p", TDM_KVX_ROLE_PREFILL, ep, TDM_KVX_TRANSPORT_ZMQ, 1);
    assert_int_equal(unlink(path), 0);
    write_file(path, "moved in\n");
    t_free(&p);
    assert_true(file_is(path, "moved in\n"));
    unlink(path);

    /* the abstract namespace has no file; the wildcard binds in a directory of the engine's own */
    snprintf(ep, sizeof(ep), "ipc://@tdm-kvx-test-%d", (int)getpid());
    t_config(&c, "e", TDM_KVX_ROLE_BOTH, ep);
    assert_int_equal(tdm_kvx_create(&c, &k), TDM_OK);
    tdm_kvx_destroy(k);
    t_config(&c, "e", TDM_KVX_ROLE_BOTH, "ipc://*");
    assert_int_equal(tdm_kvx_create(&c, &k), TDM_OK);
    char got[256];
    assert_int_equal(tdm_kvx_get_endpoint(k, got, sizeof(got)), TDM_OK);
    assert_true(strncmp(got, "ipc:///", 7) == 0);
    assert_non_null(strstr(got, "/tdm-kvx-"));
    assert_int_equal(lstat(got + 6, &after), 0);
    assert_true(S_ISSOCK(after.st_mode));
    char dir[256];
    snprintf(dir, sizeof(dir), "%s", got + 6);
    *strrchr(dir, '/') = '\0';
    assert_int_equal(lstat(dir, &after), 0);
    assert_true(S_ISDIR(after.st_mode));
    assert_int_equal(after.st_mode & 0777, 0700);
    t_engine(&d, "d", TDM_KVX_ROLE_DECODE, NULL, TDM_KVX_TRANSPORT_ZMQ, 2);
    assert_int_equal(tdm_kvx_register(k, &d.lay, d.bases, TDM_MEM_HOST, 0), TDM_OK);
    assert_int_equal(tdm_kvx_connect(d.kvx, got, NULL, &peer), TDM_OK);
    t_free(&d);
    tdm_kvx_destroy(k);
    assert_int_equal(lstat(got + 6, &after), -1);
    assert_int_equal(lstat(dir, &after), -1);   /* directory gone too */
}

/* ---- a raw peer ------------------------------------------------------------------------- */

typedef struct raw {
    void *ctx, *sock;
} raw;

static void raw_open(raw *r, eng *e)
{
    char ep[256];
    assert_int_equal(tdm_kvx_get_endpoint(e->kvx, ep, sizeof(ep)), TDM_OK);
    r->ctx = zmq_ctx_new();
    r->sock = zmq_socket(r->ctx, ZMQ_DEALER);
    int zero = 0, timeo = 5000;
    zmq_setsockopt(r->sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(r->sock, ZMQ_RCVTIMEO, &timeo, sizeof(timeo));
    assert_int_equal(zmq_connect(r->sock, ep), 0);
}

static void raw_close(raw *r)
{
    zmq_close(r->sock);
    zmq_ctx_term(r->ctx);
}

static void raw_send(raw *r, const tdm__kvx_msg *m)
{
    uint8_t buf[TDM__KVX_MAX_HEADER];
    size_t len;
    assert_int_equal(tdm__kvx_msg_encode(m, buf, sizeof(buf), &len), TDM_OK);
    assert_true(zmq_send(r->sock, buf, len, 0) >= 0);
}

/* The next message that is not a PING (its payload frame, if any, is dropped). */
static tdm__kvx_msg raw_recv(raw *r)
{
    static uint8_t buf[TDM__KVX_MAX_HELLO];
    tdm__kvx_msg m;
    for (;;) {
        int n = zmq_recv(r->sock, buf, sizeof(buf), 0);
        if (n < 0) fail_msg("raw peer: nothing received");
        int more = 0;
        size_t ml = sizeof(more);
        zmq_getsockopt(r->sock, ZMQ_RCVMORE, &more, &ml);
        while (more) {
            uint8_t junk[16];
            zmq_recv(r->sock, junk, sizeof(junk), 0);
            zmq_getsockopt(r->sock, ZMQ_RCVMORE, &more, &ml);
        }
        char why[128];
        assert_int_equal(tdm__kvx_msg_decode(buf, (size_t)n, &m, why, sizeof(why)), TDM_OK);
        if (m.type != TDM__KVX_PING) return m;
    }
}

static tdm__kvx_msg hello_for(eng *e, uint32_t role, const char *shm, uint64_t shm_size)
{
    tdm__kvx_msg m;
    tdm__kvx_msg_init(&m, TDM__KVX_HELLO);
    snprintf(m.hello.engine_id, sizeof(m.hello.engine_id), "raw");
    m.hello.role = role;
    m.hello.layout = e->lay;
    m.hello.transports = WITH_SHM;
    snprintf(m.hello.host_id, sizeof(m.hello.host_id), "%s", e->kvx->host_id);   /* the same host */
    if (shm) {
        snprintf(m.hello.shm_name, sizeof(m.hello.shm_name), "%s", shm);
        m.hello.shm_size = shm_size;
        m.hello.slot_bytes = SLOT;
    }
    return m;
}

/* A victim segment of size bytes filled with a pattern, with the given mode. */
static void victim_make(const char *name, size_t size, mode_t mode)
{
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    assert_int_equal(fchmod(fd, mode), 0);
    uint8_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(m != MAP_FAILED);
    for (size_t i = 0; i < size; i++) m[i] = (uint8_t)(i * 7 + 3);
    munmap(m, size);
    close(fd);
}

/* 1 when the victim still exists with its size and every byte. */
static int victim_intact(const char *name, size_t size)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0) return 0;
    struct stat st;
    int ok = fstat(fd, &st) == 0 && (size_t)st.st_size == size;
    const uint8_t *m = ok ? mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (m == MAP_FAILED) return 0;
    for (size_t i = 0; ok && i < size; i++) ok = m[i] == (uint8_t)(i * 7 + 3);
    munmap((void *)m, size);
    return ok;
}

static void engine_name(char *buf, size_t n, const char *tag)
{
    struct stat st;
    unsigned long long ns = stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long long)st.st_ino : 0;
    static unsigned seq;
    snprintf(buf, n, "/tdm-kvx-%llu-%d-%s-%016x", ns, (int)getpid(), tag, 0xabc000u + seq++);
}

/* An engine with SLOT-byte chunks (the shared-memory slot size) over the default cache. */
static void slot_engine(eng *e, const char *id, const char *ep, uint64_t seed)
{
    tdm_kvx_config c;
    t_config(&c, id, TDM_KVX_ROLE_BOTH, ep);
    c.max_chunk_bytes = SLOT;
    t_engine_default_cache(e, &c, seed);
}

static void expect_refused(eng *e, const tdm__kvx_msg *hello, const char *what)
{
    raw r;
    raw_open(&r, e);
    raw_send(&r, hello);
    tdm__kvx_msg a = raw_recv(&r);
    assert_int_equal(a.type, TDM__KVX_HELLO_ACK);
    assert_int_equal(a.status, TDM_E_PROTOCOL);
    if (!strstr(a.reason, what)) fail_msg("reason '%s' lacks '%s'", a.reason, what);
    assert_string_equal(a.hello.shm_name, "");
    assert_int_equal(t_stats(e).num_peers, 0);
    raw_close(&r);
}

/* A victim segment (size bytes, mode) named in a HELLO that offers hello_size bytes: refused
 * for `what`, the victim intact; then removed. */
static void victim_in_hello_refused(eng *e, const char *victim, size_t size, mode_t mode, uint64_t hello_size,
                                    const char *what)
{
    victim_make(victim, size, mode);
    tdm__kvx_msg h = hello_for(e, TDM_KVX_ROLE_BOTH, victim, hello_size);
    expect_refused(e, &h, what);
    assert_true(victim_intact(victim, size));
    shm_unlink(victim);
}

static void secure__hello_naming_a_foreign_segment_is_refused_victim_intact(void **state)
{
    (void)state;
    const size_t vsize = 64 * SLOT;
    eng p;
    slot_engine(&p, "server", "tcp://127.0.0.1:*", 5);

    /* the attack of issue 11: any name, the victim's size */
    char victim[TDM__KVX_ID_LEN];
    snprintf(victim, sizeof(victim), "/tdm-test-victim-%d", (int)getpid());
    victim_in_hello_refused(&p, victim, vsize, 0600, vsize, "engine-generated");

    /* an engine-like name, but the size differs from the HELLO's */
    engine_name(victim, sizeof(victim), "tx0");
    victim_in_hello_refused(&p, victim, vsize + 4096, 0600, vsize, "bytes");

    /* an engine-like name and size, readable by others: not an engine's segment */
    engine_name(victim, sizeof(victim), "tx1");
    victim_in_hello_refused(&p, victim, vsize, 0644, vsize, "mode");

    /* a FIFO under an engine-like name: refused at once, not waited on */
    engine_name(victim, sizeof(victim), "tx3");
    char fifo[96];
    snprintf(fifo, sizeof(fifo), "/dev/shm%s", victim);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    tdm__kvx_msg h = hello_for(&p, TDM_KVX_ROLE_BOTH, victim, vsize);
    expect_refused(&p, &h, "not a shared-memory object");
    struct stat fst;
    assert_int_equal(lstat(fifo, &fst), 0);
    assert_true(S_ISFIFO(fst.st_mode));
    unlink(fifo);

    /* an engine-like name and size, mode 0600, but another user's (root can open it) */
    if (geteuid() == 0) {
        engine_name(victim, sizeof(victim), "tx4");
        victim_make(victim, vsize, 0600);
        int fd = shm_open(victim, O_RDWR, 0);
        assert_true(fd >= 0);
        assert_int_equal(fchown(fd, 65534, 65534), 0);
        close(fd);
        h = hello_for(&p, TDM_KVX_ROLE_BOTH, victim, vsize);
        expect_refused(&p, &h, "uid");
        assert_true(victim_intact(victim, vsize));
        shm_unlink(victim);
    } else {
        print_message("not root: the other user's segment case is skipped\n");
    }

    /* a shared KV offer naming the victim, with the wrong size */
    engine_name(victim, sizeof(victim), "kv");
    size_t lbytes = p.layer_bytes;
    victim_make(victim, lbytes * T_LAYERS + 4096, 0600);
    h = hello_for(&p, TDM_KVX_ROLE_BOTH, NULL, 0);
    snprintf(h.hello.kv_name, sizeof(h.hello.kv_name), "%s", victim);
    h.hello.kv_size = lbytes * T_LAYERS;
    h.hello.kv_layers = T_LAYERS;
    for (uint32_t i = 0; i < T_LAYERS; i++) h.hello.kv_off[i] = i * lbytes;
    expect_refused(&p, &h, "bytes");
    assert_true(victim_intact(victim, lbytes * T_LAYERS + 4096));
    shm_unlink(victim);
    assert_int_equal(t_stats(&p).num_peers, 0);
    t_free(&p);
}

static void secure__peer_segment_only_read_own_segment_carries_data(void **state)
{
    (void)state;
    const size_t vsize = 64 * SLOT;
    eng p;
    slot_engine(&p, "server", "tcp://127.0.0.1:*", 9);
    /* a same-user segment of the right shape: accepted, but only ever read */
    char seg[TDM__KVX_ID_LEN];
    engine_name(seg, sizeof(seg), "tx2");
    victim_make(seg, vsize, 0600);
    raw r;
    raw_open(&r, &p);
    tdm__kvx_msg h = hello_for(&p, TDM_KVX_ROLE_BOTH, seg, vsize);
    raw_send(&r, &h);
    tdm__kvx_msg a = raw_recv(&r);
    assert_int_equal(a.type, TDM__KVX_HELLO_ACK);
    if (a.status) fail_msg("refused: %s", a.reason);
    assert_true(a.hello.transports & TDM_KVX_TRANSPORT_SHM);   /* ours is mapped */
    assert_int_equal(tdm__kvx_shm_name_parse(a.hello.shm_name, 't', NULL, NULL), 1);
    assert_int_equal(a.hello.slot_bytes, SLOT);
    /* map the server's segment read-only, as a client must, before sending anything */
    int fd = shm_open(a.hello.shm_name, O_RDONLY, 0);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal((uint64_t)st.st_size, a.hello.shm_size);
    assert_int_equal(st.st_mode & 0777, 0600);
    const uint8_t *sm = mmap(NULL, a.hello.shm_size, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(sm != MAP_FAILED);
    close(fd);
    /* pull 4 blocks */
    uint32_t src[4] = { 3, 17, 8, 60 };
    tdm_kvx_send_desc sd;
    t_send_desc(&sd, 7, src, 4, 4);
    uint64_t sh;
    assert_int_equal(tdm_kvx_send(p.kvx, &sd, &sh), TDM_OK);
    tdm__kvx_msg q;
    tdm__kvx_msg_init(&q, TDM__KVX_XFER_REQ);
    q.rid = 7;
    q.xid = 1;
    q.mode = TDM_KVX_PULL;
    q.num_blocks = 4;
    q.num_tokens = 4 * T_BS;
    raw_send(&r, &q);
    size_t unit = (size_t)2 * T_BS * T_HEADS * T_DIM * 2;
    uint64_t units = 0, bytes = 0;
    uint8_t want[SLOT];
    while (units < 4u * T_LAYERS) {
        tdm__kvx_msg m = raw_recv(&r);
        assert_int_equal(m.type, TDM__KVX_DATA);
        assert_true(m.slot < a.hello.shm_size / SLOT);
        assert_int_equal(m.nbytes, (uint64_t)(m.layer_end - m.layer_begin) * m.block_count * unit);
        assert_int_equal(tdm_kv_pack(&p.lay, p.bases, src + m.block_begin, m.block_count, m.layer_begin, m.layer_end,
                                     want, sizeof(want)), TDM_OK);
        assert_memory_equal(sm + (size_t)m.slot * SLOT, want, m.nbytes);
        units += (uint64_t)(m.layer_end - m.layer_begin) * m.block_count;
        bytes += m.nbytes;
        tdm__kvx_msg cr;
        tdm__kvx_msg_init(&cr, TDM__KVX_CREDIT);
        cr.slot = m.slot;
        raw_send(&r, &cr);
    }
    tdm__kvx_msg dn;
    tdm__kvx_msg_init(&dn, TDM__KVX_DONE);
    dn.rid = 7;
    dn.xid = 1;
    dn.nbytes = bytes;
    raw_send(&r, &dn);
    tdm_kvx_event ev = t_wait(&p);
    assert_int_equal(ev.type, TDM_KVX_EV_DONE);
    assert_int_equal(t_stats(&p).chunks_sent_shm, t_stats(&p).chunks_sent);
    /* the server's name left /dev/shm once we had spoken after its ACK */
    errno = 0;
    assert_int_equal(shm_open(a.hello.shm_name, O_RDONLY, 0), -1);
    assert_int_equal(errno, ENOENT);
    /* ours was read at most: same name, same bytes */
    assert_true(victim_intact(seg, vsize));
    munmap((void *)sm, a.hello.shm_size);
    raw_close(&r);
    t_free(&p);
    assert_true(victim_intact(seg, vsize));   /* the engine never unlinks what it did not create */
    shm_unlink(seg);
}

/* A raw server: answers one HELLO with the ACK in *arg (its host id and layout copied from
 * the HELLO), then waits for the client to go. */
typedef struct fake_srv {
    void *ctx, *sock;
    tdm__kvx_msg ack;
} fake_srv;

static void *fake_server(void *arg)
{
    fake_srv *f = arg;
    static uint8_t buf[TDM__KVX_MAX_HELLO];
    uint8_t rtid[256];
    int rl = zmq_recv(f->sock, rtid, sizeof(rtid), 0);
    int n = zmq_recv(f->sock, buf, sizeof(buf), 0);
    tdm__kvx_msg h;
    if (rl <= 0 || n <= 0 || tdm__kvx_msg_decode(buf, (size_t)n, &h, NULL, 0) != TDM_OK) return NULL;
    f->ack.hello.layout = h.hello.layout;
    snprintf(f->ack.hello.host_id, sizeof(f->ack.hello.host_id), "%s", h.hello.host_id);
    size_t len;
    if (tdm__kvx_msg_encode(&f->ack, buf, sizeof(buf), &len) != TDM_OK) return NULL;
    zmq_send(f->sock, rtid, (size_t)rl, ZMQ_SNDMORE);
    zmq_send(f->sock, buf, len, 0);
    return NULL;
}

/* tdm_kvx_connect to a raw server whose ACK names shm (size bytes); returns its status. */
static int connect_to_fake(const char *shm, uint64_t size, char *why, size_t why_len)
{
    fake_srv f;
    f.ctx = zmq_ctx_new();
    f.sock = zmq_socket(f.ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(f.sock, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_bind(f.sock, "tcp://127.0.0.1:*"), 0);
    char ep[128];
    size_t el = sizeof(ep);
    zmq_getsockopt(f.sock, ZMQ_LAST_ENDPOINT, ep, &el);
    tdm__kvx_msg_init(&f.ack, TDM__KVX_HELLO_ACK);
    snprintf(f.ack.hello.engine_id, sizeof(f.ack.hello.engine_id), "fake-server");
    f.ack.hello.role = TDM_KVX_ROLE_BOTH;
    f.ack.hello.transports = WITH_SHM;
    snprintf(f.ack.hello.shm_name, sizeof(f.ack.hello.shm_name), "%s", shm);
    f.ack.hello.shm_size = size;
    f.ack.hello.slot_bytes = SLOT;
    eng d;
    slot_engine(&d, "client", NULL, 3);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fake_server, &f), 0);
    uint32_t peer;
    int rc = tdm_kvx_connect(d.kvx, ep, NULL, &peer);
    snprintf(why, why_len, "%s", tdm_kvx_errmsg(d.kvx));
    pthread_join(th, NULL);
    t_free(&d);
    zmq_close(f.sock);
    zmq_ctx_term(f.ctx);
    return rc;
}

/* A victim segment (size bytes, mode) named in a raw server's ACK offering ack_size bytes:
 * tdm_kvx_connect fails for `what`, the victim intact; then removed. */
static void victim_in_ack_refused(const char *victim, size_t size, mode_t mode, uint64_t ack_size,
                                  const char *what)
{
    char why[256];
    victim_make(victim, size, mode);
    assert_int_equal(connect_to_fake(victim, ack_size, why, sizeof(why)), TDM_E_PROTOCOL);
    assert_non_null(strstr(why, what));
    assert_true(victim_intact(victim, size));
    shm_unlink(victim);
}

static void secure__ack_naming_a_foreign_segment_fails_connect_victim_intact(void **state)
{
    (void)state;
    const size_t vsize = 8 * SLOT;
    char victim[TDM__KVX_ID_LEN];
    snprintf(victim, sizeof(victim), "/tdm-test-victim-%d", (int)getpid());
    victim_in_ack_refused(victim, vsize, 0600, vsize, "malformed HELLO_ACK");
    engine_name(victim, sizeof(victim), "tx5");
    victim_in_ack_refused(victim, vsize, 0640, vsize, "mode");
    engine_name(victim, sizeof(victim), "tx6");
    victim_in_ack_refused(victim, vsize, 0600, 2 * vsize, "bytes");
}

static void secure__startup_sweeps_dead_owners_segments_only(void **state)
{
    (void)state;
    pid_t dead = fork();
    assert_true(dead >= 0);
    if (dead == 0) _exit(0);
    assert_int_equal(waitpid(dead, NULL, 0), dead);
    struct stat st;
    unsigned long long ns = stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long long)st.st_ino : 0;
    char stale[96], stale_kv[96], live[96], other_ns[96], foreign[96];
    snprintf(stale, sizeof(stale), "/tdm-kvx-%llu-%d-tx0-00000000000000aa", ns, (int)dead);
    snprintf(stale_kv, sizeof(stale_kv), "/tdm-kvx-%llu-%d-kv-00000000000000ab", ns, (int)dead);
    snprintf(live, sizeof(live), "/tdm-kvx-%llu-%d-tx0-00000000000000ac", ns, (int)getppid());
    snprintf(other_ns, sizeof(other_ns), "/tdm-kvx-%llu-%d-tx0-00000000000000ad", ns + 1, (int)dead);
    snprintf(foreign, sizeof(foreign), "/tdm-kvx-%d-not-ours", (int)dead);
    const char *all[] = { stale, stale_kv, live, other_ns, foreign };
    for (int i = 0; i < 5; i++) victim_make(all[i], 4096, 0600);
    /* private ipc directories: a dead owner's (with its socket), a live one's, a dead owner's
     * holding something else than the engine's socket */
    const char *t = getenv("TMPDIR");
    const char *tmp = t && t[0] == '/' && strlen(t) < 64 ? t : "/tmp";
    char ddead[80], dlive[80], dother[80], sock[100], other[100];
    snprintf(ddead, sizeof(ddead), "%s/tdm-kvx-%d-XXXXXX", tmp, (int)dead);
    snprintf(dlive, sizeof(dlive), "%s/tdm-kvx-%d-XXXXXX", tmp, (int)getppid());
    snprintf(dother, sizeof(dother), "%s/tdm-kvx-%d-XXXXXX", tmp, (int)dead);
    assert_non_null(mkdtemp(ddead));
    assert_non_null(mkdtemp(dlive));
    assert_non_null(mkdtemp(dother));
    snprintf(sock, sizeof(sock), "%s/kvx.sock", ddead);
    close(bind_unix(sock));
    snprintf(other, sizeof(other), "%s/kvx.sock", dother);
    write_file(other, "not a socket\n");
    tdm_kvx_config c;
    t_config(&c, "sweeper", TDM_KVX_ROLE_BOTH, NULL);
    tdm_kvx *k;
    assert_int_equal(tdm_kvx_create(&c, &k), TDM_OK);
    assert_int_equal(lstat(ddead, &st), -1);      /* swept, socket and all */
    assert_int_equal(lstat(dlive, &st), 0);
    assert_true(file_is(other, "not a socket\n"));
    unlink(other);
    rmdir(dother);
    rmdir(dlive);
    assert_false(victim_intact(stale, 4096));
    assert_false(victim_intact(stale_kv, 4096));
    assert_true(victim_intact(live, 4096));       /* its owner runs */
    assert_true(victim_intact(other_ns, 4096));   /* another pid namespace: not ours to judge */
    assert_true(victim_intact(foreign, 4096));    /* not an engine's name */
    tdm_kvx_destroy(k);
    for (int i = 0; i < 5; i++) shm_unlink(all[i]);
}

/* ---- peer slots: no source takes them all (issue 26) --------------------------------------- */

/* n raw peers connecting from source address src (a 127.0.0.x) send a HELLO (zmq transport
 * only) each; returns how many were accepted, and counts the refusals for lack of a slot. */
static int flood(eng *e, void *ctx, void **socks, int n, const char *src, int *no_space)
{
    char ep[256], conn[300];
    assert_int_equal(tdm_kvx_get_endpoint(e->kvx, ep, sizeof(ep)), TDM_OK);
    snprintf(conn, sizeof(conn), "tcp://%s:0;%s", src, ep + 6);   /* source;destination */
    int zero = 0, timeo = 5000, ok = 0;
    *no_space = 0;
    for (int i = 0; i < n; i++) {
        socks[i] = zmq_socket(ctx, ZMQ_DEALER);
        zmq_setsockopt(socks[i], ZMQ_LINGER, &zero, sizeof(zero));
        zmq_setsockopt(socks[i], ZMQ_RCVTIMEO, &timeo, sizeof(timeo));
        assert_int_equal(zmq_connect(socks[i], conn), 0);
        tdm__kvx_msg h = hello_for(e, TDM_KVX_ROLE_BOTH, NULL, 0);
        h.hello.transports = TDM_KVX_TRANSPORT_ZMQ;
        snprintf(h.hello.engine_id, sizeof(h.hello.engine_id), "flood%d", i);
        raw r = {ctx, socks[i]};
        raw_send(&r, &h);
    }
    for (int i = 0; i < n; i++) {
        raw r = {ctx, socks[i]};
        tdm__kvx_msg a = raw_recv(&r);
        assert_int_equal(a.type, TDM__KVX_HELLO_ACK);
        if (a.status == TDM_OK) ok++;
        else if (a.status == TDM_E_NO_SPACE) (*no_space)++;
    }
    return ok;
}

static void flood_close(void *ctx, void **socks, int n)
{
    for (int i = 0; i < n; i++) zmq_close(socks[i]);
    zmq_ctx_term(ctx);
}

/* The engine the floods aim at: tcp on loopback, zmq transport only. */
static void flood_server(eng *p)
{
    tdm_kvx_config c;
    t_config(&c, "server", TDM_KVX_ROLE_BOTH, "tcp://127.0.0.1:*");
    c.transports = TDM_KVX_TRANSPORT_ZMQ;
    t_engine_default_cache(p, &c, 7);
}

/* A legitimate engine d (from 127.0.0.1) connects to p: must succeed. */
static void other_peer_connects(eng *p, eng *d)
{
    char ep[256];
    uint32_t peer;
    assert_int_equal(tdm_kvx_get_endpoint(p->kvx, ep, sizeof(ep)), TDM_OK);
    t_engine(d, "d", TDM_KVX_ROLE_DECODE, NULL, TDM_KVX_TRANSPORT_ZMQ, 8);
    int rc = tdm_kvx_connect(d->kvx, ep, NULL, &peer);
    if (rc) fail_msg("connect: %s", tdm_kvx_errmsg(d->kvx));
}

static void secure__one_source_cannot_take_every_peer_slot(void **state)
{
    (void)state;
    eng p, d;
    flood_server(&p);
    void *ctx = zmq_ctx_new(), *socks[256];
    int no_space;
    /* 256 peers from 127.0.0.2: the default cap is 64 per source */
    assert_int_equal(flood(&p, ctx, socks, 256, "127.0.0.2", &no_space), 64);
    assert_int_equal(no_space, 192);
    assert_int_equal(p.kvx->peers_refused, 192);
    other_peer_connects(&p, &d);   /* a peer from another source still gets a slot */
    flood_close(ctx, socks, 256);
    t_free(&d);
    t_free(&p);
}

static void secure__slot_of_a_peer_that_never_transfers_is_reclaimed(void **state)
{
    (void)state;
    eng p, d;
    flood_server(&p);
    pthread_mutex_lock(&p.kvx->mu);   /* as the JSON keys of tdm_kvx_create_json */
    p.kvx->lim.max_peers_per_source = 256;
    p.kvx->lim.peer_idle_ms = 100;
    pthread_mutex_unlock(&p.kvx->mu);
    void *ctx = zmq_ctx_new(), *socks[256];
    int no_space;
    assert_int_equal(flood(&p, ctx, socks, 256, "127.0.0.2", &no_space), 256);   /* every slot */
    t_sleep_ms(300);   /* past peer_idle_ms, before peer_timeout_ms (2 s) ends them anyway */
    other_peer_connects(&p, &d);
    assert_int_equal(p.kvx->peers_reclaimed, 1);
    assert_int_equal(t_stats(&p).num_peers, 256);   /* one gave its slot to d */
    flood_close(ctx, socks, 256);
    t_free(&d);
    t_free(&p);
}

static void secure__peer_limits_are_json_settings(void **state)
{
    (void)state;
    tdm_kvx *k = NULL;
    assert_int_equal(tdm_kvx_create_json("{\"engine_id\": \"j\", \"max_peers_per_source\": 3, "
                                         "\"max_peers_per_key\": 2, \"peer_idle_ms\": 500, "
                                         "\"nixl_require_curve\": true}", &k), TDM_OK);
    assert_int_equal(k->lim.max_peers_per_source, 3);
    assert_int_equal(k->lim.max_peers_per_key, 2);
    assert_int_equal(k->lim.peer_idle_ms, 500);
    assert_int_equal(k->lim.nixl_require_curve, 1);
    tdm_kvx_destroy(k);
    assert_int_equal(tdm_kvx_create_json("{\"engine_id\": \"j\"}", &k), TDM_OK);
    assert_int_equal(k->lim.max_peers_per_source, 64);   /* the defaults */
    assert_int_equal(k->lim.peer_idle_ms, 10000);
    assert_int_equal(k->lim.nixl_require_curve, 0);
    tdm_kvx_destroy(k);
    k = NULL;
    assert_int_equal(tdm_kvx_create_json("{\"engine_id\": \"j\", \"nixl_require_curve\": 1}", &k),
                     TDM_E_CONFIG);
    assert_null(k);
    assert_non_null(strstr(tdm_kvx_errmsg(NULL), "nixl_require_curve"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(secure__existing_ipc_path_is_refused_and_left_alone),
        cmocka_unit_test(secure__hello_naming_a_foreign_segment_is_refused_victim_intact),
        cmocka_unit_test(secure__peer_segment_only_read_own_segment_carries_data),
        cmocka_unit_test(secure__ack_naming_a_foreign_segment_fails_connect_victim_intact),
        cmocka_unit_test(secure__startup_sweeps_dead_owners_segments_only),
        cmocka_unit_test(secure__one_source_cannot_take_every_peer_slot),
        cmocka_unit_test(secure__slot_of_a_peer_that_never_transfers_is_reclaimed),
        cmocka_unit_test(secure__peer_limits_are_json_settings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
