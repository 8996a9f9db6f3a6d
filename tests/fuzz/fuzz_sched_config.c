/*
 * fuzz_sched_config.c -- fuzz harness for the scheduler's JSON configuration decoder
 * (tdm_sched_configure) and its round trip: any input either applies completely or changes
 * nothing; the configuration written back always parses and re-applies.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tandem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    tdm_sched *s;
    if (tdm_sched_create(&s) != TDM_OK) {
        free(text);
        return 0;
    }
    char before[4096], after[4096];
    size_t nb = 0, na = 0;
    if (tdm_sched_get_config(s, before, sizeof(before), &nb) != TDM_OK) abort();
    int rc = tdm_sched_configure(s, text);
    if (tdm_sched_get_config(s, after, sizeof(after), &na) != TDM_OK) abort();
    if (rc != TDM_OK) {
        if (strcmp(before, after) != 0) abort();            /* a refusal changed the configuration */
        if (tdm_sched_errmsg(s)[0] == '\0') abort();        /* ... or gave no reason */
    } else if (tdm_sched_configure(s, after) != TDM_OK) {
        abort();                                            /* the dump does not re-apply */
    }
    tdm_sched_destroy(s);
    free(text);
    return 0;
}
