#!/usr/bin/env bash
# bench.baseline_tcp_streams: the raw-TCP stream baseline in both polling modes,
# with and without its warm-up,
# against its own server: each prints its JSON line under its own name, and the
# client fails unless the server counted every byte it sent. Then the ping-pong
# over several connections (--conns), which must complete every round trip on
# every connection (a round trip the server missed hangs it: the timeout fails it).
# Usage: baseline_tcp_test.sh <conveyor-baseline>
set -euo pipefail
bin=${1:?}
port=$((20000 + RANDOM % 20000))
"$bin" tcp-server --bind "127.0.0.1:$port" 2>/dev/null &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
for i in $(seq 50); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
for poll in busy block; do
  for warm in 0 16; do
    out=$("$bin" tcp "127.0.0.1:$port" --test stream --poll "$poll" --size 64K --duration 0.05 \
      --warmup "$warm")
    grep -q "\"test\":\"tcp-stream-$poll\",\"mode\":\"bw\",\"size\":65536" <<<"$out" ||
      { echo "FAIL: --poll $poll --warmup $warm printed: $out" >&2; exit 1; }
  done
done
for poll in busy block; do
  out=$(timeout 20 "$bin" tcp "127.0.0.1:$port" --test pingpong --poll "$poll" --size 64 --iters 2000 \
    --duration 10 --conns 8)
  grep -q "\"test\":\"tcp-pingpong-$poll\",\"mode\":\"lat\",\"size\":64" <<<"$out" &&
    grep -q '"iterations":2000' <<<"$out" ||
    { echo "FAIL: --conns 8 --poll $poll printed: $out" >&2; exit 1; }
done
# --conns is a ping-pong option; the server survives a bad request.
if "$bin" tcp "127.0.0.1:$port" --test stream --size 8 --duration 0.01 --conns 2 2>/dev/null; then
  echo "FAIL: --conns with --test stream was accepted" >&2; exit 1
fi
out=$("$bin" tcp "127.0.0.1:$port" --test pingpong --size 8 --iters 100 --duration 10)
grep -q '"iterations":100' <<<"$out" || { echo "FAIL: the server stopped serving: $out" >&2; exit 1; }
echo "PASS"
