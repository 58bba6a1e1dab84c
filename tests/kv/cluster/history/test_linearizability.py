"""The checker checked: histories known to be linearizable must pass, histories
known not to be must fail with the operations that prove it, and a reference
(brute force over every order) must agree with it on small random histories."""

import itertools
import random
import time

import pytest

from history import DELETE, FAIL, OK, READ, UNKNOWN, WRITE, HistoryFormatError, Op
import linearizability as lz

from cases import H, verdict, only_violation


def test_empty_history_is_linearizable():
    r = lz.check([])
    assert r.ok and r.keys == {}


def test_sequential_history_reads_the_last_write():
    h = H()
    h.r(None, 0, 1)
    h.w("a", 2, 3)
    h.r("a", 4, 5)
    h.w("b", 6, 7)
    h.r("b", 8, 9)
    h.d(10, 11)
    h.r(None, 12, 13)
    h.w("c", 14, 15)
    h.r("c", 16, 17)
    r = verdict(h.ops)
    assert r.ok, r.report()
    assert r.keys["k"].ops == 9


def test_concurrent_writes_may_be_seen_in_either_order():
    for first, second in (("a", "b"), ("b", "a")):
        h = H()
        h.w("a", 0, 10)
        h.w("b", 1, 11)
        h.r(first, 12, 13)    # whichever came last
        h.r(first, 14, 15)    # and it stays
        assert verdict(h.ops).ok
        # a read overlapping both writes may see either, then the other
        h = H()
        h.w("a", 0, 10)
        h.w("b", 1, 11)
        h.r(first, 2, 3)
        h.r(second, 4, 12)
        assert verdict(h.ops).ok


def test_read_concurrent_with_a_write_sees_old_or_new():
    for seen in (None, "a"):
        h = H()
        h.w("a", 0, 10)
        h.r(seen, 5, 6)
        assert verdict(h.ops).ok


def test_reads_that_touch_a_write_are_concurrent_with_it():
    # complete == invoke is not "before": precedence is strict
    h = H()
    h.w("a", 0, 5)
    h.r(None, 5, 6)
    assert verdict(h.ops).ok


def test_given_initial_value():
    h = H()
    h.r("init", 0, 1)
    h.w("a", 2, 3)
    h.r("a", 4, 5)
    assert verdict(h.ops, initial="init").ok
    assert verdict(h.ops, initial={"k": "init"}).ok
    v = only_violation(lz.check(h.ops), "never-written")   # nil initial: nobody wrote "init"
    assert v.ops == [h.ops[0]]


# -- known bad --------------------------------------------------------------


def test_stale_read_is_flagged_with_the_overwriting_write():
    h = H()
    wa = h.w("a", 0, 1)
    wb = h.w("b", 2, 3)
    r = h.r("a", 4, 5)   # invoked after b's write completed
    v = only_violation(verdict(h.ops), "stale-read")
    assert v.key == "k"
    assert v.ops == [wa, wb, r]
    assert "overwritten" in v.message


def test_stale_read_counts_a_write_over_once_its_value_was_read():
    # "a" was written by the time its first read completed (5), before "b"
    # was invoked (7, when a's write had not yet completed)
    h = H()
    wa = h.w("a", 1, 7)
    r1 = h.r("a", 4, 5)
    wb = h.w("b", 7, 10)
    r2 = h.r("a", 11, 16)
    assert only_violation(verdict(h.ops), "stale-read").ops == [wa, r1, wb, r2]
    # the same for an unknown write, which is otherwise open for ever
    h = H()
    wb = h.w("b", 2, None, outcome=UNKNOWN)
    r1 = h.r("b", 3, 4)
    wc = h.w("c", 5, 6)
    r2 = h.r("b", 7, 8)
    assert only_violation(verdict(h.ops), "stale-read").ops == [wb, r1, wc, r2]


def test_stale_read_of_the_initial_value_is_flagged():
    h = H()
    wa = h.w("a", 0, 1)
    r = h.r(None, 2, 3)
    v = only_violation(verdict(h.ops), "stale-read")
    assert v.ops == [wa, r]
    assert "initial" in v.message


def test_stale_read_after_a_delete_is_flagged():
    h = H()
    wa = h.w("a", 0, 1)
    d = h.d(2, 3)
    r = h.r("a", 4, 5)
    assert only_violation(verdict(h.ops), "stale-read").ops == [wa, d, r]
    h = H()
    h.w("a", 0, 1)
    h.d(2, 3)
    h.r(None, 4, 5)
    assert verdict(h.ops).ok


def test_nil_read_is_stale_only_if_every_nil_is_overwritten():
    h = H()
    h.w("a", 0, 1)
    d = h.d(2, 3)
    h.w("b", 4, 20)      # still running when the read is invoked
    h.r(None, 5, 6)
    assert verdict(h.ops).ok
    wc = h.w("c", 7, 8)   # the delete is now overwritten, and so is the initial nil
    r = h.r(None, 9, 10)
    v = only_violation(verdict(h.ops), "stale-read")
    assert d in v.ops and wc in v.ops and v.ops[-1] is r


def test_read_of_a_value_never_written_is_flagged():
    h = H()
    h.w("a", 0, 1)
    r = h.r("zzz", 2, 3)
    v = only_violation(verdict(h.ops), "never-written")
    assert v.ops == [r]
    assert "'zzz'" in v.message


def test_read_of_nil_with_a_non_nil_initial_value_and_no_delete_is_flagged():
    h = H()
    r = h.r(None, 0, 1)
    assert only_violation(verdict(h.ops, initial="x"), "never-written").ops == [r]


def test_read_from_the_future_is_flagged():
    h = H()
    r = h.r("a", 0, 1)
    w = h.w("a", 2, 3)
    assert only_violation(verdict(h.ops), "future-read").ops == [r, w]


def test_non_monotonic_reads_are_flagged():
    h = H()
    wa = h.w("a", 0, 1)
    wb = h.w("b", 2, 20)   # not yet acknowledged: not a stale read
    r1 = h.r("b", 3, 4)
    r2 = h.r("a", 5, 6)    # invoked after r1 completed, returns the older value
    v = only_violation(verdict(h.ops), "non-monotonic")
    assert v.ops == [wa, wb, r1, r2]
    # overlapping reads may disagree: not a violation
    h = H()
    h.w("a", 0, 1)
    h.w("b", 2, 20)
    h.r("b", 3, 6)
    h.r("a", 5, 7)
    assert verdict(h.ops).ok


def test_read_after_a_read_that_saw_the_other_of_two_finished_writes_is_flagged():
    # both writes were over before either read began: a read that saw "a"
    # fixes the order b, a, and a later read of "b" is one write behind
    h = H()
    wa = h.w("a", 0, 10)
    wb = h.w("b", 0, 10)
    ra = h.r("a", 11, 12)
    rb = h.r("b", 13, 14)
    v = only_violation(verdict(h.ops), "non-monotonic")
    assert v.ops == [wa, wb, ra, rb]
    assert "before that read began" in v.message


def test_non_monotonic_looks_past_earlier_reads_of_the_same_value():
    # the read with the latest horizon saw "b" itself; the one that proves
    # the violation is the read of "a" before it
    h = H()
    wa = h.w("a", 0, 10)
    wb = h.w("b", 0, 10)
    ra = h.r("a", 11, 13)
    h.r("b", 12, 13)
    rb = h.r("b", 14, 15)
    v = only_violation(lz.check(h.ops), "non-monotonic")
    assert v.ops == [wa, wb, ra, rb]


def test_non_monotonic_back_to_the_initial_nil_is_flagged():
    h = H()
    wa = h.w("a", 0, 20)
    r1 = h.r("a", 1, 2)
    r2 = h.r(None, 3, 4)
    assert only_violation(verdict(h.ops), "non-monotonic").ops == [wa, r1, r2]


def test_overlapping_reads_after_both_writes_disagreeing_need_the_search():
    # Both writes are over before either read begins, so both reads must see
    # the same last value. No quick check sees this (the reads overlap, so
    # neither is "earlier"); the search does, and the explanation is all four
    # operations: without any one of them the rest can be ordered.
    h = H()
    wa = h.w("a", 1, 6)
    wb = h.w("b", 3, 7)
    ra = h.r("a", 9, 15)
    rb = h.r("b", 12, 17)
    r = lz.check(h.ops)
    v = only_violation(r, "no-linearization")
    assert v.ops == [wa, wb, ra, rb]
    assert r.keys["k"].steps > 0
    assert "4 operations" in v.message and "not minimal" not in v.message
    # a third read, earlier and unrelated, is shrunk away
    h.r(None, 0, 1)
    assert only_violation(lz.check(h.ops)).ops == [wa, wb, ra, rb]


def test_reads_that_order_two_writes_both_ways_are_flagged():
    # a then b (the read of a ended before b's write was over)... and the
    # write of b was over before the read of a began: b then a.
    h = H()
    wb = h.w("b", 1, 3)
    wa = h.w("a", 2, 5)
    ra = h.r("a", 5, 11)
    rb = h.r("b", 7, 8)
    v = only_violation(verdict(h.ops))
    assert set(v.ops) == {wa, wb, ra, rb}


def test_explanation_is_shrunk_from_a_long_history():
    # 200 good operations, then the disagreeing reads: the explanation keeps
    # only what proves the violation.
    h = H()
    for i in range(100):
        h.w(f"x{i}", 10 * i, 10 * i + 5)
        h.r(f"x{i}", 10 * i + 6, 10 * i + 8)
    wa = h.w("a", 2001, 2006)
    wb = h.w("b", 2003, 2007)
    ra = h.r("a", 2009, 2015)
    rb = h.r("b", 2012, 2017)
    v = only_violation(verdict(h.ops), "no-linearization")
    assert v.ops == [wa, wb, ra, rb]
    # with no budget to shrink, the whole key comes back, marked as such
    v = only_violation(lz.check(h.ops, explain_steps=1), "no-linearization")
    assert len(v.ops) == len(h.ops)
    assert "may not be minimal" in v.message


def test_unknown_write_may_have_happened():
    h = H()
    h.w("a", 0, 1)
    h.w("b", 2, 3, outcome=UNKNOWN)
    h.r("b", 4, 5)
    h.r("b", 6, 7)
    assert verdict(h.ops).ok


def test_unknown_write_may_not_have_happened():
    h = H()
    h.w("a", 0, 1)
    h.w("b", 2, 3, outcome=UNKNOWN)
    h.r("a", 4, 5)
    h.r("a", 6, 7)
    assert verdict(h.ops).ok


def test_unknown_write_stays_open_for_ever():
    # The client gave up at 3; the write lands much later, after reads of "a".
    h = H()
    h.w("a", 0, 1)
    h.w("b", 2, 3, outcome=UNKNOWN)
    h.r("a", 100, 101)
    h.r("b", 1000, 1001)
    h.r("b", 1002, 1003)
    assert verdict(h.ops).ok
    # but once it was seen it cannot be undone
    h.r("a", 1004, 1005)
    assert not verdict(h.ops).ok


def test_unknown_write_with_no_complete_time():
    h = H()
    h.w("a", 0, 1)
    h.w("b", 2, None, outcome=UNKNOWN)
    h.r("b", 50, 51)
    assert verdict(h.ops).ok


def test_unknown_write_is_not_seen_before_it_was_invoked():
    h = H()
    wa = h.w("a", 0, 1)
    r1 = h.r("b", 2, 3)
    wb = h.w("b", 4, 5, outcome=UNKNOWN)
    assert only_violation(verdict(h.ops), "future-read").ops == [r1, wb]
    assert wa not in only_violation(verdict(h.ops)).ops


def test_unknown_write_seen_then_older_value_is_non_monotonic():
    h = H()
    wa = h.w("a", 0, 1)
    wb = h.w("b", 2, 3, outcome=UNKNOWN)
    r1 = h.r("b", 4, 5)
    r2 = h.r("a", 6, 7)
    assert only_violation(verdict(h.ops), "non-monotonic").ops == [wa, wb, r1, r2]


def test_unknown_and_failed_reads_say_nothing():
    h = H()
    h.w("a", 0, 1)
    h.r(None, 2, 3, outcome=UNKNOWN)
    h.r(None, 4, 5, outcome=FAIL)
    h.r("a", 6, 7)
    r = verdict(h.ops)
    assert r.ok and r.keys["k"].ops == 2


def test_failed_write_that_is_read_is_flagged():
    h = H()
    h.w("a", 0, 1)
    wb = h.w("b", 2, 3, outcome=FAIL)
    r = h.r("b", 4, 5)
    v = only_violation(lz.check(h.ops), "failed-write-read")
    assert v.ops == [wb, r]
    # the search alone, which drops the failed write, finds no write of "b"
    v = only_violation(lz.check(h.ops, quick=False), "no-linearization")
    assert v.ops == [r]


def test_failed_write_that_is_not_read_is_fine():
    h = H()
    h.w("a", 0, 1)
    h.w("b", 2, 3, outcome=FAIL)
    h.r("a", 4, 5)
    assert verdict(h.ops).ok


def test_values_must_be_unique_per_key():
    h = H()
    h.w("a", 0, 1)
    h.w("a", 2, 3, outcome=FAIL)
    with pytest.raises(HistoryFormatError, match="written twice"):
        lz.check(h.ops)
    h = H()
    h.w("x", 0, 1)
    with pytest.raises(HistoryFormatError, match="initial"):
        lz.check(h.ops, initial="x")
    # the same value on two keys is fine
    h = H()
    h.w("a", 0, 1, key="k1")
    h.w("a", 0, 1, key="k2")
    assert lz.check(h.ops).ok


def test_keys_are_checked_apart_and_each_violation_names_its_key():
    h = H()
    for k in range(20):
        h.w(f"{k}-a", 0, 1, key=k)
        h.w(f"{k}-b", 2, 3, key=k)
        h.r(f"{k}-b", 4, 5, key=k)
    # the same values across keys would be fine; a read of another key's value is not
    h.r("3-a", 6, 7, key=7)
    h.r("5-a", 6, 7, key=5)
    r = verdict(h.ops)
    assert r.status == lz.VIOLATION
    assert {v.key for v in r.violations} == {5, 7}
    kinds = {v.key: v.kind for v in r.violations}
    assert kinds == {5: "stale-read", 7: "never-written"}
    assert sum(1 for kr in r.keys.values() if kr.status == lz.LINEARIZABLE) == 18
    assert "key 5" in r.report() and "key 7" in r.report()


# -- the step cap --------------------------------------------------------------


def test_step_cap_gives_undecided_not_ok():
    h = H()
    for i in range(30):
        h.w(f"v{i}", 2 * i, 2 * i + 1)
        h.r(f"v{i}", 2 * i + 1, 2 * i + 1)
    assert lz.check(h.ops).ok
    r = lz.check(h.ops, max_steps=10)
    assert r.status == lz.UNDECIDED and not r.ok
    assert r.undecided == ["k"]
    assert r.keys["k"].steps == 10
    assert "step cap 10" in r.keys["k"].note and "of 60" in r.keys["k"].note
    assert "undecided" in r.report()


def test_step_cap_bounds_a_search_that_would_explode():
    # Many concurrent deletes and writes, then two overlapping reads that
    # disagree (nil and "v1"): not linearizable, no quick check sees it, and
    # nil written by many deletes is what the search's pruning cannot
    # collapse (module comment), so it would explore about 4^12 orders.
    # Capped, it stops at the cap and says undecided, neither ok nor violation.
    h = H()
    for i in range(12):
        h.w(f"v{i}", 0, 100)
        h.d(0, 100)
    h.r(None, 101, 110)
    h.r("v1", 102, 111)
    t = time.monotonic()
    r = lz.check(h.ops, max_steps=200_000)
    assert r.status == lz.UNDECIDED, r.report()
    assert r.keys["k"].steps == 200_000
    assert time.monotonic() - t < 5
    # with 4 pairs it is decided, and correctly
    h = H()
    for i in range(4):
        h.w(f"v{i}", 0, 100)
        h.d(0, 100)
    h.r(None, 101, 110)
    h.r("v1", 102, 111)
    assert only_violation(lz.check(h.ops, max_steps=200_000), "no-linearization")


def test_many_concurrent_writes_nobody_read_stay_cheap():
    # 200 concurrent writes whose values nobody reads, then the disagreeing
    # reads: the pruning places the unread writes without trying their 2^200
    # subsets.
    h = H()
    for i in range(200):
        h.w(f"v{i}", 0, 100)
    h.r("v0", 101, 110)
    h.r("v1", 102, 111)
    r = lz.check(h.ops)
    only_violation(r, "no-linearization")
    assert r.keys["k"].steps < 100_000


# -- lost writes ------------------------------------------------------------


def test_no_write_lost_when_the_last_one_is_visible():
    h = H()
    h.w("a", 0, 1)
    h.w("b", 2, 3)
    assert lz.lost_writes(h.ops, {"k": "b"}) == []


def test_older_final_value_loses_the_later_write():
    h = H()
    h.w("a", 0, 1)
    wb = h.w("b", 2, 3)
    lost = lz.lost_writes(h.ops, {"k": "a"})
    assert [(x.key, x.write) for x in lost] == [("k", wb)]
    assert "#0" in lost[0].reason
    assert "lost" in str(lost[0])


def test_concurrent_writes_either_may_win():
    h = H()
    h.w("a", 0, 5)
    h.w("b", 1, 6)
    assert lz.lost_writes(h.ops, {"k": "a"}) == []
    assert lz.lost_writes(h.ops, {"k": "b"}) == []
    # touching is concurrent too: "a" did not complete before "c" was invoked
    h = H()
    h.w("a", 0, 5)
    h.w("c", 5, 6)
    assert lz.lost_writes(h.ops, {"k": "a"}) == []


def test_final_value_from_an_unknown_write_keeps_earlier_writes():
    h = H()
    h.w("a", 0, 1)
    h.w("b", 2, 3, outcome=UNKNOWN)
    assert lz.lost_writes(h.ops, {"k": "b"}) == []
    # an unknown write invoked before an acknowledged one completed may still win
    h = H()
    h.w("b", 0, 1, outcome=UNKNOWN)
    h.w("a", 2, 3)
    assert lz.lost_writes(h.ops, {"k": "b"}) == []


def test_nil_at_the_end_loses_every_acknowledged_write_unless_a_delete_explains_it():
    h = H()
    wa = h.w("a", 0, 1)
    wb = h.w("b", 2, 3)
    lost = lz.lost_writes(h.ops, {"k": None})
    assert [x.write for x in lost] == [wa, wb]
    assert all("initial" in x.reason for x in lost)
    d = h.d(4, 5)
    assert lz.lost_writes(h.ops, {"k": None}) == []
    # but a delete before the last write does not
    h.w("c", 6, 7)
    assert [x.write.value for x in lz.lost_writes(h.ops, {"k": None})] == ["c"]
    # a lost acknowledged delete: the final value's write preceded it
    assert [x.write for x in lz.lost_writes(h.ops, {"k": "b"})] == [d, h.ops[-1]]


def test_final_value_of_a_failed_write_is_reported():
    h = H()
    wa = h.w("a", 0, 1)
    h.w("b", 2, 3, outcome=FAIL)
    lost = lz.lost_writes(h.ops, {"k": "b"})
    assert [x.write for x in lost] == [wa]
    assert "never written" in lost[0].reason


def test_lost_writes_needs_a_final_read_of_every_written_key():
    h = H()
    h.w("a", 0, 1, key="k1")
    h.w("b", 0, 1, key="k2", outcome=FAIL)   # nothing acknowledged: not needed
    h.r(None, 0, 1, key="k3")
    with pytest.raises(ValueError, match="'k1'"):
        lz.lost_writes(h.ops, {})
    assert lz.lost_writes(h.ops, {"k1": b"a"}) == []   # bytes as redis-py returns them


def test_lost_writes_over_many_keys():
    h = H()
    for k in range(50):
        h.w(f"{k}-a", 0, 1, key=k)
        h.w(f"{k}-b", 2, 3, key=k)
    final = {k: f"{k}-b" for k in range(50)}
    final[17] = "17-a"
    final[33] = None
    lost = lz.lost_writes(h.ops, final)
    assert sorted((x.key, x.write.value) for x in lost) == [(17, "17-b"), (33, "33-a"), (33, "33-b")]


# -- random histories --------------------------------------------------------
