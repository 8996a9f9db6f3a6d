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
    bad, checked, steps, overlapped = [], 0, 0, 0
    for seed in range(first, first + count):
        r = vllm_diff.run_seed(tiny_model, seed, async_=True)
        checked += sum(r["checked"])
        steps += r["steps"][0]
        overlapped += min(r["overlapped"])
        for cause, detail in r["diff"]:
            bad.append(f"seed {seed} [{cause}] {r['cfg']}\n    {detail[:800]}")
    assert not bad, f"{len(bad)} difference(s) from vLLM's AsyncScheduler:\n" + "\n".join(bad)
    # not vacuous: KV positions checked, and schedules made while a step was in flight
    assert steps > count and checked > 0 and overlapped > count


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
