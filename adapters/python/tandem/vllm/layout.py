"""The KV cache layout of a vLLM engine, taken from vLLM itself and described exactly with
Tandem's layout descriptor (tdm_kv_layout, kind CUSTOM: explicit strides).

What register_kv_caches receives depends on the vLLM version:

* vLLM >= 0.32 (RFC #42082): one 4-D view per layer, logical [B, H, N, C]: blocks, head slots,
  tokens (kernel states) and the content of one (slot, token) cell, in the cache dtype, over a
  buffer whose physical order is the backend's KVCacheLayout (LBHNC, LBNHC, BLHNC, ...), so
  the strides of the view carry the order. The content, per the layer's AttentionSpec:
  dense (K then V of one head: C = head_size + head_size_v), K/V planes (num_head_slots 2:
  slot 0 holds K of every head, slot 1 V), or MLA's single latent vector (head_size_v 0).
* vLLM <= 0.31: the shape of the backend's get_kv_cache_shape(), permuted by its
  get_kv_cache_stride_order(): [2, B, N, H, D] (FlashAttention, FlexAttention, Triton) or
  [B, 2, N, H, D] (FlashInfer), NHD or HND in memory; MLA's latent [B, N, L].

Everything is read from the tensors (shape, strides in elements, dtype, device) and the
layer's spec; nothing is assumed contiguous. An MLA latent of L elements is described as one
head of L/2 elements whose "K" is the first half and "V" the second: every byte of the cell
moves, and two engines with the same latent size exchange it exactly. A layout the
descriptor cannot express (packed quantized content, a head dimension that is not
contiguous, e5m2 or integer caches, ...) raises LayoutError naming the shape and strides.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from tandem import _lib
from tandem.kvx import MEM_CUDA, MEM_HOST, DType, KVLayout, LayoutKind

__all__ = ["LayoutError", "KVFacts", "VLLMKVLayout", "facts_from_vllm", "describe_kv_caches"]

class LayoutError(ValueError):
    """The KV cache tensors cannot be described exactly; the message says why."""


@dataclass
class KVFacts:
    """What the layer's spec says about one cell's content (None: not known)."""
    num_kv_heads: Optional[int] = None
    head_size: Optional[int] = None
    head_size_v: Optional[int] = None      # 0: MLA (one latent vector)
    num_head_slots: Optional[int] = None   # 2 with K/V planes
    state_content_bytes: Optional[int] = None
    cache_dtype: str = "auto"              # vLLM's --kv-cache-dtype
    num_blocks: Optional[int] = None       # the KV cache manager's blocks
    block_size: Optional[int] = None       # tokens per manager block
    layer_names: Optional[Sequence[str]] = None   # the transferred group's layers, in order
    quant_mode: Optional[str] = None       # name of the spec's kv_quant_mode


@dataclass
class VLLMKVLayout:
    layout: KVLayout
    bases: list            # one address per registered layer
    names: list            # the registered layers' names
    mem_kind: int
    form: str              # how the cells were read: "dense", "planes", "mla", "legacy-..."

    def describe(self) -> str:
        c = self.layout.c
        return (f"{self.form}: {c.num_layers} layers x {c.num_blocks} blocks x {c.block_size} "
                f"tokens x {c.num_kv_heads} heads x {c.head_dim} ({DType(c.dtype).name}), strides "
                f"kv {c.stride_kv} block {c.stride_block} token {c.stride_token} head "
                f"{c.stride_head}")


def facts_from_vllm(vllm_config: Any, kv_cache_config: Any = None) -> KVFacts:
    """The facts of the first KV cache group (the one the connector transfers) from vLLM's
    KVCacheConfig when there is one, else from the model config."""
    cc = getattr(vllm_config, "cache_config", None)
    f = KVFacts(cache_dtype=str(getattr(cc, "cache_dtype", "auto") or "auto"),
                block_size=getattr(cc, "block_size", None))
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if groups:
        moved = [g for g in groups if getattr(g, "enable_kv_transfer", True)]
        if len(moved) > 1:
            raise LayoutError(f"TandemConnector moves one KV cache group; this model has "
                              f"{len(moved)} (hybrid attention is not supported)")
        g = (moved or groups)[0]
        spec = g.kv_cache_spec
        f.layer_names = list(g.layer_names)
        f.num_kv_heads = getattr(spec, "num_kv_heads", None)
        f.head_size = getattr(spec, "head_size", None)
        f.head_size_v = getattr(spec, "head_size_v", None)
        f.num_head_slots = getattr(spec, "num_head_slots", None)
        f.state_content_bytes = getattr(spec, "state_content_bytes", None)
        f.block_size = getattr(spec, "block_size", f.block_size)
        qm = getattr(spec, "kv_quant_mode", None)
        f.quant_mode = getattr(qm, "name", None) if qm is not None else None
        if f.num_kv_heads is None or f.head_size is None:
            raise LayoutError(f"TandemConnector: the KV cache spec {type(spec).__name__} has no "
                              f"attention heads (only attention KV caches can be moved)")
        f.num_blocks = getattr(kv_cache_config, "num_blocks", None)
        return f
    mc = getattr(vllm_config, "model_config", None)
    if mc is not None:
        try:
            f.head_size = mc.get_head_size()
            f.num_kv_heads = mc.get_num_kv_heads(vllm_config.parallel_config)
            f.head_size_v = 0 if getattr(mc, "use_mla", False) else f.head_size
        except Exception:   # a partial config (host tests): the tensors decide alone
            pass
    return f


_TORCH_DTYPES = {"float16": DType.FP16, "bfloat16": DType.BF16, "float32": DType.FP32,
                 "float8_e4m3fn": DType.FP8_E4M3}


def _dtype(name: str, cache_dtype: str) -> DType:
    if name in _TORCH_DTYPES:
        return _TORCH_DTYPES[name]
    if name == "uint8" and cache_dtype in ("fp8", "fp8_e4m3"):
        return DType.FP8_E4M3   # vLLM stores fp8 caches as uint8
    raise LayoutError(f"KV cache dtype {name} with --kv-cache-dtype {cache_dtype} is not supported "
                      f"(fp16, bf16, fp32 and fp8-e4m3 caches are)")


def _info(t):
    """(address, shape, strides in elements, dtype name, is_cuda) of a torch tensor or a
    numpy array."""
    if hasattr(t, "data_ptr"):
        return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), str(t.dtype).replace("torch.", ""),
                t.device.type != "cpu")
    es = t.dtype.itemsize
    return (t.ctypes.data, tuple(t.shape), tuple(s // es for s in t.strides), str(t.dtype), False)


def _refuse(shape, strides, why: str):
    raise LayoutError(f"TandemConnector: cannot describe a KV cache tensor of shape "
                      f"{list(shape)} strides {list(strides)} (elements): {why}")


def _cells(shape, strides, f: KVFacts):
    """(form, blocks, tokens, heads, head_dim, stride kv, block, token, head) of one tensor."""
    nd = len(shape)
    if nd == 4:   # vLLM >= 0.32: [B, H, N, C]
        b, h, n, c = shape
        sb, sh, sn, sc = strides
        if c > 1 and sc != 1:
            _refuse(shape, strides, "the content dimension is not contiguous")
        if f.quant_mode and f.quant_mode not in ("NONE", "FP8_PER_TENSOR"):
            _refuse(shape, strides, f"quantization mode {f.quant_mode} packs scales into the cells")
        hs, hsv = f.head_size, f.head_size_v
        if f.num_head_slots == 2 and h == 2 and hs and hsv == hs and f.num_kv_heads \
                and c == f.num_kv_heads * hs:
            # K/V planes: slot 0 = K of every head, slot 1 = V; heads side by side in C
            return "planes", b, n, f.num_kv_heads, hs, sh, sb, sn, hs
        if f.state_content_bytes is not None or f.num_head_slots is not None:
            _refuse(shape, strides, f"packed cell content ({f.state_content_bytes} bytes, "
                                    f"{f.num_head_slots} head slots)")
        if hsv == 0 or (hs is None and h == 1 and f.head_size_v == 0):
            if c % 2:
                _refuse(shape, strides, f"an MLA latent of odd size {c}")
            return "mla", b, n, 1, c // 2, c // 2, sb, sn, 0
        if hs is not None and hsv is not None and hs + hsv != c:
            _refuse(shape, strides, f"cells of {c} elements, the spec says K {hs} + V {hsv}")
        if hs is not None and hsv is not None and hs != hsv:
            _refuse(shape, strides, f"K and V head sizes differ ({hs} and {hsv})")
        if f.num_kv_heads is not None and h != f.num_kv_heads:
            _refuse(shape, strides, f"{h} head slots, the spec says {f.num_kv_heads} KV heads")
        if c % 2:
            _refuse(shape, strides, f"cells of odd size {c} cannot hold K and V of one size")
        return "dense", b, n, h, c // 2, c // 2, sb, sn, sh
    if nd == 5:   # vLLM <= 0.31: FlashAttention-like [2, B, N, H, D] or FlashInfer-like [B, 2, N, H, D]
        if shape[4] > 1 and strides[4] != 1:
            _refuse(shape, strides, "head_size is not contiguous")
        fa, fi = shape[0] == 2, shape[1] == 2
        if fa and fi and f.num_blocks not in (None, 2):
            fa = f.num_blocks != shape[1]
            fi = not fa
        if fa == fi:
            _refuse(shape, strides, "neither [2, blocks, block_size, heads, head_size] nor "
                                    "[blocks, 2, block_size, heads, head_size]")
        if fa:
            return ("legacy-kv-first", shape[1], shape[2], shape[3], shape[4], strides[0],
                    strides[1], strides[2], strides[3])
        return ("legacy-blocks-first", shape[0], shape[2], shape[3], shape[4], strides[1],
                strides[0], strides[2], strides[3])
    if nd == 3:   # vLLM <= 0.31 MLA: [B, N, latent]
        b, n, c = shape
        if c > 1 and strides[2] != 1:
            _refuse(shape, strides, "the latent is not contiguous")
        if c % 2:
            _refuse(shape, strides, f"an MLA latent of odd size {c}")
        return "legacy-mla", b, n, 1, c // 2, c // 2, strides[0], strides[1], 0
    _refuse(shape, strides, f"{nd} dimensions (4-D [blocks, heads, tokens, cell] views of vLLM "
                            f">= 0.32, or the 5-D / 3-D MLA shapes of older backends, are known)")


def describe_kv_caches(kv_caches: dict, facts: Optional[KVFacts] = None) -> VLLMKVLayout:
    """The exact Tandem layout of vLLM's per-layer KV cache tensors (register_kv_caches'
    argument): one registered layer per distinct tensor of the transferred group, in the
    model's order. Raises LayoutError when the tensors cannot be described exactly."""
    f = facts or KVFacts()
    names = [n for n in (f.layer_names or kv_caches.keys()) if n in kv_caches]
    if not names:
        if f.layer_names and kv_caches:
            raise LayoutError(f"TandemConnector: none of the KV cache group's layers "
                              f"({', '.join(list(f.layer_names)[:4])}) is among the registered "
                              f"KV cache tensors ({', '.join(list(kv_caches)[:4])})")
        raise LayoutError("TandemConnector: no KV cache tensors")
    seen, tensors, kept = set(), [], []
    for n in names:
        t = kv_caches[n]
        if isinstance(t, (list, tuple)):
            raise LayoutError(f"TandemConnector: layer {n} holds a list of tensors (state space "
                              f"models are not supported)")
        a = _info(t)[0]
        if a in seen:   # layers that share one KV cache (KV sharing): registered once
            continue
        seen.add(a)
        tensors.append(t)
        kept.append(n)
    addr0, shape, strides, dtype, cuda = _info(tensors[0])
    form, nb, bs, heads, hd, s_kv, s_blk, s_tok, s_head = _cells(shape, strides, f)
    if f.num_blocks and nb != f.num_blocks:
        # kernel blocks: a manager block of r kernel blocks is one block when its tokens
        # continue across kernel blocks at a constant stride
        r = nb // f.num_blocks
        if nb % f.num_blocks or s_blk != bs * s_tok:
            _refuse(shape, strides, f"{nb} kernel blocks for {f.num_blocks} manager blocks whose "
                                    f"tokens are not evenly strided")
        nb, bs, s_blk = f.num_blocks, bs * r, s_blk * r
    if any(s < 0 for s in (s_kv, s_blk, s_tok, s_head)):
        _refuse(shape, strides, "negative strides")
    lay = KVLayout(num_layers=len(tensors), num_blocks=nb, block_size=bs, num_kv_heads=heads,
                   head_dim=hd, dtype=_dtype(dtype, f.cache_dtype), kind=LayoutKind.CUSTOM)
    c = lay.c
    c.stride_kv, c.stride_block, c.stride_token, c.stride_head = s_kv, s_blk, s_tok, s_head
    rc = _lib.fn("tdm_kv_layout_validate")(ctypes.byref(c))
    if rc:
        msg = _lib.fn("tdm_kv_errmsg")()
        _refuse(shape, strides, f"Tandem refuses the derived layout: {(msg or b'').decode()}")
    bases = []
    for n, t in zip(kept, tensors):
        a, s, st, d, cu = _info(t)
        if s != shape or st != strides or d != dtype or cu != cuda:
            raise LayoutError(f"TandemConnector: layer {n} ({list(s)} strides {list(st)} {d}) "
                              f"differs from layer {kept[0]} ({list(shape)} strides "
                              f"{list(strides)} {dtype})")
        bases.append(a)
    return VLLMKVLayout(lay, bases, kept, MEM_CUDA if cuda else MEM_HOST, form)


_lib.declare("tdm_kv_layout_validate", ctypes.c_int, [ctypes.POINTER(_lib.KVLayoutC)])
_lib.declare("tdm_kv_errmsg", ctypes.c_char_p, [])
