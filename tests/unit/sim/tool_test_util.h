/*
 * tool_test_util.h -- helpers of the tests that run the `tandem` command line: where the
 * built tool is (TANDEM_BUILD, falling back to build/), a skip with a message when it is not
 * built, SH(fmt, ...) to format a shell command and get its exit status, and load_json to read
 * the JSON a command wrote. Include after cmocka.h (NEED_TOOL skips the running test).
 */
#ifndef TOOL_TEST_UTIL_H
#define TOOL_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

static char g_tool[512];

static int find_tool(void)
{
    const char *bd = getenv("TANDEM_BUILD");
    snprintf(g_tool, sizeof g_tool, "%s/tandem", bd ? bd : "build");
    if (access(g_tool, X_OK) != 0) {
        printf("[ SKIP     ] %s not built\n", g_tool);
        return 0;
    }
    return 1;
}

#define NEED_TOOL()          \
    do {                     \
        if (!find_tool()) {  \
            skip();          \
            return;          \
        }                    \
    } while (0)

static int run_cmd(const char *cmd)
{
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* Format a command (usually the tool's path first) and run it; returns its exit status. */
#define SH(...)                                   \
    ({                                            \
        char cmd_[4096];                          \
        snprintf(cmd_, sizeof cmd_, __VA_ARGS__); \
        run_cmd(cmd_);                            \
    })

/* The JSON document in the file at path; fails the test with the parser's reason otherwise. */
static inline json_t *load_json(const char *path)
{
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) fail_msg("%s: %s (line %d)", path, je.text, je.line);
    return o;
}

#endif
