/*
 * kvx_nixl_pool.h -- the copying threads of a NIXL engine that READs with several threads
 * (kvx_nixl_pool.c): each owns one UCX worker of the backend, posts the transfer requests
 * handed to it and polls them until they end. Internal to libtandem.
 */
#ifndef TANDEM_KVX_NIXL_POOL_H
#define TANDEM_KVX_NIXL_POOL_H

#include <stdint.h>

#include "kvx_nixl_api.h"

#define TDM__NX_POOL_GIVE_UP_S 5.0   /* an abandoned part still active this long is released */
#define TDM__NX_POOL_GAVE_UP (-1000) /* the status of a part released while still active */

/* One part of a READ: the I/O thread creates req on the thread's worker, the thread posts,
 * polls, releases and destroys it, then sets st (TDM__NX_OK, a NIXL error, or
 * TDM__NX_POOL_GAVE_UP) and queues the job as done. Owned by the I/O thread again once taken. */
typedef struct tdm__nx_job {
    struct tdm__nx_job *next;
    tdm__nx_req req;
    void *owner;                 /* the READ it belongs to */
    int st;
    int abandoned;               /* atomic: its transfer ended; give up after GIVE_UP_S */
    double abandon_at;
} tdm__nx_job;

typedef struct tdm__nx_pool tdm__nx_pool;

/* Starts `threads` copying threads over agent; each done part is signalled on wake_fd (an
 * eventfd). 0, or -1 (out of memory, no thread). */
int tdm__nx_pool_start(const tdm__nx_api *a, tdm__nx_agent agent, uint32_t threads, int wake_fd, tdm__nx_pool **out);
/* Hands j (req created on worker `thread`) to that thread. */
void tdm__nx_pool_submit(tdm__nx_pool *p, uint32_t thread, tdm__nx_job *j);
/* Marks j's transfer as ended: the thread still waits for the part to end, up to GIVE_UP_S. */
void tdm__nx_pool_abandon(tdm__nx_job *j);
/* The parts that ended since the last call (a list), waiting up to wait_s for one. */
tdm__nx_job *tdm__nx_pool_take(tdm__nx_pool *p, double wait_s);
uint32_t tdm__nx_pool_threads(const tdm__nx_pool *p);
/* Stops the threads once their parts have ended (abandon them first), joins, frees. */
void tdm__nx_pool_stop(tdm__nx_pool *p);

#endif /* TANDEM_KVX_NIXL_POOL_H */
