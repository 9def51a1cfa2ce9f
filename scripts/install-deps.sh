#!/usr/bin/env bash
# Installs the Debian packages qkv needs, only those missing, so `make` works on a fresh machine.
set -euo pipefail
packages=(
  cmake g++ make clang-14 libclang-rt-14-dev libomp-14-dev
  libopenblas-dev libcli11-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  pybind11-dev python3-dev python3-numpy python3-pytest python3-torch
  python3-setuptools python3-pip python3-venv python3-wheel ccache
  libopenmpi-dev openmpi-bin python3-mpi4py
  chromium chromium-driver python3-selenium python3-pil
  pkg-config dpkg-dev file clang-format-14
  g++-aarch64-linux-gnu qemu-user
  python3-gensim dict-gcide wordnet-base
  libcpp-httplib-dev
)
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
