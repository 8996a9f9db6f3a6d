/*
 * main.c -- the `tandem` command line: dispatches to the subcommands in tools/cmd_*.c.
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "tandem.h"

struct command {
    const char *name;
    tdm_cmd_fn fn;
    const char *help;
};

int main(int argc, char **argv)
{
    const struct command cmds[] = {
        {"demo", tdm_cmd_demo, "a small built-in scheduling demo"},
        {"sim", tdm_cmd_sim, "replay a trace through the scheduler on a cost model"},
        {"ab", tdm_cmd_ab, "compare scheduler configs on the same trace"},
        {"sweep", tdm_cmd_sweep, "grid over scheduler parameters, Pareto table and plot"},
        {"tune", tdm_cmd_tune, "search the static scheduler parameters (or, with --gpus N, deployments) for the best goodput"},
        {"cost", tdm_cmd_cost, "the cost model as a calculator"},
        {"fit", tdm_cmd_fit, "fit the table cost model to a deployment's measured steps"},
        {"profile", tdm_cmd_profile, "measure GEMM and bandwidth rates with cuBLAS (GPU)"},
        {"serve", tdm_cmd_serve, "the ABI as a ZeroMQ + msgpack service"},
        {"kvbench", tdm_cmd_kvbench, "KV pack/transfer throughput against baselines"},
    };
    const size_t n = sizeof(cmds) / sizeof(cmds[0]);

    if (argc >= 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version"))) {
        printf("tandem %s (abi %u)\n", tdm_version_string(), tdm_abi_version());
        return 0;
    }
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
        !strcmp(argv[1], "help")) {
        FILE *o = argc < 2 ? stderr : stdout;
        fprintf(o, "usage: tandem <command> [options]   (tandem <command> --help)\n\ncommands:\n");
        for (size_t i = 0; i < n; i++)
            fprintf(o, "  %-9s %s%s\n", cmds[i].name, cmds[i].help,
                    cmds[i].fn ? "" : " [not built]");
        fprintf(o, "  %-9s %s\n", "version", "print the library version");
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(argv[1], cmds[i].name) != 0) continue;
        if (!cmds[i].fn) {
            fprintf(stderr, "tandem: command '%s' is not built into this binary\n", argv[1]);
            return 2;
        }
        return cmds[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "tandem: unknown command '%s' (see tandem --help)\n", argv[1]);
    return 2;
}
