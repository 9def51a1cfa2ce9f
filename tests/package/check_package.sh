#!/usr/bin/env bash
# The C++ package for real: installs this build to a temporary prefix, then builds and runs the
# README's "Use from CMake" consumer (find_package(qkv CONFIG REQUIRED), static and shared), the
# same program through pkg-config, and, when asked, builds the .deb and inspects it with dpkg-deb.
# Usage: check_package.sh <build dir> <source dir> [deb]
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
what=${3:-install}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The README's snippets, exactly as a reader copies them: each fenced block that follows a
# "<!-- file: NAME -->" line is written to NAME.
mkdir -p "$work/consumer"
awk -v dir="$work/consumer" '
  /^<!-- file: / { name = $3; next }
  name != "" && /^```/ { if (inside) { inside = 0; name = "" } else { inside = 1; out = dir "/" name; printf "" > out } next }
  inside { print >> out }
' "$src/README.md"
for f in CMakeLists.txt hello.cpp; do
  [ -s "$work/consumer/$f" ] || { echo "README.md has no '<!-- file: $f -->' snippet" >&2; exit 1; }
done

if [ "$what" = deb ]; then
  (cd "$build" && cpack -G DEB -B "$work/deb" >/dev/null)
  deb=$(ls "$work"/deb/qkv_*.deb)
  echo "built $(basename "$deb")"
  dpkg-deb --info "$deb" | grep -E '^ (Package|Version|Depends):'
  dpkg-deb --contents "$deb" > "$work/contents"
  for want in ./usr/include/qkv/qkv.h ./usr/include/qkv/attention.h ./usr/bin/qkv qkvConfig.cmake qkvConfigVersion.cmake \
              qkvTargets.cmake /libqkv.a /libqkv.so /pkgconfig/qkv.pc ./usr/lib/python3/dist-packages/qkv/__init__.py; do
    grep -q -- "$want" "$work/contents" || { echo "the .deb lacks $want" >&2; exit 1; }
  done
  if grep -q -- 'src/' "$work/contents"; then echo "the .deb ships internal headers" >&2; exit 1; fi
  depends=$(dpkg-deb --field "$deb" Depends)
  for dep in libfmt libopenblas libgomp1 libstdc++6; do
    [[ "$depends" == *"$dep"* ]] || { echo "Depends lacks $dep: $depends" >&2; exit 1; }
  done
  echo "deb ok"
  exit 0
fi

prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
[ -f "$prefix/include/qkv/qkv.h" ] || { echo "no include/qkv/qkv.h installed" >&2; exit 1; }
if find "$prefix/include" -name '*.h' | xargs grep -l '"\(core\|io\|kernels\|attention\|layer\)/' ; then
  echo "an installed header includes an internal one" >&2; exit 1
fi

for target in qkv::qkv qkv::qkv_shared; do
  dir=$work/build-${target//:/_}
  sed "s/qkv::qkv)/$target)/" "$work/consumer/CMakeLists.txt" > "$work/consumer/CMakeLists.txt.$$"
  mkdir -p "$dir/src" && cp "$work/consumer/hello.cpp" "$dir/src/" && mv "$work/consumer/CMakeLists.txt.$$" "$dir/src/CMakeLists.txt"
  cmake -S "$dir/src" -B "$dir" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$dir" >/dev/null
  got=$("$dir/hello")
  [ "$got" = "out[0] = 0.731059 0.268941" ] || { echo "find_package, $target: unexpected output '$got'" >&2; exit 1; }
  echo "find_package, $target: $got"
done

pc=$(find "$prefix" -name qkv.pc)
export PKG_CONFIG_PATH=$(dirname "$pc")
g++ -O1 "$work/consumer/hello.cpp" -o "$work/hello-pc" $(pkg-config --cflags --libs qkv)
libdir=$(pkg-config --variable=libdir qkv)
got=$(LD_LIBRARY_PATH=$libdir "$work/hello-pc")
[ "$got" = "out[0] = 0.731059 0.268941" ] || { echo "pkg-config: unexpected output '$got'" >&2; exit 1; }
echo "pkg-config: $got"
