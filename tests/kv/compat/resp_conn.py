"""A raw RESP2/RESP3 connection for the compat suites: every reply parsed into
tagged tuples that keep what the wire said (a null bulk is not a null array, a
RESP3 set is not an array, a double is not a bulk), so two servers' replies
compare exactly."""
import socket


def encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, port, timeout=10.0):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def close(self):
        self.s.close()

    def send(self, *args):
        self.s.sendall(encode(args))

    def call(self, *args):
        self.send(*args)
        return self.read()

    def _fill(self):
        chunk = self.s.recv(1 << 16)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _bytes(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def read(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return ("simple", rest)
        if t == b"-":
            return ("err", rest)
        if t == b":":
            return ("int", int(rest))
        if t == b",":
            return ("dbl", rest)
        if t == b"_":
            return ("null",)
        if t == b"#":
            return ("bool", rest)
        if t in (b"$", b"="):
            n = int(rest)
            return ("null",) if n < 0 else ("bulk", self._bytes(n))
        if t in (b"*", b"~", b">"):
            n = int(rest)
            if n < 0:
                return ("nullarr",)
            return ({b"*": "arr", b"~": "set", b">": "push"}[t], [self.read() for _ in range(n)])
        if t == b"%":
            n = int(rest)
            return ("map", [(self.read(), self.read()) for _ in range(n)])
        raise ValueError("unexpected reply line %r" % line)
