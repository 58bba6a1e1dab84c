"""Runs tests/gloo/torch_ddp.py under torchrun over Gloo's TCP transport and over
Conveyor (`-m conveyor_gloo`, CONVEYOR_GLOO_DEVICE from the environment) and
checks the final parameters are bitwise equal. Usage: torch_ddp_compare.py NPROC
"""
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torchrun as launcher  # noqa: E402


def torchrun(nproc, args, env):
    rc = launcher.run(nproc, args, env)
    if rc != 0:
        sys.exit(f"failed: torchrun {' '.join(args)} (exit {rc})")


def main():
    nproc = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ)
        env.pop("GLOO_DEVICE_TRANSPORT", None)
        tcp, conv = os.path.join(d, "tcp.pt"), os.path.join(d, "conveyor.pt")
        torchrun(nproc, [os.path.join(HERE, "torch_ddp.py"), tcp], env)
        torchrun(nproc, ["-m", "conveyor_gloo", os.path.join(HERE, "torch_ddp.py"), conv], env)
        a, b = torch.load(tcp), torch.load(conv)
        if not torch.equal(a, b):
            sys.exit(f"parameters differ: max |diff| {float((a - b).abs().max())}")
        print(f"DDP final parameters over Conveyor equal those over Gloo TCP ({a.numel()} values)")


if __name__ == "__main__":
    main()
