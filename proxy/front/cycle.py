"""One request and its response on a client connection, as ASGI sees it.

The connection (:mod:`proxy.front.connection`) hands a :class:`Cycle` a request
whose head and whole body have arrived; the cycle runs the ASGI app on it and
writes what the app sends:

- ``receive()`` returns the whole body in one message, then waits until the
  client leaves (``http.disconnect``).
- ``send()``: the response head is held until the first body message, so a
  whole response goes out in one write (one wake-up of the client, not two).
  A body without ``content-length`` is chunked (close-delimited for an HTTP/1.0
  client); a response to ``HEAD``, a 1xx, 204 or 304 has none.
- Every response carries ``date`` (the app's own, or the server's), once.
- ``send()`` waits while the client's connection is not draining what was
  written (the transport's ``pause_writing``): a client that reads slowly holds
  at most the transport's buffer and one body message here, and the app (the
  relay) reads no more from the upstream meanwhile.
- An app that fails before its response started gets a 500; after, the
  connection is aborted (no terminating chunk), which is how a client learns
  that a body was cut.
- :meth:`Cycle.cut` ends what the app has not finished when the server stops
  (a stream with an error event, an unanswered request with a 503).
- ``scope["extensions"]["prefixpin.watch"](callback)`` registers a callback
  called once if the client's connection is lost (at once if it already is):
  :mod:`proxy.watch` turns it into the cancellation of the request's waits.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from itertools import chain
from typing import Any, Protocol

from starlette.types import ASGIApp, Message, Scope

from proxy.responses import REASONS, failure, http_date
from proxy.watch import WATCH

log = logging.getLogger("prefixpin")
_NO_BODY = frozenset({204, 304})
_UNSAFE = re.compile(rb"[\r\n\0]")  # a header line break, or a NUL
_EVENT_END = (b"\n\n", b"\r\n\r\n", b"\r\r")


class Conn(Protocol):
    """What a cycle needs of its client connection (:class:`proxy.front.connection.Connection`)."""

    @property
    def write_paused(self) -> bool:
        """The client does not drain what was written."""

    def write(self, data: bytes) -> None: ...

    async def drained(self) -> None:
        """Until the client has read enough of what was written (or is gone)."""

    def abort(self) -> None: ...

    def cycle_done(self, cycle: Cycle) -> None:
        """The app has returned: the next request, or the end of the connection."""


class Cycle:
    """One request/response; :meth:`run` serves it with an ASGI app."""

    __slots__ = (
        "_gone",
        "_head",
        "_watch",
        "body",
        "chunked",
        "complete",
        "conn",
        "discard",
        "keep_alive",
        "lost",
        "remaining",
        "scope",
        "sse",
        "started",
        "status",
        "tail",
    )

    def __init__(self, conn: Conn, scope: Scope, body: bytes, *, keep_alive: bool) -> None:
        self.conn = conn
        self.scope = scope
        self.body: bytes | None = body
        self.keep_alive = keep_alive
        self.started = False
        self.complete = False
        self.status = 0
        self.lost = False
        self.chunked = False
        self.discard = False  # HEAD, 1xx, 204, 304: no body goes out
        self.remaining = -1  # content-length still to send (-1: not framed by a length)
        self.sse = False  # the response is an event stream
        self.tail = b""  # the last body bytes sent (does the stream stand between two events?)
        self._head: bytes | None = None  # held until the first body message
        self._gone: asyncio.Future[None] | None = None
        # The hook in the scope is its own object: a bound method of the cycle there
        # would be a cycle (scope -> hook -> cycle -> scope), each request's scope left
        # to the garbage collector, whose passes stall the event loop.
        self._watch = _Watch()
        scope["extensions"] = {WATCH: self._watch}

    def serving(self, task: asyncio.Task[None]) -> None:
        """``task`` runs the app for this request (the one a client that leaves cancels)."""
        self._watch.task = task

    # -- the client -------------------------------------------------------------------
    def connection_lost(self) -> None:
        self.lost = True
        gone = self._gone
        if gone is not None and not gone.done():
            gone.set_result(None)
        self._watch.lost()

    async def receive(self) -> Message:
        body, self.body = self.body, None
        if body is not None:
            return {"type": "http.request", "body": body, "more_body": False}
        if not self.lost:
            if self._gone is None:
                self._gone = asyncio.get_running_loop().create_future()
            await self._gone
        return {"type": "http.disconnect"}

    # -- serving ----------------------------------------------------------------------
    async def run(self, app: ASGIApp) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            self.keep_alive = False  # whatever it had sent: no next request on this connection
            if not self.started:
                log.error("the app failed before answering %s", self.scope.get("path"), exc_info=exc)
                self._fail()
            elif not self.complete:
                self.conn.abort()  # the body is cut: the client must be able to tell
            if not isinstance(exc, Exception):
                raise
        else:
            if not self.complete and not self.lost:
                if not self.started:
                    log.error("the app returned without answering %s", self.scope.get("path"))
                    self._fail()
                else:
                    self.conn.abort()
        finally:
            self.conn.cycle_done(self)

    def _fail(self) -> None:
        self.keep_alive = False
        self.status = 500
        self.conn.write(failure())
        self.complete = True

    def cut(self, event: bytes, refusal: bytes) -> str:
        """End what the app has not finished (the server stops): an event stream with
        ``event`` and its last chunk, a request not yet answered with ``refusal`` (a
        whole response); anything else is aborted.  Says what was done, for the log."""
        if self.complete:
            return "complete"
        self.complete = True
        self.keep_alive = False
        if not self.started:
            self.status = 503
            self.conn.write(refusal)
            return "answered 503"
        head, self._head = self._head, None
        if self.sse and self.chunked:
            if not self.tail.endswith(_EVENT_END) and self.tail:
                event = b"\n\n" + event  # end the event the stream is in the middle of
            self.conn.write((head or b"") + b"%x\r\n%b\r\n0\r\n\r\n" % (len(event), event))
            return "stream ended with an error event"
        self.conn.abort()
        return "response cut"

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("the response had started already")
            self.started = True
            self._start(message["status"], message.get("headers", ()))
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if not self.started or self.complete:
            raise RuntimeError("a response body sent before its start or after its end")
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        if self.lost:
            if not more:
                self.complete = True
            return
        out = self._frame(body, more)
        head, self._head = self._head, None
        if head is not None:
            out = head + out
        if body:
            self.tail = body
        if not more:
            self.complete = True
        if out:
            conn = self.conn
            conn.write(out)
            if conn.write_paused:  # the client is not reading: wait until it drains
                await conn.drained()

    def _start(self, status: int, headers: Any) -> None:
        self.status = status
        parts = [b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, b""))]
        length: int | None = None
        dated = False
        headers = list(headers)
        # Every name and value in one C scan (a space joins them: no separator is flagged).
        if _UNSAFE.search(b" ".join(chain.from_iterable(headers))):
            raise RuntimeError("a response header holds a line break")
        for name, value in headers:
            name = name.lower()
            if name == b"content-length":
                length = int(value)
                continue  # written below, once
            if name in (b"transfer-encoding", b"connection"):
                if name == b"connection" and b"close" in value.lower():
                    self.keep_alive = False
                continue  # the framing and the connection are ours to write, below
            if name == b"date":
                if dated:
                    continue  # once
                dated = True
            elif name == b"content-type" and value.startswith(b"text/event-stream"):
                self.sse = True
            parts += (name, b": ", value, b"\r\n")
        if not dated:
            parts += (b"date: ", http_date(), b"\r\n")
        self.discard = self.scope["method"] == "HEAD" or status < 200 or status in _NO_BODY
        if length is not None:
            parts.append(b"content-length: %d\r\n" % length)
            self.remaining = length
        elif not self.discard:
            if self.scope["http_version"] == "1.1":
                self.chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
            else:  # HTTP/1.0 has no chunks: the body ends with the connection
                self.keep_alive = False
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        self._head = b"".join(parts)

    def _frame(self, body: bytes, more: bool) -> bytes:
        if self.discard:
            return b""
        if self.chunked:
            if body:
                return b"%x\r\n%b\r\n%b" % (len(body), body, b"" if more else b"0\r\n\r\n")
            return b"" if more else b"0\r\n\r\n"
        if self.remaining >= 0:
            if len(body) > self.remaining:
                raise RuntimeError("the response body is longer than its content-length")
            self.remaining -= len(body)
            if not more and self.remaining:
                raise RuntimeError("the response body is shorter than its content-length")
        return body


class _Watch:
    """``scope["extensions"]["prefixpin.watch"]``: registers the callback to call once
    when the client's connection is lost (at once if it already is), and says which
    task serves the request (the one to cancel)."""

    __slots__ = ("gone", "on_lost", "task")

    def __init__(self) -> None:
        self.gone = False
        self.on_lost: Callable[[], None] | None = None
        self.task: asyncio.Task[None] | None = None

    def __call__(self, on_lost: Callable[[], None]) -> asyncio.Task[None] | None:
        if self.gone:
            on_lost()
        else:
            self.on_lost = on_lost
        return self.task

    def lost(self) -> None:
        self.gone = True
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            on_lost()


__all__ = ["Conn", "Cycle"]
