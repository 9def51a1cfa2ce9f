"""How `qkv` reads the values of its options and the text of its input files: integers are
decimal (a leading zero is refused, not read as octal; a hex prefix is not an integer), seeds span
0 to 2^64 - 1 and nothing outside wraps, and a UTF-8 byte-order mark at the start of a sentence
file is not part of its first word. Each refusal of a value: exit 2 (usage) and one line naming
the option and the value as typed; of a file: exit 1."""
import pytest


def sentence_cmd(embeddings, *extra):
    return ["context", "--embeddings", embeddings.glove, *extra]


def usage_failure(proc, *needles):
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert err and "\n" not in err, err
    for n in needles:
        assert n in err, (n, err)


@pytest.mark.parametrize("value, needle", [
    ("-1", "'-1' is outside 0 to 2^64 - 1"),
    ("18446744073709551616", "'18446744073709551616' is outside 0 to 2^64 - 1"),
    ("99999999999999999999", "'99999999999999999999' is outside 0 to 2^64 - 1"),
    ("0x10", "'0x10' is not an integer"),
    ("010", "'010' has a leading zero"),
    ("1.5", "'1.5' is not an integer"),
])
def test_bad_seeds_are_refused_not_wrapped(run, embeddings, value, needle):
    usage_failure(run(*sentence_cmd(embeddings, "--random-weights", value, "the bank")), "--random-weights", needle)
    usage_failure(run("train", "--task", "lookup", "--steps", "1", "--seed", value), "--seed", needle)


def test_seeds_span_the_64_bit_range(run, embeddings):
    """The largest seed is a seed of its own, and a seed is read as the decimal number typed."""
    top = run(*sentence_cmd(embeddings, "--random-weights", "18446744073709551615", "the bank"))
    assert top.returncode == 0, top.stderr
    assert "seed 18446744073709551615" in top.stdout, top.stdout
    low = run(*sentence_cmd(embeddings, "--random-weights", "1", "the bank"))
    assert low.returncode == 0 and "seed 1)" in low.stdout, low.stdout
    assert low.stdout.split("\n", 1)[1] != top.stdout.split("\n", 1)[1]


@pytest.mark.parametrize("args, option, needle", [
    (["explain", "--precision", "010", "--example", "seed-003"], "--precision", "'010' has a leading zero"),
    (["explain", "--precision", "0x3", "--example", "seed-003"], "--precision", "'0x3' is not an integer"),
    (["train", "--task", "lookup", "--steps", "010"], "--steps", "'010' has a leading zero"),
    (["train", "--task", "lookup", "--steps", "0x3"], "--steps", "'0x3' is not an integer"),
    (["serve", "--port", "08000"], "--port", "'08000' has a leading zero"),
])
def test_integers_are_decimal(run, args, option, needle):
    usage_failure(run(*args), option, needle)


def test_decimal_integers_and_zero_are_read_as_typed(run):
    r = run("explain", "--example", "seed-003", "--precision", "3")
    assert r.returncode == 0, r.stderr
    r = run("train", "--task", "lookup", "--steps", "0", "--threads", "1")
    assert r.returncode == 0 and "no training steps (--steps 0)" in r.stdout, (r.stdout, r.stderr)


def test_byte_order_mark_in_an_input_file_is_not_a_word(run, embeddings, tmp_path):
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_bytes(b"the river bank\n")
    marked.write_bytes(b"\xef\xbb\xbfthe river bank\n")
    want = run(*sentence_cmd(embeddings, "--random-weights", "3", "--input", plain))
    got = run(*sentence_cmd(embeddings, "--random-weights", "3", "--input", marked))
    assert want.returncode == 0 and got.returncode == 0, (want.stderr, got.stderr)
    assert got.stderr == "" and got.stdout.split("\n", 1)[1] == want.stdout.split("\n", 1)[1]
    pair = tmp_path / "pair.txt"
    pair.write_bytes(b"\xef\xbb\xbfthe river bank\r\nwe sat by the bank\r\n")
    r = run("compare", "--embeddings", embeddings.glove, "--random-weights", "3", "--word", "the", "--input", pair)
    assert r.returncode == 0, r.stderr


def test_missing_words_are_noted_once_each(run, embeddings):
    r = run(*sentence_cmd(embeddings, "--random-weights", "0", "--oov", "zero", "zzz the zzz yyy zzz bank"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().endswith("given zero vectors: zzz, yyy"), r.stderr


def test_compare_input_with_the_wrong_number_of_lines_is_bad_input(run, embeddings, tmp_path):
    three = tmp_path / "three.txt"
    three.write_text("the bank\nthe river\nthe money\n")
    r = run("compare", "--embeddings", embeddings.glove, "--random-weights", "0", "--word", "the", "--input", three)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "expected 2 non-blank lines (one sentence each), found 3" in r.stderr, r.stderr


def test_file_whose_size_is_unknown_is_named_as_such(run, embeddings):
    """/proc files report 0 bytes but read some: refused as such, not called empty."""
    for argv in (["explain", "the bank", "--embeddings", "/proc/self/status", "--random-weights", "0"],
                 ["attend", "--q", "/proc/self/status", "--k", "/proc/self/status", "--v", "/proc/self/status",
                  "--out", "/dev/null"]):
        r = run(*argv)
        assert r.returncode == 1, (r.returncode, r.stderr)
        assert "/proc/self/status" in r.stderr and "reports a size of 0 bytes but has content" in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--task", "context", "--min-length", "2"], "the halves objective needs sentences of at least 4 words"),
    (["--task", "masked-word", "--min-length", "5", "--max-length", "3"],
     "sentence lengths must satisfy 2 <= min (5) <= max (3)"),
])
def test_training_option_values_the_task_refuses_are_usage_errors(run, embeddings, tmp_path, args, needle):
    """Checked by the task's own rule (check_masked_word_config) before any file is read."""
    usage_failure(run("train", "--embeddings", embeddings.glove, "--sentences", tmp_path / "none.txt", *args), needle)
