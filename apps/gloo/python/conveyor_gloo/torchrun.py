"""torchrun with every rank on conveyor-gloo:

    python3 -m conveyor_gloo.torchrun --nproc_per_node 4 train.py --epochs 3

takes torchrun's own arguments and runs torch.distributed.run with the training
script wrapped as `-m conveyor_gloo SCRIPT ...` (each rank imports conveyor_gloo
before the script runs). A script given with `-m module` runs as
`-m conveyor_gloo -m module ...`; `--no_python` is refused (it runs no Python).

It also works on torch 1.13 with Python 3.11 (Debian 12), where plain torchrun
stops before starting any rank: its launcher turns `--redirects`/`--tee`
(default "0") into a stream set by iterating the Flag enum, and since Python
3.11 that iteration skips the empty and the combined members, so "0" and "3"
become None ("'NoneType' object has no attribute 'get'"). This module maps the
number to the member directly (Std(value)), only where the launcher's own
conversion returns None; on a torch without the fault nothing changes.
"""
import sys

from torch.distributed import run as _run
from torch.distributed.elastic.multiprocessing import api as _api


def _fix_std_parsing():
    std = _api.Std
    original = std.from_str.__func__

    def from_str(cls, vm):
        got = original(cls, vm)
        if got is None:  # a single number the launcher's loop did not find
            return cls(int(vm))
        if isinstance(got, dict):
            fixed = {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
            return {k: (v if v is not None else fixed[k]) for k, v in got.items()}
        return got

    std.from_str = classmethod(from_str)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    _fix_std_parsing()
    args = _run.parse_args(argv)
    if args.no_python:
        sys.exit("conveyor_gloo.torchrun: --no_python runs no Python, so conveyor_gloo cannot be imported; "
                 "import conveyor_gloo in the program instead")
    script_args = [args.training_script] + list(args.training_script_args)
    if args.module:
        script_args = ["-m"] + script_args
    args.module = True
    args.training_script = "conveyor_gloo"
    args.training_script_args = script_args
    _run.run(args)


if __name__ == "__main__":
    main()
