"""TandemScheduler's metrics and request options against vLLM's own Scheduler on the same
scenario (hand-built ModelRunnerOutputs, no model): request events (QUEUED, SCHEDULED,
PREEMPTED) carried on EngineCoreOutput.events, Request.prefill_stats (cached tokens, vLLM
0.32+), SchedulerStats and PrefixCacheStats step by step; requests of a kind Tandem does not
schedule finished with an error while the others are served; max_loras, repetition_detection
and prompt_logprobs (no prefix-cache reads) honoured."""
from conftest import EOS_TOKEN_ID, make_configs, make_pair, make_requests

from vllm.config import LoRAConfig
from vllm.lora.request import LoRARequest
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.utils.hashing import sha256

from test_vllm_compare import default_token, fake_output, norm_eco, norm_so


def stats_view(st):
    if st is None:
        return None
    p = st.prefix_cache_stats
    return {"running": st.num_running_reqs, "waiting": st.num_waiting_reqs,
            "skipped": st.num_skipped_waiting_reqs,
            "kv_usage": round(st.kv_cache_usage, 9),
            "prefix": (p.requests, p.queries, p.hits, p.preempted_requests,
                       p.preempted_queries, p.preempted_hits, p.reset)}


def prefill_view(ps):
    if ps is None:
        return None
    return (ps.num_prompt_tokens, ps.num_computed_tokens, ps.num_cached_tokens,
            ps.num_local_cached_tokens, ps.num_external_cached_tokens,
            ps.num_cache_creation_tokens)


def run_metrics(sched, reqs, token_fn=default_token, max_steps=400, actions=None):
    """Per step: SchedulerStats, and per output its event types, prefill stats, tokens."""
    for r in reqs:
        sched.add_request(r)
    trace = []
    for step in range(max_steps):
        if not sched.has_requests():
            break
        so = sched.schedule()
        eco = sched.update_from_output(so, fake_output(sched, so, token_fn))
        outs = {}
        stats = None
        for e in eco.values():
            if e.scheduler_stats is not None:
                stats = stats_view(e.scheduler_stats)
            for o in e.outputs:
                outs[o.request_id] = (
                    [ev.type for ev in (o.events or ())],
                    prefill_view(getattr(o, "prefill_stats", None)),
                    list(o.new_token_ids), None if o.finish_reason is None else str(o.finish_reason))
        trace.append((norm_so(so, exact_blocks=False), outs, stats))
        if actions and step in actions:
            actions[step](sched)
    else:
        raise AssertionError("did not finish")
    return trace


def compare_metrics(tiny_model, sched_kw, req_kw, **kw):
    ref, ours = make_pair(tiny_model, **sched_kw)
    a = run_metrics(ref, make_requests(**req_kw), **kw)
    b = run_metrics(ours, make_requests(**req_kw), **kw)
    for i, (x, y) in enumerate(zip(a, b)):
        assert y[0] == x[0], f"step {i}: SchedulerOutput differs\nvllm:   {x[0]}\ntandem: {y[0]}"
        assert y[1] == x[1], f"step {i}: outputs differ\nvllm:   {x[1]}\ntandem: {y[1]}"
        assert y[2] == x[2], f"step {i}: SchedulerStats differ\nvllm:   {x[2]}\ntandem: {y[2]}"
    assert len(a) == len(b)
    ours.shutdown()
    return a


def test_metrics__prefix_hits_events_prefill_stats(tiny_model):
    t = compare_metrics(tiny_model, dict(max_num_seqs=1),
                        dict(num_requests=3, num_tokens=40, max_tokens=2, same_prompt=True))
    firsts = [o for _, outs, _ in t for o in outs.values() if o[1] is not None]
    assert len(firsts) == 3 and any(p[2] > 0 for _, p, _, _ in firsts), firsts
    assert all(ev[:2] == [1, 2] for ev, _, _, _ in firsts)   # QUEUED, SCHEDULED
    assert any(st and st["prefix"][0] > 0 and st["prefix"][2] > 0 for _, _, st in t)


def test_metrics__preemption_events_and_stats(tiny_model):
    t = compare_metrics(tiny_model, dict(num_blocks=11, block_size=4, max_num_seqs=8,
                                         max_num_batched_tokens=128, max_model_len=128),
                        dict(num_requests=4, num_tokens=8, max_tokens=12, block_size=4))
    assert any(s["preempted"] for s, _, _ in t)
    assert any(3 in ev for _, outs, _ in t for ev, _, _, _ in outs.values())  # PREEMPTED
    assert any(st and st["prefix"][3] > 0 for _, _, st in t)   # preempted_requests


def test_metrics__chunked_prefill_and_waiting_counts(tiny_model):
    compare_metrics(tiny_model, dict(max_num_batched_tokens=64, max_model_len=1024,
                                     max_num_seqs=2),
                    dict(num_requests=5, num_tokens=100, max_tokens=3))


def test_metrics__reset_prefix_cache_flag(tiny_model):
    def reset(s):
        assert s.reset_prefix_cache(reset_running_requests=True)
    compare_metrics(tiny_model, dict(max_num_seqs=4),
                    dict(num_requests=3, num_tokens=20, max_tokens=5, same_prompt=True),
                    actions={1: reset})


# ---- request kinds and options ---------------------------------------------------------------

def _request(rid, prompt, block_size=16, **sp_kw):
    sp = SamplingParams(max_tokens=sp_kw.pop("max_tokens", 4), **sp_kw)
    sp.update_from_generation_config({}, EOS_TOKEN_ID)
    return Request(request_id=str(rid), prompt_token_ids=list(prompt), sampling_params=sp,
                   pooling_params=None, block_hasher=get_request_block_hasher(block_size, sha256),
                   arrival_time=1000.0 + int(rid) * 1e-3)


def _drive(sched, reqs, token_fn=default_token, max_steps=200, exact_blocks=True):
    for r in reqs:
        sched.add_request(r)
    trace, final = [], {}
    for _ in range(max_steps):
        if not sched.has_requests():
            break
        so = sched.schedule()
        eco = sched.update_from_output(so, fake_output(sched, so, token_fn))
        trace.append((norm_so(so, exact_blocks), norm_eco(eco)))
        for e in eco.values():
            for o in e.outputs:
                if o.finish_reason is not None:
                    final[o.request_id] = o
    else:
        raise AssertionError("did not finish")
    return trace, final


def test_unsupported_kinds__finished_with_error_engine_keeps_serving(tiny_model):
    from vllm.sampling_params import StructuredOutputsParams
    _, ours = make_pair(tiny_model)
    good = make_requests(3, num_tokens=12, max_tokens=4)
    sp = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(regex="a+"))
    sp.update_from_generation_config({}, EOS_TOKEN_ID)
    grammar = Request(request_id="10", prompt_token_ids=[5] * 12, sampling_params=sp,
                      pooling_params=None)
    pooling = Request(request_id="11", prompt_token_ids=[6] * 12, sampling_params=None,
                      pooling_params=PoolingParams())
    embeds = Request(request_id="12", prompt_token_ids=None, sampling_params=SamplingParams(),
                     pooling_params=None, prompt_embeds=__import__("torch").zeros(4, 8))
    reqs = [good[0], grammar, good[1], pooling, embeds, good[2]]
    trace, final = _drive(ours, reqs)
    for rid in ("10", "11", "12"):
        o = final[rid]
        assert str(o.finish_reason) == "error" and o.new_token_ids == []
        if hasattr(o, "error"):
            assert o.error is not None and o.error.code == "validation_error"
            assert "TandemScheduler does not schedule" in o.error.message
        assert not ours.has_request(rid)
    # The others ran exactly as vLLM runs them alone.
    ref, _ = make_pair(tiny_model)
    ref_trace, ref_final = _drive(ref, make_requests(3, num_tokens=12, max_tokens=4))
    assert {k: str(v.finish_reason) for k, v in final.items() if k in ("0", "1", "2")} == \
        {k: str(v.finish_reason) for k, v in ref_final.items()}
    toks = lambda tr: {rid: sum((o[rid][0] for _, o in tr if rid in o), []) for rid in "012"}
    assert toks(trace) == toks(ref_trace)
    assert ours.get_num_unfinished_requests() == 0
    ours.shutdown()


def test_repetition_detection__as_vllm(tiny_model):
    from vllm.sampling_params import RepetitionDetectionParams
    rep = RepetitionDetectionParams(max_pattern_size=2, min_count=3)

    def tok(rid, k):
        return 500 + (k % 2) if rid == "1" else default_token(rid, k)

    def reqs():
        return [_request(0, [1] * 10, max_tokens=10, repetition_detection=rep),
                _request(1, [2] * 10, max_tokens=10, repetition_detection=rep),
                _request(2, [3] * 10, max_tokens=10, repetition_detection=rep, min_tokens=8)]
    ref, ours = make_pair(tiny_model)
    a, fa = _drive(ref, reqs(), tok)
    b, fb = _drive(ours, reqs(), tok)
    assert b == a
    assert fa["1"].stop_reason == "repetition_detected" and fb["1"].stop_reason == fa["1"].stop_reason
    ours.shutdown()


def test_prompt_logprobs__skips_prefix_cache_reads(tiny_model):
    def reqs():
        return [_request(0, [4] * 40, max_tokens=2), _request(1, [4] * 40, max_tokens=2,
                                                              prompt_logprobs=1),
                _request(2, [4] * 40, max_tokens=2)]
    # Block counts, not ids: request 1 computes its own copies of the prompt's blocks, and
    # the two pools order the freed copies differently (see test_vllm_compare's preemption
    # test); the prefix hits themselves must be identical.
    ref, ours = make_pair(tiny_model, max_num_seqs=1)
    a, _ = _drive(ref, reqs(), exact_blocks=False)
    b, _ = _drive(ours, reqs(), exact_blocks=False)
    assert b == a
    hits = {rid: nc for s, _ in b for rid, (_, nc) in s["new"].items()}
    assert hits["1"] == 0 and hits["2"] > 0
    ours.shutdown()


def test_max_loras__honoured_as_vllm(tiny_model):
    def build(cls):
        vc, kv = make_configs(tiny_model, max_num_seqs=8)
        vc.lora_config = LoRAConfig(max_loras=1, max_lora_rank=8)
        return cls(vllm_config=vc, kv_cache_config=kv, log_stats=True, block_size=16,
                   structured_output_manager=StructuredOutputManager(vc))

    def reqs():
        out = []
        for i, lid in enumerate((1, 2, 1, 2, 0)):
            r = _request(i, [10 + i] * 12, max_tokens=3)
            if lid:
                r.lora_request = LoRARequest(f"l{lid}", lid, "/nonexistent")
            out.append(r)
        return out
    from tandem.vllm import TandemScheduler
    ref, ours = build(Scheduler), build(TandemScheduler)
    a, _ = _drive(ref, reqs())
    b, _ = _drive(ours, reqs())
    assert b == a
    first = a[0][0]["num_scheduled"]
    assert "1" not in first and "3" not in first and "0" in first and "2" in first
    ours.shutdown()
