"""Every opcode, batch posting, the blocking helpers and completion statuses,
over soft and shm (both ends in this process, each on its own device)."""

import os
import struct
import threading
import time

import pytest

import conveyor
from conveyor import Access, SendWr, WrOpcode, WcOpcode, WcStatus
from conftest import make_pair, wait_for


def test_connection_attr_and_private_data(pair):
    a = pair.i.qp.connection()
    assert pair.i.qp.state == conveyor.QpState.rts
    assert a.ird > 0 and a.ord > 0
    assert pair.i.info.attr.ord == a.ord
    assert pair.t.info.private_data == b"initiator"  # accept() reports the peer's
    assert pair.i.peer == pair.t.mr.remote()


def test_read_write_byte_for_byte(pair):
    i, t = pair.i, pair.t
    t.buf[:] = os.urandom(len(t.buf))
    local = bytearray(len(t.buf))
    mr = i.pd.register_memory(local, Access.local_write)
    i.qp.post_read(mr, i.peer, wr_id=11)
    (wc,) = wait_for(i.cq, 1)
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len) == (11, WcStatus.success, WcOpcode.rdma_read, len(local))
    assert wc.ok and wc.qp_num == i.qp.qp_num
    assert local == t.buf
    pattern = os.urandom(1000)
    local[:1000] = pattern
    i.qp.post_write((mr, 0, 1000), i.peer.slice(5000, 1000), wr_id=12)
    (wc,) = wait_for(i.cq, 1)
    assert wc.status == WcStatus.success and wc.opcode == WcOpcode.rdma_write
    assert t.buf[5000:6000] == pattern


def test_send_recv_and_batch_recv(pair):
    i, t = pair.i, pair.t
    rbuf = bytearray(4096)
    rmr = t.pd.register_memory(rbuf, Access.local_write)
    t.qp.post_recv([conveyor.RecvWr((rmr, k * 1024, 1024), wr_id=100 + k) for k in range(4)])
    sbuf = bytearray(b"".join(bytes([k]) * 1024 for k in range(4)))
    smr = i.pd.register_memory(sbuf, Access.local_write)
    for k in range(4):
        i.qp.post_send_msg((smr, k * 1024, 700), wr_id=k)
    sends = wait_for(i.cq, 4)
    assert [w.opcode for w in sends] == [WcOpcode.send] * 4
    recvs = wait_for(t.cq, 4)
    assert [w.wr_id for w in recvs] == [100, 101, 102, 103]
    assert all(w.opcode == WcOpcode.recv and w.byte_len == 700 for w in recvs)
    for k in range(4):
        assert rbuf[k * 1024:k * 1024 + 700] == bytes([k]) * 700


def test_send_with_imm_and_write_with_imm(pair):
    i, t = pair.i, pair.t
    a = pair.i.qp.connection()
    if not a.extensions and a.iwarp is not None:
        pytest.skip("immediate data not negotiated (RFC 7306 is an MPA offer the peer may decline)")
    rbuf = bytearray(256)
    rmr = t.pd.register_memory(rbuf, Access.local_write)
    t.qp.post_recv(rmr, 1)
    t.qp.post_recv(rmr, 2)
    sbuf = bytearray(b"imm!" * 16)
    smr = i.pd.register_memory(sbuf, Access.local_write)
    i.qp.post_send([
        SendWr(WrOpcode.send_with_imm, local=smr, wr_id=1, imm_data=0xDEADBEEF),
        SendWr(WrOpcode.rdma_write_with_imm, local=smr, remote=i.peer.slice(100, 64), wr_id=2, imm_data=7),
    ])
    assert [w.wr_id for w in wait_for(i.cq, 2)] == [1, 2]
    r1, r2 = wait_for(t.cq, 2)
    assert r1.opcode == WcOpcode.recv and r1.with_imm and r1.imm_data == 0xDEADBEEF
    assert rbuf[:64] == sbuf
    assert r2.opcode == WcOpcode.recv_rdma_with_imm and r2.with_imm and r2.imm_data == 7
    assert t.buf[100:164] == sbuf


def test_send_with_invalidate(pair):
    i, t = pair.i, pair.t
    if not t.dev.attr.send_with_invalidate:
        pytest.skip("no send_with_invalidate")
    victim = t.pd.register_memory(bytearray(64), conveyor.ALL_ACCESS | Access.remote_invalidate)
    rmr = t.pd.register_memory(bytearray(64), Access.local_write)
    t.qp.post_recv(rmr, 9)
    smr = i.pd.register_memory(bytearray(b"x" * 8), Access.local_write)
    i.qp.post_send(SendWr(WrOpcode.send_with_inv, local=smr, wr_id=3, invalidate_rkey=victim.rkey))
    assert wait_for(i.cq, 1)[0].ok
    (r,) = wait_for(t.cq, 1)
    assert r.with_inv and r.invalidated_rkey == victim.rkey


def test_atomics(pair):
    i, t = pair.i, pair.t
    if not t.dev.attr.atomics:
        pytest.skip("no atomics")
    struct.pack_into("<Q", t.buf, 64, 40)
    res = bytearray(16)
    rmr = i.pd.register_memory(res, Access.local_write)
    slot = i.peer.slice(64, 8)
    i.qp.post_fetch_add((rmr, 0, 8), slot, 2, wr_id=1)
    (wc,) = wait_for(i.cq, 1)
    assert wc.opcode == WcOpcode.fetch_add and wc.ok
    assert struct.unpack_from("<Q", res, 0)[0] == 40
    assert struct.unpack_from("<Q", t.buf, 64)[0] == 42
    i.qp.post_cmp_swap((rmr, 8, 8), slot, 42, 1000, wr_id=2)
    (wc,) = wait_for(i.cq, 1)
    assert wc.opcode == WcOpcode.comp_swap and wc.ok
    assert struct.unpack_from("<Q", res, 8)[0] == 42
    assert struct.unpack_from("<Q", t.buf, 64)[0] == 1000
    # the generic form of both
    i.qp.post_send([SendWr(WrOpcode.atomic_fetch_and_add, local=(rmr, 0, 8), remote=slot, compare_add=5, wr_id=3),
                    SendWr(WrOpcode.atomic_cmp_and_swp, local=(rmr, 8, 8), remote=slot, compare_add=1005,
                           swap=7, wr_id=4)])
    assert [w.wr_id for w in wait_for(i.cq, 2)] == [3, 4]
    assert struct.unpack_from("<Q", t.buf, 64)[0] == 7


def test_batch_of_16_in_one_call(pair):
    i, t = pair.i, pair.t
    t.buf[:4096] = os.urandom(4096)
    local = bytearray(4096)
    mr = i.pd.register_memory(local, Access.local_write)
    wrs = [SendWr(WrOpcode.rdma_read, local=(mr, k * 256, 256), remote=i.peer.slice(k * 256, 256), wr_id=k)
           for k in range(16)]
    i.qp.post_send(wrs)
    got = wait_for(i.cq, 16)
    assert sorted(w.wr_id for w in got) == list(range(16))
    assert local == t.buf[:4096]
    # unsignaled requests produce no completion; the signaled last one does
    wrs = [SendWr(WrOpcode.rdma_write, local=(mr, 0, 64), remote=i.peer.slice(8192 + 64 * k, 64), wr_id=k,
                  flags=conveyor.SendFlags.none) for k in range(15)]
    wrs.append(SendWr(WrOpcode.rdma_write, local=(mr, 0, 64), remote=i.peer.slice(9999, 64), wr_id=99))
    i.qp.post_send(wrs)
    assert [w.wr_id for w in wait_for(i.cq, 1)] == [99]
    assert i.cq.poll() == []


def test_inline_and_multi_sge(pair):
    i, t = pair.i, pair.t
    a = i.pd.register_memory(bytearray(b"A" * 10), Access.local_write)
    b = i.pd.register_memory(bytearray(b"B" * 20), Access.local_write)
    i.qp.post_send(SendWr(WrOpcode.rdma_write, local=[a, b], remote=i.peer.slice(300, 30), wr_id=5,
                          flags=conveyor.SendFlags.signaled | conveyor.SendFlags.inline_data))
    assert wait_for(i.cq, 1)[0].ok
    assert t.buf[300:330] == b"A" * 10 + b"B" * 20


def test_read_into_and_write_from(pair):
    i, t = pair.i, pair.t
    t.buf[:100] = bytes(range(100))
    out = bytearray(100)
    wc = i.qp.read_into(out, i.peer.slice(0, 100))  # a plain buffer, registered for the call
    assert wc.byte_len == 100 and out == bytes(range(100))
    i.qp.write_from(b"immutable source", i.peer.slice(200, 16))  # read-only source is fine
    assert t.buf[200:216] == b"immutable source"
    mr = i.pd.register_memory(bytearray(b"z" * 32), Access.local_write)
    i.qp.write_from(mr, i.peer.slice(400, 32))
    assert t.buf[400:432] == b"z" * 32


def test_helper_keeps_other_completions(pair):
    i = pair.i
    mr = i.pd.register_memory(bytearray(64), Access.local_write)
    i.qp.post_read(mr, i.peer.slice(0, 64), wr_id=777)
    i.qp.read_into(mr, i.peer.slice(0, 64))
    got = i.cq.poll() or i.cq.wait(5.0)
    assert [w.wr_id for w in got] == [777], "a completion the helper met must stay for poll()"


def test_bad_rkey_is_rem_access_err(pair):
    i = pair.i
    mr = i.pd.register_memory(bytearray(64), Access.local_write)
    bogus = conveyor.RemoteRegion(i.peer.addr, 64, i.peer.rkey ^ 0x5A5A)
    i.qp.post_read(mr, bogus, wr_id=1)
    (wc,) = wait_for(i.cq, 1)
    assert wc.status == WcStatus.rem_access_err and not wc.ok
    # the QP is now in ERROR: posts are refused
    with pytest.raises(conveyor.QpInError) as e:
        i.qp.post_read(mr, i.peer, wr_id=2)
    assert e.value.code == conveyor.ErrorCode.qp_in_error


def test_read_into_failure_is_completion_error(pair):
    i = pair.i
    out = bytearray(64)
    with pytest.raises(conveyor.CompletionError) as e:
        i.qp.read_into(out, conveyor.RemoteRegion(i.peer.addr, 64, i.peer.rkey ^ 1))
    assert e.value.status == WcStatus.rem_access_err
    assert e.value.completion.status == WcStatus.rem_access_err


def test_modify_to_error_flushes_receives(pair):
    t = pair.t
    rmr = t.pd.register_memory(bytearray(64), Access.local_write)
    t.qp.post_recv(rmr, 5)
    t.qp.modify(conveyor.QpState.error)
    assert t.qp.state == conveyor.QpState.error
    (wc,) = wait_for(t.cq, 1)
    assert wc.wr_id == 5 and wc.status == WcStatus.wr_flush_err


def drive(p, n, timeout=5.0):
    """n initiator completions, while this thread runs the manual-progress target's engine."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        p.t.cq.poll()  # manual progress: polling the target's CQ serves the READs
        got += p.i.cq.poll()
    assert len(got) == n, "%d of %d completions" % (len(got), n)
    return got


def test_full_send_queue_is_again(provider):
    # The target runs in manual progress and nobody drives it yet: the READs
    # stay outstanding, so the queue is certainly full at max_send_wr.
    p = make_pair(provider, max_send_wr=4, target_progress=conveyor.ProgressMode.manual)
    i = p.i
    mr = i.pd.register_memory(bytearray(64), Access.local_write)
    n = 0
    with pytest.raises(conveyor.Again):
        for k in range(p.i.qp.caps.max_send_wr + 1):
            i.qp.post_read(mr, i.peer.slice(0, 64), wr_id=k)
            n += 1
    assert n == p.i.qp.caps.max_send_wr
    assert len(drive(p, n)) == n
    i.qp.post_read(mr, i.peer.slice(0, 64), wr_id=99)  # room again
    assert drive(p, 1)[0].wr_id == 99


def test_batch_failure_names_the_first_unposted(provider):
    p = make_pair(provider, max_send_wr=4, target_progress=conveyor.ProgressMode.manual)
    i = p.i
    mr = i.pd.register_memory(bytearray(64), Access.local_write)
    wrs = [SendWr(WrOpcode.rdma_read, local=mr, remote=i.peer.slice(0, 64), wr_id=k) for k in range(6)]
    with pytest.raises(conveyor.Again) as e:
        i.qp.post_send(wrs)
    assert "request 4" in e.value.context
    assert [w.wr_id for w in drive(p, 4)] == [0, 1, 2, 3]


def test_post_before_connect_is_invalid_state(provider):
    dev = conveyor.Device.open(provider)
    pd, cq = dev.alloc_pd(), dev.create_cq(16)
    qp = pd.create_qp(cq)
    mr = pd.register_memory(bytearray(64), Access.local_write)
    with pytest.raises(conveyor.InvalidState):
        qp.post_read(mr, mr.remote(), wr_id=1)


def test_cq_overflow(provider):
    # Manual-progress target: the three READs are all posted before any is
    # served; then this thread serves them and nobody polls the depth-1 CQ.
    p = make_pair(provider, target_progress=conveyor.ProgressMode.manual)
    small = p.i.dev.create_cq(1)
    qp = p.i.pd.create_qp(small)
    tq = p.t.pd.create_qp(p.t.cq)
    th = threading.Thread(target=lambda: p.t.lis.accept(5.0).accept(tq, p.t.mr.remote().encode()))
    th.start()
    conveyor.connect(qp, p.t.lis.address)
    th.join()
    mr = p.i.pd.register_memory(bytearray(64), Access.local_write)
    for k in range(3):
        qp.post_read(mr, p.i.peer.slice(0, 64), wr_id=k)
    # The second completion finds the CQ full; the QP that lost it goes to ERROR.
    deadline = time.monotonic() + 10
    while qp.state != conveyor.QpState.error and time.monotonic() < deadline:
        p.t.cq.poll()
    with pytest.raises(conveyor.CqOverflow) as e:
        small.poll()
    assert e.value.code == conveyor.ErrorCode.cq_overflow


def test_cq_fd_and_arm(pair):
    import select
    i = pair.i
    fd = i.cq.fd()
    assert isinstance(fd, int) and fd >= 0
    assert i.cq.poll() == []
    i.cq.arm()
    assert select.select([fd], [], [], 0)[0] == []
    mr = i.pd.register_memory(bytearray(8), Access.local_write)
    i.qp.post_read(mr, i.peer.slice(0, 8), wr_id=4)
    r, _, _ = select.select([fd], [], [], 5.0)
    assert r == [fd]
    assert [w.wr_id for w in wait_for(i.cq, 1)] == [4]
