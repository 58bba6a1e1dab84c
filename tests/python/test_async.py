"""asyncio: an echo server serving many clients' QPs in one event loop
thread (cq.wait_async on each CQ's descriptor), async connect/accept."""

import asyncio
import os
import threading

import pytest

import conveyor
from conveyor import Access

CLIENTS = 16
ROUNDS = 10
MSG = 512


async def serve_one(pd, dev, req, done):
    cq = dev.create_cq(64)
    qp = pd.create_qp(cq)
    rbuf = bytearray(MSG)
    sbuf = bytearray(MSG)
    rmr = pd.register_memory(rbuf, Access.local_write)
    smr = pd.register_memory(sbuf, Access.local_write)
    qp.post_recv(rmr, 1)
    await req.accept_async(qp)
    while True:
        (wc,) = await cq.wait_async(max_entries=1)
        assert wc.ok, wc
        if wc.opcode != conveyor.WcOpcode.recv:
            continue  # an echo's SEND completed (it may come after the next message)
        n = wc.byte_len
        if bytes(rbuf[:n]) == b"bye":
            break
        sbuf[:n] = rbuf[:n]
        qp.post_recv(rmr, 1)  # before the echo: the client's next message may follow at once
        qp.post_send_msg((smr, 0, n), 2)
    done.append(qp)


async def server(dev, lis, n, tasks):
    pd = dev.alloc_pd()
    done = []
    for _ in range(n):
        req = await lis.accept_async(10.0)
        tasks.append(asyncio.ensure_future(serve_one(pd, dev, req, done)))
    return done


async def client(dev, address, k):
    pd = dev.alloc_pd()
    cq = dev.create_cq(16)
    qp = pd.create_qp(cq)
    rbuf = bytearray(MSG)
    sbuf = bytearray(MSG)
    rmr = pd.register_memory(rbuf, Access.local_write)
    smr = pd.register_memory(sbuf, Access.local_write)
    await conveyor.connect_async(qp, address, timeout=10.0)
    for r in range(ROUNDS):
        msg = os.urandom(MSG - (k + r) % 7)
        qp.post_recv(rmr, 10)
        sbuf[: len(msg)] = msg
        qp.post_send_msg((smr, 0, len(msg)), 11)
        got = {}
        while 10 not in got:
            for wc in await cq.wait_async():
                got[wc.wr_id] = wc
        assert got[10].ok and got[10].byte_len == len(msg)
        assert bytes(rbuf[: len(msg)]) == msg, "client %d round %d: echo differs" % (k, r)
    bye = pd.register_memory(bytearray(b"bye"), Access.local_write)
    qp.post_send_msg(bye, 12)
    while True:
        if any(wc.wr_id == 12 for wc in await cq.wait_async()):
            break
    return k


def test_echo_server_many_clients(provider):
    async def main():
        sdev = conveyor.Device.open(provider)
        cdev = conveyor.Device.open(provider)
        lis = conveyor.Listener.bind(sdev)
        tasks = []
        srv = asyncio.ensure_future(server(sdev, lis, CLIENTS, tasks))
        results = await asyncio.gather(*(client(cdev, lis.address, k) for k in range(CLIENTS)))
        await srv
        await asyncio.gather(*tasks)
        return results, threading.active_count()

    results, _ = asyncio.run(asyncio.wait_for(main(), 60))
    assert sorted(results) == list(range(CLIENTS))


def test_wait_async_timeout_and_cancel(provider):
    cq = conveyor.Device.open(provider).create_cq(16)

    async def main():
        with pytest.raises(conveyor.TimedOut):
            await cq.wait_async(timeout=0.05)
        t = asyncio.ensure_future(cq.wait_async())
        await asyncio.sleep(0.02)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        # nothing is left registered on the descriptor: a new wait works
        with pytest.raises(conveyor.TimedOut):
            await cq.wait_async(timeout=0.02)

    asyncio.run(main())
    assert conveyor._async._waiters == {}


def test_two_waiters_on_one_cq(provider):
    from conftest import make_pair

    p = make_pair(provider)
    mr = p.i.pd.register_memory(bytearray(64), Access.local_write)

    async def main():
        a = asyncio.ensure_future(p.i.cq.wait_async(max_entries=1, timeout=5))
        b = asyncio.ensure_future(p.i.cq.wait_async(max_entries=1, timeout=5))
        await asyncio.sleep(0.01)
        p.i.qp.post_read(mr, p.i.peer.slice(0, 64), wr_id=1)
        p.i.qp.post_read(mr, p.i.peer.slice(0, 64), wr_id=2)
        ra, rb = await asyncio.gather(a, b)
        return sorted(w.wr_id for w in ra + rb)

    assert asyncio.run(main()) == [1, 2]
