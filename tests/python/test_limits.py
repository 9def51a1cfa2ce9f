"""Resource limits and numeric edge cases through the `qkv` command (rows of the bad-input table,
docs/bad-inputs.md, that no other test covers): files and outputs whose declared sizes exceed
memory, absurd numbers in arguments, subnormal and huge values. Each failure is one line and a
non-zero exit."""
import functools
import resource
import struct
import subprocess

import numpy as np
import pytest

from qkv_testlib import attention

TWO_TB = 2 << 40
# Children run with this address-space cap, so an implementation that did try to allocate a
# declared 2 TB could not take the machine down: 3 TB leaves room to map the sparse file.
CAP = 3 * TWO_TB


def cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


@functools.lru_cache(maxsize=None)
def asan_binary(path):
    """An ASan build reserves ~15 TB of shadow address space, so it cannot run under the cap."""
    with open(path, "rb") as f:
        data = f.read()
    return b"__asan_init" in data


def run_capped(qkv_bin, *args, cwd=None):
    return subprocess.run([qkv_bin, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120,
                          preexec_fn=None if asan_binary(qkv_bin) else cap_memory)


def one_line_failure(proc, code, *needles):
    message = proc.stderr.strip()
    assert proc.returncode == code, f"exit {proc.returncode}, stderr: {proc.stderr!r}"
    assert message and "\n" not in message, f"not one line: {proc.stderr!r}"
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def npy_header(descr, shape):
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    text += " " * ((64 - (10 + len(text) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()


@pytest.fixture
def inputs(tmp_path, seed):
    rng = np.random.default_rng(seed)
    for name, shape in (("q", (3, 4)), ("k", (5, 4)), ("v", (5, 2))):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal(shape).astype(np.float32))
    return tmp_path


def attend_args(d, q="q.npy", k="k.npy", v="v.npy", out="out.npy"):
    return ["attend", "--q", d / q, "--k", d / k, "--v", d / v, "--out", d / out]


def test_tiny_npy_declaring_2tb_is_refused_before_allocating(qkv_bin, inputs):
    (inputs / "big.npy").write_bytes(npy_header("<f4", "(524288, 1048576)") + bytes(16))
    proc = run_capped(qkv_bin, *attend_args(inputs, q="big.npy"))
    one_line_failure(proc, 1, "big.npy", "declares 2199023255552 bytes but the file holds 16")
    assert not (inputs / "out.npy").exists()


def test_sparse_npy_of_2tb_is_refused_with_a_clear_error(qkv_bin, inputs):
    path = inputs / "sparse.npy"
    head = npy_header("<f4", "(524288, 1048576)")
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + TWO_TB)  # sparse: no disk used
    proc = run_capped(qkv_bin, *attend_args(inputs, k="sparse.npy"))
    assert proc.returncode == 1 and "sparse.npy" in proc.stderr, proc.stderr
    assert "allocate" in proc.stderr or "memory" in proc.stderr, proc.stderr
    assert "\n" not in proc.stderr.strip()
    assert not (inputs / "out.npy").exists()


def test_weights_output_larger_than_memory_is_refused(qkv_bin, tmp_path):
    """q and k of 300,000 rows are 1.2 MB each, but --weights would be [300000, 300000] floats."""
    n = 300_000
    for name in ("q", "k", "v"):
        np.save(tmp_path / f"{name}.npy", np.ones((n, 1), np.float32))
    proc = run_capped(qkv_bin, *attend_args(tmp_path), "--weights", tmp_path / "w.npy")
    one_line_failure(proc, 1, "weights", "cannot allocate 360000000000 bytes")
    assert not (tmp_path / "out.npy").exists() and not (tmp_path / "w.npy").exists()


@pytest.mark.parametrize("binary", [False, True])
def test_word2vec_header_claiming_10_to_12_words_is_refused(qkv_bin, tmp_path, binary):
    path = tmp_path / "vectors.bin"
    if binary:
        path.write_bytes(b"1000000000000 3\nbank " + np.array([0.1, 0.2, 0.3], "<f4").tobytes())
    else:
        path.write_text("1000000000000 3\nbank 0.1 0.2 0.3\n")
    proc = run_capped(qkv_bin, "explain", "--embeddings", path, "--random-weights", "0", "bank")
    one_line_failure(proc, 1, "vectors.bin", "declares 1000000000000 words")


def test_npy_shape_overflowing_size_t_is_refused(qkv_bin, inputs):
    (inputs / "over.npy").write_bytes(npy_header("<f4", "(1099511627776, 1099511627776, 1099511627776)"))
    proc = run_capped(qkv_bin, *attend_args(inputs, v="over.npy"))
    one_line_failure(proc, 1, "over.npy", "more bytes than can be addressed")


@pytest.mark.parametrize("extra, code, needle", [
    (["--window", "99999999999999999999,1"], 2, "is not an integer"),
    (["--key-lengths", "1e30"], 2, "'1e30' is not an integer"),
    (["--query-lengths", "-9223372036854775808"], 1, "query_lengths[0] = -9223372036854775808 is outside"),
    (["--alibi-slopes", "1e39"], 2, "alibi_slopes[0] = 1e+39 must be finite and at most FLT_MAX (3.4e38) in magnitude"),
    (["--alibi-slopes", "nan"], 2, "alibi_slopes[0] = nan must be finite"),
    (["--scale", "nan"], 1, "scale must be finite"),
    (["--scale", "1e300"], 1, "scale must be finite and at most FLT_MAX (3.4e38) in magnitude, got 1e+300"),
    (["--softcap", "nan"], 2, "--softcap: softcap must be a finite number >= 0 (0 = off), got nan"),
    (["--softcap", "inf"], 2, "--softcap"),
    (["--threads", "99999"], 2, "--threads"),
    (["--threads", "-1"], 2, "--threads"),
])
def test_absurd_numbers_in_arguments(run, inputs, extra, code, needle):
    proc = run(*attend_args(inputs), *extra)
    one_line_failure(proc, code, needle)
    assert not (inputs / "out.npy").exists()


def test_empty_input_files_are_refused(run, inputs):
    (inputs / "empty.npy").write_bytes(b"")
    one_line_failure(run(*attend_args(inputs, q="empty.npy")), 1, "empty.npy", "only 0 bytes")
    (inputs / "empty.txt").write_bytes(b"")
    one_line_failure(run("explain", "--embeddings", inputs / "empty.txt", "--random-weights", "0", "bank"), 1, "empty.txt", "empty")


def numpy_attention32(d, **kw):
    q, k, v = (np.load(d / f"{n}.npy").astype(np.float64)[None, None] for n in ("q", "k", "v"))
    return attention(q, k, v, **kw)[0][0, 0]


@pytest.mark.parametrize("kernel", ["auto", "fused", "reference"])
def test_subnormal_inputs_match_numpy(run, tmp_path, seed, kernel):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((4, 5)) * 1e-39).astype(np.float32)
    k = (rng.standard_normal((6, 5)) * 1e-39).astype(np.float32)
    v = (rng.standard_normal((6, 3)) * 1e-40).astype(np.float32)
    assert np.all(np.abs(v[v != 0]) < np.finfo(np.float32).tiny), "v must be subnormal"
    for name, a in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", a)
    proc = run(*attend_args(tmp_path), "--kernel", kernel)
    assert proc.returncode == 0, proc.stderr
    got = np.load(tmp_path / "out.npy")
    want = numpy_attention32(tmp_path)
    # The fused kernels flush subnormal results to 0 (x86 takes an assist for each; qkv/attention.h),
    # so outputs ~1e-40 are exact to FLT_MIN there and to the last subnormal bit on the reference.
    atol = 1e-45 if kernel == "reference" else float(np.finfo(np.float32).tiny)
    np.testing.assert_allclose(got, want, rtol=0, atol=atol, err_msg=f"seed {seed}")


@pytest.mark.parametrize("kernel", ["auto", "fused", "reference"])
def test_values_of_1e30_match_numpy(run, tmp_path, seed, kernel):
    rng = np.random.default_rng(seed)
    np.save(tmp_path / "q.npy", rng.standard_normal((4, 5)).astype(np.float32))
    np.save(tmp_path / "k.npy", rng.standard_normal((6, 5)).astype(np.float32))
    np.save(tmp_path / "v.npy", (rng.standard_normal((6, 3)) * 1e30).astype(np.float32))
    proc = run(*attend_args(tmp_path), "--kernel", kernel)
    assert proc.returncode == 0, proc.stderr
    # Relative to the largest output (the kernel's contract): an output that nearly cancels
    # (-1.1e27 from values ~1e30, seed 2683456459) carries error of the values' size.
    want = numpy_attention32(tmp_path)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=0, atol=2e-5 * np.abs(want).max(),
                               err_msg=f"seed {seed}")


def test_large_finite_scores_match_numpy(run, tmp_path):
    """q·k = 1e10 is finite in float32: the softmax is one-hot and the output is the best key's value.
    (The AVX-512 and AVX2 paths once returned 0 with lse -inf here, silently.)"""
    np.save(tmp_path / "q.npy", np.array([[1e5]], np.float32))
    np.save(tmp_path / "k.npy", np.array([[1e5], [0.0]], np.float32))
    np.save(tmp_path / "v.npy", np.array([[1.0], [2.0]], np.float32))
    proc = run(*attend_args(tmp_path), "--scale", "1", "--lse", tmp_path / "lse.npy")
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), [[1.0]])
    np.testing.assert_allclose(np.load(tmp_path / "lse.npy"), [1e10], rtol=1e-6)
