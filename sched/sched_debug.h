/*
 * sched_debug.h -- internal consistency checks of a scheduler, for tests (not exported
 * from libtandem.so; tests link libtandem.a).
 */
#ifndef TANDEM_SCHED_DEBUG_H
#define TANDEM_SCHED_DEBUG_H

#include <stddef.h>
#include <stdint.h>
#include "tandem.h"

/* Verify every internal invariant of s: each block's refcount equals the number of live
 * block tables that hold it; free list = exactly the blocks with refcount 0 (null block
 * excluded); free + in use == total; the hash index maps only to hashed blocks and every
 * hashed block is indexed; running <= max_num_seqs; each request is in exactly one queue
 * that matches its state; the id map holds exactly the live requests. Returns TDM_OK, or
 * TDM_E_INTERNAL with a description of the first violation written into msg. */
int tdm__sched_check(const tdm_sched *s, char *msg, size_t msg_len);

/* Number of blocks currently referenced by at least one request (null block excluded). */
uint32_t tdm__sched_blocks_in_use(const tdm_sched *s);

/* The prefix cache seen from outside, for replaying KV events: the number of indexed
 * digests, and whether a digest (32 bytes, zero-padded) is indexed. */
uint32_t tdm__sched_num_cached(const tdm_sched *s);
int tdm__sched_is_cached(const tdm_sched *s, const uint8_t digest[32]);

#endif
