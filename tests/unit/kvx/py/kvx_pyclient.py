#!/usr/bin/env python3
"""kvx_pyclient.py -- docs/protocol.md's claim, tested: a receiver written only with pyzmq and
msgpack handshakes with a Tandem prefill engine (kvx_pyserver), pulls a request and checks
every byte, and the engine reports the transfer DONE. Also: a HELLO of another protocol
version is refused with -15. Writes "passed failed skipped" to the counts file (argv[2]);
skips when pyzmq or msgpack is missing."""
import subprocess
import sys

counts, server = sys.argv[2], sys.argv[1]
try:
    import msgpack
    import zmq
except ImportError as e:
    print(f"[  SKIPPED ] kvx pyzmq client: {e}")
    open(counts, "w").write("0 0 1\n")
    sys.exit(0)

passed = failed = 0


def check(name, fn):
    global passed, failed
    try:
        fn()
        print(f"[       OK ] {name}")
        passed += 1
    except Exception as e:  # noqa: BLE001 -- report any failure as a test failure
        print(f"[  FAILED  ] {name}: {e!r}")
        failed += 1


def pull():
    srv = subprocess.Popen([server], stdout=subprocess.PIPE, text=True)
    try:
        line = srv.stdout.readline().split()
        assert line[0] == "endpoint", line
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 10000)
        s.connect(line[1])
        layout = [1, 32, 4096, 16, 8, 128, 1, 4096 * 16 * 8 * 128, 16 * 8 * 128, 8 * 128, 128]
        s.send(msgpack.packb([1, 1, "py-decode", 2, layout, 0, 0, 1, "pyhost", "", 0, 0]))
        ack = msgpack.unpackb(s.recv())
        assert ack[1] == 2 and ack[2] == 0, ack
        assert ack[4] == "py-prefill", ack
        s.send(msgpack.packb([1, 3, 42, 1, 1, 8, 0, 128]))
        unit = 2 * 16 * 8 * 128 * 2
        seen = set()
        while len(seen) < 32 * 8:
            frames = s.recv_multipart()
            h = msgpack.unpackb(frames[0])
            if h[1] == 10:
                continue
            assert h[1] == 4, h
            _, _, rid, xid, seq, l0, l1, b0, nb, nbytes, slot, tokens = h
            assert (rid, xid, slot, tokens) == (42, 1, 0xFFFFFFFF, 128) and len(frames[1]) == nbytes == (l1 - l0) * nb * unit
            for i, layer in enumerate(range(l0, l1)):
                part = frames[1][i * nb * unit:(i + 1) * nb * unit]
                assert part == bytes([layer]) * len(part), f"layer {layer} bytes differ"
                for b in range(b0, b0 + nb):
                    assert (layer, b) not in seen
                    seen.add((layer, b))
        s.send(msgpack.packb([1, 6, 42, 1, 32 * 8 * unit]))
        out = srv.communicate(timeout=20)[0].split()
        assert out[:3] == ["event", "1", "0"], out
        s.close()
        ctx.term()
    finally:
        if srv.poll() is None:
            srv.kill()


def other_version():
    srv = subprocess.Popen([server], stdout=subprocess.PIPE, text=True)
    try:
        ep = srv.stdout.readline().split()[1]
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 10000)
        s.connect(ep)
        s.send(msgpack.packb([2, 1, "future"]))
        ack = msgpack.unpackb(s.recv())
        assert ack[1] == 2 and ack[2] == -15, ack
        s.close()
        ctx.term()
    finally:
        srv.kill()
        srv.wait()


check("pyclient__pulls_every_byte_and_engine_sees_done", pull)
check("pyclient__other_version_is_refused", other_version)
open(counts, "w").write(f"{passed} {failed} 0\n")
print(f"[  PASSED  ] {passed} test(s).")
sys.exit(1 if failed else 0)
