"""A channel between the serve process and one of its workers: calls both ways.

Frames are a 4-byte big-endian length and a pickle of ``(kind, id, name, value)``:
a call (``kind`` 0) names an operation and carries its arguments; its answer
(1: the value, 2: an error's message) carries the call's ``id``.  Both ends are
processes of one prefixpin installation that the serve process started itself
(a socketpair, never a listening socket), so unpickling what the other end sent
trusts nothing it did not already trust.

A cast (``id`` 0) is a call that wants no answer.  A call is answered by
``handle(name, args)``, run as its frame arrives: a plain
value is the answer at once (the store's calls: no task, no await), an awaitable
(an operation that itself waits on other links, such as a metrics scrape) is
awaited in a task while frames go on being read.  It is an asyncio protocol, not
streams.  (The store's writes between workers do not travel here: see
proxy.store.replica.)
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any

log = logging.getLogger("prefixpin")

_HEAD = struct.Struct(">I")
_CALL, _VALUE, _ERROR = 0, 1, 2
MAX_FRAME = 1 << 30

Handle = Callable[[str, tuple[Any, ...]], Any]


class LinkClosed(ConnectionError):
    """The other end is gone (or did not answer in time)."""


def frame(value: Any) -> bytes:
    """One frame: a 4-byte big-endian length, then the pickle of ``value``."""
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEAD.pack(len(payload)) + payload


def unframe(buf: bytearray) -> list[Any]:
    """The values of the whole frames at the start of ``buf``, in order, removed from it
    (the start of a frame still arriving stays).  A frame over ``MAX_FRAME`` raises
    ValueError, a damaged one what pickle raises: the caller drops that channel."""
    out: list[Any] = []
    pos = 0
    try:
        while len(buf) - pos >= 4:
            (size,) = _HEAD.unpack_from(buf, pos)
            if size > MAX_FRAME:
                raise ValueError(f"frame of {size} bytes")
            if len(buf) - pos - 4 < size:
                break
            out.append(pickle.loads(memoryview(buf)[pos + 4 : pos + 4 + size]))
            pos += 4 + size
    finally:
        del buf[:pos]
    return out


def encode(kind: int, call_id: int, name: str, value: Any) -> bytes:
    return frame((kind, call_id, name, value))


def run_sync(coro: Any) -> Any:
    """The value of a coroutine that never suspends (the memory store's methods)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a call that should not wait did")


class Link(asyncio.Protocol):
    """One end of a channel.  ``closed`` is set when the other end goes; ``lost``
    (a future) completes then too."""

    def __init__(self, handle: Handle, *, name: str = "link") -> None:
        self.handle = handle
        self.name = name
        self.closed = False
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._batch: list[bytes] | None = None
        self._next = 0
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(cls, sock: socket.socket, handle: Handle, *, name: str = "link") -> Link:
        loop = asyncio.get_running_loop()
        _, link = await loop.connect_accepted_socket(lambda: cls(handle, name=name), sock=sock)
        return link

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()

    async def call(self, name: str, *args: Any, timeout: float | None = None) -> Any:
        """Ask the other end; raises :class:`LinkClosed` when it is gone or took
        longer than ``timeout``, RuntimeError with its message when it failed."""
        if self.closed or self.transport is None:
            raise LinkClosed(f"{self.name} is closed")
        self._next += 1
        call_id = self._next
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending[call_id] = fut
        timer = loop.call_later(timeout, self._expire, call_id) if timeout is not None else None
        try:
            self.transport.write(encode(_CALL, call_id, name, args))
            return await fut
        finally:
            self._pending.pop(call_id, None)
            if timer is not None:
                timer.cancel()

    def cast(self, name: str, *args: Any) -> None:
        """Tell the other end, wanting no answer (it handles the link's frames in
        order, so a later call sees what this one did)."""
        if self.closed or self.transport is None:
            raise LinkClosed(f"{self.name} is closed")
        self.transport.write(encode(_CALL, 0, name, args))

    def _expire(self, call_id: int) -> None:
        fut = self._pending.pop(call_id, None)
        if fut is not None and not fut.done():
            fut.set_exception(LinkClosed(f"{self.name}: no answer in time"))

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        batch: list[bytes] = []
        self._batch = batch  # answers to the frames of one read go out in one write
        try:
            for kind, call_id, name, value in unframe(buf):
                self._frame(kind, call_id, name, value)
        except Exception:
            log.exception("%s: unreadable frame; closing it", self.name)
            self.close()
            return
        finally:
            self._batch = None
            if batch and not self.closed and self.transport is not None:
                self.transport.write(b"".join(batch))

    def _frame(self, kind: int, call_id: int, name: str, value: Any) -> None:
        if kind == _CALL:
            self._answer(call_id, name, value)
            return
        fut = self._pending.get(call_id)
        if fut is not None and not fut.done():
            if kind == _VALUE:
                fut.set_result(value)
            else:
                fut.set_exception(RuntimeError(value))

    def _answer(self, call_id: int, name: str, value: Any) -> None:
        try:
            result = self.handle(name, value)
        except Exception as exc:
            if call_id:
                self._reply(_ERROR, call_id, name, f"{type(exc).__name__}: {exc}")
            else:
                log.warning("%s: %s failed: %s", self.name, name, exc)
            return
        if inspect.isawaitable(result):
            task = asyncio.get_running_loop().create_task(self._later(call_id, name, result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._reply(_VALUE, call_id, name, result)

    async def _later(self, call_id: int, name: str, result: Any) -> None:
        try:
            value = await result
        except Exception as exc:
            self._reply(_ERROR, call_id, name, f"{type(exc).__name__}: {exc}")
        else:
            self._reply(_VALUE, call_id, name, value)

    def _reply(self, kind: int, call_id: int, name: str, value: Any) -> None:
        if not call_id or self.closed or self.transport is None:
            return
        frame = encode(kind, call_id, name, value)
        if self._batch is not None:
            self._batch.append(frame)
        else:
            self.transport.write(frame)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(LinkClosed(f"{self.name} closed"))
        self._pending.clear()
        for task in self._tasks:
            task.cancel()
        if self.transport is not None:
            self.transport.close()
        if not self.lost.done():
            self.lost.set_result(None)
