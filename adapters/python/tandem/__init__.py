"""tandem: Python bindings (ctypes) for libtandem, the scheduling and KV-transfer layer of an
LLM serving engine.

    import tandem
    with tandem.Scheduler(block_size=16, num_blocks=1024) as s:
        s.add(tandem.Request(id=1, prompt=[1, 2, 3], max_tokens=4))
        batch = s.step()
        s.update({e.req_id: [42] for e in batch})

Importing checks the loaded library's ABI version (ImportError on a mismatch); see _lib for
how libtandem.so is found (TANDEM_LIBRARY first).
"""
from . import _lib
from .errors import Status, TandemError
from .scheduler import (Batch, BatchEntry, EntryKind, FinishReason, KVEvent, KVEventBatch,
                        KVEventKind, Mode, Param, Policy,
                        PrefixHash, RemoteKVFailure, Request, RequestInfo, RequestState,
                        RequestView, Role,
                        Scheduler, Stats, UpdateEntry, UpdateResult)
from .kvx import (DType, Event, EventType, KVLayout, KVTransfer, KVXStats, LayoutKind,
                  ScaleKind, host_cache)
from .kvx import Mode as KVMode

__version__ = "0.2.0"
#: The version of the loaded libtandem ("major.minor.patch").
library_version = _lib.library_version
#: The path libtandem was loaded from.
library_path = _lib.path
ABI_VERSION = _lib.ABI_VERSION


def has_scheduler() -> bool:
    """Whether the loaded library implements the scheduler (tdm_sched_*)."""
    return _lib.has("tdm_sched_create")


def has_kvx() -> bool:
    """Whether the loaded library implements the KV transfer engine (tdm_kvx_*)."""
    return _lib.has("tdm_kvx_create")


def strerror(status: int) -> str:
    return _lib.strerror(status)


__all__ = [
    "Batch", "BatchEntry", "EntryKind", "FinishReason", "KVEvent", "KVEventBatch", "KVEventKind",
    "Mode", "Param", "Policy", "PrefixHash",
    "RemoteKVFailure", "Request", "RequestInfo", "RequestState", "RequestView", "Role",
    "Scheduler", "Stats",
    "Status", "TandemError", "UpdateEntry", "UpdateResult", "__version__", "library_version",
    "library_path", "has_scheduler", "has_kvx", "strerror", "ABI_VERSION",
    "DType", "Event", "EventType", "KVLayout", "KVTransfer", "KVXStats", "LayoutKind",
    "host_cache", "KVMode", "ScaleKind",
]
