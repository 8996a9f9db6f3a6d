/*
 * kvx_tp_shm.c -- the shared-memory transport for peers on the same host. The connecting side
 * creates one POSIX shared-memory segment per peer pair (shm_open with O_EXCL, mode 0600) and
 * names it in its HELLO; the accepting side maps it and unlinks the name, so nothing is left
 * in /dev/shm once both have mapped it (the creator unlinks too, for a peer that never came).
 * The segment is two halves of equal slots: client->server, then server->client. The sender
 * packs a chunk straight into one of its free slots (the single copy), the DATA message names
 * the slot, the receiver unpacks from it and returns the slot with a CREDIT message.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvx_internal.h"

struct tdm__kvx_shm {
    uint8_t *base;
    size_t size, slot_bytes;
    uint32_t slots;              /* per half */
    int server;                  /* we write the second half */
    uint8_t *busy;               /* [slots] of our half */
    uint32_t nbusy;
    int created;
    char name[TDM__KVX_ID_LEN];
};

static int shm_init(tdm__kvx_shm *s, int fd, size_t size, size_t slot_bytes)
{
    s->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s->base == MAP_FAILED) { s->base = NULL; return TDM_E_IO; }
    s->size = size;
    s->slot_bytes = slot_bytes;
    s->slots = (uint32_t)(size / 2 / slot_bytes);
    s->busy = tdm__calloc(s->slots ? s->slots : 1, 1);
    if (!s->busy) return TDM_E_NOMEM;
    return TDM_OK;
}

int tdm__kvx_shm_create(size_t slot_bytes, uint32_t slots, unsigned seq, tdm__kvx_shm **out,
                        char *name, size_t name_len)
{
    tdm__kvx_shm *s = tdm__calloc(1, sizeof(*s));
    if (!s) return TDM_E_NOMEM;
    size_t size = 2 * (size_t)slots * slot_bytes;
    snprintf(s->name, sizeof(s->name), "/tdm-kvx-%d-%u-%lx", (int)getpid(), seq,
             (unsigned long)((uintptr_t)s >> 4));
    int fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) { tdm__free(s); return TDM_E_IO; }
    s->created = 1;
    int rc = ftruncate(fd, (off_t)size) == 0 ? shm_init(s, fd, size, slot_bytes) : TDM_E_IO;
    close(fd);
    if (rc) { tdm__kvx_shm_destroy(s); return rc; }
    snprintf(name, name_len, "%s", s->name);
    *out = s;
    return TDM_OK;
}

int tdm__kvx_shm_open(const char *name, size_t size, size_t slot_bytes, tdm__kvx_shm **out)
{
    if (slot_bytes == 0 || size < 2 * slot_bytes || size > ((size_t)1 << 36)) return TDM_E_PROTOCOL;
    tdm__kvx_shm *s = tdm__calloc(1, sizeof(*s));
    if (!s) return TDM_E_NOMEM;
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) { tdm__free(s); return TDM_E_IO; }
    shm_unlink(name);
    struct stat st;
    int rc = TDM_E_IO;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size == size) rc = shm_init(s, fd, size, slot_bytes);
    close(fd);
    if (rc) { tdm__kvx_shm_destroy(s); return rc; }
    *out = s;
    return TDM_OK;
}

void tdm__kvx_shm_set_side(tdm__kvx_shm *s, int server) { s->server = server; }
uint64_t tdm__kvx_shm_size(const tdm__kvx_shm *s) { return s->size; }

void tdm__kvx_shm_destroy(tdm__kvx_shm *s)
{
    if (!s) return;
    if (s->base) munmap(s->base, s->size);
    if (s->created) shm_unlink(s->name);
    tdm__free(s->busy);
    tdm__free(s);
}

static uint8_t *half(tdm__kvx_shm *s, int second) { return s->base + (second ? s->size / 2 : 0); }

static int shm_acquire(void *ctx, size_t nbytes, void **buf, uint32_t *slot)
{
    tdm__kvx_shm *s = ctx;
    if (nbytes > s->slot_bytes) return TDM_E_INTERNAL;
    if (s->nbusy == s->slots) return TDM_E_AGAIN;
    for (uint32_t i = 0; i < s->slots; i++) {
        if (s->busy[i]) continue;
        s->busy[i] = 1;
        s->nbusy++;
        *buf = half(s, s->server) + (size_t)i * s->slot_bytes;
        *slot = i;
        return TDM_OK;
    }
    return TDM_E_AGAIN;
}

static void shm_abandon(void *ctx, void *buf, uint32_t slot)
{
    (void)buf;
    tdm__kvx_shm *s = ctx;
    if (slot < s->slots && s->busy[slot]) { s->busy[slot] = 0; s->nbusy--; }
}

static int shm_credit(void *ctx, uint32_t slot)
{
    tdm__kvx_shm *s = ctx;
    if (slot >= s->slots || !s->busy[slot]) return TDM_E_PROTOCOL;
    s->busy[slot] = 0;
    s->nbusy--;
    return TDM_OK;
}

static int shm_resolve(void *ctx, zmq_msg_t *frame, uint32_t slot, size_t nbytes, const void **bytes)
{
    tdm__kvx_shm *s = ctx;
    if (frame || slot >= s->slots || nbytes > s->slot_bytes) return TDM_E_PROTOCOL;
    *bytes = half(s, !s->server) + (size_t)slot * s->slot_bytes;
    return TDM_OK;
}

const tdm__kvx_transport tdm__kvx_shm_transport = {
    .version = TDM__KVX_TRANSPORT_VERSION,
    .name = "shm",
    .kind = TDM_KVX_TRANSPORT_SHM,
    .acquire = shm_acquire,
    .make_frame = NULL,
    .abandon = shm_abandon,
    .credit = shm_credit,
    .resolve = shm_resolve,
    .destroy = NULL,
};
