"""Tools of the cluster fault tests (kv_faults.py): network namespaces
(`ip`, whether they can be made here, a free test subnet), and what a hostile
peer of the replication endpoint sends (MPA requests, replication hellos)
with the probes of what the node holds meanwhile (descriptors, memory, how
long until it closes a connection)."""
import os
import random
import shutil
import socket
import struct
import subprocess
import time


# ----------------------------------------------------------- namespaces --

def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=check)


def netns_unavailable():
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` (iproute2)"
    try:
        r = ip("netns", "list", check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "`ip netns list`: %s" % e
    if r.returncode != 0:
        return "`ip netns list` failed: %s" % r.stderr.strip()
    return None


def free_subnet():
    """A 10.213.x.0/30 no interface here has an address in."""
    used = ip("-o", "addr").stdout
    for _ in range(100):
        x = random.randrange(100, 250)
        if (" 10.213.%d." % x) not in used:
            return x
    raise RuntimeError("no free 10.213.x.0/30")


# --------------------------------------------------------- garbage peers --

MPA_REQ = b"MPA ID Req Frame"


def mpa_request(private_data, revision=1, length=None):
    """An MPA request (RFC 5044) without markers or CRC, its private data
    length `length` (default: the data's)."""
    n = len(private_data) if length is None else length
    return MPA_REQ + bytes([0, revision]) + struct.pack(">H", n) + private_data


def mpa_p2p_request(private_data):
    """An enhanced MPA request (RFC 6581, revision 2) asking for peer-to-peer
    mode with a zero-length RDMA Write as the ready-to-receive: the responder
    waits for that RTR after its reply."""
    words = struct.pack(">HH", 0x8000 | 16, 0x8000 | 16)  # IRD|peer2peer, ORD|write RTR
    pd = words + private_data
    return MPA_REQ + bytes([0x10, 2]) + struct.pack(">H", len(pd)) + pd


def hello(node_id, shard_id, password=b"", version=1):
    return b"CVKVREPL" + bytes([version]) + node_id.encode() + shard_id.encode() + \
        bytes([len(password)]) + password


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def read_until_closed(s, timeout):
    """Everything the peer sends until it closes: (bytes, seconds), or
    (bytes, None) when it is still open after `timeout`."""
    t0 = time.monotonic()
    got = b""
    while time.monotonic() - t0 < timeout:
        s.settimeout(max(0.01, timeout - (time.monotonic() - t0)))
        try:
            b = s.recv(65536)
        except socket.timeout:
            break
        except ConnectionResetError:
            return got, time.monotonic() - t0
        if not b:
            return got, time.monotonic() - t0
        got += b
    return got, None
