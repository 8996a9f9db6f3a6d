"""TandemScheduler under dynamo.vllm's own argument handling (ai-dynamo 1.6.1): Dynamo's parser
and config builder (dynamo.vllm.args.parse_args) take `--scheduler-cls
tandem.vllm.TandemScheduler`, vLLM's create_engine_config resolves the class, and a
TandemScheduler built from that VllmConfig serves requests, publishes its KV events where
Dynamo's kv_events_config says and, with Dynamo's forward-pass metrics on, its
ForwardPassMetrics where Dynamo's own setup_fpm_relay subscribes. Also recorded here, as
Dynamo 1.6.1 behaves: with forward-pass metrics on, Dynamo logs "InstrumentedScheduler will NOT
be injected" for any --scheduler-cls (even InstrumentedScheduler's own path); --benchmark-mode
refuses a class path without "InstrumentedScheduler" in it."""
import json
import logging
import time

import pytest

pytest.importorskip("vllm")
zmq = pytest.importorskip("zmq")
dargs = pytest.importorskip("dynamo.vllm.args")
fpm = pytest.importorskip("dynamo.common.forward_pass_metrics")
# imported before any test: importing them configures Dynamo's logging, which replaces the root
# logger's handlers (pytest's log capture among them)
dllm = pytest.importorskip("dynamo.llm")
try:    # ai-dynamo 1.6.1's worker module imports vLLM 0.31 internals (not in 0.32/0.33)
    from dynamo.vllm import main as dmain
    DMAIN_ERR = None
except ImportError as e:
    dmain, DMAIN_ERR = None, str(e)

import torch  # noqa: E402
from vllm.usage.usage_lib import UsageContext  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from conftest import free_port, make_requests  # noqa: E402
from test_vllm_compare import default_token, fake_output  # noqa: E402

TANDEM = "tandem.vllm.TandemScheduler"
FPM_WARNING = "InstrumentedScheduler will NOT be injected"



@pytest.fixture
def no_fpm_env(monkeypatch):
    monkeypatch.delenv("DYN_FORWARDPASS_METRIC_PORT", raising=False)
    monkeypatch.delenv("DYN_FPM_TRACE", raising=False)
    monkeypatch.delenv("DYN_FPM_WORKER_ID", raising=False)


def dynamo_argv(model, *extra):
    return ["--model", model, "--skip-tokenizer-init", "--max-model-len", "512",
            "--scheduler-cls", TANDEM, "--no-async-scheduling", *extra]


def dynamo_warnings(caplog):
    """Dynamo's warnings; asserts first that Dynamo's argument handling was captured at all
    (its INFO line on kv_events_config), so that an empty list means no warning."""
    assert any(r.name == "dynamo.vllm.args" and "kv_events_config" in r.getMessage()
               for r in caplog.records), "Dynamo's log records were not captured"
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and r.name.startswith("dynamo")]


def build_tandem(config, num_blocks=400):
    """vLLM's engine config from Dynamo's Config, then the scheduler class it names, built as
    vLLM's EngineCore builds it (one full-attention KV cache group)."""
    vc = config.engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    cls = vc.scheduler_config.get_scheduler_cls()
    bs = vc.cache_config.block_size
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=bs, num_kv_heads=1,
                                                      head_size=1, dtype=torch.float32))])
    vc.cache_config.num_gpu_blocks = num_blocks
    return vc, cls(vllm_config=vc, kv_cache_config=kv, log_stats=True, block_size=bs,
                   structured_output_manager=StructuredOutputManager(vc))


def serve(sched, n=3, num_tokens=300, max_tokens=4):
    bs = sched.block_size
    for r in make_requests(n, num_tokens=num_tokens, max_tokens=max_tokens, block_size=bs):
        sched.add_request(r)
    produced = 0
    for _ in range(200):
        if not sched.has_requests():
            return produced
        so = sched.schedule()
        eco = sched.update_from_output(so, fake_output(sched, so, default_token))
        produced += sum(len(o.new_token_ids) for e in eco.values() for o in e.outputs)
    raise AssertionError("did not finish")


def test_args__tandem_scheduler_through_dynamo_parser_without_warnings(
        tiny_model, no_fpm_env, caplog):
    from tandem.vllm import TandemScheduler
    ev_port = free_port()
    kv_events = {"enable_kv_cache_events": True, "publisher": "zmq",
                 "endpoint": f"tcp://*:{ev_port}", "topic": "kv"}
    with caplog.at_level(logging.INFO):
        config = dargs.parse_args(dynamo_argv(tiny_model, "--kv-events-config",
                                              json.dumps(kv_events)))
    assert dynamo_warnings(caplog) == []
    assert config.engine_args.scheduler_cls == TANDEM
    assert config.use_kv_events is True      # Dynamo will relay vLLM's ZMQ KV events
    vc, s = build_tandem(config)
    assert type(s) is TandemScheduler and s._fpm is None
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(f"tcp://127.0.0.1:{ev_port}")
    time.sleep(0.3)
    try:
        assert serve(s) == 3 * 4
        import msgspec
        from vllm.distributed.kv_events import BlockStored, KVEventBatch
        dec = msgspec.msgpack.Decoder(type=KVEventBatch)
        stored = 0
        end = time.monotonic() + 5
        while time.monotonic() < end and stored == 0:
            if sub.poll(100):
                parts = sub.recv_multipart()
                stored += sum(isinstance(e, BlockStored) for e in dec.decode(parts[-1]).events)
        assert stored > 0, "no BlockStored event reached the subscriber"
    finally:
        sub.close(linger=0)
        s.shutdown()


def test_args__fpm_on_tandem_publishes_where_dynamos_relay_listens(
        tiny_model, no_fpm_env, monkeypatch, caplog):
    if dmain is None:
        pytest.skip(f"dynamo.vllm.main does not import with this vLLM: {DMAIN_ERR}")
    port = free_port()
    monkeypatch.setenv("DYN_FORWARDPASS_METRIC_PORT", str(port))
    monkeypatch.setenv("DYN_FPM_WORKER_ID", "worker-7")
    with caplog.at_level(logging.INFO):
        config = dargs.parse_args(dynamo_argv(tiny_model))
    # Dynamo 1.6.1 logs this for any --scheduler-cls when forward-pass metrics are on.
    assert any(FPM_WARNING in w for w in dynamo_warnings(caplog))
    assert config.engine_args.scheduler_cls == TANDEM

    relays = []

    class Relay:     # stands in for the Rust FpmEventRelay (it needs a running runtime)
        def __init__(self, endpoint, zmq_endpoint):
            relays.append(zmq_endpoint)

    monkeypatch.setattr(dllm, "FpmEventRelay", Relay)
    vc, s = build_tandem(config)
    assert dmain.setup_fpm_relay(config, object(), vc) is not None
    assert relays == [f"tcp://127.0.0.1:{port}"]
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(relays[0])
    time.sleep(0.3)
    try:
        serve(s)
        got = []
        end = time.monotonic() + 5
        while time.monotonic() < end and not got:
            if sub.poll(100):
                m = fpm.decode(sub.recv_multipart()[2])
                if m is not None and m.wall_time > 0:
                    got.append(m)
        assert got, "no ForwardPassMetrics reached the relay's endpoint"
        m = got[0]
        assert m.worker_id == "worker-7" and m.dp_rank == 0
        assert m.scheduled_requests.num_prefill_requests == 3
        assert m.scheduled_requests.sum_prefill_tokens == 3 * 300
    finally:
        sub.close(linger=0)
        s.shutdown()


def test_args__dynamo_warns_even_for_its_own_class_path(tiny_model, no_fpm_env, monkeypatch,
                                                        caplog):
    """The warning is not about the class: Dynamo 1.6.1 checks only that the flag is set."""
    monkeypatch.setenv("DYN_FPM_TRACE", "1")
    argv = dynamo_argv(tiny_model)
    argv[argv.index(TANDEM)] = "dynamo.vllm.instrumented_scheduler.InstrumentedScheduler"
    with caplog.at_level(logging.INFO):
        dargs.parse_args(argv)
    assert any(FPM_WARNING in w for w in dynamo_warnings(caplog))


def test_args__benchmark_mode_needs_instrumented_scheduler(tiny_model, no_fpm_env):
    with pytest.raises(ValueError, match="--benchmark-mode requires InstrumentedScheduler"):
        dargs.parse_args(dynamo_argv(tiny_model, "--benchmark-mode", "agg"))
