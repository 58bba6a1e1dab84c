"""numpy arrays and torch CPU tensors registered and moved without copies:
the bytes land in (and leave from) the array's own memory."""

import numpy as np
import pytest
import torch

import conveyor
from conveyor import Access, SendWr, WrOpcode
from conftest import make_pair, wait_for


def test_numpy_read_sink_and_write_source(provider):
    src = np.arange(1 << 16, dtype=np.uint32)  # 256 KiB on the target
    p = make_pair(provider, target_buf=src)
    assert p.t.mr.addr == src.ctypes.data
    sink = np.zeros_like(src)
    mr = p.i.pd.register_memory(sink, Access.local_write)
    assert mr.addr == sink.ctypes.data
    p.i.qp.post_read(mr, p.i.peer, wr_id=1)
    wait_for(p.i.cq, 1)
    assert np.array_equal(sink, src)  # the READ wrote into sink's own buffer
    sink[:] = 7
    p.i.qp.post_write(mr, p.i.peer, wr_id=2)
    wait_for(p.i.cq, 1)
    assert (src == 7).all()  # the WRITE placed into the target array's buffer


def test_numpy_views_and_dtypes(provider):
    p = make_pair(provider)
    p.t.buf[:] = bytes(range(256)) * (len(p.t.buf) // 256)
    grid = np.zeros((4, 256), dtype=np.uint8)
    row = grid[2]  # a contiguous view into grid
    mr = p.i.pd.register_memory(row, Access.local_write)
    assert mr.addr == grid.ctypes.data + 2 * 256
    p.i.qp.read_into(mr, p.i.peer.slice(0, 256))
    assert grid[2].tobytes() == bytes(range(256)) and not grid[1].any() and not grid[3].any()
    f = np.zeros(8, dtype=np.float64)
    p.i.qp.read_into(f, p.i.peer.slice(0, 64))
    assert f.tobytes() == bytes(range(64))


def test_torch_tensor_read_and_write(provider):
    target = torch.linspace(0, 1, 1 << 14, dtype=torch.float32)
    p = make_pair(provider, target_buf=target)
    assert p.t.mr.addr == target.data_ptr()
    t = torch.zeros(1 << 14, dtype=torch.float32)
    mr = p.i.pd.register_memory(t, Access.local_write)
    assert mr.addr == t.data_ptr() and mr.length == t.numel() * t.element_size()
    p.i.qp.read_into(mr, p.i.peer)
    assert torch.equal(t, target)
    t.fill_(3.5)
    p.i.qp.write_from(mr, p.i.peer)
    assert bool((target == 3.5).all())


def test_torch_slices_and_grad(provider):
    p = make_pair(provider)
    p.t.buf[:64] = b"\x01" * 64
    big = torch.zeros(64, dtype=torch.uint8)
    part = big[16:32]  # a contiguous slice shares big's storage
    p.i.qp.read_into(part, p.i.peer.slice(0, 16))
    assert big[16:32].tolist() == [1] * 16 and big[:16].sum().item() == 0
    w = torch.zeros(4, requires_grad=True)
    mr = p.i.pd.register_memory(w, Access.local_write)
    assert mr.addr == w.data_ptr()
    with pytest.raises(conveyor.InvalidArgument):
        p.i.pd.register_memory(torch.zeros(4, 4).t(), Access.local_write)  # not contiguous


def test_batch_into_one_array(provider):
    p = make_pair(provider)
    p.t.buf[:] = np.random.default_rng(1).integers(0, 256, len(p.t.buf), dtype=np.uint8).tobytes()
    dst = np.zeros(16 * 512, dtype=np.uint8)
    mr = p.i.pd.register_memory(dst, Access.local_write)
    wrs = [SendWr(WrOpcode.rdma_read, local=(mr, k * 512, 512), remote=p.i.peer.slice((15 - k) * 512, 512), wr_id=k)
           for k in range(16)]
    p.i.qp.post_send(wrs)
    wait_for(p.i.cq, 16)
    for k in range(16):
        assert dst[k * 512:(k + 1) * 512].tobytes() == bytes(p.t.buf[(15 - k) * 512:(16 - k) * 512])
