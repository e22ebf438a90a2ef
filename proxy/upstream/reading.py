"""Reading an upstream body within bounds, without holding the event loop.

- :func:`read_whole` reads a whole body for the reply machine (a JSON answer),
  decoded, and holds at most ``limit`` bytes of it (``limits.max_decoded_bytes``):
  past that it stops and returns :class:`Over`, the bytes read so far as the
  upstream sent them, for the caller to relay as they came.
- :class:`Decoded` is a compressed body as the decoded slices it streams
  (:mod:`proxy.upstream.decode`), with a turn of the event loop between the
  slices one piece of the body makes (a 255 KiB piece may inflate to 256 MiB:
  no request waits behind it).  While asked to (``keep_raw``) it keeps the bytes
  as they came, for the same relay-as-sent fallback.

A body that is not valid in its coding, or is cut short in it, fails with
:class:`proxy.errors.UpstreamEncoding` (a 502, or an in-band error on a stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from proxy.errors import UpstreamEncoding
from proxy.upstream.decode import DecodeError, Decoder
from proxy.upstream.message import Body


@dataclass(slots=True)
class Over:
    """The body passed the bound: its bytes read so far, as the upstream sent them (the
    rest is still to be read from the body)."""

    raw: list[bytes] = field(default_factory=list)


async def read_whole(body: Body, decoder: Decoder | None, limit: int) -> bytes | Over:
    """The whole body, decoded, or :class:`Over` once more than ``limit`` bytes would be
    held.  Raises UpstreamError (UpstreamEncoding: not valid in its coding)."""
    if decoder is None:  # identity: the body is what is held
        parts: list[bytes] = []
        size = 0
        async for chunk in body:
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                return Over(parts)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    raw: list[bytes] = []
    out: list[bytes] = []
    try:
        async for chunk in body:
            raw.append(chunk)
            for i, piece in enumerate(decoder.feed(chunk)):
                if i:
                    await asyncio.sleep(0)  # another slice of the same piece: the loop's turn first
                out.append(piece)
                if decoder.decoded > limit:
                    return Over(raw)
        out.extend(decoder.end())
    except DecodeError as exc:
        raise UpstreamEncoding(f"the upstream's response body is corrupt: {exc}") from None
    return b"".join(out)


class Decoded:
    """``inner``'s decoded slices, as a body (proxy.upstream.message.Body)."""

    __slots__ = ("_decoder", "_inner", "keep_raw", "raw")

    def __init__(self, inner: Body, decoder: Decoder, *, keep_raw: bool = False) -> None:
        self._inner = inner
        self._decoder = decoder
        self.keep_raw = keep_raw
        self.raw: list[bytes] = []  # the body as it came, while keep_raw

    @property
    def inner(self) -> Body:
        """The body as the upstream sends it."""
        return self._inner

    def forget_raw(self) -> None:
        """Keep no more of the body as it came (the decoded bytes went out)."""
        self.keep_raw = False
        self.raw = []

    async def __aiter__(self) -> AsyncIterator[bytes]:
        decoder = self._decoder
        try:
            async for chunk in self._inner:
                if self.keep_raw:
                    self.raw.append(chunk)
                for i, piece in enumerate(decoder.feed(chunk)):
                    if i:
                        await asyncio.sleep(0)
                    yield piece
            for piece in decoder.end():
                yield piece
        except DecodeError as exc:
            raise UpstreamEncoding(f"the upstream's response body is corrupt: {exc}") from None

    def at_end(self) -> bool:
        return False  # the decoder may hold the last bytes: the relay ends the response itself

    async def aclose(self) -> None:
        await self._inner.aclose()


__all__ = ["Decoded", "Over", "read_whole"]
