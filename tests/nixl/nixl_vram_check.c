/*
 * nixl_vram_check.c -- the GPU half of the NIXL transport, run by scripts/gpu-check.sh on a
 * machine with a GPU: two processes (this binary re-executed as the prefill engine), both
 * KV caches in device memory registered as VRAM, the decode side READs 64 MiB of scattered
 * blocks over NIXL (UCX picks cuda_ipc / cuda_copy), then the same blocks into a cache laid
 * out otherwise (HND: staged through the host rings, unpacked on the device). Every byte is
 * copied back to the host and compared with the pattern the sender wrote. Prints the READ
 * bandwidth against cudaMemcpy device-to-device of the same bytes in this run, and last
 *   nixl_vram ok direct_gbps=X staged_gbps=Y d2d_gbps=Z
 * Exit: 0 ok, 1 a check failed, 3 no GPU or no NIXL (the reason is printed). A few seconds.
 * Environment: TANDEM_NIXL_DIR (or TANDEM_BUILD/venv-nixl) as for `make test-nixl`.
 */
#include <glob.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tandem.h"

#define LAYERS 8
#define NB 256           /* blocks per layer */
#define BS 16
#define HEADS 8
#define DIM 128          /* 64 KiB per block-layer (K and V, fp16): 128 MiB per cache */
#define N 128            /* blocks moved: 64 MiB */
#define TP (TDM_KVX_TRANSPORT_ZMQ | TDM_KVX_TRANSPORT_NIXL)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct gcache {
    tdm_kv_layout l;
    size_t layer_bytes;
    uint8_t *dev;
    void *bases[LAYERS];
} gcache;

static int gcache_init(gcache *c, uint32_t kind, int fill)
{
    if (tdm_kv_layout_init(&c->l, (tdm_kv_layout_kind)kind, LAYERS, NB, BS, HEADS, DIM, TDM_DTYPE_FP16)) return -1;
    tdm_kv_layout_layer_bytes(&c->l, &c->layer_bytes);
    size_t all = c->layer_bytes * LAYERS;
    if (tdm_cuda_malloc((void **)&c->dev, all)) return -1;
    uint8_t *h = malloc(all);
    if (!h) return -1;
    for (size_t i = 0; i < all; i++) h[i] = fill ? (uint8_t)(i * 2654435761u >> 13) : 0xee;
    int rc = tdm_cuda_memcpy(c->dev, h, all, TDM_CUDA_COPY_HOST_TO_DEVICE);
    free(h);
    for (uint32_t i = 0; i < LAYERS; i++) c->bases[i] = c->dev + i * c->layer_bytes;
    return rc;
}

static void ids(uint32_t *v, int dst)
{
    for (uint32_t i = 0; i < N; i++) v[i] = dst ? (i * 37u + 11u) % NB : (i * 101u + 3u) % NB;
}

static int wait_done(tdm_kvx *k, const char *who)
{
    tdm_kvx_event ev;
    tdm_kvx_event_init(&ev);
    uint32_t n = 0;
    if (tdm_kvx_poll(k, &ev, 1, &n, 60000) || n != 1 || ev.type != TDM_KVX_EV_DONE) {
        fprintf(stderr, "nixl_vram: %s: transfer did not complete: %s\n", who, n ? ev.reason : "timeout");
        return -1;
    }
    return 0;
}

/* The prefill process: sends requests 1 (direct) and 2 (staged) of the same blocks. */
static int child(const char *ep)
{
    tdm_kvx_config c;
    tdm_kvx_config_init(&c);
    c.engine_id = "vram-prefill";
    c.role = TDM_KVX_ROLE_PREFILL;
    c.listen_endpoint = ep;
    c.transports = TP;
    tdm_kvx *k;
    gcache src;
    if (tdm_kvx_create(&c, &k) || gcache_init(&src, TDM_KV_LAYOUT_VLLM_NHD, 1) ||
        tdm_kvx_register(k, &src.l, src.bases, TDM_MEM_CUDA, 0)) {
        fprintf(stderr, "nixl_vram child: %s\n", tdm_kvx_errmsg(NULL));
        return 2;
    }
    uint32_t s[N];
    ids(s, 0);
    for (uint64_t r = 1; r <= 2; r++) {
        tdm_kvx_send_desc sd;
        tdm_kvx_send_desc_init(&sd);
        sd.request_id = r;
        sd.num_blocks = N;
        sd.block_ids = s;
        sd.num_blocks_ready = N;
        uint64_t h;
        if (tdm_kvx_send(k, &sd, &h)) return 3;
    }
    int rc = wait_done(k, "sender") || wait_done(k, "sender") ? 4 : 0;
    tdm_kvx_destroy(k);
    tdm_cuda_free(src.dev);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--child")) return child(argv[2]);
    signal(SIGPIPE, SIG_IGN);
    char msg[200];
    if (tdm_cuda_available(msg, sizeof(msg)) != TDM_OK) { printf("nixl_vram: skipped: %s\n", msg); return 3; }
    const char *b = getenv("TANDEM_BUILD");
    if (!getenv("TANDEM_NIXL_DIR") && !getenv("TANDEM_NIXL_LIB") && b) {
        char pat[512];
        snprintf(pat, sizeof(pat), "%s/venv-nixl/lib/python3*/site-packages", b);
        glob_t g;
        if (glob(pat, 0, NULL, &g) == 0) { setenv("TANDEM_NIXL_DIR", g.gl_pathv[0], 1); globfree(&g); }
    }
    char self[1024];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (sl <= 0) return 1;
    self[sl] = '\0';
    char ep[128];
    snprintf(ep, sizeof(ep), "ipc:///tmp/tdm-nixl-vram-%d", (int)getpid());
    /* two decode engines: one cache like the sender's (direct READs), one HND (staged) */
    double secs[2] = { 0, 0 };
    uint32_t s[N], d[N];
    ids(s, 0);
    ids(d, 1);
    gcache ref;   /* the sender's pattern, rebuilt here to compare against */
    if (gcache_init(&ref, TDM_KV_LAYOUT_VLLM_NHD, 1)) { fprintf(stderr, "nixl_vram: cuda alloc failed\n"); return 1; }
    size_t all = ref.layer_bytes * LAYERS;
    uint8_t *href = malloc(all), *hgot = malloc(all);
    if (!href || !hgot || tdm_cuda_memcpy(href, ref.dev, all, TDM_CUDA_COPY_DEVICE_TO_HOST)) return 1;
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, "--child", ep, (char *)NULL);
        _exit(127);
    }
    int bad = 0;
    for (int staged = 0; staged < 2 && !bad; staged++) {
        tdm_kvx_config c;
        tdm_kvx_config_init(&c);
        c.engine_id = staged ? "vram-decode-hnd" : "vram-decode";
        c.role = TDM_KVX_ROLE_DECODE;
        c.transports = TP;
        tdm_kvx *k;
        if (tdm_kvx_create(&c, &k)) {
            printf("nixl_vram: skipped: %s\n", tdm_kvx_errmsg(NULL));
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return 3;
        }
        gcache dst;
        uint32_t kind = staged ? TDM_KV_LAYOUT_VLLM_HND : TDM_KV_LAYOUT_VLLM_NHD;
        if (gcache_init(&dst, kind, 0) || tdm_kvx_register(k, &dst.l, dst.bases, TDM_MEM_CUDA, 0)) {
            fprintf(stderr, "nixl_vram: register: %s\n", tdm_kvx_errmsg(k));
            bad = 1;
            tdm_kvx_destroy(k);
            break;
        }
        uint32_t peer = 0;
        int rc = TDM_E_TIMEOUT;
        for (int i = 0; i < 200 && (rc == TDM_E_TIMEOUT || rc == TDM_E_STATE); i++) {
            if (i) usleep(50000);
            rc = tdm_kvx_connect(k, ep, NULL, &peer);
        }
        tdm_kvx_recv_desc rd;
        tdm_kvx_recv_desc_init(&rd);
        rd.peer = peer;
        rd.request_id = 1 + (uint64_t)staged;
        rd.num_blocks = N;
        rd.block_ids = d;
        uint64_t h;
        double t0 = now();
        if (rc || tdm_kvx_recv(k, &rd, &h) || wait_done(k, "receiver")) {
            fprintf(stderr, "nixl_vram: %s: %s\n", staged ? "staged" : "direct", tdm_kvx_errmsg(k));
            bad = 1;
        }
        secs[staged] = now() - t0;
        tdm_kvx_stats st;
        tdm_kvx_stats_init(&st);
        tdm_kvx_get_stats(k, &st);
        if (!bad && st.chunks_read_nixl == 0) { fprintf(stderr, "nixl_vram: NIXL carried nothing\n"); bad = 1; }
        /* every row of every moved block, K and V, in the receiver's own arrangement */
        if (!bad && tdm_cuda_memcpy(hgot, dst.dev, all, TDM_CUDA_COPY_DEVICE_TO_HOST)) bad = 1;
        size_t row = (size_t)DIM * 2;
        for (uint32_t l = 0; !bad && l < LAYERS; l++)
            for (uint32_t i = 0; !bad && i < N; i++)
                for (uint32_t kv = 0; kv < 2 && !bad; kv++)
                    for (uint32_t t = 0; t < BS && !bad; t++)
                        for (uint32_t hd = 0; hd < HEADS && !bad; hd++) {
                            const tdm_kv_layout *sl_ = &ref.l, *dl = &dst.l;
                            size_t so = (size_t)l * ref.layer_bytes +
                                        (size_t)(kv * sl_->stride_kv + s[i] * sl_->stride_block + t * sl_->stride_token +
                                                 hd * sl_->stride_head) * 2;
                            size_t dof = (size_t)l * dst.layer_bytes +
                                         (size_t)(kv * dl->stride_kv + d[i] * dl->stride_block + t * dl->stride_token +
                                                  hd * dl->stride_head) * 2;
                            if (memcmp(href + so, hgot + dof, row)) {
                                fprintf(stderr, "nixl_vram: %s: layer %u block %u kv %u token %u head %u differs\n",
                                        staged ? "staged" : "direct", l, d[i], kv, t, hd);
                                bad = 1;
                            }
                        }
        tdm_kvx_destroy(k);
        tdm_cuda_free(dst.dev);
    }
    int ws = 0;
    if (bad) kill(pid, SIGKILL);
    waitpid(pid, &ws, 0);
    unlink(ep + 6);
    if (!bad && (!WIFEXITED(ws) || WEXITSTATUS(ws))) { fprintf(stderr, "nixl_vram: the sender failed (%d)\n", ws); bad = 1; }
    /* the baseline: cudaMemcpy device to device of the same bytes */
    size_t bytes = (size_t)N * LAYERS * ref.layer_bytes / NB;
    uint8_t *d2 = NULL;
    double best = 1e30;
    if (!bad && tdm_cuda_malloc((void **)&d2, bytes) == TDM_OK) {
        for (int r = 0; r < 5; r++) {
            double t0 = now();
            tdm_cuda_memcpy(d2, ref.dev, bytes, TDM_CUDA_COPY_DEVICE_TO_DEVICE);
            double t = now() - t0;
            if (t < best) best = t;
        }
        tdm_cuda_free(d2);
    }
    tdm_cuda_free(ref.dev);
    free(href);
    free(hgot);
    if (bad) { printf("nixl_vram FAILED\n"); return 1; }
    printf("nixl vram: %zu MiB of scattered blocks between two processes: direct READ %.2f GB/s, staged (HND) "
           "%.2f GB/s; cudaMemcpy D2D %.2f GB/s (UCX_TLS=%s)\n", bytes >> 20, bytes / secs[0] / 1e9,
           bytes / secs[1] / 1e9, bytes / best / 1e9, getenv("UCX_TLS") ? getenv("UCX_TLS") : "unset, UCX's choice");
    printf("nixl_vram ok direct_gbps=%.2f staged_gbps=%.2f d2d_gbps=%.2f\n", bytes / secs[0] / 1e9,
           bytes / secs[1] / 1e9, bytes / best / 1e9);
    return 0;
}
