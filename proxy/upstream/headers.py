"""Header hygiene between client and upstream: hop-by-hop headers (and those a
``Connection`` header names) never cross, nor do prefixpin's own ``x-prefixpin-*``
request headers; a response header the upstream repeated is joined into one."""

from __future__ import annotations

from collections.abc import Iterable

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
OWN_HEADERS = ("x-prefixpin-",)
_HOP_BY_HOP_RAW = frozenset(h.encode() for h in HOP_BY_HOP)
_OWN_RAW = b"x-prefixpin-"


def _named_in_connection(headers: Iterable[tuple[str, str]]) -> set[str]:
    """Header names listed in ``Connection`` (RFC 9110 7.6.1): hop-by-hop too."""
    return {t.strip().lower() for k, v in headers if k.lower() == "connection" for t in v.split(",") if t.strip()}


def request_headers(headers: Iterable[tuple[str, str]], *, identity: bool = False) -> list[tuple[str, str]]:
    """Client headers fit to forward: hop-by-hop (incl. those ``Connection`` names)
    and ``x-prefixpin-*`` removed."""
    headers = list(headers)
    skip = HOP_BY_HOP | _named_in_connection(headers)
    if identity:
        skip |= {"accept-encoding"}
    out = []
    for k, v in headers:
        lk = k.lower()
        if lk not in skip and not lk.startswith(OWN_HEADERS):
            out.append((k, v))
    if identity:
        out.append(("accept-encoding", "identity"))
    return out


def raw_request_headers(headers: list[tuple[bytes, bytes]], *, identity: bool = False) -> list[tuple[str, str]]:
    """:func:`request_headers` from an ASGI header list (names lowercase, as ASGI has
    them): only the headers that are forwarded get decoded."""
    skip = _HOP_BY_HOP_RAW
    if identity:
        skip |= {b"accept-encoding"}
    for k, v in headers:
        if k == b"connection":
            skip |= {t.strip().lower() for t in v.split(b",") if t.strip()}
    out = [
        (k.decode("latin-1"), v.decode("latin-1")) for k, v in headers if k not in skip and not k.startswith(_OWN_RAW)
    ]
    if identity:
        out.append(("accept-encoding", "identity"))
    return out


def raw_response_headers(
    headers: list[tuple[bytes, bytes]], *, drop: Iterable[bytes] = ()
) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers fit for the client, as an ASGI header list:
    hop-by-hop ones (and those ``Connection`` names) and ``drop`` removed, names
    lower-case, values as sent, a repeated header joined into one (but
    ``set-cookie``, which cannot be)."""
    skip = _HOP_BY_HOP_RAW.union(drop)
    for k, v in headers:
        if k.lower() == b"connection":  # rare: the names it lists are hop-by-hop too
            skip |= {t.strip().lower() for t in v.split(b",") if t.strip()}
    out: dict[bytes, bytes] = {}
    cookies: list[tuple[bytes, bytes]] = []
    for k, v in headers:
        lk = k.lower()
        if lk in skip:
            continue
        if lk == b"set-cookie":
            cookies.append((lk, v))
            continue
        prev = out.get(lk)
        out[lk] = prev + b", " + v if prev is not None else v
    return [*out.items(), *cookies]


def has_header(headers: list[tuple[bytes, bytes]], name: bytes) -> bool:
    """Is ``name`` (lowercase) among ``headers``?"""
    return any(k.lower() == name for k, _ in headers)
