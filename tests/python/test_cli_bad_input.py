"""Bad input through the `qkv` command: each case checks the exit code (2 usage, 1 bad input), that
stderr is one line naming the file or argument and the fault, and that no output file (nor a
temporary) is left behind. N = 0 is not an error: it gives an empty [.., 0, Dv] output
(test_cli_reference.py); D = 0 is refused."""
import os
import re
import resource
import struct
import subprocess
import time

import numpy as np
import pytest

from qkv_testlib import leftovers, write_layer, write_safetensors


def check_failure(proc, code, *needles, directory=None, inputs=()):
    message = proc.stderr.strip()
    assert proc.returncode == code, f"exit {proc.returncode}, stderr: {proc.stderr!r}"
    assert message and "\n" not in message, f"not one line: {proc.stderr!r}"
    for needle in needles:
        assert str(needle) in message, f"{needle!r} not in {message!r}"
    assert "Segmentation" not in message and "terminate" not in message
    if directory is not None:
        assert leftovers(directory, keep=[os.path.basename(str(i)) for i in inputs]) == [], \
            f"a failed run left files behind: {leftovers(directory, keep=inputs)}"


class Attend:
    """q/k/v .npy inputs in a directory, and a runner of `qkv attend` that checks for leftovers."""
    def __init__(self, run, directory, rng, q=(2, 3, 5, 4), k=(2, 3, 6, 4), v=(2, 3, 6, 3), dtype=np.float64):
        self.run, self.dir = run, directory
        self.inputs = []
        for name, shape in (("q", q), ("k", k), ("v", v)):
            self.save(name + ".npy", rng.standard_normal(shape).astype(dtype))

    def save(self, name, array):
        np.save(self.dir / name, array)
        self.inputs.append(name)
        return self.dir / name

    def write(self, name, data):
        (self.dir / name).write_bytes(data)
        self.inputs.append(name)
        return self.dir / name

    def __call__(self, *extra, q="q.npy", k="k.npy", v="v.npy", out="out.npy", lse="lse.npy"):
        args = ["attend", "--q", self.dir / q, "--k", self.dir / k, "--v", self.dir / v]
        if out:
            args += ["--out", self.dir / out]
        if lse:
            args += ["--lse", self.dir / lse]
        return self.run(*args, *extra)

    def fails(self, code, *needles, extra=(), **kw):
        proc = self(*extra, **kw)
        check_failure(proc, code, *needles, directory=self.dir, inputs=self.inputs)
        return proc


@pytest.fixture
def attend(run, tmp_path, seed):
    return Attend(run, tmp_path, np.random.default_rng(seed))


# ---- files that are missing, unreadable, truncated or garbled ----

def test_missing_input_file(attend):
    attend.fails(1, "nope.npy", q="nope.npy")


def test_directory_as_input(attend):
    (attend.dir / "adir").mkdir()
    attend.inputs.append("adir")
    attend.fails(1, "adir", "it is a directory, not a file", q="adir")


def test_device_and_fifo_as_input(attend, run):
    """A stream with no end (/dev/zero) or no writer (a FIFO) is refused at once, not read forever
    or waited on: the FIFO once blocked `qkv` in open() until a writer came."""
    attend.fails(1, "/dev/zero", "not a regular file", k="/dev/zero")
    os.mkfifo(attend.dir / "fifo")
    attend.inputs.append("fifo")
    start = time.monotonic()
    attend.fails(1, "fifo", "not a regular file", v="fifo")
    proc = run("explain", "hello world", "--embeddings", attend.dir / "fifo", "--random-weights", "0", timeout=20)
    check_failure(proc, 1, "fifo", "not a regular file")
    assert time.monotonic() - start < 15


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_input_file(attend):
    os.chmod(attend.dir / "k.npy", 0)
    attend.fails(1, "k.npy")


def test_truncated_npy(attend):
    data = (attend.dir / "k.npy").read_bytes()
    attend.write("short.npy", data[:-7])
    attend.fails(1, "short.npy", k="short.npy")


@pytest.mark.parametrize("garble", ["magic", "header", "random", "empty", "dtype", "huge_shape"])
def test_garbled_npy(attend, seed, garble):
    data = bytearray((attend.dir / "q.npy").read_bytes())
    if garble == "magic":
        data[1:6] = b"NUMPZ"
    elif garble == "header":
        start = data.index(b"{")
        data[start:start + 10] = b"{'descr'::"
    elif garble == "random":
        data = np.random.default_rng(seed).integers(0, 256, 300, dtype=np.uint8).tobytes()
    elif garble == "empty":
        data = b""
    elif garble == "dtype":
        data = bytes(data).replace(b"'<f8'", b"'<c8'")
    else:
        # A shape far larger than the file, keeping the header's length (eat padding spaces).
        big = b"(2, 3, 5, 9999999999)"
        data = bytes(data).replace(b"(2, 3, 5, 4)", big).replace(b" " * (len(big) - 12) + b"\n", b"\n", 1)
    attend.write("bad.npy", bytes(data))
    attend.fails(1, "bad.npy", q="bad.npy")


def _npy_with_header(header, data):
    """A format 1.0 .npy file with the header dict text `header`, padded as numpy pads it."""
    text = header.encode("latin1")
    text += b" " * ((64 - (10 + len(text) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data


@pytest.mark.parametrize("descr, shape, needle", [
    (r"'<\f8'", "(2, 3, 5, 4)", 'unsupported .npy dtype "<\\x0c8"'),  # a form feed, not '<f8'
    (r"'\<f8'", "(2, 3, 5, 4)", 'unsupported .npy dtype "\\\\<f8"'),
    ("'<f8'", "[2, 3, 5, 4]", "'shape' is not a tuple (it is a list, which numpy refuses)"),
    ("'<f8'", "(120)", "'shape' is not a tuple"),
    ("'<f8'", "(02, 3, 5, 4)", 'the integer "02" has a leading zero'),
])
def test_npy_headers_numpy_refuses(attend, descr, shape, needle):
    """Headers numpy refuses (each was read: the escapes as '<f8', the list and (120) as shapes, 02
    as 2) are refused with the file named."""
    data = np.load(attend.dir / "q.npy").astype("<f8").tobytes()
    attend.write("bad.npy", _npy_with_header(f"{{'descr': {descr}, 'fortran_order': False, 'shape': {shape}, }}",
                                             data))
    attend.fails(1, "bad.npy", needle, q="bad.npy")


@pytest.mark.parametrize("descr", ["'f8'", "'=f8'", "'|f8'", r"'<\x668'"])
def test_npy_native_byte_order_is_float64(attend, descr):
    """numpy reads 'f8', '=f8' and '|f8' (and '<f8' spelled with an escape) as little-endian float64
    here: qkv refused 'f8' and '|f8', and ran '=f8' in float32 (it tested the descr's text for '<f8')."""
    assert attend("--kernel", "reference", lse="").returncode == 0
    want = np.load(attend.dir / "out.npy")
    assert want.dtype == np.float64
    for name in ("q", "k", "v"):
        a = np.load(attend.dir / f"{name}.npy")
        attend.write(f"n{name}.npy", _npy_with_header(
            f"{{'descr': {descr}, 'fortran_order': False, 'shape': {a.shape}, }}", a.astype("<f8").tobytes()))
    proc = attend("--kernel", "reference", q="nq.npy", k="nk.npy", v="nv.npy", out="nout.npy", lse="")
    assert proc.returncode == 0, proc.stderr
    got = np.load(attend.dir / "nout.npy")
    assert got.dtype == np.float64 and np.array_equal(got, want)


# ---- shapes ----

@pytest.mark.parametrize("shapes, needle", [
    (dict(k=(2, 3, 6, 5)), "head dims differ"),
    (dict(v=(2, 3, 7, 3)), "must agree"),
    (dict(k=(2, 2, 6, 4), v=(2, 2, 6, 3)), "multiple"),
    (dict(k=(1, 3, 6, 4), v=(1, 3, 6, 3)), "batch sizes differ"),
    (dict(q=(5, 4)), "ranks differ"),
    (dict(q=(7,), k=(7,), v=(7,)), "expected a 2-D"),
    (dict(q=(5, 0), k=(6, 0), v=(6, 3)), "head dim D must be at least 1"),
    (dict(v=(2, 3, 6, 0)), "Dv must be at least 1"),
])
def test_mismatched_shapes(run, tmp_path, seed, shapes, needle):
    dims = dict(q=(2, 3, 5, 4), k=(2, 3, 6, 4), v=(2, 3, 6, 3))
    dims.update(shapes)
    a = Attend(run, tmp_path, np.random.default_rng(seed), **dims)
    a.fails(1, needle, "q.npy")


@pytest.mark.parametrize("make, needle", [
    (lambda: np.ones((4, 6), dtype=bool), "--keep-mask"),
    (lambda: np.ones((2, 2, 5, 6), dtype=bool), "does not broadcast"),
    (lambda: np.ones((), dtype=bool), "scalar"),
])
def test_keep_mask_shape(attend, make, needle):
    attend.save("keep.npy", make())
    attend.fails(1, needle, "keep.npy", extra=["--keep-mask", attend.dir / "keep.npy"])


def test_bias_shape_and_values(attend, seed):
    attend.save("bias.npy", np.zeros((3, 5, 7), dtype=np.float32))
    attend.fails(1, "--bias", "bias.npy", "does not broadcast", extra=["--bias", attend.dir / "bias.npy"])
    bias = np.zeros((5, 6), dtype=np.float32)
    bias[3, 2] = np.nan
    attend.save("nanbias.npy", bias)
    attend.fails(1, "nanbias.npy: element [3, 2] is NaN", extra=["--bias", attend.dir / "nanbias.npy"])


@pytest.mark.parametrize("extra, needle", [
    (["--key-lengths", "3"], "key_lengths: expected 2 entries"),
    (["--key-lengths", "3,7"], "key_lengths[1] = 7 is outside [0, 6]"),
    (["--query-lengths", "-1,2"], "query_lengths[0] = -1"),
    (["--alibi-slopes", "0.5,0.25"], "alibi_slopes: expected 3 entries (one per query head), got 2"),
    (["--scale", "inf"], "scale must be finite"),
])
def test_mask_arguments_against_shapes(attend, extra, needle):
    attend.fails(1, needle, extra=extra)


# ---- non-finite values ----

@pytest.mark.parametrize("tensor, index, value, word", [
    ("q", (1, 2, 3, 0), np.nan, "NaN"),
    ("k", (0, 1, 5, 3), np.inf, "+Inf"),
    ("v", (1, 0, 0, 2), -np.inf, "-Inf"),
])
def test_non_finite_inputs(attend, tensor, index, value, word):
    array = np.load(attend.dir / f"{tensor}.npy")
    array[index] = value
    attend.save(f"{tensor}.npy", array)
    attend.fails(1, f"{tensor}.npy: element [{', '.join(map(str, index))}] is {word}")


def test_non_finite_float32_inputs(run, tmp_path, seed):
    a = Attend(run, tmp_path, np.random.default_rng(seed), q=(5, 4), k=(6, 4), v=(6, 3), dtype=np.float32)
    q = np.load(tmp_path / "q.npy")
    q[4, 1] = np.nan
    a.save("q.npy", q)
    a.fails(1, "q.npy: element [4, 1] is NaN")


def test_overflowing_scores_are_refused_not_nan(run, tmp_path, seed):
    a = Attend(run, tmp_path, np.random.default_rng(seed), q=(3, 2), k=(4, 2), v=(4, 2))
    a.save("q.npy", np.full((3, 2), 1e300))
    a.save("k.npy", np.full((4, 2), 1e300))
    # The float64 reference refuses scores past its range itself (it returned NaN, which the command
    # then reported as "output of attention ... is NaN").
    a.fails(1, "reference_attention_forward: the output overflowed float64 although q, k and v are finite",
            extra=["--kernel", "reference"])


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_])
def test_integer_and_bool_inputs_are_refused(run, tmp_path, seed, dtype):
    """Python refuses integer arrays; the command used to convert them silently."""
    a = Attend(run, tmp_path, np.random.default_rng(seed), q=(3, 2), k=(4, 2), v=(4, 2))
    a.save("k.npy", np.ones((4, 2), dtype=dtype))
    a.fails(1, "--k", "k.npy", f"holds dtype '{np.dtype(dtype).str}'", "floating-point")


def test_window_bound_of_int64_max_means_unbounded(run, tmp_path, seed):
    """`--window 0,9223372036854775807` overflowed in the mask and returned all zeros."""
    a = Attend(run, tmp_path, np.random.default_rng(seed), q=(2, 5, 4), k=(2, 7, 4), v=(2, 7, 3))
    for huge, plain in (("0,9223372036854775807", "0,-1"), ("9223372036854775807,0", "-1,0")):
        for name, window in (("huge.npy", huge), ("plain.npy", plain)):
            proc = a(f"--window={window}", out=name, lse=None)
            assert proc.returncode == 0, proc.stderr
        got, want = np.load(tmp_path / "huge.npy"), np.load(tmp_path / "plain.npy")
        assert np.abs(want).max() > 0
        np.testing.assert_array_equal(got, want)


# ---- outputs ----

def test_output_directory_missing(attend):
    attend.fails(1, "--out", "does not exist", out="no/such/dir/out.npy")


def test_output_is_a_directory(attend):
    (attend.dir / "outdir").mkdir()
    attend.inputs.append("outdir")
    attend.fails(1, "outdir", "is a directory", out="outdir")


def test_second_output_unwritable_leaves_nothing(attend):
    attend.fails(1, "--lse", "does not exist", lse="missing/lse.npy")


def test_same_path_for_two_outputs(attend):
    attend.fails(1, "out.npy", "two outputs", lse="out.npy")


def test_failure_keeps_an_existing_output(attend):
    """A failed run leaves an existing output file as it was (outputs are renamed into place)."""
    attend.save("out.npy", np.arange(3.0))
    attend.fails(1, "nope.npy", q="nope.npy")
    assert np.array_equal(np.load(attend.dir / "out.npy"), np.arange(3.0))


# ---- usage errors: exit code 2 ----

@pytest.mark.parametrize("extra, needle", [
    (["--bogus"], "--bogus"),
    (["--causal=diagonal"], "--causal"),
    (["--key-lengths", "3,x"], "'x' is not an integer"),
    (["--window", "1"], "--window"),
    (["--alibi-slopes", "0.5,,1"], "empty entry"),
    (["--softcap", "-1"], "--softcap"),
    (["--kernel", "gpu"], "--kernel"),
    (["--threads", "0"], "--threads"),
])
def test_bad_options(attend, extra, needle):
    attend.fails(2, needle, extra=extra)


@pytest.mark.parametrize("value, needle", [
    ("inf", "--softcap: softcap must be a finite number >= 0 (0 = off), got inf"),
    ("-inf", "--softcap: softcap must be a finite number >= 0 (0 = off), got -inf"),
    ("nan", "--softcap: softcap must be a finite number >= 0 (0 = off), got nan"),
    ("1e400", "--softcap: softcap must be a finite number >= 0 (0 = off), got inf"),
    ("-1", "--softcap: softcap must be a finite number >= 0 (0 = off), got -1"),
    ("abc", "--softcap: 'abc' is not a number"),
])
def test_softcap_errors_echo_the_value_readably(attend, value, needle):
    """CLI11's own range check printed DBL_MAX as a 309-digit number; the rule's message (Python's) is short."""
    proc = attend.fails(2, needle, extra=["--softcap", value])
    assert not re.search(r"\d{25}", proc.stderr) and len(proc.stderr) < 120, proc.stderr


@pytest.mark.parametrize("args, needle", [
    (["attend", "--threads", "0"], "--threads: '0' is outside 1 to 4096"),
    (["attend", "--threads", "2.5"], "--threads: '2.5' is not an integer (expected 1 to 4096)"),
    (["attend", "--threads", "99999999999999999999999"], "--threads: '99999999999999999999999' is outside 1 to 4096"),
    (["train", "--lr", "0"], "--lr: '0' must be > 0"),
    (["train", "--lr", "inf"], "--lr: 'inf' is not a finite number"),
    (["train", "--clip", "1e999"], "--clip: '1e999' is not a finite number"),
    (["train", "--weight-decay", "-0.5"], "--weight-decay: '-0.5' must be >= 0"),
    (["train", "--warmup", "-1"], "--warmup: '-1' must be >= 0"),
    (["train", "--warmup", "1e400"], "--warmup: '1e400' is not an integer (expected >= 0)"),
    (["train", "--checkpoint-every", "99999999999999999999"], "is beyond the 64-bit integer range"),
    (["train", "--steps", "99999999999999"], "--steps: '99999999999999' is outside 0 to 1099511627776"),
    (["train", "--pairs", "x" * 100], "--pairs: '" + "x" * 40 + "...' is not an integer"),
    (["context", "--precision", "10", "bank"], "--precision: '10' is outside 1 to 9"),
    (["explain", "--heads", "0"], "--heads: '0' is outside 1 to 4096"),
])
def test_numeric_option_errors_echo_the_value_readably(run, tmp_path, args, needle):
    proc = run(*args, cwd=tmp_path)
    check_failure(proc, 2, needle, directory=tmp_path)
    assert not re.search(r"\d{30}", proc.stderr) and len(proc.stderr) < 160, proc.stderr


def test_missing_required_option(attend):
    attend.fails(2, "--out", out=None)


@pytest.mark.parametrize("args, needle", [
    (["frobnicate"], "frobnicate"),
    ([], "subcommand"),
    (["explain", "a sentence"], "no word vectors: pass --embeddings F, set QKV_EMBEDDINGS"),
    (["explain", "--example", "nope"], "--example"),
    (["explain", "--heads", "2"], "apply only to a sentence"),
    (["context", "hello"], "--embeddings"),
    (["compare", "--embeddings", "e.txt", "--random-weights", "0", "--word", "bank", "only one sentence"], "sentences"),
])
def test_usage_errors(run, tmp_path, monkeypatch, args, needle):
    monkeypatch.setenv("QKV_EMBEDDINGS", "")  # no default word vectors (docs/cli.md)
    proc = run(*args, cwd=tmp_path)
    check_failure(proc, 2, needle, directory=tmp_path)


# ---- embeddings files, sentences, layer files ----

@pytest.mark.parametrize("content, needle", [
    ("bank 0.1 0.2 0.3\nriver 0.1 0.2\n", "line 2"),
    ("bank 0.1 0.2 0.3\nriver 0.1 zero 0.3\n", "line 2"),
    ("", "glove.txt"),
    ("3 3\nbank 0.1 0.2 0.3\n", "glove.txt"),
])
def test_garbled_glove_and_word2vec_text(run, tmp_path, content, needle):
    (tmp_path / "glove.txt").write_text(content)
    proc = run("context", "--embeddings", tmp_path / "glove.txt", "--random-weights", "0", "--out", tmp_path / "o.npy", "--format", "npy",
               "river bank")
    check_failure(proc, 1, needle, directory=tmp_path, inputs=["glove.txt"])


@pytest.mark.parametrize("cut", [2, 5, 20])  # 1 would only drop the optional final newline
def test_truncated_word2vec_binary(run, embeddings, tmp_path, cut):
    data = embeddings.w2v_bin.read_bytes()
    bad = tmp_path / "cut.bin"
    bad.write_bytes(data[:-cut])
    proc = run("context", "--embeddings", bad, "--random-weights", "0", "--out", tmp_path / "o.npy", "--format", "npy", "river bank")
    check_failure(proc, 1, "cut.bin", directory=tmp_path, inputs=["glove.txt", "w2v.txt", "w2v.bin", "cut.bin"])


def test_garbled_word2vec_binary_header(run, embeddings, tmp_path):
    data = embeddings.w2v_bin.read_bytes()
    bad = tmp_path / "big.bin"
    bad.write_bytes(b"99999999 300\n" + data[data.index(b"\n") + 1:])
    proc = run("explain", "--embeddings", bad, "--random-weights", "0", "river bank")
    check_failure(proc, 1, "big.bin")


TWO_TB = 2 << 40


@pytest.mark.parametrize("head, needle", [
    (b"1000 300\n", "word 1 of 1000"),                    # word2vec header, then zeros: detected as binary
    (b"the 0.1 0.2\n", "line 2 has no newline within 1048576 bytes"),  # GloVe, then zeros
    (b"", "line 1 has no newline within 1048576 bytes"),   # zeros only
])
def test_sparse_2tb_embeddings_file_is_refused_within_seconds(run, tmp_path, head, needle):
    """Detection and parsing read at most 1 MiB per line; before, such a file was scanned whole
    (about 14 s per 4 GiB, hours for 2 TB)."""
    path = tmp_path / "huge.vec"
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(TWO_TB)  # sparse: no disk used
    start = time.monotonic()
    proc = run("context", "--embeddings", path, "--random-weights", "0", "--format", "npy", "--out", tmp_path / "o.npy", "river bank")
    seconds = time.monotonic() - start
    check_failure(proc, 1, "huge.vec", needle, directory=tmp_path, inputs=["huge.vec"])
    assert seconds < 5, f"took {seconds:.1f} s"


@pytest.mark.parametrize("header", ["", "2 3\n"])
def test_embeddings_line_longer_than_1mib_is_refused(run, tmp_path, header):
    rows = "bank 0.1 0.2 0.3" + " " * (1 << 20) + "\nriver 0.4 0.5 0.6\n"
    (tmp_path / "long.txt").write_text(header + rows)
    proc = run("context", "--embeddings", tmp_path / "long.txt", "--random-weights", "0", "river bank")
    line = 2 if header else 1
    check_failure(proc, 1, "long.txt", f"line {line} has no newline within 1048576 bytes (1 MiB")


def _asan_binary(path):
    with open(path, "rb") as f:
        return b"__asan_init" in f.read()


@pytest.mark.parametrize("kind", ["npy", "word2vec_binary"])
def test_declared_size_beyond_physical_memory_is_refused(qkv_bin, tmp_path, seed, kind):
    """A sparse file consistent with its header that declares more than the machine's RAM: one line
    stating both sizes, not an allocation failure or the OOM killer. The word2vec case is a file
    smaller than RAM whose 180 bytes per one-float word (value, string, two lookup-table entries)
    exceed it."""
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE")
    rng = np.random.default_rng(seed)
    for name, shape in (("q", (3, 4)), ("k", (5, 4)), ("v", (5, 2))):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal(shape).astype(np.float32))
    if kind == "npy":
        n = ram // 4 + (1 << 28)  # float32 values: RAM + 1 GiB
        text = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({n},), }}"
        text += " " * ((64 - (10 + len(text) + 1) % 64) % 64) + "\n"
        head, size, need = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode(), 4 * n, 4 * n
        name = "huge.npy"
        args = ["attend", "--q", tmp_path / "q.npy", "--k", tmp_path / name, "--v", tmp_path / "v.npy",
                "--out", tmp_path / "out.npy"]
    else:
        words = ram // 160 + 1
        head, size, need = f"{words} 1\n".encode(), 6 * words, 180 * words
        name = "huge.bin"
        args = ["context", "--embeddings", tmp_path / name, "--random-weights", "0", "--format", "npy", "--out", tmp_path / "out.npy", "bank"]
    with open(tmp_path / name, "wb") as f:
        f.write(head)
        f.truncate(len(head) + size)
    cap = len(head) + size + (4 << 30)  # the mapping plus 4 GiB: a loader that did allocate would fail

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    proc = subprocess.run([qkv_bin, *map(str, args)], capture_output=True, text=True, timeout=60,
                          preexec_fn=None if _asan_binary(qkv_bin) else cap_memory)
    check_failure(proc, 1, name, f"needs {need} bytes", f"more than the {ram} bytes", "of physical memory",
                  directory=tmp_path, inputs=["q.npy", "k.npy", "v.npy", name])


def test_missing_embeddings_file(run, tmp_path):
    proc = run("explain", "--embeddings", tmp_path / "nope.txt", "--random-weights", "0", "river bank")
    check_failure(proc, 1, "nope.txt", directory=tmp_path)


@pytest.mark.parametrize("command", ["explain", "context"])
@pytest.mark.parametrize("sentence", ["", "  ", "!!! ..."])
def test_empty_sentence(run, embeddings, command, sentence):
    proc = run(command, "--embeddings", embeddings.glove, sentence)
    check_failure(proc, 1, "has no words")


@pytest.mark.parametrize("policy", ["error", "zero", "skip"])
def test_all_words_out_of_vocabulary(run, embeddings, tmp_path, policy):
    proc = run("context", "--embeddings", embeddings.glove, "--random-weights", "0", "--oov", policy, "--format", "npy", "--out",
               tmp_path / "o.npy", "zyzzyva quux")
    check_failure(proc, 1, "zyzzyva", "quux", directory=tmp_path, inputs=["glove.txt", "w2v.txt", "w2v.bin"])


def test_some_words_out_of_vocabulary_listed(run, embeddings):
    proc = run("explain", "--embeddings", embeddings.glove, "--random-weights", "0", "the zyzzyva bank quux")
    check_failure(proc, 1, "zyzzyva", "quux")


def test_nan_in_an_embedding(run, embeddings, tmp_path):
    text = embeddings.glove.read_text().splitlines()
    i = next(n for n, line in enumerate(text) if line.startswith("bank "))
    parts = text[i].split()
    parts[3] = "nan"
    text[i] = " ".join(parts)
    (tmp_path / "nan.txt").write_text("\n".join(text) + "\n")
    proc = run("context", "--embeddings", tmp_path / "nan.txt", "--random-weights", "0", "river bank")
    check_failure(proc, 1, "nan.txt", "bank")


@pytest.mark.parametrize("damage", ["truncated", "header", "length", "missing_tensor", "wrong_shape", "nan", "width"])
def test_bad_layer_file(run, embeddings, tmp_path, seed, damage):
    rng = np.random.default_rng(seed)
    E = embeddings.matrix.shape[1]
    path = tmp_path / "layer.safetensors"
    w = write_layer(path, rng, E=E if damage != "width" else E + 1, H=2, D=3)
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[:-10])
    elif damage == "header":
        path.write_bytes(data[:8] + b"{not json" + data[17:])
    elif damage == "length":
        path.write_bytes(struct.pack("<Q", 1 << 40) + data[8:])
    elif damage in ("missing_tensor", "wrong_shape", "nan"):
        meta = {"qkv.format": "qkv.MultiHeadAttention/1", "qkv.embed_dim": str(E), "qkv.num_heads": "2",
                "qkv.num_kv_heads": "2", "qkv.head_dim": "3", "qkv.value_dim": "3", "qkv.bias": "0",
                "qkv.output_projection": "1", "qkv.parameter_free": "0"}
        tensors = {k: v.astype(np.float32) for k, v in w.items()}
        if damage == "missing_tensor":
            del tensors["w_k"]
        elif damage == "wrong_shape":
            tensors["w_v"] = tensors["w_v"][:, :5]
        else:
            tensors["w_q"][1, 2] = np.nan
        write_safetensors(path, tensors, meta)
    out = tmp_path / "o.npy"
    proc = run("context", "--embeddings", embeddings.glove, "--weights", path, "--format", "npy", "--out", out,
               "river bank")
    needle = {"missing_tensor": "w_k", "wrong_shape": "w_v", "nan": "w_q", "width": "width"}.get(damage, "layer")
    check_failure(proc, 1, "layer.safetensors", needle, directory=tmp_path,
                  inputs=["glove.txt", "w2v.txt", "w2v.bin", "layer.safetensors"])


def test_weights_excludes_random_layer_options(run, embeddings, tmp_path):
    proc = run("context", "--embeddings", embeddings.glove, "--weights", tmp_path / "x", "--heads", "2", "bank")
    check_failure(proc, 2, "--weights", "--heads")


@pytest.mark.parametrize("word, needle", [
    ("grows", "not in sentence 1"),
    ("zyzzyva", "not in the vocabulary"),
    ("river bank", "exactly one word"),
])
def test_compare_word_problems(run, embeddings, word, needle):
    proc = run("compare", "--embeddings", embeddings.glove, "--random-weights", "0", "--word", word, "I went to the bank",
               "river bank")
    check_failure(proc, 1, needle)


def test_heads_must_divide_width(run, embeddings):
    proc = run("context", "--embeddings", embeddings.glove, "--heads", "4", "river bank")
    check_failure(proc, 1, "--heads 4", "--dk")


@pytest.mark.parametrize("kind", ["npy", "word2vec_binary", "safetensors"])
def test_mutated_files_never_crash(run, embeddings, tmp_path, seed, kind):
    """Random byte flips and truncations: every run ends in success or one error line, never a
    signal, and a failed run leaves no output."""
    rng = np.random.default_rng(seed)
    if kind == "npy":
        np.save(tmp_path / "k.npy", rng.standard_normal((3, 4)))
        np.save(tmp_path / "v.npy", rng.standard_normal((3, 2)))
        np.save(tmp_path / "base", rng.standard_normal((2, 4)))
        base = (tmp_path / "base.npy").read_bytes()
        args = ["attend", "--q", tmp_path / "m.dat", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy"]
    elif kind == "word2vec_binary":
        base = embeddings.w2v_bin.read_bytes()
        args = ["context", "--embeddings", tmp_path / "m.dat", "--random-weights", "0", "--format", "npy"]
    else:
        write_layer(tmp_path / "layer.safetensors", rng, E=embeddings.matrix.shape[1], H=2, D=3)
        base = (tmp_path / "layer.safetensors").read_bytes()
        args = ["context", "--embeddings", embeddings.glove, "--weights", tmp_path / "m.dat", "--format", "npy"]
    if kind != "npy":
        args.append("we sat by the river bank")
    for trial in range(40):
        data = bytearray(base)
        for _ in range(int(rng.integers(1, 6))):
            # Mostly the header, where the parsing is.
            limit = min(len(data), 160) if rng.random() < 0.7 else len(data)
            data[int(rng.integers(0, limit))] = int(rng.integers(0, 256))
        if rng.random() < 0.3:
            data = data[:int(rng.integers(0, len(data)))]
        (tmp_path / "m.dat").write_bytes(bytes(data))
        out = tmp_path / "out.npy"
        proc = run(*args, "--out", out)
        context = f"seed {seed}, trial {trial}: exit {proc.returncode}, stderr {proc.stderr!r}"
        assert proc.returncode in (0, 1), context
        if proc.returncode == 1:
            assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("qkv: error: "), context
            assert not out.exists(), context
        else:
            out.unlink()
        assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name], context
