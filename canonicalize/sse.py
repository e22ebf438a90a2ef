"""Server-sent events, split incrementally, as the WHATWG HTML standard reads them
("Interpreting an event stream").

A line ends at CRLF, LF or CR; an event ends at an empty line, whatever ended the
line before it (``\\n\\n``, ``\\r\\n\\r\\n``, ``\\n\\r\\n``, ``\\r\\r`` …).  A field
line is ``name: value`` (one space after the colon is syntax), or ``name`` alone
(an empty value); ``data`` values join with LF; a line that starts with a colon is
a comment; a byte order mark opens only the stream.  An event we split differently
from the client would be guarded as the wrong thing, so the split is exactly the
standard's: any cut of a stream into chunks gives the same events.

A network chunk can end anywhere: in the middle of a line, of a UTF-8 sequence, or
between the CR and the LF of one line end.  The splitter keeps the partial tail and
only ever yields whole events; an event whose empty line ends with a CR that ends
the chunk waits for the next byte, which may be that line end's LF.  Each event
keeps its raw bytes (with its empty line): an event nobody changes is forwarded
byte for byte, and the events' bytes, then ``take()``, are the stream as received.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, NamedTuple

import orjson

_BOM = b"\xef\xbb\xbf"


class Event(NamedTuple):  # a tuple: built for every event of every stream
    raw: bytes  # the event including its terminating empty line
    data: bytes | None  # the joined ``data`` field, None when the event has none

    @classmethod
    def parse(cls, raw: bytes) -> Event:
        """The event of ``raw``, one event's bytes (an unterminated tail included)."""
        return cls(raw, _data(raw))


def _data(block: bytes) -> bytes | None:
    """The ``data`` field of an event's lines (its empty line left out or not)."""
    if block.startswith(b"data: "):  # most events: one data line, ended by LF
        end = block.find(b"\n", 6)
        if end == len(block) - 1 and b"\r" not in block:
            return block[6:end]
    elif b"data" not in block:
        return None
    parts = []
    for line in block.splitlines():  # bytes split at CRLF, LF and CR only
        if line.startswith(b"data"):
            value = line[4:]
            if not value:
                parts.append(b"")
            elif value[0] == 58:  # b":"
                parts.append(value[2:] if value[1:2] == b" " else value[1:])
    return b"\n".join(parts) if parts else None


def _blank(buf: bytes, at: int, cr: bool) -> int:
    """Where the first empty line after a line end at or past ``at`` begins, minus
    one (the end of the line before it), or -1.  A line start followed by CR or LF
    is an empty line: after an LF (alone or a CRLF's), or after a CR that is
    not a CRLF's first half, i.e. a CR followed by a CR."""
    p = buf.find(b"\n\n", at)
    if cr:
        stop = p + 1 if p >= 0 else len(buf)
        for two in (b"\n\r", b"\r\r"):
            i = buf.find(two, at, stop)
            if i >= 0:
                p, stop = i, i + 1
    return p


class SSESplitter:
    """Feed raw chunks, get whole events; ``flush`` returns an unterminated tail."""

    __slots__ = ("_at", "_buf", "_first")

    def __init__(self) -> None:
        self._buf = b""  # the start of the next event, not yet complete
        self._at = 0  # no empty line begins in _buf before _at + 1
        self._first = True  # the next event opens the stream (a BOM may open it)

    def feed(self, chunk: bytes) -> Iterator[Event]:
        # State is stored once, at the end: a caller that stops iterating midway (its
        # own failure) can take() the tail as it was, then forward the chunk itself.
        buf = self._buf + chunk if self._buf else chunk
        n = len(buf)
        cr = b"\r" in buf
        first = self._first
        start, at = 0, self._at
        while start < n:
            s = start + 3 if first and buf.startswith(_BOM) else start
            if s < n and buf[s] in b"\r\n":  # an empty line right where the event starts
                q = s
            else:
                p = _blank(buf, at if at > s else s, cr)
                if p < 0:
                    at = n - 1  # the last byte may be the first of a pair
                    break
                q = p + 1
            if buf[q] == 10:
                end = q + 1
            elif q + 1 < n:
                end = q + 2 if buf[q + 1] == 10 else q + 1
            else:  # a CR that ends the chunk: an LF may follow
                at = q - 1 if q > s else start
                break
            yield Event(buf[start:end], _data(buf[s:q]))
            first = False
            start = end
        self._buf = buf[start:]
        self._at = at - start if at > start else 0
        self._first = first

    @property
    def held(self) -> int:
        """How many bytes are held back: the start of an event not yet whole."""
        return len(self._buf)

    def take(self) -> bytes:
        """The bytes held back so far (an unterminated event), as received."""
        tail, self._buf, self._at = self._buf, b"", 0
        return tail

    def flush(self) -> Event | None:
        """The held-back bytes as one event (the stream ended), None if only blanks."""
        tail = self.take()
        return Event.parse(tail) if tail.strip() else None


def encode(data: bytes) -> bytes:
    """One ``data:`` event."""
    return b"data: " + data + b"\n\n"


def loads_or_none(data: bytes) -> Any:
    """An event's JSON payload, or None when it is not JSON (forwarded as it is)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def read(data: bytes) -> tuple[Any, bool]:
    """An event's JSON payload as the most lenient client reads it, and whether orjson
    read it (True) or only the standard library's ``json`` on the text with invalid
    UTF-8 replaced (False: NaN, Infinity, 1e400, a lone surrogate, invalid UTF-8 — the
    openai SDK reads events with ``json``, a browser replaces bad UTF-8).  A guard
    must judge what the client will see, so it reads with this.  Raises ValueError
    when neither reads it."""
    try:
        return orjson.loads(data), True
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data.decode("utf-8", "replace")), False
    except RecursionError as exc:  # nested deeper than the interpreter's stack: unreadable
        raise ValueError("JSON nested too deep") from exc


def payload(data: bytes, *, lenient: bool) -> tuple[Any, bool]:
    """An event's JSON payload and whether orjson read it: with ``lenient`` (a guard
    judges the event) as :func:`read` reads it, else orjson's; None when it is not
    JSON to any client (forwarded as it is)."""
    if not lenient:
        return loads_or_none(data), True
    try:
        return read(data)
    except ValueError:
        return None, True


def dumps(obj: Any, strict: bool) -> bytes:
    """``obj`` as JSON: orjson for what orjson read, the standard library (ASCII, NaN
    kept) for what only it read."""
    return orjson.dumps(obj) if strict else json.dumps(obj).encode()
