/*
 * kv_events.c -- the KV cache event queue (see kv_events.h): preallocation, the STORED /
 * REMOVED / ALL_CLEARED records, overflow accounting, and the drain that hands one buffer to
 * the host while the other is written. Block digests are copied with their meaningful
 * length: the host's digest size for host-supplied hashes, else the algorithm's.
 */
#include <string.h>

#include "kv_events.h"
#include "sched_internal.h"

#define STRIDE TDM_KV_EVENT_HASH_STRIDE

static void buf_free(tdm__kv_buf *b)
{
    tdm__free(b->kinds);
    tdm__free(b->hash_sizes);
    tdm__free(b->has_parent);
    tdm__free(b->hash_offsets);
    tdm__free(b->token_offsets);
    tdm__free(b->first_blocks);
    tdm__free(b->hashes);
    tdm__free(b->parents);
    tdm__free(b->tokens);
    tdm__free(b->req_ids);
    memset(b, 0, sizeof(*b));
}

static void buf_clear(tdm__kv_buf *b)
{
    b->num_events = b->num_hashes = b->num_tokens = 0;
    b->open = b->overflowed = false;
    b->dropped = 0;
    b->hash_offsets[0] = b->token_offsets[0] = 0;
}

static int buf_init(tdm__kv_buf *b, uint32_t cap, uint32_t bs)
{
    memset(b, 0, sizeof(*b));
    b->kinds = tdm__malloc(cap);
    b->hash_sizes = tdm__malloc(cap);
    b->has_parent = tdm__malloc(cap);
    b->hash_offsets = tdm__malloc(((size_t)cap + 1) * sizeof(uint32_t));
    b->token_offsets = tdm__malloc(((size_t)cap + 1) * sizeof(uint32_t));
    b->first_blocks = tdm__malloc((size_t)cap * sizeof(uint32_t));
    b->hashes = tdm__malloc((size_t)cap * STRIDE);
    b->parents = tdm__malloc((size_t)cap * STRIDE);
    b->tokens = tdm__malloc((size_t)cap * bs * sizeof(tdm_token));
    b->req_ids = tdm__malloc((size_t)cap * sizeof(uint64_t));
    if (!b->kinds || !b->hash_sizes || !b->has_parent || !b->hash_offsets || !b->token_offsets ||
        !b->first_blocks || !b->hashes || !b->parents || !b->tokens || !b->req_ids) {
        buf_free(b);
        return TDM_E_NOMEM;
    }
    buf_clear(b);
    return TDM_OK;
}

int tdm__kv_init(tdm__kv_events *ev, uint32_t cap, uint32_t block_size, uint32_t num_blocks)
{
    uint64_t kept = ev->dropped_total;
    memset(ev, 0, sizeof(*ev));
    ev->dropped_total = kept;
    ev->block_hash_size = tdm__calloc(num_blocks, 1);
    if (!ev->block_hash_size || buf_init(&ev->buf[0], cap, block_size) ||
        buf_init(&ev->buf[1], cap, block_size)) {
        tdm__kv_free(ev);
        return TDM_E_NOMEM;
    }
    ev->cap = cap;
    ev->block_size = block_size;
    ev->num_blocks = num_blocks;
    ev->ready = true;
    return TDM_OK;
}

void tdm__kv_free(tdm__kv_events *ev)
{
    uint64_t kept = ev->dropped_total;
    buf_free(&ev->buf[0]);
    buf_free(&ev->buf[1]);
    tdm__free(ev->block_hash_size);
    memset(ev, 0, sizeof(*ev));
    ev->dropped_total = kept;
}

/* One more event lost: recording stops until the next drain, so that the batch is exactly
 * the events up to the overflow. */
static void drop(tdm__kv_events *ev, tdm__kv_buf *b)
{
    b->overflowed = true;
    b->open = false;
    b->dropped++;
    ev->dropped_total++;
}

/* Open an event of `kind`: false (and counted) if the queue is full. */
static bool open_event(tdm__kv_events *ev, tdm__kv_buf *b, uint8_t kind, uint8_t hash_size)
{
    if (b->overflowed || b->num_events >= ev->cap) {
        drop(ev, b);
        return false;
    }
    uint32_t e = b->num_events++;
    b->kinds[e] = kind;
    b->hash_sizes[e] = hash_size;
    b->has_parent[e] = 0;
    memset(b->parents + (size_t)e * STRIDE, 0, STRIDE);
    b->req_ids[e] = 0;
    b->first_blocks[e] = 0;
    b->hash_offsets[e + 1] = b->num_hashes;
    b->token_offsets[e + 1] = b->num_tokens;
    b->open = false;
    return true;
}

static void put_hash(tdm__kv_buf *b, const tdm__digest *h, uint8_t size)
{
    uint8_t *dst = b->hashes + (size_t)b->num_hashes * STRIDE;
    memcpy(dst, h, size);
    memset(dst + size, 0, STRIDE - size);
    b->num_hashes++;
    b->hash_offsets[b->num_events] = b->num_hashes;
}

void tdm__kv_removed(tdm__kv_events *ev, uint32_t block, const tdm__digest *h)
{
    tdm__kv_buf *b = &ev->buf[ev->cur];
    uint8_t size = block < ev->num_blocks && ev->block_hash_size[block] ? ev->block_hash_size[block]
                                                                      : (uint8_t)TDM__DIGEST_MAX;
    if (b->overflowed || b->num_hashes >= ev->cap) {
        drop(ev, b);
        return;
    }
    if (!open_event(ev, b, TDM_KV_EVENT_REMOVED, size)) return;
    put_hash(b, h, size);
}

bool tdm__kv_reset_is_clear(const tdm__pool *p)
{
    for (uint32_t b = 1; b < p->num_blocks; b++)
        if (p->blk[b].hashed && p->blk[b].refcnt != 0) return false;
    return true;
}

void tdm__kv_cleared(tdm__kv_events *ev)
{
    tdm__kv_buf *b = &ev->buf[ev->cur];
    (void)open_event(ev, b, TDM_KV_EVENT_ALL_CLEARED, 0);
}

void tdm__kv_cache_blocks(tdm_sched *s, tdm__req *r, uint32_t from, uint32_t to)
{
    tdm__kv_events *ev = s->pool.ev;
    tdm__kv_buf *b = ev ? &ev->buf[ev->cur] : NULL;
    uint32_t bs = (uint32_t)s->prm.block_size;
    uint8_t size = (uint8_t)(r->host_hash_size ? r->host_hash_size : tdm__hash_len((int)s->prm.prefix_hash));
    if (b) b->open = false;
    for (uint32_t i = from; i < to; i++) {
        if (!tdm__pool_cache(&s->pool, r->blocks[i], *tdm__req_digest(r, i))) {
            if (b) b->open = false; /* not indexed (an equal digest is cached): the run ends */
            continue;
        }
        if (!b) continue;
        if (b->overflowed || b->num_hashes >= ev->cap || (!b->open && b->num_events >= ev->cap)) {
            drop(ev, b);
            continue;
        }
        if (!b->open) {
            (void)open_event(ev, b, TDM_KV_EVENT_STORED, size);
            uint32_t e = b->num_events - 1;
            b->req_ids[e] = r->id;
            b->first_blocks[e] = i;
            if (i > 0) {
                b->has_parent[e] = 1;
                memcpy(b->parents + (size_t)e * STRIDE, tdm__req_digest(r, i - 1), size);
            }
            b->open = true;
        }
        put_hash(b, tdm__req_digest(r, i), size);
        memcpy(b->tokens + b->num_tokens, r->tokens + (size_t)i * bs, (size_t)bs * sizeof(tdm_token));
        b->num_tokens += bs;
        b->token_offsets[b->num_events] = b->num_tokens;
        ev->block_hash_size[r->blocks[i]] = size;
    }
    if (b) b->open = false;
}

void tdm__kv_drain(tdm__kv_events *ev, tdm_kv_event_batch *o)
{
    tdm__kv_buf *b = &ev->buf[ev->cur];
    o->num_events = b->num_events;
    o->kinds = b->kinds;
    o->hash_sizes = b->hash_sizes;
    o->hash_offsets = b->hash_offsets;
    o->hashes = b->hashes;
    o->has_parent = b->has_parent;
    o->parent_hashes = b->parents;
    o->token_offsets = b->token_offsets;
    o->token_ids = b->tokens;
    o->req_ids = b->req_ids;
    o->first_blocks = b->first_blocks;
    o->block_size = ev->block_size;
    o->overflowed = b->overflowed;
    o->num_dropped = b->dropped;
    ev->cur ^= 1;
    buf_clear(&ev->buf[ev->cur]);
}
