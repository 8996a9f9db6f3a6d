/*
 * kv_bench.c -- throughput of the KV data path against baselines measured in the same run:
 * pack and unpack (tdm_kv_pack / tdm_kv_unpack over a paged cache) and the shared-memory
 * transfer against memcpy of the same bytes (the prefill cache lives in a tdm_kvx_alloc_shared
 * segment, so the receiver copies blocks directly; KV_BENCH_NO_DIRECT=1 measures the
 * pack -> slot -> unpack path instead); transfers between two engines over ZeroMQ ipc
 * and tcp (pack, send, receive, unpack, acknowledgement) against raw ZeroMQ moving the same
 * bytes in messages of the same size over the same transport. Transfer sizes 16 MiB to
 * 1 GiB (fewer repetitions for big ones; best of the repetitions is kept). The table comes
 * first; the last line is
 *   kv_bench pack_vs_memcpy=R unpack_vs_memcpy=R shm_vs_memcpy=R ipc_vs_zmq=R tcp_vs_zmq=R
 * where each R is the geometric mean over the sizes of Tandem's throughput / the baseline's,
 * followed by nixl_vs_memcpy=R nixl_thp_vs_memcpy=R: a transfer of 256 MiB (KV_BENCH_NIXL_MIB)
 * between two processes over NIXL (this binary re-executed as the prefill engine; the decode
 * engine READs its blocks), best of 6 after a warm-up, over memcpy of the same bytes on the
 * same kind of pages (best of 6 before and 6 after the transfers, so a quiet moment counts
 * for the baseline too); nixl_vs_memcpy on plain 4 KiB pages, nixl_thp_vs_memcpy with both
 * caches and the baseline's buffers on transparent huge pages (madvise, as numpy and torch
 * allocate large arrays; the amount actually backed by 2 MiB pages is printed)
 * (KV_BENCH_NIXL_PAGES=4k or thp: only that one; KV_BENCH_NIXL_BLOCKS=contiguous: blocks in
 * order on both ends, coalesced into large descriptors, instead of scattered). UCX_TLS is
 * printed (UCX's own choice when unset), and the decode engine's copying threads
 * (TANDEM_NIXL_THREADS, default min(4, CPUs): NIXL's UCX thread pool splits each READ across
 * them); the memcpy baseline is always one thread. Without NIXL (TANDEM_NIXL_DIR, or the wheel in
 * $TANDEM_BUILD/venv-nixl from `make test-nixl`) it prints nixl_vs_memcpy=skipped and why.
 * It never fails on speed. Environment: KV_BENCH_MAX_MIB (default 1024) caps the sizes.
 */
#include <glob.h>
#include <sys/wait.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>

#include <zmq.h>

#include "tandem.h"

#define LAYERS 16
#define BS 16
#define HEADS 8
#define DIM 128
#define CHUNK (8u << 20)
/* shared memory: 4 slots of 4 MiB, a working set that stays in the shared L3 cache */
#define SHM_CHUNK (4u << 20)
#define SHM_SLOTS 4

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "kv_bench: %s failed: %s (%s)\n", what, tdm_strerror(rc), tdm_kvx_errmsg(NULL));
    exit(1);
}

typedef struct cache {
    tdm_kv_layout l;
    uint8_t *mem;
    int owned;
    void *bases[LAYERS];
} cache;

static size_t cache_bytes(uint32_t nblocks)
{
    tdm_kv_layout l;
    size_t lb;
    tdm_kv_layout_init(&l, TDM_KV_LAYOUT_VLLM_NHD, LAYERS, nblocks, BS, HEADS, DIM, TDM_DTYPE_FP16);
    tdm_kv_layout_layer_bytes(&l, &lb);
    return lb * LAYERS;
}

/* mem: the cache's memory (NULL: allocate) */
static void cache_init(cache *c, uint32_t nblocks, int seed, void *mem)
{
    if (tdm_kv_layout_init(&c->l, TDM_KV_LAYOUT_VLLM_NHD, LAYERS, nblocks, BS, HEADS, DIM, TDM_DTYPE_FP16))
        die("layout", TDM_E_INVAL);
    size_t lb;
    tdm_kv_layout_layer_bytes(&c->l, &lb);
    c->mem = mem ? mem : aligned_alloc(4096, lb * LAYERS);
    c->owned = mem == NULL;
    if (!c->mem) die("alloc", TDM_E_NOMEM);
    memset(c->mem, seed, lb * LAYERS);
    for (int i = 0; i < LAYERS; i++) c->bases[i] = c->mem + i * lb;
}

/* ---- raw ZeroMQ baseline --------------------------------------------------------------------- */

typedef struct rawsend {
    void *sock;
    const uint8_t *buf;
    size_t bytes;
} rawsend;

static void *raw_sender(void *arg)
{
    rawsend *r = arg;
    for (size_t off = 0; off < r->bytes; off += CHUNK) {
        size_t n = r->bytes - off < CHUNK ? r->bytes - off : CHUNK;
        if (zmq_send(r->sock, r->buf + off, n, 0) < 0) { perror("zmq_send"); break; }
    }
    return NULL;
}

/* Seconds to move bytes in CHUNK messages from a PUSH to a PULL socket over ep (two contexts,
 * as two engines have). */
static double raw_zmq(const char *ep_bind, const uint8_t *buf, size_t bytes)
{
    void *c1 = zmq_ctx_new(), *c2 = zmq_ctx_new();
    void *push = zmq_socket(c1, ZMQ_PUSH), *pull = zmq_socket(c2, ZMQ_PULL);
    char ep[256];
    size_t len = sizeof(ep);
    zmq_bind(push, ep_bind);
    zmq_getsockopt(push, ZMQ_LAST_ENDPOINT, ep, &len);
    zmq_connect(pull, ep);
    zmq_send(push, "x", 1, 0);   /* connected */
    zmq_msg_t m;
    zmq_msg_init(&m);
    zmq_msg_recv(&m, pull, 0);
    rawsend r = { push, buf, bytes };
    pthread_t t;
    double t0 = now();
    pthread_create(&t, NULL, raw_sender, &r);
    size_t got = 0;
    while (got < bytes) {
        if (zmq_msg_recv(&m, pull, 0) < 0) break;
        got += zmq_msg_size(&m);
    }
    double dt = now() - t0;
    pthread_join(t, NULL);
    zmq_msg_close(&m);
    int zero = 0;
    zmq_setsockopt(push, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(pull, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_close(push);
    zmq_close(pull);
    zmq_ctx_term(c1);
    zmq_ctx_term(c2);
    if (strncmp(ep, "ipc://", 6) == 0) unlink(ep + 6);
    return dt;
}

/* ---- Tandem engines --------------------------------------------------------------------------- */

typedef struct pairx {
    tdm_kvx *p, *d;
    uint32_t peer;
    uint64_t rid;
} pairx;

static void pair_create(pairx *x, const char *ep, uint32_t transports, uint32_t chunk, uint32_t slots)
{
    tdm_kvx_config c;
    tdm_kvx_config_init(&c);
    c.engine_id = "bench-prefill";
    c.role = TDM_KVX_ROLE_PREFILL;
    c.listen_endpoint = ep;
    c.transports = transports;
    c.max_chunk_bytes = chunk;
    c.shm_slots = slots;
    int rc;
    if ((rc = tdm_kvx_create(&c, &x->p))) die("create", rc);
    c.engine_id = "bench-decode";
    c.role = TDM_KVX_ROLE_DECODE;
    c.listen_endpoint = NULL;
    if ((rc = tdm_kvx_create(&c, &x->d))) die("create", rc);
}

static void pair_connect(pairx *x, cache *src, cache *dst)
{
    int rc;
    if ((rc = tdm_kvx_register(x->p, &src->l, src->bases, TDM_MEM_HOST, 0))) die("register", rc);
    if ((rc = tdm_kvx_register(x->d, &dst->l, dst->bases, TDM_MEM_HOST, 0))) die("register", rc);
    char real[256];
    tdm_kvx_get_endpoint(x->p, real, sizeof(real));
    if ((rc = tdm_kvx_connect(x->d, real, NULL, &x->peer))) die("connect", rc);
    x->rid = 1;
}

static void pair_close(pairx *x)
{
    tdm_kvx_destroy(x->d);
    tdm_kvx_destroy(x->p);
}

static tdm_kvx_event wait_ev(tdm_kvx *k)
{
    tdm_kvx_event ev;
    tdm_kvx_event_init(&ev);
    uint32_t n = 0;
    tdm_kvx_poll(k, &ev, 1, &n, 60000);
    if (n != 1 || ev.type != TDM_KVX_EV_DONE) {
        fprintf(stderr, "kv_bench: transfer did not complete: %s\n", n ? ev.reason : "timeout");
        exit(1);
    }
    return ev;
}

/* Seconds for one request of nb blocks: from the receiver's request to its DONE event. */
static double xfer(pairx *x, const uint32_t *ids, uint32_t nb)
{
    uint64_t h;
    int rc;
    tdm_kvx_send_desc sd;
    tdm_kvx_send_desc_init(&sd);
    sd.request_id = x->rid;
    sd.num_blocks = nb;
    sd.block_ids = ids;
    sd.num_blocks_ready = nb;
    if ((rc = tdm_kvx_send(x->p, &sd, &h))) die("send", rc);
    tdm_kvx_recv_desc rd;
    tdm_kvx_recv_desc_init(&rd);
    rd.peer = x->peer;
    rd.request_id = x->rid++;
    rd.num_blocks = nb;
    rd.block_ids = ids;
    double t0 = now();
    if ((rc = tdm_kvx_recv(x->d, &rd, &h))) die("recv", rc);
    wait_ev(x->d);
    double dt = now() - t0;
    wait_ev(x->p);
    return dt;
}

/* ---- NIXL between two processes ----------------------------------------------------------------- */

/* n bytes on 2 MiB bounds; thp: advise transparent huge pages before the first touch. */
static uint8_t *big_alloc(size_t n, int thp)
{
    size_t al = (size_t)2 << 20, sz = (n + al - 1) / al * al;
    uint8_t *p = aligned_alloc(al, sz);
    if (!p) die("alloc", TDM_E_NOMEM);
    if (thp) (void)madvise(p, sz, MADV_HUGEPAGE);   /* a hint: without THP, plain pages */
    return p;
}

/* MiB of this process's anonymous memory on huge pages (-1: unknown). */
static long anon_huge_mib(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb >> 10;
}

static double memcpy_best(uint8_t *dst, const uint8_t *src, size_t bytes, int reps, double best)
{
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        memcpy(dst, src, bytes);
        double t = now() - t0;
        if (t < best) best = t;
    }
    return best;
}

#define NIXL_REPS 6

static void nixl_config(tdm_kvx_config *c, const char *id, uint32_t role, const char *ep)
{
    tdm_kvx_config_init(c);
    c->engine_id = id;
    c->role = role;
    c->listen_endpoint = ep;
    c->transports = TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_NIXL;
    c->max_chunk_bytes = CHUNK;
    c->transfer_timeout_ms = 60000;
}

/* The blocks of a NIXL transfer: scattered (as the table's), or in order on both ends with
 * KV_BENCH_NIXL_BLOCKS=contiguous (the READ then coalesces them into a few large descriptors). */
static int nixl_contiguous(void)
{
    const char *v = getenv("KV_BENCH_NIXL_BLOCKS");
    return v && !strcmp(v, "contiguous");
}

static void nixl_ids(uint32_t *ids, uint32_t nb)
{
    for (uint32_t i = 0; i < nb; i++) ids[i] = nixl_contiguous() ? i : (i * 7919u) % nb;
    if (!nixl_contiguous() && nb % 7919u == 0) for (uint32_t i = 0; i < nb; i++) ids[i] = nb - 1 - i;
}

/* The prefill process: exports requests 1 .. NIXL_REPS + 1 of nb blocks, waits for them. */
static int nixl_child(const char *ep, uint32_t nb, int thp)
{
    tdm_kvx_config c;
    nixl_config(&c, "bench-nixl-prefill", TDM_KVX_ROLE_PREFILL, ep);
    tdm_kvx *k;
    if (tdm_kvx_create(&c, &k)) return 2;
    cache src;
    cache_init(&src, nb, 1, big_alloc(cache_bytes(nb), thp));
    if (tdm_kvx_register(k, &src.l, src.bases, TDM_MEM_HOST, 0)) return 3;
    uint32_t *ids = malloc(nb * sizeof(uint32_t));
    nixl_ids(ids, nb);
    for (uint64_t r = 1; r <= NIXL_REPS + 1; r++) {
        tdm_kvx_send_desc sd;
        tdm_kvx_send_desc_init(&sd);
        sd.request_id = r;
        sd.num_blocks = nb;
        sd.block_ids = ids;
        sd.num_blocks_ready = nb;
        uint64_t h;
        if (tdm_kvx_send(k, &sd, &h)) return 4;
    }
    for (int r = 0; r <= NIXL_REPS; r++) wait_ev(k);
    tdm_kvx_destroy(k);
    free(ids);
    free(src.mem);
    return 0;
}

/* Best seconds of NIXL_REPS transfers of nb blocks from a child process; 0 with why on failure. */
static double nixl_run(const char *self, uint32_t nb, int thp, long *huge_mib, char *why, size_t why_len)
{
    char ep[128];
    snprintf(ep, sizeof(ep), "ipc:///tmp/tdm-kvbench-nixl-%d", (int)getpid());
    tdm_kvx_config c;
    nixl_config(&c, "bench-nixl-decode", TDM_KVX_ROLE_DECODE, NULL);
    tdm_kvx *k;
    int rc = tdm_kvx_create(&c, &k);
    if (rc) { snprintf(why, why_len, "%s", tdm_kvx_errmsg(NULL)); return 0; }
    char nbs[32];
    snprintf(nbs, sizeof(nbs), "%u", nb);
    long huge0 = anon_huge_mib();
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, "--nixl-child", ep, nbs, thp ? "thp" : "4k", (char *)NULL);
        _exit(127);
    }
    cache dst;
    cache_init(&dst, nb, 2, big_alloc(cache_bytes(nb), thp));
    *huge_mib = huge0 < 0 ? -1 : anon_huge_mib() - huge0;   /* of our cache */
    if ((rc = tdm_kvx_register(k, &dst.l, dst.bases, TDM_MEM_HOST, 0))) die("register", rc);
    uint32_t peer = 0;
    rc = TDM_E_TIMEOUT;
    for (int i = 0; i < 200 && (rc == TDM_E_TIMEOUT || rc == TDM_E_STATE); i++) {
        if (i) usleep(50000);
        rc = tdm_kvx_connect(k, ep, NULL, &peer);
    }
    if (rc) die("connect (nixl)", rc);
    uint32_t *ids = malloc(nb * sizeof(uint32_t));
    nixl_ids(ids, nb);
    double best = 1e30;
    for (uint64_t r = 1; r <= NIXL_REPS + 1; r++) {   /* the first one warms up */
        tdm_kvx_recv_desc rd;
        tdm_kvx_recv_desc_init(&rd);
        rd.peer = peer;
        rd.request_id = r;
        rd.num_blocks = nb;
        rd.block_ids = ids;
        uint64_t h;
        double t0 = now();
        if ((rc = tdm_kvx_recv(k, &rd, &h))) die("recv (nixl)", rc);
        wait_ev(k);
        double t = now() - t0;
        if (r > 1 && t < best) best = t;
    }
    /* the child's cache is all 1s, ours was all 2s: every byte must have moved */
    size_t lb;
    tdm_kv_layout_layer_bytes(&dst.l, &lb);
    for (size_t i = 0; i < lb * LAYERS; i++)
        if (dst.mem[i] != 1) { fprintf(stderr, "kv_bench: NIXL transfer wrong at byte %zu\n", i); exit(1); }
    tdm_kvx_stats st;
    tdm_kvx_stats_init(&st);
    tdm_kvx_get_stats(k, &st);
    if (st.chunks_read_nixl == 0) { fprintf(stderr, "kv_bench: NIXL carried nothing\n"); exit(1); }
    int ws = 0;
    waitpid(pid, &ws, 0);
    tdm_kvx_destroy(k);
    unlink(ep + 6);
    free(ids);
    free(dst.mem);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws)) { snprintf(why, why_len, "the prefill process failed (%d)", ws); return 0; }
    return best;
}

/* The decode engine's copying threads as the library picks them (kvx_tp_nixl.c). */
static void nixl_threads(char *buf, size_t n)
{
    const char *v = getenv("TANDEM_NIXL_THREADS");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (v && v[0]) snprintf(buf, n, "%s copying threads (TANDEM_NIXL_THREADS)", v);
    else snprintf(buf, n, "%ld copying threads (default min(4, %ld CPUs))", cpus < 1 ? 1 : cpus < 4 ? cpus : 4, cpus);
}

/* Finds the wheel `make test-nixl` installed when TANDEM_NIXL_DIR is not set. */
static void nixl_find_wheel(void)
{
    const char *b = getenv("TANDEM_BUILD");
    if (getenv("TANDEM_NIXL_DIR") || getenv("TANDEM_NIXL_LIB") || !b) return;
    char pat[512];
    snprintf(pat, sizeof(pat), "%s/venv-nixl/lib/python3*/site-packages", b);
    glob_t g;
    if (glob(pat, 0, NULL, &g) == 0) {
        setenv("TANDEM_NIXL_DIR", g.gl_pathv[0], 1);
        globfree(&g);
    }
}

/* ---- main -------------------------------------------------------------------------------------- */

#define NSIZES 4
static const size_t MIB = 1u << 20;

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--nixl-child"))
        return nixl_child(argv[2], (uint32_t)atoi(argv[3]), !strcmp(argv[4], "thp"));
    size_t max_mib = 1024;
    const char *env = getenv("KV_BENCH_MAX_MIB");
    if (env && atoi(env) >= 16) max_mib = (size_t)atoi(env);
    size_t sizes[NSIZES] = { 16, 64, 256, 1024 };
    int reps[NSIZES] = { 6, 4, 3, 2 };
    size_t unit;   /* one block of one layer */
    tdm_kv_layout tmp;
    tdm_kv_layout_init(&tmp, TDM_KV_LAYOUT_VLLM_NHD, LAYERS, 1, BS, HEADS, DIM, TDM_DTYPE_FP16);
    tdm_kv_layout_block_bytes(&tmp, &unit);
    uint32_t nblocks = (uint32_t)(max_mib * MIB / (unit * LAYERS));
    char ipc_ep[128], ipc_raw[128];
    snprintf(ipc_ep, sizeof(ipc_ep), "ipc:///tmp/tdm-kvbench-%d", (int)getpid());
    snprintf(ipc_raw, sizeof(ipc_raw), "ipc:///tmp/tdm-kvbench-raw-%d", (int)getpid());
    pairx shm, ipc, tcp;
    char shm_ep[160];
    snprintf(shm_ep, sizeof(shm_ep), "%s-shm", ipc_ep);
    uint32_t shm_chunk = getenv("KV_BENCH_SHM_KIB") ? (uint32_t)atoi(getenv("KV_BENCH_SHM_KIB")) << 10 : SHM_CHUNK;
    uint32_t shm_slots = getenv("KV_BENCH_SHM_SLOTS") ? (uint32_t)atoi(getenv("KV_BENCH_SHM_SLOTS")) : SHM_SLOTS;
    pair_create(&shm, shm_ep, TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_SHM, shm_chunk, shm_slots);
    pair_create(&ipc, ipc_ep, TDM_KVX_TRANSPORT_ZMQ, CHUNK, 8);
    pair_create(&tcp, "tcp://127.0.0.1:*", TDM_KVX_TRANSPORT_ZMQ, CHUNK, 8);
    /* the prefill cache lives in the shm pair's shared segment, so that its receiver reads
     * blocks directly (one copy); the other pairs use the same memory as plain host memory */
    void *shared = NULL;
    int rc0 = getenv("KV_BENCH_NO_DIRECT") ? TDM_E_UNSUPPORTED : tdm_kvx_alloc_shared(shm.p, cache_bytes(nblocks), &shared);
    if (rc0 && rc0 != TDM_E_UNSUPPORTED) die("alloc_shared", rc0);
    cache src, dst;
    cache_init(&src, nblocks, 1, shared);
    cache_init(&dst, nblocks, 2, NULL);
    pair_connect(&shm, &src, &dst);
    pair_connect(&ipc, &src, &dst);
    pair_connect(&tcp, &src, &dst);
    uint8_t *stage = aligned_alloc(4096, max_mib * MIB), *copy = aligned_alloc(4096, max_mib * MIB);
    if (!stage || !copy) die("alloc", TDM_E_NOMEM);
    memset(stage, 3, max_mib * MIB);
    memset(copy, 4, max_mib * MIB);
    uint32_t *ids = malloc(nblocks * sizeof(uint32_t));
    for (uint32_t i = 0; i < nblocks; i++) ids[i] = (i * 7919u) % nblocks;   /* scattered */
    if (nblocks % 7919u == 0) for (uint32_t i = 0; i < nblocks; i++) ids[i] = nblocks - 1 - i;


    double r_pack[NSIZES], r_unpack[NSIZES], r_shm[NSIZES], r_ipc[NSIZES], r_tcp[NSIZES];
    int ns = 0;
    printf("%8s %9s %9s %9s %9s %9s %9s %9s %9s   (GB/s, best of reps)\n", "size", "memcpy", "pack",
           "unpack", "shm", "zmq-ipc", "kvx-ipc", "zmq-tcp", "kvx-tcp");
    for (int s = 0; s < NSIZES && sizes[s] <= max_mib; s++, ns++) {
        size_t bytes = sizes[s] * MIB;
        uint32_t nb = (uint32_t)(bytes / (unit * LAYERS));
        double best[8];
        for (int k = 0; k < 8; k++) best[k] = 1e30;
        for (int r = 0; r < reps[s]; r++) {
            double t0 = now();
            memcpy(copy, stage, bytes);
            double t = now() - t0;
            if (t < best[0]) best[0] = t;
            t0 = now();
            int rc = tdm_kv_pack(&src.l, src.bases, ids, nb, 0, LAYERS, stage, bytes);
            t = now() - t0;
            if (rc) die("pack", rc);
            if (t < best[1]) best[1] = t;
            t0 = now();
            rc = tdm_kv_unpack(&dst.l, dst.bases, ids, nb, 0, LAYERS, stage, bytes);
            t = now() - t0;
            if (rc) die("unpack", rc);
            if (t < best[2]) best[2] = t;
            if ((t = xfer(&shm, ids, nb)) < best[3]) best[3] = t;
            if ((t = raw_zmq(ipc_raw, stage, bytes)) < best[4]) best[4] = t;
            if ((t = xfer(&ipc, ids, nb)) < best[5]) best[5] = t;
            if ((t = raw_zmq("tcp://127.0.0.1:*", stage, bytes)) < best[6]) best[6] = t;
            if ((t = xfer(&tcp, ids, nb)) < best[7]) best[7] = t;
        }
        printf("%5zu MiB", sizes[s]);
        for (int k = 0; k < 8; k++) printf(" %9.2f", bytes / best[k] / 1e9);
        printf("\n");
        r_pack[s] = best[0] / best[1];
        r_unpack[s] = best[0] / best[2];
        r_shm[s] = best[0] / best[3];
        r_ipc[s] = best[4] / best[5];
        r_tcp[s] = best[6] / best[7];
        fflush(stdout);
    }
    /* the last transfer's bytes are checked once, so a fast wrong path cannot pass as fast */
    size_t row = unit * nblocks;
    (void)row;
    pair_close(&tcp);
    pair_close(&ipc);
    pair_close(&shm);   /* unmaps the shared prefill cache: src.mem is gone */
    double g[5] = { 0, 0, 0, 0, 0 };
    for (int s = 0; s < ns; s++) {
        g[0] += log(r_pack[s]);
        g[1] += log(r_unpack[s]);
        g[2] += log(r_shm[s]);
        g[3] += log(r_ipc[s]);
        g[4] += log(r_tcp[s]);
    }
    printf("chunks of %u MiB; %u layers x %u-token blocks x %u heads x %u dims fp16 (%zu KiB per block-layer), "
           "blocks scattered; shm: %s; zmq baselines: PUSH->PULL, same message size and transport\n",
           CHUNK >> 20, LAYERS, BS, HEADS, DIM, unit >> 10,
           shared ? "direct reads from the shared prefill cache" : "pack into 4 MiB slots, unpack");
    /* NIXL: two processes, against memcpy of the same bytes measured now */
    char nixl_r[2][64] = { "skipped", "skipped" };
    {
        nixl_find_wheel();
        size_t mib = getenv("KV_BENCH_NIXL_MIB") ? (size_t)atoi(getenv("KV_BENCH_NIXL_MIB")) : 256;
        if (mib < 16) mib = 16;
        uint32_t nb = (uint32_t)(mib * MIB / (unit * LAYERS));
        size_t bytes = (size_t)nb * unit * LAYERS;
        char why[600] = "", self[1024];
        ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (sl > 0) self[sl] = '\0';
        else snprintf(why, sizeof(why), "cannot find this executable");
        const char *tls = getenv("UCX_TLS"), *pg = getenv("KV_BENCH_NIXL_PAGES");
        for (int thp = 0; thp <= 1 && sl > 0; thp++) {
            if (pg && strcmp(pg, thp ? "thp" : "4k") != 0) continue;
            uint8_t *a = big_alloc(bytes, thp), *b = big_alloc(bytes, thp);
            memset(a, 5, bytes);
            memset(b, 6, bytes);
            double tm = memcpy_best(b, a, bytes, NIXL_REPS, 1e30);
            long huge = -1;
            double tn = nixl_run(self, nb, thp, &huge, why, sizeof(why));
            tm = memcpy_best(b, a, bytes, NIXL_REPS, tm);
            free(a);
            free(b);
            if (tn <= 0) break;
            char pages[96];
            if (!thp) snprintf(pages, sizeof(pages), "4 KiB pages");
            else if (huge < 0) snprintf(pages, sizeof(pages), "huge pages advised (backing unknown)");
            else snprintf(pages, sizeof(pages), "huge pages advised, %ld of %zu MiB on 2 MiB pages", huge, bytes / MIB);
            char thr[96];
            nixl_threads(thr, sizeof(thr));
            printf("nixl: %zu MiB between two processes, READ of %s blocks, %s: %.2f GB/s, %s; memcpy %.2f GB/s "
                   "(1 thread) (UCX_TLS=%s)\n", bytes / MIB, nixl_contiguous() ? "contiguous" : "scattered", pages,
                   bytes / tn / 1e9, thr, bytes / tm / 1e9, tls ? tls : "unset, UCX's choice");
            snprintf(nixl_r[thp ? 1 : 0], sizeof(nixl_r[0]), "%.2f", tm / tn);
        }
        if (why[0]) printf("nixl: skipped: %s\n", why);
    }
    printf("kv_bench pack_vs_memcpy=%.2f unpack_vs_memcpy=%.2f shm_vs_memcpy=%.2f ipc_vs_zmq=%.2f "
           "tcp_vs_zmq=%.2f nixl_vs_memcpy=%s nixl_thp_vs_memcpy=%s\n", exp(g[0] / ns), exp(g[1] / ns), exp(g[2] / ns),
           exp(g[3] / ns), exp(g[4] / ns), nixl_r[0], nixl_r[1]);
    free(ids);
    free(stage);
    free(copy);
    if (src.owned) free(src.mem);
    free(dst.mem);
    return 0;
}
