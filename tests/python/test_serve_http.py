"""`qkv serve` over HTTP: the API answers what `qkv explain --json` / `qkv compare --json` print for
the same sentence and layer, refuses bad requests with a JSON message, serves 50 clients at once,
and stops cleanly on SIGINT and SIGTERM."""
import http.client
import json
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from serve_testlib import Server, cli_json, request, sentence_of, softmax_rows, write_words


@pytest.fixture
def words(tmp_path, seed):
    return write_words(tmp_path / "words.txt", seed)


@pytest.fixture
def server(qkv_bin, words):
    s = Server(qkv_bin, "--embeddings", words, "--heads", "2")
    yield s
    code, err = s.stop()
    assert code == 0, err


def assert_same_steps(served, cli):
    """The steps the page shows, served vs printed by the CLI: the same float64 code, so equal."""
    assert served["tokens"] == cli["tokens"]
    assert len(served["heads"]) == len(cli["heads"])
    for got, want in zip(served["heads"], cli["heads"]):
        for key in ("scores", "scale", "scaled_scores", "weights", "v", "context"):
            np.testing.assert_array_equal(np.array(got[key]), np.array(want[key]), err_msg=key)


def test_page_and_assets_are_served_offline(server):
    status, page, ctype = request(server.url)
    assert status == 200 and ctype.startswith("text/html")
    assert '<script src="/serve.js">' in page and 'href="/serve.css"' in page
    for path, kind in (("serve.js", "text/javascript"), ("serve.css", "text/css")):
        status, text, ctype = request(server.url + path)
        assert status == 200 and ctype.startswith(kind) and len(text) > 500
        # Nothing is fetched from elsewhere: the page works offline.
        assert "https://" not in text and "//cdn" not in text
    assert server.url.startswith("http://127.0.0.1:")


def test_config_lists_the_layers_and_limits(server, words):
    status, config, _ = request(server.url + "api/config")
    assert status == 200
    assert [l["id"] for l in config["layers"]] == ["default", "parameter-free", "random"]
    assert config["embeddings"] == "words.txt" and str(words.parent) not in json.dumps(config)
    assert config["limits"]["max_tokens"] == 64 and config["width"] == 8 and config["positions"] is False
    assert config["oov"] == "error"


@pytest.mark.parametrize("layer,cli_args", [("default", ["--heads", "2"]), ("parameter-free", ["--parameter-free"]),
                                            ("random", ["--heads", "2", "--seed", "7"])])
@pytest.mark.parametrize("positions", [False, True])
def test_explain_equals_the_cli(server, run, words, layer, cli_args, positions):
    sentence = "the cat chased the dog"
    status, served, _ = request(server.url + "api/explain",
                                {"sentence": sentence, "layer": layer, "seed": 7, "positions": positions})
    assert status == 200, served
    cli = cli_json(run, "explain", "--embeddings", words, *cli_args, *(["--positions"] if positions else []), sentence)
    assert_same_steps(served["explanation"], cli)
    assert served["options"]["positions"] is positions
    assert served["explanation"]["w_q"] is None  # the weights are not sent with every keystroke


def test_unscaled_and_causal_follow_the_cli_scores(server, run, words):
    sentence = "we sat by the river bank"
    cli = cli_json(run, "explain", "--embeddings", words, "--heads", "2", sentence)
    _, unscaled, _ = request(server.url + "api/explain", {"sentence": sentence, "scaled": False})
    _, causal, _ = request(server.url + "api/explain", {"sentence": sentence, "causal": True})
    for h, head in enumerate(cli["heads"]):
        got = unscaled["explanation"]["heads"][h]
        assert got["scale"] == 1.0
        np.testing.assert_allclose(got["weights"], softmax_rows(head["scores"]), rtol=1e-12, atol=1e-15)
        got = causal["explanation"]["heads"][h]
        want = softmax_rows(head["scaled_scores"], causal=True)
        np.testing.assert_allclose(got["weights"], want, rtol=1e-12, atol=1e-15)
        assert np.all(np.triu(np.array(got["weights"]), 1) == 0.0)
        np.testing.assert_allclose(np.array(got["context"]), want @ np.array(head["v"]), rtol=1e-12, atol=1e-12)


def test_word_order_needs_positions(server):
    """Without positions, reordering the words reorders the weights and nothing else."""
    def weights(sentence, positions):
        _, r, _ = request(server.url + "api/explain",
                          {"sentence": sentence, "layer": "parameter-free", "positions": positions})
        return np.array(r["explanation"]["heads"][0]["weights"])
    a, b = "the cat chased the dog", "the dog chased the cat"
    perm = [0, 4, 2, 3, 1]  # b's token i is a's token perm[i]
    np.testing.assert_allclose(weights(b, False), weights(a, False)[np.ix_(perm, perm)], rtol=1e-12, atol=1e-15)
    assert not np.allclose(weights(b, True), weights(a, True)[np.ix_(perm, perm)], atol=1e-6)


def test_compare_equals_the_cli(server, run, words):
    s1, s2 = "i went to the bank to deposit money", "we sat by the river bank"
    for layer, extra in (("default", ["--heads", "2"]), ("parameter-free", ["--parameter-free"])):
        status, served, _ = request(server.url + "api/compare", {"word": "bank", "sentences": [s1, s2], "layer": layer})
        assert status == 200, served
        cli = cli_json(run, "compare", "--embeddings", words, *extra, "--word", "bank", s1, s2)
        assert served == cli
        assert cli["static_cosine"] == pytest.approx(1.0, abs=1e-12)
        heads = 2 if layer == "default" else 1
        assert len(cli["sentences"][0]["nearest"]) == 5 and len(cli["sentences"][0]["weights"]) == heads


@pytest.mark.parametrize("oov", ["zero", "skip"])
def test_missing_words_are_in_the_answer(qkv_bin, run, words, oov):
    """With --oov zero or skip each answer lists the sentence's words not in the vocabulary, in
    order with repeats (zero vectors or left out, as the config's "oov" says); with the default
    (error) the list is empty, as such a sentence is refused."""
    s = Server(qkv_bin, "--embeddings", words, "--heads", "2", "--oov", oov)
    try:
        assert request(s.url + "api/config")[1]["oov"] == oov
        sentence = "the zyzzyva cat zyzzyva qq"
        status, served, _ = request(s.url + "api/explain", {"sentence": sentence})
        assert status == 200, served
        assert served["missing"] == ["zyzzyva", "zyzzyva", "qq"]
        cli = cli_json(run, "explain", "--embeddings", words, "--heads", "2", "--oov", oov, sentence)
        assert_same_steps(served["explanation"], cli)
        assert cli["tokens"] == (sentence.split() if oov == "zero" else ["the", "cat"])
        status, compared, _ = request(s.url + "api/compare", {"word": "cat", "sentences": ["the zyzzyva cat", "qq cat qq"]})
        assert status == 200, compared
        assert [side["missing"] for side in compared["sentences"]] == [["zyzzyva"], ["qq", "qq"]]
        assert request(s.url + "api/explain", {"sentence": "the cat"})[1]["missing"] == []
        # The commands note them on stderr; the server answers with them instead, once per keystroke.
        note = run("compare", "--embeddings", words, "--heads", "2", "--oov", oov, "--word", "cat", "the zyzzyva cat",
                   "qq cat qq").stderr
        assert "sentence 1: not in" in note and "zyzzyva" in note and "sentence 2: not in" in note, note
    finally:
        code, err = s.stop()
        assert code == 0, err
    assert "qkv: note" not in err, err


@pytest.mark.parametrize("body,message", [
    ({"sentence": sentence_of(65)}, "has 65 words; the explorer shows at most 64"),
    ({"sentence": "a " * 1100}, "the sentence is 2200 bytes long; the explorer takes at most 2048"),
    ({"sentence": "the zyzzyva sat"}, "zyzzyva"),
    ({"sentence": "..."}, "has no words"),
    ({}, "\"sentence\" is missing"),
    ({"sentence": 3}, "\"sentence\" must be a string"),
    ({"sentence": "the cat", "scaled": "yes"}, "\"scaled\" must be true or false"),
    ({"sentence": "the cat", "layer": "/etc/passwd"}, "\"layer\" must be \"default\", \"parameter-free\" or"),
    ({"sentence": "the cat", "layer": "random", "seed": -1}, "\"seed\" must be an integer"),
    ([1, 2], "the request body must be a JSON object"),
])
def test_bad_explain_requests(server, words, body, message):
    status, r, ctype = request(server.url + "api/explain", body)
    assert status == 400 and ctype.startswith("application/json")
    assert message in r["error"]
    assert str(words.parent) not in r["error"]  # the server's paths stay on the server


@pytest.mark.parametrize("body,message", [
    ({"word": "bank", "sentences": ["the bank"]}, "\"sentences\" must be a list of two strings"),
    ({"word": "bank", "sentences": ["the bank", "the river"]}, "--word 'bank': not in sentence 2"),
    ({"word": "two words", "sentences": ["a", "b"]}, "must be exactly one word"),
])
def test_bad_compare_requests(server, body, message):
    status, r, _ = request(server.url + "api/compare", body)
    assert status == 400 and message in r["error"]


def test_malformed_oversize_and_unknown(server):
    status, r, _ = request(server.url + "api/explain", raw=b'{"sentence": "the cat"')
    assert status == 400 and r["error"].startswith("malformed JSON")
    # A number past double's range is the body's fault as well (it once gave 500).
    for route, raw in (("api/explain", b'{"sentence": "the cat", "x": 1e999}'),
                       ("api/compare", b'{"word": "the", "sentences": ["the cat", "the dog"], "seed": -1e400}')):
        status, r, _ = request(server.url + route, raw=raw)
        assert status == 400 and r["error"].startswith("malformed JSON"), (status, r)
    status, r, _ = request(server.url + "api/explain", raw=json.dumps({"sentence": "a " * 5000}).encode())
    assert status == 413 and r["error"] == "the request is larger than the 8192 bytes the explorer takes"
    status, r, _ = request(server.url + "nope")
    assert status == 404 and r["error"] == "unknown route GET /nope"
    status, r, _ = request(server.url + "../../etc/passwd")
    assert status in (400, 404) and "root:" not in json.dumps(r)
    status, r, _ = request(server.url + "api/explain", method="GET")
    assert status in (404, 405) and "error" in r


def test_a_client_cannot_name_a_file(server, words):
    """Fields the API does not know, such as file names, are ignored: the answer is the same."""
    _, plain, _ = request(server.url + "api/explain", {"sentence": "the cat"})
    _, other, _ = request(server.url + "api/explain",
                          {"sentence": "the cat", "embeddings": "/nonexistent", "weights": str(words)})
    assert plain == other


def test_fifty_concurrent_clients(server):
    bodies = [{"sentence": sentence_of(3 + i % 20, i), "layer": "random", "seed": i} for i in range(50)]
    expected = [request(server.url + "api/explain", b)[1] for b in bodies[:5]]
    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(lambda b: request(server.url + "api/explain", b, timeout=60), bodies))
    assert [a[0] for a in answers] == [200] * 50
    assert [a[1] for a in answers[:5]] == expected
    assert all(len(a[1]["explanation"]["tokens"]) == 3 + i % 20 for i, a in enumerate(answers))


@pytest.mark.parametrize("sig,name", [(signal.SIGINT, "SIGINT"), (signal.SIGTERM, "SIGTERM")])
def test_signal_stops_cleanly(qkv_bin, words, sig, name):
    s = Server(qkv_bin, "--embeddings", words, "--parameter-free")
    assert request(s.url + "api/config")[0] == 200
    # A browser keeps its connection open: the server still stops promptly.
    idle = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    idle.request("GET", "/api/config")
    assert idle.getresponse().read()
    start = time.monotonic()
    code, err = s.stop(sig)
    elapsed = time.monotonic() - start
    idle.close()
    assert code == 0 and f"qkv serve: stopped ({name})" in err
    assert elapsed < 5, f"stopping took {elapsed:.1f} s with an idle connection open"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", s.port), timeout=2).close()


def test_signal_stops_even_while_clients_trickle_their_requests(qkv_bin, words):
    """Two clients each send a header line every second, so no read of theirs ever times out:
    SIGINT still ends the server, within its grace of 5 s, exit 0, saying what it left."""
    s = Server(qkv_bin, "--embeddings", words, "--parameter-free")
    slow = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(2)]
    for c in slow:
        c.sendall(b"POST /api/explain HTTP/1.1\r\nHost: x\r\n")
    stop = {}

    def trickle():
        for i in range(30):
            if stop:
                return
            for c in slow:
                try:
                    c.sendall(f"X-Slow-{i}: 1\r\n".encode())
                except OSError:
                    return
            time.sleep(1)

    with ThreadPoolExecutor(1) as pool:
        pool.submit(trickle)
        time.sleep(1.5)
        start = time.monotonic()
        code, err = s.stop(signal.SIGINT, timeout=20)
        elapsed = time.monotonic() - start
        stop["now"] = True
    for c in slow:
        c.close()
    assert code == 0 and "qkv serve: stopped (SIGINT)" in err, (code, err)
    assert elapsed < 10, f"stopping took {elapsed:.1f} s"


def test_a_body_without_content_length_is_refused_unread(server):
    """A chunked body is held to no limit by cpp-httplib: refused (411) before it is read."""
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1].strip("/"))), timeout=10) as c:
        c.sendall(b"POST /api/explain HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        c.sendall(b"100000\r\n" + b"a" * 4096)  # the start of a 1 MB chunk, never finished
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            part = c.recv(65536)
            if not part:
                break
            reply += part
    assert reply.startswith(b"HTTP/1.1 411"), reply[:200]
    assert b"must come with Content-Length" in reply, reply


def test_empty_host_is_a_usage_error(qkv_bin, words):
    r = subprocess.run([qkv_bin, "serve", "--embeddings", str(words), "--parameter-free", "--host", ""],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--host" in r.stderr and "an empty address" in r.stderr, (r.returncode, r.stderr)


def test_a_host_name_that_does_not_resolve_is_named(run, words):
    """Any failure to bind read as a port in use; a name that does not resolve says so, before the
    word vectors are read. glibc refuses a name with spaces itself, so no query leaves the machine."""
    r = run("serve", "--embeddings", words, "--parameter-free", "--host", "no such host", "--port", "0", timeout=30)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr == ("qkv: error: --host no such host: cannot resolve the host name (Name or service not known): "
                        "give an address of this machine, such as 127.0.0.1\n"), r.stderr
    r = run("serve", "--embeddings", words.parent / "missing.txt", "--host", "no such host", timeout=30)
    assert r.returncode == 1 and "cannot resolve the host name" in r.stderr, r.stderr


def test_host_other_than_loopback_warns(qkv_bin, words):
    s = Server(qkv_bin, "--embeddings", words, "--parameter-free", "--host", "0.0.0.0")
    assert s.url.startswith("http://0.0.0.0:")
    assert request(f"http://127.0.0.1:{s.port}/api/config")[0] == 200
    code, err = s.stop()
    assert code == 0 and "warning: listening on 0.0.0.0, not only on this machine" in err


def test_bad_command_lines(qkv_bin, run, words):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = run("serve", "--embeddings", words, "--parameter-free", "--port", port, timeout=30)
        assert r.returncode == 1 and f"--port {port}: cannot listen there" in r.stderr
    # Nor is a port another `qkv serve` listens on (no SO_REUSEPORT sharing).
    first = Server(qkv_bin, "--embeddings", words, "--parameter-free")
    try:
        r = run("serve", "--embeddings", words, "--parameter-free", "--port", first.port, timeout=30)
        assert r.returncode == 1 and f"--port {first.port}: cannot listen there" in r.stderr
    finally:
        assert first.stop()[0] == 0
    r = run("serve", "--embeddings", words, "--port", "70000")
    assert r.returncode == 2 and "70000" in r.stderr
    r = run("serve", "--embeddings", words.parent / "missing.txt", "--port", "0")
    assert r.returncode == 1 and "missing.txt" in r.stderr


def test_learned_layer_is_the_default(qkv_bin, run, words, tmp_path):
    """Started with --weights (a trained layer, with its output projection), the default layer is
    that layer, as in `qkv explain --weights`; the other layers stay available."""
    layer = tmp_path / "layer.safetensors"
    r = run("train", "--steps", "2", "--batch", "2", "--pairs", "2", "--keys", "4", "--values", "4", "-E", "8",
            "--heads", "2", "--eval-examples", "4", "--threads", "1", "--save", layer)
    assert r.returncode == 0, r.stderr
    s = Server(qkv_bin, "--embeddings", words, "--weights", layer)
    try:
        _, config, _ = request(s.url + "api/config")
        assert config["layers"][0]["label"] == "learned weights from layer.safetensors, 2 heads, d_k = 4"
        assert str(tmp_path) not in json.dumps(config)
        sentence = "the dog chased the cat"
        _, served, _ = request(s.url + "api/explain", {"sentence": sentence})
        assert_same_steps(served["explanation"], cli_json(run, "explain", "--embeddings", words, "--weights", layer,
                                                          sentence))
        _, free, _ = request(s.url + "api/explain", {"sentence": sentence, "layer": "parameter-free"})
        assert_same_steps(free["explanation"], cli_json(run, "explain", "--embeddings", words, "--parameter-free",
                                                        sentence))
        s1, s2 = "i went to the bank to deposit money", "we sat by the river bank"
        _, compared, _ = request(s.url + "api/compare", {"word": "bank", "sentences": [s1, s2]})
        assert compared == cli_json(run, "compare", "--embeddings", words, "--weights", layer, "--word", "bank", s1, s2)
    finally:
        code, err = s.stop()
        assert code == 0, err
