"""TandemScheduler: vLLM v1's SchedulerInterface over libtandem.

    vllm serve MODEL --scheduler-cls tandem.vllm.TandemScheduler

Tandem decides; this class only translates. It keeps vLLM's Request objects (by a uint64 id
mapping, with one _Slot of cached per-request state), hands each request's prompt and stop
conditions to the Tandem scheduler, and turns each tdm_batch into a SchedulerOutput
(NewRequestData for first schedulings, CachedRequestData for continuing and resumed ones, the
preempted and finished ids) and each tdm_update_result into EngineCoreOutputs. The KV block
pool, prefix cache, budgets, chunked prefill, preemption and stop checks all run in the
library. The hot path (a decode step of many running requests) reads the library's arrays
once and builds vLLM's containers with C-level map/zip, not one Python call per request.

Metrics are vLLM's: request events (QUEUED at add, SCHEDULED at admission, PREEMPTED),
Request.prefill_stats (vLLM 0.32+; EngineCoreOutput.num_cached_tokens before), and
SchedulerStats / PrefixCacheStats filled as vLLM's Scheduler fills them; under NVIDIA Dynamo,
its ForwardPassMetrics when Dynamo turns them on (metrics.py, dynamo.py).

Requests of a kind Tandem does not schedule (structured output, multimodal inputs, prompt
embeddings, pooling) are finished with FINISHED_ERROR and a RequestError on the next
update_from_output, as vLLM reports a grammar that fails to compile; the engine keeps serving.
max_loras is honoured (requests of a further LoRA wait in the adapter), repetition_detection
is checked on each new token, and requests that skip prefix-cache reads (prompt logprobs) are
added with TDM_REQ_SKIP_PREFIX_CACHE.

Async scheduling (vLLM's default since 0.3x when the executor supports it): EngineCore calls
schedule() for step N+1 before update_from_output() for step N. The library's async mode
(async_scheduling) makes the decisions of vLLM's AsyncScheduler; this class keeps the vLLM
Request fields that AsyncScheduler keeps (num_output_placeholders, num_in_flight_tokens,
num_stale_output_tokens, is_prefill_chunk) and reports num_output_tokens with placeholders in
CachedRequestData as it does. Pipeline parallelism runs with async scheduling (vLLM's
default there): the library's decode_stagger spaces a request's decodes by the stage count, as
AsyncScheduler's next_decode_eligible_step does. Refused at start-up, naming the flag:
pipeline parallelism with --no-async-scheduling, async scheduling together with speculative
decoding,
hybrid KV cache groups, and the scheduler options the library does not reproduce
(--prefill-schedule-interval, --long-prefill-token-threshold-adaptive; see
_refuse_unmatched). --max-num-inflight-kv-loads (vLLM 0.34) is the library's
max_inflight_kv_loads.

vLLM 0.31-0.34 are supported, their differences detected by feature (the _HAS_* /
_PREFILL_IDS_* probes below, SchedulerConfig fields, Request attributes); a newer vLLM starts
with one warning naming the tested versions.
"""
from __future__ import annotations

import ctypes
import inspect
import logging
import time
from array import array
from collections import defaultdict, deque
from typing import Iterable, Optional

from vllm.v1.core.sched.interface import PauseState, SchedulerInterface
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.engine import EngineCoreOutput
from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats
from vllm.v1.request import Request, RequestStatus

import tandem
from tandem import FinishReason, TandemError

try:
    from vllm.v1.metrics.stats import KV_FETCH_STAGES
except ImportError:   # pragma: no cover - older vLLM
    KV_FETCH_STAGES = ()

from . import tandem_config as _tandem_cli
from ._outputs import (_K_CONT, _K_NEW, _K_RESUMED, _OUT, _PREEMPTED, _QUEUED, _RID,
                       _SCHEDULED, _STATUS_TO_REASON, OutputsMixin, _kwargs_for, _Slot)


def _vllm_version() -> tuple:
    """(major, minor) of the host's vLLM ("0.33.0rc1", "0.32.1.dev5+g1234" -> (0, 33), (0, 32))."""
    import re
    import vllm
    m = re.match(r"(\d+)\.(\d+)", str(getattr(vllm, "__version__", "0.0")))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


# The vLLM releases this adapter is tested against (make test-vllm, VLLM_VERSION=...).
TESTED_VLLM = ((0, 31), (0, 32), (0, 33), (0, 34))
_logger = logging.getLogger("tandem.vllm")
_warned_newer = False


def _warn_if_untested() -> None:
    """One warning per process for a vLLM newer than the tested range (its interfaces are
    detected by feature, so it may well work; a mismatch shows as a clear error)."""
    global _warned_newer
    v = _vllm_version()
    if v > TESTED_VLLM[-1] and not _warned_newer:
        _warned_newer = True
        import vllm
        _logger.warning("TandemScheduler is tested with vLLM %s; this is vLLM %s",
                        ", ".join(f"{a}.{b}" for a, b in TESTED_VLLM), vllm.__version__)


def _fields(cls) -> frozenset:
    f = getattr(cls, "__dataclass_fields__", None) or getattr(cls, "__struct_fields__", None)
    return frozenset(f or ())


# Interface differences between vLLM releases, detected by feature (attributes, signatures):
# 0.34 removed Model Runner V1: a resumed request is sent as NewRequestData with all its
# tokens (prefill_token_ids, now required), and CachedRequestData lost resumed_req_ids and
# all_token_ids.
_CRD_FIELDS = _fields(CachedRequestData)
_HAS_RESUMED_IDS = "resumed_req_ids" in _CRD_FIELDS
_HAS_ALL_TOKEN_IDS = "all_token_ids" in _CRD_FIELDS
# vLLM 0.33+: received KV loads wait in kv_holding_waiting, and a load is admitted only if it
# leaves in-flight prefills their blocks (_inflight_prefill_reserved_blocks)
try:
    from vllm.v1.core.sched.scheduler import Scheduler as _VllmScheduler
    _HAS_KV_HOLDING = hasattr(_VllmScheduler, "_inflight_prefill_reserved_blocks")
    # vLLM 0.33+: a KV consumer's blocks freed with batches in flight wait for their updates
    _HAS_DEFER_BLOCK_FREE = hasattr(_VllmScheduler, "_drain_deferred_frees")
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler as _VllmAsync
    # AsyncScheduler's PP decode cadence (next_decode_eligible_step, decode_stagger); vLLM
    # 0.31-0.33 apply it only with Model Runner V2 (0.34 has no other)
    _HAS_DECODE_STAGGER = "decode_stagger" in _VllmAsync.__init__.__code__.co_names
    _STAGGER_NEEDS_MRV2 = "use_v2_model_runner" in \
        _VllmAsync._update_after_schedule.__code__.co_names
except ImportError:   # pragma: no cover
    _HAS_KV_HOLDING = _HAS_DEFER_BLOCK_FREE = _HAS_DECODE_STAGGER = _STAGGER_NEEDS_MRV2 = False
_FROM_REQUEST = inspect.signature(NewRequestData.from_request).parameters
_PREFILL_IDS_ARG = "prefill_token_ids" in _FROM_REQUEST
_PREFILL_IDS_REQUIRED = (_PREFILL_IDS_ARG and _FROM_REQUEST["prefill_token_ids"].default
                         is inspect.Parameter.empty)


def _prefill_token_ids(request):
    """The tokens a (re)started request prefills: vLLM 0.34's Request.prefill_token_ids (the
    prompt object itself while no output exists, so it is sent once), else all tokens."""
    ids = getattr(request, "prefill_token_ids", None)
    return ids if ids is not None else list(request.all_token_ids)


def _prefix_hit_limit(request) -> Optional[int]:
    """The most prompt tokens a request may read from the prefix cache: vLLM 0.34's
    Request.prefix_cache_hit_limit (0 = no reads, None = unbounded), 0 for vLLM <= 0.33's
    skip_reading_prefix_cache."""
    if hasattr(request, "prefix_cache_hit_limit"):
        lim = request.prefix_cache_hit_limit
        return None if lim is None else int(lim)
    return 0 if getattr(request, "skip_reading_prefix_cache", False) else None


def _skips_external_kv(request) -> bool:
    """vLLM does not consult the KV connector for such requests (0.34:
    skip_reading_external_kv, any hit limit; older: skip_reading_prefix_cache)."""
    v = getattr(request, "skip_reading_external_kv", None)
    if v is not None:
        return bool(v)
    return bool(getattr(request, "skip_reading_prefix_cache", False))


def tandem_config_from_vllm(vllm_config, kv_cache_config, block_size: int) -> dict:
    """The Tandem configuration equivalent to a vLLM engine's scheduler and cache config."""
    sc = vllm_config.scheduler_config
    cc = vllm_config.cache_config
    budget = getattr(sc, "max_num_scheduled_tokens", None) or sc.max_num_batched_tokens
    policy = str(getattr(sc, "policy", "fcfs") or "fcfs").lower()
    # max_num_active_seqs (vLLM 0.33+) bounds admission into RUNNING only, as Tandem's
    # max_num_seqs does
    active = getattr(sc, "max_num_active_seqs", None) or sc.max_num_seqs
    cfg = {
        "max_num_batched_tokens": int(budget),
        "max_num_seqs": int(min(active, sc.max_num_seqs)),
        "max_model_len": int(vllm_config.model_config.max_model_len),
        "long_prefill_token_threshold": int(sc.long_prefill_token_threshold or 0),
        "enable_chunked_prefill": bool(sc.enable_chunked_prefill),
        "num_blocks": int(kv_cache_config.num_blocks),
        "block_size": int(block_size),
        "enable_prefix_caching": bool(cc.enable_prefix_caching),
        "policy": "priority" if policy == "priority" else "fcfs",
        "num_lookahead_tokens": int(getattr(vllm_config, "num_lookahead_tokens", 0) or 0),
        # Tandem hashes blocks only for requests without vLLM's digests (see _hash_size).
        "prefix_hash": "xxh3_128" if _hash_algo(cc).startswith("xxhash") else "sha256",
        # vLLM 0.33 admits a request only when its whole prompt fits (older ones: no such key)
        "reserve_full_prompt": bool(getattr(sc, "scheduler_reserve_full_isl", False)),
        "watermark": float(getattr(sc, "watermark", 0.0) or 0.0),
        # vLLM 0.33 goes on with the running requests after one that preempted itself
        "continue_after_self_preemption": _vllm_version() >= (0, 33),
        # EngineCore schedules step N+1 before it reports step N (vLLM's AsyncScheduler)
        "async_scheduling": bool(getattr(sc, "async_scheduling", False)),
    }
    # KV connector loads (P/D): vLLM 0.33+ queues received requests apart, ahead of the
    # waiting ones, and admits a load only if it leaves in-flight prefills their blocks
    # (detected by the scheduler's kv_holding_waiting queue); 0.34's
    # --max-num-inflight-kv-loads caps the loads holding blocks and starts them while the
    # batch is full; --kv-load-failure-policy (vLLM's default "fail") decides a failed load.
    ktc = getattr(vllm_config, "kv_transfer_config", None)
    if _HAS_KV_HOLDING and ktc is not None:   # only a KV connector loads
        cfg["kv_load_queues"] = True
    loads = getattr(sc, "max_num_inflight_kv_loads", None)
    if loads:
        cfg["max_inflight_kv_loads"] = int(loads)
    # vLLM 0.33+'s defer_block_free: with overlapping batches (async scheduling or pipeline
    # parallelism) and a consumer connector, the blocks of a request freed while a step of it
    # is in flight go back to the pool only once every batch scheduled so far is updated
    concurrent = int(getattr(vllm_config, "max_concurrent_batches", 1) or 1)
    if (_HAS_DEFER_BLOCK_FREE and ktc is not None and concurrent > 1 and
            bool(getattr(ktc, "is_kv_consumer", False))):
        cfg["defer_block_free"] = True
    # AsyncScheduler with pipeline parallelism: a request sampled in a step is next
    # scheduled pipeline_parallel_size steps later (next_decode_eligible_step)
    pp = int(getattr(vllm_config.parallel_config, "pipeline_parallel_size", 1) or 1)
    if pp > 1 and cfg["async_scheduling"] and _HAS_DECODE_STAGGER and (
            not _STAGGER_NEEDS_MRV2 or bool(getattr(vllm_config, "use_v2_model_runner", False))):
        cfg["decode_stagger"] = pp
    if ktc is not None and getattr(ktc, "kv_load_failure_policy", None) is not None:
        cfg["remote_kv_failure"] = ("fail" if ktc.kv_load_failure_policy == "fail"
                                    else "recompute")
    # vLLM 0.34: the long-prefill threshold applies only with chunked prefill, and
    # cache-aware admission (a window of the waiting queue reordered by cached-prefix depth
    # once the KV cache is that full). Both are detected by the config fields 0.34 added.
    fields = _fields(type(sc))
    if "cache_aware_admission_window" in fields:
        cfg["long_prefill_needs_chunking"] = True
        window = int(getattr(sc, "cache_aware_admission_window", 0) or 0)
        if window:
            cfg["cache_aware_window"] = window
            cfg["cache_aware_threshold"] = float(sc.cache_aware_admission_threshold)
    return cfg


def _refuse_unmatched(vllm_config) -> None:
    """Refuse, at start-up, the vLLM options whose behaviour TandemScheduler does not
    reproduce (rather than silently schedule otherwise than vLLM would)."""
    sc = vllm_config.scheduler_config
    pp = int(getattr(vllm_config.parallel_config, "pipeline_parallel_size", 1) or 1)
    if pp > 1 and not bool(getattr(sc, "async_scheduling", False)):
        # vLLM's synchronous PP sends each step's sampled tokens back in CachedRequestData,
        # which the adapter does not; with async scheduling (vLLM's default with PP) the
        # library staggers a request's decodes by the stage count, as AsyncScheduler does
        raise ValueError(f"TandemScheduler fills pipeline-parallel batch queues only with "
                         f"async scheduling (pipeline_parallel_size={pp}, "
                         f"--no-async-scheduling): drop --no-async-scheduling, or run with "
                         f"--pipeline-parallel-size 1")
    if bool(getattr(sc, "async_scheduling", False)) and (
            getattr(vllm_config, "speculative_config", None) is not None or
            int(getattr(vllm_config, "num_lookahead_tokens", 0) or 0) > 0):
        raise ValueError("TandemScheduler does not combine async scheduling with "
                         "speculative decoding: run with --no-async-scheduling, or "
                         "without --speculative-config")
    unmatched = (
        ("long_prefill_token_threshold_adaptive", False,
         "--long-prefill-token-threshold-adaptive", "leave it off"),
        ("prefill_schedule_interval", 1, "--prefill-schedule-interval", "leave it at 1"),
    )
    for attr, default, flag, what in unmatched:
        value = getattr(sc, attr, default)
        if value != default and not (default is False and not value):
            raise ValueError(f"TandemScheduler does not implement {flag} ({attr}={value!r}): "
                             f"{what}, or run vLLM's own scheduler")


def _hash_algo(cache_config) -> str:
    return str(getattr(cache_config, "prefix_caching_hash_algo", "sha256") or "sha256")


def _hash_size(vllm_config, block_size: int, hash_block_size: Optional[int]) -> int:
    """Bytes of vLLM's block digests when the adapter passes Request.block_hashes to Tandem
    (prefix caching on, digests over the scheduler's block size): sha256 and sha256_cbor give
    32, xxhash and xxhash_cbor 16 (xxh3_128). 0: Tandem hashes the blocks itself."""
    cc = vllm_config.cache_config
    if not cc.enable_prefix_caching or (hash_block_size and hash_block_size != block_size):
        return 0
    return 16 if _hash_algo(cc).startswith("xxhash") else 32


class TandemScheduler(OutputsMixin, SchedulerInterface):
    """vLLM v1 scheduler whose decisions are made by libtandem (see the module doc)."""

    def __init__(self, vllm_config, kv_cache_config, structured_output_manager,
                 block_size: int, hash_block_size: Optional[int] = None, mm_registry=None,
                 include_finished_set: bool = False, log_stats: bool = False,
                 tandem_config: Optional[dict] = None, fpm_recorder=None) -> None:
        self.vllm_config = vllm_config
        self.scheduler_config = vllm_config.scheduler_config
        self.cache_config = vllm_config.cache_config
        self.kv_cache_config = kv_cache_config
        self.structured_output_manager = structured_output_manager
        self.log_stats = log_stats
        self.block_size = block_size
        self.hash_block_size = int(hash_block_size or block_size)
        self.num_hash_lookahead_tokens = int(getattr(vllm_config, "num_hash_lookahead_tokens",
                                                     0) or 0)
        self.max_model_len = vllm_config.model_config.max_model_len
        _warn_if_untested()
        # Resumed requests go out as NewRequestData with all their tokens when the model
        # runner wants that: always on vLLM 0.34 (Model Runner V1 removed), with the V2
        # runner on 0.31-0.33.
        self.use_v2_model_runner = bool(getattr(vllm_config, "use_v2_model_runner", False))
        self._resumed_as_new = self.use_v2_model_runner or not _HAS_RESUMED_IDS
        # MRV1 (vLLM <= 0.33): all_token_ids of requests not scheduled in the previous step
        self._send_all_tokens = _HAS_ALL_TOKEN_IDS and not self._resumed_as_new
        self._mrope_kw = ({"uses_mrope": bool(getattr(vllm_config.model_config, "uses_mrope",
                                                      False))}
                          if "uses_mrope" in _FROM_REQUEST else {})
        self._async = bool(getattr(self.scheduler_config, "async_scheduling", False))
        _refuse_unmatched(vllm_config)
        if len(kv_cache_config.kv_cache_groups) > 1:
            raise ValueError("TandemScheduler supports one KV cache group (no hybrid models)")
        lc = getattr(vllm_config, "lora_config", None)
        self.max_loras = int(lc.max_loras) if lc is not None else 0
        self.connector = None
        self.ec_connector = None
        if getattr(vllm_config, "kv_transfer_config", None) is not None:
            from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
            from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
            self.connector = KVConnectorFactory.create_connector(
                config=vllm_config, role=KVConnectorRole.SCHEDULER,
                kv_cache_config=kv_cache_config)
        cfg = tandem_config_from_vllm(vllm_config, kv_cache_config, block_size)
        # --additional-config '{"tandem": ...}' (tandem_config.py); None: vLLM's behaviour
        cfg, tandem_opts = _tandem_cli.configure(vllm_config, cfg)
        if tandem_config:
            cfg.update(tandem_config)
        if cfg.get("policy") == "slo_adaptive":
            # not vLLM's schedule anyway: the SLO-adaptive policy keeps its own queues (an
            # explicit --max-num-inflight-kv-loads with it is refused by the library)
            cfg.pop("kv_load_queues", None)
        self.tandem_config = cfg
        self._load_queue = bool(cfg.get("max_inflight_kv_loads"))
        self.sched = _tandem_cli.create_scheduler(cfg, tandem_opts)
        from .kv_events import KVEventRelay
        self._kv_events = KVEventRelay(vllm_config, kv_cache_config, self.sched,
                                       lambda tid: self.requests.get(self._req_of.get(tid)))
        self._drafts = int(cfg.get("num_lookahead_tokens", 0) or 0) > 0
        self._caching = bool(cfg.get("enable_prefix_caching", True))
        fields = getattr(EngineCoreOutput, "__struct_fields__", None) or ()
        self._eco_has_prefill_stats = "prefill_stats" in fields
        self._eco_has_cached = "num_cached_tokens" in fields
        self._eco_has_error = "error" in fields

        self.requests: dict[str, Request] = {}
        self._id_of: dict[str, int] = {}
        self._req_of: dict[int, str] = {}
        self._slots: dict[int, _Slot] = {}
        self._next_id = 1
        self.finished_req_ids: set[str] = set()
        self.finished_req_ids_dict = defaultdict(set) if include_finished_set else None
        self.prev_step_scheduled_req_ids: set[str] = set()
        self._reset_preempted: set[str] = set()
        self._pause = PauseState.UNPAUSED
        self._held_new: list[Request] = []   # added while PAUSED_NEW
        self._pending: deque = deque()      # (SchedulerOutput, slots, tids) not yet updated
        self._held: set = set()       # tids whose blocks the connector sends (delay free)
        self._recv_aborted: dict = {}  # tids aborted while their KV load was in flight
        self._errors: dict = {}        # req_id -> (Request, RequestError): finished next update
        self._fresh: set = set()       # slots with events / prefill stats to hand out
        self._num_special = 0          # live slots that need the per-request output path
        self._lora_refs: dict[int, int] = {}   # LoRA id -> requests in the library
        self._lora_wait: deque = deque()       # requests waiting for a LoRA slot (max_loras)
        self._step_count = 0
        # vLLM's own block digests go to Tandem, so both prefix caches and the KV events
        # name blocks alike; _nhash: digests handed over so far, per tandem id.
        self._hash_size = _hash_size(vllm_config, block_size, hash_block_size)
        self._nhash: dict[int, int] = {}
        self._pcs = PrefixCacheStats() if log_stats else None
        # Dynamo's forward-pass metrics, when Dynamo enables them (tandem/vllm/metrics.py), or
        # into the recorder given (TandemInstrumentedScheduler: Dynamo's own publisher)
        if fpm_recorder is None:
            from .metrics import ForwardPassMetricsPublisher
            fpm_recorder = ForwardPassMetricsPublisher.from_env(vllm_config)
        self._fpm = fpm_recorder
        if tandem_opts and tandem_opts.get("steps_csv"):   # per-step CSV (steps_csv.py)
            from .steps_csv import StepRecorder
            StepRecorder(tandem_opts["steps_csv"]).install(self)

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        if self.log_stats:
            request.record_event(_QUEUED)
        reason = self._unsupported(request)
        if reason is not None:
            self._errors[request.request_id] = (request, reason)
            return
        if self.connector is not None:
            # before the request is queued (vLLM 0.34: may_load_async may use what it records)
            on_new = getattr(self.connector, "on_new_request", None)
            if on_new is not None:
                on_new(request)
        if self._pause != PauseState.UNPAUSED:
            self._held_new.append(request)
            return
        self._admit_lora_or_add(request)

    def _unsupported(self, request: Request) -> Optional[str]:
        """Why Tandem cannot schedule this request (None: it can)."""
        if request.prompt_token_ids is None:
            return "TandemScheduler does not schedule prompt embeddings"
        if request.mm_features:
            return "TandemScheduler does not schedule multimodal inputs"
        if request.pooling_params is not None:
            return "TandemScheduler does not schedule pooling requests"
        if getattr(request, "structured_output_request", None) is not None:
            return "TandemScheduler does not schedule structured output (grammars)"
        return None

    def _lora_id(self, request: Request) -> int:
        lr = request.lora_request
        return int(lr.lora_int_id) if lr is not None and lr.lora_int_id > 0 else 0

    def _admit_lora_or_add(self, request: Request) -> None:
        """max_loras: a request of a LoRA that is not among the (at most max_loras) LoRAs of
        the requests in the library waits in the adapter until one of them has drained."""
        lid = self._lora_id(request)
        if lid and self.max_loras and lid not in self._lora_refs and \
                len(self._lora_refs) >= self.max_loras:
            self._lora_wait.append(request)
            return
        self._add(request)

    def _lora_released(self, lid: int) -> None:
        n = self._lora_refs.get(lid, 0) - 1
        if n > 0:
            self._lora_refs[lid] = n
            return
        self._lora_refs.pop(lid, None)
        waiting, self._lora_wait = self._lora_wait, deque()
        for request in waiting:   # in arrival order; those that still do not fit wait on
            if request.request_id in self.requests and not request.is_finished():
                self._admit_lora_or_add(request)

    def _add(self, request: Request) -> None:
        sp = request.sampling_params
        rid = self._next_id
        salt = request.cache_salt or ""
        if request.lora_request is not None:
            salt += f"\x00lora:{request.lora_request.lora_int_id}"
        eos = getattr(sp, "eos_token_id", None)
        hashes = list(request.block_hashes) if self._hash_size else None
        if hashes is not None:
            salt = ""   # vLLM's digests already cover cache_salt and the LoRA
        limit = _prefix_hit_limit(request)
        r = tandem.Request(
            id=rid, prompt=request.prompt_token_ids, max_tokens=request.max_tokens,
            min_tokens=int(getattr(sp, "min_tokens", 0) or 0),
            eos_token_id=None if eos is None else int(eos),
            stop_token_ids=list(getattr(sp, "stop_token_ids", None) or ()),
            priority=int(request.priority), arrival_time=float(request.arrival_time),
            cache_salt=salt or None, ignore_eos=bool(getattr(sp, "ignore_eos", False)),
            block_hashes=hashes, block_hash_size=self._hash_size,
            skip_prefix_cache=limit == 0,
            prefix_hit_limit=limit if limit else None)
        if self.connector is not None:
            self._connector_prepare(request, r)
        self.sched.add(r)
        if hashes is not None:
            self._nhash[rid] = len(hashes)
        self._next_id += 1
        self._id_of[request.request_id] = rid
        self._req_of[rid] = request.request_id
        self.requests[request.request_id] = request
        slot = _Slot(rid, request.request_id, request)
        slot.remote = bool(r.remote_prefill)
        if getattr(request, "_block_hasher", None) is not None:
            slot.nh = self._next_hash_at(request)
        slot.lora = self._lora_id(request)
        if slot.lora:
            self._lora_refs[slot.lora] = self._lora_refs.get(slot.lora, 0) + 1
        self._slots[rid] = slot
        self._num_special += slot.special
        if self.log_stats or getattr(request, "prefill_stats", None) is not None:
            self._mark_fresh(slot)

    def _next_hash_at(self, request: Request) -> int:
        """The token count at which vLLM's block hasher next has a full block to hash."""
        return ((len(request.block_hashes) + 1) * self.hash_block_size +
                self.num_hash_lookahead_tokens)

    def _mark_fresh(self, slot: _Slot) -> None:
        slot.fresh = True
        self._fresh.add(slot)

    def _connector_prepare(self, request: Request, r: "tandem.Request") -> None:
        """A connector that loads the whole prompt remotely (P/D decode side) turns the
        request into a Tandem REMOTE_PREFILL request; one that will send it (P side) into a
        REMOTE_DECODE request."""
        params = request.kv_transfer_params or {}
        if params.get("do_remote_prefill") and not _skips_external_kv(request):
            r.remote_prefill = True
        if self._load_queue:   # --max-num-inflight-kv-loads: the load queue (vLLM 0.34)
            may = getattr(self.connector, "may_load_async", None)
            r.may_load_async = bool(may(request)) if may is not None else r.remote_prefill
        if params.get("do_remote_decode"):
            r.remote_decode = True

    def _start_remote_load(self, tid: int) -> None:
        """Blocks were reserved for a REMOTE_PREFILL request: hand them to the connector."""
        req_id = self._req_of.get(tid)
        request = self.requests.get(req_id) if req_id else None
        if request is None:
            return
        blocks = self.sched.request_blocks(tid)
        info = self.sched.request_info(tid)
        skip = info.num_cached_tokens // self.block_size

        class _Blocks:
            def get_block_ids(self, allow_none=False):
                return (list(blocks),)

            def get_unhashed_block_ids(self):
                return list(blocks[skip:])

        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        self.connector.update_state_after_alloc(
            request, _Blocks(), len(request.prompt_token_ids) - skip * self.block_size)

    def has_request(self, request_id: str) -> bool:
        return request_id in self.requests

    def finish_requests(self, request_ids, finished_status: RequestStatus) -> list:
        assert RequestStatus.is_finished(finished_status)
        if isinstance(request_ids, str):
            ids: Iterable[str] = (request_ids,)
        elif request_ids is None:
            ids = list(self.requests)
        else:
            ids = set(request_ids)
        reason = _STATUS_TO_REASON.get(finished_status, FinishReason.ABORT)
        done = []
        for req_id in ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            tid = self._id_of.get(req_id)
            if tid is None:     # never reached the library: held, rejected, waiting for LoRA
                for q in (self._held_new, self._lora_wait):
                    if request in q:
                        q.remove(request)
                self._errors.pop(req_id, None)
            elif reason == FinishReason.ABORT:
                if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                    # its blocks stay held until the connector reports the load done
                    self._recv_aborted[tid] = False   # True once a batch reported it
                self.sched.abort(tid)
            else:
                self.sched.finish(tid, reason)
            request.status = finished_status
            self._free_request(request, forget=tid is None)
            done.append(request)
        return done

    def _free_request(self, request: Request, forget: bool = False):
        """vLLM's bookkeeping when a request finishes; returns the connector's
        kv_transfer_params."""
        req_id = request.request_id
        params = None
        tid = self._id_of.get(req_id)
        if self.connector is not None and not forget:
            blocks = []
            if tid is not None:
                try:
                    blocks = self.sched.request_blocks(tid)
                except TandemError:
                    blocks = []
            delay, params = self.connector.request_finished(request, blocks)
            if tid is not None:
                if delay:
                    self._held.add(tid)
                else:
                    try:    # a REMOTE_DECODE request the connector does not send
                        self.sched.release(tid)
                    except TandemError:
                        pass
        slot = self._slots.get(tid) if tid is not None else None
        if slot is not None and slot.req is request:
            slot.req = None     # finished: the slot stays until the batch reports it
            self._num_special -= slot.special
            slot.special = True
            self._fresh.discard(slot)
            if slot.lora:
                self._lora_released(slot.lora)
        self.requests.pop(req_id, None)
        self.finished_req_ids.add(req_id)
        if self.finished_req_ids_dict is not None:
            self.finished_req_ids_dict[request.client_index].add(req_id)
        return params

    def _forget(self, tid: int):
        self._nhash.pop(tid, None)
        req_id = self._req_of.pop(tid, None)
        if req_id is not None:
            self._id_of.pop(req_id, None)
        self._slots.pop(tid, None)

    def _preempted(self, request: Request, ts: float) -> None:
        """vLLM's _preempt_request bookkeeping on the Request (the library freed its KV)."""
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        if self._async:     # the output in flight is stale (applied, counting nothing)
            request.num_stale_output_tokens = request.num_in_flight_tokens
            request.num_output_placeholders = 0
        request.num_preemptions += 1
        if self.log_stats:
            request.record_event(_PREEMPTED, ts)
        slot = self._slots.get(self._id_of.get(request.request_id))
        if slot is not None:
            self._mark_fresh(slot)

    # ---- schedule ----------------------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        if self._pending and not self._async:
            raise RuntimeError("TandemScheduler: schedule() called twice without "
                               "update_from_output() while async scheduling is off")
        if self._pause == PauseState.PAUSED_ALL:
            so = SchedulerOutput.make_empty()
            so.finished_req_ids = self.finished_req_ids
            self.finished_req_ids = set()
            return so
        ts = time.monotonic()
        b = self.sched.step_raw(now=time.time())
        self._step_count += 1
        # Read every array of the batch before any other library call.
        n = b.num_reqs
        total = b.total_tokens
        if n:
            tids = b.req_ids[:n]
            ntok = b.num_tokens[:n]
            ncomp = b.num_computed[:n]
            kinds = ctypes.string_at(b.kinds, n)
            offs = b.block_offsets[:n + 1]
            blocks = b.blocks[:offs[n]] if offs[n] else ()
            nspec = b.num_spec[:n] if self._drafts else None
        else:
            tids, ntok, ncomp, kinds, offs, blocks, nspec = [], [], [], b"", [0], (), None
        pre_ids = b.preempted_ids[:b.num_preempted] if b.num_preempted else ()
        fin_ids = b.finished_ids[:b.num_finished] if b.num_finished else ()
        recv = b.recv_ready_ids[:b.num_recv_ready] if b.num_recv_ready else ()

        # Preemptions first: they reset the vLLM Request's state.
        preempted = self._reset_preempted
        self._reset_preempted = set()
        for tid in pre_ids:
            slot = self._slots.get(tid)
            if slot is None or slot.req is None:
                continue
            self._preempted(slot.req, ts)
            preempted.add(slot.rid)
        for tid in fin_ids:
            req_id = self._req_of.get(tid)
            if req_id is not None:
                self.finished_req_ids.add(req_id)
                # held blocks: forgotten on finished_sending, or (an aborted load) on
                # finished_recving
                if tid in self._recv_aborted:
                    self._recv_aborted[tid] = True
                elif tid not in self._held:
                    self._forget(tid)
        if self.connector is not None:
            for tid in recv:
                self._start_remote_load(tid)

        slots = list(map(self._slots.__getitem__, tids))
        rids = list(map(_RID, slots))
        num_scheduled = dict(zip(rids, ntok))
        # Running (CONTINUING) entries come first in a batch: translate them in bulk.
        k = n - len(kinds.lstrip(b"\x02"))
        cached_ids = rids[:k]
        cached_computed = ncomp[:k]
        if offs[k] == 0:
            new_block_ids: list = [None] * k
        else:
            new_block_ids = [(blocks[offs[i]:offs[i + 1]],) if offs[i + 1] > offs[i] else None
                             for i in range(k)]
        if self._async:     # AsyncScheduler: the outputs in flight count
            if self._num_special == 0:     # s.out: the Request's output token list
                cached_outputs = [len(s.out) + s.req.num_output_placeholders
                                  for s in slots[:k]]
            else:
                cached_outputs = [s.req.num_output_tokens + s.req.num_output_placeholders
                                  for s in slots[:k]]
        elif self._num_special == 0:
            cached_outputs = list(map(len, map(_OUT, slots[:k])))
        else:
            cached_outputs = [s.req.num_output_tokens for s in slots[:k]]
        all_token_ids: dict = {}
        if self._send_all_tokens and k:
            for req_id in set(cached_ids).difference(self.prev_step_scheduled_req_ids):
                all_token_ids[req_id] = list(self.requests[req_id].all_token_ids)
        new_reqs: list = []
        resumed: set = set()
        for i in range(k, n):      # new, resumed (and, out of order, continuing) entries
            slot = slots[i]
            request = slot.req
            kind = kinds[i]
            req_id = slot.rid
            bl = blocks[offs[i]:offs[i + 1]]
            request.num_computed_tokens = ncomp[i]
            if kind != _K_CONT:
                self._admitted(slot, ncomp[i], ts)
            if kind == _K_NEW or (self._resumed_as_new and kind == _K_RESUMED):
                # The model runner (vLLM 0.34; the V2 runner before) takes resumed requests
                # as new ones, with their tokens.
                if request.status == RequestStatus.WAITING:
                    request.num_cached_tokens = ncomp[i]
                request.status = RequestStatus.RUNNING
                if self._resumed_as_new or _PREFILL_IDS_REQUIRED:
                    new_reqs.append(NewRequestData.from_request(
                        request, (bl,), _prefill_token_ids(request), **self._mrope_kw))
                else:
                    new_reqs.append(NewRequestData.from_request(request, (bl,),
                                                                **self._mrope_kw))
                continue
            cached_ids.append(req_id)
            if kind == _K_RESUMED:
                resumed.add(req_id)
                request.status = RequestStatus.RUNNING
            if self._send_all_tokens and req_id not in self.prev_step_scheduled_req_ids:
                all_token_ids[req_id] = list(request.all_token_ids)
            new_block_ids.append((bl,) if bl or kind == _K_RESUMED else None)
            cached_computed.append(ncomp[i])
            cached_outputs.append(request.num_output_tokens + request.num_output_placeholders
                                  if self._async else request.num_output_tokens)
        spec: dict = {}
        if nspec is not None and any(nspec):
            for i, ns in enumerate(nspec):
                if ns:
                    spec[rids[i]] = list(slots[i].req.spec_token_ids[:ns])
        cached = CachedRequestData(**_kwargs_for(
            CachedRequestData, req_ids=cached_ids, resumed_req_ids=resumed, new_token_ids=[],
            all_token_ids=all_token_ids, new_block_ids=new_block_ids,
            num_computed_tokens=cached_computed, num_output_tokens=cached_outputs))
        so = SchedulerOutput(**_kwargs_for(
            SchedulerOutput, scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled, total_num_scheduled_tokens=total,
            scheduled_spec_decode_tokens=spec, scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0], finished_req_ids=self.finished_req_ids,
            free_encoder_mm_hashes=[], preempted_req_ids=preempted))
        so.tandem_recv_ready = [self._req_of[t] for t in recv if t in self._req_of]
        if self.connector is not None:
            so.kv_connector_metadata = self.connector.build_connector_meta(so)
        # vLLM's _update_after_schedule: optimistic advance.
        if self._async:
            self._after_schedule_async(slots, ncomp, ntok)
        else:
            for slot, c, t in zip(slots, ncomp, ntok):
                c += t
                request = slot.req
                request.num_computed_tokens = c
                request.is_prefill_chunk = c < (len(slot.all) if slot.all is not None
                                                else request.num_tokens)
        for req_id in spec:
            self.requests[req_id].spec_token_ids = []
        if self._send_all_tokens:
            self.prev_step_scheduled_req_ids = set(num_scheduled)
        self.finished_req_ids = set()
        if n:
            self._pending.append((so, slots, rids, array("Q", tids), ntok))
        if self._fpm is not None:
            self._fpm.scheduled(so)
        return so

    @staticmethod
    def _after_schedule_async(slots, ncomp, ntok) -> None:
        """AsyncScheduler._update_after_schedule on the vLLM Requests: a request scheduled to
        sample (not a prefill chunk) holds one output placeholder more (the library holds the
        same count and decides with it)."""
        for slot, c, t in zip(slots, ncomp, ntok):
            c += t
            request = slot.req
            request.num_computed_tokens = c
            request.num_in_flight_tokens += t
            ph = request.num_output_placeholders
            if c < len(slot.all) + ph:   # slot.all: the request's token list (num_tokens)
                request.is_prefill_chunk = True
            else:
                request.is_prefill_chunk = False
                request.num_output_placeholders = ph + 1

    def _admitted(self, slot: _Slot, num_computed: int, ts: float) -> None:
        """A waiting request was admitted with num_computed tokens already there (its prefix
        hit): vLLM's SCHEDULED event, PrefixCacheStats record and Request.prefill_stats."""
        request = slot.req
        if self.log_stats:
            request.record_event(_SCHEDULED, ts)
        self._mark_fresh(slot)
        if slot.remote and request.num_preemptions <= 0:
            ps = getattr(request, "prefill_stats", None)
            if ps is not None:     # the remote prefill's tokens arrived from elsewhere
                ps.set(num_prompt_tokens=request.num_prompt_tokens, num_local_cached_tokens=0,
                       num_external_cached_tokens=min(num_computed, request.num_prompt_tokens))
            return
        if self._pcs is not None and self._caching and _prefix_hit_limit(request) != 0:
            self._pcs.record(num_tokens=request.num_tokens, num_hits=num_computed,
                             preempted=request.num_preemptions > 0)
        ps = getattr(request, "prefill_stats", None)
        if ps is not None and request.num_preemptions <= 0:
            ps.set(num_prompt_tokens=request.num_prompt_tokens,
                   num_local_cached_tokens=num_computed, num_external_cached_tokens=0)

    def get_grammar_bitmask(self, scheduler_output):
        return None

    def _append_hashes(self, tid: int, request: Request) -> None:
        """Hand the digests of blocks that filled (vLLM extends request.block_hashes as it
        appends tokens) to Tandem, which caches those blocks at its next step."""
        sent = self._nhash.get(tid, 0)
        if len(request.block_hashes) <= sent:
            return
        try:
            self.sched.append_block_hashes(tid, request.block_hashes[sent:], self._hash_size)
            self._nhash[tid] = len(request.block_hashes)
        except TandemError:
            pass    # a block without its digest is only not cached; scheduling is unaffected

    def update_draft_token_ids(self, draft_token_ids) -> None:
        for req_id, drafts in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids):
            request = self.requests.get(req_id)
            tid = self._id_of.get(req_id)
            if request is None or tid is None or request.is_finished():
                continue
            request.spec_token_ids = list(drafts)
            try:
                self.sched.set_draft_tokens(tid, list(drafts))
            except TandemError:
                request.spec_token_ids = []

    def update_draft_token_ids_in_output(self, draft_token_ids, scheduler_output) -> None:
        spec = scheduler_output.scheduled_spec_decode_tokens
        for req_id, drafts in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids):
            slot = spec.get(req_id)
            if slot is None:
                continue
            n = len(slot)
            spec[req_id] = (list(drafts) + [-1] * n)[:n]

    # ---- counts and state ------------------------------------------------------------------
    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def has_finished_requests(self) -> bool:
        # Held blocks (a connector still sending) keep the engine stepping so that the
        # worker's finished_sending reaches update_from_output and the blocks are released.
        return len(self.finished_req_ids) > 0 or len(self._held) > 0

    @property
    def pause_state(self) -> PauseState:
        return self._pause

    def set_pause_state(self, pause_state: PauseState) -> None:
        self._pause = PauseState(pause_state)
        if self._pause == PauseState.UNPAUSED:
            held, self._held_new = self._held_new, []
            for request in held:
                self._admit_lora_or_add(request)

    def reset_prefix_cache(self, reset_running_requests: bool = False,
                           reset_connector: bool = False) -> bool:
        running = []
        if reset_running_requests:
            running = [rid for rid, r in self.requests.items() if r.status == RequestStatus.RUNNING]
        try:
            self.sched.reset_prefix_cache(reset_running=reset_running_requests)
        except TandemError:
            return False
        if self._pcs is not None:
            self._pcs.reset = True
        ts = time.monotonic()
        for rid in reversed(running):    # vLLM preempts from the tail of its running list
            self._preempted(self.requests[rid], ts)
            self._reset_preempted.add(rid)
        if reset_running_requests:
            self.prev_step_scheduled_req_ids.clear()
        if reset_connector and self.connector is not None:
            reset = getattr(self.connector, "reset_cache", None)
            if reset is not None:
                reset()
        return True

    def reset_encoder_cache(self) -> None:
        return None

    def get_request_counts(self) -> tuple:
        st = self.sched.stats()
        return st.num_running, st.num_waiting + len(self._lora_wait) + len(self._held_new)

    def get_kv_cache_usage(self) -> float:
        return self.sched.stats().kv_usage

    def make_stats(self, *args, **kwargs):
        """SchedulerStats as vLLM's Scheduler fills them: running and waiting counts (waiting
        requests that cannot be admitted now, remote-KV waits and LoRA waits, counted as
        skipped), KV usage, and the prefix-cache lookups of the requests admitted since the
        previous call (PrefixCacheStats: requests, queries, hits, preempted_*)."""
        if not self.log_stats:
            return None
        st = self.sched.stats()
        pcs, self._pcs = self._pcs, PrefixCacheStats()
        skipped = st.num_waiting_remote_kv + len(self._lora_wait)
        waiting = st.num_waiting + len(self._lora_wait) + len(self._held_new)
        return SchedulerStats(**_kwargs_for(
            SchedulerStats, num_running_reqs=st.num_running,
            num_waiting_reqs=waiting - skipped, num_skipped_waiting_reqs=skipped,
            num_kv_fetch_reqs_by_stage=dict.fromkeys(KV_FETCH_STAGES, 0),
            kv_cache_usage=st.kv_usage, prefix_cache_stats=pcs))

    def get_kv_connector(self):
        return self.connector

    def get_ec_connector(self):
        return self.ec_connector

    def get_kv_event_publisher_config(self):
        return self._kv_events.publisher_config()

    def shutdown(self) -> None:
        self._kv_events.shutdown()
        if self._fpm is not None:
            self._fpm.close()
        if self.connector is not None:
            shut = getattr(self.connector, "shutdown", None)
            if shut is not None:
                shut()
        self.sched.close()
