"""Every route that is not a wire API: forwarded unchanged (method, path, query,
body bytes), the response relayed as it arrives (proxy.relay), never buffered,
never decoded.  When the client goes away the relay stops and the upstream
response is closed (proxy.watch); when the upstream cuts the body, the
UpstreamError comes out of :func:`forward` after the response started, and the
server cuts the client's response too."""

from __future__ import annotations

from starlette.types import Scope, Send

from proxy.relay import relay
from proxy.upstream.headers import has_header, raw_request_headers, raw_response_headers
from proxy.upstream.message import Response
from proxy.upstream.pool import Pool
from proxy.upstream.target import client_path


async def passthrough(scope: Scope, upstream: Pool, body: bytes) -> Response:
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
