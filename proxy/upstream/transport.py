"""The upstream transport under httpx: aiohttp's connector and C HTTP parser.

prefixpin talks to its upstream through an ``httpx.AsyncClient`` (requests,
responses, streaming, timeouts and errors are httpx's), but the bytes move
through this transport.  httpx's default one (httpcore + h11) costs ~1 ms per
50 KB request on the proxy's hot path and polls every idle pooled socket each
time a request enters or leaves the pool, which gets worse as the pool grows
(encode/httpcore#928); aiohttp's connector does the same job at a fraction of the
cost (measured in tests/bench/overhead).

aiohttp's exceptions are translated to httpx's here, at this one boundary, so the
rest of prefixpin only ever sees httpx errors.  Only a failure to connect becomes
``httpx.ConnectError``/``ConnectTimeout``: everything after a connection was taken
may have reached the upstream, and the caller must not send it again.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
from yarl import URL

from proxy.redact import scrub

# Headers aiohttp would otherwise add or compute itself: what httpx built is what goes out.
_SKIP_AUTO = frozenset({"Accept", "Accept-Encoding", "User-Agent", "Content-Type"})
_COMPUTED = frozenset({b"content-length", b"transfer-encoding"})


def _translate(exc: BaseException) -> httpx.TransportError:
    text = scrub(str(exc) or type(exc).__name__)  # aiohttp quotes the URL in some messages
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(text)
    if isinstance(exc, aiohttp.ServerTimeoutError | TimeoutError):
        return httpx.ReadTimeout(text)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(text)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(text)
    if isinstance(exc, aiohttp.ClientOSError | OSError):
        return httpx.ReadError(text)
    return httpx.RemoteProtocolError(text)


def _peer_closed(proto: Any) -> bool:
    """Is this idle pooled connection readable?  An idle HTTP/1.1 connection has
    nothing to read unless the server closed it (EOF, RST) or is about to (a 408
    some servers send first): either way it must not carry a request.  The event
    loop may not have noticed yet; the kernel has."""
    transport = proto.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLRDHUP | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(0))


class _CheckedConnector(aiohttp.TCPConnector):
    """Before a pooled connection is reused, look at its socket (_peer_closed);
    a closed one is dropped and the next one (or a new connection) is used, so the
    request never goes out on a connection the upstream already closed."""

    async def _get(self, key: Any, traces: list[Any]) -> Any:
        for proto, _ in self._conns.get(key, ()):
            if proto.is_connected() and _peer_closed(proto):
                proto.close()  # aiohttp's _get skips and discards closed connections
                continue
            break
        return await super()._get(key, traces)


class _Body(httpx.AsyncByteStream):
    """A response body, relayed as the bytes arrive."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise _translate(exc) from exc

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
                connector=_CheckedConnector(**self._connector_args),
                auto_decompress=False,  # bytes pass through as the upstream sent them
                trust_env=False,
                skip_auto_headers=_SKIP_AUTO,
            )
            # aiohttp resends a GET/PUT/DELETE whose pooled connection broke, even
            # after the request was written; a proxy must not (see UpstreamClient).
            self._session._retry_connection = False
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        t = request.extensions.get("timeout") or {}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=t.get("connect"), sock_read=t.get("read"))
        headers = [
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw if k.lower() not in _COMPUTED
        ]
        body = request.content if request.method not in ("GET", "HEAD") or request.content else None
        # The request target as the caller built it: httpx and yarl would both
        # normalize dot segments away (proxy.upstream.target decides which paths may go).
        target = request.extensions.get("target")
        url = (
            URL(f"{request.url.scheme}://{request.url.netloc.decode('ascii')}{target.decode('latin-1')}", encoded=True)
            if isinstance(target, bytes)
            else URL(str(request.url))
        )
        try:
            resp = await self._get_session().request(
                request.method,
                url,
                headers=headers,
                data=body,
                timeout=timeout,
                allow_redirects=False,
                compress=None,
                chunked=None,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise _translate(exc) from exc
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
