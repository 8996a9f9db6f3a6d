"""TandemInstrumentedScheduler: Tandem's scheduling as a subclass of Dynamo's InstrumentedScheduler.

    python -m dynamo.vllm --model MODEL --benchmark-mode agg \\
        --scheduler-cls tandem.vllm.dynamo.TandemInstrumentedScheduler --no-async-scheduling

Importable only with Dynamo installed (ai-dynamo 1.6.1: dynamo.vllm.instrumented_scheduler);
tandem.vllm.dynamo resolves the name lazily and says so when Dynamo is missing.

The object is Dynamo's InstrumentedScheduler (a vLLM AsyncScheduler) with a TandemScheduler
inside. Two block owners share the engine's KV cache blocks, one at a time:
- vLLM's KV cache manager (built by InstrumentedScheduler's own constructor, over a view of the
  engine config with KV events and the KV connector off, so that nothing binds twice) serves
  only Dynamo's self-benchmark (--benchmark-mode): its warm-up, prefill and decode sweeps over
  the point grid inject synthetic requests and fake prefixes into that manager, and Dynamo's
  code times the forward passes and writes its results file. This measures the engine per batch
  shape; no real request is scheduled by it.
- The TandemScheduler (libtandem's block pool) schedules every real request. Requests that
  arrive while the benchmark runs are added to it at once but wait there: it is not stepped
  (so its pool allocates nothing) until the benchmark is over and vLLM's manager has returned
  every block (no request left, no output in flight, no deferred free, no finished id still to
  report, all blocks but the null block free; a block still held then is an error, never an
  overlap). From the next schedule() on, every call goes to Tandem and vLLM's manager is not
  used again. Dynamo's own InstrumentedScheduler, by contrast, schedules such a request
  together with the synthetic ones, and the benchmark aborts on the point check.
Without --benchmark-mode Tandem owns the blocks from the start: the class makes the decisions
of TandemScheduler (the same library, the same configuration).

Forward-pass metrics: one publisher, Dynamo's (_FpmPublisherThread, bound by
InstrumentedScheduler's constructor on DYN_FORWARDPASS_METRIC_PORT + dp rank, default 20380,
paused while the benchmark runs). Benchmark passes are kept in the results file as Dynamo
keeps them; Tandem's passes are computed by tandem/vllm/metrics.py's rules and handed to that
publisher, with the worker id read when each pass is reported, so Dynamo's
EngineCore.set_fpm_worker_id (snapshot mode: it sets the scheduler's _fpm_worker_id and the
publisher's) re-targets them too.

Not combined: --benchmark-mode with a kv_transfer_config (the benchmark's steps would need a
connector bound to vLLM's manager, which Tandem's connector is not); refused at start-up.
"""
from __future__ import annotations

import contextlib
import copy
import logging

from dynamo.vllm.instrumented_scheduler import InstrumentedScheduler

from .metrics import ForwardPassMetricsRecorder
from .scheduler import TandemScheduler

logger = logging.getLogger(__name__)

_BENCH_TAG = "tandem_benchmark_step"   # set on SchedulerOutputs that vLLM's manager produced


def _benchmark_config(vllm_config):
    return (getattr(vllm_config, "additional_config", None) or {}).get("benchmark")


def _manager_view(vllm_config):
    """The engine config InstrumentedScheduler's vLLM half is built over: KV events and the KV
    connector off (TandemScheduler owns both; vLLM's would bind the same endpoints)."""
    view = copy.copy(vllm_config)
    object.__setattr__(view, "kv_events_config", None)
    object.__setattr__(view, "kv_transfer_config", None)
    return view


class TandemInstrumentedScheduler(InstrumentedScheduler):
    """Dynamo's InstrumentedScheduler whose real traffic is scheduled by Tandem (module doc)."""

    def __init__(self, vllm_config, kv_cache_config, structured_output_manager,
                 block_size: int, hash_block_size=None, tandem_config=None, **kwargs) -> None:
        if _benchmark_config(vllm_config) and \
                getattr(vllm_config, "kv_transfer_config", None) is not None:
            raise ValueError("TandemInstrumentedScheduler: --benchmark-mode with a "
                             "--kv-transfer-config is not supported (Dynamo's benchmark runs on "
                             "vLLM's KV cache manager, the connector serves Tandem's); "
                             "benchmark a worker without the connector")
        self._in_vllm = 0
        self._tandem = None
        self._vllm_inflight = 0
        super().__init__(vllm_config=_manager_view(vllm_config), kv_cache_config=kv_cache_config,
                         structured_output_manager=structured_output_manager,
                         block_size=block_size, hash_block_size=hash_block_size, **kwargs)
        self.vllm_config = vllm_config
        try:
            recorder = ForwardPassMetricsRecorder(vllm_config, self._publisher.publish,
                                                  self._fpm_worker_id)
            self._tandem = TandemScheduler(
                vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                structured_output_manager=structured_output_manager, block_size=block_size,
                hash_block_size=hash_block_size, tandem_config=tandem_config,
                fpm_recorder=recorder, **kwargs)
        except BaseException:
            InstrumentedScheduler.shutdown(self)
            raise
        self._recorder = recorder
        self.connector = self._tandem.connector
        self.ec_connector = self._tandem.ec_connector
        self._vllm_owns = bool(self._bench_active)
        if not self._vllm_owns:
            self._tandem_requests()

    # ---- who owns the blocks ------------------------------------------------------------------
    # Dynamo's worker id: set_fpm_worker_id writes scheduler._fpm_worker_id; Tandem's recorder
    # reads the same value when it reports the next pass.
    @property
    def _fpm_worker_id(self) -> str:
        return self.__dict__.get("_tdm_fpm_worker_id", "")

    @_fpm_worker_id.setter
    def _fpm_worker_id(self, value: str) -> None:
        self.__dict__["_tdm_fpm_worker_id"] = value
        rec = self.__dict__.get("_recorder")
        if rec is not None:
            rec.worker_id = value

    @property
    def benchmark_running(self) -> bool:
        """True while vLLM's KV cache manager owns the blocks (Dynamo's benchmark, then its
        drain); real requests wait in Tandem meanwhile."""
        return self._vllm_owns

    @contextlib.contextmanager
    def _vllm(self):
        """Inside InstrumentedScheduler's / vLLM's code, self.* calls reach vLLM's methods."""
        self._in_vllm += 1
        try:
            yield
        finally:
            self._in_vllm -= 1

    def _vllm_drained(self) -> bool:
        """The benchmark is over and vLLM's manager holds nothing: hand the blocks to Tandem.
        Raises when everything is done but blocks are still held (never two owners)."""
        if self._bench_active or self._vllm_inflight or self.requests or self.finished_req_ids:
            return False
        if getattr(self, "deferred_frees", None):
            return False
        pool = self.kv_cache_manager.block_pool
        held = pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
        if held:
            raise RuntimeError(f"TandemInstrumentedScheduler: vLLM's KV cache manager still "
                               f"holds {held} blocks after Dynamo's benchmark; Tandem cannot "
                               f"take them over")
        return True

    def _tandem_requests(self) -> None:
        self._vllm_owns = False
        self.requests = self._tandem.requests
        logger.info("TandemInstrumentedScheduler: %s; Tandem schedules from now on",
                    "benchmark over, vLLM's KV cache manager empty" if self._bench_config_set()
                    else "no benchmark")

    def _bench_config_set(self) -> bool:
        return bool(_benchmark_config(self.vllm_config))

    def _vllm_step(self, so) -> bool:
        return getattr(so, _BENCH_TAG, False)

    # ---- steps -------------------------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False):
        if self._in_vllm:
            return super().schedule(throttle_prefills)
        if self._vllm_owns and self._vllm_drained():
            self._tandem_requests()
        if not self._vllm_owns:
            return self._tandem.schedule(throttle_prefills)
        with self._vllm():
            so = super().schedule(throttle_prefills)
        setattr(so, _BENCH_TAG, True)
        # Only a step that scheduled tokens can write (or fence) vLLM's blocks; an empty one
        # in flight (under async scheduling there always is one) does not delay the handover.
        if so.total_num_scheduled_tokens > 0:
            self._vllm_inflight += 1
        return so

    def update_from_output(self, scheduler_output, model_runner_output):
        if self._in_vllm:
            return super().update_from_output(scheduler_output, model_runner_output)
        if not self._vllm_step(scheduler_output):
            return self._tandem.update_from_output(scheduler_output, model_runner_output)
        if scheduler_output.total_num_scheduled_tokens > 0:
            self._vllm_inflight -= 1
        with self._vllm():
            return super().update_from_output(scheduler_output, model_runner_output)

    def get_grammar_bitmask(self, scheduler_output):
        if self._in_vllm or self._vllm_step(scheduler_output):
            with self._vllm():
                return super().get_grammar_bitmask(scheduler_output)
        return self._tandem.get_grammar_bitmask(scheduler_output)

    def update_draft_token_ids_in_output(self, draft_token_ids, scheduler_output) -> None:
        if self._in_vllm or self._vllm_step(scheduler_output):
            with self._vllm():
                return super().update_draft_token_ids_in_output(draft_token_ids,
                                                                scheduler_output)
        return self._tandem.update_draft_token_ids_in_output(draft_token_ids, scheduler_output)

    # ---- requests: the engine's go to Tandem, the benchmark's (inside vLLM's code) to vLLM ----
    def add_request(self, request) -> None:
        if self._in_vllm or self._tandem is None:
            return super().add_request(request)
        return self._tandem.add_request(request)

    def finish_requests(self, request_ids, finished_status):
        if self._in_vllm:
            return super().finish_requests(request_ids, finished_status)
        return self._tandem.finish_requests(request_ids, finished_status)

    def update_draft_token_ids(self, draft_token_ids) -> None:
        if self._in_vllm:
            return super().update_draft_token_ids(draft_token_ids)
        return self._tandem.update_draft_token_ids(draft_token_ids)

    def has_request(self, request_id: str) -> bool:
        return self._tandem.has_request(request_id)

    # ---- counts and state ----------------------------------------------------------------------
    def get_num_unfinished_requests(self) -> int:
        if self._in_vllm:
            return super().get_num_unfinished_requests()
        return self._tandem.get_num_unfinished_requests()

    def has_finished_requests(self) -> bool:
        if self._in_vllm:
            return super().has_finished_requests()
        if self._vllm_owns and len(self.finished_req_ids) > 0:
            return True
        return self._tandem.has_finished_requests()

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def has_requests(self) -> bool:
        if self._in_vllm:
            return super().has_requests()
        if self._vllm_owns:
            with self._vllm():
                if super().has_requests() or self._vllm_inflight:
                    return True
        return self._tandem.has_requests()

    def get_request_counts(self) -> tuple:
        if self._in_vllm:
            return super().get_request_counts()
        return self._tandem.get_request_counts()

    def get_kv_cache_usage(self) -> float:
        if self._in_vllm or self._vllm_owns:
            return super().get_kv_cache_usage()
        return self._tandem.get_kv_cache_usage()

    def make_stats(self, *args, **kwargs):
        if self._in_vllm:
            return super().make_stats(*args, **kwargs)
        return self._tandem.make_stats(*args, **kwargs)

    @property
    def pause_state(self):
        if self._in_vllm or self._tandem is None:
            return self._pause_state
        return self._tandem.pause_state

    def set_pause_state(self, pause_state) -> None:
        if self._tandem is not None and not self._in_vllm:
            self._tandem.set_pause_state(pause_state)
        super().set_pause_state(pause_state)

    def reset_prefix_cache(self, reset_running_requests: bool = False,
                           reset_connector: bool = False) -> bool:
        if self._in_vllm:
            return super().reset_prefix_cache(reset_running_requests, reset_connector)
        return self._tandem.reset_prefix_cache(reset_running_requests, reset_connector)

    def reset_encoder_cache(self) -> None:
        if self._in_vllm:
            return super().reset_encoder_cache()
        return self._tandem.reset_encoder_cache()

    def get_kv_connector(self):
        return self.connector

    def get_ec_connector(self):
        return self.ec_connector

    def get_kv_event_publisher_config(self):
        if self._in_vllm:
            return super().get_kv_event_publisher_config()
        return self._tandem.get_kv_event_publisher_config()

    def shutdown(self) -> None:
        conn, ec = self.connector, self.ec_connector
        self.connector = self.ec_connector = None    # Tandem's: closed by its own shutdown
        try:
            with self._vllm():
                super().shutdown()
        finally:
            self.connector, self.ec_connector = conn, ec
            if self._tandem is not None:
                self._tandem.shutdown()


__all__ = ["TandemInstrumentedScheduler"]
