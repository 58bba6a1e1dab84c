"""conveyor_gloo: run torch.distributed's backend="gloo" over Conveyor.

    import conveyor_gloo          # before init_process_group
    dist.init_process_group("gloo", ...)

Importing loads libconveyor-gloo-torch.so with RTLD_GLOBAL, which registers the
Gloo device "CONVEYOR" with torch, and sets GLOO_DEVICE_TRANSPORT=CONVEYOR
unless the environment already names a transport. CONVEYOR_GLOO_DEVICE picks
the provider (soft, shm, verbs[:name]); unset, shm between ranks on one host and
soft between hosts. CONVEYOR_GLOO_LIBRARY overrides where the library is found.

Importing it after a Gloo process group exists raises RuntimeError: torch has
then already fixed its Gloo transport to TCP for the whole process.
CONVEYOR_GLOO_DEBUG=INFO prints which transport, provider and address each
rank uses, and each pair's connection. `python3 -m conveyor_gloo.bench` compares
all_reduce over Gloo TCP and conveyor-gloo on this host.
"""
import ctypes
import os

import torch  # noqa: F401  (libtorch must be loaded before the glue)

_HERE = os.path.dirname(os.path.abspath(__file__))
_NAME = "libconveyor-gloo-torch.so"


def _find():
    explicit = os.environ.get("CONVEYOR_GLOO_LIBRARY")
    if explicit:
        return explicit
    # next to the module, the build tree (build/python -> build/lib), an install
    # (<prefix>/lib/python3.X/dist-packages/conveyor_gloo -> <prefix>/lib)
    for d in (_HERE, os.path.join(_HERE, "..", "..", "lib"), os.path.join(_HERE, "..", "..", "..")):
        p = os.path.join(d, _NAME)
        if os.path.exists(p):
            return os.path.abspath(p)
    return _NAME  # the dynamic loader's search path


def _gloo_groups():
    """Backends of the process groups torch.distributed already made (gloo's)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return []
    c10d = dist.distributed_c10d
    pg_map = getattr(c10d, "_pg_map", None)  # torch 1.13
    if pg_map is None:  # later torch
        pg_map = getattr(getattr(c10d, "_world", None), "pg_map", {})
    backends = [str(v[0]) for v in pg_map.values() if isinstance(v, tuple) and v]
    backends.append(str(dist.get_backend()))
    return [b for b in backends if "gloo" in b.lower()]


def _check_not_late():
    """Imported after a Gloo group exists: torch has already made its Gloo device,
    and it reads GLOO_DEVICE_TRANSPORT only once (the first time it makes one),
    so that group and every later one run over Gloo's TCP transport, not
    conveyor-gloo. Silently slower is the worst outcome: refuse instead."""
    transport = os.environ.get("GLOO_DEVICE_TRANSPORT", "CONVEYOR")
    if transport != "CONVEYOR" or not _gloo_groups():
        return
    raise RuntimeError(
        "conveyor_gloo was imported after torch.distributed.init_process_group(backend=\"gloo\"): "
        "torch has already chosen Gloo's TCP transport for this process (it reads "
        "GLOO_DEVICE_TRANSPORT once, when it makes its first Gloo device), so the run would "
        "silently not use conveyor-gloo. Import conveyor_gloo before init_process_group, or "
        "start the unmodified script with `python3 -m conveyor_gloo script.py` (or "
        "`python3 -m conveyor_gloo.torchrun ...`).")


_check_not_late()
library = ctypes.CDLL(_find(), mode=ctypes.RTLD_GLOBAL)
os.environ.setdefault("GLOO_DEVICE_TRANSPORT", "CONVEYOR")
