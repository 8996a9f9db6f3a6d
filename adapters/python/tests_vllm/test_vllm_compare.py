"""TandemScheduler against vLLM's own Scheduler on the same scenarios, driven the way vLLM's
tests/v1/core tests drive the default scheduler: hand-built ModelRunnerOutput, no model, no
GPU. Each step's SchedulerOutput (scheduled tokens, new/cached requests and their block ids,
resumed, preempted and finished ids) and each EngineCoreOutputs (new tokens, finish reasons)
must be identical."""
import pytest

from conftest import make_mro, make_pair, make_requests

from vllm.v1.core.sched.interface import SchedulerInterface
from vllm.v1.request import RequestStatus


def norm_so(so, exact_blocks=True):
    c = so.scheduled_cached_reqs
    if not exact_blocks:
        return {
            "num_scheduled": dict(so.num_scheduled_tokens),
            "total": so.total_num_scheduled_tokens,
            "new": {n.req_id: (len(n.block_ids[0]), n.num_computed_tokens)
                    for n in so.scheduled_new_reqs},
            "cached": {rid: (None if b is None else len(b[0]), nc)
                       for rid, b, nc in zip(c.req_ids, c.new_block_ids, c.num_computed_tokens)},
            "resumed": sorted(getattr(c, "resumed_req_ids", ())),
            "preempted": sorted(so.preempted_req_ids or ()),
            "finished": sorted(so.finished_req_ids),
        }
    return {
        "num_scheduled": dict(so.num_scheduled_tokens),
        "total": so.total_num_scheduled_tokens,
        "new": {n.req_id: (list(n.block_ids[0]), n.num_computed_tokens)
                for n in so.scheduled_new_reqs},
        "cached": {rid: (None if b is None else list(b[0]), nc)
                   for rid, b, nc in zip(c.req_ids, c.new_block_ids, c.num_computed_tokens)},
        "resumed": sorted(getattr(c, "resumed_req_ids", ())),
        "preempted": sorted(so.preempted_req_ids or ()),
        "finished": sorted(so.finished_req_ids),
    }


def norm_eco(eco):
    out = {}
    for outs in eco.values():
        for o in outs.outputs:
            out[o.request_id] = (list(o.new_token_ids),
                                 None if o.finish_reason is None else str(o.finish_reason),
                                 o.stop_reason)
    return out


def default_token(req_id, k):
    return 1000 + int(req_id) * 10 + k


def fake_output(sched, so, token_fn):
    req_ids = list(so.num_scheduled_tokens)
    sampled = []
    for rid in req_ids:
        r = sched.requests[rid]
        sampled.append([token_fn(rid, r.num_output_tokens)]
                       if r.num_computed_tokens >= r.num_tokens else [])
    return make_mro(req_ids, sampled_token_ids=sampled)


def drive(sched, reqs, token_fn=default_token, aborts=None, max_steps=400, exact_blocks=True,
          actions=None):
    for r in reqs:
        sched.add_request(r)
    trace = []
    for step in range(max_steps):
        if not sched.has_requests():
            break
        so = sched.schedule()
        eco = sched.update_from_output(so, fake_output(sched, so, token_fn))
        trace.append((norm_so(so, exact_blocks), norm_eco(eco)))
        if aborts and step in aborts:
            sched.finish_requests(aborts[step], RequestStatus.FINISHED_ABORTED)
        if actions and step in actions:
            trace.append(("action", actions[step](sched)))
    else:
        raise AssertionError("did not finish")
    return trace


def compare(tiny_model, n_steps_min=1, req_kw=None, sched_kw=None, **drive_kw):
    ref, ours = make_pair(tiny_model, **(sched_kw or {}))
    assert isinstance(ours, SchedulerInterface)
    t_ref = drive(ref, make_requests(**req_kw), **drive_kw)
    t_ours = drive(ours, make_requests(**req_kw), **drive_kw)
    for i, (a, b) in enumerate(zip(t_ref, t_ours)):
        if a[0] == "action":
            assert b == a, f"step {i}: action result differs: vllm {a} tandem {b}"
            continue
        assert b[0] == a[0], f"step {i}: SchedulerOutput differs\nvllm:   {a[0]}\ntandem: {b[0]}"
        assert b[1] == a[1], f"step {i}: outputs differ\nvllm:   {a[1]}\ntandem: {b[1]}"
    assert len(t_ours) == len(t_ref)
    assert len(t_ref) >= n_steps_min
    assert ours.get_num_unfinished_requests() == 0
    st = ours.sched.stats()
    assert st.num_running == 0 and st.num_waiting == 0
    ours.shutdown()
    return t_ref


def test_compare__basic_ten_requests(tiny_model):
    compare(tiny_model, req_kw=dict(num_requests=10, num_tokens=10, max_tokens=5))


def test_compare__chunked_prefill_small_budget(tiny_model):
    t = compare(tiny_model, sched_kw=dict(max_num_batched_tokens=64, max_model_len=1024,
                                          max_num_seqs=8),
                req_kw=dict(num_requests=6, num_tokens=100, max_tokens=4))
    assert any(s["total"] == 64 for s, _ in t if s != "action")


def test_compare__long_prefill_threshold(tiny_model):
    compare(tiny_model, sched_kw=dict(max_num_batched_tokens=256, max_model_len=1024,
                                      long_prefill_token_threshold=40),
            req_kw=dict(num_requests=4, num_tokens=90, max_tokens=3))


def test_compare__max_num_seqs_cap(tiny_model):
    compare(tiny_model, sched_kw=dict(max_num_seqs=2),
            req_kw=dict(num_requests=5, num_tokens=8, max_tokens=3))


def test_compare__preemption_when_blocks_run_out(tiny_model):
    # Block counts, not ids: after a free, Tandem puts unhashed blocks at the head of the
    # free queue (reused first, so that cached blocks live longer) where vLLM appends them
    # at the tail, so the ids handed out next differ. Everything else must be identical.
    t = compare(exact_blocks=False,
                tiny_model=tiny_model, sched_kw=dict(num_blocks=11, block_size=4, max_num_seqs=8,
                                          max_num_batched_tokens=128, max_model_len=128,
                                          enable_prefix_caching=False),
                req_kw=dict(num_requests=4, num_tokens=8, max_tokens=12, block_size=4))
    assert any(s["preempted"] for s, _ in t), "the scenario should preempt"
    # Resumed requests: in "resumed" (v1 model runner) or scheduled as new again (v2).
    seen_new = [rid for s, _ in t for rid in s["new"]]
    assert any(s["resumed"] for s, _ in t) or len(seen_new) > len(set(seen_new)), \
        "the scenario should resume a preempted request"


def test_compare__prefix_cache_hits(tiny_model):
    t = compare(tiny_model, sched_kw=dict(max_num_seqs=1),
                req_kw=dict(num_requests=3, num_tokens=40, max_tokens=2, same_prompt=True))
    assert any(nc > 0 for s, _ in t for _, nc in s["new"].values())


def test_compare__stop_token_and_eos(tiny_model):
    def tok(rid, k):
        if rid == "1" and k == 1:
            return 77   # a stop token
        if rid == "2" and k == 2:
            return 50256  # EOS
        return default_token(rid, k)
    compare(tiny_model, req_kw=dict(num_requests=4, num_tokens=6, max_tokens=6,
                                    stop_token_ids=[77]), token_fn=tok)


def test_compare__abort_midway(tiny_model):
    compare(tiny_model, req_kw=dict(num_requests=5, num_tokens=12, max_tokens=8),
            aborts={1: ["1", "3"], 3: ["0"]})


def test_compare__priority_policy(tiny_model):
    compare(tiny_model, sched_kw=dict(policy="priority", max_num_seqs=2),
            req_kw=dict(num_requests=5, num_tokens=8, max_tokens=3,
                        priorities=[3, 1, 2, 0, 1]))


def test_scheduler_cls__resolves_by_qualname():
    from vllm.utils.import_utils import resolve_obj_by_qualname
    cls = resolve_obj_by_qualname("tandem.vllm.TandemScheduler")
    assert issubclass(cls, SchedulerInterface)


def test_tandem_scheduler__connector_attributes_exist(tiny_model):
    _, ours = make_pair(tiny_model)
    assert ours.connector is None and ours.ec_connector is None
    assert ours.get_kv_connector() is None
    assert ours.reset_prefix_cache() is True
    ours.shutdown()


def test_compare__abort_all_with_none(tiny_model):
    def abort_all(s):
        return sorted(r.request_id for r in s.finish_requests(None, RequestStatus.FINISHED_ABORTED))
    compare(tiny_model, req_kw=dict(num_requests=4, num_tokens=20, max_tokens=10),
            actions={2: abort_all})


def test_compare__reset_prefix_cache_with_running_requests(tiny_model):
    def reset(s):
        return s.reset_prefix_cache(reset_running_requests=True)
    compare(tiny_model, sched_kw=dict(max_num_seqs=4),
            req_kw=dict(num_requests=4, num_tokens=20, max_tokens=6, same_prompt=True),
            actions={2: reset})


def test_compare__reset_prefix_cache_refused_while_running(tiny_model):
    def reset(s):
        return s.reset_prefix_cache()
    compare(tiny_model, req_kw=dict(num_requests=2, num_tokens=20, max_tokens=6),
            actions={1: reset})


def test_compare__block_filled_in_decode_is_hit_by_its_hash(tiny_model):
    """Request 0's second block fills during decode; request 1 (admitted after it, one seq at a
    time) repeats request 0's prompt and outputs, so vLLM hits both blocks by their hashes.
    Tandem gets the same hit only from the digest the adapter appends after the update."""
    p0 = [5] * 20
    p1 = p0 + [default_token("0", k) for k in range(13)] + [9]
    t = compare(tiny_model, sched_kw=dict(max_num_seqs=1),
                req_kw=dict(num_requests=2, max_tokens=14, prompts=[p0, p1]))
    assert any(rid == "1" and nc == 32 for s, _ in t for rid, (_, nc) in s["new"].items())
