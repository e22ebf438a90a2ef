"""What goes to the upstream and what comes back, as the rest of prefixpin sees it.

A :class:`Request` is bytes ready for the wire: method, request target, headers,
body.  A :class:`Response` carries the upstream's status and headers as it sent
them and a :class:`Body` that streams; reading a body fails only with
:class:`proxy.errors.UpstreamError`.  Every transport (prefixpin's HTTP/1.1 one,
LiteLLM's, a test's) answers with these, so no client library's types reach the
request path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a request goes: scheme, host, port, and the ``Host`` header's value."""

    scheme: str
    host: str
    port: int
    netloc: str

    @property
    def tls(self) -> bool:
        return self.scheme == "https"


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float | None = 10.0
    read: float | None = 600.0  # for the head, then between body pieces
    pool: float | None = 600.0  # waiting for a free connection under the cap


@dataclass(slots=True)
class Request:
    method: str
    origin: Origin
    target: str  # as it goes on the request line: path and query
    headers: list[tuple[str, str]]
    content: bytes = b""
    timeouts: Timeouts = field(default_factory=Timeouts)


class Body(Protocol):
    """A response body: its pieces as they arrive.  Reading it to the end returns the
    connection for reuse; closing it early closes the connection (the upstream
    stops generating)."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    def at_end(self) -> bool:
        """Have the last bytes arrived and been read?  (Then a relay can end its own
        response with the bytes it just read.)"""
        ...

    async def aclose(self) -> None: ...


class Bytes:
    """A body already read whole."""

    __slots__ = ("_data", "_read")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._read = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if not self._read:
            self._read = True
            if self._data:
                yield self._data

    def at_end(self) -> bool:
        return self._read

    async def aclose(self) -> None:
        self._read = True


@dataclass(slots=True)
class Response:
    status: int
    headers: list[tuple[bytes, bytes]]  # as the upstream sent them
    body: Body
    replica: int = 0  # the index in upstream.pool that answered
    reason: bytes = b""

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower-case), or None."""
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    async def read(self) -> bytes:
        """The whole body (closing it); UpstreamError when the upstream fails it."""
        try:
            parts = [chunk async for chunk in self.body]
        finally:
            await self.body.aclose()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def aclose(self) -> None:
        await self.body.aclose()


class Transport(Protocol):
    """Sends one request; answers once the response head is in (the body streams).
    Raises :class:`proxy.errors.UpstreamError`, with ``never_sent`` only when no
    byte of the request can have reached the upstream."""

    async def send(self, request: Request) -> Response: ...

    async def aclose(self) -> None: ...


__all__ = ["Body", "Bytes", "Origin", "Request", "Response", "Timeouts", "Transport"]
