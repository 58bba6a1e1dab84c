"""Processes and places for bench/compare: a client run with a timeout, servers started and always
stopped, loopback or two network namespaces joined by a veth pair.
"""
import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time

from compare_lib.common import IP_CLI, IP_SRV, NA, NS_CLI, NS_SRV, VETH_CLI, VETH_SRV


def run_client(cmd, env=None, timeout=30):
    """Runs a client to completion; returns (stdout, stderr, rusage of the process)."""
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True)
    t0 = time.monotonic()
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - t0 > timeout:
            os.killpg(p.pid, signal.SIGKILL)
            os.wait4(p.pid, 0)
            p.returncode = -9
            raise NA(f"timed out after {timeout} s")
        time.sleep(0.005)
    p.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    o, e = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if p.returncode != 0:
        last = [l for l in e.strip().splitlines() if l.strip()] or [f"exit status {p.returncode}"]
        raise NA(last[-1][:160])
    return o, e, ru


class Server:
    """A server process, restarted when it has exited (some serve one test only)."""

    def __init__(self, cmd, env=None, settle=0.15):
        self.cmd, self.env, self.settle, self.p = cmd, env, settle, None
        self.log = tempfile.TemporaryFile()

    def ensure(self):
        if self.p is None or self.p.poll() is not None:
            self.p = subprocess.Popen(self.cmd, stdout=self.log, stderr=self.log, env=self.env,
                                      start_new_session=True)
            time.sleep(self.settle)
            if self.p.poll() is not None:
                self.log.seek(0)
                tail = self.log.read().decode(errors="replace").strip().splitlines()
                raise NA("server failed: " + (tail[-1][:140] if tail else f"exit {self.p.returncode}"))
        return self

    def wait_exit(self, timeout):
        """For one-shot servers: waits for exit, returns its rusage (or None)."""
        if self.p is None:
            return None
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            pid, status, ru = os.wait4(self.p.pid, os.WNOHANG)
            if pid:
                self.p.returncode = os.waitstatus_to_exitcode(status)
                self.p = None
                return ru
            time.sleep(0.005)
        self.stop()
        return None

    def stop(self):
        if self.p is not None and self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
                self.p.wait(timeout=3)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.p.wait()
        self.p = None


SERVERS = []


def stop_servers():
    for s in SERVERS:
        s.stop()


# -------------------------------------------------------------- environments ----
class Env:
    """Where client and server run: loopback, or two namespaces joined by a veth pair."""

    def __init__(self, name):
        self.name = name
        self.netns = name == "veth"
        self.srv_ip = IP_SRV if self.netns else "127.0.0.1"
        self.cli_ip = IP_CLI if self.netns else "127.0.0.1"
        self.dev_srv = VETH_SRV if self.netns else "lo"
        self.dev_cli = VETH_CLI if self.netns else "lo"

    def srv(self, cmd):
        return ["ip", "netns", "exec", NS_SRV] + cmd if self.netns else cmd

    def cli(self, cmd):
        return ["ip", "netns", "exec", NS_CLI] + cmd if self.netns else cmd


def netns_down():
    for ns in (NS_SRV, NS_CLI):
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def netns_up():
    """Creates the namespaces and the veth pair; returns None or the reason it could not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if not shutil.which("ip"):
        return "no ip(8) (apt install iproute2)"
    netns_down()
    steps = [
        ["ip", "netns", "add", NS_SRV], ["ip", "netns", "add", NS_CLI],
        ["ip", "link", "add", VETH_SRV, "type", "veth", "peer", "name", VETH_CLI],
        ["ip", "link", "set", VETH_SRV, "netns", NS_SRV], ["ip", "link", "set", VETH_CLI, "netns", NS_CLI],
        ["ip", "-n", NS_SRV, "addr", "add", IP_SRV + "/24", "dev", VETH_SRV],
        ["ip", "-n", NS_CLI, "addr", "add", IP_CLI + "/24", "dev", VETH_CLI],
        ["ip", "-n", NS_SRV, "link", "set", VETH_SRV, "mtu", "1500", "up"],
        ["ip", "-n", NS_CLI, "link", "set", VETH_CLI, "mtu", "1500", "up"],
        ["ip", "-n", NS_SRV, "link", "set", "lo", "up"], ["ip", "-n", NS_CLI, "link", "set", "lo", "up"],
    ]
    for s in steps:
        r = subprocess.run(s, capture_output=True, text=True)
        if r.returncode != 0:
            netns_down()
            return f"`{' '.join(s)}` failed: {r.stderr.strip()[:100]}"
    atexit.register(netns_down)
    return None
