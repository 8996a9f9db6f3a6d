#!/usr/bin/env python3
"""Per-step cost of TandemScheduler against vLLM's own Scheduler (the baseline, measured in
the same run): N running requests decoding (one token per step) after their prefill, the
schedule() + update_from_output() pair timed over many steps with hand-built outputs, as
EngineCore calls them. Prints a table; never fails on speed.

    make bench-vllm        (or: build/venv-vllm/bin/python adapters/python/tests_vllm/bench_sched.py)
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conftest  # noqa: E402
from conftest import make_configs, make_requests  # noqa: E402

from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from tandem.vllm import TandemScheduler  # noqa: E402


def build(cls, model, n):
    vc, kv = make_configs(model, max_num_seqs=max(n, 16), max_num_batched_tokens=max(8192, n),
                          num_blocks=20000)
    return cls(vllm_config=vc, kv_cache_config=kv, block_size=16, log_stats=False,
               structured_output_manager=StructuredOutputManager(vc))


def run(sched, n, steps):
    for r in make_requests(n, num_tokens=64, max_tokens=10 ** 6):
        sched.add_request(r)
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        so = sched.schedule()
        ids = list(so.num_scheduled_tokens)
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: j for j, r in enumerate(ids)},
                                sampled_token_ids=[[7]] * len(ids))
        sched.update_from_output(so, mro)
        if i >= 2:   # skip the prefill steps
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e6


def main():
    model = tempfile.mkdtemp(prefix="tiny-opt-")
    import json
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(conftest.TINY, f)
    print(f"{'running':>8} {'vLLM Scheduler us/step':>24} {'TandemScheduler us/step':>25} {'ratio':>6}")
    for n in (16, 64, 256):
        steps = 200
        base = run(build(Scheduler, model, n), n, steps)
        ours_s = build(TandemScheduler, model, n)
        ours = run(ours_s, n, steps)
        ours_s.shutdown()
        print(f"{n:>8} {base:>24.1f} {ours:>25.1f} {ours / base:>6.2f}")


if __name__ == "__main__":
    main()
