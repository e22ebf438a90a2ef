"""The embedded store replicated in every worker (``listen.workers`` > 1).

Each worker holds a whole copy (a :class:`~proxy.store.memory.MemoryStore`) and
answers its lookups itself: no round trip on the request path.  What a worker
writes (``record``, ``record_response``) goes into its copy and, as one frame,
straight into the receive buffer of every other worker and of the serve process:
a Unix stream socket per pair (:class:`Mesh`).  The handler writes before the
client gets the response's last bytes (``remote``: ``Handler.done_first``), and a
worker reads every complete frame its buffers hold before it reads its copy.  A
client sends its next turn only once it has the answer, so that turn finds its
lineage whichever worker it reaches.

- **Starting.** The serve process holds one more copy, written by every worker
  and read by none on the request path.  A worker that starts (or restarts after
  a crash) first listens for its peers, then loads that copy (the serve process
  reads its buffers before it answers), then serves.  A peer that could not reach
  it before it listened had written to the serve process first: nothing is missed.
- **Peers.** Sockets in Linux's abstract namespace, named after a random id of the
  serve process's; a connection is accepted only from the serve process or one of
  its children (``SO_PEERCRED``), since frames are pickles.
- **Back-pressure.** A peer whose buffer is full (busy, or stalled on a long
  task) is waited on for up to ``SEND_WAIT_S``, reading our own buffers meanwhile
  (so two busy workers never wait on each other); then the rest of the frame, and
  every later one for that peer, waits in our memory, in order, and goes as the
  peer reads.  A next turn that reaches that peer before its frame does goes on as
  a root, as when a store is down: one stalled worker does not stall the others.
  A peer ``BACKLOG_BYTES`` behind is cut off (hung; logged): its copy is stale
  until it restarts.
- **What differs from one process.** Each copy applies the same writes, so the
  copies agree on what is recorded.  Two writes to the same lineage from two
  workers at the same moment may apply in either order in different copies (their
  clients raced anyway), and eviction order follows each copy's own lookups: near
  ``store.max_entries`` the copies may keep slightly different sets.  Memory: one
  copy per worker, plus the serve process's.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

from canonicalize import LineageRecord, Lookup
from proxy.errors import StoreError
from proxy.link import frame, run_sync, unframe
from proxy.store import Links
from proxy.store.memory import MemoryStore

log = logging.getLogger("prefixpin")

HUB = "hub"  # the serve process's node
SEND_WAIT_S = 0.05
BACKLOG_BYTES = 64 << 20
SNDBUF = 4 << 20  # asked for; the kernel may give less (net.core.wmem_max)
_READ = 1 << 18
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


def address(fleet: str, node: str) -> str:
    """A node's socket name: abstract namespace (no file, gone with the process)."""
    return f"\0prefixpin-{fleet}-{node}"


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return -1
    # pid (comm) state ppid ...: comm may hold spaces and parentheses
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


class _Inbound:
    __slots__ = ("buf", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()


class Mesh:
    """One node: it listens for its peers' frames and sends its own to ``peers``.

    ``apply(message)`` is called with each frame a peer sent, in the order that peer
    sent them, from :meth:`drain` (or while :meth:`publish` waits).  ``owner`` is the
    pid of the serve process: only it and its children may connect."""

    def __init__(
        self,
        fleet: str,
        node: str,
        peers: Sequence[str],
        apply: Callable[[Any], None],
        *,
        owner: int,
        send_wait_s: float = SEND_WAIT_S,
        backlog_bytes: int = BACKLOG_BYTES,
    ) -> None:
        self.fleet = fleet
        self.node = node
        self.peers = tuple(p for p in peers if p != node)
        self.apply = apply
        self.owner = owner
        self.send_wait_s = send_wait_s
        self.backlog_bytes = backlog_bytes
        self.listener: socket.socket | None = None
        self._in: dict[int, _Inbound] = {}  # by file descriptor
        self._out: dict[str, socket.socket] = {}
        self._backlog: dict[str, bytearray] = {}  # what a full peer has yet to get, in order
        self._poll = select.poll()  # the listener and every inbound socket: one syscall tells what to read
        self.refused = 0  # connections refused to a process outside the fleet

    # -- receiving ---------------------------------------------------------------------
    def listen(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(address(self.fleet, self.node))
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.listener = sock
        self._poll.register(sock, select.POLLIN)

    def _accept(self) -> None:
        listener = self.listener
        if listener is None:
            return
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("store replica %s: accept failed: %s", self.node, exc)
                return
            pid, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
            if uid != os.getuid() or (pid != self.owner and _parent_of(pid) != self.owner):
                self.refused += 1
                log.warning("store replica %s: refused a connection from pid %d (not of this server)", self.node, pid)
                sock.close()
                continue
            sock.setblocking(False)
            self._in[sock.fileno()] = _Inbound(sock)
            self._poll.register(sock, select.POLLIN)

    def drain(self) -> None:
        """Apply every complete frame the peers' sockets hold now (one ``poll`` when
        there is none, as on most requests of an idle fleet); send what waits for a
        peer that was full."""
        if self._backlog:
            for peer in list(self._backlog):
                self._flush(peer)
        ready = self._poll.poll(0)
        if not ready:
            return
        listener = self.listener
        for fd, _ in ready:
            if listener is not None and fd == listener.fileno():
                self._accept()
                for conn in list(self._in.values()):  # a new peer may have written already
                    self._read(conn)
                break
        else:
            for fd, _ in ready:
                found = self._in.get(fd)
                if found is not None:
                    self._read(found)

    def _close(self, conn: _Inbound) -> None:
        fd = conn.sock.fileno()
        if fd >= 0:
            self._poll.unregister(fd)
            self._in.pop(fd, None)
        conn.sock.close()

    def _read(self, conn: _Inbound) -> None:
        sock, buf = conn.sock, conn.buf
        while True:
            try:
                data = sock.recv(_READ)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                if buf:
                    log.warning("store replica %s: a peer left in the middle of a frame", self.node)
                self._close(conn)
                break
            buf += data
            if len(data) < _READ:
                break
        try:
            for message in unframe(buf):
                self.apply(message)
        except Exception:
            log.exception("store replica %s: unreadable frame; dropping that peer", self.node)
            self._close(conn)
            buf.clear()

    # -- sending -----------------------------------------------------------------------
    def publish(self, message: Any) -> None:
        """Put ``message`` in every peer's receive buffer before returning.  A peer
        that is not there (not started, restarting) is skipped: it loads the serve
        process's copy, which is written first, when it starts."""
        data = frame(message)
        for peer in self.peers:
            self._send(peer, data)

    def _connect(self, peer: str) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            for opt in (getattr(socket, "SO_SNDBUFFORCE", None), socket.SO_SNDBUF):
                if opt is None:
                    continue
                try:
                    sock.setsockopt(socket.SOL_SOCKET, opt, SNDBUF)
                    break
                except OSError:
                    continue
            sock.settimeout(1.0)
            sock.connect(address(self.fleet, peer))
            sock.setblocking(False)
        except OSError:  # not listening (not started, or gone): it will load the serve process's copy
            sock.close()
            return None
        self._out[peer] = sock
        return sock

    def _send(self, peer: str, data: bytes) -> None:
        waiting = self._backlog.get(peer)
        if waiting is not None:  # after what waits already, in order
            waiting += data
            if len(waiting) > self.backlog_bytes:
                mb = self.backlog_bytes >> 20
                log.error("store replica %s: peer %s is %d MB behind (hung?); cut off", self.node, peer, mb)
                self._drop(peer)
            else:
                self._flush(peer)
            return
        sock = self._out.get(peer) or self._connect(peer)
        if sock is None:
            return
        view = memoryview(data)
        deadline = 0.0
        retried = False
        while view:
            try:
                n = sock.send(view)
            except (BlockingIOError, InterruptedError):
                now = time.monotonic()
                deadline = deadline or now + self.send_wait_s
                if now >= deadline:
                    self._backlog[peer] = bytearray(view)  # sent as the peer reads (drain)
                    return
                self._wait(sock, deadline - now)
                continue
            except OSError:  # the peer is gone (or restarted): once more, on a new connection
                self._drop(peer)
                if retried or len(view) != len(data):
                    return
                retried = True
                sock = self._connect(peer)
                if sock is None:
                    return
                continue
            view = view[n:]

    def _flush(self, peer: str) -> None:
        waiting, sock = self._backlog[peer], self._out.get(peer)
        if sock is None:
            del self._backlog[peer]
            return
        try:
            n = sock.send(waiting)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(peer)
            return
        del waiting[:n]
        if not waiting:
            del self._backlog[peer]

    def _wait(self, sock: socket.socket, timeout: float) -> None:
        """Until ``sock`` may be written, reading our own buffers meanwhile (the peer
        may be waiting on us)."""
        ins = [c.sock for c in self._in.values()]
        if self.listener is not None:
            ins.append(self.listener)
        readable, _, _ = select.select(ins, [sock], [], min(timeout, 0.05))
        if readable:
            self.drain()

    def _drop(self, peer: str) -> None:
        self._backlog.pop(peer, None)
        sock = self._out.pop(peer, None)
        if sock is not None:
            sock.close()

    def close(self) -> None:
        for sock in self._out.values():
            sock.close()
        self._out.clear()
        self._backlog.clear()
        for conn in list(self._in.values()):
            self._close(conn)
        if self.listener is not None:
            self._poll.unregister(self.listener)
            self.listener.close()
            self.listener = None


def applier(store: MemoryStore) -> Callable[[Any], None]:
    """Apply a peer's write (a frame) to ``store``."""

    def apply(message: Any) -> None:
        op, *args = message
        if op == "record":
            run_sync(store.record(*args))
        elif op == "record_response":
            run_sync(store.record_response(*args))
        else:
            raise ValueError(f"unknown replicated operation {op!r}")

    return apply


class ReplicaStore:
    """The Store protocol on this worker's copy, writes sent to every peer."""

    immediate = True  # record() and record_response() never wait (proxy.addons.record)
    remote = True  # writes leave this process: the handler makes them before the client's last bytes

    def __init__(self, local: MemoryStore, mesh: Mesh | None = None) -> None:
        self.local = local
        self.mesh = mesh  # set by the worker (it needs the serve process's hello)

    def _drain(self) -> None:
        if self.mesh is not None:
            self.mesh.drain()

    def _publish(self, message: tuple[Any, ...]) -> None:
        if self.mesh is None:
            return
        try:
            self.mesh.publish(message)
        except Exception as exc:  # e.g. a value pickle refuses: this copy has it, the others do not
            raise StoreError(f"store: the write did not reach the other workers: {exc}") from exc

    async def lookup(self, tenant: str, links: Sequence[bytes], declared: str | None) -> Lookup:
        self._drain()
        return await self.local.lookup(tenant, links, declared)

    async def blobs(self, tenant: str, refs: Sequence[str]) -> list[bytes | None]:
        self._drain()
        return await self.local.blobs(tenant, refs)

    async def record(
        self, tenant: str, record: LineageRecord, links: Links, blobs: dict[str, bytes], touch: Sequence[str]
    ) -> None:
        await self.local.record(tenant, record, links, blobs, touch)
        self._publish(("record", tenant, record, list(links), blobs, list(touch)))

    async def response(self, tenant: str, response_id: str) -> tuple[str, bytes] | None:
        self._drain()
        return await self.local.response(tenant, response_id)

    async def record_response(self, tenant: str, response_id: str, lineage_id: str, tip: bytes) -> None:
        await self.local.record_response(tenant, response_id, lineage_id, tip)
        self._publish(("record_response", tenant, response_id, lineage_id, tip))

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        if self.mesh is not None:
            self.mesh.close()
        await self.local.close()
