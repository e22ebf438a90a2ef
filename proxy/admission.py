"""Taking a request in: a deadline on its body, then admission control.

Body deadline (``limits.body_timeout_s``): the longest wait for the next piece
of a request body, as nginx's ``client_body_timeout``: a client that stops
sending gets ``408`` and its connection is closed.  (The header deadline lives
in proxy.server: before the headers are complete there is no request yet.)

Admission (``limits.max_concurrency``): past that many requests in flight,
answer ``503`` now.  A proxy past its capacity that queues everything makes every
request slow and most of them time out together (see docs/bench-overhead.md);
one that refuses the excess at once keeps the admitted ones fast, and clients
(the OpenAI and Anthropic SDKs among them) retry a 503 after ``Retry-After``.
A request counts once its body has been read (so slow senders cannot take the
slots of the requests that are ready) until its response, streamed body
included, has been sent.  prefixpin's own endpoints are never refused.

A pure ASGI middleware: it wraps ``receive``; the errors it raises there reach
the app's body read and come back out, to be answered here, unless the app
answers them itself, in the shape of the API the client spoke (proxy.responses).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from canonicalize import match
from proxy import responses
from proxy.errors import Overloaded, RequestTimeout
from proxy.server import BODY_IN

OWN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class Admission:
    def __init__(self, app: ASGIApp, *, limit: int, body_timeout_s: float, on_reject: Callable[[str], None]) -> None:
        self.app = app
        self.limit = limit
        self.body_timeout_s = body_timeout_s
        self.on_reject = on_reject
        self.inflight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OWN_PATHS:
            await self.app(scope, receive, send)
            return
        admitted = False
        body_done = False
        body_in = scope["extensions"].get(BODY_IN) if "extensions" in scope else None

        async def receive_body() -> Message:
            nonlocal admitted, body_done
            if body_done:
                return await receive()
            if body_in is not None and body_in():
                message = await receive()  # all there: receive() does not wait
            else:
                try:
                    async with asyncio.timeout(self.body_timeout_s):
                        message = await receive()
                except TimeoutError:
                    raise RequestTimeout(
                        f"prefixpin waited {self.body_timeout_s:g} s for the rest of the request body "
                        "(limits.body_timeout_s)"
                    ) from None
            if message["type"] == "http.request" and message.get("more_body", False):
                return message
            body_done = True
            if message["type"] == "http.request" and self.limit > 0:
                if self.inflight >= self.limit:
                    self.on_reject(scope["path"])
                    raise Overloaded(
                        f"prefixpin is at its limit of {self.limit} requests in flight "
                        "(limits.max_concurrency); retry shortly"
                    )
                self.inflight += 1
                admitted = True
            return message

        try:
            await self.app(scope, receive_body, send)
        except (RequestTimeout, Overloaded) as exc:  # from receive_body, through the app's body read
            await responses.from_error(exc, match(scope["path"]))(scope, receive, send)
        finally:
            if admitted:
                self.inflight -= 1
