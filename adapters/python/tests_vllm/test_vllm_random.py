"""The randomized differential test (vllm_diff.py) under pytest: TandemScheduler against vLLM's
own Scheduler on VLLM_DIFF_SEEDS random seeds (default 300; VLLM_DIFF_FIRST moves the range),
in groups so that a failure names its seeds. Every seed must give identical per-step
scheduling, outputs, token streams and finish reasons, and pass the simulated model runner's
KV fingerprint checks in both runs. The async variant does the same with vLLM's AsyncScheduler
and TandemScheduler with async scheduling on, driven in EngineCore's batch-queue order
(schedule N+1 before update N) on VLLM_DIFF_ASYNC_SEEDS seeds (default VLLM_DIFF_SEEDS)."""
import os

import pytest

import vllm_diff

SEEDS = int(os.environ.get("VLLM_DIFF_SEEDS", "300"))
FIRST = int(os.environ.get("VLLM_DIFF_FIRST", "0"))
GROUP = 30
GROUPS = [(FIRST + g, min(GROUP, FIRST + SEEDS - (FIRST + g))) for g in range(0, SEEDS, GROUP)]
ASYNC_SEEDS = int(os.environ.get("VLLM_DIFF_ASYNC_SEEDS", str(SEEDS)))
ASYNC_GROUPS = [(FIRST + g, min(GROUP, ASYNC_SEEDS - g)) for g in range(0, ASYNC_SEEDS, GROUP)]


@pytest.mark.parametrize("first,count", GROUPS, ids=[f"seeds{f}-{f + n - 1}" for f, n in GROUPS])
def test_random_workloads_match_vllm(tiny_model, first, count):
    bad, checked, steps = [], 0, 0
    for seed in range(first, first + count):
        r = vllm_diff.run_seed(tiny_model, seed)
        checked += sum(r["checked"])
        steps += r["steps"][0]
        for cause, detail in r["diff"]:
            bad.append(f"seed {seed} [{cause}] {r['cfg']}\n    {detail[:800]}")
    assert not bad, f"{len(bad)} difference(s) from vLLM:\n" + "\n".join(bad)
    # the runs were not vacuous: the runner checked KV positions and steps were taken
    assert steps > count and checked > 0


@pytest.mark.parametrize("first,count", ASYNC_GROUPS,
                         ids=[f"seeds{f}-{f + n - 1}" for f, n in ASYNC_GROUPS])
def test_random_workloads_match_vllm_async(tiny_model, first, count):
    check_async_seeds(tiny_model, first, count, "vLLM's AsyncScheduler")


def check_async_seeds(tiny_model, first, count, what):
    """Seeds first.. through both async schedulers: no difference, and not vacuous (KV
    positions checked, schedules made while a step was in flight)."""
    bad, checked, steps, overlapped = [], 0, 0, 0
    for seed in range(first, first + count):
        r = vllm_diff.run_seed(tiny_model, seed, async_=True)
        checked += sum(r["checked"])
        steps += r["steps"][0]
        overlapped += min(r["overlapped"])
        for cause, detail in r["diff"]:
            bad.append(f"seed {seed} [{cause}] {r['cfg']}\n    {detail[:800]}")
    assert not bad, f"{len(bad)} difference(s) from {what}:\n" + "\n".join(bad)
    assert steps > count and checked > 0 and overlapped > count


PP_SEEDS = int(os.environ.get("VLLM_DIFF_PP_SEEDS", "60"))
PP_GROUPS = [(FIRST + g, min(GROUP, PP_SEEDS - g)) for g in range(0, PP_SEEDS, GROUP)]


@pytest.mark.parametrize("pp", [2, 3])
@pytest.mark.parametrize("first,count", PP_GROUPS,
                         ids=[f"seeds{f}-{f + n - 1}" for f, n in PP_GROUPS])
def test_random_workloads_match_vllm_async_pipeline_parallel(tiny_model, first, count, pp,
                                                             monkeypatch):
    """Async scheduling with pp pipeline stages: EngineCore keeps pp + 1 batches in flight and
    AsyncScheduler spaces a request's decodes by pp steps (next_decode_eligible_step); the
    adapter sets the library's decode_stagger (VLLM_DIFF_PP_SEEDS seeds, default 60)."""
    monkeypatch.setattr(vllm_diff, "PP", pp)
    check_async_seeds(tiny_model, first, count, f"vLLM's AsyncScheduler (pp={pp})")


def test_kv_check_catches_a_wrong_prefix(tiny_model):
    """The runner's fingerprint check fails when a scheduler claims KV it does not have."""
    work = vllm_diff.draw(3)
    work["cfg"].update(enable_prefix_caching=True, max_num_batched_tokens=2048, max_num_seqs=4,
                       long_prefill_token_threshold=0, block_size=16, num_blocks=100)
    work["reqs"] = [dict(work["reqs"][0], id="0", prompt=list(range(100, 164)), arrive=0,
                         abort=None, max_tokens=2, min_tokens=0),
                    dict(work["reqs"][0], id="1", prompt=list(range(100, 164)), arrive=1,
                         abort=None, max_tokens=2, min_tokens=0)]
    sched = vllm_diff.make_sched("vllm", tiny_model, work["cfg"])
    runner = vllm_diff.Runner(work["cfg"]["num_blocks"], work["cfg"]["block_size"],
                              {r["id"]: r for r in work["reqs"]})
    sched.add_request(vllm_diff.make_request(work["reqs"][0], work["cfg"]["block_size"]))
    so = sched.schedule()
    sched.update_from_output(so, runner.run(sched, so))
    # corrupt the KV of request 0's first block: request 1's prefix hit must be caught
    runner.kv[runner.tables["0"][0]][0] = "garbage"
    sched.add_request(vllm_diff.make_request(work["reqs"][1], work["cfg"]["block_size"]))
    so = sched.schedule()
    assert any(n.num_computed_tokens > 0 for n in so.scheduled_new_reqs)
    with pytest.raises(vllm_diff.KVError):
        runner.run(sched, so)


def test_kv_loads_start_while_batch_full(tiny_model):
    """The fake async KV connector exercises vLLM 0.34's load queue: with one running slot
    taken by a long request, --max-num-inflight-kv-loads 2 starts two loads (not three) before
    that request ends, and TandemScheduler starts the same loads at the same steps."""
    import vllm
    from vllm.config import SchedulerConfig
    if "max_num_inflight_kv_loads" not in getattr(SchedulerConfig, "__dataclass_fields__", {}):
        pytest.skip(f"vLLM {vllm.__version__} has no --max-num-inflight-kv-loads")
    work = vllm_diff.draw(3)
    work["cfg"].update(max_num_seqs=1, max_num_batched_tokens=256, num_blocks=400,
                       long_prefill_token_threshold=0, block_size=16, policy="fcfs")
    work["cfg"]["sched_extra"] = dict(max_num_inflight_kv_loads=2)
    base = dict(work["reqs"][0], min_tokens=0, stop=None, ignore_eos=True, abort=None,
                priority=0, eos_k=1000, stop_k=1000)
    base.pop("prompt_logprobs", None)
    work["reqs"] = [dict(base, id="0", prompt=list(range(100, 140)), arrive=0, max_tokens=30)]
    for i in (1, 2, 3):
        work["reqs"].append(dict(base, id=str(i), prompt=list(range(200 * i, 200 * i + 50)),
                                 arrive=2, max_tokens=2,
                                 load=dict(delay=3, fail=False, bad=0.0)))
    work["loads"] = dict(policy="recompute")
    a = vllm_diff.drive("vllm", tiny_model, work)
    b = vllm_diff.drive("tandem", tiny_model, work)
    assert a["error"] is None and b["error"] is None, (a["error"], b["error"])
    assert a["load_starts"] == b["load_starts"]
    early = [rid for step, rid in a["load_starts"] if step < 30]
    assert early == ["1", "2"], a["load_starts"]    # while 0 runs, under the cap of 2
    assert vllm_diff.classify(a, b, work) == []
