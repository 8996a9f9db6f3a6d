"""`tandem serve` driven as an outside client would: pyzmq + msgpack over a ROUTER socket,
including garbage, truncated, wrong-type, multi-frame and oversized messages, after each of
which the service still answers and the instance's state is unchanged."""
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (pip install pyzmq)")
msgpack = pytest.importorskip("msgpack", reason="msgpack is not installed (pip install msgpack)")

from conftest import build_dir  # noqa: E402

MAX_MSG = 65536


def tool_path() -> Path:
    return Path(os.environ.get("TANDEM_TOOL", build_dir() / "tandem"))


@pytest.fixture
def server(needs_scheduler):
    tool = tool_path()
    if not tool.exists():
        pytest.skip(f"{tool} is not built")
    p = subprocess.Popen([str(tool), "serve", "--bind", "tcp://127.0.0.1:*", "--max-msg",
                          str(MAX_MSG)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if "listening on" not in line:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"serve did not start: {line!r} {err!r}")
    endpoint = line.rsplit(" ", 1)[1].strip()
    yield p, endpoint
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    err = p.stderr.read()
    p.stdout.close()
    p.stderr.close()
    # SIGTERM ends the service cleanly (exit 0; under ASan also: no leak).
    assert p.returncode == 0, f"tandem serve exited with {p.returncode}: {err[-2000:]}"


class Client:
    def __init__(self, endpoint, kind=None):
        self.ctx = zmq.Context.instance()
        self.kind = kind or zmq.DEALER
        self.sock = self.ctx.socket(self.kind)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def raw(self, frames, timeout=10.0):
        if self.kind == zmq.DEALER and not isinstance(frames, list):
            frames = [frames]
        if isinstance(frames, list):
            self.sock.send_multipart(frames)
        else:
            self.sock.send(frames)
        if not self.sock.poll(int(timeout * 1000)):
            raise AssertionError("no reply from tandem serve")
        return msgpack.unpackb(self.sock.recv(), raw=False, strict_map_key=False)

    def __call__(self, op, **kw):
        kw["op"] = op
        return self.raw(msgpack.packb(kw))

    def ok(self, op, **kw):
        r = self(op, **kw)
        assert r["ok"], r
        return r

    def close(self):
        self.sock.close()


@pytest.fixture
def client(server):
    c = Client(server[1])
    yield c
    c.close()


def make_instance(c, name="s"):
    c.ok("create", name=name, config={"block_size": 4, "num_blocks": 64,
                                      "max_num_batched_tokens": 64, "max_num_seqs": 8})


def snapshot(c, name="s"):
    st = c.ok("stats", name=name)["stats"]
    return st


def test_ping__reports_version(client):
    r = client.ok("ping", seq=41)
    assert r["seq"] == 41 and r["abi"] == 1 and r["version"].count(".") == 2


def test_instances__create_list_destroy(client):
    make_instance(client, "a")
    make_instance(client, "b")
    assert sorted(client.ok("list")["names"]) == ["a", "b"]
    r = client("create", name="a")
    assert not r["ok"] and r["error"] == "already exists"
    client.ok("destroy", name="a")
    assert client.ok("list")["names"] == ["b"]
    r = client("stats", name="a")
    assert not r["ok"] and r["status"] == -3 and '"a"' in r["message"]


def test_config__json_string_and_map_and_errors(client):
    client.ok("create", name="j", config='{"block_size": 8, "num_blocks": 100}')
    cfg = client.ok("get_config", name="j")["config"]
    assert cfg["block_size"] == 8 and cfg["num_blocks"] == 100
    r = client("configure", name="j", config={"no_such_key": 1})
    assert not r["ok"] and "no_such_key" in r["message"]
    assert client.ok("get_config", name="j")["config"] == cfg
    client.ok("set_param", name="j", key="max_num_seqs", value=7)
    assert client.ok("get_param", name="j", key="max_num_seqs")["value"] == 7
    r = client("create", name="bad", config={"num_blocks": "many"})
    assert not r["ok"]
    assert "bad" not in client.ok("list")["names"]


def test_scenario__requests_run_to_completion(client):
    make_instance(client)
    for i in range(5):
        client.ok("add", name="s", id=i + 1, prompt=list(range(3 + i)), max_tokens=3)
    outputs = {i + 1: 0 for i in range(5)}
    t = 0.0
    for _ in range(100):
        t += 0.01
        b = client.ok("step", name="s", now=t)["batch"]
        if not b["req_ids"] and not client.ok("stats", name="s")["stats"]["num_unfinished"]:
            break
        outs = {}
        for rid, n, comp in zip(b["req_ids"], b["num_tokens"], b["num_computed"]):
            info = client.ok("info", name="s", id=rid)["info"]
            total = info["num_prompt_tokens"] + info["num_output_tokens"]
            outs[rid] = [9] if comp + n >= total else []
        r = client.ok("update", name="s", now=t + 0.005, outputs=outs)["results"]
        for rid, n in zip(r["req_ids"], r["num_new_tokens"]):
            outputs[rid] += n
    assert outputs == {i + 1: 3 for i in range(5)}
    st = snapshot(client)
    assert st["finished"] == 5 and st["num_unfinished"] == 0


def test_update__array_form(client):
    make_instance(client)
    client.ok("add", name="s", id=7, prompt=[1, 2, 3], max_tokens=2)
    b = client.ok("step", name="s", now=1.0)["batch"]
    assert b["req_ids"] == [7] and b["kinds"] == [0]
    assert len(b["blocks"]) == b["block_offsets"][-1] == 1
    r = client.ok("update", name="s", req_ids=[7], tokens=[[5]])["results"]
    assert r["num_new_tokens"] == [1]
    info = client.ok("info", name="s", id=7, tokens=True, blocks=True)
    assert info["tokens"] == [1, 2, 3, 5] and len(info["blocks"]) == 1


def nest(n):
    v = 1
    for _ in range(n):
        v = [v]
    return v


GARBAGE = [
    b"",
    b"\xc1",                                   # never-used msgpack byte
    b"\x00\x01\x02garbage",
    msgpack.packb({"op": "add"})[:-1],         # truncated
    msgpack.packb({"op": "ping"}) + b"\x00",   # trailing bytes
    msgpack.packb([1, 2, 3]),                  # not a map
    msgpack.packb("add"),
    msgpack.packb({"op": 5}),
    msgpack.packb({"op": "nope"}),
    msgpack.packb({"op": "add", "name": "s"}),                                 # no id
    msgpack.packb({"op": "add", "name": "s", "id": "x", "prompt": [1]}),        # wrong type
    msgpack.packb({"op": "add", "name": "s", "id": -4, "prompt": [1]}),
    msgpack.packb({"op": "add", "name": "s", "id": 50, "prompt": [1, "a"]}),
    msgpack.packb({"op": "add", "name": "s", "id": 50, "prompt": [1, 2**40]}),
    msgpack.packb({"op": "add", "name": "s", "id": 50, "prompt": {"a": 1}}),
    msgpack.packb({"op": "add", "name": "s", "id": 50, "prompt": []}),
    msgpack.packb({"op": "add", "name": "s", "id": 50, "prompt": [1], "max_tokens": 2**33}),
    msgpack.packb({"op": "add", "name": "s", "id": 50, "prompt": [1], "arrival_time": "x"}),
    msgpack.packb({"op": "add", "name": "s" * 300, "id": 50, "prompt": [1]}),
    msgpack.packb({"op": "add", "name": "nosuch", "id": 50, "prompt": [1]}),
    msgpack.packb({"op": "update", "name": "s", "outputs": {1: [1, "x"]}}),
    msgpack.packb({"op": "update", "name": "s", "outputs": [1, 2]}),
    msgpack.packb({"op": "update", "name": "s", "req_ids": [1], "tokens": []}),
    msgpack.packb({"op": "update", "name": "s", "outputs": {"1": [3]}}),
    msgpack.packb({"op": "step", "name": "s", "now": "later"}),
    msgpack.packb({"op": "configure", "name": "s", "config": 17}),
    msgpack.packb({"op": "configure", "name": "s", "config": "{not json"}),
    msgpack.packb({"op": "configure", "name": "s", "config": {"a": nest(20)}}),
    msgpack.packb({"op": "set_param", "name": "s", "key": "nope", "value": 1}),
    msgpack.packb({"op": "finish", "name": "s", "id": 1, "reason": 99}),
    msgpack.packb({"op": "abort", "name": "s", "id": 12345}),
    msgpack.packb({"op": "create", "name": "bad name"}),
    b"\xdd\xff\xff\xff\xff",                   # array32 claiming 4G elements
    b"\xdf\xff\xff\xff\xff",                   # map32 claiming 4G pairs
    b"\x91" * 100000 + b"\x01",                # deeply nested arrays (over the size limit)
    b"\x91" * 1000 + b"\x01",                  # deeply nested arrays
    b"\xdb\xff\xff\xff\xff" + b"a" * 10,       # str32 longer than the message
]


def test_garbage__every_message_gets_an_error_and_state_is_unchanged(client):
    make_instance(client)
    client.ok("add", name="s", id=1, prompt=[1, 2, 3, 4, 5], max_tokens=4)
    client.ok("step", name="s", now=1.0)
    before = snapshot(client)
    info_before = client.ok("info", name="s", id=1, tokens=True, blocks=True)
    for i, g in enumerate(GARBAGE):
        r = client.raw(g)
        assert r["ok"] is False, (i, g[:40], r)
        assert r["status"] < 0 and isinstance(r["message"], str) and r["message"], (i, r)
    assert snapshot(client) == before
    assert client.ok("info", name="s", id=1, tokens=True, blocks=True) == info_before
    assert client.ok("ping")["ok"]


def test_oversized__error_reply_and_service_survives(client):
    make_instance(client)
    before = snapshot(client)
    big = msgpack.packb({"op": "add", "name": "s", "id": 2, "prompt": list(range(MAX_MSG))})
    assert len(big) > MAX_MSG
    r = client.raw(big)
    assert not r["ok"] and r["status"] == -6 and "exceeds" in r["message"]
    assert snapshot(client) == before
    client.ok("ping")


def test_envelopes__req_socket_and_multiframe(server):
    req = Client(server[1], zmq.REQ)
    try:
        assert req.raw(msgpack.packb({"op": "ping"}))["ok"]
    finally:
        req.close()
    d = Client(server[1])
    try:
        r = d.raw([msgpack.packb({"op": "ping"}), msgpack.packb({"op": "ping"})])
        assert not r["ok"] and r["status"] == -11
        assert d.ok("ping")
    finally:
        d.close()


def test_fuzz__mutated_messages_never_crash(client, server):
    make_instance(client)
    client.ok("add", name="s", id=1, prompt=[1, 2, 3], max_tokens=4)
    rng = random.Random(1234)
    seeds = [msgpack.packb(m) for m in (
        {"op": "add", "name": "s", "id": 77, "prompt": [1, 2, 3], "max_tokens": 2},
        {"op": "update", "name": "s", "outputs": {1: [4]}},
        {"op": "info", "name": "s", "id": 1, "tokens": True},
        {"op": "configure", "name": "s", "config": {"max_num_seqs": 4}},
    )]
    for _ in range(300):
        m = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            k = rng.randrange(3)
            pos = rng.randrange(len(m))
            if k == 0:
                m[pos] = rng.randrange(256)
            elif k == 1:
                del m[pos:pos + rng.randint(1, 4)]
            else:
                m[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        r = client.raw(bytes(m))
        assert isinstance(r, dict) and isinstance(r["ok"], bool)
    assert server[0].poll() is None
    assert client.ok("ping")


def test_shutdown__ends_the_process(server, client):
    client.ok("shutdown")
    assert server[0].wait(timeout=10) == 0


# ---- the KV transfer engine through the service -------------------------------------------------

LAYOUT = {"num_layers": 2, "num_blocks": 16, "block_size": 4, "num_kv_heads": 2, "head_dim": 8,
          "dtype": 1, "kind": 1}
BLOCK_HALF = 4 * 2 * 8 * 2      # bytes of K (or V) of one block in the vLLM NHD layout
LAYER_BYTES = 2 * 16 * BLOCK_HALF


def block_bytes(c, name, layer, block):
    k = c.ok("kvx_read", name=name, layer=layer, offset=block * BLOCK_HALF, length=BLOCK_HALF)
    v = c.ok("kvx_read", name=name, layer=layer, offset=LAYER_BYTES // 2 + block * BLOCK_HALF,
             length=BLOCK_HALF)
    return k["data"] + v["data"]


def test_kvx__two_engines_move_blocks_through_the_service(client, tmp_path):
    if not __import__("tandem").has_kvx():
        pytest.skip("the library lacks the KV transfer engine")
    r = client.ok("kvx_create", name="p", layout=LAYOUT,
                  config={"engine_id": "svc-p", "role": "prefill",
                          "listen": f"ipc://{tmp_path}/svc-p.sock", "heartbeat_ms": 50})
    assert r["layer_bytes"] == LAYER_BYTES and r["endpoint"].startswith("ipc://")
    client.ok("kvx_create", name="d", layout=LAYOUT, config={"engine_id": "svc-d", "role": "decode"})
    rng = random.Random(5)
    for layer in range(2):
        client.ok("kvx_write", name="p", layer=layer, offset=0,
                  data=bytes(rng.randrange(256) for _ in range(LAYER_BYTES)))
    peer = client.ok("kvx_connect", name="d", endpoint=r["endpoint"])["peer"]
    hs = client.ok("kvx_send", name="p", request_id=9, block_ids=[2, 3, 7],
                   num_blocks_ready=1)["handle"]
    client.ok("kvx_send_ready", name="p", handle=hs, num_blocks_ready=3)  # streaming: the rest
    r = client("kvx_send_ready", name="p", handle=hs + 100, num_blocks_ready=3)
    assert not r["ok"] and r["status"] == -3, r
    hr = client.ok("kvx_recv", name="d", peer=peer, request_id=9, transfer_id=1,
                   block_ids=[10, 11, 12])["handle"]
    got = {}
    for _ in range(100):
        for n in ("p", "d"):
            for ev in client.ok("kvx_poll", name=n, timeout_ms=50)["events"]:
                got[ev["handle"], n] = ev
        if (hs, "p") in got and (hr, "d") in got:
            break
    assert got[hr, "d"]["type"] == 1 and got[hr, "d"]["num_blocks_done"] == 3, got
    for layer in range(2):
        for s, t in zip([2, 3, 7], [10, 11, 12]):
            assert block_bytes(client, "d", layer, t) == block_bytes(client, "p", layer, s)
    st = client.ok("kvx_stats", name="d")["stats"]
    assert st["transfers_done"] == 1 and st["num_reserved_blocks"] == 0
    assert st["chunks_sent"] == 0  # d only received; p sent the chunks
    assert client.ok("kvx_stats", name="p")["stats"]["chunks_sent"] >= 1
    # Errors change nothing and name the problem.
    for bad in ({"name": "d", "layer": 2, "offset": 0, "length": 1},
                {"name": "d", "layer": 0, "offset": LAYER_BYTES - 1, "length": 2},
                {"name": "zz", "layer": 0, "offset": 0, "length": 1}):
        r = client("kvx_read", **bad)
        assert not r["ok"] and r["message"], r
    r = client("kvx_recv", name="d", peer=peer + 5, request_id=1, block_ids=[1])
    assert not r["ok"] and r["status"] == -19
    r = client("kvx_create", name="big", layout=dict(LAYOUT, num_blocks=1 << 24),
               config={"engine_id": "big"})
    assert not r["ok"] and r["status"] == -6
    r = client("kvx_create", name="p", layout=LAYOUT, config={"engine_id": "again"})
    assert not r["ok"] and r["status"] == -4
    assert client.ok("kvx_stats", name="d")["stats"] == st
    client.ok("kvx_destroy", name="d")
    client.ok("kvx_destroy", name="p")
