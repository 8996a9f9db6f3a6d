/*
 * cli.c -- option parsing shared by the simulator's subcommands (see cli.h), and the
 * common setup: the model and hardware presets or JSON files, and the trace with its
 * arrival, scaling, window, cap and clip options.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

const char tdm_sim_cli_common_usage[] =
    "workload:\n"
    "  --trace PATH          trace file (Azure CSV, Mooncake JSONL, length CSV, Tandem JSONL);\n"
    "                        default: the embedded chat workload ('builtin')\n"
    "  --format F            azure | vidur | mooncake | lengths | tandem (default: detected)\n"
    "  --isl N, --osl N      synthetic fixed lengths (no --trace): N prompt / output tokens\n"
    "  --len-range R         with --isl/--osl: each length uniform in [N(1-R), N(1+R)]\n"
    "  --dataset-entries N   with --isl: prompts drawn from N distinct ones, shuffled per pass\n"
    "                        (aiperf --num-dataset-entries): repeats hit the prefix cache\n"
    "  --arrival A           trace | poisson | gamma (length-only files: poisson)\n"
    "  --rate R              req/s of synthetic arrivals, or inf (builtin: 20; with\n"
    "                        --concurrency and a synthetic workload: inf)\n"
    "  --concurrency N       closed loop: at most N requests in flight, the next sent when\n"
    "                        one finishes (vllm bench serve --max-concurrency)\n"
    "  --warmup N            leave the first N requests sent out of the metrics\n"
    "                        (default: N = --concurrency in closed loop, 0 otherwise)\n"
    "  --cv X                Gamma arrivals: coefficient of variation (burstiness)\n"
    "  --rate-scale X        multiply the arrival rate by X\n"
    "  --window A:B          keep arrivals in [A, B) seconds from the first\n"
    "  --max-requests N      keep the first N requests\n"
    "  --seed S              seed of every random choice (default 42)\n"
    "  --jitter-ms J         spread each arrival over [t, t+J) (Mooncake default 3000)\n"
    "  --max-len N           clip prompt+output to N tokens (default: the model's context)\n"
    "  --no-clip             do not clip (over-long requests are rejected and count as misses)\n"
    "model and hardware:\n"
    "  --model M             preset or JSON file (default llama-3-8b)\n"
    "  --hw H                a100-80g | h100-sxm | h200 or a hardware JSON (default h100-sxm;\n"
    "                        a config's deployment.hw takes precedence)\n"
    "  --tp N                tensor-parallel degree (default 1)\n"
    "  --precision P         bf16 | fp8: weight bytes and GEMM rates (default bf16)\n"
    "  --kv-cache-dtype D    auto | bf16 | fp8: KV cache bytes (default auto = bf16, as vLLM\n"
    "                        keeps it under fp8 weights)\n"
    "  --frontend-ms X       serving path before the scheduler (HTTP, tokenization), per\n"
    "                        request uniform over [X/2, 3X/2] (default 0)\n"
    "  --frontend-service-ms S  the serving path as one server that each request holds S ms,\n"
    "                        in order, before --frontend-ms (API server saturation; default 0)\n"
    "  --client-jitter-ms Z  closed loop: an exponential delay of mean Z between a slot\n"
    "                        freeing and the next send, not counted in TTFT (default 0)\n"
    "  --desync              closed loop: the first wave's slots are refilled at random\n"
    "                        times over its lifetime (an out-of-phase start)\n"
    "  --desync-round R      closed loop: the loop runs in phase for R waves, and the R-th\n"
    "                        wave's slots are refilled at random times over one lifetime\n"
    "                        (--desync is R = 1; make calibrate's silicon check uses 2)\n"
    "  --warmup-drain        closed loop: the measured phase starts once every warm-up\n"
    "                        request has finished, with N sends at once (aiperf's phases)\n"
    "  --mem-util F          fraction of GPU memory for weights + KV (default 0.9)\n"
    "metrics and output:\n"
    "  --slo-ttft-ms X       TTFT SLO (default 500)\n"
    "  --slo-tpot-ms X       TPOT SLO (default 50)\n"
    "  --slo-class C:T:P     SLO class C of the trace's slo_class column: TTFT T ms, TPOT P ms\n"
    "                        (0 = none; best_effort and batch default to none)\n"
    "  --goodput             search the highest rate with >= target attainment of both SLOs\n"
    "  --goodput-target F    attainment needed for goodput (default 0.9)\n"
    "  --json FILE           write the summary as JSON\n"
    "  --requests-csv FILE   one row per request\n"
    "  --steps-csv FILE      tandem sim: one row per step of every instance\n"
    "  --chrome-trace FILE   tandem sim: Chrome trace JSON (Perfetto): a track per instance\n"
    "  --quiet               no progress bar\n";

static int need(int i, int argc, char **argv)
{
    if (i + 1 >= argc) {
        fprintf(stderr, "tandem %s: %s needs a value\n", argv[0], argv[i]);
        return -1;
    }
    return 0;
}

static int num(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "tandem: %s: bad value '%s' (expected a number in [%g, %g])\n", opt, s,
                lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* A dtype option: checked by its setter on a scratch model. */
static int dtype_arg(const char *opt, const char *s, int (*set)(tdm_sim_model *, const char *),
                     const char *choices)
{
    tdm_sim_model probe;
    memset(&probe, 0, sizeof probe);
    if (set(&probe, s) != 0) {
        fprintf(stderr, "tandem: %s: %s\n", opt, choices);
        return -1;
    }
    return 0;
}

/* NAME:TTFT_MS:TPOT_MS */
static int parse_slo_class(tdm_sim_cli *c, const char *s)
{
    const char *p = strchr(s, ':');
    char *end;
    double t = p ? strtod(p + 1, &end) : -1, q = -1;
    if (p && *end == ':') q = strtod(end + 1, &end);
    if (!p || p == s || (size_t)(p - s) >= TDM_SIM_SLO_NAME || *end || !(t >= 0) || !(q >= 0) ||
        t > 1e9 || q > 1e9) {
        fprintf(stderr, "tandem: --slo-class: expected NAME:TTFT_MS:TPOT_MS (ms >= 0), got '%s'\n", s);
        return -1;
    }
    size_t k = 0, len = (size_t)(p - s);
    while (k < c->ropts.n_slo_classes &&
           (strlen(c->slo_cls[k].name) != len || strncmp(c->slo_cls[k].name, s, len)))
        k++;
    if (k == TDM_SIM_MAX_SLO_CLASSES) {
        fprintf(stderr, "tandem: --slo-class: at most %d classes\n", TDM_SIM_MAX_SLO_CLASSES);
        return -1;
    }
    memcpy(c->slo_cls[k].name, s, len);
    c->slo_cls[k].name[len] = '\0';
    c->slo_cls[k].ttft_s = t * 1e-3;
    c->slo_cls[k].tpot_s = q * 1e-3;
    if (k == c->ropts.n_slo_classes) c->ropts.n_slo_classes++;
    return 0;
}

int tdm_sim_cli_parse(tdm_sim_cli *c, int argc, char **argv, const char *usage)
{
    memset(c, 0, sizeof *c);
    c->prog = argv[0];
    tdm_sim_trace_opts_init(&c->topts);
    tdm_sim_run_opts_init(&c->ropts);
    c->model = "llama-3-8b";
    c->hw = "h100-sxm";
    c->tp = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        double v;
#define VAL (need(i, argc, argv) ? -1 : 0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s\n%s", usage, tdm_sim_cli_common_usage);
            c->help = 1;
            return 1;
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) c->quiet = 1;
        else if (!strcmp(a, "--goodput")) c->goodput = 1;
        else if (!strcmp(a, "--no-clip")) c->no_clip = 1;
        else if (!strcmp(a, "--desync")) c->ropts.desync = 1;
        else if (!strcmp(a, "--warmup-drain")) c->ropts.warmup_drain = 1;
        else if (a[0] != '-' || !strcmp(a, "-")) {
            if (c->npos == TDM_SIM_CLI_MAXPOS) {
                fprintf(stderr, "tandem %s: too many arguments\n", argv[0]);
                return -1;
            }
            c->pos[c->npos++] = a;
        } else {
            if (VAL) return -1;
            const char *s = argv[++i];
            if (!strcmp(a, "--trace")) c->trace = s;
            else if (!strcmp(a, "--format")) {
                if (!strcmp(s, "azure")) c->topts.fmt = TDM_SIM_FMT_AZURE;
                else if (!strcmp(s, "mooncake")) c->topts.fmt = TDM_SIM_FMT_MOONCAKE;
                else if (!strcmp(s, "lengths")) c->topts.fmt = TDM_SIM_FMT_LENGTHS;
                else if (!strcmp(s, "tandem")) c->topts.fmt = TDM_SIM_FMT_TANDEM;
                else if (!strcmp(s, "vidur")) c->topts.fmt = TDM_SIM_FMT_VIDUR;
                else {
                    fprintf(stderr, "tandem: --format: azure, vidur, mooncake, lengths or tandem\n");
                    return -1;
                }
            } else if (!strcmp(a, "--arrival")) {
                if (!strcmp(s, "trace")) c->topts.arrival = TDM_SIM_ARRIVAL_TRACE;
                else if (!strcmp(s, "poisson")) c->topts.arrival = TDM_SIM_ARRIVAL_POISSON;
                else if (!strcmp(s, "gamma")) c->topts.arrival = TDM_SIM_ARRIVAL_GAMMA;
                else {
                    fprintf(stderr, "tandem: --arrival: trace, poisson or gamma\n");
                    return -1;
                }
            } else if (!strcmp(a, "--rate")) {
                c->rate_set = 1;
                if (!strcmp(s, "inf")) c->topts.rate = INFINITY;
                else if (num(a, s, 1e-6, 1e6, &c->topts.rate)) return -1;
            } else if (!strcmp(a, "--isl") || !strcmp(a, "--osl")) {
                if (num(a, s, 1, 1e8, &v)) return -1;
                if (a[2] == 'i') c->topts.isl = (uint32_t)v;
                else c->topts.osl = (uint32_t)v;
            } else if (!strcmp(a, "--len-range")) {
                if (num(a, s, 0, 0.999, &c->topts.len_range)) return -1;
            } else if (!strcmp(a, "--dataset-entries")) {
                if (num(a, s, 1, 1e7, &v)) return -1;
                c->topts.dataset_entries = (uint32_t)v;
            } else if (!strcmp(a, "--desync-round")) {
                if (num(a, s, 1, 1000, &v)) return -1;
                if (v != floor(v)) {
                    fprintf(stderr, "tandem: --desync-round: bad value '%s' (a whole number of "
                                    "waves)\n", s);
                    return -1;
                }
                c->ropts.desync = (int)v;
            } else if (!strcmp(a, "--concurrency")) {
                if (num(a, s, 1, 1e7, &v)) return -1;
                c->ropts.concurrency = (uint32_t)v;
            } else if (!strcmp(a, "--warmup")) {
                if (num(a, s, 0, 1e9, &v)) return -1;
                c->ropts.warmup = (int64_t)v;
            } else if (!strcmp(a, "--slo-class")) {
                if (parse_slo_class(c, s) != 0) return -1;
            } else if (!strcmp(a, "--steps-csv")) c->steps_csv = s;
            else if (!strcmp(a, "--chrome-trace")) c->chrome_trace = s;
            else if (!strcmp(a, "--cv")) {
                if (num(a, s, 1e-3, 100, &c->topts.cv)) return -1;
            } else if (!strcmp(a, "--rate-scale")) {
                if (num(a, s, 1e-6, 1e6, &c->topts.rate_scale)) return -1;
            } else if (!strcmp(a, "--window")) {
                char *end;
                c->topts.window_start = strtod(s, &end);
                if (*end != ':' || c->topts.window_start < 0) {
                    fprintf(stderr, "tandem: --window: expected START:END seconds\n");
                    return -1;
                }
                c->topts.window_end = end[1] ? strtod(end + 1, NULL) : 0;
                if (c->topts.window_end && c->topts.window_end <= c->topts.window_start) {
                    fprintf(stderr, "tandem: --window: END must be after START\n");
                    return -1;
                }
            } else if (!strcmp(a, "--max-requests")) {
                if (num(a, s, 1, 1e9, &v)) return -1;
                c->topts.max_requests = (size_t)v;
            } else if (!strcmp(a, "--seed")) {
                if (num(a, s, 0, 1.8e19, &v)) return -1;
                c->topts.seed = (uint64_t)v;
            } else if (!strcmp(a, "--jitter-ms")) {
                if (num(a, s, 0, 1e9, &v)) return -1;
                c->topts.jitter_s = v * 1e-3;
            } else if (!strcmp(a, "--max-len")) {
                if (num(a, s, 2, 1e8, &v)) return -1;
                c->topts.max_len = (uint32_t)v;
            } else if (!strcmp(a, "--model")) c->model = s;
            else if (!strcmp(a, "--hw")) c->hw = s;
            else if (!strcmp(a, "--precision")) {
                if (dtype_arg(a, s, tdm_sim_model_set_precision, "bf16 or fp8")) return -1;
                c->precision = s;
            } else if (!strcmp(a, "--kv-cache-dtype")) {
                if (dtype_arg(a, s, tdm_sim_model_set_kv_dtype, "auto, bf16 or fp8")) return -1;
                c->kv_dtype = s;
            } else if (!strcmp(a, "--frontend-ms")) {
                if (num(a, s, 0, 1e4, &v)) return -1;
                c->ropts.frontend_s = v / 1e3;
            } else if (!strcmp(a, "--frontend-service-ms")) {
                if (num(a, s, 0, 1e4, &v)) return -1;
                c->ropts.frontend_service_s = v / 1e3;
            } else if (!strcmp(a, "--client-jitter-ms")) {
                if (num(a, s, 0, 1e5, &v)) return -1;
                c->ropts.client_jitter_s = v / 1e3;
            }
            else if (!strcmp(a, "--tp")) {
                if (num(a, s, 1, 64, &v)) return -1;
                c->tp = (uint32_t)v;
            } else if (!strcmp(a, "--mem-util")) {
                if (num(a, s, 0.05, 1, &c->ropts.mem_util)) return -1;
            } else if (!strcmp(a, "--slo-ttft-ms")) {
                if (num(a, s, 1e-3, 1e9, &v)) return -1;
                c->ropts.slo_ttft_s = v * 1e-3;
            } else if (!strcmp(a, "--slo-tpot-ms")) {
                if (num(a, s, 1e-3, 1e9, &v)) return -1;
                c->ropts.slo_tpot_s = v * 1e-3;
            } else if (!strcmp(a, "--goodput-target")) {
                if (num(a, s, 0.01, 1, &c->ropts.goodput_target)) return -1;
            } else if (!strcmp(a, "--json")) c->json = s;
            else if (!strcmp(a, "--requests-csv")) c->csv = s;
            else if (!strcmp(a, "--plot")) c->plot = s;
            else if (!strcmp(a, "--config")) c->config = s;
            else if (!strcmp(a, "--budget")) c->g_budget = s;
            else if (!strcmp(a, "--max-seqs")) c->g_seqs = s;
            else if (!strcmp(a, "--long-prefill")) c->g_long = s;
            else if (!strcmp(a, "--policy")) c->g_policy = s;
            else if (!strcmp(a, "--mode")) c->g_mode = s;
            else if (!strcmp(a, "--tbt-ms")) c->g_tbt = s;
            else {
                fprintf(stderr, "tandem %s: unknown option %s (see --help)\n", argv[0], a);
                return -1;
            }
        }
#undef VAL
    }
    c->ropts.progress = !c->quiet && isatty(2);
    c->ropts.slo_classes = c->slo_cls;
    if ((c->topts.osl || c->topts.len_range > 0 || c->topts.dataset_entries) && !c->topts.isl) {
        fprintf(stderr, "tandem %s: --osl, --len-range and --dataset-entries need --isl\n", argv[0]);
        return -1;
    }
    if (c->topts.isl && c->trace) {
        fprintf(stderr, "tandem %s: --isl/--osl make a synthetic workload; drop --trace\n", argv[0]);
        return -1;
    }
    if ((c->steps_csv || c->chrome_trace) && strcmp(argv[0], "sim")) {
        fprintf(stderr, "tandem %s: --steps-csv and --chrome-trace are options of tandem sim\n",
                argv[0]);
        return -1;
    }
    if (c->ropts.concurrency && c->goodput) {
        fprintf(stderr, "tandem %s: --goodput searches an arrival rate; it has no meaning in "
                        "closed loop (--concurrency)\n", argv[0]);
        return -1;
    }
    if ((c->ropts.warmup_drain || c->ropts.desync) && !c->ropts.concurrency) {
        fprintf(stderr, "tandem %s: --%s is an option of the closed loop (--concurrency)\n",
                argv[0], c->ropts.warmup_drain ? "warmup-drain" : "desync");
        return -1;
    }
    /* closed loop on a synthetic workload: send as fast as slots free (vllm bench serve's
     * default request rate is inf) */
    if (c->ropts.concurrency && !c->rate_set && (!c->trace || !strcmp(c->trace, "builtin")))
        c->topts.rate = INFINITY;
    return 0;
}

int tdm_sim_cli_setup(tdm_sim_cli *c)
{
    char err[TDM_SIM_ERRLEN];
    if (tdm_sim_model_load(c->model, &c->m, err, sizeof err) != 0 ||
        tdm_sim_hw_load(c->hw, &c->h, err, sizeof err) != 0) {
        fprintf(stderr, "tandem %s: %s\n", c->prog, err);
        return -1;
    }
    c->m.tp = c->tp;
    if (c->precision) tdm_sim_model_set_precision(&c->m, c->precision);
    if (c->kv_dtype) tdm_sim_model_set_kv_dtype(&c->m, c->kv_dtype);
    if (!c->no_clip && !c->topts.max_len) c->topts.max_len = c->m.max_len;
    if (c->no_clip) c->topts.max_len = 0;
    if (tdm_sim_trace_load(c->trace, &c->topts, &c->t, err, sizeof err) != 0) {
        fprintf(stderr, "tandem %s: %s\n", c->prog, err);
        return -1;
    }
    return 0;
}

void tdm_sim_cli_free(tdm_sim_cli *c) { tdm_sim_trace_free(&c->t); }

void tdm_sim_config_hw_label(const tdm_sim_config *cfg, char *out, size_t n)
{
    const tdm_sim_pool *p = &cfg->pools[0], *d = &cfg->pools[1];
    if (!cfg->disagg) snprintf(out, n, "%s", p->hw.name);
    else if (!strcmp(p->hw.name, d->hw.name)) snprintf(out, n, "%s", p->hw.name);
    else snprintf(out, n, "prefill %s, decode %s", p->hw.name, d->hw.name);
}

void tdm_sim_cli_describe(FILE *f, const tdm_sim_cli *c, const tdm_sim_config *cfg)
{
    double span = tdm_sim_trace_span(&c->t);
    char hw[160];
    const tdm_sim_model *m = &c->m;
    int table = c->h.cost_model == TDM_SIM_COST_TABLE;
    if (cfg) {
        tdm_sim_config_hw_label(cfg, hw, sizeof hw);
        m = &cfg->pools[0].model;
        table = cfg->pools[0].hw.cost_model == TDM_SIM_COST_TABLE ||
                (cfg->disagg && cfg->pools[1].hw.cost_model == TDM_SIM_COST_TABLE);
    } else {
        snprintf(hw, sizeof hw, "%s", c->h.name);
    }
    if (isinf(c->topts.rate) && c->ropts.concurrency)
        fprintf(f, "workload: %s, %zu requests, closed loop at concurrency %u", c->t.name, c->t.n,
                c->ropts.concurrency);
    else
        fprintf(f, "workload: %s, %zu requests over %.1f s (%.2f req/s)", c->t.name, c->t.n, span,
                span > 0 ? (double)c->t.n / span : 0.0);
    if (c->ropts.concurrency && !isinf(c->topts.rate))
        fprintf(f, ", concurrency %u", c->ropts.concurrency);
    fprintf(f, "; model %s (tp %u, %s%s) on %s%s\n", c->m.name, m->tp, tdm_sim_model_precision(m),
            m->bytes_per_kv <= 1 ? ", fp8 KV" : m->bytes_per_param <= 1 ? ", bf16 KV" : "", hw,
            table ? " (table cost model)" : "");
}
