"""Content codings a response may arrive in, undone in bounded slices.

prefixpin asks for ``accept-encoding: identity`` on the wire APIs' routes: it
reads those responses (usage, the fork guard, the reply a next turn replays).
An upstream that compresses anyway gets its body decoded (``gzip``,
``deflate``, ``br``); a coding prefixpin cannot undo (``zstd``, ``compress``,
several stacked) is relayed as it came, with its header, and not read.  Other
routes pass bytes through untouched and never come here.

A :class:`Decoder` never makes more than ``slice_bytes`` of output in one step:
:meth:`Decoder.feed` yields the output slice by slice, so its caller can give
the event loop a turn between slices and stop at a bound of its own (a 255 KiB
gzip body that inflates to 256 MiB costs one slice of memory at a time, and
nothing once the caller stops).  Bytes that are not the coding they claim
(:class:`DecodeError`), and a body that ends before its compressed data does
(:meth:`Decoder.end`), are errors: never relabelled as identity, never a body
silently cut short.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import brotli  # type: ignore[import-untyped]

SLICE_BYTES = 256 * 1024  # decoded bytes made per step: ~0.3 ms of zlib, the loop's longest turn here


class DecodeError(ValueError):
    """The body is not valid in its content coding, or ends before its compressed data."""


class Undecodable(ValueError):
    """A content coding prefixpin does not undo (the body is relayed as it came)."""


class Decoder:
    """One body's content coding, undone in slices; the base class of each coding's."""

    coding: str = ""

    def __init__(self, slice_bytes: int = SLICE_BYTES) -> None:
        self.slice_bytes = slice_bytes
        self.decoded = 0  # bytes made so far
        self.fed = False  # any body bytes at all (an empty body has nothing to undo)

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The decoded bytes of ``data`` (the next piece of the body), in slices of at
        most ``slice_bytes``; DecodeError when the bytes are not this coding."""
        raise NotImplementedError

    def end(self) -> Iterator[bytes]:
        """What is left once the body is over; DecodeError when the compressed data is
        incomplete (the body was cut short)."""
        raise NotImplementedError


class _Zlib(Decoder):
    """gzip (several members, as RFC 1952 allows) and deflate (zlib-wrapped, or raw as
    many servers send it)."""

    def __init__(self, coding: str, slice_bytes: int = SLICE_BYTES) -> None:
        super().__init__(slice_bytes)
        self.coding = coding
        self._gzip = coding == "gzip"
        self._d = self._new()
        self._raw_fallback = coding == "deflate"  # until zlib's 2-byte header is seen valid: it may be raw
        self._seen = b""  # the bytes fed while it may still be raw, to feed a raw decoder instead

    def _new(self) -> Any:  # zlib's decompressor type has no public name
        return zlib.decompressobj(zlib.MAX_WBITS | 16 if self._gzip else zlib.MAX_WBITS)

    def feed(self, data: bytes) -> Iterator[bytes]:
        limit = self.slice_bytes
        self.fed = self.fed or bool(data)
        if self._raw_fallback:
            self._seen += data
        while True:
            d = self._d
            if d.eof:
                if not data:
                    return
                if not self._gzip:
                    raise DecodeError(f"bytes after the end of the {self.coding} data")
                self._d = d = self._new()  # the next gzip member
            try:
                out = d.decompress(data, limit)
            except zlib.error as exc:
                if not self._raw_fallback:
                    raise DecodeError(f"the body is not valid {self.coding} data ({exc})") from None
                # "deflate" is often raw deflate, without the zlib wrapper it names
                self._raw_fallback = False
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)
                data, self._seen = self._seen, b""
                continue
            if self._raw_fallback and len(self._seen) >= 2:
                self._raw_fallback, self._seen = False, b""  # a valid zlib header
            if out:
                self.decoded += len(out)
                yield out
            rest = d.unused_data if d.eof else d.unconsumed_tail
            if len(out) < limit and not rest:
                return  # all input taken, nothing more pending
            data = rest

    def end(self) -> Iterator[bytes]:
        yield from self.feed(b"")
        if self.fed and not self._d.eof:
            raise DecodeError(f"the {self.coding} data ends before its end (the body was cut short)")


class _Brotli(Decoder):
    coding = "br"

    def __init__(self, slice_bytes: int = SLICE_BYTES) -> None:
        super().__init__(slice_bytes)
        self._d = brotli.Decompressor()

    def feed(self, data: bytes) -> Iterator[bytes]:
        d, limit = self._d, self.slice_bytes
        self.fed = self.fed or bool(data)
        while True:
            try:
                out = d.process(data, output_buffer_limit=limit)
            except brotli.error as exc:
                raise DecodeError(f"the body is not valid br data ({exc})") from None
            data = b""  # until the output is drained, brotli takes no more input
            if out:
                self.decoded += len(out)
                yield out
            elif d.can_accept_more_data() or d.is_finished():
                return

    def end(self) -> Iterator[bytes]:
        yield from self.feed(b"")
        if self.fed and not self._d.is_finished():
            raise DecodeError("the br data ends before its end (the body was cut short)")


def decoder(coding: bytes | None, slice_bytes: int = SLICE_BYTES) -> Decoder | None:
    """A decoder for ``content-encoding: coding``; None when there is nothing to undo
    (no coding, ``identity``), :class:`Undecodable` when prefixpin cannot undo it."""
    if coding is None:
        return None
    name = coding.strip().lower()
    if name in (b"", b"identity"):
        return None
    if name in (b"gzip", b"x-gzip"):
        return _Zlib("gzip", slice_bytes)
    if name == b"deflate":
        return _Zlib("deflate", slice_bytes)
    if name == b"br":
        return _Brotli(slice_bytes)
    raise Undecodable(f"content-encoding {name.decode('latin-1')!r} is not one prefixpin decodes")


__all__ = ["SLICE_BYTES", "DecodeError", "Decoder", "Undecodable", "decoder"]
