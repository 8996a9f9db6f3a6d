/*
 * tune.c -- the search of `tandem tune` (tune.h): the parameter space and its "key=v1,v2"
 * overrides, the config document of each point (the base document with the searched keys
 * set in its scheduler objects, so that what is evaluated is exactly what --out writes),
 * the objective of one point (goodput with tdm_sim_goodput, the same search as `tandem ab
 * --goodput`; attainment or output throughput of one run), a cache of the points already
 * evaluated, and the batches of evaluations spread over forked worker processes (each
 * evaluation is deterministic, so the worker count never changes a result).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tune.h"

/* ---- config documents ------------------------------------------------------------------ */

/* The base document as a wrapper {"name", "scheduler", ...} (a bare scheduler JSON is
 * wrapped); NULL on a parse error. */
static json_t *base_doc(const char *base_json, char *err, size_t errlen)
{
    if (!base_json) {
        json_t *d = json_object();
        if (d) json_object_set_new(d, "scheduler", json_object());
        return d;
    }
    json_error_t je;
    json_t *o = json_loads(base_json, 0, &je);
    if (!o || !json_is_object(o)) {
        snprintf(err, errlen, "base config: %d:%d: %s", je.line, je.column,
                 o ? "expected an object" : je.text);
        json_decref(o);
        return NULL;
    }
    if (json_object_get(o, "scheduler") || json_object_get(o, "deployment") ||
        json_object_get(o, "name")) {
        if (!json_object_get(o, "scheduler")) json_object_set_new(o, "scheduler", json_object());
        return o;
    }
    json_t *d = json_object();
    if (d) json_object_set_new(d, "scheduler", o);
    else json_decref(o);
    return d;
}

/* The scheduler objects of a wrapper that a pool reads, top-level first. */
static int sched_objs(json_t *doc, json_t *out[4])
{
    int n = 0;
    json_t *s = json_object_get(doc, "scheduler"), *d = json_object_get(doc, "deployment");
    if (json_is_object(s)) out[n++] = s;
    if (json_is_object(d)) {
        json_t *x = json_object_get(d, "scheduler");
        if (json_is_object(x)) out[n++] = x;
        static const char *const P[] = {"prefill", "decode"};
        for (int i = 0; i < 2; i++) {
            json_t *p = json_object_get(d, P[i]);
            x = json_is_object(p) ? json_object_get(p, "scheduler") : NULL;
            if (json_is_object(x)) out[n++] = x;
        }
    }
    return n;
}

/* The base's value of a key as the first pool sees it (NULL: not set). */
static json_t *base_value(json_t *doc, const char *key)
{
    json_t *objs[4], *v = NULL;
    int n = sched_objs(doc, objs);
    for (int i = 0; i < n && i < 3; i++) {
        json_t *x = json_object_get(objs[i], key);
        if (x) v = x;
    }
    return v;
}

static json_t *axis_json(const tdm_sim_tune_axis *a, const char *v)
{
    if (a->kind == TDM_SIM_TUNE_MODE) return json_string(v);
    if (a->kind == TDM_SIM_TUNE_BOOL) return json_boolean(!strcmp(v, "true"));
    if (a->kind == TDM_SIM_TUNE_INT || !strchr(v, '.')) return json_integer(strtoll(v, NULL, 10));
    return json_real(strtod(v, NULL));
}

static void point_label(const tdm_sim_tune_space *s, const tdm_sim_tune_point *p, char *out,
                        size_t n)
{
    int w = 0;
    out[0] = '\0';
    for (int a = 0; a < s->n && w >= 0 && (size_t)w < n; a++) {
        const tdm_sim_tune_axis *ax = &s->ax[a];
        if (p->idx[a] < 0 || ax->n < 2) continue;
        const tdm_sim__tune_keydef *k = tdm_sim__tune_key(ax->key);
        w += snprintf(out + w, n - (size_t)w, "%s%s%s", w ? " " : "", k ? k->tag : ax->key,
                      ax->vals[p->idx[a]]);
    }
    if (!out[0]) snprintf(out, n, "(pinned space)");
}

char *tdm_sim_tune_point_json(const char *base_json, const tdm_sim_tune_space *s,
                              const tdm_sim_tune_point *p, const char *name,
                              const char *description)
{
    char err[128];
    json_t *doc = base_doc(base_json, err, sizeof err);
    if (!doc) return NULL;
    json_t *objs[4];
    int n = sched_objs(doc, objs);
    for (int a = 0; a < s->n && !p->is_base; a++) {
        if (p->idx[a] < 0) continue;
        /* the top-level scheduler always gets the key; a pool's own scheduler object only
         * where it sets it (it would override the top-level value) */
        for (int i = 0; i < n; i++)
            if (i == 0 || json_object_get(objs[i], s->ax[a].key))
                json_object_set_new(objs[i], s->ax[a].key, axis_json(&s->ax[a], s->ax[a].vals[p->idx[a]]));
    }
    if (name) json_object_set_new(doc, "name", json_string(name));
    if (description) json_object_set_new(doc, "description", json_string(description));
    char *txt = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(doc);
    return txt;
}

/* ---- evaluation ------------------------------------------------------------------------ */

typedef struct ctx {
    const tdm_sim_trace *t;
    const char *base_json;
    const tdm_sim_model *m;
    const tdm_sim_hw *h;
    tdm_sim_run_opts ro;
    const tdm_sim_tune_space *s;
    const tdm_sim_tune_opts *o;
    tdm_sim_tune_result *res;
    double w0;
    int base_df;                 /* the base's mode is decode_first */
    int base_equiv;              /* the base is the point of the axes' starts */
    size_t cap;                  /* of res->pts */
    int spent;                   /* evaluations that simulated (refused points do not count) */
    uint32_t max_model_len;      /* what the engine sets when a config does not */
} ctx;

/* Would the library refuse this point's scheduler configs? Checked by configuring a real
 * tdm_sched per pool as the engine does (max_model_len first), without simulating. */
static int refused(const ctx *x, const tdm_sim_tune_point *p, char *msg, size_t n)
{
    char *txt = tdm_sim_tune_point_json(x->base_json, x->s, p, p->label, NULL);
    if (!txt) {
        snprintf(msg, n, "out of memory");
        return 1;
    }
    tdm_sim_config cfg;
    char err[TDM_SIM_ERRLEN];
    int rc = tdm_sim_config_parse(txt, p->label, x->m, x->h, &cfg, err, sizeof err);
    free(txt);
    if (rc != 0) {
        snprintf(msg, n, "%.150s", err);
        return 1;
    }
    int bad = 0;
    for (int i = 0; i < (cfg.disagg ? 2 : 1) && !bad; i++) {
        const tdm_sim_pool *pl = &cfg.pools[i];
        tdm_sched *sc = NULL;
        if (tdm_sched_create(&sc) != TDM_OK) {
            snprintf(msg, n, "out of memory");
            bad = 1;
            break;
        }
        uint32_t ml = pl->model.max_len > x->max_model_len ? pl->model.max_len : x->max_model_len;
        if (!pl->sched_json || !strstr(pl->sched_json, "\"max_model_len\""))
            tdm_sched_set_param(sc, TDM_SCHED_MAX_MODEL_LEN, ml);
        if (pl->sched_json && (rc = tdm_sched_configure(sc, pl->sched_json)) != TDM_OK) {
            snprintf(msg, n, "scheduler config: %.120s", tdm_sched_errmsg(sc));
            bad = 1;
        }
        tdm_sched_destroy(sc);
    }
    tdm_sim_config_free(&cfg);
    return bad;
}

/* Evaluate one point in this process: fills ok, value, scale, runs, err. */
static void eval_point(const ctx *x, tdm_sim_tune_point *p)
{
    p->ok = 0;
    p->value = -1;
    p->scale = 0;
    p->runs = 0;
    p->err[0] = '\0';
    char *txt = tdm_sim_tune_point_json(x->base_json, x->s, p, p->label, NULL);
    if (!txt) {
        snprintf(p->err, sizeof p->err, "out of memory");
        return;
    }
    tdm_sim_config cfg;
    char err[TDM_SIM_ERRLEN];
    int rc = tdm_sim_config_parse(txt, p->label, x->m, x->h, &cfg, err, sizeof err);
    free(txt);
    if (rc != 0) {
        snprintf(p->err, sizeof p->err, "%.150s", err);
        return;
    }
    if (x->o->objective == TDM_SIM_TUNE_GOODPUT) {
        tdm_sim_goodput_out g = {0};
        rc = tdm_sim_goodput(x->t, &cfg, &x->ro, &g, err, sizeof err);
        if (rc == 0) {
            p->value = g.req_s;
            p->scale = g.scale;
        }
        p->runs = g.runs ? g.runs : 1;
    } else {
        tdm_sim_result r;
        rc = tdm_sim_run(x->t, &cfg, &x->ro, &r, err, sizeof err);
        if (rc == 0) {
            p->value = x->o->objective == TDM_SIM_TUNE_ATTAINMENT ? r.sum.attainment
                                                                 : r.sum.output_throughput_tok_s;
            tdm_sim_result_free(&r);
        }
        p->runs = 1;
    }
    tdm_sim_config_free(&cfg);
    if (rc == 0) p->ok = 1;
    else snprintf(p->err, sizeof p->err, "%.150s", err);
}

typedef struct rec {
    int i, ok, runs;
    double value, scale;
    char err[160];
} rec;

static void report(const ctx *x, const tdm_sim_tune_point *p)
{
    if (!x->o->progress) return;
    const char *unit = x->o->objective == TDM_SIM_TUNE_GOODPUT ? " req/s"
                       : x->o->objective == TDM_SIM_TUNE_THROUGHPUT ? " tok/s" : "";
    static const char *const PH[] = {"base", "grid", "refine"};
    if (p->refused)
        fprintf(x->o->progress, "tune [-/%d %s] %-52s refused (not counted): %s\n", x->o->budget,
                PH[p->phase], p->label, p->err);
    else if (p->ok)
        fprintf(x->o->progress, "tune [%d/%d %s %.0fs] %-52s %s %.4g%s (%d runs)\n", x->spent,
                x->o->budget, PH[p->phase], tdm_sim_wall() - x->w0, p->label,
                tdm_sim_tune_objective_name(x->o->objective), p->value, unit, p->runs);
    else
        fprintf(x->o->progress, "tune [%d/%d %s] %-52s failed: %s\n", x->spent, x->o->budget,
                PH[p->phase], p->label, p->err);
    fflush(x->o->progress);
}

static int read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return got ? -1 : 0;
        got += (size_t)r;
    }
    return 1;
}

static void stop_workers(int *fds, const pid_t *pids, int n)
{
    for (int k = 0; k < n; k++) {
        if (fds[k] >= 0) close(fds[k]);
        kill(pids[k], SIGTERM);
        waitpid(pids[k], NULL, 0);
    }
}

/* Evaluate the points res->pts[first ..] that are not refused; with jobs > 1 in forked
 * workers, worker w taking every jobs-th of them and sending back fixed-size records. */
static int eval_batch(ctx *x, size_t first, char *err, size_t errlen)
{
    tdm_sim_tune_point *pts = x->res->pts;
    size_t todo[256], m = 0;
    for (size_t i = first; i < x->res->n && m < 256; i++)
        if (!pts[i].refused) todo[m++] = i;
    if (m == 0) return 0;
    int jobs = x->o->jobs < 1 ? 1 : x->o->jobs > 64 ? 64 : x->o->jobs;
    if ((size_t)jobs > m) jobs = (int)m;
    if (jobs <= 1) {
        for (size_t k = 0; k < m; k++) {
            tdm_sim_tune_point *p = &pts[todo[k]];
            eval_point(x, p);
            x->spent++;
            x->res->runs += (uint64_t)p->runs;
            report(x, p);
        }
        return 0;
    }
    int fds[64];
    pid_t pids[64];
    int started = 0;
    fflush(stdout);
    fflush(stderr);
    if (x->o->progress) fflush(x->o->progress);
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
                tdm_sim_tune_point p = pts[todo[k]];
                eval_point(x, &p);
                rec r;
                memset(&r, 0, sizeof r);
                r.i = (int)k;
                r.ok = p.ok;
                r.runs = p.runs;
                r.value = p.value;
                r.scale = p.scale;
                memcpy(r.err, p.err, sizeof r.err);
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
        stop_workers(fds, pids, started);
        return -1;
    }
    char done[256] = {0};
    struct pollfd pf[64];
    int open_n = started;
    for (int k = 0; k < started; k++) {
        pf[k].fd = fds[k];
        pf[k].events = POLLIN;
    }
    while (open_n > 0) {
        if (poll(pf, (nfds_t)started, -1) < 0) {
            if (errno == EINTR) continue;
            snprintf(err, errlen, "poll: %s", strerror(errno));
            for (int k = 0; k < started; k++) fds[k] = pf[k].fd;
            stop_workers(fds, pids, started);
            return -1;
        }
        for (int k = 0; k < started; k++) {
            if (pf[k].fd < 0 || !(pf[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            rec r;
            int got = read_full(pf[k].fd, &r, sizeof r);
            if (got <= 0 || r.i < 0 || (size_t)r.i >= m || done[r.i]) {
                close(pf[k].fd);
                pf[k].fd = -1;
                open_n--;
                continue;
            }
            tdm_sim_tune_point *p = &pts[todo[r.i]];
            p->ok = r.ok;
            p->runs = r.runs;
            p->value = r.value;
            p->scale = r.scale;
            r.err[sizeof r.err - 1] = '\0';
            memcpy(p->err, r.err, sizeof p->err);
            done[r.i] = 1;
            x->spent++;
            x->res->runs += (uint64_t)r.runs;
            report(x, p);
        }
    }
    for (int k = 0; k < started; k++) waitpid(pids[k], NULL, 0);
    for (size_t k = 0; k < m; k++)
        if (!done[k]) {
            tdm_sim_tune_point *p = &pts[todo[k]];
            p->ok = 0;
            p->value = -1;
            snprintf(p->err, sizeof p->err, "the worker process failed");
            x->spent++;
        }
    return 0;
}

/* ---- the search ------------------------------------------------------------------------ */

static int is_df(const ctx *x, const tdm_sim_tune_point *p)
{
    int m = tdm_sim__tune_axis_of(x->s, "mode");
    if (m < 0 || p->idx[m] < 0) return x->base_df;
    return !strcmp(x->s->ax[m].vals[p->idx[m]], "decode_first");
}

/* Parameters that do not apply are -1; those that apply and were -1 take their start. */
static void canon(const ctx *x, tdm_sim_tune_point *p)
{
    int df = is_df(x, p);
    for (int a = 0; a < x->s->n; a++) {
        const tdm_sim__tune_keydef *k = tdm_sim__tune_key(x->s->ax[a].key);
        if (k && k->df_only && !df) p->idx[a] = -1;
        else if (p->idx[a] < 0) p->idx[a] = x->s->ax[a].start;
    }
}

static int same(const ctx *x, const tdm_sim_tune_point *p, const tdm_sim_tune_point *q)
{
    if (p->is_base || q->is_base) return 0;
    for (int a = 0; a < x->s->n; a++)
        if (p->idx[a] != q->idx[a]) return 0;
    return 1;
}

/* Queue a candidate (canonicalised; skipped when already evaluated or queued, or when the
 * queue holds the rest of the budget). A config the library refuses is recorded, reported
 * and not counted. Returns -1 when out of memory. */
static int push(ctx *x, size_t first, tdm_sim_tune_point p, int phase)
{
    tdm_sim_tune_result *r = x->res;
    size_t queued = 0;
    for (size_t i = first; i < r->n; i++) queued += !r->pts[i].refused;
    if (x->spent + (int)queued >= x->o->budget || queued >= 256) return 0;
    canon(x, &p);
    for (size_t i = 0; i < r->n; i++)
        if (same(x, &r->pts[i], &p)) return 0;
    if (x->base_equiv) { /* the base already measured this point */
        tdm_sim_tune_point st = p;
        for (int a = 0; a < x->s->n; a++) st.idx[a] = -1;
        canon(x, &st);
        if (same(x, &st, &p)) return 0;
    }
    if (r->n == x->cap) {
        size_t nc = x->cap ? 2 * x->cap : 64;
        tdm_sim_tune_point *np = realloc(r->pts, nc * sizeof *np);
        if (!np) return -1;
        r->pts = np;
        x->cap = nc;
    }
    p.is_base = 0;
    p.phase = phase;
    p.ok = 0;
    p.value = -1;
    p.runs = 0;
    p.err[0] = '\0';
    point_label(x->s, &p, p.label, sizeof p.label);
    p.refused = refused(x, &p, p.err, sizeof p.err);
    r->pts[r->n++] = p;
    if (p.refused) report(x, &p);
    return 0;
}

static size_t best_of(const tdm_sim_tune_result *r)
{
    size_t b = 0;
    for (size_t i = 1; i < r->n; i++)
        if (r->pts[i].ok && (!r->pts[b].ok || r->pts[i].value > r->pts[b].value)) b = i;
    return b;
}

/* The base's values become the axes' starts (added to an axis that lacks them). */
static int set_starts(ctx *x, tdm_sim_tune_space *s, json_t *doc, char *err, size_t errlen)
{
    x->base_equiv = 1;
    for (int a = 0; a < s->n; a++) {
        tdm_sim_tune_axis *ax = &s->ax[a];
        const tdm_sim__tune_keydef *k = tdm_sim__tune_key(ax->key);
        json_t *v = base_value(doc, ax->key);
        char raw[64], val[TDM_SIM_TUNE_VLEN], e2[160];
        if (!v) snprintf(raw, sizeof raw, "%s", k->libdef);
        else if (json_is_string(v)) snprintf(raw, sizeof raw, "%s", json_string_value(v));
        else if (json_is_boolean(v)) snprintf(raw, sizeof raw, "%s", json_is_true(v) ? "true" : "false");
        else if (json_is_integer(v)) snprintf(raw, sizeof raw, "%lld", (long long)json_integer_value(v));
        else if (json_is_real(v)) snprintf(raw, sizeof raw, "%.10g", json_real_value(v));
        else raw[0] = '\0';
        if (tdm_sim__tune_norm(k, raw, val, e2, sizeof e2) != 0) {
            snprintf(err, errlen, "base config: %s", e2);
            return -1;
        }
        if (!strcmp(ax->key, "mode")) x->base_df = !strcmp(val, "decode_first");
        ax->start = -1;
        for (int i = 0; i < ax->n; i++)
            if (tdm_sim__tune_value_eq(ax, ax->vals[i], val)) ax->start = i;
        if (ax->start >= 0) continue;
        if (v && ax->n > 1) { /* the base's own value joins the axis, in order */
            int pos = ax->n;
            if (ax->kind == TDM_SIM_TUNE_INT || ax->kind == TDM_SIM_TUNE_NUM)
                for (pos = 0; pos < ax->n && strtod(ax->vals[pos], NULL) < strtod(val, NULL); pos++) {}
            memmove(ax->vals[pos + 1], ax->vals[pos], (size_t)(ax->n - pos) * TDM_SIM_TUNE_VLEN);
            memcpy(ax->vals[pos], val, TDM_SIM_TUNE_VLEN);
            ax->n++;
            ax->start = pos;
        } else {
            ax->start = 0; /* pinned, or the library default is outside the given values */
            x->base_equiv = 0; /* the base does not run with the start's value */
        }
    }
    return 0;
}

/* Coarse indices of an axis: every value up to 3, else 3 spread over the range. */
static int coarse(const tdm_sim_tune_axis *ax, int out[3])
{
    if (ax->n <= 3 || ax->kind == TDM_SIM_TUNE_MODE || ax->kind == TDM_SIM_TUNE_BOOL) {
        int n = ax->n < 3 ? ax->n : 3;
        for (int i = 0; i < n; i++) out[i] = i;
        return n;
    }
    for (int k = 0; k < 3; k++) out[k] = (int)((k + 0.5) * ax->n / 3.0);
    return 3;
}

/* The coarse grid: mode x token budget x TBT target (decode_first only), the other
 * parameters at their starts; spread evenly when larger than 2/3 of the budget. */
static int grid_phase(ctx *x, char *err, size_t errlen)
{
    const tdm_sim_tune_space *s = x->s;
    int am = tdm_sim__tune_axis_of(s, "mode"), ab = tdm_sim__tune_axis_of(s, "max_num_batched_tokens"),
        at = tdm_sim__tune_axis_of(s, "tbt_target_ms");
    int cm[3], cb[3], ct[3], nm = 1, nb = 1, nt = 1;
    cm[0] = cb[0] = ct[0] = -1;
    if (am >= 0) nm = coarse(&s->ax[am], cm);
    if (ab >= 0) nb = coarse(&s->ax[ab], cb);
    if (at >= 0) nt = coarse(&s->ax[at], ct);
    tdm_sim_tune_point grid[27];
    int ng = 0;
    for (int i = 0; i < nm; i++)
        for (int j = 0; j < nb; j++)
            for (int k = 0; k < nt; k++) {
                tdm_sim_tune_point q;
                memset(&q, 0, sizeof q);
                for (int a = 0; a < TDM_SIM_TUNE_MAXAXES; a++) q.idx[a] = -1;
                if (am >= 0) q.idx[am] = cm[i];
                if (ab >= 0) q.idx[ab] = cb[j];
                if (at >= 0) q.idx[at] = ct[k];
                if (at >= 0 && k > 0 && !is_df(x, &q)) continue;
                grid[ng++] = q;
            }
    size_t first = x->res->n, slots = (size_t)(x->o->budget - 1) * 2 / 3;
    if (slots < 1) slots = 1;
    for (size_t i = 0; i < ((size_t)ng < slots ? (size_t)ng : slots); i++)
        if (push(x, first, grid[(size_t)ng <= slots ? i : i * (size_t)ng / slots], 1) != 0) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    return eval_batch(x, first, err, errlen);
}

/* One poll of the neighbours of cur at this step: each ordered parameter's value step
 * places up and down, each other mode or boolean value (step 1 only). Returns the number
 * queued, -1 when out of memory. */
static int poll_phase(ctx *x, tdm_sim_tune_point cur, int step)
{
    const tdm_sim_tune_space *s = x->s;
    int am = tdm_sim__tune_axis_of(s, "mode");
    size_t first = x->res->n;
    canon(x, &cur);
    for (int a = 0; a < s->n; a++) {
        const tdm_sim_tune_axis *ax = &s->ax[a];
        if (cur.idx[a] < 0 || ax->n < 2) continue;
        int ordered = ax->kind == TDM_SIM_TUNE_INT || ax->kind == TDM_SIM_TUNE_NUM;
        for (int v = 0; v < ax->n; v++) {
            if (v == cur.idx[a] || (ordered && abs(v - cur.idx[a]) != step) || (!ordered && step > 1))
                continue;
            tdm_sim_tune_point q = cur;
            q.idx[a] = v;
            if (a == am) /* a new mode: its own parameters from their starts */
                for (int c = 0; c < s->n; c++) {
                    const tdm_sim__tune_keydef *k = tdm_sim__tune_key(s->ax[c].key);
                    if (k && k->df_only) q.idx[c] = -1;
                }
            if (push(x, first, q, 2) != 0) return -1;
        }
    }
    return (int)(x->res->n - first);
}

int tdm_sim_tune_run(const tdm_sim_trace *t, const char *base_json, const tdm_sim_model *m,
                     const tdm_sim_hw *h, const tdm_sim_run_opts *ro, tdm_sim_tune_space *s,
                     const tdm_sim_tune_opts *o, tdm_sim_tune_result *res, char *err,
                     size_t errlen)
{
    memset(res, 0, sizeof *res);
    if (!t || !m || !h || !ro || !s || !o || s->n < 1) {
        snprintf(err, errlen, "tune: missing argument");
        return -1;
    }
    if (o->budget < 1 || o->budget > 100000) {
        snprintf(err, errlen, "tune: budget must be in [1, 100000] evaluations");
        return -1;
    }
    if (o->objective == TDM_SIM_TUNE_GOODPUT && ro->concurrency) {
        snprintf(err, errlen, "tune: the goodput objective searches an arrival rate; closed loop "
                              "(--concurrency) needs --objective attainment or throughput");
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
    x.ro.keep_requests = 0; /* the summary is all a search needs */
    x.s = s;
    x.o = o;
    x.res = res;
    x.w0 = tdm_sim_wall();
    for (size_t i = 0; i < t->n; i++) {
        uint32_t need = t->reqs[i].prompt_len + t->reqs[i].output_len;
        if (need > x.max_model_len) x.max_model_len = need;
    }
    json_t *doc = base_doc(base_json, err, errlen);
    if (!doc) return -1;
    int rc = set_starts(&x, s, doc, err, errlen);
    json_decref(doc);
    if (rc != 0) return -1;
    x.cap = 64;
    res->pts = calloc(x.cap, sizeof *res->pts);
    if (!res->pts) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* 1. the base config as given */
    tdm_sim_tune_point *b = &res->pts[0];
    for (int a = 0; a < TDM_SIM_TUNE_MAXAXES; a++) b->idx[a] = -1;
    b->is_base = 1;
    snprintf(b->label, sizeof b->label, "base");
    res->n = 1;
    if (eval_batch(&x, 0, err, errlen) != 0) goto fail;
    /* 2. the coarse grid */
    if (x.spent < o->budget && grid_phase(&x, err, errlen) != 0) goto fail;
    /* 3. refinement: poll every parameter's neighbours around the best point; move while
     * one improves; when none does, widen the step to 2 once; then stop */
    int step = 1;
    while (x.spent < o->budget) {
        size_t bi = best_of(res);
        tdm_sim_tune_point cur = res->pts[bi];
        if (cur.is_base || !cur.ok) {
            for (int a = 0; a < TDM_SIM_TUNE_MAXAXES; a++) cur.idx[a] = -1;
            cur.is_base = 0;
        }
        size_t first = res->n;
        int q = poll_phase(&x, cur, step);
        if (q < 0) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        int sims = 0;
        for (size_t i = first; i < res->n; i++) sims += !res->pts[i].refused;
        if (sims == 0) {
            if (step == 1) {
                step = 2;
                continue;
            }
            break;
        }
        if (eval_batch(&x, first, err, errlen) != 0) goto fail;
        size_t nb = best_of(res);
        if (nb != bi && res->pts[nb].ok && (!res->pts[bi].ok || res->pts[nb].value > res->pts[bi].value))
            step = 1;
        else if (step == 1)
            step = 2;
        else
            break;
    }
    res->best = best_of(res);
    res->evaluated = x.spent;
    res->wall_s = tdm_sim_wall() - x.w0;
    if (!res->pts[res->best].ok) {
        snprintf(err, errlen, "tune: no config could be evaluated (base: %s)", res->pts[0].err);
        goto fail;
    }
    return 0;
fail:
    tdm_sim_tune_result_free(res);
    return -1;
}
