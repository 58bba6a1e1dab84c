"""gloo.torch.readme: README.md's PyTorch lines, run as written.

    readme_torchrun.py <build dir> <README.md>

Takes the shell block of README.md's PyTorch section (the `export PYTHONPATH=...`
line and the launcher line) and runs it with bash in a scratch folder that holds
a small train.py and a `build/release` link to the build folder, so the relative
PYTHONPATH of the README resolves. train.py all_reduces over backend="gloo" on
every rank and checks the sum and that the process group runs on the CONVEYOR
transport. Then the same lines with CONVEYOR_GLOO_DEVICE=bogus must fail naming
that device: the ranks really went through conveyor-gloo. torchrun's port comes
from PET_MASTER_PORT (its documented environment form), so the lines stay as
written while parallel tests do not meet on the default port.
"""
import os
import re
import socket
import subprocess
import sys
import tempfile

TRAIN = r'''
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert os.environ.get("GLOO_DEVICE_TRANSPORT") == "CONVEYOR", os.environ.get("GLOO_DEVICE_TRANSPORT")
t = torch.full((1 << 16,), float(rank + 1))
dist.all_reduce(t)
want = world * (world + 1) / 2
assert torch.all(t == want), (rank, t[:4], want)
dist.barrier()
print(f"rank {rank}/{world}: all_reduce {t[0].item()} ok", flush=True)
dist.destroy_process_group()
'''


def readme_block(readme):
    text = open(readme).read()
    section = text[text.index("## PyTorch"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    lines = [ln for ln in block.splitlines() if ln.strip()]
    assert any("conveyor_gloo" in ln for ln in lines), block
    return "\n".join(lines)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(block, build, env_extra):
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "build"))
        os.symlink(os.path.abspath(build), os.path.join(d, "build", "release"))
        with open(os.path.join(d, "train.py"), "w") as f:
            f.write(TRAIN)
        env = dict(os.environ, PET_MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1", **env_extra)
        env.pop("PYTHONPATH", None)
        # The README's lines call python3 and torchrun by name: Debian's first.
        env["PATH"] = "/usr/bin:" + env.get("PATH", "")
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=d, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
        return p.returncode, p.stdout


def main():
    build, readme = sys.argv[1], sys.argv[2]
    block = readme_block(readme)
    print("README lines:\n" + block, flush=True)
    rc, out = run(block, build, {})
    print(out[-4000:])
    if rc != 0:
        sys.exit(f"FAIL: README's lines exited {rc}")
    nproc = int(re.search(r"--nproc_per_node[ =](\d+)", block).group(1))
    done = len(re.findall(r"all_reduce [\d.]+ ok", out))
    if done != nproc:
        sys.exit(f"FAIL: {done} of {nproc} ranks reported a correct all_reduce")
    rc, out = run(block, build, {"CONVEYOR_GLOO_DEVICE": "bogus"})
    if rc == 0 or "bogus" not in out:
        print(out[-4000:])
        sys.exit("FAIL: with CONVEYOR_GLOO_DEVICE=bogus the lines did not fail naming the device: "
                 "the ranks did not go through conveyor-gloo")
    print("PASS: README's torchrun lines run as written; the ranks use conveyor-gloo")


if __name__ == "__main__":
    main()
