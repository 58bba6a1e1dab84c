"""Memory the library must not touch: a helper's buffer after it timed out,
inline data from an SGE no live region covers, the parent's connections in
a forked child; and what a registered file mapping that loses its pages does."""

import fcntl
import gc
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import conveyor
from conveyor import Access, QpState, SendFlags, SendWr, WcStatus, WrOpcode
from conftest import make_pair, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))


def test_read_into_that_timed_out_writes_nowhere_later(provider):
    # The target runs in manual progress: the READ is answered only when the
    # test polls the target, after read_into gave up and its buffer was freed.
    size = 3000
    p = make_pair(provider, target_progress=conveyor.ProgressMode.manual)
    p.t.buf[:size] = b"P" * size
    out = bytearray(size)
    with pytest.raises(conveyor.TimedOut):
        p.i.qp.read_into(out, p.i.peer.slice(0, size), timeout=0.2)
    # The READ cannot complete any more: its QP was moved to ERROR (and the
    # flush reaped) before read_into returned.
    assert p.i.qp.state == QpState.error
    assert p.i.cq.poll() == []
    del out
    gc.collect()
    fresh = [bytearray(size) for _ in range(64)]  # likely where the old buffer was
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # the target answers now, if it still may
        p.t.cq.poll()
        p.i.cq.poll()
        time.sleep(0.01)
    hit = [k for k, b in enumerate(fresh) if b.count(b"P")]
    assert not hit, "the late READ response overwrote unrelated buffers %s" % hit
    # A new QP works.
    q = make_pair(provider)
    got = bytearray(64)
    q.i.qp.read_into(got, q.i.peer.slice(0, 64))
    assert got == q.t.buf[:64]


def expect_inline_refused(p, sge):
    p.i.qp.post_send(SendWr(WrOpcode.rdma_write, local=sge, remote=p.i.peer.slice(0, 64), wr_id=9,
                            flags=SendFlags.signaled | SendFlags.inline_data))
    wc = wait_for(p.i.cq, 1)[0]
    assert wc.wr_id == 9 and wc.status == WcStatus.loc_prot_err, wc
    assert bytes(p.t.buf[:64]) == bytes(64)


def test_inline_send_from_a_forged_sge_is_loc_prot_err(pair):
    # Address 8, key 0: no region; the post must not read it.
    expect_inline_refused(pair, conveyor.Sge(8, 64, 0))


def test_inline_send_from_a_closed_region_is_loc_prot_err(pair):
    buf = bytearray(b"S" * (1 << 20))
    mr = pair.i.pd.register_memory(buf, Access.local_write)
    sge = mr.sge(0, 64)
    mr.close()
    del mr, buf
    gc.collect()
    expect_inline_refused(pair, sge)


FORK_SCRIPT = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[2])
    import conveyor
    from conftest import make_pair

    p = make_pair(sys.argv[1])
    out = bytearray(64)
    p.t.buf[:64] = b"A" * 64
    p.i.qp.read_into(out, p.i.peer.slice(0, 64))
    pid = os.fork()
    if pid == 0:
        # The child touches what it inherited and ends normally: the
        # interpreter's exit destroys every object.
        repr(p.i.qp); p.i.qp.closed; p.t.qp.closed
        try:
            p.i.qp.read_into(out, p.i.peer.slice(0, 64))
        except conveyor.InvalidState:
            pass
        else:
            sys.exit(3)  # used the parent's connection
        p.t.qp.close()
        sys.exit(0)
    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            sys.exit("the child hung on exit")
        time.sleep(0.02)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit("child: %d" % os.waitstatus_to_exitcode(status))
    time.sleep(0.2)  # a disconnect by the child would have arrived by now
    p.t.buf[:64] = b"B" * 64
    p.i.qp.read_into(out, p.i.peer.slice(0, 64))
    assert out == b"B" * 64, out
    assert p.i.qp.state == conveyor.QpState.rts and p.t.qp.state == conveyor.QpState.rts
    print("parent ok")
""")


def test_forked_child_exit_leaves_the_parents_qps_working(provider):
    r = subprocess.run([sys.executable, "-c", FORK_SCRIPT, provider, HERE], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "parent ok" in r.stdout, r.stdout + r.stderr


TRUNCATE_SCRIPT = textwrap.dedent("""
    import mmap, os, sys, tempfile
    sys.path.insert(0, sys.argv[1])
    from conftest import make_pair

    with tempfile.TemporaryFile() as f:
        os.ftruncate(f.fileno(), 1 << 16)
        m = mmap.mmap(f.fileno(), 1 << 16)
        p = make_pair("soft", target_buf=m)    # registered with remote_read
        os.ftruncate(f.fileno(), 0)            # anyone who may write the file
        out = bytearray(4096)
        p.i.qp.read_into(out, p.i.peer.slice(0, 4096), timeout=5.0)
        print("survived")
""")


def test_a_truncated_file_mapping_is_not_guarded():
    # Documented (docs/PYTHON.md, conveyor/mr.hpp): registered memory is not
    # pinned; when a registered file mapping loses its pages, the engine's
    # access for a peer's READ faults like any other access: SIGBUS.
    r = subprocess.run([sys.executable, "-c", TRUNCATE_SCRIPT, HERE], capture_output=True, text=True,
                       timeout=60)
    assert "survived" not in r.stdout
    if os.environ.get("CONVEYOR_SANITIZER"):
        assert r.returncode != 0  # the sanitizer reports the fault and aborts
    else:
        assert r.returncode == -signal.SIGBUS, (r.returncode, r.stderr)


def test_a_sealed_memfd_cannot_be_truncated_under_its_region(provider):
    # What docs/PYTHON.md recommends for file-backed memory instead.
    fd = os.memfd_create("conveyor-test", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 1 << 16)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        m = mmap.mmap(fd, 1 << 16)
        m[:5] = b"hello"
        p = make_pair(provider, target_buf=m)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
        out = bytearray(5)
        p.i.qp.read_into(out, p.i.peer.slice(0, 5))
        assert out == b"hello"
        p.i.qp.close()
        p.t.qp.close()
        p.t.mr.close()
        m.close()
    finally:
        os.close(fd)
