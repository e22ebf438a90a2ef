"""One upstream: its base URL, its transport, timeouts, at-most-once sending.

A request is sent at most once.  It is sent again only when it provably never
reached the upstream: the connection could not be made.  (A pooled connection
the upstream closed meanwhile, as llama-server does after every stream while
advertising keep-alive, is found closed by the transport before it is used.)
Once bytes were written, a reset means the upstream may be generating: a
second copy would be a second generation, billed twice, so it is a 502.  A TLS
or egress-proxy failure is not retried either: it would fail the same way.
"""

from __future__ import annotations

import base64
import re

from proxy.config import Upstream
from proxy.errors import PathRefused, UpstreamError, UpstreamProxy, UpstreamTLS
from proxy.upstream.message import Origin, Request, Response, Timeouts, Transport
from proxy.upstream.target import Base

_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")  # would break the request line


class UpstreamClient:
    """Sends to one upstream URL through ``transport``."""

    def __init__(self, cfg: Upstream, transport: Transport) -> None:
        self.transport = transport
        self.base = cfg.url  # may hold credentials: print only redact(self.base)
        self._base = Base.parse(cfg.url)
        self.origin: Origin = self._base.origin_parts
        self._basic = None
        if self._base.userinfo is not None:
            self._basic = "Basic " + base64.b64encode(":".join(self._base.userinfo).encode()).decode()
        self.timeouts = Timeouts(
            connect=min(cfg.connect_timeout_s, cfg.timeout_s), read=cfg.timeout_s, pool=cfg.timeout_s
        )

    async def send(
        self,
        method: str,
        path: str,
        query: str,
        headers: list[tuple[str, str]],
        content: bytes,
        *,
        timeout: float | None = None,
    ) -> Response:
        """Send and return once the response head is in (the body streams).

        ``path`` is the client's raw path (proxy.upstream.target.client_path);
        raises PathRefused for one that would escape the upstream's base path and
        UpstreamError when the upstream cannot be reached or fails."""
        target = self._base.target(path, query)
        if _BAD_TARGET.search(target):
            raise PathRefused("the request path is not a valid URL path")
        if self._basic is not None and not any(k.lower() == "authorization" for k, _ in headers):
            headers = [*headers, ("authorization", self._basic)]
        timeouts = self.timeouts if timeout is None else Timeouts(timeout, timeout, timeout)
        request = Request(method, self.origin, target, headers, content, timeouts)
        try:
            return await self.transport.send(request)
        except UpstreamError as exc:
            if not exc.never_sent or isinstance(exc, UpstreamTLS | UpstreamProxy):
                raise
        return await self.transport.send(request)  # nothing was sent: once more

    async def aclose(self) -> None:
        await self.transport.aclose()


def upstream_url(base: str, path: str, query: str = "") -> str:
    """Join the upstream base URL and a request path (``.../v1`` + ``/v1/x`` -> ``.../v1/x``)."""
    b = Base.parse(base)
    return b.origin + b.target(path, query)


__all__ = ["UpstreamClient", "upstream_url"]
