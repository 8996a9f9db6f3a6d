/*
 * kvx_tp_shm.c -- POSIX shared memory for peers on the same host: the segments, their names,
 * the checks a peer-named segment must pass, the start-up sweep of dead owners' segments, and
 * the shared-memory transport. Trust model (docs/protocol.md §5): every segment is created by
 * the side that writes it (shm_open O_CREAT|O_EXCL, mode 0600) under a name it generates,
 * "/tdm-kvx-NS-PID-TAG-RAND" (its pid namespace, its pid, a tag, 64 random bits); the other
 * side opens it O_RDONLY and maps it PROT_READ, only after the name has the engine pattern and
 * fstat shows a regular object of our uid, mode 0600, of exactly the size the handshake named.
 * Nobody ever writes into or unlinks a segment a peer named: only the creator unlinks its name,
 * as soon as the peer has mapped it (or the peer is gone), and an engine starting up removes
 * the segments of owners that died (same uid, same pid namespace, pid no longer alive).
 * A peer pair has at most two segments, one per direction; each is cut into slots: the sender
 * packs a chunk straight into one of its free slots (the single copy), the DATA message names
 * the slot, the receiver unpacks from it and returns the slot with a CREDIT message.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvx_internal.h"

struct tdm__kvx_shm {
    /* ours: we write it, the peer reads it */
    uint8_t *tx;
    size_t tx_size, slot_bytes;
    uint32_t slots;
    uint8_t *busy;               /* [slots] */
    uint32_t nbusy;
    int named;                   /* our name is still in /dev/shm */
    char name[TDM__KVX_ID_LEN];
    /* the peer's: mapped read-only */
    const uint8_t *rx;
    size_t rx_size, rx_slot_bytes;
    uint32_t rx_slots;
};

/* ---- names, creation, checked opening, sweep ---------------------------------------------- */

static uint64_t own_pidns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static int random64(uint64_t *v)
{
    uint8_t b[8];
    size_t got = 0;
    while (got < sizeof(b)) {
        ssize_t r = getrandom(b + got, sizeof(b) - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return TDM_E_IO;
        got += (size_t)r;
    }
    memcpy(v, b, sizeof(*v));
    return TDM_OK;
}

int tdm__kvx_seg_create(const char *tag, size_t size, char *name, size_t name_len, uint8_t **map)
{
    uint64_t rnd;
    if (random64(&rnd)) return tdm__kvx_fail(TDM_E_IO, "getrandom: %s", strerror(errno));
    snprintf(name, name_len, "/tdm-kvx-%llu-%d-%s-%016llx", (unsigned long long)own_pidns(), (int)getpid(), tag,
             (unsigned long long)rnd);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return tdm__kvx_fail(TDM_E_IO, "shm_open %s: %s", name, strerror(errno));
    void *m = MAP_FAILED;
    if (ftruncate(fd, (off_t)size) == 0) m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED) {
        shm_unlink(name);   /* ours: created just now */
        return tdm__kvx_fail(TDM_E_IO, "cannot size or map %zu bytes of shared memory: %s", size, strerror(err));
    }
    *map = m;
    return TDM_OK;
}

int tdm__kvx_seg_open_ro(const char *name, int kind, uint64_t size, const uint8_t **map, char *why, size_t why_len)
{
    if (!tdm__kvx_shm_name_parse(name, kind, NULL, NULL)) {
        snprintf(why, why_len, "segment name is not an engine-generated one");
        return TDM_E_PROTOCOL;
    }
    if (size == 0 || size > ((uint64_t)1 << 40)) {
        snprintf(why, why_len, "segment size %llu out of range", (unsigned long long)size);
        return TDM_E_PROTOCOL;
    }
    /* O_NONBLOCK: a FIFO planted under an engine-like name must not block us (S_ISREG below) */
    int fd = shm_open(name, O_RDONLY | O_NONBLOCK | O_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        snprintf(why, why_len, "cannot open segment %s: %s", name, strerror(err));
        return err == ENOENT || err == EACCES ? TDM_E_NOT_FOUND : TDM_E_IO;
    }
    struct stat st;
    int rc = TDM_E_PROTOCOL;
    if (fstat(fd, &st) != 0) { snprintf(why, why_len, "fstat: %s", strerror(errno)); rc = TDM_E_IO; }
    else if (!S_ISREG(st.st_mode)) snprintf(why, why_len, "segment %s is not a shared-memory object", name);
    else if (st.st_uid != geteuid()) snprintf(why, why_len, "segment %s belongs to uid %u, not ours", name, (unsigned)st.st_uid);
    else if (st.st_mode & 077) snprintf(why, why_len, "segment %s has mode %03o, not 0600", name, (unsigned)(st.st_mode & 0777));
    else if ((uint64_t)st.st_size != size)
        snprintf(why, why_len, "segment %s has %llu bytes, the handshake said %llu", name,
                 (unsigned long long)st.st_size, (unsigned long long)size);
    else {
        void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) { snprintf(why, why_len, "mmap: %s", strerror(errno)); rc = TDM_E_IO; }
        else { *map = m; rc = TDM_OK; }
    }
    close(fd);
    return rc;
}

void tdm__kvx_shm_sweep(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    uint64_t ns = own_pidns(), me = (uint64_t)getpid();
    uid_t uid = geteuid();
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char name[TDM__KVX_ID_LEN + 1];
        uint64_t ons, pid;
        if (strncmp(e->d_name, "tdm-kvx-", 8) != 0 || strlen(e->d_name) >= TDM__KVX_ID_LEN - 1) continue;
        name[0] = '/';
        memcpy(name + 1, e->d_name, strlen(e->d_name) + 1);   /* length checked above */
        if (!tdm__kvx_shm_name_parse(name, 0, &ons, &pid) || ons != ns || pid == me || pid > 0x7fffffffu) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;   /* alive (or not ours to ask) */
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_uid != uid)
            continue;
        shm_unlink(name);
    }
    closedir(d);
}

/* ---- the pair's segments ------------------------------------------------------------------ */

int tdm__kvx_shm_new(tdm__kvx_shm **out)
{
    tdm__kvx_shm *s = tdm__calloc(1, sizeof(*s));
    if (!s) return TDM_E_NOMEM;
    *out = s;
    return TDM_OK;
}

int tdm__kvx_shm_create(tdm__kvx_shm *s, size_t slot_bytes, uint32_t slots, unsigned seq)
{
    char tag[16];
    snprintf(tag, sizeof(tag), "tx%u", seq);
    size_t size = (size_t)slots * slot_bytes;
    s->busy = tdm__calloc(slots, 1);
    if (!s->busy) return TDM_E_NOMEM;
    int rc = tdm__kvx_seg_create(tag, size, s->name, sizeof(s->name), &s->tx);
    if (rc) { tdm__free(s->busy); s->busy = NULL; return rc; }
    s->named = 1;
    s->tx_size = size;
    s->slot_bytes = slot_bytes;
    s->slots = slots;
    return TDM_OK;
}

int tdm__kvx_shm_attach(tdm__kvx_shm *s, const char *name, uint64_t size, size_t slot_bytes, char *why, size_t why_len)
{
    if (s->rx) { snprintf(why, why_len, "a peer segment is already mapped"); return TDM_E_PROTOCOL; }
    if (slot_bytes == 0 || size % slot_bytes || size / slot_bytes == 0 || size / slot_bytes > TDM__KVX_MAX_SHM_SLOTS) {
        snprintf(why, why_len, "segment size is not 1..%u slots", TDM__KVX_MAX_SHM_SLOTS);
        return TDM_E_PROTOCOL;
    }
    int rc = tdm__kvx_seg_open_ro(name, 't', size, &s->rx, why, why_len);
    if (rc) return rc;
    s->rx_size = (size_t)size;
    s->rx_slot_bytes = slot_bytes;
    s->rx_slots = (uint32_t)(size / slot_bytes);
    return TDM_OK;
}

const char *tdm__kvx_shm_name(const tdm__kvx_shm *s) { return s->tx ? s->name : ""; }
uint64_t tdm__kvx_shm_size(const tdm__kvx_shm *s) { return s->tx_size; }
int tdm__kvx_shm_can_send(const tdm__kvx_shm *s) { return s && s->tx != NULL; }
int tdm__kvx_shm_can_recv(const tdm__kvx_shm *s) { return s && s->rx != NULL; }
int tdm__kvx_shm_named(const tdm__kvx_shm *s) { return s && s->named; }

void tdm__kvx_shm_unlink(tdm__kvx_shm *s)
{
    if (s && s->named) {
        shm_unlink(s->name);
        s->named = 0;
    }
}

void tdm__kvx_shm_drop_tx(tdm__kvx_shm *s)
{
    if (!s || !s->tx) return;
    tdm__kvx_shm_unlink(s);
    munmap(s->tx, s->tx_size);
    tdm__free(s->busy);
    s->tx = NULL;
    s->busy = NULL;
    s->tx_size = 0;
    s->slots = s->nbusy = 0;
}

void tdm__kvx_shm_destroy(tdm__kvx_shm *s)
{
    if (!s) return;
    tdm__kvx_shm_drop_tx(s);
    if (s->rx) munmap((void *)s->rx, s->rx_size);
    tdm__free(s);
}

/* ---- the transport ------------------------------------------------------------------------ */

static int shm_acquire(void *ctx, size_t nbytes, void **buf, uint32_t *slot)
{
    tdm__kvx_shm *s = ctx;
    if (!s->tx || nbytes > s->slot_bytes) return TDM_E_INTERNAL;
    if (s->nbusy == s->slots) return TDM_E_AGAIN;
    for (uint32_t i = 0; i < s->slots; i++) {
        if (s->busy[i]) continue;
        s->busy[i] = 1;
        s->nbusy++;
        *buf = s->tx + (size_t)i * s->slot_bytes;
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
    if (frame || !s->rx || slot >= s->rx_slots || nbytes > s->rx_slot_bytes) return TDM_E_PROTOCOL;
    *bytes = s->rx + (size_t)slot * s->rx_slot_bytes;
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
