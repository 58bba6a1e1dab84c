#!/bin/bash
# Runs inside the VM (started by tests/vm/run): brings up rxe, then siw, on a
# veth, runs the suites and the interop/demo programs, writes results to
# /run/results and powers off. Every step has a timeout.
set -u
R=/run/results
source "$R/config"   # BUILD, ROOT, KVER, FILTER, STEP_TIMEOUT, STEPS, PARTS
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
ulimit -l unlimited
fails=0
part() { [[ " $PARTS " == *" $1 "* ]]; }  # part <name>: is this part of the run wanted?
summary() { echo "$*" | tee -a "$R/summary"; }
step() {  # step <name> <cmd...>: runs with a timeout, records PASS/FAIL and time
  local name=$1; shift
  local t0=$SECONDS
  echo "=== step $name: $*"
  timeout -k 5 "$STEP_TIMEOUT" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  local took=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then summary "PASS $name (${took}s)"; else summary "FAIL $name rc=$rc (${took}s)"; fails=$((fails + 1)); fi
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|tests? ran|interop:' "$R/$name.log" | tail -40
  return 0
}
gtests() {  # gtests <device label>: the conformance (incl. negative) and fault suites
  local dev=$1
  for s in conformance fault; do
    step "$s-$dev" env CONVEYOR_TEST_PROVIDERS=verbs \
      CONVEYOR_TEST_TIMEOUT_SCALE=4 "$BUILD/tests/$s/conveyor_${s}_tests" \
      --gtest_filter="$FILTER" --gtest_brief=1
  done
}
interop() {  # interop <name> <server device> <client device> <crc>: every verb, bytes verified
  [ -x "$BUILD/tests/vm/conveyor_vm_interop" ] || { summary "FAIL $1: conveyor_vm_interop not built"; fails=$((fails + 1)); return; }
  step "$1" "$BUILD/tests/vm/conveyor_vm_interop" --server "$2" --client "$3" --crc "$4" --addr 10.11.0.1
}
tool="$BUILD/tools/conveyor/conveyor"
demo="$BUILD/examples/conveyor-demo"
# waits (bounded) until file $1 has a line matching $2
wait_line() { local i; for i in $(seq 150); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.2; done; return 1; }
perf() {  # perf <device>: conveyor perf against one persistent server, several tests, each checked
  local dev=$1 addr=10.11.0.1:18515
  [ -x "$tool" ] || { summary "FAIL perf-$dev: conveyor tool not built"; fails=$((fails + 1)); return; }
  timeout -k 5 "$STEP_TIMEOUT" "$tool" perf --server --persistent -p verbs -d "verbs:$dev" "$addr" \
    > "$R/perf-$dev-server.log" 2>&1 &
  local spid=$!
  if ! wait_line "$R/perf-$dev-server.log" "listening on"; then
    summary "FAIL perf-$dev-server: not listening after 30 s (perf-$dev-server.log)"; fails=$((fails + 1))
    kill "$spid" 2>/dev/null; wait "$spid"; return
  fi
  local t
  local tests=("write bw" "read bw" "write lat" "read lat" "send bw" "send lat")
  # Atomics where the device has them (rxe); siw has none and perf refuses them.
  [ "$dev" = rxe0 ] && tests+=("fetch-add lat" "compare-swap lat")
  for t in "${tests[@]}"; do
    set -- $t
    local extra=(--verify)
    [ "$2" = bw ] && extra+=(-D 1) || extra+=(-n 200)
    step "perf-$dev-$1-$2" "$tool" perf "$addr" -p verbs -d "verbs:$dev" -t "$1" -m "$2" "${extra[@]}" --quiet
  done
  # The server must have served every client without an error and still be up.
  if kill -0 "$spid" 2>/dev/null && ! grep -qi "error\|fail" "$R/perf-$dev-server.log"; then
    summary "PASS perf-$dev-server (served ${#tests[@]} clients)"
  else
    summary "FAIL perf-$dev-server (see perf-$dev-server.log)"; fails=$((fails + 1))
  fi
  kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
}
demo_pair() {  # demo_pair <device>: the demo's target and initiator on one device, both must pass
  local dev=$1 addr=10.11.0.1:7471 t0=$SECONDS
  [ -x "$demo" ] || { summary "FAIL demo-$dev: conveyor-demo not built"; fails=$((fails + 1)); return; }
  timeout -k 5 "$STEP_TIMEOUT" "$demo" --role target --address "$addr" --device "verbs:$dev" \
    > "$R/demo-$dev-target.log" 2>&1 &
  local tpid=$!
  timeout -k 5 "$STEP_TIMEOUT" "$demo" --role initiator --address "$addr" --device "verbs:$dev" \
    > "$R/demo-$dev.log" 2>&1
  local irc=$?
  [ $irc -ne 0 ] && { sleep 2; kill "$tpid" 2>/dev/null; }
  wait "$tpid"
  local trc=$?
  if [ $irc -eq 0 ] && [ $trc -eq 0 ]; then
    summary "PASS demo-$dev ($((SECONDS - t0))s): $(grep -m1 '^target: OK' "$R/demo-$dev-target.log" | cut -c1-100)"
  else
    summary "FAIL demo-$dev initiator rc=$irc target rc=$trc (demo-$dev.log, demo-$dev-target.log)"
    fails=$((fails + 1))
  fi
  grep -h "FAILED\|skipped:" "$R/demo-$dev.log" "$R/demo-$dev-target.log"
}

regcache() {  # regcache <device>: ibv_reg_mr + dereg against a registration cache hit, by size
  local bin="$BUILD/bench/conveyor-regcache-bench"
  [ -x "$bin" ] || { summary "SKIP regcache-$1: conveyor-regcache-bench not built"; return; }
  step "regcache-$1" "$bin" --providers "verbs:$1" --runs 3 --ms 20
  # The cache must have cached: a monitor that did not start serves every
  # acquire uncached, which the benchmark alone would time without failing.
  if ! grep -qE "^verbs:$1 stats: hits [1-9][0-9]* .* monitor $" "$R/regcache-$1.log"; then
    summary "FAIL regcache-$1-hits: no hits or no monitor ($(grep -m1 'stats:' "$R/regcache-$1.log"))"
    fails=$((fails + 1))
  fi
  # The table (TCG-emulated: compare the columns, not the absolute times).
  grep -E "^verbs:$1 " "$R/regcache-$1.log" | tee -a "$R/summary"
}

gloo_verbs() {  # gloo_verbs <device>: Gloo's algorithms over conveyor-gloo on the verbs provider
  local bin="$BUILD/tests/gloo/conveyor-gloo-test"
  [ -x "$bin" ] || { summary "SKIP gloo-$1: conveyor-gloo-test not built (no libgloo-dev)"; return; }
  step "gloo-$1" "$bin" --ranks 2 --device "verbs:$1" --host 10.11.0.1
}

echo "guest: kernel $(uname -r), $(nproc) cpus"
modprobe veth
ip link add veth0 type veth peer name veth1
ip addr add 10.11.0.1/24 dev veth0
ip link set lo up; ip link set veth1 up; ip link set veth0 up
modprobe -a ib_core ib_uverbs rdma_ucm rdma_cm iw_cm libcrc32c

# shm's ptrace declaration under Yama ptrace_scope 1 (issue 11, finding 9): the
# host cannot change its own scope, this kernel can. The hostile shm case then
# checks the kernel-side half: the declared peer attaches, a stranger cannot.
if part yama; then
  yama=/proc/sys/kernel/yama/ptrace_scope
  if [ -w "$yama" ]; then
    old=$(cat "$yama")
    echo 1 > "$yama"
    if [ "$(cat "$yama")" = 1 ]; then
      # As an unprivileged user: CAP_SYS_PTRACE (root) is not bound by Yama.
      step yama-scope1-shm setpriv --reuid=nobody --regid=nogroup --clear-groups --inh-caps=-all \
        "$BUILD/tests/hostile/shm/conveyor_hostile_shm_tests" \
        --gtest_filter='shm_hostile.ptrace_declaration_is_scoped_to_the_peers_that_need_it' --gtest_brief=1
      grep -q "does not bind this process" "$R/yama-scope1-shm.log" &&
        { summary "FAIL yama-scope1-shm: the test did not see scope 1"; fails=$((fails + 1)); }
    else
      summary "FAIL yama: cannot set ptrace_scope to 1"; fails=$((fails + 1))
    fi
    echo "$old" > "$yama"
  else
    summary "FAIL yama: this kernel has no writable $yama"; fails=$((fails + 1))
  fi
fi

if [[ " $STEPS " == *" rxe "* ]]; then
  modprobe rdma_rxe && rdma link add rxe0 type rxe netdev veth0
  step devices-rxe "$BUILD/tests/vm/conveyor_vm_interop" --list
  ibv_devinfo -d rxe0 > "$R/ibv_devinfo-rxe0.txt" 2>&1
  part gtests && gtests rxe0
  part interop && interop verbs-rxe0-pair verbs:rxe0 verbs:rxe0 1
  part perf && perf rxe0
  part demo && demo_pair rxe0
  part gloo && gloo_verbs rxe0
  part regcache && regcache rxe0
  # verbs_transport_params (RNR retries and timer, path MTU; range checks) and
  # the port-down grace period (a 300 ms flap keeps the QPs, an outage fails
  # each after its own grace).
  part events && step transport-rxe0 env CONVEYOR_LOG=info "$BUILD/tests/vm/conveyor_vm_interop" --transport verbs:rxe0 10.11.0.1
  part events && step portflap-rxe0 "$BUILD/tests/vm/conveyor_vm_interop" --port-flap verbs:rxe0 veth0 10.11.0.1
  # Last on this device: the port goes down under a connection with requests
  # in flight (all must complete, flushed), then down and up with none.
  part events && step portdown-rxe0 "$BUILD/tests/vm/conveyor_vm_interop" --port-down verbs:rxe0 veth0 10.11.0.1
  part events && step events-rxe0 "$BUILD/tests/vm/conveyor_vm_interop" --port-events verbs:rxe0 veth0
  # The device removed under a connection (this deletes rxe0; siw refuses
  # `rdma link delete`). rxe1 keeps another device present: librdmacm 44
  # releases a removed device's context only while some device is left.
  if part events; then
    rdma link add rxe1 type rxe netdev veth1
    step removal-rxe0 "$BUILD/tests/vm/conveyor_vm_interop" --device-removal verbs:rxe0 10.11.0.1
    rdma link delete rxe1
  fi
  # Gone already when part events removed it; otherwise it would hold 10.11.0.1.
  rdma link delete rxe0 > /dev/null 2>&1 || true
fi

if [[ " $STEPS " == *" siw "* ]]; then
  insmod "$ROOT/.cache/vm/$KVER/siw.ko" && rdma link add siw0 type siw netdev veth0
  step devices-siw "$BUILD/tests/vm/conveyor_vm_interop" --list
  ibv_devinfo -d siw0 > "$R/ibv_devinfo-siw0.txt" 2>&1
  part gtests && gtests siw0
  part interop && interop verbs-siw0-pair verbs:siw0 verbs:siw0 1
  part perf && perf siw0
  part demo && demo_pair siw0
  part gloo && gloo_verbs siw0
  part regcache && regcache siw0
  part interop && for crc in 0 1; do
    # Linux 6.1 siw never asks for CRC itself (mpa_crc_required is a constant)
    # but honours a peer's request: soft asks (as initiator or in its reply)
    # with --crc 1, and the soft side checks that CRC is in force.
    interop "interop-soft-to-siw-crc$crc" verbs:siw0 soft "$crc"
    interop "interop-siw-to-soft-crc$crc" soft verbs:siw0 "$crc"
  done
  part events && step transport-siw0 "$BUILD/tests/vm/conveyor_vm_interop" --transport verbs:siw0 10.11.0.1
  part events && step portflap-siw0 "$BUILD/tests/vm/conveyor_vm_interop" --port-flap verbs:siw0 veth0 10.11.0.1
  # Last on this device: the port goes down under a connection with requests
  # in flight (all must complete, flushed), then down and up with none.
  part events && step portdown-siw0 "$BUILD/tests/vm/conveyor_vm_interop" --port-down verbs:siw0 veth0 10.11.0.1
  part events && step events-siw0 "$BUILD/tests/vm/conveyor_vm_interop" --port-events verbs:siw0 veth0
fi
if [[ " $STEPS " == *" siw "* ]] && part interop; then
  dmesg > "$R/dmesg.txt"
  # siw must have parsed the Terminates soft sent (bad rkey, out-of-bounds READ).
  if grep -q "siw: got TERMINATE" "$R/dmesg.txt" && ! grep -q "rx bogus TERM" "$R/dmesg.txt"; then
    summary "PASS siw-understood-soft-terminates ($(grep -c 'siw: got TERMINATE' "$R/dmesg.txt") parsed: $(grep -m1 'siw: got TERMINATE' "$R/dmesg.txt" | sed 's/.*TERMINATE. //'))"
  else
    summary "FAIL siw-understood-soft-terminates (see dmesg.txt)"; fails=$((fails + 1))
  fi
fi
echo "$fails" > "$R/exit_code"
sync
poweroff -f || echo o > /proc/sysrq-trigger
