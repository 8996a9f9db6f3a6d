/*
 * kvx_nixl_pool.c -- the copying threads of a NIXL engine that READs with several of them
 * (TANDEM_NIXL_THREADS > 1). On one host UCX moves a READ with cma, one process_vm_readv per
 * descriptor, in whichever thread progresses the request's UCX worker; one thread caps
 * scattered blocks far below memcpy. So the I/O thread cuts each READ into parts, one per
 * thread, creates every part's transfer request on that thread's own UCX worker (the backend
 * has one shared worker per thread; the request names it with the "worker_id=" custom
 * parameter), and hands it over. Thread i posts its parts and polls them (the polling is
 * what copies) until each has ended, then releases it and queues it as done; the I/O thread,
 * woken through the engine's wake eventfd, collects the done parts. A part is never cancelled
 * while active: an active UCX operation cannot be withdrawn from the worker, and only a part
 * that has ended guarantees that nothing more lands in its blocks; a part that does not end
 * within TDM__NX_POOL_GIVE_UP_S of its abandonment is released anyway. The agent runs with
 * NIXL's reader-writer locking (RW) and multi-threaded UCX workers, so these threads and the
 * I/O thread may call it at once. Internal to libtandem.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "kvx_nixl_pool.h"

typedef struct copier {
    struct tdm__nx_pool *pool;
    uint32_t idx;
    pthread_t th;
    int started;
    tdm__nx_job *queue, **queue_tail;   /* submitted, not yet posted (pool->mu) */
} copier;

struct tdm__nx_pool {
    const tdm__nx_api *a;
    tdm__nx_agent agent;
    int wake_fd;
    pthread_mutex_t mu;
    pthread_cond_t work, done_cv;
    int stop;
    tdm__nx_job *done;                   /* ended parts for the I/O thread (mu) */
    uint32_t n;
    copier c[];
};

static void wake(int fd)
{
    uint64_t one = 1;
    ssize_t r = write(fd, &one, sizeof(one));
    (void)r;
}

/* Releases an ended (or given-up) part and queues it as done. */
static void finish(copier *c, tdm__nx_job *j, int st)
{
    tdm__nx_pool *p = c->pool;
    double until = tdm__now() + TDM__NX_POOL_GIVE_UP_S;
    int freed;
    while (!(freed = p->a->release_xfer_req(p->agent, j->req) == TDM__NX_OK) && tdm__now() < until) usleep(1000);
    if (freed) p->a->destroy_xfer_req(j->req);   /* else leaked rather than freed while in use */
    else if (st == TDM__NX_OK) st = TDM__NX_POOL_GAVE_UP;
    j->req = NULL;
    j->st = st;
    pthread_mutex_lock(&p->mu);
    j->next = p->done;
    p->done = j;
    pthread_cond_broadcast(&p->done_cv);
    pthread_mutex_unlock(&p->mu);
    wake(p->wake_fd);
}

static void *copier_main(void *arg)
{
    copier *c = arg;
    tdm__nx_pool *p = c->pool;
    const tdm__nx_api *a = p->a;
    tdm__nx_job *active = NULL;
    unsigned idle = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!c->queue && !active && !p->stop) pthread_cond_wait(&p->work, &p->mu);
        tdm__nx_job *fresh = c->queue;
        c->queue = NULL;
        c->queue_tail = &c->queue;
        int stop = p->stop;
        pthread_mutex_unlock(&p->mu);
        if (!fresh && !active && stop) break;
        while (fresh) {   /* post the new parts, then poll them with the others */
            tdm__nx_job *j = fresh;
            fresh = j->next;
            int st = a->post_xfer_req(p->agent, j->req, NULL);
            if (st != TDM__NX_OK && st != TDM__NX_IN_PROG) { finish(c, j, st); continue; }
            j->next = active;
            active = j;
        }
        int moved = 0;
        for (tdm__nx_job **pp = &active; *pp;) {
            tdm__nx_job *j = *pp;
            int st = a->get_xfer_status(p->agent, j->req);
            int give_up = st == TDM__NX_IN_PROG && __atomic_load_n(&j->abandoned, __ATOMIC_ACQUIRE) &&
                          tdm__now() > j->abandon_at + TDM__NX_POOL_GIVE_UP_S;
            if (st == TDM__NX_IN_PROG && !give_up) { pp = &j->next; continue; }
            *pp = j->next;
            finish(c, j, give_up ? TDM__NX_POOL_GAVE_UP : st);
            moved = 1;
        }
        /* parts waiting on the network (tcp, RDMA) must not spin a core away from the peer */
        idle = moved ? 0 : idle + 1;
        if (active && idle > 64) usleep(idle > 4096 ? 200 : 20);
        else if (active && idle > 16) sched_yield();
    }
    return NULL;
}

int tdm__nx_pool_start(const tdm__nx_api *a, tdm__nx_agent agent, uint32_t threads, int wake_fd, tdm__nx_pool **out)
{
    tdm__nx_pool *p = tdm__calloc(1, sizeof(*p) + threads * sizeof(copier));
    if (!p) return -1;
    p->a = a;
    p->agent = agent;
    p->wake_fd = wake_fd;
    p->n = threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    for (uint32_t i = 0; i < threads; i++) {
        copier *c = &p->c[i];
        c->pool = p;
        c->idx = i;
        c->queue_tail = &c->queue;
        if (pthread_create(&c->th, NULL, copier_main, c) != 0) {
            tdm__nx_pool_stop(p);
            return -1;
        }
        c->started = 1;
    }
    *out = p;
    return 0;
}

void tdm__nx_pool_submit(tdm__nx_pool *p, uint32_t thread, tdm__nx_job *j)
{
    copier *c = &p->c[thread % p->n];
    j->next = NULL;
    pthread_mutex_lock(&p->mu);
    *c->queue_tail = j;
    c->queue_tail = &j->next;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
}

void tdm__nx_pool_abandon(tdm__nx_job *j)
{
    j->abandon_at = tdm__now();
    __atomic_store_n(&j->abandoned, 1, __ATOMIC_RELEASE);
}

tdm__nx_job *tdm__nx_pool_take(tdm__nx_pool *p, double wait_s)
{
    pthread_mutex_lock(&p->mu);
    if (!p->done && wait_s > 0) {
        double until = tdm__now() + wait_s;
        while (!p->done) {
            double left = until - tdm__now();
            if (left <= 0) break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long ns = ts.tv_nsec + (long)((left < 0.05 ? left : 0.05) * 1e9);
            ts.tv_sec += ns / 1000000000L;
            ts.tv_nsec = ns % 1000000000L;
            pthread_cond_timedwait(&p->done_cv, &p->mu, &ts);
        }
    }
    tdm__nx_job *d = p->done;
    p->done = NULL;
    pthread_mutex_unlock(&p->mu);
    return d;
}

uint32_t tdm__nx_pool_threads(const tdm__nx_pool *p) { return p ? p->n : 1; }

void tdm__nx_pool_stop(tdm__nx_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < p->n; i++)
        if (p->c[i].started) pthread_join(p->c[i].th, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done_cv);
    tdm__free(p);
}
