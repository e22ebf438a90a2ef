"""The upstream transport: HTTP/1.1 on asyncio protocols, httptools' C parser.

A proxy needs little of an HTTP client: one pool of keep-alive connections per
origin, the request's bytes written as given, the response's status, headers and
body relayed as they arrive, and a clear line between "nothing was sent" and
"the upstream may have it".  General clients do far more per request (URL and
header models, cookie jars, redirects, middleware layers): on prefixpin's hot
path httpx over httpcore cost ~1 ms per 50 KB request and aiohttp under httpx
~0.35 ms; this transport writes the head and the body in one call and parses
the answer in C (measured in tests/bench/overhead, docs/bench-overhead.md).

Responses are ``httpx.Response`` objects (status, headers, a streamed body), so
the rest of prefixpin, and tests with ``httpx.MockTransport``, see one type.
Failures are httpx's exceptions, mapped once to prefixpin's errors by
:func:`proxy.errors.from_httpx`.  Only a failure to connect is
``httpx.ConnectError``/``ConnectTimeout``: once a request was written, even in
part, the caller must not send it again.

- **Stale connections.** An idle pooled connection is reused only if its socket
  has nothing to read (``_peer_closed``): llama-server closes after a stream
  while advertising keep-alive, and the FIN may be in the kernel before the
  event loop has seen it.  Nor past the upstream's own ``Keep-Alive: timeout``
  less a second: a close sent just as the request leaves would cost a 502.
- **Flow control.** A body the client reads slower than the upstream sends
  pauses reading from the upstream past ``HIGH_WATER`` bytes.
- **Framing.** Content-Length, chunked, and bodies ended by the connection's
  close; a response to ``HEAD`` has no body (that connection is not reused).
"""

from __future__ import annotations

import asyncio
import select
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httptools
import httpx

from proxy.redact import scrub

HIGH_WATER = 1 << 20  # body bytes buffered before reading from the upstream pauses
_NO_BODY_STATUS = frozenset({204, 304})
_COMPUTED = frozenset({"content-length", "transfer-encoding", "host"})
_UNSAFE = frozenset("\r\n\0")


def _peer_closed(transport: asyncio.BaseTransport) -> bool:
    """Is this idle pooled connection readable?  An idle HTTP/1.1 connection has
    nothing to read unless the server closed it (EOF, RST) or is about to (a 408
    some servers send first): either way it must not carry a request.  The event
    loop may not have noticed yet; the kernel has."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLRDHUP | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(0))


class _Conn(asyncio.Protocol):
    """One connection to the upstream, one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.idle_limit = float("inf")  # the upstream's own Keep-Alive timeout, when it names one
        self.reusable = False
        self._reset(head_only=False)

    def _reset(self, *, head_only: bool) -> None:
        self.head_only = head_only
        self.head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]], bytes]] | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.reason = b""
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.done = False
        self.until_eof = False
        self.error: httpx.TransportError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.informational = False

    # -- asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.head is None:  # bytes on an idle connection (a 408, say): it carries nothing more
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("the upstream switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed response from the upstream: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        if self.head is None:
            return  # idle in the pool
        if self.until_eof and exc is None and self.head.done():
            self.done = True  # a body without length ends with the connection
            self._wake()
            return
        if not self.done:
            cause = scrub(str(exc)) if exc else ""
            if self.head is not None and not self.head.done():
                err: httpx.TransportError = httpx.RemoteProtocolError(
                    "the upstream closed the connection without sending a response" + (f" ({cause})" if cause else "")
                )
            else:
                err = httpx.RemoteProtocolError(
                    "the upstream closed the connection before the response body was complete"
                    + (f" ({cause})" if cause else "")
                )
            self._fail(err, close=False)

    def pause_writing(self) -> None:  # the request body waits in the transport's buffer
        pass

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks -----------------------------------------------------------
    def on_message_begin(self) -> None:
        self.headers = []
        self.reason = b""

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # 100 Continue and friends: the answer comes next
            self.informational = True
            return
        self.informational = False
        framed = self.head_only or status in _NO_BODY_STATUS
        if not framed:
            te = cl = False
            for k, v in self.headers:
                lk = k.lower()
                if lk == b"content-length":
                    cl = True
                elif lk == b"transfer-encoding" and b"chunked" in v.lower():
                    te = True
                elif lk == b"keep-alive":
                    self._keep_alive(v)
            self.until_eof = not (te or cl)
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
        if self.head_only:
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
        if self.head_only:
            return
        self.done = True
        self.reusable = self.parser.should_keep_alive()
        self._wake()

    # -- the exchange ------------------------------------------------------------------
    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, err: httpx.TransportError, *, close: bool = True) -> None:
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

    async def _wait(self, fut: asyncio.Future[Any], timeout: float | None) -> Any:
        if timeout is None:
            return await fut
        timer = self.loop.call_later(timeout, self._on_timeout, fut)
        try:
            return await fut
        finally:
            timer.cancel()

    def _on_timeout(self, fut: asyncio.Future[Any]) -> None:
        if not fut.done():
            fut.set_exception(httpx.ReadTimeout("timed out waiting for the upstream"))

    async def next_chunk(self, timeout: float | None) -> bytes | None:
        """The body bytes received so far (joined), or None at its end."""
        while True:
            if self.chunks:
                chunks = self.chunks
                data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                if len(chunks) != 1:
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
                await self._wait(self.waiter, timeout)
            finally:
                self.waiter = None


class Body(httpx.AsyncByteStream):
    """A response body, relayed as the bytes arrive; closing it early closes the
    connection (so the upstream stops generating), reading it to the end returns
    the connection to the pool."""

    def __init__(self, pool: _Pool, conn: _Conn, timeout: float | None) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self._timeout = timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        while True:
            chunk = await conn.next_chunk(self._timeout)
            if chunk is None:
                break
            yield chunk
        self._release()

    def at_end(self) -> bool:
        """Has the rest of the body arrived, and been read?  (Then the bytes just
        read were the last: a relay can end its own response with them.)"""
        conn = self._conn
        return conn is None or (conn.done and not conn.chunks)

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.release(conn, keep=conn.done and conn.reusable and not conn.closed)

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.release(conn, keep=conn.done and conn.reusable and not conn.closed)


class _Pool:
    """Idle connections to one origin (most recently used first), and a cap on
    open connections shared by every origin of the transport."""

    def __init__(self, owner: H1Transport, host: str, port: int, tls: ssl.SSLContext | None) -> None:
        self.owner = owner
        self.host = host
        self.port = port
        self.tls = tls
        self.idle: list[_Conn] = []

    async def acquire(self, connect_timeout: float | None, pool_timeout: float | None) -> _Conn:
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            t = conn.transport
            idle = now - conn.idle_since
            if conn.closed or t is None or t.is_closing() or idle > self.owner.keepalive_s or idle >= conn.idle_limit:
                self.owner.forget(conn)
                continue
            if _peer_closed(t):
                self.owner.forget(conn)
                continue
            return conn
        await self.owner.reserve(pool_timeout)
        loop = asyncio.get_running_loop()
        conn = _Conn(loop)
        try:
            connect = loop.create_connection(
                lambda: conn, self.host, self.port, ssl=self.tls, server_hostname=self.host if self.tls else None
            )
            if connect_timeout is None:
                await connect
            else:
                async with asyncio.timeout(connect_timeout):
                    await connect
        except TimeoutError:
            self.owner.unreserve()
            conn.abort()
            raise httpx.ConnectTimeout("timed out connecting to the upstream") from None
        except (OSError, ssl.SSLError) as exc:
            self.owner.unreserve()
            conn.abort()
            raise httpx.ConnectError(scrub(str(exc) or type(exc).__name__)) from None
        except BaseException:
            self.owner.unreserve()
            conn.abort()
            raise
        return conn

    def release(self, conn: _Conn, *, keep: bool) -> None:
        if keep and not self.owner.closing:
            conn.head = None
            conn.idle_since = time.monotonic()
            self.idle.append(conn)
        else:
            self.owner.forget(conn)


class H1Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 to the upstream; ``max_connections`` open at once (past it, a
    request waits up to its pool timeout)."""

    def __init__(self, *, max_connections: int, keepalive_s: float = 15.0) -> None:
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self.closing = False
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._pools: dict[tuple[str, str, int], _Pool] = {}
        self._tls: ssl.SSLContext | None = None

    # -- the connection cap ------------------------------------------------------------
    async def reserve(self, timeout: float | None) -> None:
        if self.max_connections <= 0 or self._open < self.max_connections:
            self._open += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            raise httpx.PoolTimeout("timed out waiting for a connection to the upstream") from None
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)
        self._open += 1

    def unreserve(self) -> None:
        self._open -= 1
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                break

    def forget(self, conn: _Conn) -> None:
        """``conn`` leaves the pool for good: closed, and its place freed."""
        conn.abort()
        self.unreserve()

    def _pool(self, scheme: str, host: str, port: int | None) -> _Pool:
        key = (scheme, host, port or (443 if scheme == "https" else 80))
        pool = self._pools.get(key)
        if pool is None:
            tls = None
            if scheme == "https":
                if self._tls is None:
                    self._tls = _tls_context()
                tls = self._tls
            pool = self._pools[key] = _Pool(self, host, key[2], tls)
        return pool

    # -- requests ----------------------------------------------------------------------
    async def send(
        self,
        method: str,
        origin: tuple[str, str, int | None, str],
        target: str,
        headers: list[tuple[str, str]],
        content: bytes,
        timeouts: dict[str, float],
    ) -> httpx.Response:
        """``origin`` is (scheme, host, port, Host header value); ``target`` the
        request target as it goes on the request line."""
        scheme, host, port, netloc = origin
        parts = [f"{method} {target} HTTP/1.1\r\nhost: {netloc}\r\n"]
        for k, v in headers:
            if k.lower() in _COMPUTED:
                continue
            if not _UNSAFE.isdisjoint(k) or not _UNSAFE.isdisjoint(v):
                raise httpx.LocalProtocolError("a header holds a line break")
            parts.append(f"{k}: {v}\r\n")
        if content or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            parts.append(f"content-length: {len(content)}\r\n")
        parts.append("\r\n")
        try:
            head = "".join(parts).encode("latin-1")
        except UnicodeEncodeError:
            raise httpx.LocalProtocolError("a request header is not latin-1") from None
        pool = self._pool(scheme, host, port)
        conn = await pool.acquire(timeouts.get("connect"), timeouts.get("pool"))
        conn._reset(head_only=method == "HEAD")
        loop = conn.loop
        conn.head = loop.create_future()
        t = conn.transport
        assert t is not None
        try:
            t.write(head + content)  # one send: a second one costs a second wake-up of the upstream
            status, raw_headers, reason = await conn._wait(conn.head, timeouts.get("read"))
        except BaseException:
            pool.owner.forget(conn)  # cancelled or failed after writing: never reuse it
            raise
        return httpx.Response(
            status,
            headers=raw_headers,
            stream=Body(pool, conn, timeouts.get("read")),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason},
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """The httpx interface (any ``httpx.Request``), for callers that build one."""
        url = request.url
        t = request.extensions.get("timeout") or {}
        target = request.extensions.get("target")
        raw_target = target.decode("latin-1") if isinstance(target, bytes) else url.raw_path.decode("ascii")
        netloc = url.netloc.decode("ascii")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        content = await request.aread()
        return await self.send(
            request.method, (url.scheme, url.host, url.port, netloc), raw_target, headers, content, t
        )

    async def aclose(self) -> None:
        self.closing = True
        for pool in self._pools.values():
            for conn in pool.idle:
                conn.abort()
            pool.idle.clear()


def _tls_context() -> ssl.SSLContext:
    try:
        import certifi

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:  # pragma: no cover - certifi comes with httpx
        return ssl.create_default_context()


def split_origin(origin: str) -> tuple[str, str, int | None, str]:
    """``http://host:port`` -> (scheme, host, port, Host header value)."""
    parts = urlsplit(origin)
    return (parts.scheme, parts.hostname or "", parts.port, parts.netloc.rpartition("@")[2])


__all__ = ["Body", "H1Transport", "split_origin"]
