"""An httpx transport as a prefixpin transport: LiteLLM's provider translation and
tests' ``httpx.MockTransport`` answer as httpx does; this turns their requests,
responses and exceptions into prefixpin's (proxy.upstream.message, proxy.errors)
so nothing of httpx goes further."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from proxy.errors import (
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamProtocol,
    UpstreamReset,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from proxy.redact import scrub
from proxy.upstream.message import Request, Response


class HttpxTransport:
    """``inner`` (an ``httpx.AsyncBaseTransport``) behind prefixpin's Transport."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def send(self, request: Request) -> Response:
        o, t = request.origin, request.timeouts
        url = f"{o.scheme}://{o.netloc}{request.target}"
        try:
            req = httpx.Request(
                request.method,
                url,
                headers=request.headers,
                content=request.content,
                extensions={
                    "timeout": {"connect": t.connect, "read": t.read, "write": t.read, "pool": t.pool},
                    "target": request.target.encode("latin-1"),
                },
            )
            resp = await self.inner.handle_async_request(req)
        except httpx.HTTPError as exc:
            raise translate(exc, f"{o.scheme}://{o.netloc}") from exc
        reason = resp.extensions.get("reason_phrase", b"")
        return Response(resp.status_code, list(resp.headers.raw), _Body(resp, url), reason=reason)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Body:
    """An httpx response's bytes as they came (no decoding), its errors translated."""

    def __init__(self, resp: httpx.Response, where: str) -> None:
        self._resp = resp
        self._where = where
        self._ended = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            if self._resp.is_stream_consumed:  # built whole (``httpx.Response(content=...)``)
                if self._resp.content:
                    yield self._resp.content
            else:
                async for chunk in self._resp.aiter_raw():
                    if chunk:
                        yield chunk
        except httpx.HTTPError as exc:
            raise translate(exc, self._where) from exc
        self._ended = True
        await self.aclose()

    def at_end(self) -> bool:
        return self._ended

    async def aclose(self) -> None:
        await self._resp.aclose()


def translate(exc: httpx.HTTPError, where: str) -> UpstreamError:
    """An httpx failure talking to ``where`` as prefixpin's error; the message names no
    URL, header or key, ``detail`` (for the log) the redacted place and the cause."""
    detail = f"{scrub(where)}: {type(exc).__name__}: {scrub(str(exc))}"
    if isinstance(exc, httpx.ConnectTimeout):
        return UpstreamConnectTimeout("prefixpin timed out connecting to the upstream", detail=detail)
    if isinstance(exc, httpx.PoolTimeout):
        return UpstreamTimeout("prefixpin timed out waiting for a free connection to the upstream", detail=detail)
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout("prefixpin timed out waiting for the upstream's response", detail=detail)
    if isinstance(exc, httpx.ConnectError):
        return UpstreamUnavailable("prefixpin could not connect to the upstream", detail=detail)
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return UpstreamReset(
            "the upstream closed the connection after the request was sent, before responding; "
            "prefixpin did not resend it (the upstream may have received it)",
            detail=detail,
        )
    return UpstreamProtocol(f"the upstream failed: {type(exc).__name__}", detail=detail)


__all__ = ["HttpxTransport", "translate"]
