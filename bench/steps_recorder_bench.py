"""The per-step cost of TandemScheduler's steps CSV recorder (tandem/vllm/steps_csv.py), in
CPU time (process_time, so that other processes on a loaded machine do not inflate it), for
decode steps of 1, 16 and 128 requests; the same-run baseline is one Scheduler.stats() call
(the dataclass the adapter's make_stats builds per step).

    TANDEM_LIBRARY=build/libtandem.so PYTHONPATH=adapters/python python3 bench/steps_recorder_bench.py
"""
import os
import tempfile
import time
from types import SimpleNamespace

import tandem
from tandem.vllm import steps_csv


def per_step(fn, n):
    t = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t) / n * 1e6


def main():
    s = tandem.Scheduler(block_size=16, num_blocks=64, max_num_batched_tokens=256,
                         max_num_seqs=128, max_model_len=256)
    d = tempfile.mkdtemp()
    base = per_step(s.stats, 20000)
    for k in (1, 16, 128):
        reqs = {str(i): SimpleNamespace(num_computed_tokens=100 + i, is_prefill_chunk=False,
                                        num_output_tokens=5, num_output_placeholders=0)
                for i in range(k)}
        fs = SimpleNamespace(requests=reqs, sched=s)
        so = SimpleNamespace(total_num_scheduled_tokens=k, num_scheduled_tokens={r: 1 for r in reqs},
                             preempted_req_ids=set())
        path = os.path.join(d, f"steps-{k}.csv")
        rec = steps_csv.StepRecorder(path)

        def step():
            rec.scheduled(fs, so, 0.0)
            rec.updated(False)
        us = per_step(step, 20000 if k < 128 else 4000)
        rec.close()
        os.unlink(path)
        os.unlink(path + ".recorder.json")
        print(f"steps_recorder decodes={k} cpu_us_per_step={us:.1f} "
              f"baseline_stats_cpu_us={base:.1f}")
    os.rmdir(d)
    s.close()


if __name__ == "__main__":
    main()
