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


def run_with(tiny_model, tandem, monkeypatch):
    """run_engine's loop on an engine whose VllmConfig carries the "tandem" entry."""
    import test_engine_core
    orig = test_engine_core.make_configs

    def patched(*a, **kw):
        vc, kv = orig(*a, **kw)
        vc.additional_config = {"tandem": tandem}
        return vc, kv
    monkeypatch.setattr(test_engine_core, "make_configs", patched)
    return run_engine(tiny_model, "tandem.vllm.TandemScheduler")


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
