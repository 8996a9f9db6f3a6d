/*
 * tune_deploy.c -- the deployment search of `tandem tune --gpus N` (tune_deploy.h; the space,
 * the enumeration and the documents are in tune_deploy_space.c): the feasibility check
 * (memory as vLLM sizes it, the library's config validation),
 * the evaluation of one candidate (goodput through tdm_sim_goodput, then one run at that
 * rate for its percentiles and throughput), the batches of evaluations spread over forked
 * workers, and the search itself (topologies, then the limits of the best ones).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tune_deploy.h"

/* ---- feasibility ------------------------------------------------------------------------ */

int tdm_sim_deploy_check(const char *base_json, const tdm_sim_deploy_space *s,
                         const tdm_sim_deploy *d, const tdm_sim_model *m, const tdm_sim_hw *h,
                         double mem_util, uint32_t max_len, uint32_t prefill_len, char *why,
                         size_t whylen)
{
    char *txt = tdm_sim_deploy_json(base_json, s, d, "check", NULL);
    if (!txt) {
        snprintf(why, whylen, "out of memory, or the base config is not a JSON object");
        return -1;
    }
    tdm_sim_config cfg;
    char err[TDM_SIM_ERRLEN];
    int rc = tdm_sim_config_parse(txt, "check", m, h, &cfg, err, sizeof err);
    free(txt);
    if (rc != 0) {
        snprintf(why, whylen, "config: %.180s", err);
        return -1;
    }
    static const char *const ROLE[3] = {"", "prefill pool: ", "decode pool: "};
    int bad = 0;
    for (int i = 0; i < (cfg.disagg ? 2 : 1) && !bad; i++) {
        const tdm_sim_pool *pl = &cfg.pools[i];
        const char *who = ROLE[cfg.disagg ? i + 1 : 0];
        uint32_t tp = pl->model.tp ? pl->model.tp : 1;
        if (!tdm_sim__deploy_tp_fits(&pl->model, tp)) {
            snprintf(why, whylen, "%stp %u does not divide the model's %u attention heads", who, tp,
                     pl->model.heads);
            bad = 1;
            break;
        }
        tdm_sched *sc = NULL;
        if (tdm_sched_create(&sc) != TDM_OK) {
            snprintf(why, whylen, "out of memory");
            bad = 1;
            break;
        }
        uint32_t ml = pl->model.max_len > max_len ? pl->model.max_len : max_len;
        if (!pl->sched_json || !strstr(pl->sched_json, "\"max_model_len\""))
            tdm_sched_set_param(sc, TDM_SCHED_MAX_MODEL_LEN, ml);
        if (pl->sched_json && tdm_sched_configure(sc, pl->sched_json) != TDM_OK) {
            snprintf(why, whylen, "%sscheduler config refused: %.150s", who, tdm_sched_errmsg(sc));
            bad = 1;
        } else if (pl->hw.mem_gib > 0 && !(pl->sched_json && strstr(pl->sched_json, "\"num_blocks\""))) {
            int64_t bs = 16, mbt = 2048, mns = 128;
            tdm_sched_get_param(sc, TDM_SCHED_BLOCK_SIZE, &bs);
            tdm_sched_get_param(sc, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, &mbt);
            tdm_sched_get_param(sc, TDM_SCHED_MAX_NUM_SEQS, &mns);
            tdm_sim_cost cost;
            tdm_sim_cost_init(&cost, &pl->model, &pl->hw);
            uint32_t blocks = tdm_sim_cost_num_blocks(&cost, (uint32_t)bs, mem_util, (uint32_t)mbt,
                                                      (uint32_t)mns);
            double need = cfg.disagg && i == 0 ? prefill_len : max_len;
            double w = tdm_sim_model_params(&pl->model) * pl->model.bytes_per_param / tp / 1073741824.0;
            if (blocks <= 1) {
                snprintf(why, whylen, "%stp %u on %s: weights %.1f GiB per GPU leave no KV cache in "
                                      "%.0f%% of %.0f GiB", who, tp, pl->hw.name, w, 100 * mem_util,
                         pl->hw.mem_gib);
                bad = 1;
            } else if ((double)blocks * (double)bs < need) {
                snprintf(why, whylen, "%stp %u on %s: the KV cache holds %.0f tokens, less than the "
                                      "longest request (%.0f)", who, tp, pl->hw.name,
                         (double)blocks * (double)bs, need);
                bad = 1;
            }
        }
        tdm_sched_destroy(sc);
    }
    tdm_sim_config_free(&cfg);
    return bad ? -1 : 0;
}

/* ---- evaluation ------------------------------------------------------------------------- */

typedef struct ctx {
    const tdm_sim_trace *t;
    const char *base_json;
    const tdm_sim_model *m;
    const tdm_sim_hw *h;
    tdm_sim_run_opts ro;
    const tdm_sim_deploy_space *s;
    const tdm_sim_deploy_opts *o;
    tdm_sim_deploy_result *res;
    size_t cap;
    int spent;
    uint32_t max_len, prefill_len;
    double mean_osl;
    double w0;
} ctx;

static void eval_point(const ctx *x, tdm_sim_deploy_point *p)
{
    p->ok = 0;
    p->runs = 0;
    char *txt = tdm_sim_deploy_json(x->base_json, x->s, &p->d, p->label, NULL);
    if (!txt) {
        snprintf(p->why, sizeof p->why, "out of memory");
        return;
    }
    tdm_sim_config cfg;
    char err[TDM_SIM_ERRLEN];
    int rc = tdm_sim_config_parse(txt, p->label, x->m, x->h, &cfg, err, sizeof err);
    free(txt);
    if (rc != 0) {
        snprintf(p->why, sizeof p->why, "%.190s", err);
        return;
    }
    tdm_sim_goodput_out g = {0};
    rc = tdm_sim_goodput(x->t, &cfg, &x->ro, &g, err, sizeof err);
    p->runs = g.runs;
    if (rc == 0) {
        p->goodput_req_s = g.req_s;
        p->per_gpu = p->gpus ? g.req_s / p->gpus : 0;
        p->goodput_tok_s_per_gpu = p->per_gpu * x->mean_osl;
        p->scale = g.scale;
        p->best_attainment = g.best_attainment;
        /* the figures at the goodput rate (or at the best attainment's when there is none) */
        tdm_sim_trace ts;
        double sc = g.req_s > 0 ? g.scale : g.best_scale;
        if (tdm_sim_trace_scaled(x->t, sc > 0 ? sc : 1, &ts) != 0) {
            snprintf(err, sizeof err, "out of memory");
            rc = -1;
        } else {
            tdm_sim_result r;
            rc = tdm_sim_run(&ts, &cfg, &x->ro, &r, err, sizeof err);
            tdm_sim_trace_free(&ts);
            if (rc == 0) {
                const tdm_sim_summary *u = &r.sum;
                p->ttft_p50 = u->ttft.p50;
                p->ttft_p90 = u->ttft.p90;
                p->ttft_p99 = u->ttft.p99;
                p->tpot_p50 = u->tpot.p50;
                p->tpot_p90 = u->tpot.p90;
                p->tpot_p99 = u->tpot.p99;
                p->attainment = u->attainment;
                p->out_tok_s = u->output_throughput_tok_s;
                p->out_tok_s_per_gpu = p->gpus ? u->output_throughput_tok_s / p->gpus : 0;
                p->req_s = u->request_throughput;
                tdm_sim_result_free(&r);
            }
            p->runs++;
        }
    }
    tdm_sim_config_free(&cfg);
    if (rc == 0) p->ok = 1;
    else snprintf(p->why, sizeof p->why, "%.190s", err);
}

static void report(const ctx *x, const tdm_sim_deploy_point *p)
{
    FILE *f = x->o->progress;
    if (!f) return;
    if (p->infeasible)
        fprintf(f, "tune [-/%d] %-44s infeasible (not counted): %s\n", x->o->budget, p->label, p->why);
    else if (!p->ok)
        fprintf(f, "tune [%d/%d] %-44s failed: %s\n", x->spent, x->o->budget, p->label, p->why);
    else
        fprintf(f, "tune [%d/%d %.0fs] %-44s %d GPUs goodput %.4g req/s (%.4g per GPU), TTFT p90 "
                   "%.0f ms, TPOT p90 %.1f ms (%d runs)\n",
                x->spent, x->o->budget, tdm_sim_wall() - x->w0, p->label, p->gpus, p->goodput_req_s,
                p->per_gpu, p->ttft_p90 * 1e3, p->tpot_p90 * 1e3, p->runs);
    fflush(f);
}

typedef struct rec {
    size_t k;
    tdm_sim_deploy_point p;
} rec;

static int read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Evaluate pts[first ..] that are feasible and not yet evaluated, up to the budget; with
 * jobs > 1 in forked workers (worker w takes every jobs-th), results sent back whole. */
static int eval_batch(ctx *x, size_t first, char *err, size_t errlen)
{
    tdm_sim_deploy_point *pts = x->res->pts;
    size_t m = 0;
    size_t *todo = calloc(x->res->n - first + 1, sizeof *todo);
    if (!todo) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = first; i < x->res->n; i++)
        if (!pts[i].infeasible && x->spent + (int)m < x->o->budget) todo[m++] = i;
        else if (!pts[i].infeasible) snprintf(pts[i].why, sizeof pts[i].why, "over the budget");
    int jobs = x->o->jobs < 1 ? 1 : x->o->jobs > 64 ? 64 : x->o->jobs;
    if ((size_t)jobs > m) jobs = (int)m;
    int rc = 0;
    if (jobs <= 1) {
        for (size_t k = 0; k < m; k++) {
            eval_point(x, &pts[todo[k]]);
            x->spent++;
            x->res->runs += (uint64_t)pts[todo[k]].runs;
            report(x, &pts[todo[k]]);
        }
        free(todo);
        return 0;
    }
    int fds[64];
    pid_t pids[64];
    int started = 0;
    fflush(stdout);
    fflush(stderr);
    for (int w = 0; w < jobs; w++) {
        int pp[2];
        if (pipe(pp) != 0) break;
        pid_t pid = fork();
        if (pid < 0) {
            close(pp[0]);
            close(pp[1]);
            break;
        }
        if (pid == 0) {
            close(pp[0]);
            for (int k = 0; k < started; k++) close(fds[k]);
            for (size_t k = (size_t)w; k < m; k += (size_t)jobs) {
                rec r;
                memset(&r, 0, sizeof r);
                r.k = k;
                r.p = pts[todo[k]];
                eval_point(x, &r.p);
                if (write(pp[1], &r, sizeof r) != (ssize_t)sizeof r) _exit(1);
            }
            _exit(0);
        }
        close(pp[1]);
        fds[started] = pp[0];
        pids[started++] = pid;
    }
    if (started < jobs) {
        snprintf(err, errlen, "cannot start %d worker processes: %s", jobs, strerror(errno));
        rc = -1;
    }
    /* worker w's records in order (a worker blocked on a full pipe waits for its turn) */
    for (int w = 0; w < started; w++) {
        for (size_t k = (size_t)w; rc == 0 && k < m; k += (size_t)jobs) {
            rec r;
            tdm_sim_deploy_point *p = &pts[todo[k]];
            if (read_full(fds[w], &r, sizeof r) != 0 || r.k != k) {
                p->ok = 0;
                snprintf(p->why, sizeof p->why, "the worker process failed");
            } else {
                r.p.label[sizeof r.p.label - 1] = '\0';
                r.p.why[sizeof r.p.why - 1] = '\0';
                *p = r.p;
            }
            x->spent++;
            x->res->runs += (uint64_t)p->runs;
            report(x, p);
        }
        close(fds[w]);
    }
    for (int w = 0; w < started; w++) {
        if (rc != 0) kill(pids[w], SIGTERM);
        waitpid(pids[w], NULL, 0);
    }
    free(todo);
    return rc;
}

/* ---- the search ------------------------------------------------------------------------- */

static int same(const tdm_sim_deploy *a, const tdm_sim_deploy *b)
{
    return a->disagg == b->disagg && a->n[0] == b->n[0] && a->tp[0] == b->tp[0] &&
           a->is == b->is && a->it == b->it &&
           (!a->disagg || (a->n[1] == b->n[1] && a->tp[1] == b->tp[1]));
}

/* a better than b: higher goodput per GPU; without goodput, a higher best attainment */
static int better(const tdm_sim_deploy_point *a, const tdm_sim_deploy_point *b)
{
    if (!a->ok) return 0;
    if (!b->ok) return 1;
    if (a->per_gpu != b->per_gpu) return a->per_gpu > b->per_gpu;
    return a->per_gpu == 0 && a->best_attainment > b->best_attainment;
}

/* Record a candidate (checked, labelled); 0 = added, 1 = already there, -1 = out of memory. */
static int push(ctx *x, const tdm_sim_deploy *d, int phase)
{
    tdm_sim_deploy_result *r = x->res;
    for (size_t i = 0; i < r->n; i++)
        if (same(&r->pts[i].d, d)) return 1;
    if (r->n == x->cap) {
        size_t nc = x->cap ? 2 * x->cap : 32;
        tdm_sim_deploy_point *np = realloc(r->pts, nc * sizeof *np);
        if (!np) return -1;
        r->pts = np;
        x->cap = nc;
    }
    tdm_sim_deploy_point *p = &r->pts[r->n++];
    memset(p, 0, sizeof *p);
    p->d = *d;
    p->gpus = tdm_sim_deploy_gpus(d);
    p->phase = phase;
    tdm_sim_deploy_label(x->s, d, p->label, sizeof p->label);
    p->infeasible = tdm_sim_deploy_check(x->base_json, x->s, d, x->m, x->h, x->ro.mem_util, x->max_len,
                                         x->prefill_len, p->why, sizeof p->why) != 0;
    if (p->infeasible) report(x, p);
    return 0;
}

/* Pattern search over (is, it) around topology point k. */
static int refine_one(ctx *x, size_t k, char *err, size_t errlen)
{
    tdm_sim_deploy_point cur = x->res->pts[k];
    int step = 1;
    while (x->spent < x->o->budget) {
        size_t first = x->res->n;
        const int mv[4][2] = {{-step, 0}, {step, 0}, {0, -step}, {0, step}};
        for (int j = 0; j < 4; j++) {
            tdm_sim_deploy d = cur.d;
            d.is += mv[j][0];
            d.it += mv[j][1];
            if (d.is < 0 || d.is >= x->s->nseqs || d.it < 0 || d.it >= x->s->ntokens) continue;
            if (push(x, &d, 1) < 0) {
                snprintf(err, errlen, "out of memory");
                return -1;
            }
        }
        int todo = 0;
        for (size_t i = first; i < x->res->n; i++) todo += !x->res->pts[i].infeasible;
        if (todo == 0) {
            if (step == 1) {
                step = 2;
                continue;
            }
            break;
        }
        if (eval_batch(x, first, err, errlen) != 0) return -1;
        size_t bi = (size_t)-1;
        for (size_t i = first; i < x->res->n; i++)
            if (x->res->pts[i].ok && better(&x->res->pts[i], bi == (size_t)-1 ? &cur : &x->res->pts[bi]))
                bi = i;
        if (bi != (size_t)-1 && better(&x->res->pts[bi], &cur)) {
            cur = x->res->pts[bi];
            step = 1;
        } else if (step == 1) {
            step = 2;
        } else {
            break;
        }
    }
    return 0;
}

int tdm_sim_deploy_search(const tdm_sim_trace *t, const char *base_json, const tdm_sim_model *m,
                          const tdm_sim_hw *h, const tdm_sim_run_opts *ro,
                          tdm_sim_deploy_space *s, const tdm_sim_deploy_opts *o,
                          tdm_sim_deploy_result *res, char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    if (!t || !m || !h || !ro || !s || !o || t->n == 0) {
        snprintf(err, errlen, "deployment search: missing argument");
        return -1;
    }
    if (o->budget < 1 || o->budget > 100000 || o->refine < 0) {
        snprintf(err, errlen, "budget must be in [1, 100000] evaluations, refine >= 0");
        return -1;
    }
    if (ro->concurrency) {
        snprintf(err, errlen, "deployments are ranked by goodput, a search over the arrival rate; "
                              "closed loop (--concurrency) does not apply");
        return -1;
    }
    ctx x;
    memset(&x, 0, sizeof x);
    x.t = t;
    x.base_json = base_json;
    x.m = m;
    x.h = h;
    x.ro = *ro;
    x.ro.progress = 0;
    x.ro.steps_csv = x.ro.chrome_trace = NULL;
    x.ro.label = NULL;
    x.ro.keep_requests = 0;
    x.s = s;
    x.o = o;
    x.res = res;
    x.w0 = tdm_sim_wall();
    for (size_t i = 0; i < t->n; i++) {
        x.mean_osl += (double)t->reqs[i].output_len / (double)t->n;
        uint32_t need = t->reqs[i].prompt_len + t->reqs[i].output_len;
        if (need > x.max_len) x.max_len = need;
        if (t->reqs[i].prompt_len + 1 > x.prefill_len) x.prefill_len = t->reqs[i].prompt_len + 1;
    }
    int is0, it0;
    if (tdm_sim_deploy_base_limits(base_json, s, &is0, &it0, err, errlen) != 0) return -1;
    tdm_sim_deploy *topo = NULL;
    size_t nt = 0;
    if (tdm_sim_deploy_enumerate(s, m, is0, it0, &topo, &nt, err, errlen) != 0) return -1;
    if (nt == 0) {
        free(topo);
        snprintf(err, errlen, "no deployment of the TP degrees given fits %u GPU%s and divides "
                              "the model's %u attention heads", s->gpus, s->gpus == 1 ? "" : "s", m->heads);
        return -1;
    }
    for (size_t i = 0; i < nt; i++)
        if (push(&x, &topo[i], 0) < 0) {
            free(topo);
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
    free(topo);
    size_t ntopo = res->n, feasible = 0;
    for (size_t i = 0; i < ntopo; i++) feasible += !res->pts[i].infeasible;
    if (feasible == 0) {
        int w = snprintf(err, errlen, "no deployment fits %u GPU%s:", s->gpus, s->gpus == 1 ? "" : "s");
        for (size_t i = 0; i < ntopo && w > 0 && (size_t)w < errlen; i++)
            w += snprintf(err + w, errlen - (size_t)w, "%s %s: %s", i ? ";" : "", res->pts[i].label,
                          res->pts[i].why);
        goto fail;
    }
    /* 1. every topology at the base's limits */
    if (eval_batch(&x, 0, err, errlen) != 0) goto fail;
    /* 2. the limits of the best topologies */
    size_t *ord = calloc(ntopo, sizeof *ord), nok = 0;
    if (!ord) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < ntopo; i++)
        if (res->pts[i].ok) {
            size_t j = nok++;
            while (j > 0 && better(&res->pts[i], &res->pts[ord[j - 1]])) {
                ord[j] = ord[j - 1];
                j--;
            }
            ord[j] = i;
        }
    for (size_t k = 0; k < nok && k < (size_t)o->refine && x.spent < o->budget; k++)
        if (refine_one(&x, ord[k], err, errlen) != 0) {
            free(ord);
            goto fail;
        }
    free(ord);
    res->evaluated = x.spent;
    res->wall_s = tdm_sim_wall() - x.w0;
    int have = 0;
    for (size_t i = 0; i < res->n; i++)
        if (res->pts[i].ok && (!have || better(&res->pts[i], &res->pts[res->best]))) {
            res->best = i;
            have = 1;
        }
    if (!have) {
        snprintf(err, errlen, "no deployment could be evaluated (%s: %s)", res->pts[0].label,
                 res->pts[0].why);
        goto fail;
    }
    res->have_best = res->pts[res->best].per_gpu > 0;
    return 0;
fail:
    tdm_sim_deploy_result_free(res);
    return -1;
}

void tdm_sim_deploy_result_free(tdm_sim_deploy_result *r)
{
    if (!r) return;
    free(r->pts);
    r->pts = NULL;
    r->n = 0;
}
