"""Hostile conditions through the Python module: embeddings text with a byte-order mark or non-UTF-8 words,
a MultiHeadAttention or KVCache shared by threads, tight memory, hostile arguments and paths (Ctrl-C
during a long call: test_py_interrupt.py)."""
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import qkv
from py_oracle import rng_for, seed_note


# ---- embeddings text (cause 2) ----

def test_byte_order_mark_is_skipped(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbfthe 1 2\nbank 3 4\n")
    words, matrix = qkv.load_embeddings(str(path))
    assert words == ["the", "bank"]
    assert qkv.Embeddings.load(str(path)).find("the") == 0


@pytest.mark.parametrize("fmt", ["glove", "word2vec_text"])
def test_non_utf8_word_names_the_file_and_line(tmp_path, fmt):
    path = tmp_path / "latin1.txt"
    header = b"3 2\n" if fmt == "word2vec_text" else b""
    path.write_bytes(header + b"the 1 2\n\ncaf\xe9 3 4\nbank 5 6\n")
    line = 4 if fmt == "word2vec_text" else 3
    for load in (qkv.load_embeddings, qkv.Embeddings.load):
        with pytest.raises(ValueError) as err:
            load(str(path))
        message = str(err.value)
        assert str(path) in message and f"line {line}" in message and "not valid UTF-8" in message, message
        assert "caf\\xe9" in message, message


def test_non_utf8_word_in_a_binary_file_names_the_word(tmp_path):
    path = tmp_path / "latin1.bin"
    row = lambda w, a: w + b" " + np.array(a, dtype="<f4").tobytes() + b"\n"  # noqa: E731
    path.write_bytes(b"2 2\n" + row(b"the", [1, 2]) + row(b"\xff\xfe", [3, 4]))
    with pytest.raises(ValueError, match=r"word 2\b.*: the word '\\xff\\xfe' is not valid UTF-8"):
        qkv.load_embeddings(str(path), format="word2vec_binary")


def _random_words(rng, count):
    """Words of random bytes >= 0x80 around ASCII letters: every kind of invalid UTF-8 (stray
    continuation bytes, truncated and overlong sequences, surrogates, > U+10FFFF) and valid ones."""
    special = [b"caf\xe9", b"\xe2\x82", b"\xe2\x82z", b"\xed\xa0\x80x", b"\xf4\x90\x80\x80", b"\xc0\xaf",
               b"\xe0\x80\xaf", b"\xf0\x9f\x98", b"\xff\xfe", "naïve".encode(), "日本".encode()]
    words = list(special)
    while len(words) < count:
        n = int(rng.integers(1, 7))
        raw = bytes(int(b) for b in rng.integers(0x80, 0x100, n))
        words.append(b"w" + raw + (b"" if rng.random() < 0.5 else b"q"))
    return words


@pytest.mark.parametrize("fmt", ["glove", "word2vec_binary"])
@pytest.mark.parametrize("errors", ["replace", "ignore"])
def test_unicode_errors_decodes_words_as_python_does(tmp_path, fmt, errors):
    """A real vector file with a few Latin-1 words loads with unicode_errors="replace" / "ignore",
    each word being what bytes.decode("utf-8", errors) gives (gensim's unicode_errors)."""
    rng = rng_for(171)
    raw = [b"the"] + _random_words(rng, 300)
    matrix = rng.standard_normal((len(raw), 3)).astype(np.float32)
    path = tmp_path / f"vectors.{fmt}"
    if fmt == "glove":
        path.write_bytes(b"".join(w + b" " + " ".join(repr(float(x)) for x in row).encode() + b"\n"
                                  for w, row in zip(raw, matrix)))
    else:
        path.write_bytes(f"{len(raw)} 3\n".encode() +
                         b"".join(w + b" " + row.astype("<f4").tobytes() + b"\n" for w, row in zip(raw, matrix)))
    expected = [w.decode("utf-8", errors) for w in raw]
    assert expected != [w.decode("utf-8", "backslashreplace") for w in raw]  # some words do need repair
    words, m = qkv.load_embeddings(str(path), format=fmt, unicode_errors=errors)
    assert words == expected, seed_note(171)
    assert np.array_equal(m, matrix)
    e = qkv.Embeddings.load(path, format=fmt, unicode_errors=errors)
    assert e.words == expected and e.find("caf\ufffd" if errors == "replace" else "caf") >= 0
    assert e.find("naïve") >= 0 and e.find("日本") >= 0
    with pytest.raises(ValueError, match="not valid UTF-8.*unicode_errors='replace'"):
        qkv.load_embeddings(str(path), format=fmt)  # strict stays the default


def test_unicode_errors_refuses_other_values(tmp_path):
    path = tmp_path / "v.txt"
    path.write_bytes(b"the 1 2\n")
    with pytest.raises(ValueError,
                       match="unicode_errors must be 'strict', 'replace' or 'ignore', got 'surrogateescape'"):
        qkv.load_embeddings(str(path), unicode_errors="surrogateescape")
    with pytest.raises(TypeError, match="unicode_errors must be a string"):
        qkv.Embeddings.load(str(path), unicode_errors=None)


# ---- unknown keyword arguments ----

@pytest.mark.parametrize("call, given, best", [
    (lambda q: qkv.scaled_dot_product_attention(q, q, q, is_causal=True), "is_causal", "causal"),
    (lambda q: qkv.scaled_dot_product_attention(q, q, q, key_length=3), "key_length", "key_lengths"),
    (lambda q: qkv.attention_backward(q, q, q, q, kernal="reference"), "kernal", "kernel"),
    (lambda q: qkv.attention_weights(q, q, topk=2), "topk", "top_k"),
    (lambda q: qkv.decode_attention(q, None, [0], is_causal=False), "is_causal", "causal"),
    (lambda q: qkv.apply_rotary(q, layuot="interleaved"), "layuot", "layout"),
])
def test_unknown_keyword_suggests_the_known_one(call, given, best):
    """As the CLI says "unknown option --head (did you mean --heads?)", by the same rule."""
    q = np.ones((3, 4), np.float32)
    with pytest.raises(TypeError) as err:
        call(q)
    assert f"got an unexpected keyword argument '{given}' (did you mean '{best}'?)" in str(err.value), err.value


def test_unknown_keyword_without_a_close_one_points_to_help():
    q = np.ones((3, 4), np.float32)
    with pytest.raises(TypeError, match=r"scaled_dot_product_attention\(\) got an unexpected keyword argument "
                                        r"'attn_drop' \(see help\(qkv.scaled_dot_product_attention\)\)"):
        qkv.scaled_dot_product_attention(q, q, q, attn_drop=0.1)
    # A TypeError of a known argument keeps its own message; a correct call is untouched.
    with pytest.raises(TypeError, match="causal must be True or False"):
        qkv.scaled_dot_product_attention(q, q, q, causal="yes")
    assert qkv.scaled_dot_product_attention(q, q, q, causal=True).shape == (3, 4)
    assert "causal" in str(__import__("inspect").signature(qkv.scaled_dot_product_attention))


# ---- a layer shared by threads (cause 4) ----

def _forward_backward(layer, x, dy):
    y = layer.forward(x)
    dx = layer.backward(dy)
    return y, dx, layer.grads


def test_layer_shared_by_threads_keeps_each_threads_forward():
    rng = rng_for(170)
    E = 16
    layer = qkv.MultiHeadAttention(embed_dim=E, num_heads=2, seed=int(rng.integers(1 << 30)))
    # Different N per thread: a shared "last forward" gives shape errors, equal N wrong gradients.
    jobs = []
    for t in range(6):
        n = 3 + (t % 3)
        jobs.append((rng.standard_normal((n, E)).astype(np.float32), rng.standard_normal((n, E)).astype(np.float32)))
    expected = [_forward_backward(layer, x, dy) for x, dy in jobs]
    errors = []
    barrier = threading.Barrier(len(jobs))

    def work(i):
        x, dy = jobs[i]
        barrier.wait()
        try:
            for _ in range(30):
                y, dx, grads = _forward_backward(layer, x, dy)
                assert np.array_equal(y, expected[i][0]) and np.array_equal(dx, expected[i][1])
                for name, g in expected[i][2].items():
                    assert np.array_equal(grads[name], g), name
        except Exception as e:  # noqa: BLE001 (reported below with the thread)
            errors.append(f"thread {i}: {e!r}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], f"{errors} ({seed_note(170)})"


def test_backward_without_a_forward_in_this_thread_is_refused():
    layer = qkv.MultiHeadAttention(embed_dim=4, num_heads=1)
    layer.forward(np.ones((2, 4), np.float32))
    got = []

    def other():
        try:
            layer.backward(np.ones((2, 4), np.float32))
        except ValueError as e:
            got.append(str(e))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert got and "no forward" in got[0]
    layer.backward(np.ones((2, 4), np.float32))  # this thread's forward is still there


# ---- tight memory (cause 5) ----

@pytest.mark.parametrize("distributed", [False, True])
def test_out_of_memory_is_a_memory_error_with_the_size(distributed):
    """In a child capped at 1.2 GB: explain() of 8,000 tokens needs 3 x 8000^2 float64 per head (a
    bare std::bad_alloc before), a layer of width 65,536 a 16 GiB w_q and a KVCache a 4 GiB pool
    (ValueErrors before). And with qkv.distributed imported: its translator, global in pybind11 and
    the last registered, turned every qkv error of the process into ValueError."""
    if distributed:
        pytest.importorskip("mpi4py", reason="qkv.distributed needs mpi4py")
        try:
            import qkv.distributed  # noqa: F401
        except ImportError as e:
            pytest.skip(f"qkv.distributed is not built here: {e}")
    script = textwrap.dedent(f"""
        import resource, numpy as np, qkv
        if {distributed}:
            import qkv.distributed
        resource.setrlimit(resource.RLIMIT_AS, (1200 << 20, resource.RLIM_INFINITY))
        for call in (lambda: qkv.explain(tokens=["a"] * 8000, x=np.ones((8000, 4))),
                     lambda: qkv.MultiHeadAttention(embed_dim=1 << 16),
                     lambda: qkv.KVCache(num_pages=1 << 20, page_tokens=16, kv_heads=1, head_dim=64)):
            try:
                call()
                print("no error")
            except Exception as e:
                print(f"{{type(e).__name__}}: {{e}}")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    lines = proc.stdout.splitlines()
    assert len(lines) == 3, (proc.stdout, proc.stderr)
    assert lines[0].startswith("MemoryError: ") and "8000 tokens" in lines[0], lines[0]
    assert "cannot allocate 1536000000 bytes" in lines[0], lines[0]
    assert lines[1] == "MemoryError: w_q: cannot allocate 17179869184 bytes (out of memory)", lines[1]
    assert lines[2] == "MemoryError: KVCache: the key pages: cannot allocate 4294967296 bytes (out of memory)", lines[2]


def test_a_nul_byte_in_a_path_is_refused(tmp_path):
    """The system calls stop at a NUL, so "a\\0b" once saved to (and loaded from) the file "a"."""
    good = tmp_path / "emb.txt"
    good.write_text("the 1 2\nbank 3 4\n")
    with pytest.raises(ValueError, match=r"cannot read .*: the name contains a NUL byte"):
        qkv.Embeddings.load(str(good) + "\0zzz")
    target = str(tmp_path / "a")
    with pytest.raises(ValueError, match=r"cannot write .*: the name contains a NUL byte"):
        qkv.MultiHeadAttention(8, 2).save(target + "\0b")
    assert not os.path.exists(target)


def _classes():
    out = [(qkv.KVCache, (4, 4, 1, 2)), (qkv.MultiHeadAttention, (8, 2)),
           (qkv.Embeddings, (["a", "b"], np.ones((2, 3), np.float32)))]
    out.append((qkv.Optimizer, (qkv.MultiHeadAttention(8, 2),)))
    return out


@pytest.mark.parametrize("cls,args", _classes(), ids=lambda x: getattr(x, "__name__", ""))
def test_an_object_from_new_alone_is_refused(cls, args):
    """cls.__new__(cls) made an object whose C++ part was never constructed: KVCache.create() on it
    died of SIGSEGV, and other methods read uninitialised memory (repr showed embed_dim=0)."""
    with pytest.raises(TypeError, match=rf"{cls.__name__}.__new__ alone would make an object with no state; "
                                        rf"create one by calling {cls.__name__}\(...\)"):
        cls.__new__(cls)
    obj = cls(*args)  # calling the class still works
    import copy
    with pytest.raises(TypeError):
        copy.copy(obj)

    class Sub(cls):  # and a Python subclass, which goes through __new__ with its own type
        pass
    assert type(Sub(*args)) is Sub


def test_an_unbound_method_given_none_is_a_type_error():
    """Methods bound as member pointers took self as a pointer, and None became a null one:
    qkv.KVCache.create(None) died of SIGSEGV."""
    script = textwrap.dedent("""
        import numpy as np, qkv
        calls = [lambda: qkv.KVCache.create(None), lambda: qkv.KVCache.fork(None, 0),
                 lambda: qkv.KVCache.free(None, 0), lambda: qkv.KVCache.length(None, 0),
                 lambda: qkv.KVCache.free_pages.fget(None), lambda: qkv.KVCache.pool_bytes.fget(None),
                 lambda: qkv.Embeddings.__len__(None), lambda: qkv.Embeddings.dim.fget(None),
                 lambda: qkv.MultiHeadAttention.forward(None, np.zeros((2, 8), np.float32)),
                 lambda: qkv.Optimizer.step(None)]
        for call in calls:
            try:
                call()
                print("no error")
            except TypeError:
                print("TypeError")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert proc.stdout.split() == ["TypeError"] * 10, proc.stdout


def test_float64_overflow_from_finite_inputs_is_refused():
    """float64 q, k of 1e200 (scores past 1.8e308) gave NaN without an error; k = -1e200 gave rows of 0
    as if masked. Refused like the float32 kernels' overflow; NaN inputs still pass through."""
    q = np.full((1, 1, 3, 2), 1e200)
    v = np.ones((1, 1, 3, 2))
    for k in (q, -q):
        with pytest.raises(ValueError, match="the output overflowed float64 although q, k and v are finite"):
            qkv.scaled_dot_product_attention(q, k, v)
    q[0, 0, 0, 0] = np.nan
    out = qkv.scaled_dot_product_attention(q, np.zeros_like(q), v, check_finite=False)
    assert np.isnan(out[0, 0, 0]).all() and (out[0, 0, 1:] == 1).all()


def test_a_top_k_larger_than_memory_is_a_memory_error():
    """top_k sizes the results, not the keys: top_k=2**31 over 5 keys asked for 24 GB, which
    overcommit granted and the OOM killer then ended with SIGKILL (found by running FlashAttention's
    and vLLM's decode tests against qkv). Run in a child process so a regression cannot kill pytest."""
    script = textwrap.dedent("""
        import numpy as np, qkv
        c = qkv.KVCache(8, 4, 1, 8)
        s = c.create()
        c.append(s, np.ones((5, 1, 8), np.float32), np.ones((5, 1, 8), np.float32))
        q = np.ones((1, 1, 1, 8), np.float32)
        x = np.ones((1, 1, 5, 8), np.float32)
        for call in (lambda: qkv.decode_attention_weights(q, c, [s], top_k=2**31),
                     lambda: qkv.attention_weights(x, x, top_k=2**31)):
            try:
                call()
                print("no error")
            except MemoryError as e:
                print("MemoryError:", e)
        values, indices = qkv.decode_attention_weights(q, c, [s], top_k=7)  # past the keys: padding
        print(indices.tolist())
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    lines = proc.stdout.splitlines()
    for line in lines[:2]:
        assert line.startswith("MemoryError: results of shape [1, 1, ") and "2147483648]: cannot allocate" in line, line
    assert lines[2] == "[[[[0, 1, 2, 3, 4, -1, -1]]]]", lines[2]



def test_a_top_k_past_the_address_space_reports_its_real_size():
    """top_k=2**62 asks for 6 * 2**62 * 12 bytes, past 2^64: the count saturated and the message
    said "cannot allocate 18446744073709551615 bytes". Refused before anything is allocated."""
    c = qkv.KVCache(8, 4, 1, 8)
    s = c.create()
    c.append(s, np.ones((5, 1, 8), np.float32), np.ones((5, 1, 8), np.float32))
    q = np.ones((1, 1, 6, 8), np.float32)
    x = np.ones((1, 1, 6, 8), np.float32)
    want = (r"^results of shape \[1, 1, 6, 4611686018427387904\]: cannot allocate 3\.32e\+20 bytes \(more than a "
            r"64-bit address space holds\)$")
    for call in (lambda: qkv.decode_attention_weights(q, c, [s], top_k=2**62),
                 lambda: qkv.attention_weights(x, x, top_k=2**62)):
        with pytest.raises(MemoryError, match=want):
            call()

# ---- a KVCache shared by threads ----

def test_cache_free_waits_for_a_decode_reading_its_pages():
    """decode_attention reads the cache with the GIL released; free() in another thread, followed by
    an append that reuses the freed pages, once overwrote the keys under it (a silently wrong
    output). free() now waits for the readers: every decode gives the result of the keys it was
    called on, and frees that overlapped a decode are counted so the test cannot pass vacuously."""
    rng = rng_for(172)
    T, Hkv, D = 32768, 2, 64
    cache = qkv.KVCache(num_pages=T // 64 + 1, page_tokens=64, kv_heads=Hkv, head_dim=D)
    q = rng.standard_normal((1, 2, 4, D)).astype(np.float32)
    k1 = rng.standard_normal((T, Hkv, D)).astype(np.float32)
    v1 = rng.standard_normal((T, Hkv, D)).astype(np.float32)
    k2, v2 = -k1, v1 + 100.0  # what another thread writes into the reused pages
    seq = cache.create()
    cache.append(seq, k1, v1)
    expected = qkv.decode_attention(q, cache, [seq], num_threads=1)
    cache.free(seq)

    wrong, overlapped, rounds = [], 0, 0
    while overlapped < 6 and rounds < 100:  # a loaded machine delays the reader's start now and then
        rounds += 1
        seq = cache.create()
        cache.append(seq, k1, v1)
        started, times = threading.Event(), {}

        def reader(seq=seq):
            times["start"] = time.monotonic()
            started.set()
            out = qkv.decode_attention(q, cache, [seq], num_threads=1)
            times["end"] = time.monotonic()
            if not np.array_equal(out, expected):
                wrong.append(float(np.max(np.abs(out - expected))))

        t = threading.Thread(target=reader)
        t.start()
        started.wait()
        time.sleep(0.001)  # let the reader get into the call
        freed_at = time.monotonic()
        cache.free(seq)
        other = cache.create()
        cache.append(other, k2, v2)
        t.join()
        overlapped += times["start"] < freed_at < times["end"]
        cache.free(other)
    print(f"{overlapped} of {rounds} frees were called while a decode read the pages")
    assert not wrong, f"decode outputs changed under a concurrent free + append: max errors {wrong}"
    assert overlapped >= 6, f"only {overlapped} of {rounds} frees overlapped a decode: the race was not exercised"


def test_decode_called_while_a_free_waits_never_reads_reused_pages():
    """A free() waiting for one decode, and a second decode of the freed sequence called during that
    wait: the second call once copied the page table before it waited, then read the pages after
    free() and an append had refilled them (another sequence's data). It now waits before it copies
    the table, so it finds the sequence gone; rounds whose calls did not overlap so are counted."""
    rng = rng_for(173)
    Hkv, D, T_big, T = 2, 64, 65536, 256
    cache = qkv.KVCache(num_pages=T_big // 64 + 2 * T // 64 + 2, page_tokens=64, kv_heads=Hkv, head_dim=D)
    big = cache.create()
    cache.append(big, rng.standard_normal((T_big, Hkv, D), dtype=np.float32),
                 rng.standard_normal((T_big, Hkv, D), dtype=np.float32))
    q_big = rng.standard_normal((8, 16, 16, D), dtype=np.float32)
    q = rng.standard_normal((1, 2, 4, D)).astype(np.float32)
    k1 = rng.standard_normal((T, Hkv, D)).astype(np.float32)
    v1 = rng.standard_normal((T, Hkv, D)).astype(np.float32)
    wrong, exercised = [], 0
    for _ in range(3):
        seq = cache.create()
        cache.append(seq, k1, v1)
        expected = qkv.decode_attention(q, cache, [seq], num_threads=1)
        got, times = {}, {}

        def long_reader():  # keeps free() waiting
            qkv.decode_attention(q_big, cache, [big] * 8, num_threads=1)

        def freer(seq=seq):
            times["free"] = time.monotonic()
            cache.free(seq)
            times["freed"] = time.monotonic()
            got["other"] = cache.create()
            cache.append(got["other"], -k1, v1 + 100.0)

        def victim(seq=seq):
            times["call"] = time.monotonic()
            try:
                got["out"] = qkv.decode_attention(q, cache, [seq], num_threads=1)
            except ValueError as e:
                got["error"] = str(e)

        threads = [threading.Thread(target=f) for f in (long_reader, freer, victim)]
        for t in threads:
            t.start()
            time.sleep(0.1)
        for t in threads:
            t.join()
        if "out" in got and not np.array_equal(got["out"], expected):
            wrong.append(float(np.max(np.abs(got["out"] - expected))))
        if times["free"] < times["call"] < times["freed"]:
            exercised += 1
            assert "unknown sequence id" in got.get("error", ""), got
        cache.free(got["other"])
    assert not wrong, f"a decode returned another sequence's data: max errors {wrong}"
    assert exercised >= 1, "no decode was called while a free waited: the race was not exercised"


def test_an_arguments_own_error_stays_the_cause_and_an_interrupt_stays_an_interrupt():
    """A conversion that raises (an __index__ or __float__ of the caller's) became a TypeError naming
    the argument with the object's own error dropped, and a KeyboardInterrupt or MemoryError raised
    there became that TypeError too."""
    class Raises:
        def __init__(self, error):
            self.error = error

        def __index__(self):
            raise self.error

        __float__ = __index__

    x = np.ones((1, 1, 3, 4), np.float32)
    for call in (lambda arg: qkv.scaled_dot_product_attention(x, x, x, window=(arg, 0)),
                 lambda arg: qkv.scaled_dot_product_attention(x, x, x, softcap=arg),
                 lambda arg: qkv.dropout_mask((1, 1, 3, 3), 0.5, seed=arg)):
        with pytest.raises(TypeError, match="must be") as caught:
            call(Raises(LookupError("its own reason")))
        assert isinstance(caught.value.__cause__, LookupError), caught.value.__cause__
        for error in (KeyboardInterrupt, MemoryError):
            with pytest.raises(error):
                call(Raises(error()))


def test_a_path_python_can_open_is_one_qkv_can_open(tmp_path):
    """A file name that is not UTF-8 on disk reaches Python as a str with surrogate escapes (as
    os.listdir gives it) and opens with open(); qkv refused it with pybind11's "Unable to cast", and
    refused bytes paths outright."""
    raw = os.fsencode(tmp_path) + b"/caf\xe9"
    with open(raw + b".txt", "wb") as f:
        f.write(b"the 1 2\nbank 3 4\n")
    escaped = os.path.join(os.fsdecode(tmp_path), os.fsdecode(b"caf\xe9.txt"))
    for path in (escaped, raw + b".txt", type("P", (), {"__fspath__": lambda self: raw + b".txt"})()):
        assert qkv.Embeddings.load(path).words == ["the", "bank"]
    layer = qkv.MultiHeadAttention(8, 2, seed=1)
    layer.save(os.fsdecode(raw + b".safetensors"))
    assert os.path.exists(raw + b".safetensors")
    assert np.array_equal(qkv.MultiHeadAttention.load(raw + b".safetensors").w_q, layer.w_q)
    with pytest.raises(ValueError, match=r"cannot read .*: the name contains a NUL byte"):
        qkv.Embeddings.load(raw + b".txt\0zzz")
    with pytest.raises(TypeError, match=r"must be a path \(str, bytes or os.PathLike\), got 5"):
        qkv.Embeddings.load(5)
