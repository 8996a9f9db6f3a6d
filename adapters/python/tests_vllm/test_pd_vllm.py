"""A prefill and a decode engine, each a TandemScheduler with a TandemConnector (scheduler
side) and a worker-side TandemConnector over host torch tensors, driven as vLLM's EngineCore
and model runner would: the prefill engine returns kv_transfer_params, the decode engine pulls
the prompt's KV, recomputes only the last prompt token, and decodes; every KV value of the
prompt on the decode side is the prefill side's, and both engines end with every block free."""
import time

import pytest

from conftest import make_configs, make_mro, make_requests

torch = pytest.importorskip("torch")
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from tandem.vllm import TandemScheduler  # noqa: E402
from tandem.vllm.connector import TandemConnector  # noqa: E402

LAYERS, NB, BS, H, D = 2, 64, 16, 2, 4


def value(tok, pos, layer, kv):
    base = (tok * 31 + pos * 7 + layer * 3 + kv) % 1000
    return torch.tensor([[base + h * 10 + d for d in range(D)] for h in range(H)],
                        dtype=torch.float16)


class Engine:
    def __init__(self, model, engine_id, listen=None):
        extra = {"kvx": {"heartbeat_ms": 50, "peer_timeout_ms": 1000}}
        if listen:
            extra["listen"] = listen
        ktc = KVTransferConfig(kv_connector="TandemConnector",
                               kv_connector_module_path="tandem.vllm.connector",
                               kv_role="kv_both", engine_id=engine_id,
                               kv_connector_extra_config=extra)
        # the KV cache group names the layers the worker registers (vLLM's KVCacheConfig
        # and its kv_caches dict agree; vLLM 0.34 hands the config to the worker connector)
        vc, kv = make_configs(model, num_blocks=NB, block_size=BS, kv_transfer_config=ktc,
                              enable_prefix_caching=False,
                              layer_names=[f"l{i}" for i in range(LAYERS)], num_kv_heads=H,
                              head_size=D, kv_dtype=torch.float16)
        self.sched = TandemScheduler(vllm_config=vc, kv_cache_config=kv, block_size=BS,
                                     structured_output_manager=StructuredOutputManager(vc))
        assert isinstance(self.sched.connector, TandemConnector)
        self.worker = TandemConnector(vc, KVConnectorRole.WORKER, kv)
        self.kv = {f"l{i}": torch.zeros((2, NB, BS, H, D), dtype=torch.float16)
                   for i in range(LAYERS)}
        self.worker.register_kv_caches(self.kv)
        self.blocks = {}

    def step(self):
        so: SchedulerOutput = self.sched.schedule()
        w = self.worker
        w.bind_connector_metadata(so.kv_connector_metadata)
        w.start_load_kv(None)
        for n in so.scheduled_new_reqs:
            self.blocks[n.req_id] = list(n.block_ids[0])
        c = so.scheduled_cached_reqs
        for rid, nb in zip(c.req_ids, c.new_block_ids):
            if nb is not None:
                self.blocks[rid] += list(nb[0])
        sampled, ids = [], list(so.num_scheduled_tokens)
        for rid in ids:      # the "model": write KV of the scheduled positions, sample
            r = self.sched.requests[rid]
            n = so.num_scheduled_tokens[rid]
            begin = r.num_computed_tokens - n
            toks = list(r.all_token_ids)
            for pos in range(begin, begin + n):
                blk = self.blocks[rid][pos // BS]
                for li, t in enumerate(self.kv.values()):
                    for kvi in (0, 1):
                        t[kvi, blk, pos % BS] = value(toks[pos], pos, li, kvi)
            sampled.append([(toks[-1] * 7 + len(toks)) % 5000 + 3]
                           if r.num_computed_tokens >= r.num_tokens else [])
        w.wait_for_save()
        w.clear_connector_metadata()
        s, rcv = w.get_finished(set())
        kvo = KVConnectorOutput(finished_sending=s, finished_recving=rcv,
                                invalid_block_ids=w.get_block_ids_with_load_errors())
        mro = make_mro(ids, sampled_token_ids=sampled, kv_connector_output=kvo)
        return so, self.sched.update_from_output(so, mro)


def outputs_of(eco):
    return [o for outs in eco.values() for o in outs.outputs]


def test_pd__tandem_scheduler_and_connector_end_to_end(tiny_model, tmp_path):
    P = Engine(tiny_model, "P", listen=f"ipc://{tmp_path}/p.sock")
    Dd = Engine(tiny_model, "D")
    try:
        preqs = make_requests(3, num_tokens=37, max_tokens=1, block_size=BS)
        for r in preqs:
            r.kv_transfer_params = {"do_remote_decode": True}
            P.sched.add_request(r)
        params = {}
        for _ in range(10):
            so, eco = P.step()
            for o in outputs_of(eco):
                if o.kv_transfer_params:
                    params[o.request_id] = o.kv_transfer_params
            if len(params) == 3:
                break
        assert sorted(params) == ["0", "1", "2"]
        p_blocks = {rid: list(P.blocks[rid]) for rid in params}

        dreqs = make_requests(3, num_tokens=37, max_tokens=5, block_size=BS)
        for r in dreqs:
            r.kv_transfer_params = dict(params[r.request_id])
            Dd.sched.add_request(r)
        produced = {r.request_id: [] for r in dreqs}
        first_new = {}
        t0 = time.monotonic()
        while Dd.sched.has_requests() or P.sched.has_requests():
            assert time.monotonic() - t0 < 30, "P/D did not finish"
            if P.sched.has_requests():
                P.step()
            so, eco = Dd.step()
            for n in so.scheduled_new_reqs:
                first_new.setdefault(n.req_id, n.num_computed_tokens)
            for o in outputs_of(eco):
                produced[o.request_id] += o.new_token_ids
            time.sleep(0.002)
        # The decode engine computed only the last prompt token itself.
        assert first_new == {"0": 36, "1": 36, "2": 36}
        assert all(len(v) == 5 for v in produced.values()), produced
        # Its prompt KV equals the prefill engine's.
        for r in dreqs:
            for pos in range(37):
                pb = p_blocks[r.request_id][pos // BS]
                db = Dd.blocks[r.request_id][pos // BS]
                for name in P.kv:
                    assert torch.equal(Dd.kv[name][:, db, pos % BS], P.kv[name][:, pb, pos % BS])
        for e in (P, Dd):
            st = e.sched.sched.stats()
            assert st.num_free_blocks == st.num_total_blocks, st
            assert st.num_held == 0
    finally:
        Dd.sched.shutdown()
        P.sched.shutdown()
        Dd.worker.shutdown()
        P.worker.shutdown()
