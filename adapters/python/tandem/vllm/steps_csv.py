"""Per-step records of a real vLLM engine, in the CSV `tandem sim --steps-csv` writes.

TandemScheduler installs a StepRecorder when the Tandem configuration names a file
(`--additional-config '{"tandem": {"steps_csv": "steps.csv"}}'`, tandem_config.py), and so does
RecordingScheduler (recording.py: vLLM's own scheduler, unchanged, recording the same rows, so a
deployment is calibrated before it runs Tandem). One row
per step that computed tokens, with the columns of the simulator's CSV (docs/simulator.md):

    instance,role,step,start_s,duration_s,prefill_tokens,prefill_reqs,decode_reqs,
    decode_context_tokens,batch_tokens,running,waiting,kv_usage,preemptions,emit_seqs,
    prefill_attn

classified as the simulator classifies a batch entry (sim/engine.c): a decode computes one
token of a request that already has output and samples (its context, computed + 1, counts in
decode_context_tokens); anything else is a prefill chunk (prefill_attn sums
chunk * (computed + chunk / 2)); emit_seqs counts the entries that sample. duration_s is the
wall time measured from the step's schedule() call to the return of its update_from_output()
(the engine's forward pass, sampling and both scheduler calls: the period of a synchronous
engine loop); start_s counts from the first recorded step. `tandem fit` fits the table cost
model to such a file.

The recorder wraps the scheduler instance's schedule / update_from_output / shutdown (nothing
is wrapped when no file is configured, so the default path costs nothing); rows go through a
1 MiB write buffer, flushed every flush_rows rows, every second, when the engine has no
request left, and at shutdown. Its own time per step is measured, logged at shutdown and
written to PATH.recorder.json whenever the engine goes idle ({"rows", "recorder_us_per_step",
"scheduler_s": the time so far inside the wrapped scheduler's schedule and update calls}).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Optional

HEADER = ("instance,role,step,start_s,duration_s,prefill_tokens,prefill_reqs,decode_reqs,"
          "decode_context_tokens,batch_tokens,running,waiting,kv_usage,preemptions,emit_seqs,"
          "prefill_attn\n")

_log = logging.getLogger("tandem.vllm")


def step_shape(num_scheduled: dict, requests: dict) -> tuple:
    """(prefill_tokens, prefill_reqs, decode_reqs, decode_ctx, emit_seqs, prefill_attn) of a
    step just scheduled, from SchedulerOutput.num_scheduled_tokens and the vLLM Requests after
    the scheduler's optimistic advance (num_computed_tokens already counts the step's tokens;
    a request that samples is not a prefill chunk and, under async scheduling, holds one
    output placeholder more)."""
    pt = pr = dr = dctx = emit = 0
    attn = 0.0
    get = requests.get
    for rid, n in num_scheduled.items():
        r = get(rid)
        if r is None:
            continue
        if not r.is_prefill_chunk:     # it samples
            emit += 1
            if n == 1:
                # had output before this step: the async placeholder of this step excluded
                ph = r.num_output_placeholders
                if r.num_output_tokens + (ph - 1 if ph > 0 else 0) > 0:
                    dr += 1
                    dctx += r.num_computed_tokens       # computed before + 1
                    continue
        c = r.num_computed_tokens - n
        pt += n
        pr += 1
        attn += n * (c + n / 2.0)
    return pt, pr, dr, dctx, emit, attn


class StepRecorder:
    """Writes one CSV row per step of the scheduler it is installed on (see the module doc)."""

    def __init__(self, path: str, flush_rows: int = 4096, clock=time.perf_counter, stats=None):
        self.path = path
        try:
            self._f = open(path, "w", encoding="ascii", buffering=1 << 20)
        except OSError as e:
            from .tandem_config import TandemConfigError
            raise TandemConfigError(f"tandem.steps_csv: cannot write {path}: {e.strerror}") from None
        self._f.write(HEADER)
        self._clock = clock
        self._flush_rows = max(1, int(flush_rows))
        self._pending: deque = deque()    # (t_schedule, row prefix or None), per schedule()
        self._t0 = None
        self._rows = 0
        self._since_flush = 0
        self._last_flush = clock()
        self._own_s = 0.0                 # the recorder's own time (measured, logged)
        self._sched_s = 0.0               # time inside the scheduler's schedule + update calls
        self._st = None                   # (StatsC, tdm_sched_get_stats, its byref)
        if stats is not None:             # the counts of another scheduler (vLLM's own)
            self._stats = stats
        self._steps = 0

    def _stats(self, sched):
        """A TandemScheduler's counts (num_running, num_waiting, kv_usage) from the library
        (tdm_sched_get_stats into one reused struct: the Python Stats object costs a
        dataclass per step)."""
        if self._st is None:
            from ctypes import byref
            from tandem import _lib
            st = _lib.StatsC()
            _lib.fn("tdm_sched_stats_init")(byref(st))
            get = _lib.fn("tdm_sched_get_stats")
            self._st = (st, get, byref(st))
            self._h = None
        st, get, ref = self._st
        h = getattr(sched.sched, "handle", 0)
        if h != self._h:
            from ctypes import c_void_p
            self._h, self._hv = h, c_void_p(h)
        if not h or get(self._hv, ref) != 0:
            return sched.sched.stats()
        return st

    def install(self, sched) -> None:
        """Wrap sched's schedule, update_from_output and shutdown (instance attributes)."""
        schedule, update, shutdown = sched.schedule, sched.update_from_output, sched.shutdown
        clock = self._clock

        def rec_schedule(*args, **kwargs):
            t = clock()
            so = schedule(*args, **kwargs)
            t1 = clock()   # the scheduler's time ends and the recorder's begins: one read
            self._sched_s += t1 - t
            self.scheduled(sched, so, t, t1)
            return so

        def rec_update(scheduler_output, model_runner_output):
            t = clock()
            out = update(scheduler_output, model_runner_output)
            t1 = clock()
            self._sched_s += t1 - t
            self.updated(not sched.requests, t1)
            return out

        def rec_shutdown():
            try:
                self.close()
            finally:
                shutdown()

        sched.schedule = rec_schedule
        sched.update_from_output = rec_update
        sched.shutdown = rec_shutdown

    def scheduled(self, sched, so, t: float, now: Optional[float] = None) -> None:
        """Step scheduled at t (its output so); now: the clock already read after it."""
        a = self._clock() if now is None else now
        total = so.total_num_scheduled_tokens
        if not total:
            self._pending.append((t, None))
            self._own_s += self._clock() - a
            return
        if self._t0 is None:
            self._t0 = t
        pt, pr, dr, dctx, emit, attn = step_shape(so.num_scheduled_tokens, sched.requests)
        st = self._stats(sched)
        preempted = getattr(so, "preempted_req_ids", None) or ()
        self._steps += 1
        row = (self._steps, t - self._t0, pt, pr, dr, dctx, total, st.num_running,
               st.num_waiting, st.kv_usage, len(preempted), emit, attn)
        self._pending.append((t, row))
        self._own_s += self._clock() - a

    def updated(self, idle: bool = False, now: Optional[float] = None) -> None:
        """The oldest scheduled step was updated (now: the clock already read after it): its
        row is written; the buffer is flushed every flush_rows rows, every second, and when the
        engine has no request left (vLLM may kill the engine process at shutdown without
        calling shutdown())."""
        if not self._pending:
            return
        t1 = self._clock() if now is None else now
        t, row = self._pending.popleft()
        if row is None:
            return
        (step, start, pt, pr, dr, dctx, total, running, waiting, kv, pre, emit, attn) = row
        self._f.write(f"0,colocated,{step},{start:.6f},{t1 - t:.6f},{pt},{pr},{dr},{dctx},"
                      f"{total},{running},{waiting},{kv:.4f},{pre},{emit},{attn:.0f}\n")
        self._rows += 1
        self._since_flush += 1
        if idle or self._since_flush >= self._flush_rows or t1 - self._last_flush > 1.0:
            self._f.flush()
            self._since_flush = 0
            self._last_flush = t1
            if idle:
                self._write_cost()
        self._own_s += self._clock() - t1

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def us_per_step(self) -> float:
        """The recorder's own measured time per recorded step, in microseconds."""
        return self._own_s / self._rows * 1e6 if self._rows else 0.0

    def _write_cost(self) -> None:
        """PATH.recorder.json: the rows so far, the recorder's own time per step and the time
        spent inside the scheduler's schedule and update_from_output calls so far (part of
        every step's duration_s: how much of a step is the scheduler's own CPU), written when
        the engine goes idle and at close (vLLM may kill the engine process before its
        shutdown reaches the scheduler)."""
        try:
            with open(self.path + ".recorder.json", "w") as f:
                f.write(f'{{"rows": {self._rows}, "recorder_us_per_step": {self.us_per_step:.3f}, '
                        f'"scheduler_s": {self._sched_s:.6f}}}\n')
        except OSError:
            pass

    def close(self) -> None:
        if self._f is None:
            return
        self._f.close()
        self._f = None
        self._write_cost()
        _log.info("tandem steps_csv: %d rows to %s, recorder_us_per_step=%.1f", self._rows,
                  self.path, self.us_per_step)
