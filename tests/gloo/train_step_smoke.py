"""gloo.torch.train_step: bench/allreduce/train-step (DDP step time over Gloo
TCP and conveyor-gloo) still runs and reports. 2 ranks, the tiny model, 3
steps, one round, Gloo TCP and conveyor-gloo over shm and soft: the table
names every transport and the JSON lines parse, with one object per
transport, the transport torch really used, positive times, samples/s and
ratio that agree with them, and the same parameters at the end over both
transports. This checks the program, not the speed.
    train_step_smoke.py PROGRAM BUILD_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

program, build = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED " + what, flush=True)


with tempfile.TemporaryDirectory() as d:
    out_json = os.path.join(d, "out.jsonl")
    cmd = ["/usr/bin/python3", program, "--ranks", "2", "--model", "tiny", "--steps", "3",
           "--warmup", "1", "--rounds", "1", "--device", "shm,soft", "--build", build,
           "--timeout", "60", "--json", out_json]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    print(f"--- {' '.join(cmd)}: exit {p.returncode}\n{p.stdout}{p.stderr}", end="", flush=True)
    check(p.returncode == 0, "train-step failed")
    rows = [l.split() for l in p.stdout.splitlines() if l.strip() and not l.startswith("#")]
    check(sorted(r[1] for r in rows) == ["conveyor-shm", "conveyor-soft", "gloo-tcp"],
          f"table: want one row per transport, got {rows}")
    check(any("samples/s" in l and "vs tcp" in l for l in p.stdout.splitlines()),
          "table header does not name samples/s and vs tcp")
    res = []
    if os.path.exists(out_json):
        with open(out_json) as f:
            for line in f:
                try:
                    res.append(json.loads(line))
                except ValueError:
                    check(False, f"not JSON: {line!r}")

by = {r.get("transport"): r for r in res}
check(sorted(by) == ["conveyor-shm", "conveyor-soft", "gloo-tcp"],
      f"JSON: want one object per transport, got {sorted(by)}")
want = {"gloo-tcp": "TCP", "conveyor-shm": "CONVEYOR:shm", "conveyor-soft": "CONVEYOR:soft"}
for label, r in by.items():
    try:
        check(r["gloo_transport"] == want.get(label),
              f"{label} ran over {r['gloo_transport']}, want {want.get(label)}")
        check(r["ranks"] == 2 and r["steps"] == 3 and r["params"] > 0, f"{label}: {r}")
        check(r["step_ms"] > 0 and r["nosync_ms"] > 0, f"{label}: non-positive times {r}")
        sps = r["ranks"] * r["batch_per_rank"] / (r["step_ms"] / 1e3)
        check(abs(sps - r["samples_per_s"]) <= 0.01 * sps + 0.01,
              f"{label}: samples/s {r['samples_per_s']} does not follow from step_ms ({sps:.2f})")
        ratio = r["step_ms"] / by["gloo-tcp"]["step_ms"]
        check(abs(ratio - r["vs_tcp_of_medians"]) <= 0.01 * ratio + 0.001,
              f"{label}: vs_tcp_of_medians {r['vs_tcp_of_medians']}")
        # one round: the median of the rounds' ratios is that round's, the same
        check(abs(ratio - r["vs_tcp"]) <= 0.01 * ratio + 0.001, f"{label}: vs_tcp {r['vs_tcp']}")
        check(r["checksum"] == by["gloo-tcp"]["checksum"],
              f"{label}: parameters differ from gloo-tcp's ({r['checksum']})")
    except (KeyError, TypeError, ZeroDivisionError) as e:
        check(False, f"{label}: malformed object {r} ({e!r})")

sys.exit(1 if failures else 0)
