"""`pip install` of this tree into a throwaway virtualenv, offline, with Debian's tools, as the
README's Python section says, then what a pip user runs from outside the tree: `import qkv` (and
qkv.torch, qkv.distributed), `qkv.__version__`, and the `qkv` command the package installs (its
--version, and `explain` on a sentence with no flags when `make demo` has built the word vectors
the wheel then carries). The CMake build directory is the tree's build-pip/ (incremental between
runs; ccache hits objects a build/ tree compiled), so a rerun takes seconds; a first run builds
the library once. Skipped only if venv, setuptools or pip is absent."""
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"
VERSION = re.search(r"project\(qkv VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
WORDS = ROOT / "build" / "data" / "words.txt"  # setup.py's default QKV_PIP_DATA_DIR
HAVE_MPI = shutil.which("mpicxx") is not None  # CMake builds qkv.distributed's module when MPI is found

SNIPPET = """
import numpy as np, qkv, os
assert not qkv.__file__.startswith({root!r}), qkv.__file__
assert qkv.__version__ == {version!r}, qkv.__version__
q = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
out = qkv.scaled_dot_product_attention(q, q, q, causal=True)
assert out.shape == (2, 5, 8) and np.isfinite(out).all()
import torch, qkv.torch
t = torch.from_numpy(q)
assert np.array_equal(qkv.torch.scaled_dot_product_attention(t, t, t, is_causal=True).numpy(), out)
print("ok", qkv.__file__)
"""

# qkv.distributed without its compiled part (a build without MPI): an ImportError naming the fix.
NO_RING = """
import sys
sys.modules["qkv._qkv_distributed"] = None  # makes `from . import _qkv_distributed` raise ImportError
try:
    import qkv.distributed
except ImportError as e:
    print(e)
"""


def _have(module):
    return subprocess.run([PYTHON, "-c", f"import {module}"], capture_output=True).returncode == 0


def _clean_env():
    # Neither the build tree nor a user's QKV_* settings may leak in.
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("QKV_")}


@pytest.mark.skipif(not Path(PYTHON).exists(), reason="/usr/bin/python3 is absent")
def test_pip_install_into_a_venv_offline(tmp_path):
    for module in ("venv", "setuptools", "pip"):
        if not _have(module):
            pytest.skip(f"python3-{module} is not installed (apt-get install python3-{module})")
    venv = tmp_path / "venv"
    subprocess.run([PYTHON, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    env = _clean_env()
    install = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps",
                              "--disable-pip-version-check", str(ROOT)], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=1800)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    run = subprocess.run([py, "-c", SNIPPET.format(root=str(ROOT), version=VERSION)], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert run.returncode == 0 and run.stdout.startswith("ok"), run.stdout + run.stderr
    assert str(venv) in run.stdout, run.stdout  # imported from the venv's site-packages

    ring = subprocess.run([py, "-c", "import qkv.distributed as qd; print(qd.shard_ranges(8, 2, 0))"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    if HAVE_MPI:
        assert ring.returncode == 0 and ring.stdout.strip() == "[(0, 2), (6, 8)]", ring.stdout + ring.stderr
    else:
        assert ring.returncode == 1 and "apt-get install libopenmpi-dev" in ring.stderr, ring.stderr
    masked = subprocess.run([py, "-c", NO_RING], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert masked.returncode == 0, masked.stderr
    assert "qkv.distributed needs qkv built with MPI" in masked.stdout, masked.stdout
    assert "apt-get install libopenmpi-dev openmpi-bin python3-mpi4py" in masked.stdout, masked.stdout

    # The command, found on the venv's PATH as a user who activated it finds it.
    qkv = venv / "bin" / "qkv"
    assert qkv.exists(), sorted(os.listdir(venv / "bin"))
    env_path = dict(env, PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}")
    (tmp_path / "cwd").mkdir()
    version = subprocess.run(["qkv", "--version"], capture_output=True, text=True, env=env_path, cwd=tmp_path / "cwd")
    assert version.returncode == 0 and version.stdout.strip() == f"qkv {VERSION}", version.stdout + version.stderr
    explain = subprocess.run(["qkv", "explain", "we sat by the river bank"], capture_output=True, text=True,
                             env=env_path, cwd=tmp_path / "cwd", timeout=300)
    if WORDS.exists():
        assert explain.returncode == 0, explain.stderr
        assert "embeddings from words.txt" in explain.stdout, explain.stdout
    else:  # the wheel carries no word vectors: the message says how to get them
        assert explain.returncode == 2 and "no word vectors" in explain.stderr, explain.stderr
    assert os.listdir(tmp_path / "cwd") == []


@pytest.mark.skipif(not Path(PYTHON).exists(), reason="/usr/bin/python3 is absent")
def test_pip_wheel_offline(tmp_path):
    if not _have("wheel"):
        pytest.skip("python3-wheel is not installed")
    res = subprocess.run([PYTHON, "-m", "pip", "wheel", "--no-build-isolation", "--no-index", "--no-deps",
                          "--disable-pip-version-check", "-w", str(tmp_path), str(ROOT)], capture_output=True,
                         text=True, env=_clean_env(), cwd=tmp_path, timeout=1800)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    wheels = list(tmp_path.glob("qkv-*.whl"))
    assert len(wheels) == 1, list(tmp_path.iterdir())
    assert wheels[0].name.startswith(f"qkv-{VERSION}-"), wheels[0].name
    wheel = zipfile.ZipFile(wheels[0])
    names = wheel.namelist()
    assert "qkv/torch.py" in names and "qkv/__init__.py" in names
    assert any(n.startswith("qkv/_qkv.") and n.endswith(".so") for n in names), names
    assert any(n.startswith("qkv/_qkv_distributed.") for n in names) == HAVE_MPI, names
    assert (wheel.getinfo("qkv/bin/qkv").external_attr >> 16) & 0o111, "qkv/bin/qkv is not executable"
    assert ("qkv/share/qkv/words.txt" in names) == WORDS.exists(), names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "qkv = qkv._cli:main" in wheel.read(entry_points).decode(), wheel.read(entry_points)
