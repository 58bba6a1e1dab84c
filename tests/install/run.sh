#!/usr/bin/env bash
# install_and_consume: installs the build tree into a temporary prefix, then
# builds and runs a separate consumer project against that prefix twice: with
# CMake's find_package(conveyor) and with pkg-config (static: --static).
# Usage: run.sh <build dir> <consumer source dir> <cmake> <c++ compiler> [generator]
# The compiler flags of the build (sanitizers) come in CONVEYOR_TEST_CXXFLAGS.
set -euo pipefail
build=${1:?} consumer=${2:?} cmake=${3:?} cxx=${4:?} generator=${5:-}
read -r -a cxxflags <<<"${CONVEYOR_TEST_CXXFLAGS:-}"
die() { echo "FAIL: $*" >&2; exit 1; }

prefix=$(mktemp -d "${TMPDIR:-/tmp}/conveyor-install.XXXXXX")
trap 'rm -rf "$prefix"' EXIT

echo "--- cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix"
for f in include/conveyor/conveyor.hpp include/conveyor/cm.hpp; do
  [ -f "$prefix/$f" ] || die "not installed: $f"
done
lib=$(find "$prefix" -name 'libconveyor.a' -o -name 'libconveyor.so' | head -1)
config=$(find "$prefix" -name 'conveyor-config.cmake' | head -1)
pc=$(find "$prefix" -name 'conveyor.pc' | head -1)
[ -n "$lib" ] || die "no libconveyor installed"
[ -n "$config" ] || die "no conveyor-config.cmake installed"
[ -n "$pc" ] || die "no conveyor.pc installed"
if find "$prefix" -path '*/src/*' -name '*.hpp' | grep -q .; then
  die "internal headers were installed: $(find "$prefix" -path '*/src/*' -name '*.hpp' | head -3)"
fi
echo "installed: ${lib#$prefix/}, ${config#$prefix/}, ${pc#$prefix/}"

echo "--- consumer via find_package(conveyor), CMAKE_PREFIX_PATH=$prefix"
gen=()
[ -n "$generator" ] && gen=(-G "$generator")
"$cmake" -S "$consumer" -B "$prefix/consumer-build" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="${CONVEYOR_TEST_CXXFLAGS:-}" -DCMAKE_BUILD_TYPE=Release
"$cmake" --build "$prefix/consumer-build"
"$prefix/consumer-build/consumer"

echo "--- consumer via pkg-config --static, PKG_CONFIG_PATH=$(dirname "$pc")"
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
pc_prefix=$(pkg-config --variable=prefix conveyor)
if [ "$(realpath -m "$pc_prefix")" != "$(realpath -m "$prefix")" ]; then
  die "conveyor.pc says prefix=$pc_prefix but was installed under $prefix: the file is configured" \
      "with CMAKE_INSTALL_PREFIX at configure time, so 'cmake --install --prefix' does not relocate it" \
      "(a relocatable .pc uses prefix=\${pcfiledir}/../..)"
fi
read -r -a pcflags <<<"$(pkg-config --static --cflags --libs conveyor)"
echo "pkg-config --static --cflags --libs conveyor: ${pcflags[*]}"
"$cxx" "${cxxflags[@]}" "$consumer/main.cpp" "${pcflags[@]}" -o "$prefix/consumer-pc"
"$prefix/consumer-pc"
echo "PASS: installed Conveyor works with find_package and with pkg-config"
