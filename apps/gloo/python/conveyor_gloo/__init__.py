"""conveyor_gloo: run torch.distributed's backend="gloo" over Conveyor.

    import conveyor_gloo          # before init_process_group
    dist.init_process_group("gloo", ...)

Importing loads libconveyor-gloo-torch.so with RTLD_GLOBAL, which registers the
Gloo device "CONVEYOR" with torch, and sets GLOO_DEVICE_TRANSPORT=CONVEYOR
unless the environment already names a transport. CONVEYOR_GLOO_DEVICE picks
the provider (soft, shm, verbs[:name]); unset, shm between ranks on one host and
soft between hosts. CONVEYOR_GLOO_LIBRARY overrides where the library is found.
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


library = ctypes.CDLL(_find(), mode=ctypes.RTLD_GLOBAL)
os.environ.setdefault("GLOO_DEVICE_TRANSPORT", "CONVEYOR")
