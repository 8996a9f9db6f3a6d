"""End-to-end token identity: vLLM's CPU build runs one workload with its own scheduler and
with tandem.vllm.TandemScheduler, and the greedy outputs must be identical token for token.

Offline `LLM` class (not the HTTP server): all prompts are added before the first step, so
the two runs see the same arrival order. Workload: ~50 prompts built from the local model's
word list: long ones (far over --max-num-batched-tokens, so chunked prefill), groups with a
shared prefix (prefix cache), prompts with stop strings, varied max_tokens; a KV cache of
num_gpu_blocks_override blocks of 32 tokens, too small for the batch, so requests are
preempted. Greedy (temperature 0): seeded sampling with chunked prefill crashes in vLLM 0.32
itself. Async scheduling is off in both runs, or on in both with TANDEM_E2E_ASYNC=1 (vLLM then
runs its AsyncScheduler and TandemScheduler its async mode; make test-vllm-e2e-async).

    python run_e2e.py MODEL_DIR           # both runs (one subprocess each), then compare
    python run_e2e.py MODEL_DIR --one vllm|tandem OUT.json   # one run (used by the above)

Then serve_load.py runs the OpenAI-compatible server with each scheduler under a concurrent
streaming load with client aborts (health, a final request, nothing left running).

Prints one line per check, the figures, and a closing `N passed, N failed`; exit 1 on failure.
"""
import json
import os
import random
import subprocess
import sys
import time

BLOCKS = 40          # 40 x 32 = 1280 tokens of KV for 16 sequences: preemption
ENGINE = dict(dtype="float32", block_size=32, max_model_len=1024, max_num_batched_tokens=128,
              max_num_seqs=16, num_gpu_blocks_override=BLOCKS, enforce_eager=True,
              async_scheduling=os.environ.get("TANDEM_E2E_ASYNC") == "1", enable_prefix_caching=True, disable_log_stats=False,
              gpu_memory_utilization=0.3,   # on CPU: the share of RAM reserved (the server passes it too)
              seed=0)


def workload():
    """(prompt, sampling kwargs) pairs; deterministic."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gen_model import WORDS
    rng = random.Random(7)
    words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    items = []
    for _ in range(8):                                   # long: 4-10 chunks of 128 tokens
        items.append((words(rng.randint(300, 800)), dict(max_tokens=rng.randint(8, 32))))
    for _ in range(3):                                   # shared prefixes, 6 each
        prefix = words(rng.randint(100, 300))
        for _ in range(6):
            items.append((prefix + " " + words(rng.randint(1, 40)),
                          dict(max_tokens=rng.randint(16, 48))))
    for _ in range(12):                                  # stop strings
        items.append((words(rng.randint(5, 60)),
                      dict(max_tokens=64, stop=rng.choice([["e"], ["or", "an"], ["t", "."]]))))
    for _ in range(12):                                  # short, longer outputs
        items.append((words(rng.randint(3, 30)), dict(max_tokens=rng.randint(64, 160),
                                                      ignore_eos=rng.random() < 0.8)))
    return items


def one_run(model, which, out):
    from vllm import LLM, SamplingParams
    kw = dict(ENGINE)
    if which == "tandem":
        kw["scheduler_cls"] = "tandem.vllm.TandemScheduler"
    llm = LLM(model=model, **kw)
    items = workload()
    params = [SamplingParams(temperature=0.0, **sp) for _, sp in items]
    t0 = time.monotonic()
    outs = llm.generate([p for p, _ in items], params, use_tqdm=False)
    wall = time.monotonic() - t0
    metrics = {}
    for m in llm.get_metrics():
        if m.name in ("vllm:num_preemptions", "vllm:prefix_cache_hits",
                      "vllm:prefix_cache_queries", "vllm:prompt_tokens"):
            metrics[m.name] = getattr(m, "value", None)
    res = [dict(prompt_len=len(o.prompt_token_ids), tokens=list(o.outputs[0].token_ids),
                finish=o.outputs[0].finish_reason, stop_reason=o.outputs[0].stop_reason)
           for o in outs]
    with open(out, "w") as f:
        json.dump(dict(wall_s=wall, metrics=metrics, outputs=res), f)


def main():
    model = sys.argv[1]
    if len(sys.argv) == 5 and sys.argv[2] == "--one":
        one_run(model, sys.argv[3], sys.argv[4])
        return 0
    work = os.path.dirname(os.path.abspath(model))
    runs = {}
    for which in ("vllm", "tandem"):
        out = os.path.join(work, f"e2e-{which}.json")
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, os.path.abspath(__file__), model, "--one", which,
                              out])
        print(f"e2e: {which} run exit {rc}, {time.monotonic() - t0:.1f} s with start-up",
              flush=True)
        runs[which] = json.load(open(out)) if rc == 0 else None
    checks = []
    check = lambda ok, what: checks.append((bool(ok), what))  # noqa: E731
    check(runs["vllm"] is not None, "vllm run completed")
    check(runs["tandem"] is not None, "tandem run completed")
    if runs["vllm"] and runs["tandem"]:
        a, b = runs["vllm"]["outputs"], runs["tandem"]["outputs"]
        check(len(a) == len(b) == len(workload()), f"both runs returned {len(a)} outputs")
        ntok = 0
        for i, (x, y) in enumerate(zip(a, b)):
            ntok += len(x["tokens"])
            same = (x["tokens"] == y["tokens"] and x["finish"] == y["finish"]
                    and x["stop_reason"] == y["stop_reason"])
            check(same, f"prompt {i} ({x['prompt_len']} tokens): {len(x['tokens'])} tokens, "
                        f"finish {x['finish']}/{y['finish']} identical" if same else
                        f"prompt {i}: vllm {x['tokens']} {x['finish']} != tandem {y['tokens']} "
                        f"{y['finish']}")
        ma, mb = runs["vllm"]["metrics"], runs["tandem"]["metrics"]
        check(max(x["prompt_len"] for x in a) > ENGINE["max_num_batched_tokens"],
              "some prompts need chunked prefill")
        check(any(isinstance(x["stop_reason"], str) for x in a),
              "some requests stopped on a stop string")
        check((ma.get("vllm:num_preemptions") or 0) > 0,
              f"the vllm run preempted ({ma.get('vllm:num_preemptions')})")
        check((ma.get("vllm:prefix_cache_hits") or 0) > 0,
              f"the vllm run hit the prefix cache ({ma.get('vllm:prefix_cache_hits')} tokens)")
        for ok, what in checks:
            print(("PASS " if ok else "FAIL ") + what)
        print(f"e2e figures: prompts compared {len(a)}, tokens compared {ntok}, "
              f"preemptions vllm {ma.get('vllm:num_preemptions')} tandem "
              f"{mb.get('vllm:num_preemptions')}, prefix-cache hit tokens vllm "
              f"{ma.get('vllm:prefix_cache_hits')} tandem {mb.get('vllm:prefix_cache_hits')}, "
              f"generate wall vllm {runs['vllm']['wall_s']:.2f} s tandem "
              f"{runs['tandem']['wall_s']:.2f} s")
    else:
        for ok, what in checks:
            print(("PASS " if ok else "FAIL ") + what)
    for which in ("vllm", "tandem"):         # the server: streaming load with client aborts
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, os.path.join(os.path.dirname(
            os.path.abspath(__file__)), "serve_load.py"), model, which],
            capture_output=True, text=True)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("PASS ", "FAIL "))]
        for ln in lines:
            print(ln)
            checks.append((ln.startswith("PASS "), ln[5:]))
        if r.returncode != 0 and not any(ln.startswith("FAIL ") for ln in lines):
            print(f"FAIL {which} server check exited {r.returncode}: {r.stderr[-300:]}")
            checks.append((False, f"{which} server check"))
        print(f"e2e: {which} server check {time.monotonic() - t0:.1f} s with start-up")
    npass = sum(ok for ok, _ in checks)
    print(f"{npass} passed, {len(checks) - npass} failed")
    return 0 if npass == len(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
