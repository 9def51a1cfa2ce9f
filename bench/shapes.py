"""The benchmark shapes as bench/shapes.h defines them, read from the header itself: the table is
written once, there, and the Python reports cannot drift from what the C++ benchmarks measured."""
import os
import re

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shapes.h")

# One initializer of kShapes: {"name", B, H, N, D, causal[, q_scale]}.
ENTRY = re.compile(r'\{\s*"(\w+)",\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(true|false)\s*(?:,\s*[0-9.]+f?\s*)?\}')


def load(path=None):
    """{name: (B, H, N, D, causal)} in the header's order. Raises ValueError when an entry of
    kShapes does not read as one, so that a change of the header's form fails here, not as a
    shape missing from a report."""
    with open(path or HEADER) as f:
        text = f.read()
    start = text.find("kShapes[] = {")
    if start < 0:
        raise ValueError(f"{path or HEADER}: no kShapes[] = {{ ... }}")
    body = text[start + len("kShapes[] = {"):text.index("};", start)]
    entries, opened = ENTRY.findall(body), body.count('{"')
    if len(entries) != opened or not entries:
        raise ValueError(f"{path or HEADER}: {opened} entries in kShapes, {len(entries)} read as "
                         '{"name", B, H, N, D, causal[, q_scale]}')
    return {name: (int(b), int(h), int(n), int(d), causal == "true") for name, b, h, n, d, causal in entries}
