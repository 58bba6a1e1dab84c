"""gloo.torch.bench: `python3 -m conveyor_gloo.bench` (the "is it faster than
plain gloo here" command) prints one row per size with a gloo-tcp and a
conveyor column (time, bus bandwidth) and their ratio; with --format lines
(what bench/allreduce/run reads) one line per size and transport. Small sizes,
few iterations: this checks the output, not the speed.
"""
import subprocess
import sys

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED " + what, flush=True)


def bench(*args):
    cmd = [sys.executable, "-m", "conveyor_gloo.bench", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    print(f"--- {' '.join(args)}: exit {p.returncode}\n{p.stdout}{p.stderr}", end="", flush=True)
    check(p.returncode == 0, f"bench {' '.join(args)} failed")
    return p.stdout


# The command as documented, with -b/-e (8 B .. 4 KiB, factor 8: 4 sizes).
out = bench("-b", "8", "-e", "4K", "-f", "8", "-n", "2", "--iters", "3", "--rounds", "2")
header = [l for l in out.splitlines() if l.startswith("#")]
rows = [l.split() for l in out.splitlines() if l.strip() and not l.startswith("#")]
check(any("gloo-tcp" in l and "conveyor" in l for l in header),
      "the header does not name both transports")
check(any("time(us)" in l and "busbw" in l and "ratio" in l for l in header),
      "the header does not name time, busbw and ratio")
check([r[0] for r in rows] == ["8", "64", "512", "4K"], f"not one row per size: {rows}")
for r in rows:
    # size count | tcp time busbw | conveyor time busbw | ratio
    ok = len(r) == 7
    try:
        nums = [float(x) for x in r[1:]]
        ok = ok and nums[1] > 0 and nums[3] > 0 and nums[5] > 0
        ok = ok and abs(nums[5] - nums[1] / nums[3]) <= 0.02 * nums[5] + 0.01
    except ValueError:
        ok = False
    check(ok, f"row {r}: want size, count, tcp time, busbw, conveyor time, busbw, ratio")

# bench/allreduce/run's form: two conveyor providers, plot lines.
out = bench("--sizes", "4096", "-n", "2", "--iters", "2", "--rounds", "1", "--device", "soft,shm",
            "--format", "lines")
labels = sorted(l.split()[0] for l in out.splitlines() if len(l.split()) == 5)
check(labels == ["conveyor-shm", "conveyor-soft", "gloo-tcp"],
      f"--format lines: want one line per transport, got {labels}")

sys.exit(1 if failures else 0)
