"""`qkv serve` for the tests: a server on a free port (--port 0, the URL read from its first line of
output), small HTTP helpers, and word vectors that hold the tutorials' sentences."""
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from qkv_testlib import VOCABULARY, write_glove

# The vocabulary of the tests: the seeds' words plus the ones of the word-order example.
WORDS = sorted(set(VOCABULARY) | {"cat", "dog", "chased", "sat", "mat"})


def write_words(path, seed, dim=8, extra=()):
    """Random vectors (seeded) for WORDS and `extra` in GloVe text; returns the path."""
    words = WORDS + list(extra)
    matrix = np.random.default_rng(seed).standard_normal((len(words), dim)).astype(np.float32)
    write_glove(path, words, matrix)
    return path


def sentence_of(n, start=0):
    """A sentence of exactly n tokens drawn from WORDS."""
    return " ".join(WORDS[(start + 7 * i) % len(WORDS)] for i in range(n))


class Server:
    """`qkv serve ARGS --port 0` running; .url is what it printed. stop() sends a signal and
    returns (exit code, stderr)."""
    def __init__(self, qkv_bin, *args, timeout=30):
        self.proc = subprocess.Popen([qkv_bin, "serve", "--port", "0", *map(str, args)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line or self.proc.poll() is not None:
                break
        m = re.match(r"qkv serve: (http://[^/\s]+:(\d+)/)", line)
        if not m:
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            self.proc.kill()
            raise AssertionError(f"qkv serve printed {line!r}, not its URL; stderr: {err}")
        self.url, self.port = m.group(1), int(m.group(2))

    def stop(self, sig=signal.SIGINT, timeout=15):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"qkv serve did not stop within {timeout} s of signal {sig}")
        return self.proc.returncode, self.proc.stderr.read()


def request(url, body=None, method=None, raw=None, timeout=30):
    """(status, parsed JSON or text, content type) of one request; body is sent as JSON, raw as is."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, payload, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, payload, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
    text = payload.decode("utf-8", "replace")
    return status, (json.loads(text) if ctype.startswith("application/json") else text), ctype


def artifacts_dir(qkv_bin):
    """Where screenshots go: QKV_ARTIFACTS, else test-artifacts/serve beside the qkv binary (the
    build tree)."""
    path = Path(os.environ.get("QKV_ARTIFACTS", Path(qkv_bin).parent / "test-artifacts" / "serve"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def cli_json(run, *args):
    """`qkv ARGS --json` parsed; fails the test with stderr if it fails."""
    r = run(*args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def softmax_rows(m, causal=False):
    m = np.array(m, dtype=np.float64)
    if causal:
        m = np.where(np.triu(np.ones_like(m, dtype=bool), 1), -np.inf, m)
    e = np.exp(m - m.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


__all__ = ["WORDS", "write_words", "sentence_of", "Server", "request", "artifacts_dir", "cli_json", "softmax_rows",
           "signal"]
