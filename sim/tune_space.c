/*
 * tune_space.c -- the parameter space of `tandem tune` (tune.h): the keys it knows with
 * their kinds, bounds, default values and library defaults; "key=v1,v2" overrides
 * (validated, normalised, numeric axes sorted); the objectives' names; options and results.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tune.h"

/* ---- the space ----------------------------------------------------------------------- */

static const tdm_sim__tune_keydef KEYS[] = {
    {"mode", "", TDM_SIM_TUNE_MODE, 0, "vllm,decode_first,prefill_first", "vllm", 0},
    {"max_num_batched_tokens", "B", TDM_SIM_TUNE_INT, 1, "256,512,1024,2048,4096,8192", "2048", 0},
    {"tbt_target_ms", "tbt", TDM_SIM_TUNE_NUM, 0, "0,15,20,30,50,100", "0", 1},
    {"long_prefill_token_threshold", "L", TDM_SIM_TUNE_INT, 0, "0,256,512,1024,2048", "0", 0},
    {"max_num_seqs", "S", TDM_SIM_TUNE_INT, 1, "32,64,128,256,512", "128", 0},
    {"max_num_partial_prefills", "P", TDM_SIM_TUNE_INT, 0, "0,1,2,4", "0", 1},
    {"enable_chunked_prefill", "chunk=", TDM_SIM_TUNE_BOOL, 0, "true,false", "true", 0},
};
#define NKEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

const tdm_sim__tune_keydef *tdm_sim__tune_key(const char *key)
{
    for (int i = 0; i < NKEYS; i++)
        if (!strcmp(KEYS[i].key, key)) return &KEYS[i];
    return NULL;
}

int tdm_sim__tune_axis_of(const tdm_sim_tune_space *s, const char *key)
{
    for (int a = 0; a < s->n; a++)
        if (!strcmp(s->ax[a].key, key)) return a;
    return -1;
}

/* Validate and normalise one value into out. */
int tdm_sim__tune_norm(const tdm_sim__tune_keydef *k, const char *v, char *out, char *err, size_t errlen)
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

int tdm_sim__tune_value_eq(const tdm_sim_tune_axis *a, const char *x, const char *y)
{
    if (a->kind == TDM_SIM_TUNE_INT || a->kind == TDM_SIM_TUNE_NUM)
        return strtod(x, NULL) == strtod(y, NULL);
    return !strcmp(x, y);
}

static int fill_axis(tdm_sim_tune_axis *a, const tdm_sim__tune_keydef *k, const char *list, char *err,
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
        char v[TDM_SIM_TUNE_VLEN] = {0}; /* whole buffer copied: no stray bytes after the NUL */
        if (tdm_sim__tune_norm(k, tok, v, err, errlen) != 0) return -1;
        int dup = 0;
        for (int i = 0; i < t.n; i++) dup |= tdm_sim__tune_value_eq(&t, t.vals[i], v);
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
    const tdm_sim__tune_keydef *k = tdm_sim__tune_key(key);
    if (!k) {
        int w = snprintf(err, errlen, "--space: unknown key '%s' (known:", key);
        for (int i = 0; i < NKEYS && w > 0 && (size_t)w < errlen; i++)
            w += snprintf(err + w, errlen - (size_t)w, " %s", KEYS[i].key);
        if (w > 0 && (size_t)w < errlen) snprintf(err + w, errlen - (size_t)w, ")");
        return -1;
    }
    char e2[256];
    int a = tdm_sim__tune_axis_of(s, key);
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

