#!/usr/bin/env bash
# verbs_rdma_core_not_needed: libconveyor.so (and the programs given after it,
# linked with it or with the static archive) neither lists libibverbs or librdmacm as NEEDED nor leaves an ibv_*/rdma_*
# symbol for the loader to bind: the verbs provider dlopen()s rdma-core when a
# verbs device is first used (src/providers/verbs/rdma_core_loader.hpp).
# Usage: not_needed.sh <libconveyor.so> [program...]
set -euo pipefail
die() { echo "FAIL: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: not_needed.sh <libconveyor.so> [program...]"
for elf in "$@"; do
  [ -f "$elf" ] || die "no such file: $elf"
  # Each output is taken whole before grep (no SIGPIPE under pipefail).
  dyn=$(readelf -d "$elf")
  needed=$(sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' <<<"$dyn")
  [ -n "$needed" ] || die "readelf -d $elf lists no NEEDED at all (not a dynamic ELF?)"
  echo "$elf NEEDED: $(tr '\n' ' ' <<<"$needed")"
  rdma=$(grep -E '^lib(ibverbs|rdmacm)\.so' <<<"$needed" || true)
  [ -z "$rdma" ] || die "$elf needs $(tr '\n' ' ' <<<"$rdma")at load time: a program that uses only soft and shm would not start without rdma-core"
  undefined=$(nm -D --undefined-only "$elf")
  rdma=$(grep -E ' (ibv|rdma)_[a-z0-9_]+(@|$)' <<<"$undefined" || true)
  [ -z "$rdma" ] || die "$elf leaves rdma-core symbols to the dynamic loader: $(head -5 <<<"$rdma" | tr -s ' ' | tr '\n' ';')"
done
echo "PASS: no NEEDED libibverbs/librdmacm and no undefined ibv_*/rdma_* symbol in $*"
