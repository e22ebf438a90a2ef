"""The upstream transport under httpx: aiohttp's connector and C HTTP parser.

prefixpin talks to its upstream through an ``httpx.AsyncClient`` (requests,
responses, streaming, timeouts and errors are httpx's), but the bytes move
through this transport.  httpx's default one (httpcore + h11) costs ~1 ms per
50 KB request on the proxy's hot path and polls every idle pooled socket each
time a request enters or leaves the pool, which gets worse as the pool grows
(encode/httpcore#928); aiohttp's connector does the same job at a fraction of the
cost (measured in tests/bench/overhead).

aiohttp's exceptions are translated to httpx's here, at this one boundary, so the
rest of prefixpin only ever sees httpx errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx

# Headers aiohttp would otherwise add or compute itself: what httpx built is what goes out.
_SKIP_AUTO = frozenset({"Accept", "Accept-Encoding", "User-Agent", "Content-Type"})
_COMPUTED = frozenset({b"content-length", b"transfer-encoding"})


def _translate(exc: BaseException, *, connecting: bool) -> httpx.TransportError:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError) or (connecting and isinstance(exc, TimeoutError)):
        return httpx.ConnectTimeout(text)
    if isinstance(exc, aiohttp.SocketTimeoutError | TimeoutError):
        return httpx.ReadTimeout(text)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(text)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(text)
    if isinstance(exc, aiohttp.ClientOSError | OSError):
        return httpx.ReadError(text)
    return httpx.RemoteProtocolError(text)


class _Body(httpx.AsyncByteStream):
    """A response body, relayed as the bytes arrive."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise _translate(exc, connecting=False) from exc

    async def aclose(self) -> None:
        # A body read to its end returns the connection to the pool; one the client
        # abandoned closes it, so the upstream stops generating.
        if self._resp.content.at_eof():
            self._resp.release()
        else:
            self._resp.close()


class AiohttpTransport(httpx.AsyncBaseTransport):
    def __init__(self, *, max_connections: int, keepalive_s: float = 15.0) -> None:
        self._connector_args: dict[str, Any] = {
            "limit": max_connections,
            "limit_per_host": 0,
            "keepalive_timeout": keepalive_s,
        }
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        # Created on first use, inside the running loop (aiohttp requires it).
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(**self._connector_args),
                auto_decompress=False,  # bytes pass through as the upstream sent them
                trust_env=False,
                skip_auto_headers=_SKIP_AUTO,
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        t = request.extensions.get("timeout") or {}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=t.get("connect"), sock_read=t.get("read"))
        headers = [
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw if k.lower() not in _COMPUTED
        ]
        body = request.content if request.method not in ("GET", "HEAD") or request.content else None
        try:
            resp = await self._get_session().request(
                request.method, str(request.url), headers=headers, data=body, timeout=timeout,
                allow_redirects=False, compress=None, chunked=None,
            )  # fmt: skip
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise _translate(exc, connecting=True) from exc
        except asyncio.CancelledError:
            raise
        return httpx.Response(
            resp.status,
            headers=list(resp.raw_headers),
            stream=_Body(resp),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": (resp.reason or "").encode("latin-1", "replace")},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
