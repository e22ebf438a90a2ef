"""prefixpin's errors, translated from httpx / redis at one boundary each.

    PrefixpinError
     ├── RequestRejected          the client's request cannot be taken (-> 4xx)
     │    └── BodyTooLarge        over limits.max_body_bytes (-> 413)
     ├── UpstreamError            the upstream failed us (-> 5xx with an OpenAI-style body)
     │    ├── UpstreamUnavailable refused, unreachable, reset before a response (-> 502)
     │    ├── UpstreamTimeout     connect or read timeout (-> 504)
     │    └── UpstreamProtocol    the upstream spoke broken HTTP (-> 502)
     └── StoreError               the store is down or slow (never a response: fail open)

Upstream 4xx/5xx *responses* are not errors here: they pass through verbatim.
The response for each error is built in :mod:`proxy.responses`, in the shape of
the API the client spoke.
"""

from __future__ import annotations

from typing import ClassVar

import httpx


class PrefixpinError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "prefixpin_error"
    code: ClassVar[str] = "internal_error"
    metric_kind: ClassVar[str] = "other"


class RequestRejected(PrefixpinError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class BodyTooLarge(RequestRejected):
    status = 413
    code = "request_too_large"


class UpstreamError(PrefixpinError):
    status = 502
    type = "upstream_error"
    code = "upstream_error"


class UpstreamUnavailable(UpstreamError):
    code = "upstream_unavailable"
    metric_kind = "connect"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"
    metric_kind = "timeout"


class UpstreamProtocol(UpstreamError):
    code = "upstream_protocol_error"
    metric_kind = "protocol"


class StoreError(PrefixpinError):
    code = "store_unavailable"


def from_httpx(exc: httpx.HTTPError, url: str) -> UpstreamError:
    """Translate an httpx failure talking to ``url`` (never includes headers or keys)."""
    if isinstance(exc, httpx.TimeoutException):
        phase = "connecting to" if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout) else "waiting for"
        return UpstreamTimeout(f"prefixpin timed out {phase} the upstream at {url}")
    if isinstance(exc, httpx.ConnectError):
        return UpstreamUnavailable(f"prefixpin could not connect to the upstream at {url}: {exc}")
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return UpstreamUnavailable(f"the upstream at {url} closed the connection before responding: {exc}")
    return UpstreamProtocol(f"the upstream at {url} failed: {type(exc).__name__}: {exc}")
