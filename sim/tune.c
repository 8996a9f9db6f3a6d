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

/* ---- the space ----------------------------------------------------------------------- */

typedef struct keydef {
    const char *key, *tag;    /* tag: the label's prefix */
    int kind;
    double lo;
    const char *defaults;     /* the default values */
    const char *libdef;       /* the library's default, the start when the base omits it */
    int df_only;              /* 1: only means something in decode_first mode */
} keydef;

static const keydef KEYS[] = {
    {"mode", "", TDM_SIM_TUNE_MODE, 0, "vllm,decode_first,prefill_first", "vllm", 0},
    {"max_num_batched_tokens", "B", TDM_SIM_TUNE_INT, 1, "256,512,1024,2048,4096,8192", "2048", 0},
    {"tbt_target_ms", "tbt", TDM_SIM_TUNE_NUM, 0, "0,15,20,30,50,100", "0", 1},
    {"long_prefill_token_threshold", "L", TDM_SIM_TUNE_INT, 0, "0,256,512,1024,2048", "0", 0},
    {"max_num_seqs", "S", TDM_SIM_TUNE_INT, 1, "32,64,128,256,512", "128", 0},
    {"max_num_partial_prefills", "P", TDM_SIM_TUNE_INT, 0, "0,1,2,4", "0", 1},
    {"enable_chunked_prefill", "chunk=", TDM_SIM_TUNE_BOOL, 0, "true,false", "true", 0},
};
#define NKEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

static const keydef *keydef_of(const char *key)
{
    for (int i = 0; i < NKEYS; i++)
        if (!strcmp(KEYS[i].key, key)) return &KEYS[i];
    return NULL;
}

static int axis_of(const tdm_sim_tune_space *s, const char *key)
{
    for (int a = 0; a < s->n; a++)
        if (!strcmp(s->ax[a].key, key)) return a;
    return -1;
}

/* Validate and normalise one value into out. */
static int norm_value(const keydef *k, const char *v, char *out, char *err, size_t errlen)
{
    char *end;
    if (k->kind == TDM_SIM_TUNE_MODE) {
        if (strcmp(v, "vllm") && strcmp(v, "decode_first") && strcmp(v, "prefill_first")) {
            snprintf(err, errlen, "%s: bad value '%s' (vllm, decode_first or prefill_first)",
                     k->key, v);
            return -1;
        }
        snprintf(out, TDM_SIM_TUNE_VLEN, "%s", v);
    } else if (k->kind == TDM_SIM_TUNE_BOOL) {
        if (!strcmp(v, "true") || !strcmp(v, "1")) snprintf(out, TDM_SIM_TUNE_VLEN, "true");
        else if (!strcmp(v, "false") || !strcmp(v, "0")) snprintf(out, TDM_SIM_TUNE_VLEN, "false");
        else {
            snprintf(err, errlen, "%s: bad value '%s' (true or false)", k->key, v);
            return -1;
        }
    } else {
        errno = 0;
        double x = strtod(v, &end);
        int bad = end == v || *end || errno || !(x >= k->lo) || x > 2147483647.0 ||
                  (k->kind == TDM_SIM_TUNE_INT && x != floor(x)) || strlen(v) >= TDM_SIM_TUNE_VLEN;
        if (bad) {
            snprintf(err, errlen, "%s: bad value '%s' (expected %s >= %g)", k->key, v,
                     k->kind == TDM_SIM_TUNE_INT ? "an integer" : "a number", k->lo);
            return -1;
        }
        if (k->kind == TDM_SIM_TUNE_INT) snprintf(out, TDM_SIM_TUNE_VLEN, "%.0f", x);
        else snprintf(out, TDM_SIM_TUNE_VLEN, "%.10g", x);
    }
    return 0;
}

static int value_eq(const tdm_sim_tune_axis *a, const char *x, const char *y)
{
    if (a->kind == TDM_SIM_TUNE_INT || a->kind == TDM_SIM_TUNE_NUM)
        return strtod(x, NULL) == strtod(y, NULL);
    return !strcmp(x, y);
}

static int fill_axis(tdm_sim_tune_axis *a, const keydef *k, const char *list, char *err,
                     size_t errlen)
{
    char buf[512];
    if (strlen(list) >= sizeof buf) {
        snprintf(err, errlen, "%s: list too long", k->key);
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", list);
    tdm_sim_tune_axis t;
    memset(&t, 0, sizeof t);
    t.key = k->key;
    t.kind = k->kind;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char v[TDM_SIM_TUNE_VLEN];
        if (norm_value(k, tok, v, err, errlen) != 0) return -1;
        int dup = 0;
        for (int i = 0; i < t.n; i++) dup |= value_eq(&t, t.vals[i], v);
        if (dup) continue;
        if (t.n == TDM_SIM_TUNE_MAXV - 1) { /* one slot is kept for the base's value */
            snprintf(err, errlen, "%s: at most %d values", k->key, TDM_SIM_TUNE_MAXV - 1);
            return -1;
        }
        memcpy(t.vals[t.n++], v, sizeof v);
    }
    if (t.n == 0) {
        snprintf(err, errlen, "%s: no values", k->key);
        return -1;
    }
    /* numeric axes are kept sorted: a neighbour is the next value up or down */
    if (t.kind == TDM_SIM_TUNE_INT || t.kind == TDM_SIM_TUNE_NUM)
        for (int i = 1; i < t.n; i++)
            for (int j = i; j > 0 && strtod(t.vals[j], NULL) < strtod(t.vals[j - 1], NULL); j--) {
                char tmp[TDM_SIM_TUNE_VLEN];
                memcpy(tmp, t.vals[j], sizeof tmp);
                memcpy(t.vals[j], t.vals[j - 1], sizeof tmp);
                memcpy(t.vals[j - 1], tmp, sizeof tmp);
            }
    *a = t;
    return 0;
}

void tdm_sim_tune_space_default(tdm_sim_tune_space *s)
{
    char err[128];
    memset(s, 0, sizeof *s);
    for (int i = 0; i < NKEYS; i++)
        if (fill_axis(&s->ax[s->n], &KEYS[i], KEYS[i].defaults, err, sizeof err) == 0) s->n++;
}

int tdm_sim_tune_space_set(tdm_sim_tune_space *s, const char *spec, char *err, size_t errlen)
{
    const char *eq = spec ? strchr(spec, '=') : NULL;
    if (!eq || eq == spec) {
        snprintf(err, errlen, "--space: expected KEY=V1,V2,..., got '%s'", spec ? spec : "");
        return -1;
    }
    char key[64];
    size_t kl = (size_t)(eq - spec);
    if (kl >= sizeof key) kl = sizeof key - 1;
    memcpy(key, spec, kl);
    key[kl] = '\0';
    const keydef *k = keydef_of(key);
    if (!k) {
        int w = snprintf(err, errlen, "--space: unknown key '%s' (known:", key);
        for (int i = 0; i < NKEYS && w > 0 && (size_t)w < errlen; i++)
            w += snprintf(err + w, errlen - (size_t)w, " %s", KEYS[i].key);
        if (w > 0 && (size_t)w < errlen) snprintf(err + w, errlen - (size_t)w, ")");
        return -1;
    }
    char e2[256];
    int a = axis_of(s, key);
    tdm_sim_tune_axis ax;
    if (fill_axis(&ax, k, eq + 1, e2, sizeof e2) != 0) {
        snprintf(err, errlen, "--space: %s", e2);
        return -1;
    }
    if (a < 0) {
        if (s->n == TDM_SIM_TUNE_MAXAXES) {
            snprintf(err, errlen, "--space: too many keys");
            return -1;
        }
        a = s->n++;
    }
    s->ax[a] = ax;
    return 0;
}

void tdm_sim_tune_space_print(FILE *f, const tdm_sim_tune_space *s)
{
    for (int a = 0; a < s->n; a++) {
        fprintf(f, "%s%s=", a ? " " : "", s->ax[a].key);
        for (int i = 0; i < s->ax[a].n; i++) fprintf(f, "%s%s", i ? "," : "", s->ax[a].vals[i]);
    }
}

const char *tdm_sim_tune_objective_name(tdm_sim_tune_objective o)
{
    return o == TDM_SIM_TUNE_ATTAINMENT ? "attainment"
           : o == TDM_SIM_TUNE_THROUGHPUT ? "throughput" : "goodput";
}

int tdm_sim_tune_objective_parse(const char *s, tdm_sim_tune_objective *o)
{
    if (!strcmp(s, "goodput")) *o = TDM_SIM_TUNE_GOODPUT;
    else if (!strcmp(s, "attainment")) *o = TDM_SIM_TUNE_ATTAINMENT;
    else if (!strcmp(s, "throughput")) *o = TDM_SIM_TUNE_THROUGHPUT;
    else return -1;
    return 0;
}

void tdm_sim_tune_opts_init(tdm_sim_tune_opts *o)
{
    memset(o, 0, sizeof *o);
    o->objective = TDM_SIM_TUNE_GOODPUT;
    o->budget = 40;
    o->jobs = 1;
}

void tdm_sim_tune_result_free(tdm_sim_tune_result *r)
{
    if (!r) return;
    free(r->pts);
    r->pts = NULL;
    r->n = 0;
}

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
        const keydef *k = keydef_of(ax->key);
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
} ctx;

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
        double g, sc;
        int runs = 0;
        rc = tdm_sim_goodput(x->t, &cfg, &x->ro, &g, &sc, &runs, err, sizeof err);
        if (rc == 0) {
            p->value = g;
            p->scale = sc;
        }
        p->runs = runs ? runs : 1;
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
    if (p->ok)
        fprintf(x->o->progress, "tune [%zu/%d %s %.0fs] %-52s %s %.4g%s (%d runs)\n", x->res->n,
                x->o->budget, PH[p->phase], tdm_sim_wall() - x->w0, p->label,
                tdm_sim_tune_objective_name(x->o->objective), p->value, unit, p->runs);
    else
        fprintf(x->o->progress, "tune [%zu/%d %s] %-52s skipped: %s\n", x->res->n, x->o->budget,
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

/* Evaluate res->pts[first .. first + n) (res->n is first + n afterwards). */
static int eval_batch(ctx *x, size_t first, size_t n, char *err, size_t errlen)
{
    tdm_sim_tune_point *pts = x->res->pts + first;
    int jobs = x->o->jobs < 1 ? 1 : x->o->jobs;
    if ((size_t)jobs > n) jobs = (int)n;
    if (jobs <= 1) {
        for (size_t i = 0; i < n; i++) {
            eval_point(x, &pts[i]);
            x->res->n = first + i + 1;
            x->res->runs += (uint64_t)pts[i].runs;
            report(x, &pts[i]);
        }
        return 0;
    }
    int fds[64];
    pid_t pids[64];
    if (jobs > 64) jobs = 64;
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
            for (size_t i = (size_t)w; i < n; i += (size_t)jobs) {
                tdm_sim_tune_point p = pts[i];
                eval_point(x, &p);
                rec r;
                memset(&r, 0, sizeof r);
                r.i = (int)i;
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
        /* could not start every worker: the started ones are stopped and waited for */
        for (int k = 0; k < started; k++) {
            close(fds[k]);
            kill(pids[k], SIGTERM);
            waitpid(pids[k], NULL, 0);
        }
        snprintf(err, errlen, "cannot start %d worker processes: %s", jobs, strerror(errno));
        return -1;
    }
    char *done = calloc(n, 1);
    if (!done) {
        for (int k = 0; k < started; k++) {
            close(fds[k]);
            kill(pids[k], SIGTERM);
            waitpid(pids[k], NULL, 0);
        }
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    struct pollfd pf[64];
    int open_n = started;
    for (int k = 0; k < started; k++) {
        pf[k].fd = fds[k];
        pf[k].events = POLLIN;
    }
    size_t reported = 0;
    while (open_n > 0) {
        if (poll(pf, (nfds_t)started, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int k = 0; k < started; k++) {
            if (pf[k].fd < 0 || !(pf[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            rec r;
            int got = read_full(pf[k].fd, &r, sizeof r);
            if (got <= 0 || r.i < 0 || (size_t)r.i >= n || done[r.i]) {
                close(pf[k].fd);
                pf[k].fd = -1;
                open_n--;
                continue;
            }
            tdm_sim_tune_point *p = &pts[r.i];
            p->ok = r.ok;
            p->runs = r.runs;
            p->value = r.value;
            p->scale = r.scale;
            r.err[sizeof r.err - 1] = '\0';
            memcpy(p->err, r.err, sizeof p->err);
            done[r.i] = 1;
            x->res->runs += (uint64_t)r.runs;
            reported++;
            x->res->n = first + reported; /* the count in the progress line */
            report(x, p);
        }
    }
    for (int k = 0; k < started; k++) {
        if (pf[k].fd >= 0) close(pf[k].fd);
        waitpid(pids[k], NULL, 0);
    }
    for (size_t i = 0; i < n; i++)
        if (!done[i]) {
            pts[i].ok = 0;
            pts[i].value = -1;
            snprintf(pts[i].err, sizeof pts[i].err, "the worker process failed");
        }
    free(done);
    x->res->n = first + n;
    return 0;
}

/* ---- the search ------------------------------------------------------------------------ */

static int is_df(const ctx *x, const tdm_sim_tune_point *p)
{
    int m = axis_of(x->s, "mode");
    if (m < 0 || p->idx[m] < 0) return x->base_df;
    return !strcmp(x->s->ax[m].vals[p->idx[m]], "decode_first");
}

/* Parameters that do not apply are -1; those that apply and were -1 take their start. */
static void canon(const ctx *x, tdm_sim_tune_point *p)
{
    int df = is_df(x, p);
    for (int a = 0; a < x->s->n; a++) {
        const keydef *k = keydef_of(x->s->ax[a].key);
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

/* Append a candidate (canonicalised; skipped when already evaluated or queued). */
static void push(ctx *x, size_t *n, tdm_sim_tune_point p, int phase)
{
    if (*n >= (size_t)x->o->budget) return;
    canon(x, &p);
    for (size_t i = 0; i < *n; i++)
        if (same(x, &x->res->pts[i], &p)) return;
    if (x->base_equiv) { /* the base already measured this point */
        tdm_sim_tune_point st = p;
        for (int a = 0; a < x->s->n; a++) st.idx[a] = -1;
        canon(x, &st);
        if (same(x, &st, &p)) return;
    }
    p.is_base = 0;
    p.phase = phase;
    point_label(x->s, &p, p.label, sizeof p.label);
    x->res->pts[(*n)++] = p;
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
        const keydef *k = keydef_of(ax->key);
        json_t *v = base_value(doc, ax->key);
        char raw[64], val[TDM_SIM_TUNE_VLEN], e2[160];
        if (!v) snprintf(raw, sizeof raw, "%s", k->libdef);
        else if (json_is_string(v)) snprintf(raw, sizeof raw, "%s", json_string_value(v));
        else if (json_is_boolean(v)) snprintf(raw, sizeof raw, "%s", json_is_true(v) ? "true" : "false");
        else if (json_is_integer(v)) snprintf(raw, sizeof raw, "%lld", (long long)json_integer_value(v));
        else if (json_is_real(v)) snprintf(raw, sizeof raw, "%.10g", json_real_value(v));
        else raw[0] = '\0';
        if (norm_value(k, raw, val, e2, sizeof e2) != 0) {
            snprintf(err, errlen, "base config: %s", e2);
            return -1;
        }
        if (!strcmp(ax->key, "mode")) x->base_df = !strcmp(val, "decode_first");
        ax->start = -1;
        for (int i = 0; i < ax->n; i++)
            if (value_eq(ax, ax->vals[i], val)) ax->start = i;
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
        int n = ax->n < TDM_SIM_TUNE_MAXV ? ax->n : TDM_SIM_TUNE_MAXV;
        for (int i = 0; i < n && i < 3; i++) out[i] = i;
        return n < 3 ? n : 3;
    }
    for (int k = 0; k < 3; k++) out[k] = (int)((k + 0.5) * ax->n / 3.0);
    return 3;
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
    x.s = s;
    x.o = o;
    x.res = res;
    x.w0 = tdm_sim_wall();
    json_t *doc = base_doc(base_json, err, errlen);
    if (!doc) return -1;
    int rc = set_starts(&x, s, doc, err, errlen);
    json_decref(doc);
    if (rc != 0) return -1;
    res->pts = calloc((size_t)o->budget, sizeof *res->pts);
    if (!res->pts) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* 1. the base config as given */
    tdm_sim_tune_point p;
    memset(&p, 0, sizeof p);
    for (int a = 0; a < TDM_SIM_TUNE_MAXAXES; a++) p.idx[a] = -1;
    p.is_base = 1;
    snprintf(p.label, sizeof p.label, "base");
    res->pts[0] = p;
    if (eval_batch(&x, 0, 1, err, errlen) != 0) goto fail;
    /* 2. the coarse grid: mode x token budget x TBT target (decode_first), the rest at the
     * base's values; spread evenly over the grid when it is larger than 2/3 of the budget */
    int am = axis_of(s, "mode"), ab = axis_of(s, "max_num_batched_tokens"),
        at = axis_of(s, "tbt_target_ms");
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
                if (at >= 0 && k > 0 && !is_df(&x, &q)) continue; /* TBT: decode_first only */
                grid[ng++] = q;
            }
    size_t n = 1, slots = (size_t)(o->budget - 1) * 2 / 3;
    if (slots < 1) slots = 1;
    if ((size_t)ng <= slots)
        for (int g = 0; g < ng; g++) push(&x, &n, grid[g], 1);
    else
        for (size_t i = 0; i < slots; i++) push(&x, &n, grid[i * (size_t)ng / slots], 1);
    if (n > 1 && eval_batch(&x, 1, n - 1, err, errlen) != 0) goto fail;
    /* 3. refinement: poll every parameter's neighbours around the best point; move while
     * one improves; when none does, widen the step to 2 once; then stop */
    int step = 1;
    while (res->n < (size_t)o->budget) {
        size_t b = best_of(res);
        tdm_sim_tune_point cur = res->pts[b];
        if (cur.is_base || !cur.ok) {
            for (int a = 0; a < TDM_SIM_TUNE_MAXAXES; a++) cur.idx[a] = -1;
            cur.is_base = 0;
        }
        canon(&x, &cur);
        size_t n0 = res->n;
        n = n0;
        for (int a = 0; a < s->n; a++) {
            const tdm_sim_tune_axis *ax = &s->ax[a];
            if (cur.idx[a] < 0 || ax->n < 2) continue;
            int ordered = ax->kind == TDM_SIM_TUNE_INT || ax->kind == TDM_SIM_TUNE_NUM;
            for (int v = 0; v < ax->n; v++) {
                if (v == cur.idx[a]) continue;
                if (ordered && abs(v - cur.idx[a]) != step) continue;
                if (!ordered && step > 1) continue;
                tdm_sim_tune_point q = cur;
                q.idx[a] = v;
                if (a == am) /* a new mode: its own parameters from their starts */
                    for (int c = 0; c < s->n; c++) {
                        const keydef *k = keydef_of(s->ax[c].key);
                        if (k && k->df_only) q.idx[c] = -1;
                    }
                push(&x, &n, q, 2);
            }
        }
        if (n == n0) {
            if (step == 1) {
                step = 2;
                continue;
            }
            break;
        }
        if (eval_batch(&x, n0, n - n0, err, errlen) != 0) goto fail;
        size_t nb2 = best_of(res);
        if (nb2 != b && res->pts[nb2].ok && (!res->pts[b].ok || res->pts[nb2].value > res->pts[b].value))
            step = 1;
        else if (step == 1)
            step = 2;
        else
            break;
    }
    res->best = best_of(res);
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
