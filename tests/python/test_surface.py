"""The read-only surface: every attribute of the attribute and counter
objects, read on live objects, with the values they must have; and a guard
that every public name of the package is used by some test here."""

import glob
import inspect
import os
import re
import time

import conveyor
from conveyor import Access
from conftest import has_wire, make_pair, runs_mpa, wait_for


def test_device_attr_and_ports(provider):
    dev = conveyor.Device.open(provider)
    a = dev.attr
    assert isinstance(a, conveyor.DeviceAttr) and a.name == provider and a.provider == provider
    for f in ("max_cqe", "max_inline_data", "max_mr", "max_msg_size", "max_qp_rd_atom", "max_sge_rd"):
        assert isinstance(getattr(a, f), int) and getattr(a, f) > 0, f
    assert isinstance(a.immediate_data, bool) and isinstance(a.send_with_invalidate, bool)
    # soft and shm atomics are one locked instruction on the word: atomic against the CPU too
    assert a.atomics and a.atomic_cap == "global", a.atomic_cap
    for port in a.ports:
        assert isinstance(port, conveyor.PortAttr)
        assert port.num >= 1 and isinstance(port.state, str) and isinstance(port.link_layer, str)
        assert isinstance(port.mtu, int) and all(isinstance(x, str) for x in port.addresses)
    infos = {d.name: d for d in conveyor.devices()}
    assert infos[provider].reason == "" and isinstance(infos[provider].transport, conveyor.Transport)


def test_connection_attr_caps_counters_and_request(provider):
    p = make_pair(provider)
    assert isinstance(p.t.lis, conveyor.Listener)
    if has_wire(p.t.dev.attr):  # "ip:port": the listener holds a port
        assert p.t.lis.port > 0 and p.t.lis.address.endswith(":%d" % p.t.lis.port)
    assert isinstance(p.i.info, conveyor.ConnectionInfo) and isinstance(p.i.qp, conveyor.QueuePair)
    assert isinstance(p.i.pd, conveyor.ProtectionDomain) and isinstance(p.i.cq, conveyor.CompletionQueue)
    a = p.i.qp.connection()
    assert isinstance(a, conveyor.ConnectionAttr)
    assert isinstance(a.local_address, str) and isinstance(a.peer_address, str)
    assert isinstance(a.ird, int) and isinstance(a.ord, int) and isinstance(a.extensions, bool)
    da = p.i.dev.attr
    assert [x is not None for x in (a.iwarp, a.shm, a.verbs)].count(True) == 1, "one transport part"
    assert (a.iwarp is not None) == runs_mpa(da) and (a.shm is not None) == (not has_wire(da))
    if a.iwarp is not None:
        w = a.iwarp
        assert isinstance(w, conveyor.IwarpConnectionAttr)
        assert isinstance(w.crc, bool) and isinstance(w.rtr, str) and w.rtr in ("write", "read", "none")
        assert isinstance(w.large_fpdus, bool)
        # Two soft devices with the default software.large_fpdus send FPDUs of
        # up to 64 KiB; without it an FPDU fits in one TCP segment.
        assert w.mss > 0 and 0 < w.max_fpdu <= (65536 if w.large_fpdus else w.mss)
        assert w.mpa_revision in (1, 2)
    if has_wire(da):  # a TCP/IP peer's address is the other side's local one
        assert a.peer_address == p.t.qp.connection().local_address
    if a.shm is not None:
        s = a.shm
        assert isinstance(s, conveyor.ShmConnectionAttr)
        assert isinstance(s.direct_mapping, bool) and s.data_path in ("cma", "staged") and s.slot_payload > 0
    caps = p.i.qp.caps
    assert isinstance(caps, conveyor.QpCaps)
    assert caps.max_send_sge >= 1 and caps.max_recv_sge >= 1 and caps.max_inline_data >= 0

    mr = p.i.pd.register_memory(bytearray(4096), Access.local_write)
    p.i.qp.read_into(mr, p.i.peer.slice(0, 4096))
    ci, ct = p.i.qp.counters(), p.t.qp.counters()
    assert isinstance(ci, conveyor.QpCounters)
    for c in (ci, ct):
        for f in ("tx_bytes", "rx_bytes", "reads_served", "writes_placed", "atomics_served"):
            assert isinstance(getattr(c, f), int) and getattr(c, f) >= 0, f
        # The counters' part is the connection's: MPA's (iwarp) or shm's.
        assert (c.iwarp is not None) == (a.iwarp is not None) and (c.shm is not None) == (a.shm is not None)
        part = c.iwarp if c.iwarp is not None else c.shm
        assert isinstance(part, conveyor.IwarpQpCounters if c.iwarp is not None else conveyor.ShmQpCounters)
        fields = (("tx_fpdus", "rx_fpdus", "tx_stream_bytes", "rx_stream_bytes", "tx_syscalls", "rx_syscalls",
                   "terminates_sent", "terminates_received", "rx_direct_bytes") if c.iwarp is not None
                  else ("tx_slots", "rx_slots", "doorbells", "direct_ops", "hints"))
        for f in fields:
            assert isinstance(getattr(part, f), int) and getattr(part, f) >= 0, f
    # A 4096-byte READ: its payload, counted the same on every provider.
    assert ct.reads_served >= 1 and ci.rx_bytes >= 4096 and ct.tx_bytes >= 4096
    if ci.iwarp is not None:
        assert ci.iwarp.tx_fpdus >= 1 and ci.iwarp.rx_fpdus >= 1
        assert ci.iwarp.tx_syscalls >= 1 and ct.iwarp.rx_syscalls >= 1
        assert ci.iwarp.rx_stream_bytes > ci.rx_bytes, "the stream carries framing besides the payload"
        assert ci.iwarp.terminates_sent == 0 and ct.iwarp.terminates_received == 0
    if ci.shm is not None:
        assert ci.shm.tx_slots >= 1 and ct.shm.rx_slots >= 1, "the READ request took a ring slot"
        assert ci.shm.direct_ops == 0 and ci.shm.doorbells >= 0  # a registered (not allocated) region
    # verbs (not run here) reports its MTUs in its own part.
    assert {"path_mtu", "port_mtu"} <= set(dir(conveyor.VerbsConnectionAttr))


def test_request_peer_address_and_disconnect(provider):
    dev = conveyor.Device.open(provider)
    pd, cq = dev.alloc_pd(), dev.create_cq(16)
    import threading
    lis = conveyor.Listener.bind(dev)
    tq = pd.create_qp(cq)
    seen = {}

    def serve():
        req = lis.accept(5.0)
        assert isinstance(req, conveyor.ConnectRequest)
        seen["peer"] = req.peer_address
        req.accept(tq)

    th = threading.Thread(target=serve)
    th.start()
    qp = pd.create_qp(cq)
    conveyor.connect(qp, lis.address)
    th.join()
    if has_wire(dev.attr):  # "ip:port" both ways (shm names a peer by "pid P")
        assert seen["peer"] == qp.connection().local_address
    else:
        assert isinstance(seen["peer"], str)
    rmr = pd.register_memory(bytearray(16), Access.local_write)
    tq.post_recv(rmr, 5)
    qp.disconnect()  # the peer sees the end: its receive flushes
    (wc,) = wait_for(cq, 1)
    assert wc.wr_id == 5 and wc.status == conveyor.WcStatus.wr_flush_err
    deadline = time.monotonic() + 5
    while tq.state != conveyor.QpState.error and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tq.state == conveyor.QpState.error


def test_work_request_objects():
    s = conveyor.Sge(10, 20, 30)
    w = conveyor.SendWr(conveyor.WrOpcode.rdma_write, local=[s, s], remote=conveyor.RemoteRegion(1000, 8, 7),
                        wr_id=3, imm_data=9)
    assert len(w.sg_list) == 2 and w.sg_list[0].length == 20
    assert (w.remote_addr, w.rkey, w.imm_data, w.opcode) == (1000, 7, 9, conveyor.WrOpcode.rdma_write)
    w.wr_id = 44
    w.flags = conveyor.SendFlags.fence
    assert w.wr_id == 44 and w.flags == int(conveyor.SendFlags.fence)
    r = conveyor.RecvWr(s, wr_id=8)
    assert r.wr_id == 8 and r.sg_list[0].addr == 10


def test_completion_fields(pair):
    i = pair.i
    mr = i.pd.register_memory(bytearray(8), Access.local_write)
    i.qp.post_read(mr, i.peer.slice(0, 8), wr_id=1)
    (wc,) = wait_for(i.cq, 1)
    assert isinstance(wc, conveyor.WorkCompletion)
    assert wc.vendor_err == 0 and not wc.with_inv and wc.invalidated_rkey == 0 and wc.imm_data == 0


def test_unsupported_is_exported():
    assert issubclass(conveyor.Unsupported, conveyor.ConveyorError)
    assert conveyor._errors._BY_CODE[int(conveyor.ErrorCode.unsupported)] is conveyor.Unsupported


def test_every_public_name_is_used_by_a_test():
    here = os.path.dirname(os.path.abspath(__file__))
    text = "".join(open(f).read() for f in glob.glob(os.path.join(here, "*.py")) if not f.endswith("test_stubs.py"))
    unused = []
    for name in conveyor.__all__:
        obj = getattr(conveyor, name)
        if name not in text:
            unused.append(name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException) and not hasattr(obj, "__members__"):
            unused += ["%s.%s" % (name, m) for m in dir(obj)
                       if not m.startswith("_") and not re.search(r"(\.%s\b|\"%s\")" % (m, m), text)]
    assert not unused, "no test uses: %s" % unused


def test_listener_bound_without_an_address_gets_one_in_the_providers_syntax(provider):
    # make_pair connects through such a listener; here its address itself.
    dev = conveyor.Device.open(provider)
    a = conveyor.Listener.bind(dev)
    b = conveyor.Listener.bind(dev, backlog=8)
    assert a.address and a.address != b.address, "two live listeners got one address"
    if has_wire(dev.attr):
        assert a.port > 0 and a.address.endswith(":%d" % a.port)
    else:
        assert a.address.startswith("@") and a.port == 0


def test_device_facts(provider):
    a = conveyor.Device.open(provider).attr
    for fact in ("post_recv_checks_lkeys", "inline_checks_lkeys", "deregister_stops_outstanding",
                 "registration_pins_pages", "runs_mpa"):
        assert isinstance(getattr(a, fact), bool), fact
    # connection attributes report MPA exactly where runs_mpa says (see
    # test_connection_attr_caps_counters_and_request)
