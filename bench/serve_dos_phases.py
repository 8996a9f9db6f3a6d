#!/usr/bin/env python3
"""Ping latency of a legitimate `tandem serve` client under each hostile phase (issue 26).

    python bench/serve_dos_phases.py [--tool build/tandem] [--seconds 8] [--phases a,b,...]

For each phase a fresh service is started on loopback, the hostile clients of
adapters/python/tests/serve_hostile.py run for --seconds in another process, and one client
pings every 20 ms (the load test's loop, test_serve_dos._load). One line per phase:
pings sent, unanswered, p50/p99/max in ms, and the hostile process's counts. `uptime` is
printed first and last: these are wall-clock figures on whatever else the machine runs.
The target is p99 <= 50 ms in every phase; this script reports, it asserts nothing.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "adapters", "python", "tests"))

import zmq  # noqa: E402

# phase name -> (hostile kinds, CURVE service)
PHASES = {
    "none": ([], False),
    "raw": (["raw"], False),
    "null": (["null"], False),
    "big": (["big"], False),
    "add7": (["add7"], False),
    "add1m": (["add1m"], False),
    "add1m_bin": (["add1m_bin"], False),
    "upd4m": (["upd4m"], False),
    "cfg": (["cfg"], False),
    "kvx4m": (["kvx4m"], False),
    "flood256": (["flood256"], False),
    "all_plain": (["raw", "null", "big", "add7", "add1m", "flood256"], False),
    "curve_all": (["raw", "null", "curve", "big"], True),
}


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def start(tool, args):
    p = subprocess.Popen([tool, "serve", "--bind", "tcp://127.0.0.1:*", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if "listening on" not in line:
        p.kill()
        sys.exit(f"serve did not start: {line!r} {p.communicate()[1]!r}")
    return p, line.rsplit(" ", 1)[1].strip()


def stop(p):
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", default=os.environ.get("TANDEM_TOOL", os.path.join(ROOT, "build", "tandem")))
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--phases", default=",".join(PHASES))
    a = ap.parse_args()
    import test_serve_dos as t  # noqa: E402  (the load test's client loop and percentiles)
    from test_serve import Client
    print("uptime:", uptime(), flush=True)
    for name in a.phases.split(","):
        kinds, curve = PHASES[name]
        args, spub, ka, kb = [], "-", None, None
        if curve:
            spub_b, ssec = zmq.curve_keypair()
            ka, kb = zmq.curve_keypair(), zmq.curve_keypair()
            spub = spub_b.decode()
            args = ["--curve-secret", ssec.decode(), "--curve-allow", ka[0].decode(),
                    "--curve-allow", kb[0].decode()]
        p, ep = start(a.tool, args)
        try:
            if curve:
                from test_serve_security import curve_client
                c = curve_client(ep, spub_b, ka)
            else:
                c = Client(ep)
            lat, hostile = t._load(ep, kinds, a.seconds, c, spub, kb) if kinds else \
                t._load(ep, ["none"], a.seconds, c)
            c.close()
        finally:
            stop(p)
        ok = sorted(x for x in lat if x is not None)
        if not ok:
            print(f"phase {name:10s}: {len(lat)} pings, none answered", flush=True)
            continue
        pct = lambda q: ok[min(len(ok) - 1, int(q * len(ok)))] * 1e3  # noqa: E731
        print(f"phase {name:10s}: {len(lat):4d} pings, {len(lat) - len(ok)} unanswered; "
              f"p50 {pct(0.5):6.1f} ms, p99 {pct(0.99):6.1f} ms, max {ok[-1] * 1e3:6.1f} ms"
              f"  [{hostile}]", flush=True)
        time.sleep(0.5)
    print("uptime:", uptime(), flush=True)


if __name__ == "__main__":
    main()
