"""canonicalize.sse: incremental SSE splitting that never assumes one event per chunk."""

from __future__ import annotations

import random
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


# -- line ends as the WHATWG standard defines them ------------------------------------------
# A line ends at CRLF, LF or CR; an event ends at an empty line, whatever ended the line
# before it.  The probe's stream: an event ended by "\n\r\n" must not swallow the next one.
# (CR then LF is one line end, CRLF: not a pair.)
@pytest.mark.parametrize(
    ("first", "blank"),
    [(a, b) for a in (b"\n", b"\r\n", b"\r") for b in (b"\n", b"\r\n", b"\r") if a + b != b"\r\n"],
)
def test_every_pair_of_line_ends_ends_an_event(first: bytes, blank: bytes) -> None:
    one = b"data: a" + first + blank
    stream = one + b"data: b\n\n"
    expected = [Event(one, b"a"), Event(b"data: b\n\n", b"b")]
    assert split([stream]) == expected
    assert split(stream[i : i + 1] for i in range(len(stream))) == expected


def test_an_event_ended_by_lf_crlf_is_not_merged_with_the_next() -> None:
    stream = b'data: {"a": 1}\n\r\ndata: {"b": 2}\n\n'
    assert list(SSESplitter().feed(stream)) == [
        Event(b'data: {"a": 1}\n\r\n', b'{"a": 1}'),
        Event(b'data: {"b": 2}\n\n', b'{"b": 2}'),
    ]


def test_a_cr_that_ends_a_chunk_waits_for_its_possible_lf() -> None:
    splitter = SSESplitter()
    assert list(splitter.feed(b"data: a\r\r")) == []  # the second CR may be half of a CRLF
    assert list(splitter.feed(b"\ndata: b\r\r")) == [Event(b"data: a\r\r\n", b"a")]
    assert list(splitter.feed(b"d")) == [Event(b"data: b\r\r", b"b")]
    assert splitter.flush() == Event(b"d", None)


def test_flush_gives_an_event_held_for_its_cr() -> None:
    splitter = SSESplitter()
    assert list(splitter.feed(b"data: a\r\n\r")) == []
    assert splitter.flush() == Event(b"data: a\r\n\r", b"a")


def test_a_data_line_without_a_colon_is_an_empty_data_line() -> None:
    assert split([b"data\n\n"]) == [Event(b"data\n\n", b"")]
    assert split([b"data: a\ndata\n\n"]) == [Event(b"data: a\ndata\n\n", b"a\n")]
    assert split([b"datax\n\n"]) == [Event(b"datax\n\n", None)]


def test_an_empty_line_after_an_event_is_its_own_empty_event() -> None:
    assert split([b"data: a\n\n\n"]) == [Event(b"data: a\n\n", b"a"), Event(b"\n", None)]
    assert split([b"\r\ndata: a\n\n"]) == [Event(b"\r\n", None), Event(b"data: a\n\n", b"a")]


def test_a_byte_order_mark_opens_only_the_stream() -> None:
    bom = b"\xef\xbb\xbf"
    assert split([bom + b"data: a\n\n" + bom + b"data: b\n\n"]) == [
        Event(bom + b"data: a\n\n", b"a"),
        Event(bom + b"data: b\n\n", None),  # a field named "\ufeffdata": ignored
    ]
    assert split([bom + b"\ndata: a\n\n"]) == [Event(bom + b"\n", None), Event(b"data: a\n\n", b"a")]
    assert split([bom[:1], bom[1:] + b"\r", b"\ndata: a\n\n"]) == [
        Event(bom + b"\r\n", None),
        Event(b"data: a\n\n", b"a"),
    ]


def test_a_caller_that_stops_midway_takes_the_tail_as_it_was() -> None:
    # The handler's fail-open path: events of a chunk half consumed, then take() + chunk.
    splitter = SSESplitter()
    list(splitter.feed(b"data: a\n\ndata: b"))
    chunk = b"\n\ndata: c\n\ndata: d"
    events = splitter.feed(chunk)
    next(events)
    assert splitter.take() + chunk == b"data: b\n\ndata: c\n\ndata: d"


# -- any split of a valid stream gives the same events ------------------------------------------
def reference(stream: bytes) -> tuple[list[Event], bytes]:
    """The events of a whole stream, parsed line by line as the standard says (no chunks,
    so a CR is never ambiguous), and the unterminated tail."""
    events: list[Event] = []
    start = pos = 0
    data: list[bytes] = []
    first = True
    n = len(stream)
    while pos < n:
        end = pos
        while end < n and stream[end] not in b"\r\n":
            end += 1
        if end == n:
            break
        line = stream[pos:end]
        term = 2 if stream[end : end + 2] == b"\r\n" else 1
        if first and start == 0 and pos == 0 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
        pos = end + term
        if line == b"":
            events.append(Event(stream[start:pos], b"\n".join(data) if data else None))
            start, data = pos, []
            first = False
            continue
        name, colon, value = line.partition(b":")
        if name == b"data":
            data.append(value[1:] if colon and value.startswith(b" ") else value)
    return events, stream[start:]


_PIECES = (
    b"data: ",
    b"data:",
    b"data",
    b"event: x",
    b": comment",
    b"id: 7",
    b"retry: 10",
    b"database: no",
    b'{"choices":[{"delta":{"content":"\xc3\xa9 \xe2\x82\xac \xf0\x9f\x9a\x80"}}]}',
    b"[DONE]",
    b"  spaced",
    b":",
)
_ENDS = (b"\n", b"\r\n", b"\r")


def random_stream(rng: random.Random) -> bytes:
    out = [b"\xef\xbb\xbf"] if rng.random() < 0.1 else []
    for _ in range(rng.randint(0, 8)):
        for _ in range(rng.randint(0, 4)):
            line = b"".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 3)))
            out.append(line + rng.choice(_ENDS))
        out.append(rng.choice(_ENDS))  # the empty line that ends the event
    if rng.random() < 0.3:
        out.append(rng.choice(_PIECES))  # an unterminated tail
    return b"".join(out)


def check_split(stream: bytes, chunks: list[bytes]) -> None:
    expected, tail = reference(stream)
    splitter = SSESplitter()
    events = [e for c in chunks for e in splitter.feed(c)]
    rest = splitter.take()
    # An event whose empty line ends with a CR at the stream's end is held for a
    # possible LF: take() returns it, byte for byte.
    if events != expected:
        assert events == expected[:-1] and rest == expected[-1].raw and tail == b"", (stream, chunks)
    else:
        assert rest == tail, (stream, chunks)
    assert b"".join(e.raw for e in events) + rest == stream


def test_random_streams_split_anywhere_give_the_standards_events() -> None:
    rng = random.Random(20260518)
    for k in range(3000):
        stream = random_stream(rng)
        cuts = sorted(rng.randint(0, len(stream)) for _ in range(rng.randint(0, 6)))
        check_split(stream, [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)])
        if k % 5 == 0:
            check_split(stream, [stream[i : i + 1] for i in range(len(stream))])
