"""Hostile clients of `tandem serve` for the denial-of-service load test (test_serve_dos.py),
run as a separate process so that they do not share the measuring client's interpreter.

    python serve_hostile.py ENDPOINT SECONDS KINDS [SERVER_PUBLIC_KEY]

KINDS is a comma-separated list of:
  raw     64 TCP connections that never send a byte (each reopened when the service ends it)
  null    64 connections that complete a NULL-mechanism ZMTP handshake, then stay silent
  curve   16 CURVE clients with keys the service does not allow, sending pings
  big     16 MiB requests: a padded "ping" and an "update" of 16 M one-byte elements
  add7    "add" requests of 10^7 one-byte tokens (over --max-prompt-tokens)
  add1m   in-limit "add" requests of 2^20 tokens, each aborted after (their prompt
          digests are computed on the service's decoding thread, docs/service.md)
  add1m_bin  the same with the prompt as a bin of packed int32 (4 bytes a token)
  flood256[@ENDPOINT]  256 peers from 127.0.0.2 send a KV-transfer HELLO each to a transfer
          engine of the service (the one listening at ENDPOINT, or one this client creates)
          and stay connected; counts the HELLO_ACKs accepted and refused -8 NO_SPACE
  upd4m   in-limit-shaped "update" requests: 4,000 outputs of 1,025 tokens (4.1 M elements,
          ~4 MiB), for requests the instance does not have (refused -5 after decoding)
  cfg     "configure" requests of ~4 MiB (a config map with a 2^20-element array), "op" first
          and "op" last (past the peek's budget)
  kvx4m   "kvx_send" and "kvx_recv" naming 4 M block ids, and 15 MiB "kvx_write"s, to a
          16-block transfer engine of the service
  none    nothing (a baseline)
Loopback only: the endpoint must be tcp://127.0.0.1:PORT. Prints one line of counts at the end.
"""
import socket
import struct
import sys
import threading
import time

import msgpack
import zmq

from test_serve_dos import null_greeting, padded_request

HOLD = 64
PAUSE = 0.1  # between two large requests of one hostile client (bounded load for CI)


def _hold(port, deadline, greet, counts, key):
    socks = [None] * HOLD
    while time.monotonic() < deadline:
        for i, s in enumerate(socks):
            if s is not None:
                try:
                    if s.recv(65536) == b"":
                        s.close()
                        socks[i] = None
                except BlockingIOError:
                    continue
                except OSError:
                    s.close()
                    socks[i] = None
                    continue
            if socks[i] is None:
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=1)
                    if greet:
                        s.sendall(greet)
                    s.setblocking(False)
                    socks[i] = s
                    counts[key] += 1
                except OSError:
                    pass
        time.sleep(0.05)
    for s in socks:
        if s is not None:
            s.close()


def _curve(ep, spub, deadline, counts):
    ctx = zmq.Context.instance()
    socks = []
    for _ in range(16):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.curve_serverkey = spub.encode()
        s.curve_publickey, s.curve_secretkey = zmq.curve_keypair()
        s.connect(ep)
        socks.append(s)
    while time.monotonic() < deadline:
        for s in socks:
            try:
                s.send(msgpack.packb({"op": "ping"}), zmq.NOBLOCK)
                counts["curve"] += 1
            except zmq.Again:
                pass
            if s.poll(0):
                counts["curve_answered"] += 1
                s.recv()
        time.sleep(0.1)
    for s in socks:
        s.close()


def _client(ep, spub, keypair):
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if spub:
        s.curve_serverkey = spub.encode()
        s.curve_publickey, s.curve_secretkey = keypair
    s.connect(ep)
    return s


def _call(s, raw, counts, key):
    s.send(raw, copy=False)
    if s.poll(8000):  # a request lost with its connection is counted, not waited for
        r = msgpack.unpackb(s.recv(), raw=False)
        counts[key + ("_ok" if r.get("ok") else "_refused")] += 1
        return r
    counts[key + "_noreply"] += 1
    return None


def _big(ep, spub, keypair, deadline, counts):
    s = _client(ep, spub, keypair)
    ping16 = padded_request("ping", (16 << 20) - 64)
    n = 4 << 20  # an update of four ~4 M-element arrays: 16 M elements, just under 16 MiB
    upd = (bytes([0x86]) + msgpack.packb("op") + msgpack.packb("update") + msgpack.packb("name")
           + msgpack.packb("big"))
    for k, m in (("a", n), ("b", n), ("c", n), ("d", n - 128)):
        upd += msgpack.packb(k) + b"\xdd" + struct.pack(">I", m) + b"\x01" * m
    while time.monotonic() < deadline:
        for raw, key in ((ping16, "ping16"), (upd, "update16")):
            _call(s, raw, counts, key)
            time.sleep(PAUSE)
    s.close()


def _add1m(ep, spub, keypair, deadline, counts):
    """In-limit adds of 2^20 tokens: decoded by the service's worker, then scheduled (the
    scheduler's own work, SHA-256 block hashes included, runs on the service's loop)."""
    s = _client(ep, spub, keypair)
    prompt = list(range(1000, 1000 + (1 << 20)))
    _call(s, msgpack.packb({"op": "create", "name": "big1m",
                            "config": {"num_blocks": 70000, "block_size": 16,
                                       "max_model_len": 1 << 21,
                                       "max_num_batched_tokens": 1 << 21}}), counts, "create")
    rid = 0
    while time.monotonic() < deadline:
        rid += 1
        r = _call(s, msgpack.packb({"op": "add", "name": "big1m", "id": rid, "prompt": prompt}),
                  counts, "add1m")
        if r and r.get("ok"):
            _call(s, msgpack.packb({"op": "abort", "name": "big1m", "id": rid}), counts, "abort")
        time.sleep(0.05)
    s.close()


def _add1m_bin(ep, spub, keypair, deadline, counts):
    """_add1m with the compact encoding: 4 MiB of packed int32 instead of ~3 MiB of msgpack
    ints (one msgpack element instead of 2^20 while decoded)."""
    s = _client(ep, spub, keypair)
    prompt = struct.pack(f"<{1 << 20}i", *range(1000, 1000 + (1 << 20)))
    _call(s, msgpack.packb({"op": "create", "name": "bin1m",
                            "config": {"num_blocks": 70000, "block_size": 16,
                                       "max_model_len": 1 << 21,
                                       "max_num_batched_tokens": 1 << 21}}), counts, "create")
    rid = 0
    while time.monotonic() < deadline:
        rid += 1
        r = _call(s, msgpack.packb({"op": "add", "name": "bin1m", "id": rid, "prompt": prompt}),
                  counts, "add1m_bin")
        if r and r.get("ok"):
            _call(s, msgpack.packb({"op": "abort", "name": "bin1m", "id": rid}), counts, "abort")
        time.sleep(0.05)
    s.close()


# The transfer engine flooded by flood256 (docs/service.md "KV transfer"): a tiny host cache.
FLOOD_LAYOUT = {"num_layers": 2, "num_blocks": 16, "block_size": 4, "num_kv_heads": 2,
                "head_dim": 8, "dtype": 1, "kind": 1}


def flood_hello(i, lay=FLOOD_LAYOUT):
    """A protocol-1 HELLO (docs/protocol.md §2) of a peer offering only the zmq transport."""
    nb, bs, h, d = lay["num_blocks"], lay["block_size"], lay["num_kv_heads"], lay["head_dim"]
    layout = [lay["kind"], lay["num_layers"], nb, bs, h, d, lay["dtype"], nb * bs * h * d,
              bs * h * d, h * d, d]
    return msgpack.packb([1, 1, f"flood{i}", 0, layout, 0, 0, 1, "floodhost", "", 0, 0])


def _flood256(ep, spub, keypair, deadline, counts, target=None):
    s = _client(ep, spub, keypair)
    if not target:
        r = _call(s, msgpack.packb({"op": "kvx_create", "name": "flood", "layout": FLOOD_LAYOUT,
                                    "config": {"engine_id": "svc-flood", "role": "both",
                                               "listen": "tcp://127.0.0.1:*"}}),
                  counts, "kvx_create")
        target = r["endpoint"] if r and r.get("ok") else None
    if not target:
        return
    ctx = zmq.Context.instance()
    peers = []
    for i in range(256):
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect("tcp://127.0.0.2:0;" + target[len("tcp://"):])
        d.send(flood_hello(i))
        peers.append(d)
    acks = 0
    end = min(deadline, time.monotonic() + 10)
    while acks < 256 and time.monotonic() < end:
        for d in peers:
            while d.poll(0):
                h = msgpack.unpackb(d.recv(), raw=False)
                if h[1] == 2:  # HELLO_ACK
                    acks += 1
                    counts["flood_ok" if h[2] == 0 else f"flood_{h[2]}"] += 1
        time.sleep(0.01)
    while time.monotonic() < deadline:  # hold the slots (the engine's PINGs keep them alive)
        for d in peers:
            while d.poll(0):
                d.recv()
        time.sleep(0.05)
    for d in peers:
        d.close()
    s.close()


def _upd4m(ep, spub, keypair, deadline, counts):
    s = _client(ep, spub, keypair)
    _call(s, msgpack.packb({"op": "create", "name": "upd", "config": {"num_blocks": 64}}),
          counts, "create")
    raw = msgpack.packb({"op": "update", "name": "upd", "now": 1.0,
                         "outputs": {i: [1] * 1025 for i in range(4000)}})
    while time.monotonic() < deadline:
        _call(s, raw, counts, "upd4m")
        time.sleep(PAUSE)
    s.close()


def _cfg(ep, spub, keypair, deadline, counts):
    s = _client(ep, spub, keypair)
    _call(s, msgpack.packb({"op": "create", "name": "cfg"}), counts, "create")
    junk = list(range(1000, 1000 + (1 << 20)))
    raws = (msgpack.packb({"op": "configure", "name": "cfg", "config": {"junk": junk}}),
            msgpack.packb({"name": "cfg", "config": {"junk": junk}, "op": "configure"}))
    while time.monotonic() < deadline:
        for raw in raws:
            _call(s, raw, counts, "cfg")
            time.sleep(PAUSE)
    s.close()


def _kvx4m(ep, spub, keypair, deadline, counts):
    s = _client(ep, spub, keypair)
    _call(s, msgpack.packb({"op": "kvx_create", "name": "k4m", "layout": FLOOD_LAYOUT,
                            "config": {"engine_id": "k4m"}}), counts, "kvx_create")
    ids = [1] * (4 << 20)
    raws = (msgpack.packb({"op": "kvx_send", "name": "k4m", "request_id": 1, "block_ids": ids}),
            msgpack.packb({"op": "kvx_recv", "name": "k4m", "peer": 0, "request_id": 1,
                           "block_ids": ids}),
            msgpack.packb({"op": "kvx_write", "name": "k4m", "layer": 0, "offset": 0,
                           "data": b"\0" * (15 << 20)}))
    while time.monotonic() < deadline:
        for raw in raws:
            _call(s, raw, counts, "kvx4m")
            time.sleep(PAUSE)
    s.close()


def _add7(ep, spub, keypair, deadline, counts):
    s = _client(ep, spub, keypair)
    extra = msgpack.packb("name") + msgpack.packb("big") + msgpack.packb("id") + msgpack.packb(7)
    raw = padded_request("add", 10 ** 7, extra)
    while time.monotonic() < deadline:
        _call(s, raw, counts, "add7")
        time.sleep(PAUSE)
    s.close()


def main(argv):
    ep, seconds, kinds = argv[1], float(argv[2]), argv[3].split(",")
    spub = argv[4] if len(argv) > 4 and argv[4] != "-" else None
    keypair = (argv[5].encode(), argv[6].encode()) if len(argv) > 6 else None
    if not ep.startswith("tcp://127.0.0.1:"):
        sys.exit("serve_hostile: loopback endpoints only")
    port = int(ep.rsplit(":", 1)[1])
    deadline = time.monotonic() + seconds
    counts = __import__("collections").Counter()
    greet, ready = null_greeting()
    jobs = {"none": (time.sleep, (0,)),
            "raw": (_hold, (port, deadline, b"", counts, "raw")),
            "null": (_hold, (port, deadline, greet + ready, counts, "null")),
            "curve": (_curve, (ep, spub, deadline, counts)),
            "big": (_big, (ep, spub, keypair, deadline, counts)),
            "add7": (_add7, (ep, spub, keypair, deadline, counts)),
            "add1m": (_add1m, (ep, spub, keypair, deadline, counts)),
            "add1m_bin": (_add1m_bin, (ep, spub, keypair, deadline, counts)),
            "upd4m": (_upd4m, (ep, spub, keypair, deadline, counts)),
            "cfg": (_cfg, (ep, spub, keypair, deadline, counts)),
            "kvx4m": (_kvx4m, (ep, spub, keypair, deadline, counts))}
    for k in kinds:
        if k.startswith("flood256"):
            jobs[k] = (_flood256, (ep, spub, keypair, deadline, counts, k.partition("@")[2] or None))
    threads = [threading.Thread(target=jobs[k][0], args=jobs[k][1], daemon=True) for k in kinds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    print("hostile:", " ".join(f"{k}={v}" for k, v in sorted(counts.items())), flush=True)


if __name__ == "__main__":
    main(sys.argv)
