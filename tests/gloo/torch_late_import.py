"""gloo.torch.late_import: `import conveyor_gloo` after init_process_group
(backend="gloo") used to run silently over Gloo's TCP transport (torch reads
GLOO_DEVICE_TRANSPORT once, when it makes its first Gloo device); it must
raise a RuntimeError that says to import it first. Controls: imported first,
torch really goes through conveyor-gloo (a bogus provider fails); a late import
where the user chose another transport (GLOO_DEVICE_TRANSPORT=TCP) is allowed.
One rank each, in fresh processes.
"""
import os
import subprocess
import sys
import tempfile

INIT = """
import datetime, sys, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=30))
"""
LATE = INIT + """
try:
    import conveyor_gloo
except RuntimeError as e:
    print("RAISED", e)
    sys.exit(3)
print("IMPORTED")
"""
EARLY = "import conveyor_gloo\n" + INIT + "print('INITIALISED')\n"

failures = []


def run(name, code, extra):
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items()
               if k not in ("CONVEYOR_GLOO_DEVICE", "GLOO_DEVICE_TRANSPORT")}
        env.update(extra)
        p = subprocess.run([sys.executable, "-c", code, os.path.join(tmp, "store")], env=env,
                           capture_output=True, text=True, timeout=120)
    print(f"--- {name}: exit {p.returncode}\n{p.stdout}{p.stderr}", end="", flush=True)
    return p


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED " + what, flush=True)


p = run("late", LATE, {})
check(p.returncode == 3 and "RAISED" in p.stdout, "late: the import did not raise RuntimeError")
check("before init_process_group" in p.stdout and "GLOO_DEVICE_TRANSPORT" in p.stdout,
      "late: the error does not say to import before init_process_group, and why")

p = run("late.tcp_chosen", LATE, {"GLOO_DEVICE_TRANSPORT": "TCP"})
check(p.returncode == 0 and "IMPORTED" in p.stdout,
      "late.tcp_chosen: refused although the user chose TCP")

p = run("early", EARLY, {})
check(p.returncode == 0 and "INITIALISED" in p.stdout, "early: import then init failed")

p = run("early.bogus", EARLY, {"CONVEYOR_GLOO_DEVICE": "bogus"})
check(p.returncode != 0 and "CONVEYOR_GLOO_DEVICE='bogus'" in p.stderr,
      "early.bogus: torch did not go through conveyor-gloo after an early import")

sys.exit(1 if failures else 0)
