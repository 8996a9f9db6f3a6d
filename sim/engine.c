/*
 * engine.c -- the simulator's event loop: a host that drives real libtandem schedulers
 * through the public ABI, with the cost model in place of a GPU. Each instance (a
 * colocated engine, or a prefill or decode engine of a disaggregated deployment) is a
 * tdm_sched; at each event time the loop delivers arrivals, completes the steps that end
 * (tdm_sched_update with one sampled token per request that reached the end of its
 * tokens), completes KV transfers (tdm_sched_remote_kv_done on the decode side,
 * tdm_sched_release on the prefill side) and starts a step on every idle instance
 * (tdm_sched_step; the step lasts the cost model's estimate). Load is open-loop (the
 * trace's arrivals) or closed-loop (at most `concurrency` requests in flight, the next one
 * sent when one finishes); the first `warmup` requests sent are excluded from the metrics.
 * Each request carries its own TTFT/TPOT deadlines (its SLO class, else the run's SLOs), so
 * the scheduler's SLO policy sees them. Work per step is O(batch); nothing is allocated per
 * step once the buffers reach their high-water mark, and nothing per token: the gaps go into
 * a fixed-size sketch.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

typedef struct rstate {
    uint32_t total;        /* tokens the current scheduler holds (prompt + outputs) */
    uint32_t generated;    /* outputs counted for the user (decode side) */
    double last_token;
    int32_t inst;          /* instance holding it now */
    uint8_t phase;         /* 0 colocated/decode, 1 prefill side */
} rstate;

/* A request in flight: its state and its outcome so far (folded into the summary, and
 * copied to the result's reqs when they are kept, when it ends). */
typedef struct live {
    rstate r;
    tdm_sim_req_out o;
} live;

#define NO_SLOT UINT32_MAX

typedef struct xfer {
    double end;
    uint64_t id;
    uint32_t pre, dec;
} xfer;

/* A min-heap of timed events on the end time: KV transfers, requests in transit. */
typedef struct xheap {
    xfer *a;
    size_t n, cap;
} xheap;

typedef struct eng {
    const tdm_sim_trace *t;
    const tdm_sim_config *c;
    const tdm_sim_run_opts *o;
    tdm_sim_result *res;
    tdm_sim_inst *in;
    size_t ninst, npre;        /* disagg: [0, npre) prefill, [npre, ninst) decode */
    live *lv;                  /* the requests in flight */
    uint32_t *slot;            /* per request id: its lv index, NO_SLOT when not in flight */
    uint32_t *free_lv;
    size_t n_lv, n_free;
    tdm_sim_acc acc;
    tdm_token *toks;
    uint32_t max_prompt;
    xheap heap;                /* KV transfers in flight */
    xheap transit;             /* requests between the client and the scheduler (frontend) */
    double fe_free;            /* when the serving path's server is next free (frontend_service_s) */
    uint32_t rr_pre, rr_dec;
    double kv_gbps;
    size_t done;
    uint32_t inflight;         /* sent and not finished (closed loop) */
    size_t sent, warmup;
    double burst_t;            /* warmup_drain: when the measured phase's burst was sent */
    double cls_ttft[TDM_SIM_MAX_SLO_CLASSES + 1], cls_tpot[TDM_SIM_MAX_SLO_CLASSES + 1];
    char *err;
    size_t errlen;
} eng;

static int heap_push(xheap *h, xfer x)
{
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 256;
        xfer *p = realloc(h->a, nc * sizeof *p);
        if (!p) return -1;
        h->a = p;
        h->cap = nc;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h->a[p].end <= x.end) break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = x;
    return 0;
}

static xfer heap_pop(xheap *h)
{
    xfer top = h->a[0], last = h->a[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        double mv = last.end;
        if (l < n && h->a[l].end < mv) m = l, mv = h->a[l].end;
        if (r < n && h->a[r].end < mv) m = r;
        if (m == i) break;
        h->a[i] = h->a[m];
        i = m;
    }
    if (n) h->a[i] = last;
    return top;
}

static int push_id(uint64_t **a, size_t *n, size_t *cap, uint64_t id)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        uint64_t *p = realloc(*a, nc * sizeof *p);
        if (!p) return -1;
        *a = p;
        *cap = nc;
    }
    (*a)[(*n)++] = id;
    return 0;
}

static live *L(eng *e, uint64_t id)
{
    return &e->lv[e->slot[id]];
}

/* The outcome of request id before it is sent (times -1, its SLOs resolved). */
static void out_init(const eng *e, size_t id, tdm_sim_req_out *q)
{
    const tdm_sim_req *r = &e->t->reqs[id];
    memset(q, 0, sizeof *q);
    q->arrival = r->arrival;
    q->first_token = q->finish = -1;
    q->prompt_len = r->prompt_len;
    q->output_len = r->output_len;
    q->instance = q->prefill_instance = -1;
    uint32_t k = r->slo_class <= e->t->n_slo ? r->slo_class : 0;
    q->has_slo = k > 0;
    q->slo_class = (uint8_t)k;
    q->slo_ttft_s = k ? e->cls_ttft[k] : e->o->slo_ttft_s;
    q->slo_tpot_s = k ? e->cls_tpot[k] : e->o->slo_tpot_s;
}

/* Give request id a slot in flight (the slots grow to the peak in flight, then are reused). */
static live *live_open(eng *e, size_t id)
{
    uint32_t k;
    if (e->n_free) {
        k = e->free_lv[--e->n_free];
    } else {
        if ((e->n_lv & (e->n_lv - 1)) == 0) { /* a power of two (or 0): full, double */
            size_t nc = e->n_lv ? e->n_lv * 2 : 64;
            live *p = realloc(e->lv, nc * sizeof *p);
            if (!p) return NULL;
            e->lv = p;
            uint32_t *f = realloc(e->free_lv, nc * sizeof *f);
            if (!f) return NULL;
            e->free_lv = f;
        }
        k = (uint32_t)e->n_lv++;
    }
    live *l = &e->lv[k];
    memset(&l->r, 0, sizeof l->r);
    out_init(e, id, &l->o);
    e->slot[id] = k;
    return l;
}

/* Request id has ended (or the run has): its outcome into the summary, its slot freed. */
static void live_close(eng *e, uint64_t id)
{
    const tdm_sim_req_out *o = &L(e, id)->o;
    tdm_sim_acc_add(&e->acc, o);
    if (e->res->reqs) e->res->reqs[id] = *o;
    e->free_lv[e->n_free++] = e->slot[id];
    e->slot[id] = NO_SLOT;
}

static int fail(eng *e, const char *what, tdm_sched *s, int rc)
{
    snprintf(e->err, e->errlen, "%s: %s (%s)", what, s ? tdm_sched_errmsg(s) : "",
             tdm_strerror(rc));
    return -1;
}

/* Does the user's scheduler JSON set this key? */
static int json_has(const char *json, const char *key)
{
    if (!json) return 0;
    json_t *o = json_loads(json, 0, NULL);
    int has = o && json_object_get(o, key) != NULL;
    json_decref(o);
    return has;
}

static int inst_init(eng *e, tdm_sim_inst *in, const tdm_sim_pool *p, int role, int pool)
{
    memset(in, 0, sizeof *in);
    in->role = role;
    in->pool = pool;
    tdm_sim_cost_init(&in->cost, &p->model, &p->hw);
    int rc = tdm_sched_create(&in->s);
    if (rc != TDM_OK) return fail(e, "tdm_sched_create", NULL, rc);
    if (!json_has(p->sched_json, "max_model_len")) {
        uint32_t ml = p->model.max_len;
        for (size_t i = 0; i < e->t->n; i++) {
            uint32_t need = e->t->reqs[i].prompt_len + e->t->reqs[i].output_len;
            if (need > ml) ml = need;
        }
        rc = tdm_sched_set_param(in->s, TDM_SCHED_MAX_MODEL_LEN, ml);
        if (rc != TDM_OK) return fail(e, "max_model_len", in->s, rc);
    }
    if (p->sched_json && (rc = tdm_sched_configure(in->s, p->sched_json)) != TDM_OK)
        return fail(e, "scheduler config", in->s, rc);
    int64_t bs = 16, nb = 0;
    tdm_sched_get_param(in->s, TDM_SCHED_BLOCK_SIZE, &bs);
    in->block_size = (uint32_t)bs;
    if (!json_has(p->sched_json, "num_blocks")) {
        int64_t mbt = 8192, mns = 256;
        tdm_sched_get_param(in->s, TDM_SCHED_MAX_NUM_BATCHED_TOKENS, &mbt);
        tdm_sched_get_param(in->s, TDM_SCHED_MAX_NUM_SEQS, &mns);
        uint32_t blocks = tdm_sim_cost_num_blocks(&in->cost, (uint32_t)bs, e->o->mem_util,
                                                  (uint32_t)mbt, (uint32_t)mns);
        if (blocks > 1 && (rc = tdm_sched_set_param(in->s, TDM_SCHED_NUM_BLOCKS, blocks + 1)) != TDM_OK)
            return fail(e, "num_blocks", in->s, rc);
    }
    tdm_sched_get_param(in->s, TDM_SCHED_NUM_BLOCKS, &nb);
    if (role != TDM_ROLE_BOTH && (rc = tdm_sched_set_param(in->s, TDM_SCHED_ROLE, role)) != TDM_OK)
        return fail(e, "role", in->s, rc);
    in->cm.version = TDM_COST_MODEL_VERSION;
    in->cm.ctx = &in->cost;
    in->cm.estimate = tdm_sim_cost_estimate_cb;
    if ((rc = tdm_sched_set_cost_model(in->s, &in->cm)) != TDM_OK)
        return fail(e, "tdm_sched_set_cost_model", in->s, rc);
    tdm_batch_init(&in->batch);
    if (e->c->router == TDM_SIM_ROUTER_KV_AWARE &&
        tdm_sim_blockset_init(&in->blocks, (size_t)(nb > 0 ? nb : 1024)) != 0) {
        snprintf(e->err, e->errlen, "out of memory");
        return -1;
    }
    return 0;
}

static void inst_free(tdm_sim_inst *in)
{
    tdm_sched_destroy(in->s);
    free(in->out_ids);
    free(in->out_offs);
    free(in->out_toks);
    free(in->pend_add);
    free(in->pend_done);
    tdm_sim_blockset_free(&in->blocks);
}

/* Route request id to an instance of the first pool (arrival) or the decode pool. */
static int route(eng *e, uint64_t id, int to_decode)
{
    const tdm_sim_req *r = &e->t->reqs[id];
    size_t first = to_decode ? e->npre : 0;
    size_t count = to_decode ? e->ninst - e->npre : (e->c->disagg ? e->npre : e->ninst);
    tdm_sim_router router = to_decode ? TDM_SIM_ROUTER_LEAST_LOAD : e->c->router;
    int kv = router == TDM_SIM_ROUTER_KV_AWARE;
    if (kv) tdm_sim_trace_tokens(e->t, id, e->toks);
    int k = tdm_sim_route(e->in, first, count, router, e->c->overlap_weight,
                          to_decode ? &e->rr_dec : &e->rr_pre, kv ? e->toks : NULL,
                          r->prompt_len, kv);
    tdm_sim_inst *in = &e->in[k];
    if (push_id(&in->pend_add, &in->n_add, &in->cap_add, id) != 0) {
        snprintf(e->err, e->errlen, "out of memory");
        return -1;
    }
    in->outstanding++;
    in->outstanding_tokens += r->prompt_len + (to_decode || !e->c->disagg ? r->output_len : 0);
    L(e, id)->r.inst = k;
    return 0;
}

static void finish_req(eng *e, tdm_sim_inst *in, uint64_t id, double t, uint8_t status)
{
    const tdm_sim_req *r = &e->t->reqs[id];
    tdm_sim_req_out *o = &L(e, id)->o;
    if (status != 2) o->finish = t; /* a rejected request never finished */
    o->status = status;
    in->outstanding--;
    in->outstanding_tokens -= r->prompt_len + r->output_len;
    e->done++;
    if (e->inflight) e->inflight--;
    live_close(e, id);
}

/* The serving path before the scheduler (HTTP, tokenization, the hop to the engine core) of
 * request id: the run's frontend_s, spread uniformly over [0.5, 1.5] of it per request (a
 * fixed delay would keep a closed loop of equal requests in lockstep, which real clients
 * and servers never are). 0 = none. */
static double frontend_s(const eng *e, uint64_t id)
{
    double f = e->o->frontend_s;
    if (f <= 0) return 0;
    double u = (double)(tdm_sim_mix64(id * 0x9e3779b97f4a7c15ull + 17) >> 11) / 9007199254740992.0;
    return f * (0.5 + u);
}

/* Closed loop: the client's delay before sending request id when a slot frees at `now`
 * (not counted in its TTFT). Sends count in phases: the run's, and with warmup_drain the
 * measured phase's from its burst (send `warmup`, at burst_t). A phase's first wave (its first
 * `concurrency` sends) leaves at once; with desync = R, the sends that refill its R-th wave's
 * slots (sends R*C to (R+1)*C - 1 of the phase) leave at a uniformly random fraction of one
 * request lifetime (the time since the phase began over R), so the loop runs in phase for R
 * waves and out of phase after; every other send waits an exponential delay of mean
 * client_jitter_s. */
static double client_delay_s(const eng *e, uint64_t id, double now)
{
    size_t k = e->sent - 1, conc = e->o->concurrency; /* k: this request's send index */
    size_t b = e->o->warmup_drain ? e->warmup : 0;    /* the measured phase's first send */
    size_t p0 = b && k >= b ? b : 0;                  /* the first send of k's phase */
    size_t j = k - p0;                                /* k's index within its phase */
    if (j < conc) return 0;
    double u = (double)(tdm_sim_mix64(id * 0xbf58476d1ce4e5b9ull + 29) >> 11) / 9007199254740992.0;
    size_t R = e->o->desync > 0 ? (size_t)e->o->desync : 0;
    if (R && j >= R * conc && j < (R + 1) * conc)
        return u * (now - (p0 ? e->burst_t : 0)) / (double)R;
    return e->o->client_jitter_s > 0 ? -e->o->client_jitter_s * log1p(-u) : 0;
}

/* Closed loop: whether a slot is free for the next send. With warmup_drain the first
 * measured request waits until no warm-up request is in flight. */
static int slot_free(const eng *e)
{
    uint32_t conc = e->o->concurrency;
    if (!conc) return 1;
    if (e->inflight >= conc) return 0;
    return !(e->o->warmup_drain && e->warmup && e->sent == e->warmup && e->inflight);
}

/* Send the requests due at `now`: every arrival up to now (open loop), or in closed loop
 * as many as free slots allow, each sent at max(its arrival, now). */
static int deliver(eng *e, size_t *next, double now)
{
    const tdm_sim_trace *t = e->t;
    uint32_t conc = e->o->concurrency;
    while (*next < t->n && t->reqs[*next].arrival <= now && slot_free(e)) {
        size_t id = *next;
        live *l = live_open(e, id);
        if (!l) {
            snprintf(e->err, e->errlen, "out of memory");
            return -1;
        }
        tdm_sim_req_out *o = &l->o;
        if (conc) o->arrival = now;
        o->warmup = e->sent < e->warmup;
        if (e->sent == e->warmup) e->burst_t = now;
        e->sent++;
        e->inflight++;
        if (conc) o->arrival = now + client_delay_s(e, id, now);
        double fe = frontend_s(e, id);
        if (e->o->frontend_service_s > 0) {   /* one server, first come first served */
            double start = e->fe_free > o->arrival ? e->fe_free : o->arrival;
            e->fe_free = start + e->o->frontend_service_s;
            fe += e->fe_free - o->arrival;
        }
        if (fe > 0 || o->arrival > now) {
            xfer x = {o->arrival + fe, id, 0, 0};
            if (heap_push(&e->transit, x) != 0) {
                snprintf(e->err, e->errlen, "out of memory");
                return -1;
            }
        } else if (route(e, id, 0) != 0) {
            return -1;
        }
        (*next)++;
    }
    return 0;
}

/* Add the requests queued for this instance (before its next step). */
static int flush_pending(eng *e, tdm_sim_inst *in, double t)
{
    for (size_t i = 0; i < in->n_done; i++) {
        int rc = tdm_sched_remote_kv_done(in->s, in->pend_done[i], 1, 0);
        if (rc != TDM_OK) return fail(e, "tdm_sched_remote_kv_done", in->s, rc);
    }
    in->n_done = 0;
    for (size_t i = 0; i < in->n_add; i++) {
        uint64_t id = in->pend_add[i];
        const tdm_sim_req *r = &e->t->reqs[id];
        tdm_sim_trace_tokens(e->t, id, e->toks);
        tdm_request_desc d;
        tdm_request_desc_init(&d);
        d.id = id;
        d.prompt = e->toks;
        d.num_prompt_tokens = r->prompt_len;
        d.max_tokens = r->output_len;
        d.eos_token_id = -1;
        d.priority = r->priority;
        live *l = L(e, id);
        d.arrival_time = l->o.arrival;
        d.ttft_slo = l->o.slo_ttft_s;
        d.tpot_slo = l->o.slo_tpot_s;
        d.flags = TDM_REQ_SLO_DEPRIORITIZE; /* a late request counts as a miss anyway */
        if (in->role == TDM_ROLE_PREFILL) {
            d.flags |= TDM_REQ_REMOTE_DECODE;
            d.max_tokens = 1;
        } else if (in->role == TDM_ROLE_DECODE) {
            d.flags |= TDM_REQ_REMOTE_PREFILL;
        }
        int rc = tdm_sched_add(in->s, &d);
        if (rc != TDM_OK) {
            /* too long for max_model_len or the pool: rejected, an SLO miss */
            tdm_sim_req_out *o = &l->o;
            if (in->role == TDM_ROLE_DECODE && o->prefill_instance >= 0)
                tdm_sched_release(e->in[o->prefill_instance].s, id);
            if (in->role == TDM_ROLE_PREFILL) {
                in->outstanding_tokens += r->output_len; /* finish_req subtracts the full */
            }
            finish_req(e, in, id, t, 2);
            continue;
        }
        l->r.total = r->prompt_len;
        l->r.phase = in->role == TDM_ROLE_PREFILL;
        if (in->role != TDM_ROLE_PREFILL) l->o.instance = (int32_t)(in - e->in);
        else l->o.prefill_instance = (int32_t)(in - e->in);
    }
    in->n_add = 0;
    return 0;
}

static int start_transfers(eng *e, tdm_sim_inst *dec, double t)
{
    for (uint32_t i = 0; i < dec->batch.num_recv_ready; i++) {
        uint64_t id = dec->batch.recv_ready_ids[i];
        int32_t p = L(e, id)->o.prefill_instance;
        if (p < 0) continue;
        tdm_sim_inst *pre = &e->in[p];
        double bytes = tdm_sim_model_kv_bytes_per_token(&pre->cost.model) *
                       e->t->reqs[id].prompt_len;
        double start = t > pre->link_free ? t : pre->link_free;
        double end = start + e->c->kv_latency_s + bytes / (e->kv_gbps * 1e9);
        pre->link_free = end;
        tdm_sim_steptrace_xfer(e->o, (size_t)p, (size_t)(dec - e->in), id, start, end, bytes);
        xfer x = {end, id, (uint32_t)p, (uint32_t)(dec - e->in)};
        if (heap_push(&e->heap, x) != 0) {
            snprintf(e->err, e->errlen, "out of memory");
            return -1;
        }
        e->res->sum.kv_transfers++;
        e->res->sum.kv_transfer_bytes += bytes;
        e->res->sum.kv_transfer_mean_s += end - t;
    }
    return 0;
}

static int try_step(eng *e, tdm_sim_inst *in, double t)
{
    if (flush_pending(e, in, t) != 0) return -1;
    int rc = tdm_sched_step(in->s, t, &in->batch);
    if (rc != TDM_OK) return fail(e, "tdm_sched_step", in->s, rc);
    const tdm_batch *b = &in->batch;
    if (b->num_recv_ready && start_transfers(e, in, t) != 0) return -1;
    for (uint32_t i = 0; i < b->num_preempted; i++) {
        uint64_t id = b->preempted_ids[i];
        if (id < e->t->n && e->slot[id] != NO_SLOT) L(e, id)->o.preemptions++;
    }
    if (b->num_reqs == 0) return 0;
    tdm_sim_shape sh;
    memset(&sh, 0, sizeof sh);
    for (uint32_t i = 0; i < b->num_reqs; i++) {
        uint64_t id = b->req_ids[i];
        const rstate *r = &L(e, id)->r;
        uint32_t n = b->num_tokens[i], c = b->num_computed[i];
        int emits = c + n >= r->total;
        if (n == 1 && emits && r->total > e->t->reqs[id].prompt_len) {
            sh.decode_reqs++;
            sh.decode_ctx += c + 1;
        } else {
            sh.prefill_tokens += n;
            sh.prefill_reqs++;
            sh.prefill_attn += n * ((double)c + n / 2.0);
            sh.prefill_kv_read += c + n;
        }
        sh.emit_seqs += emits;
    }
    double dt = tdm_sim_cost_step(&in->cost, &sh, NULL);
    if (e->o->steps_csv || e->o->chrome_trace)
        tdm_sim_steptrace_step(e->o, in, (size_t)(in - e->in), t, dt, &sh, b);
    in->busy = 1;
    in->step_start = t;
    in->step_end = t + dt;
    in->steps++;
    in->tokens += b->total_tokens;
    in->req_steps += b->num_reqs;
    return 0;
}

static int complete_step(eng *e, tdm_sim_inst *in)
{
    const tdm_batch *b = &in->batch;
    double t = in->step_end;
    in->busy = 0;
    uint32_t n = b->num_reqs;
    if (n > in->out_cap) {
        size_t nc = n * 2;
        uint64_t *a = realloc(in->out_ids, nc * sizeof *a);
        if (a) in->out_ids = a;
        uint32_t *o = realloc(in->out_offs, (nc + 1) * sizeof *o);
        if (o) in->out_offs = o;
        tdm_token *k = realloc(in->out_toks, nc * sizeof *k);
        if (k) in->out_toks = k;
        if (!a || !o || !k) {
            snprintf(e->err, e->errlen, "out of memory");
            return -1;
        }
        in->out_cap = nc;
    }
    uint32_t nt = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t id = b->req_ids[i];
        in->out_ids[i] = id;
        in->out_offs[i] = nt;
        uint32_t total = L(e, id)->r.total;
        if (b->num_computed[i] + b->num_tokens[i] >= total)
            in->out_toks[nt++] = (tdm_token)(1 + tdm_sim_mix64(id * 131 + total) % 32000);
    }
    in->out_offs[n] = nt;
    tdm_step_output so;
    tdm_step_output_init(&so);
    so.num_reqs = n;
    so.req_ids = in->out_ids;
    so.token_offsets = in->out_offs;
    so.tokens = in->out_toks;
    so.now = t;
    tdm_update_result ur;
    tdm_update_result_init(&ur);
    int rc = tdm_sched_update(in->s, &so, &ur);
    if (rc != TDM_OK) return fail(e, "tdm_sched_update", in->s, rc);
    for (uint32_t j = 0; j < ur.num_reqs; j++) {
        uint64_t id = ur.req_ids[j];
        if (id >= e->t->n || e->slot[id] == NO_SLOT) continue;
        rstate *r = &L(e, id)->r;
        uint32_t nn = ur.num_new_tokens[j];
        r->total += nn;
        if (r->phase == 1) {
            /* prefill side of a disaggregated pair: hand the request to a decode instance */
            if (ur.finish_reasons[j] != TDM_FINISH_NONE) {
                const tdm_sim_req *q = &e->t->reqs[id];
                in->outstanding--;
                in->outstanding_tokens -= q->prompt_len;
                if (route(e, id, 1) != 0) return -1;
            }
            continue;
        }
        if (nn) {
            tdm_sim_req_out *o = &L(e, id)->o;
            if (r->generated == 0) {
                o->first_token = t;
            } else if (!o->warmup && tdm_sim_sketch_add(&e->res->itl, t - r->last_token) != 0) {
                snprintf(e->err, e->errlen, "out of memory");
                return -1;
            }
            /* several tokens in one step (speculative decoding) share one gap */
            for (uint32_t k = 1; k < nn && !o->warmup; k++)
                if (tdm_sim_sketch_add(&e->res->itl, 0) != 0) {
                    snprintf(e->err, e->errlen, "out of memory");
                    return -1;
                }
            r->generated += nn;
            r->last_token = t;
            o->generated = r->generated;
        }
        if (ur.finish_reasons[j] != TDM_FINISH_NONE)
            finish_req(e, in, id, t, ur.finish_reasons[j] == TDM_FINISH_ERROR ? 0 : 1);
    }
    tdm_sched_stats st;
    tdm_sched_stats_init(&st);
    if (tdm_sched_get_stats(in->s, &st) == TDM_OK) {
        in->kv_sum += st.kv_usage;
        if (st.kv_usage > in->kv_max) in->kv_max = st.kv_usage;
    }
    return 0;
}

static int complete_xfer(eng *e, const xfer *x)
{
    tdm_sim_inst *pre = &e->in[x->pre], *dec = &e->in[x->dec];
    int rc = tdm_sched_release(pre->s, x->id);
    /* NOT_FOUND / STATE: the delayed-free timeout already freed the held blocks */
    if (rc != TDM_OK && rc != TDM_E_NOT_FOUND && rc != TDM_E_STATE)
        return fail(e, "tdm_sched_release", pre->s, rc);
    if (push_id(&dec->pend_done, &dec->n_done, &dec->cap_done, x->id) != 0) {
        snprintf(e->err, e->errlen, "out of memory");
        return -1;
    }
    return 0;
}

static int loop(eng *e)
{
    const tdm_sim_trace *t = e->t;
    size_t next = 0;
    double now = 0;
    uint64_t events = 0;
    tdm_sim_progress pg;
    tdm_sim_progress_begin(&pg, e->o->progress, e->o->label);
    for (;;) {
        if (deliver(e, &next, now) != 0) goto out;
        for (size_t i = 0; i < e->ninst; i++)
            if (e->in[i].busy && e->in[i].step_end <= now && complete_step(e, &e->in[i]) != 0)
                goto out;
        while (e->transit.n && e->transit.a[0].end <= now) {
            xfer x = heap_pop(&e->transit);
            if (route(e, x.id, 0) != 0) goto out;
        }
        while (e->heap.n && e->heap.a[0].end <= now) {
            xfer x = heap_pop(&e->heap);
            if (complete_xfer(e, &x) != 0) goto out;
        }
        /* closed loop: a request that finished at `now` frees a slot for the next one */
        if (e->o->concurrency && deliver(e, &next, now) != 0) goto out;
        for (size_t i = 0; i < e->ninst; i++)
            if (!e->in[i].busy && try_step(e, &e->in[i], now) != 0) goto out;
        double tn = INFINITY;
        if (next < t->n && slot_free(e))
            tn = t->reqs[next].arrival > now ? t->reqs[next].arrival : now;
        for (size_t i = 0; i < e->ninst; i++)
            if (e->in[i].busy && e->in[i].step_end < tn) tn = e->in[i].step_end;
        if (e->heap.n && e->heap.a[0].end < tn) tn = e->heap.a[0].end;
        if (e->transit.n && e->transit.a[0].end < tn) tn = e->transit.a[0].end;
        int pending = 0;
        for (size_t i = 0; i < e->ninst; i++) pending |= e->in[i].n_add || e->in[i].n_done;
        if (tn == INFINITY && !pending) break;
        if (tn == INFINITY) tn = now; /* queued work for idle instances: one more round */
        if (tn < now) tn = now;
        now = tn;
        if ((++events & 4095) == 0) {
            tdm_sim_progress_update(&pg, (double)e->done / (double)t->n, e->done, t->n, now);
            uint64_t steps = 0;
            for (size_t i = 0; i < e->ninst; i++) steps += e->in[i].steps;
            if (e->o->max_steps && steps >= e->o->max_steps) break;
        }
    }
    tdm_sim_progress_end(&pg);
    e->res->sum.duration_s = now;
    return 0;
out:
    tdm_sim_progress_end(&pg);
    return -1;
}

/* Each SLO class the trace names takes its targets from the run options; "best_effort" and
 * "batch" default to none. An undefined class is an error (a silent default would hide a typo). */
static int resolve_slo_classes(eng *e)
{
    for (uint32_t k = 0; k < e->t->n_slo; k++) {
        const char *nm = e->t->slo_names[k];
        size_t j = 0;
        while (j < e->o->n_slo_classes && strcmp(e->o->slo_classes[j].name, nm)) j++;
        if (j < e->o->n_slo_classes) {
            e->cls_ttft[k + 1] = e->o->slo_classes[j].ttft_s;
            e->cls_tpot[k + 1] = e->o->slo_classes[j].tpot_s;
        } else if (!strcmp(nm, "best_effort") || !strcmp(nm, "batch")) {
            e->cls_ttft[k + 1] = e->cls_tpot[k + 1] = 0;
        } else {
            snprintf(e->err, e->errlen, "the trace names SLO class '%s', which is not defined "
                     "(--slo-class %s:TTFT_MS:TPOT_MS)", nm, nm);
            return -1;
        }
    }
    return 0;
}

void tdm_sim_result_free(tdm_sim_result *r)
{
    if (!r) return;
    free(r->reqs);
    tdm_sim_sketch_free(&r->itl);
    memset(r, 0, sizeof *r);
}

int tdm_sim_run(const tdm_sim_trace *t, const tdm_sim_config *c, const tdm_sim_run_opts *o,
                tdm_sim_result *res, char *err, size_t errlen)
{
    tdm_sim_run_opts defo;
    if (!o) {
        tdm_sim_run_opts_init(&defo);
        o = &defo;
    }
    double w0 = tdm_sim_wall();
    memset(res, 0, sizeof *res);
    snprintf(res->name, sizeof res->name, "%s", c->name);
    eng e;
    memset(&e, 0, sizeof e);
    e.t = t;
    e.c = c;
    e.o = o;
    e.res = res;
    e.err = err;
    e.errlen = errlen;
    int rc = -1;
    for (size_t i = 0; i < t->n; i++) {
        if (t->reqs[i].prompt_len > e.max_prompt) e.max_prompt = t->reqs[i].prompt_len;
    }
    res->n = t->n;
    if (o->keep_requests) res->reqs = calloc(t->n ? t->n : 1, sizeof *res->reqs);
    e.slot = malloc((t->n ? t->n : 1) * sizeof *e.slot);
    tdm_sim_acc_init(&e.acc, o->slo_ttft_s, o->slo_tpot_s);
    e.toks = malloc(((size_t)e.max_prompt + 1) * sizeof *e.toks);
    e.npre = c->disagg ? c->pools[0].instances : 0;
    e.ninst = c->pools[0].instances + (c->disagg ? c->pools[1].instances : 0);
    e.in = calloc(e.ninst ? e.ninst : 1, sizeof *e.in);
    if ((o->keep_requests && !res->reqs) || !e.slot || !e.toks || !e.in) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    if (e.ninst == 0 || (c->disagg && c->pools[1].instances == 0)) {
        snprintf(err, errlen, "%s: a pool has no instances", c->name);
        goto done;
    }
    if (resolve_slo_classes(&e) != 0) goto done;
    res->n_classes = t->n_slo;
    for (uint32_t k = 0; k < t->n_slo; k++) {
        memcpy(res->classes[k].name, t->slo_names[k], sizeof res->classes[k].name);
        res->classes[k].ttft_s = e.cls_ttft[k + 1];
        res->classes[k].tpot_s = e.cls_tpot[k + 1];
    }
    e.warmup = o->warmup >= 0 ? (size_t)o->warmup : o->concurrency;
    if (e.warmup >= t->n && t->n) {
        snprintf(err, errlen, "warm-up of %zu requests leaves none of the %zu to measure",
                 e.warmup, t->n);
        goto done;
    }
    memset(e.slot, 0xff, (t->n ? t->n : 1) * sizeof *e.slot); /* NO_SLOT */
    e.kv_gbps = c->kv_gbps;
    if (c->disagg && e.kv_gbps <= 0) {
        double a = c->pools[0].hw.interconnect_gbps, b = c->pools[1].hw.interconnect_gbps;
        if (a <= 0) a = b; /* 0 = unknown */
        if (b <= 0) b = a;
        e.kv_gbps = a < b ? a : b;
        if (e.kv_gbps <= 0) e.kv_gbps = TDM_SIM_DEFAULT_LINK_GBPS;
    }
    size_t k = 0;
    for (int p = 0; p < (c->disagg ? 2 : 1); p++) {
        int role = c->disagg ? (p == 0 ? TDM_ROLE_PREFILL : TDM_ROLE_DECODE) : TDM_ROLE_BOTH;
        for (uint32_t i = 0; i < c->pools[p].instances; i++, k++)
            if (inst_init(&e, &e.in[k], &c->pools[p], role, p) != 0) {
                e.ninst = k + 1;
                goto done;
            }
    }
    tdm_sim_steptrace_begin(o, c->name, e.in, e.ninst);
    int lrc = loop(&e);
    tdm_sim_steptrace_end(o);
    if (lrc != 0) goto done;
    /* the requests still in flight (a max_steps stop) and those never sent: unfinished */
    for (size_t i = 0; i < t->n; i++) {
        if (e.slot[i] != NO_SLOT) {
            live_close(&e, i);
        } else if (i >= e.sent) {
            tdm_sim_req_out q;
            out_init(&e, i, &q);
            tdm_sim_acc_add(&e.acc, &q);
            if (res->reqs) res->reqs[i] = q;
        }
    }
    if (e.warmup) {
        /* the measurement window: first measured send to last measured finish */
        double a = e.acc.first_arrival < 0 ? INFINITY : e.acc.first_arrival;
        double z = e.acc.last_finish > 0 ? e.acc.last_finish : 0;
        res->sum.duration_s = z > a ? z - a : 0;
    }
    res->sum.warmup = e.warmup;
    res->sum.concurrency = o->concurrency;
    /* scheduler counters */
    uint64_t q = 0, h = 0;
    double kvs = 0;
    uint64_t steps = 0, toks = 0;
    for (size_t i = 0; i < e.ninst; i++) {
        tdm_sched_stats st;
        tdm_sched_stats_init(&st);
        if (tdm_sched_get_stats(e.in[i].s, &st) == TDM_OK) {
            res->sum.preemptions += st.preemptions;
            q += st.prefix_queries;
            h += st.prefix_hits;
        }
        steps += e.in[i].steps;
        toks += e.in[i].tokens;
        res->sum.extrapolated_steps += e.in[i].cost.extrapolated_steps;
        if (e.in[i].cost.tables) res->sum.table_model = 1;
        res->sum.request_steps += e.in[i].req_steps;
        kvs += e.in[i].steps ? e.in[i].kv_sum / (double)e.in[i].steps : 0;
        if (e.in[i].kv_max > res->sum.kv_usage_max) res->sum.kv_usage_max = e.in[i].kv_max;
    }
    res->sum.prefix_hit_rate = q ? (double)h / (double)q : 0;
    res->sum.kv_usage_mean = kvs / (double)e.ninst;
    res->sum.steps = steps;
    res->sum.batched_tokens = toks;
    res->sum.mean_batch_tokens = steps ? (double)toks / (double)steps : 0;
    if (res->sum.kv_transfers) res->sum.kv_transfer_mean_s /= (double)res->sum.kv_transfers;
    res->sum.gpus = tdm_sim_config_gpus(c);
    int arc = tdm_sim_acc_finish(&e.acc, res);
    if (arc != 0) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    res->sum.goodput_req_s = -1;
    rc = 0;
done:
    for (size_t i = 0; i < e.ninst; i++) inst_free(&e.in[i]);
    free(e.in);
    free(e.slot);
    free(e.lv);
    free(e.free_lv);
    tdm_sim_sketch_free(&e.acc.ttft); /* after an error (tdm_sim_acc_finish frees them too) */
    tdm_sim_sketch_free(&e.acc.tpot);
    tdm_sim_sketch_free(&e.acc.e2e);
    free(e.toks);
    free(e.heap.a);
    free(e.transit.a);
    if (rc != 0) tdm_sim_result_free(res);
    else res->sum.wall_s = tdm_sim_wall() - w0;
    return rc;
}

void tdm_sim_run_opts_init(tdm_sim_run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->slo_ttft_s = 0.5;
    o->slo_tpot_s = 0.05;
    o->goodput_target = 0.9;
    o->mem_util = 0.9;
    o->label = "sim";
    o->warmup = -1;
    o->keep_requests = 1;
}
