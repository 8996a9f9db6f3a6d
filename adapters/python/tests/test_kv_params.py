"""TandemConnector's kv_transfer_params (tandem/vllm/params.py, no vllm needed): NixlConnector's
keys are all there with its meanings, a decode side given only those keys (as a host that
speaks NixlConnector's protocol forwards them) finds the engine and the request, malformed
params are refused with the field named, and such params drive a real pull end to end."""
import time

import pytest

import tandem
from tandem import KVLayout, KVTransfer, host_cache
from tandem.vllm.params import (endpoint_host_port, make_transfer_params, parse_transfer_params,
                                request_id_u64)

NIXL_KEYS = {"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
             "remote_request_id", "remote_host", "remote_port", "tp_size"}


def test_params__carry_every_nixl_connector_key():
    p = make_transfer_params("prefill-0", "tcp://10.0.0.5:7600", "cmpl-abc-0", [4, 5, 6],
                             num_tokens=40, block_size=16, tp_size=2)
    assert NIXL_KEYS <= set(p)
    assert p["do_remote_prefill"] is True and p["do_remote_decode"] is False
    assert p["remote_block_ids"] == [4, 5, 6] and p["remote_engine_id"] == "prefill-0"
    assert p["remote_request_id"] == "cmpl-abc-0"
    assert (p["remote_host"], p["remote_port"], p["tp_size"]) == ("10.0.0.5", 7600, 2)
    assert p["remote_endpoint"] == "tcp://10.0.0.5:7600" and p["remote_block_size"] == 16


def test_params__nixl_keys_alone_are_enough_for_the_decode_side():
    p = make_transfer_params("prefill-0", "tcp://10.0.0.5:7600", "cmpl-abc-0", [1], 16, 16)
    only = {k: p[k] for k in NIXL_KEYS}
    rid, engine, ep = parse_transfer_params(only)
    assert rid == request_id_u64("cmpl-abc-0") and engine == "prefill-0"
    assert ep == "tcp://10.0.0.5:7600"
    assert parse_transfer_params(dict(only, remote_host="::1"))[2] == "tcp://[::1]:7600"
    # Tandem's own endpoint wins when present; integer request ids are still understood
    assert parse_transfer_params(dict(p, remote_endpoint="ipc:///tmp/x.sock"))[2] == "ipc:///tmp/x.sock"
    assert parse_transfer_params(dict(p, remote_request_id=5))[0] == 5


def test_params__ipc_endpoints_have_no_host_or_port():
    assert endpoint_host_port("ipc:///tmp/p.sock") == (None, None)
    assert endpoint_host_port("tcp://[::1]:5600") == ("::1", 5600)
    assert endpoint_host_port("tcp://host:notaport") == (None, None)
    p = make_transfer_params("e", "ipc:///tmp/p.sock", "r", [1], 4, 4)
    assert p["remote_host"] is None and p["remote_port"] is None


@pytest.mark.parametrize("bad, field", [
    ({"remote_request_id": "r", "remote_host": "h", "remote_port": 1}, "remote_engine_id"),
    ({"remote_engine_id": "e", "remote_host": "h", "remote_port": 1}, "remote_request_id"),
    ({"remote_engine_id": "e", "remote_request_id": -3, "remote_host": "h", "remote_port": 1},
     "remote_request_id"),
    ({"remote_engine_id": "e", "remote_request_id": True, "remote_host": "h", "remote_port": 1},
     "remote_request_id"),
    ({"remote_engine_id": "e", "remote_request_id": "r", "remote_host": "h", "remote_port": 70000},
     "remote_port"),
    ({"remote_engine_id": "e", "remote_request_id": "r", "remote_port": 5600}, "remote_host"),
    ({"remote_engine_id": "e", "remote_request_id": "r", "remote_endpoint": "udp://x:1"},
     "remote_endpoint"),
])
def test_params__malformed_are_refused_naming_the_field(bad, field):
    with pytest.raises(ValueError) as ei:
        parse_transfer_params(bad)
    assert field in str(ei.value)


def test_params__drive_a_pull_over_tcp(tmp_path):
    if not tandem.has_kvx():
        pytest.skip(f"{tandem.library_path} does not implement the KV transfer engine yet")
    lay = KVLayout(num_layers=2, num_blocks=16, block_size=4, num_kv_heads=2, head_dim=8)
    p = KVTransfer("p-params", role="prefill", listen="tcp://127.0.0.1:*", heartbeat_ms=50,
                   peer_timeout_ms=2000, transfer_timeout_ms=5000)
    d = KVTransfer("d-params", role="decode", heartbeat_ms=50, peer_timeout_ms=2000,
                   transfer_timeout_ms=5000)
    try:
        pb, db = host_cache(lay), host_cache(lay)
        for li, b in enumerate(pb):
            b[:] = bytes(((i * 7 + li) & 0xFF) for i in range(len(b)))
        p.register(lay, pb)
        d.register(lay, db)
        src, dst = [3, 5, 9], [1, 2, 10]
        params = make_transfer_params("p-params", p.endpoint, "cmpl-xyz-0", src, 12, 4)
        p.send(request_id=request_id_u64("cmpl-xyz-0"), block_ids=src)
        rid, engine, ep = parse_transfer_params({k: params[k] for k in NIXL_KEYS})
        peer = d.connect(ep)
        h = d.recv(peer, request_id=rid, block_ids=dst, transfer_id=1)
        evs, t0 = [], time.monotonic()
        while not evs and time.monotonic() - t0 < 10:
            evs = d.poll(timeout_ms=100)
        assert evs and evs[0].ok and evs[0].handle == h, evs
        for s, t in zip(src, dst):
            for b_src, b_dst in zip(pb, db):
                n = len(b_src) // lay.num_blocks // 2   # one block of K (then V) per layer
                for kv in (0, 1):
                    o_s = kv * len(b_src) // 2 + s * n
                    o_d = kv * len(b_dst) // 2 + t * n
                    assert b_dst[o_d:o_d + n] == b_src[o_s:o_s + n]
    finally:
        d.close()
        p.close()
