/*
 * fake_nixl_capi.c -- a test double of NIXL's C API for engines that live in one process:
 * built as build/tests-nixl/fake/libnixl_capi.so.0 and loaded through TANDEM_NIXL_LIB by
 * tests/unit/kvx/test_kvx_nixl_fake.c, so that the NIXL transport's code runs in every
 * `make test` and `make check` (sanitizers), with faults NIXL itself cannot be made to
 * produce on demand. It keeps agents and their registered ranges in a process-wide list,
 * checks every descriptor of a transfer against them as NIXL does, and copies the bytes
 * when a READ completes. Faults, read at each call from the environment:
 *   FAKE_NIXL_POLLS=n        a READ reports "in progress" n times before completing (2)
 *   FAKE_NIXL_STATUS_ERR=1   a READ completes with an error instead of copying
 *   FAKE_NIXL_POST_ERR=1     posting a READ fails
 *   FAKE_NIXL_RELEASE_BUSY=n releasing an active READ is refused n times per READ
 *   FAKE_NIXL_NO_BACKEND=1   the UCX backend cannot be created
 * fake_nixl_live_reqs() says how many transfer requests exist (leak and cancel checks);
 * fake_nixl_last_cfg() what the last configured agent was asked for (progress thread, its
 * delay); fake_nixl_last_descs() how many descriptors the last transfer request had;
 * fake_nixl_last_workers() the num_workers backend parameter last asked for ("" when none).
 * A request is touched by one thread at a time (the engine's I/O thread or copying thread).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef struct range { uintptr_t a; size_t n; } range;
typedef struct agent {
    struct agent *next;
    char name[128];
    range *regs;
    size_t nregs;
} agent;
typedef struct dlist { int mem; range *d; size_t n; } dlist;
typedef struct req {
    agent *ag;
    dlist loc, rem;
    int posted, done, st, busy_left;
    long polls_left;
} req;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static agent *agents;
static long live_reqs;
static int dummy;

static long env_num(const char *k, long def)
{
    const char *v = getenv(k);
    return v && v[0] ? atol(v) : def;
}

API long fake_nixl_live_reqs(void)
{
    pthread_mutex_lock(&mu);
    long n = live_reqs;
    pthread_mutex_unlock(&mu);
    return n;
}

/* nixl_capi_agent_config_t's layout */
typedef struct agent_cfg {
    bool prog_thread, listen_thread;
    int listen_port, thread_sync;
    unsigned int num_workers;
    uint64_t pthr_delay_us, lthr_delay_us;
    bool capture_telemetry;
} agent_cfg;
static agent_cfg last_cfg;
static int have_cfg;
static size_t last_descs;

API int fake_nixl_last_cfg(int *prog_thread, unsigned long long *delay_us)
{
    pthread_mutex_lock(&mu);
    int h = have_cfg;
    *prog_thread = last_cfg.prog_thread;
    *delay_us = (unsigned long long)last_cfg.pthr_delay_us;
    pthread_mutex_unlock(&mu);
    return h;
}

API long fake_nixl_last_descs(void)
{
    pthread_mutex_lock(&mu);
    long n = (long)last_descs;
    pthread_mutex_unlock(&mu);
    return n;
}

static agent *find(const char *name)
{
    for (agent *a = agents; a; a = a->next)
        if (!strcmp(a->name, name)) return a;
    return NULL;
}

API int nixl_capi_create_agent(const char *name, agent **out)
{
    agent *a = calloc(1, sizeof(*a));
    if (!a || !name || strlen(name) >= sizeof(a->name)) { free(a); return -1; }
    strcpy(a->name, name);
    pthread_mutex_lock(&mu);
    a->next = agents;
    agents = a;
    pthread_mutex_unlock(&mu);
    *out = a;
    return 0;
}

API int nixl_capi_create_configured_agent(const char *name, const agent_cfg *cfg, agent **out)
{
    if (!cfg || cfg->listen_thread) return -1;
    pthread_mutex_lock(&mu);
    last_cfg = *cfg;
    have_cfg = 1;
    pthread_mutex_unlock(&mu);
    return nixl_capi_create_agent(name, out);
}

API int nixl_capi_destroy_agent(agent *a)
{
    pthread_mutex_lock(&mu);
    for (agent **pp = &agents; *pp; pp = &(*pp)->next)
        if (*pp == a) { *pp = a->next; break; }
    pthread_mutex_unlock(&mu);
    free(a->regs);
    free(a);
    return 0;
}

static char last_workers[16];

API int fake_nixl_last_workers(char *buf, size_t n)
{
    pthread_mutex_lock(&mu);
    snprintf(buf, n, "%s", last_workers);
    pthread_mutex_unlock(&mu);
    return 0;
}

API int nixl_capi_params_add(void *params, const char *key, const char *value)
{
    (void)params;
    if (!key || !value) return -1;
    pthread_mutex_lock(&mu);
    if (!strcmp(key, "num_workers")) snprintf(last_workers, sizeof(last_workers), "%s", value);
    pthread_mutex_unlock(&mu);
    return 0;
}

API int nixl_capi_opt_args_set_custom_param(void *o, const void *data, size_t len)
{
    (void)o;
    return data && len && !memcmp(data, "worker_id=", len < 10 ? len : 10) ? 0 : -1;
}

API int nixl_capi_get_plugin_params(agent *a, const char *p, void **mems, void **params)
{
    (void)a; (void)p;
    pthread_mutex_lock(&mu);
    last_workers[0] = '\0';
    pthread_mutex_unlock(&mu);
    *mems = &dummy;
    *params = &dummy;
    return 0;
}

API int nixl_capi_destroy_mem_list(void *m) { (void)m; return 0; }
API int nixl_capi_destroy_params(void *p) { (void)p; return 0; }

API int nixl_capi_create_backend(agent *a, const char *p, void *params, void **be)
{
    (void)a; (void)p; (void)params;
    if (env_num("FAKE_NIXL_NO_BACKEND", 0)) return -2;
    *be = &dummy;
    return 0;
}

API int nixl_capi_destroy_backend(void *b) { (void)b; return 0; }
API int nixl_capi_create_opt_args(void **o) { *o = &dummy; return 0; }
API int nixl_capi_destroy_opt_args(void *o) { (void)o; return 0; }
API int nixl_capi_opt_args_add_backend(void *o, void *b) { (void)o; (void)b; return 0; }

static int dl_create(int mem, dlist **out)
{
    dlist *d = calloc(1, sizeof(*d));
    if (!d) return -1;
    d->mem = mem;
    *out = d;
    return 0;
}

static int dl_destroy(dlist *d)
{
    free(d->d);
    free(d);
    return 0;
}

static int dl_add(dlist *d, uintptr_t a, size_t n)
{
    range *r = realloc(d->d, (d->n + 1) * sizeof(range));
    if (!r) return -1;
    d->d = r;
    d->d[d->n].a = a;
    d->d[d->n].n = n;
    d->n++;
    return 0;
}

API int nixl_capi_create_reg_dlist(int mem, dlist **out) { return dl_create(mem, out); }
API int nixl_capi_destroy_reg_dlist(dlist *d) { return dl_destroy(d); }
API int nixl_capi_reg_dlist_add_desc(dlist *d, uintptr_t a, size_t n, uint64_t dev, const void *m, size_t ml)
{
    (void)dev; (void)m; (void)ml;
    return dl_add(d, a, n);
}
API int nixl_capi_create_xfer_dlist(int mem, dlist **out) { return dl_create(mem, out); }
API int nixl_capi_destroy_xfer_dlist(dlist *d) { return dl_destroy(d); }
API int nixl_capi_xfer_dlist_add_desc(dlist *d, uintptr_t a, size_t n, uint64_t dev)
{
    (void)dev;
    return dl_add(d, a, n);
}

API int nixl_capi_register_mem(agent *a, dlist *d, void *opt)
{
    (void)opt;
    pthread_mutex_lock(&mu);
    range *r = realloc(a->regs, (a->nregs + d->n) * sizeof(range));
    if (r) {
        a->regs = r;
        memcpy(a->regs + a->nregs, d->d, d->n * sizeof(range));
        a->nregs += d->n;
    }
    pthread_mutex_unlock(&mu);
    return r ? 0 : -1;
}

API int nixl_capi_deregister_mem(agent *a, dlist *d, void *opt)
{
    (void)opt;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < d->n; i++)
        for (size_t j = 0; j < a->nregs; j++)
            if (a->regs[j].a == d->d[i].a && a->regs[j].n == d->d[i].n) {
                a->regs[j] = a->regs[--a->nregs];
                break;
            }
    pthread_mutex_unlock(&mu);
    return 0;
}

API int nixl_capi_get_local_md(agent *a, void **data, size_t *len)
{
    size_t n = strlen(a->name) + 5;
    char *m = malloc(n);
    if (!m) return -1;
    memcpy(m, "FAKE:", 5);
    memcpy(m + 5, a->name, n - 5);
    *data = m;
    *len = n;
    return 0;
}

API int nixl_capi_load_remote_md(agent *a, const void *data, size_t len, char **name)
{
    (void)a;
    char buf[160];
    if (len < 6 || len - 5 >= sizeof(buf) || memcmp(data, "FAKE:", 5)) return -2;
    memcpy(buf, (const char *)data + 5, len - 5);
    buf[len - 5] = '\0';
    pthread_mutex_lock(&mu);
    int ok = find(buf) != NULL;
    pthread_mutex_unlock(&mu);
    if (!ok) return -2;
    *name = strdup(buf);
    return *name ? 0 : -1;
}

API int nixl_capi_invalidate_remote_md(agent *a, const char *n) { (void)a; (void)n; return 0; }

static int covered(const agent *a, range r)
{
    for (size_t i = 0; i < a->nregs; i++)
        if (r.a >= a->regs[i].a && r.n <= a->regs[i].n && r.a - a->regs[i].a <= a->regs[i].n - r.n) return 1;
    return 0;
}

static int copy_list(dlist *dst, const dlist *src)
{
    dst->mem = src->mem;
    dst->n = src->n;
    dst->d = malloc(src->n * sizeof(range) + 1);
    if (!dst->d) return -1;
    memcpy(dst->d, src->d, src->n * sizeof(range));
    return 0;
}

API int nixl_capi_create_xfer_req(agent *a, int op, dlist *loc, dlist *rem, const char *remote, req **out, void *opt)
{
    (void)opt;
    if (op != 0 || loc->n != rem->n || loc->n == 0) return -1;
    pthread_mutex_lock(&mu);
    agent *r = find(remote);
    int ok = r != NULL;
    for (size_t i = 0; ok && i < loc->n; i++)
        ok = loc->d[i].n == rem->d[i].n && covered(a, loc->d[i]) && covered(r, rem->d[i]);
    if (ok) last_descs = loc->n;
    pthread_mutex_unlock(&mu);
    if (!ok) return -2;
    req *q = calloc(1, sizeof(*q));
    if (!q || copy_list(&q->loc, loc) || copy_list(&q->rem, rem)) {
        if (q) { free(q->loc.d); free(q); }
        return -1;
    }
    q->ag = a;
    pthread_mutex_lock(&mu);
    live_reqs++;
    pthread_mutex_unlock(&mu);
    *out = q;
    return 0;
}

API int nixl_capi_post_xfer_req(agent *a, req *q, void *opt)
{
    (void)a; (void)opt;
    if (env_num("FAKE_NIXL_POST_ERR", 0)) return -2;
    q->posted = 1;
    q->polls_left = env_num("FAKE_NIXL_POLLS", 2);
    q->busy_left = (int)env_num("FAKE_NIXL_RELEASE_BUSY", 0);
    return 1;
}

API int nixl_capi_get_xfer_status(agent *a, req *q)
{
    (void)a;
    if (!q->posted) return -3;
    if (q->done) return q->st;
    if (q->polls_left-- > 0) return 1;
    q->done = 1;
    if (env_num("FAKE_NIXL_STATUS_ERR", 0)) return q->st = -2;
    for (size_t i = 0; i < q->loc.n; i++) memcpy((void *)q->loc.d[i].a, (const void *)q->rem.d[i].a, q->loc.d[i].n);
    return q->st = 0;
}

API int nixl_capi_release_xfer_req(agent *a, req *q)
{
    (void)a;
    if (q->posted && !q->done && q->busy_left > 0) {
        q->busy_left--;
        return -3;
    }
    q->posted = 0;   /* an active READ is cancelled: nothing is copied */
    q->done = 1;
    return 0;
}

API int nixl_capi_destroy_xfer_req(req *q)
{
    free(q->loc.d);
    free(q->rem.d);
    free(q);
    pthread_mutex_lock(&mu);
    live_reqs--;
    pthread_mutex_unlock(&mu);
    return 0;
}
