"""The Tandem configuration of a vLLM engine, from vLLM's own command line.

vLLM carries `--additional-config` (VllmConfig.additional_config, a dict) to the EngineCore
process (the whole VllmConfig goes there; checked in 0.32, 0.33 and 0.34, and the field
predates 0.31), so that is the channel:

    vllm serve MODEL --scheduler-cls tandem.vllm.TandemScheduler \\
        --additional-config '{"tandem": {"policy": "slo_adaptive", "slo_ttft_ms": 300,
                                         "slo_tpot_ms": 25}}'
    vllm serve MODEL ... --additional-config '{"tandem": "best.json"}'
    vllm serve MODEL ... --additional-config '{"tandem": {"config": "best.json",
                                                          "steps_csv": "steps.csv"}}'

The value of "tandem" is a path (a JSON file as `tandem sim`, `ab` and `tune --out` read and
write: the library's scheduler JSON, or the wrapper {"name", "description", "scheduler",
"deployment"}) or an object of
  - "config": such a path, applied first;
  - the library's scheduler keys (tdm_sched_configure: "policy", "mode", "tbt_target_ms",
    "slo_ttft_ms", "slo_tpot_ms", "policy_plugin", "cost_model", ...), applied over the file;
  - the adapter's own keys: "steps_csv" (a path: the per-step CSV of steps_csv.py).

Keys that vLLM's own options also set are reconciled with the engine vLLM built, or refused
with a message naming the key and the vLLM option: the KV cache layout (block_size,
max_model_len, async_scheduling, num_lookahead_tokens, prefix_hash) must be vLLM's; the
worker's buffers bound max_num_batched_tokens, max_num_seqs and num_blocks (Tandem may use
less, not more); scheduling choices (chunked prefill, long-prefill threshold, prefix caching,
policy, mode, SLOs, cost model) are Tandem's. Any other bad value fails start-up with the
library's message, which names the key. Without a "tandem" entry nothing changes: the
configuration is exactly tandem_config_from_vllm's (vLLM's own behaviour).
"""
from __future__ import annotations

import json
import os
from typing import Optional, Tuple

# Keys of the "tandem" object that are the adapter's, not the library's.
ADAPTER_KEYS = ("config", "steps_csv")

# Keys whose value must be the one vLLM's engine runs with, and the vLLM option that sets it.
_MUST_EQUAL = {
    "block_size": "--block-size",
    "max_model_len": "--max-model-len",
    "async_scheduling": "--async-scheduling / --no-async-scheduling",
    "num_lookahead_tokens": "--speculative-config",
    "prefix_hash": "--prefix-caching-hash-algo",
}
# Keys bounded by what vLLM's worker allocated: Tandem may use less, never more.
_AT_MOST = {
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
    "num_blocks": "the KV cache vLLM allocated (--gpu-memory-utilization, "
                  "--num-gpu-blocks-override, VLLM_CPU_KVCACHE_SPACE)",
}
# Wrapper keys of a `tandem sim` config file.
_WRAPPER_KEYS = ("name", "description", "scheduler", "deployment")


class TandemConfigError(ValueError):
    """A Tandem configuration that cannot run on this vLLM engine (the message names the key)."""


def options_from_vllm(vllm_config) -> Optional[dict]:
    """The "tandem" entry of vLLM's additional_config as an object (a bare path becomes
    {"config": path}); None when there is none."""
    extra = getattr(vllm_config, "additional_config", None)
    if not isinstance(extra, dict) or "tandem" not in extra:
        return None
    v = extra["tandem"]
    if isinstance(v, str):
        return {"config": v}
    if not isinstance(v, dict):
        raise TandemConfigError(f"additional_config.tandem: expected a path or an object, got "
                                f"{type(v).__name__}")
    return dict(v)


def read_config_file(path: str) -> dict:
    """The scheduler keys of a Tandem config file (the library's JSON or the sim wrapper)."""
    if not isinstance(path, str) or not path:
        raise TandemConfigError("tandem.config: expected the path of a JSON file")
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise TandemConfigError(f"tandem.config: cannot read {path}: {e.strerror}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise TandemConfigError(f"tandem.config: {path}:{e.lineno}:{e.colno}: invalid JSON: "
                                f"{e.msg}") from None
    if not isinstance(doc, dict):
        raise TandemConfigError(f"tandem.config: {path}: expected a JSON object")
    if "scheduler" not in doc and "deployment" not in doc:
        return doc      # the library's scheduler JSON itself
    for k in doc:
        if k not in _WRAPPER_KEYS:
            raise TandemConfigError(f"tandem.config: {path}: unknown key \"{k}\" (a wrapper has "
                                    f"{', '.join(_WRAPPER_KEYS)})")
    _check_deployment(path, doc.get("deployment"))
    sched = doc.get("scheduler", {})
    if not isinstance(sched, dict):
        raise TandemConfigError(f"tandem.config: {path}: \"scheduler\" must be an object")
    return dict(sched)


def _check_deployment(path: str, dep) -> None:
    """One vLLM engine is one colocated instance: a deployment of several instances or a
    disaggregated one is refused (hw, tp, router and precision describe the simulated
    machines and are not settings of this engine)."""
    if dep is None:
        return
    if not isinstance(dep, dict):
        raise TandemConfigError(f"tandem.config: {path}: \"deployment\" must be an object")
    mode = dep.get("mode", "colocated")
    if mode != "colocated":
        raise TandemConfigError(
            f"tandem.config: {path}: deployment.mode \"{mode}\": one vLLM engine is one "
            f"colocated instance (a disaggregated pair is two engines with a KV connector, "
            f"each given its pool's scheduler keys)")
    n = dep.get("instances", 1)
    if n != 1:
        raise TandemConfigError(
            f"tandem.config: {path}: deployment.instances {n}: one vLLM engine is one "
            f"instance (start {n} engines behind a router)")


def reconcile(base: dict, keys: dict) -> dict:
    """base (tandem_config_from_vllm's dict) with the scheduler keys applied, after checking
    the keys that overlap vLLM's options; raises TandemConfigError naming the key."""
    cfg = dict(base)
    if "policy_plugin" in keys and "policy" not in keys:
        cfg.pop("policy", None)    # the plug-in is the policy (vLLM's --scheduling-policy is not)
    for k, v in keys.items():
        if k in _MUST_EQUAL and k in base and v != base[k]:
            raise TandemConfigError(
                f"tandem.{k}: {json.dumps(v)} differs from this vLLM engine's {json.dumps(base[k])} "
                f"(set by {_MUST_EQUAL[k]}): start vLLM with the value instead, or drop the key")
        if k in _AT_MOST and k in base:
            if isinstance(v, bool) or not isinstance(v, int):
                raise TandemConfigError(f"tandem.{k}: expected an integer, got {json.dumps(v)}")
            if v > base[k]:
                raise TandemConfigError(
                    f"tandem.{k}: {v} exceeds this vLLM engine's {base[k]} ({_AT_MOST[k]}): "
                    f"vLLM's worker is sized for at most that; start vLLM with {v} or more")
        cfg[k] = v
    return cfg


def _steps_csv(v) -> str:
    """The steps_csv option: the path of the CSV to write."""
    if not isinstance(v, str) or not v:
        raise TandemConfigError("tandem.steps_csv: expected the path of the CSV to write")
    return v


def resolve(base: dict, options: Optional[dict]) -> Tuple[dict, dict]:
    """(the library configuration, the adapter's options) for a vLLM engine whose own
    configuration is base, given the "tandem" options (None: base unchanged, no options)."""
    if options is None:
        return dict(base), {}
    keys: dict = {}
    if "config" in options:
        keys.update(read_config_file(options["config"]))
    keys.update({k: v for k, v in options.items() if k not in ADAPTER_KEYS})
    adapter = {k: options[k] for k in ADAPTER_KEYS if k in options and k != "config"}
    if "steps_csv" in adapter:
        _steps_csv(adapter["steps_csv"])
    return reconcile(base, keys), adapter


def configure(vllm_config, base: dict) -> Tuple[dict, Optional[dict]]:
    """TandemScheduler's hook: (the library configuration, the adapter's options, None when
    vLLM's command line has no "tandem" entry: then the configuration is base itself)."""
    options = options_from_vllm(vllm_config)
    if options is None:
        return base, None
    return resolve(base, options)


def recording_options(vllm_config) -> Optional[str]:
    """RecordingScheduler's hook: the steps_csv path of the "tandem" entry (None: none). vLLM's
    own scheduler decides, so every other key is refused, naming it."""
    options = options_from_vllm(vllm_config)
    if options is None:
        return None
    for k in options:
        if k != "steps_csv":
            raise TandemConfigError(
                f"tandem.{k}: tandem.vllm.RecordingScheduler runs vLLM's own scheduler and only "
                f"records its steps (the one key it takes is steps_csv); Tandem's scheduler "
                f"settings need --scheduler-cls tandem.vllm.TandemScheduler")
    return _steps_csv(options.get("steps_csv"))


def create_scheduler(cfg: dict, adapter: Optional[dict]):
    """tandem.Scheduler(cfg); with a Tandem configuration from the command line (adapter not
    None), a refusal by the library becomes a start-up error naming the key (the library's
    message does), and the per-step CSV is opened before any request is served."""
    import tandem
    if adapter is None:
        return tandem.Scheduler(cfg)
    try:
        return tandem.Scheduler(cfg)
    except tandem.TandemError as e:
        raise TandemConfigError(f"TandemScheduler: the Tandem configuration was refused: "
                                f"{e.message or e}") from None
