"""proxy.relay: ``before_end`` (a shared store's record) is done before the client can
have what it waits for: the body's last bytes, or the stream's last event when that
comes first (chat's ``data: [DONE]`` before the upstream's end)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from proxy.relay import One, relay


class Chunks:
    """A body read piece by piece; its end is known only once the last piece is read."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = list(pieces)
        self.read = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            self.read += 1
            yield piece

    def at_end(self) -> bool:
        return self.read == len(self.pieces)

    async def aclose(self) -> None:
        return None


class Events:
    """Pieces passed through as they are; ``last`` once ``[DONE]`` went by."""

    def __init__(self) -> None:
        self.last = False

    def feed(self, chunk: bytes) -> bytes:
        self.last = self.last or b"[DONE]" in chunk
        return chunk

    def end(self) -> bytes:
        return b""


def _run(body: Chunks, pieces: Events | None) -> list[Any]:
    log: list[Any] = []

    async def send(message: dict[str, Any]) -> None:
        log.append(message["body"])

    async def before_end() -> None:
        log.append("recorded")

    asyncio.run(relay(send, body, pieces, before_end=before_end))  # type: ignore[arg-type]
    return log


def test_the_record_goes_before_the_last_event_when_it_comes_first() -> None:
    body = Chunks(b"data: {}\n\n", b"data: [DONE]\n\n", b"")
    assert _run(body, Events()) == [b"data: {}\n\n", "recorded", b"data: [DONE]\n\n", b""]


def test_the_record_goes_before_the_last_bytes_once() -> None:
    body = Chunks(b"data: {}\n\n", b"data: [DONE]\n\n")
    assert _run(body, Events()) == [b"data: {}\n\n", "recorded", b"data: [DONE]\n\n"]
    assert _run(Chunks(b"a", b"b"), None) == [b"a", "recorded", b"b"]


def test_an_answer_read_whole_ends_the_response_in_one_message_after_the_record() -> None:
    body = One(b'{"id": "x"}')
    assert _run(body, None) == ["recorded", b'{"id": "x"}']  # type: ignore[arg-type]
    assert body.at_end()
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    asyncio.run(relay(send, One(b"")))  # type: ignore[arg-type]
    assert messages == [{"type": "http.response.body", "body": b""}]  # no more_body: the end
    # The same bytes as a body of one piece read by iteration would give.
    assert _run(Chunks(b'{"id": "x"}'), None) == ["recorded", b'{"id": "x"}']
