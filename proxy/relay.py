"""Relaying an upstream body to the client as it arrives: the one loop every
streamed response goes through (the wire APIs' streams through their reply
machine, every other route's bytes as they come).

The body is read to its end even when the client's response has ended (the
stream's last event sent), since reading it to the end is what returns the
upstream connection to the pool.  When the upstream's last bytes are in, they
end the client's response in the same write as its terminating chunk.  A
failure reading the body comes out as the upstream's :class:`UpstreamError`:
the caller decides what the client sees (an in-band error event, or a cut).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from starlette.types import Send

from proxy.upstream.message import Body


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


__all__ = ["Pieces", "relay"]
