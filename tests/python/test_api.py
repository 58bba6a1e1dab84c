"""Devices, protection domains, memory registration, remote regions: the
control-path calls one by one, and the buffer protocol's rules."""

import gc
import mmap
import sys
import weakref

import numpy as np
import pytest
import torch

import conveyor
from conveyor import Access


def test_devices_lists_soft_and_shm():
    infos = conveyor.devices()
    names = {d.name: d for d in infos}
    assert names["soft"].available and names["soft"].provider == "soft"  # name check: the list itself
    assert names["shm"].available
    assert "soft" in repr(infos)


def test_device_open_and_attr(provider):
    dev = conveyor.Device.open(provider)
    assert dev.name == provider and dev.provider == provider
    a = dev.attr
    assert a.max_qp > 0 and a.max_sge > 0 and a.max_qp_wr > 0 and a.max_mr_size > 0
    assert isinstance(a.transport, conveyor.Transport)
    assert isinstance(a.ports, list)
    assert repr(dev) == "Device(name='%s', provider='%s')" % (provider, provider)


def test_device_open_options():
    dev = conveyor.Device.open("soft", progress=conveyor.ProgressMode.manual, spin_us=5, request_crc=False)
    assert dev.name == "soft"  # name check: open("soft") with options still names what it opened


def test_device_open_unknown_is_not_found():
    with pytest.raises(conveyor.NotFound) as e:
        conveyor.Device.open("no-such-device")
    assert e.value.code == conveyor.ErrorCode.not_found
    assert "no-such-device" in e.value.context
    assert isinstance(e.value, LookupError)


def test_cq_depth_and_bad_depth(provider):
    dev = conveyor.Device.open(provider)
    assert dev.create_cq(17).depth >= 17
    with pytest.raises(conveyor.InvalidArgument):
        dev.create_cq(0)


def test_register_bytearray_memoryview_mmap(provider):
    pd = conveyor.Device.open(provider).alloc_pd()
    b = bytearray(4096)
    mr = pd.register_memory(b, Access.local_write | Access.remote_read)
    assert len(mr) == mr.length == 4096 and mr.obj is b
    assert mr.rights == int(Access.local_write | Access.remote_read)
    assert mr.lkey != 0 or mr.rkey != 0
    mv = memoryview(bytearray(100))[10:90]  # a slice: its own address
    mr2 = pd.register_memory(mv, Access.local_write)
    assert mr2.length == 80
    m = mmap.mmap(-1, 8192)
    mr3 = pd.register_memory(m, Access.local_write | Access.remote_write)
    assert mr3.length == 8192
    for r in (mr, mr2, mr3):
        r.close()
        assert not r.registered
    m.close()  # possible again once the region let go of it


def test_region_addr_is_the_objects_own_memory(provider):
    pd = conveyor.Device.open(provider).alloc_pd()
    a = np.arange(1000, dtype=np.int64)
    mr = pd.register_memory(a, Access.local_write)
    assert mr.addr == a.ctypes.data and mr.length == a.nbytes
    t = torch.arange(100, dtype=torch.float32)
    tmr = pd.register_memory(t, Access.local_write)
    assert tmr.addr == t.data_ptr() and tmr.length == 400
    assert tmr.obj is t
    # region.memory aliases the registered bytes
    tmr.memory.cast("f")[3] = 42.0
    assert t[3].item() == 42.0


def test_read_only_buffer_refused_for_writing_rights(provider):
    pd = conveyor.Device.open(provider).alloc_pd()
    for rights in (Access.local_write, Access.local_write | Access.remote_write,
                   Access.local_write | Access.remote_atomic):
        with pytest.raises(conveyor.InvalidArgument) as e:
            pd.register_memory(b"read only", rights)
        assert "read-only" in str(e.value)
    ro = np.zeros(16)
    ro.flags.writeable = False
    with pytest.raises(conveyor.InvalidArgument):
        pd.register_memory(ro, Access.local_write)
    # remote_read alone never writes: a read-only source is fine.
    mr = pd.register_memory(b"read only", Access.remote_read)
    assert mr.memory.readonly


def test_non_contiguous_and_non_buffer_refused(provider):
    pd = conveyor.Device.open(provider).alloc_pd()
    with pytest.raises(conveyor.InvalidArgument):
        pd.register_memory(np.zeros((8, 8))[:, 1], Access.local_write)
    with pytest.raises(TypeError):
        pd.register_memory("a str", Access.remote_read)
    with pytest.raises(TypeError):
        pd.register_memory(12345, Access.remote_read)


def test_region_keeps_the_object_alive(provider):
    pd = conveyor.Device.open(provider).alloc_pd()
    a = np.ones(1 << 16, dtype=np.uint8)
    alive = weakref.ref(a)
    mr = pd.register_memory(a, Access.local_write)
    del a
    gc.collect()
    assert alive() is not None, "the region must hold the registered array"
    assert mr.memory[0] == 1
    mr.close()
    gc.collect()
    assert alive() is None, "close() must release the array"


def test_region_collected_releases_the_object(provider):
    pd = conveyor.Device.open(provider).alloc_pd()
    b = bytearray(1024)
    base = sys.getrefcount(b)
    mr = pd.register_memory(b, Access.local_write)
    assert sys.getrefcount(b) > base
    del mr
    gc.collect()
    assert sys.getrefcount(b) == base


def test_registered_bytearray_cannot_be_resized(provider):
    pd = conveyor.Device.open(provider).alloc_pd()
    b = bytearray(1024)
    with pd.register_memory(b, Access.local_write) as mr:
        with pytest.raises(BufferError):
            b.extend(b"x" * 100000)  # would move the memory under the NIC
        assert mr.registered
    assert not mr.registered
    b.extend(b"x")  # fine once deregistered


def test_allocate_memory_is_a_writable_memoryview(provider):
    pd = conveyor.Device.open(provider).alloc_pd()
    mr = pd.allocate_memory(1 << 20, Access.local_write | Access.remote_read)
    assert mr.obj is None and mr.length == 1 << 20
    v = mr.memory
    assert not v.readonly and len(v) == 1 << 20 and v[0] == 0
    v[0:5] = b"hello"
    assert bytes(mr.memory[0:5]) == b"hello"
    arr = np.frombuffer(mr.memory, dtype=np.uint8)  # numpy over the region's own memory
    assert arr.ctypes.data == mr.addr
    with pytest.raises(BufferError):
        mr.close()  # views exist
    del v, arr
    gc.collect()
    mr.close()
    assert not mr.registered
    with pytest.raises(conveyor.InvalidState):
        mr.memory


def test_deregistered_region_raises(provider):
    pd = conveyor.Device.open(provider).alloc_pd()
    mr = pd.register_memory(bytearray(64), Access.local_write)
    mr.deregister()
    with pytest.raises(conveyor.InvalidState):
        mr.remote()
    with pytest.raises(conveyor.InvalidState):
        mr.sge()
    assert repr(mr) == "MemoryRegion(deregistered)"
    mr.close()  # idempotent


def test_sge_and_slices(provider):
    pd = conveyor.Device.open(provider).alloc_pd()
    mr = pd.register_memory(bytearray(4096), Access.local_write)
    s = mr.sge(100, 200)
    assert (s.addr, s.length, s.lkey) == (mr.addr + 100, 200, mr.lkey)
    assert mr.sge().length == 4096 and mr.sge(4000).length == 96
    with pytest.raises(conveyor.InvalidArgument):
        mr.sge(4000, 200)
    s2 = conveyor.Sge(addr=1, length=2, lkey=3)
    assert "lkey=3" in repr(s2)


def test_remote_region_encode_decode():
    r = conveyor.RemoteRegion(0x1122334455667788, 1 << 20, 0xABCDEF01)
    wire = r.encode()
    assert isinstance(wire, bytes) and len(wire) == conveyor.RemoteRegion.encoded_size == 28
    assert wire[:4] == b"CVRR"
    back = conveyor.RemoteRegion.decode(wire)
    assert back == r and hash(back) == hash(r)
    assert conveyor.RemoteRegion.decode(bytearray(wire)) == r
    assert conveyor.RemoteRegion.decode(memoryview(wire)) == r
    s = r.slice(16, 8)
    assert (s.addr, s.length, s.rkey) == (r.addr + 16, 8, r.rkey)
    with pytest.raises(conveyor.InvalidArgument):
        conveyor.RemoteRegion.decode(wire[:20])
    with pytest.raises(conveyor.InvalidArgument):
        conveyor.RemoteRegion.decode(b"XXXX" + wire[4:])
    with pytest.raises(TypeError):
        conveyor.RemoteRegion.decode(12)


def test_remote_of_a_region_matches(provider):
    pd = conveyor.Device.open(provider).alloc_pd()
    mr = pd.register_memory(bytearray(512), conveyor.ALL_ACCESS)
    r = mr.remote()
    assert (r.addr, r.length, r.rkey) == (mr.addr, 512, mr.rkey)


def test_create_qp_is_init_with_caps(provider):
    dev = conveyor.Device.open(provider)
    pd, cq = dev.alloc_pd(), dev.create_cq(64)
    rcq = dev.create_cq(64)
    with pd.create_qp(cq, rcq, max_send_wr=32, max_recv_wr=8, max_inline_data=64) as qp:
        assert qp.state == conveyor.QpState.init
        assert qp.caps.max_send_wr >= 32 and qp.caps.max_recv_wr >= 8
        assert qp.send_cq is cq and qp.recv_cq is rcq and qp.pd is pd
        assert qp.qp_num >= 0 and "INIT" in repr(qp).upper()
        with pytest.raises(conveyor.InvalidState):
            qp.connection()
        c = qp.counters()
        assert c.tx_bytes == 0
    assert qp.closed
    with pytest.raises(conveyor.InvalidState):
        qp.state


def test_version_and_enums():
    assert conveyor.__version__.count(".") == 2
    assert conveyor.WcStatus.rem_access_err.name == "rem_access_err" and int(conveyor.WcStatus.success) == 0
    assert int(Access.remote_atomic) == 8 and int(conveyor.SendFlags.fence) == 4
    assert conveyor.max_private_data == 251
