/*
 * test_tune_deploy.c -- `tandem tune --gpus N`, the deployment search (sim/tune_deploy.c,
 * tools/cmd_tune_deploy.c): the topologies a budget holds (an exact list for a small case;
 * for every budget up to 16 and several TP lists: within the budget, maximal, complete
 * against an independent count, TP dividing the heads); infeasible pools reported with their
 * reason and a search with nothing feasible failing with each reason; the config documents
 * (read back by the simulator's parser, the base's keys kept, one engine's file per pool);
 * known bests: a decode-heavy workload wants the decode-heavy split and a prefill-heavy one
 * the prefill-heavy split, and the search's best equals the exhaustive maximum of a small
 * space; one worker and two give the same result; through the binary, argument errors
 * (exit 2) and --out read back by `tandem sim --config --goodput` giving the goodput reported.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <jansson.h>

#include "sim.h"
#include "sim_test_util.h"
#include "tool_test_util.h"
#include "tune_deploy.h"

typedef struct env {
    tdm_sim_trace t;
    tdm_sim_model m;
    tdm_sim_hw h;
    tdm_sim_run_opts ro;
} env;

/* A fixed-length Poisson workload of n requests on model/hw. */
static void env_init(env *e, const char *model, const char *hw, uint32_t isl, uint32_t osl, size_t n)
{
    char err[TDM_SIM_ERRLEN];
    assert_int_equal(tdm_sim_model_load(model, &e->m, err, sizeof err), 0);
    assert_int_equal(tdm_sim_hw_load(hw, &e->h, err, sizeof err), 0);
    tdm_sim_trace_opts to;
    tdm_sim_trace_opts_init(&to);
    to.isl = isl;
    to.osl = osl;
    to.max_requests = n;
    to.rate = 10;
    to.max_len = e->m.max_len;
    assert_int_equal(tdm_sim_trace_load(NULL, &to, &e->t, err, sizeof err), 0);
    assert_int_equal(e->t.n, n);
    tdm_sim_run_opts_init(&e->ro);
    e->ro.slo_ttft_s = 1.0;
    e->ro.slo_tpot_s = 0.1;
}

static void space(tdm_sim_deploy_space *s, uint32_t gpus, const char *tps)
{
    char err[256];
    tdm_sim_deploy_space_default(s, gpus);
    if (tps) assert_int_equal(tdm_sim_deploy_parse_list("tp", tps, s->tp, TDM_SIM_DEPLOY_MAXTP, &s->ntp,
                                                        err, sizeof err), 0);
}

/* ---- enumeration ------------------------------------------------------------------------ */

static void enumerate__the_topologies_of_four_gpus(void **state)
{
    (void)state;
    tdm_sim_model m;
    assert_int_equal(tdm_sim_model_preset("llama-3-8b", &m), 0);
    tdm_sim_deploy_space s;
    space(&s, 4, "1,2");
    tdm_sim_deploy *v;
    size_t n;
    char err[256];
    assert_int_equal(tdm_sim_deploy_enumerate(&s, &m, 0, 0, &v, &n, err, sizeof err), 0);
    /* agg: 4x tp1, 2x tp2; disagg (p, d): (1,1) 1P3D 2P2D 3P1D, (1,2) 2P1D, (2,1) 1P2D, (2,2) 1P1D */
    static const uint32_t W[][5] = {{0, 4, 1, 0, 0}, {0, 2, 2, 0, 0}, {1, 1, 1, 3, 1}, {1, 2, 1, 2, 1},
                                    {1, 3, 1, 1, 1}, {1, 2, 1, 1, 2}, {1, 1, 2, 2, 1}, {1, 1, 2, 1, 2}};
    assert_int_equal(n, sizeof W / sizeof W[0]);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(v[i].disagg, W[i][0]);
        assert_int_equal(v[i].n[0], W[i][1]);
        assert_int_equal(v[i].tp[0], W[i][2]);
        if (v[i].disagg) {
            assert_int_equal(v[i].n[1], W[i][3]);
            assert_int_equal(v[i].tp[1], W[i][4]);
        }
        assert_true(tdm_sim_deploy_gpus(&v[i]) <= 4);
    }
    char lab[96];
    tdm_sim_deploy_label(&s, &v[2], lab, sizeof lab);
    assert_string_equal(lab, "disagg 1P tp1 B1024 + 3D tp1 S16");
    free(v);
    /* one mode only */
    s.agg = 0;
    assert_int_equal(tdm_sim_deploy_enumerate(&s, &m, 0, 0, &v, &n, err, sizeof err), 0);
    assert_int_equal(n, 6);
    free(v);
    s.agg = 1;
    s.disagg = 0;
    assert_int_equal(tdm_sim_deploy_enumerate(&s, &m, 0, 0, &v, &n, err, sizeof err), 0);
    assert_int_equal(n, 2);
    free(v);
    /* bad arguments */
    s.agg = 0;
    assert_int_equal(tdm_sim_deploy_enumerate(&s, &m, 0, 0, &v, &n, err, sizeof err), -1);
    assert_non_null(strstr(err, "serving mode"));
    s.agg = 1;
    assert_int_equal(tdm_sim_deploy_enumerate(&s, &m, 99, 0, &v, &n, err, sizeof err), -1);
}

static void enumerate__every_budget_is_respected_maximal_and_complete(void **state)
{
    (void)state;
    tdm_sim_model m;
    assert_int_equal(tdm_sim_model_preset("llama-3-8b", &m), 0); /* 32 heads, 8 KV heads */
    static const char *const LISTS[] = {"1", "2", "1,2", "1,2,4,8", "2,4", "1,3,4", "8", "4,16"};
    for (uint32_t g = 1; g <= 16; g++)
        for (size_t l = 0; l < sizeof LISTS / sizeof LISTS[0]; l++) {
            tdm_sim_deploy_space s;
            space(&s, g, LISTS[l]);
            tdm_sim_deploy *v = NULL;
            size_t n = 0;
            char err[256];
            assert_int_equal(tdm_sim_deploy_enumerate(&s, &m, 1, 2, &v, &n, err, sizeof err), 0);
            /* an independent count: colocated, one per usable TP; disaggregated, every (p, x, d,
             * y) with y >= 1 that no further instance of either pool fits */
            size_t want = 0;
            for (int a = 0; a < s.ntp; a++) {
                uint32_t p = s.tp[a];
                if (p > g || 32 % p) continue; /* tp 3 does not divide 32 heads */
                want++;
                for (int b = 0; b < s.ntp; b++) {
                    uint32_t d = s.tp[b];
                    if (d > g || 32 % d) continue;
                    for (uint32_t x = 1; x * p <= g; x++)
                        for (uint32_t y = 1; x * p + y * d <= g; y++) {
                            uint32_t left = g - x * p - y * d;
                            want += left < p && left < d;
                        }
                }
            }
            if (n != want) fail_msg("budget %u, tp %s: %zu topologies, expected %zu", g, LISTS[l], n, want);
            for (size_t i = 0; i < n; i++) {
                const tdm_sim_deploy *d = &v[i];
                uint32_t used = tdm_sim_deploy_gpus(d);
                assert_true(used >= 1 && used <= g);
                assert_int_equal(d->is, 1);
                assert_int_equal(d->it, 2);
                assert_true(d->n[0] >= 1 && d->tp[0] >= 1 && 32 % d->tp[0] == 0);
                if (!d->disagg) {
                    assert_int_equal(d->n[0], g / d->tp[0]);
                } else {
                    assert_true(d->n[1] >= 1 && 32 % d->tp[1] == 0);
                    uint32_t left = g - used;
                    assert_true(left < d->tp[0] && left < d->tp[1]);
                }
                for (size_t j = 0; j < i; j++)
                    assert_false(memcmp(&v[j], d, sizeof *d) == 0);
            }
            free(v);
        }
}

static void enumerate__tp_must_divide_the_heads(void **state)
{
    (void)state;
    tdm_sim_model m;
    assert_int_equal(tdm_sim_model_preset("llama-3-8b", &m), 0);
    m.heads = 12;
    m.kv_heads = 4;
    tdm_sim_deploy_space s;
    space(&s, 8, "1,2,4,8");
    tdm_sim_deploy *v;
    size_t n;
    char err[256];
    assert_int_equal(tdm_sim_deploy_enumerate(&s, &m, 0, 0, &v, &n, err, sizeof err), 0);
    for (size_t i = 0; i < n; i++) {
        assert_true(v[i].tp[0] != 8);
        assert_true(!v[i].disagg || v[i].tp[1] != 8);
    }
    free(v);
}

static void lists__parse_and_refuse(void **state)
{
    (void)state;
    uint32_t v[8];
    int n = 0;
    char err[256];
    assert_int_equal(tdm_sim_deploy_parse_list("tp", "8,2,2,4", v, 8, &n, err, sizeof err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(v[0], 2);
    assert_int_equal(v[2], 8);
    assert_int_equal(tdm_sim_deploy_parse_list("tp", "2,x", v, 8, &n, err, sizeof err), -1);
    assert_non_null(strstr(err, "bad value in '2,x'"));
    assert_int_equal(tdm_sim_deploy_parse_list("tp", "0", v, 8, &n, err, sizeof err), -1);
    assert_int_equal(tdm_sim_deploy_parse_list("tp", "1,", v, 8, &n, err, sizeof err), -1);
    assert_int_equal(tdm_sim_deploy_parse_list("tp", "", v, 8, &n, err, sizeof err), -1);
    assert_int_equal(tdm_sim_deploy_parse_list("tp", "1,2,3", v, 2, &n, err, sizeof err), -1);
    assert_non_null(strstr(err, "at most 2"));
    tdm_sim_deploy_space s;
    tdm_sim_deploy_space_default(&s, 4);
    assert_int_equal(s.ntp, 3); /* 1, 2, 4: 8 is above the budget */
    assert_int_equal(tdm_sim_deploy_parse_modes("disagg", &s, err, sizeof err), 0);
    assert_true(!s.agg && s.disagg);
    assert_int_equal(tdm_sim_deploy_parse_modes("both", &s, err, sizeof err), 0);
    assert_true(s.agg && s.disagg);
    assert_int_equal(tdm_sim_deploy_parse_modes("mixed", &s, err, sizeof err), -1);
    assert_non_null(strstr(err, "agg, disagg or both"));
}

/* ---- feasibility and documents ---------------------------------------------------------- */

static void check__infeasible_pools_say_why(void **state)
{
    (void)state;
    tdm_sim_model m;
    tdm_sim_hw h;
    assert_int_equal(tdm_sim_model_preset("llama-3.1-70b", &m), 0);
    assert_int_equal(tdm_sim_hw_preset("h100-sxm", &h), 0); /* 80 GiB */
    tdm_sim_deploy_space s;
    space(&s, 8, NULL);
    int is, it;
    char err[256], why[200];
    assert_int_equal(tdm_sim_deploy_base_limits(NULL, &s, &is, &it, err, sizeof err), 0);
    tdm_sim_deploy d = {.disagg = 0, .n = {8, 0}, .tp = {1, 0}, .is = is, .it = it};
    /* 70B in bf16 on one 80 GiB GPU: the weights alone do not fit */
    assert_int_equal(tdm_sim_deploy_check(NULL, &s, &d, &m, &h, 0.9, 4500, 4001, why, sizeof why), -1);
    assert_non_null(strstr(why, "weights 131.4 GiB per GPU leave no KV cache"));
    /* at tp 4 it fits, but not a request longer than its KV cache */
    d.n[0] = 2;
    d.tp[0] = 4;
    assert_int_equal(tdm_sim_deploy_check(NULL, &s, &d, &m, &h, 0.9, 4500, 4001, why, sizeof why), 0);
    assert_int_equal(tdm_sim_deploy_check(NULL, &s, &d, &m, &h, 0.9, 1000000, 4001, why, sizeof why), -1);
    assert_non_null(strstr(why, "less than the longest request (1000000)"));
    /* disaggregated: the pool that does not fit is named */
    tdm_sim_deploy dd = {.disagg = 1, .n = {1, 4}, .tp = {4, 1}, .is = is, .it = it};
    assert_int_equal(tdm_sim_deploy_check(NULL, &s, &dd, &m, &h, 0.9, 4500, 4001, why, sizeof why), -1);
    assert_non_null(strstr(why, "decode pool: tp 1"));
    /* the library's config validation: a budget below the sequence cap */
    assert_int_equal(tdm_sim_deploy_check("{\"max_num_seqs\": 1024, \"max_num_batched_tokens\": 512}",
                                          &s, &d, &m, &h, 0.9, 4500, 4001, why, sizeof why), 0);
    tdm_sim_deploy_space s2;
    space(&s2, 8, "4");
    s2.seqs[0] = 1024;
    s2.nseqs = 1;
    s2.tokens[0] = 512;
    s2.ntokens = 1;
    tdm_sim_deploy d2 = {.disagg = 0, .n = {2, 0}, .tp = {4, 0}, .is = 0, .it = 0};
    assert_int_equal(tdm_sim_deploy_check(NULL, &s2, &d2, &m, &h, 0.9, 4500, 4001, why, sizeof why), -1);
    assert_non_null(strstr(why, "scheduler config refused"));
}

static void search__nothing_feasible_fails_with_every_reason(void **state)
{
    (void)state;
    env e;
    env_init(&e, "llama-3.1-70b", "h100-sxm", 512, 16, 20);
    tdm_sim_deploy_space s;
    space(&s, 2, "1"); /* 70B does not fit one 80 GiB GPU */
    tdm_sim_deploy_opts o;
    tdm_sim_deploy_opts_init(&o);
    tdm_sim_deploy_result r;
    char err[TDM_SIM_ERRLEN];
    assert_int_equal(tdm_sim_deploy_search(&e.t, NULL, &e.m, &e.h, &e.ro, &s, &o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "no deployment fits 2 GPUs"));
    assert_non_null(strstr(err, "agg 2x tp1"));
    assert_non_null(strstr(err, "disagg 1P tp1"));
    assert_non_null(strstr(err, "leave no KV cache"));
    assert_null(r.pts);
    /* closed loop is refused */
    e.ro.concurrency = 4;
    assert_int_equal(tdm_sim_deploy_search(&e.t, NULL, &e.m, &e.h, &e.ro, &s, &o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "closed loop"));
    tdm_sim_trace_free(&e.t);
}

static void json__documents_read_back(void **state)
{
    (void)state;
    tdm_sim_model m;
    tdm_sim_hw h;
    assert_int_equal(tdm_sim_model_preset("llama-3-8b", &m), 0);
    assert_int_equal(tdm_sim_hw_preset("h100-sxm", &h), 0);
    tdm_sim_deploy_space s;
    space(&s, 8, NULL);
    const char *base = "{\"name\": \"b\", \"scheduler\": {\"policy\": \"priority\", \"max_num_seqs\": 100},"
                       " \"deployment\": {\"router\": \"round_robin\", \"kv_gbps\": 25, \"hw\": \"h200\","
                       " \"instances\": 3}}";
    int is, it;
    char err[TDM_SIM_ERRLEN];
    assert_int_equal(tdm_sim_deploy_base_limits(base, &s, &is, &it, err, sizeof err), 0);
    assert_int_equal(s.seqs[is], 100); /* the base's value joined the list */
    assert_int_equal(s.tokens[it], 2048); /* the library's default */
    tdm_sim_deploy d = {.disagg = 1, .n = {2, 3}, .tp = {1, 2}, .is = is, .it = it + 1};
    char *txt = tdm_sim_deploy_json(base, &s, &d, "cand", "desc");
    assert_non_null(txt);
    tdm_sim_config c;
    assert_int_equal(tdm_sim_config_parse(txt, NULL, &m, &h, &c, err, sizeof err), 0);
    assert_int_equal(c.disagg, 1);
    assert_int_equal(c.pools[0].instances, 2);
    assert_int_equal(c.pools[0].model.tp, 1);
    assert_int_equal(c.pools[1].instances, 3);
    assert_int_equal(c.pools[1].model.tp, 2);
    assert_string_equal(c.pools[0].hw.name, "h200"); /* the base's hardware, every pool */
    assert_string_equal(c.pools[1].hw.name, "h200");
    assert_int_equal(c.router, TDM_SIM_ROUTER_ROUND_ROBIN);
    assert_true(c.kv_gbps == 25);
    assert_non_null(strstr(c.pools[0].sched_json, "\"max_num_batched_tokens\":4096"));
    assert_non_null(strstr(c.pools[0].sched_json, "\"policy\":\"priority\""));
    assert_non_null(strstr(c.pools[1].sched_json, "\"max_num_seqs\":100"));
    assert_non_null(strstr(c.pools[1].sched_json, "\"policy\":\"priority\""));
    assert_string_equal(c.name, "cand");
    tdm_sim_config_free(&c);
    free(txt);
    /* each engine's file: one colocated instance, its pool's merged keys */
    txt = tdm_sim_deploy_engine_json(base, &s, &d, 1, "desc");
    assert_non_null(txt);
    assert_int_equal(tdm_sim_config_parse(txt, NULL, &m, &h, &c, err, sizeof err), 0);
    assert_int_equal(c.disagg, 0);
    assert_int_equal(c.pools[0].instances, 1);
    assert_int_equal(c.pools[0].model.tp, 2);
    assert_non_null(strstr(c.pools[0].sched_json, "\"max_num_seqs\":100"));
    tdm_sim_config_free(&c);
    free(txt);
    assert_null(tdm_sim_deploy_engine_json(base, &s, &d, 2, NULL));
    /* colocated: the top-level scheduler gets the limits */
    tdm_sim_deploy a = {.disagg = 0, .n = {4, 0}, .tp = {2, 0}, .is = 0, .it = 0};
    txt = tdm_sim_deploy_json(base, &s, &a, NULL, NULL);
    assert_int_equal(tdm_sim_config_parse(txt, NULL, &m, &h, &c, err, sizeof err), 0);
    assert_int_equal(c.disagg, 0);
    assert_int_equal(c.pools[0].instances, 4);
    assert_int_equal(c.pools[0].model.tp, 2);
    assert_non_null(strstr(c.pools[0].sched_json, "\"max_num_seqs\":16"));
    assert_non_null(strstr(c.pools[0].sched_json, "\"max_num_batched_tokens\":1024"));
    assert_int_equal(tdm_sim_config_gpus(&c), 8);
    tdm_sim_config_free(&c);
    free(txt);
    assert_null(tdm_sim_deploy_json("[1]", &s, &a, NULL, NULL));
}

/* ---- the search ------------------------------------------------------------------------- */

/* The best disaggregated split of 4 one-GPU instances for a workload. */
static void best_split(uint32_t isl, uint32_t osl, uint32_t *x, uint32_t *y)
{
    env e;
    env_init(&e, "llama-3-8b", "h100-sxm", isl, osl, 400);
    e.ro.slo_tpot_s = 0.02;
    tdm_sim_deploy_space s;
    space(&s, 4, "1");
    s.agg = 0;
    tdm_sim_deploy_opts o;
    tdm_sim_deploy_opts_init(&o);
    o.refine = 0;
    tdm_sim_deploy_result r;
    char err[TDM_SIM_ERRLEN];
    /* 32 sequences per instance: a burst of the whole trace does not fit the decode pool */
    if (tdm_sim_deploy_search(&e.t, "{\"max_num_seqs\": 32}", &e.m, &e.h, &e.ro, &s, &o, &r, err,
                              sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(r.n, 3); /* 1P3D, 2P2D, 3P1D */
    assert_true(r.have_best);
    for (size_t i = 0; i < r.n; i++) {
        assert_true(r.pts[i].ok);
        assert_true(r.pts[i].per_gpu <= r.pts[r.best].per_gpu);
        assert_true(r.pts[i].scale < 1024); /* a rate the SLOs bound, not the search's ceiling */
        printf("  isl %u osl %u: %s %.3f req/s/GPU\n", isl, osl, r.pts[i].label, r.pts[i].per_gpu);
    }
    *x = r.pts[r.best].d.n[0];
    *y = r.pts[r.best].d.n[1];
    tdm_sim_deploy_result_free(&r);
    tdm_sim_trace_free(&e.t);
}

static void search__known_best_splits(void **state)
{
    (void)state;
    uint32_t x, y;
    /* long outputs of short prompts: the decode pool is the bottleneck */
    best_split(64, 512, &x, &y);
    assert_int_equal(x, 1);
    assert_int_equal(y, 3);
    /* long prompts, one or two tokens out: the prefill pool is */
    best_split(8000, 2, &x, &y);
    assert_int_equal(x, 3);
    assert_int_equal(y, 1);
}

/* Best goodput per GPU over every topology with both limits pinned to (seqs, tokens). */
static double pinned_best(env *e, uint32_t seqs, uint32_t tokens)
{
    char base[128], err[TDM_SIM_ERRLEN];
    snprintf(base, sizeof base, "{\"max_num_seqs\": %u, \"max_num_batched_tokens\": %u}", seqs, tokens);
    tdm_sim_deploy_space s;
    space(&s, 2, "1");
    s.seqs[0] = seqs;
    s.nseqs = 1;
    s.tokens[0] = tokens;
    s.ntokens = 1;
    tdm_sim_deploy_opts o;
    tdm_sim_deploy_opts_init(&o);
    tdm_sim_deploy_result r;
    if (tdm_sim_deploy_search(&e->t, base, &e->m, &e->h, &e->ro, &s, &o, &r, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(r.n, 2); /* 2x tp1, 1P1D */
    double v = r.pts[r.best].per_gpu;
    tdm_sim_deploy_result_free(&r);
    return v;
}

static void search__best_is_the_exhaustive_maximum(void **state)
{
    (void)state;
    env e;
    env_init(&e, "llama-3-8b", "h100-sxm", 1024, 128, 150);
    e.ro.slo_ttft_s = 0.3;
    e.ro.slo_tpot_s = 0.025;
    static const uint32_t SEQS[] = {8, 32, 256};
    double ex = 0;
    for (size_t i = 0; i < 3; i++) {
        double v = pinned_best(&e, SEQS[i], 2048);
        if (v > ex) ex = v;
    }
    assert_true(ex > 0);
    /* the search from the middle value: every topology refined, so every point is visited */
    tdm_sim_deploy_space s;
    space(&s, 2, "1");
    s.nseqs = 3;
    memcpy(s.seqs, SEQS, sizeof SEQS);
    s.tokens[0] = 2048;
    s.ntokens = 1;
    tdm_sim_deploy_opts o;
    tdm_sim_deploy_opts_init(&o);
    o.refine = 10;
    o.budget = 100;
    tdm_sim_deploy_result r;
    char err[TDM_SIM_ERRLEN];
    assert_int_equal(tdm_sim_deploy_search(&e.t, "{\"max_num_seqs\": 32, \"max_num_batched_tokens\": 2048}",
                                           &e.m, &e.h, &e.ro, &s, &o, &r, err, sizeof err), 0);
    assert_int_equal(r.evaluated, 6);
    assert_true(fabs(r.pts[r.best].per_gpu - ex) <= 1e-9 * ex);
    assert_true(r.pts[r.best].gpus <= 2);
    /* its figures come from a run at the goodput rate */
    const tdm_sim_deploy_point *b = &r.pts[r.best];
    assert_true(b->ttft_p50 > 0 && b->ttft_p90 >= b->ttft_p50 && b->tpot_p90 >= b->tpot_p50);
    assert_true(b->attainment >= 0.9);
    assert_true(b->out_tok_s_per_gpu > 0);
    assert_true(fabs(b->goodput_tok_s_per_gpu - b->per_gpu * 128) <= 1e-9 * b->goodput_tok_s_per_gpu);
    tdm_sim_deploy_result_free(&r);
    /* a budget of 3 stops there */
    o.budget = 3;
    assert_int_equal(tdm_sim_deploy_search(&e.t, "{\"max_num_seqs\": 32, \"max_num_batched_tokens\": 2048}",
                                           &e.m, &e.h, &e.ro, &s, &o, &r, err, sizeof err), 0);
    assert_int_equal(r.evaluated, 3);
    tdm_sim_deploy_result_free(&r);
    tdm_sim_trace_free(&e.t);
}

static void search__same_result_with_one_or_two_workers(void **state)
{
    (void)state;
    env e;
    env_init(&e, "llama-3-8b", "h100-sxm", 1024, 64, 100);
    tdm_sim_deploy_result r[2];
    for (int j = 0; j < 2; j++) {
        tdm_sim_deploy_space s;
        space(&s, 3, "1,2");
        tdm_sim_deploy_opts o;
        tdm_sim_deploy_opts_init(&o);
        o.jobs = j + 1;
        o.budget = 12;
        o.refine = 1;
        char err[TDM_SIM_ERRLEN];
        assert_int_equal(tdm_sim_deploy_search(&e.t, NULL, &e.m, &e.h, &e.ro, &s, &o, &r[j], err, sizeof err), 0);
    }
    assert_int_equal(r[0].n, r[1].n);
    assert_int_equal(r[0].best, r[1].best);
    for (size_t i = 0; i < r[0].n; i++) {
        assert_string_equal(r[0].pts[i].label, r[1].pts[i].label);
        assert_true(r[0].pts[i].per_gpu == r[1].pts[i].per_gpu);
        assert_true(r[0].pts[i].ttft_p90 == r[1].pts[i].ttft_p90);
    }
    for (int j = 0; j < 2; j++) tdm_sim_deploy_result_free(&r[j]);
    tdm_sim_trace_free(&e.t);
}

/* ---- the command ------------------------------------------------------------------------ */

static int file_has(const char *path, const char *needle)
{
    size_t n;
    char *b = tdm_sim__slurp(path, &n);
    int r = b && strstr(b, needle) != NULL;
    free(b);
    return r;
}

static void command__argument_errors_exit_2_with_a_message(void **state)
{
    (void)state;
    NEED_TOOL();
    char e[256];
    write_tmp(e, sizeof e, "tuned-err.txt", "");
    static const struct {
        const char *args, *msg;
    } C[] = {
        {"--gpus 0", "--gpus: bad value '0'"},
        {"--gpus", "--gpus needs a value"},
        {"--gpus 4 --tp-list 0", "--tp-list: bad value"},
        {"--gpus 2 --tp-list 4", "no TP degree fits 2 GPUs"},
        {"--gpus 4 --serving-mode mixed", "agg, disagg or both"},
        {"--gpus 4 --space mode=vllm", "max_num_seqs and max_num_batched_tokens only"},
        {"--gpus 4 --space max_num_seqs=a", "max_num_seqs: bad value"},
        {"--gpus 4 --objective throughput", "goodput per GPU"},
        {"--gpus 4 --concurrency 4", "closed loop"},
        {"--gpus 4 --tp 2", "--tp-list"},
        {"--gpus 4 --refine -1", "--refine: bad value"},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        assert_int_equal(SH("%s tune --max-requests 10 %s >/dev/null 2>%s", g_tool, C[i].args, e), 2);
        if (!file_has(e, C[i].msg)) fail_msg("tune %s: no '%s' in the message", C[i].args, C[i].msg);
    }
    /* nothing feasible: exit 1 with the reasons */
    assert_int_equal(SH("%s tune --gpus 1 --model llama-3.1-70b --max-requests 10 --quiet >/dev/null 2>%s",
                        g_tool, e), 1);
    assert_true(file_has(e, "tandem tune: no deployment fits 1 GPU: agg 1x tp1"));
    assert_true(file_has(e, "leave no KV cache"));
    unlink(e);
}

static void command__out_reads_back_with_the_goodput_reported(void **state)
{
    (void)state;
    NEED_TOOL();
    char out[256], eng[256], js[256], log[256], sim[256];
    write_tmp(out, sizeof out, "tuned-best.json", "");
    snprintf(eng, sizeof eng, "/tmp/tandem-simtest-%d-tuned-best.engine.json", (int)getpid());
    write_tmp(js, sizeof js, "tuned-points.json", "");
    write_tmp(log, sizeof log, "tuned-log.txt", "");
    write_tmp(sim, sizeof sim, "tuned-sim.json", "");
    const char *w = "--isl 1024 --osl 64 --max-requests 120 --slo-ttft-ms 300 --slo-tpot-ms 25";
    assert_int_equal(SH("%s tune --gpus 2 %s --serving-mode agg --space max_num_seqs=64,128 "
                        "--space max_num_batched_tokens=1024,2048 --budget 6 --jobs 2 --quiet --out %s "
                        "--json %s > %s", g_tool, w, out, js, log), 0);
    assert_true(file_has(log, "tune best="));
    assert_true(file_has(log, "ranked by goodput per GPU"));
    assert_true(file_has(log, "--tensor-parallel-size"));
    json_t *p = load_json(js);
    size_t best = (size_t)json_integer_value(json_object_get(p, "best"));
    json_t *pts = json_object_get(p, "points");
    assert_int_equal(json_array_size(pts) >= 2, 1);
    json_t *bp = json_array_get(pts, best);
    double g = json_number_value(json_object_get(bp, "goodput_req_s"));
    double pg = json_number_value(json_object_get(bp, "goodput_req_s_per_gpu"));
    assert_true(g > 0);
    for (size_t i = 0; i < json_array_size(pts); i++)
        assert_true(json_number_value(json_object_get(json_array_get(pts, i), "goodput_req_s_per_gpu")) <= pg);
    json_decref(p);
    /* the deployment tune wrote, run by tandem sim: the same goodput */
    assert_int_equal(SH("%s sim --config %s %s --goodput --quiet --json %s >/dev/null", g_tool, out, w, sim), 0);
    json_t *s = load_json(sim);
    assert_true(fabs(json_number_value(json_object_get(s, "goodput_req_s")) - g) <= 1e-6 * g);
    json_decref(s);
    /* the engine's file: one colocated instance */
    json_t *ej = load_json(eng);
    json_t *dep = json_object_get(ej, "deployment");
    assert_int_equal(json_integer_value(json_object_get(dep, "instances")), 1);
    assert_string_equal(json_string_value(json_object_get(dep, "mode")), "colocated");
    assert_non_null(json_object_get(json_object_get(ej, "scheduler"), "max_num_seqs"));
    json_decref(ej);
    assert_int_equal(SH("%s sim --config %s %s --quiet >/dev/null", g_tool, eng, w), 0);
    unlink(out);
    unlink(eng);
    unlink(js);
    unlink(log);
    unlink(sim);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(enumerate__the_topologies_of_four_gpus),
        cmocka_unit_test(enumerate__every_budget_is_respected_maximal_and_complete),
        cmocka_unit_test(enumerate__tp_must_divide_the_heads),
        cmocka_unit_test(lists__parse_and_refuse),
        cmocka_unit_test(check__infeasible_pools_say_why),
        cmocka_unit_test(search__nothing_feasible_fails_with_every_reason),
        cmocka_unit_test(json__documents_read_back),
        cmocka_unit_test(search__known_best_splits),
        cmocka_unit_test(search__best_is_the_exhaustive_maximum),
        cmocka_unit_test(search__same_result_with_one_or_two_workers),
        cmocka_unit_test(command__argument_errors_exit_2_with_a_message),
        cmocka_unit_test(command__out_reads_back_with_the_goodput_reported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
