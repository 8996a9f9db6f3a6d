"""The Tandem configuration from vLLM's command line, through vLLM's real EngineCore:
VllmConfig.additional_config (what `--additional-config '{"tandem": ...}'` fills) reaches
TandemScheduler, which applies every kind of Tandem setting (slo_adaptive, decode-first with a
TBT target, a `tandem tune --out` file), refuses keys that contradict the engine vLLM built
and bad values at start-up naming the key, and writes the per-step CSV that `tandem fit`
reads. Without a "tandem" entry the engine runs exactly as before (test_engine_core)."""
import csv
import json

import pytest

from conftest import make_configs
from test_engine_core import FakeExecutor, NUM_BLOCKS, run_engine

from vllm.v1.engine.core import EngineCore


def engine_with(tiny_model, tandem):
    vc, _ = make_configs(tiny_model, max_num_seqs=4, max_num_batched_tokens=256,
                         max_model_len=256)
    vc.scheduler_config.scheduler_cls = "tandem.vllm.TandemScheduler"
    vc.cache_config.num_gpu_blocks = None
    vc.additional_config = {"tandem": tandem}
    return vc


def run_with(tiny_model, tandem, monkeypatch, scheduler_cls="tandem.vllm.TandemScheduler",
             **kw):
    """run_engine's loop on an engine whose VllmConfig carries the "tandem" entry."""
    import test_engine_core
    orig = test_engine_core.make_configs

    def patched(*a, **kw):
        vc, kv = orig(*a, **kw)
        vc.additional_config = {"tandem": tandem}
        return vc, kv
    monkeypatch.setattr(test_engine_core, "make_configs", patched)
    return run_engine(tiny_model, scheduler_cls, **kw)


@pytest.mark.parametrize("tandem,want", [
    ({"policy": "slo_adaptive", "slo_ttft_ms": 300, "slo_tpot_ms": 25},
     {"policy": "slo_adaptive", "slo_ttft_ms": 300}),
    ({"mode": "decode_first", "tbt_target_ms": 40, "max_num_batched_tokens": 128},
     {"mode": "decode_first", "tbt_target_ms": 40, "max_num_batched_tokens": 128}),
])
def test_engine_core__tandem_policies_from_additional_config(tiny_model, monkeypatch, tandem, want):
    sched, produced, finished = run_with(tiny_model, tandem, monkeypatch)
    for k, v in want.items():
        assert sched.tandem_config[k] == v
    assert sched.tandem_config["num_blocks"] == NUM_BLOCKS     # still the engine's
    assert all(len(v) == 5 for v in produced.values()), produced
    assert set(finished.values()) == {"length"}


def test_engine_core__tune_out_file_and_steps_csv(tiny_model, monkeypatch, tmp_path):
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"name": "tuned", "scheduler": {
        "mode": "decode_first", "tbt_target_ms": 30, "max_num_batched_tokens": 64,
        "long_prefill_token_threshold": 32}}))
    steps = tmp_path / "steps.csv"
    sched, produced, finished = run_with(
        tiny_model, {"config": str(best), "steps_csv": str(steps)}, monkeypatch)
    assert (sched.tandem_config["mode"], sched.tandem_config["max_num_batched_tokens"]) == \
        ("decode_first", 64)
    assert all(len(v) == 5 for v in produced.values())
    rows = list(csv.DictReader(steps.open()))     # closed by EngineCore.shutdown
    assert rows, "no steps recorded"
    # 6 prompts of 40 tokens and 4 decodes each (the 5th token comes with the prompt's end)
    assert sum(int(r["prefill_tokens"]) for r in rows) == 6 * 40
    assert sum(int(r["decode_reqs"]) for r in rows) == 6 * 4
    assert sum(int(r["emit_seqs"]) for r in rows) == 6 * 5
    assert all(int(r["batch_tokens"]) <= 64 and float(r["duration_s"]) > 0 for r in rows)
    assert [int(r["step"]) for r in rows] == list(range(1, len(rows) + 1))


@pytest.mark.parametrize("tandem,needle", [
    ({"block_size": 32}, "tandem.block_size: 32 differs"),
    ({"max_num_batched_tokens": 512}, "tandem.max_num_batched_tokens: 512 exceeds"),
    ({"policy": "lifo"}, "policy: \"lifo\" is not one of"),
    ({"tbt_target_ms": "soon"}, "tbt_target_ms"),
    ({"colour": 1}, "unknown key \"colour\""),
    ("/nonexistent/best.json", "tandem.config: cannot read /nonexistent/best.json"),
])
def test_engine_core__bad_tandem_config_fails_start_up_naming_the_key(tiny_model, tandem, needle):
    vc = engine_with(tiny_model, tandem)
    with pytest.raises(ValueError) as e:
        EngineCore(vc, FakeExecutor, log_stats=False)
    assert needle in str(e.value)


# ---- RecordingScheduler: vLLM's own scheduler recording its steps --------------------------------

def check_steps(rows, max_batch=256):
    # 6 prompts of 40 tokens and 4 decodes each (the 5th token comes with the prompt's end)
    assert rows, "no steps recorded"
    assert sum(int(r["prefill_tokens"]) for r in rows) == 6 * 40
    assert sum(int(r["decode_reqs"]) for r in rows) == 6 * 4
    assert sum(int(r["emit_seqs"]) for r in rows) == 6 * 5
    assert all(int(r["batch_tokens"]) <= max_batch and float(r["duration_s"]) > 0 for r in rows)
    assert [int(r["step"]) for r in rows] == list(range(1, len(rows) + 1))
    assert int(rows[0]["running"]) >= 1 and 0 < float(rows[0]["kv_usage"]) <= 1


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_recording_scheduler__vllm_decisions_and_the_steps_csv(tiny_model, monkeypatch, tmp_path,
                                                              async_scheduling):
    from tandem.vllm import RecordingScheduler
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    steps = tmp_path / "steps.csv"
    sched, produced, finished = run_with(
        tiny_model, {"steps_csv": str(steps)}, monkeypatch, "tandem.vllm.RecordingScheduler",
        async_scheduling=async_scheduling)
    assert isinstance(sched, RecordingScheduler) and isinstance(sched, Scheduler)
    assert isinstance(sched, AsyncScheduler) == async_scheduling   # the class vLLM would pick
    monkeypatch.undo()
    _, ref_produced, ref_finished = run_engine(tiny_model, None, async_scheduling=async_scheduling)
    assert produced == ref_produced and finished == ref_finished   # vLLM's own decisions
    rows = list(csv.DictReader(steps.open()))     # closed by EngineCore.shutdown
    check_steps(rows)
    # the same rows as TandemScheduler in parity records for the same run (durations aside)
    tsteps = tmp_path / "tandem.csv"
    run_with(tiny_model, {"steps_csv": str(tsteps)}, monkeypatch,
             async_scheduling=async_scheduling)
    shape = ("prefill_tokens", "prefill_reqs", "decode_reqs", "decode_context_tokens",
             "batch_tokens", "emit_seqs", "prefill_attn", "running")
    assert [[r[k] for k in shape] for r in rows] == \
        [[r[k] for k in shape] for r in csv.DictReader(tsteps.open())]


def test_recording_scheduler__without_a_tandem_entry_records_nothing(tiny_model):
    from vllm.v1.core.sched.scheduler import Scheduler
    sched, produced, finished = run_engine(tiny_model, "tandem.vllm.RecordingScheduler")
    assert sched.steps_csv is None
    assert "schedule" not in vars(sched)     # nothing wrapped: vLLM's methods as they are
    assert type(sched).schedule is Scheduler.schedule
    assert set(finished.values()) == {"length"}


@pytest.mark.parametrize("tandem,needle", [
    ({"policy": "slo_adaptive"}, "tandem.policy: tandem.vllm.RecordingScheduler runs vLLM's own"),
    ({"steps_csv": "s.csv", "config": "best.json"}, "tandem.config: tandem.vllm.Recording"),
    ({"steps_csv": 3}, "tandem.steps_csv: expected the path"),
    ("best.json", "tandem.config: tandem.vllm.RecordingScheduler"),
    ({"steps_csv": "/nonexistent/dir/s.csv"}, "tandem.steps_csv: cannot write"),
])
def test_recording_scheduler__other_keys_fail_start_up_naming_the_key(tiny_model, tandem, needle):
    vc = engine_with(tiny_model, tandem)
    vc.scheduler_config.scheduler_cls = "tandem.vllm.RecordingScheduler"
    with pytest.raises(ValueError) as e:
        EngineCore(vc, FakeExecutor, log_stats=False)
    assert needle in str(e.value)
