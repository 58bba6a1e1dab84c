"""asyncio support: CQ waits on the event loop, connect/accept off it.

``await cq.wait_async()`` polls the CQ; when it is empty it arms the CQ and
waits for its descriptor (``cq.fd()``) with ``loop.add_reader``, so one event
loop thread serves any number of CQs and QPs without blocking.

The connection manager's calls block (TCP connect, MPA handshake), so the
async forms run each on a thread of its own (they release the GIL, so the
loop keeps running meanwhile). Not the loop's default executor: its few
workers could all be connects waiting for accepts queued behind them.
"""

import asyncio
import threading

from . import _conveyor


class _CqWaiter:
    """The futures of every coroutine waiting on one CQ in one loop.

    add_reader allows one callback per descriptor: the first waiter installs
    it, and the callback wakes every waiter and removes itself.
    """

    __slots__ = ("loop", "fd", "futures")

    def __init__(self, loop, fd):
        self.loop = loop
        self.fd = fd
        self.futures = []

    def wait(self):
        fut = self.loop.create_future()
        if not self.futures:
            self.loop.add_reader(self.fd, self._ready)
        self.futures.append(fut)
        return fut

    def _ready(self):
        self.loop.remove_reader(self.fd)
        futures, self.futures = self.futures, []
        for f in futures:
            if not f.done():
                f.set_result(None)

    def cancel(self, fut):
        if fut in self.futures:
            self.futures.remove(fut)
            if not self.futures:
                self.loop.remove_reader(self.fd)


# (id(loop), fd) -> _CqWaiter; an entry lives while someone waits.
_waiters = {}


async def cq_wait_async(cq, timeout=None, max_entries=16):
    """Waits on the event loop until `cq` has completions; returns them (a list).

    Raises TimedOut after `timeout` seconds (None: no bound). The same
    arguments, in the same order, as CompletionQueue.wait().
    """
    wcs = cq.poll(max_entries)
    if wcs:
        return wcs
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    fd = cq.fd()
    key = (id(loop), fd)
    while True:
        cq.arm()
        wcs = cq.poll(max_entries)  # what arrived before arm() does not signal
        if wcs:
            return wcs
        waiter = _waiters.get(key)
        if waiter is None:
            waiter = _waiters[key] = _CqWaiter(loop, fd)
        fut = waiter.wait()
        try:
            if deadline is None:
                await fut
            else:
                left = deadline - loop.time()
                if left <= 0:
                    raise asyncio.TimeoutError
                await asyncio.wait_for(asyncio.shield(fut), left)
        except (asyncio.TimeoutError, asyncio.CancelledError) as e:
            waiter.cancel(fut)
            if not waiter.futures and _waiters.get(key) is waiter:
                del _waiters[key]
            if isinstance(e, asyncio.CancelledError):
                raise
            err = _conveyor_error("TimedOut", "CompletionQueue.wait_async: no completion within the timeout")
            raise err from None
        finally:
            if not waiter.futures and _waiters.get(key) is waiter:
                del _waiters[key]
        wcs = cq.poll(max_entries)
        if wcs:
            return wcs


def _conveyor_error(name, context):
    from . import _errors

    cls = getattr(_errors, name)
    err = cls(context)
    err.code = _conveyor.ErrorCode.timed_out
    err.context = context
    return err


def _in_thread(fn, *args):
    """Runs fn(*args) on a new daemon thread; a future of the loop gets its outcome."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def settle(ok, value):
        if not fut.done():
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    def run():
        try:
            value = fn(*args)
        except BaseException as e:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, False, e)
        else:
            loop.call_soon_threadsafe(settle, True, value)

    threading.Thread(target=run, name="conveyor-async", daemon=True).start()
    return fut


async def connect_async(qp, address, private_data=None, timeout=5.0):
    """connect() without blocking the event loop; returns the ConnectionInfo."""
    return await _in_thread(_conveyor.connect, qp, address, private_data, timeout)


async def listener_accept_async(listener, timeout=5.0):
    """Listener.accept() without blocking the event loop; returns the ConnectRequest."""
    return await _in_thread(listener.accept, timeout)


async def request_accept_async(request, qp, private_data=None):
    """ConnectRequest.accept() without blocking the event loop; returns the ConnectionInfo."""
    return await _in_thread(request.accept, qp, private_data)
