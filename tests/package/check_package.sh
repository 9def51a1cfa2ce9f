#!/usr/bin/env bash
# The C++ package for real, as a user runs it.
#   install: installs this build to a temporary prefix, then builds and runs the README's
#     "Use from CMake" consumer (find_package(qkv CONFIG REQUIRED), static and shared), the same
#     program through pkg-config run with an empty environment (the .pc's rpath finds libqkv; again
#     after the prefix is moved, and from the unpacked .deb; no '//' in the .pc's paths, and each
#     directory its flags name exists), a ring consumer (COMPONENTS distributed, built with -Wall
#     -Wextra -Werror) when qkv was built with MPI, the installed command (--version; `explain` on
#     a sentence with no flags, reading <prefix>/share/qkv/words.txt), and the installed Python
#     package from the directory /usr/bin/python3 reads for that prefix; then the tree configured
#     for an absolute libdir outside the prefix, installed, and set back, with the .pc and the
#     CMake package checked there.
#   deb: checks that `make package` packs a tree of its own without tests and benchmarks (a dry
#     run), builds the .deb, checks its contents and Depends, unpacks it with dpkg -x into a scratch
#     root and runs its command (no flags, its own data), its Python package and its qkv.pc.
# The word vectors are checked only when `make demo` has built build/data/words.txt (said if not).
# Usage: check_package.sh <build dir> <source dir> [install|deb]
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
what=${3:-install}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "$*" >&2; exit 1; }

version=$(sed -n 's/^project(qkv VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
words=$build/data/words.txt
have_mpi=no
[ -f "$build/src/distributed/libqkv_distributed.a" ] && have_mpi=yes

# The command under <root>/bin, run as a new user would: empty environment, a scratch directory.
check_cli() {
  local bin=$1 got
  got=$(env -i "$bin" --version)
  [ "$got" = "qkv $version" ] || fail "$bin --version: '$got', expected 'qkv $version'"
  if grep -qaF "$build" "$bin"; then fail "$bin holds a path of the build tree ($build)"; fi
  if [ ! -f "$words" ] || [ ! -f "$(dirname "$words")/context-layer.safetensors" ]; then
    echo "$bin explain: not run ($words or the trained layer beside it is not built; make demo)"
    return
  fi
  mkdir -p "$work/cwd"
  got=$(cd "$work/cwd" && env -i "$bin" explain "we sat by the river bank") || fail "$bin explain failed"
  [[ "$got" == *"embeddings from words.txt"* ]] || fail "$bin explain: no word vectors in '$got'"
  [[ "$got" == *"the trained layer context-layer.safetensors"* ]] || fail "$bin explain: not the trained layer: '$got'"
  echo "$bin explain (no flags): $(grep -m1 'embeddings from' <<<"$got")"
}

# pkg-config as the README says, through the qkv.pc in <pcdir>, which must lead to <root> wherever
# that tree was put: no '//' in the file or the flags, every directory they name exists, and the
# README's program built with them runs with an empty environment on the libqkv under <libroot>
# (<root> unless given; the .pc's rpath).
check_pc() {
  local pcdir=$1 root=$2 libroot=${3:-$2} prefix_seen flags flag dir got loaded
  if grep -q '//' "$pcdir/qkv.pc"; then fail "$pcdir/qkv.pc holds a '//': $(grep '//' "$pcdir/qkv.pc")"; fi
  prefix_seen=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=prefix qkv)
  [[ "$prefix_seen" != */ ]] || fail "$pcdir/qkv.pc: prefix $prefix_seen ends in '/' (its paths then hold a '//')"
  [ "$(realpath "$prefix_seen")" = "$(realpath "$root")" ] || fail "$pcdir/qkv.pc: prefix $prefix_seen is not $root"
  flags=$(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs qkv)
  [[ "$flags" != *//* ]] || fail "pkg-config qkv from $pcdir: '$flags' holds a '//'"
  for flag in $flags; do
    case $flag in -I*) dir=${flag#-I} ;; -L*) dir=${flag#-L} ;; -Wl,-rpath,*) dir=${flag#-Wl,-rpath,} ;; *) continue ;; esac
    [ -d "$dir" ] || fail "pkg-config qkv from $pcdir: $flag names no directory"
  done
  g++ -O1 "$work/consumer/hello.cpp" -o "$work/hello-pc" $flags
  got=$(env -i "$work/hello-pc")
  [ "$got" = "out[0] = 0.731059 0.268941" ] || fail "pkg-config from $pcdir: unexpected output '$got'"
  loaded=$(env -i ldd "$work/hello-pc" | awk '$1 ~ /^libqkv\.so/ {print $3}')
  [[ "$(realpath "$loaded")" == "$(realpath "$libroot")"/* ]] || fail "hello-pc loads libqkv from '$loaded', not from $libroot"
  echo "pkg-config from $pcdir (prefix=$prefix_seen), run with an empty environment: $got"
}

# The README's CMake consumer linked to <target>, built in <dir>, configured with <where> (the
# -D that leads find_package to qkv); it must print the expected weights.
check_cmake() {
  local target=$1 dir=$2 where=$3 got
  mkdir -p "$dir/src" && cp "$work/consumer/hello.cpp" "$dir/src/"
  sed "s/qkv::qkv)/$target)/" "$work/consumer/CMakeLists.txt" > "$dir/src/CMakeLists.txt"
  cmake -S "$dir/src" -B "$dir" "$where" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$dir" >/dev/null
  got=$("$dir/hello")
  [ "$got" = "out[0] = 0.731059 0.268941" ] || fail "find_package, $target: unexpected output '$got'"
  echo "find_package ($where), $target: $got"
}

# The qkv package under <dir>, imported by Debian's interpreter from outside the tree.
check_python() {
  local dir=$1 got
  got=$(cd "$work" && env -i PYTHONPATH="$dir" /usr/bin/python3 -c "import qkv; print(qkv.__version__, qkv.__file__)")
  [[ "$got" == "$version $dir/qkv/__init__.py" ]] || fail "import qkv from $dir: '$got'"
  if [ $have_mpi = yes ]; then
    (cd "$work" && env -i PYTHONPATH="$dir" /usr/bin/python3 -c "import qkv.distributed") || fail "import qkv.distributed from $dir failed"
  fi
  echo "python: qkv $version from $dir"
}

# The README's snippets, exactly as a reader copies them: each fenced block that follows a
# "<!-- file: NAME -->" line is written to NAME.
mkdir -p "$work/consumer"
awk -v dir="$work/consumer" '
  /^<!-- file: / { name = $3; next }
  name != "" && /^```/ { if (inside) { inside = 0; name = "" } else { inside = 1; out = dir "/" name; printf "" > out } next }
  inside { print >> out }
' "$src/README.md"
for f in CMakeLists.txt hello.cpp; do
  [ -s "$work/consumer/$f" ] || fail "README.md has no '<!-- file: $f -->' snippet"
done

if [ "$what" = deb ]; then
  # `make package` builds only what the .deb ships: cpack first builds all of the tree it packs, so
  # that tree is one of its own without the tests and benchmarks, and the tree given here, a
  # developer's, is neither configured nor built. Read from a dry run (a real one compiles again).
  plan=$(env -u MAKEFLAGS -u MAKELEVEL make -n --no-print-directory -C "$src" package BUILD="$build" \
    PACKAGE_BUILD="$work/package-tree" | sed -e ':a' -e '/\\$/{N; s/\\\n//; ta}')
  grep -q -- "-B $work/package-tree .*-DQKV_BUILD_TESTS=OFF -DQKV_BUILD_BENCH=OFF" <<<"$plan" \
    && grep -q -- "cd $work/package-tree && cpack -G DEB" <<<"$plan" \
    || fail "make package does not pack a tree of its own without tests and benchmarks: $plan"
  if grep -E -- "QKV_BUILD_(TESTS|BENCH)=ON|cmake -S [^ ]+ -B $build( |\$)|cmake --build $build( |\$)" <<<"$plan"; then
    fail "make package configures or builds more than the .deb ships (above)"
  fi
  (cd "$build" && cpack -G DEB -B "$work/deb" >/dev/null)
  deb=$(ls "$work"/deb/qkv_*.deb)
  echo "built $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)"
  [[ "$(basename "$deb")" == qkv_${version}_*.deb ]] || fail "the .deb's version is not $version"
  dpkg-deb --info "$deb" | grep -E '^ (Package|Version|Depends):'
  dpkg-deb --contents "$deb" > "$work/contents"
  want=(./usr/include/qkv/qkv.h ./usr/include/qkv/attention.h ./usr/include/qkv/version.h ./usr/bin/qkv qkvConfig.cmake
        qkvConfigVersion.cmake qkvTargets.cmake /libqkv.a /libqkv.so /pkgconfig/qkv.pc /dist-packages/qkv/__init__.py)
  [ $have_mpi = yes ] && want+=(./usr/include/qkv/distributed.h ./usr/include/qkv/sharding.h qkvDistributedTargets.cmake /libqkv_distributed.a)
  [ -f "$words" ] && want+=(./usr/share/qkv/words.txt)
  [ -f "$build/data/context-layer.safetensors" ] && want+=(./usr/share/qkv/context-layer.safetensors)
  for w in "${want[@]}"; do
    grep -q -- "$w" "$work/contents" || fail "the .deb lacks $w"
  done
  if grep -q -- 'src/' "$work/contents"; then fail "the .deb ships internal headers"; fi
  depends=$(dpkg-deb --field "$deb" Depends)
  for dep in libfmt libopenblas libgomp1 libstdc++6; do
    [[ "$depends" == *"$dep"* ]] || fail "Depends lacks $dep: $depends"
  done
  # The Python package must be where Debian's python3 looks for /usr.
  pydir=$(sed -n 's|.* \./usr/\(lib/[^ ]*dist-packages\)/qkv/__init__.py$|\1|p' "$work/contents")
  /usr/bin/python3 -c "import sys; sys.exit('/usr/$pydir' not in sys.path)" || fail "/usr/$pydir is not on /usr/bin/python3's sys.path"
  dpkg -x "$deb" "$work/root"
  check_cli "$work/root/usr/bin/qkv"
  check_python "$work/root/usr/$pydir"
  check_pc "$(dirname "$(find "$work/root" -name qkv.pc)")" "$work/root/usr"
  echo "deb ok"
  exit 0
fi

prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
[ -f "$prefix/include/qkv/qkv.h" ] || fail "no include/qkv/qkv.h installed"
# Every public header of the source tree, the ring's pair only with MPI.
for h in "$src"/include/qkv/*.h; do
  name=$(basename "$h")
  case $name in distributed.h | sharding.h) [ $have_mpi = yes ] || continue ;; esac
  [ -f "$prefix/include/qkv/$name" ] || fail "include/qkv/$name is not installed"
done
if find "$prefix/include" -name '*.h' | xargs grep -l '"\(core\|io\|kernels\|attention\|layer\)/' ; then
  fail "an installed header includes an internal one"
fi

for target in qkv::qkv qkv::qkv_shared; do
  check_cmake $target "$work/build-${target//:/_}" -DCMAKE_PREFIX_PATH="$prefix"
done

# pkg-config as the README says: the .pc is in <prefix>/lib/pkgconfig for a prefix other than /usr.
[ -f "$prefix/lib/pkgconfig/qkv.pc" ] || fail "no lib/pkgconfig/qkv.pc under the prefix: $(find "$prefix" -name qkv.pc)"
check_pc "$prefix/lib/pkgconfig" "$prefix"
# The soname follows the documented policy: major.minor, so a layout change refuses to load.
soname=$(objdump -p "$prefix/lib/libqkv.so" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = "libqkv.so.${version%.*}" ] || fail "libqkv.so's soname is '$soname', expected libqkv.so.${version%.*}"
loaded=$(env -i ldd "$work/hello-pc" | awk -v s="$soname" '$1 == s {print $3}')
[ -n "$loaded" ] && [ "$(realpath "$loaded")" = "$(realpath "$prefix/lib/$soname")" ] || fail "hello-pc loads $soname from '$loaded', not the prefix's lib"
echo "soname: $soname"

if [ $have_mpi = yes ]; then
  mkdir -p "$work/ring/src"
  cat > "$work/ring/src/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(ring LANGUAGES CXX)
find_package(qkv CONFIG REQUIRED COMPONENTS distributed)
add_executable(ring ring.cpp)
target_link_libraries(ring PRIVATE qkv::qkv_distributed)
# A consumer that fails on warnings: mpi.h's C++ bindings (OpenMPI's) must not be compiled in.
target_compile_options(ring PRIVATE -Wall -Wextra -Werror)
CMAKE
  cat > "$work/ring/src/ring.cpp" <<'CPP'
#include <cstdio>

#include <qkv/distributed.h>

int main() {
  for (const qkv::TokenRange& r : qkv::shard_ranges(8, 2, 0, qkv::Sharding::zigzag))
    std::printf("[%lld, %lld) ", static_cast<long long>(r.begin), static_cast<long long>(r.end));
  std::printf("\n");
}
CPP
  cmake -S "$work/ring/src" -B "$work/ring" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$work/ring" >/dev/null
  got=$("$work/ring/ring")
  [ "$got" = "[0, 2) [6, 8) " ] || fail "qkv::qkv_distributed: unexpected output '$got'"
  echo "find_package COMPONENTS distributed: $got"
else
  echo "qkv::qkv_distributed: not checked (this build has no MPI)"
fi

check_cli "$prefix/bin/qkv"
# Where /usr/bin/python3 looks under /usr/local is where the package goes under any prefix.
pydir=$(cd "$prefix" && find . -path '*/qkv/__init__.py' | sed 's|^\./||; s|/qkv/__init__.py$||')
/usr/bin/python3 -c "import sys; sys.exit('/usr/local/$pydir' not in sys.path)" \
  || fail "the Python package went to <prefix>/$pydir: /usr/local/$pydir is not on /usr/bin/python3's sys.path"
check_python "$prefix/$pydir"
# The whole prefix moved elsewhere: the .pc finds it there (its prefix is relative to the file).
mv "$prefix" "$work/moved"
check_pc "$work/moved/lib/pkgconfig" "$work/moved"

# An absolute libdir, as Nix and some distributions pass (-DCMAKE_INSTALL_LIBDIR=/...), here outside
# the prefix as Nix's outputs are. CMake fixes such a dir when the tree is configured, and the CMake
# package then names the configured prefix, so the tree is configured for both, installed, and set
# back as it was (by the cmake that configured it); only install rules change, so nothing is recompiled.
cached() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
old_prefix=$(cached CMAKE_INSTALL_PREFIX)
old_libdir=$(cached CMAKE_INSTALL_LIBDIR)
tree_cmake=$(cached CMAKE_COMMAND)
configure() {
  "$tree_cmake" -S "$src" -B "$build" -DCMAKE_INSTALL_PREFIX="$1" -DCMAKE_INSTALL_LIBDIR="$2" > "$work/configure.log" 2>&1 \
    || { cat "$work/configure.log" >&2; fail "configuring $build with prefix $1 and libdir $2 failed"; }
}
trap '(configure "$old_prefix" "$old_libdir"); rm -rf "$work"' EXIT
abs=$work/abs
configure "$abs/out" "$abs/lib/lib64"
cmake --install "$build" --prefix "$abs/out" >/dev/null
configure "$old_prefix" "$old_libdir"
trap 'rm -rf "$work"' EXIT
[ "$(cached CMAKE_INSTALL_PREFIX)|$(cached CMAKE_INSTALL_LIBDIR)" = "$old_prefix|$old_libdir" ] \
  || fail "$build was not set back to prefix $old_prefix and libdir $old_libdir"
[ -f "$abs/lib/lib64/libqkv.so" ] && [ -f "$abs/out/include/qkv/qkv.h" ] || fail "the absolute libdir's install is not where it was configured"
check_pc "$abs/lib/lib64/pkgconfig" "$abs/out" "$abs/lib/lib64"
# Debian's CMake does not search lib64 under a CMAKE_PREFIX_PATH entry: the package's own dir is given.
check_cmake qkv::qkv_shared "$work/build-abs" -Dqkv_DIR="$abs/lib/lib64/cmake/qkv"
loaded=$(env -i ldd "$work/build-abs/hello" | awk '$1 ~ /^libqkv\.so/ {print $3}')
[[ "$(realpath "$loaded")" == "$(realpath "$abs/lib/lib64")"/* ]] || fail "the CMake consumer loads libqkv from '$loaded', not from $abs/lib/lib64"
