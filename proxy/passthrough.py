"""Every route that is not a wire API nor prefixpin's own: forwarded unchanged
(method, path, query, body bytes; to the next healthy replica in turn when there
is a pool), the response relayed as it arrives (:func:`proxy.relay.relay`), never
buffered, never decoded.  A client that leaves gets nothing more (499) and the
upstream response is closed (proxy.watch); an upstream that fails before
answering gets an error in the OpenAI shape; one that cuts the body gets the
client's response cut too (the server aborts the connection)."""

from __future__ import annotations

import logging

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from proxy import responses
from proxy.body import read_body
from proxy.errors import PrefixpinError, UpstreamError
from proxy.metrics import Metrics
from proxy.relay import relay
from proxy.upstream.headers import has_header, raw_request_headers, raw_response_headers
from proxy.upstream.message import Response
from proxy.upstream.pool import Pool
from proxy.upstream.slot_watch import SlotWatch
from proxy.upstream.target import client_path
from proxy.watch import ClientGone, ClientWatch

log = logging.getLogger("prefixpin")


class Passthrough:
    """The ASGI endpoint of every other route (module docstring)."""

    def __init__(self, upstream: Pool, metrics: Metrics, max_body_bytes: int, slots: SlotWatch | None) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.slots = slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.slots is not None and scope["method"] == "POST":
            self.slots.last_sent = None  # e.g. /v1/completions: a task on some slot, unrouted
        watch = ClientWatch(scope, receive)
        try:
            await self._serve(scope, receive, send, watch)
        finally:
            watch.close()

    async def _serve(self, scope: Scope, receive: Receive, send: Send, watch: ClientWatch) -> None:
        metrics, upstream = self.metrics, self.upstream
        try:
            body = await read_body(scope, receive, self.max_body_bytes)
            with watch:
                resp = await upstream.send(
                    scope["method"],
                    client_path(scope),
                    scope["query_string"].decode("latin-1"),
                    raw_request_headers(scope["headers"]),
                    body,
                    sticky=False,
                )
        except (ClientDisconnect, ClientGone):
            await responses.client_gone()(scope, receive, send)
            return
        except PrefixpinError as exc:
            if isinstance(exc, UpstreamError):
                metrics.upstream_errors.labels(exc.metric_kind).inc()
                log.warning("upstream error on passthrough: %s", exc.logged)
            metrics.requests.labels("passthrough", "bypass", str(exc.status)).inc()
            await responses.from_error(exc)(scope, receive, send)
            return
        metrics.requests.labels("passthrough", "bypass", str(resp.status)).inc()
        try:
            with watch:
                await forward(send, resp, pooled=upstream.pooled)
        except ClientGone:
            pass  # the client left: the upstream response is closed
        except UpstreamError as exc:
            # The upstream cut the body: the client's is cut too (the server aborts
            # the connection, no terminating chunk), so the client can tell.
            metrics.upstream_errors.labels("stream_cut").inc()
            log.warning("the upstream cut a passthrough response; the client's is cut too: %s", exc.logged)
            raise


async def forward(send: Send, resp: Response, *, pooled: bool) -> None:
    """``resp`` to the client as it arrives; closed at the end (also when the client leaves)."""
    headers = raw_response_headers(resp.headers)
    length = resp.header(b"content-length")
    if length is not None and not has_header(resp.headers, b"transfer-encoding"):
        headers.append((b"content-length", length))
    if pooled:  # ours replaces one the upstream sent
        headers = [(k, v) for k, v in headers if k != b"x-prefixpin-replica"]
        headers.append((b"x-prefixpin-replica", b"%d" % resp.replica))
    try:
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        await relay(send, resp.body)
    finally:
        await resp.aclose()


__all__ = ["Passthrough", "forward"]
