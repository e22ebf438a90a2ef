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
- **The hot route.** A POST to an exchange's path (chat completions, Messages,
  Responses) skips uvicorn's request cycle and the ASGI layers around the app: the
  protocol gathers the body itself and, once it is whole, starts one task that
  hands it to the app's ``serve`` (:class:`HotCycle`; the app says which paths
  with ``hot(path)``).  The task starts once, with the body, instead of waking up
  for each piece of it.  A body that is not whole within ``hot_wait_s``, or grows
  past ``hot_limit``, or a request that is pipelined behind another, or asks for
  ``100-continue``, goes the ordinary way (uvicorn's cycle, the body deadline,
  admission) with what has arrived so far.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import httptools
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from proxy.errors import UpstreamStreamCut
from proxy.watch import WATCH

log = logging.getLogger("prefixpin")
ABORT = "prefixpin.abort"
CORK = "prefixpin.cork"
BODY_IN = "prefixpin.body_in"
_SERIAL = "prefixpin.serial"
_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header read deadline and an abort hook."""

    header_timeout_s: float = 60.0
    _header_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None
    _begun = False
    _serial = 0  # requests begun on this connection
    _lost = False
    _on_lost: Callable[[], None] | None = None  # the current request's (one at a time: uvicorn runs them in turn)
    _front: Any = None  # the app, when it serves a hot route (proxy.app.Front)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        hot = getattr(self.app, "hot", None)
        self._front = self.app if callable(hot) else None
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._lost = True
        super().connection_lost(exc)
        on_lost, self._on_lost = self._on_lost, None
        if on_lost is not None:
            on_lost()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begun = True
        self._serial += 1
        # Nothing here refers to the scope (a closure over it would be a cycle through
        # its own "extensions": each request's scope and headers left for the garbage
        # collector, whose pass over them stalls the loop): the request is its number.
        hooks: dict[str, Any] = {
            _SERIAL: self._serial,
            ABORT: partial(self._abort, self._serial),
            WATCH: self._watch,
            CORK: self._cork,
            BODY_IN: self._body_in,
        }
        self.scope["extensions"] = hooks
        # The header deadline is armed by data_received, only when the headers did
        # not all come in the bytes that began the request (the usual case).

    def on_response_complete(self) -> None:
        self._on_lost = None  # that request is answered; a pipelined next one starts only now
        super().on_response_complete()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._begun = False
        front = self._front
        if (
            front is not None
            and self.limit_concurrency is None
            and not self.expect_100_continue
            and (self.cycle is None or self.cycle.response_complete)  # not pipelined behind another
            and self.parser.get_method() == b"POST"
            and not self.parser.should_upgrade()
        ):
            url = httptools.parse_url(self.url)
            raw_path: bytes = url.path
            if raw_path.isascii() and b"%" not in raw_path and not self.root_path:
                path = raw_path.decode("ascii")
                exchange = front.hot(path)
                if exchange is not None:
                    scope: Any = self.scope
                    scope["method"] = "POST"
                    version = self.parser.get_http_version()
                    if version != "1.1":
                        scope["http_version"] = version
                    scope["path"] = path
                    scope["raw_path"] = raw_path
                    scope["query_string"] = url.query or b""
                    keep_alive = version != "1.0" and self.parser.should_keep_alive()
                    self.cycle = HotCycle(self, front, scope, exchange, keep_alive)  # type: ignore[assignment]
                    return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        cycle: Any = self.cycle
        if type(cycle) is HotCycle and cycle.more_body:
            cycle.parts.append(body)
            cycle.size += len(body)
            if cycle.size > cycle.front.hot_limit:
                self._demote(cycle)
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        cycle: Any = self.cycle
        if type(cycle) is HotCycle and cycle.more_body:
            cycle.more_body = False
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None
            parts = cycle.parts
            body = parts[0] if len(parts) == 1 else b"".join(parts)
            cycle.parts = []
            task = self.loop.create_task(cycle.run(body))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)
            return
        super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._begun and self._header_timer is None and not self._lost:
            self._arm()  # a request whose headers are still on their way
        cycle: Any = self.cycle
        if type(cycle) is HotCycle and cycle.more_body and self._body_timer is None and not self._lost:
            # the rest of the body is on its way: if it takes long, the ordinary path
            # (with its body deadline) takes over
            self._body_timer = self.loop.call_later(cycle.front.hot_wait_s, self._demote, cycle)

    def _demote(self, cycle: HotCycle) -> None:
        """The request goes uvicorn's way after all, with the body read so far."""
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if self.cycle is not cycle or not cycle.more_body or self.transport.is_closing():  # type: ignore[comparison-overlap]
            return
        ordinary = RequestResponseCycle(
            scope=cycle.scope,  # type: ignore[arg-type]
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=cycle.keep_alive,
            on_response=self.on_response_complete,
        )
        ordinary.body = bytearray(b"".join(cycle.parts))
        cycle.parts = []
        cycle.more_body = False
        self.cycle = ordinary
        if len(ordinary.body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        self._start_asgi_task(ordinary, self.app)

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
        cycle: Any = self.cycle
        return cycle is not None and not cycle.more_body

    def _cork(self, hold: bool) -> None:
        cycle: Any = self.cycle
        if cycle is None:
            return
        held = cycle.transport
        if hold:
            if not isinstance(held, _Held):
                cycle.transport = _Held(held)
        elif isinstance(held, _Held):
            cycle.transport = held.transport
            held.flush()

    def _abort(self, serial: int) -> None:
        cycle: Any = self.cycle
        if cycle is not None and cycle.scope.get("extensions", {}).get(_SERIAL) == serial:
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


class HotCycle:
    """One request on the hot route: its body, gathered by the protocol, then one
    task that serves it (``front.serve``) and writes the response straight to the
    transport.  It stands where uvicorn's RequestResponseCycle would (the protocol's
    ``cycle``), with the attributes the protocol's own code reads."""

    __slots__ = (
        "_gone",
        "chunked",
        "disconnected",
        "exchange",
        "front",
        "keep_alive",
        "length",
        "more_body",
        "parts",
        "proto",
        "response_complete",
        "scope",
        "size",
        "started",
        "transport",
    )

    def __init__(self, proto: DeadlineProtocol, front: Any, scope: Scope, exchange: Any, keep_alive: bool) -> None:
        self.proto = proto
        self.front = front
        self.scope = scope
        self.exchange = exchange
        self.keep_alive = keep_alive
        self.transport: Any = proto.transport
        self.parts: list[bytes] = []
        self.size = 0
        self.more_body = True
        self.disconnected = False
        self.started = False
        self.response_complete = False
        self.chunked = False
        self.length = 0
        self._gone: asyncio.Future[None] | None = None

    # The protocol's connection_lost sets ``disconnected``, then ``message_event.set()``.
    @property
    def message_event(self) -> HotCycle:
        return self

    def set(self) -> None:
        gone = self._gone
        if gone is not None and not gone.done():
            gone.set_result(None)

    async def run(self, body: bytes) -> None:
        """As uvicorn's ``run_asgi``: an app that fails before answering gets a 500,
        after, a closed connection."""
        try:
            await self.front.serve(self.scope, body, self.receive, self.send, self.exchange)
        except BaseException as exc:
            log.error("Exception in ASGI application\n", exc_info=exc)
            if not self.started:
                await self._send_500()
            elif not self.response_complete:
                self.transport.close()
        else:
            if not self.started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self.transport.close()

    async def _send_500(self) -> None:
        head = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21"), (b"connection", b"close")]
        await self.send({"type": "http.response.start", "status": 500, "headers": head})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error"})

    async def receive(self) -> Message:
        """The body was handed over whole: what is left to hear is the client leaving."""
        while not (self.disconnected or self.response_complete):
            self._gone = asyncio.get_running_loop().create_future()
            await self._gone
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        proto = self.proto
        if proto.flow.write_paused and not self.disconnected:
            await proto.flow.drain()
        if self.disconnected:
            return
        if not self.started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{message['type']}'.")
            self.started = True
            status: int = message["status"]
            head = [STATUS_LINE[status]]
            length: int | None = None
            close = False
            chunked = False
            for name, value in (*proto.server_state.default_headers, *message.get("headers", ())):
                if HEADER_RE.search(name) or HEADER_VALUE_RE.search(value):
                    raise RuntimeError("Invalid HTTP header.")
                name = name.lower()
                if name == b"content-length":
                    if length is None and not chunked:
                        length = int(value)
                elif name == b"transfer-encoding" and value.lower() == b"chunked":
                    chunked = length is None
                elif name == b"connection" and b"close" in value.lower():
                    close = True
                head += (name, b": ", value, b"\r\n")
            if close:
                self.keep_alive = False
            elif not self.keep_alive:
                head.append(b"connection: close\r\n")
            if chunked:
                self.chunked = True
            elif length is None and status not in (204, 304):
                self.chunked = True
                head.append(b"transfer-encoding: chunked\r\n")
            self.length = length or 0
            head.append(b"\r\n")
            if proto.access_log:
                proto.access_logger.info(
                    '%s - "%s %s HTTP/%s" %d',
                    get_client_addr(self.scope),  # type: ignore[arg-type]
                    "POST",
                    get_path_with_query_string(self.scope),  # type: ignore[arg-type]
                    self.scope["http_version"],
                    status,
                )
            self.transport.write(b"".join(head))
            return
        if self.response_complete:
            raise RuntimeError(f"Unexpected ASGI message '{message['type']}' sent, after response already completed.")
        if message["type"] != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{message['type']}'.")
        body: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        if self.chunked:
            if body:
                self.transport.write(b"%x\r\n%b\r\n%b" % (len(body), body, b"" if more else b"0\r\n\r\n"))
            elif not more:
                self.transport.write(b"0\r\n\r\n")
        else:
            if len(body) > self.length:
                raise RuntimeError("Response content longer than Content-Length")
            self.length -= len(body)
            if body:
                self.transport.write(body)
        if not more:
            if self.length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            if not self.keep_alive:
                self.transport.close()
            proto.on_response_complete()


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
