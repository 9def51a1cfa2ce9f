"""Fixtures for the `qkv` command tests: the binary (QKV_BIN), the seeds (QKV_SEEDS), a runner,
a per-test random generator whose seed is reported, and small generated embedding files."""
import os
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from qkv_testlib import EmbeddingFiles

HERE = Path(__file__).resolve().parent


def _default_bin():
    for build in ("build", "build-cli"):
        p = HERE.parents[1] / build / "qkv"
        if p.exists():
            return str(p)
    return "qkv"


@pytest.fixture(scope="session")
def qkv_bin():
    path = os.path.abspath(os.environ.get("QKV_BIN", _default_bin()))
    if not Path(path).exists():
        pytest.fail(f"qkv binary not found at {path}; set QKV_BIN")
    return path


@pytest.fixture(scope="session")
def seeds_dir():
    path = Path(os.environ.get("QKV_SEEDS", HERE.parents[2] / "shared" / "seeds"))
    return path


@pytest.fixture
def run(qkv_bin):
    """Runs `qkv ARGS...`; returns the CompletedProcess (text mode)."""
    def _run(*args, cwd=None, timeout=60):
        return subprocess.run([qkv_bin, *map(str, args)], capture_output=True, text=True, errors="replace", cwd=cwd,
                              timeout=timeout)
    return _run


@pytest.fixture
def seed(request):
    """A fresh seed per test, shown in failure messages by the tests; QKV_TEST_SEED=<that seed>
    replays it (every test then uses that seed as it is, so the printed value is the one to pass)."""
    if "QKV_TEST_SEED" in os.environ:
        return int(os.environ["QKV_TEST_SEED"]) % (1 << 32)
    base = int(np.random.SeedSequence().entropy % (1 << 32))
    return (base + zlib.crc32(request.node.name.encode())) % (1 << 32)


@pytest.fixture
def embeddings(tmp_path, seed):
    return EmbeddingFiles(tmp_path, np.random.default_rng(seed))


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for the page tests (html_browser_util), one per test module; a missing
    browser or driver fails the test, naming the package."""
    from html_browser_util import Browser, missing_browser
    problem = missing_browser()
    if problem:
        pytest.fail(problem)
    b = Browser()
    yield b
    b.close()
