"""The checker against simulated linearizable histories, a brute force, and large histories."""
import itertools
import random
import time

import pytest

from history import DELETE, FAIL, OK, READ, UNKNOWN, WRITE, HistoryFormatError, Op
import linearizability as lz


from cases import H, verdict, only_violation


def simulate(rng, n_ops, keys=1, clients=4, p_read=0.5, p_delete=0.05, p_unknown=0.05,
             p_fail=0.03):
    """A real linearizable register per key, driven by clients that overlap at
    random: each operation takes effect at one instant strictly between its
    invoke and its completion. An unknown operation may or may not take
    effect (possibly after the client gave up); a failed one never does."""
    reg = {k: None for k in range(keys)}
    busy = {}          # client -> [op fields, phase]
    ops = []
    counter = itertools.count()
    t = 0
    started = 0
    late = []          # unknown writes that will land after the client gave up
    while started < n_ops or busy:
        t += rng.randint(1, 3)
        if late and rng.random() < 0.2:
            k, v = late.pop(rng.randrange(len(late)))
            reg[k] = v
        c = rng.randrange(clients)
        st = busy.get(c)
        if st is None:
            if started >= n_ops:
                continue
            started += 1
            k = rng.randrange(keys)
            x = rng.random()
            kind = READ if x < p_read else DELETE if x < p_read + p_delete else WRITE
            value = f"c{c}-{next(counter)}" if kind == WRITE else None
            fate = (UNKNOWN if rng.random() < p_unknown else
                    FAIL if kind != READ and rng.random() < p_fail else OK)
            busy[c] = [dict(client=c, key=k, kind=kind, value=value, invoke=t, fate=fate), 0]
        elif st[1] == 0:
            f = st[0]
            if f["fate"] == FAIL or (f["fate"] == UNKNOWN and rng.random() < 0.4):
                st[1] = 2       # no effect (yet): settles without a linearization point
                if f["fate"] == UNKNOWN and f["kind"] != READ and rng.random() < 0.5:
                    late.append((f["key"], f["value"]))
            else:
                if f["kind"] == READ:
                    f["value"] = reg[f["key"]]
                else:
                    reg[f["key"]] = f["value"]
                st[1] = 1
        else:
            f = st[0]
            outcome = f["fate"]
            value = f["value"] if f["kind"] != READ or outcome == OK else None
            complete = None if outcome == UNKNOWN and rng.random() < 0.3 else t
            ops.append(Op(len(ops), c, f["key"], f["kind"], value, f["invoke"], complete, outcome))
            del busy[c]
    return ops


def stale_mutation(rng, ops):
    """Changes one ok read to a value that is provably stale: the value of an
    ok write X such that another ok write W (of a different value) was invoked
    after X completed and completed before the read was invoked. X happened,
    W happened after it, the read after W: no order lets the read see X.
    Returns (new ops, read, X, W) or None if the history has no such read."""
    reads = [o for o in ops if o.kind == READ and o.outcome == OK]
    rng.shuffle(reads)
    for r in reads:
        writes = [o for o in ops if o.key == r.key and o.is_write and o.outcome == OK]
        pairs = [(x, w) for x in writes if x.kind == WRITE for w in writes
                 if x.complete < w.invoke and w.complete < r.invoke and w.value != x.value]
        if pairs:
            x, w = rng.choice(pairs)
            assert r.value != x.value
            bad = Op(r.id, r.client, r.key, READ, x.value, r.invoke, r.complete, OK)
            return [bad if o.id == r.id else o for o in ops], bad, x, w
    return None


@pytest.mark.parametrize("seed", range(40))
def test_simulated_linearizable_histories_pass_and_one_stale_read_fails(seed):
    rng = random.Random(seed)
    ops = simulate(rng, n_ops=rng.randint(20, 120), keys=rng.randint(1, 3),
                   clients=rng.randint(2, 6))
    good = verdict(ops)
    assert good.ok, good.report()
    m = stale_mutation(rng, ops)
    assert m is not None, "the simulation should give a stale candidate"
    bad_ops, read, x, w = m
    r = lz.check(bad_ops)
    v = only_violation(r)
    assert v.key == read.key and read in v.ops
    # and the search alone finds it too, with an explanation that is itself
    # unlinearizable and closed (every read's value has its write)
    r2 = lz.check(bad_ops, quick=False)
    v2 = only_violation(r2, "no-linearization")
    assert v2.key == read.key
    assert not lz.check(v2.ops, quick=False).ok
    written = {o.value for o in v2.ops if o.is_write}
    assert all(o.value in written or o.value is None for o in v2.ops if o.kind == READ)
    assert len(v2.ops) < len([o for o in bad_ops if o.key == read.key])


def brute_force(ops, initial=None):
    """Reference: tries every order (every subset of the unknown writes taking
    effect), keeping real time. Only for a handful of operations."""
    ops = [o for o in ops if o.outcome != FAIL and not (o.kind == READ and o.outcome != OK)]
    sure = [o for o in ops if o.outcome == OK]
    maybe = [o for o in ops if o.outcome == UNKNOWN]
    for n in range(len(maybe) + 1):
        for chosen in itertools.combinations(maybe, n):
            if _orders(sure + list(chosen), initial):
                return True
    return False


def _orders(ops, value):
    if not ops:
        return True
    for o in ops:
        if any(p is not o and p.precedes(o) for p in ops):
            continue   # something that must come first is still waiting
        if o.kind == READ:
            if o.value != value:
                continue
            nxt = value
        else:
            nxt = o.value
        if _orders([p for p in ops if p is not o], nxt):
            return True
    return False


@pytest.mark.parametrize("seed", range(300))
def test_checker_agrees_with_brute_force_on_small_random_histories(seed):
    """Random intervals and random read values, many of them bad in ways no
    quick check names: the verdict must be the brute force's, both with the
    quick checks and with the search alone, and a search explanation must
    itself be unlinearizable by brute force."""
    rng = random.Random(1000 + seed)
    n = rng.randint(1, 7)
    values = [f"v{i}" for i in range(n)]
    h = H()
    for i in range(n):
        a = rng.randint(0, 12)
        b = a + rng.randint(0, 6)
        outcome = rng.choices([OK, UNKNOWN, FAIL], [6, 1, 1])[0]
        x = rng.random()
        if x < 0.45:
            h.w(values[i], a, b, outcome=outcome)
        elif x < 0.55:
            h.d(a, b, outcome=outcome)
        else:
            h.r(rng.choice(values[: max(1, i)] + [None]), a, b, outcome=outcome)
    expect = brute_force(h.ops)
    searched = lz._Key("k", h.ops, None).searched
    assert lz._search(searched, None, 10**6, prune=False)[0] == expect
    assert lz._search(searched, None, 10**6, prune=True)[0] == expect
    for quick in (True, False):
        r = lz.check(h.ops, quick=quick)
        assert r.ok == expect, (quick, [str(o) for o in h.ops], r.report())
        if not expect:
            v = r.violations[0]
            assert not brute_force(v.ops), str(v)


def test_large_history_is_checked_in_a_few_seconds():
    rng = random.Random(7)
    ops = simulate(rng, n_ops=10_000, keys=100, clients=16)
    assert len(ops) == 10_000
    t = time.monotonic()
    r = lz.check(ops)
    elapsed = time.monotonic() - t
    assert r.ok, r.report()
    assert len(r.keys) == 100
    assert elapsed < 5, f"{elapsed:.2f} s"
    # and with one stale read in it, that key alone is named
    bad_ops, read, _, _ = stale_mutation(rng, ops)
    r = lz.check(bad_ops)
    assert [v.key for v in r.violations] == [read.key]


def test_one_busy_key_with_many_clients():
    rng = random.Random(11)
    ops = simulate(rng, n_ops=3000, keys=1, clients=12, p_unknown=0.02)
    r = lz.check(ops)
    assert r.ok, r.report()
    assert r.keys[0].steps < 10 * len(ops)   # linear in practice, not exploding


# -- the command line ----------------------------------------------------------


def run_cli(*args):
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run([sys.executable, os.path.join(here, "linearizability.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def test_command_line_exit_status_says_what_was_found(tmp_path):
    import json

    from history import save
    h = H()
    h.w("a", 0, 1)
    h.w("b", 2, 3)
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    save(h.ops, good)
    h.r("a", 4, 5)
    save(h.ops, bad)
    p = run_cli(good)
    assert p.returncode == 0 and p.stdout.startswith("ok: 1 key(s)"), p.stdout + p.stderr
    p = run_cli(bad)
    assert p.returncode == 1 and "stale-read" in p.stdout, p.stdout + p.stderr
    final = tmp_path / "final.json"
    final.write_text(json.dumps({"k": "a"}))
    p = run_cli(good, "--final", final)
    assert p.returncode == 1 and "1 lost acknowledged write" in p.stdout, p.stdout + p.stderr
    final.write_text(json.dumps({"k": "b"}))
    assert run_cli(good, "--final", final).returncode == 0
    assert run_cli(good, "--max-steps", 1).returncode == 2
    (tmp_path / "junk.jsonl").write_text("{\n")
    p = run_cli(tmp_path / "junk.jsonl")
    assert p.returncode == 3 and "junk.jsonl:1: not JSON" in p.stderr
