/*
 * kvx_tp_zmq.c -- the ZeroMQ transport (tcp or ipc, whatever the peer connection uses): a
 * chunk is packed into a buffer from a small pool and handed to ZeroMQ without a copy
 * (zmq_msg_init_data); ZeroMQ's free callback, which runs on one of its own threads, returns
 * the buffer to the pool and wakes the engine's I/O thread. The pool size bounds the bytes
 * in flight per engine (back-pressure). The receiver reads the payload frame in place.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "kvx_internal.h"

struct tdm__kvx_pool {
    pthread_mutex_t mu;
    size_t buf_bytes;
    uint32_t count, made, nfree;
    void **free_list;
    int wake_fd;
};

int tdm__kvx_pool_create(size_t buf_bytes, uint32_t count, int wake_fd, tdm__kvx_pool **out)
{
    tdm__kvx_pool *p = tdm__calloc(1, sizeof(*p));
    if (!p) return TDM_E_NOMEM;
    p->free_list = tdm__calloc(count, sizeof(void *));
    if (!p->free_list) { tdm__free(p); return TDM_E_NOMEM; }
    pthread_mutex_init(&p->mu, NULL);
    p->buf_bytes = buf_bytes;
    p->count = count;
    p->wake_fd = wake_fd;
    *out = p;
    return TDM_OK;
}

void tdm__kvx_pool_destroy(tdm__kvx_pool *p)
{
    if (!p) return;
    for (uint32_t i = 0; i < p->nfree; i++) tdm__free(p->free_list[i]);
    tdm__free(p->free_list);
    pthread_mutex_destroy(&p->mu);
    tdm__free(p);
}

static int zmq_acquire(void *ctx, size_t nbytes, void **buf, uint32_t *slot)
{
    tdm__kvx_pool *p = ctx;
    if (nbytes > p->buf_bytes) return TDM_E_INTERNAL;
    void *b = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->nfree) b = p->free_list[--p->nfree];
    else if (p->made < p->count) {
        b = tdm__malloc(p->buf_bytes);
        if (b) p->made++;
    }
    int blocked = !b && p->made >= p->count;
    pthread_mutex_unlock(&p->mu);
    if (!b) return blocked ? TDM_E_AGAIN : TDM_E_NOMEM;
    *buf = b;
    *slot = TDM__KVX_NO_SLOT;
    return TDM_OK;
}

static void pool_put(tdm__kvx_pool *p, void *b)
{
    pthread_mutex_lock(&p->mu);
    p->free_list[p->nfree++] = b;
    pthread_mutex_unlock(&p->mu);
}

/* Runs on a ZeroMQ I/O thread once the frame has been sent (or dropped). */
static void zmq_free_cb(void *data, void *hint)
{
    tdm__kvx_pool *p = hint;
    pool_put(p, data);
    uint64_t one = 1;
    ssize_t r = write(p->wake_fd, &one, sizeof(one));
    (void)r;
}

static int zmq_make_frame(void *ctx, void *buf, size_t nbytes, zmq_msg_t *frame)
{
    if (zmq_msg_init_data(frame, buf, nbytes, zmq_free_cb, ctx) != 0) return TDM_E_IO;
    return TDM_OK;
}

static void zmq_abandon(void *ctx, void *buf, uint32_t slot)
{
    (void)slot;
    pool_put(ctx, buf);
}

static int zmq_resolve(void *ctx, zmq_msg_t *frame, uint32_t slot, size_t nbytes, const void **bytes)
{
    (void)ctx;
    if (!frame || slot != TDM__KVX_NO_SLOT) return TDM_E_PROTOCOL;
    if (zmq_msg_size(frame) != nbytes) return TDM_E_PROTOCOL;
    *bytes = zmq_msg_data(frame);
    return TDM_OK;
}

const tdm__kvx_transport tdm__kvx_zmq_transport = {
    .version = TDM__KVX_TRANSPORT_VERSION,
    .name = "zmq",
    .kind = TDM_KVX_TRANSPORT_ZMQ,
    .acquire = zmq_acquire,
    .make_frame = zmq_make_frame,
    .abandon = zmq_abandon,
    .credit = NULL,
    .resolve = zmq_resolve,
    .destroy = NULL,
};
