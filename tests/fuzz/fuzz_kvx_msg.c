/*
 * fuzz_kvx_msg.c -- libFuzzer harness for the KV transfer protocol's header decoder
 * (tdm__kvx_msg_decode, the only code that parses bytes from the network). Any input must be
 * decoded or refused without a crash, an out-of-bounds read or an allocation; a message that
 * decodes must encode again and decode to the same fields (round trip; KV scales finite and
 * > 0), its strings must be NUL-terminated within their buffers, and any shared-memory name it
 * carries must be an engine-generated one (tdm__kvx_shm_name_parse) with a segment size of
 * 1..1024 whole slots. The seed corpus is tests/fuzz/corpus/kvx_msg/
 * (made by tests/fuzz/gen_kvx_msg_corpus.c: `make kvx-corpus`).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../kv_transfer/kvx_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tdm__kvx_msg m, m2;
    char why[128];
    if (tdm__kvx_msg_decode(data, size, &m, why, sizeof(why)) != TDM_OK) {
        if (memchr(why, 0, sizeof(why)) == NULL) abort();
        return 0;
    }
    if (!memchr(m.reason, 0, sizeof(m.reason)) || !memchr(m.hello.engine_id, 0, sizeof(m.hello.engine_id)) ||
        !memchr(m.hello.host_id, 0, sizeof(m.hello.host_id)) || !memchr(m.hello.shm_name, 0, sizeof(m.hello.shm_name)) ||
        !memchr(m.hello.kv_name, 0, sizeof(m.hello.kv_name)))
        abort();
    if (m.type == TDM__KVX_HELLO || m.type == TDM__KVX_HELLO_ACK) {
        const tdm__kvx_hello *h = &m.hello;
        if (h->shm_name[0] && (!tdm__kvx_shm_name_parse(h->shm_name, 't', NULL, NULL) || h->slot_bytes == 0 ||
                               h->shm_size % h->slot_bytes || h->shm_size / h->slot_bytes == 0 ||
                               h->shm_size / h->slot_bytes > TDM__KVX_MAX_SHM_SLOTS))
            abort();
        if (h->kv_name[0] && (!tdm__kvx_shm_name_parse(h->kv_name, 'k', NULL, NULL) || h->kv_size == 0))
            abort();
    }
    static uint8_t buf[TDM__KVX_MAX_HELLO];
    size_t len;
    if (tdm__kvx_msg_encode(&m, buf, sizeof(buf), &len) != TDM_OK) abort();
    if (tdm__kvx_msg_decode(buf, len, &m2, why, sizeof(why)) != TDM_OK) abort();
    if (m.type != m2.type || m.rid != m2.rid || m.xid != m2.xid || m.nbytes != m2.nbytes ||
        m.block_begin != m2.block_begin || m.block_count != m2.block_count || m.status != m2.status ||
        m.slot != m2.slot || strcmp(m.reason, m2.reason) != 0 || strcmp(m.hello.shm_name, m2.hello.shm_name) != 0 ||
        strcmp(m.hello.kv_name, m2.hello.kv_name) != 0 || m.hello.shm_size != m2.hello.shm_size ||
        m.hello.kv_size != m2.hello.kv_size ||
        memcmp(&m.hello.layout, &m2.hello.layout, sizeof(m.hello.layout)) != 0 ||
        m.hello.scale_kind != m2.hello.scale_kind || m.hello.scale_count != m2.hello.scale_count)
        abort();
    /* KV scales: finite, > 0 and the same after the round trip */
    uint32_t ns = m.hello.scale_kind ? m.hello.layout.num_layers * m.hello.scale_count : 0;
    for (uint32_t i = 0; i < ns; i++)
        for (int kv = 0; kv < 2; kv++) {
            float a = tdm__kvx_hello_scale(&m.hello, kv, i), b = tdm__kvx_hello_scale(&m2.hello, kv, i);
            if (!(a > 0.0f) || a != b || a - a != 0.0f) abort();
        }
    return 0;
}
