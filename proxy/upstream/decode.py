"""Content codings a response may arrive in, undone for the reply machine.

prefixpin asks for ``accept-encoding: identity`` on the wire APIs' routes: it
reads those responses (usage, the fork guard, the reply a next turn replays).
An upstream that compresses anyway gets its body decoded (``gzip``,
``deflate``, ``br``) and relayed decoded, its ``content-encoding`` dropped; a
coding prefixpin cannot undo (``zstd``, ``compress``, several stacked) is relayed
as it came, with its header, and not read.  Other routes pass bytes through
untouched and never come here.
"""

from __future__ import annotations

import zlib
from typing import Protocol

import brotli  # type: ignore[import-untyped]


class Decoder(Protocol):
    def feed(self, data: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class _Zlib:
    def __init__(self, wbits: int) -> None:
        self._d = zlib.decompressobj(wbits)
        self._first = wbits != -zlib.MAX_WBITS

    def feed(self, data: bytes) -> bytes:
        try:
            return self._d.decompress(data)
        except zlib.error:
            if not self._first:
                raise
            # "deflate" is often raw deflate, without the zlib wrapper it names
            self._d, self._first = zlib.decompressobj(-zlib.MAX_WBITS), False
            return self._d.decompress(data)

    def flush(self) -> bytes:
        return self._d.flush()


class _Brotli:
    def __init__(self) -> None:
        self._d = brotli.Decompressor()

    def feed(self, data: bytes) -> bytes:
        return bytes(self._d.process(data))

    def flush(self) -> bytes:
        return b""


def decoder(coding: bytes | None) -> Decoder | None:
    """A decoder for ``content-encoding: coding``; None when there is nothing to undo
    (no coding, ``identity``) — and ValueError when prefixpin cannot undo it."""
    if coding is None:
        return None
    name = coding.strip().lower()
    if name in (b"", b"identity"):
        return None
    if name in (b"gzip", b"x-gzip"):
        return _Zlib(zlib.MAX_WBITS | 16)
    if name == b"deflate":
        return _Zlib(zlib.MAX_WBITS)
    if name == b"br":
        return _Brotli()
    raise ValueError(f"content-encoding {name.decode('latin-1')!r} is not one prefixpin decodes")


__all__ = ["Decoder", "decoder"]
