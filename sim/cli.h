/*
 * cli.h -- the command-line options shared by `tandem sim`, `ab` and `sweep` (trace,
 * arrival process, model, hardware, SLOs, outputs) and the setup they all do (load the
 * trace, the model, the hardware). Parsed by sim/cli.c.
 */
#ifndef TANDEM_SIM_CLI_H
#define TANDEM_SIM_CLI_H

#include "sim.h"

#define TDM_SIM_CLI_MAXPOS 32

typedef struct tdm_sim_cli {
    const char *prog;
    const char *trace;            /* NULL = builtin */
    tdm_sim_trace_opts topts;
    const char *model, *hw;
    const char *precision;        /* NULL = the model's (bf16) */
    const char *kv_dtype;         /* NULL = auto (bf16) */
    uint32_t tp;
    int no_clip;
    tdm_sim_run_opts ropts;
    int goodput, quiet, help;
    const char *json, *csv, *plot, *config;
    const char *steps_csv, *chrome_trace;   /* per-step traces (tandem sim only) */
    int rate_set;                 /* --rate given */
    tdm_sim_slo_class slo_cls[TDM_SIM_MAX_SLO_CLASSES];  /* --slo-class definitions */
    const char *pos[TDM_SIM_CLI_MAXPOS];
    int npos;
    /* sweep grid (comma-separated lists) */
    const char *g_budget, *g_seqs, *g_long, *g_policy, *g_mode, *g_tbt;
    /* loaded */
    tdm_sim_trace t;
    tdm_sim_model m;
    tdm_sim_hw h;
} tdm_sim_cli;

/* Parse argv (argv[0] is the subcommand name). Returns 0, 1 for --help (usage printed), or
 * -1 after printing an error. */
int tdm_sim_cli_parse(tdm_sim_cli *c, int argc, char **argv, const char *usage);
/* Load the model, the hardware and the trace; prints errors. */
int tdm_sim_cli_setup(tdm_sim_cli *c);
void tdm_sim_cli_free(tdm_sim_cli *c);
/* One line describing the workload and the hardware: the config's (cfg may be NULL: the
 * command line's). */
void tdm_sim_cli_describe(FILE *f, const tdm_sim_cli *c, const tdm_sim_config *cfg);
/* The hardware a config runs on ("h200", or "prefill h100-sxm, decode h200"). */
void tdm_sim_config_hw_label(const tdm_sim_config *cfg, char *out, size_t n);
extern const char tdm_sim_cli_common_usage[];

#endif
