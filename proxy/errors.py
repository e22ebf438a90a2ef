"""prefixpin's errors; the upstream package and the store raise these, and
:mod:`proxy.responses` turns each into the client's response, in one place.

    PrefixpinError
     ├── RequestRejected          the client's request cannot be taken (-> 4xx)
     │    ├── BodyTooLarge        over limits.max_body_bytes (-> 413)
     │    └── PathRefused         the path would climb above the upstream's base path (-> 400)
     ├── Overloaded               past limits.max_concurrency (-> 503 + Retry-After)
     ├── UpstreamError            the upstream failed us (-> 5xx with an OpenAI-style body)
     │    ├── UpstreamUnavailable refused or unreachable: the request never left (-> 502)
     │    │    ├── UpstreamItself its address is prefixpin's own listening address: never sent
     │    │    ├── UpstreamTLS    the TLS handshake failed (certificate verification, ...): never left
     │    │    ├── UpstreamProxy  the egress proxy refused or failed the tunnel: never left
     │    │    └── UpstreamReset  the connection broke after the request was sent (-> 502, never resent)
     │    ├── UpstreamTimeout     connect or response timeout (-> 504)
     │    │    └── UpstreamConnectTimeout  the connection was never made: the request never left
     │    ├── UpstreamProtocol    the upstream spoke broken HTTP, or a head over limits.max_header_bytes (-> 502)
     │    │    └── UpstreamEncoding  a body not valid in its content-encoding, or cut short in it (-> 502)
     │    └── UpstreamStreamCut   a response body ended early (the client's response is cut too)
     └── StoreError               the store is down or slow (never a response: fail open)

Upstream 4xx/5xx *responses* are not errors here: they pass through verbatim.
The response for each error is built in :mod:`proxy.responses`, in the shape of
the API the client spoke.
Messages a client sees never name the upstream's URL ("the upstream"; a TLS or
proxy failure names the host it failed for, never a credential); what helps an
operator goes in ``detail``, scrubbed of credentials, for the log.
"""

from __future__ import annotations

from typing import ClassVar


class PrefixpinError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "prefixpin_error"
    code: ClassVar[str] = "internal_error"
    metric_kind: ClassVar[str] = "other"
    headers: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail  # for the log only (already scrubbed)

    @property
    def logged(self) -> str:
        """The message, with the detail in parentheses when there is one: for the log."""
        return f"{self} ({self.detail})" if self.detail else str(self)


class RequestRejected(PrefixpinError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class BodyTooLarge(RequestRejected):
    status = 413
    code = "request_too_large"


class PathRefused(RequestRejected):
    code = "invalid_path"


class Overloaded(PrefixpinError):
    status = 503
    type = "overloaded_error"
    code = "overloaded"
    headers = (("retry-after", "1"),)


class UpstreamError(PrefixpinError):
    status = 502
    type = "upstream_error"
    code = "upstream_error"
    # True only when the request provably never reached the upstream (no connection
    # was made): the one case a pool may send it to another replica.
    never_sent: ClassVar[bool] = False


class UpstreamUnavailable(UpstreamError):
    code = "upstream_unavailable"
    metric_kind = "connect"
    never_sent = True


class UpstreamItself(UpstreamUnavailable):
    """The upstream's address is prefixpin's own listening address: connected, but
    nothing is sent (it would come back here, again and again)."""

    code = "upstream_is_prefixpin"


class UpstreamTLS(UpstreamUnavailable):
    code = "upstream_tls_error"
    metric_kind = "tls"


class UpstreamProxy(UpstreamUnavailable):
    code = "upstream_proxy_error"
    metric_kind = "proxy"


class UpstreamReset(UpstreamUnavailable):
    metric_kind = "reset"
    never_sent = False


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"
    metric_kind = "timeout"


class UpstreamConnectTimeout(UpstreamTimeout):
    never_sent = True


class UpstreamProtocol(UpstreamError):
    code = "upstream_protocol_error"
    metric_kind = "protocol"


class UpstreamEncoding(UpstreamProtocol):
    code = "upstream_bad_encoding"
    metric_kind = "encoding"


class UpstreamStreamCut(UpstreamError):
    code = "upstream_stream_cut"
    metric_kind = "stream_cut"


class StoreError(PrefixpinError):
    code = "store_unavailable"
