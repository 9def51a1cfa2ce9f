"""Bad input to the qkv module raises the documented exception with a clear message, never crashes."""

import errno
import re
import threading
import time

import numpy as np
import pytest

import qkv
from py_oracle import rng_for, seed_note

sdpa = qkv.scaled_dot_product_attention


def _qkv(case, n=5, m=7, d=4, dtype=np.float32):
    rng = rng_for(case)
    return (rng.standard_normal((n, d)).astype(dtype), rng.standard_normal((m, d)).astype(dtype),
            rng.standard_normal((m, d)).astype(dtype))


@pytest.mark.parametrize("shape, message", [
    ((4,), "q: expected rank 2 [N, D], 3 [H, N, D] or 4 [B, H, N, D], got shape [4]"),
    ((1, 1, 1, 3, 4), "q: expected rank 2"),
])
def test_wrong_rank(shape, message):
    _, k, v = _qkv(3000)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        sdpa(np.ones(shape, np.float32), k, v)


def test_scalar_array_rank_zero():
    _, k, v = _qkv(3001)
    with pytest.raises(ValueError, match="q: expected rank 2"):
        sdpa(np.ones((), np.float32), k, v)


def test_mismatched_shapes():
    q, k, v = _qkv(3002)
    with pytest.raises(ValueError, match=r"q \[5, 4\] and k \[7, 3\] must have the same last dim"):
        sdpa(q, k[:, :3], v)
    with pytest.raises(ValueError, match=r"k \[7, 4\] and v \[6, 4\] must agree on every dim but the last"):
        sdpa(q, k, v[:6])
    with pytest.raises(ValueError, match="must have the same rank"):
        sdpa(q[None], k, v)
    with pytest.raises(ValueError, match=r"q \[3, 5, 4\] and k \[2, 7, 4\]: H = 3 query heads is not a positive multiple of Hkv = 2"):
        sdpa(np.stack([q] * 3), np.stack([k] * 2), np.stack([v] * 2))
    with pytest.raises(ValueError, match="different batch sizes"):
        sdpa(q[None, None], np.stack([k[None]] * 2), np.stack([v[None]] * 2))
    with pytest.raises(ValueError, match="head dim D must be at least 1"):
        sdpa(q[:, :0], k[:, :0], v)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.complex64, np.float16, np.bool_])
def test_wrong_dtype(dtype):
    q, k, v = _qkv(3003)
    with pytest.raises(TypeError, match=f"q: dtype {np.dtype(dtype).name} is not supported; use float32, float64"):
        sdpa(q.astype(dtype), k, v)


def test_non_native_byte_order_is_refused():
    q, k, v = _qkv(3004)
    with pytest.raises(TypeError, match="k: dtype >f4 is not supported"):
        sdpa(q, k.astype(">f4"), v)


def test_mixed_dtypes_and_non_arrays():
    q, k, v = _qkv(3005)
    with pytest.raises(TypeError, match="q, k and v must share a dtype, got float32, float64 and float32"):
        sdpa(q, k.astype(np.float64), v)
    with pytest.raises(TypeError, match="v must be a numpy array, got list"):
        sdpa(q, k, v.tolist())


def test_misaligned_arrays_are_copied_not_refused():
    q, k, v = _qkv(3006)
    raw = np.zeros(5 * 4 * 4 + 1, dtype=np.uint8)[1:].view(np.float32).reshape(5, 4)
    raw[...] = q
    assert not raw.flags.aligned
    assert np.array_equal(sdpa(raw, k, v), sdpa(q, k, v)), seed_note(3006)
    record = np.zeros((5, 4), dtype=[("a", np.int8), ("x", np.float32)])
    record["x"] = q
    odd = record["x"]  # strides of 20 and 5 bytes: not a whole number of float32
    assert np.array_equal(sdpa(odd, k, v), sdpa(q, k, v)), seed_note(3006)


@pytest.mark.parametrize("tensor", ["q", "k", "v"])
@pytest.mark.parametrize("bad, word", [(np.nan, "NaN"), (np.inf, r"\+inf"), (-np.inf, "-inf")])
def test_check_finite_names_tensor_and_index(tensor, bad, word):
    arrays = dict(zip("qkv", _qkv(3007)))
    arrays[tensor][2, 3] = bad
    with pytest.raises(ValueError, match=rf"{tensor} contains {word} at index \(2, 3\)"):
        sdpa(arrays["q"], arrays["k"], arrays["v"], check_finite=True)


def test_check_finite_off_propagates_nan_in_that_row_only():
    q, k, v = _qkv(3008)
    q[1, 0] = np.nan
    out = sdpa(q, k, v)
    assert np.isnan(out[1]).all() and np.isfinite(np.delete(out, 1, axis=0)).all(), seed_note(3008)


def test_check_finite_index_for_rank4_float64():
    rng = rng_for(3009)
    q = rng.standard_normal((2, 3, 4, 5))
    q[1, 2, 0, 4] = np.nan
    with pytest.raises(ValueError, match=r"q contains NaN at index \(1, 2, 0, 4\)"):
        sdpa(q, q, q, check_finite=True)


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(causal_align="diagonal"), ValueError, "causal_align must be 'top_left' or 'bottom_right', got 'diagonal'"),
    (dict(causal_align=3), TypeError, "causal_align must be a string"),
    (dict(causal="yes"), TypeError, "causal must be True or False"),
    (dict(key_lengths=[1, 2]), ValueError, r"key_lengths: expected 1 entries \(one per batch row\), got 2"),
    (dict(key_lengths=8), ValueError, r"key_lengths\[0\] = 8 is outside \[0, 7\]"),
    (dict(key_lengths=[1 << 70]), ValueError, r"key_lengths\[0\] = 1180591620717411303424 is out of range"),
    (dict(key_lengths=[1.5]), TypeError, r"key_lengths\[0\] must be an integer, got 1.5"),
    (dict(query_lengths=-1), ValueError, r"query_lengths\[0\] = -1 is outside \[0, 5\]"),
    (dict(window=3), TypeError, r"window must be a pair \(left, right\)"),
    (dict(window=(1, "x")), TypeError, r"window\[1\] must be an integer"),
    (dict(keep_mask=np.ones((5, 7), np.float32)), TypeError, "keep_mask must be a numpy bool"),
    (dict(keep_mask=np.ones((4, 7), bool)), ValueError, r"keep_mask: shape \[4, 7\] does not broadcast"),
    (dict(bias=np.ones((5, 6), np.float32)), ValueError, r"bias: shape \[5, 6\] does not broadcast"),
    (dict(bias=np.ones((5, 7), np.int64)), TypeError, "bias must be a numpy float32 or float64 array"),
    (dict(alibi_slopes=[0.1, 0.2]), ValueError, r"alibi_slopes: expected 1 entries \(one per query head\), got 2"),
    (dict(alibi_slopes=["a"]), TypeError, r"alibi_slopes\[0\] must be a number"),
    (dict(alibi_slopes=[np.inf]), ValueError, r"alibi_slopes\[0\] = inf must be finite"),
    (dict(alibi_slopes=[1e300]), ValueError, r"alibi_slopes\[0\] = 1e\+300 must be finite and at most FLT_MAX"),
    (dict(softcap=-1.0), ValueError, "softcap must be a finite number >= 0"),
    (dict(softcap="big"), TypeError, "softcap must be a number"),
    (dict(scale=np.nan), ValueError, "scale must be finite"),
    (dict(scale="x"), TypeError, "scale must be a number or None"),
    (dict(kernel="gpu"), ValueError, "kernel must be 'auto', 'reference' or 'fused', got 'gpu'"),
    (dict(num_threads=-2), ValueError, r"num_threads must be >= 0 \(0 = default\), got -2"),
    # Nothing is coerced: a float, a string or an out-of-range int is refused by name, never
    # truncated, taken as truthy or reported as a pybind11 signature.
    (dict(num_threads=1.5), TypeError, "num_threads must be an integer, got 1.5"),
    (dict(num_threads="2"), TypeError, "num_threads must be an integer, got '2'"),
    (dict(num_threads=True), TypeError, "num_threads must be an integer, got True"),
    (dict(num_threads=1 << 31), ValueError, "num_threads = 2147483648 is out of range"),
    (dict(check_finite="yes"), TypeError, "check_finite must be True or False, got 'yes'"),
    (dict(return_lse=1), ValueError, 'return_lse must be False, True or "float64", got 1'),
    (dict(simd=None), TypeError, "simd must be a string, got None"),
    (dict(scale=1e300), ValueError, r"scale must be finite and at most FLT_MAX \(3.4e38\) in magnitude, got 1e\+300"),
    (dict(scale=np.bool_(True)), TypeError, "scale must be a number or None, got True"),
    (dict(scale=1 + 2j), TypeError, r"scale must be a number or None, got \(1\+2j\)"),
    (dict(key_lengths=np.array([True])), TypeError, r"key_lengths\[0\] must be an integer, got True"),
    (dict(key_lengths=b"\x01"), TypeError, "key_lengths must be an int or a sequence of 1 ints"),
    (dict(alibi_slopes=[1 + 1j]), TypeError, r"alibi_slopes\[0\] must be a number, got \(1\+1j\)"),
    (dict(softcap=1e-300), ValueError, "softcap = 1e-300 is below float32's normal range; pass 0 to turn the cap off"),
    (dict(softcap=1e300), ValueError, r"softcap must be a finite number >= 0 \(0 = off\), got 1e\+300"),
])
def test_bad_mask_and_option_arguments(kwargs, exc, message):
    q, k, v = _qkv(3010)
    with pytest.raises(exc, match=message):
        sdpa(q, k, v, **kwargs)


def _bias_with(value, dtype, at=(2, 3), shape=(5, 7)):
    bias = np.zeros(shape, dtype)
    bias[at] = value
    return bias


# The CLI's --bias rule: NaN and +inf would turn their row into NaN, and a finite float64 beyond
# float32 would reach the kernels as +-inf; -inf masks the pair and is accepted.
@pytest.mark.parametrize("bias, message", [
    (_bias_with(1e300, np.float64), r"bias: element 1e\+300 at index \(2, 3\) overflows float32"),
    (_bias_with(-1e300, np.float64), r"bias: element -1e\+300 at index \(2, 3\) overflows float32"),
    (_bias_with(np.inf, np.float32), r"bias contains \+inf at index \(2, 3\)"),
    (_bias_with(np.inf, np.float64), r"bias contains \+inf at index \(2, 3\)"),
    (_bias_with(np.nan, np.float32), r"bias contains NaN at index \(2, 3\)"),
    (_bias_with(np.nan, np.float64, at=(0, 3, 4), shape=(1, 5, 7)), r"bias contains NaN at index \(0, 3, 4\)"),
])
@pytest.mark.parametrize("check_finite", [False, True])
def test_bias_nan_inf_or_beyond_float32_is_refused(bias, message, check_finite):
    q, k, v = _qkv(3011)
    with pytest.raises(ValueError, match=message):
        sdpa(q, k, v, bias=bias, check_finite=check_finite)
    dout = np.ones((5, 4), np.float32)
    with pytest.raises(ValueError, match=message):
        qkv.attention_backward(q, k, v, dout, bias=bias)
    with pytest.raises(ValueError, match=message):
        qkv.attention_weights(q, k, bias=bias)


def test_minus_inf_bias_masks_the_pair():
    q, k, v = _qkv(3012)
    for dtype in (np.float32, np.float64):
        bias = _bias_with(-np.inf, dtype, at=(slice(None), slice(1, None)))
        out = sdpa(q, k, v, bias=bias, check_finite=True)
        np.testing.assert_allclose(out, np.broadcast_to(v[0], out.shape), rtol=1e-6)


def test_largest_float64_bias_that_rounds_into_float32_is_kept():
    q, k, v = _qkv(3013)
    edge = float(np.float32(np.finfo(np.float32).max)) * (1 + 2.0 ** -25)  # rounds down to FLT_MAX
    assert np.isfinite(np.float32(edge))
    sdpa(q, k, v, bias=_bias_with(-edge, np.float64))


# A 2-D array where a list of numbers belongs, or an array where one number belongs: numpy's own
# messages ("only integer scalar arrays can be converted ...") named no argument.
@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(key_lengths=np.array([[1], [2]])), TypeError, r"key_lengths\[0\] must be an integer, got array\(\[1\]\)"),
    (dict(query_lengths=np.array([[1]])), TypeError, r"query_lengths\[0\] must be an integer, got array\(\[1\]\)"),
    (dict(alibi_slopes=np.array([[0.5]])), TypeError, r"alibi_slopes\[0\] must be a number, got array\(\[0.5\]\)"),
    (dict(scale=np.array([0.3, 0.3])), TypeError, r"scale must be a number or None, got array\(\[0.3, 0.3\]\)"),
    (dict(scale=np.array([0.3])), TypeError, r"scale must be a number or None, got array\(\[0.3\]\)"),
    (dict(softcap=np.array([2.0])), TypeError, r"softcap must be a number, got array\(\[2.\]\)"),
    (dict(num_threads=np.array([1])), TypeError, r"num_threads must be an integer, got array\(\[1\]\)"),
    (dict(scale=10 ** 400), ValueError, r"scale = 1000+ is out of range"),
])
def test_arrays_where_numbers_belong_are_refused_by_name(kwargs, exc, message):
    q, k, v = _qkv(3014)
    with pytest.raises(exc, match=message):
        sdpa(q, k, v, **kwargs)


def _longest_pause_of_another_thread(call):
    """Runs call() while another Python thread counts and timestamps its progress; returns the
    call's duration and the longest stretch within it in which that thread made no progress."""
    stamps = []
    started = threading.Event()
    running = [True]

    def spin():
        n = 0
        started.set()
        while running[0]:
            n += 1
            if n % 64 == 0:
                stamps.append(time.perf_counter())

    thread = threading.Thread(target=spin)
    thread.start()
    started.wait()
    try:
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
    finally:
        running[0] = False
        thread.join()
    points = [t0] + [t for t in stamps if t0 < t < t1] + [t1]
    return t1 - t0, max(b - a for a, b in zip(points, points[1:]))


def test_the_gil_is_released_during_a_long_call():
    # A call that holds the GIL stops every other Python thread for (nearly) its whole duration;
    # one that releases it lets them keep going (the control below shows the difference).
    rng = rng_for(3100)
    # Long enough on a fast machine too: (1, 2, 512, 64) took 45 ms on a quiet one, under the
    # 50 ms the check needs to tell a held GIL from a released one.
    q = rng.standard_normal((1, 4, 1024, 64)).astype(np.float32)
    elapsed, pause = _longest_pause_of_another_thread(lambda: sdpa(q, q, q, kernel="reference", num_threads=1))
    assert elapsed > 0.05, f"call too short ({elapsed:.3f} s) to tell"
    assert pause < 0.5 * elapsed, f"another thread stalled {pause:.3f} s of a {elapsed:.3f} s call ({seed_note(3100)})"


def test_gil_check_detects_a_held_gil():
    # The control: a regular expression with catastrophic backtracking holds the GIL throughout.
    elapsed, pause = _longest_pause_of_another_thread(lambda: re.match(r"(a+)+b", "a" * 23))
    assert elapsed > 0.05 and pause > 0.5 * elapsed, f"paused {pause:.3f} s of {elapsed:.3f} s"


def test_check_finite_reads_bfloat16_bits():
    q = np.full((3, 4), 0x3F80, dtype=np.uint16)  # 1.0 in bfloat16
    q[2, 1] = 0x7FC0  # NaN
    with pytest.raises(ValueError, match=r"q contains NaN at index \(2, 1\)"):
        sdpa(q, np.full((3, 4), 0x3F80, np.uint16), np.full((3, 4), 0x3F80, np.uint16), check_finite=True)
    assert np.isnan(sdpa(q, q, q)[2]).all()


def test_huge_window_bounds_mean_unbounded():
    q, k, v = _qkv(3011)
    want = sdpa(q, k, v, causal=True)
    assert np.array_equal(sdpa(q, k, v, causal=True, window=((1 << 63) - 1, (1 << 63) - 1)), want), seed_note(3011)
    assert np.array_equal(sdpa(q, k, v, window=(None, (1 << 63) - 1)), sdpa(q, k, v)), seed_note(3011)


# Every entry point of the module that reads a file.
FILE_READERS = {"load_embeddings": qkv.load_embeddings,
                "Embeddings.load": qkv.Embeddings.load,
                "MultiHeadAttention.load": qkv.MultiHeadAttention.load,
                "load_layer": lambda path: qkv.load_layer(embeddings=path, parameter_free=True)}


@pytest.mark.parametrize("reader", FILE_READERS)
def test_a_file_that_cannot_be_opened_raises_what_open_raises(reader, tmp_path):
    """A missing file raises FileNotFoundError with errno and filename set, as open() does, and a
    directory IsADirectoryError (both were ValueError); a file that opens but is malformed is still
    a ValueError. str(e) names the path once, as open()'s does: OSError appends the filename, and
    qkv's message had it too ("cannot open /x: ...: '/x'")."""
    read = FILE_READERS[reader]
    missing = tmp_path / "missing.txt"
    for path in (missing, str(missing)):
        with pytest.raises(FileNotFoundError) as e:
            read(path)
        assert str(e.value) == f"[Errno 2] cannot open: No such file or directory: '{missing}'", str(e.value)
        assert e.value.errno == errno.ENOENT and e.value.filename == str(missing), (e.value.errno, e.value.filename)
    if reader == "MultiHeadAttention.load":  # a directory of .npy files is a layer: its config is what is missing
        with pytest.raises(FileNotFoundError) as e:
            read(tmp_path)
        config = tmp_path / "qkv_layer.json"
        assert str(e.value) == ("[Errno 2] cannot open the layer config (a .npy weights directory needs "
                                f"qkv_layer.json): cannot open: No such file or directory: '{config}'"), str(e.value)
        assert e.value.filename == str(config), e.value.filename
    else:
        with pytest.raises(IsADirectoryError) as e:
            read(tmp_path)
        assert str(e.value) == f"[Errno 21] cannot read: it is a directory, not a file: '{tmp_path}'", str(e.value)
        assert e.value.errno == errno.EISDIR and e.value.filename == str(tmp_path), e.value
    malformed = tmp_path / "malformed.txt"
    malformed.write_bytes(b"\xff" * 20)
    with pytest.raises(ValueError, match="malformed.txt") as e:
        read(malformed)
    assert not isinstance(e.value, OSError), repr(e.value)
