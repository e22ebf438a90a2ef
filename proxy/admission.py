"""Admission control (``limits.max_concurrency``): past that many requests in
flight, answer ``503`` now.

A proxy past its capacity that queues everything makes every request slow and
most of them time out together; one that refuses the excess at once keeps the
admitted ones fast, and clients (the OpenAI and Anthropic SDKs among them) retry
a 503 after ``Retry-After``.  A request counts from the moment the app is called
(prefixpin's server calls it once the whole body has arrived, so slow senders
cannot take the places of the requests that are ready) until its response,
streamed body included, has been sent.  prefixpin's own endpoints are never
refused.  A pure ASGI middleware.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from canonicalize import match
from proxy import responses
from proxy.errors import Overloaded

OWN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class Admission:
    def __init__(self, app: ASGIApp, *, limit: int, on_reject: Callable[[Scope], None]) -> None:
        self.app = app
        self.limit = limit
        self.on_reject = on_reject
        self.inflight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OWN_PATHS:
            await self.app(scope, receive, send)
            return
        if self.inflight >= self.limit:
            self.on_reject(scope)
            exc = Overloaded(
                f"prefixpin is at its limit of {self.limit} requests in flight (limits.max_concurrency); retry shortly"
            )
            await responses.from_error(exc, match(scope["path"]))(scope, receive, send)
            return
        self.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight -= 1
