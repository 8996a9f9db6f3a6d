/*
 * kvx_pyserver.c -- a prefill engine for the pyzmq client test (kvx_pyclient.py): listens on
 * an ephemeral tcp port, prints "endpoint <ep>", exports request 42 (blocks 0..7 of a vLLM NHD
 * fp16 cache whose layer L is filled with the byte L), prints the first event of that
 * transfer ("event <type> <status> <bytes>") and exits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem.h"

int main(void)
{
    tdm_kvx_config c;
    tdm_kvx_config_init(&c);
    c.engine_id = "py-prefill";
    c.role = TDM_KVX_ROLE_PREFILL;
    c.listen_endpoint = "tcp://127.0.0.1:*";
    c.peer_timeout_ms = 10000;
    tdm_kvx *k;
    if (tdm_kvx_create(&c, &k)) { printf("error %s\n", tdm_kvx_errmsg(NULL)); return 1; }
    tdm_kv_layout l;
    tdm_kv_layout_init(&l, TDM_KV_LAYOUT_VLLM_NHD, 32, 16, 16, 8, 128, TDM_DTYPE_FP16);
    size_t lb;
    tdm_kv_layout_layer_bytes(&l, &lb);
    void *b[32];
    for (int i = 0; i < 32; i++) {
        b[i] = malloc(lb);
        if (!b[i]) return 1;
        memset(b[i], i, lb);
    }
    uint32_t ids[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    tdm_kvx_send_desc sd;
    tdm_kvx_send_desc_init(&sd);
    sd.request_id = 42;
    sd.num_blocks = 8;
    sd.block_ids = ids;
    sd.num_blocks_ready = 8;
    uint64_t h;
    char ep[256];
    if (tdm_kvx_register(k, &l, b, TDM_MEM_HOST, 0) || tdm_kvx_send(k, &sd, &h) ||
        tdm_kvx_get_endpoint(k, ep, sizeof(ep))) {
        printf("error %s\n", tdm_kvx_errmsg(k));
        return 1;
    }
    printf("endpoint %s\n", ep);
    fflush(stdout);
    tdm_kvx_event ev;
    tdm_kvx_event_init(&ev);
    uint32_t n = 0;
    tdm_kvx_poll(k, &ev, 1, &n, 20000);
    printf("event %u %d %llu\n", n ? ev.type : 0, ev.status, (unsigned long long)ev.bytes);
    tdm_kvx_destroy(k);
    for (int i = 0; i < 32; i++) free(b[i]);
    return 0;
}
