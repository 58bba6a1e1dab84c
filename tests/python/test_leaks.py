"""No leaks over many create/destroy cycles: the process's RSS stays bounded
and the registered objects get their references back."""

import gc
import sys

import os

import numpy as np
import pytest

import conveyor
from conveyor import Access
from conftest import make_pair


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def cycle_objects(dev, n):
    for _ in range(n):
        pd = dev.alloc_pd()
        cq = dev.create_cq(64)
        buf = bytearray(256 << 10)
        mr = pd.register_memory(buf, Access.local_write | Access.remote_read)
        arr = np.empty(64 << 10, dtype=np.uint8)
        mr2 = pd.register_memory(arr, Access.local_write)
        amr = pd.allocate_memory(256 << 10, Access.local_write)
        view = amr.memory
        view[0] = 1
        del view
        qp = pd.create_qp(cq)
        qp.close()
        with pd.create_qp(cq):
            pass
        mr.close()
        del mr2, amr, mr, buf, arr, pd, cq


# ASan keeps freed memory in quarantine: RSS bounds mean nothing there.
rss_bound = pytest.mark.skipif(os.environ.get("CONVEYOR_SANITIZER") == "address",
                               reason="ASan's quarantine keeps freed memory")


@rss_bound
def test_object_cycles_rss_bounded(provider):
    dev = conveyor.Device.open(provider)
    cycle_objects(dev, 50)  # warm up allocators
    gc.collect()
    before = rss_kib()
    cycle_objects(dev, 1000)
    gc.collect()
    grown = rss_kib() - before
    # 1000 cycles register ~800 MB in all; a leak of one buffer per cycle
    # would add >= 64 MiB.
    assert grown < 16 << 10, "RSS grew by %d KiB over 1000 cycles" % grown


@rss_bound
def test_connection_cycles_rss_bounded(provider):
    def cycles(n):
        for _ in range(n):
            p = make_pair(provider)
            p.i.qp.read_into(p.i.pd.register_memory(bytearray(4096), Access.local_write), p.i.peer.slice(0, 4096))
            p.i.qp.close()
            p.t.qp.close()
            del p

    cycles(5)
    gc.collect()
    before = rss_kib()
    cycles(40)
    gc.collect()
    grown = rss_kib() - before
    assert grown < 24 << 10, "RSS grew by %d KiB over 40 connections" % grown


def test_references_returned():
    dev = conveyor.Device.open("soft")
    pd = dev.alloc_pd()
    b = bytearray(1024)
    a = np.zeros(128)
    base_b, base_a, base_pd = sys.getrefcount(b), sys.getrefcount(a), sys.getrefcount(pd)
    for _ in range(1000):
        with pd.register_memory(b, Access.local_write):
            pass
        m = pd.register_memory(a, Access.local_write)
        del m
        with conveyor.Device.open("soft").alloc_pd().register_memory(memoryview(b)[:16], Access.remote_read):
            pass
    gc.collect()
    assert (sys.getrefcount(b), sys.getrefcount(a), sys.getrefcount(pd)) == (base_b, base_a, base_pd)
