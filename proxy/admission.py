"""Admission control: past ``limits.max_concurrency`` requests in flight, answer 503 now.

A proxy past its capacity that queues everything makes every request slow and
most of them time out together (see docs/bench-overhead.md); one that refuses the
excess at once keeps the admitted ones fast, and clients (the OpenAI and
Anthropic SDKs among them) retry a 503 after ``Retry-After``.  A pure ASGI
middleware: a request is in flight until its response, streamed body included,
has been sent.  prefixpin's own endpoints are never refused.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

OWN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class Admission:
    def __init__(self, app: ASGIApp, *, limit: int, on_reject: Callable[[str], None]) -> None:
        self.app = app
        self.limit = limit
        self.on_reject = on_reject
        self.inflight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.limit <= 0 or scope["path"] in OWN_PATHS:
            await self.app(scope, receive, send)
            return
        if self.inflight >= self.limit:
            self.on_reject(scope["path"])
            body = orjson.dumps({"error": {
                "message": f"prefixpin is at its limit of {self.limit} requests in flight "
                           "(limits.max_concurrency); retry shortly",
                "type": "overloaded_error", "code": "overloaded",
            }})  # fmt: skip
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
            ]})  # fmt: skip
            await send({"type": "http.response.body", "body": body})
            return
        self.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight -= 1
