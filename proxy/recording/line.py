"""One request as one trace line (SPEC sections 2h and 3), credentials removed.

The event loop hands over an :class:`Entry`: references to what the request already
holds (its raw body, its raw headers, the reply), nothing copied or encoded.  The
writer thread turns it into the line's bytes with :meth:`Encoder.encode`::

    {"t": 1764201234.517, "path": "/v1/chat/completions", "headers": {...},
     "tenant": "k3f...", "lineage": "...", "role": "continuation", "status": 200,
     "usage": {"prompt_tokens": 22150, "cached_tokens": 20480}, "response": {...},
     "body": <the client's bytes>}

``body`` is the client's own bytes, spliced into the line as its JSON value: every
number, key order, duplicate key and escape as sent.  A JSON text cannot hold a raw
newline inside a string, so a newline in a valid body is whitespace between tokens;
it (and a carriage return) becomes a space, which keeps every byte at its offset and
the body one line.  A body that is not JSON text (or one too big to check off the
loop, see :data:`CHECK_MAX_BYTES`, that the proxy did not parse) is kept whole as
``"body": null, "body_base64": "..."``; ``prefixpin audit`` decodes it.

Credentials never reach the line: the headers :data:`CREDENTIAL_HEADERS` (and the
configured ``tenancy.credential_headers``, and any header named like a credential:
``...-key``, ``...-token``, ``...-secret``, ``...auth...``) are left out, and so are
the query keys ``tenancy.credential_params`` and any named like a credential.  The
tenant is the one-way hash :mod:`proxy.tenancy` computes.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple
from urllib.parse import unquote_plus

import orjson

from canonicalize import Usage
from canonicalize.jsonspan import has_line_break
from proxy.redact import is_secret_param

CREDENTIAL_HEADERS = frozenset(
    {"authorization", "x-api-key", "api-key", "x-goog-api-key", "proxy-authorization", "cookie"}
)
# A body the proxy did not parse is checked for JSON text in the writer thread, which
# holds the GIL while it parses: past this size it is kept as base64 instead (the
# audit decodes and parses it).  1 MiB: about a millisecond of the event loop's time.
CHECK_MAX_BYTES = 1 << 20
MAX_NAMES = 1024  # header names whose verdict (a credential or not) the encoder remembers
_B64_CHUNK = 3 << 18  # base64 encoded a piece at a time (a multiple of 3: the pieces join)
_NEWLINES = bytes.maketrans(b"\r\n", b"  ")


class Entry(NamedTuple):
    """What one request leaves for the trace, as the event loop has it (immutable, and
    a third of a frozen dataclass's cost to make: one per request)."""

    t: float  # wall-clock seconds when the request came in
    path: str  # the request target's path, as sent
    query: bytes  # its raw query string
    headers: Sequence[tuple[bytes, bytes]]  # as the client sent them (ASGI: lower-case names)
    body: bytes  # as the client sent it
    parsed: bool  # the proxy parsed the body: it is JSON text
    flat: bool  # the proxy knows the body holds no raw line break (JsonDoc.flat): not looked for again
    tenant: str | None
    lineage: str | None
    role: str
    status: int
    usage: Usage | None
    completion: int  # output tokens reported (0: none)
    response: dict[str, Any] | None  # the reply as the client received it


class Encoder:
    """Entries to lines; ``headers`` and ``params``: the configured credentials."""

    def __init__(self, headers: Iterable[str] = (), params: Iterable[str] = ()) -> None:
        self.secret_headers = CREDENTIAL_HEADERS | {h.lower() for h in headers}
        self.secret_params = frozenset(p.lower() for p in params)
        self._names: dict[bytes, str | None] = {}  # a header's raw name: its line name, None for a credential

    def encode(self, e: Entry) -> list[bytes]:
        """The line's bytes, in pieces (the body is not copied), ending with a newline."""
        head: dict[str, Any] = {
            "t": round(e.t * 1000) / 1000,  # (round(t, 3) writes the float as text first: 6x the time)
            "path": self.target(e.path, e.query),
            "headers": self.headers(e.headers),
            "tenant": e.tenant,
            "lineage": e.lineage,
            "role": e.role,
            "status": e.status,
            "usage": _usage(e.usage, e.completion),
            "response": e.response,
        }
        body = _embeddable(e.body, e.parsed, e.flat)
        if body is None and e.body:  # (no body at all: a request refused before it was read)
            head["body_base64"] = _base64(e.body)
        try:
            text = orjson.dumps(head)
        except TypeError:  # a reply orjson cannot write (an integer past 64 bits): the line without it
            head["response"] = None
            text = orjson.dumps(head)
        if body is None:
            return [text[:-1], b',"body":null}\n']
        return [text[:-1], b',"body":', body, b"}\n"]

    def headers(self, raw: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
        """The request's headers without credentials (repeated ones joined by ", ")."""
        out: dict[str, str] = {}
        names = self._names
        for k, v in raw:
            name = names.get(k, "")
            if name == "":
                name = self._name(k)
            if name is None:
                continue
            value = v.decode("latin-1")
            out[name] = f"{out[name]}, {value}" if name in out else value
        return out

    def _name(self, raw: bytes) -> str | None:
        """A header's name in the line, None for a credential; remembered for the
        :data:`MAX_NAMES` first names seen (clients send the same few)."""
        lower = raw.decode("latin-1").lower()
        name = None if lower in self.secret_headers or is_secret_param(lower) else lower
        if len(self._names) < MAX_NAMES:
            self._names[raw] = name
        return name

    def target(self, path: str, query: bytes) -> str:
        """``path`` and its query string without credential keys (the rest as sent)."""
        if not query:
            return path
        kept = []
        for item in query.decode("latin-1").split("&"):
            name = unquote_plus(item.partition("=")[0]).lower()
            if name in self.secret_params or is_secret_param(name):
                continue
            kept.append(item)
        return f"{path}?{'&'.join(kept)}" if kept else path


def _usage(usage: Usage | None, completion: int) -> dict[str, int] | None:
    """What the upstream reported, in the shape ``prefixpin audit`` reads (the whole
    prompt, cached tokens included)."""
    if usage is None:
        return None
    out = {"prompt_tokens": usage.prompt, "cached_tokens": usage.cached}
    if usage.cache_write:
        out["cache_write_tokens"] = usage.cache_write
    if completion:
        out["completion_tokens"] = completion
    return out


def _embeddable(body: bytes, parsed: bool, flat: bool) -> bytes | None:
    """``body`` as a JSON value on one line, or None when it is not JSON text."""
    if not parsed and not (len(body) <= CHECK_MAX_BYTES and _is_json(body)):
        return None
    if not flat and has_line_break(body, 0, len(body)):  # whitespace between tokens (a string cannot hold them raw)
        return body.translate(_NEWLINES)
    return body


def _is_json(body: bytes) -> bool:
    """JSON text in UTF-8 (orjson's strict reading; a lone surrogate's escape, which
    orjson refuses and JSON allows, the standard library's)."""
    try:
        orjson.loads(body)
        return True
    except orjson.JSONDecodeError:
        pass
    try:
        json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return True


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _base64(body: bytes) -> str:
    """``body`` in base64, a piece at a time so the event loop gets the GIL in between."""
    pieces, view = [], memoryview(body)
    for i in range(0, len(body), _B64_CHUNK):
        pieces.append(base64.b64encode(view[i : i + _B64_CHUNK]))
        time.sleep(0)
    return b"".join(pieces).decode("ascii")
