"""TandemScheduler: vLLM v1's SchedulerInterface over libtandem.

    vllm serve MODEL --scheduler-cls tandem.vllm.TandemScheduler --no-async-scheduling

Tandem decides; this class only translates. It keeps vLLM's Request objects (by a uint64 id
mapping), hands each request's prompt and stop conditions to the Tandem scheduler, and turns
each tdm_batch into a SchedulerOutput (NewRequestData for first schedulings, CachedRequestData
for continuing and resumed ones, the preempted and finished ids) and each tdm_update_result into
EngineCoreOutputs. The KV block pool, prefix cache, budgets, chunked prefill, preemption and
stop checks all run in the library.

Not supported (refused with a clear error rather than run wrongly): async scheduling / batch
queues (two schedule() calls without update_from_output in between), multimodal inputs,
prompt embeddings, structured output (grammars), pooling models, hybrid KV cache groups. LoRA
requests are scheduled (without a max_loras cap) and kept out of each other's prefix cache.
"""
from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from typing import Iterable, Optional

from vllm.v1.core.sched.interface import PauseState, SchedulerInterface
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats
from vllm.v1.request import Request, RequestStatus

import tandem
from tandem import FinishReason, TandemError

_STATUS_TO_REASON = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}
_REASON_TO_STATUS = {
    FinishReason.STOP: RequestStatus.FINISHED_STOPPED,
    FinishReason.LENGTH: RequestStatus.FINISHED_LENGTH_CAPPED,
    FinishReason.ABORT: RequestStatus.FINISHED_ABORTED,
    FinishReason.ERROR: RequestStatus.FINISHED_ERROR,
}


_FIELDS: dict = {}


def _kwargs_for(cls, **kw):
    """Only the keyword arguments that cls accepts (vLLM's dataclasses grow between versions)."""
    fields = _FIELDS.get(cls)
    if fields is None:
        f = getattr(cls, "__dataclass_fields__", None) or getattr(cls, "__struct_fields__", None)
        fields = _FIELDS[cls] = frozenset(f) if f is not None else None
    if fields is None or fields.issuperset(kw):
        return kw
    return {k: v for k, v in kw.items() if k in fields}


def _vllm_version() -> tuple:
    """(major, minor) of the host's vLLM ("0.33.0rc1", "0.32.1.dev5+g1234" -> (0, 33), (0, 32))."""
    import re
    import vllm
    m = re.match(r"(\d+)\.(\d+)", str(getattr(vllm, "__version__", "0.0")))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def tandem_config_from_vllm(vllm_config, kv_cache_config, block_size: int) -> dict:
    """The Tandem configuration equivalent to a vLLM engine's scheduler and cache config."""
    sc = vllm_config.scheduler_config
    cc = vllm_config.cache_config
    budget = getattr(sc, "max_num_scheduled_tokens", None) or sc.max_num_batched_tokens
    policy = str(getattr(sc, "policy", "fcfs") or "fcfs").lower()
    cfg = {
        "max_num_batched_tokens": int(budget),
        "max_num_seqs": int(sc.max_num_seqs),
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
    }
    return cfg


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


class TandemScheduler(SchedulerInterface):
    """vLLM v1 scheduler whose decisions are made by libtandem (see the module doc)."""

    def __init__(self, vllm_config, kv_cache_config, structured_output_manager,
                 block_size: int, hash_block_size: Optional[int] = None, mm_registry=None,
                 include_finished_set: bool = False, log_stats: bool = False,
                 tandem_config: Optional[dict] = None) -> None:
        self.vllm_config = vllm_config
        self.scheduler_config = vllm_config.scheduler_config
        self.cache_config = vllm_config.cache_config
        self.kv_cache_config = kv_cache_config
        self.structured_output_manager = structured_output_manager
        self.log_stats = log_stats
        self.block_size = block_size
        self.max_model_len = vllm_config.model_config.max_model_len
        self.use_v2_model_runner = bool(getattr(vllm_config, "use_v2_model_runner", False))
        import inspect
        self._mrope_kw = ({"uses_mrope": bool(getattr(vllm_config.model_config, "uses_mrope",
                                                      False))}
                          if "uses_mrope" in inspect.signature(NewRequestData.from_request).parameters
                          else {})
        if getattr(self.scheduler_config, "async_scheduling", False):
            raise ValueError("TandemScheduler schedules one step at a time: run vLLM with "
                             "--no-async-scheduling")
        if len(kv_cache_config.kv_cache_groups) > 1:
            raise ValueError("TandemScheduler supports one KV cache group (no hybrid models)")
        self.connector = None
        self.ec_connector = None
        if getattr(vllm_config, "kv_transfer_config", None) is not None:
            from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
            from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
            self.connector = KVConnectorFactory.create_connector(
                config=vllm_config, role=KVConnectorRole.SCHEDULER,
                kv_cache_config=kv_cache_config)
        cfg = tandem_config_from_vllm(vllm_config, kv_cache_config, block_size)
        if tandem_config:
            cfg.update(tandem_config)
        self.tandem_config = cfg
        self.sched = tandem.Scheduler(cfg)
        from .kv_events import KVEventRelay
        self._kv_events = KVEventRelay(vllm_config, kv_cache_config, self.sched,
                                       lambda tid: self.requests.get(self._req_of.get(tid)))

        self.requests: dict[str, Request] = {}
        self._id_of: dict[str, int] = {}
        self._req_of: dict[int, str] = {}
        self._next_id = 1
        self.finished_req_ids: set[str] = set()
        self.finished_req_ids_dict = defaultdict(set) if include_finished_set else None
        self.prev_step_scheduled_req_ids: set[str] = set()
        self._reset_preempted: set[str] = set()
        self._pause = PauseState.UNPAUSED
        self._held_new: list[Request] = []   # added while PAUSED_NEW
        self._awaiting_update = False
        self._held: set = set()       # tids whose blocks the connector sends (delay free)
        self._step_count = 0
        self._prefix_q = 0
        self._prefix_h = 0
        # vLLM's own block digests go to Tandem, so both prefix caches and the KV events
        # name blocks alike; _nhash: digests handed over so far, per tandem id.
        self._hash_size = _hash_size(vllm_config, block_size, hash_block_size)
        self._nhash: dict[int, int] = {}

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if self._pause != PauseState.UNPAUSED:
            self._held_new.append(request)
            self.requests[request.request_id] = request
            return
        self._add(request)

    def _add(self, request: Request) -> None:
        if request.prompt_token_ids is None:
            raise ValueError("TandemScheduler does not schedule prompt embeddings")
        if request.mm_features:
            raise ValueError("TandemScheduler does not schedule multimodal inputs")
        if request.pooling_params is not None:
            raise ValueError("TandemScheduler does not schedule pooling requests")
        if getattr(request, "structured_output_request", None) is not None:
            raise ValueError("TandemScheduler does not schedule structured output")
        sp = request.sampling_params
        rid = self._next_id
        salt = request.cache_salt or ""
        if request.lora_request is not None:
            salt += f"\x00lora:{request.lora_request.lora_int_id}"
        eos = getattr(sp, "eos_token_id", None)
        hashes = list(request.block_hashes) if self._hash_size else None
        if hashes is not None:
            salt = ""   # vLLM's digests already cover cache_salt and the LoRA
        r = tandem.Request(
            id=rid, prompt=request.prompt_token_ids, max_tokens=request.max_tokens,
            min_tokens=int(getattr(sp, "min_tokens", 0) or 0),
            eos_token_id=None if eos is None else int(eos),
            stop_token_ids=list(getattr(sp, "stop_token_ids", None) or ()),
            priority=int(request.priority), arrival_time=float(request.arrival_time),
            cache_salt=salt or None, ignore_eos=bool(getattr(sp, "ignore_eos", False)),
            block_hashes=hashes, block_hash_size=self._hash_size)
        if self.connector is not None:
            self._connector_prepare(request, r)
        self.sched.add(r)
        if hashes is not None:
            self._nhash[rid] = len(hashes)
        self._next_id += 1
        self._id_of[request.request_id] = rid
        self._req_of[rid] = request.request_id
        self.requests[request.request_id] = request

    def _connector_prepare(self, request: Request, r: "tandem.Request") -> None:
        """A connector that loads the whole prompt remotely (P/D decode side) turns the
        request into a Tandem REMOTE_PREFILL request; one that will send it (P side) into a
        REMOTE_DECODE request."""
        params = request.kv_transfer_params or {}
        if params.get("do_remote_prefill"):
            r.remote_prefill = True
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
            held = request in self._held_new
            if held:
                self._held_new.remove(request)
            else:
                tid = self._id_of[req_id]
                if reason == FinishReason.ABORT:
                    self.sched.abort(tid)
                else:
                    self.sched.finish(tid, reason)
            request.status = finished_status
            self._free_request(request, forget=held)
            done.append(request)
        return done

    def _free_request(self, request: Request, forget: bool = False):
        """vLLM's bookkeeping when a request finishes; returns the connector's
        kv_transfer_params."""
        req_id = request.request_id
        params = None
        if self.connector is not None and not forget:
            tid = self._id_of.get(req_id)
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

    # ---- schedule ----------------------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        if self._awaiting_update:
            raise RuntimeError("TandemScheduler: schedule() called twice without "
                               "update_from_output() (async scheduling is not supported)")
        if self._pause == PauseState.PAUSED_ALL:
            so = SchedulerOutput.make_empty()
            so.finished_req_ids = self.finished_req_ids
            self.finished_req_ids = set()
            return so
        b = self.sched.step(now=time.time())
        self._step_count += 1
        # Preemptions first: they reset the vLLM Request's state.
        preempted = set(self._reset_preempted)
        self._reset_preempted = set()
        for tid in b.preempted:
            req_id = self._req_of.get(tid)
            request = self.requests.get(req_id) if req_id else None
            if request is None:
                continue
            request.status = RequestStatus.PREEMPTED
            request.num_computed_tokens = 0
            request.spec_token_ids = []
            request.num_preemptions += 1
            preempted.add(req_id)
        for tid in b.finished:
            req_id = self._req_of.get(tid)
            if req_id is not None:
                self.finished_req_ids.add(req_id)
                if tid not in self._held:     # held blocks: forgotten on finished_sending
                    self._forget(tid)
        if self.connector is not None:
            for tid in b.recv_ready:
                self._start_remote_load(tid)

        new_reqs: list = []
        cached_ids: list[str] = []
        resumed: set[str] = set()
        all_token_ids: dict[str, list[int]] = {}
        new_block_ids: list = []
        cached_computed: list[int] = []
        cached_outputs: list[int] = []
        num_scheduled: dict[str, int] = {}
        spec: dict[str, list[int]] = {}
        for e in b:
            req_id = self._req_of[e.req_id]
            request = self.requests[req_id]
            request.num_computed_tokens = e.num_computed
            num_scheduled[req_id] = e.num_tokens
            if e.num_spec:
                spec[req_id] = list(request.spec_token_ids[:e.num_spec])
            if e.kind == tandem.EntryKind.NEW or (self.use_v2_model_runner and
                                                  e.kind == tandem.EntryKind.RESUMED):
                # The v2 model runner takes resumed requests as new ones, with their tokens.
                if request.status == RequestStatus.WAITING:
                    request.num_cached_tokens = e.num_computed
                request.status = RequestStatus.RUNNING
                if self.use_v2_model_runner:
                    new_reqs.append(NewRequestData.from_request(
                        request, (list(e.blocks),), list(request.all_token_ids),
                        **self._mrope_kw))
                else:
                    new_reqs.append(NewRequestData.from_request(request, (list(e.blocks),),
                                                                **self._mrope_kw))
            else:
                cached_ids.append(req_id)
                if e.kind == tandem.EntryKind.RESUMED:
                    resumed.add(req_id)
                    request.status = RequestStatus.RUNNING
                if (not self.use_v2_model_runner and
                        req_id not in self.prev_step_scheduled_req_ids):
                    all_token_ids[req_id] = list(request.all_token_ids)
                new_block_ids.append((list(e.blocks),) if e.blocks or
                                     e.kind == tandem.EntryKind.RESUMED else None)
                cached_computed.append(e.num_computed)
                cached_outputs.append(request.num_output_tokens)
        cached = CachedRequestData(
            req_ids=cached_ids, resumed_req_ids=resumed, new_token_ids=[],
            all_token_ids=all_token_ids, new_block_ids=new_block_ids,
            num_computed_tokens=cached_computed, num_output_tokens=cached_outputs)
        so = SchedulerOutput(**_kwargs_for(
            SchedulerOutput, scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled, total_num_scheduled_tokens=b.total_tokens,
            scheduled_spec_decode_tokens=spec, scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0], finished_req_ids=self.finished_req_ids,
            free_encoder_mm_hashes=[], preempted_req_ids=preempted))
        so.tandem_recv_ready = [self._req_of[t] for t in b.recv_ready if t in self._req_of]
        if self.connector is not None:
            so.kv_connector_metadata = self.connector.build_connector_meta(so)
        # vLLM's _update_after_schedule: optimistic advance.
        for req_id, n in num_scheduled.items():
            request = self.requests[req_id]
            request.num_computed_tokens += n
            request.is_prefill_chunk = request.num_computed_tokens < request.num_tokens
            if req_id in spec:
                request.spec_token_ids = []
        self.prev_step_scheduled_req_ids = set(num_scheduled)
        self.finished_req_ids = set()
        self._awaiting_update = bool(num_scheduled)
        return so

    def get_grammar_bitmask(self, scheduler_output):
        return None

    # ---- update ------------------------------------------------------------------------------
    def update_from_output(self, scheduler_output, model_runner_output) -> dict:
        self._awaiting_update = False
        self._kv_events.collect()  # the schedule's events, while their requests are known
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        logprobs = model_runner_output.logprobs
        prompt_lp = getattr(model_runner_output, "prompt_logprobs_dict", None) or {}
        report = {}
        for req_id in scheduler_output.num_scheduled_tokens:
            tid = self._id_of.get(req_id)
            request = self.requests.get(req_id)
            if tid is None or request is None or request.is_finished():
                continue
            i = index.get(req_id)
            toks = list(sampled[i]) if (sampled and i is not None) else []
            report[tid] = toks
        result = self.sched.update(report, now=time.time())
        outputs: dict[int, list] = defaultdict(list)
        for u in result:
            req_id = self._req_of.get(u.req_id)
            request = self.requests.get(req_id) if req_id else None
            if request is None:
                continue
            toks = report.get(u.req_id, [])
            new = toks[:u.num_new_tokens]
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(req_id)
            if drafts and toks:
                request.num_computed_tokens -= len(drafts) + 1 - len(toks)
            for t in new:
                request.append_output_token_ids(t)
            stopped = u.finish_reason != FinishReason.NONE
            if (self._hash_size and not stopped and
                    len(request.block_hashes) > self._nhash.get(u.req_id, 0)):
                self._append_hashes(u.req_id, request)
            if stopped:
                request.num_computed_tokens -= len(toks) - len(new)
                request.status = _REASON_TO_STATUS[u.finish_reason]
                if (u.stop_token is not None and u.finish_reason == FinishReason.STOP and
                        u.stop_token in (request.sampling_params.stop_token_ids or ())):
                    request.stop_reason = u.stop_token
            if not new and not stopped:
                continue
            kv_params = self._free_request(request) if stopped else None
            new_logprobs = None
            i = index.get(req_id)
            if (logprobs is not None and i is not None and new and
                    request.sampling_params.logprobs is not None):
                new_logprobs = logprobs.slice_request(i, len(new))
            outputs[request.client_index].append(EngineCoreOutput(**_kwargs_for(
                EngineCoreOutput, request_id=req_id, new_token_ids=new,
                finish_reason=request.get_finished_reason() if stopped else None,
                new_logprobs=new_logprobs,
                new_prompt_logprobs_tensors=prompt_lp.get(req_id),
                stop_reason=request.stop_reason, events=request.take_events(),
                kv_transfer_params=kv_params, trace_headers=request.trace_headers,
                num_cached_tokens=request.num_cached_tokens)))
        kvo = getattr(model_runner_output, "kv_connector_output", None)
        if self.connector is not None and kvo is not None:
            self.connector.update_connector_output(kvo)
            invalid = set(getattr(kvo, "invalid_block_ids", None) or ())
            failed = set(getattr(kvo, "failed_recving", None) or ())
            for req_id in set(kvo.finished_recving or ()) | failed:
                tid = self._id_of.get(req_id)
                if tid is None:
                    continue
                blocks = self.sched.request_blocks(tid)
                bad = [i for i, blk in enumerate(blocks) if blk in invalid]
                try:
                    if bad or req_id in failed:
                        valid = (bad[0] if bad else 0) * self.block_size
                        self.sched.remote_kv_done(tid, ok=False, num_valid_tokens=valid)
                    else:
                        self.sched.remote_kv_done(tid, ok=True)
                except TandemError:
                    continue
                request = self.requests.get(req_id)
                if request is not None and request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                    request.status = RequestStatus.WAITING
            for req_id in (kvo.finished_sending or ()):
                tid = self._id_of.get(req_id)
                if tid is not None:
                    try:
                        self.sched.release(tid)
                    except TandemError:
                        pass
                    self._held.discard(tid)
                    self._forget(tid)
        eco = {ci: EngineCoreOutputs(outputs=outs) for ci, outs in outputs.items()}
        if self.finished_req_ids_dict:
            for ci, fin in self.finished_req_ids_dict.items():
                if ci in eco:
                    eco[ci].finished_requests = fin
                else:
                    eco[ci] = EngineCoreOutputs(finished_requests=fin)
            self.finished_req_ids_dict.clear()
        self._kv_events.publish(self.connector)
        stats = self.make_stats()
        if stats is not None:
            e = next(iter(eco.values()), None)
            if e is None:
                e = eco[0] = EngineCoreOutputs()
            e.scheduler_stats = stats
        return eco

    def _append_hashes(self, tid: int, request: Request) -> None:
        """Hand the digests of blocks that filled (vLLM extends request.block_hashes as it
        appends tokens) to Tandem, which caches those blocks at its next step."""
        sent = self._nhash.get(tid, 0)
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
                self.requests.pop(request.request_id, None)
                self._add(request)

    def reset_prefix_cache(self, reset_running_requests: bool = False,
                           reset_connector: bool = False) -> bool:
        running = []
        if reset_running_requests:
            running = [rid for rid, r in self.requests.items() if r.status == RequestStatus.RUNNING]
        try:
            self.sched.reset_prefix_cache(reset_running=reset_running_requests)
        except TandemError:
            return False
        for rid in running:
            request = self.requests[rid]
            request.status = RequestStatus.PREEMPTED
            request.num_computed_tokens = 0
            request.spec_token_ids = []
            request.num_preemptions += 1
            self._reset_preempted.add(rid)
        if reset_connector and self.connector is not None:
            reset = getattr(self.connector, "reset_cache", None)
            if reset is not None:
                reset()
        return True

    def reset_encoder_cache(self) -> None:
        return None

    def get_request_counts(self) -> tuple:
        st = self.sched.stats()
        return st.num_running, st.num_waiting

    def get_kv_cache_usage(self) -> float:
        return self.sched.stats().kv_usage

    def make_stats(self, *args, **kwargs):
        if not self.log_stats:
            return None
        st = self.sched.stats()
        pcs = PrefixCacheStats()
        q, h = st.prefix_queries - self._prefix_q, st.prefix_hits - self._prefix_h
        self._prefix_q, self._prefix_h = st.prefix_queries, st.prefix_hits
        if hasattr(pcs, "queries"):
            pcs.queries = q
            pcs.hits = h
        return SchedulerStats(**_kwargs_for(
            SchedulerStats, num_running_reqs=st.num_running, num_waiting_reqs=st.num_waiting,
            step_counter=self._step_count, kv_cache_usage=st.kv_usage, prefix_cache_stats=pcs))

    def get_kv_connector(self):
        return self.connector

    def get_ec_connector(self):
        return self.ec_connector

    def get_kv_event_publisher_config(self):
        return self._kv_events.publisher_config()

    def shutdown(self) -> None:
        self._kv_events.shutdown()
        if self.connector is not None:
            shut = getattr(self.connector, "shutdown", None)
            if shut is not None:
                shut()
        self.sched.close()
