"""What a hostile upstream sends, built once per test session: decompression bombs
(a few hundred bytes or KiB that inflate to hundreds of MiB), an endless SSE line,
a huge response head; and the framing helpers the scripts send them with."""

from __future__ import annotations

import functools
import gzip
import zlib

import brotli

MiB = 1 << 20


@functools.lru_cache(maxsize=8)
def bomb(coding: str, size: int = 256 * MiB, fill: bytes = b"\0") -> bytes:
    """``size`` bytes of ``fill`` compressed with ``coding`` (gzip, deflate, br), built
    a MiB at a time (the test never holds the inflated bytes)."""
    piece = fill * (MiB // len(fill))
    if coding == "br":
        c = brotli.Compressor(quality=4)  # as small, built 30x faster than at 11
        return b"".join(c.process(piece) for _ in range(size // MiB)) + c.finish()
    z = zlib.compressobj(9, zlib.DEFLATED, 31 if coding == "gzip" else 15)
    return b"".join(z.compress(piece) for _ in range(size // MiB)) + z.flush()


def packed(coding: str, data: bytes) -> bytes:
    """``data`` in ``coding``."""
    if coding == "br":
        return bytes(brotli.compress(data))
    if coding == "gzip":
        return gzip.compress(data)
    return zlib.compress(data)


def head(status: bytes = b"200 OK", *headers: bytes) -> bytes:
    """A response head with ``headers`` (each ``b"name: value"``)."""
    return b"HTTP/1.1 " + status + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def dechunk(body: bytes) -> bytes:
    """A chunked body's data (as tests.infra.front.read_response returns it, framed)."""
    out = []
    at = 0
    while True:
        end = body.index(b"\r\n", at)
        size = int(body[at:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(body[end + 2 : end + 2 + size])
        at = end + 4 + size


__all__ = ["MiB", "bomb", "chunk", "dechunk", "head", "packed"]
