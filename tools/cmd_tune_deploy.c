/*
 * cmd_tune_deploy.c -- `tandem tune --gpus N [BASE.json] [options]`: the deployment search
 * (sim/tune_deploy.c): colocated replicas or disaggregated xPyD pools, TP per pool and batch
 * limits, for a GPU budget and an SLO pair, every candidate run through the real scheduler in
 * the simulator and ranked by goodput per GPU. Progress on stderr; on stdout the infeasible
 * deployments with their reasons, the ranked table (goodput, per GPU, output tokens/s per
 * GPU, TTFT and TPOT percentiles at the goodput rate), the vLLM flags of each engine of the
 * best and a closing "tune best=..." line. --out FILE writes the best deployment as `tandem sim
 * --config` reads it, and beside it one file per engine for vLLM's --additional-config.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../sim/cli.h"
#include "../sim/tune_deploy.h"
#include "commands.h"

static const char USAGE[] =
    "usage: tandem tune --gpus N [BASE.json] [--tp-list 1,2,4,8] [--serving-mode agg|disagg|both]\n"
    "                   [--space max_num_seqs=LIST] [--space max_num_batched_tokens=LIST]\n"
    "                   [--budget N] [--refine K] [--jobs J] [--top K] [--out BEST.json]\n"
    "                   [--json FILE] [--slo-ttft-ms T] [--slo-tpot-ms P] [--goodput-target F] [options]\n"
    "  Searches deployments for a budget of N GPUs: colocated replicas of one TP degree, or\n"
    "  disaggregated pools (x prefill instances of TP p, y decode instances of TP d, every split\n"
    "  the budget holds), and the batch limits of each pool; every candidate runs through the\n"
    "  scheduler in the simulator (queueing included) and is ranked by goodput per GPU: the\n"
    "  highest arrival rate with >= --goodput-target of requests meeting both SLOs.\n"
    "  --gpus N          the GPU budget (1 .. 1024)\n"
    "  --tp-list L       TP degrees a pool may have (default 1,2,4,8, those <= N)\n"
    "  --serving-mode M  agg (colocated), disagg, or both (default)\n"
    "  --space max_num_seqs=L, --space max_num_batched_tokens=L\n"
    "                    the batch-limit values (default 16..512 and 1024..16384); colocated:\n"
    "                    the pool's; disaggregated: the decode pool's max_num_seqs and the\n"
    "                    prefill pool's max_num_batched_tokens\n"
    "  --budget N        evaluations in all (default 60; each is a goodput search, 8-16 runs)\n"
    "  --refine K        topologies whose batch limits are searched (default 3)\n"
    "  --jobs J          worker processes (default: the CPUs, at most 8); results do not depend on J\n"
    "  --top K           rows of the ranked table (default 10)\n"
    "  --out FILE        the best deployment (tandem sim --config FILE), and FILE's stem with\n"
    "                    .engine.json (colocated) or .prefill.json and .decode.json: one vLLM\n"
    "                    engine's file each (--additional-config '{\"tandem\": {\"config\": F}}')\n"
    "  --json FILE       every candidate with its figures\n"
    "  BASE              a config whose other scheduler keys, router and KV link are kept, and\n"
    "                    whose batch limits are the search's start (default: library defaults)\n";

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
    json_t *o = json_load_file(path, 0, NULL);
    if (!o) return NULL;
    char *t = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return t;
}

static int write_text(const char *path, const char *txt)
{
    FILE *f = txt ? fopen(path, "w") : NULL;
    if (!f) return -1;
    int bad = fputs(txt, f) < 0 || fputc('\n', f) < 0;
    return fclose(f) != 0 || bad ? -1 : 0;
}

/* FILE's stem (without .json) + suffix. */
static void sibling(const char *out, const char *suffix, char *buf, size_t n)
{
    size_t l = strlen(out);
    if (l > 5 && !strcmp(out + l - 5, ".json")) l -= 5;
    snprintf(buf, n, "%.*s%s", (int)l, out, suffix);
}

static int write_points_json(const char *path, const tdm_sim_deploy_result *r)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\"objective\": \"goodput_per_gpu\", \"best\": %zu, \"have_best\": %s, "
               "\"evaluated\": %d, \"runs\": %llu, \"wall_s\": %.3f,\n\"points\": [\n",
            r->best, r->have_best ? "true" : "false", r->evaluated, (unsigned long long)r->runs,
            r->wall_s);
    for (size_t i = 0; i < r->n; i++) {
        const tdm_sim_deploy_point *p = &r->pts[i];
        json_t *o = json_object();
        if (o) {
            json_object_set_new(o, "label", json_string(p->label));
            json_object_set_new(o, "phase", json_string(p->phase ? "limits" : "topology"));
            json_object_set_new(o, "disaggregated", json_boolean(p->d.disagg));
            json_object_set_new(o, "gpus", json_integer(p->gpus));
            json_object_set_new(o, "instances", json_integer(p->d.n[0]));
            json_object_set_new(o, "tp", json_integer(p->d.tp[0]));
            json_object_set_new(o, "infeasible", json_boolean(p->infeasible));
            json_object_set_new(o, "ok", json_boolean(p->ok));
            const struct {
                const char *k;
                double v;
            } F[] = {{"goodput_req_s", p->goodput_req_s}, {"goodput_req_s_per_gpu", p->per_gpu},
                     {"rate_scale", p->scale}, {"best_attainment", p->best_attainment},
                     {"ttft_p50_s", p->ttft_p50}, {"ttft_p90_s", p->ttft_p90},
                     {"ttft_p99_s", p->ttft_p99}, {"tpot_p50_s", p->tpot_p50},
                     {"tpot_p90_s", p->tpot_p90}, {"tpot_p99_s", p->tpot_p99},
                     {"attainment", p->attainment}, {"request_throughput", p->req_s},
                     {"output_tok_s_per_gpu", p->out_tok_s_per_gpu},
                     {"goodput_tok_s_per_gpu", p->goodput_tok_s_per_gpu}};
            for (size_t k = 0; k < sizeof F / sizeof F[0]; k++)
                json_object_set_new(o, F[k].k, json_real(isfinite(F[k].v) ? F[k].v : 0));
            json_object_set_new(o, "runs", json_integer(p->runs));
            json_object_set_new(o, "why", json_string(p->why));
        }
        if (o && p->d.disagg) {
            json_object_set_new(o, "decode_instances", json_integer(p->d.n[1]));
            json_object_set_new(o, "decode_tp", json_integer(p->d.tp[1]));
        }
        char *t = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        fprintf(f, "  %s%s\n", t ? t : "null", i + 1 < r->n ? "," : "");
        free(t);
        json_decref(o);
    }
    fputs("]}\n", f);
    return fclose(f) == 0 ? 0 : -1;
}

/* The vLLM flags of one engine file (its explicit limits and TP). */
static void engine_flags(const char *txt, char *buf, size_t n)
{
    json_t *o = txt ? json_loads(txt, 0, NULL) : NULL;
    json_t *s = json_object_get(o, "scheduler"), *d = json_object_get(o, "deployment");
    int w = snprintf(buf, n, "--tensor-parallel-size %lld",
                     (long long)json_integer_value(json_object_get(d, "tp")));
    json_t *v = json_object_get(s, "max_num_seqs");
    if (v && w > 0 && (size_t)w < n)
        w += snprintf(buf + w, n - (size_t)w, " --max-num-seqs %lld", (long long)json_integer_value(v));
    v = json_object_get(s, "max_num_batched_tokens");
    if (v && w > 0 && (size_t)w < n)
        snprintf(buf + w, n - (size_t)w, " --max-num-batched-tokens %lld", (long long)json_integer_value(v));
    json_decref(o);
}

static void ms2(char *buf, size_t n, double a, double b)
{
    snprintf(buf, n, "%.0f / %.0f", a * 1e3, b * 1e3);
}

int tdm_cmd_tune_deploy(int argc, char **argv)
{
    tdm_sim_deploy_opts o;
    tdm_sim_deploy_opts_init(&o);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o.jobs = ncpu < 1 ? 1 : ncpu > 8 ? 8 : (int)ncpu;
    int top = 10, gpus = 0;
    const char *out = NULL, *tps = NULL, *modes = NULL, *seqs = NULL, *toks = NULL;
    char err[TDM_SIM_ERRLEN];
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return 1;
    int nrest = 0, bad = 0;
    for (int i = 0; i < argc && !bad; i++) {
        const char *a = argv[i];
        static const char *const OWN[] = {"--gpus", "--tp-list", "--serving-mode", "--refine", "--space",
                                          "--objective", "--budget", "--jobs", "--top", "--out"};
        int own = 0;
        for (size_t k = 0; i > 0 && k < sizeof OWN / sizeof OWN[0]; k++) own |= !strcmp(a, OWN[k]);
        if (!own) {
            if (i > 0 && (!strcmp(a, "--policy") || !strcmp(a, "--plot") || !strcmp(a, "--requests-csv") ||
                          !strcmp(a, "--tp"))) {
                fprintf(stderr, "tandem tune: %s is not an option of tune --gpus%s (see --help)\n", a,
                        !strcmp(a, "--tp") ? " (the TP degrees searched: --tp-list)" : "");
                bad = 1;
                break;
            }
            rest[nrest++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tandem tune: %s needs a value\n", a);
            bad = 1;
            break;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--gpus")) bad = parse_int(a, v, 1, 1024, &gpus) != 0;
        else if (!strcmp(a, "--tp-list")) tps = v;
        else if (!strcmp(a, "--serving-mode")) modes = v;
        else if (!strcmp(a, "--refine")) bad = parse_int(a, v, 0, 1000, &o.refine) != 0;
        else if (!strcmp(a, "--budget")) bad = parse_int(a, v, 1, 100000, &o.budget) != 0;
        else if (!strcmp(a, "--jobs")) bad = parse_int(a, v, 1, 64, &o.jobs) != 0;
        else if (!strcmp(a, "--top")) bad = parse_int(a, v, 1, 100000, &top) != 0;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--objective")) {
            if (strcmp(v, "goodput")) {
                fprintf(stderr, "tandem tune: --gpus ranks deployments by goodput per GPU "
                                "(--objective %s is for the scheduler search)\n", v);
                bad = 1;
            }
        } else if (!strncmp(v, "max_num_seqs=", 13)) seqs = v + 13;
        else if (!strncmp(v, "max_num_batched_tokens=", 23)) toks = v + 23;
        else {
            fprintf(stderr, "tandem tune: --gpus searches max_num_seqs and max_num_batched_tokens "
                            "only (--space %s)\n", v);
            bad = 1;
        }
    }
    if (bad) {
        free(rest);
        return 2;
    }
    tdm_sim_cli c;
    int p = tdm_sim_cli_parse(&c, nrest, rest, USAGE);
    free(rest);
    if (p != 0) return p > 0 ? 0 : 2;
    if (gpus < 1) {
        fprintf(stderr, "tandem tune: --gpus N is needed for the deployment search\n");
        return 2;
    }
    tdm_sim_deploy_space sp;
    tdm_sim_deploy_space_default(&sp, (uint32_t)gpus);
    if ((tps && tdm_sim_deploy_parse_list("--tp-list", tps, sp.tp, TDM_SIM_DEPLOY_MAXTP, &sp.ntp, err,
                                          sizeof err) != 0) ||
        (modes && tdm_sim_deploy_parse_modes(modes, &sp, err, sizeof err) != 0) ||
        (seqs && tdm_sim_deploy_parse_list("max_num_seqs", seqs, sp.seqs, TDM_SIM_DEPLOY_MAXV - 1,
                                           &sp.nseqs, err, sizeof err) != 0) ||
        (toks && tdm_sim_deploy_parse_list("max_num_batched_tokens", toks, sp.tokens,
                                           TDM_SIM_DEPLOY_MAXV - 1, &sp.ntokens, err, sizeof err) != 0)) {
        fprintf(stderr, "tandem tune: %s\n", err);
        return 2;
    }
    if (sp.ntp == 0 || sp.tp[0] > (uint32_t)gpus) {
        fprintf(stderr, "tandem tune: --tp-list: no TP degree fits %d GPUs\n", gpus);
        return 2;
    }
    if (c.npos > (c.config ? 0 : 1)) {
        fprintf(stderr, "tandem tune: one base config at most\n");
        return 2;
    }
    if (c.ropts.concurrency) {
        fprintf(stderr, "tandem tune: --gpus ranks deployments by goodput, a search over the arrival "
                        "rate: closed loop (--concurrency) does not apply\n");
        return 2;
    }
    const char *bpath = c.config ? c.config : c.npos ? c.pos[0] : NULL;
    if (tdm_sim_cli_setup(&c) != 0) return 1;
    int rc = 1;
    char *base = NULL;
    tdm_sim_deploy_result r;
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
    tdm_sim_cli_describe(stdout, &c, NULL);
    printf("tune --gpus %d: goodput per GPU, SLO TTFT <= %.0f ms, TPOT <= %.0f ms, attainment >= "
           "%.0f%%; TP", gpus, c.ropts.slo_ttft_s * 1e3, c.ropts.slo_tpot_s * 1e3,
           100 * c.ropts.goodput_target);
    for (int i = 0; i < sp.ntp; i++) printf("%s%u", i ? "," : " ", sp.tp[i]);
    printf("; %s; budget %d evaluations, refine %d, %d job%s; base %s\n",
           sp.agg && sp.disagg ? "agg and disagg" : sp.agg ? "agg" : "disagg", o.budget, o.refine,
           o.jobs, o.jobs == 1 ? "" : "s", bpath ? bpath : "library defaults");
    o.progress = c.quiet ? NULL : stderr;
    fflush(stdout);
    if (tdm_sim_deploy_search(&c.t, base, &c.m, &c.h, &c.ropts, &sp, &o, &r, err, sizeof err) != 0) {
        fprintf(stderr, "tandem tune: %s\n", err);
        goto done;
    }
    size_t ninf = 0, nskip = 0;
    for (size_t i = 0; i < r.n; i++) {
        ninf += (size_t)r.pts[i].infeasible;
        nskip += !r.pts[i].infeasible && !r.pts[i].ok;
    }
    if (ninf) {
        printf("infeasible (not simulated):\n");
        for (size_t i = 0; i < r.n; i++)
            if (r.pts[i].infeasible) printf("  %-40s %s\n", r.pts[i].label, r.pts[i].why);
    }
    size_t *ord = calloc(r.n, sizeof *ord), nok = 0;
    if (!ord) goto done;
    for (size_t i = 0; i < r.n; i++)
        if (r.pts[i].ok) {
            size_t j = nok++;
            while (j > 0 && (r.pts[i].per_gpu > r.pts[ord[j - 1]].per_gpu ||
                             (r.pts[i].per_gpu == r.pts[ord[j - 1]].per_gpu && r.pts[i].per_gpu == 0 &&
                              r.pts[i].best_attainment > r.pts[ord[j - 1]].best_attainment))) {
                ord[j] = ord[j - 1];
                j--;
            }
            ord[j] = i;
        }
    printf("ranked by goodput per GPU (tok/s/GPU: goodput x mean output tokens per GPU; latencies and "
           "attainment from one run at the goodput rate, or with no goodput at the best attainment's):\n");
    printf("  %4s %-40s %4s %9s %9s %11s %15s %15s %7s %s\n", "rank", "deployment", "GPUs", "req/s",
           "req/s/GPU", "tok/s/GPU", "TTFT p50/p90 ms", "TPOT p50/p90 ms", "attain", "phase");
    for (size_t k = 0; k < nok && k < (size_t)top; k++) {
        const tdm_sim_deploy_point *q = &r.pts[ord[k]];
        char t1[32], t2[32];
        ms2(t1, sizeof t1, q->ttft_p50, q->ttft_p90);
        ms2(t2, sizeof t2, q->tpot_p50, q->tpot_p90);
        if (q->tpot_p90 < 0.1) snprintf(t2, sizeof t2, "%.1f / %.1f", q->tpot_p50 * 1e3, q->tpot_p90 * 1e3);
        printf("  %4zu %-40s %4u %9.4g %9.4g %11.1f %15s %15s %7.3f %s\n", k + 1, q->label, q->gpus,
               q->goodput_req_s, q->per_gpu, q->goodput_tok_s_per_gpu, t1, t2, q->attainment,
               q->phase ? "limits" : "topology");
    }
    if (nskip) printf("  (%zu candidates not evaluated: over the budget, or the run failed: --json)\n", nskip);
    free(ord);
    const tdm_sim_deploy_point *b = &r.pts[r.best];
    rc = 0;
    if (!r.have_best)
        printf("no deployment meets the SLOs for %.0f%% of requests at any rate; the closest: %s "
               "(%.1f%% at its best rate)\n", 100 * c.ropts.goodput_target, b->label,
               100 * b->best_attainment);
    char desc[600];
    snprintf(desc, sizeof desc, "tandem tune --gpus %d: %s, goodput %.4g req/s (%.4g per GPU) on %s "
                                "(%s on %s), TTFT <= %.0f ms, TPOT <= %.0f ms, attainment >= %.0f%%",
             gpus, b->label, b->goodput_req_s, b->per_gpu, c.t.name, c.m.name, c.h.name,
             c.ropts.slo_ttft_s * 1e3, c.ropts.slo_tpot_s * 1e3, 100 * c.ropts.goodput_target);
    int npool = b->d.disagg ? 2 : 1;
    for (int k = 0; k < npool; k++) {
        char *e = tdm_sim_deploy_engine_json(base, &sp, &b->d, k, desc);
        char fl[200];
        engine_flags(e, fl, sizeof fl);
        printf("vllm %s (%u engine%s): %s\n", b->d.disagg ? (k ? "decode" : "prefill") : "engine",
               b->d.n[k], b->d.n[k] == 1 ? "" : "s", fl);
        if (out) {
            char path[1024];
            sibling(out, b->d.disagg ? (k ? ".decode.json" : ".prefill.json") : ".engine.json", path,
                    sizeof path);
            if (write_text(path, e) != 0) {
                fprintf(stderr, "tandem tune: cannot write %s\n", path);
                rc = 1;
            } else {
                printf("wrote %s (vLLM: --additional-config '{\"tandem\": {\"config\": \"%s\"}}')\n",
                       path, path);
            }
        }
        free(e);
    }
    if (out) {
        char *doc = tdm_sim_deploy_json(base, &sp, &b->d, "tuned", desc);
        if (write_text(out, doc) != 0) {
            fprintf(stderr, "tandem tune: cannot write %s\n", out);
            rc = 1;
        } else {
            printf("wrote %s (tandem sim --config %s)\n", out, out);
        }
        free(doc);
    }
    if (c.json && write_points_json(c.json, &r) != 0) {
        fprintf(stderr, "tandem tune: cannot write %s\n", c.json);
        rc = 1;
    }
    printf("tune best=%.6g req/s/gpu deployment=\"%s\" gpus=%u goodput=%.6g req/s ttft_p90_ms=%.1f "
           "tpot_p90_ms=%.2f tok_s_per_gpu=%.1f evaluated=%d infeasible=%zu runs=%llu wall_s=%.1f\n",
           b->per_gpu, b->label, b->gpus, b->goodput_req_s, b->ttft_p90 * 1e3, b->tpot_p90 * 1e3,
           b->goodput_tok_s_per_gpu, r.evaluated, ninf, (unsigned long long)r.runs, r.wall_s);
done:
    tdm_sim_deploy_result_free(&r);
    free(base);
    tdm_sim_cli_free(&c);
    return rc;
}
