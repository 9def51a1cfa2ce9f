"""The benchmark shapes are written once, in bench/shapes.h: bench/shapes.py reads them from the
header for the Python reports (bench/report.py's forward table, torch_compare.py,
compare_backward.py), so a shape the header adds or changes is the one the reports print, and an
entry the reader cannot read stops it rather than leaving a shape out."""
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qkv_testlib import build_dir

ROOT = Path(__file__).resolve().parents[2]


def shapes_module():
    spec = importlib.util.spec_from_file_location("bench_shapes", ROOT / "bench" / "shapes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HEADER = """namespace qkv::bench {
inline constexpr Shape kShapes[] = {
    {"S1", 1, 1, 3, 4, false},
    {"S7", 2, 3, 64, 32, true, 4.0f},
%s};
}
"""


def test_the_header_reads_as_the_benchmarks_register_it():
    """The names read from the header are the shapes qkv_bench registers (where it is built), and
    each is a shape: positive sizes, S5 the causal one."""
    table = shapes_module().load()
    assert all(min(s[:4]) > 0 for s in table.values()) and table["S5"][4] and not table["S4"][4], table
    binary = build_dir() / "bench" / "qkv_bench"
    if not binary.exists():
        pytest.skip(f"{binary} is not built")
    listed = subprocess.run([str(binary), "--benchmark_filter=^attention/", "--benchmark_list_tests"],
                            capture_output=True, text=True, timeout=60).stdout.split()
    registered = list(dict.fromkeys(m.group(1) for n in listed if (m := re.match(r"attention/(\w+)/fp32/", n))))
    assert registered == list(table), (registered, list(table))


def test_the_forward_table_takes_its_shapes_from_the_header(tmp_path):
    for name in ("report.py", "shapes.py"):
        shutil.copy(ROOT / "bench" / name, tmp_path / name)
    (tmp_path / "shapes.h").write_text(HEADER % "")
    bench = {"run_name": "attention/S7/fp32/threads:1/repeats:5/real_time", "aggregate_name": "median",
             "real_time": 2.0, "time_unit": "ms", "FLOPS": 1e9, "cpu_s_per_iter": 0.002, "cpu_rate_threads": 1,
             "flops_per_iter": 2e6}
    (tmp_path / "qkv.json").write_text(json.dumps({"benchmarks": [bench]}))
    (tmp_path / "torch.json").write_text(json.dumps({"results": {}}))
    (tmp_path / "memory.json").write_text(json.dumps({"peak_growth_mb": 1.0, "inputs_outputs_mb": 2.0,
                                                      "reset_ok": True}))
    r = subprocess.run([sys.executable, str(tmp_path / "report.py"), "--qkv", str(tmp_path / "qkv.json"),
                        "--torch", str(tmp_path / "torch.json"), "--memory", str(tmp_path / "memory.json")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "| S7 2·3·64·32 causal | fp32 | 1 | 2.000 | 1.0 |" in r.stdout, r.stdout


@pytest.mark.parametrize("entry", ['    {"S8", 1, 1, 1 << 10, 64, false},\n', '    {"S8", 1, 1, 64, false},\n'])
def test_an_entry_the_reader_cannot_read_is_refused(tmp_path, entry):
    path = tmp_path / "shapes.h"
    path.write_text(HEADER % entry)
    with pytest.raises(ValueError, match=r"3 entries in kShapes, 2 read as"):
        shapes_module().load(str(path))
