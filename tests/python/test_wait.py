"""CompletionQueue.wait() and wait_async() take the same arguments in the same
order (timeout=None, max_entries=16): no timeout means no bound, and a wait
without one still ends on Ctrl-C."""

import asyncio
import os
import signal
import threading
import time

import pytest

import conveyor


def test_wait_needs_no_timeout(pair):
    src = bytearray(b"w" * 32)
    mr = pair.i.pd.register_memory(src, conveyor.Access.local_write)
    pair.i.qp.post_write(mr, pair.i.peer.slice(0, 32), wr_id=7)
    (wc,) = pair.i.cq.wait(max_entries=1)
    assert wc.wr_id == 7 and wc.ok
    pair.i.qp.post_write(mr, pair.i.peer.slice(0, 32), wr_id=8)
    (wc,) = pair.i.cq.wait(None, 1)
    assert wc.wr_id == 8 and wc.ok


def test_wait_and_wait_async_take_the_same_arguments(provider):
    dev = conveyor.Device.open(provider)
    cq = dev.create_cq(16)

    async def both():
        for call in (lambda: cq.wait_async(0.05, 1), lambda: cq.wait_async(timeout=0.05, max_entries=1)):
            with pytest.raises(conveyor.TimedOut):
                await call()

    for call in (lambda: cq.wait(0.05, 1), lambda: cq.wait(timeout=0.05, max_entries=1)):
        with pytest.raises(conveyor.TimedOut):
            call()
    asyncio.run(both())


def test_a_wait_without_timeout_ends_on_ctrl_c(provider):
    dev = conveyor.Device.open(provider)
    cq = dev.create_cq(16)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            cq.wait()
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 2.0
    assert cq.poll() == []  # the CQ is usable after the interruption
