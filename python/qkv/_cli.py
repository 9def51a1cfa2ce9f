"""The `qkv` command of the pip package (console entry point): runs the compiled command the wheel
ships as qkv/bin/qkv. Its data (qkv/share/qkv/words.txt, ...) is found from there, as in an
installed prefix."""
import os
import sys
from pathlib import Path


def main():
    exe = Path(__file__).resolve().parent / "bin" / "qkv"
    if not exe.is_file():
        sys.exit(f"qkv: {exe} is missing: this qkv package was installed without its command")
    os.execv(exe, ["qkv", *sys.argv[1:]])
