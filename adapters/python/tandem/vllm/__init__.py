"""vLLM drop-ins over libtandem (importing them requires the vllm package):

- TandemScheduler: vLLM v1's SchedulerInterface, `--scheduler-cls tandem.vllm.TandemScheduler`
  (with --no-async-scheduling).
- TandemConnector: KVConnectorBase_V1 over the Tandem KV transfer engine.
- RecordingScheduler: vLLM's own scheduler, unchanged, writing the per-step CSV `tandem fit`
  reads (`--scheduler-cls tandem.vllm.RecordingScheduler` and the "tandem" entry's steps_csv).

Attributes are imported lazily so that `import tandem.vllm` itself does not import vllm.
"""


def __getattr__(name):
    if name == "TandemScheduler":
        from .scheduler import TandemScheduler
        return TandemScheduler
    if name == "TandemConnector":
        from .connector import TandemConnector
        return TandemConnector
    if name == "RecordingScheduler":
        from .recording import RecordingScheduler
        return RecordingScheduler
    raise AttributeError(name)


__all__ = ["TandemScheduler", "TandemConnector", "RecordingScheduler"]
