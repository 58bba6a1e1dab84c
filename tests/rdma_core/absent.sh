#!/usr/bin/env bash
# verbs_absent_soft_shm_work: a program linked with libconveyor.so, run where
# rdma-core is not installed, starts, moves data over soft and shm, lists the
# verbs provider as unavailable and fails to open it with
# "rdma-core (libibverbs.so.1) is not installed: apt install ...", never crashing.
#
# rdma-core is made absent in a private mount namespace (unshare -m): each
# directory holding libibverbs.so* or librdmacm.so* (as ldconfig knows them)
# gets an overlay of itself (upper layer on a tmpfs) in which those files are
# deleted, so dlopen("libibverbs.so.1") finds no file, as on a machine without
# the packages. The host is untouched; the namespace's mounts vanish with it.
# Needs root (skipped, exit 77, otherwise). On a machine without rdma-core the
# programs run as they are.
# Usage: absent.sh <conveyor command> <conveyor-rdma-core-probe>
set -euo pipefail
conveyor=$(realpath "${1:?usage: absent.sh <conveyor command> <probe>}")
probe=$(realpath "${2:?usage: absent.sh <conveyor command> <probe>}")
die() { echo "FAIL: $*" >&2; exit 1; }
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: needs root, to hide rdma-core in a private mount namespace (unshare -m, overlay mounts)"
  exit 77
fi
if ! unshare --mount --propagation private true 2>/dev/null; then
  echo "SKIP: unshare --mount is refused here (no CAP_SYS_ADMIN?): cannot hide rdma-core"
  exit 77
fi

# Directories the loader would find rdma-core's libraries in.
cache=$(ldconfig -p)
libs=$(awk '/lib(ibverbs|rdmacm)\.so/ {print $NF}' <<<"$cache")
dirs=""
for l in $libs; do
  [ -e "$l" ] && dirs+="$(dirname "$(realpath "$l")")"$'\n'
done
dirs=$(sort -u <<<"$dirs" | sed '/^$/d')
echo "hiding rdma-core's libraries in: ${dirs:-(none: rdma-core is not installed here)}"

out=$(mktemp -d "${TMPDIR:-/tmp}/conveyor-no-rdma-core.XXXXXX")
trap 'rm -rf "$out"' EXIT
rc=0
timeout --kill-after=10 120 unshare --mount --propagation private bash -euo pipefail -c '
  out=$1 conveyor=$2 probe=$3 dirs=$4
  layers=$(mktemp -d)
  mount -t tmpfs tmpfs "$layers"
  n=0
  while read -r d; do
    [ -n "$d" ] || continue
    n=$((n + 1))
    mkdir -p "$layers/upper$n" "$layers/work$n"
    mount -t overlay overlay -o "lowerdir=$d,upperdir=$layers/upper$n,workdir=$layers/work$n" "$d"
    rm -f "$d"/libibverbs.so* "$d"/librdmacm.so*
    left=$(find "$d" -maxdepth 1 \( -name "libibverbs.so*" -o -name "librdmacm.so*" \))
    [ -z "$left" ] || { echo "still visible: $left" >&2; exit 1; }
  done <<<"$dirs"
  unset LD_LIBRARY_PATH LD_PRELOAD
  rc=0
  "$conveyor" devices >"$out/devices.txt" 2>&1 || rc=$?
  echo "$rc" >"$out/devices.rc"
  rc=0
  "$probe" >"$out/probe.txt" 2>&1 || rc=$?
  echo "$rc" >"$out/probe.rc"
' bash "$out" "$conveyor" "$probe" "$dirs" || rc=$?
[ "$rc" -eq 0 ] || die "the mount namespace could not be set up (exit $rc)"

want="rdma-core (libibverbs.so.1) is not installed: apt install ibverbs-providers librdmacm1"
echo "--- conveyor devices (exit $(cat "$out/devices.rc")), rdma-core hidden"
cat "$out/devices.txt"
[ "$(cat "$out/devices.rc")" -eq 0 ] || die "conveyor devices failed without rdma-core"
devices=$(cat "$out/devices.txt")
grep -q '^soft$' <<<"$devices" || die "conveyor devices does not list soft"
grep -q '^shm' <<<"$devices" || die "conveyor devices does not list shm"
grep -qF "available:         no: $want" <<<"$devices" ||
  die "conveyor devices does not say that rdma-core is not installed and what to install"

echo "--- conveyor-rdma-core-probe (exit $(cat "$out/probe.rc")), rdma-core hidden"
cat "$out/probe.txt"
probe_out=$(cat "$out/probe.txt")
grep -qx 'soft: READ 65536 bytes verified' <<<"$probe_out" || die "soft did not work without rdma-core"
grep -qx 'shm: READ 65536 bytes verified' <<<"$probe_out" || die "shm did not work without rdma-core"
for name in verbs verbs:mlx5_0; do
  grep -qF "$name: unsupported: open $name: $want" <<<"$probe_out" ||
    die "opening $name does not fail with errc::unsupported saying '$want'"
done
[ "$(cat "$out/probe.rc")" -eq 0 ] || die "the probe failed (exit $(cat "$out/probe.rc"))"
echo "PASS: without rdma-core, soft and shm work and verbs says what to install"
