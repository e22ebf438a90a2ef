"""Serving an ASGI app on a socket: listeners, the lifespan, the connection cap, stopping.

:func:`serve` is what ``prefixpin serve`` calls: it opens the app's lifespan,
listens, and on SIGTERM or SIGINT stops accepting (the listening sockets are
closed at once, idle connections too), lets the requests in flight finish (up to
``grace_s``, ``listen.shutdown_grace_s``), then ends what is still running: an
event stream with an error event in its API's shape and its last chunk, a request
not yet answered with a 503, anything else cut; each one logged.  Then the
lifespan ends.

The cap on open client connections (``limits.max_connections``; 0: from the
process's file-descriptor limit) keeps the process able to answer: when a new
connection would pass it, the oldest connection with nothing in flight is closed
to make room (idle keep-alive connections first, then ones still sending a
request); when every connection has a request in flight, the new one is
answered ``503`` and closed.  So a flood of idle or slow connections costs the
flood, not ``/healthz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import socket
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Scope

from proxy.config import Limits
from proxy.front.connection import Connection
from proxy.front.cycle import Cycle
from proxy.redact import redact_query
from proxy.responses import refusal, shutdown_event

log = logging.getLogger("prefixpin")
access_log = logging.getLogger("prefixpin.access")
# scope["extensions"][ACCESS_NOTE]: what the app adds to the request's access-log line
# (proxy.access: role, lineage, tokens, cause)
ACCESS_NOTE = "prefixpin.access"
BACKLOG = 2048
READ_BUFFER = 256 << 10  # what one read takes at most (uvloop reads 256 KiB at a time too)
RESERVED_FDS = 64  # files, the store, logs: what the process needs besides connections


def connection_cap(configured: int, upstream_connections: int) -> int:
    """``limits.max_connections``, or with 0 what the file-descriptor limit leaves
    once the upstream connections and ``RESERVED_FDS`` are counted."""
    if configured > 0:
        return configured
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 16384
    return max(16, min(16384, soft - RESERVED_FDS - min(upstream_connections, soft // 2)))


FLUSH_S = 2.0  # once the grace is over: how long the last bytes get to reach the clients


class Server:
    """The connections of one process and the app they serve."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limits: Limits,
        max_connections: int,
        secret_params: frozenset[str] = frozenset(),
        on_refused: Callable[[Scope, int], None] | None = None,
    ) -> None:
        """``limits``: the config's (``limits.*``); what the server answers itself (431,
        413, 408, ...) is rendered by :mod:`proxy.responses`, in the shape of the API
        the request's path belongs to."""
        self.app = app
        self.limits = limits
        self.max_connections = max_connections
        self.secret_params = secret_params
        self.on_refused = on_refused  # a request refused here, its head read: (its scope, the status)
        self.connections: dict[Connection, None] = {}  # oldest first
        self.read_buffer = memoryview(bytearray(READ_BUFFER))
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self._closed: asyncio.Event | None = None  # set once the last connection is gone (stopping)

    def refused(self, scope: Scope, status: int) -> None:
        """Tell ``on_refused`` (the trace) of a request refused here; never raises."""
        if self.on_refused is None:
            return
        try:
            self.on_refused(scope, status)
        except Exception:  # a bug of the recorder's must not touch the connection
            log.exception("recording a refused request failed")

    def protocol(self) -> Connection:
        return Connection(self)

    # -- the cap on connections -------------------------------------------------------
    def admit(self, conn: Connection) -> bool:
        """Take ``conn`` in; when that passes the cap, make room or refuse it."""
        self.connections[conn] = None
        if len(self.connections) <= self.max_connections:
            return True
        victim = next((c for c in self.connections if c is not conn and c.idle and c.incoming is None), None)
        if victim is None:
            victim = next((c for c in self.connections if c is not conn and c.idle), None)
        if victim is not None:
            self.forget(victim)
            victim.close()
            return True
        log.warning("refusing a connection: %d are open, each with a request in flight", len(self.connections) - 1)
        conn.refuse(503, "too_many_connections", "prefixpin has too many open connections (limits.max_connections)")
        return False

    def forget(self, conn: Connection) -> None:
        self.connections.pop(conn, None)
        if self._closed is not None and not self.connections:
            self._closed.set()

    # -- requests ---------------------------------------------------------------------
    def start(self, cycle: Cycle, loop: asyncio.AbstractEventLoop) -> None:
        """Serve ``cycle`` in a task of its own on ``loop`` (its connection's: looked up
        once per connection, not per request)."""
        task = loop.create_task(cycle.run(self.app))
        cycle.serving(task)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def log_access(self, cycle: Cycle) -> None:
        scope = cycle.scope
        target = scope["raw_path"].decode("latin-1")
        if scope["query_string"]:
            target = redact_query(target + "?" + scope["query_string"].decode("latin-1"), self.secret_params)
        client = scope["client"]
        peer = f"{client[0]}:{client[1]}" if client else "-"
        note = (scope.get("extensions") or {}).get(ACCESS_NOTE)
        line = '%s - "%s %s HTTP/%s" %d'
        args = [peer, scope["method"], target, scope["http_version"], cycle.status]
        if note:
            line += " %s"
            args.append(note)
        access_log.info(line, *args)

    # -- stopping ---------------------------------------------------------------------
    async def shutdown(self, grace_s: float) -> None:
        """Close idle connections now, the others once their request is answered
        (keep-alive off); after ``grace_s``, end what is still running (see the module
        docstring), then close every connection."""
        self.stopping = True
        for conn in list(self.connections):
            if conn.idle:
                conn.close()
            elif conn.cycle is not None:
                conn.cycle.keep_alive = False
        tasks = list(self.tasks)
        if tasks:
            log.info("stopping: %d request(s) in flight get up to %g s to finish", len(tasks), grace_s)
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            if pending:
                self._cut(grace_s)
                for task in pending:
                    task.cancel()
                await asyncio.wait(pending, timeout=FLUSH_S)  # their cleanup: upstream connections closed
        for conn in list(self.connections):
            conn.close()  # what was written still goes out
        await self._flushed(FLUSH_S)
        for conn in list(self.connections):
            conn.abort()

    def _cut(self, grace_s: float) -> None:
        """End every request still running; one log line each."""
        message = "prefixpin is shutting down: the response was ended before it was complete"
        for conn in list(self.connections):
            cycle = conn.cycle
            if cycle is None:
                continue
            path = cycle.scope["raw_path"]
            what = cycle.cut(shutdown_event(path, message), refusal(path, 503, "server_shutdown", message))
            if what == "complete":
                continue  # answered; the app is only finishing up
            log.warning(
                'shutdown: "%s %s" still running after %g s: %s',
                cycle.scope["method"],
                path.decode("latin-1"),
                grace_s,
                what,
            )

    async def _flushed(self, timeout: float) -> None:
        """Until every connection is closed (its last bytes written), or ``timeout``."""
        if self.connections:
            self._closed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._closed.wait()


class Lifespan:
    """The ASGI lifespan protocol, run against the app: startup, then shutdown."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._replies: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await self._inbox.put({"type": "lifespan.startup"})
        reply = await self._replies.get()
        if reply["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the app failed to start: {reply.get('message', '')}")

    async def shutdown(self) -> None:
        if self._task is None or self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        await self._replies.get()
        await self._task

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        try:
            await self.app(scope, self._inbox.get, self._replies.put)
        except Exception as exc:
            log.exception("the app's lifespan failed")
            await self._replies.put({"type": "lifespan.startup.failed", "message": str(exc)})


def bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (a name or an address; IPv6 only for an
    IPv6 address), not yet listening."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
    except BaseException:
        sock.close()
        raise
    return sock


def listen(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket (``reuse_port``: one of several processes on the port)."""
    sock = bind(host, port, reuse_port=reuse_port)
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


def claim(host: str, port: int) -> socket.socket:
    """A hold on the port for processes that will each listen on it with
    ``SO_REUSEPORT`` (proxy.workers).  Bound first without it: that fails while
    anything else holds the port (another prefixpin too), where the workers'
    sockets alone would quietly share it.  Then held with it, so they can join."""
    with bind(host, port) as plain:
        port = plain.getsockname()[1]  # port 0 becomes one
    return bind(host, port, reuse_port=True)


async def serve(
    server: Server,
    sockets: list[socket.socket],
    *,
    grace_s: float = 30.0,
    on_ready: Callable[[], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until SIGTERM / SIGINT (or ``stop`` is set), then stop gracefully."""
    loop = asyncio.get_running_loop()
    lifespan = Lifespan(server.app)
    await lifespan.startup()
    stop = stop or asyncio.Event()
    listeners: list[Any] = [await loop.create_server(server.protocol, sock=s, backlog=BACKLOG) for s in sockets]
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests)
            loop.add_signal_handler(sig, stop.set)
    if on_ready is not None:
        on_ready()
    try:
        await stop.wait()
    finally:
        for listener in listeners:
            listener.close()
        await server.shutdown(grace_s)
        await lifespan.shutdown()


__all__ = ["Lifespan", "Server", "bind", "claim", "connection_cap", "listen", "serve"]
