"""torchrun with a free port and torch 1.13's launcher quirks handled:
   torchrun.py NPROC [torchrun arguments...] SCRIPT [ARGS...]

--standalone always uses port 29400, so parallel tests would meet each other;
this picks a free port for the static rendezvous instead. And torch 1.13's
launcher cannot parse its own default "--redirects 0" under Python 3.11 (enum
Flag iteration changed), so it passes "2" (tee stderr), a value it does parse.
"""
import os
import socket
import subprocess
import sys
import tempfile


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(nproc, args, env=None, timeout=240):
    with tempfile.TemporaryDirectory() as logs:
        cmd = ["/usr/bin/torchrun", "--nnodes=1", f"--nproc_per_node={nproc}",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}",
               "--redirects", "2", "--tee", "2", "--log_dir", logs] + list(args)
        e = dict(os.environ if env is None else env)
        e.setdefault("OMP_NUM_THREADS", "1")
        return subprocess.run(cmd, env=e, timeout=timeout).returncode


if __name__ == "__main__":
    sys.exit(run(int(sys.argv[1]), sys.argv[2:]))
