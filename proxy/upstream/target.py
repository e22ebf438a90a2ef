"""Where a request goes upstream: the client's request target on the upstream's base.

The path is forwarded as the client sent it (ASGI ``raw_path``), never decoded
or normalized, so an upstream sees what the client meant, ``%2F`` included.  A
path whose dot segments (literal or percent-encoded, in any case, also behind
``%2F`` or ``\\``) would climb above the upstream's base path is refused: with
``upstream.url: http://host/tenantA/v1``, ``/v1/../../admin`` must never become
``/admin``.  Scheme, host and port come from the configured URL only; an
absolute-URI request target or a ``Host`` header changes nothing; a host named
in another script goes out in its IDNA form (:mod:`proxy.hostnames`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from starlette.types import Scope

from proxy.errors import PathRefused
from proxy.hostnames import ascii_host
from proxy.upstream.message import Origin

_SEPARATORS = re.compile(r"[/\\]")


def client_path(scope: Scope) -> str:
    """The request's path exactly as the client sent it (latin-1, like ASGI's query string)."""
    raw = scope.get("raw_path")
    if isinstance(raw, bytes) and raw:
        return raw.decode("latin-1").partition("?")[0]
    path: str = scope["path"]  # a server without raw_path: as Starlette's request.url.path
    return path.replace("?", "%3F").replace("#", "%23").replace("\\", "%5C")


@functools.lru_cache(maxsize=1024)  # a handful of paths, every request
def climbs(path: str) -> bool:
    """Would resolving ``path``'s dot segments go above its start?  Decoded up to
    three times (double encoding), split on ``/`` and ``\\``; empty segments
    count for nothing (the strictest reading of ``a//..``)."""
    for _ in range(3):
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    depth = 0
    for seg in _SEPARATORS.split(path):
        if seg == "..":
            depth -= 1
            if depth < 0:
                return True
        elif seg not in ("", "."):
            depth += 1
    return False


@dataclass(frozen=True)
class Base:
    """The configured upstream URL, split once: origin, base path, base query, userinfo."""

    origin: str
    path: str
    query: str
    userinfo: tuple[str, str] | None
    origin_parts: Origin

    @classmethod
    def parse(cls, url: str) -> Base:
        parts = urlsplit(url)
        host = ascii_host(parts.hostname or "")  # DNS, Host and TLS take a non-ASCII name's IDNA form
        netloc = f"[{host}]" if ":" in host else host
        if parts.port:
            netloc += f":{parts.port}"
        scheme = parts.scheme.lower()
        userinfo = (unquote(parts.username), unquote(parts.password or "")) if parts.username else None
        port = parts.port or (443 if scheme == "https" else 80)
        return cls(
            f"{scheme}://{netloc}", parts.path.rstrip("/"), parts.query, userinfo, Origin(scheme, host, port, netloc)
        )

    def target(self, path: str, query: str = "") -> str:
        """The upstream request target for a client's path and query (``.../v1`` +
        ``/v1/x`` -> ``.../v1/x``); raises PathRefused for a path that escapes."""
        if not path.startswith("/"):
            raise PathRefused("the request path must start with '/'")
        if self.path.endswith("/v1") and (path == "/v1" or path.startswith("/v1/")):
            path = path[3:]
        if climbs(path):
            raise PathRefused("the request path climbs above the API's base path ('..' segments)")
        q = "&".join(p for p in (self.query, query) if p)
        return self.path + path + (f"?{q}" if q else "")
