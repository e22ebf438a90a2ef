"""The cap on open upstream connections (``upstream.max_connections``), over every origin.

A connection holds a *slot* from the moment it is opened until it is closed, idle
in a pool included.  A request that finds no slot waits, first come first
served, up to its pool timeout.  A slot never sits unused while someone waits:

- a closed connection's slot goes straight to the first waiter (:meth:`Cap.give`);
- a connection released while requests wait goes, with its slot, to a waiter for
  the same origin (:meth:`Cap.hand`), or is closed so its slot goes to one for
  another origin (the caller's choice, :attr:`Cap.waiting`);
- a request that finds no slot first closes an idle connection to any origin
  (``evict``) before it waits;
- a waiter woken just as its time ran out keeps what it was given (the wake-up is
  not lost), and one cancelled then passes it on.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from proxy.errors import UpstreamTimeout

C = TypeVar("C")


class Cap(Generic[C]):
    """Slots for at most ``limit`` connections (0: no cap); ``C`` is the connection type."""

    def __init__(self, limit: int, close: Callable[[C], None]) -> None:
        """``close(conn)``: close a connection nobody took (its slot is then given back)."""
        self.limit = limit
        self.open = 0
        self._close = close
        self._waiters: deque[tuple[object, asyncio.Future[C | None]]] = deque()

    @property
    def waiting(self) -> bool:
        return any(not f.done() for _, f in self._waiters)

    async def take(self, key: object, timeout: float | None, evict: Callable[[], bool]) -> C | None:
        """A slot for a connection to ``key`` (an origin): None, open a connection with
        it; or a connection to ``key`` handed over with its slot.  ``evict()`` closes an
        idle connection (its slot freed by :meth:`give`) and says whether it did.
        UpstreamTimeout after ``timeout`` seconds."""
        if self.limit <= 0 or self.open < self.limit or (evict() and self.open < self.limit):
            self.open += 1
            return None
        fut: asyncio.Future[C | None] = asyncio.get_running_loop().create_future()
        entry = (key, fut)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except BaseException as exc:
            if not fut.done() or fut.cancelled():
                if isinstance(exc, TimeoutError):
                    raise UpstreamTimeout("prefixpin timed out waiting for a free connection to the upstream") from None
                raise
            if isinstance(exc, TimeoutError):
                return fut.result()  # woken as the time ran out: it is ours
            got = fut.result()  # cancelled once woken: what it was given goes on
            if got is not None:
                self._close(got)
            self.give()
            raise
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)

    def give(self) -> None:
        """A connection was closed: its slot goes to the first waiter, or is freed."""
        while self._waiters:
            _, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot changes hands: the count stays
                return
        self.open -= 1

    def hand(self, key: object, conn: C) -> bool:
        """Hand ``conn`` (to ``key``, with its slot) to the first waiter for ``key``."""
        for entry in self._waiters:
            k, fut = entry
            if k == key and not fut.done():
                self._waiters.remove(entry)
                fut.set_result(conn)
                return True
        return False


__all__ = ["Cap"]
