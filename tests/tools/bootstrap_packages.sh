#!/usr/bin/env bash
# Every program a step of scripts/test (and scripts/demo, scripts/package, the
# benchmarks) calls must come from a package that scripts/bootstrap installs, or
# from one that every Debian 12 system has (Priority: required). A fresh minimal
# Debian 12 (debootstrap --variant=minbase plus git) has nothing else, so a
# program that is merely present on the machine the suite ran on is not enough.
# Fails naming the program, its package and the step that needs it.
# Usage: tests/tools/bootstrap_packages.sh <repository root>
set -euo pipefail
repo=${1:?usage: bootstrap_packages.sh <repository root>}
# The package lists, read from the scripts themselves (the lines of `packages=(...)`):
# scripts/bootstrap's, and bench/bootstrap's (the benchmarks' peers, which the tests
# do not need and CI does not install).
eval "$(sed -n '/^packages=(/,/^)/p' "$repo/bench/bootstrap")"
bench_packages=("${packages[@]}")
eval "$(sed -n '/^packages=(/,/^)/p' "$repo/scripts/bootstrap")"
# ... and what they depend on, recursively (Depends and Pre-Depends only).
declare -A closure=()
while read -r p; do closure[${p%%:*}]=1; done < <(
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances --installed "${packages[@]}" 2>/dev/null | grep -v '^[ <]')
declare -A bench_closure=()
while read -r p; do bench_closure[${p%%:*}]=1; done < <(
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances --installed "${packages[@]}" "${bench_packages[@]}" 2>/dev/null |
    grep -v '^[ <]')

# step: programs it runs (by name on PATH, or an absolute path).
checks=(
  "build:g++ cmake ninja ccache pkg-config git"
  "format:clang-format"
  "fuzz:clang++-16"
  "wire-capture:tshark tcpdump"
  "two-host-and-namespace-tests:ip sysctl"
  "package:cpack dpkg-shlibdeps dpkg-deb file unshare chroot apt-get"
  "python-and-kv-tests:/usr/bin/python3 redis-server redis-cli redis-benchmark memcached /usr/bin/etcd"
  "bench:taskset fi_info"
  # Only bench/bootstrap installs these: where they are absent (CI) nothing runs them.
  "bench-peers:gnuplot mpirun ucx_perftest"
)
fail=0
for c in "${checks[@]}"; do
  step=${c%%:*}
  for prog in ${c#*:}; do
    path=$(command -v "$prog" || true)
    if [ -z "$path" ] && [ "$step" = bench-peers ]; then
      echo "note: '$prog' is not installed (bench/bootstrap installs it)"
      continue
    fi
    if [ -z "$path" ]; then
      echo "FAIL: step '$step' runs '$prog', which is not installed (scripts/bootstrap ran first?)"
      fail=1
      continue
    fi
    real=$(readlink -f "$path")
    # dpkg -S knows the path as the package shipped it: try the resolved path, then
    # the PATH entry, then both under /usr (merged /usr: /bin is /usr/bin).
    owner=""
    for q in "$real" "$path" "/usr$real" "/usr$path" "${real#/usr}" "${path#/usr}"; do
      owner=$(dpkg -S "$q" 2>/dev/null | head -1 | cut -d: -f1) && [ -n "$owner" ] && break
    done
    if [ -z "$owner" ]; then
      echo "FAIL: step '$step' runs '$prog' ($real), which no Debian package owns"
      fail=1
      continue
    fi
    # The listed packages pull in their dependencies: accept anything in that closure.
    ok=0
    if [ -n "${closure[$owner]:-}" ]; then ok=1; fi
    if [ "$step" = bench-peers ] && [ -n "${bench_closure[$owner]:-}" ]; then ok=1; fi
    prio=$(dpkg-query -W -f='${Priority}' "$owner" 2>/dev/null || true)
    [ "$prio" = required ] && ok=1
    installer=scripts/bootstrap
    [ "$step" = bench-peers ] && installer="scripts/bootstrap or bench/bootstrap"
    if [ $ok -eq 0 ]; then
      echo "FAIL: step '$step' runs '$prog' from package '$owner' (Priority: ${prio:-?}), which $installer does not install"
      fail=1
    fi
  done
done
[ $fail -eq 0 ] || exit 1
echo "PASS: every program the steps run comes from a package scripts/bootstrap installs (or a required one)"
