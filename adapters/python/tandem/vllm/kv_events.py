"""KV cache events of TandemScheduler published the way vLLM's Scheduler publishes its own.

vLLM's BlockPool queues BlockStored (when full blocks join the prefix cache), BlockRemoved
(one per cached block evicted) and AllBlocksCleared (reset_prefix_cache); its Scheduler takes
them at the end of update_from_output, wraps them in one KVEventBatch and hands it to the
publisher made by EventPublisherFactory from vllm_config.kv_events_config (ZMQ, or the null
publisher). Tandem's block pool records the same events at the same points (include/tandem.h,
tdm_sched_kv_events), with the digests it indexes, which are vLLM's own Request.block_hashes
when the adapter passes them; this module turns them into vLLM's event objects, adding what
only the host knows (LoRA id and name, extra keys, session id, the KV cache spec kind), and
publishes them. Fields a vLLM version does not have are left out (0.31 to 0.33).
"""
from __future__ import annotations

import time
from typing import Callable, List, Optional

import tandem
from tandem import KVEventKind


def _fields(cls) -> set:
    return set(getattr(cls, "__struct_fields__", ()))


class KVEventRelay:
    """Drains Tandem's events and publishes them as vLLM's KVEventBatch. `resolve(tid)` gives
    the vLLM Request of a Tandem request id (or None once it is gone)."""

    def __init__(self, vllm_config, kv_cache_config, sched: tandem.Scheduler,
                 resolve: Callable[[int], object]) -> None:
        from vllm.distributed.kv_events import EventPublisherFactory
        cfg = getattr(vllm_config, "kv_events_config", None)
        self.enabled = bool(cfg is not None and cfg.enable_kv_cache_events)
        dp = getattr(vllm_config.parallel_config, "data_parallel_index",
                     getattr(vllm_config.parallel_config, "data_parallel_rank", 0))
        self.publisher = EventPublisherFactory.create(cfg, dp)
        self.sched = sched
        self.resolve = resolve
        self._pending: list = []
        self._spec = self._spec_metadata(kv_cache_config)
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
        self._stored, self._removed, self._cleared = BlockStored, BlockRemoved, AllBlocksCleared
        self._stored_fields = _fields(BlockStored)
        self._removed_fields = _fields(BlockRemoved)
        try:
            from vllm.distributed.kv_events import MEDIUM_GPU
        except ImportError:
            MEDIUM_GPU = "GPU"
        self._medium = MEDIUM_GPU
        try:
            from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
        except ImportError:
            maybe_convert_block_hash = lambda h: h  # noqa: E731
        self._convert = maybe_convert_block_hash
        if self.enabled:
            sched.set_param("enable_kv_events", 1)

    @staticmethod
    def _spec_metadata(kv_cache_config):
        try:
            from vllm.v1.kv_cache_interface import (get_kv_cache_spec_kind,
                                                    get_kv_cache_spec_sliding_window)
        except ImportError:
            return None
        g = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        return get_kv_cache_spec_kind(g).value, get_kv_cache_spec_sliding_window(g)

    def publisher_config(self):
        """vLLM's SchedulerInterface.get_kv_event_publisher_config."""
        return self.publisher.get_publisher_config()

    def _extra_keys(self, request, first: int, n: int, bs: int) -> Optional[list]:
        try:
            from vllm.v1.core.kv_cache_utils import (generate_block_hash_extra_keys,
                                                     to_event_extra_keys)
        except ImportError:
            return None
        keys, mm = [], 0
        for i in range(first, first + n):
            k, mm = generate_block_hash_extra_keys(request, i * bs, (i + 1) * bs, mm)
            keys.append(k)
        return to_event_extra_keys(keys)

    def _convert_event(self, e):
        if e.kind == KVEventKind.ALL_CLEARED:
            return self._cleared()
        hashes = [self._convert(h) for h in e.block_hashes]
        if e.kind == KVEventKind.REMOVED:
            kw = dict(block_hashes=hashes, medium=self._medium, group_idx=0)
            return self._removed(**{k: v for k, v in kw.items() if k in self._removed_fields})
        request = self.resolve(e.req_id)
        lora = getattr(request, "lora_request", None) if request is not None else None
        kw = dict(block_hashes=hashes,
                  parent_block_hash=None if e.parent_block_hash is None
                  else self._convert(e.parent_block_hash),
                  token_ids=list(e.token_ids), block_size=e.block_size,
                  lora_id=lora.adapter_id if lora else None, medium=self._medium,
                  lora_name=lora.name if lora else None,
                  extra_keys=(self._extra_keys(request, e.first_block, len(hashes), e.block_size)
                              if request is not None else None),
                  group_idx=0, session_id=getattr(request, "session_id", None),
                  lookahead_token_ids=None)
        if self._spec is not None:
            kw["kv_cache_spec_kind"], kw["kv_cache_spec_sliding_window"] = self._spec
        return self._stored(**{k: v for k, v in kw.items() if k in self._stored_fields})

    def collect(self) -> None:
        """Drain Tandem's queue into the pending list (call it while the requests that stored
        blocks can still be resolved)."""
        if not self.enabled:
            return
        b = self.sched.kv_events()
        if b.overflowed:
            from vllm.logger import init_logger
            init_logger(__name__).warning(
                "Tandem's KV event queue overflowed: %d events lost (raise kv_events_capacity)",
                b.num_dropped)
        self._pending.extend(self._convert_event(e) for e in b.events)

    def take(self) -> List:
        """Collect, then return and clear the events of this step (vLLM's take_events)."""
        self.collect()
        ev, self._pending = self._pending, []
        return ev

    def publish(self, connector=None) -> None:
        """End of update_from_output: one KVEventBatch with this step's events, as vLLM's
        Scheduler (the KV connector's events appended after the pool's)."""
        events = self.take() if self.enabled else []
        take = getattr(connector, "take_events", None) if connector is not None else None
        connector_events = take() if take is not None else None
        if connector_events:
            events.extend(connector_events)
        if events:
            from vllm.distributed.kv_events import KVEventBatch
            self.publisher.publish(KVEventBatch(ts=time.time(), events=events))

    def shutdown(self) -> None:
        self.publisher.shutdown()
