"""TandemScheduler's ForwardPassMetrics against Dynamo's own InstrumentedScheduler
(dynamo.vllm.instrumented_scheduler, ai-dynamo 1.6.1) on the same scenarios. Both run with
DYN_FORWARDPASS_METRIC_PORT set (each its own free port) and DYN_FPM_WORKER_ID; a ZeroMQ SUB
socket connects to each where Dynamo's FpmEventRelay would (tcp://127.0.0.1:port) and decodes
every message with Dynamo's decode(). Per forward pass, the scheduled and queued request metrics
must be equal (variances to 1e-9 relative: the accumulation order of the queued requests
differs), worker_id and dp_rank as set, counter_id the message's sequence frame, wall_time > 0;
idle heartbeats (all zero, wall_time 0) are ignored. The scenarios chunk prefills, hit the prefix
cache, preempt and resume. Last, the metrics reach Dynamo's own FpmEventSubscriber (what the
planner reads) through Dynamo's own FpmEventRelay."""
import os
import time

import pytest

pytest.importorskip("vllm")
zmq = pytest.importorskip("zmq")
fpm = pytest.importorskip("dynamo.common.forward_pass_metrics")
instr = pytest.importorskip("dynamo.vllm.instrumented_scheduler")

from conftest import free_port, make_configs, make_requests  # noqa: E402
from test_vllm_compare import fake_output, default_token  # noqa: E402

from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

WORKER = "tandem-fpm-test"



class Sub:
    def __init__(self, port):
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(f"tcp://127.0.0.1:{port}")

    def take(self, n, timeout=10.0):
        """n non-heartbeat messages as (sequence frame, decoded ForwardPassMetrics)."""
        got = []
        end = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < end:
            if not self.sock.poll(100):
                continue
            topic, seq, payload = self.sock.recv_multipart()
            assert topic == b""
            m = fpm.decode(payload)
            assert m is not None, "Dynamo's decode() refused the message"
            if m.wall_time == 0.0 and m.scheduled_requests == fpm.ScheduledRequestMetrics():
                continue    # idle heartbeat
            got.append((int.from_bytes(seq, "big"), m))
        return got

    def close(self):
        self.sock.close(linger=0)


def build(tiny_model, which, port, monkeypatch, **kw):
    from tandem.vllm import TandemScheduler
    monkeypatch.setenv("DYN_FORWARDPASS_METRIC_PORT", str(port))
    monkeypatch.setenv("DYN_FPM_WORKER_ID", WORKER)
    vc, kv = make_configs(tiny_model, **kw)
    cls = instr.InstrumentedScheduler if which == "dynamo" else TandemScheduler
    return cls(vllm_config=vc, kv_cache_config=kv, log_stats=False,
               block_size=kw.get("block_size", 16),
               structured_output_manager=StructuredOutputManager(vc))


def run(sched, reqs, max_steps=400):
    """Drive like EngineCore.step (schedule, fake model, update); the number of passes that
    scheduled tokens (those emit one message each)."""
    for r in reqs:
        sched.add_request(r)
    passes = 0
    for _ in range(max_steps):
        if not sched.has_requests():
            return passes
        so = sched.schedule()
        passes += so.total_num_scheduled_tokens > 0
        sched.update_from_output(so, fake_output(sched, so, default_token))
    raise AssertionError("did not finish")


def fields(struct):
    return {f: getattr(struct, f) for f in struct.__struct_fields__}


def assert_same(a, b, where):
    fa, fb = fields(a), fields(b)
    for k in fa:
        if k.startswith("var_"):
            assert fb[k] == pytest.approx(fa[k], rel=1e-9, abs=1e-9), f"{where}: {k}"
        else:
            assert fb[k] == fa[k], f"{where}: {k}: dynamo {fa[k]}, tandem {fb[k]}"


def compare(tiny_model, monkeypatch, sched_kw, req_kw):
    out = {}
    for which in ("dynamo", "tandem"):
        port = free_port()
        s = build(tiny_model, which, port, monkeypatch, **sched_kw)
        sub = Sub(port)
        time.sleep(0.3)     # the subscription reaches the PUB socket before the first pass
        try:
            n = run(s, make_requests(**req_kw))
            out[which] = (n, sub.take(n))
        finally:
            sub.close()
            s.shutdown()
    (na, a), (nb, b) = out["dynamo"], out["tandem"]
    assert na == nb and len(a) == na and len(b) == nb, (na, len(a), nb, len(b))
    for i, ((_, x), (seq, y)) in enumerate(zip(a, b)):
        assert_same(x.scheduled_requests, y.scheduled_requests, f"pass {i} scheduled")
        assert_same(x.queued_requests, y.queued_requests, f"pass {i} queued")
        assert (y.version, y.worker_id, y.dp_rank) == (fpm.FPM_VERSION, WORKER, 0)
        assert y.counter_id == seq
        assert y.wall_time > 0.0
    seqs = [seq for seq, _ in b]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    return [m for _, m in b]


def test_fpm__chunked_prefill_and_decode(tiny_model, monkeypatch):
    ms = compare(tiny_model, monkeypatch,
                 dict(max_num_seqs=4, max_num_batched_tokens=24, block_size=8, num_blocks=200,
                      max_model_len=256),
                 dict(num_requests=6, num_tokens=30, max_tokens=5, block_size=8))
    assert any(m.queued_requests.num_prefill_requests for m in ms)
    assert any(m.scheduled_requests.num_prefill_requests and m.scheduled_requests.num_decode_requests
               for m in ms)
    # a chunk continuing a prefill reads the earlier chunks' KV
    assert any(m.scheduled_requests.sum_prefill_kv_tokens for m in ms)


def test_fpm__prefix_hits(tiny_model, monkeypatch):
    ms = compare(tiny_model, monkeypatch, dict(max_num_seqs=1),
                 dict(num_requests=3, num_tokens=40, max_tokens=2, same_prompt=True))
    assert any(m.scheduled_requests.sum_prefill_kv_tokens >= 32 for m in ms)


def test_fpm__preemption_queues_decode_requests(tiny_model, monkeypatch):
    ms = compare(tiny_model, monkeypatch,
                 dict(num_blocks=11, block_size=4, max_num_seqs=8, max_num_batched_tokens=128,
                      max_model_len=128, enable_prefix_caching=False),
                 dict(num_requests=4, num_tokens=8, max_tokens=12, block_size=4))
    assert any(m.queued_requests.num_decode_requests for m in ms), "should preempt"


def test_fpm__off_without_dynamo_switches(tiny_model, monkeypatch):
    from tandem.vllm import TandemScheduler
    monkeypatch.delenv("DYN_FORWARDPASS_METRIC_PORT", raising=False)
    monkeypatch.setenv("DYN_FPM_TRACE", "0")
    vc, kv = make_configs(tiny_model)
    s = TandemScheduler(vllm_config=vc, kv_cache_config=kv, log_stats=False, block_size=16,
                        structured_output_manager=StructuredOutputManager(vc))
    assert s._fpm is None
    s.shutdown()
    monkeypatch.setenv("DYN_FPM_TRACE", "1")      # what dynamo.vllm writes for --fpm-trace
    port = free_port()
    monkeypatch.setenv("DYN_FORWARDPASS_METRIC_PORT", str(port))
    s = TandemScheduler(vllm_config=vc, kv_cache_config=kv, log_stats=False, block_size=16,
                        structured_output_manager=StructuredOutputManager(vc))
    try:
        assert s._fpm is not None and s._fpm.port == port
    finally:
        s.shutdown()


def test_fpm__bad_port_is_a_clear_error(tiny_model, monkeypatch):
    from tandem.vllm import TandemScheduler
    monkeypatch.setenv("DYN_FORWARDPASS_METRIC_PORT", "not-a-port")
    vc, kv = make_configs(tiny_model)
    with pytest.raises(ValueError, match="DYN_FORWARDPASS_METRIC_PORT"):
        TandemScheduler(vllm_config=vc, kv_cache_config=kv, log_stats=False, block_size=16,
                        structured_output_manager=StructuredOutputManager(vc))


def test_fpm__through_dynamos_relay_to_its_subscriber(tiny_model, monkeypatch):
    """Dynamo's own Rust FpmEventRelay (as dynamo.vllm.main sets it up: endpoint plus
    tcp://127.0.0.1:port) carries TandemScheduler's metrics to Dynamo's FpmEventSubscriber,
    the planner's consumer, over Dynamo's event plane: an in-process DistributedRuntime with
    in-memory discovery and the ZMQ event plane advertised on 127.0.0.1."""
    import asyncio
    import queue
    import threading
    llm = pytest.importorskip("dynamo.llm")
    runtime = pytest.importorskip("dynamo.runtime")
    monkeypatch.setenv("DYN_EVENT_PLANE", "zmq")
    monkeypatch.setenv("DYN_EVENT_PLANE_HOST", "127.0.0.1")
    port = free_port()
    s = build(tiny_model, "tandem", port, monkeypatch, block_size=16)
    got: queue.Queue = queue.Queue()

    async def main():
        rt = runtime.DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp")
        ep = rt.endpoint("tandemtest.backend.generate")
        relay = llm.FpmEventRelay(endpoint=ep, zmq_endpoint=f"tcp://127.0.0.1:{port}")
        sub = llm.FpmEventSubscriber(ep)

        def pull():
            while True:
                data = sub.recv()
                got.put(data)
                if data is None:
                    return

        threading.Thread(target=pull, daemon=True).start()
        await asyncio.sleep(1.0)   # discovery, then the subscriber's connection
        n = await asyncio.to_thread(run, s, make_requests(3, num_tokens=40, max_tokens=3))
        seen = []
        end = time.monotonic() + 15
        while time.monotonic() < end and len(seen) < n:
            try:
                data = await asyncio.to_thread(got.get, True, 0.5)
            except queue.Empty:
                continue
            m = fpm.decode(data) if data is not None else None
            if m is not None and m.wall_time > 0:
                seen.append(m)
        sub.shutdown()
        del relay
        rt.shutdown()
        return n, seen

    try:
        n, seen = asyncio.run(main())
    finally:
        s.shutdown()
    assert n > 0 and len(seen) == n, (n, len(seen))
    assert seen[0].worker_id == WORKER
    assert seen[0].scheduled_requests.num_prefill_requests == 3
    assert seen[0].scheduled_requests.sum_prefill_tokens == 120
    assert sum(m.scheduled_requests.num_decode_requests for m in seen) == 3 * 2
