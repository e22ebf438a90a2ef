"""Every response prefixpin writes itself, in one place, in each API's own shape.

An OpenAI-speaking client gets ``{"error": {"message", "type", "code"}}``, an
Anthropic one ``{"type": "error", "error": {"type", "message"}}``: the SDKs turn
exactly these into their exceptions.  Routes that are not a known wire API (the
passthrough ones, prefixpin's own) use the OpenAI shape.  Upstream 4xx/5xx are
never rewritten: they pass through verbatim and do not come here.
"""

from __future__ import annotations

import orjson
from starlette.responses import Response

from canonicalize import CHAT, Exchange, encode
from proxy.errors import PrefixpinError, UpstreamEncoding, UpstreamError

JSON = "application/json"


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


__all__ = ["client_gone", "error", "error_bytes", "from_error", "stream_cut", "stream_error"]
