"""Server half of the end-to-end check: vLLM's OpenAI-compatible server (module entry point,
not the `vllm` console script) on 127.0.0.1 and a free ephemeral port, with vLLM's scheduler
or TandemScheduler; a concurrent streaming load where half the clients close the connection
mid-stream; then /health must answer 200, a final request must be served, and the metrics must
show no request left running or waiting.

    python serve_load.py MODEL_DIR vllm|tandem
"""
import asyncio
import os
import socket
import subprocess
import sys
import time

import aiohttp

from run_e2e import BLOCKS


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def stream(session, url, i, abort_after):
    body = {"model": "m", "prompt": "the cat runs " * (5 + 7 * i), "max_tokens": 96,
            "temperature": 0, "ignore_eos": True, "stream": True}
    chunks = 0
    async with session.post(url + "/v1/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                chunks += 1
                if abort_after and chunks >= abort_after:
                    r.close()             # the client goes away mid-stream
                    return "aborted", chunks
    return "done", chunks


async def load(url):
    async with aiohttp.ClientSession() as s:
        res = await asyncio.gather(*(stream(s, url, i, 3 if i % 2 else 0) for i in range(24)),
                                   return_exceptions=True)
        await asyncio.sleep(2)
        async with s.get(url + "/health") as r:
            health = r.status
        body = {"model": "m", "prompt": "the dog sleeps", "max_tokens": 16, "temperature": 0}
        async with s.post(url + "/v1/completions", json=body) as r:
            final = (r.status, await r.json())
        async with s.get(url + "/metrics") as r:
            metrics = await r.text()
    return res, health, final, metrics


def gauge(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def main():
    model, which = sys.argv[1], sys.argv[2]
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--block-size", "32", "--max-model-len", "1024",
           "--max-num-batched-tokens", "128", "--max-num-seqs", "16",
           "--num-gpu-blocks-override", str(BLOCKS), "--enforce-eager",
           "--async-scheduling" if os.environ.get("TANDEM_E2E_ASYNC") == "1" else "--no-async-scheduling",
           "--gpu-memory-utilization", "0.3"]   # on CPU: the share of RAM it reserves
    if which == "tandem":
        cmd += ["--scheduler-cls", "tandem.vllm.TandemScheduler"]
    log = open(f"{model}-serve-{which}.log", "w")
    srv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    checks = []
    try:
        t0 = time.monotonic()
        up = False
        while time.monotonic() - t0 < 300 and srv.poll() is None:
            try:
                import urllib.request
                up = urllib.request.urlopen(url + "/health", timeout=2).status == 200
                if up:
                    break
            except Exception:
                time.sleep(2)
        checks.append((up, f"{which} server up ({time.monotonic() - t0:.0f} s)"))
        if up:
            t1 = time.monotonic()
            res, health, final, metrics = asyncio.run(load(url))
            errs = [r for r in res if isinstance(r, Exception)]
            done = sum(1 for r in res if not isinstance(r, Exception) and r[0] == "done"
                       and r[1] > 0)
            aborted = sum(1 for r in res if not isinstance(r, Exception) and r[0] == "aborted")
            checks.append((not errs and done == 12 and aborted == 12,
                           f"{which} streams: {done} completed, {aborted} aborted, "
                           f"{len(errs)} errors {errs[:1]} ({time.monotonic() - t1:.1f} s)"))
            checks.append((health == 200, f"{which} /health after the load: {health}"))
            ok = final[0] == 200 and final[1].get("usage", {}).get("completion_tokens", 0) > 0
            checks.append((ok, f"{which} final request served: {final[0]}"))
            run, wait = (gauge(metrics, "vllm:num_requests_running"),
                         gauge(metrics, "vllm:num_requests_waiting"))
            checks.append((run == 0 and wait == 0,
                           f"{which} nothing left running/waiting: {run}/{wait}"))
            checks.append((srv.poll() is None, f"{which} server still alive"))
    finally:
        srv.terminate()
        try:
            srv.wait(30)
        except subprocess.TimeoutExpired:
            srv.kill()
    for ok, what in checks:
        print(("PASS " if ok else "FAIL ") + what, flush=True)
    return 0 if all(ok for ok, _ in checks) and checks else 1


if __name__ == "__main__":
    sys.exit(main())
