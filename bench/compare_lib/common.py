"""The paths, sizes and names every part of bench/compare uses; log(), size_name() and NA."""
import os
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "build", "release")
BASELINE = os.path.join(BUILD, "bench", "conveyor-baseline")
FIBENCH = os.path.join(BUILD, "bench", "conveyor-fi-bench")
CONVEYOR = os.path.join(BUILD, "tools", "conveyor", "conveyor")

KIB, MIB = 1024, 1024 * 1024
SIZES = [8, 4 * KIB, 64 * KIB, 1 * MIB, 8 * MIB]
NS_SRV, NS_CLI = "cvycmp-srv", "cvycmp-cli"
VETH_SRV, VETH_CLI = "cvycmp0", "cvycmp1"
IP_SRV, IP_CLI = "10.77.0.1", "10.77.0.2"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def size_name(n):
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} B"


class NA(Exception):
    """A measurement that cannot be made here; the message is the reason."""
