"""Shared fixtures: the repository paths, and skips for parts the loaded library lacks."""
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def build_dir() -> Path:
    return Path(os.environ.get("TANDEM_BUILD", REPO / "build"))


@pytest.fixture
def needs_scheduler():
    import tandem
    if not tandem.has_scheduler():
        pytest.skip(f"{tandem.library_path} does not implement the scheduler (tdm_sched_*) yet")


@pytest.fixture
def sched(needs_scheduler):
    import tandem
    s = tandem.Scheduler(block_size=4, num_blocks=64, max_num_batched_tokens=64, max_num_seqs=8,
                         max_model_len=256)
    yield s
    s.close()


@pytest.fixture
def cc():
    c = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not c:
        pytest.skip("no C compiler")
    return c
