"""Every error class: raised with the library's code, errno and context."""

import errno
import os
import socket
import struct
import threading
import time

import pytest

import conveyor
from conveyor import Access, ErrorCode
from conftest import has_wire, make_pair


def fresh_qp(provider):
    dev = conveyor.Device.open(provider)
    return dev, dev.alloc_pd().create_qp(dev.create_cq(16))


def test_every_code_has_its_class():
    for name, code in ErrorCode.__members__.items():
        if code == ErrorCode.ok:
            continue
        cls = conveyor._errors._BY_CODE[int(code)]
        assert cls.__name__.lower() == name.replace("_", "").lower(), (name, cls)
        assert issubclass(cls, conveyor.ConveyorError)
        assert getattr(conveyor, cls.__name__) is cls


def test_builtin_bases():
    assert issubclass(conveyor.TimedOut, TimeoutError)
    assert issubclass(conveyor.ConnectionRefused, ConnectionRefusedError)
    assert issubclass(conveyor.ConnectionReset, ConnectionResetError)
    assert issubclass(conveyor.InvalidArgument, ValueError)
    assert issubclass(conveyor.IoError, OSError)


def test_connection_refused_carries_errno():
    _, qp = fresh_qp("soft")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(conveyor.ConnectionRefused) as e:
        conveyor.connect(qp, "127.0.0.1:%d" % port)
    assert e.value.code == ErrorCode.connection_refused
    assert e.value.errno == 111  # ECONNREFUSED
    assert ("127.0.0.1:%d" % port) in e.value.context
    assert str(port) in str(e.value)


def test_shm_connect_to_nobody_is_refused():
    _, qp = fresh_qp("shm")
    with pytest.raises(conveyor.ConveyorError) as e:
        conveyor.connect(qp, "@cvy-py-nobody-listens-here")
    assert e.value.code in (ErrorCode.connection_refused, ErrorCode.not_found)


def test_rejected_with_reason(provider):
    dev, qp = fresh_qp(provider)
    lis = conveyor.Listener.bind(dev)
    th = threading.Thread(target=lambda: lis.accept(5.0).reject("not today"))
    th.start()
    with pytest.raises(conveyor.Rejected) as e:
        conveyor.connect(qp, lis.address)
    th.join()
    assert e.value.code == ErrorCode.rejected and "not today" in e.value.context


def test_accept_timeout_is_timed_out(provider):
    lis = conveyor.Listener.bind(conveyor.Device.open(provider))
    t0 = time.monotonic()
    with pytest.raises(conveyor.TimedOut) as e:
        lis.accept(0.1)
    assert e.value.code == ErrorCode.timed_out and time.monotonic() - t0 < 2


def test_address_error():
    dev = conveyor.Device.open("soft")
    with pytest.raises(conveyor.AddressError) as e:
        conveyor.Listener.bind(dev, "no-port-here")
    assert "no-port-here" in e.value.context
    _, qp = fresh_qp("soft")
    with pytest.raises(conveyor.AddressError):
        conveyor.connect(qp, "not an address")


def test_private_data_too_long_is_invalid_argument(provider):
    dev, qp = fresh_qp(provider)
    lis = conveyor.Listener.bind(dev)
    with pytest.raises(conveyor.InvalidArgument):
        conveyor.connect(qp, lis.address, private_data=b"x" * (conveyor.max_private_data + 1))


def test_protocol_error_from_a_peer_that_is_not_mpa():
    # A TCP server that answers the MPA request with junk.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def junk():
        c, _ = srv.accept()
        c.recv(1024)
        c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"\0" * 64)
        time.sleep(0.5)
        c.close()

    th = threading.Thread(target=junk)
    th.start()
    _, qp = fresh_qp("soft")
    with pytest.raises(conveyor.ConveyorError) as e:
        conveyor.connect(qp, "127.0.0.1:%d" % srv.getsockname()[1], timeout=3.0)
    th.join()
    srv.close()
    assert isinstance(e.value, conveyor.ProtocolError), repr(e.value)
    assert e.value.code == ErrorCode.protocol_error and "MPA" in e.value.context


def test_unsupported_atomics_with_a_plain_iwarp_peer():
    # A minimal MPA revision 1 responder (RFC 5044): an iWARP peer that is not
    # Conveyor, so no RFC 7306 extensions; an atomic is refused at post time.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def responder():
        c, _ = srv.accept()
        hdr = c.recv(20, socket.MSG_WAITALL)
        assert hdr[:16] == b"MPA ID Req Frame", hdr
        pd_len = struct.unpack(">H", hdr[18:20])[0]
        if pd_len:
            c.recv(pd_len, socket.MSG_WAITALL)
        c.sendall(b"MPA ID Rep Frame" + bytes([hdr[16] & 0x40, 1]) + struct.pack(">H", 0))
        c.recv(1)  # until the initiator goes
        c.close()

    th = threading.Thread(target=responder)
    th.start()
    dev = conveyor.Device.open("soft", request_crc=False)
    pd = dev.alloc_pd()
    qp = pd.create_qp(dev.create_cq(16))
    try:
        info = conveyor.connect(qp, "127.0.0.1:%d" % srv.getsockname()[1], timeout=3.0)
        assert not info.attr.extensions and info.attr.iwarp.mpa_revision == 1
        mr = pd.register_memory(bytearray(8), Access.local_write)
        with pytest.raises(conveyor.Unsupported) as e:
            qp.post_fetch_add(mr, conveyor.RemoteRegion(0x1000, 8, 1), 1, wr_id=1)
        assert e.value.code == ErrorCode.unsupported
        with pytest.raises(conveyor.Unsupported):
            qp.post_send(conveyor.SendWr(conveyor.WrOpcode.send_with_imm, local=mr, imm_data=1))
    finally:
        qp.close()
        th.join()
        srv.close()


def peer_that_hangs_up(linger_rst):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def hang_up():
        c, _ = srv.accept()
        c.recv(1024)  # the MPA request
        if linger_rst:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")  # RST on close
        c.close()

    th = threading.Thread(target=hang_up)
    th.start()
    _, qp = fresh_qp("soft")
    try:
        with pytest.raises(conveyor.ConveyorError) as e:
            conveyor.connect(qp, "127.0.0.1:%d" % srv.getsockname()[1], timeout=3.0)
    finally:
        th.join()
        srv.close()
    return e.value


def test_connection_reset_by_a_peer_that_closes():
    e = peer_that_hangs_up(linger_rst=False)
    assert isinstance(e, conveyor.ConnectionReset), repr(e)
    assert e.code == ErrorCode.connection_reset


def test_io_error_carries_errno():
    # A TCP reset during the handshake: soft reports the failed recv as an
    # I/O error with its errno (ECONNRESET).
    e = peer_that_hangs_up(linger_rst=True)
    assert isinstance(e, (conveyor.IoError, conveyor.ConnectionReset)), repr(e)
    assert e.errno == 104
    if isinstance(e, conveyor.IoError):
        assert isinstance(e, OSError) and e.code == ErrorCode.io_error


@pytest.mark.skipif(os.environ.get("CONVEYOR_SANITIZER") == "address",
                    reason="UBSan's memory checks need a free descriptor")
def test_resource_exhausted_when_out_of_descriptors():
    # In a child process: a CQ needs an eventfd; with the descriptor limit
    # reached, create_cq fails with resource_exhausted and EMFILE.
    import subprocess
    import sys
    code = """
import resource, conveyor
dev = conveyor.Device.open("soft")
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
cqs = []
try:
    for _ in range(100):
        cqs.append(dev.create_cq(4))
except conveyor.ResourceExhausted as e:
    print(int(e.code), e.errno, len(cqs) > 0)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(int(ErrorCode.resource_exhausted)), "24", "True"], out.stdout


def test_close_while_connecting_is_invalid_state(provider):
    dev, qp = fresh_qp(provider)
    lis = conveyor.Listener.bind(dev)  # never accepts
    errors = []

    def connecting():
        try:
            conveyor.connect(qp, lis.address, timeout=1.0)
        except conveyor.ConveyorError as e:
            errors.append(e)

    th = threading.Thread(target=connecting)
    th.start()
    time.sleep(0.2)
    with pytest.raises(conveyor.InvalidState):
        qp.close()
    th.join()
    assert errors and not qp.closed
    qp.close()
    assert qp.closed


def test_invalid_state_and_qp_in_error(provider):
    p = make_pair(provider)
    mr = p.i.pd.register_memory(bytearray(8), Access.local_write)
    with pytest.raises(conveyor.InvalidState):
        p.i.pd.create_qp(p.i.cq).post_send_msg(mr, 1)
    p.i.qp.modify(conveyor.QpState.error)
    with pytest.raises(conveyor.QpInError) as e:
        p.i.qp.post_send_msg(mr, 1)
    assert e.value.code == ErrorCode.qp_in_error and e.value.errno == 0


def test_invalid_argument_cases(provider):
    dev = conveyor.Device.open(provider)
    pd = dev.alloc_pd()
    with pytest.raises(conveyor.InvalidArgument):
        pd.allocate_memory(1 << 60, Access.local_write)
    with pytest.raises(conveyor.InvalidArgument):
        pd.register_memory(bytearray(0), Access.local_write)  # empty
    with pytest.raises(conveyor.InvalidArgument):
        pd.register_memory(bytearray(8), Access.remote_write)  # remote_write without local_write


def test_an_address_that_does_not_parse_is_a_value_error(provider):
    dev, qp = fresh_qp(provider)
    # Malformed in the provider's syntax: "ip:port" has no port; a shm name has no ":".
    bad = "no-port-here" if has_wire(dev.attr) else "bad:address"
    for call in (lambda: conveyor.Listener.bind(dev, bad), lambda: conveyor.connect(qp, bad)):
        with pytest.raises(ValueError) as e:
            call()
        assert isinstance(e.value, conveyor.ConveyorError)
        assert isinstance(e.value, conveyor.InvalidAddress)
        assert isinstance(e.value, conveyor.AddressError)  # as before
        assert not isinstance(e.value, OSError)
        assert e.value.code == ErrorCode.address_error
        assert bad in str(e.value)


def test_an_address_that_cannot_be_bound_is_an_os_error(provider):
    dev = conveyor.Device.open(provider)
    lis = conveyor.Listener.bind(dev)
    with pytest.raises(OSError) as e:
        conveyor.Listener.bind(dev, lis.address)  # in use
    assert isinstance(e.value, conveyor.ConveyorError)
    assert isinstance(e.value, conveyor.BindError)
    assert isinstance(e.value, conveyor.AddressError)
    assert not isinstance(e.value, ValueError)
    assert e.value.errno == errno.EADDRINUSE
    assert e.value.code == ErrorCode.address_error
    assert lis.address in str(e.value)


def test_posting_on_an_unconnected_qp_says_connect_first(provider):
    dev, qp = fresh_qp(provider)
    mr = qp.pd.allocate_memory(64, conveyor.Access.local_write)
    far = conveyor.RemoteRegion(0x1000, 64, 1)
    calls = {
        "post_send_msg": lambda: qp.post_send_msg(mr),
        "post_write": lambda: qp.post_write(mr, far),
        "post_read": lambda: qp.post_read(mr, far),
        "post_send": lambda: qp.post_send(conveyor.SendWr(local=mr)),
        "post_send batch": lambda: qp.post_send([conveyor.SendWr(local=mr), conveyor.SendWr(local=mr)]),
        "read_into": lambda: qp.read_into(mr, far),
        "write_from": lambda: qp.write_from(mr, far),
    }
    for name, call in calls.items():
        with pytest.raises(conveyor.InvalidState) as e:
            call()
        assert "connect first" in str(e.value), (name, str(e.value))
    qp.post_recv(mr)  # receives may be posted before connecting, as in verbs
