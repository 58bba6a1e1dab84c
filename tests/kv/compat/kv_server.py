"""A `conveyor kv serve --port 0` for the compat suites (kv_compat.py,
kv_limits.py): starts it, reads the RESP port from its start-up line, and keeps
draining its stderr (kept in stderr_lines) so the server never blocks on it."""
import re
import subprocess
import threading
import time


class KvServer:
    def __init__(self, binary, *args, preexec_fn=None):
        sized = "--data-bytes" in args
        cmd = [binary, "kv", "serve", "--port", "0", *([] if sized else ["--data-bytes", "64mb"]),
               *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, preexec_fn=preexec_fn)
        self.stderr_lines = []
        self.port = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.stderr_lines.append(line)
            m = re.search(r"RESP on [^ ]*:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            self.proc.wait(10)
            raise RuntimeError("server did not start: " + "".join(self.stderr_lines))
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()

    def sanitized(self):
        """True when the server runs under ASan or TSan (their runtimes map shadow memory)."""
        with open(f"/proc/{self.proc.pid}/maps") as f:
            maps = f.read()
        return "libasan" in maps or "libtsan" in maps

    def _drain(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line)
