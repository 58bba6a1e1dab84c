"""Run an unmodified script with torch.distributed's Gloo backend on Conveyor.

    torchrun --nproc_per_node 4 -m conveyor_gloo train.py --epochs 3
    python3 -m conveyor_gloo train.py ...

Importing the package registers the transport and sets
GLOO_DEVICE_TRANSPORT=CONVEYOR; the script then runs as __main__ with its own
arguments.
"""
import runpy
import sys

import conveyor_gloo  # noqa: F401

if len(sys.argv) < 2:
    sys.exit("usage: python3 -m conveyor_gloo SCRIPT [ARGS...]")
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
