#!/usr/bin/env bash
# tools.man_pages_and_completion: every subcommand `conveyor --help` lists has a
# man page made from its --help (the options are there, groff renders it), and
# the bash completion offers subcommands and each one's options.
# Usage: man_and_completion.sh <conveyor> <man dir> <completion script>
set -euo pipefail
tool=${1:?} mandir=${2:?} completion=${3:?}
die() { echo "FAIL: $*" >&2; exit 1; }
subs=$("$tool" --help | sed -n 's/^  \([a-z_][a-z_]*\)  .*/\1/p')
[ -n "$subs" ] || die "no subcommands in conveyor --help"
[ -f "$mandir/conveyor.1" ] || die "no conveyor.1 in $mandir"
for s in $subs; do
  page=$mandir/conveyor-$s.1
  [ -f "$page" ] || die "no man page for conveyor $s ($page)"
  grep -q "^\.TH CONVEYOR-${s^^} 1" "$page" || die "$page has no .TH line"
done
grep -q -- '--report_gbits' "$mandir/conveyor-write_bw.1" || die "conveyor-write_bw.1 lacks --report_gbits"
grep -q -- '--tx-depth' "$mandir/conveyor-perf.1" || die "conveyor-perf.1 lacks --tx-depth"
grep -q 'conveyor kv serve --help' "$mandir/conveyor-kv.1" || die "conveyor-kv.1 lacks kv serve"
if command -v groff >/dev/null; then
  out=$(groff -man -Tutf8 "$mandir/conveyor-perf.1" 2>&1)
  grep -q -- '--duration' <<<"$out" || die "groff did not render conveyor-perf.1: $out"
  grep -qi 'warning' <<<"$out" && die "groff warns on conveyor-perf.1: $out"
fi

complete_words() {  # <words...>: what completing the last word offers
  bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); _conveyor; printf "%s\n" "${COMPREPLY[@]}"' \
    _ "$completion" "$@"
}
got=$(complete_words "$tool" pe)
[ "$got" = perf ] || die "completing 'pe' gave '$got', want perf"
got=$(complete_words "$tool" wri)
grep -qx write_bw <<<"$got" && grep -qx write_lat <<<"$got" || die "completing 'wri' gave '$got'"
got=$(complete_words "$tool" write_bw --rep)
grep -qx -- --report_gbits <<<"$got" || die "completing 'write_bw --rep' gave '$got'"
got=$(complete_words "$tool" kv se)
grep -qx serve <<<"$got" && grep -qx set <<<"$got" || die "completing 'kv se' gave '$got'"
got=$(complete_words "$tool" kv serve --append)
grep -qx -- --appendonly <<<"$got" || die "completing 'kv serve --append' gave '$got'"
# kv get|set|del take redis-cli's letters (-h host, -p port, -a password) and --provider's values.
got=$(complete_words "$tool" kv get k --ho)
grep -qx -- --host <<<"$got" || die "completing 'kv get k --ho' gave '$got'"
got=$(complete_words "$tool" kv get k -)
grep -qx -- -h <<<"$got" && grep -qx -- -a <<<"$got" && grep -qx -- --pass <<<"$got" ||
  die "completing 'kv get k -' gave '$got'"
got=$(complete_words "$tool" kv get k --provider s)
grep -qx shm <<<"$got" && grep -qx soft <<<"$got" || die "completing 'kv get --provider s' gave '$got'"
echo "PASS: $(wc -w <<<"$subs") subcommands with man pages; completion offers subcommands and options"
