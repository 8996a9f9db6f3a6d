/*
 * sched_driver.c -- the scenario driver of the scheduler tests (see sched_driver.h): a
 * configured scheduler, generated prompts, a batch checker that every step goes through,
 * fake sampled tokens for tdm_sched_update, and the end-of-scenario cleanliness check.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_driver.h"

/* The latest host time the driver passed to a scheduler since the last tsd_new: tsd_run
 * continues from it, so that the clock never goes backwards within a scenario. */
static double g_last_now;

static void saw_now(double t)
{
    if (t > g_last_now) g_last_now = t;
}

#define TSD_MAX_LIVE 16
static tdm_sched *g_live[TSD_MAX_LIVE];

static void track(tdm_sched *s)
{
    for (int i = 0; i < TSD_MAX_LIVE; i++)
        if (!g_live[i]) {
            g_live[i] = s;
            return;
        }
}

static void untrack(tdm_sched *s)
{
    for (int i = 0; i < TSD_MAX_LIVE; i++)
        if (g_live[i] == s) g_live[i] = NULL;
}

void tsd_free(tdm_sched *s)
{
    untrack(s);
    tdm_sched_destroy(s);
}

int tsd_teardown(void **state)
{
    (void)state;
    for (int i = 0; i < TSD_MAX_LIVE; i++)
        if (g_live[i]) {
            tdm_sched_destroy(g_live[i]);
            g_live[i] = NULL;
        }
    return 0;
}

tdm_sched *tsd_new(const char *json)
{
    tdm_sched *s = NULL;
    int rc = tdm_sched_create(&s);
    assert_int_equal(rc, TDM_OK);
    assert_non_null(s);
    track(s);
    g_last_now = 0.0; /* a new scenario, a new clock */
    if (json) {
        rc = tdm_sched_configure(s, json);
        if (rc != TDM_OK) fail_msg("configure(%s) -> %d: %s", json, rc, tdm_sched_errmsg(s));
    }
    return s;
}

tdm_sched *tsd_newp(const int64_t *kv)
{
    tdm_sched *s = tsd_new(NULL);
    for (; kv && kv[0] != 0; kv += 2) {
        int rc = tdm_sched_set_param(s, (tdm_sched_param)kv[0], kv[1]);
        if (rc != TDM_OK) fail_msg("set_param(%lld, %lld) -> %d: %s", (long long)kv[0],
                                   (long long)kv[1], rc, tdm_sched_errmsg(s));
    }
    return s;
}

void tsd_check(const tdm_sched *s)
{
    char msg[512];
    msg[0] = '\0';
    int rc = tdm__sched_check(s, msg, sizeof(msg));
    if (rc != TDM_OK) fail_msg("tdm__sched_check -> %d: %s", rc, msg);
}

void tsd_stats(const tdm_sched *s, tdm_sched_stats *st)
{
    memset(st, 0, sizeof(*st));
    assert_int_equal(tdm_sched_stats_init(st), TDM_OK);
    assert_int_equal(tdm_sched_get_stats(s, st), TDM_OK);
}

uint32_t tsd_unfinished(const tdm_sched *s)
{
    uint32_t n = 12345;
    assert_int_equal(tdm_sched_num_unfinished(s, &n), TDM_OK);
    return n;
}

void tsd_assert_clean(const tdm_sched *s)
{
    tdm_sched_stats st;
    tsd_check(s);
    tsd_stats(s, &st);
    assert_int_equal(tsd_unfinished(s), 0);
    assert_int_equal(st.num_running, 0);
    assert_int_equal(st.num_waiting, 0);
    assert_int_equal(st.num_waiting_remote_kv, 0);
    assert_int_equal(st.num_held, 0);
    if (st.num_free_blocks != st.num_total_blocks)
        fail_msg("not clean: %u of %u blocks free", st.num_free_blocks, st.num_total_blocks);
    assert_int_equal(tdm__sched_blocks_in_use(s), 0);
}

void tsd_done(tdm_sched *s)
{
    tsd_assert_clean(s);
    tsd_free(s);
}

void tsd_prompt(uint64_t id, uint32_t n, tdm_token *out)
{
    for (uint32_t i = 0; i < n; i++)
        out[i] = (tdm_token)(1000 + (id * 7919u + (uint64_t)i * 31u) % 1000003u);
}

int tsd_desc(tdm_request_desc *d, uint64_t id, const tdm_token *prompt, uint32_t n, uint32_t max_tokens)
{
    int rc = tdm_request_desc_init(d);
    d->id = id;
    d->prompt = prompt;
    d->num_prompt_tokens = n;
    d->max_tokens = max_tokens;
    return rc;
}

int tsd_add_desc(tdm_sched *s, tdm_request_desc *d)
{
    return tdm_sched_add(s, d);
}

void tsd_req_init(tsd_req *r, uint64_t id, uint32_t n, uint32_t max_tokens)
{
    assert_true(n <= TSD_REQ_MAX_PROMPT);
    tsd_prompt(id, n, r->prompt);
    assert_int_equal(tsd_desc(&r->d, id, r->prompt, n, max_tokens), TDM_OK);
}

int tsd_add_tokens(tdm_sched *s, uint64_t id, const tdm_token *prompt, uint32_t n,
                   uint32_t max_tokens)
{
    tdm_request_desc d;
    assert_int_equal(tsd_desc(&d, id, prompt, n, max_tokens), TDM_OK);
    d.arrival_time = (double)id * 1e-3;
    return tdm_sched_add(s, &d);
}

int tsd_add(tdm_sched *s, uint64_t id, uint32_t num_prompt, uint32_t max_tokens)
{
    tdm_token *p = malloc((num_prompt ? num_prompt : 1) * sizeof(*p));
    assert_non_null(p);
    tsd_prompt(id, num_prompt, p);
    int rc = tsd_add_tokens(s, id, p, num_prompt, max_tokens);
    free(p);
    return rc;
}

static int64_t param(const tdm_sched *s, tdm_sched_param k)
{
    int64_t v = -1;
    assert_int_equal(tdm_sched_get_param(s, k, &v), TDM_OK);
    return v;
}

void tsd_limits_get(const tdm_sched *s, tsd_limits *l)
{
    l->budget = param(s, TDM_SCHED_MAX_NUM_BATCHED_TOKENS);
    l->max_seqs = param(s, TDM_SCHED_MAX_NUM_SEQS);
    l->block_size = param(s, TDM_SCHED_BLOCK_SIZE);
    l->num_blocks = param(s, TDM_SCHED_NUM_BLOCKS);
    l->max_model_len = param(s, TDM_SCHED_MAX_MODEL_LEN);
    l->lookahead = param(s, TDM_SCHED_NUM_LOOKAHEAD_TOKENS);
}

int tsd_find(const tdm_batch *b, uint64_t id)
{
    for (uint32_t i = 0; i < b->num_reqs; i++)
        if (b->req_ids[i] == id) return (int)i;
    return -1;
}

int tsd_find_id(const uint64_t *ids, uint32_t n, uint64_t id)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] == id) return (int)i;
    return -1;
}

void tsd_info(const tdm_sched *s, uint64_t id, tdm_request_info *i)
{
    memset(i, 0, sizeof(*i));
    assert_int_equal(tdm_request_info_init(i), TDM_OK);
    int rc = tdm_sched_request_info(s, id, i);
    if (rc != TDM_OK) fail_msg("request_info(%llu) -> %d: %s", (unsigned long long)id, rc,
                               tdm_sched_errmsg(s));
}

uint32_t tsd_state(const tdm_sched *s, uint64_t id)
{
    tdm_request_info i;
    tsd_info(s, id, &i);
    return i.state;
}

void tsd_step(tdm_sched *s, double now, tdm_batch *b)
{
    tsd_limits l;
    tsd_limits_get(s, &l);
    memset(b, 0, sizeof(*b));
    assert_int_equal(tdm_batch_init(b), TDM_OK);
    saw_now(now);
    int rc = tdm_sched_step(s, now, b);
    if (rc != TDM_OK) fail_msg("step -> %d: %s", rc, tdm_sched_errmsg(s));

    int64_t mode = 0, policy = 0;
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_MODE, &mode), TDM_OK);
    assert_int_equal(tdm_sched_get_param(s, TDM_SCHED_POLICY, &policy), TDM_OK);
    /* SLO_ADAPTIVE builds its own batch, decodes first, whatever the mode (docs/scheduler.md) */
    if (policy == TDM_POLICY_SLO_ADAPTIVE) mode = TDM_MODE_DECODE_FIRST;
    int last_class = 0;
    uint64_t sum = 0;
    if (b->num_reqs) {
        assert_non_null(b->req_ids);
        assert_non_null(b->num_tokens);
        assert_non_null(b->num_computed);
        assert_non_null(b->kinds);
        assert_non_null(b->num_spec);
        assert_non_null(b->block_offsets);
        assert_int_equal(b->block_offsets[0], 0);
    }
    /* Over the cap only after the host lowered max_num_seqs (header): then nothing is admitted. */
    uint32_t admitted = 0;
    for (uint32_t i = 0; i < b->num_reqs; i++) admitted += b->kinds[i] != TDM_ENTRY_CONTINUING;
    if (b->num_reqs > (uint64_t)l.max_seqs && admitted)
        fail_msg("batch has %u requests (%u admitted), max_num_seqs %lld", b->num_reqs, admitted,
                 (long long)l.max_seqs);
    for (uint32_t i = 0; i < b->num_reqs; i++) {
        uint64_t id = b->req_ids[i];
        for (uint32_t j = 0; j < i; j++)
            if (b->req_ids[j] == id) fail_msg("id %llu twice in a batch", (unsigned long long)id);
        if (b->num_tokens[i] == 0) fail_msg("entry %u schedules 0 tokens", i);
        if (b->num_spec[i] > b->num_tokens[i]) {
            tdm_request_info di;
            tsd_info(s, id, &di);
            fail_msg("id %llu: num_spec %u > num_tokens %u (num_computed %u; request: %u prompt + %u output, "
                     "computed now %u)", (unsigned long long)id, b->num_spec[i], b->num_tokens[i],
                     b->num_computed[i], di.num_prompt_tokens, di.num_output_tokens, di.num_computed_tokens);
        }
        assert_true(b->kinds[i] <= TDM_ENTRY_CONTINUING);
        assert_true(b->block_offsets[i] <= b->block_offsets[i + 1]);
        sum += b->num_tokens[i];
        tdm_request_info info;
        tsd_info(s, id, &info);
        assert_int_equal(info.state, TDM_STATE_RUNNING);
        /* vLLM: nothing is admitted in a step that preempted */
        if (b->num_preempted && b->kinds[i] != TDM_ENTRY_CONTINUING)
            fail_msg("id %llu admitted in a step that preempted", (unsigned long long)id);
        /* decode-first: decodes, then partial prefills, then new/resumed requests */
        int cls = b->kinds[i] != TDM_ENTRY_CONTINUING ? 2
                  : (uint64_t)b->num_computed[i] + 1 >= (uint64_t)info.num_prompt_tokens + info.num_output_tokens ? 0 : 1;
        if (mode == TDM_MODE_DECODE_FIRST && cls < last_class)
            fail_msg("decode-first batch: entry %u (id %llu, class %d) after class %d", i,
                     (unsigned long long)id, cls, last_class);
        last_class = cls;
        /* prefill-first: a step that runs a prompt runs no decode */
        if (mode == TDM_MODE_PREFILL_FIRST && cls == 0 && b->num_prefill_reqs)
            fail_msg("prefill-first batch: decode id %llu next to %u prefills",
                     (unsigned long long)id, b->num_prefill_reqs);
        /* optimistic advance (vLLM _update_after_schedule) */
        assert_int_equal(info.num_computed_tokens, b->num_computed[i] + b->num_tokens[i]);
        const uint32_t *tbl = NULL;
        uint32_t nt = 0;
        assert_int_equal(tdm_sched_request_blocks(s, id, &tbl, &nt), TDM_OK);
        assert_int_equal(nt, info.num_blocks);
        uint64_t need = ((uint64_t)b->num_computed[i] + b->num_tokens[i] + (uint64_t)l.block_size - 1) /
                        (uint64_t)l.block_size;
        if (nt < need) fail_msg("id %llu: %u blocks for %u tokens", (unsigned long long)id, nt,
                                b->num_computed[i] + b->num_tokens[i]);
        uint32_t nb = b->block_offsets[i + 1] - b->block_offsets[i];
        const uint32_t *eb = b->blocks + b->block_offsets[i];
        if (b->kinds[i] != TDM_ENTRY_CONTINUING) {
            if (nb != nt) fail_msg("id %llu NEW/RESUMED entry carries %u blocks, table has %u",
                                   (unsigned long long)id, nb, nt);
        } else {
            assert_true(nb <= nt);
        }
        for (uint32_t k = 0; k < nb; k++) {
            if (eb[k] == 0 || eb[k] >= (uint64_t)l.num_blocks)
                fail_msg("id %llu: bad block id %u", (unsigned long long)id, eb[k]);
            assert_int_equal(eb[k], tbl[nt - nb + k]);
        }
    }
    assert_int_equal(sum, b->total_tokens);
    if (sum > (uint64_t)l.budget) fail_msg("batch of %llu tokens, budget %lld",
                                           (unsigned long long)sum, (long long)l.budget);
    for (uint32_t i = 0; i < b->num_preempted; i++) {
        assert_non_null(b->preempted_ids);
        if (tsd_find(b, b->preempted_ids[i]) >= 0)
            fail_msg("id %llu both preempted and scheduled", (unsigned long long)b->preempted_ids[i]);
    }
    for (uint32_t i = 0; i < b->num_finished; i++) {
        assert_non_null(b->finished_ids);
        if (tsd_find(b, b->finished_ids[i]) >= 0)
            fail_msg("id %llu both finished and scheduled", (unsigned long long)b->finished_ids[i]);
    }
    for (uint32_t i = 0; i < b->num_recv_ready; i++) assert_non_null(b->recv_ready_ids);
    tdm_sched_stats st;
    tsd_stats(s, &st);
    assert_true(st.num_running <= (uint64_t)l.max_seqs || !admitted);
    assert_true(st.num_free_blocks <= st.num_total_blocks);
    assert_int_equal(st.num_total_blocks, (uint32_t)(l.num_blocks - 1));
    assert_int_equal(st.steps, b->step);
    double usage = st.num_total_blocks ? 1.0 - (double)st.num_free_blocks / st.num_total_blocks : 0.0;
    if (st.kv_usage < usage - 1e-9 || st.kv_usage > usage + 1e-9)
        fail_msg("kv_usage %.6f, free/total says %.6f", st.kv_usage, usage);
    tsd_check(s);
}

/* One step output of m requests (ids, token offsets, tokens) at `now`, reported with
 * tdm_sched_update (r, when given, initialized first); returns its status. */
static int send_output(tdm_sched *s, uint32_t m, const uint64_t *ids, const uint32_t *offs,
                       const tdm_token *toks, double now, tdm_update_result *r)
{
    return tsd_report_step(s, 0, m, ids, offs, toks, now, r);
}

int tsd_report_step(tdm_sched *s, uint64_t step, uint32_t m, const uint64_t *ids, const uint32_t *offs,
                    const tdm_token *toks, double now, tdm_update_result *r)
{
    tdm_step_output o;
    memset(&o, 0, sizeof(o));
    assert_int_equal(tdm_step_output_init(&o), TDM_OK);
    o.num_reqs = m;
    o.req_ids = ids;
    o.token_offsets = offs;
    o.tokens = toks;
    o.now = now;
    saw_now(now);
    if (r) {
        memset(r, 0, sizeof(*r));
        assert_int_equal(tdm_update_result_init(r), TDM_OK);
    }
    return step ? tdm_sched_update_step(s, step, &o, r) : tdm_sched_update(s, &o, r);
}

void tsd_update(tdm_sched *s, const tdm_batch *b, tdm_token tok, double now,
                tdm_update_result *r)
{
    uint32_t n = b->num_reqs;
    uint64_t *ids = calloc(n + 1, sizeof(*ids));
    uint32_t *offs = calloc(n + 2, sizeof(*offs));
    uint32_t cap = 16;
    for (uint32_t i = 0; i < n; i++) cap += 1 + b->num_spec[i];
    tdm_token *toks = calloc(cap, sizeof(*toks));
    assert_true(ids && offs && toks);
    uint32_t m = 0, nt = 0;
    for (uint32_t i = 0; i < n; i++) {
        tdm_request_info info;
        memset(&info, 0, sizeof(info));
        tdm_request_info_init(&info);
        if (tdm_sched_request_info(s, b->req_ids[i], &info) != TDM_OK) continue;
        if (info.state == TDM_STATE_FINISHED || info.state == TDM_STATE_FINISHED_HELD) continue;
        ids[m] = b->req_ids[i];
        offs[m] = nt;
        uint64_t end = (uint64_t)b->num_computed[i] + b->num_tokens[i] - b->num_spec[i];
        if (end >= (uint64_t)info.num_prompt_tokens + info.num_output_tokens) {
            for (uint32_t k = 0; k < 1 + b->num_spec[i]; k++) toks[nt++] = tok;
        }
        m++;
    }
    offs[m] = nt;
    int rc = send_output(s, m, ids, offs, toks, now, r);
    if (rc != TDM_OK) fail_msg("update -> %d: %s", rc, tdm_sched_errmsg(s));
    free(ids);
    free(offs);
    free(toks);
    tsd_check(s);
}

int tsd_update_one(tdm_sched *s, uint64_t id, const tdm_token *toks, uint32_t n, double now,
                   tdm_update_result *r)
{
    uint32_t offs[2] = { 0, n };
    return send_output(s, 1, &id, offs, toks, now, r);
}

int tsd_run(tdm_sched *s, int max_steps, double *now)
{
    double t = now ? *now : g_last_now;
    if (t < g_last_now) t = g_last_now;
    int steps = 0;
    while (tsd_unfinished(s) > 0) {
        if (steps >= max_steps) fail_msg("still %u unfinished after %d steps", tsd_unfinished(s), steps);
        tdm_batch b;
        t += 0.01;
        tsd_step(s, t, &b);
        tsd_update(s, &b, 7, t + 0.005, NULL);
        steps++;
    }
    /* one more step flushes the finished list */
    tdm_batch b;
    t += 0.01;
    tsd_step(s, t, &b);
    assert_int_equal(b.num_reqs, 0);
    if (now) *now = t;
    return steps;
}

char *tsd_config(const tdm_sched *s)
{
    size_t len = 0;
    int rc = tdm_sched_get_config(s, NULL, 0, &len);
    assert_true(rc == TDM_OK || rc == TDM_E_TRUNCATED);
    assert_true(len > 0);
    char *buf = malloc(len + 1);
    assert_non_null(buf);
    size_t len2 = 0;
    assert_int_equal(tdm_sched_get_config(s, buf, len + 1, &len2), TDM_OK);
    assert_int_equal(len, len2);
    assert_int_equal(strlen(buf), len);
    return buf;
}

void tsd_assert_msg_has(const tdm_sched *s, const char *needle)
{
    const char *m = tdm_sched_errmsg(s);
    assert_non_null(m);
    if (!strstr(m, needle)) fail_msg("error message \"%s\" does not mention \"%s\"", m, needle);
}

void tsd_assert_tokens(const tdm_sched *s, uint64_t id, const tdm_token *prompt, uint32_t np,
                       const tdm_token *outs, uint32_t no)
{
    const tdm_token *t = NULL;
    uint32_t n = 0;
    assert_int_equal(tdm_sched_request_tokens(s, id, &t, &n), TDM_OK);
    assert_int_equal(n, np + no);
    for (uint32_t i = 0; i < np; i++) assert_int_equal(t[i], prompt[i]);
    for (uint32_t i = 0; i < no; i++) assert_int_equal(t[np + i], outs[i]);
}
