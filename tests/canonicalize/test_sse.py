"""canonicalize.sse: incremental SSE splitting that never assumes one event per chunk."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from canonicalize.sse import Event, SSESplitter, encode

# Three events separated by \n\n, one by \r\n\r\n, with multi-byte UTF-8
# (2, 3 and 4 bytes), a comment, an event: line and a multi-line data field.
STREAM = (
    ": keep-alive\n\n"
    'event: message_start\ndata: {"type":"message_start","text":"é — €"}\n\n'
    'data: {"choices":[{"delta":{"content":"🚀 ok"}}]}\r\n\r\n'
    "data: line one\ndata: line two\nid: 7\n\n"
    "data: [DONE]\n\n"
).encode()

EXPECTED = [
    Event(b": keep-alive\n\n", None),
    Event(
        'event: message_start\ndata: {"type":"message_start","text":"é — €"}\n\n'.encode(),
        '{"type":"message_start","text":"é — €"}'.encode(),
    ),
    Event(
        'data: {"choices":[{"delta":{"content":"🚀 ok"}}]}\r\n\r\n'.encode(),
        '{"choices":[{"delta":{"content":"🚀 ok"}}]}'.encode(),
    ),
    Event(b"data: line one\ndata: line two\nid: 7\n\n", b"line one\nline two"),
    Event(b"data: [DONE]\n\n", b"[DONE]"),
]


def split(chunks: Iterable[bytes]) -> list[Event]:
    splitter = SSESplitter()
    events: list[Event] = []
    for chunk in chunks:
        events.extend(splitter.feed(chunk))
    tail = splitter.flush()
    if tail is not None:
        events.append(tail)
    return events


def test_whole_stream_in_one_chunk() -> None:
    assert split([STREAM]) == EXPECTED


def test_raw_bytes_rebuild_the_stream_exactly() -> None:
    assert b"".join(e.raw for e in split([STREAM])) == STREAM


@pytest.mark.parametrize("at", range(len(STREAM) + 1))
def test_every_split_point(at: int) -> None:
    assert split([STREAM[:at], STREAM[at:]]) == EXPECTED


def test_every_pair_of_split_points() -> None:
    n = len(STREAM)
    for i in range(n + 1):
        for j in range(i, n + 1):
            assert split([STREAM[:i], STREAM[i:j], STREAM[j:]]) == EXPECTED, (i, j)


def test_one_byte_at_a_time() -> None:
    assert split(STREAM[i : i + 1] for i in range(len(STREAM))) == EXPECTED


def test_split_inside_multibyte_characters() -> None:
    for char in ("é", "—", "🚀"):
        encoded = char.encode()
        start = STREAM.index(encoded)
        for k in range(1, len(encoded)):
            at = start + k
            assert split([STREAM[:at], STREAM[at:]]) == EXPECTED, (char, k)


def test_split_inside_crlf_separator() -> None:
    start = STREAM.index(b"\r\n\r\n")
    for k in range(4):
        at = start + k
        splitter = SSESplitter()
        first = list(splitter.feed(STREAM[:at]))
        assert len(first) == 2  # the CRLF-terminated event is not out before its separator is complete
        rest = list(splitter.feed(STREAM[at:]))
        assert first + rest == EXPECTED
    complete = list(SSESplitter().feed(STREAM[: start + 4]))
    assert complete == EXPECTED[:3]


def test_events_are_yielded_as_soon_as_they_are_complete() -> None:
    splitter = SSESplitter()
    assert list(splitter.feed(b"data: a\n")) == []
    assert list(splitter.feed(b"\n")) == [Event(b"data: a\n\n", b"a")]
    assert list(splitter.feed(b"data: b")) == []
    assert list(splitter.feed(b"\n\ndata: c\n\n")) == [Event(b"data: b\n\n", b"b"), Event(b"data: c\n\n", b"c")]
    assert splitter.flush() is None


def test_crlf_stream() -> None:
    stream = b"event: ping\r\ndata: {}\r\n\r\ndata: a\r\ndata: b\r\n\r\n"
    assert split([stream]) == [
        Event(b"event: ping\r\ndata: {}\r\n\r\n", b"{}"),
        Event(b"data: a\r\ndata: b\r\n\r\n", b"a\nb"),
    ]


def test_cr_only_stream() -> None:
    assert split([b"data: a\r\rdata: b\r\r"]) == [Event(b"data: a\r\r", b"a"), Event(b"data: b\r\r", b"b")]


def test_data_field_value_rules() -> None:
    # Only one space after the colon is part of the syntax; "data:" without a
    # space is valid; an empty data line contributes an empty line.
    assert split([b"data:x\n\n"]) == [Event(b"data:x\n\n", b"x")]
    assert split([b"data:  x\n\n"]) == [Event(b"data:  x\n\n", b" x")]
    assert split([b"data: a\ndata:\ndata: b\n\n"]) == [Event(b"data: a\ndata:\ndata: b\n\n", b"a\n\nb")]


def test_comments_and_event_lines_stay_in_raw() -> None:
    raw = b": comment\nevent: content_block_delta\nid: 3\nretry: 100\ndata: {}\n\n"
    assert split([raw]) == [Event(raw, b"{}")]
    assert split([b": only a comment\n\n"]) == [Event(b": only a comment\n\n", None)]


def test_data_that_looks_like_a_field_name_is_not_data() -> None:
    assert split([b"database: x\n\n"]) == [Event(b"database: x\n\n", None)]


def test_flush_returns_an_unterminated_tail() -> None:
    splitter = SSESplitter()
    assert list(splitter.feed(b"data: a\n\ndata: [DONE]")) == [Event(b"data: a\n\n", b"a")]
    assert splitter.flush() == Event(b"data: [DONE]", b"[DONE]")
    assert splitter.flush() is None  # the tail is handed out once


def test_flush_of_a_tail_with_one_newline() -> None:
    splitter = SSESplitter()
    assert list(splitter.feed(b"data: x\n")) == []
    assert splitter.flush() == Event(b"data: x\n", b"x")


@pytest.mark.parametrize("tail", [b"", b"\n", b"\r\n", b"  \n"])
def test_flush_of_whitespace_is_nothing(tail: bytes) -> None:
    splitter = SSESplitter()
    list(splitter.feed(b"data: a\n\n" + tail))
    assert splitter.flush() is None


def test_splitter_is_reusable_after_flush() -> None:
    splitter = SSESplitter()
    list(splitter.feed(b"data: half"))
    splitter.flush()
    assert list(splitter.feed(b"data: new\n\n")) == [Event(b"data: new\n\n", b"new")]


def test_empty_chunks_are_harmless() -> None:
    assert split([b"", b"data: a", b"", b"\n\n", b""]) == [Event(b"data: a\n\n", b"a")]


def test_encode_is_one_data_event() -> None:
    assert encode(b'{"a":1}') == b'data: {"a":1}\n\n'
    assert split([encode(b"x") + encode(b"y")]) == [Event(b"data: x\n\n", b"x"), Event(b"data: y\n\n", b"y")]
