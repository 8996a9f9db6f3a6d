"""TandemConnector without a GPU: host-memory torch tensors in vLLM's FlashAttention layout,
scheduler-side and worker-side connectors of a prefill and a decode engine driven by hand
(as vLLM's scheduler and model runner would call them), every byte of the moved blocks
compared; and the failure path (an unreachable prefill engine) reporting load errors."""
import time

import pytest

from conftest import make_configs, make_requests

torch = pytest.importorskip("torch")
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from tandem.vllm.connector import TandemConnector, request_id_u64  # noqa: E402
from tandem.vllm.params import parse_transfer_params  # noqa: E402

LAYERS, NB, BS, H, D = 3, 32, 16, 2, 8


def ktc(engine_id, listen=None):
    extra = {"kvx": {"heartbeat_ms": 50, "peer_timeout_ms": 1000, "transfer_timeout_ms": 5000,
                     "handshake_timeout_ms": 1000}}
    if listen:
        extra["listen"] = listen
    return KVTransferConfig(kv_connector="TandemConnector",
                            kv_connector_module_path="tandem.vllm.connector",
                            kv_role="kv_both", engine_id=engine_id,
                            kv_connector_extra_config=extra)


def caches(seed):
    g = torch.Generator().manual_seed(seed)
    return {f"layer.{i}": torch.randint(-1000, 1000, (2, NB, BS, H, D), generator=g).to(torch.float16)
            for i in range(LAYERS)}


def engine(tiny_model, engine_id, listen=None, seed=0):
    vc, _ = make_configs(tiny_model, kv_transfer_config=ktc(engine_id, listen))
    # the KV cache config that matches the tensors of caches() (the connector reads its spec)
    kv = KVCacheConfig(num_blocks=NB, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        [f"layer.{i}" for i in range(LAYERS)],
        FullAttentionSpec(block_size=BS, num_kv_heads=H, head_size=D, dtype=torch.float16))])
    sched = TandemConnector(vc, KVConnectorRole.SCHEDULER, kv)
    worker = TandemConnector(vc, KVConnectorRole.WORKER, kv)
    kvc = caches(seed)
    worker.register_kv_caches(kvc)
    return sched, worker, kvc


def wait_finished(worker, which, req_id, timeout=10.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        s, r = worker.get_finished(set())
        got = s if which == "send" else r
        if got and req_id in got:
            return
        time.sleep(0.01)
    raise AssertionError(f"{which} of {req_id} did not finish")


def test_connector__prefill_to_decode_moves_every_byte(tiny_model, tmp_path):
    p_s, p_w, p_kv = engine(tiny_model, "P", listen=f"ipc://{tmp_path}/p.sock", seed=1)
    d_s, d_w, d_kv = engine(tiny_model, "D", seed=2)
    try:
        # Prefill engine: the request finished (max_tokens=1) holding blocks 4, 5, 6.
        preq = make_requests(1, num_tokens=40, max_tokens=1)[0]
        preq.kv_transfer_params = {"do_remote_decode": True}
        preq.status = RequestStatus.FINISHED_LENGTH_CAPPED
        delay, params = p_s.request_finished(preq, [4, 5, 6])
        assert delay is True and params["do_remote_prefill"] is True
        assert params["remote_request_id"] == preq.request_id   # NixlConnector keys too
        assert parse_transfer_params(params)[0] == request_id_u64(preq.request_id)
        p_w.bind_connector_metadata(p_s.build_connector_meta(None))
        p_w.wait_for_save()
        p_w.clear_connector_metadata()

        # Decode engine: the same prompt with the returned params.
        dreq = make_requests(1, num_tokens=40, max_tokens=4)[0]
        dreq.kv_transfer_params = dict(params)
        n, is_async = d_s.get_num_new_matched_tokens(dreq, 0)
        assert (n, is_async) == (40, True)
        d_s.update_state_after_alloc(dreq, [10, 11, 12], n)
        assert dreq.kv_transfer_params["do_remote_prefill"] is False
        d_w.bind_connector_metadata(d_s.build_connector_meta(None))
        d_w.start_load_kv(None)
        d_w.clear_connector_metadata()
        wait_finished(d_w, "recv", dreq.request_id)
        wait_finished(p_w, "send", preq.request_id)
        assert d_w.get_block_ids_with_load_errors() == set()
        for name in p_kv:
            for src, dst in zip([4, 5, 6], [10, 11, 12]):
                assert torch.equal(d_kv[name][:, dst], p_kv[name][:, src]), (name, src, dst)
            assert not torch.equal(d_kv[name][:, 13], p_kv[name][:, 7])  # untouched
    finally:
        d_w.shutdown()
        p_w.shutdown()


def test_connector__unreachable_prefill_reports_load_errors(tiny_model, tmp_path):
    d_s, d_w, _ = engine(tiny_model, "D2", seed=3)
    try:
        dreq = make_requests(1, num_tokens=20, max_tokens=2)[0]
        dreq.kv_transfer_params = {"do_remote_prefill": True, "remote_engine_id": "gone",
                                   "remote_endpoint": f"ipc://{tmp_path}/nobody.sock",
                                   "remote_request_id": 5, "remote_block_ids": [1, 2]}
        n, _ = d_s.get_num_new_matched_tokens(dreq, 0)
        d_s.update_state_after_alloc(dreq, [3, 4], n)
        d_w.bind_connector_metadata(d_s.build_connector_meta(None))
        d_w.start_load_kv(None)
        wait_finished(d_w, "recv", dreq.request_id)
        assert d_w.get_block_ids_with_load_errors() == {3, 4}
    finally:
        d_w.shutdown()


def test_connector__plain_request_is_not_touched(tiny_model):
    d_s, d_w, _ = engine(tiny_model, "D3", seed=4)
    try:
        req = make_requests(1, num_tokens=20)[0]
        assert d_s.get_num_new_matched_tokens(req, 0) == (0, False)
        req.status = RequestStatus.FINISHED_STOPPED
        assert d_s.request_finished(req, [1, 2]) == (False, None)
    finally:
        d_w.shutdown()


def export(p_s, p_w, blocks, name):
    """The prefill engine finishes request `name` (max_tokens 1) holding `blocks` and exports
    them; returns (request, kv_transfer_params for the decode engine)."""
    preq = make_requests(1, num_tokens=len(blocks) * BS, max_tokens=1)[0]
    preq.request_id = name
    preq.kv_transfer_params = {"do_remote_decode": True}
    preq.status = RequestStatus.FINISHED_LENGTH_CAPPED
    _, params = p_s.request_finished(preq, blocks)
    p_w.bind_connector_metadata(p_s.build_connector_meta(None))
    p_w.wait_for_save()
    p_w.clear_connector_metadata()
    return preq, params


def load(d_s, d_w, params, blocks, name):
    """The decode engine schedules request `name` with params into `blocks` and starts the
    load; returns the request."""
    dreq = make_requests(1, num_tokens=len(blocks) * BS, max_tokens=4)[0]
    dreq.request_id = name
    dreq.kv_transfer_params = dict(params)
    n, _ = d_s.get_num_new_matched_tokens(dreq, 0)
    d_s.update_state_after_alloc(dreq, blocks, n)
    d_w.bind_connector_metadata(d_s.build_connector_meta(None))
    d_w.start_load_kv(None)
    d_w.clear_connector_metadata()
    return dreq


def test_connector__connect_is_off_the_forward_path(tiny_model, caplog):
    # a host that never answers: the connect waits for the handshake timeout (1 s here) in the
    # connector's thread; start_load_kv has returned long before the failure is known
    d_s, d_w, _ = engine(tiny_model, "D4", seed=5)
    try:
        params = {"do_remote_prefill": True, "remote_engine_id": "nobody",
                  "remote_endpoint": "tcp://10.255.255.1:7", "remote_request_id": 5,
                  "remote_block_ids": [1, 2]}
        dreq = load(d_s, d_w, params, [3, 4], "slow-1")
        s, r = d_w.get_finished(set())
        assert not r or dreq.request_id not in r        # not failed yet: still connecting
        wait_finished(d_w, "recv", dreq.request_id)
        assert d_w.get_block_ids_with_load_errors() == {3, 4}
        lines = [m for m in caplog.messages if "KV load of request slow-1" in m]
        assert len(lines) == 1 and "nobody" in lines[0] and "10.255.255.1" in lines[0], lines
    finally:
        d_w.shutdown()


def test_connector__restarted_prefill_engine_is_reconnected(tiny_model, tmp_path):
    d_s, d_w, d_kv = engine(tiny_model, "D5", seed=6)
    p_s, p_w, p_kv = engine(tiny_model, "P5", listen=f"ipc://{tmp_path}/p5a.sock", seed=7)
    try:
        _, params = export(p_s, p_w, [1, 2], "r-1")
        dreq = load(d_s, d_w, params, [5, 6], "d-1")
        wait_finished(d_w, "recv", dreq.request_id)
        assert d_w.get_block_ids_with_load_errors() == set()
        p_w.shutdown()   # the prefill engine goes away, and comes back elsewhere
        p_s, p_w, p_kv = engine(tiny_model, "P5", listen=f"ipc://{tmp_path}/p5b.sock", seed=8)
        _, params = export(p_s, p_w, [3, 4], "r-2")
        dreq = load(d_s, d_w, params, [7, 8], "d-2")
        wait_finished(d_w, "recv", dreq.request_id)
        assert d_w.get_block_ids_with_load_errors() == set()
        for name in p_kv:
            assert torch.equal(d_kv[name][:, 7], p_kv[name][:, 3])
            assert torch.equal(d_kv[name][:, 8], p_kv[name][:, 4])
    finally:
        d_w.shutdown()
        p_w.shutdown()


def test_connector__bogus_params_fail_that_request_only(tiny_model, tmp_path, caplog):
    d_s, d_w, d_kv = engine(tiny_model, "D6", seed=9)
    d_w.load_timeout_ms = 1000
    p_s, p_w, p_kv = engine(tiny_model, "P6", listen=f"ipc://{tmp_path}/p6.sock", seed=10)
    try:
        _, params = export(p_s, p_w, [1, 2], "r-ok")
        # the right endpoint under another engine's name: refused, not pulled from P6
        wrong = dict(params, remote_engine_id="P-other")
        bad1 = load(d_s, d_w, wrong, [10, 11], "bad-engine")
        wait_finished(d_w, "recv", bad1.request_id)
        assert d_w.get_block_ids_with_load_errors() == {10, 11}
        assert any("bad-engine" in m and "is not 'P-other'" in m for m in caplog.messages)
        # a request P6 never exported: fails after the load timeout with the engine's reason
        ghost = dict(params, remote_request_id="never-exported")
        bad2 = load(d_s, d_w, ghost, [12, 13], "bad-request")
        wait_finished(d_w, "recv", bad2.request_id)
        assert d_w.get_block_ids_with_load_errors() == {12, 13}
        line = [m for m in caplog.messages if "KV load of request bad-request" in m]
        assert len(line) == 1 and "P6" in line[0] and "TIMEOUT" in line[0], line
        # the next load from the same peer is unaffected
        good = load(d_s, d_w, params, [14, 15], "good")
        wait_finished(d_w, "recv", good.request_id)
        assert d_w.get_block_ids_with_load_errors() == set()
        for name in p_kv:
            assert torch.equal(d_kv[name][:, 14], p_kv[name][:, 1])
    finally:
        d_w.shutdown()
        p_w.shutdown()
