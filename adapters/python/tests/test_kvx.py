"""KVTransfer through the real transfer engine: two engines in one process over ipc, every
byte of the moved blocks checked; errors carry the library's message."""
import os
import time

import pytest

import tandem
from tandem import KVLayout, KVTransfer, Status, TandemError, host_cache


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
