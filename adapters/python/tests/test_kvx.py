"""KVTransfer through the real transfer engine: two engines in one process over ipc, every
byte of the moved blocks checked; errors carry the library's message."""
import os
import sys
import time

import pytest

import tandem
from tandem import DType, KVLayout, KVTransfer, ScaleKind, Status, TandemError, host_cache


@pytest.fixture
def needs_kvx():
    if not tandem.has_kvx():
        pytest.skip(f"{tandem.library_path} does not implement the KV transfer engine yet")


def fill(bufs, seed):
    for li, b in enumerate(bufs):
        mv = memoryview(b)
        mv[:] = bytes(((i * 131 + li * 17 + seed) & 0xFF) for i in range(len(mv)))


def wait(e, n=1, timeout=10.0):
    out = []
    t0 = time.monotonic()
    while len(out) < n:
        assert time.monotonic() - t0 < timeout, f"waited for {n} events, got {out}"
        out += e.poll(timeout_ms=100)
    return out


def block_bytes(layout, bufs, block):
    """All bytes of one block (K and V, every layer) in logical order."""
    out = bytearray()
    es = layout.elem_size
    for b in bufs:
        mv = memoryview(b)
        for kv in (0, 1):
            for t in range(layout.block_size):
                for h in range(layout.num_kv_heads):
                    o = layout.offset(kv, block, t, h)
                    out += mv[o:o + layout.head_dim * es]
    return bytes(out)


@pytest.fixture
def pair(needs_kvx, tmp_path):
    lay = KVLayout(num_layers=2, num_blocks=16, block_size=4, num_kv_heads=2, head_dim=8)
    p = KVTransfer("p0", role="prefill", listen=f"ipc://{tmp_path}/p0.sock",
                   heartbeat_ms=50, peer_timeout_ms=2000, transfer_timeout_ms=5000)
    d = KVTransfer("d0", role="decode", heartbeat_ms=50, peer_timeout_ms=2000,
                   transfer_timeout_ms=5000)
    pb, db = host_cache(lay), host_cache(lay)
    fill(pb, 7)
    p.register(lay, pb)
    d.register(lay, db)
    peer = d.connect(p.endpoint)
    yield lay, p, d, pb, db, peer
    d.close()
    p.close()


def test_kvx__pull_moves_every_byte(pair):
    lay, p, d, pb, db, peer = pair
    src, dst = [3, 5, 9], [1, 2, 10]
    hs = p.send(request_id=42, block_ids=src)
    hr = d.recv(peer, request_id=42, block_ids=dst, transfer_id=1)
    ev = wait(d)[0]
    assert ev.ok and ev.handle == hr and ev.num_blocks_done == 3, ev
    assert wait(p)[0].handle == hs
    for s, t in zip(src, dst):
        assert block_bytes(lay, db, t) == block_bytes(lay, pb, s)
    st = d.stats()
    assert st.num_reserved_blocks == 0 and st.transfers_done == 1 and st.bytes_received > 0


def test_kvx__unknown_peer_is_refused_with_message(pair):
    lay, p, d, pb, db, peer = pair
    with pytest.raises(TandemError) as ei:
        d.recv(peer + 77, request_id=1, block_ids=[1])
    assert ei.value.status == Status.PEER and ei.value.message


def test_kvx__block_out_of_layout_is_range(pair):
    lay, p, d, pb, db, peer = pair
    with pytest.raises(TandemError) as ei:
        d.recv(peer, request_id=1, block_ids=[1, 99])
    assert ei.value.status == Status.RANGE


def test_kvx__bad_config_names_key(needs_kvx):
    with pytest.raises(TandemError) as ei:
        KVTransfer("x", no_such_key=1)
    assert "no_such_key" in ei.value.message


def test_kvx__closed_engine_raises_state(needs_kvx):
    e = KVTransfer("solo")
    e.close()
    with pytest.raises(TandemError) as ei:
        e.poll()
    assert ei.value.status == Status.STATE


def test_kvx__set_kv_scales_rescales_fp8_into_fp16(needs_kvx, tmp_path):
    """fp8 1.0 everywhere with K scale 2 and V scale 0.5 per layer arrives as fp16 2.0 / 0.5;
    bad scales and calls after the handshake raise with the library's message."""
    l8 = KVLayout(num_layers=2, num_blocks=8, block_size=4, num_kv_heads=2, head_dim=8,
                  dtype=DType.FP8_E4M3)
    l16 = KVLayout(num_layers=2, num_blocks=8, block_size=4, num_kv_heads=2, head_dim=8)
    p = KVTransfer("p8", role="prefill", listen=f"ipc://{tmp_path}/p8.sock", heartbeat_ms=50)
    d = KVTransfer("d16", role="decode", heartbeat_ms=50)
    try:
        pb, db = host_cache(l8), host_cache(l16)
        for b in pb:
            b[:] = b"\x38" * len(b)                 # fp8-e4m3 1.0
        p.register(l8, pb)
        d.register(l16, db)
        with pytest.raises(TandemError) as ei:
            p.set_kv_scales(ScaleKind.TENSOR, [2.0, float("nan")], [0.5, 0.5])
        assert ei.value.status == Status.INVAL and "k_scales[1]" in ei.value.message
        with pytest.raises(TandemError) as ei:
            p.set_kv_scales(ScaleKind.HEAD, [1.0] * 2, [1.0] * 2)   # needs 2 x 2 floats
        assert ei.value.status == Status.INVAL
        p.set_kv_scales(ScaleKind.TENSOR, [2.0, 2.0], [0.5, 0.5])
        peer = d.connect(p.endpoint)
        p.send(request_id=5, block_ids=[1, 6])
        d.recv(peer, request_id=5, block_ids=[3, 4])
        assert wait(d)[0].ok
        for b in db:
            mv = memoryview(b)
            for blk in (3, 4):
                for kv, want in ((0, b"\x00\x40"), (1, b"\x00\x38")):   # fp16 2.0, 0.5
                    o = l16.offset(kv, blk, 0, 0)
                    n = l16.block_size * l16.num_kv_heads * l16.head_dim * 2
                    assert bytes(mv[o:o + n]) == want * (n // 2)
        with pytest.raises(TandemError) as ei:
            p.set_kv_scales(ScaleKind.NONE)
        assert ei.value.status == Status.STATE and "handshake" in ei.value.message
    finally:
        d.close()
        p.close()


def test_nixl_transport_finds_the_wheel_on_sys_path(tmp_path, monkeypatch):
    """A host asking for the NIXL transport outside an activated venv gets TANDEM_NIXL_DIR
    pointed at the NIXL wheel of its own environment; an explicit setting is never replaced,
    and nothing is set when NIXL is not asked for or no wheel is installed."""
    from tandem import kvx as kvx_mod
    libs = tmp_path / ".nixl_cu13.mesonpy.libs"
    libs.mkdir()
    (libs / "libnixl_capi.so").write_bytes(b"")
    monkeypatch.delenv("TANDEM_NIXL_LIB", raising=False)
    monkeypatch.delenv("TANDEM_NIXL_DIR", raising=False)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "absent"), str(tmp_path)])

    kvx_mod._point_at_nixl_wheel({"transports": ["zmq"]})
    assert "TANDEM_NIXL_DIR" not in os.environ
    kvx_mod._point_at_nixl_wheel({"transports": ["zmq", "nixl"]})
    assert os.environ["TANDEM_NIXL_DIR"] == str(tmp_path)

    monkeypatch.setenv("TANDEM_NIXL_DIR", "/elsewhere")
    kvx_mod._point_at_nixl_wheel({"transports": ["nixl"]})
    assert os.environ["TANDEM_NIXL_DIR"] == "/elsewhere"

    monkeypatch.delenv("TANDEM_NIXL_DIR")
    monkeypatch.setenv("TANDEM_NIXL_LIB", "/x/libnixl_capi.so")
    kvx_mod._point_at_nixl_wheel({"transports": ["nixl"]})
    assert "TANDEM_NIXL_DIR" not in os.environ

    monkeypatch.delenv("TANDEM_NIXL_LIB")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "absent")])
    kvx_mod._point_at_nixl_wheel({"transports": ["nixl"]})
    assert "TANDEM_NIXL_DIR" not in os.environ
