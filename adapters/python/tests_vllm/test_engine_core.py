"""TandemScheduler inside vLLM's real EngineCore, selected the way `--scheduler-cls` selects it
(SchedulerConfig.scheduler_cls = "tandem.vllm.TandemScheduler"), with a fake executor in place
of the model (no GPU, no weights): EngineCore builds the KV cache config from the executor's
specs and memory, constructs the scheduler with its own arguments, and its step() loop runs
requests to completion. The same loop with vLLM's default Scheduler gives the same tokens.
With async scheduling on (vLLM's default), EngineCore runs its batch queue of two
(step_with_batch_queue: schedule N+1 before update N) with TandemScheduler and with vLLM's
AsyncScheduler, and both give the tokens, events and stats of the sync run."""
from concurrent.futures import Future

import pytest
import torch

from conftest import make_configs, make_mro, make_requests

from vllm.v1.engine.core import EngineCore
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec

BLOCK = 16
NUM_BLOCKS = 256


class FakeExecutor(Executor):
    """Answers EngineCore's worker RPCs; its 'model' samples 1000 + 10·request + position."""

    def _init_executor(self) -> None:
        self.spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1,
                                      dtype=torch.float32)

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False):
        name = method if isinstance(method, str) else getattr(method, "__name__", "")
        answers = {
            "get_kv_cache_spec": {"model.layers.0.self_attn.attn": self.spec},
            "get_supported_kv_cache_layouts": None,
            "determine_available_memory": self.spec.page_size_bytes * NUM_BLOCKS,
            "get_kv_connector_handshake_metadata": None,
        }
        out = [] if name == "compile_or_warm_up_model" else [answers.get(name)]
        if non_block:
            f = Future()
            f.set_result(out)
            return f
        return out

    def get_supported_kv_cache_layouts(self):
        return [["LBNHC"]]

    def set_kv_cache_layout(self, *a, **kw):
        return None

    def execute_model(self, scheduler_output, non_block=False):
        self._last = scheduler_output
        f = Future()
        f.set_result(None)
        return f if non_block else None

    def sample_tokens(self, grammar_output, non_block=False):
        so = self._last
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            r = self.engine.scheduler.requests.get(rid)
            # The step samples unless it is a prompt chunk; its output index counts the
            # outputs still in flight (async scheduling: this step's placeholder included).
            done = r is not None and not r.is_prefill_chunk
            k = r.num_output_tokens + max(0, r.num_output_placeholders - 1) if done else 0
            sampled.append([1000 + int(rid) * 10 + k] if done else [])
        out = make_mro(ids, sampled_token_ids=sampled)
        if non_block:
            f = Future()
            f.set_result(out)
            return f
        return out

    def check_health(self) -> None:
        return None


def run_engine(tiny_model, scheduler_cls, log_stats=False, async_scheduling=False):
    vc, _ = make_configs(tiny_model, max_num_seqs=4, max_num_batched_tokens=256,
                         max_model_len=256, async_scheduling=async_scheduling)
    vc.scheduler_config.scheduler_cls = scheduler_cls
    vc.cache_config.num_gpu_blocks = None
    core = EngineCore(vc, FakeExecutor, log_stats=log_stats)
    core.model_executor.engine = core
    assert core.batch_queue_size == (2 if async_scheduling else 1)
    reqs = make_requests(6, num_tokens=40, max_tokens=5)
    for r in reqs:
        core.add_request(r)
    produced = {r.request_id: [] for r in reqs}
    finished = {}
    events = {r.request_id: [] for r in reqs}
    stats = []
    for _ in range(200):
        if not core.scheduler.has_requests():
            break
        outs, _ = core.step()
        for eco in outs.values():
            if eco.scheduler_stats is not None:
                p = eco.scheduler_stats.prefix_cache_stats
                stats.append((eco.scheduler_stats.num_running_reqs,
                              eco.scheduler_stats.num_waiting_reqs, p.requests, p.queries,
                              p.hits))
            for o in eco.outputs:
                events[o.request_id] += [e.type for e in (o.events or ())]
                produced[o.request_id] += o.new_token_ids
                if o.finish_reason is not None:
                    finished[o.request_id] = str(o.finish_reason)
    sched = core.scheduler
    core.shutdown()
    if log_stats:
        return sched, produced, finished, events, stats
    return sched, produced, finished


def test_engine_core__runs_tandem_scheduler_by_qualname(tiny_model):
    sched, produced, finished = run_engine(tiny_model, "tandem.vllm.TandemScheduler")
    from tandem.vllm import TandemScheduler
    assert isinstance(sched, TandemScheduler)
    assert sched.tandem_config["num_blocks"] == NUM_BLOCKS
    assert all(len(v) == 5 for v in produced.values()), produced
    assert set(finished.values()) == {"length"}
    _, ref_produced, ref_finished = run_engine(tiny_model, None)
    assert produced == ref_produced and finished == ref_finished


def test_engine_core__log_stats_events_and_stats_as_vllm(tiny_model):
    _, produced, finished, events, stats = run_engine(tiny_model, "tandem.vllm.TandemScheduler",
                                                      log_stats=True)
    _, r_produced, r_finished, r_events, r_stats = run_engine(tiny_model, None, log_stats=True)
    assert produced == r_produced and finished == r_finished
    assert events == r_events and all(ev[:2] == [1, 2] for ev in events.values())
    assert stats == r_stats


def test_engine_core__async_scheduling_batch_queue_as_async_scheduler(tiny_model):
    from tandem.vllm import TandemScheduler
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    sched, produced, finished, events, stats = run_engine(
        tiny_model, "tandem.vllm.TandemScheduler", log_stats=True, async_scheduling=True)
    assert isinstance(sched, TandemScheduler) and sched.tandem_config["async_scheduling"]
    ref, r_produced, r_finished, r_events, r_stats = run_engine(
        tiny_model, None, log_stats=True, async_scheduling=True)
    assert isinstance(ref, AsyncScheduler)
    assert produced == r_produced and finished == r_finished
    assert events == r_events and stats == r_stats
    # the tokens are those of the sync run (each position's token is the same function)
    _, s_produced, s_finished = run_engine(tiny_model, "tandem.vllm.TandemScheduler")
    assert produced == s_produced and finished == s_finished
    assert all(len(v) == 5 for v in produced.values()), produced


def test_start_up__pipeline_parallel_and_async_drafts_refused_with_a_message(tiny_model):
    from tandem.vllm import TandemScheduler
    from vllm.v1.structured_output import StructuredOutputManager
    vc, kv = make_configs(tiny_model, async_scheduling=True)
    vc.__dict__["speculative_config"] = object()   # any speculative decoding
    with pytest.raises(ValueError, match="--no-async-scheduling"):
        TandemScheduler(vllm_config=vc, kv_cache_config=kv, block_size=16,
                        structured_output_manager=StructuredOutputManager(vc))
    vc, kv = make_configs(tiny_model)
    vc.parallel_config.pipeline_parallel_size = 2
    with pytest.raises(ValueError, match="pipeline-parallel"):
        TandemScheduler(vllm_config=vc, kv_cache_config=kv, block_size=16,
                        structured_output_manager=StructuredOutputManager(vc))
