"""Dynamo's forward-pass metrics (FPM) from TandemScheduler.

Dynamo's planner and router read one ForwardPassMetrics message per forward pass (the schema
is Dynamo's: dynamo.common.forward_pass_metrics, ai-dynamo 1.6.1, FPM_VERSION 1). In Dynamo's
own vLLM worker they come from its InstrumentedScheduler, which binds a ZeroMQ PUB socket in the
EngineCore process on tcp://*:(DYN_FORWARDPASS_METRIC_PORT + dp_rank) (default port 20380;
Tandem's publisher binds 127.0.0.1 there unless TANDEM_FPM_BIND_HOST says otherwise);
the worker's FpmEventRelay subscribes to tcp://127.0.0.1:that port and re-publishes on
Dynamo's event plane. TandemScheduler publishes the same messages on the same socket, so the
relay, the planner and the router take them unchanged.

Enabled exactly when Dynamo enables its relay: DYN_FORWARDPASS_METRIC_PORT is set, or
DYN_FPM_TRACE is true (dynamo.vllm writes "1"/"0" there from --fpm-trace before the engine
process starts). DYN_FPM_WORKER_ID names the worker. Off otherwise, and off (with one warning)
when the dynamo package is not importable, since the message classes are Dynamo's.

What one message holds, as InstrumentedScheduler computes it (so that a planner sees the same
numbers from either scheduler; tests_dynamo/test_dynamo_fpm.py compares them step by step):
- scheduled_requests, from the SchedulerOutput the engine hands to update_from_output: new
  requests and continuing ones still in their context phase (no output token yet) are prefill
  (their scheduled tokens, their prompt length's population variance, their already computed
  tokens as KV read); the other continuing ones are decode (their computed tokens).
- queued_requests, after the update: every unfinished request not running; a preempted one, or
  one waiting for remote KV, counts as decode (its computed tokens), any other as prefill (its
  token count).
- wall_time: the time since the previous update_from_output, or since the matching schedule()
  for the first pass after an idle period. Passes that scheduled no token emit nothing; when
  idle, the publisher thread sends an all-zero heartbeat once a second.
- counter_id: a per-publisher sequence number, also sent as the message's second frame
  (frames: empty topic, 8-byte big-endian sequence number, msgpack payload).

Encoding and the socket write run on a daemon thread behind a bounded queue (a full queue drops
the message: metrics never block a step).
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from typing import Optional

from vllm.v1.request import RequestStatus

logger = logging.getLogger(__name__)

ENV_PORT = "DYN_FORWARDPASS_METRIC_PORT"
ENV_BIND = "TANDEM_FPM_BIND_HOST"   # the address the PUB socket binds (Tandem's own setting)
DEFAULT_BIND = "127.0.0.1"          # Dynamo's relay subscribes on loopback; "*" for every interface
ENV_TRACE = "DYN_FPM_TRACE"
ENV_WORKER_ID = "DYN_FPM_WORKER_ID"
DEFAULT_PORT = 20380
_TRUE = ("1", "true", "on", "yes")
_QUEUED_AS_DECODE = (RequestStatus.PREEMPTED, RequestStatus.WAITING_FOR_REMOTE_KVS)


def fpm_enabled(environ=None) -> bool:
    """Whether Dynamo's forward-pass metrics are on for this process (see the module doc)."""
    env = os.environ if environ is None else environ
    if ENV_PORT in env:
        return True
    return str(env.get(ENV_TRACE, "")).strip().lower() in _TRUE


def fpm_port(vllm_config, environ=None) -> int:
    """The port this engine's scheduler publishes on: DYN_FORWARDPASS_METRIC_PORT (default
    20380) plus the data-parallel index (vLLM keeps the true rank there for dense external
    DP, where data_parallel_rank is reset to 0 in each engine)."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_PORT)
    try:
        base = int(raw) if raw not in (None, "") else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"{ENV_PORT} must be an integer port, got {raw!r}") from None
    rank = dp_rank_of(vllm_config)
    if not 0 < base + rank < 65536:
        raise ValueError(f"{ENV_PORT}={base} with dp rank {rank} is not a valid port")
    return base + rank


def fpm_endpoint(port: int, environ=None) -> str:
    """The endpoint the publisher binds: TANDEM_FPM_BIND_HOST (default 127.0.0.1, where
    Dynamo's FpmEventRelay subscribes; the socket has no CURVE, so binding every interface,
    "*", publishes the scheduler's metrics to anyone who can reach the port) and the port."""
    env = os.environ if environ is None else environ
    host = str(env.get(ENV_BIND, "") or DEFAULT_BIND).strip()
    if not host or any(c in host for c in "/;") or host.count(":") > 0 and not host.startswith("["):
        raise ValueError(f"{ENV_BIND} must be an IPv4 address, [IPv6] or '*', got {host!r}")
    return f"tcp://{host}:{port}"


def dp_rank_of(vllm_config) -> int:
    pc = getattr(vllm_config, "parallel_config", None)
    rank = getattr(pc, "data_parallel_index", None)
    if rank is None:
        rank = getattr(pc, "data_parallel_rank", 0)
    return int(rank or 0)


class _Acc:
    """Count, sum and population variance in one pass (Welford)."""
    __slots__ = ("n", "s", "mean", "m2")

    def __init__(self):
        self.n, self.s, self.mean, self.m2 = 0, 0, 0.0, 0.0

    def add(self, v: int) -> None:
        self.n += 1
        self.s += v
        d = v - self.mean
        self.mean += d / self.n
        self.m2 += d * (v - self.mean)

    def var(self) -> float:
        return self.m2 / self.n if self.n else 0.0


def scheduled_metrics(so, requests) -> dict:
    """ScheduledRequestMetrics' fields for one SchedulerOutput; requests: req_id -> Request
    (for the prompt length of continuing prefills)."""
    nsched = so.num_scheduled_tokens
    npre = ptok = pkv = 0
    plen, dkv = _Acc(), _Acc()
    for r in so.scheduled_new_reqs:
        npre += 1
        ptok += nsched.get(r.req_id, 0)
        plen.add(len(r.prompt_token_ids) if r.prompt_token_ids else 0)
        pkv += r.num_computed_tokens
    c = so.scheduled_cached_reqs
    for rid, comp, nout in zip(c.req_ids, c.num_computed_tokens, c.num_output_tokens):
        if nout == 0:
            npre += 1
            ptok += nsched.get(rid, 0)
            req = requests.get(rid)
            plen.add(req.num_prompt_tokens if req is not None else 0)
            pkv += comp
        else:
            dkv.add(comp)
    return dict(num_prefill_requests=npre, sum_prefill_tokens=ptok,
                var_prefill_length=plen.var(), sum_prefill_kv_tokens=pkv,
                num_decode_requests=dkv.n, sum_decode_kv_tokens=dkv.s,
                var_decode_kv_tokens=dkv.var())


def queued_metrics(requests) -> dict:
    """QueuedRequestMetrics' fields over the unfinished requests that are not running."""
    pre, dec = _Acc(), _Acc()
    for r in requests.values():
        st = r.status
        if st == RequestStatus.RUNNING or RequestStatus.is_finished(st):
            continue
        if st in _QUEUED_AS_DECODE:
            dec.add(r.num_computed_tokens)
        else:
            pre.add(r.num_tokens)
    return dict(num_prefill_requests=pre.n, sum_prefill_tokens=pre.s,
                var_prefill_length=pre.var(), num_decode_requests=dec.n,
                sum_decode_kv_tokens=dec.s, var_decode_kv_tokens=dec.var())


class _Publisher:
    """The PUB socket and its thread (bounded queue; heartbeat when idle)."""
    HEARTBEAT_S = 1.0

    def __init__(self, fpm_mod, endpoint: str, worker_id: str, dp_rank: int,
                 max_queue: int = 10000):
        import msgspec
        import zmq
        self._fpm = fpm_mod
        self._replace = msgspec.structs.replace
        self.worker_id = worker_id
        self.dp_rank = dp_rank
        self._q: queue.Queue = queue.Queue(maxsize=max_queue)
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PUB)
        self._again = zmq.Again
        self._noblock = zmq.NOBLOCK
        try:
            self._sock.bind(endpoint)
        except Exception:
            self._sock.close(linger=0)
            raise
        self.dropped = 0
        self._seq = 0
        self._running = True
        self._thread = threading.Thread(target=self._run, name="tandem-fpm", daemon=True)
        self._thread.start()

    def put(self, msg) -> None:
        try:
            self._q.put_nowait(msg)
        except queue.Full:
            self.dropped += 1

    def _send(self, msg) -> None:
        seq = self._seq
        self._seq += 1
        msg = self._replace(msg, counter_id=seq)
        try:
            self._sock.send_multipart((b"", seq.to_bytes(8, "big"), self._fpm.encode(msg)),
                                      flags=self._noblock)
        except self._again:
            self.dropped += 1

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            try:
                msg = self._q.get(timeout=self.HEARTBEAT_S)
            except queue.Empty:
                if time.monotonic() - last < self.HEARTBEAT_S:
                    continue
                msg = self._fpm.ForwardPassMetrics(worker_id=self.worker_id,
                                                   dp_rank=self.dp_rank)
            if msg is None or not self._running:
                break
            try:
                self._send(msg)
            except Exception:   # never let the thread die on one bad send
                logger.warning("tandem: forward-pass metrics send failed", exc_info=True)
            last = time.monotonic()

    def close(self) -> None:
        """Stops the thread (what is still queued is sent first unless the queue is full)
        and closes the socket once the thread is gone."""
        try:
            self._q.put(None, timeout=1.0)
        except queue.Full:
            self._running = False
        self._thread.join(timeout=5.0)
        if self._thread.is_alive():     # never close a socket another thread still uses
            logger.warning("tandem: forward-pass metrics thread did not stop; socket left open")
            return
        self._sock.close(linger=0)


class ForwardPassMetricsRecorder:
    """Per-scheduler recorder: scheduled(so) after each schedule(), updated(so, requests)
    after each update_from_output(); each forward pass that scheduled tokens becomes one
    ForwardPassMetrics (worker_id and dp_rank as this object holds them when the pass is
    reported) handed to emit(msg). No socket: emit is the publisher's put (the publisher
    below, or Dynamo's own when the scheduler is an InstrumentedScheduler, tandem/vllm/
    dynamo_scheduler.py). emit must not block."""

    def __init__(self, vllm_config, emit, worker_id: str = ""):
        from dynamo.common import forward_pass_metrics as fpm_mod
        self._fpm = fpm_mod
        self._emit = emit
        self.dp_rank = dp_rank_of(vllm_config)
        self.worker_id = str(worker_id)
        self._sched_times: deque = deque()
        self._last_update = 0.0

    def scheduled(self, so) -> None:
        if so.total_num_scheduled_tokens > 0:
            self._sched_times.append(time.monotonic())

    def updated(self, so, requests) -> None:
        if so.total_num_scheduled_tokens <= 0:
            self._last_update = 0.0
            return
        now = time.monotonic()
        t0 = self._sched_times.popleft() if self._sched_times else 0.0
        if self._last_update > 0:
            wall = now - self._last_update
        else:
            wall = now - t0 if t0 > 0 else 0.0
        self._last_update = now
        m = self._fpm
        self._emit(m.ForwardPassMetrics(
            worker_id=self.worker_id, dp_rank=self.dp_rank, wall_time=wall,
            scheduled_requests=m.ScheduledRequestMetrics(**scheduled_metrics(so, requests)),
            queued_requests=m.QueuedRequestMetrics(**queued_metrics(requests))))

    def close(self) -> None:
        pass


class ForwardPassMetricsPublisher(ForwardPassMetricsRecorder):
    """The recorder over Tandem's own PUB socket on Dynamo's FPM port (TandemScheduler under
    Dynamo's switches); close() at shutdown."""

    def __init__(self, vllm_config, environ=None):
        env = os.environ if environ is None else environ
        self.port = fpm_port(vllm_config, env)
        self.endpoint = fpm_endpoint(self.port, env)
        super().__init__(vllm_config, None, str(env.get(ENV_WORKER_ID, "")))
        self._pub = _Publisher(self._fpm, self.endpoint, self.worker_id, self.dp_rank)
        self._emit = self._pub.put
        logger.info("TandemScheduler: forward-pass metrics on %s (worker_id=%r, dp_rank=%d)",
                    self.endpoint, self.worker_id, self.dp_rank)

    @classmethod
    def from_env(cls, vllm_config) -> Optional["ForwardPassMetricsPublisher"]:
        """A publisher when Dynamo's FPM are enabled in this process, else None."""
        if not fpm_enabled():
            return None
        try:
            import dynamo.common.forward_pass_metrics  # noqa: F401
        except ImportError:
            logger.warning("TandemScheduler: %s/%s ask for Dynamo's forward-pass metrics but "
                           "the dynamo package is not importable; none are published",
                           ENV_PORT, ENV_TRACE)
            return None
        return cls(vllm_config)

    @property
    def dropped(self) -> int:
        """Messages dropped because the queue was full or the socket would block."""
        return self._pub.dropped

    def close(self) -> None:
        self._pub.close()
