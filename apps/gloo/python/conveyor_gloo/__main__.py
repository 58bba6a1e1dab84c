"""Run an unmodified script with torch.distributed's Gloo backend on Conveyor.

    python3 -m conveyor_gloo.torchrun --nproc_per_node 4 train.py --epochs 3
    torchrun --nproc_per_node 4 -m conveyor_gloo train.py --epochs 3
    python3 -m conveyor_gloo train.py ...
    python3 -m conveyor_gloo -m package.module ...

Importing the package registers the transport and sets
GLOO_DEVICE_TRANSPORT=CONVEYOR; the script (or module) then runs as __main__
with its own arguments.
"""
import runpy
import sys

import conveyor_gloo  # noqa: F401

if len(sys.argv) < 2 or (sys.argv[1] == "-m" and len(sys.argv) < 3):
    sys.exit("usage: python3 -m conveyor_gloo SCRIPT [ARGS...] | -m MODULE [ARGS...]")
if sys.argv[1] == "-m":
    module = sys.argv[2]
    sys.argv = [module] + sys.argv[3:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
