/*
 * tandem_kvx.h -- the KV transfer engine (tdm_kvx): peers, handshake, transfers of paged
 * KV blocks between a prefill and a decode engine, completion events.
 * Part of Tandem's public ABI; included by tandem.h.
 */
#ifndef TANDEM_KVX_H
#define TANDEM_KVX_H

#include "tandem.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_KVX_H */
