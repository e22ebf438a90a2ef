"""The counting hooks (``when = "counted"``: measure, the provider caches' cost
and verdicts, trace), off the request's path: one queue, consumed by one task.

A finished request is queued (:meth:`Counting.put`); the task counts what is
queued, in the order the responses ended, at the first good moment: when a
request goes to its upstream while no other waits on one (the handler calls
:meth:`kick`: the loop has nothing else to do until the answer comes), or
within ``DRAIN_S``.  So the counting of one response never delays the
client's next request at one connection, and under load it runs in batches
(one wake-up of the task per ``DRAIN_S``, not one per request).  ``/metrics``
waits until everything queued before it is counted (:meth:`flushed`); shutdown
counts what is left (:meth:`close`).  A request's duration ends with its
response, not with its counting (``Answer.ended``).

The queue is bounded (``MAX_PENDING`` flows, each holding its request's body and
parse until counted).  The task takes the whole queue at each wake-up, so it holds
what ended within ``DRAIN_S`` (a few flows at thousands of requests per second);
only a counting hook that waits (a hook may return what to await) can hold it
longer.  A flow that finds the queue full is not counted: ``dropped`` is called
(``prefixpin_fail_open_total{stage="counting"}``), a warning logged now and then,
and its response is what it was.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from proxy.flow import Flow
from proxy.throttle import Throttle, more

log = logging.getLogger("prefixpin")

DRAIN_S = 0.005  # the longest the counting waits when no request goes upstream alone first
MAX_PENDING = 1024  # flows queued at most (module docstring)
WARN_EVERY_S = 60.0  # a full queue's warning, at most this often


class Counting:
    """One queue, one task (module docstring).  ``run(hooks, flow)`` runs the hooks, each
    failing open."""

    def __init__(
        self,
        hooks: tuple[Any, ...],
        run: Callable[[tuple[Any, ...], Flow], Awaitable[None]],
        dropped: Callable[[], None] = lambda: None,
        *,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.hooks = hooks
        self._run = run
        self._dropped = dropped
        self.max_pending = max_pending
        self._warn = Throttle(WARN_EVERY_S)
        self.pending: list[Flow] = []
        self._go: asyncio.Future[None] | None = None  # set to wake the task
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the task's (an app served again runs on another)
        self._waiting: list[asyncio.Future[None]] = []  # flushed() calls, answered once the queue is empty

    def put(self, flow: Flow) -> None:
        """Queue ``flow``'s counting."""
        if not self.hooks:
            return
        if len(self.pending) >= self.max_pending:
            self._drop()
            return
        self.pending.append(flow)
        if self._timer is None:  # (the loop looked up once per batch: each lookup is a getpid() call)
            self._timer = self._here().call_later(DRAIN_S, self.kick)

    def _drop(self) -> None:
        """A flow not counted: the queue is full (a counting hook waits)."""
        self._dropped()
        if self._warn.allow(time.monotonic()):
            log.warning(
                "the counting queue is full (%d responses wait behind a counting hook): "
                'a response is served but not counted (prefixpin_fail_open_total{stage="counting"})%s',
                len(self.pending),
                more(self._warn.take_held(), "not counted"),
            )

    def kick(self) -> None:
        """A good moment to count: now (the task runs at the loop's next turn)."""
        loop = self._here()
        if not self.pending and not self._waiting:
            return
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._consume())
        go = self._go
        if go is None:
            self._go = go = loop.create_future()
        if not go.done():
            go.set_result(None)

    def _here(self) -> asyncio.AbstractEventLoop:
        """The running loop; on another than before (an app served again), afresh."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._timer, self._task, self._go = loop, None, None, None
        return loop

    async def flushed(self) -> None:
        """Until every request queued so far is counted."""
        if not self.pending:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self.kick()
        await waiter

    async def close(self) -> None:
        """Count what is queued; stop the task."""
        await self.flushed()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            go = self._go
            if go is None:  # (one set already, by a kick before this task ran, wakes it at once)
                go = self._go = loop.create_future()
            await go
            self._go = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            while self.pending:
                await self._count()
            waiting, self._waiting = self._waiting, []
            for waiter in waiting:
                if not waiter.done():
                    waiter.set_result(None)

    async def _count(self) -> None:
        """Count what is queued now, in order.  Each flow (its parse among what it holds)
        is freed once counted, not kept until the task wakes again."""
        pending, self.pending = self.pending, []
        pending.reverse()
        hooks, run = self.hooks, self._run
        while pending:  # each flow freed as soon as it is counted
            await run(hooks, pending.pop())


__all__ = ["DRAIN_S", "MAX_PENDING", "Counting"]
