"""The output half of TandemScheduler (scheduler.py): per-request state kept between steps
(_Slot) and update_from_output, which hands a step's sampled tokens to tdm_sched_update as
buffers and turns the library's result into vLLM's EngineCoreOutputs. The decode hot path (every
request took all its tokens, none finished, nothing special asked for) appends the tokens to
vLLM's Request token lists and builds the outputs with C-level map() calls; everything else
(finishes, drafts, repetition detection, logprobs, trace headers, other clients) takes the
per-request path, which mirrors vLLM's Scheduler.update_from_output line by line.
"""
from __future__ import annotations

import ctypes
import time
from array import array
from collections import defaultdict
from itertools import accumulate, chain
from operator import attrgetter

from vllm.v1.engine import EngineCoreEventType, EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import Request, RequestStatus

from tandem import FinishReason, TandemError

try:    # vLLM 0.32+
    from vllm.outputs import RequestError
except ImportError:   # pragma: no cover - older vLLM
    RequestError = None
try:
    from vllm.v1.core.sched.utils import check_sequence_repetition
except ImportError:   # pragma: no cover - older vLLM
    check_sequence_repetition = None

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


try:    # vLLM 0.34: a request's token lists are int32 arrays (TokenBuffer, array('i'))
    from vllm.v1.token_buffer import TokenBuffer
except ImportError:   # pragma: no cover - older vLLM
    TokenBuffer = None
# The type of Request._all_token_ids and its extend, used directly on the hot path.
_ALL_TYPE = TokenBuffer if TokenBuffer is not None else list
_ALL_EXTEND = _ALL_TYPE.extend

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


_REPETITION = getattr(RequestStatus, "FINISHED_REPETITION", None)
if _REPETITION is not None:
    _STATUS_TO_REASON[_REPETITION] = FinishReason.STOP

_QUEUED = EngineCoreEventType.QUEUED
_SCHEDULED = EngineCoreEventType.SCHEDULED
_PREEMPTED = EngineCoreEventType.PREEMPTED
_K_NEW, _K_RESUMED, _K_CONT = 0, 1, 2
_NO_HASH = 1 << 62


class _Slot:
    """What the adapter keeps per request between steps: the ids, vLLM's Request and its
    token lists (appended to directly on the hot path), when its block hasher next has a full
    block to hash, and whether it needs the per-request (slow) output path."""
    __slots__ = ("tid", "rid", "req", "out", "all", "nh", "special", "remote", "lora",
                 "fresh", "rep")

    def __init__(self, tid, rid, req):
        self.tid = tid
        self.rid = rid
        self.req = req
        self.out = getattr(req, "_output_token_ids", None)
        self.all = getattr(req, "_all_token_ids", None)
        self.nh = _NO_HASH
        self.remote = False
        self.lora = 0
        self.fresh = False
        sp = req.sampling_params
        self.rep = getattr(sp, "repetition_detection", None) if sp is not None else None
        if self.rep is not None and not (self.rep.max_pattern_size > 0 and self.rep.min_count >= 2):
            self.rep = None
        self.special = (type(self.out) is not list or type(self.all) is not _ALL_TYPE or
                        req.client_index != 0 or req.trace_headers is not None or
                        (sp is not None and (sp.logprobs is not None or
                                             sp.prompt_logprobs is not None)) or
                        self.rep is not None)


_RID = attrgetter("rid")
_OUT = attrgetter("out")
_ALL = attrgetter("all")
_TID = attrgetter("tid")



class OutputsMixin:
    """update_from_output and its helpers; mixed into TandemScheduler."""

    # ---- update ------------------------------------------------------------------------------
    def _take_pending(self, scheduler_output):
        for j, ent in enumerate(self._pending):
            if ent[0] is scheduler_output:
                del self._pending[j]
                return ent
        return None

    def update_from_output(self, scheduler_output, model_runner_output) -> dict:
        ent = self._take_pending(scheduler_output)
        self._kv_events.collect()  # the schedule's events, while their requests are known
        outputs: dict[int, list] = defaultdict(list)
        if ent is not None:
            self._apply_outputs(ent, scheduler_output, model_runner_output, outputs)
        if self._errors:
            self._finish_errors(outputs)
        self._connector_output(model_runner_output, outputs)
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
        if self._fpm is not None:
            self._fpm.updated(scheduler_output, self.requests)
        return eco

    def _apply_outputs(self, ent, so, mro, outputs) -> None:
        _, slots, rids, tid_arr, ntok = ent
        n = len(slots)
        sampled = mro.sampled_token_ids
        if sampled and len(sampled) == n and mro.req_ids == rids:
            toks = sampled
        else:   # the worker's order may differ (vLLM 0.34 has no req_id_to_index)
            index = getattr(mro, "req_id_to_index", None)
            if index is None:
                index = dict(zip(mro.req_ids, range(len(mro.req_ids))))
            toks = [sampled[i] if (sampled and i is not None) else []
                    for i in map(index.get, rids)]
        lens = list(map(len, toks))
        if self._async:
            self._resolve_placeholders(slots, lens, ntok)
        offs = array("I", [0])
        offs.extend(accumulate(lens))
        flat = array("i", chain.from_iterable(toks))
        r = self.sched.update_raw(tid_arr, offs, flat, now=time.time())
        m = r.num_reqs
        res_tids = r.req_ids[:m] if m else []
        nnew = r.num_new_tokens[:m] if m else []
        reasons = ctypes.string_at(r.finish_reasons, m) if m else b""
        stops = r.stop_tokens[:m] if (m and reasons.count(0) != m) else None
        spec = so.scheduled_spec_decode_tokens
        if (m == n and self._num_special == 0 and not spec and stops is None and
                nnew == lens and 0 not in lens and res_tids == tid_arr.tolist()):
            # Every request took all its tokens and none finished: the decode hot path.
            list(map(list.extend, map(_OUT, slots), toks))
            list(map(_ALL_EXTEND, map(_ALL, slots), toks))
            for slot in slots:
                if len(slot.all) >= slot.nh:
                    self._rehash(slot)
            outs = list(map(EngineCoreOutput, rids, toks))
            if self._fresh:
                for i, slot in enumerate(slots):
                    if slot.fresh:
                        self._first_output_fields(slot, outs[i])
            outputs[0].extend(outs)
            return
        pos = dict(zip(tid_arr.tolist(), range(n)))
        for j in range(m):
            slot = self._slots.get(res_tids[j])
            if slot is None or slot.req is None:
                continue
            i = pos.get(res_tids[j])
            if i is None:
                continue
            self._apply_one(slot, toks[i], nnew[j], reasons[j],
                            stops[j] if stops is not None else -1, so, mro, i, outputs)

    @staticmethod
    def _resolve_placeholders(slots, lens, ntok) -> None:
        """AsyncScheduler's bookkeeping as a step's output arrives: the step is no longer in
        flight; a preempted request's stale share drains; a running request's returned tokens
        resolve its placeholders (the library applies the same rules). ntok: the tokens each
        request was scheduled in that step."""
        running = RequestStatus.RUNNING
        for slot, k, t in zip(slots, lens, ntok):
            request = slot.req
            if request is None:     # finished since it was scheduled: output skipped
                continue
            request.num_in_flight_tokens -= t
            if request.num_stale_output_tokens > 0:
                request.num_stale_output_tokens -= t
                continue
            if k:
                ph = request.num_output_placeholders
                if ph and request.status == running:
                    request.num_output_placeholders = ph - k if ph > k else 0

    def _rehash(self, slot: _Slot) -> None:
        request = slot.req
        request.update_block_hashes()
        slot.nh = self._next_hash_at(request)
        if self._hash_size:     # the new digests go to Tandem too (see _append_hashes)
            self._append_hashes(slot.tid, request)

    def _first_output_fields(self, slot: _Slot, out) -> None:
        """The events and prefill stats a request carries on its next output."""
        request = slot.req
        slot.fresh = False
        self._fresh.discard(slot)
        ev = request.take_events() if self.log_stats else None
        if ev:
            out.events = ev
        if self._eco_has_prefill_stats:
            ps = request.take_prefill_stats()
            if ps is not None:
                ps.finalize(self._estimate_cached_tokens(request))
                out.prefill_stats = ps
        if self._eco_has_cached:
            out.num_cached_tokens = request.num_cached_tokens

    def _estimate_cached_tokens(self, request: Request) -> int:
        """vLLM's kv_cache_manager.estimate_cached_tokens: the tokens of the request's full,
        hashed blocks (its computed full blocks are all cached when prefix caching is on)."""
        if not self._caching:
            return 0
        done = min(request.num_computed_tokens, request.num_tokens)
        return done // self.block_size * self.block_size

    def _append(self, slot: _Slot, new) -> None:
        if type(slot.out) is list and type(slot.all) is _ALL_TYPE:
            slot.out.extend(new)
            slot.all.extend(new)
            if len(slot.all) >= slot.nh:
                self._rehash(slot)
        else:
            slot.req.append_output_token_ids(list(new))   # runs vLLM's block hasher
            if self._hash_size:
                self._append_hashes(slot.tid, slot.req)

    def _apply_one(self, slot, toks, num_new, reason, stop_token, so, mro, i, outputs) -> None:
        """One request's output, with everything the hot path leaves out (finishes, drafts,
        repetition detection, logprobs, trace headers, other clients)."""
        request = slot.req
        req_id = slot.rid
        toks = list(toks)
        new = toks[:num_new]
        drafts = so.scheduled_spec_decode_tokens.get(req_id)
        if drafts and toks:
            request.num_computed_tokens -= len(drafts) + 1 - len(toks)
        stopped = reason != FinishReason.NONE
        if slot.rep is not None and new and check_sequence_repetition is not None:
            # vLLM's check_stop after each token: EOS / stop tokens / length first, then
            # (past min_tokens) repetition.
            min_tokens = int(getattr(request.sampling_params, "min_tokens", 0) or 0)
            base = request.num_output_tokens
            for k in range(1, len(new) + 1):
                self._append(slot, new[k - 1:k])
                if base + k >= min_tokens and check_sequence_repetition(
                        request.output_token_ids, slot.rep):
                    if not (stopped and k == len(new)):
                        new = new[:k]
                        stopped = True
                        reason = -1
                    break
        elif new:
            self._append(slot, new)
        if stopped:
            request.num_computed_tokens -= len(toks) - len(new)
            if reason == -1:    # repetition, detected here
                request.status = _REPETITION
                request.stop_reason = "repetition_detected"
                try:
                    self.sched.finish(slot.tid, FinishReason.STOP)
                except TandemError:
                    pass
            else:
                request.status = _REASON_TO_STATUS[FinishReason(reason)]
                if (stop_token >= 0 and reason == FinishReason.STOP and
                        stop_token in (request.sampling_params.stop_token_ids or ())):
                    request.stop_reason = stop_token
        if not new and not stopped:
            return
        kv_params = self._free_request(request) if stopped else None
        new_logprobs = None
        logprobs = mro.logprobs
        if (logprobs is not None and new and
                request.sampling_params.logprobs is not None):
            new_logprobs = logprobs.slice_request(i, len(new))
        prompt_lp = getattr(mro, "prompt_logprobs_dict", None) or {}
        out = EngineCoreOutput(**_kwargs_for(
            EngineCoreOutput, request_id=req_id, new_token_ids=new,
            finish_reason=request.get_finished_reason() if stopped else None,
            new_logprobs=new_logprobs,
            new_prompt_logprobs_tensors=prompt_lp.get(req_id),
            stop_reason=request.stop_reason, kv_transfer_params=kv_params,
            trace_headers=request.trace_headers))
        if slot.fresh or stopped:
            slot.req = request     # _free_request cleared it; the output still needs it
            self._first_output_fields(slot, out)
            if stopped:
                slot.req = None
        outputs[request.client_index].append(out)

    def _finish_errors(self, outputs) -> None:
        """Requests Tandem does not schedule: finished with an error, as vLLM finishes a
        request whose grammar failed to compile (the engine keeps serving the others)."""
        errors, self._errors = self._errors, {}
        for req_id, (request, message) in errors.items():
            if self.requests.get(req_id) is not request or request.is_finished():
                continue
            request.status = RequestStatus.FINISHED_ERROR
            self._free_request(request, forget=True)
            kw = {}
            if self._eco_has_error and RequestError is not None:
                kw["error"] = RequestError(code="validation_error", message=message)
            outputs[request.client_index].append(EngineCoreOutput(
                request_id=req_id, new_token_ids=[],
                finish_reason=request.get_finished_reason(),
                events=request.take_events() if self.log_stats else None,
                trace_headers=request.trace_headers, **kw))

    def _connector_output(self, model_runner_output, outputs) -> None:
        kvo = getattr(model_runner_output, "kv_connector_output", None)
        if self.connector is None or kvo is None:
            return
        self.connector.update_connector_output(kvo)
        invalid = set(getattr(kvo, "invalid_block_ids", None) or ())
        failed = set(getattr(kvo, "failed_recving", None) or ())
        for req_id in set(kvo.finished_recving or ()) | failed:
            tid = self._id_of.get(req_id)
            if tid is None:
                continue
            if tid in self._recv_aborted:   # aborted while loading: its blocks are free now
                reported = self._recv_aborted.pop(tid)
                try:
                    self.sched.remote_kv_done(tid, ok=True)
                except TandemError:
                    pass
                if reported:
                    self._forget(tid)
                continue
            blocks = self.sched.request_blocks(tid)
            bad = [i for i, blk in enumerate(blocks) if blk in invalid]
            try:
                if bad or req_id in failed:
                    valid = (bad[0] if bad else 0) * self.block_size
                    self.sched.remote_kv_done(tid, ok=False, num_valid_tokens=valid)
                    failed_now = self.sched.request_info(tid).finish_reason == FinishReason.ERROR
                else:
                    self.sched.remote_kv_done(tid, ok=True)
                    failed_now = False
            except TandemError:
                continue
            request = self.requests.get(req_id)
            if failed_now and request is not None and not request.is_finished():
                # --kv-load-failure-policy fail (vLLM's default): the library finished the
                # request with an error; vLLM reports it in this update
                request.status = RequestStatus.FINISHED_ERROR
                self._free_request(request)
                outputs[request.client_index].append(EngineCoreOutput(
                    request_id=req_id, new_token_ids=[],
                    finish_reason=request.get_finished_reason(),
                    events=request.take_events() if self.log_stats else None,
                    trace_headers=request.trace_headers))
                continue
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
