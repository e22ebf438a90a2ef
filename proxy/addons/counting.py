"""The counting hooks (``when = "counted"``: measure, the provider caches' cost
and verdicts, trace): the one place a finished request is counted.

:meth:`Counting.count` runs them in the request's own task, right after its last
byte and the hooks of that moment (:meth:`proxy.addons.Runner.after_last`): the
client already has its whole response, and the request's memory is still warm.
That is measured: handing the finished requests to one task that drained a queue
(at the next request to go upstream, or within 5 ms) made a continuing 45 KB
session's request 10-20% dearer end to end (``python3 -m
benchmarks.bench_overhead``): the requests were freed later, cold, in batches.
``/metrics`` waits until the requests being counted are (:meth:`flushed`),
and so does shutdown (:meth:`close`).  A request's duration ends with its
response, not with its counting (``Answer.ended``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from proxy.flow import Flow


class Counting:
    """The counting hooks and the requests being counted (module docstring).
    ``run(hooks, flow)`` runs the hooks, each failing open."""

    def __init__(self, hooks: tuple[Any, ...], run: Callable[[tuple[Any, ...], Flow], Awaitable[None]]) -> None:
        self.hooks = hooks
        self._run = run
        self.busy = 0  # requests being counted (a hook that awaits something keeps it above 0)
        self._waiting: list[asyncio.Future[None]] = []  # flushed() calls, answered when busy is 0

    async def count(self, flow: Flow) -> None:
        """Count ``flow`` now."""
        if not self.hooks:
            return
        self.busy += 1
        try:
            await self._run(self.hooks, flow)
        finally:
            self.busy -= 1
            if not self.busy and self._waiting:
                waiting, self._waiting = self._waiting, []
                for waiter in waiting:
                    if not waiter.done():
                        waiter.set_result(None)

    async def flushed(self) -> None:
        """Until no request is being counted."""
        if not self.busy:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        await waiter

    async def close(self) -> None:
        """Shutdown: until the requests being counted are."""
        await self.flushed()


__all__ = ["Counting"]
