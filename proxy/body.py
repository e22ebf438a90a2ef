"""The client's request body, read whole before anything is decided about it, and
bounded by ``limits.max_body_bytes`` (the front refuses a longer one before it
reaches the app; this bound holds under any other ASGI server too)."""

from __future__ import annotations

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope

from proxy.errors import BodyTooLarge


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it is known to pass ``limit``;
    ClientDisconnect when the client leaves before it is in."""
    for k, v in scope["headers"]:
        if k == b"content-length":
            if v.isdigit() and int(v) > limit:
                declared = v.decode("latin-1")
                raise BodyTooLarge(f"request body of {declared} bytes is over the limit of {limit} bytes")
            break
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is over the limit of {limit} bytes")
        if not message.get("more_body", False):
            if not chunks:
                return chunk  # the usual case: one piece
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)


__all__ = ["read_body"]
