#!/usr/bin/env bash
# install_and_consume: installs the build tree into a temporary prefix, then
# builds and runs a separate consumer project against that prefix four ways:
# find_package(conveyor) with conveyor::conveyor (shared) and with
# conveyor::conveyor_static, `pkg-config --libs conveyor` (shared, no --static)
# and `pkg-config --libs conveyor-static`. It checks what each binary loads,
# the library's SONAME and that libconveyor.so exports only the public API.
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
for f in include/conveyor/conveyor.hpp include/conveyor/cm.hpp include/conveyor/export.hpp; do
  [ -f "$prefix/$f" ] || die "not installed: $f"
done
[ ! -e "$prefix/include/conveyor/README.md" ] || die "include/conveyor/README.md (the source tree's folder note) was installed"
so=$(find "$prefix" -name 'libconveyor.so.0' | head -1)
archive=$(find "$prefix" -name 'libconveyor.a' | head -1)
config=$(find "$prefix" -name 'conveyor-config.cmake' | head -1)
pc=$(find "$prefix" -name 'conveyor.pc' | head -1)
[ -n "$so" ] || die "no libconveyor.so.0 installed"
[ -n "$archive" ] || die "no libconveyor.a installed"
[ -n "$config" ] || die "no conveyor-config.cmake installed"
[ -n "$pc" ] || die "no conveyor.pc installed"
[ -f "$(dirname "$pc")/conveyor-static.pc" ] || die "no conveyor-static.pc installed"
[ -L "$(dirname "$so")/libconveyor.so" ] || die "no libconveyor.so link (for -lconveyor) next to $so"
# Pipelines here never end in `grep -q`: it exits at the first match, the
# writer can then die of SIGPIPE, and with pipefail the check failed at random
# (ldd's output, in a full run under load). Each output is taken whole first.
internal_headers=$(find "$prefix" -path '*/src/*' -name '*.hpp')
if [ -n "$internal_headers" ]; then
  die "internal headers were installed: $(head -3 <<<"$internal_headers")"
fi
libdir=$(dirname "$so")
echo "installed: ${so#$prefix/}, ${archive#$prefix/}, ${config#$prefix/}, ${pc#$prefix/}"

echo "--- libconveyor.so: SONAME, versioned public symbols only"
soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libconveyor.so.0 ] || die "SONAME is '$soname', want libconveyor.so.0"
exported=$(nm -D --defined-only --with-symbol-versions "$so" | awk '$2 != "A" {print $3}')
[ -n "$exported" ] || die "libconveyor.so exports nothing"
count=$(wc -l <<<"$exported")
unversioned=$(grep -v '@@CONVEYOR_0$' <<<"$exported" || true)
[ -z "$unversioned" ] || die "symbols without version CONVEYOR_0: $(head -3 <<<"$unversioned")"
demangled=$(sed 's/@@CONVEYOR_0$//' <<<"$exported" | c++filt)
foreign=$(grep -Ev '^((typeinfo|typeinfo name|vtable) for )?conveyor::' <<<"$demangled" || true)
[ -z "$foreign" ] || die "libconveyor.so exports symbols outside namespace conveyor: $(head -5 <<<"$foreign")"
internal=$(grep -E '^((typeinfo|typeinfo name|vtable) for )?conveyor::(detail|soft|shm|swnic|verbs|wire)::' <<<"$demangled" || true)
[ -z "$internal" ] || die "libconveyor.so exports internals: $(head -5 <<<"$internal")"
for want in 'conveyor::device::open(' 'conveyor::connect(' 'conveyor::build_info()'; do
  grep -qF "$want" <<<"$demangled" || die "libconveyor.so does not export $want"
done
echo "SONAME $soname; $count symbols exported, all public API, all CONVEYOR_0"

needs() {
  local dyn
  dyn=$(readelf -d "$1")
  grep -q "(NEEDED).*\[$2\]" <<<"$dyn"
}
gen=()
[ -n "$generator" ] && gen=(-G "$generator")
consume_cmake() {  # <name> <extra cmake args...>
  local name=$1; shift
  "$cmake" -S "$consumer" -B "$prefix/$name" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="${CONVEYOR_TEST_CXXFLAGS:-}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  "$cmake" --build "$prefix/$name" >/dev/null
  "$prefix/$name/consumer"
}

# No pkg-config module but the installed ones: the shared library must need
# none of ISA-L's or rdma-core's development files.
echo "--- find_package(conveyor), conveyor::conveyor, with no other pkg-config module visible"
PKG_CONFIG_LIBDIR=$prefix/nonexistent PKG_CONFIG_PATH="" consume_cmake consumer-shared
needs "$prefix/consumer-shared/consumer" libconveyor.so.0 || die "the find_package consumer does not load libconveyor.so.0"
! needs "$prefix/consumer-shared/consumer" 'libisal.*' || die "the shared consumer links ISA-L itself: it should be private to libconveyor.so"
echo "--- the same with COMPONENTS static and no ISA-L visible: must fail, naming what is missing"
if out=$(PKG_CONFIG_LIBDIR=$prefix/nonexistent PKG_CONFIG_PATH="" \
         "$cmake" -S "$consumer" -B "$prefix/consumer-nostatic" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
         -DCMAKE_CXX_COMPILER="$cxx" -DCONSUMER_STATIC=ON 2>&1); then
  die "find_package(conveyor COMPONENTS static) succeeded without ISA-L's pkg-config file"
fi
grep -q "conveyor_static needs the development" <<<"$out" && grep -q "libisal" <<<"$out" ||
  die "unclear failure: $out"

echo "--- find_package(conveyor COMPONENTS static), conveyor::conveyor_static"
consume_cmake consumer-static -DCONSUMER_STATIC=ON
! needs "$prefix/consumer-static/consumer" 'libconveyor.so.*' || die "the static consumer loads libconveyor.so"

export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
pc_prefix=$(pkg-config --variable=prefix conveyor)
if [ "$(realpath -m "$pc_prefix")" != "$(realpath -m "$prefix")" ]; then
  die "conveyor.pc says prefix=$pc_prefix but was installed under $prefix: the file is configured" \
      "with CMAKE_INSTALL_PREFIX at configure time, so 'cmake --install --prefix' does not relocate it" \
      "(a relocatable .pc uses prefix=\${pcfiledir}/../..)"
fi
echo "--- pkg-config --cflags --libs conveyor (no --static), only the installed .pc visible"
read -r -a pcflags <<<"$(PKG_CONFIG_LIBDIR=$(dirname "$pc") pkg-config --cflags --libs conveyor)"
echo "pkg-config --cflags --libs conveyor: ${pcflags[*]}"
"$cxx" "${cxxflags[@]}" "$consumer/main.cpp" "${pcflags[@]}" -Wl,-rpath,"$libdir" -o "$prefix/consumer-pc"
"$prefix/consumer-pc"
needs "$prefix/consumer-pc" libconveyor.so.0 || die "the pkg-config consumer does not load libconveyor.so.0"

echo "--- pkg-config --cflags --libs conveyor-static"
read -r -a pcflags <<<"$(pkg-config --cflags --libs conveyor-static)"
echo "pkg-config --cflags --libs conveyor-static: ${pcflags[*]}"
"$cxx" "${cxxflags[@]}" "$consumer/main.cpp" "${pcflags[@]}" -o "$prefix/consumer-pc-static"
"$prefix/consumer-pc-static"
! needs "$prefix/consumer-pc-static" 'libconveyor.so.*' || die "the conveyor-static consumer loads libconveyor.so"

echo "--- installed programs run from the prefix (RUNPATH \$ORIGIN/../lib)"
if [ -x "$prefix/bin/conveyor" ]; then
  "$prefix/bin/conveyor" --version
  loaded=$(ldd "$prefix/bin/conveyor")
  grep -qF "libconveyor.so.0 => $prefix/" <<<"$loaded" ||
    die "installed conveyor does not load the installed libconveyor.so.0: $(grep conveyor <<<"$loaded")"
fi
echo "PASS: installed Conveyor works shared and static, with find_package and with pkg-config"
