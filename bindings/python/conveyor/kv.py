"""conveyor-kv's client: one-sided GETs and hash reads, write RPCs.

    import conveyor.kv
    with conveyor.kv.Client.connect("127.0.0.1:7380") as c:   # kv serve --rdma-listen
        c.set("greeting", "hello")                            # an RPC
        c.get("greeting")                                     # b'hello', by one-sided READs
        c.hgetall("user:1")                                   # {b'name': b'ada', ...}

GET, MGET, HGET, HMGET and HGETALL never involve a server thread: the first
read of a key READs its bucket groups then its item; later reads are one READ
of the item, accepted only while it is still the key's current value
(docs/KV.md, "One READ"). `stats()` counts them. Keys, fields and values are
bytes or str (UTF-8); values come back as bytes. Errors raise
conveyor.ConveyorError subclasses (a wrong type: Rejected, with Redis's
WRONGTYPE text). One call at a time per client; the GIL is released while it
waits.

`ClusterClient.connect(address)` takes any node of a cluster (kv serve
--cluster --rdma-listen) and sends each key to its slot's primary
(docs/KV-CLUSTER.md, "One-sided clients in a cluster").
"""

from ._conveyor import kv as _kv

Client = _kv.Client
ClusterClient = _kv.ClusterClient

__all__ = ["Client", "ClusterClient"]
