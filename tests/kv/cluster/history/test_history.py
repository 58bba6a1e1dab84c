"""The history model: the recorder under many threads, outcomes, and the JSON
lines file, including files that are not histories."""

import itertools
import json
import threading

import pytest

import history as hs
from history import FAIL, OK, READ, UNKNOWN, WRITE, HistoryFormatError, Op, Recorder


def fake_clock():
    c = itertools.count(100, 10)
    return lambda: next(c)


def test_recorder_records_times_and_outcomes():
    rec = Recorder(clock=fake_clock())
    w = rec.invoke("c1", "k", WRITE, "v1")
    r = rec.invoke("c2", "k", READ)
    r.ok(b"v1")
    w.ok()
    ops = rec.ops()
    assert [(o.id, o.kind, o.value, o.invoke, o.complete, o.outcome) for o in ops] == [
        (0, WRITE, "v1", 100, 130, OK), (1, READ, "v1", 110, 120, OK)]


def test_block_left_by_an_exception_is_unknown():
    rec = Recorder(clock=fake_clock())
    with pytest.raises(TimeoutError):
        with rec.record("c1", "k", WRITE, "v1"):
            raise TimeoutError("no reply in 1 s")
    with rec.record("c1", "k", WRITE, "v2") as op:
        op.fail("MOVED 1 127.0.0.1:7001")
    with rec.record("c1", "k", READ) as op:
        op.ok(None)
    ops = rec.ops()
    assert [o.outcome for o in ops] == [UNKNOWN, FAIL, OK]
    assert ops[0].error == "TimeoutError: no reply in 1 s"
    assert ops[1].error.startswith("MOVED")
    assert ops[2].value is None


def test_an_operation_is_settled_once():
    rec = Recorder()
    p = rec.invoke("c", "k", WRITE, "v")
    p.ok()
    with pytest.raises(RuntimeError, match="already settled"):
        p.fail()
    assert len(rec.ops()) == 1


def test_pending_operations_show_as_unknown_without_a_complete_time():
    rec = Recorder(clock=fake_clock())
    rec.invoke("c1", "k", WRITE, "v1")
    (op,) = rec.ops()
    assert op.outcome == UNKNOWN and op.complete is None and op.error == "pending"
    assert op.end() == float("inf")


def test_recorder_rejects_what_the_checker_could_not_use():
    rec = Recorder()
    with pytest.raises(HistoryFormatError, match="needs a value"):
        rec.invoke("c", "k", WRITE)
    with pytest.raises(HistoryFormatError, match="takes no value"):
        rec.invoke("c", "k", READ, "x")
    with pytest.raises(HistoryFormatError, match="kind"):
        rec.invoke("c", "k", "incr")
    with pytest.raises(HistoryFormatError, match="UTF-8"):
        rec.invoke("c", b"\xff", READ)
    with pytest.raises(HistoryFormatError, match="string or an integer"):
        rec.invoke("c", 1.5, READ)


def test_many_threads_append_safely():
    rec = Recorder()
    threads, per = 8, 500

    def client(c):
        for i in range(per):
            with rec.record(c, i % 7, WRITE, f"{c}-{i}") as op:
                op.ok()
            with rec.record(c, i % 7, READ) as op:
                op.ok(f"{c}-{i}")

    ts = [threading.Thread(target=client, args=(c,)) for c in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    ops = rec.ops()
    assert len(ops) == threads * per * 2
    assert [o.id for o in ops] == list(range(len(ops)))
    assert len({(o.client, o.value) for o in ops if o.kind == WRITE}) == threads * per
    # each client's own operations are sequential in time, in the order it made them
    for c in range(threads):
        mine = [o for o in ops if o.client == c]
        assert all(a.complete <= b.invoke for a, b in zip(mine, mine[1:]))


def test_save_and_load_round_trip(tmp_path):
    rec = Recorder(clock=fake_clock())
    rec.invoke("c1", "k", WRITE, "v1").ok()
    rec.invoke(2, 7, WRITE, 42).unknown("timeout")
    rec.invoke("c1", "k", hs.DELETE).fail("CLUSTERDOWN")
    rec.invoke("c1", "k", READ).ok("v1")
    rec.invoke("c3", "k", READ)            # never settled
    p = tmp_path / "h.jsonl"
    rec.save(p)
    assert hs.load(p) == rec.ops()
    assert all(json.loads(line) for line in p.read_text().splitlines())


def write_lines(tmp_path, *lines, raw=None):
    p = tmp_path / "h.jsonl"
    if raw is not None:
        p.write_bytes(raw)
    else:
        p.write_text("\n".join(lines) + "\n")
    return p


GOOD = '{"id":0,"client":"c","key":"k","kind":"write","value":"v","invoke":1,"complete":2,"outcome":"ok"}'


def test_load_skips_blank_lines_assigns_missing_ids_and_reads_info(tmp_path):
    p = write_lines(tmp_path, "", GOOD, "   ",
                    '{"client":"c","key":"k","kind":"read","invoke":3,"complete":null,"outcome":"info"}')
    ops = hs.load(p)
    assert [o.id for o in ops] == [0, 1]
    assert ops[1].outcome == UNKNOWN


BAD_LINES = [
    ("{not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('"write"', "expected a JSON object"),
    (GOOD.replace('"outcome":"ok"', '"outcome":"ok","extra":1'), "unknown field"),
    (GOOD.replace('"kind":"write",', ''), "missing field 'kind'"),
    (GOOD.replace('"write"', '"incr"'), "kind must be"),
    (GOOD.replace('"ok"', '"maybe"'), "outcome must be"),
    (GOOD.replace('"invoke":1', '"invoke":true'), "invoke must be"),
    (GOOD.replace('"invoke":1', '"invoke":-5'), "invoke must be"),
    (GOOD.replace('"invoke":1', '"invoke":1.5'), "invoke must be"),
    (GOOD.replace('"invoke":1', '"invoke":NaN'), "not JSON"),
    (GOOD.replace('"invoke":1', '"invoke":' + "9" * 30), "invoke must be"),
    (GOOD.replace('"complete":2', '"complete":0'), "complete must be"),
    (GOOD.replace('"complete":2', '"complete":null'), "needs a complete time"),
    (GOOD.replace('"value":"v"', '"value":null'), "a write needs a value"),
    (GOOD.replace('"value":"v"', '"value":{"a":1}'), "value must be"),
    (GOOD.replace('"key":"k"', '"key":[1]'), "key must be"),
    (GOOD.replace('"id":0', '"id":-1'), "id must be"),
    (GOOD.replace('"write"', '"delete"'), "a delete carries no value"),
    (GOOD.replace('"write"', '"read"').replace('"ok"', '"fail"'), "only an ok read"),
    ("[" * 100000 + "]" * 100000, "not JSON"),
]


@pytest.mark.parametrize("line, reason", [pytest.param(line, reason, id=f"{i}-{reason}")
                                          for i, (line, reason) in enumerate(BAD_LINES)])
def test_load_rejects_bad_lines_with_file_and_line(tmp_path, line, reason):
    p = write_lines(tmp_path, GOOD.replace('"id":0', '"id":9'), line)
    with pytest.raises(HistoryFormatError) as e:
        hs.load(p)
    assert f"{p}:2: " in str(e.value)
    assert reason in str(e.value)


def test_load_rejects_duplicate_ids(tmp_path):
    p = write_lines(tmp_path, GOOD, GOOD)
    with pytest.raises(HistoryFormatError, match=r":2: id 0 already used on line 1"):
        hs.load(p)


def test_load_rejects_bytes_that_are_not_utf8(tmp_path):
    p = write_lines(tmp_path, raw=GOOD.encode() + b"\n" + b'{"client":"\xff"}\n')
    with pytest.raises(HistoryFormatError, match=r":2: not UTF-8"):
        hs.load(p)


def test_load_rejects_a_line_too_long_without_reading_it_all(tmp_path):
    p = write_lines(tmp_path, raw=b" " * (hs.MAX_LINE_BYTES + 10))
    with pytest.raises(HistoryFormatError, match=r":1: line longer than"):
        hs.load(p)


def test_op_checks_itself():
    with pytest.raises(HistoryFormatError):
        Op(0, "c", "k", WRITE, "v", 5, 4, OK)
    op = Op(0, "c", "k", WRITE, "v", 1, 2, OK)
    later = Op(1, "c", "k", READ, "v", 3, 4, OK)
    touching = Op(2, "c", "k", READ, "v", 2, 4, OK)
    assert op.precedes(later) and not later.precedes(op)
    assert not op.precedes(touching)   # strict: touching intervals overlap
    assert "write 'v'" in str(op) and "read -> 'v'" in str(later)
