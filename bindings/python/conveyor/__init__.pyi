# Type stubs of the conveyor package (the extension conveyor._conveyor and the
# Python layer). tests/python/test_stubs.py checks that they name everything
# the package exports.
import enum
from typing import Any, Awaitable, ClassVar, Iterable, List, Optional, Sequence, Tuple, Union


__version__: str
max_private_data: int

# --- errors ---------------------------------------------------------------
class ErrorCode(enum.IntEnum):
    ok: int
    invalid_argument: int
    not_found: int
    unsupported: int
    again: int
    timed_out: int
    connection_refused: int
    connection_reset: int
    rejected: int
    protocol_error: int
    address_error: int
    resource_exhausted: int
    invalid_state: int
    qp_in_error: int
    cq_overflow: int
    io_error: int
    @property
    def name(self) -> str: ...

class ConveyorError(Exception):
    """A library error: code, errno and context say what and where."""
    code: Optional[ErrorCode]
    errno: int
    context: str

class InvalidArgument(ConveyorError, ValueError): ...
class NotFound(ConveyorError, LookupError): ...
class Unsupported(ConveyorError): ...
class Again(ConveyorError): ...
class TimedOut(ConveyorError, TimeoutError): ...
class ConnectionRefused(ConveyorError, ConnectionRefusedError): ...
class ConnectionReset(ConveyorError, ConnectionResetError): ...
class Rejected(ConveyorError): ...
class ProtocolError(ConveyorError): ...
class AddressError(ConveyorError): ...
class InvalidAddress(AddressError, ValueError): ...
class BindError(AddressError, OSError): ...
class ResourceExhausted(ConveyorError, MemoryError): ...
class InvalidState(ConveyorError): ...
class QpInError(ConveyorError): ...
class CqOverflow(ConveyorError): ...
class IoError(ConveyorError, OSError): ...

class CompletionError(ConveyorError):
    """A blocking helper's request completed with an error status."""
    status: WcStatus
    completion: WorkCompletion

# --- enums and flags ------------------------------------------------------
class WcStatus(enum.IntEnum):
    success: int
    loc_len_err: int
    loc_qp_op_err: int
    loc_prot_err: int
    wr_flush_err: int
    mw_bind_err: int
    bad_resp_err: int
    loc_access_err: int
    rem_inv_req_err: int
    rem_access_err: int
    rem_op_err: int
    retry_exc_err: int
    rnr_retry_exc_err: int
    fatal_err: int
    resp_timeout_err: int
    general_err: int
    @property
    def name(self) -> str: ...

class WcOpcode(enum.IntEnum):
    send: int
    rdma_write: int
    rdma_read: int
    comp_swap: int
    fetch_add: int
    recv: int
    recv_rdma_with_imm: int

class WrOpcode(enum.IntEnum):
    send: int
    send_with_imm: int
    send_with_inv: int
    rdma_write: int
    rdma_write_with_imm: int
    rdma_read: int
    atomic_cmp_and_swp: int
    atomic_fetch_and_add: int

class QpState(enum.IntEnum):
    reset: int
    init: int
    rtr: int
    rts: int
    error: int

class Transport(enum.IntEnum):
    iwarp: int
    roce: int
    infiniband: int
    shm: int

class ProgressMode(enum.IntEnum):
    thread: int
    manual: int

class Access(enum.IntFlag):
    none: int
    local_write: int
    remote_write: int
    remote_read: int
    remote_atomic: int
    remote_invalidate: int

class SendFlags(enum.IntFlag):
    none: int
    signaled: int
    inline_data: int
    fence: int
    solicited: int

ALL_ACCESS: Access

# --- devices --------------------------------------------------------------
class DeviceInfo:
    name: str
    provider: str
    transport: Transport
    available: bool
    reason: str

class PortAttr:
    num: int
    state: str
    link_layer: str
    mtu: int
    addresses: List[str]

class DeviceAttr:
    name: str
    provider: str
    transport: Transport
    max_qp: int
    max_cqe: int
    max_qp_wr: int
    max_sge: int
    max_sge_rd: int
    max_inline_data: int
    max_mr: int
    max_mr_size: int
    max_msg_size: int
    max_qp_rd_atom: int
    max_srq: int
    max_srq_wr: int
    max_srq_sge: int
    post_recv_checks_lkeys: bool
    inline_checks_lkeys: bool
    deregister_stops_outstanding: bool
    registration_pins_pages: bool
    runs_mpa: bool
    atomics: bool
    atomic_cap: str
    immediate_data: bool
    send_with_invalidate: bool
    ports: List[PortAttr]

def devices() -> List[DeviceInfo]:
    """Every device of every provider built into the library."""

class Device:
    @staticmethod
    def open(name: str, *, progress: ProgressMode = ..., request_crc: bool = True, spin_us: int = 20,
             engine_spin_us: int = 50, engine_park: bool = True, handshake_timeout_ms: int = 5000,
             max_pending_handshakes: int = 256, large_fpdus: bool = True) -> Device:
        """Opens 'soft', 'soft:<label>', 'shm', 'verbs[:name]'; NotFound names the devices that exist."""
    @property
    def name(self) -> str: ...
    @property
    def provider(self) -> str: ...
    @property
    def attr(self) -> DeviceAttr: ...
    def alloc_pd(self) -> ProtectionDomain: ...
    def create_cq(self, depth: int = 1024) -> CompletionQueue: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None:
        """Idempotent; the engine thread ends once everything made from the device is closed too."""
    def __enter__(self) -> Device: ...
    def __exit__(self, *exc: Any) -> None: ...

# --- memory ---------------------------------------------------------------
class Sge:
    addr: int
    length: int
    lkey: int
    def __init__(self, addr: int, length: int, lkey: int) -> None: ...

class RemoteRegion:
    addr: int
    length: int
    rkey: int
    encoded_size: ClassVar[int]
    def __init__(self, addr: int, length: int, rkey: int) -> None: ...
    def slice(self, offset: int, length: int) -> RemoteRegion: ...
    def encode(self) -> bytes:
        """The stable 28-byte form (magic "CVRR", version 1, big-endian fields)."""
    @staticmethod
    def decode(data: Any) -> RemoteRegion:
        """InvalidArgument on a short buffer, bad magic or unknown version."""

#: An SGE argument: a region (all of it), (region, offset, length) or an Sge.
SgeLike = Union[Sge, "MemoryRegion", Tuple["MemoryRegion", int, int]]

class MemoryRegion:
    """A registration; holds the registered object until close(). Context manager."""
    @property
    def addr(self) -> int: ...
    @property
    def length(self) -> int: ...
    def __len__(self) -> int: ...
    @property
    def lkey(self) -> int: ...
    @property
    def rkey(self) -> int: ...
    @property
    def rights(self) -> int: ...
    @property
    def registered(self) -> bool: ...
    @property
    def obj(self) -> Any:
        """The registered object (None for allocate_memory)."""
    @property
    def memory(self) -> memoryview:
        """The region's bytes; the region cannot close while a view exists."""
    def remote(self) -> RemoteRegion: ...
    def sge(self, offset: int = 0, length: Optional[int] = None) -> Sge: ...
    def deregister(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> MemoryRegion: ...
    def __exit__(self, *args: Any) -> None: ...

class ProtectionDomain:
    def register_memory(self, buffer: Any, rights: int) -> MemoryRegion:
        """Any C-contiguous buffer-protocol object or CPU torch tensor, without copying."""
    def allocate_memory(self, length: int, rights: int) -> MemoryRegion: ...
    def create_qp(self, send_cq: CompletionQueue, recv_cq: Optional[CompletionQueue] = None, *,
                  max_send_wr: int = 256, max_recv_wr: int = 256, max_send_sge: int = 4,
                  max_recv_sge: int = 4, max_inline_data: int = 256, sq_sig_all: bool = False,
                  max_rd_atomic: int = 16, max_dest_rd_atomic: int = 16,
                  srq: Optional[SharedReceiveQueue] = None) -> QueuePair: ...
    def create_srq(self, *, max_wr: int = 256, max_sge: int = 4,
                   srq_limit: int = 0) -> SharedReceiveQueue: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> ProtectionDomain: ...
    def __exit__(self, *exc: Any) -> None: ...

class SrqAttr:
    max_wr: int
    max_sge: int
    srq_limit: int

class SharedReceiveQueue:
    """QPs created with srq= draw their receives from it; Again when full."""
    pd: ProtectionDomain
    @property
    def srq_num(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def post_recv(self, local: Union[SgeLike, List[RecvWr]], wr_id: int = 0) -> None: ...
    def arm_limit(self, limit: int) -> None: ...
    def query(self) -> SrqAttr: ...
    def close(self) -> None: ...
    def __enter__(self) -> SharedReceiveQueue: ...
    def __exit__(self, *exc: Any) -> None: ...

# --- completions ----------------------------------------------------------
class WorkCompletion:
    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    with_imm: bool
    with_inv: bool
    byte_len: int
    imm_data: int
    invalidated_rkey: int
    qp_num: int
    vendor_err: int
    @property
    def ok(self) -> bool: ...

class CompletionQueue:
    @property
    def depth(self) -> int: ...
    def poll(self, max_entries: int = 16) -> List[WorkCompletion]:
        """Never blocks; [] when empty; CqOverflow once completions were lost."""
    def wait(self, timeout: Optional[float] = None, max_entries: int = 16) -> List[WorkCompletion]:
        """Blocks with the GIL released; TimedOut after timeout seconds (None: no bound); Ctrl-C ends it."""
    def fd(self) -> int: ...
    def arm(self) -> None: ...
    def wait_async(self, timeout: Optional[float] = None, max_entries: int = 16) -> Awaitable[List[WorkCompletion]]: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> CompletionQueue: ...
    def __exit__(self, *exc: Any) -> None: ...

# --- queue pairs ----------------------------------------------------------
class SendWr:
    wr_id: int
    flags: int
    def __init__(self, opcode: WrOpcode = ..., local: Union[SgeLike, Sequence[SgeLike], None] = None,
                 remote: Optional[RemoteRegion] = None, wr_id: int = 0, flags: int = 1, imm_data: int = 0,
                 invalidate_rkey: int = 0, compare_add: int = 0, swap: int = 0) -> None: ...
    @property
    def opcode(self) -> WrOpcode: ...
    @property
    def sg_list(self) -> List[Sge]: ...
    @property
    def remote_addr(self) -> int: ...
    @property
    def rkey(self) -> int: ...
    @property
    def imm_data(self) -> int: ...

class RecvWr:
    wr_id: int
    def __init__(self, local: Union[SgeLike, Sequence[SgeLike]], wr_id: int = 0) -> None: ...
    @property
    def sg_list(self) -> List[Sge]: ...

class QpCaps:
    max_send_wr: int
    max_recv_wr: int
    max_send_sge: int
    max_recv_sge: int
    max_inline_data: int

class IwarpConnectionAttr:
    """iWARP (MPA over TCP) as negotiated by soft."""
    mpa_revision: int
    crc: bool
    mss: int
    max_fpdu: int
    rtr: str
    large_fpdus: bool

class ShmConnectionAttr:
    """How an shm connection moves data."""
    data_path: str
    direct_mapping: bool
    slot_payload: int

class VerbsConnectionAttr:
    """What rdma-core reports (path_mtu is 0 on iWARP devices)."""
    path_mtu: int
    port_mtu: int

class ConnectionAttr:
    """Common facts; a transport's part is None on providers that do not fill it."""
    local_address: str
    peer_address: str
    ird: int
    ord: int
    extensions: bool
    @property
    def iwarp(self) -> Optional[IwarpConnectionAttr]: ...
    @property
    def shm(self) -> Optional[ShmConnectionAttr]: ...
    @property
    def verbs(self) -> Optional[VerbsConnectionAttr]: ...

class IwarpQpCounters:
    tx_fpdus: int
    rx_fpdus: int
    tx_stream_bytes: int
    rx_stream_bytes: int
    tx_syscalls: int
    rx_syscalls: int
    terminates_sent: int
    terminates_received: int
    rx_direct_bytes: int

class ShmQpCounters:
    tx_slots: int
    rx_slots: int
    doorbells: int
    direct_ops: int
    hints: int

class QpCounters:
    """Payload bytes and requests served (soft, shm; zeros on verbs), plus a transport's part."""
    tx_bytes: int
    rx_bytes: int
    reads_served: int
    writes_placed: int
    atomics_served: int
    @property
    def iwarp(self) -> Optional[IwarpQpCounters]: ...
    @property
    def shm(self) -> Optional[ShmQpCounters]: ...

class QueuePair:
    """An RC queue pair. Posting never blocks: Again when full, QpInError in ERROR."""
    pd: ProtectionDomain
    send_cq: CompletionQueue
    recv_cq: CompletionQueue
    srq: Optional[SharedReceiveQueue]
    @property
    def qp_num(self) -> int: ...
    @property
    def state(self) -> QpState: ...
    @property
    def caps(self) -> QpCaps: ...
    @property
    def closed(self) -> bool: ...
    def post_send(self, wrs: Union[SendWr, Iterable[SendWr]]) -> None: ...
    def post_recv(self, local: Union[SgeLike, List[RecvWr]], wr_id: int = 0) -> None: ...
    def post_send_msg(self, local: SgeLike, wr_id: int = 0) -> None: ...
    def post_write(self, local: SgeLike, remote: RemoteRegion, wr_id: int = 0) -> None: ...
    def post_read(self, local: SgeLike, remote: RemoteRegion, wr_id: int = 0) -> None: ...
    def post_fetch_add(self, result: SgeLike, remote: RemoteRegion, add: int, wr_id: int = 0) -> None: ...
    def post_cmp_swap(self, result: SgeLike, remote: RemoteRegion, compare: int, swap: int,
                      wr_id: int = 0) -> None: ...
    def read_into(self, buffer: Any, remote: RemoteRegion, timeout: Optional[float] = 5.0) -> WorkCompletion:
        """READ and wait (GIL released); CompletionError on a failed completion."""
    def write_from(self, buffer: Any, remote: RemoteRegion, timeout: Optional[float] = 5.0) -> WorkCompletion:
        """WRITE and wait until the peer placed it (GIL released)."""
    def modify(self, state: QpState) -> None: ...
    def connection(self) -> ConnectionAttr: ...
    def counters(self) -> QpCounters: ...
    def disconnect(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> QueuePair: ...
    def __exit__(self, *args: Any) -> None: ...

# --- connection manager ---------------------------------------------------
class ConnectionInfo:
    private_data: bytes
    attr: ConnectionAttr

class ConnectRequest:
    @property
    def private_data(self) -> bytes: ...
    @property
    def peer_address(self) -> str: ...
    def accept(self, qp: QueuePair, private_data: Optional[bytes] = None) -> ConnectionInfo: ...
    def reject(self, reason: Union[str, bytes, None] = None) -> None: ...
    def accept_async(self, qp: QueuePair, private_data: Optional[bytes] = None) -> Awaitable[ConnectionInfo]: ...

class Listener:
    @staticmethod
    def bind(device: Device, address: Optional[str] = None, backlog: int = 64) -> Listener: ...
    @property
    def address(self) -> str: ...
    @property
    def port(self) -> int: ...
    def accept(self, timeout: Optional[float] = 5.0) -> ConnectRequest: ...
    def accept_async(self, timeout: Optional[float] = 5.0) -> Awaitable[ConnectRequest]: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> Listener: ...
    def __exit__(self, *exc: Any) -> None: ...

def connect(qp: QueuePair, address: str, private_data: Optional[bytes] = None,
            timeout: Optional[float] = 5.0) -> ConnectionInfo:
    """Connects qp (INIT) to a listener; GIL released."""

async def connect_async(qp: QueuePair, address: str, private_data: Optional[bytes] = None,
                        timeout: Optional[float] = 5.0) -> ConnectionInfo: ...
