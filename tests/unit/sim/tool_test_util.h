/*
 * tool_test_util.h -- helpers of the tests that run the `tandem` command line: where the
 * built tool is (TANDEM_BUILD, falling back to build/), a skip with a message when it is not
 * built, and SH(fmt, ...) to format a shell command and get its exit status. Include after
 * cmocka.h (NEED_TOOL skips the running test).
 */
#ifndef TOOL_TEST_UTIL_H
#define TOOL_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

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

#endif
