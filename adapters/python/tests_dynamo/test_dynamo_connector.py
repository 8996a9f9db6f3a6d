"""TandemConnector in Dynamo's disaggregated flow (ai-dynamo 1.6.1), by NixlConnector's
protocol: configured as kv_connector "NixlConnector" with kv_connector_module_path
"tandem.vllm.dynamo" (tandem.vllm.dynamo.kv_transfer_config), Dynamo's parser accepts it for
--disaggregation-mode prefill and decode, Dynamo's make_kv_connector_protocol picks its
NixlConnectorProtocol and vLLM's KVConnectorFactory loads TandemConnector. Then a prefill and a
decode engine (TandemScheduler + TandemConnector, worker side over host tensors, as in
tests_vllm/test_pd_vllm.py) exchange a prompt's KV with the kv_transfer_params carried the way
Dynamo's handlers carry them: the prefill request's params from the protocol
(_update_kv_transfer_params into SamplingParams.extra_args), the prefill response's through
decode_request_kv_transfer_params and _build_disaggregated_params, a JSON round trip (Dynamo's
request plane), and into the decode request with _update_kv_transfer_params. The decode engine
computes only the last prompt token and holds the prefill engine's KV for every prompt
position. Under its own name, TandemConnector is refused by Dynamo (a ValueError)."""
import json
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")
dargs = pytest.importorskip("dynamo.vllm.args")
kcp = pytest.importorskip("dynamo.vllm.kv_connector_protocols")
handlers = pytest.importorskip("dynamo.vllm.handlers")

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.usage.usage_lib import UsageContext  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402

import test_pd_vllm as pd  # noqa: E402
from conftest import EOS_TOKEN_ID, make_configs  # noqa: E402

from tandem.vllm import TandemScheduler  # noqa: E402
from tandem.vllm.connector import TandemConnector  # noqa: E402
from tandem.vllm.dynamo import kv_transfer_config  # noqa: E402

BS, NB, PROMPT = pd.BS, pd.NB, 37


def parse(model, mode, engine_id, monkeypatch, listen=None):
    monkeypatch.delenv("DYN_FORWARDPASS_METRIC_PORT", raising=False)
    monkeypatch.delenv("DYN_FPM_TRACE", raising=False)
    ktc = kv_transfer_config(engine_id, listen=listen)
    config = dargs.parse_args(["--model", model, "--skip-tokenizer-init", "--max-model-len", "512",
                               "--scheduler-cls", "tandem.vllm.TandemScheduler",
                               "--no-async-scheduling", "--disaggregation-mode", mode,
                               "--kv-transfer-config", json.dumps(ktc)])
    return config.engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_connector__accepted_by_dynamo_as_nixl_protocol(tiny_model, monkeypatch, mode):
    vc = parse(tiny_model, mode, "E0", monkeypatch, listen="tcp://127.0.0.1:0")
    assert vc.kv_transfer_config.kv_connector == "NixlConnector"
    assert type(kcp.make_kv_connector_protocol(vc)) is kcp.NixlConnectorProtocol
    assert KVConnectorFactory.get_connector_class(vc.kv_transfer_config) is TandemConnector
    assert vc.scheduler_config.get_scheduler_cls() is TandemScheduler


def test_connector__own_name_is_refused_by_dynamo(tiny_model):
    ktc = KVTransferConfig(kv_connector="TandemConnector",
                           kv_connector_module_path="tandem.vllm.connector", kv_role="kv_both")
    with pytest.raises(ValueError, match="Unsupported kv_connector='TandemConnector'"):
        kcp.make_kv_connector_protocol(SimpleNamespace(kv_transfer_config=ktc))


class Engine(pd.Engine):
    """test_pd_vllm's engine, with TandemConnector configured as Dynamo runs it."""

    def __init__(self, model, engine_id, listen=None):
        ktc = KVTransferConfig(**kv_transfer_config(
            engine_id, listen=listen, kvx={"heartbeat_ms": 50, "peer_timeout_ms": 1000}))
        vc, kv = make_configs(model, num_blocks=NB, block_size=BS, kv_transfer_config=ktc,
                              enable_prefix_caching=False)
        self.vc = vc
        self.sched = TandemScheduler(vllm_config=vc, kv_cache_config=kv, block_size=BS,
                                     structured_output_manager=StructuredOutputManager(vc))
        assert isinstance(self.sched.connector, TandemConnector)
        self.worker = KVConnectorFactory.create_connector(config=vc, role=KVConnectorRole.WORKER,
                                                          kv_cache_config=kv)
        assert type(self.worker) is TandemConnector
        self.kv = {f"l{i}": torch.zeros((2, NB, BS, pd.H, pd.D), dtype=torch.float16)
                   for i in range(pd.LAYERS)}
        self.worker.register_kv_caches(self.kv)
        self.blocks = {}


def request(i, sp):
    sp.update_from_generation_config({}, EOS_TOKEN_ID)
    return Request(request_id=str(i), prompt_token_ids=[i + 5] * PROMPT, sampling_params=sp,
                   pooling_params=None, block_hasher=get_request_block_hasher(BS, sha256),
                   arrival_time=1000.0 + i)


def test_connector__prefill_to_decode_through_dynamos_handoff(tiny_model, tmp_path):
    init_none_hash(sha256)
    P = Engine(tiny_model, "P", listen=f"ipc://{tmp_path}/p.sock")
    D = Engine(tiny_model, "D")
    try:
        protocols = {}
        for i in range(3):
            proto = kcp.make_kv_connector_protocol(P.vc)      # one per request, as Dynamo does
            assert type(proto) is kcp.NixlConnectorProtocol
            sp = SamplingParams(max_tokens=1)
            handlers._update_kv_transfer_params(sp, proto.prefill_request_kv_transfer_params())
            r = request(i, sp)
            assert r.kv_transfer_params["do_remote_decode"] is True
            protocols[r.request_id] = proto
            P.sched.add_request(r)
        handoff = {}
        for _ in range(10):
            _, eco = P.step()
            for o in pd.outputs_of(eco):
                if o.kv_transfer_params:
                    res = SimpleNamespace(kv_transfer_params=o.kv_transfer_params,
                                          prompt_token_ids=[int(o.request_id) + 5] * PROMPT)
                    disagg = handlers.PrefillWorkerHandler._build_disaggregated_params(
                        None, protocols[o.request_id].decode_request_kv_transfer_params(res))
                    handoff[o.request_id] = json.loads(json.dumps(disagg))
            if len(handoff) == 3:
                break
        assert sorted(handoff) == ["0", "1", "2"]
        p_blocks = {rid: list(P.blocks[rid]) for rid in handoff}

        for rid, disagg in handoff.items():
            sp = SamplingParams(max_tokens=5)
            handlers._update_kv_transfer_params(sp, disagg["kv_transfer_params"])
            r = request(int(rid), sp)
            assert r.kv_transfer_params["do_remote_prefill"] is True
            D.sched.add_request(r)
        produced = {rid: [] for rid in handoff}
        first_new = {}
        t0 = time.monotonic()
        while D.sched.has_requests() or P.sched.has_requests():
            assert time.monotonic() - t0 < 30, "P/D did not finish"
            if P.sched.has_requests():
                P.step()
            so, eco = D.step()
            for n in so.scheduled_new_reqs:
                first_new.setdefault(n.req_id, n.num_computed_tokens)
            for o in pd.outputs_of(eco):
                produced[o.request_id] += o.new_token_ids
            time.sleep(0.002)
        assert first_new == {"0": PROMPT - 1, "1": PROMPT - 1, "2": PROMPT - 1}
        assert all(len(v) == 5 for v in produced.values()), produced
        for rid in handoff:
            for pos in range(PROMPT):
                pb = p_blocks[rid][pos // BS]
                db = D.blocks[rid][pos // BS]
                for name in P.kv:
                    assert torch.equal(D.kv[name][:, db, pos % BS], P.kv[name][:, pb, pos % BS])
        for e in (P, D):
            st = e.sched.sched.stats()
            assert st.num_free_blocks == st.num_total_blocks, st
    finally:
        for e in (D, P):
            e.sched.shutdown()
            e.worker.shutdown()
