"""Tandem inside NVIDIA Dynamo's vLLM worker (`python -m dynamo.vllm`, ai-dynamo 1.6.1).

Scheduler: `--scheduler-cls tandem.vllm.TandemScheduler --no-async-scheduling`. Dynamo passes
the class to vLLM unchanged. Its KV router indexes Tandem's prefix cache from the KV events
TandemScheduler publishes through vLLM's kv_events_config (tandem/vllm/kv_events.py), and its
planner reads the ForwardPassMetrics TandemScheduler publishes on Dynamo's FPM socket when
Dynamo enables them (tandem/vllm/metrics.py). Dynamo 1.6.1 logs "InstrumentedScheduler will NOT
be injected" whenever forward-pass metrics are on and any --scheduler-cls is given (the check in
dynamo/vllm/args.py looks only at whether the flag is set); with TandemScheduler that line is
stale: the metrics are published all the same. Its --benchmark-mode accepts only a class path
containing "InstrumentedScheduler" (and raises a ValueError for TandemScheduler): for it, use
`--scheduler-cls tandem.vllm.dynamo.TandemInstrumentedScheduler`, a subclass of Dynamo's
InstrumentedScheduler that runs Dynamo's self-benchmark on vLLM's KV cache manager and then
schedules all real traffic with Tandem (tandem/vllm/dynamo_scheduler.py; this module resolves
the name lazily, so it imports without Dynamo).

Connector: Dynamo's disaggregated handler knows a connector by its KVTransferConfig name
(dynamo/vllm/kv_connector_protocols.py: NixlConnector, NeuronNixlConnector, MooncakeConnector,
LMCacheMPConnector; any other name is a ValueError) and has no registration call. TandemConnector
speaks NixlConnector's protocol (a pull: the prefill response's kv_transfer_params go to the
decode request unchanged, in NixlConnector's keys, tandem/vllm/params.py), so it is configured
under that name through vLLM's own external-module rule (a kv_connector_module_path is looked up
before vLLM's registry, and the class is the module's attribute of that name):

    --kv-transfer-config '{"kv_connector": "NixlConnector",
                           "kv_connector_module_path": "tandem.vllm.dynamo",
                           "kv_role": "kv_both", "engine_id": "prefill-0",
                           "kv_connector_extra_config": {"listen": "tcp://10.0.0.5:7600"}}'

Dynamo then picks its NixlConnectorProtocol and vLLM loads TandemConnector (this module's
NixlConnector is that class, not a copy). Names vLLM checks for NIXL-specific set-ups (decode
context parallel, DS conv-state layout for Mamba) see "NixlConnector" too; Tandem serves one
KV cache group of full attention, where those do not apply.
"""
from __future__ import annotations

from typing import Optional

from .connector import TandemConnector

#: TandemConnector under the name Dynamo's disaggregated flow accepts (see the module doc).
NixlConnector = TandemConnector

SCHEDULER_CLS = "tandem.vllm.TandemScheduler"
#: The --scheduler-cls for Dynamo's --benchmark-mode (and snapshot mode's set_fpm_worker_id).
INSTRUMENTED_SCHEDULER_CLS = __name__ + ".TandemInstrumentedScheduler"
CONNECTOR_MODULE = __name__


def __getattr__(name):
    if name == "TandemInstrumentedScheduler":
        try:
            import dynamo.vllm.instrumented_scheduler  # noqa: F401
        except ImportError as e:
            raise ImportError(
                "tandem.vllm.dynamo.TandemInstrumentedScheduler subclasses Dynamo's "
                "InstrumentedScheduler and needs the ai-dynamo package "
                f"(dynamo.vllm.instrumented_scheduler does not import: {e}); without Dynamo "
                "use tandem.vllm.TandemScheduler") from e
        from .dynamo_scheduler import TandemInstrumentedScheduler
        return TandemInstrumentedScheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def kv_transfer_config(engine_id: str, listen: Optional[str] = None,
                       kv_role: str = "kv_both", kvx: Optional[dict] = None) -> dict:
    """The --kv-transfer-config JSON object that runs TandemConnector under Dynamo."""
    extra: dict = {}
    if listen:
        extra["listen"] = listen
    if kvx:
        extra["kvx"] = dict(kvx)
    return {"kv_connector": "NixlConnector", "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": kv_role, "engine_id": engine_id, "kv_connector_extra_config": extra}


__all__ = ["NixlConnector", "TandemConnector", "kv_transfer_config", "SCHEDULER_CLS",
           "INSTRUMENTED_SCHEDULER_CLS"]
