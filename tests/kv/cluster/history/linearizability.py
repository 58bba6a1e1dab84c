"""Per-key linearizability of a register history, and lost acknowledged writes.

check(ops) decides, key by key, whether some total order of each key's
operations (a) puts every operation between its invoke and its completion
(real time: an operation that completed before another was invoked comes
first), and (b) makes every read return the value of the last write before it
(nil before the first write, or the given initial value). Keys are independent
registers, so a history is linearizable exactly when every key's history is
(linearizability is local: Herlihy & Wing), and each key is checked alone.

Outcomes (history.py): a failed operation never happened and is dropped; an
unknown one may have happened at any moment after its invoke, so it is open
for ever (an unknown write whose value no read returned is dropped: putting it
last, or nowhere, changes no read, so the answer is the same); an unknown read
tells nothing and is dropped. Write values must be unique per key (and differ
from the initial value), so a read names the write it saw; nil is the one
value written many times (by deletes, and initially).

A write is placed before the first read of its value completes, so its
effective end is the earlier of its completion and that read's: an unknown
write that was read is open for ever no longer, and what must follow it is
known sooner. Both stages below use that end.

Each key goes through two stages:

1. Quick checks, O(n log n) in the key's n operations. Each is a proof of a
   violation on its own and names the few operations that prove it:
     never-written      a read returned a value no write wrote (nor the initial)
     failed-write-read  a read returned a value only a failed write wrote
     future-read        every write of the value was invoked after the read completed
     stale-read         every write of the value was over, then another write
                        was invoked and completed, then the read was invoked
     non-monotonic      read A completed, then read B was invoked and returned
                        a value whose writes were all over before A began or
                        before the first write of A's value began (so they were
                        overwritten by the write A saw)
   They are complete for none of the subtler cases (two overlapping reads
   that disagree, orders forced through several reads); those are the
   search's.

2. The search (Wing & Gong's backtracking, with Lowe's memoisation as in
   Porcupine): the operations' invoke and complete events in one time-ordered
   doubly linked list; walk it, and at an invoke event try to linearize that
   operation now (the register's step says whether it can: a read must see the
   current value); if the resulting (set of linearized operations, value) was
   not seen before, remember it, take the operation's two events out of the
   list and start again from the front. Meeting a complete event means the
   operation it closes should have been linearized already: undo the last
   choice (put its events back, dancing-links style) and try the next one.
   The list empty means every operation found its place: linearizable. Undoing
   with nothing left to undo means no order exists: a violation.

   Three sound prunings for a register with unique values (_search): no write
   replaces a value that a read still to be placed returns; a value no read
   still to be placed returns is cached as one "dead" value; and choices that
   are never wrong (a read placed as soon as it can be; a write of a dead
   value over a dead value) are not undone one by one. The tests hold the
   pruned search to the plain one and to a brute force over every order.

   Complexity: a step is one list move, one model step and one set lookup on
   a bitset of n bits (O(n/64) words); about a million steps a second. An
   operation is only linearized once everything that precedes it is, so the
   linearized sets are down-sets of the real-time order: with at most c
   operations pairwise concurrent there are at most n * 2^c of them, and the
   plain search is O(n * 2^c * c) steps at worst. With the prunings, the
   writes nobody reads and the reads cost no branching, so what is
   exponential is the number of concurrent writes whose values are read, and
   nil written by many concurrent deletes (which no pruning collapses: prefer
   unique values to deletes where a test can). Histories from real clients,
   linearizable or not, take a few steps per operation (the tests measure
   it). Each key stops after `max_steps` steps with the result "undecided"
   (not "ok"), saying how far it got; the whole check is at most keys x
   (max_steps + explain_steps) steps.

   A violation found only by the search is explained by shrinking: keep
   removing operations while the rest still cannot be linearized (first the
   latest invoked ones, by bisection, then chunks and single operations; a
   write goes together with the reads of its value, so every subset tried is
   one that a linearizable history would keep linearizable). What is left is
   the explanation: a 1-minimal set of operations that cannot be ordered. The
   shrinking has its own step budget; when it runs out, or a search along the
   way reaches the step cap, the report says that the set may not be minimal.

lost_writes(ops, final_reads) checks the read-back at the end: each
acknowledged write (or delete) must still be visible, as its own value or as
the value of a write not known to precede it (one that did not complete before
it was invoked; a failed write never counts).

Command line: linearizability.py HISTORY.jsonl [--final FINAL.json]
[--initial VALUE] [--max-steps N]; exit status 0 linearizable (and no lost
write), 1 a violation or a lost write, 2 undecided, 3 unreadable input.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import sys
from typing import Iterable, Mapping

from history import (DELETE, FAIL, OK, READ, UNKNOWN, WRITE, HistoryFormatError, Op, by_key,
                     _scalar)

DEFAULT_MAX_STEPS = 1_000_000  # about a second of Python per key at worst
DEFAULT_EXPLAIN_STEPS = DEFAULT_MAX_STEPS  # per key with a violation only the search found

LINEARIZABLE, VIOLATION, UNDECIDED = "ok", "violation", "undecided"


@dataclasses.dataclass
class Violation:
    """Why one key's history is not linearizable: `kind` (see the module
    comment), a sentence, and the operations that prove it, in invoke order."""

    key: object
    kind: str
    message: str
    ops: list

    def __str__(self) -> str:
        lines = [f"key {self.key!r}: {self.kind}: {self.message}"]
        lines += [f"    {op}" for op in self.ops]
        return "\n".join(lines)


@dataclasses.dataclass
class KeyResult:
    key: object
    status: str            # LINEARIZABLE, VIOLATION or UNDECIDED
    ops: int               # operations the search considered
    steps: int             # search steps spent (0 when a quick check decided)
    violation: Violation | None = None
    note: str = ""


@dataclasses.dataclass
class Result:
    keys: dict  # key -> KeyResult

    @property
    def status(self) -> str:
        if self.violations:
            return VIOLATION
        return UNDECIDED if self.undecided else LINEARIZABLE

    @property
    def ok(self) -> bool:
        """Every key linearizable (undecided is not ok)."""
        return self.status == LINEARIZABLE

    @property
    def violations(self) -> list:
        return [r.violation for r in self.keys.values() if r.status == VIOLATION]

    @property
    def undecided(self) -> list:
        return [k for k, r in self.keys.items() if r.status == UNDECIDED]

    def report(self) -> str:
        n = len(self.keys)
        lines = [f"{self.status}: {n} key(s), {len(self.violations)} violation(s), "
                 f"{len(self.undecided)} undecided, {sum(r.steps for r in self.keys.values())} steps"]
        lines += [str(v) for v in self.violations]
        lines += [f"key {k!r}: undecided: {self.keys[k].note}" for k in self.undecided]
        return "\n".join(lines)


class _Initial:
    """The register's value before any write: a writer that precedes everything."""

    invoke = -math.inf

    def end(self):
        return -math.inf


_INITIAL = _Initial()
_DEAD = object()  # the search's name for a value no read still to be placed returns


def check(ops: Iterable[Op], initial=None, max_steps: int = DEFAULT_MAX_STEPS,
          quick: bool = True, explain_steps: int = DEFAULT_EXPLAIN_STEPS) -> Result:
    """Checks every key. `initial`: the value of every key before the history
    (None: nil), or a mapping key -> value (missing keys: nil). `quick=False`
    leaves the search alone to decide (the tests compare both ways).
    Raises HistoryFormatError if a key has a value written twice (the checker
    needs unique values to tell which write a read saw)."""
    results = {}
    for key, group in by_key(ops).items():
        init = initial.get(key) if isinstance(initial, Mapping) else initial
        if init is not None:
            init = _scalar(init, "initial value")
        results[key] = check_key(key, group, init, max_steps, quick, explain_steps)
    return Result(results)


def check_key(key, ops: list, initial=None, max_steps: int = DEFAULT_MAX_STEPS,
              quick: bool = True, explain_steps: int = DEFAULT_EXPLAIN_STEPS) -> KeyResult:
    k = _Key(key, ops, initial)
    if quick:
        v = k.quick_check()
        if v is not None:
            return KeyResult(key, VIOLATION, len(k.searched), 0, v)
    status, steps, depth = _search(k.searched, initial, max_steps)
    if status is None:
        return KeyResult(key, UNDECIDED, len(k.searched), steps, None,
                         f"step cap {max_steps} reached after linearizing at most {depth} "
                         f"of {len(k.searched)} operations")
    if status:
        return KeyResult(key, LINEARIZABLE, len(k.searched), steps)
    return KeyResult(key, VIOLATION, len(k.searched), steps,
                     k.explain(max_steps, explain_steps))


class _Key:
    """One key's operations, indexed for the quick checks and the shrinking."""

    def __init__(self, key, ops: list, initial):
        self.key, self.initial = key, initial
        self.reads = sorted((o for o in ops if o.kind == READ and o.outcome == OK),
                            key=lambda o: (o.invoke, o.id))
        writes = [o for o in ops if o.is_write]
        self.failed = {}        # value -> failed write of it
        self.writers = {}       # value -> writes (ok or unknown) that may have written it
        seen = {}
        for w in writes:
            if w.kind == WRITE:
                if w.value == initial:
                    raise HistoryFormatError(
                        f"key {key!r}: {w} writes the initial value; the checker needs unique values")
                if w.value in seen:
                    raise HistoryFormatError(
                        f"key {key!r}: value {w.value!r} written twice (#{seen[w.value].id} and "
                        f"#{w.id}); the checker needs unique values")
                seen[w.value] = w
            if w.outcome == FAIL:
                self.failed.setdefault(w.value, w)
            else:
                self.writers.setdefault(w.value, []).append(w)
        self.writers.setdefault(initial, []).insert(0, _INITIAL)
        read_values = {r.value for r in self.reads}
        # A write is placed before the first read of its value completes: its
        # effective end (an unknown write that was read is not open for ever).
        self.first_seen = {}
        for r in self.reads:
            if r.value is not None:
                s = self.first_seen.get(r.value)
                if s is None or r.complete < s.complete:
                    self.first_seen[r.value] = r
        # What the search needs: ok reads, ok writes, and the unknown writes some
        # read may have seen (the others change nothing: see the module comment).
        self.searched = sorted(
            [o for o in writes if o.outcome == OK
             or (o.outcome == UNKNOWN and o.value in read_values)] + self.reads,
            key=lambda o: (o.invoke, o.id))

    def _end(self, x) -> float:
        """When x was over at the latest: its completion or the completion of
        the first read of its value, whichever came first."""
        e = x.end()
        s = self.first_seen.get(x.value) if x is not _INITIAL and x.kind == WRITE else None
        return e if s is None else max(x.invoke, min(e, s.complete))

    def _proof(self, xs) -> list:
        """Writes xs (not the initial value) and the reads that bound their end."""
        out = []
        for x in _real(xs):
            out.append(x)
            s = self.first_seen.get(x.value) if x.kind == WRITE else None
            if s is not None and s.complete < x.end():
                out.append(s)
        return out

    # -- quick checks -------------------------------------------------------

    def quick_check(self) -> Violation | None:
        ok_writes = sorted((w for w in self.searched if w.is_write and w.outcome == OK),
                           key=lambda o: o.invoke)
        any_after = _SuffixMin(ok_writes)
        nonnil_after = _SuffixMin([w for w in ok_writes if w.kind == WRITE])
        first_invoke = {v: min(x.invoke for x in xs) for v, xs in self.writers.items()}
        last_end = {v: max(self._end(x) for x in xs) for v, xs in self.writers.items()}
        # An earlier read A of another value w pins a horizon: whatever was
        # over before A began, or before the first write of w began, was
        # placed before the write A saw. Reads by completion, with the two
        # farthest horizons of different values among those completed so far.
        def horizon(a):
            return max(a.invoke, first_invoke[a.value])

        by_end = sorted((r for r in self.reads if r.value in first_invoke),
                        key=lambda r: r.complete)
        ends = [r.complete for r in by_end]
        top2, best, second = [], None, None
        for b in by_end:
            if best is None:
                best = b
            elif b.value == best.value:
                if horizon(b) > horizon(best):
                    best = b
            elif horizon(b) > horizon(best):
                best, second = b, best
            elif second is None or horizon(b) > horizon(second):
                second = b
            top2.append((best, second))

        for r in self.reads:
            v = r.value
            shown = "nil" if v is None else repr(v)
            xs = self.writers.get(v)
            if xs is None:
                if v in self.failed:
                    return Violation(self.key, "failed-write-read",
                                     f"read returned {shown}, which only a failed write wrote",
                                     _ordered([self.failed[v], r]))
                return Violation(self.key, "never-written",
                                 f"read returned {shown}, which no write wrote", [r])
            if first_invoke[v] > r.complete:
                return Violation(self.key, "future-read",
                                 f"read returned {shown}, whose write was invoked after the read completed",
                                 _ordered(_real(xs) + [r]))
            # stale: after every write of v, another write invoked and completed
            # before r was invoked
            after = nonnil_after if v is None else any_after
            witnesses = [after.first_after(self._end(x)) for x in xs]
            if all(w is not None and w.complete < r.invoke for w in witnesses):
                how = ("its write" if len(xs) == 1 and xs[0] is not _INITIAL else
                       "the initial value" if len(xs) == 1 else "each write of it")
                return Violation(self.key, "stale-read",
                                 f"read returned {shown}, but {how} was overwritten by a write that "
                                 f"completed before the read was invoked",
                                 _ordered(self._proof(xs) + list(dict.fromkeys(witnesses)) + [r]))
            # non-monotonic: an earlier read saw another value, and every write
            # of v was over before that read or the write of its value began
            i = bisect.bisect_left(ends, r.invoke)
            if i:
                best, second = top2[i - 1]
                a = best if best.value != v else second
                if a is not None and horizon(a) > last_end[v]:
                    what = "the initial value " if xs == [_INITIAL] else ""
                    after = ("that read began" if horizon(a) == a.invoke
                             else f"the write of {a.value!r} began")
                    return Violation(self.key, "non-monotonic",
                                     f"read returned {what}{shown} after an earlier read (completed "
                                     f"before it was invoked) returned {a.value!r}, and every write "
                                     f"of {shown} was over before {after}",
                                     _ordered(self._proof(xs) + _real(self.writers[a.value]) + [a, r]))
        return None

    # -- explanation by shrinking -------------------------------------------

    def explain(self, max_steps: int, budget: int) -> Violation:
        """A 1-minimal subset of the searched operations that cannot be
        linearized, closed under "a read brings the writes it may have seen"."""
        ops = self.searched
        spent = 0
        cut = capped = False

        def unlinearizable(subset: list) -> bool:
            nonlocal spent, cut, capped
            if spent >= budget:
                cut = True
                return False
            status, steps, _ = _search(subset, self.initial, min(max_steps, budget - spent))
            spent += steps
            if status is None:
                if spent >= budget:
                    cut = True
                else:
                    capped = True
            return status is False

        # Latest-invoked operations first: the shortest failing prefix (in
        # invoke order, plus the writes its reads may have seen). Failing is
        # monotone in the prefix, so bisection finds it.
        lo, hi = 0, len(ops)  # the prefix of length hi fails
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if unlinearizable(self._closure(ops[:mid])):
                hi = mid
            else:
                lo = mid
        current = self._closure(ops[:hi])
        # Then chunks of removable units, halving (delta debugging), down to one.
        chunk = max(1, len(current) // 2)
        while True:
            i = 0
            while i < len(current):
                anchors = current[i:i + chunk]
                drop = set()
                for a in anchors:
                    drop |= self._unit(a, current)
                rest = [o for o in current if o.id not in drop]
                if rest and unlinearizable(rest):
                    current = rest
                else:
                    i += chunk
            if chunk == 1:
                break
            chunk //= 2
        note = (" (may not be minimal: the explanation's step budget ran out)" if cut else
                " (may not be minimal: a search while shrinking reached the step cap)" if capped
                else "")
        return Violation(self.key, "no-linearization",
                         f"no order of these {len(current)} operations respects both real time "
                         f"and the register{note}", current)

    def _closure(self, subset: list) -> list:
        """subset plus every write its reads may have seen (for nil: every delete)."""
        ids = {o.id for o in subset}
        extra = []
        for r in subset:
            if r.kind == READ:
                for w in _real(self.writers.get(r.value, [])):
                    if w.id not in ids and w in self.searched_set:
                        ids.add(w.id)
                        extra.append(w)
        return sorted(subset + extra, key=lambda o: (o.invoke, o.id))

    @property
    def searched_set(self):
        if not hasattr(self, "_searched_set"):
            self._searched_set = set(self.searched)
        return self._searched_set

    def _unit(self, anchor: Op, current: list) -> set:
        """What goes with `anchor` when it is removed: a write takes the reads
        of its value (a delete: every nil read)."""
        if anchor.kind == READ:
            return {anchor.id}
        return {anchor.id} | {o.id for o in current if o.kind == READ and o.value == anchor.value}


class _SuffixMin:
    """Writes sorted by invoke; first_after(t): of the writes invoked after t,
    the one that completed first (None if none)."""

    def __init__(self, writes: list):
        self.invokes = [w.invoke for w in writes]
        self.best = [None] * (len(writes) + 1)
        for i in range(len(writes) - 1, -1, -1):
            b = self.best[i + 1]
            self.best[i] = writes[i] if b is None or writes[i].complete < b.complete else b

    def first_after(self, t):
        if t == math.inf:
            return None
        return self.best[bisect.bisect_right(self.invokes, t)]


def _real(xs) -> list:
    return [x for x in xs if x is not _INITIAL]


def _ordered(ops) -> list:
    return sorted(dict.fromkeys(ops), key=lambda o: (o.invoke, o.id))


def _search(ops: list, initial, max_steps: int, prune: bool = True):
    """Wing & Gong / Lowe / Porcupine over one key's operations (prune=False:
    the plain algorithm, which the tests hold the pruned one to).
    Returns (True | False | None for undecided, steps, deepest linearization)."""
    n = len(ops)
    if n == 0:
        return True, 0, 0
    # Events: node 0 is the head, 1..2n the events in time order, 2n+1 the
    # tail. At equal times invokes come first: operations that touch are
    # concurrent (precedence is strict: complete < invoke).
    # With prune, a write's interval also ends where the first read of its
    # value completes: it must be placed before that read, so this changes
    # no answer, and an unknown write that was read stops being open for ever.
    seen_by = {}
    if prune:
        for o in ops:
            if o.kind == READ and o.value is not None:
                seen_by[o.value] = min(seen_by.get(o.value, math.inf), o.complete)
    events = []
    for i, o in enumerate(ops):
        end = o.end()
        if o.kind == WRITE and o.value in seen_by:
            end = max(o.invoke, min(end, seen_by[o.value]))
        events.append((o.invoke, 0, i))
        events.append((end, 1, i))
    events.sort()
    tail = 2 * n + 1
    nxt = list(range(1, 2 * n + 2)) + [tail]
    prv = [0] + list(range(0, 2 * n + 1))
    op_of = [0] * (2 * n + 2)
    is_call = [False] * (2 * n + 2)
    call_node = [0] * n
    ret_node = [0] * n
    for node, (_, kind, i) in enumerate(events, 1):
        op_of[node] = i
        if kind == 0:
            is_call[node] = True
            call_node[i] = node
        else:
            ret_node[i] = node
    values = [o.value for o in ops]

    # Register-specific pruning (prune=True), from the unique written values:
    # - a write may not change the value while a read of the current value
    #   is still to be placed: no write brings that value back (unless it is
    #   nil and a delete is still to be placed), so that read could never be;
    # - a value that no read still to be placed returns is as good as any
    #   other such value: the cache stores it as _DEAD, so orders of writes
    #   nobody read collapse into one configuration;
    # - some choices are never wrong, so when everything after one fails, the
    #   configuration before it fails too and backtracking goes straight past
    #   it: a read placed as soon as it can be (earlier keeps every
    #   constraint: what had to precede it is placed, what it precedes is
    #   not), and, while the current value is dead, a write whose value is
    #   dead too (no read can come between it and the next write, so any
    #   order that places it later stays an order without it).
    pending_reads = {}
    pending_deletes = 0
    for o in ops:
        if o.kind == READ:
            pending_reads[o.value] = pending_reads.get(o.value, 0) + 1
        elif o.kind == DELETE:
            pending_deletes += 1
    kinds = [o.kind for o in ops]

    cache = set()
    stack = []  # (op, value before it, forced: see above)
    linearized = 0
    state = initial
    node = nxt[0]
    steps = deepest = 0
    while nxt[0] != tail:
        if steps >= max_steps:
            return None, steps, deepest
        steps += 1
        if is_call[node]:
            i = op_of[node]
            kind = kinds[i]
            if kind == READ:
                if values[i] != state:
                    node = nxt[node]
                    continue
                new = state
                left = pending_reads[new] - 1
            else:
                new = values[i]
                if prune and new != state and pending_reads.get(state, 0) and not (
                        state is None and pending_deletes):
                    node = nxt[node]
                    continue
                left = pending_reads.get(new, 0)
            bits = linearized | (1 << i)
            memo = (bits, new if left or not prune else _DEAD)
            forced = prune and (kind == READ or not (left or pending_reads.get(state, 0)))
            if memo not in cache:
                cache.add(memo)
                stack.append((i, state, forced))
                linearized, state = bits, new
                if kind == READ:
                    pending_reads[new] = left
                elif kind == DELETE:
                    pending_deletes -= 1
                # lift: take the call and return events out of the list
                c, r = call_node[i], ret_node[i]
                nxt[prv[c]] = nxt[c]
                prv[nxt[c]] = prv[c]
                nxt[prv[r]] = nxt[r]
                prv[nxt[r]] = prv[r]
                if len(stack) > deepest:
                    deepest = len(stack)
                node = nxt[0]
                continue
            if not forced:
                node = nxt[node]
                continue
            # else a choice that is never wrong already failed: so does this
            # configuration
        # Backtrack: a complete event of an operation not yet placed, or a
        # configuration that cannot succeed.
        while True:
            if not stack:
                return False, steps, deepest
            i, state, forced = stack.pop()
            linearized &= ~(1 << i)
            if kinds[i] == READ:
                pending_reads[values[i]] += 1
            elif kinds[i] == DELETE:
                pending_deletes += 1
            # unlift, in the reverse order of the lift (dancing links)
            c, r = call_node[i], ret_node[i]
            nxt[prv[r]] = r
            prv[nxt[r]] = r
            nxt[prv[c]] = c
            prv[nxt[c]] = c
            node = nxt[c]
            if not forced:
                break
    return True, steps, deepest


# -- lost acknowledged writes -------------------------------------------------


@dataclasses.dataclass
class LostWrite:
    key: object
    write: Op
    final: object       # the value read at the end (None: nil)
    reason: str

    def __str__(self) -> str:
        return f"key {self.key!r}: lost {self.write}: {self.reason}"


def lost_writes(ops: Iterable[Op], final_reads: Mapping, initial=None) -> list:
    """Every acknowledged write or delete whose effect is gone at the end.
    final_reads: key -> the value read once all clients stopped (None: nil).
    A write W is still visible if the final value is W's own or that of a
    write X (ok or unknown, not failed) not known to precede W (X did not
    complete before W was invoked). Raises ValueError for a key with
    acknowledged writes and no final read: the read-back must cover them."""
    lost = []
    missing = []
    for key, group in by_key(ops).items():
        acked = [o for o in group if o.is_write and o.outcome == OK]
        if not acked:
            continue
        if key not in final_reads:
            missing.append(key)
            continue
        final = final_reads[key]
        if final is not None:
            final = _scalar(final, f"final value of {key!r}")
        sources = [o for o in group if o.is_write and o.outcome != FAIL
                   and (o.value == final if o.kind == WRITE else final is None)]
        newest = max((s.end() for s in sources), default=-math.inf)
        shown = "nil" if final is None else repr(final)
        for w in acked:
            if newest >= w.invoke:
                continue
            if sources:
                last = max(sources, key=lambda s: s.end())
                reason = (f"the final value {shown} is from #{last.id}, which completed "
                          f"before this write was invoked")
            elif final == (initial.get(key) if isinstance(initial, Mapping) else initial):
                reason = f"the final value {shown} is the initial value"
            else:
                reason = f"the final value {shown} was never written (by a write that did not fail)"
            lost.append(LostWrite(key, w, final, reason))
    if missing:
        raise ValueError(f"no final read of {len(missing)} key(s) with acknowledged writes: "
                         f"{', '.join(map(repr, missing[:10]))}")
    return lost


def main(argv: list) -> int:
    import argparse
    import json

    from history import load

    p = argparse.ArgumentParser(description="Per-key linearizability of a JSON-lines history.")
    p.add_argument("history")
    p.add_argument("--final", help="JSON object: key -> value read at the end (null: nil)")
    p.add_argument("--initial", help="every key's value before the history (default nil)")
    p.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS)
    a = p.parse_args(argv)
    try:
        ops = load(a.history)
        result = check(ops, initial=a.initial, max_steps=a.max_steps)
        lost = []
        if a.final:
            with open(a.final, encoding="utf-8") as f:
                final = json.load(f)
            if not isinstance(final, dict):
                raise HistoryFormatError(f"{a.final}: expected a JSON object key -> value")
            lost = lost_writes(ops, final, initial=a.initial)
    except (OSError, ValueError) as e:
        print(f"linearizability: {e}", file=sys.stderr)
        return 3
    print(result.report())
    for w in lost:
        print(w)
    if a.final:
        print(f"{len(lost)} lost acknowledged write(s)")
    if result.violations or lost:
        return 1
    return 2 if result.undecided else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
