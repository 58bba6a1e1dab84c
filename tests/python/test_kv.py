"""conveyor.kv: conveyor-kv's client from Python against a real `conveyor kv
serve` (soft and shm): one-sided GET/MGET/HGET/HMGET/HGETALL, a key read again
in one READ, write RPCs, WRONGTYPE, close()."""

import os
import socket
import subprocess
import time

import pytest

import conveyor
import conveyor.kv

BUILD = os.environ.get("CONVEYOR_BUILD_DIR", "")
TOOL = os.path.join(BUILD, "tools", "conveyor", "conveyor")

pytestmark = pytest.mark.skipif(not os.path.exists(TOOL), reason="the conveyor tool is not built")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp_path, address, *args, provider="soft"):
    """`conveyor kv serve` with its RDMA front end at `address`, once its RESP
    port answers."""
    port = free_port()
    proc = subprocess.Popen([TOOL, "kv", "serve", "--quiet", "--port", str(port), "--provider",
                             provider, "--rdma-listen", address, "--dir", str(tmp_path)] + list(args))
    deadline = time.time() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise AssertionError("kv serve did not start (exit %s)" % proc.poll())
            time.sleep(0.05)


def stop(proc):
    proc.terminate()
    proc.wait(20)


# Each provider with an address in its own syntax (shm: a name on this host).
ADDRESSES = {
    "soft": lambda: "127.0.0.1:%d" % free_port(),
    "shm": lambda: "@kv-py-%d" % os.getpid(),
}


@pytest.fixture(params=sorted(ADDRESSES))
def server(request, tmp_path):
    provider = request.param
    address = ADDRESSES[provider]()
    proc = start_server(tmp_path, address, provider=provider)
    yield address
    stop(proc)


def test_strings_by_one_sided_reads_and_the_second_read_is_one_read(server):
    with conveyor.kv.Client.connect(server) as c:
        c.set("greeting", "hello")
        c.set(b"bin\x00ary", b"\x00\xff\x01")
        assert c.get("greeting") == b"hello"
        assert c.get(b"bin\x00ary") == b"\x00\xff\x01"
        assert c.get("absent") is None
        before = c.stats()
        assert c.get("greeting") == b"hello"
        after = c.stats()
        assert after["one_read"] == before["one_read"] + 1
        assert after["reads"] == before["reads"] + 1
        assert c.mget(["greeting", "absent", b"bin\x00ary"]) == [b"hello", None, b"\x00\xff\x01"]
        assert c.incr("n") == 1 and c.incr("n", 41) == 42
        assert c.get("n") == b"42"
        assert c.delete("greeting") is True
        assert c.delete("greeting") is False
        assert c.get("greeting") is None, "a deleted key read from a remembered location"
        assert c.expire("n", 0.001) is True
        time.sleep(0.01)
        assert c.get("n") is None


def test_hashes_by_one_sided_reads(server):
    with conveyor.kv.Client.connect(server) as c:
        assert c.command("HSET", "user:1", "name", "ada", "lang", "c++") == b":2\r\n"
        assert c.hgetall("user:1") == {b"name": b"ada", b"lang": b"c++"}
        assert c.hget("user:1", "name") == b"ada"
        assert c.hget("user:1", "absent") is None
        assert c.hmget("user:1", ["lang", "x", "name"]) == [b"c++", None, b"ada"]
        assert c.hgetall("nohash") == {}
        assert c.stats()["hash_one_sided"] >= 3
        with pytest.raises(conveyor.Rejected, match="WRONGTYPE"):
            c.get("user:1")
        c.set("s", "string")
        with pytest.raises(conveyor.Rejected, match="WRONGTYPE"):
            c.hgetall("s")


def test_errors_and_close(server):
    with pytest.raises(TypeError):
        conveyor.kv.Client.connect(server).get(42)
    c = conveyor.kv.Client.connect(server)
    assert c.command("PING") == b"+PONG\r\n"
    assert c.command("NOSUCHCOMMAND").startswith(b"-ERR")
    c.close()
    c.close()  # idempotent
    with pytest.raises(conveyor.InvalidState):
        c.get("k")
    with pytest.raises(conveyor.InvalidState):
        c.stats()


def test_a_wrong_password_is_refused(tmp_path):
    address = "127.0.0.1:%d" % free_port()
    proc = start_server(tmp_path, address, "--requirepass", "secret")
    try:
        with pytest.raises(conveyor.Rejected):
            conveyor.kv.Client.connect(address, password="wrong")
        with conveyor.kv.Client.connect(address, password="secret") as c:
            c.set("k", "v")
            assert c.get("k") == b"v"
    finally:
        stop(proc)
