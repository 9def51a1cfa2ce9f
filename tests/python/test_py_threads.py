"""One qkv.MultiHeadAttention or qkv.KVCache used from several Python threads at once. forward(),
backward(), save() and decode_attention() run with the GIL released; what changes the object
(weight assignment, Optimizer.step(), append, fork, free) must never land in the middle of such a
call: each call sees the object wholly before or wholly after a change (docs/soak-and-fuzz.md,
"Threads")."""
import os
import subprocess
import sys
import threading
import time

import numpy as np

import qkv
from py_oracle import rng_for, seed_note

E = 256  # weights of 256 KB: a copy into them takes long enough to overlap the other thread's reads


def _layer_and_input(seed):
    rng = rng_for(seed)
    layer = qkv.MultiHeadAttention(E, num_heads=4, seed=seed)
    layer.training = False
    x = rng.standard_normal((512, E)).astype(np.float32)
    return rng, layer, x


def _close(a, b):
    return float(np.max(np.abs(a - b))) <= 1e-5 * (1 + float(np.max(np.abs(b))))


def _in_another_thread(work):
    """Runs work(stop) in a thread until the returned stop() is called; stop() re-raises its error."""
    stop, errors = threading.Event(), []

    def run():
        try:
            work(stop)
        except Exception as e:  # noqa: BLE001 (re-raised in the calling thread)
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()

    def finish():
        stop.set()
        t.join()
        if errors:
            raise errors[0]
    return finish


def test_weight_assignment_never_lands_inside_another_threads_forward():
    """w_o alternates between two values in one thread while another runs forward(): every output
    is the forward of one of the two (an assignment that copied into w_o mid-forward gave a mix)."""
    rng, layer, x = _layer_and_input(181)
    w_a = layer.w_o.copy()
    w_b = rng.uniform(-0.1, 0.1, w_a.shape).astype(np.float32)
    y_a = layer.forward(x)
    layer.w_o = w_b
    y_b = layer.forward(x)
    layer.w_o = w_a
    assigned = [0]

    def writer(stop):
        while not stop.is_set():
            layer.w_o = w_b if assigned[0] % 2 == 0 else w_a
            assigned[0] += 1

    finish = _in_another_thread(writer)
    try:
        mixed = sum(not (_close(y, y_a) or _close(y, y_b)) for y in (layer.forward(x) for _ in range(150)))
    finally:
        finish()
    print(f"{assigned[0]} assignments beside 150 forwards")
    assert assigned[0] > 150, "the writer barely ran: the race was not exercised"
    assert mixed == 0, f"{mixed} of 150 forwards used a half-assigned w_o {seed_note(181)}"


def test_save_beside_weight_assignment_writes_one_whole_version(tmp_path):
    """save() reads the weights with the GIL released; each file saved while another thread assigns
    w_o holds one of the two values whole."""
    rng, layer, _ = _layer_and_input(182)
    w_a = layer.w_o.copy()
    w_b = rng.uniform(-0.1, 0.1, w_a.shape).astype(np.float32)

    def writer(stop):
        i = 0
        while not stop.is_set():
            layer.w_o = w_b if i % 2 == 0 else w_a
            i += 1

    path = tmp_path / "layer.safetensors"
    finish = _in_another_thread(writer)
    mixed = 0
    try:
        for _ in range(60):
            layer.save(path)
            w = qkv.MultiHeadAttention.load(path).w_o
            mixed += not (np.array_equal(w, w_a) or np.array_equal(w, w_b))
    finally:
        finish()
    assert mixed == 0, f"{mixed} of 60 saved files hold a half-assigned w_o {seed_note(182)}"


def test_optimizer_step_never_lands_inside_another_threads_forward():
    """Optimizer.step() in one thread (SGD, big steps, so every step moves every weight by O(1))
    while another runs forward(): every output is the forward of the weights after some whole
    number of steps."""
    rng, layer, x = _layer_and_input(183)
    x = x[:128]
    names = ["w_q", "w_k", "w_v", "w_o"]
    grads = {n: rng.standard_normal(getattr(layer, n).shape).astype(np.float32) * 0.02 for n in names}
    opt = qkv.SGD(layer, lr=1.0, momentum=0.0)
    states = [{n: getattr(layer, n).copy() for n in names}]

    def stepper(stop):
        while not stop.is_set() and len(states) < 200:
            time.sleep(0.001)  # let forwards start between the steps
            opt.step(grads)
            states.append({n: getattr(layer, n).copy() for n in names})

    finish = _in_another_thread(stepper)
    outputs = []
    try:
        # At least 30 forwards, and on until the stepper has made 20 steps: on a loaded machine the
        # stepper's thread can get few turns while 30 forwards run.
        deadline = time.monotonic() + 60
        while len(outputs) < 30 or (len(states) <= 20 and time.monotonic() < deadline):
            outputs.append(layer.forward(x))
    finally:
        finish()
    check = qkv.MultiHeadAttention(E, num_heads=4)
    check.training = False
    candidates = []
    for s in states:
        for n in names:
            setattr(check, n, s[n])
        candidates.append(check.forward(x))
    mixed = sum(not any(_close(y, c) for c in candidates) for y in outputs)
    print(f"{len(outputs)} forwards beside {len(states) - 1} optimizer steps")
    assert len(states) > 10, "the optimizer barely ran: the race was not exercised"
    assert mixed == 0, f"{mixed} of {len(outputs)} forwards saw a half-done optimizer step {seed_note(183)}"


def test_cache_shared_by_threads_decodes_what_was_appended():
    """Three threads create, append to, fork and free their own sequences (so pages are reused all
    the time, and forks of the shared sequence copy its partial last page) while the main thread
    decodes a shared sequence no one changes: every decode is bitwise the first one, and every
    sequence a writer reads back holds what it appended."""
    rng = rng_for(184)
    Hkv, D = 2, 64
    cache = qkv.KVCache(num_pages=600, page_tokens=16, kv_heads=Hkv, head_dim=D, dtype="bf16")
    shared = cache.create()
    cache.append(shared, rng.standard_normal((1000, Hkv, D)).astype(np.float32),
                 rng.standard_normal((1000, Hkv, D)).astype(np.float32))
    q = rng.standard_normal((1, 4, 1, D)).astype(np.float32)
    expected = qkv.decode_attention(q, cache, [shared], num_threads=1)
    bad, done = [], [0]

    def writer(seed):
        def work(stop):
            r = np.random.default_rng(seed)
            mine = []
            while not stop.is_set():
                if len(mine) < 4 or (len(mine) < 8 and r.random() < 0.5):  # at most 8 x 4 pages each
                    seq = cache.fork(shared) if r.random() < 0.3 else cache.create()
                    base = cache.keys(seq).copy()
                    k = r.standard_normal((int(r.integers(1, 40)), Hkv, D)).astype(np.float32)
                    cache.append(seq, k, k)
                    mine.append((seq, base, k))
                else:
                    seq, base, k = mine.pop(int(r.integers(len(mine))))
                    got = cache.keys(seq)
                    want = np.concatenate([base, qkv_bf16(k).transpose(1, 0, 2)], axis=1)
                    if not np.array_equal(got, want):
                        bad.append(f"writer {seed}: sequence {seq} changed")
                    cache.free(seq)
                done[0] += 1
        return work

    finishers = [_in_another_thread(writer(s)) for s in (1, 2, 3)]
    try:
        changed = decodes = 0
        until = time.monotonic() + 60
        while (done[0] < 300 or decodes < 300) and time.monotonic() < until:
            changed += not np.array_equal(qkv.decode_attention(q, cache, [shared], num_threads=1), expected)
            decodes += 1
    finally:
        for f in finishers:
            f()
    print(f"{done[0]} cache changes beside {decodes} decodes")
    assert done[0] >= 100, "the writers barely ran: the race was not exercised"
    assert changed == 0 and not bad, (changed, bad[:3], seed_note(184))


def qkv_bf16(x):
    """float32 rounded to bfloat16 (nearest, ties to even), as the bf16 cache stores it."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def test_a_thread_started_after_another_ended_finds_none_of_its_state():
    """glibc reuses an ended thread's id (threading.get_ident()) for the next thread, which found
    the dead thread's forward and gradients: backward() ran without a forward of its own and
    SGD.step() applied another thread's gradients."""
    layer = qkv.MultiHeadAttention(embed_dim=16, num_heads=2, seed=1)
    x = np.ones((3, 16), np.float32)
    seen, reused = [], 0
    for _ in range(20):
        t = threading.Thread(target=lambda: (layer.forward(x), layer.backward(x)))
        t.start()
        t.join()
        ended = t.ident
        got = {}

        def fresh():
            got["reused"] = threading.get_ident() == ended
            got["grads"] = sorted(layer.grads)
            for name, call in (("backward", lambda: layer.backward(x)), ("step", qkv.SGD(layer, lr=0.5).step)):
                try:
                    call()
                    got[name] = "ran"
                except ValueError as e:
                    got[name] = str(e)
        t = threading.Thread(target=fresh)
        t.start()
        t.join()
        reused += got.pop("reused")
        seen.append(got)
    assert all(g["grads"] == [] and "no forward" in g["backward"] and "no gradients" in g["step"] for g in seen), seen
    print(f"{reused} of 20 fresh threads had an ended thread's id")


REFUSED = ("a call in this thread is reading a qkv object (Python code run inside it, by an argument's conversion "
           "or a signal handler, tries to change one); the change could wait for ever for that call, so it is refused")

_REENTRY = """
import threading, time
import numpy as np
import qkv
cache = qkv.KVCache(num_pages=16, page_tokens=16, kv_heads=1, head_dim=8)
seq, other = cache.create(), cache.create()
kv = np.arange(32, dtype=np.float32).reshape(4, 1, 8) / 32
cache.append(seq, kv, kv)
q = np.ones((1, 1, 1, 8), np.float32)
plain = qkv.decode_attention(q, cache, [seq], softcap=0.5)

class FreesTheSequence:  # softcap's conversion frees the sequence the call reads
    def __float__(self):
        cache.free(seq)
        return 0.5
try:
    qkv.decode_attention(q, cache, [seq], softcap=FreesTheSequence())
    print("free ran inside the read")
except TypeError as e:
    print("refused:", type(e.__cause__).__name__, e.__cause__)
print("length", cache.length(seq), "same", np.array_equal(qkv.decode_attention(q, cache, [seq], softcap=0.5), plain))

class ReadsAgain:  # another thread's free() waits for this call; the conversion reads the cache again
    def __float__(self):
        self.freer = threading.Thread(target=cache.free, args=(other,))
        self.freer.start()
        time.sleep(0.3)  # the GIL released: the freer is waiting for this call's read
        self.inner = qkv.decode_attention(q, cache, [seq], softcap=0.5)
        return 0.5
again = ReadsAgain()
outer = qkv.decode_attention(q, cache, [seq], softcap=again)
again.freer.join()
print("nested", np.array_equal(again.inner, plain), np.array_equal(outer, plain))
"""


def test_a_cache_changed_or_read_again_from_inside_a_decodes_arguments_never_waits_for_itself():
    """decode_attention holds its read of the cache while it converts its mask arguments, so Python
    code run by a conversion runs inside the read. A free() there waited for the read that waited
    for it (a hang), and a second read there waited for another thread's free() that waited for
    the first read: now the free raises RuntimeError (the cause of the argument's TypeError) and
    the second read goes ahead."""
    proc = subprocess.run([sys.executable, "-c", _REENTRY], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "refused: RuntimeError " + REFUSED,
        "length 4 same True",
        "nested True True"], proc.stdout


_CROSSED = """
import threading
import numpy as np
import qkv

def cache_with_a_fork():
    cache = qkv.KVCache(num_pages=4, page_tokens=4, kv_heads=1, head_dim=4)
    seq = cache.create()
    cache.append(seq, np.ones((2, 1, 4), np.float32), np.ones((2, 1, 4), np.float32))
    return cache, seq, cache.fork(seq)
(a, a_seq, a_fork), (b, b_seq, b_fork) = cache_with_a_fork(), cache_with_a_fork()
q = np.ones((1, 1, 1, 4), np.float32)
both = threading.Barrier(2)
results = {}

class FreesInTheOtherCache:  # top_k's conversion, inside this thread's read of its own cache
    def __init__(self, cache, seq):
        self.cache, self.seq = cache, seq
    def __index__(self):
        both.wait()  # both threads hold their reads
        self.cache.free(self.seq)
        return 1

def decode(name, cache, seq, top_k):
    try:
        qkv.decode_attention_weights(q, cache, [seq], top_k=top_k)
        results[name] = "ran"
    except TypeError as e:
        results[name] = type(e.__cause__).__name__

threads = [threading.Thread(target=decode, args=("a", a, a_seq, FreesInTheOtherCache(b, b_fork)), daemon=True),
           threading.Thread(target=decode, args=("b", b, b_seq, FreesInTheOtherCache(a, a_fork)), daemon=True)]
for t in threads:
    t.start()
for t in threads:
    t.join(20)
print(sorted(results.items()), a.length(a_fork), b.length(b_fork))
"""


def test_two_threads_each_changing_the_cache_the_other_reads_from_inside_their_own_read_never_hang():
    """Thread A reads cache a and, from top_k's conversion, frees a sequence of cache b; thread B the
    reverse. Each change waited for the other thread's read, which waited for the change: both hung.
    A change from inside any read of the same thread is refused, whatever the object."""
    proc = subprocess.run([sys.executable, "-c", _CROSSED], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[('a', 'RuntimeError'), ('b', 'RuntimeError')] 2 2", proc.stdout


_FREE_WAITS = """
import signal, threading, time
import numpy as np
import qkv
rng = np.random.default_rng(7)
cache = qkv.KVCache(num_pages=64, page_tokens=256, kv_heads=1, head_dim=64)
seq, other = cache.create(), cache.create()
k = rng.standard_normal((16384, 1, 64), dtype=np.float32)
cache.append(seq, k, k)
q = rng.standard_normal((1, 8, 4000, 64), dtype=np.float32)
reader = threading.Thread(target=lambda: qkv.decode_attention_weights(q, cache, [seq], top_k=5), daemon=True)
reader.start()
time.sleep(0.3)  # the read is running
signal.setitimer(signal.ITIMER_REAL, 0.3)
signal.signal(signal.SIGALRM, lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
t0 = time.monotonic()
try:
    cache.free(other)
    print("freed after", round(time.monotonic() - t0, 2), "s; the read still running:", reader.is_alive())
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - t0, 2), "s; the read still running:", reader.is_alive())
"""


def test_ctrl_c_ends_a_change_waiting_for_another_threads_read():
    """free() waits until no call reads the cache; that wait ignored Ctrl-C for as long as the read
    ran (seconds for a long decode)."""
    proc = subprocess.run([sys.executable, "-c", _FREE_WAITS], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    assert words[0] == "interrupted" and words[-1] == "True", proc.stdout
    assert float(words[2]) < 1.0, proc.stdout


def test_training_switched_on_during_a_forward_leaves_no_half_state():
    """forward() read layer.training twice, once with the GIL released: switched on by a signal
    handler (or another thread) during the call, it kept a forward with no cache, and backward()
    failed with the C++ API's message."""
    script = """
import signal
import numpy as np
import qkv
layer = qkv.MultiHeadAttention(64, 4, seed=1)
layer.training = False
x = np.random.default_rng(3).standard_normal((12000, 64)).astype(np.float32)
signal.signal(signal.SIGALRM, lambda *args: setattr(layer, "training", True))
signal.setitimer(signal.ITIMER_REAL, 0.05)
y = layer.forward(x)
try:
    layer.backward(np.ones_like(y))
    print("backward ran")
except ValueError as e:
    print(e)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.stdout.strip() == ("backward: no forward to go back through; call forward() first with "
                                   "training = True"), (proc.stdout, proc.stderr)
