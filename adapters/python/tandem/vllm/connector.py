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

Worker side: register_kv_caches() takes vLLM's per-layer tensors in the FlashAttention layout
[2, num_blocks, block_size, num_kv_heads, head_size] (torch tensors, CPU or CUDA, or numpy
arrays for host tests); the layout is exchanged and checked once per peer by the engine.
"""
from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                                KVConnectorMetadata,
                                                                KVConnectorRole)

import tandem
from tandem import KVLayout, KVTransfer, TandemError
from tandem.kvx import MEM_CUDA, MEM_HOST, DType, EventType, LayoutKind, Side
from tandem.vllm.params import make_transfer_params, parse_transfer_params, request_id_u64

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


_DTYPES = {"float16": DType.FP16, "bfloat16": DType.BF16, "float32": DType.FP32,
           "float8_e4m3fn": DType.FP8_E4M3}


def _tensor_info(t):
    """(address, shape, dtype name, is_cuda) of a torch tensor or numpy array."""
    if hasattr(t, "data_ptr"):
        return t.data_ptr(), tuple(t.shape), str(t.dtype).replace("torch.", ""), t.device.type != "cpu"
    return t.ctypes.data, tuple(t.shape), str(t.dtype), False


class TandemConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = self._kv_transfer_config
        extra = dict(ktc.kv_connector_extra_config or {})
        self.engine_id = str(ktc.engine_id or extra.get("engine_id") or f"tandem-{uuid.uuid4().hex[:12]}")
        self.endpoint: Optional[str] = extra.get("listen")
        self.kvx_config = dict(extra.get("kvx", {}))
        self.block_size = vllm_config.cache_config.block_size
        pc = getattr(vllm_config, "parallel_config", None)
        self.tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        # scheduler side
        self._reqs_need_recv: dict = {}
        self._reqs_need_send: dict = {}
        # worker side
        self.kvx: Optional[KVTransfer] = None
        self._peers: dict = {}
        self._recv: dict = {}
        self._send: dict = {}
        self._done_sending: set = set()
        self._done_recving: set = set()
        self._load_errors: set = set()
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
        tensors = list(kv_caches.values())
        if not tensors:
            raise ValueError("TandemConnector: no KV cache tensors")
        addr0, shape, dtype, cuda = _tensor_info(tensors[0])
        if len(shape) != 5 or shape[0] != 2:
            raise ValueError(f"TandemConnector: expected [2, blocks, block_size, heads, head_dim] "
                             f"KV tensors, got shape {shape}")
        if dtype not in _DTYPES:
            raise ValueError(f"TandemConnector: unsupported KV dtype {dtype}")
        layout = KVLayout(num_layers=len(tensors), num_blocks=shape[1], block_size=shape[2],
                          num_kv_heads=shape[3], head_dim=shape[4], dtype=_DTYPES[dtype],
                          kind=LayoutKind.VLLM_NHD)
        addrs = []
        for t in tensors:
            a, s, d, c = _tensor_info(t)
            if s != shape or d != dtype or c != cuda:
                raise ValueError("TandemConnector: every layer's KV tensor must be alike")
            addrs.append(a)
        self.kvx = KVTransfer(self.engine_id, role="both", listen=self.endpoint,
                              **self.kvx_config)
        self.kvx.register(layout, addrs, mem_kind=MEM_CUDA if cuda else MEM_HOST)
        if self.endpoint:
            self.endpoint = self.kvx.endpoint
        self._kv_tensors = tensors   # keep them alive while registered

    def _peer(self, engine_id: str, endpoint: str) -> int:
        p = self._peers.get(engine_id)
        if p is None:
            try:
                p = self.kvx.find_peer(engine_id)
            except TandemError:
                p = self.kvx.connect(endpoint)
            self._peers[engine_id] = p
        return p

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        for spec in meta.reqs_to_recv.values():
            try:
                if spec.remote_endpoint is None:
                    raise TandemError(-1, "malformed kv_transfer_params")
                peer = self._peer(spec.remote_engine_id, spec.remote_endpoint)
                h = self.kvx.recv(peer, request_id=spec.remote_request_id,
                                  block_ids=spec.local_block_ids, num_skip=spec.num_skip,
                                  transfer_id=next(self._tids))
                self._recv[h] = spec
            except TandemError:
                self._load_errors.update(spec.local_block_ids[spec.num_skip:])
                self._done_recving.add(spec.req_id)

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
        for ev in self.kvx.poll(timeout_ms=0):
            if ev.side == Side.RECV:
                spec = self._recv.pop(ev.handle, None)
                if spec is None:
                    continue
                if ev.type != EventType.DONE:
                    done = max(ev.num_blocks_done, spec.num_skip)
                    self._load_errors.update(spec.local_block_ids[done:])
                self._done_recving.add(spec.req_id)
            else:
                req_id = self._send.pop(ev.handle, None)
                if req_id is not None:
                    self._done_sending.add(req_id)

    def get_finished(self, finished_req_ids):
        self._drain()
        s, r = self._done_sending, self._done_recving
        self._done_sending, self._done_recving = set(), set()
        return (s or None), (r or None)

    def get_block_ids_with_load_errors(self) -> set:
        self._drain()
        e, self._load_errors = self._load_errors, set()
        return e

    def shutdown(self):
        if self.kvx is not None:
            self.kvx.close()
            self.kvx = None
