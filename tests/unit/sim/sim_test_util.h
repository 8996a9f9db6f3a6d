/*
 * sim_test_util.h -- helpers of the simulator tests: where the shared data lives
 * (TANDEM_SHARED, falling back to ../shared) and a skip with a message when it is absent.
 */
#ifndef SIM_TEST_UTIL_H
#define SIM_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static inline const char *shared_dir(void)
{
    const char *s = getenv("TANDEM_SHARED");
    return s && *s ? s : "../shared";
}

/* Path under the shared directory, or NULL (and a message) when the file is absent. */
static inline const char *shared_path(const char *rel, char *buf, size_t n)
{
    snprintf(buf, n, "%s/%s", shared_dir(), rel);
    if (access(buf, R_OK) != 0) {
        printf("[ SKIP     ] %s not found (set TANDEM_SHARED to the shared data directory)\n", buf);
        return NULL;
    }
    return buf;
}

#define NEED_SHARED(rel, buf)                                                  \
    do {                                                                       \
        if (!shared_path((rel), (buf), sizeof(buf))) {                         \
            skip();                                                            \
            return;                                                            \
        }                                                                      \
    } while (0)

/* Write text to a temporary file; returns its path (static buffer per call site). */
static inline void write_tmp(char *path, size_t n, const char *name, const char *text)
{
    snprintf(path, n, "/tmp/tandem-simtest-%d-%s", (int)getpid(), name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

#endif
