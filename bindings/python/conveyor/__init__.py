"""Conveyor: RDMA with verbs semantics, from Python.

    import conveyor
    dev = conveyor.Device.open("soft")           # or "shm", "verbs[:name]"
    pd = dev.alloc_pd()
    cq = dev.create_cq(256)
    buf = bytearray(4096)                         # or numpy/torch/mmap/memoryview
    mr = pd.register_memory(buf, conveyor.Access.local_write | conveyor.Access.remote_read)
    qp = pd.create_qp(cq)
    info = conveyor.connect(qp, "127.0.0.1:7471", private_data=mr.remote().encode())
    peer = conveyor.RemoteRegion.decode(info.private_data)
    qp.read_into(mr, peer.slice(0, 4096))         # post, wait (GIL released)

The API is the C++ one (include/conveyor): devices, protection domains,
memory regions, completion queues, queue pairs, work requests and the
connection manager, with the verbs names. Control-path errors and failed posts
raise ConveyorError subclasses carrying the library's code, errno and context;
completions carry a WcStatus. See docs/PYTHON.md.

Room is left for the applications' Python faces (conveyor.kv, the Gloo
transport) as submodules of this package.
"""

import enum as _enum

from . import _errors
from ._errors import (
    AddressError,
    Again,
    BindError,
    CompletionError,
    ConnectionRefused,
    ConnectionReset,
    ConveyorError,
    CqOverflow,
    InvalidAddress,
    InvalidArgument,
    InvalidState,
    IoError,
    NotFound,
    ProtocolError,
    QpInError,
    Rejected,
    ResourceExhausted,
    TimedOut,
    Unsupported,
)
from . import _conveyor
from ._conveyor import (
    CompletionQueue,
    ConnectionAttr,
    ConnectionInfo,
    ConnectRequest,
    Device,
    DeviceAttr,
    DeviceInfo,
    ErrorCode,
    IwarpConnectionAttr,
    IwarpQpCounters,
    Listener,
    MemoryRegion,
    PortAttr,
    ProgressMode,
    ProtectionDomain,
    QpCaps,
    QpCounters,
    QpState,
    QueuePair,
    RecvWr,
    RemoteRegion,
    SendWr,
    Sge,
    SharedReceiveQueue,
    ShmConnectionAttr,
    ShmQpCounters,
    SrqAttr,
    Transport,
    VerbsConnectionAttr,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
    connect,
    devices,
    max_private_data,
)
from . import _async

__version__ = _conveyor.version


class Access(_enum.IntFlag):
    """Access rights of a registration (conveyor::access); combine with |."""

    none = 0
    local_write = 1 << 0  # the local NIC may write (receive, READ sink, atomic result)
    remote_write = 1 << 1  # peers may RDMA WRITE into it
    remote_read = 1 << 2  # peers may RDMA READ from it
    remote_atomic = 1 << 3  # peers may run atomics on it
    remote_invalidate = 1 << 4  # a peer's SEND with invalidate may revoke it (not in ALL_ACCESS)


class SendFlags(_enum.IntFlag):
    """Flags of a send work request (conveyor::send_flags)."""

    none = 0
    signaled = 1 << 0  # produce a completion
    inline_data = 1 << 1  # copy the payload at post time
    fence = 1 << 2  # wait for earlier READs/atomics first
    solicited = 1 << 3  # solicited event (SEND variants)


#: Every right: what a region that peers may do anything with needs.
ALL_ACCESS = Access.local_write | Access.remote_write | Access.remote_read | Access.remote_atomic

connect_async = _async.connect_async


def _attach():
    CompletionQueue.wait_async = _async.cq_wait_async
    Listener.accept_async = _async.listener_accept_async
    ConnectRequest.accept_async = _async.request_accept_async


_attach()
del _attach

__all__ = [
    "ALL_ACCESS",
    "Access",
    "AddressError",
    "Again",
    "BindError",
    "CompletionError",
    "CompletionQueue",
    "ConnectRequest",
    "ConnectionAttr",
    "ConnectionInfo",
    "ConnectionRefused",
    "ConnectionReset",
    "ConveyorError",
    "CqOverflow",
    "Device",
    "DeviceAttr",
    "DeviceInfo",
    "ErrorCode",
    "InvalidAddress",
    "InvalidArgument",
    "InvalidState",
    "IoError",
    "IwarpConnectionAttr",
    "IwarpQpCounters",
    "Listener",
    "MemoryRegion",
    "NotFound",
    "PortAttr",
    "ProgressMode",
    "ProtectionDomain",
    "ProtocolError",
    "QpCaps",
    "QpCounters",
    "QpInError",
    "QpState",
    "QueuePair",
    "RecvWr",
    "Rejected",
    "RemoteRegion",
    "ResourceExhausted",
    "SendFlags",
    "SendWr",
    "Sge",
    "SharedReceiveQueue",
    "ShmConnectionAttr",
    "ShmQpCounters",
    "SrqAttr",
    "TimedOut",
    "Transport",
    "Unsupported",
    "VerbsConnectionAttr",
    "WcOpcode",
    "WcStatus",
    "WorkCompletion",
    "WrOpcode",
    "connect",
    "connect_async",
    "devices",
    "max_private_data",
]
