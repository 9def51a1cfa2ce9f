"""`pip install` of this tree into a throwaway virtualenv, offline, with Debian's tools, then
`import qkv` (and qkv.torch) from outside the tree. The CMake build directory is the tree's
build-pip/ (incremental between runs; ccache hits objects a build/ tree compiled), so a rerun
takes seconds; a first run builds the library once. Skipped only if venv or setuptools is absent."""
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"

SNIPPET = """
import numpy as np, qkv, os
assert not qkv.__file__.startswith({root!r}), qkv.__file__
q = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
out = qkv.scaled_dot_product_attention(q, q, q, causal=True)
assert out.shape == (2, 5, 8) and np.isfinite(out).all()
import torch, qkv.torch
t = torch.from_numpy(q)
assert np.array_equal(qkv.torch.scaled_dot_product_attention(t, t, t, is_causal=True).numpy(), out)
print("ok", qkv.__file__)
"""


def _have(module):
    return subprocess.run([PYTHON, "-c", f"import {module}"], capture_output=True).returncode == 0


@pytest.mark.skipif(not Path(PYTHON).exists(), reason="/usr/bin/python3 is absent")
def test_pip_install_into_a_venv_offline(tmp_path):
    for module in ("venv", "setuptools", "pip"):
        if not _have(module):
            pytest.skip(f"python3-{module} is not installed (apt-get install python3-{module})")
    venv = tmp_path / "venv"
    subprocess.run([PYTHON, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the build tree must not leak in
    install = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps",
                              "--disable-pip-version-check", str(ROOT)], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=1800)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    run = subprocess.run([py, "-c", SNIPPET.format(root=str(ROOT))], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert run.returncode == 0 and run.stdout.startswith("ok"), run.stdout + run.stderr
    assert str(venv) in run.stdout, run.stdout  # imported from the venv's site-packages


@pytest.mark.skipif(not Path(PYTHON).exists(), reason="/usr/bin/python3 is absent")
def test_pip_wheel_offline(tmp_path):
    if not _have("wheel"):
        pytest.skip("python3-wheel is not installed")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([PYTHON, "-m", "pip", "wheel", "--no-build-isolation", "--no-index", "--no-deps",
                          "--disable-pip-version-check", "-w", str(tmp_path), str(ROOT)], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=1800)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    wheels = list(tmp_path.glob("qkv-*.whl"))
    assert len(wheels) == 1, list(tmp_path.iterdir())
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "qkv/torch.py" in names and "qkv/__init__.py" in names
    assert any(n.startswith("qkv/_qkv.") and n.endswith(".so") for n in names), names
