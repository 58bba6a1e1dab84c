"""close() and context managers: Device, ProtectionDomain, CompletionQueue,
Listener (QueuePair, MemoryRegion and SharedReceiveQueue had them). close()
releases the handle at once, a second close() does nothing, and any other use
of a closed object raises InvalidState naming it, never crashes. A device's
engine thread ends when the device and what was made from it are closed,
without waiting for the garbage collector."""

import gc
import os
import threading
import time

import pytest

import conveyor
from conftest import make_pair


def engine_threads(provider):
    """This process's engine threads of the provider (named by the library)."""
    name = "cv-%s-engine" % provider
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % tid) as f:
                n += f.read().strip() == name
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return n


def test_device_close_ends_its_engine_thread_without_the_garbage_collector(provider):
    gc.disable()  # nothing may depend on a collection
    try:
        before = engine_threads(provider)
        dev = conveyor.Device.open(provider)
        assert engine_threads(provider) == before + 1
        pd = dev.alloc_pd()
        cq = dev.create_cq(16)
        qp = pd.create_qp(cq)
        mr = pd.allocate_memory(64, conveyor.Access.local_write)
        # Children keep the device alive: closing it alone leaves the thread.
        dev.close()
        assert dev.closed
        assert engine_threads(provider) == before + 1
        for obj in (qp, mr, cq, pd):
            obj.close()
        assert engine_threads(provider) == before
        # The Python objects are still there (not collected); only closed.
        assert dev.closed and pd.closed and cq.closed and qp.closed and not mr.registered
    finally:
        gc.enable()


def test_with_blocks_close_everything_in_order(provider):
    before = engine_threads(provider)
    with conveyor.Device.open(provider) as dev:
        with dev.alloc_pd() as pd, dev.create_cq(16) as cq:
            with pd.create_qp(cq) as qp, pd.allocate_memory(64, conveyor.Access.local_write) as mr:
                assert qp.state == conveyor.QpState.init and len(mr) == 64
            assert qp.closed and not mr.registered
        assert pd.closed and cq.closed
        assert not dev.closed
    assert dev.closed
    assert engine_threads(provider) == before


def test_close_is_idempotent(provider):
    dev = conveyor.Device.open(provider)
    pd = dev.alloc_pd()
    cq = dev.create_cq(16)
    lis = conveyor.Listener.bind(dev)
    for obj in (lis, cq, pd, dev):
        obj.close()
        obj.close()
        assert obj.closed
        with obj:  # entering a closed object is allowed; leaving closes nothing more
            pass
        assert "closed" in repr(obj)


def test_using_a_closed_object_raises_invalid_state_naming_it(provider):
    dev = conveyor.Device.open(provider)
    pd = dev.alloc_pd()
    cq = dev.create_cq(16)
    lis = conveyor.Listener.bind(dev)
    lis.close()
    cq.close()
    pd.close()
    dev.close()
    uses = [
        ("Device", lambda: dev.alloc_pd()),
        ("Device", lambda: dev.create_cq(4)),
        ("Device", lambda: dev.name),
        ("Device", lambda: dev.attr),
        ("Device", lambda: conveyor.Listener.bind(dev)),
        ("ProtectionDomain", lambda: pd.allocate_memory(64, conveyor.Access.local_write)),
        ("ProtectionDomain", lambda: pd.register_memory(bytearray(64), conveyor.Access.local_write)),
        ("ProtectionDomain", lambda: pd.create_srq()),
        ("CompletionQueue", lambda: cq.poll()),
        ("CompletionQueue", lambda: cq.wait(0.01)),
        ("CompletionQueue", lambda: cq.arm()),
        ("CompletionQueue", lambda: cq.fd()),
        ("CompletionQueue", lambda: cq.depth),
        ("Listener", lambda: lis.accept(0.01)),
        ("Listener", lambda: lis.address),
    ]
    for what, use in uses:
        with pytest.raises(conveyor.InvalidState) as e:
            use()
        assert what in str(e.value) and "closed" in str(e.value), str(e.value)


def test_a_qp_cannot_be_made_from_a_closed_cq_or_pd(provider):
    dev = conveyor.Device.open(provider)
    pd = dev.alloc_pd()
    cq = dev.create_cq(16)
    cq.close()
    with pytest.raises(conveyor.InvalidState, match="CompletionQueue"):
        pd.create_qp(cq)
    pd.close()
    with pytest.raises(conveyor.InvalidState, match="ProtectionDomain"):
        pd.create_qp(dev.create_cq(16))


def test_an_open_qp_keeps_working_after_its_device_pd_and_cqs_are_closed(provider):
    p = make_pair(provider)
    data = bytearray(b"x" * 64)
    mr = p.i.pd.register_memory(data, conveyor.Access.local_write)
    for obj in (p.i.dev, p.i.pd, p.t.dev, p.t.pd, p.t.cq):
        obj.close()
    # The QP and region keep the device alive; a helper that would register a
    # buffer of its own needs the PD, and says it was closed.
    p.i.qp.write_from(mr, p.i.peer.slice(0, 64))
    assert bytes(p.t.buf[:64]) == bytes(data)
    with pytest.raises(conveyor.InvalidState, match="ProtectionDomain"):
        p.i.qp.write_from(bytearray(64), p.i.peer.slice(0, 64))
    mr.close()
    p.i.qp.close()
    p.t.qp.close()


def test_a_cq_or_listener_in_use_by_another_thread_refuses_to_close(provider):
    dev = conveyor.Device.open(provider)
    cq = dev.create_cq(16)
    lis = conveyor.Listener.bind(dev)
    started = threading.Event()

    def block():
        started.set()
        with pytest.raises(conveyor.TimedOut):
            cq.wait(1.0)

    def accept():
        with pytest.raises(conveyor.TimedOut):
            lis.accept(1.0)

    threads = [threading.Thread(target=block), threading.Thread(target=accept)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.2)
    with pytest.raises(conveyor.InvalidState, match="another thread"):
        cq.close()
    with pytest.raises(conveyor.InvalidState, match="another thread"):
        lis.close()
    for t in threads:
        t.join()
    cq.close()
    lis.close()
    assert cq.closed and lis.closed
