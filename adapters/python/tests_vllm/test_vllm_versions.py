"""What TandemScheduler and TandemConnector do differently per vLLM release, checked on the
installed one: the start-up refusals of options the adapter does not reproduce (each naming
the flag), the single warning for a vLLM newer than the tested range, vLLM 0.34's
--max-num-inflight-kv-loads passed to the library, AsyncScheduler's decode cadence with one
pipeline stage, vLLM 0.34's
per-request prefix-hit limit and resumed requests sent whole (NewRequestData with
prefill_token_ids), outputs in another order than the scheduled one, and the connector's
capability hooks."""
import logging
from types import SimpleNamespace

import pytest

from conftest import make_configs, make_mro, make_pair, make_requests

from vllm.config import SchedulerConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.core.sched.output import CachedRequestData
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from tandem.vllm import scheduler as tsched
from tandem.vllm import TandemScheduler

SC_FIELDS = getattr(SchedulerConfig, "__dataclass_fields__", {})


def build(tiny_model, **kw):
    vc, kv = make_configs(tiny_model, **kw)
    return TandemScheduler(vllm_config=vc, kv_cache_config=kv, block_size=kw.get("block_size", 16),
                           structured_output_manager=StructuredOutputManager(vc))


@pytest.mark.parametrize("field,value,flag", [
    ("prefill_schedule_interval", 2, "--prefill-schedule-interval"),
    ("long_prefill_token_threshold_adaptive", True, "--long-prefill-token-threshold-adaptive"),
])
def test_refuses_unmatched_options_naming_the_flag(tiny_model, field, value, flag):
    if field not in SC_FIELDS:
        pytest.skip(f"this vLLM has no {field}")
    with pytest.raises(ValueError, match=flag):
        build(tiny_model, long_prefill_token_threshold=16 if "threshold" in field else 0,
              sched_extra={field: value})
    build(tiny_model)    # the defaults start


def test_refuses_pipeline_parallelism_and_async_with_spec_naming_the_flags():
    def cfg(pp=1, async_=False, spec=None):
        return SimpleNamespace(
            scheduler_config=SimpleNamespace(async_scheduling=async_),
            parallel_config=SimpleNamespace(pipeline_parallel_size=pp),
            speculative_config=spec, num_lookahead_tokens=0)
    with pytest.raises(ValueError, match="--no-async-scheduling.*--pipeline-parallel-size 1"):
        tsched._refuse_unmatched(cfg(pp=2))                # synchronous PP
    tsched._refuse_unmatched(cfg(pp=2, async_=True))    # PP with async scheduling: fine
    with pytest.raises(ValueError, match="--no-async-scheduling"):
        tsched._refuse_unmatched(cfg(async_=True, spec=object()))
    tsched._refuse_unmatched(cfg(spec=object()))      # spec decoding without async: fine
    tsched._refuse_unmatched(cfg(async_=True))


def test_newer_vllm_warns_once_naming_the_tested_versions(tiny_model, monkeypatch, caplog):
    import vllm
    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    monkeypatch.setattr(tsched, "_warned_newer", False)
    with caplog.at_level(logging.WARNING, logger="tandem.vllm"):
        build(tiny_model).shutdown()
        build(tiny_model).shutdown()
    msgs = [r.getMessage() for r in caplog.records if r.name == "tandem.vllm"]
    assert len(msgs) == 1, msgs
    assert "0.31, 0.32, 0.33, 0.34" in msgs[0] and "0.99.0" in msgs[0]


def test_tested_vllm_does_not_warn(tiny_model, monkeypatch, caplog):
    monkeypatch.setattr(tsched, "_warned_newer", False)
    with caplog.at_level(logging.WARNING, logger="tandem.vllm"):
        build(tiny_model).shutdown()
    assert tsched._vllm_version() <= tsched.TESTED_VLLM[-1]
    assert not [r for r in caplog.records if r.name == "tandem.vllm"]


def test_prefix_hit_limit_matches_vllm(tiny_model):
    """A request whose prefix-cache reads are bounded gets the same (whole-block) hit as
    under vLLM: bounded by prompt_logprob_start on 0.34, unbounded with it (and
    skip_reading_prefix_cache=False) before, none with prompt logprobs alone."""
    kw = dict(prompt_logprobs=1)
    if "prompt_logprob_start" in SamplingParams.__struct_fields__:
        kw.update(prompt_logprob_start=40, skip_reading_prefix_cache=False)
    hits = []
    for sched in make_pair(tiny_model):
        a = make_requests(1, num_tokens=70, same_prompt=True, max_tokens=2)[0]
        sched.add_request(a)
        for _ in range(4):
            so = sched.schedule()
            sched.update_from_output(so, make_mro(list(so.num_scheduled_tokens),
                                                  [[5]] * len(so.num_scheduled_tokens)))
        sp = SamplingParams(max_tokens=2, **kw)
        sp.update_from_generation_config({}, 50256)
        b = Request(request_id="1", prompt_token_ids=[0] * 70, sampling_params=sp,
                    pooling_params=None, block_hasher=get_request_block_hasher(16, sha256),
                    arrival_time=2000.0)
        sched.add_request(b)
        so = sched.schedule()
        hits.append({n.req_id: n.num_computed_tokens for n in so.scheduled_new_reqs})
    assert hits[0] == hits[1]
    if hasattr(Request, "get_prefix_cache_hit_limit"):
        expected = 32      # 0.34: hits bounded to whole blocks within 40 tokens
    elif "prompt_logprob_start" in SamplingParams.__struct_fields__:
        expected = 64      # a start and skip_reading_prefix_cache=False: unbounded before 0.34
    else:
        expected = 0       # prompt logprobs: no reads
    assert hits[0] == {"1": expected}


def test_resumed_requests_are_sent_whole_when_vllm_has_no_resumed_ids(tiny_model):
    """vLLM 0.34 (no CachedRequestData.resumed_req_ids): a request resumed after preemption
    comes again as NewRequestData whose prefill_token_ids are all its tokens."""
    if "resumed_req_ids" in getattr(CachedRequestData, "__dataclass_fields__", {}):
        pytest.skip("this vLLM lists resumed requests in CachedRequestData")
    sched = build(tiny_model, num_blocks=11, block_size=4, max_num_seqs=8,
                  max_num_batched_tokens=128, max_model_len=128, enable_prefix_caching=False)
    for r in make_requests(4, num_tokens=8, max_tokens=12, block_size=4):
        sched.add_request(r)
    seen, resumed = set(), 0
    for _ in range(200):
        if not sched.has_requests():
            break
        so = sched.schedule()
        for n in so.scheduled_new_reqs:
            if n.req_id in seen:
                resumed += 1
                assert list(n.prefill_token_ids) == list(sched.requests[n.req_id].all_token_ids)
                assert len(n.prefill_token_ids) > 8      # prompt and outputs
            seen.add(n.req_id)
        ids = list(so.num_scheduled_tokens)
        sampled = [[9] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens
                   else [] for r in ids]
        sched.update_from_output(so, make_mro(ids[::-1], sampled[::-1]))   # reversed order
    assert resumed > 0
    assert not sched.has_requests()


def test_outputs_in_another_order_are_applied_by_request_id(tiny_model):
    ref, ours = make_pair(tiny_model)
    streams = []
    for sched in (ref, ours):
        for r in make_requests(5, num_tokens=10, max_tokens=3):
            sched.add_request(r)
        out = {}
        while sched.has_requests():
            so = sched.schedule()
            ids = list(so.num_scheduled_tokens)
            sampled = [[100 + int(r)] for r in ids]
            eco = sched.update_from_output(so, make_mro(ids[::-1], sampled[::-1]))
            for e in eco.values():
                for o in e.outputs:
                    out.setdefault(o.request_id, []).extend(o.new_token_ids)
        streams.append(out)
    assert streams[0] == streams[1]
    assert streams[1]["3"] == [103, 103, 103]


def test_connector_capability_hooks(tiny_model):
    from tandem.vllm.connector import TandemConnector
    assert TandemConnector.supports_lookahead_block_hashes(None) is False
    try:
        from vllm.config.kv_transfer import KVCacheAccess
    except ImportError:
        KVCacheAccess = None
    if KVCacheAccess is not None:
        access = TandemConnector.kv_cache_access(None)
        assert KVCacheAccess.REGISTERS in access and access.needs_single_chunk()
    conn = TandemConnector.__new__(TandemConnector)
    assert conn.may_load_async(SimpleNamespace(kv_transfer_params={"do_remote_prefill": True}))
    assert not conn.may_load_async(SimpleNamespace(kv_transfer_params=None))
    assert not conn.may_load_async(SimpleNamespace(kv_transfer_params={"do_remote_decode": True}))


def test_max_num_inflight_kv_loads_is_passed_to_the_library(tiny_model):
    if "max_num_inflight_kv_loads" not in SC_FIELDS:
        pytest.skip("this vLLM has no --max-num-inflight-kv-loads")
    s = build(tiny_model, sched_extra=dict(max_num_inflight_kv_loads=3))
    try:
        assert s.tandem_config["max_inflight_kv_loads"] == 3
        assert "kv_load_queues" not in s.tandem_config   # no KV connector: nothing loads
    finally:
        s.shutdown()
    s = build(tiny_model)
    try:
        assert "max_inflight_kv_loads" not in s.tandem_config
    finally:
        s.shutdown()


@pytest.mark.parametrize("role", ["kv_both", "kv_consumer", "kv_producer"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_defer_block_free_follows_vllm(tiny_model, role, async_scheduling):
    """vLLM 0.33+ defers block frees with overlapping batches and a consumer connector; the
    adapter turns the library's defer_block_free on exactly when vLLM's own scheduler (the
    same configuration) has it on; older vLLMs have neither."""
    import vllm_diff
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    loads = {"role": role, "policy": "recompute"}
    cfg = dict(async_scheduling=async_scheduling,
               kv_transfer_config=vllm_diff.kv_transfer_config(loads))
    vc, kv = make_configs(tiny_model, **cfg)
    kw = dict(vllm_config=vc, kv_cache_config=kv, log_stats=False, block_size=16,
              structured_output_manager=StructuredOutputManager(vc))
    ref = (AsyncScheduler if async_scheduling else Scheduler)(**kw)
    vllm_defers = bool(getattr(ref, "defer_block_free", False))
    assert vllm_defers == (async_scheduling and role != "kv_producer" and
                           hasattr(Scheduler, "_drain_deferred_frees"))
    s = TandemScheduler(**kw)
    try:
        assert bool(s.tandem_config.get("defer_block_free", False)) == vllm_defers
    finally:
        s.shutdown()


def test_async_decode_cadence_never_holds_a_request_with_one_pipeline_stage(tiny_model):
    """vLLM 0.34's AsyncScheduler makes a decode wait until next_decode_eligible_step, set to
    current_step + pipeline_parallel_size when it is scheduled; with one stage that is always
    the next schedule() call, so the gate never holds a request back (with PP the library's
    decode_stagger reproduces it: test_vllm_random's PP groups). Checked on vLLM's own AsyncScheduler: before
    every schedule(), no running request is ineligible for the step it is about to make."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    vc, kv = make_configs(tiny_model, async_scheduling=True, max_num_seqs=4,
                          max_num_batched_tokens=256, num_blocks=200)
    ref = AsyncScheduler(vllm_config=vc, kv_cache_config=kv, block_size=16,
                         structured_output_manager=StructuredOutputManager(vc))
    if not hasattr(ref, "decode_stagger"):
        pytest.skip("this vLLM has no next_decode_eligible_step")
    assert ref.decode_stagger == 1
    for r in make_requests(6, num_tokens=40, max_tokens=12):
        ref.add_request(r)
    pending, checked = [], 0
    for _ in range(200):
        if not ref.has_requests() and not pending:
            break
        for r in ref.running:
            assert r.next_decode_eligible_step <= ref.current_step + 1
            checked += 1
        so = ref.schedule()
        ids = list(so.num_scheduled_tokens)
        toks = [[7] if ref.requests[i].num_computed_tokens >= ref.requests[i].num_tokens else []
                for i in ids]
        pending.append((so, make_mro(ids, toks)))
        if len(pending) == 2 or not so.total_num_scheduled_tokens:
            ref.update_from_output(*pending.pop(0))
    assert checked > 20
