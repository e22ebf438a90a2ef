"""Every route that is not a wire API: forwarded unchanged (method, path, query,
body bytes), the response relayed chunk by chunk, never buffered, through ASGI's
``send`` from the request's own task.  When the client goes away the relay stops
and the upstream response is closed (proxy.watch); when the upstream cuts the
body, the client's is cut too (UpstreamStreamCut, proxy.server.CutStreams)."""

from __future__ import annotations

from collections.abc import AsyncIterable

import httpx
from starlette.types import Scope, Send

from proxy.errors import UpstreamStreamCut
from proxy.redact import scrub
from proxy.upstream.headers import has_header, raw_request_headers, raw_response_headers
from proxy.upstream.pool import REPLICA, Pool
from proxy.upstream.target import client_path
from proxy.watch import ClientWatch


async def passthrough(scope: Scope, upstream: Pool, body: bytes) -> httpx.Response:
    """Forward any request unchanged: method, path, query, body bytes (to the next
    healthy replica in turn when there is a pool); the response, its body unread."""
    return await upstream.send(
        scope["method"],
        client_path(scope),
        scope["query_string"].decode("latin-1"),
        raw_request_headers(scope["headers"]),
        body,
        sticky=False,
    )


async def relay(send: Send, resp: httpx.Response, upstream: Pool, watch: ClientWatch) -> None:
    """Send ``resp`` to the client as it arrives, and close it (also when the client leaves)."""
    headers = raw_response_headers(resp.headers)
    if has_header(resp.headers, b"content-length") and not has_header(resp.headers, b"transfer-encoding"):
        headers.append((b"content-length", resp.headers["content-length"].encode("latin-1")))
    if upstream.pooled:  # ours replaces one the upstream sent
        headers = [(k, v) for k, v in headers if k != b"x-prefixpin-replica"]
        headers.append((b"x-prefixpin-replica", b"%d" % resp.extensions.get(REPLICA, 0)))
    chunks: AsyncIterable[bytes] = resp.stream if isinstance(resp.stream, httpx.AsyncByteStream) else resp.aiter_raw()
    at_end = getattr(chunks, "at_end", None)  # our transport: the last bytes can end the response
    ended = False
    try:
        await send({"type": "http.response.start", "status": resp.status_code, "headers": headers})
        with watch:
            async for chunk in chunks:  # read to its end even once ended: that returns the connection
                if ended:
                    continue
                if at_end is not None and at_end():
                    ended = True
                    await send({"type": "http.response.body", "body": chunk})
                elif chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if not ended:
                await send({"type": "http.response.body", "body": b""})
    except httpx.HTTPError as exc:
        # The upstream cut the body: cut ours too (no terminating chunk), so the
        # client can tell; proxy.server.CutStreams ends the connection.
        raise UpstreamStreamCut("the upstream's response ended early", detail=scrub(str(exc))) from exc
    finally:
        await resp.aclose()
