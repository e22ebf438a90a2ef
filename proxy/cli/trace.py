"""Trace files, read line by line for ``audit`` and ``replay`` (SPEC section 3).

A trace is JSON Lines, one request a line::

    {"t": 1.5, "headers": {...}, "body": {<request>}, "path": "/v1/chat/completions"}

``path`` is optional (chat completions by default; ``/v1/messages`` and the other
wire APIs' paths are understood).  Other keys are annotations: ``kind`` and
``session`` are shown by replay, ``response`` (the upstream's reply) is recorded
by audit, the rest is ignored.  A malformed line is reported with its number and
skipped; a file that cannot be read at all raises :class:`TraceError`.

:class:`Trace` reads a file one line at a time: what a command holds of a trace is
the line it is at, never the file (a recorded trace is up to ``trace.max_bytes``, and
its bodies parsed take several times that).

A line's number (``TraceLine.line``, from 1 as editors count) is one more than its
*index* (from 0), the number ``prefixpin audit`` gives every request everywhere.
Lines are split at ``\n`` only (JSON text may hold U+2028 and the like raw).

Lines ``prefixpin serve --trace`` wrote (:mod:`proxy.recording`) carry ``tenant``
and ``role``: :attr:`TraceLine.recorded`.  Their ``body`` is the client's bytes,
kept in :attr:`TraceLine.raw` as the file has them; a body that was not JSON text is
in ``body_base64`` (``body`` null): it is decoded, and read when it is a JSON object.
A request serve refused before reading its body (413, 503) has a line with ``role``
``rejected`` and no body: it is skipped, its reason said.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from canonicalize import CHAT, MESSAGES, Exchange, match

CHAT_PATH = "/v1/chat/completions"


class TraceError(Exception):
    """The trace file cannot be read at all (as opposed to one malformed line)."""


@dataclass(frozen=True, slots=True)
class TraceLine:
    """One request of a trace."""

    line: int  # 1-based line number in the file
    t: float
    headers: dict[str, str]
    body: dict[str, Any]
    path: str = CHAT_PATH
    kind: str | None = None
    session: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # every other key of the line
    raw: bytes | None = None  # the body's bytes as the file has them (recorded lines)

    @property
    def index(self) -> int:
        """The request's number everywhere in audit's output: its line, from 0."""
        return self.line - 1

    @property
    def recorded(self) -> bool:
        """Written by ``prefixpin serve --trace``: the usage is of what prefixpin forwarded."""
        return "tenant" in self.extra and "role" in self.extra

    @property
    def exchange(self) -> Exchange:
        """The wire API of the line (an unknown path is taken as chat completions)."""
        return match(self.path.split("?", 1)[0]) or CHAT

    @property
    def reply(self) -> dict[str, Any] | None:
        """The reply the line's ``response`` holds, as the proxy records a real one: the
        assistant message (a whole completion's, an Anthropic message's content, a
        Responses response's output and id), or None."""
        resp = self.extra.get("response")
        if not isinstance(resp, dict):
            return None
        if isinstance(resp.get("choices"), list) and resp["choices"]:  # a whole chat completion
            msg = resp["choices"][0].get("message")
            return msg if isinstance(msg, dict) else None
        if resp.get("type") == "message" and "content" in resp:  # a whole Anthropic message
            return {"role": "assistant", "content": resp["content"]}
        if isinstance(resp.get("output"), list):  # a whole Responses response (its id: previous_response_id)
            out: dict[str, Any] = {"role": "assistant", "output": resp["output"]}
            if isinstance(resp.get("id"), str):
                out["id"] = resp["id"]
            return out
        return resp if resp.get("role") == "assistant" else None


def _path(obj: dict[str, Any], body: dict[str, Any]) -> str:
    path = obj.get("path")
    if path is None:
        # Older traces name no path: an Anthropic body is the one with a top-level system.
        return "/v1/messages" if obj.get("route") == MESSAGES.name or "system" in body else CHAT_PATH
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError('"path" is not a request path')
    return path


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _skip(text: str, i: int) -> int:
    """Past the whitespace at ``i``."""
    m = _WS.match(text, i)
    return m.end() if m else i


def _members(text: str) -> tuple[Any, tuple[int, int] | None]:
    """The line's JSON value and, when it is an object, where its ``body`` member's
    value is in ``text``, between the colon and the next delimiter (json.loads's
    reading: the last of a repeated key wins)."""
    i = _skip(text, 0)
    if text[i : i + 1] != "{":
        return json.loads(text), None
    obj: dict[str, Any] = {}
    span = None
    i = _skip(text, i + 1)
    if text[i : i + 1] == "}":
        return (obj, None) if not text[i + 1 :].strip(" \t\n\r") else (json.loads(text), None)
    while True:
        key, i = _DECODER.raw_decode(text, i)
        i = _skip(text, i)
        if not isinstance(key, str) or text[i : i + 1] != ":":
            return json.loads(text), None  # its error
        colon = i + 1
        value, end = _DECODER.raw_decode(text, _skip(text, colon))
        obj[key] = value
        i = _skip(text, end)
        span = (colon, i) if key == "body" else span  # with the whitespace around it, as written
        if text[i : i + 1] == ",":
            i = _skip(text, i + 1)
            continue
        if text[i : i + 1] == "}" and not text[i + 1 :].strip(" \t\n\r"):
            return obj, span
        return json.loads(text), None


def _body(obj: dict[str, Any], text: str, span: tuple[int, int] | None) -> tuple[dict[str, Any], bytes | None]:
    """The request body, and its bytes when the line keeps them."""
    body = obj.get("body")
    if body is None and isinstance(obj.get("body_base64"), str):
        try:
            raw = base64.b64decode(obj["body_base64"], validate=True)
            body = json.loads(raw.decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"the request body was not JSON text (kept as body_base64: {exc})") from None
        if not isinstance(body, dict):
            raise ValueError("the request body was not a JSON object (kept as body_base64)")
        return body, raw
    if body is None and obj.get("role") == "rejected":  # recorded by serve: refused before its body was read
        raise ValueError(
            f"prefixpin refused this request ({obj.get('status')}) before reading its body: no body recorded"
        )
    if not isinstance(body, dict):
        raise ValueError('"body" is missing or not an object')
    return body, text[span[0] : span[1]].encode("utf-8", "surrogatepass") if span else None


def parse_line(number: int, text: str) -> TraceLine:
    """One trace line; ``ValueError`` says what is wrong with it."""
    try:
        obj, span = _members(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise ValueError("not JSON (nested too deeply)") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    body, raw = _body(obj, text, span)
    headers = obj.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ValueError('"headers" is not an object of strings')
    t = obj.get("t", 0)
    if isinstance(t, bool) or not isinstance(t, int | float):
        raise ValueError('"t" is not a number')
    kind, session = obj.get("kind"), obj.get("session")
    skip = ("t", "headers", "body", "body_base64", "path", "kind", "session")
    extra = {k: v for k, v in obj.items() if k not in skip}
    return TraceLine(
        number,
        float(t),
        {str(k): v for k, v in headers.items()},
        body,
        path=_path(obj, body),
        kind=None if kind is None else str(kind),
        session=None if session is None else str(session),
        extra=extra,
        raw=raw,
    )


class Trace:
    """A trace file, opened (or :class:`TraceError`): iterate it once for its well-formed
    lines, in order; each malformed one is reported on ``errors`` and kept in
    ``skipped``.  ``lines``: how many lines the file has (a progress bar's total, counted
    on opening without parsing them)."""

    def __init__(self, path: str | Path, errors: TextIO, tool: str) -> None:
        self.path, self.errors, self.tool = path, errors, tool
        self.skipped: list[dict[str, Any]] = []
        self.read = 0  # lines read so far, well-formed or not
        try:
            with Path(path).open("rb") as file:
                self.lines = _count_lines(file)
        except OSError as exc:
            raise TraceError(f"cannot read trace {path}: {exc}") from None

    def __iter__(self) -> Iterator[TraceLine]:
        try:
            with Path(self.path).open("rb") as file:
                for number, chunk in enumerate(file, start=1):  # (binary: split at b"\n" only)
                    self.read = number
                    found = self._line(number, chunk)
                    if found is not None:
                        yield found
        except OSError as exc:
            raise TraceError(f"cannot read trace {self.path} past line {self.read}: {exc}") from None

    def _line(self, number: int, chunk: bytes) -> TraceLine | None:
        try:
            raw = chunk.decode("utf-8").rstrip("\r\n")
            if not raw.strip():
                return None
            return parse_line(number, raw)
        except (UnicodeDecodeError, ValueError) as exc:
            why = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else str(exc)
            print(f"prefixpin {self.tool}: {self.path}:{number}: skipped: {why} (index {number - 1})", file=self.errors)
            self.skipped.append({"line": number, "index": number - 1, "error": why})
            return None


_COUNT_BYTES = 1 << 20  # read at once when counting a file's lines


def _count_lines(file: BinaryIO) -> int:
    """The lines of ``file`` (its newlines, and one more after the last if it ends
    without one), read in pieces."""
    newlines, last = 0, b"\n"
    while piece := file.read(_COUNT_BYTES):
        newlines += piece.count(b"\n")
        last = piece[-1:]
    return newlines + (last != b"\n")


def read_trace(path: str | Path, errors: TextIO, tool: str) -> tuple[list[TraceLine], list[dict[str, Any]]]:
    """All well-formed lines at once, and the malformed ones (:class:`Trace`, for a
    caller that holds the whole trace anyway)."""
    trace = Trace(path, errors, tool)
    return list(trace), trace.skipped
