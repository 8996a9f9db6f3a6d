"""TandemConnector: vLLM's KVConnectorBase_V1 over the Tandem KV transfer engine (tdm_kvx).

    --kv-transfer-config '{"kv_connector": "TandemConnector",
                           "kv_connector_module_path": "tandem.vllm.connector",
                           "kv_role": "kv_both", "engine_id": "prefill-0",
                           "kv_connector_extra_config": {"listen": "tcp://10.0.0.5:7600"}}'

A pull model, like NixlConnector's. The prefill engine (request with kv_transfer_params
{"do_remote_decode": true}) keeps the finished request's blocks (request_finished returns
delay_free=True) and its worker exports them with tdm_kvx_send; the returned
kv_transfer_params name the engine, its endpoint, the request id and the block ids, in
NixlConnector's keys as well (remote_host, remote_port, tp_size, ...: tandem/vllm/params.py),
so that hosts that only speak NixlConnector's protocol can carry them. The
decode engine (a request carrying those params with "do_remote_prefill": true) reports the
prompt as loadable asynchronously, reserves blocks, and its worker pulls them with tdm_kvx_recv
(skipping blocks it already holds from its prefix cache). Completions come back through
get_finished(); blocks that did not arrive are reported by get_block_ids_with_load_errors() so
that the scheduler recomputes them.

Worker side: register_kv_caches() takes vLLM's per-layer tensors (torch, CPU or CUDA, or
numpy arrays for host tests) and describes them exactly from their shape, strides and dtype
and the layer's KV cache spec (tandem/vllm/layout.py: every arrangement vLLM's attention
backends use, MLA's latent included); a layout it cannot describe stops the engine with the
shape and strides in the message. The layout is exchanged and checked once per peer by the
engine, which converts between different layouts, dtypes and block sizes.

Peers are looked up by engine id for every load, never cached: a dead peer is replaced by a
fresh connection to the endpoint in the params. Connections are made by one background thread,
never on the forward path; loads waiting for one start when it completes. Every failed load
logs one line naming the request, the peer and the reason, and its blocks are reported
through get_block_ids_with_load_errors() (vLLM then recomputes or fails the request, per its
kv_load_failure_policy).
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                                KVConnectorMetadata,
                                                                KVConnectorRole)

import tandem
from tandem import KVLayout, KVTransfer, TandemError
from tandem.errors import Status
from tandem.kvx import EventType, Side
from tandem.vllm.layout import describe_kv_caches, facts_from_vllm
from tandem.vllm.params import make_transfer_params, parse_transfer_params, request_id_u64

# under "vllm": its handlers print these lines in the engine's log
logger = logging.getLogger("vllm.tandem.connector")

# A pull whose request the prefill engine has not exported fails after this long without
# progress (kv_connector_extra_config "load_timeout_ms"); the engine's default is 30 s.
_LOAD_TIMEOUT_MS = 10000
# A connect answered EXISTS without a live peer of the expected engine is retried this long.
_EXISTS_RETRY_S = 5.0
# The handshake timeout unless "kvx" sets one: connects run off the forward path, and a
# loaded host (or NIXL's agent set-up) can take longer than the engine's default of 5 s.
_HANDSHAKE_TIMEOUT_MS = 10000

__all__ = ["TandemConnector", "TandemConnectorMetadata", "request_id_u64"]


@dataclass
class RecvSpec:
    req_id: str
    remote_request_id: int
    remote_engine_id: str
    remote_endpoint: Optional[str]   # None: the params were malformed (the load fails)
    local_block_ids: list
    num_skip: int = 0


@dataclass
class SendSpec:
    req_id: str
    request_id: int
    block_ids: list


@dataclass
class TandemConnectorMetadata(KVConnectorMetadata):
    reqs_to_recv: dict = field(default_factory=dict)
    reqs_to_send: dict = field(default_factory=dict)


def _block_ids(blocks) -> tuple:
    """(all block ids, number of leading ones already holding KV) from vLLM's KVCacheBlocks
    or a plain list."""
    if isinstance(blocks, (list, tuple)):
        ids = list(blocks[0]) if blocks and isinstance(blocks[0], (list, tuple)) else list(blocks)
        return ids, 0
    ids = list(blocks.get_block_ids()[0])
    unhashed = getattr(blocks, "get_unhashed_block_ids", None)
    skip = len(ids) - len(unhashed()) if unhashed is not None else 0
    return ids, max(skip, 0)


class TandemConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = self._kv_transfer_config
        extra = dict(ktc.kv_connector_extra_config or {})
        self.engine_id = str(ktc.engine_id or extra.get("engine_id") or f"tandem-{uuid.uuid4().hex[:12]}")
        self.endpoint: Optional[str] = extra.get("listen")
        self.kvx_config = dict(extra.get("kvx", {}))
        self.kvx_config.setdefault("handshake_timeout_ms", _HANDSHAKE_TIMEOUT_MS)
        self.load_timeout_ms = int(extra.get("load_timeout_ms", _LOAD_TIMEOUT_MS))
        self.block_size = vllm_config.cache_config.block_size
        pc = getattr(vllm_config, "parallel_config", None)
        self.tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        # scheduler side
        self._reqs_need_recv: dict = {}
        self._reqs_need_send: dict = {}
        # worker side
        self.kvx: Optional[KVTransfer] = None
        self.layout_desc: Optional[str] = None
        self._recv: dict = {}
        self._waiting: dict = {}        # endpoint -> [RecvSpec] waiting for a connection
        self._connects: "queue.Queue" = queue.Queue()
        self._connected: "queue.Queue" = queue.Queue()   # (endpoint, error or None)
        self._connector_thread: Optional[threading.Thread] = None
        self._send: dict = {}
        self._done_sending: set = set()
        self._done_recving: set = set()
        self._load_errors: set = set()
        self._failed_now: list = []     # loads failed in this step ...
        self._failed_prev: list = []    # ... and in the previous one: reported now
        self._tids = itertools.count(1)

    # ---- capabilities (vLLM 0.34 asks the connector class; older versions never call these)
    @classmethod
    def kv_cache_access(cls, kv_transfer_config):
        """How the workers reach the device KV cache: the Tandem engine registers it with
        NIXL (UCX: one physical allocation per segment) and, between processes on one host,
        shares it with legacy CUDA IPC handles, so vLLM's extensible KV cache (several
        physical allocations behind one segment) must not back it."""
        from vllm.config.kv_transfer import KVCacheAccess
        return KVCacheAccess.REGISTERS | KVCacheAccess.LEGACY_IPC

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config) -> bool:
        """No: a transfer names whole prompt blocks, and the decode side's prefix hit is
        taken from its own cache, so vLLM keeps block hashes without drafter lookahead."""
        return False

    def may_load_async(self, request) -> bool:
        """Whether get_num_new_matched_tokens may report an asynchronous load: exactly the
        requests whose prompt KV comes from a remote prefill."""
        params = request.kv_transfer_params or {}
        return bool(params.get("do_remote_prefill"))

    # ---- scheduler side ----------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        params = request.kv_transfer_params or {}
        if params.get("do_remote_prefill"):
            n = len(request.prompt_token_ids) - num_computed_tokens
            if n > 0:
                return n, True
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        params = request.kv_transfer_params or {}
        if not params.get("do_remote_prefill") or num_external_tokens <= 0:
            return
        ids, skip = _block_ids(blocks)
        if not ids:
            return
        try:
            rid, engine, ep = parse_transfer_params(params)
        except ValueError:
            rid, engine, ep = 0, str(params.get("remote_engine_id")), None
        self._reqs_need_recv[request.request_id] = RecvSpec(
            req_id=request.request_id, remote_request_id=rid, remote_engine_id=engine,
            remote_endpoint=ep, local_block_ids=ids, num_skip=skip)
        params["do_remote_prefill"] = False

    def build_connector_meta(self, scheduler_output) -> TandemConnectorMetadata:
        meta = TandemConnectorMetadata(reqs_to_recv=self._reqs_need_recv,
                                       reqs_to_send=self._reqs_need_send)
        self._reqs_need_recv = {}
        self._reqs_need_send = {}
        return meta

    def request_finished(self, request, block_ids):
        from vllm.v1.request import RequestStatus
        params = request.kv_transfer_params or {}
        if not params.get("do_remote_decode"):
            return False, None
        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED,
                                  RequestStatus.FINISHED_STOPPED):
            return False, None
        ids = list(block_ids[0]) if block_ids and isinstance(block_ids[0], (list, tuple)) \
            else list(block_ids)
        if not ids:
            return False, None
        rid = request_id_u64(request.request_id)
        self._reqs_need_send[request.request_id] = SendSpec(request.request_id, rid, ids)
        return True, make_transfer_params(self.engine_id, self.endpoint, request.request_id, ids,
                                          request.num_tokens, self.block_size, self.tp_size)

    # ---- worker side -------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict):
        desc = describe_kv_caches(kv_caches, facts_from_vllm(self._vllm_config,
                                                             self._kv_cache_config))
        self.kvx = KVTransfer(self.engine_id, role="both", listen=self.endpoint,
                              **self.kvx_config)
        self.kvx.register(desc.layout, desc.bases, mem_kind=desc.mem_kind)
        if self.endpoint:
            self.endpoint = self.kvx.endpoint
        self.layout_desc = desc.describe()
        logger.info("TandemConnector %s: KV cache %s; listening on %s", self.engine_id,
                    self.layout_desc, self.endpoint)
        self._kv_tensors = kv_caches   # keep them alive while registered

    def _fail_load(self, spec: RecvSpec, peer: str, reason: str):
        """Log spec's failure; get_finished reports it one step later (a load never ends in
        the step that starts it, as with every failure the transfer engine reports)."""
        logger.warning("TandemConnector: KV load of request %s from engine %s (%s) failed: %s",
                       spec.req_id, spec.remote_engine_id, peer, reason)
        self._failed_now.append(spec)

    def _connect_loop(self):
        """The connector thread: connects to the endpoints asked for, one at a time, and
        reports each outcome (None or the error); never on the forward path."""
        while True:
            job = self._connects.get()
            if job is None:
                return
            ep, engine_id = job
            kvx = self.kvx
            if kvx is None:
                return
            err = None
            deadline = time.monotonic() + _EXISTS_RETRY_S
            while True:
                try:
                    kvx.connect(ep)
                    break
                except TandemError as e:
                    if e.status != Status.EXISTS:
                        err = str(e)
                        break
                    try:   # connected meanwhile: fine
                        kvx.find_peer(engine_id)
                        break
                    except TandemError:
                        pass
                    if "connected to that endpoint" in str(e):
                        # our live connection to ep is another engine
                        err = f"the engine at {ep} is not '{engine_id}'"
                        break
                    # still connecting, or the engine still holds the connection of a
                    # handshake we gave up on: it lets go within a few heartbeats
                    if time.monotonic() > deadline:
                        err = str(e)
                        break
                    time.sleep(0.1)
            self._connected.put((ep, err))

    def _start_recv(self, spec: RecvSpec, peer: int):
        try:
            h = self.kvx.recv(peer, request_id=spec.remote_request_id,
                              block_ids=spec.local_block_ids, num_skip=spec.num_skip,
                              transfer_id=next(self._tids), timeout_ms=self.load_timeout_ms)
        except TandemError as e:
            self._fail_load(spec, f"peer {peer}", str(e))
            return
        self._recv[h] = spec

    def _dispatch(self, spec: RecvSpec):
        """Start spec's pull now if its engine is connected, else queue it behind a connect."""
        try:
            peer = self.kvx.find_peer(spec.remote_engine_id)
        except TandemError:
            peer = None
        if peer is not None:
            self._start_recv(spec, peer)
            return
        ep = spec.remote_endpoint
        waiting = self._waiting.setdefault(ep, [])
        waiting.append(spec)
        if len(waiting) == 1:
            if self._connector_thread is None:
                self._connector_thread = threading.Thread(target=self._connect_loop, daemon=True,
                                                          name="tandem-connect")
                self._connector_thread.start()
            self._connects.put((ep, spec.remote_engine_id))

    def _connects_done(self):
        while True:
            try:
                ep, err = self._connected.get_nowait()
            except queue.Empty:
                return
            for spec in self._waiting.pop(ep, []):
                if err is not None:
                    self._fail_load(spec, ep, err)
                    continue
                try:
                    peer = self.kvx.find_peer(spec.remote_engine_id)
                except TandemError:
                    self._fail_load(spec, ep, f"the engine at {ep} is not "
                                              f"'{spec.remote_engine_id}'")
                    continue
                self._start_recv(spec, peer)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        for spec in meta.reqs_to_recv.values():
            if spec.remote_endpoint is None:
                self._fail_load(spec, "?", "malformed kv_transfer_params")
                continue
            self._dispatch(spec)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return None

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        for spec in meta.reqs_to_send.values():
            try:
                h = self.kvx.send(request_id=spec.request_id, block_ids=spec.block_ids)
                self._send[h] = spec.req_id
            except TandemError:
                self._done_sending.add(spec.req_id)

    def _drain(self):
        if self.kvx is None:
            return
        self._connects_done()
        for ev in self.kvx.poll(timeout_ms=0):
            if ev.side == Side.RECV:
                spec = self._recv.pop(ev.handle, None)
                if spec is None:
                    continue
                if ev.type != EventType.DONE:
                    done = max(ev.num_blocks_done, spec.num_skip)
                    logger.warning("TandemConnector: KV load of request %s from engine %s "
                                   "(peer %d) failed after %d of %d blocks: %s [%s]",
                                   spec.req_id, spec.remote_engine_id, ev.peer, done,
                                   len(spec.local_block_ids), ev.reason or "no reason given",
                                   _status_name(ev.status))
                    self._load_errors.update(spec.local_block_ids[done:])
                self._done_recving.add(spec.req_id)
            else:
                req_id = self._send.pop(ev.handle, None)
                if req_id is not None:
                    if ev.type != EventType.DONE:
                        logger.warning("TandemConnector: KV export of request %s to peer %d "
                                       "ended without a transfer: %s [%s]", req_id, ev.peer,
                                       ev.reason or "no reason given", _status_name(ev.status))
                    self._done_sending.add(req_id)

    def get_finished(self, finished_req_ids):
        for spec in self._failed_prev:
            self._load_errors.update(spec.local_block_ids[spec.num_skip:])
            self._done_recving.add(spec.req_id)
        self._failed_prev, self._failed_now = self._failed_now, []
        self._drain()
        s, r = self._done_sending, self._done_recving
        self._done_sending, self._done_recving = set(), set()
        return (s or None), (r or None)

    def get_block_ids_with_load_errors(self) -> set:
        self._drain()
        e, self._load_errors = self._load_errors, set()
        return e

    def shutdown(self):
        t, self._connector_thread = self._connector_thread, None
        if t is not None:
            self._connects.put(None)
            t.join(timeout=30)
        if self.kvx is not None:
            self.kvx.close()
            self.kvx = None


def _status_name(status: int) -> str:
    try:
        return Status(status).name
    except ValueError:
        return str(status)
