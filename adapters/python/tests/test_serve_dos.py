"""`tandem serve` under denial-of-service attempts (issue 26), loopback only: idle raw TCP
sockets, idle NULL-mechanism ZMTP connections and unauthenticated sockets against CURVE never
take the connection slots of clients that speak; one CURVE key cannot take every slot; a
connection that never sends a request is ended; oversized and over-limit messages are
refused before they are decoded and large ones never hold the other clients."""
import socket
import struct
import time

import pytest

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (pip install pyzmq)")
msgpack = pytest.importorskip("msgpack", reason="msgpack is not installed (pip install msgpack)")

from test_serve import Client  # noqa: E402
from test_serve_security import curve_client, serve  # noqa: E402,F401  (fixture)

RANGE = -6


def port_of(ep):
    return int(ep.rsplit(":", 1)[1])


def raw_sockets(ep, n):
    """n TCP connections that never send a byte."""
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port_of(ep)), timeout=5)
        out.append(s)
    return out


def null_greeting():
    """A ZMTP 3.0 greeting with the NULL mechanism and a READY command (a DEALER): the
    handshake a real client completes, after which these sockets stay silent."""
    greet = b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00") + b"\x00" * 32
    props = bytes([11]) + b"Socket-Type" + struct.pack(">I", 6) + b"DEALER"
    body = bytes([5]) + b"READY" + props
    return greet, bytes([0x04, len(body)]) + body


def zmtp_null_sockets(ep, n):
    greet, ready = null_greeting()
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port_of(ep)), timeout=5)
        s.sendall(greet + ready)
        out.append(s)
    return out


def close_all(socks):
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def ping_within(ep, seconds, client=None):
    """A fresh (or the given) client's ping answered within `seconds`: True/False."""
    c = client or Client(ep)
    try:
        c.sock.send(msgpack.packb({"op": "ping", "seq": 7}))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if c.sock.poll(50):
                r = msgpack.unpackb(c.sock.recv(), raw=False)
                if r.get("seq") == 7:
                    return r["ok"]
        return False
    finally:
        if client is None:
            c.close()


def test_idle_raw_tcp_sockets_do_not_take_the_slots(serve):
    ep = serve("--max-connections", "4")
    socks = raw_sockets(ep, 48)
    try:
        time.sleep(0.3)  # accepted by ZeroMQ, all of them idle in the handshake
        for _ in range(3):
            assert ping_within(ep, 3.0), "a client was locked out by idle TCP sockets"
    finally:
        close_all(socks)


def test_idle_null_zmtp_connections_do_not_take_the_slots(serve):
    ep = serve("--max-connections", "4")
    socks = zmtp_null_sockets(ep, 48)
    try:
        time.sleep(0.3)  # handshakes complete, then silence
        for _ in range(3):
            assert ping_within(ep, 3.0), "a client was locked out by idle ZMTP connections"
    finally:
        close_all(socks)


def test_silent_connection_is_ended_after_idle_ms(serve):
    ep = serve("--idle-ms", "400", "--handshake-ms", "5000")
    greet, ready = null_greeting()
    s = socket.create_connection(("127.0.0.1", port_of(ep)), timeout=5)
    try:
        s.sendall(greet + ready)
        s.settimeout(4.0)
        t0 = time.monotonic()
        data = b""
        try:
            while True:  # the server's greeting and READY, then the end of the stream
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except (ConnectionResetError, socket.timeout):
            pass
        dt = time.monotonic() - t0
        assert data[:1] == b"\xff", "no ZMTP greeting from the service"
        assert dt < 3.5, f"the silent connection was still open after {dt:.1f} s"
    finally:
        s.close()


def test_unauthenticated_sockets_do_not_lock_out_allowed_keys(serve):
    if not zmq.has("curve"):
        pytest.skip("libzmq without CURVE")
    spub, ssec = zmq.curve_keypair()
    ka = zmq.curve_keypair()
    ep = serve("--curve-secret", ssec.decode(), "--curve-allow", ka[0].decode(),
               "--max-connections", "4")
    socks = raw_sockets(ep, 32) + zmtp_null_sockets(ep, 16)
    strangers = [curve_client(ep, spub, zmq.curve_keypair()) for _ in range(16)]
    try:
        for c in strangers:
            c.sock.send(msgpack.packb({"op": "ping"}))
        time.sleep(0.3)
        for _ in range(3):
            a = curve_client(ep, spub, ka)
            try:
                assert ping_within(ep, 3.0, a), "an allowed key was locked out"
            finally:
                a.close()
        assert not any(c.sock.poll(0) for c in strangers), "a key that is not allowed got an answer"
    finally:
        close_all(socks)
        for c in strangers:
            c.close()


def test_one_key_cannot_take_every_slot(serve):
    if not zmq.has("curve"):
        pytest.skip("libzmq without CURVE")
    spub, ssec = zmq.curve_keypair()
    ka, kb = zmq.curve_keypair(), zmq.curve_keypair()
    ep = serve("--curve-secret", ssec.decode(), "--curve-allow", ka[0].decode(),
               "--curve-allow", kb[0].decode(), "--max-connections", "4",
               "--max-connections-per-key", "2")
    mine = [curve_client(ep, spub, ka) for _ in range(3)]
    try:
        assert mine[0].ok("ping") and mine[1].ok("ping")
        mine[2].sock.send(msgpack.packb({"op": "ping"}))
        assert not mine[2].sock.poll(800), "a third connection of one key was served (cap 2)"
        b = curve_client(ep, spub, kb)
        try:
            assert b.ok("ping")
        finally:
            b.close()
    finally:
        for c in mine:
            c.close()


def vm_hwm_mib(pid):
    """The process's peak resident memory (VmHWM), MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    pytest.skip("no VmHWM in /proc")


def padded_request(op, n, extra=b""):
    """{"op": op, <extra pairs>, "pad"/"prompt": [n one-byte elements]} built directly (a
    Python list of 10^7 ints would cost the test more than the service)."""
    key = b"prompt" if op == "add" else b"pad"
    pairs = 2 + extra.count(b"\xa4name")  # extra holds name + id for add
    head = bytes([0x80 | (pairs + (2 if op == "add" else 0))])
    body = msgpack.packb("op") + msgpack.packb(op) + extra
    return head + body + msgpack.packb(key.decode()) + b"\xdd" + struct.pack(">I", n) + b"\x01" * n


def test_oversized_requests_are_refused_before_decoding(needs_scheduler):
    from test_serve_security import start, stop
    p, ep = start()
    try:
        c = Client(ep)
        c.ok("create", name="s", config={"num_blocks": 64, "block_size": 4})
        base = vm_hwm_mib(p.pid)
        # a 16 MiB "ping" (one-byte elements: 24 bytes each once decoded)
        r = c.raw(padded_request("ping", (16 << 20) - 64), timeout=30)
        assert not r["ok"] and r["status"] == RANGE and '"ping" request' in r["message"], r
        # a 10^7-token add (over --max-prompt-tokens, 2^20)
        extra = msgpack.packb("name") + msgpack.packb("s") + msgpack.packb("id") + msgpack.packb(1)
        r = c.raw(padded_request("add", 10 ** 7, extra), timeout=30)
        assert not r["ok"] and r["status"] == RANGE and "--max-prompt-tokens" in r["message"], r
        assert c.ok("stats", name="s")["stats"]["num_waiting"] == 0
        grew = vm_hwm_mib(p.pid) - base
        print(f"\npeak memory grew by {grew:.0f} MiB for a 16 MiB ping and a 10^7-token add")
        # the frames themselves (ZeroMQ's buffer and the message: 2 x 16 MiB), not 24 bytes
        # per element decoded (400 MiB)
        assert grew < 120, f"the service's peak memory grew by {grew:.0f} MiB"
        c.close()
    finally:
        stop(p)


def test_a_clients_large_and_small_requests_are_answered_in_order(serve):
    c = Client(serve())
    c.ok("create", name="s", config={"num_blocks": 8192, "block_size": 16, "max_model_len": 65536})
    prompt = list(range(1000, 41000))  # 40,000 three-byte ids: over the 64 KiB inline size
    c.sock.send(msgpack.packb({"op": "add", "name": "s", "id": 1, "prompt": prompt, "seq": 1}))
    c.sock.send(msgpack.packb({"op": "info", "name": "s", "id": 1, "seq": 2}))
    replies = []
    for _ in range(2):
        assert c.sock.poll(10000), "no reply"
        replies.append(msgpack.unpackb(c.sock.recv(), raw=False))
    assert [r["seq"] for r in replies] == [1, 2], replies
    assert replies[0]["ok"], replies[0]
    assert replies[1]["ok"] and replies[1]["info"]["num_prompt_tokens"] == 40000, replies[1]
    c.close()


# How long a ping may wait before the client counts the service as stalled: 5 s (a lockout by
# idle connections lasted 28 s to forever; a ping waited 1.8 s once on a 2-core machine at load
# average 20), or 10 s against a sanitizer build (make check-serve / check-serve-tsan set
# TANDEM_SLOW_TOOL), which runs everything several times slower. Latency is printed, not
# asserted.
LIVENESS_S = 10.0 if __import__("os").environ.get("TANDEM_SLOW_TOOL") else 5.0


def _percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _load(ep, kinds, seconds, client, spub="-", keypair=None):
    """Runs the hostile clients (another process) for `seconds` while `client` pings every
    20 ms; returns the latencies (seconds) of the pings, None for one never answered, and the
    hostile process's counts line."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    # the client has spoken before the attack starts, so its connection holds a slot (a
    # pending one from the flood's own address is fair game for eviction: docs/service.md)
    assert ping_within(ep, LIVENESS_S, client), "the service did not answer before the attack"
    args = [sys.executable, os.path.join(here, "serve_hostile.py"), ep, str(seconds),
            ",".join(kinds), spub]
    if keypair:
        args += [keypair[0].decode(), keypair[1].decode()]
    h = subprocess.Popen(args, cwd=here, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lat = []
    try:
        time.sleep(0.5)  # the hostile clients are connected and sending
        end = time.monotonic() + seconds - 1.0
        seq = 0
        while time.monotonic() < end:
            seq += 1
            t0 = time.monotonic()
            client.sock.send(msgpack.packb({"op": "ping", "seq": seq}))
            got = None
            while client.sock.poll(int(LIVENESS_S * 1000) + 500):
                r = msgpack.unpackb(client.sock.recv(), raw=False)
                if r.get("seq") == seq:
                    got = time.monotonic() - t0
                    break
            lat.append(got)
            time.sleep(0.02)
    finally:
        out = h.communicate(timeout=120)[0]
    return lat, out.strip().splitlines()[-1] if out.strip() else ""


def _report(name, lat, hostile):
    ok = [x for x in lat if x is not None]
    assert ok, f"{name}: no ping answered"
    print(f"\n{name}: {len(lat)} pings, {len(lat) - len(ok)} unanswered; p50 "
          f"{_percentile(ok, 0.5) * 1e3:.1f} ms, p99 {_percentile(ok, 0.99) * 1e3:.1f} ms, max "
          f"{max(ok) * 1e3:.1f} ms (target p99 < 50 ms)\n  {hostile}")
    # Liveness, not speed (speeds are reported, never asserted): every ping is answered, none
    # waits for a hostile client's seconds-long handshake, decode or slot.
    assert len(ok) == len(lat), f"{name}: {len(lat) - len(ok)} pings were never answered"
    assert max(ok) < LIVENESS_S, f"{name}: a ping waited {max(ok):.2f} s"


def test_load_legitimate_client_keeps_being_served_under_attack(serve):
    """Bounded (three 5 s phases, loopback only): idle raw TCP sockets, idle NULL-mechanism
    ZMTP connections, 16 MiB requests and 10^7-token adds against a plain service; 256 peers
    flooding one of its transfer engines with in-limit 2^20-token adds (arrays and packed
    bins); then idle sockets and CURVE clients with keys not allowed against a CURVE service.
    A legitimate client's pings are all answered (p50/p99/max printed, bench/
    serve_dos_phases.py measures each kind alone), and after the flood a peer from another
    source still connects to the engine."""
    ep = serve()
    c = Client(ep)
    try:
        lat, hostile = _load(ep, ["raw", "null", "big", "add7"], 5.0, c)
        _report("plain service", lat, hostile)
        # a transfer engine of the service flooded by 256 peers from one source (its per-source
        # cap, 64, holds) while in-limit 2^20-token adds are hashed on the decoding thread
        from serve_hostile import FLOOD_LAYOUT
        victim = c.ok("kvx_create", name="victim", layout=FLOOD_LAYOUT,
                      config={"engine_id": "victim", "role": "both",
                              "listen": "tcp://127.0.0.1:*"})["endpoint"]
        lat, hostile = _load(ep, ["flood256@" + victim, "add1m", "add1m_bin"], 5.0, c)
        _report("KV engine flood + 2^20-token adds", lat, hostile)
        assert "flood_ok=64" in hostile and "flood_-8=192" in hostile, hostile
        assert "add1m_ok=" in hostile and "add1m_bin_ok=" in hostile, hostile
        c.ok("kvx_create", name="d", layout=FLOOD_LAYOUT, config={"engine_id": "d"})
        assert c.ok("kvx_connect", name="d", endpoint=victim)["peer"] >= 0  # another source
    finally:
        c.close()
    if not zmq.has("curve"):
        return
    spub, ssec = zmq.curve_keypair()
    ka, kb = zmq.curve_keypair(), zmq.curve_keypair()
    ep = serve("--curve-secret", ssec.decode(), "--curve-allow", ka[0].decode(),
               "--curve-allow", kb[0].decode())
    a = curve_client(ep, spub, ka)
    try:
        lat, hostile = _load(ep, ["raw", "null", "curve", "big"], 5.0, a, spub.decode(), kb)
        _report("CURVE service", lat, hostile)
        assert "curve_answered" not in hostile, hostile
    finally:
        a.close()


def _packed(tokens):
    """The compact token encoding: a bin of packed little-endian int32."""
    return struct.pack(f"<{len(tokens)}i", *tokens)


def _first_computed(c, rid):
    """Runs one step; the prefix-cache hit (num_computed) of request rid in it."""
    b = c.ok("step", name="s", now=1.0)["batch"]
    k = b["req_ids"].index(rid)
    hit = b["num_computed"][k]
    done = b["num_computed"][k] + b["num_tokens"][k]
    c.ok("update", name="s", now=1.1, outputs={r: ([5] if r == rid and done else [])
                                                 for r in b["req_ids"]})
    c.ok("finish", name="s", id=rid)
    c.ok("step", name="s", now=1.2)
    return hit


@pytest.mark.parametrize("algo", ["sha256", "xxh3_128"])
def test_large_adds_prompt_work_off_the_loop_shares_the_prefix_cache(needs_scheduler, algo):
    """A large add's prompt is converted and its block digests computed on the decoding thread
    (TDM_REQ_PRECOMPUTED_DIGESTS): those digests are the scheduler's own, so a small add
    (hashed by the library on the loop) hits the blocks of a large one and the other way
    round, with arrays, the compact bin encoding and a cache salt. Fails if the worker's
    digests differed in any byte (no hit), were not the library's format, or were not used
    (the service counts the adds whose digests came from the worker)."""
    from test_serve_security import start
    p, ep = start()
    c = Client(ep)
    c.ok("create", name="s", config={"num_blocks": 8192, "block_size": 16, "max_model_len": 65536,
                                     "max_num_batched_tokens": 65536, "prefix_hash": algo})
    big = list(range(1000, 41000))   # 40,000 three-byte ids: ~120 KiB, queued for the worker
    small = big[:16000]              # ~48 KiB: decoded and hashed on the loop
    c.ok("add", name="s", id=1, prompt=big)
    assert _first_computed(c, 1) == 0
    c.ok("add", name="s", id=2, prompt=small + [7])
    assert _first_computed(c, 2) == 16000          # every block of the large one's prefix
    c.ok("add", name="s", id=3, prompt=_packed(big[:30000] + [3, 4]))  # bin: 120 KiB
    assert _first_computed(c, 3) == 30000
    # salted: the worker hashes the salt as the library does
    c.ok("add", name="s", id=4, prompt=small[:15000], cache_salt="tenant-a")
    assert _first_computed(c, 4) == 0
    c.ok("add", name="s", id=5, prompt=_packed(small[:15000] + list(range(20000))),
         cache_salt="tenant-a")
    assert _first_computed(c, 5) == 14992          # 937 whole blocks of the salted prefix
    c.ok("add", name="s", id=6, prompt=_packed(small[:15000] + list(range(20000))),
         cache_salt="tenant-b")
    assert _first_computed(c, 6) == 0              # another salt: nothing shared
    c.close()
    p.terminate()
    err = p.communicate(timeout=20)[1]
    assert p.returncode == 0, err
    assert "; 4 adds hashed off the loop" in err, err  # ids 1, 3, 5 and 6


def test_compact_tokens_are_refused_when_malformed(serve):
    c = Client(serve())
    c.ok("create", name="s", config={"num_blocks": 64, "block_size": 4})
    r = c("add", name="s", id=1, prompt=b"\x01\x00\x00\x00\x02")
    assert not r["ok"] and r["status"] == -1 and "multiple of 4" in r["message"], r
    big = b"\x01\x00\x00\x00" * 40000 + b"\x01"  # queued for the worker, then refused alike
    r = c("add", name="s", id=1, prompt=big)
    assert not r["ok"] and r["status"] == -1 and "multiple of 4" in r["message"], r
    r = c("add", name="s", id=1, prompt=_packed([1, -2, 3]))
    assert not r["ok"] and "negative" in r["message"], r
    assert c.ok("stats", name="s")["stats"]["num_waiting"] == 0
    # over --max-prompt-tokens, told from the bin's header before decoding
    r = c("add", name="s", id=1, prompt=b"\x00" * (4 * ((1 << 20) + 1)))
    assert not r["ok"] and r["status"] == RANGE and "--max-prompt-tokens" in r["message"], r
    c.close()


def test_ops_whose_work_would_stall_the_loop_are_bounded_first(serve):
    """Configs (create, configure, kvx_create) and drafts are small ops: over 64 KiB they are
    refused before decoding (a 16 MiB config took the loop over a second of JSON work); a
    config map of more than 4096 elements is refused before any JSON is built; an update
    output of more than 1 + 1024 tokens is refused before its tokens are decoded."""
    c = Client(serve())
    c.ok("create", name="s", config={"num_blocks": 64, "block_size": 4})
    junk = list(range(1000, 1000 + 40000))  # ~120 KiB
    for op, kw in (("configure", dict(name="s", config={"junk": junk})),
                   ("create", dict(name="t", config={"junk": junk})),
                   ("kvx_create", dict(name="k", layout=__import__("serve_hostile").FLOOD_LAYOUT,
                                       config={"engine_id": "k", "junk": junk})),
                   ("draft", dict(name="s", id=1, tokens=junk))):
        r = c.raw(msgpack.packb({"op": op, **kw}))  # "op" first: told by the peek
        assert not r["ok"] and r["status"] == RANGE and "takes at most 65536 bytes" in r["message"], (op, r)
        r = c.raw(msgpack.packb({**kw, "op": op}))  # "op" past the peek's budget: decoded, then
        assert not r["ok"], (op, r)  # refused by the op (its bound, or the library)
        assert op == "draft" or "4096 msgpack elements" in r["message"], (op, r)
    r = c("configure", name="s", config={"junk": [1] * 5000})  # 5 KB, 5002 elements
    assert not r["ok"] and r["status"] == RANGE and "4096 msgpack elements" in r["message"], r
    r = c("update", name="s", now=1.0, outputs={1: [1] * 1026})
    assert not r["ok"] and r["status"] == -1 and "at most 1025" in r["message"], r
    # a transfer names at most as many blocks as the engine's cache has (16 here)
    from serve_hostile import FLOOD_LAYOUT
    c.ok("kvx_create", name="k", layout=FLOOD_LAYOUT, config={"engine_id": "k"})
    for op, kw in (("kvx_send", {}), ("kvx_recv", {"peer": 0})):
        r = c(op, name="k", request_id=1, block_ids=[1] * 17, **kw)
        assert not r["ok"] and r["status"] == RANGE and "has 16 blocks" in r["message"], (op, r)
    assert c.ok("kvx_stats", name="k")["stats"]["num_send_active"] == 0
    assert c.ok("get_config", name="s")["config"]["num_blocks"] == 64
    c.close()
