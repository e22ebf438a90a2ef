"""Trace files, read once for ``audit`` and ``replay`` (SPEC section 3).

A trace is JSON Lines, one request a line::

    {"t": 1.5, "headers": {...}, "body": {<request>}, "path": "/v1/chat/completions"}

``path`` is optional (chat completions by default; ``/v1/messages`` and the other
wire APIs' paths are understood).  Other keys are annotations: ``kind`` and
``session`` are shown by replay, ``response`` (the upstream's reply) is recorded
by audit, the rest is ignored.  A malformed line is reported with its number and
skipped; a file that cannot be read at all raises :class:`TraceError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

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

    @property
    def exchange(self) -> Exchange:
        """The wire API of the line (an unknown path is taken as chat completions)."""
        return match(self.path.split("?", 1)[0]) or CHAT


def _path(obj: dict[str, Any], body: dict[str, Any]) -> str:
    path = obj.get("path")
    if path is None:
        # Older traces name no path: an Anthropic body is the one with a top-level system.
        return "/v1/messages" if obj.get("route") == MESSAGES.name or "system" in body else CHAT_PATH
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError('"path" is not a request path')
    return path


def parse_line(number: int, text: str) -> TraceLine:
    """One trace line; ``ValueError`` says what is wrong with it."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise ValueError('"body" is missing or not an object')
    headers = obj.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ValueError('"headers" is not an object of strings')
    t = obj.get("t", 0)
    if isinstance(t, bool) or not isinstance(t, int | float):
        raise ValueError('"t" is not a number')
    kind, session = obj.get("kind"), obj.get("session")
    extra = {k: v for k, v in obj.items() if k not in ("t", "headers", "body", "path", "kind", "session")}
    return TraceLine(
        number,
        float(t),
        {str(k): v for k, v in headers.items()},
        body,
        path=_path(obj, body),
        kind=None if kind is None else str(kind),
        session=None if session is None else str(session),
        extra=extra,
    )


def read_trace(path: str | Path, errors: TextIO, tool: str) -> tuple[list[TraceLine], list[dict[str, Any]]]:
    """All well-formed lines; each malformed one is reported on ``errors`` and skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace {path}: {exc}") from None
    lines, skipped = [], []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            lines.append(parse_line(number, raw))
        except ValueError as exc:
            print(f"prefixpin {tool}: {path}:{number}: skipped: {exc}", file=errors)
            skipped.append({"line": number, "error": str(exc)})
    return lines, skipped
