"""Randomized differential test of TandemScheduler against vLLM's own Scheduler.

Each seed draws a workload (1-3000-token prompts, many sharing prefixes; arrivals spread over
the first steps; aborts; stop tokens, EOS and min_tokens; small KV caches on most seeds, the
priority policy, a long-prefill threshold, prefix caching off on some) and a configuration,
then drives each scheduler alone through it with the same simulated model runner:

  * the runner keeps a KV store (one fingerprint per block slot) and each request's block
    table, built only from what the SchedulerOutput says (new requests' block ids, cached
    requests' new block ids, resumed requests' replaced tables);
  * before computing a chunk it checks the fingerprints of every position the scheduler
    claims is already computed (the whole prefix for a new or resumed request: every prefix
    hit and every resumption is checked; the last position for a continuing one), then
    writes the fingerprints of the positions it computes; a fingerprint is a hash of all
    tokens up to and including that position, as a real KV entry depends on them all;
  * the sampled token is a function of the fingerprint read back from the KV store at the
    last position, so a wrong KV block gives a wrong token stream. EOS and stop tokens are
    emitted only once min_tokens is reached (vLLM's sampler masks them before).

Per step, the two traces must agree on: the scheduled request ids and token counts, the new
requests (block count, num_computed_tokens), the cached requests (new block count,
num_computed_tokens, num_output_tokens, whether all_token_ids is sent, resumed), the
preempted and finished ids, and the outputs (new tokens, finish reason, stop reason); at the
end, every request's token stream and finish reason. Only physical block ids may differ.

--async drives vLLM's AsyncScheduler and TandemScheduler with async scheduling on, in the call
order of EngineCore's batch queue (step_with_batch_queue, two batches): schedule() for step
N+1 comes before update_from_output() for step N, aborts are processed just before an update.
The model runner then keeps each request's tokens itself (the token a step samples feeds the
next step's placeholder position, as on the device), so a late output, a discarded one (a
request finished or aborted while its next step was in flight) and a stale one (preempted in
flight) all take their real path.

    python vllm_diff.py --seeds 300 [--first 0] [--show 3] [--async]   # divergences by cause
"""
from __future__ import annotations

import argparse
import collections
import random
import sys
from typing import Optional

from conftest import EOS_TOKEN_ID, make_configs, make_mro

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

STOP_IDS = (7, 8)
MAX_MODEL_LEN = 4096
_hash_ready = False


class KVError(AssertionError):
    """The scheduler told the model runner that KV was computed where it was not."""


# ---- the workload ----------------------------------------------------------------------------

def draw(seed: int) -> dict:
    """The configuration and the requests of one seed."""
    rng = random.Random(seed)
    bs = rng.choice((16, 16, 16, 32, 8))
    max_num_seqs = rng.choice((1, 2, 4, 8, 16, 32))
    budget = max(max_num_seqs, rng.choice((32, 64, 128, 256, 512, 1024, 2048, 4096)))
    cfg = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, block_size=bs,
               max_model_len=MAX_MODEL_LEN,
               enable_prefix_caching=rng.random() < 0.85,
               long_prefill_token_threshold=(rng.choice((16, 64, 100, 256, 1000))
                                             if rng.random() < 0.35 else 0),
               policy="priority" if rng.random() < 0.3 else "fcfs",
               # vLLM 0.33's default is on; off, admission takes the first chunk only
               sched_extra=dict(scheduler_reserve_full_isl=rng.random() < 0.6))
    prefixes = [[rng.randrange(100, 1100) for _ in range(rng.randint(8, 2000))]
                for _ in range(rng.randint(1, 4))]
    n = rng.randint(2, 40)
    spread = rng.choice((0, 5, 30))
    arrivals = sorted(rng.randint(0, spread) for _ in range(n))
    reqs = []
    for i in range(n):
        plen = rng.choice((rng.randint(1, 64), rng.randint(1, 600), rng.randint(1, 3000)))
        if rng.random() < 0.6:
            p = rng.choice(prefixes)
            k = min(plen, len(p), rng.choice((len(p), rng.randint(1, len(p)))))
            prompt = p[:k] + [rng.randrange(100, 1100) for _ in range(max(0, plen - k))]
        else:
            prompt = [rng.randrange(100, 1100) for _ in range(plen)]
        prompt = prompt[:3000]
        max_tokens = rng.choice((1, 2, rng.randint(1, 16), rng.randint(1, 64),
                                 rng.randint(1, 200)))
        reqs.append(dict(
            id=str(i), prompt=prompt, max_tokens=max_tokens,
            min_tokens=rng.randint(0, max_tokens) if rng.random() < 0.15 else 0,
            stop=list(STOP_IDS) if rng.random() < 0.4 else None,
            ignore_eos=rng.random() < 0.1,
            priority=rng.randint(0, 3) if cfg["policy"] == "priority" else 0,
            arrive=arrivals[i],
            abort=rng.randint(1, 60) if rng.random() < 0.15 else None,
            # how often this request samples EOS / a stop token (1 in k)
            eos_k=rng.choice((5, 20, 1000)), stop_k=rng.choice((7, 30, 1000))))
    need = max(-(-(len(r["prompt"]) + r["max_tokens"]) // bs) for r in reqs)
    if rng.random() < 0.8:   # small: preemption, eviction of cached prefixes
        cfg["num_blocks"] = rng.randint(need + 1, max(need + 2, 2 * need))
    else:
        cfg["num_blocks"] = 20000 // bs
    wrng = random.Random(seed * 7919 + 1)   # its own stream: the draws above stay as they were
    if wrng.random() < 0.2:   # vLLM's admission watermark (a fraction of the blocks)
        cfg["sched_extra"]["watermark"] = wrng.choice((0.01, 0.05, 0.1))
    # The options of vLLM 0.34 (older versions drop the config keys they lack), from a stream
    # of their own again: cache-aware admission, chunked prefill off (the long-prefill
    # threshold then ignored), per-request prefix-hit limits (prompt logprobs), and the
    # worker's outputs in another order than the scheduled one.
    xrng = random.Random(seed * 104729 + 3)
    if xrng.random() < 0.3:
        cfg["sched_extra"]["cache_aware_admission_window"] = xrng.choice((2, 4, 16, 64))
        cfg["sched_extra"]["cache_aware_admission_threshold"] = xrng.choice((0.0, 0.3, 0.5, 0.9))
    if xrng.random() < 0.15:
        cfg["enable_chunked_prefill"] = False
        cfg["max_num_batched_tokens"] = MAX_MODEL_LEN   # vLLM: >= max_model_len without it
    for r in reqs:
        if xrng.random() < 0.1:
            start = xrng.choice((None, 0, 16, 40, 200))
            r["prompt_logprobs"] = (1, start)
    shuffle = xrng.random() < 0.5
    # An async KV connector (FakeAsyncConnector) on some seeds, from a stream of its own: P/D
    # remote-prefill requests whose loads complete after a drawn number of steps, some
    # failing (one bad block), vLLM 0.34's --max-num-inflight-kv-loads drawn, and the load
    # failure policy.
    krng = random.Random(seed * 15485863 + 5)
    loads = None
    if krng.random() < 0.35:
        loads = dict(policy=krng.choice(("recompute", "recompute", "fail")))
        cfg["sched_extra"]["max_num_inflight_kv_loads"] = krng.choice((None, None, 1, 2, 4, 16))
        for r in reqs:
            if krng.random() < 0.5:
                r["load"] = dict(delay=krng.choice((0, 1, 1, 2, 3, 5, 9)),
                                 fail=krng.random() < 0.2, bad=krng.random())
    return dict(seed=seed, cfg=cfg, reqs=reqs, shuffle=shuffle, loads=loads)


def make_request(spec: dict, block_size: int) -> Request:
    global _hash_ready
    if not _hash_ready:
        init_none_hash(sha256)
        _hash_ready = True
    kw = {}
    plp = spec.get("prompt_logprobs")
    if plp is not None:   # vLLM skips prefix-cache reads (0.34: up to prompt_logprob_start)
        kw["prompt_logprobs"] = plp[0]
        if plp[1] is not None and "prompt_logprob_start" in SamplingParams.__struct_fields__:
            kw.update(prompt_logprob_start=plp[1], skip_reading_prefix_cache=False)
    sp = SamplingParams(max_tokens=spec["max_tokens"], min_tokens=spec["min_tokens"],
                        stop_token_ids=spec["stop"], ignore_eos=spec["ignore_eos"], **kw)
    if spec.get("load") is not None:   # P/D decode side: the prompt's KV comes from a peer
        sp.extra_args = {"kv_transfer_params": {"do_remote_prefill": True}}
    sp.update_from_generation_config({}, EOS_TOKEN_ID)
    return Request(request_id=spec["id"], prompt_token_ids=list(spec["prompt"]),
                   sampling_params=sp, pooling_params=None,
                   block_hasher=get_request_block_hasher(block_size, sha256),
                   arrival_time=1000.0 + int(spec["id"]) * 1e-3, priority=spec["priority"])


# ---- the fake async KV connector -------------------------------------------------------------

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1, KVConnectorMetadata)


class FakeAsyncConnector(KVConnectorBase_V1):
    """A P/D decode-side connector (as NIXL's): a request with do_remote_prefill loads the
    rest of its prompt past the local prefix hit asynchronously, once (a retry after a failed
    load recomputes). The scheduler-side instance records each load's blocks; the Runner
    completes them (writing their KV fingerprints) after the drawn number of steps and
    reports them in KVConnectorOutput, a failed one with one invalid block."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.started: dict = {}       # req_id -> (block ids, first external token, prompt len)
        self.new_loads: list = []     # started since the runner last looked

    @property
    def requires_kv_delivery(self) -> bool:
        # It only loads; it hands no KV off when a request completes (vLLM's default for a
        # kv_consumer). True would make vLLM drop, at a preemption, the output of a step in
        # flight, which the library delivers (docs/adapters.md).
        return False

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        params = request.kv_transfer_params or {}
        if not params.get("do_remote_prefill") or request.request_id in self.started:
            return 0, False
        count = len(request.prompt_token_ids) - num_computed_tokens
        return count, count > 0

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        params = request.kv_transfer_params or {}
        if num_external_tokens > 0 and params.get("do_remote_prefill") and \
                request.request_id not in self.started:
            n = len(request.prompt_token_ids)
            self.started[request.request_id] = (list(blocks.get_block_ids()[0]),
                                                n - num_external_tokens, n)
            self.new_loads.append(request.request_id)

    def build_connector_meta(self, scheduler_output):
        return KVConnectorMetadata()

    def request_finished(self, request, block_ids):
        return False, None

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass


def kv_transfer_config(loads: dict):
    from vllm.config import KVTransferConfig
    kw = {}
    if "kv_load_failure_policy" in getattr(KVTransferConfig, "__dataclass_fields__", {}):
        kw["kv_load_failure_policy"] = loads["policy"]
    return KVTransferConfig(kv_connector="FakeAsyncConnector", kv_role=loads.get("role", "kv_both"),
                            kv_connector_module_path="vllm_diff", **kw)


# ---- the simulated model runner --------------------------------------------------------------

class Runner:
    """A model runner that keeps only fingerprints: see the module doc."""

    def __init__(self, num_blocks: int, block_size: int, specs: dict, own_tokens: bool = False,
                 shuffle_seed: Optional[int] = None):
        self.bs = block_size
        # shuffle_seed: outputs in a shuffled order, when the model runner output has no
        # req_id_to_index (vLLM 0.34: the scheduler looks ids up itself)
        self.shuffle = random.Random(shuffle_seed) if shuffle_seed is not None else None
        # own_tokens (async): the runner's token list per request (prompt + every token it
        # sampled), not the scheduler's, which lags a step behind.
        self.own = {} if own_tokens else None
        self.kv = [[None] * block_size for _ in range(num_blocks)]
        self.tables: dict[str, list[int]] = {}
        self.fps: dict[str, list[int]] = {}
        self.specs = specs
        self.checked_positions = 0
        self.step = 0
        self.loads_due: dict = {}   # req_id -> (step due, blocks, first, prompt len, bad index)
        self.load_starts: list = []  # (step, req_id) of every load the scheduler started

    def _fp(self, rid: str, tokens, upto: int) -> list:
        fp = self.fps.setdefault(rid, [])
        while len(fp) < upto:
            p = len(fp)
            fp.append(hash((fp[-1] if p else 0x5eed, tokens[p])))
        return fp

    def _read(self, rid: str, p: int):
        t = self.tables[rid]
        b = p // self.bs
        if b >= len(t):
            raise KVError(f"request {rid}: position {p} is beyond its {len(t)} blocks")
        return self.kv[t[b]][p % self.bs]

    def loads_pending(self) -> bool:
        return bool(self.loads_due)

    def _connector_output(self, sched):
        """Start the loads the scheduler began this step, complete those due: their KV is
        written up to the first bad block of a failed one, which is reported invalid."""
        conn = getattr(sched, "connector", None)
        if conn is None or not isinstance(conn, KVConnectorBase_V1) or \
                not hasattr(conn, "new_loads"):
            return None
        for rid in conn.new_loads:
            blocks, first, n = conn.started[rid]
            ld = self.specs[rid]["load"]
            bad = None
            if ld["fail"]:
                lo, hi = first // self.bs, -(-n // self.bs)
                bad = lo + int(ld["bad"] * (hi - lo))
            self.loads_due[rid] = (self.step + ld["delay"], blocks, first, n, bad)
            self.load_starts.append((self.step, rid))
        conn.new_loads.clear()
        done = [rid for rid, v in self.loads_due.items() if v[0] <= self.step]
        if not done:
            return None
        invalid = set()
        for rid in done:
            _, blocks, first, n, bad = self.loads_due.pop(rid)
            upto = n if bad is None else min(n, bad * self.bs)
            fp = self._fp(rid, self.specs[rid]["prompt"], n)
            for p in range(first, upto):
                self.kv[blocks[p // self.bs]][p % self.bs] = fp[p]
            if bad is not None:
                invalid.add(blocks[bad])
        from vllm.v1.outputs import KVConnectorOutput
        return KVConnectorOutput(finished_recving=set(done), invalid_block_ids=invalid)

    def run(self, sched, so) -> ModelRunnerOutput:
        kvo = self._connector_output(sched)
        self.step += 1
        c = so.scheduled_cached_reqs
        first: dict[str, int] = {}
        for n in so.scheduled_new_reqs:
            self.tables[n.req_id] = list(n.block_ids[0])
            first[n.req_id] = n.num_computed_tokens
            self._check_prefill_ids(sched, n)
        resumed = set(getattr(c, "resumed_req_ids", ()))
        for rid, nb, nc in zip(c.req_ids, c.new_block_ids, c.num_computed_tokens):
            if rid in resumed:
                self.tables[rid] = list(nb[0]) if nb is not None else []
                first[rid] = nc
            else:
                if nb is not None:
                    self.tables.setdefault(rid, []).extend(nb[0])
                first[rid] = -nc - 1   # continuing: only the last position is checked
        req_ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            n = so.num_scheduled_tokens[rid]
            f = first[rid]
            nc = f if f >= 0 else -f - 1
            if self.own is not None:
                toks = self.own.setdefault(rid, list(self.specs[rid]["prompt"]))
                if nc + n > len(toks):   # every earlier step has run: its token is here
                    raise KVError(f"request {rid}: positions up to {nc + n} scheduled with "
                                  f"{len(toks)} tokens sampled so far")
                num_out = len(toks) - len(self.specs[rid]["prompt"])
            else:
                r = sched.requests[rid]
                toks = r.all_token_ids
                num_out = r.num_output_tokens
            fp = self._fp(rid, toks, nc + n)
            check = range(nc) if f >= 0 else range(max(0, nc - 1), nc)
            for p in check:
                got = self._read(rid, p)
                if got != fp[p]:
                    raise KVError(f"request {rid}: the KV at position {p} is not its prefix's "
                                  f"(computed {nc}, {'new/resumed' if f >= 0 else 'continuing'})")
            self.checked_positions += len(check)
            t = self.tables[rid]
            for p in range(nc, nc + n):
                b = p // self.bs
                if b >= len(t):
                    raise KVError(f"request {rid}: no block for position {p} ({len(t)} blocks)")
                self.kv[t[b]][p % self.bs] = fp[p]
            if nc + n >= len(toks):     # reached the end: a token is sampled
                tok = self._sample(rid, num_out, self._read(rid, len(toks) - 1))
                sampled.append([tok])
                if self.own is not None:
                    toks.append(tok)
            else:
                sampled.append([])
        if self.shuffle is not None and len(req_ids) > 1:
            # vLLM 0.34: the worker's output order may differ from the scheduled order
            order = list(range(len(req_ids)))
            self.shuffle.shuffle(order)
            req_ids = [req_ids[i] for i in order]
            sampled = [sampled[i] for i in order]
        if kvo is not None:
            return make_mro(req_ids, sampled, kv_connector_output=kvo)
        return make_mro(req_ids, sampled)

    def _check_prefill_ids(self, sched, n) -> None:
        """NewRequestData.prefill_token_ids (vLLM 0.34; the V2 runner's before): the tokens
        the worker prefills from, which must be the request's own (prompt, then outputs)."""
        ids = getattr(n, "prefill_token_ids", None)
        if ids is None:
            return
        toks = (self.own.get(n.req_id) if self.own is not None else None)
        if toks is None:
            toks = (list(self.specs[n.req_id]["prompt"]) if self.own is not None
                    else list(sched.requests[n.req_id].all_token_ids))
        ids = list(ids)
        if len(ids) < n.num_computed_tokens or ids != list(toks[:len(ids)]):
            raise KVError(f"request {n.req_id}: prefill_token_ids ({len(ids)}) are not its "
                          f"tokens ({len(toks)}, computed {n.num_computed_tokens})")

    def _sample(self, rid: str, k: int, fp: int) -> int:
        spec = self.specs[rid]
        h = (fp * 0x9E3779B97F4A7C15) >> 7 & 0xFFFFFFFF
        if k >= spec["min_tokens"]:
            if k == spec["max_tokens"] - 1 and h % 3 == 0:   # a stop on the max_tokens-th token
                return EOS_TOKEN_ID if (h >> 3) % 2 or not spec["stop"] else spec["stop"][0]
            if h % spec["eos_k"] == 1:
                return EOS_TOKEN_ID
            if spec["stop"] and h % spec["stop_k"] == 2:
                return spec["stop"][h % 2]
        return 100 + (h >> 4) % 30000


# ---- driving ---------------------------------------------------------------------------------

def norm_outputs(eco) -> dict:
    outs = {}
    for o in (x for e in eco.values() for x in e.outputs):
        outs[o.request_id] = (list(o.new_token_ids),
                              None if o.finish_reason is None else str(o.finish_reason),
                              o.stop_reason)
    return outs


def norm_step(so, eco) -> dict:
    c = so.scheduled_cached_reqs
    all_ids = getattr(c, "all_token_ids", None) or {}
    outs = norm_outputs(eco) if eco is not None else {}
    return {
        "preempted": sorted(so.preempted_req_ids or ()),
        "new": {n.req_id: (len(n.block_ids[0]), n.num_computed_tokens)
                for n in so.scheduled_new_reqs},
        "scheduled": dict(sorted(so.num_scheduled_tokens.items())),
        "cached": {rid: (None if b is None else len(b[0]), nc, no, rid in all_ids)
                   for rid, b, nc, no in zip(c.req_ids, c.new_block_ids, c.num_computed_tokens,
                                             c.num_output_tokens)},
        "resumed": sorted(getattr(c, "resumed_req_ids", ())),
        "finished": sorted(so.finished_req_ids),
        "outputs": outs,
    }


TANDEM_OVERRIDES: dict = {}   # --tandem-config: library keys over the adapter's translation
ASYNC_KV_CONSUMER = True      # --async-kv-producer: declare the connector a producer in async
PP = 1                        # --pp N: N pipeline stages (batches in flight: EngineCore's)


def make_sched(kind: str, model: str, cfg: dict, loads: Optional[dict] = None):
    if loads is not None:
        cfg = dict(cfg, kv_transfer_config=kv_transfer_config(loads))
    pp = cfg.get("pp", 1)
    cfg = {k: v for k, v in cfg.items() if k != "pp"}
    vc, kv = make_configs(model, **cfg)
    if pp > 1:   # pipeline stages: EngineCore keeps max_concurrent_batches batches in flight
        vc.parallel_config.pipeline_parallel_size = pp
    kw = dict(vllm_config=vc, kv_cache_config=kv, log_stats=True, block_size=cfg["block_size"],
              structured_output_manager=StructuredOutputManager(vc))
    if kind == "vllm":
        return AsyncScheduler(**kw) if cfg.get("async_scheduling") else Scheduler(**kw)
    from tandem.vllm import TandemScheduler
    return TandemScheduler(**kw, tandem_config=dict(TANDEM_OVERRIDES) or None)


def collect(outputs: dict, streams: dict, reasons: dict) -> None:
    """Append one update's tokens to the streams and record the finish reasons."""
    for rid, (toks, fin, _) in outputs.items():
        streams[rid].extend(toks)
        if fin is not None:
            reasons[rid] = fin


def run_result(kind, sched, runner, trace, streams, reasons, error, preemptions, **extra) -> dict:
    """The end of a drive: Tandem must have finished every request; shut it down."""
    if kind != "vllm" and error is None and sched.get_num_unfinished_requests():
        error = "requests left unfinished"
    if hasattr(sched, "shutdown") and kind != "vllm":
        sched.shutdown()
    return dict(trace=trace, streams=dict(streams), reasons=reasons, error=error,
                preemptions=preemptions, checked=runner.checked_positions,
                load_starts=runner.load_starts, **extra)


def drive(kind: str, model: str, work: dict, max_steps: int = 6000, async_: bool = False) -> dict:
    if async_:
        return drive_async(kind, model, work, max_steps)
    cfg = work["cfg"]
    sched = make_sched(kind, model, cfg, work.get("loads"))
    specs = {r["id"]: r for r in work["reqs"]}
    runner = Runner(cfg["num_blocks"], cfg["block_size"], specs,
                    shuffle_seed=work["seed"] if work.get("shuffle") else None)
    pending = collections.deque(sorted(work["reqs"], key=lambda r: (r["arrive"], int(r["id"]))))
    aborts = collections.defaultdict(list)
    for r in work["reqs"]:
        if r["abort"] is not None:
            aborts[r["arrive"] + r["abort"]].append(r["id"])
    trace, streams, reasons, preemptions = [], collections.defaultdict(list), {}, 0
    error = None
    step = 0
    try:
        while step < max_steps:
            while pending and pending[0]["arrive"] <= step:
                sched.add_request(make_request(pending.popleft(), cfg["block_size"]))
            if not pending and not sched.has_requests() and not runner.loads_pending():
                break
            so = sched.schedule()
            eco = sched.update_from_output(so, runner.run(sched, so))
            s = norm_step(so, eco)
            preemptions += len(s["preempted"])
            collect(s["outputs"], streams, reasons)
            trace.append(s)
            if step in aborts:
                sched.finish_requests(aborts[step], RequestStatus.FINISHED_ABORTED)
                for rid in aborts[step]:
                    reasons.setdefault(rid, "abort")
            step += 1
        else:
            error = f"did not finish in {max_steps} steps"
    except KVError as e:
        error = f"KV check: {e}"
    return run_result(kind, sched, runner, trace, streams, reasons, error, preemptions)


def drive_async(kind: str, model: str, work: dict, max_steps: int = 6000) -> dict:
    """EngineCore's step_with_batch_queue with two batches (async scheduling): one iteration
    schedules a batch (and runs it on the runner) unless nothing is schedulable, and then,
    when two batches are in flight or nothing new was scheduled, takes the oldest one's
    output to update_from_output. Arrivals and aborts are processed at the start of an
    iteration (EngineCore's input queue), so an abort often hits a request whose step is in
    flight. Each trace entry is one schedule() with the outputs of its own update."""
    cfg = dict(work["cfg"], async_scheduling=True, pp=PP)
    loads = work.get("loads")
    if loads is not None and not ASYNC_KV_CONSUMER:
        # --async-kv-producer: the connector declared a producer (it still hands nothing off:
        # requires_kv_delivery is False), so that vLLM 0.33+ frees blocks at once instead of
        # deferring them while a step is in flight (defer_block_free, which the library
        # reproduces with its defer_block_free; the default kv_both role is a consumer).
        loads = dict(loads, role="kv_producer")
    sched = make_sched(kind, model, cfg, loads)
    # EngineCore's batch queue: max_concurrent_batches (2; pp + 1 with PP, or pp on vLLM
    # 0.31-0.33's Model Runner V1)
    qsize = sched.vllm_config.max_concurrent_batches
    specs = {r["id"]: r for r in work["reqs"]}
    runner = Runner(cfg["num_blocks"], cfg["block_size"], specs, own_tokens=True,
                    shuffle_seed=work["seed"] if work.get("shuffle") else None)
    pending = collections.deque(sorted(work["reqs"], key=lambda r: (r["arrive"], int(r["id"]))))
    aborts = collections.defaultdict(list)
    for r in work["reqs"]:
        if r["abort"] is not None:
            aborts[r["arrive"] + r["abort"]].append(r["id"])
    trace, streams, reasons, preemptions = [], collections.defaultdict(list), {}, 0
    error = None
    queue: collections.deque = collections.deque()
    it = overlapped = 0
    try:
        while it < max_steps:
            while pending and pending[0]["arrive"] <= it:
                sched.add_request(make_request(pending.popleft(), cfg["block_size"]))
            if it in aborts:
                sched.finish_requests(aborts[it], RequestStatus.FINISHED_ABORTED)
                for rid in aborts[it]:
                    reasons.setdefault(rid, "abort")
            if not pending and not sched.has_requests() and not queue and \
                    not runner.loads_pending():
                break
            if sched.has_requests() or runner.loads_pending():
                overlapped += bool(queue)    # scheduled while the previous step is in flight
                so = sched.schedule()
                out = runner.run(sched, so)
                entry = norm_step(so, None)
                preemptions += len(entry["preempted"])
                trace.append(entry)
                queue.appendleft((so, out, entry))
                if len(queue) < qsize and (so.total_num_scheduled_tokens > 0 or
                                            sched.has_requests()):
                    it += 1
                    continue
            elif not queue:
                it += 1
                continue
            so, out, entry = queue.pop()
            entry["outputs"] = norm_outputs(sched.update_from_output(so, out))
            collect(entry["outputs"], streams, reasons)
            it += 1
        else:
            error = f"did not finish in {max_steps} iterations"
    except KVError as e:
        error = f"KV check: {e}"
    return run_result(kind, sched, runner, trace, streams, reasons, error, preemptions,
                      overlapped=overlapped)


# ---- comparison ------------------------------------------------------------------------------

def classify(a: dict, b: dict, work: dict) -> list:
    """The causes, [(cause, detail)], of the differences between two runs ([] when they
    agree): the finish reasons of requests whose token streams agree (a reason changes no
    schedule), and the first step where the schedules differ."""
    if a["error"]:
        return [("vllm-error", a["error"])]
    if b["error"]:
        return [("tandem-error", b["error"])]
    out = []
    same = [r for r, t in a["streams"].items() if b["streams"].get(r) == t]
    fin = {r: (a["reasons"].get(r), b["reasons"].get(r)) for r in same
           if a["reasons"].get(r) != b["reasons"].get(r)}
    if fin:
        out.append(("finish-reason", f"request: (vllm, tandem) {dict(list(fin.items())[:6])}"))
    for i, (x, y) in enumerate(zip(a["trace"], b["trace"])):
        if x == y:
            continue
        key = next(k for k in ("preempted", "new", "scheduled", "cached", "resumed", "finished",
                               "outputs") if x[k] != y[k])
        detail = f"step {i} {key}: vllm {x[key]} tandem {y[key]}"
        if key == "outputs":
            tx = {k: v[0] for k, v in x[key].items()}
            ty = {k: v[0] for k, v in y[key].items()}
            if tx == ty:
                continue    # finish / stop reasons only: counted above
            out.append(("tokens", detail))
        elif key == "preempted":
            out.append(("preempt-extra" if len(y[key]) > len(x[key]) else "preempt-missing",
                        detail))
        elif key == "new":
            if set(x["new"]) != set(y["new"]):
                out.append(("admit-extra" if len(y["new"]) > len(x["new"]) else "admit-fewer",
                            detail))
            elif ({k: v[1] for k, v in x["new"].items()} ==
                  {k: v[1] for k, v in y["new"].items()}):
                out.append(("chunk-size", detail))    # same hit, other block count
            else:
                out.append(("prefix-hit", detail))
        elif key == "scheduled":
            out.append(("running-set" if set(x[key]) != set(y[key]) else "chunk-size", detail))
        else:
            out.append((key, detail))
        return out
    if len(a["trace"]) != len(b["trace"]):
        out.append(("length", f"{len(a['trace'])} vs {len(b['trace'])} steps"))
    elif a["streams"] != b["streams"]:
        out.append(("streams", ""))
    elif a["reasons"] != b["reasons"] and not out:
        out.append(("reasons", f"vllm {a['reasons']} tandem {b['reasons']}"))
    return out


def run_seed(model: str, seed: int, async_: bool = False) -> dict:
    work = draw(seed)
    a = drive("vllm", model, work, async_=async_)
    b = drive("tandem", model, work, async_=async_)
    return dict(seed=seed, diff=classify(a, b, work), preempt=(a["preemptions"], b["preemptions"]),
                overlapped=(a.get("overlapped", 0), b.get("overlapped", 0)),
                steps=(len(a["trace"]), len(b["trace"])), checked=(a["checked"], b["checked"]),
                cfg=work["cfg"], loads=work.get("loads") is not None)


def tiny_model_dir() -> str:
    import json
    import tempfile
    from conftest import TINY
    d = tempfile.mkdtemp(prefix="tiny-opt-")
    with open(f"{d}/config.json", "w") as f:
        json.dump(TINY, f)
    return d


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--show", type=int, default=2, help="details shown per cause")
    ap.add_argument("--async", dest="async_", action="store_true",
                    help="async scheduling (AsyncScheduler, one-step-lagged updates)")
    ap.add_argument("--async-kv-consumer", action="store_true",
                    help="async: the fake connector keeps its kv_both (consumer) role, so vLLM "
                         "defers block frees (the default)")
    ap.add_argument("--async-kv-producer", action="store_true",
                    help="async: the fake connector is declared a producer (no deferred frees)")
    ap.add_argument("--pp", type=int, default=1,
                    help="async: pipeline_parallel_size (the batch queue holds "
                         "max_concurrent_batches: pp + 1, or pp on 0.31-0.33's MRV1)")
    ap.add_argument("--tandem-config", default="{}",
                    help="JSON: library keys set over the adapter's translation")
    ns = ap.parse_args(argv)
    import json
    TANDEM_OVERRIDES.update(json.loads(ns.tandem_config))
    global ASYNC_KV_CONSUMER, PP
    ASYNC_KV_CONSUMER = ns.async_kv_consumer or not ns.async_kv_producer
    PP = ns.pp
    if PP > 1 and not ns.async_:
        ap.error("--pp needs --async (TandemScheduler runs PP with async scheduling only)")
    import vllm
    model = tiny_model_dir()
    causes = collections.defaultdict(list)
    pv = pt = bad = ov = nl = 0
    for seed in range(ns.first, ns.first + ns.seeds):
        r = run_seed(model, seed, ns.async_)
        nl += r["loads"]
        pv += r["preempt"][0]
        pt += r["preempt"][1]
        ov += r["overlapped"][1]
        bad += bool(r["diff"])
        for cause, detail in r["diff"]:
            causes[cause].append((seed, detail, r["cfg"]))
    print(f"vllm_diff vllm={vllm.__version__} {'async' if ns.async_ else 'sync'}"
          f"{f' pp={PP}' if PP > 1 else ''} "
          f"seeds={ns.seeds} divergent={bad} overlapped_schedules={ov} "
          f"preemptions vllm={pv} tandem={pt} kv_load_seeds={nl}")
    for cause, items in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        print(f"  {cause}: {len(items)} seeds ({', '.join(str(s) for s, _, _ in items[:12])}"
              f"{', ...' if len(items) > 12 else ''})")
        for seed, detail, cfg in items[:ns.show]:
            print(f"    seed {seed} {cfg}\n      {detail[:600]}")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
