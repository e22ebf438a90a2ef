"""Talking to the upstream: one pooled connection, header hygiene, passthrough.

Requests and responses are httpx's; they go straight to the transport (aiohttp's
connector, or LiteLLM for ``kind: litellm``), since a proxy has no client-side
cookies, auth or redirects for ``httpx.AsyncClient`` to run.  Response bodies are
relayed chunk by chunk, never buffered; when the client goes away the generator
is closed and so is the upstream response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from urllib.parse import urlsplit

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from proxy.config import Upstream
from proxy.errors import from_httpx

HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
        "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
    }
)  # fmt: skip
OWN_HEADERS = ("x-prefixpin-",)


# A pooled keep-alive connection the upstream closed meanwhile fails like this,
# before any response: the request never reached the upstream, so it is sent once
# more on a fresh connection (what nginx's proxy_next_upstream does).  llama-server
# closes the connection after every stream while advertising keep-alive.
_STALE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class UpstreamClient:
    """The upstream: base URL, pooled transport, timeouts."""

    def __init__(self, cfg: Upstream, transport: httpx.AsyncBaseTransport | None = None) -> None:
        if transport is None:
            from proxy.transport import AiohttpTransport

            transport = AiohttpTransport(max_connections=cfg.max_connections)
        if cfg.kind == "litellm":
            from proxy.litellm_upstream import LiteLLMTransport

            transport = LiteLLMTransport(cfg, transport)
        self.transport = transport
        self.base = cfg.url
        connect = min(cfg.connect_timeout_s, cfg.timeout_s)
        self.timeout = {"connect": connect, "read": cfg.timeout_s, "write": cfg.timeout_s, "pool": cfg.timeout_s}

    async def send(self, method: str, path: str, query: str, headers: list[tuple[str, str]], content: bytes,
                   *, timeout: float | None = None) -> httpx.Response:  # fmt: skip
        """Send and return once the response headers are in (the body streams)."""
        limits = self.timeout if timeout is None else dict.fromkeys(self.timeout, timeout)
        request = httpx.Request(method, upstream_url(self.base, path, query), headers=headers, content=content,
                                extensions={"timeout": limits})  # fmt: skip
        try:
            return await self.transport.handle_async_request(request)
        except _STALE:
            return await self.transport.handle_async_request(request)

    async def aclose(self) -> None:
        await self.transport.aclose()


def upstream_url(base: str, path: str, query: str = "") -> str:
    """Join the upstream base URL and a request path (``.../v1`` + ``/v1/x`` -> ``.../v1/x``)."""
    base = base.rstrip("/")
    if urlsplit(base).path.endswith("/v1") and (path == "/v1" or path.startswith("/v1/")):
        path = path[3:]
    return base + path + (f"?{query}" if query else "")


def request_headers(headers: Iterable[tuple[str, str]], *, identity: bool = False) -> list[tuple[str, str]]:
    """Client headers fit to forward: hop-by-hop and ``x-prefixpin-*`` removed."""
    out = [
        (k, v) for k, v in headers
        if k.lower() not in HOP_BY_HOP and not k.lower().startswith(OWN_HEADERS)
        and not (identity and k.lower() == "accept-encoding")
    ]  # fmt: skip
    if identity:
        out.append(("accept-encoding", "identity"))
    return out


def response_headers(headers: httpx.Headers, *, drop: Iterable[str] = ()) -> dict[str, str]:
    skip = HOP_BY_HOP | {d.lower() for d in drop}
    out: dict[str, str] = {}
    for k, v in headers.multi_items():
        lk = k.lower()
        if lk in skip:
            continue
        out[lk] = f"{out[lk]}, {v}" if lk in out and lk != "set-cookie" else v
    return out


async def passthrough(request: Request, upstream: UpstreamClient, body: bytes) -> Response:
    """Forward any request unchanged: method, path, query, body bytes, streaming."""
    try:
        resp = await upstream.send(
            request.method, request.url.path, request.url.query, request_headers(request.headers.items()), body
        )
    except httpx.HTTPError as exc:
        raise from_httpx(exc, upstream.base) from exc

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        except httpx.HTTPError:
            return  # the upstream cut the body: end ours cleanly
        finally:
            await resp.aclose()

    headers = response_headers(resp.headers)
    if "content-length" in resp.headers and "transfer-encoding" not in resp.headers:
        headers["content-length"] = resp.headers["content-length"]
    return StreamingResponse(
        relay(), status_code=resp.status_code, headers=headers, background=BackgroundTask(resp.aclose)
    )
