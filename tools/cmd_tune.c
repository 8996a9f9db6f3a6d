/*
 * cmd_tune.c -- `tandem tune [BASE.json] --slo-ttft-ms T --slo-tpot-ms P [options]`: search
 * the static scheduler parameters (sim/tune.c) for the best goodput (or attainment, or
 * throughput) on one trace and SLO pair; progress on stderr, the ranked top-k table on
 * stdout, a closing "tune best=..." line for scripts, --out FILE with the best config as
 * `tandem sim --config` and `tandem ab` read it, --json FILE with every evaluated point.
 * The workload, model and hardware options are those of `tandem sim` (sim/cli.c); the
 * options of tune itself are taken out of argv before those are parsed.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../sim/cli.h"
#include "../sim/tune.h"
#include "commands.h"

static const char USAGE[] =
    "usage: tandem tune [BASE.json] [--slo-ttft-ms T] [--slo-tpot-ms P] [--goodput-target F]\n"
    "                   [--objective goodput|attainment|throughput] [--space KEY=V1,V2,...]...\n"
    "                   [--budget N] [--jobs J] [--top K] [--out BEST.json] [--json FILE] [options]\n"
    "  Searches the static scheduler parameters for the best objective on the trace: the base\n"
    "  config as given, a coarse grid over mode x max_num_batched_tokens x tbt_target_ms, then\n"
    "  moves to the best neighbouring value of each parameter while one improves.\n"
    "  --objective O   goodput (default): the highest req/s with >= --goodput-target of requests\n"
    "                  meeting both SLOs, the search of `tandem ab --goodput`; attainment or\n"
    "                  throughput (output tok/s): one run at the trace's rate (or closed loop)\n"
    "  --space K=LIST  the values of one parameter (one value pins it); keys and defaults:\n"
    "                  mode=vllm,decode_first,prefill_first\n"
    "                  max_num_batched_tokens=256,512,1024,2048,4096,8192\n"
    "                  tbt_target_ms=0,15,20,30,50,100 (decode_first only)\n"
    "                  long_prefill_token_threshold=0,256,512,1024,2048\n"
    "                  max_num_seqs=32,64,128,256,512\n"
    "                  max_num_partial_prefills=0,1,2,4 (decode_first only)\n"
    "                  enable_chunked_prefill=true,false\n"
    "                  (--mode, --max-seqs, --long-prefill, --tbt-ms LIST as in tandem sweep)\n"
    "  --budget N      evaluations in all, the base included (default 40; each goodput\n"
    "                  evaluation is about 8-16 simulations). Not sweep's --budget (token lists:\n"
    "                  --space max_num_batched_tokens=...)\n"
    "  --jobs J        worker processes (default: the CPUs, at most 8); results do not depend on J\n"
    "  --top K         rows of the ranked table (default 10)\n"
    "  --out FILE      the best config: BASE with the searched keys set (a wrapper JSON)\n"
    "  BASE            a config (scheduler JSON or wrapper); its other keys and deployment are\n"
    "                  kept (default: the library's defaults)\n"
    "  --gpus N        search deployments instead (xPyD pools, TP, batch limits) for N GPUs:\n"
    "                  tandem tune --gpus N --help\n";

static int parse_int(const char *opt, const char *s, long lo, long hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "tandem tune: %s: bad value '%s' (expected an integer in [%ld, %ld])\n",
                opt, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static char *slurp_json(const char *path)
{
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) return NULL;
    char *t = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return t;
}

/* The top-level scheduler object of a point's document, compact (malloc'ed). */
static char *point_sched(const char *base, const tdm_sim_tune_space *s, const tdm_sim_tune_point *p)
{
    char *doc = tdm_sim_tune_point_json(base, s, p, NULL, NULL);
    json_t *o = doc ? json_loads(doc, 0, NULL) : NULL;
    free(doc);
    json_t *sc = o ? json_object_get(o, "scheduler") : NULL;
    char *t = sc ? json_dumps(sc, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    return t;
}

static int write_points_json(const char *path, const char *base, const tdm_sim_tune_space *s,
                             const tdm_sim_tune_result *r, tdm_sim_tune_objective obj)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\"objective\": \"%s\", \"best\": %zu, \"evaluated\": %d, \"runs\": %llu, "
               "\"wall_s\": %.3f,\n\"points\": [\n",
            tdm_sim_tune_objective_name(obj), r->best, r->evaluated, (unsigned long long)r->runs,
            r->wall_s);
    for (size_t i = 0; i < r->n; i++) {
        const tdm_sim_tune_point *p = &r->pts[i];
        char *sc = point_sched(base, s, p);
        json_t *lab = json_string(p->label), *er = json_string(p->err);
        char *ls = lab ? json_dumps(lab, JSON_ENCODE_ANY) : NULL;
        char *es = er ? json_dumps(er, JSON_ENCODE_ANY) : NULL;
        fprintf(f, "  {\"label\": %s, \"phase\": \"%s\", \"ok\": %s, \"value\": %.10g, "
                   "\"refused\": %s, \"scale\": %.10g, \"runs\": %d, \"error\": %s, \"scheduler\": %s}%s\n",
                ls ? ls : "\"\"", p->phase == 0 ? "base" : p->phase == 1 ? "grid" : "refine",
                p->ok ? "true" : "false", p->value, p->refused ? "true" : "false", p->scale, p->runs, es ? es : "\"\"",
                sc ? sc : "null", i + 1 < r->n ? "," : "");
        free(sc);
        free(ls);
        free(es);
        json_decref(lab);
        json_decref(er);
    }
    fputs("]}\n", f);
    return fclose(f) == 0 ? 0 : -1;
}

int tdm_cmd_tune(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--gpus")) { /* the deployment search */
            if (tdm_cmd_tune_deploy) return tdm_cmd_tune_deploy(argc, argv);
            fprintf(stderr, "tandem tune: --gpus: the deployment search is not built\n");
            return 2;
        }
    tdm_sim_tune_space space;
    tdm_sim_tune_space_default(&space);
    tdm_sim_tune_opts to;
    tdm_sim_tune_opts_init(&to);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    to.jobs = ncpu < 1 ? 1 : ncpu > 8 ? 8 : (int)ncpu;
    int top = 10;
    const char *out = NULL;
    char err[TDM_SIM_ERRLEN];
    /* take tune's own options out; the rest are the simulator's */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return 1;
    int nrest = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int own = i > 0 && (!strcmp(a, "--space") || !strcmp(a, "--objective") ||
                            !strcmp(a, "--budget") || !strcmp(a, "--jobs") ||
                            !strcmp(a, "--top") || !strcmp(a, "--out"));
        if (!own) {
            if (i > 0 && (!strcmp(a, "--policy") || !strcmp(a, "--plot") ||
                          !strcmp(a, "--requests-csv"))) {
                fprintf(stderr, "tandem tune: %s is not an option of tune (see --help)\n", a);
                free(rest);
                return 2;
            }
            rest[nrest++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tandem tune: %s needs a value\n", a);
            free(rest);
            return 2;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (!strcmp(a, "--space")) {
            if (tdm_sim_tune_space_set(&space, v, err, sizeof err) != 0) {
                fprintf(stderr, "tandem tune: %s\n", err);
                bad = 1;
            }
        } else if (!strcmp(a, "--objective")) {
            if (tdm_sim_tune_objective_parse(v, &to.objective) != 0) {
                fprintf(stderr, "tandem tune: --objective: goodput, attainment or throughput\n");
                bad = 1;
            }
        } else if (!strcmp(a, "--budget")) bad = parse_int(a, v, 1, 100000, &to.budget) != 0;
        else if (!strcmp(a, "--jobs")) bad = parse_int(a, v, 1, 64, &to.jobs) != 0;
        else if (!strcmp(a, "--top")) bad = parse_int(a, v, 1, 100000, &top) != 0;
        else out = v;
        if (bad) {
            free(rest);
            return 2;
        }
    }
    tdm_sim_cli c;
    int p = tdm_sim_cli_parse(&c, nrest, rest, USAGE);
    free(rest);
    if (p != 0) return p > 0 ? 0 : 2;
    static const char *const SWEEP_KEYS[] = {"mode", "max_num_seqs", "long_prefill_token_threshold",
                                             "tbt_target_ms"};
    const char *sweep_vals[] = {c.g_mode, c.g_seqs, c.g_long, c.g_tbt};
    for (int k = 0; k < 4; k++) {
        if (!sweep_vals[k]) continue;
        char spec[600];
        snprintf(spec, sizeof spec, "%s=%s", SWEEP_KEYS[k], sweep_vals[k]);
        if (tdm_sim_tune_space_set(&space, spec, err, sizeof err) != 0) {
            fprintf(stderr, "tandem tune: %s\n", err);
            return 2;
        }
    }
    if (c.npos > (c.config ? 0 : 1)) {
        fprintf(stderr, "tandem tune: one base config at most\n");
        return 2;
    }
    if (to.objective == TDM_SIM_TUNE_GOODPUT && c.ropts.concurrency) {
        fprintf(stderr, "tandem tune: the goodput objective searches an arrival rate; closed loop "
                        "(--concurrency) needs --objective attainment or throughput\n");
        return 2;
    }
    const char *bpath = c.config ? c.config : c.npos ? c.pos[0] : NULL;
    if (tdm_sim_cli_setup(&c) != 0) return 1;
    int rc = 1;
    char *base = NULL;
    tdm_sim_tune_result r;
    memset(&r, 0, sizeof r);
    if (bpath) {
        tdm_sim_config probe;
        if (tdm_sim_config_load(bpath, &c.m, &c.h, &probe, err, sizeof err) != 0) {
            fprintf(stderr, "tandem tune: %s\n", err);
            goto done;
        }
        tdm_sim_config_free(&probe);
        if (!(base = slurp_json(bpath))) {
            fprintf(stderr, "tandem tune: cannot read %s\n", bpath);
            goto done;
        }
    }
    const char *unit = to.objective == TDM_SIM_TUNE_GOODPUT ? "req/s"
                       : to.objective == TDM_SIM_TUNE_THROUGHPUT ? "tok/s" : "";
    tdm_sim_cli_describe(stdout, &c, NULL);
    printf("tune: objective %s, SLO TTFT <= %.0f ms, TPOT <= %.0f ms, attainment >= %.0f%%; "
           "budget %d evaluations, %d job%s; base %s\n",
           tdm_sim_tune_objective_name(to.objective), c.ropts.slo_ttft_s * 1e3,
           c.ropts.slo_tpot_s * 1e3, 100 * c.ropts.goodput_target, to.budget, to.jobs,
           to.jobs == 1 ? "" : "s", bpath ? bpath : "library defaults");
    to.progress = c.quiet ? NULL : stderr;
    fflush(stdout);
    if (tdm_sim_tune_run(&c.t, base, &c.m, &c.h, &c.ropts, &space, &to, &r, err, sizeof err) != 0) {
        fprintf(stderr, "tandem tune: %s\n", err);
        goto done;
    }
    printf("space: ");
    tdm_sim_tune_space_print(stdout, &space);
    printf("\n");
    /* ranked: ok points by value, the first evaluated first among equals */
    size_t *ord = calloc(r.n, sizeof *ord), nok = 0;
    if (!ord) goto done;
    for (size_t i = 0; i < r.n; i++)
        if (r.pts[i].ok) {
            size_t j = nok++;
            while (j > 0 && r.pts[ord[j - 1]].value < r.pts[i].value) {
                ord[j] = ord[j - 1];
                j--;
            }
            ord[j] = i;
        }
    const tdm_sim_tune_point *b0 = &r.pts[0], *best = &r.pts[r.best];
    printf("  %4s %14s %8s %5s  %-7s %s\n", "rank", tdm_sim_tune_objective_name(to.objective),
           b0->ok ? "vs base" : "", "runs", "phase", "config");
    for (size_t k = 0; k < nok && k < (size_t)top; k++) {
        const tdm_sim_tune_point *q = &r.pts[ord[k]];
        char ratio[16] = "";
        if (b0->ok && b0->value > 0) snprintf(ratio, sizeof ratio, "%.2fx", q->value / b0->value);
        printf("  %4zu %14.4g %8s %5d  %-7s %s\n", k + 1, q->value, ratio, q->runs,
               q->phase == 0 ? "base" : q->phase == 1 ? "grid" : "refine", q->label);
    }
    size_t nref = 0;
    for (size_t i = 0; i < r.n; i++) nref += (size_t)r.pts[i].refused;
    if (nref) printf("  (%zu configs refused by the scheduler, not simulated)\n", nref);
    if (r.n - nref > nok) printf("  (%zu runs failed; see the progress log)\n", r.n - nref - nok);
    free(ord);
    char *sc = point_sched(base, &space, best);
    printf("best scheduler: %s\n", sc ? sc : "?");
    rc = 0;
    if (out) {
        char desc[512];
        snprintf(desc, sizeof desc, "tandem tune: %s %.4g %s on %s (%s, tp %u, %s), TTFT <= %.0f ms, "
                                    "TPOT <= %.0f ms, attainment >= %.0f%%; %s",
                 tdm_sim_tune_objective_name(to.objective), best->value, unit, c.t.name, c.m.name,
                 c.m.tp, c.h.name, c.ropts.slo_ttft_s * 1e3, c.ropts.slo_tpot_s * 1e3,
                 100 * c.ropts.goodput_target, best->label);
        char *doc = tdm_sim_tune_point_json(base, &space, best, "tuned", desc);
        FILE *f = doc ? fopen(out, "w") : NULL;
        if (!f || fputs(doc, f) < 0 || fputc('\n', f) < 0 || fclose(f) != 0) {
            fprintf(stderr, "tandem tune: cannot write %s\n", out);
            rc = 1;
        } else {
            printf("wrote %s\n", out);
        }
        free(doc);
    }
    if (c.json && write_points_json(c.json, base, &space, &r, to.objective) != 0) {
        fprintf(stderr, "tandem tune: cannot write %s\n", c.json);
        rc = 1;
    }
    printf("tune best=%.6g%s%s config=%s evaluated=%d runs=%llu wall_s=%.1f\n", best->value,
           *unit ? " " : "", unit, sc ? sc : "?", r.evaluated, (unsigned long long)r.runs, r.wall_s);
    free(sc);
done:
    tdm_sim_tune_result_free(&r);
    free(base);
    tdm_sim_cli_free(&c);
    return rc;
}
