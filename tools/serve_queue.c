/*
 * serve_queue.c -- large requests of `tandem serve` are decoded on a worker thread while the
 * service goes on serving the others (docs/service.md, "Large requests"). The loop hands a
 * request over when it is larger than TDM_SERVE_SMALL_MSG, or when its client already has one
 * queued (a client's requests are answered in the order it sent them). The worker runs the
 * pre-check and msgpack-c's decoder, which touch no service state; the loop then runs the op
 * on its own thread, so instances still need no locking. The queue holds at most
 * TDM_SERVE_QUEUE_ITEMS requests and 2 x --max-msg bytes; beyond, a request gets -9 AGAIN
 * at once. One request is decoded at a time, on a thread of lower priority (nice 10).
 */
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve.h"

static void item_free(tdm__serve_item *it)
{
    for (int i = 0; i < it->nframes; i++) zmq_msg_close(&it->frames[i]);
    msgpack_unpacked_destroy(&it->up);
    tdm__serve_pre_free(&it->pre);
    free(it);
}

static void *worker(void *arg)
{
    tdm__serve_queue *q = arg;
    /* Linux nices threads one by one: decoding yields the CPU to the loop and ZeroMQ's I/O
     * thread, which serve everyone else (best effort: an error changes nothing) */
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10) != 0) {
    }
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->garbage) { /* answered ones: their frees (munmap) cost the loop nothing */
            tdm__serve_item *g = q->garbage;
            q->garbage = NULL;
            pthread_mutex_unlock(&q->mu);
            while (g) {
                tdm__serve_item *next = g->next;
                item_free(g);
                g = next;
            }
            pthread_mutex_lock(&q->mu);
        }
        tdm__serve_item *it = q->head;
        while (it && it->state != TDM__SERVE_ITEM_QUEUED) it = it->next;
        if (!it) {
            if (q->stop) break;
            pthread_cond_wait(&q->cv, &q->mu);
            continue;
        }
        it->state = TDM__SERVE_ITEM_DECODING;
        pthread_mutex_unlock(&q->mu);
        it->rc = tdm__serve_decode(zmq_msg_data(&it->frames[it->body]),
                                   zmq_msg_size(&it->frames[it->body]), &it->up, &it->e);
        if (it->rc == 0) tdm__serve_pre_run(q->hashcfgs, &it->up.data, &it->pre); /* an add's */
        pthread_mutex_lock(&q->mu);
        it->state = TDM__SERVE_ITEM_DONE;
        char b = 1;
        if (write(q->wake[1], &b, 1) < 0) { /* full pipe: the loop is awake anyway */ }
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

int tdm__serve_queue_start(tdm__serve_queue *q, size_t max_bytes)
{
    memset(q, 0, sizeof *q);
    q->wake[0] = q->wake[1] = -1;
    q->max_bytes = max_bytes;
    if (pipe(q->wake) != 0) return -1;
    for (int i = 0; i < 2; i++) {
        fcntl(q->wake[i], F_SETFL, fcntl(q->wake[i], F_GETFL) | O_NONBLOCK);
        fcntl(q->wake[i], F_SETFD, FD_CLOEXEC);
    }
    q->hashcfgs = malloc(sizeof *q->hashcfgs);
    if (!q->hashcfgs) {
        close(q->wake[0]);
        close(q->wake[1]);
        q->wake[0] = q->wake[1] = -1;
        return -1;
    }
    tdm__serve_hashcfgs_init(q->hashcfgs);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    if (pthread_create(&q->thread, NULL, worker, q) != 0) {
        tdm__serve_hashcfgs_free(q->hashcfgs);
        free(q->hashcfgs);
        q->hashcfgs = NULL;
        close(q->wake[0]);
        close(q->wake[1]);
        q->wake[0] = q->wake[1] = -1;
        pthread_mutex_destroy(&q->mu);
        pthread_cond_destroy(&q->cv);
        return -1;
    }
    q->started = 1;
    return 0;
}

void tdm__serve_queue_stop(tdm__serve_queue *q)
{
    if (!q->started) return;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    while (q->garbage) {
        tdm__serve_item *n = q->garbage->next;
        item_free(q->garbage);
        q->garbage = n;
    }
    while (q->head) {
        tdm__serve_item *n = q->head->next;
        item_free(q->head);
        q->head = n;
    }
    close(q->wake[0]);
    close(q->wake[1]);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    tdm__serve_hashcfgs_free(q->hashcfgs);
    free(q->hashcfgs);
    q->hashcfgs = NULL;
    q->started = 0;
}

int tdm__serve_queue_has(tdm__serve_queue *q, const void *rtid, size_t len)
{
    int found = 0;
    pthread_mutex_lock(&q->mu);
    for (tdm__serve_item *it = q->head; it && !found; it = it->next)
        found = zmq_msg_size(&it->frames[0]) == len && !memcmp(zmq_msg_data(&it->frames[0]), rtid, len);
    pthread_mutex_unlock(&q->mu);
    return found;
}

int tdm__serve_queue_push(tdm__serve_queue *q, zmq_msg_t *frames, int n, int nenv,
                          const tdm__serve_caller *who, int rc, const tdm__serve_err *e)
{
    size_t bytes = zmq_msg_size(&frames[n - 1]);
    pthread_mutex_lock(&q->mu);
    int full = q->count >= TDM_SERVE_QUEUE_ITEMS || (rc == 0 && q->bytes + bytes > q->max_bytes);
    pthread_mutex_unlock(&q->mu);
    if (full) return TDM_E_AGAIN;
    tdm__serve_item *it = calloc(1, sizeof *it);
    if (!it) return TDM_E_NOMEM;
    for (int i = 0; i < n; i++) {
        zmq_msg_init(&it->frames[i]);
        zmq_msg_move(&it->frames[i], &frames[i]);
    }
    it->nframes = n;
    it->nenv = nenv;
    it->body = n - 1;
    it->who = *who;
    msgpack_unpacked_init(&it->up);
    it->rc = rc;
    if (e) it->e = *e;
    it->bytes = rc ? 0 : bytes;
    it->state = rc ? TDM__SERVE_ITEM_DONE : TDM__SERVE_ITEM_QUEUED;
    pthread_mutex_lock(&q->mu);
    if (q->tail) q->tail->next = it;
    else q->head = it;
    q->tail = it;
    q->count++;
    q->bytes += it->bytes;
    if (q->bytes > q->peak_bytes) q->peak_bytes = q->bytes;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

tdm__serve_item *tdm__serve_queue_pop(tdm__serve_queue *q)
{
    char buf[64];
    while (read(q->wake[0], buf, sizeof buf) > 0) {
    }
    tdm__serve_item *it = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->head && q->head->state == TDM__SERVE_ITEM_DONE) {
        it = q->head;
        q->head = it->next;
        if (!q->head) q->tail = NULL;
        q->count--;
        q->bytes -= it->bytes;
    }
    pthread_mutex_unlock(&q->mu);
    return it;
}

void tdm__serve_item_free(tdm__serve_item *it)
{
    if (it) item_free(it);
}

void tdm__serve_queue_recycle(tdm__serve_queue *q, tdm__serve_item *it)
{
    if (!it) return;
    pthread_mutex_lock(&q->mu);
    it->next = q->garbage;
    q->garbage = it;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}
