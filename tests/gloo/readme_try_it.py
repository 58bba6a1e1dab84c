"""readme.try_it: README.md's "Try it in a minute" block, run as written.

    readme_try_it.py <build dir> <README.md>

Runs the block with bash (-e: every command must succeed) in a scratch folder
whose `build/release` links to the build folder, with Debian's python3 first
on PATH, in a session of its own so the servers the block starts in the
background are stopped afterwards whatever happens. Then checks what each part
says it shows: the devices, the ping's summary, the kv round trip through
redis-cli, every rank's all_reduce and the Python import. torchrun's port comes
from PET_MASTER_PORT (its documented environment form), as in gloo.torch.readme.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile

from readme_torchrun import free_port


def readme_block(readme):
    text = open(readme).read()
    section = text[text.index("## Try it in a minute"):]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def main():
    build, readme = sys.argv[1], sys.argv[2]
    block = readme_block(readme)
    print("README block:\n" + block, flush=True)
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "build"))
        os.symlink(os.path.abspath(build), os.path.join(d, "build", "release"))
        env = dict(os.environ, PET_MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
        env.pop("PYTHONPATH", None)
        env["PATH"] = "/usr/bin:" + env.get("PATH", "")
        out_path = os.path.join(d, "out.txt")
        with open(out_path, "w") as out:
            p = subprocess.Popen(["bash", "-e", "-c", block], cwd=d, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = p.wait(timeout=240)
            except subprocess.TimeoutExpired:
                rc = "timeout"
            finally:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # the block's background servers
                except ProcessLookupError:
                    pass
        out = open(out_path).read()
    print(out[-6000:])
    if rc != 0:
        sys.exit(f"FAIL: the block exited {rc}")
    nproc = int(re.search(r"--nproc_per_node[ =](\d+)", block).group(1))
    want = float(nproc * (nproc + 1) // 2)
    checks = {
        "conveyor devices lists soft": re.search(r"^\s*soft\b", out, re.M),
        "ping prints min/median/max": re.search(r"min.*median.*max", out),
        "redis-cli reads back what it set": re.search(r"^hello$", out, re.M),
        f"every rank all_reduces to {want}": len(re.findall(
            r"rank \d+: \[" + re.escape(str(want)) + r"(, " + re.escape(str(want)) + r")*\]",
            out)) == nproc,
        "import conveyor lists devices": re.search(r"soft", out.split("rank ")[-1]),
    }
    failed = [k for k, ok in checks.items() if not ok]
    if failed:
        sys.exit("FAIL: " + "; ".join(failed))
    print("PASS: README's try-it block runs as written and shows what it says")


if __name__ == "__main__":
    main()
