/*
 * commands.h -- the subcommands of the `tandem` command line. Each lives in its own
 * tools/cmd_<name>.c; main.c dispatches by name. A subcommand whose file is not built
 * (a weak symbol left NULL) reports that it is not available.
 */
#ifndef TANDEM_TOOLS_COMMANDS_H
#define TANDEM_TOOLS_COMMANDS_H

typedef int (*tdm_cmd_fn)(int argc, char **argv);

#define TDM_WEAK __attribute__((weak))

TDM_WEAK int tdm_cmd_demo(int argc, char **argv);
TDM_WEAK int tdm_cmd_sim(int argc, char **argv);
TDM_WEAK int tdm_cmd_ab(int argc, char **argv);
TDM_WEAK int tdm_cmd_sweep(int argc, char **argv);
TDM_WEAK int tdm_cmd_tune(int argc, char **argv);
/* `tandem tune --gpus N`: the deployment search (cmd_tune_deploy.c), entered from tdm_cmd_tune */
TDM_WEAK int tdm_cmd_tune_deploy(int argc, char **argv);
TDM_WEAK int tdm_cmd_cost(int argc, char **argv);
TDM_WEAK int tdm_cmd_fit(int argc, char **argv);
TDM_WEAK int tdm_cmd_profile(int argc, char **argv);
TDM_WEAK int tdm_cmd_serve(int argc, char **argv);
TDM_WEAK int tdm_cmd_kvbench(int argc, char **argv);

#endif
