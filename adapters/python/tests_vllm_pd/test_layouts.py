"""TandemConnector's layouts from vLLM itself: the KV cache tensors every vLLM attention
backend arrangement produces, built as vLLM builds them (CPU torch), described by
tandem.vllm.layout and moved between two Tandem engines, every token of every head compared.

vLLM >= 0.32: vLLM's own create_kv_cache_views() over a raw buffer, for each KVCacheLayout
(LBHNC, LBNHC, LHBNC, BLHNC, BLNHC, BHLNC), the dense cell (K then V), the K/V planes of
backends with num_head_slots 2, and MLA's latent, in fp16, bf16 and fp8 (uint8 storage).
vLLM <= 0.31 shapes (get_kv_cache_shape permuted by get_kv_cache_stride_order): FlashAttention
[2, B, N, H, D] and FlashInfer [B, 2, N, H, D], NHD and HND, and MLA's [B, N, L].
Pairs of different arrangements and block sizes exercise the engine's conversion path; the
refusals name the shape and strides."""
import dataclasses



import pytest

torch = pytest.importorskip("torch")
kvi = pytest.importorskip("vllm.v1.kv_cache_interface")
if not hasattr(kvi, "create_kv_cache_views"):
    pytest.skip("vLLM < 0.32 (no create_kv_cache_views)", allow_module_level=True)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

from tandem import KVTransfer  # noqa: E402
from tandem.kvx import EventType  # noqa: E402
from tandem.vllm.layout import KVFacts, LayoutError, describe_kv_caches  # noqa: E402

LAYERS, H, D, LATENT = 2, 2, 8, 24
CFG = {"heartbeat_ms": 50, "peer_timeout_ms": 5000, "transfer_timeout_ms": 10000}


class Cache:
    """One engine's KV cache: the per-layer tensors, the facts of their spec, and the
    per-token reader (layer, block, token) -> (K [H, D'], V [H, D']) as raw bytes."""

    def __init__(self, tensors, facts, reader, bs):
        self.tensors, self.facts, self.reader, self.bs = tensors, facts, reader, bs

    def kv(self, layer, block, tok):
        k, v = self.reader(self.tensors[f"l{layer}"], block, tok)
        return k.contiguous().view(torch.uint8), v.contiguous().view(torch.uint8)


def _fill(raw):
    g = torch.Generator().manual_seed(raw.numel() % 9973)
    raw.copy_(torch.randint(0, 120, raw.shape, generator=g, dtype=torch.uint8))


def v32(layout, nb, bs, dtype=torch.float16, form="dense", cache_dtype="auto", fill=True):
    """vLLM >= 0.32: per-layer views over one raw buffer, as vLLM's model runner makes them."""
    if form == "mla":
        spec = kvi.MLAAttentionSpec(block_size=bs, num_kv_heads=1, head_size=LATENT, dtype=dtype)
    else:
        spec = kvi.FullAttentionSpec(block_size=bs, num_kv_heads=H, head_size=D, dtype=dtype)
        if form == "planes":
            spec = dataclasses.replace(spec, num_head_slots=2,
                                       state_content_bytes=H * D * dtype.itemsize)
    strides = kvi.compute_layout_strides(spec, nb, LAYERS, layout)
    size = spec.page_size_bytes * nb * LAYERS
    raw = torch.zeros(size, dtype=torch.int8)
    kt = kvi.KVCacheTensor(size=size, layers=[f"l{i}" for i in range(LAYERS)],
                           layer_stride=strides[0], block_stride=strides[1])
    views = kvi.create_kv_cache_views(raw, spec, nb, layout, kt)
    if fill:
        _fill(raw.view(torch.uint8))
    facts = KVFacts(num_kv_heads=spec.num_kv_heads, head_size=spec.head_size,
                    head_size_v=spec.head_size_v, num_head_slots=spec.num_head_slots,
                    state_content_bytes=spec.state_content_bytes, cache_dtype=cache_dtype,
                    num_blocks=nb, block_size=bs)
    if form == "dense":
        def reader(t, b, n):
            return t[b, :, n, :D], t[b, :, n, D:]
    elif form == "planes":
        def reader(t, b, n):
            return t[b, 0, n].reshape(H, D), t[b, 1, n].reshape(H, D)
    else:
        def reader(t, b, n):
            return t[b, 0, n, :LATENT // 2], t[b, 0, n, LATENT // 2:]
    return Cache({f"l{i}": v for i, v in enumerate(views)}, facts, reader, bs)


def legacy(kind, nb, bs, hnd=False, dtype=torch.float16, fill=True):
    """vLLM <= 0.31: a backend's get_kv_cache_shape, allocated in its stride order and
    permuted back (as the model runner did)."""
    if kind == "mla":
        shape, order = (nb, bs, LATENT), (0, 1, 2)
    elif kind == "flash":
        shape = (2, nb, bs, H, D)
        order = (0, 1, 3, 2, 4) if hnd else (0, 1, 2, 3, 4)
    else:   # flashinfer
        shape = (nb, 2, bs, H, D)
        order = (0, 1, 3, 2, 4) if hnd else (0, 1, 2, 3, 4)
    inv = [order.index(i) for i in range(len(order))]
    tensors = {}
    for i in range(LAYERS):
        phys = torch.zeros([shape[j] for j in order], dtype=dtype)
        if fill:
            _fill(phys.view(torch.uint8))
        tensors[f"l{i}"] = phys.permute(*inv)
    facts = KVFacts(num_kv_heads=1 if kind == "mla" else H, head_size=LATENT if kind == "mla" else D,
                    head_size_v=0 if kind == "mla" else D, num_blocks=nb, block_size=bs)
    if kind == "mla":
        def reader(t, b, n):
            return t[b, n, :LATENT // 2], t[b, n, LATENT // 2:]
    elif kind == "flash":
        def reader(t, b, n):
            return t[0, b, n], t[1, b, n]
    else:
        def reader(t, b, n):
            return t[b, 0, n], t[b, 1, n]
    return Cache(tensors, facts, reader, bs)


def move(src, dst, src_blocks, dst_blocks, tmp_path, tag):
    """Pull src_blocks of src into dst_blocks of dst through two engines; compare every token."""
    ds, dd = describe_kv_caches(src.tensors, src.facts), describe_kv_caches(dst.tensors, dst.facts)
    ep = f"ipc://{tmp_path}/{tag}.sock"
    with KVTransfer("P", role="prefill", listen=ep, transports=["zmq"], **CFG) as p, \
            KVTransfer("D", role="decode", transports=["zmq"], **CFG) as d:
        p.register(ds.layout, ds.bases)
        d.register(dd.layout, dd.bases)
        p.send(request_id=7, block_ids=src_blocks)
        peer = d.connect(ep)
        d.recv(peer, request_id=7, block_ids=dst_blocks)
        for eng in (d, p):
            evs = eng.poll(timeout_ms=10000)
            assert evs and evs[0].type == EventType.DONE, (tag, evs and evs[0].reason)
    ntok = len(src_blocks) * src.bs
    for layer in range(LAYERS):
        for t in range(ntok):
            a = src.kv(layer, src_blocks[t // src.bs], t % src.bs)
            b = dst.kv(layer, dst_blocks[t // dst.bs], t % dst.bs)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), (tag, layer, t)
    return ds, dd


ALL = list(KVCacheLayout)


@pytest.mark.parametrize("layout", ALL, ids=[x.name for x in ALL])
@pytest.mark.parametrize("form", ["dense", "planes", "mla"])
def test_v32_layout_moves_every_token_to_a_reference_layout(layout, form, tmp_path):
    src = v32(layout, 16, 16, form=form)
    dst = v32(KVCacheLayout.LBHNC, 12, 16, form=form, fill=False)
    ds, _ = move(src, dst, [3, 9, 0, 15], [11, 2, 5, 7], tmp_path, f"{layout.name}-{form}")
    assert ds.form == form


@pytest.mark.parametrize("dtype,cache_dtype", [(torch.bfloat16, "auto"), (torch.float32, "auto"),
                                               (torch.uint8, "fp8_e4m3"), (torch.uint8, "fp8")])
def test_v32_dtypes_move_byte_exact(dtype, cache_dtype, tmp_path):
    src = v32(KVCacheLayout.BLNHC, 8, 16, dtype=dtype, cache_dtype=cache_dtype)
    dst = v32(KVCacheLayout.LBHNC, 8, 16, dtype=dtype, cache_dtype=cache_dtype, fill=False)
    move(src, dst, [1, 4], [6, 0], tmp_path, f"dt-{cache_dtype}-{dtype}")


@pytest.mark.parametrize("kind,hnd", [("flash", False), ("flash", True), ("flashinfer", False),
                                      ("flashinfer", True)])
def test_legacy_backend_shapes_move_to_v32_views_and_back(kind, hnd, tmp_path):
    old = legacy(kind, 16, 16, hnd=hnd)
    new = v32(KVCacheLayout.LBNHC, 16, 16, fill=False)
    ds, _ = move(old, new, [2, 3, 14], [0, 8, 9], tmp_path, f"{kind}-{hnd}-fwd")
    assert ds.form.startswith("legacy")
    back = legacy(kind, 16, 16, hnd=not hnd, fill=False)
    move(new, back, [0, 8, 9], [5, 6, 7], tmp_path, f"{kind}-{hnd}-back")


def test_legacy_mla_latent_moves_to_v32_mla(tmp_path):
    move(legacy("mla", 8, 16), v32(KVCacheLayout.BLHNC, 8, 16, form="mla", fill=False),
         [1, 2, 7], [3, 0, 4], tmp_path, "mla-legacy")


@pytest.mark.parametrize("src_layout,src_bs,dst_layout,dst_bs", [
    (KVCacheLayout.LBHNC, 16, KVCacheLayout.BLNHC, 32),
    (KVCacheLayout.BHLNC, 32, KVCacheLayout.LBNHC, 16),
    (KVCacheLayout.LHBNC, 16, KVCacheLayout.LHBNC, 64),
])
def test_different_block_sizes_are_reblocked(src_layout, src_bs, dst_layout, dst_bs, tmp_path):
    src = v32(src_layout, 16, src_bs)
    dst = v32(dst_layout, 16, dst_bs, fill=False)
    n_src = 4
    n_dst = (n_src * src_bs + dst_bs - 1) // dst_bs
    move(src, dst, [5, 1, 12, 3], [9, 2, 14, 0, 7, 11, 4, 6][:n_dst], tmp_path,
         f"rb-{src_bs}-{dst_bs}")


def test_kernel_blocks_of_a_manager_block_are_one_block_when_tokens_continue():
    # a manager block split into kernel blocks: its tokens continue across them only
    # when each block holds one head slot
    spec = kvi.FullAttentionSpec(block_size=32, num_kv_heads=1, head_size=D, dtype=torch.float16)
    nb = 8
    views = v32_views_kernel(spec, nb, 16)
    desc = describe_kv_caches(views, KVFacts(num_kv_heads=1, head_size=D, head_size_v=D,
                                             num_blocks=nb, block_size=32))
    assert desc.layout.num_blocks == nb and desc.layout.block_size == 32
    spec2 = kvi.FullAttentionSpec(block_size=32, num_kv_heads=H, head_size=D, dtype=torch.float16)
    with pytest.raises(LayoutError, match="kernel blocks"):
        describe_kv_caches(v32_views_kernel(spec2, nb, 16),
                           KVFacts(num_kv_heads=H, head_size=D, head_size_v=D, num_blocks=nb,
                                   block_size=32))


def v32_views_kernel(spec, nb, kbs):
    layout = KVCacheLayout.LBHNC
    strides = kvi.compute_layout_strides(spec, nb, LAYERS, layout)
    size = spec.page_size_bytes * nb * LAYERS
    raw = torch.zeros(size, dtype=torch.int8)
    kt = kvi.KVCacheTensor(size=size, layers=[f"l{i}" for i in range(LAYERS)],
                           layer_stride=strides[0], block_stride=strides[1])
    views = kvi.create_kv_cache_views(raw, spec, nb, layout, kt, kernel_block_size=kbs)
    return {f"l{i}": v for i, v in enumerate(views)}


def test_refusals_name_shape_and_strides():
    t = torch.zeros(4, 2, 16, 16, dtype=torch.float16)
    with pytest.raises(LayoutError, match=r"shape \[4, 2, 16, 16\] strides \[512, 256, 16, 1\]"):
        describe_kv_caches({"l0": t}, KVFacts(num_kv_heads=H, head_size=D, head_size_v=D,
                                              state_content_bytes=40))
    with pytest.raises(LayoutError, match="quantization mode"):
        describe_kv_caches({"l0": t}, KVFacts(quant_mode="FP8_PER_TOKEN_HEAD"))
    with pytest.raises(LayoutError, match="not contiguous"):
        describe_kv_caches({"l0": t.transpose(2, 3)}, KVFacts())
    with pytest.raises(LayoutError, match="fp8_e5m2"):
        describe_kv_caches({"l0": torch.zeros(4, 2, 16, 16, dtype=torch.uint8)},
                           KVFacts(cache_dtype="fp8_e5m2"))
    with pytest.raises(LayoutError, match="dimensions"):
        describe_kv_caches({"l0": torch.zeros(4, 16, dtype=torch.float16)}, KVFacts())
    with pytest.raises(LayoutError, match="differs from layer"):
        describe_kv_caches({"a": t, "b": torch.zeros(4, 2, 8, 16, dtype=torch.float16)}, KVFacts())


def test_layers_sharing_one_cache_are_registered_once():
    t = torch.zeros(4, 2, 16, 16, dtype=torch.float16)
    u = torch.zeros(4, 2, 16, 16, dtype=torch.float16)
    desc = describe_kv_caches({"a": t, "b": u, "c": t}, KVFacts())
    assert desc.names == ["a", "b"] and desc.layout.num_layers == 2



