"""Shared set-up of the Dynamo integration tests (`make test-dynamo`, build/venv-dynamo: vLLM
with ai-dynamo and ai-dynamo-runtime). When vLLM is importable, the vLLM drop-in tests' helpers
(tests_vllm/conftest.py: tiny local model, vLLM configs, requests) are loaded and re-exported
here, and tests_vllm is put on sys.path, so `from conftest import make_configs` and
`from test_vllm_compare import drive` work as they do there. vLLM's CUDA wheel picks no platform
on a machine without a GPU; VLLM_TARGET_DEVICE=cpu (set before vLLM is imported) selects its CPU
platform, which Dynamo's argument parser needs to build vLLM's defaults."""
import importlib.util
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_VLLM_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests_vllm")

if importlib.util.find_spec("vllm") is not None:
    sys.path.insert(0, os.path.abspath(_VLLM_TESTS))
    _spec = importlib.util.spec_from_file_location(
        "tandem_tests_vllm_conftest", os.path.join(_VLLM_TESTS, "conftest.py"))
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    globals().update({k: v for k, v in vars(_mod).items() if not k.startswith("__")})


def free_port() -> int:
    """A TCP port free on all interfaces now, inside Dynamo's accepted range (its envs.py takes
    1024-49151 for DYN_FORWARDPASS_METRIC_PORT; the kernel's ephemeral ports lie above)."""
    import random
    import socket
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 49151)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-49151")
