"""Talking to the upstream: one pooled connection, header hygiene, passthrough.

Requests and responses are httpx's; they go straight to the transport (aiohttp's
connector, or LiteLLM for ``kind: litellm``), since a proxy has no client-side
cookies, auth or redirects for ``httpx.AsyncClient`` to run.  Response bodies are
relayed chunk by chunk, never buffered; when the client goes away the generator
is closed and so is the upstream response.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterable

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from proxy.config import Upstream
from proxy.errors import PathRefused, UpstreamStreamCut, from_httpx
from proxy.redact import scrub
from proxy.target import Base, client_path

HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
        "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
    }
)  # fmt: skip
OWN_HEADERS = ("x-prefixpin-",)


class UpstreamClient:
    """The upstream: base URL, pooled transport, timeouts.

    A request is sent at most once.  It is sent again only when it provably never
    reached the upstream: the connection could not be made.  (A pooled connection
    the upstream closed meanwhile, as llama-server does after every stream while
    advertising keep-alive, is found closed by the transport before it is used.)
    Once bytes were written, a reset means the upstream may be generating: a
    second copy would be a second generation, billed twice, so it is a 502.
    """

    def __init__(self, cfg: Upstream, transport: httpx.AsyncBaseTransport | None = None) -> None:
        if transport is None:
            from proxy.transport import AiohttpTransport

            transport = AiohttpTransport(max_connections=cfg.max_connections)
        if cfg.kind == "litellm":
            from proxy.litellm_upstream import LiteLLMTransport

            transport = LiteLLMTransport(cfg, transport)
        self.transport = transport
        self.base = cfg.url  # may hold credentials: print only redact(self.base)
        self._base = Base.parse(cfg.url)
        self._basic = None
        if self._base.userinfo is not None:
            self._basic = "Basic " + base64.b64encode(":".join(self._base.userinfo).encode()).decode()
        connect = min(cfg.connect_timeout_s, cfg.timeout_s)
        self.timeout = {"connect": connect, "read": cfg.timeout_s, "write": cfg.timeout_s, "pool": cfg.timeout_s}

    async def send(self, method: str, path: str, query: str, headers: list[tuple[str, str]], content: bytes,
                   *, timeout: float | None = None) -> httpx.Response:  # fmt: skip
        """Send and return once the response headers are in (the body streams).

        ``path`` is the client's raw path (proxy.target.client_path); raises
        PathRefused for one that would escape the upstream's base path."""
        limits = self.timeout if timeout is None else dict.fromkeys(self.timeout, timeout)
        target = self._base.target(path, query)
        if self._basic is not None and not any(k.lower() == "authorization" for k, _ in headers):
            headers = [*headers, ("authorization", self._basic)]
        try:
            request = httpx.Request(method, self._base.origin + target, headers=headers, content=content,
                                    extensions={"timeout": limits, "target": target.encode("latin-1")})  # fmt: skip
        except (httpx.InvalidURL, UnicodeEncodeError):
            raise PathRefused("the request path is not a valid URL path") from None
        try:
            return await self.transport.handle_async_request(request)
        except httpx.ConnectError:  # nothing was sent
            return await self.transport.handle_async_request(request)

    async def aclose(self) -> None:
        await self.transport.aclose()


def upstream_url(base: str, path: str, query: str = "") -> str:
    """Join the upstream base URL and a request path (``.../v1`` + ``/v1/x`` -> ``.../v1/x``)."""
    b = Base.parse(base)
    return b.origin + b.target(path, query)


def _named_in_connection(headers: Iterable[tuple[str, str]]) -> set[str]:
    """Header names listed in ``Connection`` (RFC 9110 7.6.1): hop-by-hop too."""
    return {t.strip().lower() for k, v in headers if k.lower() == "connection" for t in v.split(",") if t.strip()}


def request_headers(headers: Iterable[tuple[str, str]], *, identity: bool = False) -> list[tuple[str, str]]:
    """Client headers fit to forward: hop-by-hop (incl. those ``Connection`` names)
    and ``x-prefixpin-*`` removed."""
    headers = list(headers)
    skip = HOP_BY_HOP | _named_in_connection(headers)
    out = [
        (k, v) for k, v in headers
        if k.lower() not in skip and not k.lower().startswith(OWN_HEADERS)
        and not (identity and k.lower() == "accept-encoding")
    ]  # fmt: skip
    if identity:
        out.append(("accept-encoding", "identity"))
    return out


def response_headers(headers: httpx.Headers, *, drop: Iterable[str] = ()) -> dict[str, str]:
    items = headers.multi_items()
    skip = HOP_BY_HOP | _named_in_connection(items) | {d.lower() for d in drop}
    out: dict[str, str] = {}
    for k, v in items:
        lk = k.lower()
        if lk in skip:
            continue
        out[lk] = f"{out[lk]}, {v}" if lk in out and lk != "set-cookie" else v
    return out


async def passthrough(request: Request, upstream: UpstreamClient, body: bytes) -> Response:
    """Forward any request unchanged: method, path, query, body bytes, streaming."""
    try:
        resp = await upstream.send(
            request.method, client_path(request), request.url.query, request_headers(request.headers.items()), body
        )
    except httpx.HTTPError as exc:
        raise from_httpx(exc, upstream.base) from exc

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
    return StreamingResponse(
        relay(), status_code=resp.status_code, headers=headers, background=BackgroundTask(resp.aclose)
    )
