"""What the checker's two test files share: a history builder and verdict helpers."""
import itertools
import random
import time

import pytest

from history import DELETE, FAIL, OK, READ, UNKNOWN, WRITE, HistoryFormatError, Op
import linearizability as lz


class H:
    """Builds a history by hand: h.w("a", 0, 10) is a write of "a" invoked at
    0 and completed at 10; outcome and key are keywords."""

    def __init__(self):
        self.ops = []

    def _add(self, kind, value, invoke, complete, outcome, key, client):
        op = Op(len(self.ops), client if client is not None else f"c{len(self.ops)}", key, kind,
                value, invoke, complete, outcome)
        self.ops.append(op)
        return op

    def w(self, value, invoke, complete, outcome=OK, key="k", client=None):
        return self._add(WRITE, value, invoke, complete, outcome, key, client)

    def d(self, invoke, complete, outcome=OK, key="k", client=None):
        return self._add(DELETE, None, invoke, complete, outcome, key, client)

    def r(self, value, invoke, complete, outcome=OK, key="k", client=None):
        return self._add(READ, value if outcome == OK else None, invoke, complete, outcome, key,
                         client)


def verdict(ops, **kw):
    """The result with the quick checks and with the search alone; they must agree."""
    a = lz.check(ops, **kw)
    b = lz.check(ops, quick=False, **kw)
    assert a.status == b.status, (a.report(), b.report())
    return a


def only_violation(result, kind=None):
    assert result.status == lz.VIOLATION, result.report()
    assert len(result.violations) == 1, result.report()
    v = result.violations[0]
    if kind is not None:
        assert v.kind == kind, str(v)
    return v


# -- known good -------------------------------------------------------------
