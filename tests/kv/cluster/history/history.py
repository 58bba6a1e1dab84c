"""Operation histories for the cluster fault tests (issue 35).

A history is what concurrent clients did to a key-value store: for every
operation, who issued it, on which key, what it wrote or what it read, when it
was invoked and when it completed (monotonic nanoseconds), and its outcome:

  ok       acknowledged: it took effect, and a read's value is what it saw.
  fail     it definitely did not take effect (an error reply that guarantees
           nothing changed, e.g. -MOVED before any write).
  unknown  (alias "info", Jepsen's word) the client gave up (timeout, lost
           connection): the operation may or may not have taken effect, at any
           moment after its invoke, even after the client recorded the loss.
           The checker treats it as open for ever; its `complete` is kept only
           as a note of when the client gave up.

Kinds: `write` (a value unique per key, so a read names the write it saw),
`read` (a value, or None for nil: key absent) and `delete` (writes nil).

Usage, from many client threads:

    rec = Recorder()
    with rec.record(client="c1", key="k", kind="write", value="c1-17") as op:
        r.set("k", "c1-17")
        op.ok()
    with rec.record(client="c1", key="k", kind="read") as op:
        op.ok(r.get("k"))        # bytes are decoded as UTF-8
    rec.save("history.jsonl")

Leaving the block without ok()/fail()/unknown() (an exception) records the
operation as unknown: the safe assumption when nobody knows. Times come from
time.monotonic_ns (CLOCK_MONOTONIC: one clock for every process on a host,
so histories of several client processes on one machine can be merged).

File format: JSON lines, one operation per line:
  {"id": 3, "client": "c1", "key": "k", "kind": "write", "value": "c1-17",
   "invoke": 1200, "complete": 3400, "outcome": "ok"}
plus an optional "error" string (why it failed or is unknown). `load` rejects
anything else with the file, line and reason (HistoryFormatError).
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from typing import Callable, Iterable, Iterator

WRITE, READ, DELETE = "write", "read", "delete"
KINDS = (WRITE, READ, DELETE)
OK, FAIL, UNKNOWN = "ok", "fail", "unknown"
OUTCOMES = (OK, FAIL, UNKNOWN)
_OUTCOME_ALIASES = {"info": UNKNOWN}

# Times are monotonic nanoseconds, so anything past int64 is a damaged file.
_MAX_TIME = 2**63 - 1
# A line longer than this is not an operation (values are short unique tags).
MAX_LINE_BYTES = 1 << 20
_FIELDS = {"id", "client", "key", "kind", "value", "invoke", "complete", "outcome", "error"}


class HistoryFormatError(ValueError):
    """A history file or record that is not a valid history (says where and why)."""


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _scalar(x, what: str):
    """Keys, values and client ids are JSON scalars: str or int (bytes -> UTF-8 str)."""
    if isinstance(x, (bytes, bytearray, memoryview)):
        try:
            return bytes(x).decode("utf-8")
        except UnicodeDecodeError:
            raise HistoryFormatError(f"{what} is not UTF-8: {bytes(x)[:40]!r}") from None
    if isinstance(x, str) or _is_int(x):
        return x
    raise HistoryFormatError(f"{what} must be a string or an integer, not {type(x).__name__}")


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation. `value`: what a write wrote, what a read returned (None:
    nil; None too for a read that did not complete ok), None for a delete.
    `complete` is None only for an unknown outcome the client never closed."""

    id: int
    client: str | int
    key: str | int
    kind: str
    value: str | int | None
    invoke: int
    complete: int | None
    outcome: str
    error: str | None = None

    def __post_init__(self):
        _validate(self)

    @property
    def is_write(self) -> bool:
        """A write or a delete: something that changes the register."""
        return self.kind != READ

    def end(self) -> float:
        """When the operation is known to be over: never, for an unknown one."""
        return math.inf if self.outcome == UNKNOWN else self.complete

    def precedes(self, other: "Op") -> bool:
        """Real-time order: self completed before other was invoked."""
        return self.end() < other.invoke

    def to_json(self) -> dict:
        d = {"id": self.id, "client": self.client, "key": self.key, "kind": self.kind,
             "value": self.value, "invoke": self.invoke, "complete": self.complete,
             "outcome": self.outcome}
        if self.error is not None:
            d["error"] = self.error
        return d

    def __str__(self) -> str:
        what = {WRITE: f"write {self.value!r}", DELETE: "delete",
                READ: f"read -> {'nil' if self.value is None else repr(self.value)}"}[self.kind]
        if self.kind == READ and self.outcome != OK:
            what = "read"
        end = "…" if self.complete is None else str(self.complete)
        note = f" ({self.error})" if self.error else ""
        return (f"#{self.id} client {self.client} key {self.key!r}: {what} "
                f"[{self.invoke}, {end}] {self.outcome}{note}")


def _validate(op: Op) -> None:
    if not _is_int(op.id) or op.id < 0:
        raise HistoryFormatError(f"id must be a non-negative integer, not {op.id!r}")
    _scalar(op.client, "client")
    _scalar(op.key, "key")
    if op.kind not in KINDS:
        raise HistoryFormatError(f"kind must be one of {', '.join(KINDS)}, not {op.kind!r}")
    if op.outcome not in OUTCOMES:
        raise HistoryFormatError(f"outcome must be one of {', '.join(OUTCOMES)}, not {op.outcome!r}")
    if op.value is not None:
        _scalar(op.value, "value")
    if op.kind == WRITE and op.value is None:
        raise HistoryFormatError("a write needs a value (a delete writes nil)")
    if op.kind == DELETE and op.value is not None:
        raise HistoryFormatError("a delete carries no value")
    if op.kind == READ and op.outcome != OK and op.value is not None:
        raise HistoryFormatError("only an ok read has a value")
    if not _is_int(op.invoke) or not 0 <= op.invoke <= _MAX_TIME:
        raise HistoryFormatError(f"invoke must be an integer in [0, 2^63), not {op.invoke!r}")
    if op.complete is None:
        if op.outcome != UNKNOWN:
            raise HistoryFormatError(f"an {op.outcome} operation needs a complete time")
    elif not _is_int(op.complete) or not op.invoke <= op.complete <= _MAX_TIME:
        raise HistoryFormatError(
            f"complete must be an integer in [invoke, 2^63), not {op.complete!r} (invoke {op.invoke})")
    if op.error is not None and not isinstance(op.error, str):
        raise HistoryFormatError("error must be a string")


class Pending:
    """An invoked operation; settle it once with ok(), fail() or unknown()."""

    def __init__(self, recorder: "Recorder", client, key, kind, value, invoke: int):
        self._rec = recorder
        self.client, self.key, self.kind, self.value, self.invoke = client, key, kind, value, invoke
        self.done = False

    def ok(self, value=None) -> Op:
        """Acknowledged. A read passes what it returned (None for nil)."""
        if self.kind == READ:
            self.value = None if value is None else _scalar(value, "value")
        return self._rec._settle(self, OK, None)

    def fail(self, error: str | None = None) -> Op:
        """Definitely without effect (only when the reply guarantees it)."""
        if self.kind == READ:
            self.value = None
        return self._rec._settle(self, FAIL, error)

    def unknown(self, error: str | None = None) -> Op:
        """May or may not have taken effect (timeout, connection lost)."""
        if self.kind == READ:
            self.value = None
        return self._rec._settle(self, UNKNOWN, error)

    def __enter__(self) -> "Pending":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self.done:
            self.unknown(None if exc is None else f"{exc_type.__name__}: {exc}"[:200])
        return False  # the exception, if any, goes on


class Recorder:
    """Collects operations from many threads. Thread safety: every method may
    be called from any thread; ids are given in invoke order."""

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns):
        self._clock = clock
        self._lock = threading.Lock()
        self._next_id = 0
        self._pending: dict[int, Pending] = {}
        self._ops: list[Op] = []

    def invoke(self, client, key, kind: str, value=None) -> Pending:
        """Starts an operation now; settle it with the returned Pending."""
        client, key = _scalar(client, "client"), _scalar(key, "key")
        if kind not in KINDS:
            raise HistoryFormatError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        if kind == WRITE:
            if value is None:
                raise HistoryFormatError("a write needs a value (a delete writes nil)")
            value = _scalar(value, "value")
        elif value is not None:
            raise HistoryFormatError(f"a {kind} takes no value at invoke")
        with self._lock:
            p = Pending(self, client, key, kind, value, self._clock())
            p.id = self._next_id
            self._next_id += 1
            self._pending[p.id] = p
        return p

    record = invoke  # reads better in a with-statement

    def _settle(self, p: Pending, outcome: str, error: str | None) -> Op:
        with self._lock:
            if p.done:
                raise RuntimeError(f"operation #{p.id} was already settled")
            now = self._clock()
            op = Op(p.id, p.client, p.key, p.kind, p.value, p.invoke, now, outcome, error)
            p.done = True
            del self._pending[p.id]
            self._ops.append(op)
        return op

    def ops(self) -> list[Op]:
        """A snapshot, in id order; operations still pending appear as unknown
        with no complete time (a client that never came back)."""
        with self._lock:
            ops = list(self._ops)
            # A pending read has no value yet (ok() may be setting it on
            # another thread: it is read here only for writes).
            ops += [Op(p.id, p.client, p.key, p.kind, None if p.kind == READ else p.value,
                       p.invoke, None, UNKNOWN, "pending")
                    for p in self._pending.values()]
        ops.sort(key=lambda o: o.id)
        return ops

    def save(self, path) -> None:
        save(self.ops(), path)


def save(ops: Iterable[Op], path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for op in ops:
            f.write(json.dumps(op.to_json(), ensure_ascii=True, separators=(",", ":")) + "\n")


def _reject_constant(name):
    raise ValueError(f"{name} is not a number a history can hold")


def parse_line(line: str, default_id: int) -> Op:
    """One JSON line -> Op; HistoryFormatError (without the place) if it is not one."""
    try:
        d = json.loads(line, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise HistoryFormatError(f"not JSON: {e}") from None
    if not isinstance(d, dict):
        raise HistoryFormatError(f"expected a JSON object, got {type(d).__name__}")
    extra = set(d) - _FIELDS
    if extra:
        raise HistoryFormatError(f"unknown field(s): {', '.join(sorted(map(repr, extra)))}")
    for need in ("client", "key", "kind", "invoke", "outcome"):
        if need not in d:
            raise HistoryFormatError(f"missing field {need!r}")
    outcome = d["outcome"]
    if isinstance(outcome, str):
        outcome = _OUTCOME_ALIASES.get(outcome, outcome)
    return Op(id=d.get("id", default_id), client=d["client"], key=d["key"], kind=d["kind"],
              value=d.get("value"), invoke=d["invoke"], complete=d.get("complete"),
              outcome=outcome, error=d.get("error"))


def load(path) -> list[Op]:
    """Reads a JSON-lines history. Blank lines are skipped; anything else that
    is not an operation raises HistoryFormatError naming the file and line."""
    ops: list[Op] = []
    seen: dict[int, int] = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(_lines(f), 1):
            where = f"{path}:{lineno}"
            if raw is None:
                raise HistoryFormatError(f"{where}: line longer than {MAX_LINE_BYTES} bytes")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise HistoryFormatError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
            if not text.strip():
                continue
            try:
                op = parse_line(text, len(ops))
            except HistoryFormatError as e:
                raise HistoryFormatError(f"{where}: {e}") from None
            if op.id in seen:
                raise HistoryFormatError(f"{where}: id {op.id} already used on line {seen[op.id]}")
            seen[op.id] = lineno
            ops.append(op)
    return ops


def _lines(f) -> Iterator[bytes | None]:
    """Lines of a binary file, each at most MAX_LINE_BYTES (None for a longer one)."""
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            yield None
            return
        yield raw


def by_key(ops: Iterable[Op]) -> dict:
    """Operations grouped by key, each group in id order."""
    groups: dict = {}
    for op in ops:
        groups.setdefault(op.key, []).append(op)
    for g in groups.values():
        g.sort(key=lambda o: o.id)
    return groups
