"""Every route that is not a wire API: forwarded unchanged (method, path, query,
body bytes), the response relayed chunk by chunk, never buffered.  When the
client goes away the generator is closed and so is the upstream response; when
the upstream cuts the body, the client's is cut too."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from proxy.errors import UpstreamStreamCut
from proxy.redact import scrub
from proxy.upstream.headers import request_headers, response_headers
from proxy.upstream.pool import REPLICA, Pool
from proxy.upstream.target import client_path


async def passthrough(request: Request, upstream: Pool, body: bytes) -> Response:
    """Forward any request unchanged: method, path, query, body bytes, streaming
    (to the next healthy replica in turn when there is a pool)."""
    resp = await upstream.send(
        request.method,
        client_path(request.scope),
        request.url.query,
        request_headers(request.headers.items()),
        body,
        sticky=False,
    )

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            # The upstream cut the body: cut ours too (no terminating chunk), so the
            # client can tell; proxy.abort ends the connection.
            raise UpstreamStreamCut("the upstream's response ended early", detail=scrub(str(exc))) from exc
        finally:
            await resp.aclose()

    headers = response_headers(resp.headers)
    if "content-length" in resp.headers and "transfer-encoding" not in resp.headers:
        headers["content-length"] = resp.headers["content-length"]
    if upstream.pooled:
        headers["x-prefixpin-replica"] = str(resp.extensions.get(REPLICA, 0))
    return StreamingResponse(
        relay(), status_code=resp.status_code, headers=headers, background=BackgroundTask(resp.aclose)
    )
