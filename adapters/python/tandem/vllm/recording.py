"""vLLM's own scheduler, unchanged, writing the per-step CSV that `tandem fit` reads.

    vllm serve MODEL --scheduler-cls tandem.vllm.RecordingScheduler \\
        --additional-config '{"tandem": {"steps_csv": "steps.csv"}}'

The first step of the loop docs/simulator.md describes ("From the simulator to production"):
a deployment records the steps of the scheduler it runs today, `tandem fit` fits the
simulator's cost model to them, `tandem tune` picks a configuration on that model, and only
then does the engine switch to TandemScheduler. Every decision is vLLM's (the class is vLLM's
Scheduler, or its AsyncScheduler when async scheduling is on, as vLLM itself would choose);
the StepRecorder of steps_csv.py wraps schedule / update_from_output / shutdown of the
instance as it does TandemScheduler's, with the counts (running, waiting, KV usage) read from
vLLM's scheduler. Without a "tandem" entry nothing is recorded and nothing is wrapped. Any key
but steps_csv is refused at start-up, naming it (the Tandem scheduler's keys need
TandemScheduler).
"""
from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from .steps_csv import StepRecorder
from .tandem_config import recording_options


class _Counts:
    __slots__ = ("num_running", "num_waiting", "kv_usage")


def vllm_counts(sched, _c=_Counts()):
    """(num_running, num_waiting, kv_usage) of vLLM's scheduler, as its own metrics count them
    (get_request_counts where this vLLM has it: the KV-load queues of 0.34 wait too)."""
    counts = getattr(sched, "get_request_counts", None)
    if counts is not None:
        _c.num_running, _c.num_waiting = counts()
    else:
        _c.num_running = len(sched.running)
        _c.num_waiting = len(sched.waiting) + len(getattr(sched, "skipped_waiting", ()))
    _c.kv_usage = sched.kv_cache_manager.usage
    return _c


def _vllm_config(args, kwargs):
    return kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]


class RecordingScheduler(Scheduler):
    """vLLM's Scheduler (AsyncScheduler with async scheduling) recording its steps."""

    def __new__(cls, *args, **kwargs):
        if cls is RecordingScheduler and \
                _vllm_config(args, kwargs).scheduler_config.async_scheduling:
            cls = RecordingAsyncScheduler
        return super().__new__(cls)

    def __init__(self, *args, **kwargs):
        path = recording_options(_vllm_config(args, kwargs))   # refuses before vLLM allocates
        super().__init__(*args, **kwargs)
        self.steps_csv = path
        if path:
            StepRecorder(path, stats=vllm_counts).install(self)


class RecordingAsyncScheduler(RecordingScheduler, AsyncScheduler):
    """RecordingScheduler over vLLM's AsyncScheduler (chosen by RecordingScheduler itself)."""
