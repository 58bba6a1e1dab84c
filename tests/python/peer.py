"""The target process of test_processes.py: registers a pattern with every
right, listens, prints its address, serves one initiator, then checks what the
initiator wrote and says so over a SEND.

    python3 peer.py <provider> <address> <size> <seed>

<address> "" listens at an ephemeral address the provider picks.
"""

import random
import sys

import conveyor


def pattern(size, seed):
    return random.Random(seed).randbytes(size)


def main():
    provider, address, size, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    dev = conveyor.Device.open(provider)
    pd = dev.alloc_pd()
    cq = dev.create_cq(64)
    shelf = bytearray(pattern(size, seed)) + bytearray(size)  # READ half, WRITE half
    mr = pd.register_memory(shelf, conveyor.ALL_ACCESS)
    msg = bytearray(64)
    msg_mr = pd.register_memory(msg, conveyor.Access.local_write)
    lis = conveyor.Listener.bind(dev, address or None)
    print(lis.address, flush=True)
    qp = pd.create_qp(cq)
    qp.post_recv(msg_mr, 1)
    req = lis.accept(20.0)
    assert req.private_data == b"hello target", req.private_data
    req.accept(qp, mr.remote().encode())
    (wc,) = cq.wait(20.0, 1)  # the initiator's "done"
    assert wc.ok and wc.opcode == conveyor.WcOpcode.recv and bytes(msg[: wc.byte_len]) == b"done", wc
    ok = shelf[size:] == pattern(size, seed + 1)
    reply = bytearray(b"verified" if ok else b"mismatch")
    rmr = pd.register_memory(reply, conveyor.Access.local_write)
    qp.post_send_msg(rmr, 2)
    (wc,) = cq.wait(20.0, 1)
    assert wc.ok, wc
    qp.disconnect()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
