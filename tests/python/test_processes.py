"""Two processes: a target (peer.py) and this one, over soft and shm. 1 MiB
READ and WRITE verified byte for byte on both sides."""

import os
import subprocess
import sys

import numpy as np

import conveyor
from conveyor import Access
from peer import pattern

HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = 1 << 20


def test_read_write_across_processes(provider):
    seed = int.from_bytes(os.urandom(4), "little")
    child = subprocess.Popen([sys.executable, os.path.join(HERE, "peer.py"), provider,
                              "", str(SIZE), str(seed)],  # "": an ephemeral address
                             stdout=subprocess.PIPE, text=True)
    try:
        address = child.stdout.readline().strip()
        assert address, "the target printed no address"
        dev = conveyor.Device.open(provider)
        pd = dev.alloc_pd()
        cq = dev.create_cq(64)
        qp = pd.create_qp(cq)
        info = conveyor.connect(qp, address, private_data=b"hello target", timeout=10.0)
        peer = conveyor.RemoteRegion.decode(info.private_data)
        assert peer.length == 2 * SIZE

        sink = np.zeros(SIZE, dtype=np.uint8)  # READ straight into a numpy array
        qp.read_into(sink, peer.slice(0, SIZE), timeout=10.0)
        assert sink.tobytes() == pattern(SIZE, seed)

        src = pattern(SIZE, seed + 1)
        qp.write_from(src, peer.slice(SIZE, SIZE), timeout=10.0)
        # the target checks the written half and answers
        reply = bytearray(64)
        rmr = pd.register_memory(reply, Access.local_write)
        qp.post_recv(rmr, 7)
        done = pd.register_memory(bytearray(b"done"), Access.local_write)
        qp.post_send_msg(done, 8)
        got = {}
        while len(got) < 2:
            for wc in cq.wait(10.0):
                got[wc.wr_id] = wc
        assert got[8].ok and got[7].ok
        assert bytes(reply[: got[7].byte_len]) == b"verified"
        assert child.wait(timeout=20) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
