"""What the compat suites (kv_compat.py, kv_limits.py, kv_server_ops.py,
kv_scripts.py, kv_types.py) share: a `conveyor kv serve --port 0` (KvServer:
starts it, reads the RESP port from its start-up line, and keeps draining its
stderr, kept in stderr_lines, so the server never blocks on it), a
redis-server beside it (RedisServer), free_port and encode."""
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def encode(*argv):
    """One command as a RESP array of bulk strings."""
    out = b"*%d\r\n" % len(argv)
    for a in argv:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


class RedisServer:
    """A redis-server 7 on a free loopback port, in its own temporary directory
    (nothing persisted unless args say so), killed by stop()."""


    def client(self, **kw):
        """A redis-py client of this server (imported here: not every suite has
        redis-py's needs)."""
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10, **kw)

    def __init__(self, *args):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="conveyor-kv-redis.")
        self.proc = subprocess.Popen(
            ["/usr/bin/redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start")

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class KvServer:

    def client(self, **kw):
        """A redis-py client of this server (imported here: not every suite has
        redis-py's needs)."""
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10, **kw)

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

    def alive(self):
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM):
        """Signals the server (SIGTERM: a clean stop), kills it after 20 s;
        returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.drain.join(5)
        self.proc.stderr.close()
        return self.proc.returncode

    def _drain(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line)
