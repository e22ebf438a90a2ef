"""Knowing that the client went away, without a task per request.

While a request waits on the upstream, or relays its streamed answer, a client
that disconnects must cancel that work: the upstream stops generating and its
connection is released.  Starlette's ``StreamingResponse`` learns of it from a
second task per response that waits on ``receive()``; here the server tells us:
prefixpin's protocol (proxy.server) calls the request's registered callback from
``connection_lost``, and that cancels the request's own task, but only inside
an armed region (``with watch:``), where :class:`ClientGone` comes out instead
of the cancellation.

Under another ASGI server (in-process tests) the scope has no such extension:
a watcher task on ``receive()`` does the same, started on the first arming.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from starlette.types import Receive, Scope

# scope["extensions"][WATCH](callback): call it when the client leaves; it returns the task
# that serves the request (None: the one running, looked up here)
WATCH = "prefixpin.watch"


class ClientGone(Exception):
    """The client disconnected while the request waited or streamed."""


class ClientWatch:
    """One request's client: ``with watch:`` turns its disconnect into ClientGone."""

    __slots__ = ("_cancelled", "_receive", "_task", "_watcher", "armed", "gone")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self._receive: Receive | None = receive
        self._watcher: asyncio.Task[None] | None = None
        self._cancelled = False
        self.armed = False
        self.gone = False
        task = None
        register = (scope.get("extensions") or {}).get(WATCH)
        if register is not None:
            task = register(self._left)
            self._receive = None  # the server tells us: no watcher needed
        # (asyncio.current_task() asks the kernel for the process id on every call: the
        # server says which task it is when it can)
        self._task = task if task is not None else asyncio.current_task()

    def _left(self) -> None:
        self.gone = True
        if self.armed and not self._cancelled and self._task is not None:
            self._cancelled = True
            self._task.cancel()

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._left()

    def __enter__(self) -> ClientWatch:
        if self.gone:
            raise ClientGone
        if self._receive is not None and self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch(self._receive))
        self.armed = True
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.armed = False
        if self._cancelled:  # ours (the client left), whatever the wait made of the cancellation
            self._cancelled = False
            if self._task is not None:
                self._task.uncancel()
            raise ClientGone from None

    def close(self) -> None:
        """The request is over: stop the fallback watcher, if one runs."""
        self.armed = False
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None


__all__ = ["WATCH", "ClientGone", "ClientWatch"]
