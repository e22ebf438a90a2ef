"""One HTTP/1.1 connection to the upstream, one exchange at a time, parsed by httptools.

A response is complete at its framing (``content-length``, the last chunk, or
the connection's close when it has neither) and nothing after it is taken: bytes
that follow a complete response (a second response in the same write, a partial
one) mark the connection unfit and it is closed, never returned to the pool, so
no later request is sent on a connection that is in the middle of a message.
A status HTTP does not have (below 100, above 599) or a switch of protocols
(101) fails the exchange.  A body the client reads slower than the upstream
sends pauses reading from the upstream past ``HIGH_WATER`` bytes.

Failures are prefixpin's own errors (:mod:`proxy.errors`): once the request was
written, even in part, they never say ``never_sent``.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import httptools

from proxy import heads
from proxy.deadline import Deadline
from proxy.errors import UpstreamError, UpstreamProtocol, UpstreamReset, UpstreamTimeout, UpstreamTLS
from proxy.redact import scrub
from proxy.upstream.tls import describe as tls_describe

HIGH_WATER = 1 << 20  # body bytes buffered before reading from the upstream pauses
_NO_BODY_STATUS = frozenset({204, 304})
Head = tuple[int, list[tuple[bytes, bytes]], bytes]


class _SecondMessage(Exception):
    """The upstream began another message after a complete response."""


class Connection(asyncio.Protocol):
    """See the module docstring.  ``where`` names the upstream in log details, ``host``
    in a TLS failure's message."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, where: str, host: str = "", *, max_head: int = 64 * 1024
    ) -> None:
        self.loop = loop
        self.where = where
        self.host = host
        self.max_head = max_head  # a response head's bytes (limits.max_header_bytes)
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.lost_at = float("inf")  # when the upstream closed it while it was idle in the pool
        self.idle_limit = float("inf")  # the upstream's own Keep-Alive timeout, when it names one
        self.reusable = False
        self.uses = 0  # exchanges started on it (above 1: a reused connection)
        self.chunked = False  # the last response's body was chunked (a stream, as a rule)
        self.head: asyncio.Future[Head] | None = None  # None: idle, between exchanges
        # The read timeout (see wait): the future waited on, its timeout, its deadline.
        self._waiting: asyncio.Future[Any] | None = None
        self._wait_s = 0.0
        self._deadline = Deadline(loop, self._timed_out)
        self._clear(head_only=False)

    def start(self, *, head_only: bool) -> asyncio.Future[Head]:
        """A new exchange: the future of its response head."""
        self._clear(head_only=head_only)
        self.uses += 1
        self.head = head = self.loop.create_future()
        return head

    def _clear(self, *, head_only: bool) -> None:
        self.head_only = head_only
        self.headers: list[tuple[bytes, bytes]] = []
        self.reason = b""
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.began = False  # a (final) response began
        self.head_bytes = 0  # bytes received while the head was incomplete (a bound on its buffering)
        self.feeding = 0  # the bytes being parsed now
        self.done = False
        self.until_eof = False
        self.error: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.informational = False

    # -- asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.head is None or self.done:
            # Bytes on an idle connection (a 408, say) or after a complete response:
            # the connection is not at the start of a message any more.
            self.abort()
            return
        self.feeding = len(data)  # with head_bytes: the bytes a head completed by this feed came in (proxy.heads)
        try:
            self.parser.feed_data(data)
            if not self.began and self.error is None:
                # httptools buffers a header's pieces until it is whole: a head that
                # never ends must not grow without bound.
                self.head_bytes += len(data)
                if self.head_bytes > self.max_head:
                    self._head_too_large()
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamProtocol("the upstream switched protocols", detail=self.where))
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _SecondMessage) or self.done:
                self.reusable = False  # the response is whole; what follows it is not ours
                self.abort()
                return
            self._fail(UpstreamProtocol("the upstream sent a malformed response", detail=f"{self.where}: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._deadline.cancel()  # (the loop's timer would hold the connection until it fires)
        self.reusable = False
        if self.head is None:
            self.lost_at = time.monotonic()  # idle in the pool (the pool reads when)
            return
        if self.until_eof and exc is None and self.head.done() and not self.done:
            self.done = True  # a body without length ends with the connection
            self._wake()
            return
        if not self.done:
            if isinstance(exc, ssl.SSLError) and not self.head.done():
                # TLS 1.3: the upstream checks our certificate after the handshake, and
                # its refusal (certificate required, unknown CA) comes as an alert here.
                self._fail(UpstreamTLS(tls_describe(exc, self.host), detail=self.where), close=False)
                return
            cause = f" ({scrub(str(exc))})" if exc else ""
            if not self.head.done():
                message = "the upstream closed the connection without sending a response"
            else:
                message = "the upstream closed the connection before the response body was complete"
            self._fail(_reset(message, f"{self.where}{cause}"), close=False)

    # -- httptools callbacks -----------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.began:
            raise _SecondMessage
        self.headers = []
        self.reason = b""

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.began:
            self.headers.append((name, value))
        # else: a trailer field of a chunked body; responses carry none we use

    def _head_too_large(self) -> None:
        self._fail(
            UpstreamProtocol(
                f"the upstream's response head is over {self.max_head} bytes (limits.max_header_bytes)",
                detail=self.where,
            )
        )

    def on_headers_complete(self) -> None:
        if heads.over(self.max_head, self.head_bytes + self.feeding, self.headers, len(self.reason)):
            self._head_too_large()
            return
        status = self.parser.get_status_code()
        if status == 101:
            self._fail(UpstreamProtocol("the upstream switched protocols", detail=self.where))
            return
        if 100 <= status < 200:  # 100 Continue and friends: the answer comes next
            self.informational = True
            return
        if not 200 <= status <= 599:
            self._fail(
                UpstreamProtocol(
                    f"the upstream answered with status {status}, which HTTP does not have", detail=self.where
                )
            )
            return
        self.informational = False
        self.began = True
        framed = self.head_only or status in _NO_BODY_STATUS
        if not framed:
            te = cl = False
            for k, v in self.headers:
                lk = k.lower()
                if lk == b"content-length":
                    cl = True
                elif lk == b"transfer-encoding":
                    # chunked only when it is the last coding (RFC 9112 6.3), as llhttp frames it:
                    # "gzip, chunked" is chunked, "notchunked" reads to the close
                    te = v.rpartition(b",")[2].strip().lower() == b"chunked"
                elif lk == b"keep-alive":
                    self._keep_alive(v)
            self.until_eof = not (te or cl)
            self.chunked = te
        head = self.head
        if head is not None and not head.done():
            head.set_result((status, self.headers, self.reason))
        if self.head_only:
            self.done = True  # llhttp would wait for a body that never comes
            self.reusable = False
            self._wake()

    def _keep_alive(self, value: bytes) -> None:
        """``Keep-Alive: timeout=5`` (llama-server): the upstream closes an idle connection
        after 5 s, so reusing it near then races its close; stop reusing it 1 s earlier."""
        for part in value.split(b","):
            name, _, n = part.strip().partition(b"=")
            if name.lower() == b"timeout" and n.strip().isdigit():
                self.idle_limit = max(int(n) - 1.0, 0.0)

    def on_body(self, body: bytes) -> None:
        if self.head_only or self.done or self.error is not None:
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        if self.head_only or self.done or self.error is not None:
            return
        self.done = True
        self.reusable = self.parser.should_keep_alive()
        self._wake()

    # -- the exchange ------------------------------------------------------------------
    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, err: UpstreamError, *, close: bool = True) -> None:
        self.reusable = False
        if self.error is None:
            self.error = err
        head = self.head
        if head is not None and not head.done():
            head.set_exception(err)
        self._wake()
        if close:
            self.abort()

    def abort(self) -> None:
        self.reusable = False
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    async def wait(self, fut: asyncio.Future[Any], timeout: float | None) -> Any:
        """``fut``'s result, or UpstreamTimeout after ``timeout`` seconds without it.
        The connection's one :class:`~proxy.deadline.Deadline` keeps the time: a
        request's waits (its head, its body's pieces) make no timer of their own."""
        if timeout is None or fut.done():
            return await fut
        self._waiting, self._wait_s = fut, timeout
        self._deadline.set(timeout)
        try:
            return await fut
        finally:
            self._waiting = None
            self._deadline.clear()

    def _timed_out(self) -> None:
        fut = self._waiting
        if fut is not None and not fut.done():
            detail = f"{self.where}: nothing in {self._wait_s:g} s"
            fut.set_exception(UpstreamTimeout("prefixpin timed out waiting for the upstream's response", detail=detail))

    async def next_chunk(self, timeout: float | None) -> bytes | None:
        """The body bytes received so far (joined), or None at its end."""
        while True:
            if self.chunks:
                chunks = self.chunks
                data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                if chunks:
                    chunks.clear()
                self.buffered = 0
                if self.paused and self.transport is not None and not self.closed:
                    self.paused = False
                    self.transport.resume_reading()
                return data
            if self.done:
                return None
            if self.error is not None:
                raise self.error
            self.waiter = self.loop.create_future()
            try:
                await self.wait(self.waiter, timeout)
            finally:
                self.waiter = None


class Body:
    """A response body (proxy.upstream.message.Body) read off a :class:`Connection`;
    ``release(conn, keep)`` gives the connection back to its pool.  Its own async
    iterator: an async generator would cost the event loop's bookkeeping of one (a
    weak reference registered and dropped) on every response."""

    __slots__ = ("_conn", "_release", "_timeout")

    def __init__(self, conn: Connection, release: Callable[[Connection, bool], None], timeout: float | None) -> None:
        self._conn: Connection | None = conn
        self._release = release
        self._timeout = timeout

    def __aiter__(self) -> Body:
        return self

    async def __anext__(self) -> bytes:
        conn = self._conn
        if conn is None:
            raise StopAsyncIteration
        chunk = await conn.next_chunk(self._timeout)
        if chunk is None:
            await self.aclose()  # read to its end: the connection goes back to its pool
            raise StopAsyncIteration
        return chunk

    def at_end(self) -> bool:
        conn = self._conn
        return conn is None or (conn.done and not conn.chunks)

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._release(conn, conn.done and conn.reusable and not conn.closed)


def _reset(message: str, detail: str) -> UpstreamReset:
    return UpstreamReset(
        message + "; prefixpin did not resend the request (the upstream may have received it)", detail=detail
    )


__all__ = ["HIGH_WATER", "Body", "Connection"]
