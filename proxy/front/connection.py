"""One client connection: HTTP/1.1 requests parsed by httptools, served in order.

A request is served (a :class:`proxy.front.cycle.Cycle`) once its head and its
whole body have arrived; requests a client pipelines behind it wait, parsed,
and are answered in the order they came (reading pauses while one waits).

What the connection refuses, each with a response that says why and a close:

- a head over ``max_header_bytes`` (431), one that has not all arrived within
  ``header_timeout_s`` of its first byte (408);
- a body over ``max_body_bytes`` (413: at once when ``content-length`` says so),
  or whose next piece takes longer than ``body_timeout_s`` (408);
- bytes that are not HTTP/1.1 (400): every request-smuggling framing llhttp
  refuses (``content-length`` with ``transfer-encoding``, two lengths, obs-fold,
  bare LF, ...);
- more than ``MAX_WAITING`` requests pipelined behind the one being served
  (503; the ones before it are answered): each waits parsed, and one read of
  small requests would otherwise hold thousands;
- a request target that is not a path (400, and one log line): ``CONNECT
  host:port``, ``*``, an absolute-form URL that does not parse (``http://a:b:c/``,
  ``http://[::1/x``, a port past 65535).  An absolute-form URL that parses is
  served by its path and query.

A refusal pipelined behind requests is written once they are answered.

What it never does: take a chunked body's trailer fields for headers (RFC 9110
6.5.1: they are dropped), or switch protocols (``Upgrade`` is ignored, as RFC
9110 7.8 allows: the request and its body are served like any other and the
requests behind it are parsed on).  A connection idle for ``keepalive_timeout_s``
(before its first request's first byte, or between requests) is closed, without
a response.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import httptools

from proxy import heads
from proxy.config import Limits
from proxy.deadline import Deadline
from proxy.front.cycle import Cycle
from proxy.responses import refusal

log = logging.getLogger("prefixpin")
access_log = logging.getLogger("prefixpin.access")

MAX_WAITING = 64  # requests pipelined on one connection, parsed, waiting their turn (module docstring)


class Host(Protocol):
    """What a connection needs of the server that accepted it
    (:class:`proxy.front.server.Server`): the limits (``limits.*`` in the config), the
    cap on open connections, and the requests it runs."""

    limits: Limits
    stopping: bool
    read_buffer: memoryview  # where every connection's bytes are read into (one at a time: one event loop)

    def admit(self, conn: Connection) -> bool:
        """Take ``conn`` in (False: refused, at the cap)."""

    def forget(self, conn: Connection) -> None: ...

    def start(self, cycle: Cycle, loop: asyncio.AbstractEventLoop) -> None:
        """Run the app on ``cycle``."""

    def log_access(self, cycle: Cycle) -> None: ...

    def refused(self, scope: dict[str, Any], status: int) -> None:
        """A request refused here, its head read (the trace records it); never raises."""


class _Request:
    """A request as it is parsed."""

    __slots__ = (
        "body_declared",
        "continue_",
        "first",
        "head_raw",
        "headers",
        "headers_done",
        "keep_alive",
        "method",
        "parts",
        "path",
        "query",
        "size",
        "url",
        "version",
    )

    def __init__(self) -> None:
        self.url = b""
        self.path = b"/"  # the target's path and query, once the head is in
        self.query = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.first = 0  # the connection's bytes before the read that brought its first byte
        self.head_raw = 0  # bytes received while the head was incomplete (a bound on its buffering)
        self.parts: list[bytes] = []
        self.size = 0
        self.method = "GET"
        self.version = "1.1"
        self.keep_alive = True
        self.body_declared = False
        self.continue_ = False


class Connection(asyncio.BufferedProtocol):
    """See the module docstring.  ``server`` holds the app, the limits, the connections
    (for the cap on their number) and the buffer the loop reads into: the bytes read
    are parsed at once (httptools copies out what it keeps), so the loop does not
    make a ``bytes`` of each read (a request body's worth of copying per request)."""

    def __init__(self, server: Host) -> None:
        self.server = server
        self.limits: Limits = server.limits
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.incoming: _Request | None = None  # being parsed
        self.reframing: _Request | None = None  # an Upgrade request whose body is parsed on (see _upgrade)
        self.queue: deque[_Request] = deque()  # parsed whole, waiting their turn
        self.cycle: Cycle | None = None  # being served
        self.lost = False
        self.paused = False
        self.write_paused = False  # the client does not drain what was written (flow control)
        self._drained: asyncio.Future[None] | None = None
        self.refusal: bytes | None = None  # the last response, once the requests before it are answered
        self.client: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None
        self._deadline = Deadline(self.loop, self._due)
        self._timer_key: Any = None  # the state the deadline is for (None: no deadline)
        self.received = 0  # the connection's bytes so far, the read being parsed included
        self.read_start = 0  # ... and before the read being parsed

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.client = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))
        if self.server.admit(self):
            self._rearm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._cancel_timer()
        self.server.forget(self)
        self.resume_writing()
        if self.cycle is not None:
            self.cycle.connection_lost()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    async def drained(self) -> None:
        """Until the client has read enough of what was written (or is gone)."""
        if not self.write_paused or self.lost:
            return
        if self._drained is None:
            self._drained = self.loop.create_future()
        await self._drained

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.server.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.server.read_buffer[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        if self.refusal is not None:
            return  # nothing more is read from a connection that is being refused
        before = self.incoming
        in_head = before is not None and not before.headers_done
        self.read_start = self.received
        self.received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            if not self._upgrade(data[exc.args[0] :]):
                return
        except httptools.HttpParserError as exc:
            self._parse_error(exc)
            self._next()  # the requests parsed before the refused one are answered first
            return
        if in_head and self.incoming is before and before is not None and not before.headers_done:
            before.head_raw += len(data)
            if before.head_raw > self.limits.max_header_bytes:
                self._head_too_large()
                return
        if self.queue and self.cycle is not None and not self.paused and self.transport is not None:
            self.paused = True  # one request waits parsed: read no more until it is served
            self.transport.pause_reading()
        self._next()
        self._rearm()

    def _upgrade(self, rest: bytes | memoryview) -> bool:
        """llhttp stops at a request that asks to switch protocols (``Upgrade``); we
        never switch.  Parsing goes on with a new parser: the request's body, if it
        declared one, framed by a synthetic head, then the requests behind it.
        False when the rest was refused."""
        while True:
            self.parser = httptools.HttpRequestParser(self)
            try:
                req = self.reframing
                if req is not None:
                    self.parser.feed_data(_frame_head(req))
                self.parser.feed_data(rest)
                return True
            except httptools.HttpParserUpgrade as exc:
                rest = rest[exc.args[0] :]
            except httptools.HttpParserError as exc:
                self._parse_error(exc)
                return False

    def _parse_error(self, exc: httptools.HttpParserError) -> None:
        refused = exc.__context__
        if isinstance(refused, _Refused):  # raised by one of our callbacks
            refused.answer()
        else:
            self.refuse(400, "invalid_request", f"the request is not valid HTTP/1.1 ({exc})")

    # -- httptools callbacks ----------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.reframing is None:
            if len(self.queue) >= MAX_WAITING:
                raise _Refused(self._too_many_waiting)
            self.incoming = req = _Request()
            req.first = self.read_start

    def on_url(self, url: bytes) -> None:
        req = self.incoming
        if req is not None and self.reframing is None:
            req.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self.incoming
        if req is None or req.headers_done or self.reframing is not None:
            return  # a trailer field (or the synthetic head of a reframed body): never a header
        req.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self.reframing is not None:
            return
        req = self.incoming
        assert req is not None
        req.headers_done = True
        if heads.over(self.limits.max_header_bytes, self.received - req.first, req.headers, len(req.url)):
            raise _Refused(self._head_too_large)
        parser = self.parser
        req.method = parser.get_method().decode("ascii")
        if not self._target(req):
            raise _Refused(lambda: self._bad_target(req))
        req.version = parser.get_http_version()
        req.keep_alive = parser.should_keep_alive() and req.version != "1.0"
        length = None
        chunked = False
        for name, value in req.headers:
            if name == b"content-length":
                length = int(value) if value.isdigit() else None
            elif name == b"transfer-encoding":
                if chunked or value.strip().lower() != b"chunked":
                    # Codings before chunked (gzip, ...) or a second transfer-encoding:
                    # nothing here undoes them, and proxies disagree on such framings.
                    raise _Refused(self._bad_framing)
                chunked = True
            elif name == b"expect" and value.lower() == b"100-continue":
                req.continue_ = True
        req.body_declared = chunked or (length is not None and length > 0)
        if length is not None and length > self.limits.max_body_bytes:
            raise _Refused(self._body_too_large)
        if req.continue_ and self.cycle is None and not self.queue and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        req = self.reframing or self.incoming
        assert req is not None
        req.parts.append(body)
        req.size += len(body)
        if req.size > self.limits.max_body_bytes:
            raise _Refused(self._body_too_large)

    def on_message_complete(self) -> None:
        req = self.reframing
        if req is not None:
            self.reframing = None
        else:
            req = self.incoming
            assert req is not None
            if req.body_declared and not req.parts and self.parser.should_upgrade():
                self.reframing = req  # its body comes after the head llhttp stopped at
                return
        self.incoming = None
        self.queue.append(req)

    # -- serving ----------------------------------------------------------------------
    def _next(self) -> None:
        """Serve the next request parsed, if none is being served."""
        if self.cycle is not None or not self.queue or self.lost:
            return
        req = self.queue.popleft()
        if self.paused and not self.queue and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        parts = req.parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        raw_path = req.path
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": req.version,
            "server": self.local,
            "client": self.client,
            "scheme": "http",
            "method": req.method,
            "root_path": "",
            "path": unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": req.query,
            "headers": req.headers,
        }
        keep_alive = req.keep_alive and not self.server.stopping
        self.cycle = cycle = Cycle(self, scope, body, keep_alive=keep_alive)
        self.server.start(cycle, self.loop)

    def cycle_done(self, cycle: Cycle) -> None:
        """``cycle``'s app has returned: the next request, or the end of the connection."""
        self.cycle = None
        if access_log.isEnabledFor(logging.INFO):
            self.server.log_access(cycle)
        if self.lost or self.transport is None or self.transport.is_closing():
            return
        if not cycle.complete or not cycle.keep_alive:
            self.transport.close()
            return
        if self.refusal is not None and not self.queue:
            self.transport.write(self.refusal)
            self.transport.close()
            return
        self._next()
        self._rearm()

    @property
    def idle(self) -> bool:
        """Nothing being served or waiting: the connection may be closed without loss."""
        return self.cycle is None and not self.queue

    # -- the request target ---------------------------------------------------------
    @staticmethod
    def _target(req: _Request) -> bool:
        """Set ``req``'s path and query from its target; False when it is not a path:
        CONNECT's authority-form, ``*``, an absolute-form URL that does not parse."""
        url = req.url
        if req.method == "CONNECT":
            return False
        if url[:1] == b"/":  # origin-form: the usual case
            try:
                parsed = httptools.parse_url(url)
            except httptools.HttpParserInvalidURLError:
                return False
            req.path, req.query = parsed.path or b"/", parsed.query or b""
            return True
        try:
            parts = urlsplit(url.decode("latin-1"))
            port = parts.port  # raises ValueError on a port that is not one
        except ValueError:
            return False
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname or port == 0:
            return False
        req.path = (parts.path or "/").encode("latin-1")
        req.query = parts.query.encode("latin-1")
        return True

    def _bad_target(self, req: _Request) -> None:
        target = req.url[:200].decode("latin-1")
        log.info("refused a request whose target is not a path: %s %r (400)", req.method, target)
        self.refuse(400, "invalid_request", "the request target must be a path (CONNECT is not served)")

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # -- refusing ---------------------------------------------------------------------
    def refuse(self, status: int, code: str, message: str) -> None:
        """Answer ``status`` once the requests before this one are answered, then close;
        nothing more is read.  The body is in the shape of the API the request's path
        names, when its path is known (an Anthropic client gets Anthropic's)."""
        if self.refusal is not None:
            return
        req = self.incoming or self.reframing
        path = req.url.partition(b"?")[0] if req is not None and req.url[:1] == b"/" else None
        self.refusal = refusal(path, status, code, message)
        if req is not None and req.headers_done:
            scope = {"type": "http", "method": req.method, "path": unquote(req.path.decode("latin-1"))}
            self.server.refused({**scope, "query_string": req.query, "headers": req.headers}, status)
        self._cancel_timer()
        self.incoming = self.reframing = None
        if self.transport is None:
            return
        if not self.transport.is_closing():
            self.transport.pause_reading()
        if self.idle:
            self.transport.write(self.refusal)
            self.transport.close()

    def _head_too_large(self) -> None:
        self.refuse(
            431,
            "headers_too_large",
            f"the request head is over {self.limits.max_header_bytes} bytes (limits.max_header_bytes)",
        )

    def _bad_framing(self) -> None:
        self.refuse(400, "invalid_request", "only transfer-encoding: chunked is accepted, once")

    def _too_many_waiting(self) -> None:
        self.refuse(
            503,
            "too_many_pipelined_requests",
            f"over {MAX_WAITING} requests are pipelined on this connection: send the rest once these are answered",
        )

    def _body_too_large(self) -> None:
        self.refuse(
            413,
            "request_too_large",
            f"the request body is over {self.limits.max_body_bytes} bytes (limits.max_body_bytes)",
        )

    # -- the one timer ----------------------------------------------------------------
    def _rearm(self) -> None:
        """The deadline the connection's state calls for: none while a request is served
        or waits; the keep-alive timeout when idle; the header deadline from a head's
        first bytes; the body deadline from each piece of a body.  Kept by one
        :class:`~proxy.deadline.Deadline`: a keep-alive connection makes no timer per
        request."""
        req = self.incoming or self.reframing
        if self.cycle is not None or self.queue or self.refusal is not None or self.lost:
            key: Any = None
        elif req is None:
            key = "idle"
        elif not req.headers_done:
            key = req  # armed once per head: the deadline runs from its first bytes
        else:
            key = (req, req.size)  # re-armed by each piece of the body
        if key == self._timer_key:
            return
        self._timer_key = key
        if key is None:
            self._deadline.clear()
        elif key == "idle":
            self._deadline.set(self.limits.keepalive_timeout_s)
        elif key is req:
            self._deadline.set(self.limits.header_timeout_s)
        else:
            self._deadline.set(self.limits.body_timeout_s)

    def _cancel_timer(self) -> None:
        self._deadline.cancel()
        self._timer_key = None

    def _due(self) -> None:
        key, self._timer_key = self._timer_key, None
        if key is not None:
            self._expired(key)

    def _expired(self, key: Any) -> None:
        if key == "idle":
            self.close()
        elif isinstance(key, _Request):
            log.info("closing a connection whose request head took over %.0f s", self.limits.header_timeout_s)
            self.refuse(408, "request_timeout", "the request head did not arrive in time (limits.header_timeout_s)")
        else:
            log.info("closing a connection whose request body stalled for %.0f s", self.limits.body_timeout_s)
            self.refuse(408, "request_timeout", "the request body stalled (limits.body_timeout_s)")


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; ``data_received`` answers it."""

    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.answer = answer


def _frame_head(req: _Request) -> bytes:
    """A head that frames ``req``'s body as it declared it, for a new parser."""
    for name, value in req.headers:
        if name == b"transfer-encoding":
            return b"POST / HTTP/1.1\r\ntransfer-encoding: " + value + b"\r\n\r\n"
    length = next((v for k, v in req.headers if k == b"content-length"), b"0")
    return b"POST / HTTP/1.1\r\ncontent-length: " + length + b"\r\n\r\n"


def _address(info: Any) -> tuple[str, int] | None:
    if isinstance(info, tuple) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return None


__all__ = ["Connection", "Host"]
