"""Where the `qkv` command finds the data it reads by default (find_data_file, tools/qkv): the
first of $QKV_DATA_DIR, <dir of qkv>/data and <dir of qkv>/../share/qkv that has the file, found
from the running executable (so a copy of the binary in another prefix, or a symlink to it on
PATH, reads that prefix's share/qkv) and never from a path compiled in."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SENTENCE = "river bank"
WORDS = "river 1 0 0\nbank 0 1 0\nmoney 0 0 1\n"


def run(exe, *args, env=None, cwd=None):
    base = {"PATH": "/usr/bin:/bin"}  # no QKV_* of the caller's environment
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env={**base, **(env or {})}, cwd=cwd,
                          timeout=120)


@pytest.fixture
def prefix(qkv_bin, tmp_path):
    """A copy of the command in <tmp>/prefix/bin, as `cmake --install` lays it out (libqkv is
    linked statically into it)."""
    root = tmp_path / "prefix"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(qkv_bin, root / "bin" / "qkv")
    (tmp_path / "cwd").mkdir()
    return root


def width_line(stdout):
    return next(line for line in stdout.splitlines() if "embeddings from" in line)


def test_installed_layout_reads_share_qkv_even_through_a_symlink(prefix, tmp_path):
    (prefix / "share" / "qkv").mkdir(parents=True)
    (prefix / "share" / "qkv" / "words.txt").write_text(WORDS)
    p = run(prefix / "bin" / "qkv", "explain", "--random-weights", "0", SENTENCE, cwd=tmp_path / "cwd")
    assert p.returncode == 0, p.stderr
    assert "embeddings from words.txt (width 3)" in width_line(p.stdout)
    (tmp_path / "path").mkdir()
    os.symlink(prefix / "bin" / "qkv", tmp_path / "path" / "qkv")
    p = run("qkv", "explain", "--random-weights", "0", SENTENCE, env={"PATH": f"{tmp_path / 'path'}:/usr/bin:/bin"}, cwd=tmp_path / "cwd")
    assert p.returncode == 0 and "(width 3)" in width_line(p.stdout), p.stderr
    assert os.listdir(tmp_path / "cwd") == []


def test_build_tree_data_dir_beside_the_binary_comes_before_share(prefix, tmp_path):
    (prefix / "bin" / "data").mkdir()
    (prefix / "bin" / "data" / "words.txt").write_text("river 1 0\nbank 0 1\n")
    (prefix / "share" / "qkv").mkdir(parents=True)
    (prefix / "share" / "qkv" / "words.txt").write_text(WORDS)
    p = run(prefix / "bin" / "qkv", "explain", "--random-weights", "0", SENTENCE, cwd=tmp_path / "cwd")
    assert p.returncode == 0 and "(width 2)" in width_line(p.stdout), p.stdout + p.stderr


def test_qkv_data_dir_comes_first_and_qkv_embeddings_before_it(prefix, tmp_path):
    (prefix / "share" / "qkv").mkdir(parents=True)
    (prefix / "share" / "qkv" / "words.txt").write_text(WORDS)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "words.txt").write_text("river 1 0 0 0\nbank 0 1 0 0\n")
    p = run(prefix / "bin" / "qkv", "explain", "--random-weights", "0", SENTENCE, env={"QKV_DATA_DIR": str(mine)}, cwd=tmp_path / "cwd")
    assert p.returncode == 0 and "(width 4)" in width_line(p.stdout), p.stdout + p.stderr
    explicit = tmp_path / "explicit.txt"
    explicit.write_text("river 1 0 0 0 0\nbank 0 1 0 0 0\n")
    p = run(prefix / "bin" / "qkv", "explain", "--random-weights", "0", SENTENCE, env={"QKV_DATA_DIR": str(mine), "QKV_EMBEDDINGS": str(explicit)},
            cwd=tmp_path / "cwd")
    assert p.returncode == 0 and "explicit.txt (width 5)" in width_line(p.stdout), p.stdout + p.stderr
    # QKV_DATA_DIR without the file: the search goes on to share/qkv.
    p = run(prefix / "bin" / "qkv", "explain", "--random-weights", "0", SENTENCE, env={"QKV_DATA_DIR": str(tmp_path / "cwd")},
            cwd=tmp_path / "cwd")
    assert p.returncode == 0 and "(width 3)" in width_line(p.stdout), p.stdout + p.stderr


def test_no_data_anywhere_is_a_usage_error_naming_the_places_searched(prefix, tmp_path):
    for env in ({}, {"QKV_DATA_DIR": str(tmp_path / "cwd")}):
        p = run(prefix / "bin" / "qkv", "explain", "--random-weights", "0", SENTENCE, env=env, cwd=tmp_path / "cwd")
        assert p.returncode == 2 and p.stdout == "", p.stdout
        assert "no word vectors: pass --embeddings F, set QKV_EMBEDDINGS=F, or build the default words.txt" in p.stderr
        assert "(searched: $QKV_DATA_DIR, <dir of qkv>/data, <dir of qkv>/../share/qkv)" in p.stderr, p.stderr
    # QKV_EMBEDDINGS set but empty turns the default off even when share/qkv has the file.
    (prefix / "share" / "qkv").mkdir(parents=True)
    (prefix / "share" / "qkv" / "words.txt").write_text(WORDS)
    p = run(prefix / "bin" / "qkv", "explain", "--random-weights", "0", SENTENCE, env={"QKV_EMBEDDINGS": ""}, cwd=tmp_path / "cwd")
    assert p.returncode == 2 and "no word vectors" in p.stderr, p.stderr
    assert os.listdir(tmp_path / "cwd") == []


def test_version_is_the_projects(qkv_bin):
    cmake = (Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    version = re.search(r"project\(qkv VERSION ([0-9.]+)", cmake).group(1)
    p = run(qkv_bin, "--version")
    assert p.returncode == 0 and p.stdout == f"qkv {version}\n" and p.stderr == "", p.stdout + p.stderr
