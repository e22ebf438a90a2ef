"""prefixpin's upstream transport: pooled HTTP/1.1 connections, direct or through
an egress proxy, plain or TLS.

Why not httpx's own transport: on a 45 KB chat request against an instant
upstream, httpx over httpcore costs ~1,000 µs of CPU per request and aiohttp's
client ~250 µs, this transport ~85 µs (the whole request through prefixpin costs
~300 µs); it writes the head and the body in one call and parses the answer in C.
What a library would bring, it has too: the system's CAs, ``SSL_CERT_FILE`` /
``SSL_CERT_DIR``, a private CA file, mutual TLS (:mod:`proxy.upstream.tls`),
``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY`` / ``NO_PROXY`` and CONNECT
tunnels (:mod:`proxy.upstream.egress`), keep-alive with stale-connection
checks, a strict response parser (:mod:`proxy.upstream.http11`).

- **At most once.** Only a failure to *connect* (to the upstream, or to the
  egress proxy, or the tunnel or TLS handshake before any request byte) says
  ``never_sent``; once the request was written, even in part, a failure never
  does: the caller must not send it again.
- **Stale connections.** An idle pooled connection is reused only if its socket
  has nothing to read (llama-server closes after a stream while advertising
  keep-alive, and the FIN may be in the kernel before the event loop has seen
  it), and not past the upstream's own ``Keep-Alive: timeout`` less a second.
- **Closes after streams.** llama-server closes a connection a few milliseconds
  after a chunked (streamed) response while advertising keep-alive: a request
  that comes sooner is written into a closing connection, and fails with
  nothing read (it cannot be resent).  So a chunked response's connection
  carries no request in its first second until the origin has been seen keeping
  one open that long (then they are reused at once).  An origin seen closing one
  within that second (whether the event loop or the socket check finds it, or a
  reused one failing so) no longer gets its connections back after a chunked
  response; after other responses they are reused as before.
- **A cap** of ``max_connections`` open at once over every origin
  (:mod:`proxy.upstream.cap`); past it a request waits up to its pool timeout,
  and is handed the first slot or released connection.
- **TLS** is a handshake after the TCP connection, with its own deadline
  (``TLS_HANDSHAKE_S``): an ``https://`` URL to a plain-HTTP server is named as
  such within seconds, not left to the connect timeout.
- **A response head** is bounded by ``max_header_bytes`` (``limits.max_header_bytes``).
- **Not itself.** A direct connection whose far end is one of this process's own
  listening addresses (``listening``) carries no request: it fails as
  :class:`~proxy.errors.UpstreamItself`, before a byte is sent.  The config check at
  start (``proxy.config``) catches an upstream URL that names the listen address; this
  catches what only resolving shows: a host name of this machine, ``127.1``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import select
import ssl
import time
from collections.abc import Sequence
from typing import Any

from proxy.errors import (
    RequestRejected,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamItself,
    UpstreamProxy,
    UpstreamTLS,
    UpstreamUnavailable,
)
from proxy.redact import scrub
from proxy.upstream import tls as tls_
from proxy.upstream.cap import Cap
from proxy.upstream.egress import Egress, Proxy, new_answer, tunnel
from proxy.upstream.http11 import Body, Connection
from proxy.upstream.message import Origin, Request, Response, Timeouts

log = logging.getLogger("prefixpin")
CLOSED_SOON_S = 1.0  # a pooled connection closed this soon after its chunked response: on purpose
TLS_HANDSHAKE_S = 5.0  # a TLS server answers a handshake at once; silence is a plain-HTTP one

_COMPUTED = frozenset({"content-length", "transfer-encoding", "host", "proxy-authorization"})
_UNSAFE = re.compile("[\r\n\0]")
_NO_LENGTH_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})


def _peer_closed(transport: asyncio.BaseTransport) -> bool:
    """Is this idle pooled connection readable?  An idle HTTP/1.1 connection has
    nothing to read unless the server closed it (EOF, RST) or is about to (a 408
    some servers send first): either way it must not carry a request.  The event
    loop may not have noticed yet; the kernel has.  A FIN or a reset makes a socket
    readable on every system, so readability is the whole (portable) check."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    return _readable(sock.fileno())


if hasattr(select, "poll"):

    def _readable(fd: int) -> bool:
        poller = select.poll()
        poller.register(fd, select.POLLIN)  # POLLERR and POLLHUP are always reported
        return bool(poller.poll(0))

else:  # pragma: no cover - Windows: no poll(), and no fd limit on select()

    def _readable(fd: int) -> bool:
        readable, _, failed = select.select([fd], [], [fd], 0)
        return bool(readable or failed)


class _Pool:
    """Idle connections to one origin, most recently used first."""

    def __init__(self, owner: Connections, origin: Origin, proxy: Proxy | None) -> None:
        self.owner = owner
        self.origin = origin
        self.proxy = proxy
        self.where = f"{origin.scheme}://{origin.netloc}" + (f" via {proxy.label}" if proxy else "")
        self.idle: list[Connection] = []
        # Learned (see the module docstring): whether the origin closes a connection soon
        # after a chunked response, or keeps it open; until one or the other is seen,
        # such a connection waits CLOSED_SOON_S before its next request.
        self.closes_after_chunked = False
        self.keeps_after_chunked = False

    async def acquire(self, timeouts: Timeouts) -> Connection:
        now = time.monotonic()
        untried: list[Connection] = []
        while self.idle:
            conn = self.idle.pop()
            if not self._fit(conn, now):
                self.owner.forget(conn)
            elif self._untried(conn, now):
                untried.append(conn)  # still pooled: whether the origin keeps it is yet to be seen
            else:
                self.idle.extend(reversed(untried))
                return conn
        self.idle.extend(reversed(untried))
        owner = self.owner
        handed = await owner.cap.take(self, timeouts.pool, owner.evict_idle)
        if handed is not None:
            now = time.monotonic()
            if self._fit(handed, now) and not self._untried(handed, now):
                return handed  # released by another request just now, with its slot
            handed.abort()  # its slot is ours: open another
        conn = Connection(asyncio.get_running_loop(), self.where, self.origin.host, max_head=owner.max_header_bytes)
        try:
            if timeouts.connect is None:
                await self._open(conn)
            else:
                async with asyncio.timeout(timeouts.connect):
                    await self._open(conn)
        except BaseException as exc:
            owner.cap.give()
            conn.abort()
            if isinstance(exc, TimeoutError):
                raise UpstreamConnectTimeout(
                    "prefixpin timed out connecting to the upstream"
                    + (f" through {self.proxy.label}" if self.proxy else ""),
                    detail=self.where,
                ) from None
            raise
        return conn

    def _fit(self, conn: Connection, now: float) -> bool:
        """May this idle connection carry a request?"""
        t = conn.transport
        if conn.closed or t is None or t.is_closing():
            if conn.chunked and conn.lost_at - conn.idle_since < CLOSED_SOON_S:
                self.closing_after_chunked()  # the event loop saw the close before this request came
            return False
        idle = now - conn.idle_since
        if idle > self.owner.keepalive_s or idle >= conn.idle_limit:
            return False
        if _peer_closed(t):
            if conn.chunked and idle < CLOSED_SOON_S:
                self.closing_after_chunked()
            return False
        if conn.chunked and idle >= CLOSED_SOON_S and not self.keeps_after_chunked:
            self.keeps_after_chunked = True  # open a second after its stream: the origin keeps them
        return True

    def _untried(self, conn: Connection, now: float) -> bool:
        """A chunked response's connection younger than CLOSED_SOON_S, from an origin
        not yet seen keeping such connections open: a request sent on it could meet the
        origin's close (and could not be sent again)."""
        return conn.chunked and not self.keeps_after_chunked and now - conn.idle_since < CLOSED_SOON_S

    def closing_after_chunked(self) -> None:
        if not self.closes_after_chunked:
            self.closes_after_chunked = True
            log.info("%s closes its connections after a streamed response: those are not reused", scrub(self.where))

    async def _open(self, conn: Connection) -> None:
        """Connect ``conn``: directly, or through the proxy (a CONNECT tunnel for https)."""
        loop = conn.loop
        origin, proxy, owner = self.origin, self.proxy, self.owner
        if proxy is None:
            try:
                transport, _ = await loop.create_connection(
                    (lambda: conn) if not origin.tls else asyncio.Protocol, origin.host, origin.port
                )
            except OSError as exc:
                raise UpstreamUnavailable(
                    "prefixpin could not connect to the upstream", detail=f"{self.where}: {scrub(str(exc))}"
                ) from None
            peer = transport.get_extra_info("peername") if owner.listening else None
            if peer is not None and reaches_itself(peer, transport.get_extra_info("sockname"), owner.listening):
                transport.abort()
                host, port = peer[:2]
                raise UpstreamItself(
                    "prefixpin's upstream is prefixpin itself: the upstream's address is prefixpin's own listening "
                    "address, so each request would come back to it; point the upstream URL at the model server",
                    detail=f"{scrub(self.where)} reaches {host} port {port}, where this process listens",
                )
            if origin.tls:
                await self._handshake(conn, transport)
            return
        to_proxy = owner.proxy_tls if proxy.scheme == "https" else None
        answer = new_answer()
        try:
            transport, _ = await loop.create_connection(
                (lambda: answer) if origin.tls else (lambda: conn),
                proxy.host,
                proxy.port,
                ssl=to_proxy,
                server_hostname=proxy.host if to_proxy else None,
            )
        except ssl.SSLError as exc:
            raise UpstreamProxy(
                f"prefixpin could not connect to the egress proxy {proxy.label}: " + tls_.describe(exc, proxy.host),
                detail=self.where,
            ) from None
        except OSError as exc:
            raise UpstreamProxy(
                f"prefixpin could not connect to the egress proxy {proxy.label}",
                detail=f"{self.where}: {scrub(str(exc))}",
            ) from None
        if not origin.tls:
            return  # plain http: absolute-form requests on this connection
        try:
            await tunnel(proxy, origin, transport, answer)
        except BaseException:
            transport.abort()
            raise
        await self._handshake(conn, transport)

    async def _handshake(self, conn: Connection, transport: asyncio.Transport) -> None:
        """TLS over ``transport``, for ``conn``.  A TLS server answers a handshake at
        once; one that does not within ``TLS_HANDSHAKE_S`` is named for what it most
        likely is (a plain-HTTP server behind an https:// URL), not left to the connect
        timeout."""
        origin, owner = self.origin, self.owner
        wait = TLS_HANDSHAKE_S
        try:
            async with asyncio.timeout(wait):
                secure = await conn.loop.start_tls(transport, conn, owner.tls, server_hostname=origin.host)
        except TimeoutError:
            transport.abort()
            raise UpstreamTLS(
                f"prefixpin could not connect to the upstream: host {origin.host} accepted the connection but "
                f"did not answer the TLS handshake within {wait:g} s; is it a plain-HTTP server (an http:// URL)?",
                detail=self.where,
            ) from None
        except (ssl.SSLError, ConnectionError) as exc:
            transport.abort()
            raise UpstreamTLS(
                "prefixpin could not connect to the upstream: " + tls_.describe(exc, origin.host), detail=self.where
            ) from None
        except BaseException:
            transport.abort()
            raise
        assert secure is not None
        conn.connection_made(secure)

    def release(self, conn: Connection, keep: bool) -> None:
        owner = self.owner
        if keep and not owner.closing and not (conn.chunked and self.closes_after_chunked):
            conn.head = None
            conn.idle_since = time.monotonic()
            if not owner.cap.waiting:
                self.idle.append(conn)
            elif not owner.cap.hand(self, conn):  # a request to this origin waits: it takes conn
                owner.forget(conn)  # one to another origin waits: conn's slot is its
        else:
            owner.forget(conn)


def reaches_itself(peer: Any, local: Any, listening: Sequence[tuple[str, int]]) -> bool:
    """Whether a connection from ``local`` to ``peer`` (socket addresses) ends at one of
    the ``listening`` addresses: the same port, and the same host, or, for a listener on
    every address of its family (``0.0.0.0``, ``::``: IPv6 listeners take no IPv4), a
    peer of that family that is this machine (the kernel picks a local destination as
    the connection's own source address)."""
    if not isinstance(peer, tuple) or not isinstance(local, tuple) or len(peer) < 2 or len(local) < 2:
        return False
    host, port = str(peer[0]), peer[1]
    six = ":" in host
    for own_host, own_port in listening:
        if port != own_port:
            continue
        if host == own_host:
            return True
        if own_host == ("::" if six else "0.0.0.0") and host == str(local[0]):
            return True
    return False


class Connections:
    """The transport (proxy.upstream.message.Transport): pools per origin under one cap."""

    def __init__(
        self,
        *,
        max_connections: int,
        tls: ssl.SSLContext | None = None,
        egress: Egress | None = None,
        keepalive_s: float = 15.0,
        max_header_bytes: int = 64 * 1024,
        listening: Sequence[tuple[str, int]] = (),
    ) -> None:
        """``listening``: this process's own listening addresses (host, port), where no
        request may go (the module docstring)."""
        self.max_connections = max_connections
        self.listening = tuple(listening)
        self.keepalive_s = keepalive_s
        self.max_header_bytes = max_header_bytes  # a response head's bound (limits.max_header_bytes)
        self.closing = False
        self._tls = tls
        self.egress = egress
        self.cap: Cap[Connection] = Cap(max_connections, close=lambda conn: conn.abort())
        self._pools: dict[tuple[str, str, int], _Pool] = {}

    @property
    def tls(self) -> ssl.SSLContext:
        if self._tls is None:  # built on first use: a plain-http sidecar never loads CAs
            self._tls = ssl.create_default_context()
            self._tls.set_alpn_protocols(["http/1.1"])
        return self._tls

    @property
    def proxy_tls(self) -> ssl.SSLContext:
        """TLS to an https:// egress proxy: the system's trust (the proxy is the network's)."""
        ctx = ssl.create_default_context()
        ctx.set_alpn_protocols(["http/1.1"])
        return ctx

    # -- the connection cap (proxy.upstream.cap) ---------------------------------------
    def forget(self, conn: Connection) -> None:
        """``conn`` leaves the pool for good: closed, and its slot given back."""
        conn.abort()
        self.cap.give()

    def evict_idle(self) -> bool:
        """Close the longest-idle pooled connection, to any origin (its slot is needed)."""
        oldest: _Pool | None = None
        for pool in self._pools.values():
            if pool.idle and (oldest is None or pool.idle[0].idle_since < oldest.idle[0].idle_since):
                oldest = pool
        if oldest is None:
            return False
        self.forget(oldest.idle.pop(0))
        return True

    def _pool(self, origin: Origin) -> _Pool:
        key = (origin.scheme, origin.host, origin.port)
        pool = self._pools.get(key)
        if pool is None:
            proxy = self.egress.proxy_for(origin) if self.egress is not None else None
            pool = self._pools[key] = _Pool(self, origin, proxy)
        return pool

    # -- requests ----------------------------------------------------------------------
    async def send(self, request: Request) -> Response:
        pool = self._pool(request.origin)
        head = _head(request, pool.proxy)
        conn = await pool.acquire(request.timeouts)
        waiting = conn.start(head_only=request.method == "HEAD")
        t = conn.transport
        assert t is not None
        try:
            # One write, one wake-up upstream; the body is not copied behind the head
            # (uvloop writes both with one writev).
            if request.content:
                t.writelines((head, request.content))
            else:
                t.write(head)
            status, headers, reason = await conn.wait(waiting, request.timeouts.read)
        except BaseException as exc:
            if isinstance(exc, UpstreamError) and conn.uses > 1 and not conn.began and conn.chunked:
                pool.closing_after_chunked()  # a reused connection closed under the request
            self.forget(conn)  # cancelled or failed after writing: never reused
            raise
        return Response(status, headers, Body(conn, pool.release, request.timeouts.read), reason=reason)

    async def aclose(self) -> None:
        self.closing = True
        for pool in self._pools.values():
            for conn in pool.idle:
                conn.abort()
            pool.idle.clear()


def _head(request: Request, proxy: Proxy | None) -> bytes:
    """The request line and headers, as they go on the wire."""
    origin = request.origin
    target = request.target
    if proxy is not None and not origin.tls:
        target = f"http://{origin.netloc}{target}"  # absolute-form, for the proxy
    parts = [f"{request.method} {target} HTTP/1.1\r\nhost: {origin.netloc}\r\n"]
    fields = [f"{k}: {v}" for k, v in request.headers if k.lower() not in _COMPUTED]
    if fields:
        if _UNSAFE.search("".join(fields)):  # one scan of them all
            raise RequestRejected("a request header holds a line break")
        parts += ("\r\n".join(fields), "\r\n")
    if proxy is not None and not origin.tls and proxy.authorization:
        parts.append(f"proxy-authorization: {proxy.authorization}\r\n")
    if request.content or request.method not in _NO_LENGTH_METHODS:
        parts.append(f"content-length: {len(request.content)}\r\n")
    parts.append("\r\n")
    return "".join(parts).encode("latin-1")


def origin_of(scheme: str, host: str, port: int | None, netloc: str) -> Origin:
    return Origin(scheme, host, port or (443 if scheme == "https" else 80), netloc)


__all__ = ["Connections", "origin_of"]
