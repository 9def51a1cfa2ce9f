"""One bad mask or dropout option, every front end, one message: the `qkv` command (and its MPI
ring), numpy's qkv.scaled_dot_product_attention, qkv.torch.scaled_dot_product_attention, and both
rings (qkv.torch over torch.distributed, qkv.distributed over MPI) all apply the core's rules
(include/qkv/options_parse.h), so each must refuse the option with the core's text. The command
refuses a value at parse time (exit 2), a count that needs the shapes when it runs (exit 1)."""

import json
import math
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import qkv

torch = pytest.importorskip("torch")
import qkv.torch as qt  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "option_front_ends_worker.py"
B, H, N, D = 1, 2, 5, 4

# (id, keywords as numpy and the rings spell them, the command's arguments, its exit code, message)
CASES = [
    ("softcap rounding to 0", dict(softcap=1e-50), ["--softcap", "1e-50"], 2,
     "softcap = 1e-50 is below float32's normal range; pass 0 to turn the cap off"),
    ("negative softcap", dict(softcap=-1.0), ["--softcap", "-1"], 2,
     "softcap must be a finite number >= 0 (0 = off), got -1"),
    ("NaN softcap", dict(softcap=math.nan), ["--softcap", "nan"], 2,
     "softcap must be a finite number >= 0 (0 = off), got nan"),
    ("infinite softcap", dict(softcap=math.inf), ["--softcap", "1e400"], 2,
     "softcap must be a finite number >= 0 (0 = off), got inf"),
    ("causal alignment name", dict(causal=True, causal_align="diagonal"), ["--causal=diagonal"], 2,
     "causal_align must be 'top_left' or 'bottom_right', got 'diagonal'"),
    ("ALiBi slope past float32", dict(alibi_slopes=[1e39, 0.5]), ["--alibi-slopes", "1e39,0.5"], 2,
     "alibi_slopes[0] = 1e+39 must be finite and at most FLT_MAX (3.4e38) in magnitude (kept as float32)"),
    ("ALiBi slope count", dict(alibi_slopes=[0.5, 0.25, 0.125]), ["--alibi-slopes", "0.5,0.25,0.125"], 1,
     "alibi_slopes: expected 2 entries (one per query head), got 3"),
    ("key_lengths count", dict(key_lengths=[3, 3]), ["--key-lengths", "3,3"], 1,
     "key_lengths: expected 1 entries (one per batch row), got 2"),
    ("key length past M", dict(key_lengths=[9]), ["--key-lengths", "9"], 1,
     "key_lengths[0] = 9 is outside [0, 5]"),
]
IDS = [c[0] for c in CASES]


def arrays():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((B, H, N, D)).astype(np.float32) for _ in range(3)]


def torch_keywords(kwargs):
    """The same option in qkv.torch.scaled_dot_product_attention's spelling (is_causal)."""
    kwargs = dict(kwargs)
    if "causal" in kwargs:
        kwargs["is_causal"] = kwargs.pop("causal")
    return kwargs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    for name, a in zip("qkv", arrays()):
        np.save(d / f"{name}.npy", a)
    return d


def attend(inputs, tmp_path, extra, ring=0):
    cmd = [os_qkv(), "attend", "--q", inputs / "q.npy", "--k", inputs / "k.npy", "--v", inputs / "v.npy",
           "--out", tmp_path / "out.npy", *extra]
    if ring:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ring), *cmd, "--ring"]
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120)


def os_qkv():
    import os
    return os.environ.get("QKV_BIN", "qkv")


@pytest.mark.parametrize("kwargs, extra, code, message", [c[1:] for c in CASES], ids=IDS)
def test_the_command(inputs, tmp_path, kwargs, extra, code, message):
    proc = attend(inputs, tmp_path, extra)
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("kwargs, extra, code, message", [c[1:] for c in CASES], ids=IDS)
def test_numpy(kwargs, extra, code, message):
    q, k, v = arrays()
    with pytest.raises(ValueError) as e:
        qkv.scaled_dot_product_attention(q, k, v, **kwargs)
    assert message in str(e.value)


@pytest.mark.parametrize("kwargs, extra, code, message", [c[1:] for c in CASES], ids=IDS)
def test_torch(kwargs, extra, code, message):
    q, k, v = (torch.from_numpy(a) for a in arrays())
    with pytest.raises(ValueError) as e:
        qt.scaled_dot_product_attention(q, k, v, **torch_keywords(kwargs))
    assert message in str(e.value)


# Dropout has no command option: numpy and qkv.torch here, the rings below (DROPOUT).
DROPOUT = [(1.0, "1"), (-0.5, "-0.5"), (math.nan, "nan")]


@pytest.mark.parametrize("p, shown", DROPOUT)
def test_dropout_p_numpy_and_torch(p, shown):
    message = f"dropout_p must be in [0, 1), got {shown}"
    q, k, v = arrays()
    with pytest.raises(ValueError) as e:
        qkv.scaled_dot_product_attention(q, k, v, dropout_p=p, seed=1)
    assert message in str(e.value)
    with pytest.raises(ValueError) as e:
        qt.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), dropout_p=p)
    assert message in str(e.value)


def ring_messages(tmp_path, launcher, mode):
    """Each ring's messages for CASES, then for DROPOUT (qkv.distributed takes a seed too)."""
    out = tmp_path / f"{mode}.json"
    seed = {} if mode == "torch" else dict(seed=1)
    cases = json.dumps([c[1] for c in CASES] + [dict(dropout_p=p, **seed) for p, _ in DROPOUT])
    done = subprocess.run([*launcher, sys.executable, str(WORKER), mode, cases, str(out)], capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def check_ring(got):
    assert len(got) == len(CASES) + len(DROPOUT)
    for (name, _, _, _, message), text in zip(CASES, got):
        assert text is not None and message in text, (name, text)
    for (_, shown), text in zip(DROPOUT, got[len(CASES):]):
        assert text is not None and f"dropout_p must be in [0, 1), got {shown}" in text, (shown, text)


def test_torch_ring(tmp_path):
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    check_ring(ring_messages(tmp_path, [], "torch"))


def mpi_available():
    if shutil.which("mpirun") is None:
        return False
    probe = subprocess.run([sys.executable, "-c", "import mpi4py, qkv.distributed"], capture_output=True)
    return probe.returncode == 0


def test_mpi_ring(tmp_path):
    if not mpi_available():
        pytest.skip("mpirun, mpi4py or qkv.distributed (qkv built with MPI) is not available")
    check_ring(ring_messages(tmp_path, ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"], "mpi"))


@pytest.mark.parametrize("kwargs, extra, code, message", [c[1:] for c in CASES], ids=IDS)
def test_the_command_ring(inputs, tmp_path, kwargs, extra, code, message):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not available")
    if "--ring" not in subprocess.run([os_qkv(), "attend", "--help"], capture_output=True, text=True).stdout:
        pytest.skip("qkv was built without MPI (no attend --ring)")
    proc = attend(inputs, tmp_path, extra, ring=2)
    assert proc.returncode != 0, proc.stderr
    assert message in proc.stderr, proc.stderr
