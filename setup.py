"""pip packaging of the `qkv` Python module: runs CMake on this tree to build the `qkv_python`
target (the compiled core qkv/_qkv.<abi>.so) and packages it with python/qkv/*.py.

    /usr/bin/python3 -m pip install --no-build-isolation --no-index .     # or: pip wheel ...

Needs cmake, g++ and the Debian packages of scripts/install-deps.sh; downloads nothing. The CMake
build directory is QKV_PIP_BUILD_DIR (default <tree>/build-pip, kept between builds so a rebuild
is incremental; at the depth of build/ so that ccache, used when installed, hits on objects a
`build/` tree compiled). QKV_PIP_JOBS sets the parallel jobs (default 2).
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
                     "-DQKV_BUILD_BENCH=OFF", "-DQKV_BUILD_TOOLS=OFF"]
        if shutil.which("ccache"):
            configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
            env.setdefault("CCACHE_BASEDIR", str(ROOT))
        subprocess.run(configure, check=True, env=env)
        jobs = os.environ.get("QKV_PIP_JOBS", "2")
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "qkv_python", "-j", jobs], check=True, env=env)
        built = build_dir / "python" / "qkv" / Path(self.get_ext_filename(ext.name)).name
        if not built.exists():
            raise RuntimeError(f"CMake did not produce {built} (is pybind11-dev installed? see the configure output)")
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, dest)


setup(
    name="qkv",
    version=version(),
    description="Exact, fast CPU self-attention: numpy and PyTorch APIs over fused AVX-512/AVX2 kernels",
    packages=["qkv"],
    package_dir={"qkv": "python/qkv"},
    ext_modules=[Extension("qkv._qkv", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["numpy"],
    extras_require={"torch": ["torch"]},
    options={"build": {"build_base": "build-pip/setuptools"}, "egg_info": {"egg_base": "build-pip"}},
    zip_safe=False,
)
