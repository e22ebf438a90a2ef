"""Egress proxies: which upstream requests go through one, and the CONNECT tunnel.

``upstream.proxy`` names the proxy (``http://[user:pass@]host:port``, or
``https://`` to reach the proxy itself over TLS; ``direct`` for none).  Unset, the
environment decides as the usual HTTP clients (curl, requests, httpx) do:
``HTTPS_PROXY`` for https upstreams, ``HTTP_PROXY`` for http ones, ``ALL_PROXY``
for both, the lower-case names first; ``NO_PROXY`` (a comma-separated list of
hosts, domains with or without a leading dot or ``*.``, IP addresses, CIDR
ranges, each optionally ``:port``, or ``*``) names the upstreams reached
directly, whichever way the proxy was named.

An https upstream is reached through a ``CONNECT host:port`` tunnel, then TLS
with the upstream inside it; an http one with absolute-form request targets
(``POST http://host:port/v1/... HTTP/1.1``) on a connection to the proxy.  The
proxy's credentials go in ``Proxy-Authorization`` and nowhere else: logs and
errors name the proxy as ``scheme://host:port``.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from proxy.config import Environment, egress_for
from proxy.errors import UpstreamProxy
from proxy.upstream.message import Origin

MAX_HEAD = 16 * 1024  # the most of a CONNECT answer's head prefixpin reads


@dataclass(frozen=True)
class Proxy:
    scheme: str  # http | https
    host: str
    port: int
    authorization: str | None = field(default=None, repr=False)  # "Basic ..." from the URL's userinfo

    @classmethod
    def parse(cls, url: str) -> Proxy:
        """``url`` as a proxy; ValueError saying why it cannot be one (no credential in it)."""
        parts = urlsplit(url if "://" in url else f"http://{url}")
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise ValueError(f"{scheme}:// proxies are not supported (use an http:// or https:// proxy)")
        if not parts.hostname:
            raise ValueError("the proxy URL names no host")
        port = parts.port or (443 if scheme == "https" else 80)
        auth = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            auth = "Basic " + base64.b64encode(pair).decode("ascii")
        return cls(scheme, parts.hostname, port, auth)

    @property
    def label(self) -> str:
        """The proxy as logs and errors name it: no credentials."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


class Egress:
    """Which proxy, if any, an origin is reached through."""

    def __init__(self, configured: str | None, env: Environment) -> None:
        self.no_proxy = _NoProxy(env.no_proxy)
        self._by_scheme: dict[str, Proxy | None] = {}
        for scheme in ("http", "https"):
            url = egress_for(scheme, configured, env)
            self._by_scheme[scheme] = Proxy.parse(url) if url else None

    def proxy_for(self, origin: Origin) -> Proxy | None:
        proxy = self._by_scheme.get(origin.scheme)
        if proxy is None or self.no_proxy.matches(origin.host, origin.port):
            return None
        return proxy


class _NoProxy:
    def __init__(self, entries: tuple[str, ...]) -> None:
        self.everything = "*" in entries
        self.hosts: list[tuple[str, int | None]] = []
        self.networks: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int | None]] = []
        for raw in entries:
            entry, port = _split_port(raw.strip().lower())
            entry = entry.removeprefix("*.").lstrip(".").strip("[]")
            if not entry or entry == "*":
                continue
            try:
                self.networks.append((ipaddress.ip_network(entry, strict=False), port))
            except ValueError:
                self.hosts.append((entry, port))

    def matches(self, host: str, port: int) -> bool:
        if self.everything:
            return True
        host = host.lower().strip("[]")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            address = None
        if address is not None:
            return any(address in net and p in (None, port) for net, p in self.networks)
        return any((host == h or host.endswith("." + h)) and p in (None, port) for h, p in self.hosts)


def _split_port(entry: str) -> tuple[str, int | None]:
    host, sep, port = entry.rpartition(":")
    if sep and port.isdigit() and (not host.count(":") or host.endswith("]")):
        return host, int(port)
    return entry, None


class _Answer(asyncio.Protocol):
    """Reads the proxy's answer to CONNECT: its status line and headers."""

    def __init__(self) -> None:
        self.head: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._buf = b""

    def data_received(self, data: bytes) -> None:
        if self.head.done():
            return
        self._buf += data
        end = self._buf.find(b"\r\n\r\n")
        if end >= 0:
            self.head.set_result(self._buf[:end])
        elif len(self._buf) > MAX_HEAD:
            self.head.set_exception(ValueError("the answer's head is too long"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            self.head.set_exception(ConnectionError("the proxy closed the connection"))


async def tunnel(proxy: Proxy, origin: Origin, transport: asyncio.Transport, answer: _Answer) -> None:
    """Ask ``proxy`` (reached on ``transport``) for a tunnel to ``origin``; raises
    UpstreamProxy unless it answers 2xx."""
    target = f"{origin.host}:{origin.port}" if ":" not in origin.host else f"[{origin.host}]:{origin.port}"
    lines = [f"CONNECT {target} HTTP/1.1", f"host: {target}"]
    if proxy.authorization:
        lines.append(f"proxy-authorization: {proxy.authorization}")
    transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    try:
        head = await answer.head
    except (ValueError, ConnectionError) as exc:
        raise UpstreamProxy(
            f"the egress proxy {proxy.label} failed the tunnel to {target}: {exc}", detail=proxy.label
        ) from None
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit() or not 200 <= int(parts[1]) < 300:
        raise UpstreamProxy(
            f"the egress proxy {proxy.label} refused the tunnel to {target}: {status_line[:200]}", detail=proxy.label
        )


def new_answer() -> _Answer:
    return _Answer()


__all__ = ["Egress", "Proxy", "new_answer", "tunnel"]
