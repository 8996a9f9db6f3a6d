"""The scheduler: a Pythonic wrapper of tdm_sched (include/tandem.h).

Scheduler owns one tdm_sched handle (closed by close(), the context manager, or garbage
collection). Batch and UpdateResult are plain Python copies of the library's struct-of-arrays
results, so they stay valid after the next call. A Scheduler is not thread-safe (like the C
handle): serialise calls on one instance.
"""
from __future__ import annotations

import ctypes
import json
import time
from array import array
from ctypes import POINTER, byref, c_char_p, c_int64, c_size_t, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from . import _lib
from .errors import Status, TandemError


class Param(IntEnum):
    MAX_NUM_BATCHED_TOKENS = 1
    MAX_NUM_SEQS = 2
    MAX_MODEL_LEN = 3
    LONG_PREFILL_TOKEN_THRESHOLD = 4
    ENABLE_CHUNKED_PREFILL = 5
    NUM_BLOCKS = 6
    BLOCK_SIZE = 7
    ENABLE_PREFIX_CACHING = 8
    WATERMARK_PPM = 9
    POLICY = 10
    MODE = 11
    TBT_TARGET_US = 12
    NUM_LOOKAHEAD_TOKENS = 13
    ROLE = 14
    REMOTE_KV_FAILURE = 15
    REMOTE_KV_TIMEOUT_MS = 16
    DELAY_FREE_TIMEOUT_MS = 17
    MAX_NUM_PARTIAL_PREFILLS = 18
    PREFIX_HASH = 19
    RESERVE_FULL_PROMPT = 20
    CONTINUE_AFTER_SELF_PREEMPTION = 21
    ENABLE_KV_EVENTS = 22
    KV_EVENTS_CAPACITY = 23
    ASYNC_SCHEDULING = 24
    SLO_TTFT_US = 25
    SLO_TPOT_US = 26
    LONG_PREFILL_NEEDS_CHUNKING = 27
    CACHE_AWARE_WINDOW = 28
    CACHE_AWARE_THRESHOLD_PPM = 29
    MAX_INFLIGHT_KV_LOADS = 30
    KV_LOAD_QUEUES = 31
    DEFER_BLOCK_FREE = 32
    DECODE_STAGGER = 33


class PrefixHash(IntEnum):
    """The block digest of the prefix cache (JSON key "prefix_hash")."""
    SHA256 = 0
    XXH3_128 = 1


class Policy(IntEnum):
    FCFS = 0
    PRIORITY = 1
    CUSTOM = 2
    SLO = 3
    SLO_ADAPTIVE = 4


class Mode(IntEnum):
    VLLM = 0
    DECODE_FIRST = 1
    PREFILL_FIRST = 2


class Role(IntEnum):
    BOTH = 0
    PREFILL = 1
    DECODE = 2


class RemoteKVFailure(IntEnum):
    RECOMPUTE = 0
    FAIL = 1


class FinishReason(IntEnum):
    NONE = 0
    STOP = 1
    LENGTH = 2
    ABORT = 3
    ERROR = 4


class EntryKind(IntEnum):
    NEW = 0
    RESUMED = 1
    CONTINUING = 2


class RequestState(IntEnum):
    WAITING = 0
    WAITING_REMOTE_KV = 1
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_HELD = 4
    FINISHED = 5


_KINDS = tuple(EntryKind)          # index by value (0, 1, 2)
_REASONS = tuple(FinishReason)     # index by value (0..4)

FLAG_IGNORE_EOS = 1 << 0
FLAG_REMOTE_PREFILL = 1 << 1
FLAG_REMOTE_DECODE = 1 << 2
FLAG_SKIP_PREFIX_CACHE = 1 << 3
FLAG_SLO_DEPRIORITIZE = 1 << 4
FLAG_PREFIX_HIT_LIMIT = 1 << 5
FLAG_MAY_LOAD_ASYNC = 1 << 6
FLAG_PRECOMPUTED_DIGESTS = 1 << 7  # block hashes are Tandem's own, from tdm_prefix_digests


def _enum_value(enum, v):
    if isinstance(v, str):
        try:
            return int(enum[v.upper()])
        except KeyError:
            raise ValueError(f"unknown {enum.__name__} {v!r}; one of "
                             f"{', '.join(m.name.lower() for m in enum)}") from None
    return int(v)


@dataclass
class Request:
    """The parameters of tdm_sched_add (tdm_request_desc)."""
    id: int
    prompt: Sequence[int]
    max_tokens: int = 16
    min_tokens: int = 0
    eos_token_id: Optional[int] = None
    stop_token_ids: Sequence[int] = ()
    priority: int = 0
    arrival_time: Optional[float] = None   # None: time.monotonic() at add
    ttft_slo: float = 0.0
    tpot_slo: float = 0.0
    cache_salt: Optional[Union[bytes, str]] = None
    num_remote_tokens: int = 0
    tenant: int = 0
    ignore_eos: bool = False
    remote_prefill: bool = False
    remote_decode: bool = False
    skip_prefix_cache: bool = False
    slo_deprioritize: bool = False   # SLO_ADAPTIVE may put it last once its TTFT is lost
    # The host's own digests of the full prompt blocks (e.g. vLLM's Request.block_hashes):
    # given (even empty), the prefix cache uses them instead of computing its own; later
    # blocks' digests go through Scheduler.append_block_hashes. block_hash_size: bytes per
    # digest (16..32); 0 = the length of the first digest.
    block_hashes: Optional[Sequence[bytes]] = None
    block_hash_size: int = 0
    # The most tokens a prefix-cache hit may cover (None: no limit; 0: no reads).
    prefix_hit_limit: Optional[int] = None
    # With max_inflight_kv_loads: the request may load its KV remotely (vLLM's
    # KVConnector.may_load_async), so it waits in the load queue (docs/scheduler.md).
    may_load_async: bool = False

    @property
    def flags(self) -> int:
        return ((FLAG_IGNORE_EOS if self.ignore_eos else 0)
                | (FLAG_REMOTE_PREFILL if self.remote_prefill else 0)
                | (FLAG_REMOTE_DECODE if self.remote_decode else 0)
                | (FLAG_SKIP_PREFIX_CACHE if self.skip_prefix_cache else 0)
                | (FLAG_SLO_DEPRIORITIZE if self.slo_deprioritize else 0)
                | (FLAG_PREFIX_HIT_LIMIT if self.prefix_hit_limit is not None else 0)
                | (FLAG_MAY_LOAD_ASYNC if self.may_load_async else 0))


@dataclass
class BatchEntry:
    req_id: int
    num_tokens: int
    num_computed: int
    kind: EntryKind
    num_spec: int
    blocks: List[int]


@dataclass
class Batch:
    """One step's schedule (a copy of tdm_batch)."""
    step: int
    total_tokens: int
    num_prefill_reqs: int
    entries: List[BatchEntry]
    preempted: List[int]
    finished: List[int]
    recv_ready: List[int]

    def __len__(self):
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    @property
    def req_ids(self) -> List[int]:
        return [e.req_id for e in self.entries]

    @property
    def num_tokens(self) -> Dict[int, int]:
        return {e.req_id: e.num_tokens for e in self.entries}

    def entry(self, req_id: int) -> Optional[BatchEntry]:
        for e in self.entries:
            if e.req_id == req_id:
                return e
        return None


@dataclass
class UpdateEntry:
    req_id: int
    num_new_tokens: int
    finish_reason: FinishReason
    stop_token: Optional[int]


@dataclass
class UpdateResult:
    entries: List[UpdateEntry] = field(default_factory=list)

    def __len__(self):
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    @property
    def finished(self) -> Dict[int, FinishReason]:
        return {e.req_id: e.finish_reason for e in self.entries
                if e.finish_reason != FinishReason.NONE}


@dataclass
class RequestInfo:
    state: RequestState
    finish_reason: FinishReason
    num_prompt_tokens: int
    num_output_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int
    num_blocks: int
    num_preemptions: int
    priority: int
    arrival_time: float
    first_scheduled_time: float
    first_token_time: float
    last_token_time: float
    finish_time: float
    max_token_gap: float


@dataclass
class RequestView:
    """What a custom policy sees of a request (tdm_request_view)."""
    state: RequestState
    id: int
    priority: int
    tenant: int
    arrival_time: float
    ttft_slo: float
    tpot_slo: float
    num_prompt_tokens: int
    num_output_tokens: int
    num_computed_tokens: int
    num_preemptions: int
    max_tokens: int
    admit_seq: int


def _view(p) -> RequestView:
    v = p.contents
    return RequestView(RequestState(v.state), v.id, v.priority, v.tenant, v.arrival_time,
                       v.ttft_slo, v.tpot_slo, v.num_prompt_tokens, v.num_output_tokens,
                       v.num_computed_tokens, v.num_preemptions, v.max_tokens, v.admit_seq)


@dataclass
class Stats:
    num_running: int
    num_waiting: int
    num_waiting_remote_kv: int
    num_held: int
    num_total_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    kv_usage: float
    prefix_queries: int
    prefix_hits: int
    prefix_hit_rate: float
    evictions: int
    preemptions: int
    steps: int
    scheduled_tokens: int
    finished: int
    kv_events_dropped: int = 0


class KVEventKind(IntEnum):
    STORED = 1
    REMOVED = 2
    ALL_CLEARED = 3


@dataclass
class KVEvent:
    """One KV cache event (tdm_kv_event_batch): STORED blocks (digests, the parent of the
    first, their tokens, the request and the index of its first stored block), one REMOVED
    digest, or ALL_CLEARED."""
    kind: KVEventKind
    block_hashes: List[bytes]
    parent_block_hash: Optional[bytes] = None
    token_ids: List[int] = field(default_factory=list)
    block_size: int = 0
    req_id: int = 0
    first_block: int = 0


@dataclass
class KVEventBatch:
    """The events drained after a step, in emission order. `overflowed` says the queue
    filled and `num_dropped` events after these were lost."""
    events: List[KVEvent]
    overflowed: bool = False
    num_dropped: int = 0


_BOOL_KEYS = {"enable_chunked_prefill", "enable_prefix_caching", "enable_kv_events"}


def _json_value(key, v):
    """Friendlier config values: enum members become their lower-case names (the library's
    JSON spelling: "fcfs", "decode_first", "prefill", ...), 0/1 of boolean keys booleans."""
    if isinstance(v, IntEnum):
        return v.name.lower()
    if key in _BOOL_KEYS and isinstance(v, int) and not isinstance(v, bool) and v in (0, 1):
        return bool(v)
    return v


def _struct_to_dataclass(cls, s, conv=None):
    kw = {}
    for name in cls.__dataclass_fields__:
        v = getattr(s, name)
        if conv and name in conv:
            v = conv[name](v)
        kw[name] = v
    return cls(**kw)


def _hash_buffer(hashes: Sequence[bytes], size: int):
    """The digests concatenated in a ctypes buffer (every one must be `size` bytes)."""
    for h in hashes:
        if len(h) != size:
            raise ValueError(f"block hash of {len(h)} bytes, expected {size}")
    joined = b"".join(bytes(h) for h in hashes)
    return (ctypes.c_char * max(len(joined), 1)).from_buffer_copy(joined or b"\0")


def _ints(ptr, n) -> List[int]:
    return ptr[:n] if n else []


_EMPTY = ctypes.create_string_buffer(8)


def _addr(buf) -> int:
    """The address of an array.array's (or any writable buffer's) first byte; an empty buffer
    gets a static dummy address (the library reads nothing from it)."""
    if len(buf) == 0:
        return ctypes.addressof(_EMPTY)
    info = getattr(buf, "buffer_info", None)
    if info is not None:
        return info()[0]
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class Scheduler:
    """A Tandem scheduler (one engine). `config` is a dict or a JSON string of
    tdm_sched_configure keys; keyword arguments are added to it (e.g. block_size=16)."""

    def __init__(self, config: Union[None, str, Mapping] = None, **params):
        self._h = None
        h = c_void_p()
        try:
            create = _lib.fn("tdm_sched_create")
        except _lib.MissingSymbol as e:
            raise TandemError(Status.UNSUPPORTED, str(e), "tdm_sched_create") from None
        rc = create(byref(h))
        if rc != 0:
            msg = _lib.fn("tdm_sched_errmsg")(None)
            raise TandemError(rc, (msg or b"").decode(errors="replace"), "tdm_sched_create")
        self._h = h
        self._out_raw = None
        self._batch = _lib.BatchC()
        self._call("tdm_batch_init", byref(self._batch), handle=False)
        self._result = _lib.UpdateResultC()
        self._call("tdm_update_result_init", byref(self._result), handle=False)
        try:
            doc = {}
            if isinstance(config, str):
                doc = json.loads(config) if config.strip() else {}
            elif config is not None:
                doc = dict(config)
            doc.update(params)
            if doc:
                self.configure(doc)
        except BaseException:
            self.close()
            raise

    # ---- plumbing ------------------------------------------------------------------------
    def _call(self, name, *args, handle=True):
        if handle and self._h is None:
            raise TandemError(Status.STATE, "the scheduler is closed", name)
        try:
            f = _lib.fn(name)
        except _lib.MissingSymbol as e:
            raise TandemError(Status.UNSUPPORTED, str(e), name) from None
        rc = f(self._h, *args) if handle else f(*args)
        if rc != 0:
            msg = ""
            if handle:
                m = _lib.fn("tdm_sched_errmsg")(self._h)
                msg = (m or b"").decode(errors="replace")
            raise TandemError(rc, msg, name)
        return rc

    @property
    def handle(self) -> int:
        """The raw tdm_sched pointer (for other bindings); 0 once closed."""
        return self._h.value if self._h is not None else 0

    def close(self):
        """Destroy the scheduler and every request it holds. Idempotent."""
        if self._h is not None:
            h, self._h = self._h, None
            _lib.fn("tdm_sched_destroy")(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- configuration -------------------------------------------------------------------
    def configure(self, config: Union[str, Mapping]):
        """Apply a JSON configuration (all or nothing)."""
        if isinstance(config, str):
            text = config
        else:
            text = json.dumps({k: _json_value(k, v) for k, v in dict(config).items()})
        self._call("tdm_sched_configure", text.encode())

    @property
    def config(self) -> dict:
        """The full current configuration (tdm_sched_get_config) as a dict."""
        n = c_size_t(0)
        try:
            self._call("tdm_sched_get_config", None, 0, byref(n))
        except TandemError as e:
            if e.status != Status.TRUNCATED:
                raise
        buf = ctypes.create_string_buffer(n.value + 1)
        self._call("tdm_sched_get_config", buf, n.value + 1, byref(n))
        return json.loads(buf.value.decode())

    def set_param(self, key: Union[Param, str, int], value: int):
        self._call("tdm_sched_set_param", _enum_value(Param, key), int(value))

    def get_param(self, key: Union[Param, str, int]) -> int:
        v = c_int64()
        self._call("tdm_sched_get_param", _enum_value(Param, key), byref(v))
        return v.value

    def set_policy(self, compare, pick_victim=None, name: str = "python"):
        """Install a custom policy written in Python (tdm_sched_set_policy). compare(a, b)
        gets two RequestViews and returns < 0 when a should be admitted before b, > 0 after,
        0 if equal (then arrival order); it must be a strict weak ordering that does not
        change while a request waits. pick_victim(running) gets the running RequestViews and
        returns the index to preempt (None: the one compare ranks last). Exceptions raised
        by the callbacks are swallowed (compare -> 0, pick_victim -> last). Only while the
        waiting queue is empty."""
        def c_compare(ctx, a, b):
            try:
                r = compare(_view(a), _view(b))
                return -1 if r < 0 else (1 if r > 0 else 0)
            except Exception:
                return 0

        def c_victim(ctx, arr, n):
            try:
                i = int(pick_victim([_view(arr[k]) for k in range(n)]))
                return i if 0 <= i < n else n - 1
            except Exception:
                return n - 1 if n else 0

        pol = _lib.PolicyC()
        pol.version = 1
        name_b = name.encode()
        pol.name = name_b
        pol.ctx = None
        pol.compare = _lib.POLICY_COMPARE_FN(c_compare)
        pol.pick_victim = (_lib.POLICY_VICTIM_FN(c_victim) if pick_victim is not None
                           else ctypes.cast(None, _lib.POLICY_VICTIM_FN))
        pol.destroy = ctypes.cast(None, _lib.POLICY_DESTROY_FN)
        self._call("tdm_sched_set_policy", byref(pol))
        self._policy_refs = (pol, name_b)   # the callbacks must outlive their use by C

    def load_policy(self, path: str, symbol: Optional[str] = None):
        self._call("tdm_sched_load_policy", path.encode(), symbol.encode() if symbol else None)

    # ---- requests ------------------------------------------------------------------------
    def add(self, request: Optional[Request] = None, **kw) -> int:
        """Add a request (a Request, or its fields as keywords). Returns its id."""
        r = request if request is not None else Request(**kw)
        d = _lib.RequestDesc()
        self._call("tdm_request_desc_init", byref(d), handle=False)
        prompt = r.prompt
        if isinstance(prompt, array) and prompt.typecode == "i" and prompt.itemsize == 4 and \
                len(prompt):
            # An int32 array (vLLM 0.34's TokenBuffer): handed over as it is, no copy here
            # (the library copies it during the call).
            parr = (_lib.c_token * len(prompt)).from_buffer(prompt)
        else:
            prompt = list(prompt)
            parr = (_lib.c_token * max(len(prompt), 1))(*prompt)
        stops = list(r.stop_token_ids)
        sarr = (_lib.c_token * max(len(stops), 1))(*stops)
        salt = r.cache_salt.encode() if isinstance(r.cache_salt, str) else r.cache_salt
        d.flags = r.flags
        d.id = int(r.id)
        d.prompt = ctypes.cast(parr, POINTER(_lib.c_token))
        d.num_prompt_tokens = len(prompt)
        d.max_tokens = int(r.max_tokens)
        d.min_tokens = int(r.min_tokens)
        d.eos_token_id = -1 if r.eos_token_id is None else int(r.eos_token_id)
        d.stop_token_ids = ctypes.cast(sarr, POINTER(_lib.c_token)) if stops else None
        d.num_stop_token_ids = len(stops)
        d.priority = int(r.priority)
        d.arrival_time = time.monotonic() if r.arrival_time is None else float(r.arrival_time)
        d.ttft_slo = float(r.ttft_slo)
        d.tpot_slo = float(r.tpot_slo)
        if salt:
            sbuf = ctypes.create_string_buffer(salt, len(salt))
            d.cache_salt = ctypes.cast(sbuf, c_void_p)
            d.cache_salt_len = len(salt)
        d.num_remote_tokens = int(r.num_remote_tokens)
        d.tenant = int(r.tenant)
        hbuf = None
        if r.block_hashes is not None:
            size = int(r.block_hash_size) or (len(r.block_hashes[0]) if len(r.block_hashes) else 0)
            if not size:
                raise ValueError("block_hash_size is needed when block_hashes is empty")
            hbuf = _hash_buffer(r.block_hashes, size)
            d.block_hashes = ctypes.cast(hbuf, c_void_p) if len(r.block_hashes) else None
            d.num_block_hashes = len(r.block_hashes)
            d.block_hash_size = size
        if r.prefix_hit_limit is not None:
            d.prefix_hit_limit = int(r.prefix_hit_limit)
        self._call("tdm_sched_add", byref(d))
        del hbuf, parr
        return int(r.id)

    def append_block_hashes(self, req_id: int, hashes: Sequence[bytes], hash_size: int = 0):
        """Give the digests of the request's next full blocks (those that filled since the
        last call, e.g. during decode); hash_size 0 = the length of the first digest."""
        if not len(hashes):
            return
        size = int(hash_size) or len(hashes[0])
        buf = _hash_buffer(hashes, size)
        self._call("tdm_sched_append_block_hashes", int(req_id), ctypes.cast(buf, c_void_p),
                   len(hashes), size)

    def abort(self, req_id: int):
        self._call("tdm_sched_abort", int(req_id))

    def finish(self, req_id: int, reason: Union[FinishReason, str, int] = FinishReason.STOP):
        self._call("tdm_sched_finish", int(req_id), _enum_value(FinishReason, reason))

    def set_draft_tokens(self, req_id: int, tokens: Sequence[int]):
        toks = list(tokens)
        arr = (_lib.c_token * max(len(toks), 1))(*toks)
        self._call("tdm_sched_set_draft_tokens", int(req_id), arr, len(toks))

    def remote_kv_done(self, req_id: int, ok: bool = True, num_valid_tokens: int = 0):
        self._call("tdm_sched_remote_kv_done", int(req_id), 1 if ok else 0, int(num_valid_tokens))

    def release(self, req_id: int):
        self._call("tdm_sched_release", int(req_id))

    def reset_prefix_cache(self, reset_running: bool = False):
        self._call("tdm_sched_reset_prefix_cache", 1 if reset_running else 0)

    # ---- the step loop -------------------------------------------------------------------
    def step(self, now: Optional[float] = None) -> Batch:
        """Schedule one step; returns a copy of the batch."""
        b = self._batch
        self._call("tdm_sched_step", time.monotonic() if now is None else float(now), byref(b))
        n = b.num_reqs
        ids = _ints(b.req_ids, n)
        ntok = _ints(b.num_tokens, n)
        ncomp = _ints(b.num_computed, n)
        kinds = _ints(b.kinds, n)
        nspec = _ints(b.num_spec, n)
        offs = _ints(b.block_offsets, n + 1) if n else [0]
        blocks = _ints(b.blocks, offs[-1]) if n else []
        K = _KINDS
        entries = [BatchEntry(ids[i], ntok[i], ncomp[i], K[kinds[i]], nspec[i],
                              blocks[offs[i]:offs[i + 1]]) for i in range(n)]
        return Batch(step=b.step, total_tokens=b.total_tokens,
                     num_prefill_reqs=b.num_prefill_reqs, entries=entries,
                     preempted=_ints(b.preempted_ids, b.num_preempted),
                     finished=_ints(b.finished_ids, b.num_finished),
                     recv_ready=_ints(b.recv_ready_ids, b.num_recv_ready))

    def update(self, outputs: Union[Mapping[int, Sequence[int]], Iterable[Tuple[int, Sequence[int]]]],
               now: Optional[float] = None, step: Optional[int] = None) -> UpdateResult:
        """Report a step's sampled tokens: {req_id: [tokens]}. Returns what the scheduler did.

        With step (the Batch.step of the batch reported; tdm_sched_update_step) the report
        covers that whole batch: a request of it left out reports no tokens, as vLLM's
        update_from_output takes it, so {id: [token]} for the requests that sampled is
        enough. Batches are then reported once each, oldest first. Without step
        (tdm_sched_update) each listed request reports its oldest unreported step and a
        request left out stays owed: list every scheduled request, with [] for a prompt
        chunk that did not finish the prompt. Use one form for every batch."""
        items = list(outputs.items()) if isinstance(outputs, Mapping) else list(outputs)
        n = len(items)
        ids = (c_uint64 * max(n, 1))()
        offs = (c_uint32 * (n + 1))()
        flat: List[int] = []
        for i, (rid, toks) in enumerate(items):
            ids[i] = int(rid)
            flat.extend(int(t) for t in toks)
            offs[i + 1] = len(flat)
        tarr = (_lib.c_token * max(len(flat), 1))(*flat)
        o = _lib.StepOutputC()
        self._call("tdm_step_output_init", byref(o), handle=False)
        o.num_reqs = n
        o.req_ids = ctypes.cast(ids, POINTER(c_uint64))
        o.token_offsets = ctypes.cast(offs, POINTER(c_uint32))
        o.tokens = ctypes.cast(tarr, POINTER(_lib.c_token))
        o.now = time.monotonic() if now is None else float(now)
        r = self._result
        if step is None:
            self._call("tdm_sched_update", byref(o), byref(r))
        else:
            self._call("tdm_sched_update_step", int(step), byref(o), byref(r))
        m = r.num_reqs
        rids = _ints(r.req_ids, m)
        nnew = _ints(r.num_new_tokens, m)
        fr = _ints(r.finish_reasons, m)
        st = _ints(r.stop_tokens, m)
        F = _REASONS
        return UpdateResult([UpdateEntry(rids[i], nnew[i], F[fr[i]],
                                         None if st[i] < 0 else st[i]) for i in range(m)])

    # ---- the step loop, without copies (for adapters on a hot path) ----------------------
    def step_raw(self, now: Optional[float] = None) -> "_lib.BatchC":
        """Schedule one step; returns the library's tdm_batch itself (ctypes). Its arrays are
        owned by the scheduler and valid only until the next step_raw/step/update call:
        read them (b.req_ids[:b.num_reqs], ...) before calling again. step() is the safe copy."""
        b = self._batch
        self._call("tdm_sched_step", time.monotonic() if now is None else float(now), byref(b))
        return b

    def update_raw(self, req_ids, token_offsets, tokens, now: Optional[float] = None):
        """Report a step's sampled tokens as buffers (objects with the buffer protocol, e.g.
        array.array): req_ids uint64 ('Q'), token_offsets uint32 ('I', len(req_ids) + 1),
        tokens int32 ('i'). Returns the library's tdm_update_result (ctypes), valid until the
        next call on this scheduler. update() is the safe, Pythonic form."""
        n = len(req_ids)
        if len(token_offsets) != n + 1:
            raise ValueError("update_raw: token_offsets needs len(req_ids) + 1 entries")
        o = self._out_raw
        if o is None:
            o = self._out_raw = _lib.StepOutputC()
            self._call("tdm_step_output_init", byref(o), handle=False)
        o.num_reqs = n
        o.req_ids = ctypes.cast(_addr(req_ids), POINTER(c_uint64))
        o.token_offsets = ctypes.cast(_addr(token_offsets), POINTER(c_uint32))
        o.tokens = ctypes.cast(_addr(tokens), POINTER(_lib.c_token))
        o.now = time.monotonic() if now is None else float(now)
        r = self._result
        self._call("tdm_sched_update", byref(o), byref(r))
        return r

    # ---- queries -------------------------------------------------------------------------
    def request_info(self, req_id: int) -> RequestInfo:
        i = _lib.RequestInfoC()
        self._call("tdm_request_info_init", byref(i), handle=False)
        self._call("tdm_sched_request_info", int(req_id), byref(i))
        return _struct_to_dataclass(RequestInfo, i, {"state": RequestState,
                                                     "finish_reason": FinishReason})

    def request_blocks(self, req_id: int) -> List[int]:
        p = POINTER(c_uint32)()
        n = c_uint32()
        self._call("tdm_sched_request_blocks", int(req_id), byref(p), byref(n))
        return _ints(p, n.value)

    def request_tokens(self, req_id: int) -> List[int]:
        p = POINTER(_lib.c_token)()
        n = c_uint32()
        self._call("tdm_sched_request_tokens", int(req_id), byref(p), byref(n))
        return _ints(p, n.value)

    def stats(self) -> Stats:
        s = _lib.StatsC()
        self._call("tdm_sched_stats_init", byref(s), handle=False)
        self._call("tdm_sched_get_stats", byref(s))
        return _struct_to_dataclass(Stats, s)

    def kv_events(self) -> KVEventBatch:
        """Drain the KV cache events recorded since the previous call (empty unless
        enable_kv_events is set); a plain Python copy."""
        b = _lib.KVEventBatchC()
        self._call("tdm_kv_event_batch_init", byref(b), handle=False)
        self._call("tdm_sched_kv_events", byref(b))
        n = b.num_events
        if not n:
            return KVEventBatch([], bool(b.overflowed), b.num_dropped)
        stride = 32  # TDM_KV_EVENT_HASH_STRIDE
        kinds = b.kinds[:n]
        sizes = b.hash_sizes[:n]
        hoff = b.hash_offsets[:n + 1]
        toff = b.token_offsets[:n + 1]
        raw = ctypes.string_at(b.hashes, hoff[n] * stride) if hoff[n] else b""
        parents = ctypes.string_at(b.parent_hashes, n * stride)
        tokens = b.token_ids[:toff[n]] if toff[n] else []
        out = []
        for i in range(n):
            sz = sizes[i]
            hs = [raw[k * stride:k * stride + sz] for k in range(hoff[i], hoff[i + 1])]
            kind = KVEventKind(kinds[i])
            if kind == KVEventKind.STORED:
                parent = parents[i * stride:i * stride + sz] if b.has_parent[i] else None
                out.append(KVEvent(kind, hs, parent, tokens[toff[i]:toff[i + 1]], b.block_size,
                                   b.req_ids[i], b.first_blocks[i]))
            else:
                out.append(KVEvent(kind, hs))
        return KVEventBatch(out, bool(b.overflowed), b.num_dropped)

    def num_unfinished(self) -> int:
        n = c_uint32()
        self._call("tdm_sched_num_unfinished", byref(n))
        return n.value

    def __contains__(self, req_id: int) -> bool:
        try:
            self.request_info(req_id)
            return True
        except TandemError as e:
            if e.status == Status.NOT_FOUND:
                return False
            raise
