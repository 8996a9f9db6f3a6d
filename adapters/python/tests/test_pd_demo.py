"""examples/pd_demo end to end: a prefill and a decode engine in two processes, KV moved by the
transfer engine and checked byte by byte; then with the prefill engine SIGKILLed halfway,
after which every request still completes (recomputed on the decode side) with no block
leaked."""
import json
import os
import subprocess
import sys

import pytest

import tandem
from conftest import REPO

DEMO = REPO / "examples" / "pd_demo" / "pd_demo.py"


@pytest.fixture
def needs_pd():
    if not (tandem.has_scheduler() and tandem.has_kvx()):
        pytest.skip("the library lacks the scheduler or the KV transfer engine")
    if not DEMO.exists():
        pytest.skip(f"{DEMO} not found")


def run_demo(tmp_path, *extra):
    ep = f"ipc://{tmp_path}/pd.sock"
    r = subprocess.run([sys.executable, str(DEMO), "--json", "--kv-endpoint", ep, *extra],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ))
    lines = [l for l in r.stdout.splitlines() if l.startswith("SUMMARY ")]
    assert lines, f"no summary (rc {r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r, json.loads(lines[-1][len("SUMMARY "):])


def test_pd_demo__kv_moves_and_every_byte_checks(needs_pd, tmp_path):
    r, s = run_demo(tmp_path, "--requests", "8")
    assert r.returncode == 0, r.stdout + r.stderr
    assert s["completed"] == s["requests"] == 8
    assert s["remote"] == 8 and s["recomputed"] == 0
    assert s["kv_mismatches"] == 0 and s["kv_bytes_checked"] > 0 and s["tokens_ok"]
    assert s["free_blocks"] == s["total_blocks"] and s["reserved_blocks"] == 0
    assert s["prefill_exit"] == 0
    assert "TTFT ms" in r.stdout and "KV check: OK" in r.stdout


def test_pd_demo__prefill_killed_halfway_requests_recompute(needs_pd, tmp_path):
    r, s = run_demo(tmp_path, "--requests", "12", "--kill-prefill-after", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert s["prefill_exit"] == -9                # SIGKILL
    assert s["completed"] == s["requests"] == 12
    assert s["remote"] >= 3 and s["recomputed"] >= 1
    assert s["remote"] + s["recomputed"] == 12
    assert s["kv_mismatches"] == 0 and s["tokens_ok"]
    assert s["free_blocks"] == s["total_blocks"] and s["reserved_blocks"] == 0
