"""The engine's own noise, the floor under any real-serving A/B on this machine (issue 22):
`make bench-vllm-noise` starts N identical servers (vLLM's scheduler, recording its steps with
tandem.vllm.RecordingScheduler), pinned and paused as bench_serve.py runs its arms, and
replays one workload point on each in turn, the order rotated every round. Every point's
steps are scored by the recording fit of an earlier `make bench-vllm-serve` (`tandem fit
--score`: measured step time over the fit's), so a server's speed is read apart from the load
it served. Identical servers at one point can only differ by the engine and the machine:
whatever spread the schedulers' arms show beyond this one is theirs.

Prints one `noise_point` line per point (time, server, speed, mean step, TTFT and TPOT p50)
and a `noise_summary` line: the speeds' range over the points past the first round (the
first, right after the servers start, is reported apart), per server and overall, and the
TTFT and TPOT p50 ranges. Not part of `make test`."""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_serve as b  # noqa: E402  the servers, the client and the point come from there


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--tool", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--fit-steps", required=True,
                    help="the steps CSV of a bench-vllm-serve recording run (its fit scores the points)")
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scale", type=float, default=6.0)
    ap.add_argument("--requests", type=int, default=600)
    a = ap.parse_args()
    if a.servers < 2 or a.rounds < 2:
        raise SystemExit("bench_noise: --servers and --rounds must be at least 2")
    if not os.path.exists(a.fit_steps):
        raise SystemExit(f"bench_noise: no {a.fit_steps} (run make bench-vllm-serve first: its "
                         f"recording run's steps are the fit that scores each point)")
    os.makedirs(a.out, exist_ok=True)
    mcfg = os.path.join(a.model, "config.json")
    reqs = b.load_trace(a.trace, a.requests, json.load(open(mcfg))["vocab_size"])
    pin = b.pin_client(nice=-15 if os.geteuid() == 0 else 0)
    slo = (2.0, 0.05)
    names = [f"S{i}" for i in range(a.servers)]
    steps = {n: os.path.abspath(os.path.join(a.out, f"steps-{n}.csv")) for n in names}
    servers, pts = {}, {n: [] for n in names}
    print(f"noise  {a.servers} identical servers (vLLM's scheduler), {a.rounds} rounds of one "
          f"point each: {len(reqs)} requests of {a.trace} at {a.scale:g}x", flush=True)
    try:
        for n in names:
            if os.path.exists(steps[n]):
                os.unlink(steps[n])
            servers[n] = b.Server(a.model, n, a.out, scheduler_cls="tandem.vllm.RecordingScheduler",
                                  tandem={"steps_csv": steps[n]}, **pin)
        for n in names:
            b.start_up(servers[n], n, reqs, 60)
            servers[n].pause()
        for r in range(a.rounds):
            k = r % len(names)
            for n in names[k:] + names[:k]:
                servers[n].resume(reqs[:8], 60)
                p = b.measure(servers[n], n, reqs, a.scale, slo, 60)
                servers[n].pause()
                p["t"], p["round"] = time.time(), r
                pts[n].append(p)
    finally:
        for s in servers.values():
            s.stop()
    rows = []
    for n in names:
        lines = open(steps[n]).read().splitlines()
        for j, p in enumerate(pts[n]):
            sp = os.path.join(a.out, f"point-{n}-{j}.csv")
            p["speed"], p["step_ms"] = b.score_point(a.tool, a.fit_steps, mcfg, lines,
                                                     p["steps_rows"], sp, os.path.join(a.out, "fit"))
            if p["speed"] is None:
                raise SystemExit(f"bench_noise: tandem fit --score {sp} failed")
            rows.append((p["t"], n, p))
    rows.sort(key=lambda x: x[0])
    t0 = rows[0][0]
    for t, n, p in rows:
        print(f"noise_point t={t - t0:.0f}s round={p['round']} server={n} speed={p['speed']:.3f} "
              f"step_ms={p['step_ms']:.2f} ttft_p50={1e3 * p['ttft_p50']:.1f}ms "
              f"tpot_p50={1e3 * p['tpot_p50']:.2f}ms", flush=True)
    later = [p for _, _, p in rows if p["round"] > 0]
    first = [p for _, _, p in rows if p["round"] == 0]

    def span(v):
        return f"{min(v):.3f}-{max(v):.3f} (max/min {max(v) / min(v):.2f})"
    per = " ".join(f"{n} {span([p['speed'] for p in pts[n] if p['round'] > 0])}" for n in names)
    ttft = [1e3 * p["ttft_p50"] for p in later]
    tpot = [1e3 * p["tpot_p50"] for p in later]
    first_speeds = " ".join("%.3f" % p["speed"] for p in first)
    print(f"noise_summary points={len(later)} (rounds 2-{a.rounds}) speed {span([p['speed'] for p in later])}, "
          f"median {statistics.median(p['speed'] for p in later):.3f}; per server: {per}; "
          f"ttft_p50 {min(ttft):.1f}-{max(ttft):.1f} ms (max/min {max(ttft) / min(ttft):.2f}); "
          f"tpot_p50 {min(tpot):.2f}-{max(tpot):.2f} ms (max/min {max(tpot) / min(tpot):.2f}); "
          f"first round, just after the servers started: speed {first_speeds}", flush=True)
    json.dump(pts, open(os.path.join(a.out, "results.json"), "w"), indent=1, default=str)


if __name__ == "__main__":
    main()
