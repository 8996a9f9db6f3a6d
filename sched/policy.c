/*
 * policy.c -- scheduling policies: the order of the waiting queue and the choice of the
 * preemption victim. FCFS and PRIORITY are built in (and match vLLM v1), and SLO (earliest
 * TTFT deadline first, as SLO-aware schedulers order admission), and SLO_ADAPTIVE (its
 * order and victim live in slo_adaptive.c); a custom policy is
 * a versioned function table installed from C or loaded from a shared object.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sched_internal.h"

void tdm__policy_view(const tdm__req *r, tdm_request_view *v)
{
    memset(v, 0, sizeof(*v));
    v->struct_size = sizeof(*v);
    v->state = r->state;
    v->id = r->id;
    v->priority = r->priority;
    v->tenant = r->tenant;
    v->arrival_time = r->arrival;
    v->ttft_slo = r->ttft_slo;
    v->tpot_slo = r->tpot_slo;
    v->num_prompt_tokens = r->num_prompt;
    v->num_output_tokens = r->num_tokens - r->num_prompt;
    v->num_computed_tokens = r->num_computed;
    v->num_preemptions = r->num_preemptions;
    v->max_tokens = r->max_tokens;
    v->admit_seq = r->admit_seq;
}

static int cmp_key(int32_t pa, double aa, int32_t pb, double ab)
{
    if (pa != pb) return pa < pb ? -1 : 1;
    if (aa != ab) return aa < ab ? -1 : 1;
    return 0;
}

/* SLO: the TTFT deadline, infinite for a request without a TTFT SLO. Fixed while it waits. */
static double ttft_deadline(const tdm__req *r) { return r->ttft_slo > 0 ? r->arrival + r->ttft_slo : INFINITY; }

static int cmp_slo(const tdm__req *a, const tdm__req *b)
{
    double da = ttft_deadline(a), db = ttft_deadline(b);
    if (da != db) return da < db ? -1 : 1;
    if (a->arrival != b->arrival) return a->arrival < b->arrival ? -1 : 1;
    return 0;
}

/* < 0 when a goes before b. FCFS never calls this (its queue is a deque). */
int tdm__policy_compare(const tdm_sched *s, const tdm__req *a, const tdm__req *b)
{
    if (s->prm.policy == TDM_POLICY_CUSTOM) {
        tdm_request_view va, vb;
        tdm__policy_view(a, &va);
        tdm__policy_view(b, &vb);
        return s->policy.compare(s->policy.ctx, &va, &vb);
    }
    if (s->prm.policy == TDM_POLICY_SLO) return cmp_slo(a, b);
    if (s->prm.policy == TDM_POLICY_SLO_ADAPTIVE) return tdm__ad_compare(a, b);
    return cmp_key(a->priority, a->arrival, b->priority, b->arrival);
}

/* The running index of the request to preempt. FCFS: the most recently admitted (the tail
 * of running, as vLLM pops it). PRIORITY: the largest (priority, arrival). SLO: the latest
 * TTFT deadline. SLO_ADAPTIVE: a request that lost its SLO, else the latest admitted. CUSTOM: the
 * policy's pick_victim, or the request its compare ranks last (ties: latest admitted). */
uint32_t tdm__policy_victim(tdm_sched *s)
{
    uint32_t n = s->num_running;
    if (s->prm.policy == TDM_POLICY_FCFS) return n - 1;
    if (s->prm.policy == TDM_POLICY_SLO_ADAPTIVE) return tdm__ad_victim(s);
    if (s->prm.policy == TDM_POLICY_CUSTOM && s->policy.pick_victim) {
        for (uint32_t i = 0; i < n; i++) {
            tdm__policy_view(s->running[i], &s->victim_views[i]);
            s->victim_ptrs[i] = &s->victim_views[i];
        }
        uint32_t v = s->policy.pick_victim(s->policy.ctx, s->victim_ptrs, n);
        return v < n ? v : n - 1; /* a misbehaving plug-in cannot index out of range */
    }
    uint32_t worst = 0;
    for (uint32_t i = 1; i < n; i++) {
        int c = tdm__policy_compare(s, s->running[i], s->running[worst]);
        if (c > 0 || (c == 0 && s->running[i]->admit_seq > s->running[worst]->admit_seq))
            worst = i;
    }
    return worst;
}

void tdm__policy_drop(tdm_sched *s)
{
    if (s->policy.version && s->policy.destroy) s->policy.destroy(s->policy.ctx);
    memset(&s->policy, 0, sizeof(s->policy));
    if (s->plugin) dlclose(s->plugin);
    s->plugin = NULL;
}

void tdm__policy_install(tdm_sched *s, const tdm_policy *p, void *plugin)
{
    tdm__policy_drop(s);
    s->policy = *p;
    s->policy.name = NULL;
    snprintf(s->policy_name, sizeof(s->policy_name), "%s", p->name ? p->name : "custom");
    s->plugin = plugin;
    s->prm.policy = TDM_POLICY_CUSTOM;
}

void tdm__policy_unload(tdm_policy *p, void *plugin)
{
    if (p->destroy) p->destroy(p->ctx);
    if (plugin) dlclose(plugin);
}

static int check_policy_state(tdm_sched *s)
{
    if (tdm__waiting_len(s) != 0)
        return tdm__fail(&s->err, TDM_E_STATE,
                         "the policy can only change while the waiting queue is empty (%u waiting)",
                         tdm__waiting_len(s));
    return TDM_OK;
}

/* A custom policy orders the waiting queue with a heap: room for every live request. */
static int reserve_heap(tdm_sched *s)
{
    if (tdm__heap_reserve(s, s->map_len + 1)) return tdm__fail(&s->err, TDM_E_NOMEM, "out of memory");
    return TDM_OK;
}

int tdm_sched_set_policy(tdm_sched *s, const tdm_policy *p)
{
    if (!s) return TDM_E_INVAL;
    if (!p) return tdm__fail(&s->err, TDM_E_INVAL, "tdm_sched_set_policy: policy is NULL");
    if (p->version < 1 || p->version > TDM_POLICY_VERSION)
        return tdm__fail(&s->err, TDM_E_VERSION,
                         "policy table version %u is not supported (this library: 1..%u)",
                         p->version, TDM_POLICY_VERSION);
    if (!p->compare) return tdm__fail(&s->err, TDM_E_INVAL, "policy: compare must not be NULL");
    int rc = check_policy_state(s);
    if (!rc) rc = reserve_heap(s);
    if (rc) return rc;
    tdm__policy_install(s, p, NULL);
    return TDM_OK;
}

int tdm__policy_load(tdm_sched *s, const char *path, const char *symbol, tdm_policy *out,
                     void **handle)
{
    const char *sym = symbol && *symbol ? symbol : "tdm_policy_entry";
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        return tdm__fail(&s->err, TDM_E_PLUGIN, "cannot load policy '%s': %s", path, e ? e : "?");
    }
    tdm_policy_entry_fn fn;
    void *addr = dlsym(h, sym);
    memcpy(&fn, &addr, sizeof(fn));
    if (!fn) {
        dlclose(h);
        return tdm__fail(&s->err, TDM_E_PLUGIN, "policy '%s' has no symbol '%s'", path, sym);
    }
    tdm_policy p;
    memset(&p, 0, sizeof(p));
    int erc = fn(&p, TDM_ABI_VERSION);
    if (erc != 0) {
        dlclose(h);
        return tdm__fail(&s->err, TDM_E_PLUGIN, "policy entry '%s' in '%s' failed with %d", sym,
                         path, erc);
    }
    if (p.version < 1 || p.version > TDM_POLICY_VERSION) {
        tdm__policy_unload(&p, h);
        return tdm__fail(&s->err, TDM_E_VERSION, "policy '%s' has table version %u (supported 1..%u)",
                         path, p.version, TDM_POLICY_VERSION);
    }
    if (!p.compare) {
        tdm__policy_unload(&p, h);
        return tdm__fail(&s->err, TDM_E_PLUGIN, "policy '%s' has no compare function", path);
    }
    int rc = reserve_heap(s);
    if (rc) {
        tdm__policy_unload(&p, h);
        return rc;
    }
    *out = p;
    *handle = h;
    return TDM_OK;
}

int tdm_sched_load_policy(tdm_sched *s, const char *path, const char *symbol)
{
    if (!s) return TDM_E_INVAL;
    if (!path || !*path) return tdm__fail(&s->err, TDM_E_INVAL, "tdm_sched_load_policy: path is empty");
    int rc = check_policy_state(s);
    if (rc) return rc;
    tdm_policy p;
    void *h;
    if ((rc = tdm__policy_load(s, path, symbol, &p, &h))) return rc;
    tdm__policy_install(s, &p, h);
    return TDM_OK;
}
