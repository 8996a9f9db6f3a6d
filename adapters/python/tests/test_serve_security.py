"""`tandem serve` as an attacker would probe it (issue 11): a client holding a black-holed
kvx_connect or a waiting kvx_poll does not stall the others; client-chosen timeouts and sizes
are capped; global limits refuse with a clear error; a malformed "seq" runs nothing; with
CURVE, instances belong to the client that created them, shutdown and listening beyond
loopback need an admin key, and unknown keys get no answer; non-loopback binds need CURVE."""
import socket
import subprocess
import threading
import time

import pytest

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (pip install pyzmq)")
msgpack = pytest.importorskip("msgpack", reason="msgpack is not installed (pip install msgpack)")

from test_serve import LAYOUT, Client, tool_path  # noqa: E402

AUTH, RANGE, STATE, TIMEOUT, INVAL = -17, -6, -5, -10, -1


def start(*args):
    tool = tool_path()
    if not tool.exists():
        pytest.skip(f"{tool} is not built")
    p = subprocess.Popen([str(tool), "serve", "--bind", "tcp://127.0.0.1:*", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if "listening on" not in line:
        p.kill()
        pytest.fail(f"serve did not start: {line!r} {p.communicate()[1]!r}")
    return p, line.rsplit(" ", 1)[1].strip()


def stop(p):
    if p.poll() is None:
        p.terminate()
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    err = p.stderr.read()
    p.stdout.close()
    p.stderr.close()
    assert p.returncode == 0, f"tandem serve exited with {p.returncode}: {err[-2000:]}"


@pytest.fixture
def serve(needs_scheduler):
    procs = []

    def run(*args):
        p, ep = start(*args)
        procs.append(p)
        return ep
    yield run
    for p in procs:
        stop(p)


class BlackHole:
    """A TCP listener that accepts connections and never sends a byte."""

    def __init__(self):
        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        self.s.listen(8)
        self.port = self.s.getsockname()[1]
        self.conns = []
        self.t = threading.Thread(target=self._accept, daemon=True)
        self.t.start()

    def _accept(self):
        while True:
            try:
                c, _ = self.s.accept()
            except OSError:
                return
            self.conns.append(c)

    def close(self):
        self.s.close()
        for c in self.conns:
            c.close()


def test_black_holed_kvx_connect_does_not_stall_another_client(serve):
    if not __import__("tandem").has_kvx():
        pytest.skip("the library lacks the KV transfer engine")
    ep = serve()
    a, b = Client(ep), Client(ep)
    hole = BlackHole()
    try:
        hs = 3000
        a.ok("kvx_create", name="d", layout=LAYOUT,
             config={"engine_id": "d", "role": "decode", "handshake_timeout_ms": hs})
        a.sock.send(msgpack.packb({"op": "kvx_connect", "name": "d", "seq": 1,
                                   "endpoint": f"tcp://127.0.0.1:{hole.port}"}))
        time.sleep(0.05)  # the connect is running (the service took it first)
        t0 = time.monotonic()
        r = b("ping", seq=2)
        dt = time.monotonic() - t0
        print(f"\nping answered in {dt * 1000:.1f} ms while another client's connect is "
              f"black-holed (target: 100 ms)")
        assert r["ok"] and r["seq"] == 2
        assert not a.sock.poll(0), "the black-holed connect replied before the other client"
        assert dt < hs / 1000.0, "the ping waited for the connect"
        # the engine cannot be destroyed under its running connect
        r = b("kvx_destroy", name="d")
        assert not r["ok"] and r["status"] == STATE, r
        assert a.sock.poll(int(hs * 3)), "no reply to the connect"
        r = msgpack.unpackb(a.sock.recv(), raw=False)
        assert not r["ok"] and r["seq"] == 1 and r["status"] in (TIMEOUT, AUTH, -12), r
        b.ok("kvx_destroy", name="d")
    finally:
        hole.close()
        a.close()
        b.close()


def test_waiting_kvx_poll_does_not_stall_another_client_and_timeouts_are_capped(serve):
    if not __import__("tandem").has_kvx():
        pytest.skip("the library lacks the KV transfer engine")
    ep = serve()
    a, b = Client(ep), Client(ep)
    a.ok("kvx_create", name="d", layout=LAYOUT, config={"engine_id": "d"})
    a.sock.send(msgpack.packb({"op": "kvx_poll", "name": "d", "timeout_ms": 1500, "seq": "p"}))
    time.sleep(0.05)
    t0 = time.monotonic()
    assert b.ok("ping")
    dt = time.monotonic() - t0
    print(f"\nping answered in {dt * 1000:.1f} ms during another client's 1500 ms kvx_poll")
    assert not a.sock.poll(0), "the waiting poll replied before the other client"
    assert a.sock.poll(10000)
    r = msgpack.unpackb(a.sock.recv(), raw=False)
    assert r["ok"] and r["seq"] == "p" and r["events"] == []
    for key in ("handshake_timeout_ms", "transfer_timeout_ms", "peer_timeout_ms",
                "max_chunk_bytes", "shm_slots"):
        r = b("kvx_create", name="x", layout=LAYOUT, config={"engine_id": "x", key: 2 ** 32 - 1})
        assert not r["ok"] and r["status"] == RANGE and key in r["message"], r
    r = b("kvx_create", name="x", layout=LAYOUT,
          config={"engine_id": "x", "max_chunk_bytes": 64 << 20, "shm_slots": 8})
    assert not r["ok"] and r["status"] == RANGE and "shm_slots x max_chunk_bytes" in r["message"]
    r = b("kvx_poll", name="d", timeout_ms=10001)
    assert not r["ok"] and r["status"] == INVAL
    r = b("kvx_recv", name="d", peer=0, request_id=1, block_ids=[1], timeout_ms=2 ** 32 - 1)
    assert not r["ok"] and r["status"] == INVAL
    a.close()
    b.close()


def test_engine_listening_beyond_loopback_needs_an_admin_key(serve):
    if not __import__("tandem").has_kvx():
        pytest.skip("the library lacks the KV transfer engine")
    c = Client(serve())
    for ep in ("tcp://0.0.0.0:*", "tcp://*:*", "tcp://10.1.2.3:5"):
        r = c("kvx_create", name="k", layout=LAYOUT, config={"engine_id": "k", "listen": ep})
        assert not r["ok"] and r["status"] == AUTH and "admin key" in r["message"], r
    assert c.ok("kvx_create", name="k", layout=LAYOUT,
                config={"engine_id": "k", "listen": "tcp://127.0.0.1:*"})["endpoint"]
    c.close()


def test_malformed_seq_is_an_error_and_the_op_does_not_run(serve):
    c = Client(serve())
    for seq in ([1], {"a": 1}, "x" * 300, 1.5, None):
        r = c("create", name="s", seq=seq)
        assert not r["ok"] and r["status"] == INVAL and "seq" in r["message"], r
    assert c.ok("list")["names"] == []
    r = c.ok("create", name="s", config={"num_blocks": 64, "block_size": 4})
    r = c("add", name="s", id=1, prompt=[1, 2], max_tokens=2, min_tokens=3)
    assert not r["ok"] and "min_tokens" in r["message"]
    r = c("step", name="s", now=-1e308)
    assert not r["ok"] and r["status"] == INVAL
    r = c("add", name="s", id=1, prompt=[1, 2], arrival_time=-5.0)
    assert not r["ok"] and r["status"] == INVAL
    c.close()


def test_update_replay_is_refused_through_the_service(serve):
    c = Client(serve())
    c.ok("create", name="s", config={"num_blocks": 64, "block_size": 4})
    c.ok("add", name="s", id=1, prompt=[1, 2, 3], max_tokens=8)
    c.ok("step", name="s", now=1.0)
    c.ok("update", name="s", outputs={1: [5]}, now=1.1)
    for _ in range(2):
        r = c("update", name="s", outputs={1: [5]}, now=1.1)
        assert not r["ok"] and r["status"] == STATE and "request 1" in r["message"], r
    assert c.ok("info", name="s", id=1)["info"]["num_output_tokens"] == 1
    c.close()


def test_global_limits_refuse_with_a_clear_error(serve):
    c = Client(serve("--max-blocks-per-instance", "1000", "--max-total-blocks", "1500",
                     "--max-queued-requests", "3", "--max-queued-tokens", "40",
                     "--max-prompt-tokens", "30"))
    r = c("create", name="big", config={"num_blocks": 1001})
    assert not r["ok"] and r["status"] == RANGE and "per instance" in r["message"], r
    c.ok("create", name="a", config={"num_blocks": 1000, "block_size": 4})
    r = c("create", name="b", config={"num_blocks": 600})
    assert not r["ok"] and r["status"] == RANGE and "--max-total-blocks" in r["message"], r
    c.ok("create", name="b", config={"num_blocks": 400, "block_size": 4})
    r = c("set_param", name="b", key="num_blocks", value=600)
    assert not r["ok"] and r["status"] == RANGE
    r = c("add", name="a", id=1, prompt=list(range(31)))
    assert not r["ok"] and "--max-prompt-tokens" in r["message"], r
    c.ok("add", name="a", id=1, prompt=list(range(20)))
    c.ok("add", name="b", id=1, prompt=list(range(20)))
    r = c("add", name="b", id=2, prompt=[1])
    assert not r["ok"] and "--max-queued-tokens" in r["message"], r
    c.ok("abort", name="b", id=1)  # finished: its tokens are no longer counted
    c.ok("add", name="b", id=2, prompt=[1])
    c.ok("add", name="b", id=3, prompt=[1])
    r = c("add", name="b", id=4, prompt=[1])
    assert not r["ok"] and "--max-queued-requests" in r["message"], r
    c.close()


def test_non_loopback_bind_needs_curve_or_insecure(needs_scheduler):
    tool = tool_path()
    if not tool.exists():
        pytest.skip(f"{tool} is not built")
    for ep in ("tcp://*:0", "tcp://0.0.0.0:0"):
        p = subprocess.run([str(tool), "serve", "--bind", ep], capture_output=True, text=True,
                           timeout=10)
        assert p.returncode == 2 and "--curve-secret" in p.stderr, (p.returncode, p.stderr)
    p = subprocess.Popen([str(tool), "serve", "--bind", "tcp://0.0.0.0:*", "--insecure"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert "listening on" in line
        # no admin without CURVE on a non-loopback socket: shutdown is refused
        c = Client("tcp://127.0.0.1:" + line.rsplit(":", 1)[1].strip())
        r = c("shutdown")
        assert not r["ok"] and r["status"] == AUTH, r
        c.close()
    finally:
        stop(p)


def curve_client(ep, server_pub, keypair):
    c = Client.__new__(Client)
    c.ctx = zmq.Context.instance()
    c.kind = zmq.DEALER
    c.sock = c.ctx.socket(zmq.DEALER)
    c.sock.setsockopt(zmq.LINGER, 0)
    c.sock.curve_serverkey = server_pub
    c.sock.curve_publickey, c.sock.curve_secretkey = keypair
    c.sock.connect(ep)
    return c


def test_curve_keys_starting_with_at_are_keys_not_files(serve):
    """'@' is a Z85 character: a key that starts with it is a key (not '@FILE')."""
    if not zmq.has("curve"):
        pytest.skip("libzmq without CURVE")

    def keypair(want):  # public key (want 0) or secret key (want 1) starting with '@'
        for _ in range(20000):
            k = zmq.curve_keypair()
            if k[want].startswith(b"@"):
                return k
        pytest.fail("no Z85 key starting with '@' in 20000 tries")

    spub, ssec = keypair(1)
    ka = keypair(0)
    ep = serve("--curve-secret", ssec.decode(), "--curve-allow", ka[0].decode())
    a = curve_client(ep, spub, ka)
    a.ok("create", name="mine", config={"num_blocks": 64, "block_size": 4})
    assert a.ok("list")["names"] == ["mine"]


def test_curve_owners_admin_and_unknown_keys(serve):
    if not zmq.has("curve"):
        pytest.skip("libzmq without CURVE")
    spub, ssec = zmq.curve_keypair()
    ka, kb, kadm, kx = (zmq.curve_keypair() for _ in range(4))
    ep = serve("--curve-secret", ssec.decode(), "--curve-allow", ka[0].decode(),
               "--curve-allow", kb[0].decode(), "--admin-key", kadm[0].decode())
    a, b, adm = (curve_client(ep, spub, k) for k in (ka, kb, kadm))
    x = curve_client(ep, spub, kx)
    x.sock.send(msgpack.packb({"op": "ping"}))
    assert not x.sock.poll(1000), "a key that is not allowed got an answer"
    a.ok("create", name="mine", config={"num_blocks": 64, "block_size": 4})
    a.ok("create", name="ours", shared=True, config={"num_blocks": 64, "block_size": 4})
    a.ok("add", name="mine", id=1, prompt=[1, 2, 3])
    assert sorted(a.ok("list")["names"]) == ["mine", "ours"]
    assert b.ok("list")["names"] == ["ours"]
    for op, kw in (("step", {}), ("info", {"id": 1}), ("destroy", {}), ("abort", {"id": 1})):
        r = b(op, name="mine", **kw)
        assert not r["ok"] and r["status"] == AUTH, (op, r)
    b.ok("add", name="ours", id=1, prompt=[1, 2, 3])
    assert a.ok("info", name="mine", id=1)["info"]["state"] == 0
    r = a("shutdown")
    assert not r["ok"] and r["status"] == AUTH
    if __import__("tandem").has_kvx():
        r = a("kvx_create", name="k", layout=LAYOUT,
              config={"engine_id": "k", "listen": "tcp://0.0.0.0:*"})
        assert not r["ok"] and r["status"] == AUTH, r
        a.ok("kvx_create", name="k", layout=LAYOUT, config={"engine_id": "k"})
        r = b("kvx_stats", name="k")
        assert not r["ok"] and r["status"] == AUTH, r
        assert a.ok("kvx_stats", name="k") and adm.ok("kvx_stats", name="k")
        b.ok("kvx_create", name="ks", shared=True, layout=LAYOUT, config={"engine_id": "ks"})
        assert a.ok("kvx_stats", name="ks")
    assert sorted(adm.ok("list")["names"]) == ["mine", "ours"]
    adm.ok("shutdown")
    for c in (a, b, adm, x):
        c.close()


def test_connections_beyond_the_cap_are_dropped_until_one_closes(serve):
    ep = serve("--max-connections", "2")
    a, b, c = Client(ep), Client(ep), Client(ep)
    assert a.ok("ping") and b.ok("ping")
    c.sock.send(msgpack.packb({"op": "ping"}))
    assert not c.sock.poll(1000), "a third connection was served with --max-connections 2"
    a.close()
    for _ in range(50):  # c reconnects (ZeroMQ retries) and is accepted once a has gone
        c.sock.send(msgpack.packb({"op": "ping", "seq": 9}))
        if c.sock.poll(200):
            break
    r = msgpack.unpackb(c.sock.recv(), raw=False)
    while r.get("seq") != 9 and c.sock.poll(200):
        r = msgpack.unpackb(c.sock.recv(), raw=False)
    assert r["ok"]
    assert b.ok("ping")
    b.close()
    c.close()


def test_ipc_bind_never_replaces_an_existing_file(needs_scheduler, tmp_path):
    tool = tool_path()
    if not tool.exists():
        pytest.skip(f"{tool} is not built")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    p = subprocess.run([str(tool), "serve", "--bind", f"ipc://{victim}"], capture_output=True,
                       text=True, timeout=10)
    assert p.returncode == 2 and "already exists (a regular file)" in p.stderr, (p.returncode, p.stderr)
    assert victim.is_file() and victim.read_text() == "precious"
