"""Shared fixtures: providers and a connected pair of QPs in one process.

A pair is two devices of one provider (so each side has its own engine, as
two processes would), a listener on the target side, and one QP each way.
The target registers `target_buf` with every right and sends its key as the
accept's private data.
"""

import threading
import types

import pytest

import conveyor

PROVIDERS = ["soft", "shm"]


def runs_mpa(attr):
    """The device's connections run MPA in Conveyor itself, so they report it
    (ConnectionAttr.iwarp): DeviceAttr.runs_mpa."""
    return attr.runs_mpa


def has_wire(attr):
    """The peers talk over a network (not shared memory)."""
    return attr.transport != conveyor.Transport.shm


def make_pair(provider, size=1 << 16, target_buf=None, target_progress=conveyor.ProgressMode.thread, **qp_kwargs):
    t = types.SimpleNamespace()
    t.dev = conveyor.Device.open(provider, progress=target_progress)
    t.pd = t.dev.alloc_pd()
    t.cq = t.dev.create_cq(256)
    t.buf = target_buf if target_buf is not None else bytearray(size)
    t.mr = t.pd.register_memory(t.buf, conveyor.ALL_ACCESS)
    t.lis = conveyor.Listener.bind(t.dev)  # an ephemeral address in the provider's syntax
    t.qp = t.pd.create_qp(t.cq, **qp_kwargs)

    i = types.SimpleNamespace()
    i.dev = conveyor.Device.open(provider)
    i.pd = i.dev.alloc_pd()
    i.cq = i.dev.create_cq(256)
    i.qp = i.pd.create_qp(i.cq, **qp_kwargs)

    result = {}

    def serve():
        try:
            req = t.lis.accept(5.0)
            result["req_private"] = req.private_data
            result["info"] = req.accept(t.qp, t.mr.remote().encode())
        except BaseException as e:  # handed to the main thread
            result["error"] = e

    th = threading.Thread(target=serve)
    th.start()
    i.info = conveyor.connect(i.qp, t.lis.address, private_data=b"initiator")
    th.join()
    if "error" in result:
        raise result["error"]
    assert result["req_private"] == b"initiator"
    t.info = result["info"]
    i.peer = conveyor.RemoteRegion.decode(i.info.private_data)
    return types.SimpleNamespace(t=t, i=i, provider=provider)


def wait_for(cq, n, timeout=5.0):
    """n completions from cq (raises TimedOut if they do not come)."""
    got = []
    while len(got) < n:
        got += cq.wait(timeout, max_entries=n - len(got))
    return got


@pytest.fixture(params=PROVIDERS)
def provider(request):
    return request.param


@pytest.fixture
def pair(provider):
    p = make_pair(provider)
    yield p
    p.i.qp.close()
    p.t.qp.close()
