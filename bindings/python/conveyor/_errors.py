"""Conveyor's exceptions: one class per library error code.

Every exception the bindings raise for a library error is a ConveyorError
carrying ``code`` (conveyor.ErrorCode), ``errno`` (0 if none) and ``context``
(what failed and where: device, QP, peer). The subclasses also derive from the
matching built-in exception where there is one (TimedOut is a TimeoutError,
ConnectionRefused a ConnectionRefusedError, InvalidArgument a ValueError, an
address that does not parse (InvalidAddress) a ValueError, one that cannot be
bound (BindError) an OSError, ...), so generic handlers keep working.

This module has no dependency on the extension (the extension imports it).
"""


class ConveyorError(Exception):
    """A library error: ``code``, ``errno`` and ``context`` say what and where."""

    code = None
    errno = 0
    context = ""


class InvalidArgument(ConveyorError, ValueError):
    """A parameter is out of range or malformed (also: a read-only buffer for a writing right)."""


class NotFound(ConveyorError, LookupError):
    """No such device, key or object."""


class Unsupported(ConveyorError):
    """The provider or this connection cannot do it."""


class Again(ConveyorError):
    """A queue is full: retry after completions are reaped."""


class TimedOut(ConveyorError, TimeoutError):
    """A bounded wait expired."""


class ConnectionRefused(ConveyorError, ConnectionRefusedError):
    """Nothing listens at the address."""


class ConnectionReset(ConveyorError, ConnectionResetError):
    """The peer or the network dropped the connection."""


class Rejected(ConveyorError):
    """The peer rejected the connection (its reason is in the context)."""


class ProtocolError(ConveyorError):
    """The peer violated the wire protocol."""


class AddressError(ConveyorError):
    """The address could not be parsed or bound: InvalidAddress or BindError."""


class InvalidAddress(AddressError, ValueError):
    """The address could not be parsed (e.g. a soft address without a port)."""


class BindError(AddressError, OSError):
    """The system refused the address (bind or listen failed): ``errno`` says why (EADDRINUSE)."""


class ResourceExhausted(ConveyorError, MemoryError):
    """Out of memory, keys, descriptors or locked memory."""


class InvalidState(ConveyorError):
    """The object is in the wrong state (e.g. QP not RTS, or in use by another thread)."""


class QpInError(ConveyorError):
    """The QP is in ERROR: posts are refused."""


class CqOverflow(ConveyorError):
    """The CQ overflowed: completions were lost."""


class IoError(ConveyorError, OSError):
    """A system call failed (errno says which error)."""


class CompletionError(ConveyorError):
    """A blocking helper's request completed with an error status.

    ``status`` is the conveyor.WcStatus and ``completion`` the WorkCompletion.
    """

    status = None
    completion = None


# Indexed by conveyor::errc's value (error.hpp); index 0 (ok) is never raised.
_BY_CODE = (
    ConveyorError,
    InvalidArgument,
    NotFound,
    Unsupported,
    Again,
    TimedOut,
    ConnectionRefused,
    ConnectionReset,
    Rejected,
    ProtocolError,
    AddressError,
    ResourceExhausted,
    InvalidState,
    QpInError,
    CqOverflow,
    IoError,
)
