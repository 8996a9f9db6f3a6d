"""The KV transfer engine: a Pythonic wrapper of tdm_kvx (include/tandem_kvx.h).

A KVTransfer owns one tdm_kvx handle (its own I/O thread moves the bytes). The engine
registers its paged KV cache once (a KVLayout and one base address per layer), listens and/or
connects to peers, and then moves requests' blocks: the receiver reserves destination blocks
with recv(), the sender names its source blocks with send(), and both learn the outcome from
poll() events. Host caches can be allocated with host_cache(), which returns one bytearray
per layer (memoryview-able, no numpy needed). The handle's calls are thread-safe
(the library serialises them); close() must not race with other calls.
"""
from __future__ import annotations

import ctypes
import glob
import json
import os
import sys
from ctypes import (POINTER, Structure, byref, c_char, c_char_p, c_float, c_int, c_int32,
                    c_uint32, c_uint64, c_void_p)
from dataclasses import dataclass
from enum import IntEnum
from typing import List, Optional, Sequence, Union

from . import _lib
from .errors import Status, TandemError


class DType(IntEnum):
    FP16 = 1
    BF16 = 2
    FP32 = 3
    FP8_E4M3 = 4


class LayoutKind(IntEnum):
    CUSTOM = 0
    VLLM_NHD = 1
    VLLM_HND = 2
    FLASHINFER = 3


class ScaleKind(IntEnum):
    """How an fp8 cache's values are scaled (tdm_kv_scale_kind)."""
    NONE = 0
    TENSOR = 1
    HEAD = 2


class Mode(IntEnum):
    PULL = 1
    PUSH = 2


class EventType(IntEnum):
    DONE = 1
    FAILED = 2
    CANCELLED = 3


class Side(IntEnum):
    SEND = 1
    RECV = 2


PEER_ANY = 0xFFFFFFFF
MEM_HOST = 0
MEM_CUDA = 1


class RecvDescC(Structure):
    _fields_ = [("struct_size", c_uint32), ("mode", c_uint32), ("peer", c_uint32),
                ("num_blocks", c_uint32), ("request_id", c_uint64), ("transfer_id", c_uint64),
                ("block_ids", POINTER(c_uint32)), ("num_skip", c_uint32),
                ("timeout_ms", c_uint32)]


class SendDescC(Structure):
    _fields_ = [("struct_size", c_uint32), ("mode", c_uint32), ("peer", c_uint32),
                ("num_blocks", c_uint32), ("request_id", c_uint64), ("transfer_id", c_uint64),
                ("block_ids", POINTER(c_uint32)), ("num_blocks_ready", c_uint32),
                ("timeout_ms", c_uint32)]


class EventC(Structure):
    _fields_ = [("struct_size", c_uint32), ("type", c_uint32), ("side", c_uint32),
                ("status", c_int32), ("handle", c_uint64), ("request_id", c_uint64),
                ("transfer_id", c_uint64), ("peer", c_uint32), ("num_blocks_done", c_uint32),
                ("bytes", c_uint64), ("reason", c_char * 128)]


class KVXStatsC(Structure):
    _fields_ = [("struct_size", c_uint32), ("num_peers", c_uint32),
                ("num_send_active", c_uint32), ("num_recv_active", c_uint32),
                ("num_reserved_blocks", c_uint32), ("num_queued_events", c_uint32),
                ("bytes_sent", c_uint64), ("bytes_received", c_uint64),
                ("msgs_rejected", c_uint64), ("transfers_done", c_uint64),
                ("transfers_failed", c_uint64), ("transfers_cancelled", c_uint64),
                ("chunks_sent", c_uint64), ("chunks_sent_shm", c_uint64),
                ("chunks_read_nixl", c_uint64)]


_vp = c_void_p
for _name, _proto in {
    "tdm_kvx_create_json": (c_int, [c_char_p, POINTER(c_void_p)]),
    "tdm_kvx_destroy": (None, [_vp]),
    "tdm_kvx_errmsg": (c_char_p, [_vp]),
    "tdm_kvx_get_endpoint": (c_int, [_vp, c_char_p, ctypes.c_size_t]),
    "tdm_kvx_register": (c_int, [_vp, POINTER(_lib.KVLayoutC), POINTER(c_void_p), c_uint32,
                                 c_uint32]),
    "tdm_kvx_set_kv_scales": (c_int, [_vp, c_uint32, POINTER(c_float), POINTER(c_float),
                                      c_uint32]),
    "tdm_kvx_connect": (c_int, [_vp, c_char_p, c_char_p, POINTER(c_uint32)]),
    "tdm_kvx_find_peer": (c_int, [_vp, c_char_p, POINTER(c_uint32)]),
    "tdm_kvx_recv_desc_init": (c_int, [POINTER(RecvDescC)]),
    "tdm_kvx_recv": (c_int, [_vp, POINTER(RecvDescC), POINTER(c_uint64)]),
    "tdm_kvx_send_desc_init": (c_int, [POINTER(SendDescC)]),
    "tdm_kvx_send": (c_int, [_vp, POINTER(SendDescC), POINTER(c_uint64)]),
    "tdm_kvx_send_ready": (c_int, [_vp, c_uint64, c_uint32, c_uint32, c_uint32]),
    "tdm_kvx_cancel": (c_int, [_vp, c_uint64]),
    "tdm_kvx_event_init": (c_int, [POINTER(EventC)]),
    "tdm_kvx_poll": (c_int, [_vp, POINTER(EventC), c_uint32, POINTER(c_uint32), c_int]),
    "tdm_kvx_get_fd": (c_int, [_vp, POINTER(c_int)]),
    "tdm_kvx_stats_init": (c_int, [POINTER(KVXStatsC)]),
    "tdm_kvx_get_stats": (c_int, [_vp, POINTER(KVXStatsC)]),
}.items():
    _lib.declare(_name, *_proto)


def _call(name, *args):
    try:
        return _lib.fn(name)(*args)
    except _lib.MissingSymbol as e:
        raise TandemError(Status.UNSUPPORTED, str(e), name) from None


class KVLayout:
    """A paged KV cache layout (tdm_kv_layout): one tensor per layer, all alike."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: Union[DType, int] = DType.FP16,
                 kind: Union[LayoutKind, int] = LayoutKind.VLLM_NHD):
        self.c = _lib.KVLayoutC()
        rc = _call("tdm_kv_layout_init", byref(self.c), int(kind), num_layers, num_blocks,
                   block_size, num_kv_heads, head_dim, int(dtype))
        if rc:
            raise TandemError(rc, "bad layout", "tdm_kv_layout_init")

    def __getattr__(self, name):
        return getattr(self.__dict__["c"], name)

    @property
    def elem_size(self) -> int:
        return int(_call("tdm_dtype_size", int(self.c.dtype)))

    @property
    def layer_bytes(self) -> int:
        """Bytes of one layer's tensor (K and V of every block)."""
        c = self.c
        return 2 * c.num_blocks * c.block_size * c.num_kv_heads * c.head_dim * self.elem_size

    def offset(self, kv: int, block: int, token: int, head: int, d: int = 0) -> int:
        """Byte offset of element (kv, block, token, head, d) in a layer's tensor."""
        c = self.c
        return (kv * c.stride_kv + block * c.stride_block + token * c.stride_token +
                head * c.stride_head + d) * self.elem_size


@dataclass
class Event:
    type: EventType
    side: Side
    status: int
    handle: int
    request_id: int
    transfer_id: int
    peer: int
    num_blocks_done: int
    bytes: int
    reason: str

    @property
    def ok(self) -> bool:
        return self.type == EventType.DONE


@dataclass
class KVXStats:
    num_peers: int
    num_send_active: int
    num_recv_active: int
    num_reserved_blocks: int
    num_queued_events: int
    bytes_sent: int
    bytes_received: int
    msgs_rejected: int
    transfers_done: int
    transfers_failed: int
    transfers_cancelled: int
    chunks_sent: int
    chunks_sent_shm: int
    chunks_read_nixl: int = 0


def host_cache(layout: KVLayout) -> List[bytearray]:
    """One zeroed host buffer (a bytearray: writable, memoryview-able) per layer, sized for
    layout. Never resize them while registered: the engine holds their addresses."""
    n = layout.layer_bytes
    return [bytearray(n) for _ in range(layout.num_layers)]


def _ids(seq: Sequence[int]):
    seq = list(seq)
    return (c_uint32 * max(len(seq), 1))(*seq), len(seq)


def _nixl_wheel_dir() -> Optional[str]:
    """The site-packages directory of an installed NIXL wheel (`pip install nixl`: its
    libnixl_capi.so lies in .nixl_cu12.mesonpy.libs/ or .nixl_cu13.mesonpy.libs/), or None."""
    for d in sys.path:
        if d and os.path.isdir(d) and glob.glob(os.path.join(d, ".nixl_cu1*.mesonpy.libs",
                                                             "libnixl_capi.so*")):
            return d
    return None


def _point_at_nixl_wheel(config: dict) -> None:
    """When the engine is asked for the NIXL transport and neither TANDEM_NIXL_LIB nor
    TANDEM_NIXL_DIR says where libnixl_capi is, point TANDEM_NIXL_DIR at the NIXL wheel of
    this Python environment (vLLM hosts have one: NixlConnector needs it), so a host that
    runs outside an activated virtualenv finds it too. The library reads the variables once,
    at its first NIXL use."""
    if "nixl" not in (config.get("transports") or ()):
        return
    if os.environ.get("TANDEM_NIXL_LIB") or os.environ.get("TANDEM_NIXL_DIR"):
        return
    d = _nixl_wheel_dir()
    if d:
        os.environ["TANDEM_NIXL_DIR"] = d


class KVTransfer:
    """A KV transfer engine (tdm_kvx). Keyword arguments are the keys of
    tdm_kvx_create_json besides engine_id/role/listen (heartbeat_ms, peer_timeout_ms,
    transfer_timeout_ms, max_chunk_bytes, transports=["zmq", "shm"], curve={...}, ...)."""

    def __init__(self, engine_id: str, role: str = "both", listen: Optional[str] = None,
                 **config):
        self._h = None
        self._buffers = None
        doc = {"engine_id": engine_id, "role": role}
        if listen:
            doc["listen"] = listen
        doc.update(config)
        _point_at_nixl_wheel(doc)
        h = c_void_p()
        rc = _call("tdm_kvx_create_json", json.dumps(doc).encode(), byref(h))
        if rc:
            m = _call("tdm_kvx_errmsg", None)
            raise TandemError(rc, (m or b"").decode(errors="replace"), "tdm_kvx_create_json")
        self._h = h
        self.engine_id = engine_id

    def _check(self, name, rc):
        if rc:
            m = _call("tdm_kvx_errmsg", self._h) if self._h is not None else b""
            raise TandemError(rc, (m or b"").decode(errors="replace"), name)

    def _hh(self, name):
        if self._h is None:
            raise TandemError(Status.STATE, "the transfer engine is closed", name)
        return self._h

    def close(self):
        if self._h is not None:
            h, self._h = self._h, None
            _call("tdm_kvx_destroy", h)
        self._buffers = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def endpoint(self) -> str:
        buf = ctypes.create_string_buffer(512)
        h = self._hh("tdm_kvx_get_endpoint")
        self._check("tdm_kvx_get_endpoint", _call("tdm_kvx_get_endpoint", h, buf, 512))
        return buf.value.decode()

    def register(self, layout: KVLayout, layers: Sequence, mem_kind: int = MEM_HOST,
                 head_offset: int = 0):
        """Register the local cache: one buffer (a ctypes array, or a writable object
        exposing the buffer protocol) or integer address per layer. The buffers are kept
        referenced until close()."""
        addrs = (c_void_p * len(layers))()
        for i, b in enumerate(layers):
            if isinstance(b, int):
                addrs[i] = b
            elif isinstance(b, ctypes.Array):
                addrs[i] = ctypes.addressof(b)
            else:
                addrs[i] = ctypes.addressof(c_char.from_buffer(b))
        h = self._hh("tdm_kvx_register")
        self._check("tdm_kvx_register", _call("tdm_kvx_register", h, byref(layout.c), addrs,
                                              mem_kind, head_offset))
        self._buffers = list(layers)
        self.layout = layout

    def set_kv_scales(self, kind: Union[ScaleKind, int], k_scales: Sequence[float] = (),
                      v_scales: Sequence[float] = (), count_per_layer: Optional[int] = None):
        """Declare the fp8 cache's quantization scales (tdm_kvx_set_kv_scales), after
        register() and before connecting: flat layer-major sequences of num_layers *
        count_per_layer floats (count_per_layer defaults to 0 for NONE, 1 for TENSOR and the
        layout's num_kv_heads for HEAD). The values are copied."""
        kind = ScaleKind(int(kind))
        layout = getattr(self, "layout", None)
        if count_per_layer is None:
            count_per_layer = (0 if kind == ScaleKind.NONE else 1 if kind == ScaleKind.TENSOR
                               else layout.num_kv_heads if layout is not None else 0)
        if layout is not None and kind != ScaleKind.NONE:
            # the library reads num_layers * count_per_layer floats of each array
            need = count_per_layer * layout.num_layers
            if len(k_scales) != need or len(v_scales) != need:
                raise TandemError(Status.INVAL, f"k_scales and v_scales need {need} floats each "
                                  f"(num_layers x {count_per_layer}), got {len(k_scales)} and "
                                  f"{len(v_scales)}", "tdm_kvx_set_kv_scales")
        k = (c_float * len(k_scales))(*k_scales) if len(k_scales) else None
        v = (c_float * len(v_scales))(*v_scales) if len(v_scales) else None
        h = self._hh("tdm_kvx_set_kv_scales")
        self._check("tdm_kvx_set_kv_scales",
                    _call("tdm_kvx_set_kv_scales", h, int(kind), k, v, count_per_layer))

    def connect(self, endpoint: str, server_public_key: Optional[str] = None) -> int:
        peer = c_uint32()
        h = self._hh("tdm_kvx_connect")
        self._check("tdm_kvx_connect", _call("tdm_kvx_connect", h, endpoint.encode(),
                                             server_public_key.encode() if server_public_key
                                             else None, byref(peer)))
        return peer.value

    def find_peer(self, engine_id: str) -> int:
        peer = c_uint32()
        h = self._hh("tdm_kvx_find_peer")
        self._check("tdm_kvx_find_peer", _call("tdm_kvx_find_peer", h, engine_id.encode(),
                                               byref(peer)))
        return peer.value

    def recv(self, peer: int, request_id: int, block_ids: Sequence[int], transfer_id: int = 1,
             num_skip: int = 0, mode: Mode = Mode.PULL, timeout_ms: int = 0) -> int:
        d = RecvDescC()
        _call("tdm_kvx_recv_desc_init", byref(d))
        arr, n = _ids(block_ids)
        d.mode, d.peer, d.num_blocks = int(mode), peer, n
        d.request_id, d.transfer_id = request_id, transfer_id
        d.block_ids = ctypes.cast(arr, POINTER(c_uint32))
        d.num_skip, d.timeout_ms = num_skip, timeout_ms
        out = c_uint64()
        h = self._hh("tdm_kvx_recv")
        self._check("tdm_kvx_recv", _call("tdm_kvx_recv", h, byref(d), byref(out)))
        return out.value

    def send(self, request_id: int, block_ids: Sequence[int], num_blocks_ready: Optional[int] = None,
             peer: int = PEER_ANY, transfer_id: int = 0, mode: Mode = Mode.PULL,
             timeout_ms: int = 0) -> int:
        d = SendDescC()
        _call("tdm_kvx_send_desc_init", byref(d))
        arr, n = _ids(block_ids)
        d.mode, d.peer, d.num_blocks = int(mode), peer, n
        d.request_id, d.transfer_id = request_id, transfer_id
        d.block_ids = ctypes.cast(arr, POINTER(c_uint32))
        d.num_blocks_ready = n if num_blocks_ready is None else num_blocks_ready
        d.timeout_ms = timeout_ms
        out = c_uint64()
        h = self._hh("tdm_kvx_send")
        self._check("tdm_kvx_send", _call("tdm_kvx_send", h, byref(d), byref(out)))
        return out.value

    def send_ready(self, handle: int, num_blocks_ready: int, layer_begin: int = 0,
                   layer_end: Optional[int] = None):
        end = self.layout.num_layers if layer_end is None else layer_end
        h = self._hh("tdm_kvx_send_ready")
        self._check("tdm_kvx_send_ready", _call("tdm_kvx_send_ready", h, handle, layer_begin,
                                                end, num_blocks_ready))

    def cancel(self, handle: int):
        h = self._hh("tdm_kvx_cancel")
        self._check("tdm_kvx_cancel", _call("tdm_kvx_cancel", h, handle))

    def poll(self, timeout_ms: int = 0, max_events: int = 64) -> List[Event]:
        evs = (EventC * max_events)()
        _call("tdm_kvx_event_init", byref(evs[0]))
        for i in range(1, max_events):
            evs[i].struct_size = evs[0].struct_size
        n = c_uint32()
        h = self._hh("tdm_kvx_poll")
        self._check("tdm_kvx_poll", _call("tdm_kvx_poll", h, evs, max_events, byref(n),
                                          int(timeout_ms)))
        return [Event(EventType(e.type), Side(e.side), e.status, e.handle, e.request_id,
                      e.transfer_id, e.peer, e.num_blocks_done, e.bytes,
                      e.reason.decode(errors="replace")) for e in evs[:n.value]]

    def fileno(self) -> int:
        fd = c_int()
        h = self._hh("tdm_kvx_get_fd")
        self._check("tdm_kvx_get_fd", _call("tdm_kvx_get_fd", h, byref(fd)))
        return fd.value

    def stats(self) -> KVXStats:
        s = KVXStatsC()
        _call("tdm_kvx_stats_init", byref(s))
        h = self._hh("tdm_kvx_get_stats")
        self._check("tdm_kvx_get_stats", _call("tdm_kvx_get_stats", h, byref(s)))
        return KVXStats(**{f: getattr(s, f) for f in KVXStats.__dataclass_fields__})
