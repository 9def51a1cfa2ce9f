#!/usr/bin/env bash
# Installs the Debian packages qkv needs, only those missing, so `make` works on a fresh machine.
#   install-deps.sh demo   what `make demo` needs: the compiler and libraries of the library and
#                          the qkv command, what trains the word vectors (gensim, GCIDE), and the
#                          Python module and WordNet that the sense evaluation reads
#   install-deps.sh package  the demo's set, then what `make package` adds: the tools that write
#                          the .deb's Depends (dpkg-shlibdeps, file) and MPI, for qkv_distributed
#   install-deps.sh test   the package set, then what `make test` adds: GoogleTest, Google Benchmark,
#                          the Python module's tests (torch, pytest, pip), MPI's launcher and mpi4py,
#                          Chromium and Selenium for the HTML pages, clang for the sanitizers and
#                          fuzzers, the aarch64 cross compiler and qemu
#   install-deps.sh        (or `all`) the same as test
# README.md ("Two commands") gives each set's package count, disk size and time on a fresh machine.
set -euo pipefail
demo=(
  cmake g++ make ccache
  libopenblas-dev libcli11-dev libfmt-dev nlohmann-json3-dev
  python3-gensim dict-gcide
  pybind11-dev python3-dev python3-numpy wordnet-base
  libcpp-httplib-dev pkg-config
)
package=(dpkg-dev file libopenmpi-dev)
test=(
  clang-14 libclang-rt-14-dev libomp-14-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-pytest python3-torch
  python3-setuptools python3-pip python3-venv python3-wheel
  openmpi-bin python3-mpi4py
  chromium chromium-driver python3-selenium python3-pil
  clang-format-14
  g++-aarch64-linux-gnu qemu-user
)
case "${1:-all}" in
  demo) packages=("${demo[@]}") ;;
  package) packages=("${demo[@]}" "${package[@]}") ;;
  test | all) packages=("${demo[@]}" "${package[@]}" "${test[@]}") ;;
  *) echo "usage: $0 [demo|package|test]" >&2; exit 2 ;;
esac
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
