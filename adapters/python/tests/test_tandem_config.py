"""The Tandem configuration from vLLM's command line (tandem/vllm/tandem_config.py) and the
per-step CSV recorder (tandem/vllm/steps_csv.py), without vLLM: vLLM's config objects and
Requests are stood in for by plain namespaces with the attributes the adapter reads."""
import json
from types import SimpleNamespace

import pytest

import tandem
from tandem.vllm import steps_csv, tandem_config
from tandem.vllm.tandem_config import TandemConfigError

from conftest import REPO, build_dir

# What tandem_config_from_vllm returns for a vLLM engine (the keys reconcile() checks).
BASE = {"max_num_batched_tokens": 2048, "max_num_seqs": 64, "max_model_len": 4096,
        "long_prefill_token_threshold": 0, "enable_chunked_prefill": True, "num_blocks": 512,
        "block_size": 16, "enable_prefix_caching": True, "policy": "fcfs",
        "num_lookahead_tokens": 0, "prefix_hash": "sha256", "reserve_full_prompt": False,
        "watermark": 0.0, "continue_after_self_preemption": True, "async_scheduling": False}


def vcfg(extra=None):
    return SimpleNamespace(additional_config={} if extra is None else extra)


def test_configure__no_tandem_entry_keeps_vllm_config():
    for vc in (vcfg(), vcfg({"other_plugin": 1}), SimpleNamespace()):
        cfg, opts = tandem_config.configure(vc, BASE)
        assert cfg is BASE and opts is None


def test_configure__inline_slo_adaptive_applies_over_vllm(needs_scheduler):
    cfg, opts = tandem_config.configure(vcfg({"tandem": {
        "policy": "slo_adaptive", "slo_ttft_ms": 300, "slo_tpot_ms": 25}}), BASE)
    assert opts == {}
    assert cfg["policy"] == "slo_adaptive" and cfg["max_num_seqs"] == 64
    s = tandem_config.create_scheduler(cfg, opts)
    got = s.config
    s.close()
    assert got["policy"] == "slo_adaptive"
    assert got["slo_ttft_ms"] == 300 and got["slo_tpot_ms"] == 25
    assert got["num_blocks"] == 512 and got["block_size"] == 16


def test_configure__decode_first_tbt_and_cost_model(needs_scheduler):
    cm = {"base_us": 900.0, "per_prefill_token_us": 12.5, "per_decode_req_us": 30.0,
          "per_context_token_ns": 2.0, "per_attn_token2_ps": 0.0}
    cfg, opts = tandem_config.configure(vcfg({"tandem": {
        "mode": "decode_first", "tbt_target_ms": 40, "cost_model": cm,
        "max_num_batched_tokens": 1024}}), BASE)
    s = tandem_config.create_scheduler(cfg, opts)
    got = s.config
    s.close()
    assert got["mode"] == "decode_first" and got["tbt_target_ms"] == 40
    assert got["max_num_batched_tokens"] == 1024     # less than vLLM's 2048: allowed


def test_configure__tune_out_wrapper_file(tmp_path, needs_scheduler):
    # the shape `tandem tune --out` writes: the base wrapper with the searched keys set
    f = tmp_path / "best.json"
    f.write_text(json.dumps({"name": "tuned", "description": "x",
                             "scheduler": {"mode": "decode_first", "tbt_target_ms": 30,
                                           "max_num_batched_tokens": 512, "max_num_seqs": 32,
                                           "long_prefill_token_threshold": 256},
                             "deployment": {"mode": "colocated", "instances": 1,
                                            "hw": "h100-sxm", "tp": 1}}))
    for opt in (str(f), {"config": str(f)}):
        cfg, opts = tandem_config.configure(vcfg({"tandem": opt}), BASE)
        assert (cfg["mode"], cfg["tbt_target_ms"], cfg["max_num_batched_tokens"],
                cfg["max_num_seqs"], cfg["long_prefill_token_threshold"]) == \
            ("decode_first", 30, 512, 32, 256)
        tandem_config.create_scheduler(cfg, opts).close()
    # inline keys override the file's
    cfg, _ = tandem_config.configure(vcfg({"tandem": {"config": str(f), "tbt_target_ms": 50}}),
                                     BASE)
    assert cfg["tbt_target_ms"] == 50


def test_configure__repository_configs_load(needs_scheduler):
    # every shipped colocated config is deployable on an engine large enough for it
    big = dict(BASE, max_num_batched_tokens=8192, max_num_seqs=256, max_model_len=8192)
    for name in ("slo-adaptive", "stall-free", "vllm-default", "prefill-first"):
        cfg, opts = tandem_config.configure(
            vcfg({"tandem": str(REPO / "configs" / f"{name}.json")}), big)
        tandem_config.create_scheduler(cfg, opts).close()


@pytest.mark.parametrize("keys,needle", [
    ({"block_size": 32}, "tandem.block_size: 32 differs from this vLLM engine's 16 (set by --block-size)"),
    ({"max_model_len": 8192}, "tandem.max_model_len"),
    ({"async_scheduling": True}, "tandem.async_scheduling"),
    ({"prefix_hash": "xxh3_128"}, "tandem.prefix_hash"),
    ({"max_num_batched_tokens": 8192}, "tandem.max_num_batched_tokens: 8192 exceeds this vLLM engine's 2048 (--max-num-batched-tokens)"),
    ({"max_num_seqs": 65}, "tandem.max_num_seqs: 65 exceeds"),
    ({"num_blocks": 513}, "tandem.num_blocks: 513 exceeds"),
    ({"max_num_seqs": "64"}, "tandem.max_num_seqs: expected an integer"),
])
def test_configure__overlapping_vllm_keys_refused(keys, needle):
    with pytest.raises(TandemConfigError) as e:
        tandem_config.configure(vcfg({"tandem": keys}), BASE)
    assert needle in str(e.value)


def test_configure__overlapping_keys_equal_to_vllm_accepted():
    cfg, _ = tandem_config.configure(vcfg({"tandem": {"block_size": 16, "max_model_len": 4096,
                                                      "num_blocks": 100}}), BASE)
    assert cfg["num_blocks"] == 100


@pytest.mark.parametrize("keys,needle", [
    ({"policy": "lifo"}, "policy: \"lifo\" is not one of"),
    ({"tbt_target_ms": -5}, "tbt_target_ms"),
    ({"slo_ttft_ms": "fast"}, "slo_ttft_ms: expected a number"),
    ({"enable_chunked_prefill": False}, "enable_chunked_prefill"),   # budget < max_model_len
    ({"colour": "red"}, "unknown key \"colour\""),
    ({"cost_model": {"base_us": -1}}, "cost_model.base_us"),
    ({"policy_plugin": {"path": "/nonexistent/plugin.so"}}, "/nonexistent/plugin.so"),
])
def test_create_scheduler__bad_values_fail_naming_the_key(keys, needle, needs_scheduler):
    cfg, opts = tandem_config.configure(vcfg({"tandem": keys}), BASE)
    with pytest.raises(TandemConfigError) as e:
        tandem_config.create_scheduler(cfg, opts)
    assert "the Tandem configuration was refused" in str(e.value)
    assert needle in str(e.value)


def test_create_scheduler__policy_plugin_loads(needs_scheduler):
    so = build_dir() / "tests" / "sched" / "plugin_sjf.so"
    if not so.exists():
        pytest.skip(f"{so} is built by `make tests`")
    cfg, opts = tandem_config.configure(vcfg({"tandem": {"policy_plugin": {"path": str(so)}}}),
                                        BASE)
    s = tandem_config.create_scheduler(cfg, opts)
    try:
        assert s.config["policy"] == "custom"
    finally:
        s.close()


@pytest.mark.parametrize("content,needle", [
    (None, "tandem.config: cannot read"),
    ("{\"policy\": ", "invalid JSON"),
    ("[1]", "expected a JSON object"),
    ('{"scheduler": {}, "deployment": {"mode": "disaggregated"}}', "deployment.mode \"disaggregated\""),
    ('{"scheduler": {}, "deployment": {"instances": 2}}', "deployment.instances 2"),
    ('{"scheduler": {}, "extra": 1}', "unknown key \"extra\""),
    ('{"scheduler": 5}', "\"scheduler\" must be an object"),
])
def test_config_file__errors_name_the_file_and_key(tmp_path, content, needle):
    f = tmp_path / "c.json"
    if content is not None:
        f.write_text(content)
    with pytest.raises(TandemConfigError) as e:
        tandem_config.configure(vcfg({"tandem": str(f)}), BASE)
    assert needle in str(e.value)


def test_options__bad_types():
    with pytest.raises(TandemConfigError, match="expected a path or an object"):
        tandem_config.configure(vcfg({"tandem": 7}), BASE)
    with pytest.raises(TandemConfigError, match="tandem.steps_csv"):
        tandem_config.configure(vcfg({"tandem": {"steps_csv": 3}}), BASE)
    _, opts = tandem_config.configure(vcfg({"tandem": {"steps_csv": "s.csv"}}), BASE)
    assert opts == {"steps_csv": "s.csv"}


# ---- the per-step CSV -------------------------------------------------------------------------

def req(prompt, outputs, computed_after, chunk, placeholders=0):
    return SimpleNamespace(num_computed_tokens=computed_after, is_prefill_chunk=chunk,
                           num_output_tokens=outputs, num_output_placeholders=placeholders,
                           num_prompt_tokens=prompt)


def test_step_shape__classifies_as_the_simulator():
    reqs = {
        "p1": req(100, 0, 64, True),       # first chunk of 64: prefill, no sample
        "p2": req(100, 0, 100, False),     # last chunk 36 at context 64: prefill, samples
        "d1": req(10, 5, 15, False),       # decode at context 14
        "d2": req(20, 1, 21, False),       # decode at context 20
        "r1": req(10, 3, 13, False),       # resumed: recompute of 13 tokens
        "one": req(8, 0, 8, False),        # the last prompt token alone: a prefill
    }
    sched = {"p1": 64, "p2": 36, "d1": 1, "d2": 1, "r1": 13, "one": 1, "gone": 5}
    pt, pr, dr, dctx, emit, attn = steps_csv.step_shape(sched, reqs)
    assert (pt, pr, dr, dctx, emit) == (64 + 36 + 13 + 1, 4, 2, 15 + 21, 5)
    assert attn == 64 * 32 + 36 * (64 + 18) + 13 * 6.5 + 1 * (7 + 0.5)


def test_step_shape__async_placeholders():
    # async: a decode scheduled holds its new placeholder; before it, one in flight (had output)
    reqs = {"a": req(10, 0, 11, False, placeholders=2), "b": req(10, 0, 10, False, placeholders=1)}
    pt, pr, dr, dctx, emit, _ = steps_csv.step_shape({"a": 1, "b": 10}, reqs)
    assert (pt, pr, dr, dctx, emit) == (10, 1, 1, 11, 2)


class FakeSched:
    """The attributes StepRecorder uses of a TandemScheduler."""

    def __init__(self, clock):
        self.requests = {}
        self.calls = []
        self.clock = clock
        self.sched = SimpleNamespace(stats=lambda: SimpleNamespace(
            num_running=len(self.requests), num_waiting=1, kv_usage=0.25))

    def schedule(self):
        self.clock.t += 0.001
        so = self.next_so
        self.calls.append("schedule")
        return so

    def update_from_output(self, so, mro):
        self.clock.t += 0.010
        self.calls.append("update")
        return {"out": 1}

    def shutdown(self):
        self.calls.append("shutdown")


def test_recorder__rows_durations_and_shutdown(tmp_path):
    clock = SimpleNamespace(t=100.0)
    fs = FakeSched(clock)
    path = tmp_path / "steps.csv"
    rec = steps_csv.StepRecorder(str(path), flush_rows=1, clock=lambda: clock.t)
    rec.install(fs)
    fs.requests = {"a": req(40, 0, 40, False), "b": req(10, 2, 12, False)}
    fs.next_so = SimpleNamespace(total_num_scheduled_tokens=41, num_scheduled_tokens={"a": 40, "b": 1},
                                 preempted_req_ids={"x"})
    so = fs.schedule()
    assert fs.update_from_output(so, None) == {"out": 1}
    fs.next_so = SimpleNamespace(total_num_scheduled_tokens=0, num_scheduled_tokens={})
    fs.update_from_output(fs.schedule(), None)        # an empty step: no row
    fs.requests["a"] = req(40, 1, 41, False)
    fs.next_so = SimpleNamespace(total_num_scheduled_tokens=2, num_scheduled_tokens={"a": 1, "b": 1})
    fs.update_from_output(fs.schedule(), None)
    fs.shutdown()
    assert fs.calls == ["schedule", "update"] * 3 + ["shutdown"]
    lines = path.read_text().splitlines()
    assert lines[0] == steps_csv.HEADER.strip()
    assert len(lines) == 3 and rec.rows == 2
    r1 = dict(zip(lines[0].split(","), lines[1].split(",")))
    r2 = dict(zip(lines[0].split(","), lines[2].split(",")))
    assert (r1["step"], r1["prefill_tokens"], r1["prefill_reqs"], r1["decode_reqs"],
            r1["decode_context_tokens"], r1["batch_tokens"], r1["preemptions"], r1["emit_seqs"],
            r1["prefill_attn"]) == ("1", "40", "1", "1", "12", "41", "1", "2", "800")
    assert float(r1["start_s"]) == 0.0 and abs(float(r1["duration_s"]) - 0.011) < 1e-9
    assert (r2["decode_reqs"], r2["decode_context_tokens"], r2["running"], r2["kv_usage"]) == \
        ("2", "53", "2", "0.2500")
    assert abs(float(r2["start_s"]) - 0.022) < 1e-9
    assert rec.us_per_step >= 0.0
    # the time inside the scheduler's own calls: 3 schedules of 1 ms and 3 updates of 10 ms
    cost = json.loads((tmp_path / "steps.csv.recorder.json").read_text())
    assert cost["rows"] == 2 and abs(cost["scheduler_s"] - 0.033) < 1e-9


def test_recorder__async_pairs_updates_in_order(tmp_path):
    # schedule(N+1) before update(N): each row's duration runs from its own schedule
    t = [0.0]
    fs = FakeSched(SimpleNamespace(t=0.0))
    fs.schedule = lambda: fs.next_so
    fs.update_from_output = lambda so, mro: None
    path = tmp_path / "s.csv"
    rec = steps_csv.StepRecorder(str(path), clock=lambda: t[0])
    rec.install(fs)
    fs.requests = {"a": req(4, 1, 5, False)}
    fs.next_so = SimpleNamespace(total_num_scheduled_tokens=1, num_scheduled_tokens={"a": 1})
    t[0] = 1.0
    s1 = fs.schedule()
    t[0] = 1.5
    s2 = fs.schedule()
    t[0] = 2.0
    fs.update_from_output(s1, None)
    t[0] = 3.0
    fs.update_from_output(s2, None)
    rec.close()
    rows = [ln.split(",") for ln in path.read_text().splitlines()[1:]]
    assert [(r[3], r[4]) for r in rows] == [("0.000000", "1.000000"), ("0.500000", "1.500000")]


def test_recorder__flushes_when_the_engine_is_idle(tmp_path):
    # vLLM may kill the engine process without shutdown(): rows must be on disk by then
    clock = SimpleNamespace(t=0.0)
    fs = FakeSched(clock)
    path = tmp_path / "steps.csv"
    rec = steps_csv.StepRecorder(str(path), flush_rows=10 ** 6, clock=lambda: clock.t)
    rec.install(fs)
    fs.requests = {"a": req(4, 1, 5, False)}
    fs.next_so = SimpleNamespace(total_num_scheduled_tokens=1, num_scheduled_tokens={"a": 1})
    fs.update_from_output(fs.schedule(), None)
    assert path.read_text() == ""      # buffered: a request is still there
    so = fs.schedule()
    fs.requests = {}                   # it finished in this step's update
    fs.update_from_output(so, None)
    assert len(path.read_text().splitlines()) == 3      # idle: header and both rows flushed
    cost = json.loads((tmp_path / "steps.csv.recorder.json").read_text())
    assert cost["rows"] == 2 and cost["recorder_us_per_step"] >= 0
    rec.close()


def test_recorder__unwritable_path_fails_naming_the_key(tmp_path):
    with pytest.raises(TandemConfigError, match="tandem.steps_csv: cannot write .*/no/such/dir/s.csv"):
        steps_csv.StepRecorder(str(tmp_path / "no" / "such" / "dir" / "s.csv"))
