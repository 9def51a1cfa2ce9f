"""pip packaging of qkv: runs CMake on this tree and packages python/qkv/*.py with everything the
build makes for it (CMake lists them in <build>/python/wheel-files.txt): the compiled core
qkv/_qkv.<abi>.so, qkv/_qkv_distributed.<abi>.so when MPI is found (libopenmpi-dev), and the
`qkv` command as qkv/bin/qkv behind a console entry point. The data the command reads by default
(words.txt, context-layer.safetensors) goes to qkv/share/qkv/ when `make demo` has built it in
QKV_PIP_DATA_DIR (default <tree>/build/data).

    /usr/bin/python3 -m venv --system-site-packages ~/qkv-venv   # Debian refuses pip in its own Python
    ~/qkv-venv/bin/pip install --no-build-isolation --no-index .    # or: pip wheel ... --no-deps .

Needs cmake, g++ and the Debian packages of scripts/install-deps.sh; downloads nothing. The
version is project(qkv VERSION ...) in CMakeLists.txt, read here and compiled into the module.
The CMake build directory is QKV_PIP_BUILD_DIR (default <tree>/build-pip, kept between builds so a
rebuild is incremental; at the depth of build/ so that ccache, used when installed, hits on
objects a `build/` tree compiled). QKV_PIP_JOBS sets the parallel jobs (default 2).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
DATA_FILES = ("words.txt", "context-layer.safetensors")  # what find_data_file (tools/qkv) looks for
(ROOT / "build-pip").mkdir(exist_ok=True)  # setuptools' own build files and egg-info go there too


def version():
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(qkv VERSION ([0-9.]+)", text).group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = Path(os.environ.get("QKV_PIP_BUILD_DIR", ROOT / "build-pip"))
        env = dict(os.environ)
        configure = ["cmake", "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPYTHON_EXECUTABLE={sys.executable}", "-DQKV_PYTHON=ON", "-DQKV_BUILD_TESTS=OFF",
                     "-DQKV_BUILD_BENCH=OFF", "-DQKV_BUILD_TOOLS=ON"]
        if shutil.which("ccache"):
            configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
            env.setdefault("CCACHE_BASEDIR", str(ROOT))
        subprocess.run(configure, check=True, env=env)
        jobs = os.environ.get("QKV_PIP_JOBS", "2")
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "qkv_wheel_files", "-j", jobs],
                       check=True, env=env)
        listing = build_dir / "python" / "wheel-files.txt"
        if not listing.exists():
            raise RuntimeError(f"CMake did not write {listing} (is pybind11-dev installed? see the configure output)")
        package = Path(self.get_ext_fullpath(ext.name)).parent  # <build_lib>/qkv
        files = [line.split(" ", 1) for line in listing.read_text().splitlines() if line]
        data_dir = Path(os.environ.get("QKV_PIP_DATA_DIR", ROOT / "build" / "data"))
        files += [(f"qkv/share/qkv/{name}", str(data_dir / name)) for name in DATA_FILES
                  if (data_dir / name).is_file()]
        for dest, src in files:
            target = package.parent / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
        names = [dest for dest, _ in files]
        print("qkv: packaged " + ", ".join(names))
        if not any("_qkv_distributed" in n for n in names):
            print("qkv: MPI not found: qkv.distributed is not in this package (apt-get install libopenmpi-dev)")
        if not any(n.endswith("/words.txt") for n in names):
            print(f"qkv: no {data_dir}/words.txt (`make demo` builds it): `qkv explain SENTENCE` will need --embeddings")


setup(
    name="qkv",
    version=version(),
    description="Exact, fast CPU self-attention: numpy and PyTorch APIs over fused AVX-512/AVX2 kernels",
    packages=["qkv"],
    package_dir={"qkv": "python/qkv"},
    ext_modules=[Extension("qkv._qkv", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    entry_points={"console_scripts": ["qkv = qkv._cli:main"]},
    install_requires=["numpy"],
    extras_require={"torch": ["torch"]},
    options={"build": {"build_base": "build-pip/setuptools"}, "egg_info": {"egg_base": "build-pip"}},
    zip_safe=False,
)
