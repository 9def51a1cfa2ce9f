"""Every output option of `qkv` against every kind of target (the rule is in
include/qkv/output_file.h): regular files are replaced atomically, through symlinks; character
devices and FIFOs are written in place; everything else is refused with one line, exit 1, and
nothing touched. Device nodes and a full filesystem need root (mknod, mount); without it those
cases are skipped with the reason."""
import contextlib
import os
import socket
import stat
import subprocess
import threading

import numpy as np
import pytest

from qkv_testlib import write_layer

IS_ROOT = os.geteuid() == 0


def _attend_inputs(d, rng):
    for name, shape in (("q", (2, 3, 4)), ("k", (2, 5, 4)), ("v", (2, 5, 3))):
        np.save(d / f"{name}.npy", rng.standard_normal(shape))
    return ["attend", "--q", d / "q.npy", "--k", d / "k.npy", "--v", d / "v.npy"]


def _outputs():
    """(option id, builder(inputs_dir, embeddings, rng, target) -> argv). Every output option."""
    def attend(option):
        def build(d, emb, rng, target):
            argv = _attend_inputs(d, rng)
            if option != "--out":
                argv += ["--out", d / "main_out.npy"]
            return argv + [option, target]
        return build

    def sentence(command, option, extra=()):
        def build(d, emb, rng, target):
            return [command, "--embeddings", emb.glove, "--random-weights", "0", *extra, "the river bank", option,
                    target]
        return build

    def train(option):
        def build(d, emb, rng, target):
            return ["train", "--steps", "3", "--batch", "2", "--pairs", "2", "--keys", "4", "--values", "4",
                    "-E", "8", "--eval-examples", "4", "--threads", "1", option, target]
        return build

    compare = lambda d, emb, rng, target: [  # noqa: E731
        "compare", "--embeddings", emb.glove, "--random-weights", "0", "--word", "bank", "the river bank", "the bank",
        "--html", target]
    return [
        ("attend--out", attend("--out")),
        ("attend--lse", attend("--lse")),
        ("attend--weights", attend("--weights")),
        ("context--out", sentence("context", "--out", ("--format", "npy"))),
        ("context--html", sentence("context", "--html")),
        ("explain--html", sentence("explain", "--html")),
        ("explain--svg", sentence("explain", "--svg")),
        ("compare--html", compare),
        ("train--save", train("--save")),
        ("train--checkpoint", train("--checkpoint")),
    ]


OUTPUTS = _outputs()


@pytest.fixture(params=OUTPUTS, ids=[o[0] for o in OUTPUTS])
def output(request, tmp_path, embeddings, seed, qkv_bin):
    """Runs the option's command with a given target; `expected` is what it writes to a new file."""
    name, build = request.param
    inputs = tmp_path / "in"
    inputs.mkdir()

    class Output:
        id = name

        def run(self, target, **kw):
            argv = build(inputs, embeddings, np.random.default_rng(seed), target)
            # Rebuilding the inputs with the same seed gives the same bytes each run.
            return subprocess.run([qkv_bin, *map(str, argv)], capture_output=True, timeout=120, **kw)

    out = Output()
    first = inputs / "expected.bin"
    proc = out.run(first)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    out.expected = first.read_bytes()
    out.dir = tmp_path / "t"
    out.dir.mkdir()
    return out


def one_line_failure(proc, *needles):
    err = proc.stderr.decode(errors="replace").strip()
    assert proc.returncode == 1, f"exit {proc.returncode}, stderr: {err!r}"
    last = err.splitlines()[-1]  # train prints progress lines before a failure after training
    if not err.startswith("[") and "step " not in err:
        assert "\n" not in err, f"not one line: {err!r}"
    for n in needles:
        assert n in last, f"{n!r} not in {last!r}"
    assert "terminate" not in err and "Segmentation" not in err


def entries(d):
    return sorted(p.name for p in d.iterdir())


def test_new_file(output):
    target = output.dir / "new.bin"
    assert output.run(target).returncode == 0
    assert target.read_bytes() == output.expected
    assert entries(output.dir) == ["new.bin"]


def test_existing_file_is_replaced_keeping_its_mode(output):
    target = output.dir / "old.bin"
    target.write_bytes(b"old contents")
    target.chmod(0o640)
    assert output.run(target).returncode == 0
    assert target.read_bytes() == output.expected
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    keep = ["old.bin", "old.bin.prev"] if output.id == "train--checkpoint" else ["old.bin"]
    assert entries(output.dir) == keep


def test_symlink_to_a_file_is_written_through(output):
    real = output.dir / "sub" / "real.bin"
    real.parent.mkdir()
    real.write_bytes(b"stale")
    link = output.dir / "link.bin"
    link.symlink_to(os.path.join("sub", "real.bin"))  # relative, resolved from the link's directory
    assert output.run(link).returncode == 0
    assert link.is_symlink() and os.readlink(link) == os.path.join("sub", "real.bin")
    assert real.read_bytes() == output.expected
    expect = ["real.bin", "real.bin.prev"] if output.id == "train--checkpoint" else ["real.bin"]
    assert entries(real.parent) == expect


def test_dangling_symlink_creates_its_target(output):
    link = output.dir / "link.bin"
    link.symlink_to(output.dir / "created.bin")
    assert output.run(link).returncode == 0
    assert link.is_symlink() and (output.dir / "created.bin").read_bytes() == output.expected


def test_dangling_symlink_into_a_missing_directory_is_refused(output):
    link = output.dir / "link.bin"
    link.symlink_to(output.dir / "missing" / "x.bin")
    one_line_failure(output.run(link), "link.bin", "does not exist")
    assert entries(output.dir) == ["link.bin"] and link.is_symlink()


def test_symlink_to_itself_is_refused(output):
    """A name whose status cannot be read (a link to itself) is refused with the output rule's one
    line; `train --save`, which first asks whether the name is a directory, once ended with a raw
    "filesystem error"."""
    link = output.dir / "link.bin"
    link.symlink_to("link.bin")
    r = output.run(link)
    one_line_failure(r, "link.bin", "symbolic links")
    assert b"filesystem error" not in r.stderr
    assert entries(output.dir) == ["link.bin"] and link.is_symlink()


def test_directory_is_refused(output):
    target = output.dir / "d"
    target.mkdir()
    (target / "keep").write_bytes(b"k")
    if output.id == "train--save":  # the one output a directory can take: test_train_saves_into_a_directory
        return
    one_line_failure(output.run(target), "is a directory")
    assert entries(output.dir) == ["d"] and entries(target) == ["keep"]


def test_train_saves_into_a_directory(run, tmp_path, seed):
    """`--save DIR` (an existing directory) holds the layer as .npy files plus qkv_layer.json, the
    same weights as `--save FILE.safetensors` (MultiHeadAttention::save), and loads back."""
    qkv = pytest.importorskip("qkv")
    d = tmp_path / "layer"
    d.mkdir()
    (d / "keep").write_bytes(b"k")
    train = ["train", "--steps", "2", "--batch", "2", "--pairs", "2", "--keys", "4", "--values", "4", "-E", "8",
             "--eval-examples", "4", "--threads", "1", "--seed", seed % 1000]
    r = run(*train, "--save", d)
    assert r.returncode == 0 and f"weights written to {d}" in r.stdout, (r.stdout, r.stderr)
    assert "keep" in entries(d) and "qkv_layer.json" in entries(d) and "w_q.npy" in entries(d), entries(d)
    r = run(*train, "--save", tmp_path / "layer.safetensors")
    assert r.returncode == 0, r.stderr
    from_dir = qkv.MultiHeadAttention.load(str(d))
    from_file = qkv.MultiHeadAttention.load(str(tmp_path / "layer.safetensors"))
    assert np.array_equal(from_dir.w_q, from_file.w_q) and np.array_equal(from_dir.w_v, from_file.w_v)


@pytest.mark.parametrize("inside", ["qkv_layer.json", "w_q.npy", "b_o.npy"])
def test_train_save_directory_holds_no_other_output(run, tmp_path, inside):
    """--save DIR writes a file per tensor and qkv_layer.json there: another output naming one of
    them (directly or through a link to the directory) is refused before training."""
    d = tmp_path / "layer"
    d.mkdir()
    (tmp_path / "link").symlink_to(d)
    for target in (d / inside, tmp_path / "link" / inside):
        r = run("train", "--steps", "1", "--batch", "1", "--pairs", "2", "--keys", "4", "--values", "4", "-E", "8",
                "--eval-examples", "1", "--save", d, "--loss-csv", target)
        assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
        same = "(and for --save)" if target == d / inside else f"(--save {d / inside} is the same file)"
        assert f"--loss-csv {target}: named for two outputs {same}" in r.stderr, r.stderr
        assert entries(d) == [], entries(d)


def test_a_bind_mount_does_not_hide_one_new_file_named_twice(run, tmp_path, embeddings):
    """The same directory under two paths (a bind mount, which no path rule sees through)."""
    real, bound = tmp_path / "real", tmp_path / "bound"
    real.mkdir()
    bound.mkdir()
    if subprocess.run(["mount", "--bind", str(real), str(bound)], capture_output=True).returncode != 0:
        pytest.skip("mount --bind needs root and a mount namespace that allows it")
    try:
        r = run("context", "--embeddings", embeddings.glove, "--random-weights", "0", "--format", "npy", "the bank",
                "--out", real / "o.bin", "--html", bound / "o.bin")
        assert r.returncode == 1 and "named for two outputs" in r.stderr, (r.returncode, r.stderr)
        assert entries(real) == []
    finally:
        subprocess.run(["umount", str(bound)], check=True)


# Two outputs spelled differently but leading to one file: refused before any work, nothing written.
ALIASES = {
    "dot": lambda d, name: f"{d}/./{name}",
    "dotdot": lambda d, name: f"{d}/sub/../{name}",
    "symlink": lambda d, name: (d / "link").symlink_to(name) or d / "link",
    "hardlink": lambda d, name: _hard_link(d / name, d / "hard"),
}


def _hard_link(existing, link):
    existing.write_bytes(b"old")
    os.link(existing, link)
    return link

PAIRS = [
    ("attend", lambda d, emb, rng, a, b: _attend_inputs(d, rng) + ["--out", a, "--lse", b], "--lse"),
    ("context", lambda d, emb, rng, a, b: ["context", "--embeddings", emb.glove, "--random-weights", "0", "--format",
                                           "npy", "the bank", "--out", a, "--html", b], "--html"),
    ("explain", lambda d, emb, rng, a, b: ["explain", "--example", "seed-003", "--html", a, "--svg", b], "--svg"),
    ("train-csv", lambda d, emb, rng, a, b: ["train", "--steps", "1", "--batch", "1", "--pairs", "2", "--keys", "4",
                                             "--values", "4", "-E", "8", "--eval-examples", "1", "--save", a,
                                             "--loss-csv", b], "--loss-csv"),
    ("train-checkpoint", lambda d, emb, rng, a, b: ["train", "--steps", "1", "--batch", "1", "--pairs", "2", "--keys",
                                                    "4", "--values", "4", "-E", "8", "--eval-examples", "1",
                                                    "--checkpoint", a, "--save", b], "--save"),
]


@pytest.mark.parametrize("alias", list(ALIASES))
@pytest.mark.parametrize("command, build, second", PAIRS, ids=[p[0] for p in PAIRS])
def test_one_file_named_twice_is_refused(qkv_bin, tmp_path, embeddings, seed, alias, command, build, second):
    d = tmp_path / "out"
    (d / "sub").mkdir(parents=True)
    b = ALIASES[alias](d, "o.bin")
    argv = build(d, embeddings, np.random.default_rng(seed), d / "o.bin", b)
    before = entries(d)
    proc = subprocess.run([qkv_bin, *map(str, argv)], capture_output=True, timeout=120)
    one_line_failure(proc, second, "named for two outputs", "is the same file")
    assert entries(d) == before
    if alias == "hardlink":
        assert (d / "o.bin").read_bytes() == b"old"


def test_socket_is_refused(output):
    path = output.dir / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        one_line_failure(output.run(path), "is a socket")
        assert stat.S_ISSOCK(path.lstat().st_mode)
    assert entries(output.dir) == ["s.sock"]


def _device(d, name, minor):
    if not IS_ROOT:
        pytest.skip("mknod of a character device needs root")
    path = d / name
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    return path


def _still_device(path, minor):
    st = path.lstat()
    assert stat.S_ISCHR(st.st_mode) and os.minor(st.st_rdev) == minor, "the device node was replaced"


def test_null_device_is_written_not_replaced(output):
    null = _device(output.dir, "null", 3)
    assert output.run(null).returncode == 0
    _still_device(null, 3)
    assert entries(output.dir) == ["null"]
    link = output.dir / "to-null"  # and through a symlink
    link.symlink_to(null)
    assert output.run(link).returncode == 0
    _still_device(null, 3)


def test_full_device_reports_no_space(output):
    full = _device(output.dir, "full", 7)
    one_line_failure(output.run(full), "full", "No space left on device")
    _still_device(full, 7)
    assert entries(output.dir) == ["full"]


def test_fifo_streams_to_a_reader(output):
    fifo = output.dir / "pipe"
    os.mkfifo(fifo)
    got = []

    def reader():
        with open(fifo, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    proc = output.run(fifo)
    if t.is_alive():  # the command never opened the FIFO: unblock the reader
        with open(fifo, "wb"):
            pass
    t.join(10)
    assert proc.returncode == 0, proc.stderr
    assert got == [output.expected]
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


@contextlib.contextmanager
def _full_tmpfs(directory):
    if not IS_ROOT:
        pytest.skip("mounting a small tmpfs needs root")
    directory.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(directory)]).returncode != 0:
        pytest.skip("mount -t tmpfs failed (no CAP_SYS_ADMIN in this container)")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)])


def test_full_filesystem_keeps_the_old_file(output):
    with _full_tmpfs(output.dir / "fs") as fs:
        target = fs / "out.bin"
        target.write_bytes(b"old")
        with contextlib.suppress(OSError), open(fs / "filler", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
        proc = output.run(target)
        one_line_failure(proc, "out.bin", "No space left on device")
        assert target.read_bytes() == b"old"
        keep = {"out.bin", "filler", "out.bin.prev"}  # a checkpoint's hard-linked .prev is the old file
        assert set(entries(fs)) <= keep and not any(n.startswith(".") for n in entries(fs))


@pytest.mark.parametrize("name", ["attend--out", "context--out", "explain--html"])
def test_dev_stdout_streams(name, tmp_path, embeddings, seed, qkv_bin):
    build = dict(OUTPUTS)[name]
    d = tmp_path / "in"
    d.mkdir()
    argv = build(d, embeddings, np.random.default_rng(seed), tmp_path / "file.bin")
    assert subprocess.run([qkv_bin, *map(str, argv)], capture_output=True).returncode == 0
    expected = (tmp_path / "file.bin").read_bytes()
    # /dev/fd/1 takes the same path through the rule as /dev/stdout (OutputTarget.DevFdNames...), and
    # a qkv from before the fix, which renamed over its output, cannot replace it: as root it did
    # replace the machine's /dev/stdout symlink with a regular file.
    argv = build(d, embeddings, np.random.default_rng(seed), "/dev/fd/1")
    piped = subprocess.run([qkv_bin, *map(str, argv)], capture_output=True)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.endswith(expected)
    with open(tmp_path / "redirected", "wb") as f:  # stdout redirected to a file: appended in order
        f.write(b"x")
        f.flush()
        assert subprocess.run([qkv_bin, *map(str, argv)], stdout=f).returncode == 0
    assert (tmp_path / "redirected").read_bytes() == b"x" + piped.stdout


# ---- Python save functions: the same rule (they share write_file_atomically) ----

def test_python_layer_save_follows_the_rule(tmp_path, seed):
    qkv = pytest.importorskip("qkv")
    layer = qkv.MultiHeadAttention(embed_dim=4, num_heads=1, seed=seed)
    real = tmp_path / "real"
    real.write_bytes(b"stale")
    link = tmp_path / "link"
    link.symlink_to(real)
    layer.save(str(link))
    assert link.is_symlink() and qkv.MultiHeadAttention.load(str(real)) is not None
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "missing" / "x")
    with pytest.raises(ValueError, match="dangling.*does not exist"):
        layer.save(str(dangling))
    with pytest.raises(ValueError, match="ends in '/'"):
        layer.save(str(tmp_path / "nodir") + "/")
    names = ["dangling", "link", "real"]
    if IS_ROOT:
        full = tmp_path / "full"
        os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
        with pytest.raises(ValueError, match="No space left on device"):
            layer.save(str(full))
        _still_device(full, 7)
        names.append("full")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


def test_python_layer_directory_writes_through_links(tmp_path, seed):
    qkv = pytest.importorskip("qkv")
    layer = qkv.MultiHeadAttention(embed_dim=4, num_heads=1, seed=seed)
    d = tmp_path / "layer"
    d.mkdir()
    (tmp_path / "elsewhere.npy").write_bytes(b"stale")
    layer.save(str(d))
    victim = d / sorted(p.name for p in d.iterdir() if p.suffix == ".npy")[0]
    victim.unlink()
    victim.symlink_to(tmp_path / "elsewhere.npy")
    layer.save(str(d))
    assert victim.is_symlink() and (tmp_path / "elsewhere.npy").read_bytes()[:6] == b"\x93NUMPY"
    assert not any(p.name.startswith(".") for p in d.iterdir())
