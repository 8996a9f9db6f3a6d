/*
 * compat.c -- a binary linked against ABI 1 as first published keeps working with this
 * library. Built by scripts/check-abi against build/libtandem.so (symbol versions exist only
 * in the shared object): it binds the TANDEM_1 versions of the initialisers of the structs
 * that grew since, as such a binary's references are bound, and checks that they fill only
 * the first published layout (bytes past it are left alone), that the library accepts
 * those shorter structs, and that the default versions fill the whole current struct.
 * Exits 0 when every check passes; prints each failure.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tandem.h"

int old_request_desc_init(tdm_request_desc *d);
int v1_1_request_desc_init(tdm_request_desc *d);
int old_sched_stats_init(tdm_sched_stats *st);
int old_kvx_stats_init(tdm_kvx_stats *s);
__asm__(".symver old_request_desc_init,tdm_request_desc_init@TANDEM_1");
__asm__(".symver v1_1_request_desc_init,tdm_request_desc_init@TANDEM_1.1");
__asm__(".symver old_sched_stats_init,tdm_sched_stats_init@TANDEM_1");
__asm__(".symver old_kvx_stats_init,tdm_kvx_stats_init@TANDEM_1");

#define CANARY 0xA5

static int failures;

static void check(int ok, const char *what)
{
    if (!ok) {
        printf("compat: FAIL %s\n", what);
        failures++;
    }
}

/* Bytes [from, size) of buf are all still CANARY. */
static int untouched(const void *buf, size_t from, size_t size)
{
    const unsigned char *p = buf;
    for (size_t i = from; i < size; i++)
        if (p[i] != CANARY) return 0;
    return 1;
}

int main(void)
{
    const size_t desc_v1 = offsetof(tdm_request_desc, block_hashes);
    const size_t stats_v1 = offsetof(tdm_sched_stats, kv_events_dropped);
    const size_t kvx_v1 = offsetof(tdm_kvx_stats, chunks_read_nixl);

    /* The old initialisers stop at the first published layout. */
    union { tdm_request_desc d; unsigned char b[sizeof(tdm_request_desc) + 16]; } du;
    memset(&du, CANARY, sizeof(du));
    check(old_request_desc_init(&du.d) == TDM_OK, "tdm_request_desc_init@TANDEM_1 returns TDM_OK");
    check(du.d.struct_size == desc_v1, "tdm_request_desc_init@TANDEM_1 sets the first layout's size");
    check(du.d.eos_token_id == -1 && du.d.max_tokens == 16 && du.d.tenant == 0,
          "tdm_request_desc_init@TANDEM_1 fills the first layout's defaults");
    check(untouched(&du, desc_v1, sizeof(du)), "tdm_request_desc_init@TANDEM_1 leaves the bytes past it");

    /* The TANDEM_1.1 initialiser stops before prefix_hit_limit (appended in TANDEM_1.2). */
    const size_t desc_v1_1 = offsetof(tdm_request_desc, prefix_hit_limit);
    memset(&du, CANARY, sizeof(du));
    check(v1_1_request_desc_init(&du.d) == TDM_OK && du.d.struct_size == desc_v1_1 &&
          du.d.block_hash_size == 0 && du.d.max_tokens == 16,
          "tdm_request_desc_init@TANDEM_1.1 fills the 1.1 layout");
    check(untouched(&du, desc_v1_1, sizeof(du)), "tdm_request_desc_init@TANDEM_1.1 leaves the bytes past it");
    memset(&du, CANARY, sizeof(du));
    (void)old_request_desc_init(&du.d);

    union { tdm_sched_stats s; unsigned char b[sizeof(tdm_sched_stats) + 16]; } su;
    memset(&su, CANARY, sizeof(su));
    check(old_sched_stats_init(&su.s) == TDM_OK && su.s.struct_size == stats_v1,
          "tdm_sched_stats_init@TANDEM_1 sets the first layout's size");
    check(untouched(&su, stats_v1, sizeof(su)), "tdm_sched_stats_init@TANDEM_1 leaves the bytes past it");

    union { tdm_kvx_stats s; unsigned char b[sizeof(tdm_kvx_stats) + 16]; } ku;
    memset(&ku, CANARY, sizeof(ku));
    check(old_kvx_stats_init(&ku.s) == TDM_OK && ku.s.struct_size == kvx_v1,
          "tdm_kvx_stats_init@TANDEM_1 sets the first layout's size");
    check(untouched(&ku, kvx_v1, sizeof(ku)), "tdm_kvx_stats_init@TANDEM_1 leaves the bytes past it");
    check(old_request_desc_init(NULL) == TDM_E_INVAL && old_sched_stats_init(NULL) == TDM_E_INVAL &&
          old_kvx_stats_init(NULL) == TDM_E_INVAL, "the TANDEM_1 initialisers refuse NULL");

    /* The library takes the shorter structs and writes no byte past them. */
    tdm_sched *s = NULL;
    check(tdm_sched_create(&s) == TDM_OK, "tdm_sched_create");
    if (s) {
        tdm_token prompt[40];
        for (int i = 0; i < 40; i++) prompt[i] = 100 + i;
        du.d.id = 7;
        du.d.prompt = prompt;
        du.d.num_prompt_tokens = 40;
        check(tdm_sched_add(s, &du.d) == TDM_OK, "tdm_sched_add accepts a first-layout request");
        check(untouched(&du, desc_v1, sizeof(du)), "tdm_sched_add leaves the bytes past the request");
        check(tdm_sched_get_stats(s, &su.s) == TDM_OK && su.s.num_waiting == 1,
              "tdm_sched_get_stats fills a first-layout stats struct");
        check(su.s.struct_size == stats_v1, "tdm_sched_get_stats keeps the caller's struct_size");
        check(untouched(&su, stats_v1, sizeof(su)), "tdm_sched_get_stats leaves the bytes past it");
        tdm_sched_destroy(s);
    }

    /* The default versions (what this binary binds by name) fill the current structs. */
    memset(&du, CANARY, sizeof(du));
    check(tdm_request_desc_init(&du.d) == TDM_OK && du.d.struct_size == sizeof(tdm_request_desc) &&
          du.d.block_hashes == NULL && du.d.block_hash_size == 0 &&
          du.d.prefix_hit_limit == 0, "tdm_request_desc_init@@TANDEM_1.2 fills the current struct");
    check(untouched(&du, sizeof(tdm_request_desc), sizeof(du)), "tdm_request_desc_init writes nothing past it");
    check(tdm_sched_stats_init(&su.s) == TDM_OK && su.s.struct_size == sizeof(tdm_sched_stats) &&
          su.s.kv_events_dropped == 0, "tdm_sched_stats_init@@TANDEM_1.1 fills the current struct");
    check(tdm_kvx_stats_init(&ku.s) == TDM_OK && ku.s.struct_size == sizeof(tdm_kvx_stats) &&
          ku.s.chunks_read_nixl == 0, "tdm_kvx_stats_init@@TANDEM_1.1 fills the current struct");

    if (failures == 0) printf("compat: all checks passed\n");
    return failures == 0 ? 0 : 1;
}
