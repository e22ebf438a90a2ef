"""The upstream: base URL, pooled transport, timeouts, at-most-once sending.

Responses are httpx's.  Requests go straight to the transport (prefixpin's own
HTTP/1.1 one, proxy.upstream.transport, given the method, target, headers and
bytes; LiteLLM for ``kind: litellm`` and test transports get an ``httpx.Request``),
since a proxy has no client-side cookies, auth or redirects for
``httpx.AsyncClient`` to run.  Transport failures
leave :meth:`UpstreamClient.send` as prefixpin's own :class:`UpstreamError`
(mapped once, by :func:`proxy.errors.from_httpx`).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Awaitable, Callable

import httpx

from proxy.config import Upstream
from proxy.errors import PathRefused, from_httpx
from proxy.upstream.headers import has_header
from proxy.upstream.target import Base
from proxy.upstream.transport import Body, H1Transport, split_origin

_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")  # would break the request line


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
            transport = H1Transport(max_connections=cfg.max_connections)
        if cfg.kind == "litellm":
            from proxy.upstream.litellm import LiteLLMTransport

            transport = LiteLLMTransport(cfg, transport)
        self.transport = transport
        self.base = cfg.url  # may hold credentials: print only redact(self.base)
        self._base = Base.parse(cfg.url)
        self._origin = split_origin(self._base.origin)
        self._h1 = transport if isinstance(transport, H1Transport) else None
        self._basic = None
        if self._base.userinfo is not None:
            self._basic = "Basic " + base64.b64encode(":".join(self._base.userinfo).encode()).decode()
        connect = min(cfg.connect_timeout_s, cfg.timeout_s)
        self.timeout = {"connect": connect, "read": cfg.timeout_s, "write": cfg.timeout_s, "pool": cfg.timeout_s}

    async def send(
        self,
        method: str,
        path: str,
        query: str,
        headers: list[tuple[str, str]],
        content: bytes,
        *,
        timeout: float | None = None,
    ) -> httpx.Response:
        """Send and return once the response headers are in (the body streams).

        ``path`` is the client's raw path (proxy.upstream.target.client_path);
        raises PathRefused for one that would escape the upstream's base path and
        UpstreamError when the upstream cannot be reached or fails."""
        limits = self.timeout if timeout is None else dict.fromkeys(self.timeout, timeout)
        target = self._base.target(path, query)
        if self._basic is not None and not any(k.lower() == "authorization" for k, _ in headers):
            headers = [*headers, ("authorization", self._basic)]
        h1 = self._h1
        if h1 is not None:
            if _BAD_TARGET.search(target):
                raise PathRefused("the request path is not a valid URL path")
            origin = self._origin
            return await self._twice(lambda: h1.send(method, origin, target, headers, content, limits))
        try:
            request = httpx.Request(
                method,
                self._base.origin + target,
                headers=headers,
                content=content,
                extensions={"timeout": limits, "target": target.encode("latin-1")},
            )
        except (httpx.InvalidURL, UnicodeEncodeError):
            raise PathRefused("the request path is not a valid URL path") from None
        return await self._twice(lambda: self.transport.handle_async_request(request))

    async def _twice(self, send: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
        """``send()``, once more when it could not connect (nothing was sent); an
        httpx failure becomes UpstreamError."""
        try:
            try:
                return await send()
            except httpx.ConnectError:  # nothing was sent
                return await send()
        except httpx.HTTPError as exc:
            raise from_httpx(exc, self.base) from exc

    async def read(self, resp: httpx.Response) -> bytes:
        """A (non-streamed) response's whole body; UpstreamError when the upstream fails it."""
        try:
            if isinstance(resp.stream, Body) and not has_header(resp.headers, b"content-encoding"):
                return b"".join([chunk async for chunk in resp.stream])  # nothing to decode
            return await resp.aread()
        except httpx.HTTPError as exc:
            raise from_httpx(exc, self.base) from exc

    async def aclose(self) -> None:
        await self.transport.aclose()


def upstream_url(base: str, path: str, query: str = "") -> str:
    """Join the upstream base URL and a request path (``.../v1`` + ``/v1/x`` -> ``.../v1/x``)."""
    b = Base.parse(base)
    return b.origin + b.target(path, query)
