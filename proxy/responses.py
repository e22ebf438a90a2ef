"""Every response prefixpin writes itself, in one place, in each API's own shape.

An OpenAI-speaking client gets ``{"error": {"message", "type", "code"}}``, an
Anthropic one ``{"type": "error", "error": {"type", "message"}}``: the SDKs turn
exactly these into their exceptions.  Routes that are not a known wire API (the
passthrough ones, prefixpin's own) use the OpenAI shape.  Upstream 4xx/5xx are
never rewritten: they pass through verbatim and do not come here.

The app answers with ASGI responses (:func:`from_error`, :func:`error`,
:func:`client_gone`) and in-band events (:func:`stream_cut`); prefixpin's server
(:mod:`proxy.front`) writes its own answers as whole HTTP/1.1 responses, before
or without the app: a request it refuses (:func:`refusal`: 400, 408, 413, 431,
503), the end of a stream it stops (:func:`shutdown_event`), an app that failed
before answering (:func:`failure`, a plain 500 as uvicorn's).
"""

from __future__ import annotations

import time
from email.utils import formatdate
from http import HTTPStatus

import orjson
from starlette.responses import Response

from canonicalize import CHAT, Exchange, encode, match
from proxy.errors import PrefixpinError, UpstreamEncoding, UpstreamError

JSON = "application/json"
# Each status's reason phrase, RFC 9110's where it renamed one.
REASONS = {s.value: s.phrase.encode() for s in HTTPStatus} | {413: b"Content Too Large", 422: b"Unprocessable Content"}
_date: tuple[int, bytes] = (0, b"")  # (second, its IMF-fixdate), replaced whole once a second


def error_bytes(exchange: Exchange | None, message: str, type_: str, code: str) -> bytes:
    return orjson.dumps((exchange or CHAT).error_body(message, type_, code))


def error(
    exchange: Exchange | None,
    status: int,
    message: str,
    type_: str,
    code: str,
    headers: dict[str, str] | None = None,
) -> Response:
    return Response(error_bytes(exchange, message, type_, code), status, headers=headers, media_type=JSON)


def from_error(exc: PrefixpinError, exchange: Exchange | None = None) -> Response:
    """The response for one of prefixpin's own errors (see :mod:`proxy.errors`)."""
    return error(exchange, exc.status, str(exc), exc.type, exc.code, dict(exc.headers) or None)


def client_gone() -> Response:
    """Nobody reads it: the client left (nginx's 499), for the access log and metrics."""
    return Response(status_code=499)


def stream_error(exchange: Exchange | None, message: str, type_: str, code: str) -> bytes:
    """An in-band error event, in the API's shape, that ends a stream already started."""
    body = error_bytes(exchange, message, type_, code)
    if exchange is not None and exchange.name == "messages":
        return b"event: error\n" + encode(body)
    return encode(body)


def stream_cut(exchange: Exchange, exc: UpstreamError) -> bytes:
    """The in-band event that ends a stream the upstream cut (or sent corrupt), so the
    client can tell."""
    if isinstance(exc, UpstreamEncoding):
        return stream_error(exchange, str(exc), exc.type, exc.code)
    message = f"the upstream stream ended early: {type(exc).__name__}"
    return stream_error(exchange, message, "upstream_error", "upstream_stream_cut")


# -- the server's own answers (proxy.front) ---------------------------------------------
def http_date() -> bytes:
    """Now as HTTP's ``date`` header value (RFC 9110 5.6.7), made once a second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, formatdate(now, usegmt=True).encode())
    return _date[1]


def _exchange_of(path: bytes | None) -> Exchange | None:
    return match(path.decode("latin-1")) if path else None


def whole(status: int, content_type: bytes, body: bytes) -> bytes:
    """A whole HTTP/1.1 response that closes the connection."""
    head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\ndate: %s\r\n" % (
        status,
        REASONS.get(status, b""),
        content_type,
        len(body),
        http_date(),
    )
    return head + b"connection: close\r\n\r\n" + body


def refusal(path: bytes | None, status: int, code: str, message: str) -> bytes:
    """The server's whole answer to a request it refuses, in the shape of the API
    ``path`` belongs to (None: not known)."""
    kind = "invalid_request_error" if status < 500 else "overloaded_error"
    return whole(status, b"application/json", error_bytes(_exchange_of(path), message, kind, code))


def shutdown_event(path: bytes | None, message: str) -> bytes:
    """The event that ends a stream the server stops, in the shape of the path's API."""
    return stream_error(_exchange_of(path), message, "server_error", "server_shutdown")


def failure() -> bytes:
    """The server's answer to an app that failed before answering."""
    return whole(500, b"text/plain; charset=utf-8", b"Internal Server Error")


__all__ = [
    "REASONS",
    "client_gone",
    "error",
    "error_bytes",
    "failure",
    "from_error",
    "http_date",
    "refusal",
    "shutdown_event",
    "stream_cut",
    "stream_error",
    "whole",
]
