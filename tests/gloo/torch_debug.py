"""gloo.torch.debug: CONVEYOR_GLOO_DEBUG=INFO says which transport and provider
each rank uses and each pair's connection (as NCCL_DEBUG=INFO does); nothing
is printed by default; a pair that cannot connect is reported on stderr by
every rank whatever the level.

Two ranks on this host, rendezvous through a FileStore, one all_reduce.
"""
import os
import subprocess
import sys
import tempfile

RANK = r"""
import sys, datetime
import conveyor_gloo  # before init_process_group
import torch, torch.distributed as dist
rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=30))
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
assert bool((t == 3).all()), t
dist.destroy_process_group()
"""

failures = []


def run(name, envs):
    """Both ranks, each with its own extra environment; returns [(rc, stderr)]."""
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for r, extra in enumerate(envs):
            env = {k: v for k, v in os.environ.items()
                   if k not in ("CONVEYOR_GLOO_DEVICE", "CONVEYOR_GLOO_DEBUG",
                                "CONVEYOR_GLOO_TRACE", "GLOO_DEVICE_TRANSPORT")}
            env.update(extra)
            procs.append(subprocess.Popen(
                [sys.executable, "-c", RANK, str(r), os.path.join(tmp, "store")], env=env,
                stderr=subprocess.PIPE, text=True))
        out = []
        for p in procs:
            try:
                _, err = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            out.append((p.returncode, err))
    for r, (rc, err) in enumerate(out):
        print(f"--- {name}: rank {r} exit {rc}\n{err}", end="", flush=True)
    return out


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED " + what, flush=True)


# INFO, default provider choice: shm between two ranks on one host.
for (rc, err), r in zip(run("info.auto", [{"CONVEYOR_GLOO_DEBUG": "INFO"}] * 2), (0, 1)):
    other = 1 - r
    check(rc == 0, f"info.auto: rank {r} failed")
    check(f"rank {r}/2: transport conveyor, provider auto" in err,
          f"info.auto: rank {r} printed no device line naming transport and provider")
    check(f"rank {r} <-> rank {other}: connected over shm" in err,
          f"info.auto: rank {r} printed no pair line naming shm")

# INFO with a forced provider: the lines name it.
soft = {"CONVEYOR_GLOO_DEBUG": "info", "CONVEYOR_GLOO_DEVICE": "soft"}
for (rc, err), r in zip(run("info.soft", [soft] * 2), (0, 1)):
    check(rc == 0, f"info.soft: rank {r} failed")
    check(f"rank {r}/2: transport conveyor, provider soft (CONVEYOR_GLOO_DEVICE), devices soft, "
          f"address " in err, f"info.soft: rank {r} printed no device line naming soft")
    check(f"rank {r} <-> rank {1 - r}: connected over soft" in err,
          f"info.soft: rank {r} printed no pair line naming soft")

# Default: silent.
for (rc, err), r in zip(run("default", [{}] * 2), (0, 1)):
    check(rc == 0, f"default: rank {r} failed")
    check("conveyor-gloo" not in err, f"default: rank {r} printed conveyor-gloo lines")

# A pair that cannot connect (the ranks disagree on the provider): each rank
# says so on stderr without CONVEYOR_GLOO_DEBUG.
bad = [{"CONVEYOR_GLOO_DEVICE": "soft"}, {"CONVEYOR_GLOO_DEVICE": "shm"}]
for (rc, err), r in zip(run("mismatch", bad), (0, 1)):
    check(rc != 0, f"mismatch: rank {r} did not fail")
    line = [l for l in err.splitlines() if l.startswith("conveyor-gloo error")]
    check(any(f"rank {r}: connecting to rank {1 - r} failed" in l and
              "CONVEYOR_GLOO_DEVICE differs" in l for l in line),
          f"mismatch: rank {r} printed no error line naming the pair and the cause")

sys.exit(1 if failures else 0)
