"""Where the publishers of the vLLM adapter bind (issue 26): the forward-pass metrics PUB
socket (no CURVE) binds loopback unless TANDEM_FPM_BIND_HOST widens it, and no two default
ports collide: the metrics port (Dynamo's 20380), vLLM's KV-events publisher (tcp://*:5557)
and `tandem serve`'s default, read from the built command's help. Runs without vLLM: the one
vLLM name metrics.py imports is stubbed for the import."""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import types

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "tandem" / "vllm" / "metrics.py"


@pytest.fixture
def metrics(monkeypatch):
    if "vllm" not in sys.modules:
        req = types.ModuleType("vllm.v1.request")
        req.RequestStatus = types.SimpleNamespace(PREEMPTED=1, WAITING_FOR_REMOTE_KVS=2)
        for name in ("vllm", "vllm.v1"):
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        monkeypatch.setitem(sys.modules, "vllm.v1.request", req)
    spec = importlib.util.spec_from_file_location("tandem_metrics_under_test", PKG)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fpm_publisher_binds_loopback_by_default(metrics):
    assert metrics.fpm_endpoint(20380, {}) == "tcp://127.0.0.1:20380"
    assert metrics.DEFAULT_PORT != VLLM_KV_EVENTS_PORT


VLLM_KV_EVENTS_PORT = 5557  # vLLM's KVEventsConfig.endpoint default, tcp://*:5557


def serve_default_port():
    tool = os.environ.get("TANDEM_TOOL")
    if not tool or not os.access(tool, os.X_OK):
        pytest.skip("TANDEM_TOOL is not set to the built tandem command (run through make test)")
    help_text = subprocess.run([tool, "serve", "--help"], capture_output=True, text=True,
                               timeout=30)
    m = re.search(r"default tcp://127\.0\.0\.1:(\d+)", help_text.stdout + help_text.stderr)
    assert m, "tandem serve --help names no default bind address"
    return int(m.group(1))


def test_default_ports_do_not_collide(metrics):
    serve = serve_default_port()
    assert serve != VLLM_KV_EVENTS_PORT
    assert serve != metrics.DEFAULT_PORT


def test_fpm_bind_host_is_configurable_and_checked(metrics):
    env = {metrics.ENV_BIND: "*"}
    assert metrics.fpm_endpoint(20381, env) == "tcp://*:20381"
    assert metrics.fpm_endpoint(7, {metrics.ENV_BIND: "10.0.0.5"}) == "tcp://10.0.0.5:7"
    assert metrics.fpm_endpoint(7, {metrics.ENV_BIND: "[::1]"}) == "tcp://[::1]:7"
    for bad in ("tcp://x", "a;b", "::1"):
        with pytest.raises(ValueError, match=metrics.ENV_BIND):
            metrics.fpm_endpoint(7, {metrics.ENV_BIND: bad})
