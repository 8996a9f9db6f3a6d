#!/usr/bin/env python3
"""Per-step cost of TandemScheduler against vLLM's own Scheduler (the baseline, measured in
the same process): N running requests decoding one token per step (steady state, after their
prefill), log_stats on, the schedule() + update_from_output() pair timed over many steps with
hand-built ModelRunnerOutputs, as EngineCore calls them. Prints a table and one summary line

    vllm_bench ratio256=R ratio1024=R ratio4096=R

(TandemScheduler's median time over vLLM's). Then the same with async scheduling on (vLLM's
AsyncScheduler against TandemScheduler in its async mode, in EngineCore's batch-queue order:
schedule() for step N+1, then update_from_output() for step N, the pair timed):

    vllm_bench_async ratio256=R ratio1024=R ratio4096=R

(VLLM_BENCH_ASYNC=0 skips it). Never fails on speed. Times are the process's CPU time
(VLLM_BENCH_CLOCK=wall: wall time), medians over the steps.

    make bench-vllm        (or: build/venv-vllm/bin/python adapters/python/tests_vllm/bench_sched.py)
"""
import gc
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conftest  # noqa: E402
from conftest import make_configs, make_mro, make_requests  # noqa: E402

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from tandem.vllm import TandemScheduler  # noqa: E402

PROMPT = 64
# The clock: the process's CPU time by default, which other jobs on a loaded machine do not
# stretch (wall time stretches a long step, which the OS preempts more often, more than a
# short one, and so flatters the faster scheduler); VLLM_BENCH_CLOCK=wall for wall time.
CLOCK_NAME = os.environ.get("VLLM_BENCH_CLOCK", "cpu")
CLOCK = time.perf_counter if CLOCK_NAME == "wall" else time.process_time


def build(cls, model, n, steps, async_scheduling=False):
    # Every prompt is prefilled in the first step (a budget of n * PROMPT tokens), so that all
    # requests decode in lockstep and the pool never runs out (no preemption in the timing).
    blocks_per_req = (PROMPT + steps + 8) // 16 + 2
    vc, kv = make_configs(model, max_num_seqs=n, max_num_batched_tokens=max(8192, n * PROMPT),
                          max_model_len=2048, num_blocks=n * blocks_per_req + 16,
                          async_scheduling=async_scheduling)
    return cls(vllm_config=vc, kv_cache_config=kv, block_size=16, log_stats=True,
               structured_output_manager=StructuredOutputManager(vc))


def run(sched, n, steps):
    for r in make_requests(n, num_tokens=PROMPT, max_tokens=10 ** 6):
        sched.add_request(r)
    times = []
    ids = None
    mro = None
    while len(times) < steps:
        t0 = CLOCK()
        so = sched.schedule()
        if so.total_num_scheduled_tokens == n and mro is not None:   # decode steady state
            sched.update_from_output(so, mro)
            times.append(CLOCK() - t0)
            continue
        ids = list(so.num_scheduled_tokens)
        reqs = sched.requests
        sampled = [[7] if reqs[r].num_computed_tokens >= reqs[r].num_tokens else []
                   for r in ids]
        out = make_mro(ids, sampled_token_ids=sampled)
        sched.update_from_output(so, out)
        if len(ids) == n and all(sampled):
            mro = out
    times.sort()
    return times[len(times) // 2] * 1e6


def run_async(sched, n, steps):
    """schedule() for step N+1, then update_from_output() for step N (EngineCore's batch queue
    of two); the pair is timed once both steps are decode steps of all n requests."""
    for r in make_requests(n, num_tokens=PROMPT, max_tokens=10 ** 6):
        sched.add_request(r)
    times = []
    prev = None
    mro = None
    while len(times) < steps:
        t0 = CLOCK()
        so = sched.schedule()
        if prev is not None:
            sched.update_from_output(*prev)
        dt = CLOCK() - t0
        decode = so.total_num_scheduled_tokens == n
        if decode and mro is not None and prev[0].total_num_scheduled_tokens == n:
            times.append(dt)
            prev = (so, mro)
            continue
        ids = list(so.num_scheduled_tokens)
        reqs = sched.requests
        sampled = [[7] if not reqs[r].is_prefill_chunk else [] for r in ids]
        out = make_mro(ids, sampled_token_ids=sampled)
        if decode and all(sampled):
            mro = out
        prev = (so, out)
    times.sort()
    return times[len(times) // 2] * 1e6


def main():
    model = tempfile.mkdtemp(prefix="tiny-opt-")
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(conftest.TINY, f)
    sizes = [int(x) for x in os.environ.get("VLLM_BENCH_SIZES", "256,1024,4096").split(",")]
    import vllm
    print(f"vllm {vllm.__version__}, {CLOCK_NAME} time (VLLM_BENCH_CLOCK=cpu|wall)")
    print(f"{'running':>8} {'vLLM Scheduler us/step':>24} {'TandemScheduler us/step':>25} {'ratio':>6}")
    ratios = {}
    for n in sizes:
        steps = max(20, 40000 // n)
        gc.collect()
        ref = build(Scheduler, model, n, steps)
        base = run(ref, n, steps)
        ref.shutdown()
        del ref
        gc.collect()
        ours_s = build(TandemScheduler, model, n, steps)
        ours = run(ours_s, n, steps)
        ours_s.shutdown()
        del ours_s
        ratios[n] = ours / base
        print(f"{n:>8} {base:>24.1f} {ours:>25.1f} {ours / base:>6.3f}", flush=True)
    print("vllm_bench " + " ".join(f"ratio{n}={r:.3f}" for n, r in ratios.items()), flush=True)
    if os.environ.get("VLLM_BENCH_ASYNC", "1") == "0":
        return
    print(f"{'running':>8} {'AsyncScheduler us/step':>24} {'TandemScheduler async':>25} {'ratio':>6}")
    ratios = {}
    for n in sizes:
        steps = max(20, 40000 // n)
        gc.collect()
        ref = build(AsyncScheduler, model, n, steps, async_scheduling=True)
        base = run_async(ref, n, steps)
        ref.shutdown()
        del ref
        gc.collect()
        ours_s = build(TandemScheduler, model, n, steps, async_scheduling=True)
        ours = run_async(ours_s, n, steps)
        ours_s.shutdown()
        del ours_s
        ratios[n] = ours / base
        print(f"{n:>8} {base:>24.1f} {ours:>25.1f} {ours / base:>6.3f}", flush=True)
    print("vllm_bench_async " + " ".join(f"ratio{n}={r:.3f}" for n, r in ratios.items()))


if __name__ == "__main__":
    main()
