"""Tandem's KV events fed into Dynamo's own radix tree (dynamo._core.RadixTree, the index of
Dynamo's KV router) give the same overlap score for every probe prompt as Tandem's own prefix
lookup, after stores, evictions from a small pool and a cache reset. Tandem's lookup is read
from its behaviour: a probe added to an idle scheduler is scheduled with num_computed equal to
its prefix hit (capped so that the last prompt token is recomputed). Event conversion: a
block's ExternalSequenceBlockHash is the low 64 bits of Tandem's digest read big-endian (vLLM's
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES rule); its tokens_hash is Dynamo's own
compute_block_hash_for_seq over the event's token ids."""
import json
import random

import pytest

dynamo_core = pytest.importorskip("dynamo._core")
import tandem  # noqa: E402
from tandem import KVEventKind  # noqa: E402

BS = 8
WORKER = 1


def h64(digest: bytes) -> int:
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)


class Mirror:
    """Dynamo's radix tree fed with one Tandem worker's events."""

    def __init__(self):
        self.tree = dynamo_core.RadixTree()
        self.event_id = 0
        self.counts = {k: 0 for k in KVEventKind}

    def apply(self, batch):
        assert not batch.overflowed
        for e in batch.events:
            self.event_id += 1
            self.counts[e.kind] += 1
            if e.kind == KVEventKind.STORED:
                local = dynamo_core.compute_block_hash_for_seq(list(e.token_ids), BS)
                assert len(local) == len(e.block_hashes)
                data = {"stored": {
                    "parent_hash": None if e.parent_block_hash is None else h64(e.parent_block_hash),
                    "blocks": [{"block_hash": h64(h), "tokens_hash": t}
                               for h, t in zip(e.block_hashes, local)]}}
            elif e.kind == KVEventKind.REMOVED:
                data = {"removed": {"block_hashes": [h64(h) for h in e.block_hashes]}}
            else:
                data = "cleared"
            ev = {"event_id": self.event_id, "data": data, "dp_rank": 0}
            self.tree.apply_event(WORKER, json.dumps(ev).encode())

    def score(self, prompt):
        local = dynamo_core.compute_block_hash_for_seq(list(prompt), BS)
        return self.tree.find_matches(local).scores.get((WORKER, 0), 0)


def run_idle(s, now, token):
    while s.num_unfinished():
        b = s.step(now=now)
        s.update({rid: [token] for rid in b.req_ids if b.entry(rid).num_computed +
                  b.entry(rid).num_tokens >= len(s.request_tokens(rid))}, now=now + 0.001)
        now += 0.01
    return now


def test_dynamo_radix_tree__overlap_scores_equal_tandem_prefix_hits():
    rng = random.Random(1234)
    stems = [[rng.randrange(1000, 30000) for _ in range(6 * BS)] for _ in range(5)]
    m = Mirror()
    checked = hits = 0
    with tandem.Scheduler(block_size=BS, num_blocks=40, max_num_batched_tokens=512,
                          max_num_seqs=8, max_model_len=512, enable_kv_events=True) as s:
        now, rid = 1.0, 1
        for k in range(120):
            if k == 60:
                s.reset_prefix_cache()
                m.apply(s.kv_events())
                assert m.score(stems[0]) == 0
            stem = rng.choice(stems)
            prompt = stem[:rng.randrange(1, len(stem))] + [rng.randrange(1, 999)
                                                           for _ in range(rng.randrange(0, 12))]
            if len(prompt) < 2:
                prompt = prompt + [5, 6]
            expected = min(m.score(prompt), (len(prompt) - 1) // BS)
            s.add(id=rid, prompt=prompt, max_tokens=rng.randrange(1, 12))
            b = s.step(now=now)
            got = b.entry(rid).num_computed // BS
            assert got == expected, f"probe {k}: Tandem hit {got} blocks, Dynamo scores {expected}"
            checked += 1
            hits += got > 0
            s.update({rid: [rng.randrange(1, 999)]} if b.entry(rid).num_tokens >= len(prompt)
                     - b.entry(rid).num_computed else {}, now=now + 0.001)
            now = run_idle(s, now + 0.01, rng.randrange(1, 999))
            m.apply(s.kv_events())
            rid += 1
        assert s.stats().evictions > 0
    assert checked == 120 and hits > 20
    assert all(m.counts[k] > 0 for k in KVEventKind)
