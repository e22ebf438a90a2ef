"""What uvicorn's HTTP server does not do for us: a header deadline and an abort.

- **Header deadline.** uvicorn times out idle keep-alive connections but not a
  client that connects and then sends its request line and headers slowly (or
  not at all): each such socket costs a connection forever.  ``protocol(s)``
  returns uvicorn's httptools protocol with a timer, armed when a connection
  opens and when a request begins, disarmed when its headers are complete.  When
  it fires, a request that had begun gets ``408`` and the connection closes.
- **Abort.** ASGI has no way to end a response *without* its terminating chunk,
  yet that is how a proxy tells its client that the upstream cut the body.  The
  protocol puts ``scope["extensions"]["prefixpin.abort"]`` in each request's
  scope; ``CutStreams`` (an ASGI middleware) calls it when the app raises
  UpstreamStreamCut after the response started.
- **Disconnect.** ``scope["extensions"]["prefixpin.watch"](callback)`` registers
  the request's callback, called when the client's connection is lost (at once
  if it is already): proxy.watch turns it into the cancellation of the request's
  own waits, with no second task per request listening on ``receive()``.
- **One write per whole response.** uvicorn writes a response's head as soon as
  it is sent, then its body: two sends, two wake-ups of the client.
  ``scope["extensions"]["prefixpin.cork"](True)`` holds the request's writes,
  ``(False)`` sends what was held in one write; a handler that has the whole body
  corks around its two ``send`` calls.
- **Body in.** ``scope["extensions"]["prefixpin.body_in"]()`` tells whether the
  request's whole body has arrived: reading it then needs no deadline (the usual
  case, which saves arming one per request).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.errors import UpstreamStreamCut
from proxy.watch import WATCH

log = logging.getLogger("prefixpin")
ABORT = "prefixpin.abort"
CORK = "prefixpin.cork"
BODY_IN = "prefixpin.body_in"
_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header read deadline and an abort hook."""

    header_timeout_s: float = 60.0
    _header_timer: asyncio.TimerHandle | None = None
    _begun = False
    _lost = False
    _on_lost: Callable[[], None] | None = None  # the current request's (one at a time: uvicorn runs them in turn)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._lost = True
        super().connection_lost(exc)
        on_lost, self._on_lost = self._on_lost, None
        if on_lost is not None:
            on_lost()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begun = True
        scope = self.scope
        hooks: dict[str, Any] = {
            ABORT: lambda: self._abort(scope),
            WATCH: self._watch,
            CORK: self._cork,
            BODY_IN: self._body_in,
        }
        self.scope["extensions"] = hooks
        if self._header_timer is None:
            self._arm()

    def on_response_complete(self) -> None:
        self._on_lost = None  # that request is answered; a pipelined next one starts only now
        super().on_response_complete()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._begun = False
        super().on_headers_complete()

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._on_header_timeout)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        idle = self.cycle is None or self.cycle.response_complete
        if self._begun and idle:  # not in the middle of another response (pipelining)
            self.transport.write(_408)
        log.info("closing a connection whose request headers took over %.0f s", self.header_timeout_s)
        self.transport.close()

    def _watch(self, on_lost: Callable[[], None]) -> None:
        if self._lost:
            on_lost()
        else:
            self._on_lost = on_lost

    def _body_in(self) -> bool:
        """Has the current request's whole body arrived (so ``receive()`` will not wait)?"""
        cycle = self.cycle
        return cycle is not None and not cycle.more_body

    def _cork(self, hold: bool) -> None:
        cycle = self.cycle
        if cycle is None:
            return
        held = cycle.transport
        if hold:
            if not isinstance(held, _Held):
                cycle.transport = _Held(held)  # type: ignore[assignment]
        elif isinstance(held, _Held):
            cycle.transport = held.transport
            held.flush()

    def _abort(self, scope: object) -> None:
        cycle = self.cycle
        if cycle is not None and cycle.scope is scope:
            # Ended on purpose: uvicorn must not report an app that "returned without
            # completing response" (connection_lost, which says so, comes a bit later).
            cycle.disconnected = True
        if not self.transport.is_closing():
            self.transport.abort()


class _Held:
    """A transport whose writes wait for :meth:`flush` (or a close), then go in one."""

    __slots__ = ("parts", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def flush(self) -> None:
        parts, self.parts = self.parts, []
        if parts and not self.transport.is_closing():
            self.transport.write(parts[0] if len(parts) == 1 else b"".join(parts))

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def protocol(header_timeout_s: float) -> type[DeadlineProtocol]:
    """The protocol class to pass as uvicorn's ``http=``."""
    return type("DeadlineProtocol", (DeadlineProtocol,), {"header_timeout_s": header_timeout_s})


class CutStreams:
    """ASGI middleware: a response body the upstream cut is cut for the client too
    (the connection is aborted before the terminating chunk) and counted."""

    def __init__(self, app: ASGIApp, *, on_cut: Callable[[UpstreamStreamCut], None]) -> None:
        self.app = app
        self.on_cut = on_cut

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except UpstreamStreamCut as exc:  # raised only while a body streams: the response started
            self.on_cut(exc)
            abort: Any = scope.get("extensions", {}).get(ABORT)
            if abort is None:
                raise  # the server closes the connection (and logs the exception)
            abort()
