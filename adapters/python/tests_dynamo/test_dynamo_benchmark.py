"""TandemInstrumentedScheduler (tandem/vllm/dynamo_scheduler.py) with Dynamo's own code
(ai-dynamo 1.6.1): dynamo.vllm's argument handling takes it with --benchmark-mode (and still
refuses plain TandemScheduler); Dynamo's self-benchmark runs on a small explicit grid, driven by
a fake model-runner loop, and writes its results file with every point; real requests that
arrive during the benchmark wait in Tandem (whose pool holds no block until vLLM's KV cache
manager has returned all of them) and are then scheduled exactly as a plain TandemScheduler
schedules them; forward-pass metrics come through Dynamo's one publisher after the benchmark
only, equal to TandemScheduler's own; Dynamo's EngineCore.set_fpm_worker_id re-targets them;
without --benchmark-mode the class is TandemScheduler."""
import json
import logging
import time
import types

import pytest

pytest.importorskip("vllm")
zmq = pytest.importorskip("zmq")
dargs = pytest.importorskip("dynamo.vllm.args")
fpm = pytest.importorskip("dynamo.common.forward_pass_metrics")
instr = pytest.importorskip("dynamo.vllm.instrumented_scheduler")
dllm = pytest.importorskip("dynamo.llm")   # configures Dynamo's logging before any test

from conftest import free_port, make_configs, make_requests  # noqa: E402
from test_dynamo_fpm import Sub, assert_same  # noqa: E402
from test_vllm_compare import default_token, drive, norm_eco, norm_so  # noqa: E402

from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

CLS = "tandem.vllm.dynamo.TandemInstrumentedScheduler"
WORKER = "tandem-bench-test"
# Dynamo's explicit grid (BenchmarkPoints, schema 1): two prefill points, one of them reading
# a 64-token prefix, and one decode point.
POINTS = {"schema_version": 1,
          "prefill": [{"batch_size": 1, "total_prefill_tokens": 64, "total_kv_read_tokens": 0},
                      {"batch_size": 2, "total_prefill_tokens": 128, "total_kv_read_tokens": 64}],
          "decode": [{"batch_size": 2, "total_kv_read_tokens": 128}]}
SCHED_KW = dict(max_num_seqs=4, max_num_batched_tokens=256, num_blocks=200, block_size=16,
                max_model_len=512)
REQ_KW = dict(num_requests=5, num_tokens=40, max_tokens=4)


def token(req_id, k):
    """Sampled tokens: the tests' usual ones for real requests, 7 for the benchmark's."""
    return default_token(req_id, k) if req_id.isdigit() else 7


def fake_output(sched, so):
    ids = list(so.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        r = sched.requests[rid]
        sampled.append([token(rid, r.num_output_tokens)]
                       if r.num_computed_tokens >= r.num_tokens else [])
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled)


def heartbeat(sub, timeout=10.0):
    """Waits for the publisher's idle heartbeat: the subscription is live (a PUB socket drops
    what it sends before a subscriber has joined)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if sub.sock.poll(100):
            m = fpm.decode(sub.sock.recv_multipart()[2])
            if m is not None and m.wall_time == 0.0:
                return m
    raise AssertionError("no heartbeat from the publisher")


@pytest.fixture
def fpm_env(monkeypatch, tmp_path):
    port = free_port()
    monkeypatch.setenv("DYN_FORWARDPASS_METRIC_PORT", str(port))
    monkeypatch.setenv("DYN_FPM_WORKER_ID", WORKER)
    monkeypatch.setenv("DYN_FPM_BENCHMARK_OUTPUT_PATH", str(tmp_path / "bench.json"))
    monkeypatch.delenv("DYN_FPM_TRACE", raising=False)
    return types.SimpleNamespace(port=port, results=tmp_path / "bench.json")


def configs(tiny_model, async_scheduling=False, **kw):
    vc, kv = make_configs(tiny_model, **{**SCHED_KW, **kw})
    # (vLLM 0.31's VllmConfig turns async scheduling off for this CPU config; EngineCore's
    # batch queue is what the test drives, so the flag is set as an engine with it has it)
    vc.scheduler_config.async_scheduling = async_scheduling
    return vc, kv


def build(tiny_model, benchmark=True, cls=None, **kw):
    from tandem.vllm.dynamo import TandemInstrumentedScheduler
    vc, kv = configs(tiny_model, **kw)
    if benchmark:
        vc.additional_config["benchmark"] = {"mode": "agg", "warmup_iterations": 2,
                                             "timeout": 60, "points": POINTS}
    cls = cls or TandemInstrumentedScheduler
    return cls(vllm_config=vc, kv_cache_config=kv, log_stats=True,
               block_size=SCHED_KW["block_size"],
               structured_output_manager=StructuredOutputManager(vc))


def run(s, reqs, add_at=3, max_steps=400):
    """EngineCore.step's loop (schedule, fake model, update); the real requests are added at
    step add_at, while the benchmark runs. Returns the trace of the steps Tandem scheduled and,
    per step, (benchmark running, blocks Tandem's pool holds, blocks vLLM's manager holds)."""
    tandem_trace, owners = [], []
    pool = s.kv_cache_manager.block_pool
    st0 = s._tandem.sched.stats()
    base = st0.num_total_blocks - st0.num_free_blocks     # the null block, if counted
    for step in range(max_steps):
        if step == add_at:
            for r in reqs:
                s.add_request(r)
        elif step > add_at and not s.has_requests():
            return tandem_trace, owners
        so = s.schedule()
        vllm_step = getattr(so, "tandem_benchmark_step", False)
        eco = s.update_from_output(so, fake_output(s, so))
        st = s._tandem.sched.stats()
        owners.append((s.benchmark_running, st.num_total_blocks - st.num_free_blocks - base,
                       pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()))
        if not vllm_step:
            tandem_trace.append((norm_so(so), norm_eco(eco)))
    raise AssertionError("did not finish")


def run_async(s, reqs, add_at=3, max_steps=400):
    """The same under async scheduling, as EngineCore.step_with_batch_queue drives it (two
    batches in flight: schedule N+1, then update N). Returns the trace of Tandem's steps
    (each schedule() with the outputs of its own update) and the per-step owners."""
    from collections import deque
    tandem_trace, owners, queue = [], [], deque()
    pool = s.kv_cache_manager.block_pool
    st0 = s._tandem.sched.stats()
    base = st0.num_total_blocks - st0.num_free_blocks
    for step in range(max_steps):
        if step == add_at:
            for r in reqs:
                s.add_request(r)
        elif step > add_at and not s.has_requests() and not queue:
            return tandem_trace, owners
        if s.has_requests():
            so = s.schedule()
            entry = [norm_so(so), None]
            if not getattr(so, "tandem_benchmark_step", False):
                tandem_trace.append(entry)
            queue.appendleft((so, fake_output(s, so), entry))
            if len(queue) < 2 and (so.total_num_scheduled_tokens > 0 or s.has_requests()):
                continue
        elif not queue:
            continue
        so, out, entry = queue.pop()
        entry[1] = norm_eco(s.update_from_output(so, out))
        st = s._tandem.sched.stats()
        owners.append((s.benchmark_running, st.num_total_blocks - st.num_free_blocks - base,
                       pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()))
    raise AssertionError("did not finish")


# ---- dynamo.vllm's argument handling -----------------------------------------------------------
def dynamo_argv(model, cls, *extra):
    return ["--model", model, "--skip-tokenizer-init", "--max-model-len", "512",
            "--scheduler-cls", cls, "--no-async-scheduling", *extra]


def test_benchmark__dynamo_args_accept_the_class_and_refuse_tandem_scheduler(
        tiny_model, monkeypatch, caplog):
    from vllm.usage.usage_lib import UsageContext
    from tandem.vllm.dynamo import TandemInstrumentedScheduler
    for k in ("DYN_FORWARDPASS_METRIC_PORT", "DYN_FPM_TRACE"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="--benchmark-mode requires InstrumentedScheduler"):
        dargs.parse_args(dynamo_argv(tiny_model, "tandem.vllm.TandemScheduler",
                                     "--benchmark-mode", "agg"))
    with caplog.at_level(logging.INFO):
        config = dargs.parse_args(dynamo_argv(tiny_model, CLS, "--benchmark-mode", "agg"))
    assert config.engine_args.scheduler_cls == CLS
    bench = config._benchmark_additional_config
    assert bench["mode"] == "agg"
    assert any("Benchmark mode=agg configured" in r.getMessage() for r in caplog.records)
    vc = config.engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    cls = vc.scheduler_config.get_scheduler_cls()
    assert cls is TandemInstrumentedScheduler and issubclass(cls, instr.InstrumentedScheduler)
    try:    # Dynamo's snapshot mode retargets the FPM worker id only on this test's answer
        from dynamo.vllm.worker_factory import _snapshot_uses_instrumented_scheduler
    except ImportError:
        return
    assert _snapshot_uses_instrumented_scheduler(vc)


def test_benchmark__refused_with_a_kv_connector(tiny_model, fpm_env):
    from vllm.config import KVTransferConfig
    from tandem.vllm.dynamo import kv_transfer_config
    ktc = KVTransferConfig(**kv_transfer_config("bench-0"))
    with pytest.raises(ValueError, match="--benchmark-mode with a --kv-transfer-config"):
        build(tiny_model, kv_transfer_config=ktc)


# ---- the benchmark, then Tandem ----------------------------------------------------------------
def reference(tiny_model, monkeypatch, n_msgs):
    """A plain TandemScheduler on the same requests, publishing through its own socket: its
    trace and its forward-pass metrics."""
    from tandem.vllm import TandemScheduler
    port = free_port()
    monkeypatch.setenv("DYN_FORWARDPASS_METRIC_PORT", str(port))
    vc, kv = make_configs(tiny_model, **SCHED_KW)
    ref = TandemScheduler(vllm_config=vc, kv_cache_config=kv, log_stats=True, block_size=16,
                          structured_output_manager=StructuredOutputManager(vc))
    sub = Sub(port)
    heartbeat(sub)
    try:
        trace = drive(ref, make_requests(**REQ_KW), token_fn=default_token)
        return trace, sub.take(n_msgs, timeout=5.0)
    finally:
        sub.close()
        ref.shutdown()


def assert_same_as_reference(trace, msgs, ref_trace, ref_msgs):
    assert len(trace) == len(ref_trace), (len(trace), len(ref_trace))
    for i, (a, b) in enumerate(zip(ref_trace, trace)):
        assert b == a, f"Tandem step {i} differs from TandemScheduler's\nref:  {a}\nours: {b}"
    passes = sum(1 for so, _ in trace if so["total"] > 0)
    assert len(msgs) == passes == len(ref_msgs), (len(msgs), passes, len(ref_msgs))
    for i, ((seq, m), (_, r)) in enumerate(zip(msgs, ref_msgs)):
        assert (m.worker_id, m.dp_rank, m.version) == (WORKER, 0, fpm.FPM_VERSION)
        assert m.counter_id == seq and m.wall_time > 0
        assert_same(r.scheduled_requests, m.scheduled_requests, f"pass {i} scheduled")
        assert_same(r.queued_requests, m.queued_requests, f"pass {i} queued")
    assert msgs[0][1].scheduled_requests.num_prefill_requests == 4   # max_num_seqs
    assert msgs[0][1].queued_requests.num_prefill_requests == 1


def test_benchmark__runs_then_tandem_schedules_the_real_requests(tiny_model, fpm_env,
                                                                  monkeypatch):
    from tandem.vllm import TandemScheduler
    sub = Sub(fpm_env.port)
    s = build(tiny_model)
    time.sleep(0.5)   # its publisher is paused: no heartbeat to wait for
    try:
        assert s.benchmark_running and s._bench_active
        assert s._tandem._fpm is s._recorder     # no second publisher, no second bind
        trace, owners = run(s, make_requests(**REQ_KW))
        passes = sum(1 for so, _ in trace if so["total"] > 0)
        msgs = sub.take(passes + 1, timeout=5.0)
    finally:
        sub.close()
        s.shutdown()

    # Dynamo's benchmark ran on the grid and wrote its results.
    res = json.loads(fpm_env.results.read_text())
    assert res["status"] == "complete" and res["valid"] is True
    assert res["coverage"] == {"expected_points": 3, "completed_points": 3, "skipped_points": 0}
    got = sorted((r["point"]["point_type"], r["point"]["batch_size"],
                  r["point"].get("total_kv_read_tokens"))
                 for r in res["results"])
    assert got == [("decode", 2, 128), ("prefill", 1, 0), ("prefill", 2, 64)]
    assert all(r["fpms"] for r in res["results"])

    # Never two owners: Tandem's pool holds nothing while vLLM's manager serves the benchmark,
    # and vLLM's manager holds nothing once Tandem schedules.
    assert any(run_ and vllm_held for run_, _, vllm_held in owners)
    for i, (run_, tandem_held, vllm_held) in enumerate(owners):
        assert not (tandem_held and vllm_held), f"step {i}: both own blocks"
        if run_:
            assert tandem_held == 0, f"step {i}: Tandem allocated during the benchmark"
        else:
            assert vllm_held == 0, f"step {i}: vLLM's manager holds blocks after the handover"
    assert owners[-1][0] is False

    # The real requests, held during the benchmark, were scheduled as TandemScheduler
    # schedules them; the forward-pass metrics are the real traffic's only (the benchmark's
    # stay in its results file), each equal to what TandemScheduler publishes itself.
    ref_trace, ref_msgs = reference(tiny_model, monkeypatch, passes + 1)
    assert_same_as_reference(trace, msgs, ref_trace, ref_msgs)


def retarget(s, worker_id):
    """What Dynamo's snapshot restore does: worker_factory._sync_fpm_worker_id (when it imports
    with this vLLM) asks the engine for its utility set_fpm_worker_id, here answered by
    EngineCore's method on an engine holding the scheduler."""
    import asyncio
    from vllm.v1.engine.core import EngineCore
    core = types.SimpleNamespace(scheduler=s)
    try:
        from dynamo.vllm.worker_factory import _sync_fpm_worker_id
    except ImportError:
        return EngineCore.set_fpm_worker_id(core, worker_id)

    class Client:
        async def call_utility_async(self, method, *args):
            return getattr(EngineCore, method)(core, *args)

    s.vllm_config.scheduler_config.scheduler_cls = CLS
    asyncio.run(_sync_fpm_worker_id(types.SimpleNamespace(engine_core=Client()),
                                    s.vllm_config, worker_id))


def test_benchmark__set_fpm_worker_id_retargets_tandems_metrics(tiny_model, fpm_env,
                                                                monkeypatch):
    """Dynamo's snapshot mode builds the engine before the worker has its id and then calls
    EngineCore.set_fpm_worker_id (installed by dynamo.vllm.instrumented_scheduler), which
    refuses any scheduler that is not an InstrumentedScheduler: TandemScheduler's raises, this
    class's changes the id in the next published metrics, heartbeats included."""
    from vllm.v1.engine.core import EngineCore
    from tandem.vllm import TandemScheduler
    vc, kv = make_configs(tiny_model, **SCHED_KW)
    with monkeypatch.context() as m:     # its own publisher would take the test's port
        m.delenv("DYN_FORWARDPASS_METRIC_PORT")
        plain = TandemScheduler(vllm_config=vc, kv_cache_config=kv, log_stats=False,
                                block_size=16,
                                structured_output_manager=StructuredOutputManager(vc))
    try:
        with pytest.raises(RuntimeError, match="not InstrumentedScheduler"):
            EngineCore.set_fpm_worker_id(types.SimpleNamespace(scheduler=plain), "w-1")
    finally:
        plain.shutdown()

    sub = Sub(fpm_env.port)
    s = build(tiny_model, benchmark=False)
    heartbeat(sub)
    try:
        assert not s.benchmark_running
        for r in make_requests(2, num_tokens=20, max_tokens=2):
            s.add_request(r)
        so = s.schedule()
        s.update_from_output(so, fake_output(s, so))
        (_, first), = sub.take(1)
        assert first.worker_id == WORKER
        retarget(s, "restored-worker-9")
        while s.has_requests():
            so = s.schedule()
            s.update_from_output(so, fake_output(s, so))
        later = sub.take(1)
        assert later and later[0][1].worker_id == "restored-worker-9"
        assert later[0][1].scheduled_requests.num_decode_requests == 2
        # the idle heartbeat (Dynamo's publisher thread) carries the new id too
        assert heartbeat(sub).worker_id == "restored-worker-9"
    finally:
        sub.close()
        s.shutdown()


def test_benchmark__without_benchmark_mode_it_is_tandem_scheduler(tiny_model, fpm_env,
                                                                  monkeypatch):
    """No --benchmark-mode: Tandem owns the blocks from the first step; the steps and the
    forward-pass metrics equal a plain TandemScheduler's on the same requests."""
    sub = Sub(fpm_env.port)
    s = build(tiny_model, benchmark=False)
    heartbeat(sub)
    try:
        assert not s.benchmark_running and not s._bench_active
        assert s._tandem._fpm is s._recorder
        trace, owners = run(s, make_requests(**REQ_KW), add_at=0)
        assert all(not run_ and vllm_held == 0 for run_, _, vllm_held in owners)
        passes = sum(1 for so, _ in trace if so["total"] > 0)
        msgs = sub.take(passes + 1, timeout=5.0)
        assert s.make_stats() is not None and s.get_request_counts() == (0, 0)
    finally:
        sub.close()
        s.shutdown()
    ref_trace, ref_msgs = reference(tiny_model, monkeypatch, passes + 1)
    assert_same_as_reference(trace, msgs, ref_trace, ref_msgs)


def test_benchmark__aborting_a_held_request_during_the_benchmark(tiny_model, fpm_env):
    """A real request aborted while it waits for the benchmark is gone from Tandem: the
    benchmark completes and the other requests are served."""
    from vllm.v1.request import RequestStatus
    s = build(tiny_model)
    try:
        reqs = make_requests(3, num_tokens=30, max_tokens=2)
        for r in reqs:
            s.add_request(r)
        served = set()
        for step in range(200):
            if step == 2:
                assert s.benchmark_running
                s.finish_requests(["1"], RequestStatus.FINISHED_ABORTED)
            if step > 2 and not s.has_requests():
                break
            so = s.schedule()
            served.update(k for k in so.num_scheduled_tokens if k.isdigit())
            s.update_from_output(so, fake_output(s, so))
        assert served == {"0", "2"}
        assert json.loads(fpm_env.results.read_text())["coverage"]["completed_points"] == 3
    finally:
        s.shutdown()


def test_benchmark__async_scheduling(tiny_model, fpm_env, monkeypatch):
    """Async scheduling (EngineCore.step_with_batch_queue: schedule N+1 before update N):
    the benchmark completes, the blocks change owner only once vLLM's last step that scheduled
    tokens has been updated, and Tandem's steps equal an async TandemScheduler's."""
    from collections import deque
    from tandem.vllm import TandemScheduler
    s = build(tiny_model, async_scheduling=True)
    try:
        assert s._tandem._async and s._tandem.tandem_config["async_scheduling"]
        trace, owners = run_async(s, make_requests(**REQ_KW))
    finally:
        s.shutdown()
    res = json.loads(fpm_env.results.read_text())
    assert res["status"] == "complete" and res["coverage"]["completed_points"] == 3
    for i, (run_, tandem_held, vllm_held) in enumerate(owners):
        assert not (tandem_held and vllm_held), f"update {i}: both own blocks"
        assert not run_ or tandem_held == 0, f"update {i}: Tandem allocated during the benchmark"
    assert owners[-1][0] is False and trace

    monkeypatch.delenv("DYN_FORWARDPASS_METRIC_PORT")
    vc, kv = configs(tiny_model, async_scheduling=True)
    ref = TandemScheduler(vllm_config=vc, kv_cache_config=kv, log_stats=True, block_size=16,
                          structured_output_manager=StructuredOutputManager(vc))
    ref_trace, queue = [], deque()
    try:
        for r in make_requests(**REQ_KW):
            ref.add_request(r)
        for _ in range(400):
            if not ref.has_requests() and not queue:
                break
            if ref.has_requests():
                so = ref.schedule()
                entry = [norm_so(so), None]
                ref_trace.append(entry)
                queue.appendleft((so, fake_output(ref, so), entry))
                if len(queue) < 2 and (so.total_num_scheduled_tokens > 0 or ref.has_requests()):
                    continue
            elif not queue:
                continue
            so, out, entry = queue.pop()
            entry[1] = norm_eco(ref.update_from_output(so, out))
    finally:
        ref.shutdown()
    assert trace == ref_trace
