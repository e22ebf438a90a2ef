"""The one body writer: an upstream body to the client as it arrives, whole or
streamed (the wire APIs' streams through their reply machine, a whole answer as
:class:`One` piece, every other route's bytes as they come).

The body is read to its end even when the client's response has ended (the
stream's last event sent), since reading it to the end is what returns the
upstream connection to the pool.  When the upstream's last bytes are in, they
end the client's response in the same write as its terminating chunk.  A
failure reading the body comes out as the upstream's :class:`UpstreamError`:
the caller decides what the client sees (an in-band error event, or a cut).

The relay goes at the client's pace: each ``send`` returns once the client's
connection can take more (proxy.front.cycle), so a slow reader pauses the
upstream read.  :class:`HeldHead` holds a response head until its first body
bytes, and :class:`AsSent` is how ``pieces`` say, before anything went out, that
the answer must go as the upstream sent it instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from starlette.types import Message, Send

from proxy.upstream.message import Body


class AsSent(Exception):
    """Raised by a :class:`Pieces` before anything went out: the body is to be relayed
    as the upstream sent it (its head and bytes), not as ``pieces`` would make it."""


class HeldHead:
    """``send`` with the response head held until the first body bytes (or the end):
    an answer that must still be able to go out as the upstream sent it, until its
    first bytes are decided.  ``on_sent`` is called once the head went out."""

    __slots__ = ("_on_sent", "_start", "send", "sent")

    def __init__(self, send: Send, start: Message, on_sent: Callable[[], None] | None = None) -> None:
        self.send = send  # the client's, unheld
        self._start = start
        self._on_sent = on_sent
        self.sent = False

    async def __call__(self, message: Message) -> None:
        if not self.sent:
            if message.get("more_body", False) and not message.get("body"):
                return  # nothing decided yet
            self.sent = True
            if self._on_sent is not None:
                self._on_sent()
            await self.send(self._start)
        await self.send(message)


class One:
    """A body of one piece: an answer read whole, written as the rest of the response.
    Its own iterator (an async generator would cost the loop's bookkeeping of one)."""

    __slots__ = ("_read", "content")

    def __init__(self, content: bytes) -> None:
        self.content = content
        self._read = False

    def __aiter__(self) -> One:
        return self

    async def __anext__(self) -> bytes:
        if self._read:
            raise StopAsyncIteration
        self._read = True
        return self.content

    def at_end(self) -> bool:
        return self._read

    def take(self) -> bytes:
        """Its one piece, read (what iterating it gives, without the iteration's end)."""
        self._read = True
        return self.content

    async def aclose(self) -> None:
        return None


class Pieces(Protocol):
    """What the bytes go through on their way: ``feed`` each piece, ``end`` for what
    it held back (a partial SSE line) once the body is over; ``last`` once the piece
    fed holds the stream's last event (a client stops reading there: chat's
    ``[DONE]``), which may come before the body's end."""

    def feed(self, chunk: bytes) -> bytes: ...

    def end(self) -> bytes: ...

    @property
    def last(self) -> bool: ...


async def relay(
    send: Send,
    body: Body,
    pieces: Pieces | None = None,
    *,
    before_end: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Send ``body`` (through ``pieces``) as the rest of the client's response, and end
    it; ``before_end`` is awaited just before the last bytes go out, or before the
    stream's last event does if that comes first (a client that stops reading there
    has what it waits for only once ``before_end`` is done)."""
    if type(body) is One and pieces is None:  # an answer read whole: its one piece ends the response
        content = body.take()
        if before_end is not None:
            await before_end()
        await send({"type": "http.response.body", "body": content})
        return
    ended = False
    wait = before_end  # None once awaited
    async for chunk in body:
        if ended:
            continue
        if pieces is not None:
            chunk = pieces.feed(chunk)
        if body.at_end():
            ended = True
            if pieces is not None:
                chunk += pieces.end()
            if wait is not None:
                await wait()
            await send({"type": "http.response.body", "body": chunk})
        elif chunk:
            if wait is not None and pieces is not None and pieces.last:
                await wait()
                wait = None
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    if not ended:
        tail = pieces.end() if pieces is not None else b""
        if wait is not None:
            await wait()
        await send({"type": "http.response.body", "body": tail})


__all__ = ["AsSent", "HeldHead", "One", "Pieces", "relay"]
