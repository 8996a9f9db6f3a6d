"""TandemScheduler's KV cache events against vLLM's own Scheduler's on the same scenarios:
both run with kv_events_config set and publish through vLLM's EventPublisherFactory; a
capturing publisher (returned by the factory while the schedulers are built) records every KVEventBatch, and the events
(BlockStored, BlockRemoved, AllBlocksCleared with all their fields) must be equal batch for
batch and block for block. A second test runs vLLM's real ZmqEventPublisher and decodes what
a subscriber receives."""
import os

import pytest

from conftest import make_configs, make_requests
from test_vllm_compare import drive

from vllm.config.kv_events import KVEventsConfig
from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored,
                                        EventPublisher, EventPublisherFactory)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.structured_output import StructuredOutputManager

CAPTURED = {}


class CapturePublisher(EventPublisher):
    """Keeps the published batches under its topic (the test names one per scheduler)."""

    def __init__(self, data_parallel_rank=0, topic="", **_):
        self.batches = CAPTURED.setdefault(topic, [])

    def publish(self, events):
        self.batches.append(events)

    def shutdown(self):
        pass


def make(tiny_model, which, topic, **kw):
    """vLLM's Scheduler or TandemScheduler with KV events on; EventPublisherFactory.create
    (which both call) returns a capturing publisher for the duration of the constructor."""
    from tandem.vllm import TandemScheduler
    vc, kv = make_configs(tiny_model, **kw)
    vc.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="null",
                                         topic=topic)
    cls = Scheduler if which == "vllm" else TandemScheduler
    orig = EventPublisherFactory.__dict__["create"]
    EventPublisherFactory.create = classmethod(
        lambda c, config, rank=0: CapturePublisher(rank, topic=config.topic))
    try:
        return cls(vllm_config=vc, kv_cache_config=kv, log_stats=False,
                   block_size=kw.get("block_size", 16),
                   structured_output_manager=StructuredOutputManager(vc))
    finally:
        EventPublisherFactory.create = orig


def events_of(topic):
    return [list(b.events) for b in CAPTURED.pop(topic, [])]


def compare_events(tiny_model, sched_kw, reqs_fn, actions=None, **drive_kw):
    tag = f"{os.getpid()}-{id(reqs_fn)}"
    ref = make(tiny_model, "vllm", "ref" + tag, **sched_kw)
    ours = make(tiny_model, "tandem", "ours" + tag, **sched_kw)
    drive(ref, reqs_fn(), actions=actions, **drive_kw)
    drive(ours, reqs_fn(), actions=actions, **drive_kw)
    a, b = events_of("ref" + tag), events_of("ours" + tag)
    assert len(b) == len(a), f"{len(a)} batches from vLLM, {len(b)} from Tandem"
    for i, (x, y) in enumerate(zip(a, b)):
        assert y == x, f"batch {i} differs\nvllm:   {x}\ntandem: {y}"
    ours.shutdown()
    ref.shutdown()
    return a


def kinds(batches):
    return {type(e) for batch in batches for e in batch}


def test_kv_events__stores_with_shared_prefixes_and_decode_blocks(tiny_model):
    base = list(range(500, 540))
    prompts = [base + [1, 2, 3], base[:20] + [9] * 15, list(range(900, 925)), base + [7] * 9]
    batches = compare_events(
        tiny_model, dict(block_size=8, num_blocks=200, max_num_batched_tokens=64, max_model_len=256),
        lambda: make_requests(4, max_tokens=12, block_size=8, prompts=prompts))
    assert kinds(batches) == {BlockStored}
    stored = [e for batch in batches for e in batch]
    assert any(e.parent_block_hash is not None for e in stored)  # decode-filled blocks


def test_kv_events__evictions_and_reset(tiny_model):
    prompts = [list(range(100 + 40 * i, 100 + 40 * i + 29)) for i in range(6)]

    def reset(s):
        return s.reset_prefix_cache(reset_running_requests=True)

    batches = compare_events(
        tiny_model, dict(block_size=4, num_blocks=24, max_num_seqs=2, max_num_batched_tokens=64,
                         max_model_len=128),
        lambda: make_requests(6, max_tokens=6, block_size=4, prompts=prompts),
        actions={12: reset})
    assert kinds(batches) == {BlockStored, BlockRemoved, AllBlocksCleared}


def test_kv_events__disabled_publishes_nothing(tiny_model):
    from tandem.vllm import TandemScheduler
    vc, kv = make_configs(tiny_model, block_size=8)
    s = TandemScheduler(vllm_config=vc, kv_cache_config=kv, log_stats=False, block_size=8,
                        structured_output_manager=StructuredOutputManager(vc))
    drive(s, make_requests(2, num_tokens=20, max_tokens=3, block_size=8))
    assert s.sched.get_param("enable_kv_events") == 0
    assert s.get_kv_event_publisher_config() is None
    s.shutdown()


def test_kv_events__over_vllm_zmq_publisher(tiny_model, tmp_path):
    zmq = pytest.importorskip("zmq")
    import msgspec
    from vllm.distributed.kv_events import KVEventBatch
    from tandem.vllm import TandemScheduler
    endpoint = f"ipc://{tmp_path}/kv-events-{os.getpid()}"
    vc, kv = make_configs(tiny_model, block_size=8)
    vc.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                         endpoint=endpoint, topic="kv")
    s = TandemScheduler(vllm_config=vc, kv_cache_config=kv, log_stats=False, block_size=8,
                        structured_output_manager=StructuredOutputManager(vc))
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    import time
    time.sleep(0.3)  # the subscription reaches the publisher (PUB drops what comes before)
    drive(s, make_requests(1, num_tokens=20, max_tokens=3, block_size=8))
    dec = msgspec.msgpack.Decoder(type=KVEventBatch)
    got = []
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    while poller.poll(2000):
        parts = sub.recv_multipart()
        got.append(dec.decode(parts[-1]))
        if sum(len(b.events) for b in got) >= 1:
            break
    s.shutdown()
    sub.close(0)
    ctx.term()
    events = [e for b in got for e in b.events]
    assert len(events) == 1 and isinstance(events[0], BlockStored)
    assert len(events[0].block_hashes) == 2 and events[0].parent_block_hash is None
    assert events[0].token_ids == [0] * 16
