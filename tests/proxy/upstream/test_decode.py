"""proxy.upstream.decode and proxy.upstream.reading: content codings undone in bounded
slices, with the event loop's turn between the slices of one piece; corrupt and cut
codings refused; a whole body read up to its bound."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator

import pytest

from proxy.errors import UpstreamEncoding
from proxy.upstream.decode import DecodeError, Decoder, Undecodable, decoder
from proxy.upstream.message import Bytes
from proxy.upstream.reading import Decoded, Over, read_whole
from tests.infra import hostile
from tests.infra.hostile import MiB

PLAIN = b'{"id":"x","choices":[{"message":{"content":"hello"}}]}' * 2000
SLICE = 64 * 1024


def run(d: Decoder, data: bytes, step: int = 4096) -> tuple[bytes, int]:
    """Everything ``d`` makes of ``data`` fed ``step`` bytes at a time, and its largest slice."""
    out: list[bytes] = []
    for i in range(0, len(data), step):
        out.extend(d.feed(data[i : i + step]))
    out.extend(d.end())
    return b"".join(out), max((len(p) for p in out), default=0)


def make(coding: bytes) -> Decoder:
    d = decoder(coding, SLICE)
    assert d is not None
    return d


@pytest.mark.parametrize(
    ("coding", "data"),
    [
        (b"gzip", gzip.compress(PLAIN)),
        (b"x-gzip", gzip.compress(PLAIN)),
        (b"deflate", zlib.compress(PLAIN)),
        (b"deflate", zlib.compress(PLAIN)[2:-4]),  # raw deflate, as many servers send it
        (b"br", hostile.packed("br", PLAIN)),
        (b" GZIP ", gzip.compress(PLAIN)),
    ],
)
@pytest.mark.parametrize("step", [1, 7, 4096, 1 << 30])
def test_each_coding_is_undone_whatever_the_pieces(coding: bytes, data: bytes, step: int) -> None:
    out, _ = run(make(coding), data, step)
    assert out == PLAIN


def test_gzip_members_in_a_row_are_one_body() -> None:  # RFC 1952 2.2
    out, _ = run(make(b"gzip"), gzip.compress(PLAIN) + gzip.compress(b"tail"))
    assert out == PLAIN + b"tail"


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br"])
def test_no_slice_is_larger_than_the_bound_whatever_one_piece_inflates_to(coding: str) -> None:
    d = make(coding.encode())
    bomb = hostile.bomb(coding, 64 * MiB)
    largest = total = 0
    for piece in d.feed(bomb):  # one piece: 64 MiB once inflated
        largest, total = max(largest, len(piece)), total + len(piece)
        if total > 4 * MiB:
            break  # the caller stops: nothing more is made
    assert largest <= 2 * SLICE  # brotli's buffer grows in steps: at most one step past the slice
    assert d.decoded == total


@pytest.mark.parametrize(
    ("coding", "data"),
    [
        (b"gzip", PLAIN),
        (b"br", PLAIN),
        (b"deflate", b"\xff" * 64),
        (b"gzip", gzip.compress(b"x") + b"not a member"),
        (b"deflate", zlib.compress(b"x") + b"after the end"),
    ],
)
def test_bytes_that_are_not_the_coding_they_claim_are_an_error(coding: bytes, data: bytes) -> None:
    with pytest.raises(DecodeError, match=r"not valid|after the end"):
        run(make(coding), data)


@pytest.mark.parametrize(
    ("coding", "data"),
    [
        (b"gzip", gzip.compress(PLAIN)[:-8]),  # the trailer missing
        (b"gzip", gzip.compress(PLAIN)[: len(gzip.compress(PLAIN)) // 2]),
        (b"deflate", zlib.compress(PLAIN)[:-10]),
        (b"br", hostile.packed("br", PLAIN)[:-2]),
    ],
)
def test_a_body_cut_short_in_its_coding_is_an_error_never_a_shorter_body(coding: bytes, data: bytes) -> None:
    with pytest.raises(DecodeError, match="cut short"):
        run(make(coding), data)


def test_an_empty_body_has_nothing_to_undo() -> None:
    for coding in (b"gzip", b"deflate", b"br"):
        assert run(make(coding), b"") == (b"", 0)


def test_identity_and_unknown_codings() -> None:
    assert decoder(None) is None and decoder(b"identity") is None and decoder(b"") is None
    for coding in (b"zstd", b"compress", b"gzip, br"):
        with pytest.raises(Undecodable):
            decoder(coding)


# -- reading a body: the loop's turn between slices, the bound ----------------------------------------------


class Pieces:
    """A body of the given pieces (proxy.upstream.message.Body)."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = list(pieces)
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.pieces:
            yield self.pieces.pop(0)

    def at_end(self) -> bool:
        return not self.pieces

    async def aclose(self) -> None:
        self.closed = True


async def _turns_while(work: asyncio.Future[object]) -> int:
    """How many times another task ran while ``work`` was being done."""
    turns = 0
    while not work.done():
        turns += 1
        await asyncio.sleep(0)
    return turns


def test_one_piece_that_inflates_a_lot_gives_the_loop_turns_while_it_is_decoded() -> None:
    async def main() -> tuple[int, bytes | Over]:
        body = Pieces(hostile.bomb("gzip", 16 * MiB))  # one piece
        work = asyncio.ensure_future(read_whole(body, decoder(b"gzip", SLICE), 64 * MiB))
        turns = await _turns_while(work)
        return turns, await work

    turns, content = asyncio.run(main())
    assert isinstance(content, bytes) and len(content) == 16 * MiB
    assert turns >= (16 * MiB) // (2 * SLICE) - 1  # about one per slice


def test_a_decoded_stream_gives_the_loop_turns_too() -> None:
    async def main() -> tuple[int, int]:
        body = Decoded(Pieces(hostile.bomb("br", 16 * MiB)), make(b"br"))

        async def drain() -> int:
            return sum([len(p) async for p in body])

        work = asyncio.ensure_future(drain())
        turns = await _turns_while(work)
        return turns, await work

    turns, size = asyncio.run(main())
    assert size == 16 * MiB and turns >= 16


def test_a_whole_body_past_the_bound_stops_and_hands_back_the_bytes_as_sent() -> None:
    bomb = hostile.bomb("gzip", 64 * MiB)
    pieces = [bomb[i : i + 1000] for i in range(0, len(bomb), 1000)]
    body = Pieces(*pieces)
    got = asyncio.run(read_whole(body, decoder(b"gzip", SLICE), 1 * MiB))
    assert isinstance(got, Over)
    assert b"".join(got.raw) + b"".join(body.pieces) == bomb  # what was read, then the rest, unread


def test_an_identity_body_past_the_bound_is_handed_back_too() -> None:
    body = Pieces(b"a" * 600, b"b" * 600, b"c" * 600)
    got = asyncio.run(read_whole(body, None, 1000))
    assert isinstance(got, Over) and got.raw == [b"a" * 600, b"b" * 600] and body.pieces == [b"c" * 600]
    assert asyncio.run(read_whole(Bytes(b"x" * 1000), None, 1000)) == b"x" * 1000


def test_a_corrupt_body_is_prefixpins_upstream_error() -> None:
    with pytest.raises(UpstreamEncoding, match="corrupt"):
        asyncio.run(read_whole(Pieces(b"not gzip"), decoder(b"gzip"), 1 * MiB))

    async def stream() -> None:
        async for _ in Decoded(Pieces(gzip.compress(PLAIN)[:-20]), make(b"gzip")):
            pass

    with pytest.raises(UpstreamEncoding, match="cut short"):
        asyncio.run(stream())


def test_a_decoded_body_keeps_the_bytes_as_sent_only_while_asked() -> None:
    data = gzip.compress(PLAIN)
    body = Decoded(Pieces(data[:100], data[100:]), make(b"gzip"), keep_raw=True)

    async def first() -> bytes:
        async for piece in body:
            return piece
        return b""

    asyncio.run(first())
    assert body.raw == [data[:100]]
    body.forget_raw()
    assert body.raw == [] and not body.keep_raw
