#!/usr/bin/env python3
"""Disaggregated prefill/decode with Tandem: two processes, a toy CPU model, every KV byte checked.

    python examples/pd_demo/pd_demo.py [--requests 8] [--kill-prefill-after K] [--json]

The main process is the decode engine (and the client); it starts the prefill engine as a
child process (`--role prefill`) and sends it the requests on its stdin. Both engines use the
`tandem` Python package: a tandem.Scheduler each (roles PREFILL and DECODE) and a
tandem.KVTransfer each (the prefill engine listens, the decode engine connects and pulls).

The "model" is a deterministic function: the KV of a token is kv_row(token, position, layer,
K/V, head), and the next token is a function of the last token and its position. So the decode
engine can check every byte it received (and, at the end of each request, every byte of its
whole KV cache), and its output tokens are the same whether the prompt's KV came from the
prefill engine or was recomputed locally.

Flow per request: the decode scheduler reserves blocks for a REMOTE_PREFILL request and
reports it in batch.recv_ready; the decode engine starts a PULL receive into those blocks. The
prefill engine runs the prompt (chunked), samples one token, the request finishes with its
blocks held (REMOTE_DECODE), and the engine exports them with KVTransfer.send(); once the
transfer is acknowledged it releases them. On the receive's DONE event the decode engine
checks the bytes and calls remote_kv_done(ok=True); the request resumes with the prompt
computed except its last token, which the decode engine recomputes for its logits.

With --kill-prefill-after K the prefill engine SIGKILLs itself after K acknowledged
transfers. The decode engine's outstanding receives then fail (the peer stops answering);
it calls remote_kv_done(ok=False, num_valid_tokens=<whole blocks that did arrive>) and the
scheduler's RECOMPUTE policy recomputes the rest locally. Every request still completes,
and at the end no block is leaked (free blocks == total, no reserved transfer blocks).

Prints per-request TTFT and TPOT (decode engine's clock, from submission), the KV check, and
with --json a final JSON summary line.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import struct
import subprocess
import sys
import time

import tandem
from tandem import FinishReason, KVLayout, KVTransfer, Request, TandemError, host_cache

LAYERS, HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 2, 2, 8, 4, 512
ROW = struct.Struct("<%dH" % HEAD_DIM)


def kv_row(token: int, pos: int, layer: int, kv: int, head: int) -> bytes:
    """The toy model's K (kv=0) or V (kv=1) vector of one head: HEAD_DIM fp16-sized values,
    a deterministic function of (token, position, layer)."""
    base = (token * 1000003 + pos * 7919 + layer * 104729 + kv * 613 + head * 97) & 0xFFFFFFFF
    return ROW.pack(*(((base * (2 * d + 1) * 2654435761) >> 13) & 0xFFFF for d in range(HEAD_DIM)))


def next_token(last: int, pos: int) -> int:
    return (last * 31 + pos * 17 + 5) % 30000 + 3


def prompts(n: int):
    return [[(i * 7919 + k * 104729) % 30000 + 3 for k in range(9 + (i * 13) % 52)]
            for i in range(n)]


def layout() -> KVLayout:
    return KVLayout(num_layers=LAYERS, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                    num_kv_heads=HEADS, head_dim=HEAD_DIM)


def slot_offsets(lay, blocks, pos, kv, head):
    return lay.offset(kv, blocks[pos // BLOCK_SIZE], pos % BLOCK_SIZE, head)


def write_kv(lay, bufs, blocks, tokens, begin, end):
    """Run the toy model on positions [begin, end): write their KV into the blocks."""
    n = HEAD_DIM * lay.elem_size
    for layer, buf in enumerate(bufs):
        for pos in range(begin, end):
            for kv in (0, 1):
                for h in range(HEADS):
                    o = slot_offsets(lay, blocks, pos, kv, h)
                    buf[o:o + n] = kv_row(tokens[pos], pos, layer, kv, h)


def check_kv(lay, bufs, blocks, tokens, begin, end):
    """(bytes checked, mismatching rows) for positions [begin, end)."""
    n = HEAD_DIM * lay.elem_size
    checked = bad = 0
    for layer, buf in enumerate(bufs):
        for pos in range(begin, end):
            for kv in (0, 1):
                for h in range(HEADS):
                    o = slot_offsets(lay, blocks, pos, kv, h)
                    checked += n
                    if bytes(buf[o:o + n]) != kv_row(tokens[pos], pos, layer, kv, h):
                        bad += 1
    return checked, bad


def engine_step(sched, lay, bufs, now, on_token=None):
    """One step of a toy engine: schedule, 'run the model' (write KV), report tokens.
    Returns (batch, update result, {id: tokens before the step})."""
    b = sched.step(now=now)
    report = {}
    for e in b:
        info = sched.request_info(e.req_id)
        toks = sched.request_tokens(e.req_id)
        blocks = sched.request_blocks(e.req_id)
        write_kv(lay, bufs, blocks, toks, e.num_computed, e.num_computed + e.num_tokens)
        end = e.num_computed + e.num_tokens
        if end >= info.num_prompt_tokens + info.num_output_tokens:
            t = next_token(toks[end - 1], end - 1)
            if on_token is not None:
                on_token(e.req_id, info, toks, blocks, end)
            report[e.req_id] = [t]
        else:
            report[e.req_id] = []
    r = sched.update(report, now=time.monotonic()) if len(b) else None
    return b, r


# ---- the prefill engine (child process) ---------------------------------------------------------

def run_prefill(args):
    lay = layout()
    bufs = host_cache(lay)
    kvx = KVTransfer("prefill-0", role="prefill", listen=args.kv_endpoint, heartbeat_ms=50,
                     peer_timeout_ms=1000, transfer_timeout_ms=20000)
    kvx.register(lay, bufs)
    sched = tandem.Scheduler(block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, role=tandem.Role.PREFILL,
                             max_num_batched_tokens=args.prefill_budget, max_num_seqs=16,
                             enable_prefix_caching=False)
    print(f"KV {kvx.endpoint}", flush=True)
    sending = {}     # kvx handle -> request id
    done = 0
    eof = False
    stdin = sys.stdin.fileno()
    pending_line = b""
    while True:
        r, _, _ = select.select([stdin], [], [], 0.002 if sched.num_unfinished() or sending else 0.05)
        if r and not eof:
            chunk = os.read(stdin, 65536)
            if not chunk:
                eof = True
            pending_line += chunk
            while b"\n" in pending_line:
                line, pending_line = pending_line.split(b"\n", 1)
                m = json.loads(line)
                sched.add(Request(id=m["id"], prompt=m["prompt"], max_tokens=1,
                                  remote_decode=True))
        if sched.num_unfinished():
            b, res = engine_step(sched, lay, bufs, time.monotonic())
            time.sleep(args.prefill_step_delay)
            for u in (res or ()):
                if u.finish_reason != FinishReason.NONE:   # blocks are held for the decode side
                    blocks = sched.request_blocks(u.req_id)
                    sending[kvx.send(request_id=u.req_id, block_ids=blocks)] = u.req_id
        for ev in kvx.poll(timeout_ms=0):
            rid = sending.pop(ev.handle, None)
            if rid is None:
                continue
            sched.release(rid)
            if ev.ok:
                done += 1
                if args.die_after and done >= args.die_after:
                    print(f"prefill: killing myself after {done} transfers", file=sys.stderr,
                          flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
        if eof and not sched.num_unfinished() and not sending:
            break
    st = sched.stats()
    kvx.close()
    sched.close()
    print(f"prefill: done, {done} transfers, free blocks {st.num_free_blocks}/{st.num_total_blocks}",
          file=sys.stderr, flush=True)


# ---- the decode engine (main process) -----------------------------------------------------------

def run_decode(args):
    lay = layout()
    bufs = host_cache(lay)
    here = os.path.abspath(__file__)
    env = dict(os.environ)
    cmd = [sys.executable, here, "--role", "prefill", "--kv-endpoint", args.kv_endpoint,
           "--prefill-budget", str(args.prefill_budget), "--prefill-step-delay",
           str(args.prefill_step_delay)]
    if args.kill_prefill_after:
        cmd += ["--die-after", str(args.kill_prefill_after)]
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    line = child.stdout.readline().decode().strip()
    if not line.startswith("KV "):
        child.kill()
        raise SystemExit(f"prefill engine did not start: {line!r}")
    endpoint = line[3:]

    kvx = KVTransfer("decode-0", role="decode", heartbeat_ms=50, peer_timeout_ms=1000,
                     transfer_timeout_ms=20000)
    kvx.register(lay, bufs)
    peer = kvx.connect(endpoint)
    sched = tandem.Scheduler(block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, role=tandem.Role.DECODE,
                             remote_kv_failure=tandem.RemoteKVFailure.RECOMPUTE,
                             max_num_batched_tokens=256, max_num_seqs=32,
                             enable_prefix_caching=False)
    total_blocks = sched.stats().num_free_blocks

    ps = prompts(args.requests)
    submitted, first, last, ntok = {}, {}, {}, {}
    outputs = {i + 1: [] for i in range(len(ps))}
    kv_checked = kv_bad = 0
    recomputed, remote_ok = set(), set()
    receiving = {}   # handle -> request id

    for i, p in enumerate(ps):
        rid = i + 1
        submitted[rid] = time.monotonic()
        child.stdin.write((json.dumps({"id": rid, "prompt": p}) + "\n").encode())
        sched.add(Request(id=rid, prompt=p, max_tokens=args.max_tokens, remote_prefill=True,
                          arrival_time=submitted[rid]))
    child.stdin.flush()

    def fail_remote(rid, valid_tokens):
        recomputed.add(rid)
        sched.remote_kv_done(rid, ok=False, num_valid_tokens=valid_tokens)

    def on_token(rid, info, toks, blocks, end):
        nonlocal kv_checked, kv_bad
        if info.num_output_tokens + 1 >= args.max_tokens:   # last token: check the whole cache
            c, bad = check_kv(lay, bufs, blocks, toks, 0, end)
            kv_checked += c
            kv_bad += bad

    deadline = time.monotonic() + args.timeout
    while sched.num_unfinished():
        if time.monotonic() > deadline:
            raise SystemExit("decode: timed out")
        b, res = engine_step(sched, lay, bufs, time.monotonic(), on_token)
        for rid in b.recv_ready:
            try:
                receiving[kvx.recv(peer, request_id=rid, block_ids=sched.request_blocks(rid))] = rid
            except TandemError as e:   # the prefill engine is gone: recompute
                print(f"decode: request {rid}: cannot receive ({e.name}); recomputing",
                      file=sys.stderr)
                fail_remote(rid, 0)
        now = time.monotonic()
        for u in (res or ()):
            if u.num_new_tokens:
                first.setdefault(u.req_id, now)
                last[u.req_id] = now
                ntok[u.req_id] = ntok.get(u.req_id, 0) + u.num_new_tokens
                outputs[u.req_id] += sched.request_tokens(u.req_id)[-u.num_new_tokens:]
        for ev in kvx.poll(timeout_ms=0 if len(b) else 2):
            rid = receiving.pop(ev.handle, None)
            if rid is None:
                continue
            toks = sched.request_tokens(rid)
            blocks = sched.request_blocks(rid)
            if ev.ok:
                c, bad = check_kv(lay, bufs, blocks, toks, 0, min(len(toks), len(blocks) * BLOCK_SIZE))
                kv_checked += c
                kv_bad += bad
                remote_ok.add(rid)
                sched.remote_kv_done(rid, ok=True)
            else:
                valid = ev.num_blocks_done * BLOCK_SIZE
                c, bad = check_kv(lay, bufs, blocks, toks, 0, min(valid, len(toks)))
                kv_checked += c
                kv_bad += bad
                print(f"decode: request {rid}: receive failed ({ev.reason or ev.status}); "
                      f"{ev.num_blocks_done} blocks arrived, recomputing the rest", file=sys.stderr)
                fail_remote(rid, valid)
    sched.step(now=time.monotonic())      # flush the finished list
    st = sched.stats()
    kst = kvx.stats()
    child.stdin.close()
    try:
        prc = child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        prc = child.wait()
    kvx.close()

    expected = {}
    for i, p in enumerate(ps):
        toks = list(p)
        for _ in range(args.max_tokens):
            toks.append(next_token(toks[-1], len(toks) - 1))
        expected[i + 1] = toks[len(p):]
    tokens_ok = all(outputs[r] == expected[r] for r in expected)
    print(f"{'req':>4} {'prompt':>6} {'source':>10} {'TTFT ms':>8} {'TPOT ms':>8}")
    for rid in sorted(submitted):
        ttft = (first[rid] - submitted[rid]) * 1e3
        tpot = ((last[rid] - first[rid]) / (ntok[rid] - 1) * 1e3) if ntok[rid] > 1 else 0.0
        src = "recomputed" if rid in recomputed else "remote"
        print(f"{rid:>4} {len(ps[rid - 1]):>6} {src:>10} {ttft:>8.2f} {tpot:>8.2f}")
    leaks = st.num_free_blocks != total_blocks or kst.num_reserved_blocks != 0
    print(f"KV check: {'OK' if kv_bad == 0 else 'FAILED'} ({kv_checked} bytes checked, "
          f"{kv_bad} mismatching rows); tokens {'as expected' if tokens_ok else 'WRONG'}; "
          f"{len(remote_ok)} remote, {len(recomputed)} recomputed; blocks "
          f"{'all free' if not leaks else 'LEAKED'} ({st.num_free_blocks}/{total_blocks})")
    summary = {"completed": sum(1 for r in ntok if ntok[r] == args.max_tokens),
               "requests": len(ps), "kv_bytes_checked": kv_checked, "kv_mismatches": kv_bad,
               "tokens_ok": tokens_ok, "remote": len(remote_ok), "recomputed": len(recomputed),
               "free_blocks": st.num_free_blocks, "total_blocks": total_blocks,
               "reserved_blocks": kst.num_reserved_blocks, "prefill_exit": prc}
    if args.json:
        print("SUMMARY " + json.dumps(summary))
    ok = (kv_bad == 0 and tokens_ok and not leaks and summary["completed"] == len(ps))
    return 0 if ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", choices=["decode", "prefill"], default="decode")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--kill-prefill-after", type=int, default=0,
                    help="the prefill engine SIGKILLs itself after this many transfers")
    ap.add_argument("--die-after", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--kv-endpoint", default=None,
                    help="the prefill engine's KV endpoint (default: an ipc path in /tmp)")
    ap.add_argument("--prefill-budget", type=int, default=32)
    ap.add_argument("--prefill-step-delay", type=float, default=0.01,
                    help="seconds of simulated compute per prefill step")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.kv_endpoint is None:
        args.kv_endpoint = f"ipc:///tmp/tandem-pd-demo-{os.getpid()}.sock"
    if args.role == "prefill":
        run_prefill(args)
        return 0
    return run_decode(args)


if __name__ == "__main__":
    sys.exit(main())
