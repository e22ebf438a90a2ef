"""Server-sent events, split incrementally.

A network chunk can end anywhere, in the middle of a line or of a UTF-8
sequence, so the splitter keeps the partial tail and only ever yields whole
events.  Each event keeps its raw bytes: an event nobody changes is forwarded
byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

_SEPARATORS = (b"\r\n\r\n", b"\n\n", b"\r\r")


@dataclass(frozen=True, slots=True)
class Event:
    raw: bytes  # the event including its terminating blank line
    data: bytes | None  # the joined ``data:`` field, None when the event has none


def _data(block: bytes) -> bytes | None:
    parts = []
    for line in block.splitlines():
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(parts) if parts else None


class SSESplitter:
    """Feed raw chunks, get whole events; ``flush`` returns an unterminated tail."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> Iterator[Event]:
        buf = self._buf + chunk if self._buf else chunk
        start = 0
        while True:
            best = -1
            sep_len = 0
            for sep in _SEPARATORS:
                i = buf.find(sep, start)
                if i >= 0 and (best < 0 or i < best):
                    best, sep_len = i, len(sep)
            if best < 0:
                break
            end = best + sep_len
            yield Event(buf[start:end], _data(buf[start:best]))
            start = end
        self._buf = buf[start:]

    def take(self) -> bytes:
        """The bytes held back so far (an unterminated event), as received."""
        tail, self._buf = self._buf, b""
        return tail

    def flush(self) -> Event | None:
        if not self._buf.strip():
            self._buf = b""
            return None
        tail, self._buf = self._buf, b""
        return Event(tail, _data(tail))


def encode(data: bytes) -> bytes:
    """One ``data:`` event."""
    return b"data: " + data + b"\n\n"


def loads_or_none(data: bytes) -> Any:
    """An event's JSON payload, or None when it is not JSON (forwarded as it is)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
