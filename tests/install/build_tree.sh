#!/usr/bin/env bash
# consume_build_tree: the consumer project (consumer/) built against the build
# folder itself, before any install, the way a user tries a fresh build:
# find_package(conveyor) with CMAKE_PREFIX_PATH=<build dir> (shared and
# COMPONENTS static), and pkg-config with PKG_CONFIG_PATH=<build dir> (the
# -uninstalled .pc files, shared and static). Each consumer runs, and each loads
# (or, static, does not load) the build tree's libconveyor.so.0.
# Usage: build_tree.sh <build dir> <consumer source dir> <cmake> <c++ compiler> [generator]
set -euo pipefail
build=$(realpath "${1:?}") consumer=${2:?} cmake=${3:?} cxx=${4:?} generator=${5:-}
read -r -a cxxflags <<<"${CONVEYOR_TEST_CXXFLAGS:-}"
die() { echo "FAIL: $*" >&2; exit 1; }
out=$(mktemp -d "${TMPDIR:-/tmp}/conveyor-buildtree.XXXXXX")
trap 'rm -rf "$out"' EXIT
gen=()
[ -n "$generator" ] && gen=(-G "$generator")
so=$(find "$build" -maxdepth 3 -name 'libconveyor.so.0' | head -1)
[ -n "$so" ] || die "no libconveyor.so.0 in $build"

for kind in shared static; do
  echo "--- find_package(conveyor) from the build tree: $kind"
  static=OFF
  [ $kind = static ] && static=ON
  "$cmake" -S "$consumer" -B "$out/cmake-$kind" "${gen[@]}" -DCMAKE_PREFIX_PATH="$build" \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="${CONVEYOR_TEST_CXXFLAGS:-}" \
    -DCMAKE_BUILD_TYPE=Release -DCONSUMER_STATIC=$static >/dev/null ||
    die "find_package(conveyor) failed with CMAKE_PREFIX_PATH=$build"
  "$cmake" --build "$out/cmake-$kind" >/dev/null
  "$out/cmake-$kind/consumer"
  loaded=$(ldd "$out/cmake-$kind/consumer")
  if [ $kind = shared ]; then
    grep -qF "libconveyor.so.0 => $build/" <<<"$loaded" ||
      die "the find_package consumer does not load the build tree's library: $(grep conveyor <<<"$loaded")"
  elif grep -q libconveyor.so <<<"$loaded"; then
    die "the static consumer loads libconveyor.so"
  fi
done

echo "--- pkg-config --cflags --libs conveyor, PKG_CONFIG_PATH=$build"
read -r -a pcflags <<<"$(PKG_CONFIG_PATH=$build pkg-config --cflags --libs conveyor)"
echo "pkg-config: ${pcflags[*]}"
"$cxx" "${cxxflags[@]}" "$consumer/main.cpp" "${pcflags[@]}" -Wl,-rpath,"$(dirname "$so")" -o "$out/pc"
"$out/pc"
echo "--- pkg-config --cflags --libs conveyor-static, PKG_CONFIG_PATH=$build"
read -r -a pcflags <<<"$(PKG_CONFIG_PATH=$build pkg-config --cflags --libs conveyor-static)"
echo "pkg-config: ${pcflags[*]}"
"$cxx" "${cxxflags[@]}" "$consumer/main.cpp" "${pcflags[@]}" -o "$out/pc-static"
"$out/pc-static"
echo "PASS: the build tree works as a package with find_package and with pkg-config"
