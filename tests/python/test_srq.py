"""Shared receive queues: two QPs of one PD draw their receives from one SRQ
(SharedReceiveQueue, ProtectionDomain.create_srq, create_qp(srq=...)); a QP
with an SRQ refuses its own post_recv; the limit is armed and reported."""

import threading

import pytest

import conveyor
from conveyor import Access, WcOpcode
from conftest import wait_for


def test_two_qps_share_one_srq(provider):
    tdev = conveyor.Device.open(provider)
    attr = tdev.attr
    assert attr.max_srq > 0 and attr.max_srq_wr >= 16 and attr.max_srq_sge >= 1
    assert attr.post_recv_checks_lkeys
    tpd = tdev.alloc_pd()
    tcq = tdev.create_cq(256)
    srq = tpd.create_srq(max_wr=16, max_sge=1, srq_limit=0)
    assert srq.srq_num > 0 and srq.pd is tpd and not srq.closed
    q = srq.query()
    assert isinstance(q, conveyor.SrqAttr)
    assert (q.max_wr, q.max_sge, q.srq_limit) == (16, 1, 0)
    rbuf = bytearray(4 * 64)
    rmr = tpd.register_memory(rbuf, Access.local_write)
    srq.post_recv([conveyor.RecvWr((rmr, 0, 64), wr_id=1), conveyor.RecvWr((rmr, 64, 64), wr_id=2)])
    srq.post_recv((rmr, 128, 64), wr_id=3)
    srq.arm_limit(1)
    assert srq.query().srq_limit == 1

    idev = conveyor.Device.open(provider)
    ipd = idev.alloc_pd()
    icq = idev.create_cq(256)
    lis = conveyor.Listener.bind(tdev)
    tqps, iqps = [], []
    for _ in range(2):
        tq = tpd.create_qp(tcq, srq=srq)
        assert tq.srq is srq and tq.caps.max_recv_wr == 0
        with pytest.raises(conveyor.InvalidArgument):
            tq.post_recv((rmr, 0, 64), 9)
        iq = ipd.create_qp(icq)
        err = []

        def serve(tq=tq):
            try:
                lis.accept(5.0).accept(tq)
            except BaseException as e:  # handed to the main thread
                err.append(e)

        th = threading.Thread(target=serve)
        th.start()
        conveyor.connect(iq, lis.address)
        th.join()
        assert not err, err
        tqps.append(tq)
        iqps.append(iq)

    sbuf = bytearray(b"A" * 32 + b"B" * 32)
    smr = ipd.register_memory(sbuf, Access.local_write)
    iqps[0].post_send_msg((smr, 0, 32), wr_id=10)
    assert [w.wr_id for w in wait_for(icq, 1)] == [10]
    iqps[1].post_send_msg((smr, 32, 32), wr_id=11)
    assert [w.wr_id for w in wait_for(icq, 1)] == [11]
    recvs = wait_for(tcq, 2)
    assert [w.wr_id for w in recvs] == [1, 2]
    assert [w.qp_num for w in recvs] == [tqps[0].qp_num, tqps[1].qp_num]
    assert all(w.opcode == WcOpcode.recv and w.byte_len == 32 for w in recvs)
    assert rbuf[:32] == b"A" * 32 and rbuf[64:96] == b"B" * 32
    assert srq.query().srq_limit == 1  # one receive left: not below the limit, still armed
    for qp in iqps + tqps:
        qp.close()
    with srq:
        pass
    assert srq.closed


def test_srq_of_another_pd_is_refused(provider):
    dev = conveyor.Device.open(provider)
    pd, other = dev.alloc_pd(), dev.alloc_pd()
    cq = dev.create_cq(16)
    srq = pd.create_srq(max_wr=4, max_sge=1)
    with pytest.raises(conveyor.InvalidArgument):
        other.create_qp(cq, srq=srq)
    mr = pd.register_memory(bytearray(64), Access.local_write)
    for k in range(4):
        srq.post_recv(mr, wr_id=k)
    with pytest.raises(conveyor.Again):
        srq.post_recv(mr, wr_id=5)
    srq.close()
    with pytest.raises(conveyor.InvalidState):
        srq.query()
