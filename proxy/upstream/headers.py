"""Header hygiene between client and upstream: hop-by-hop headers (and those a
``Connection`` header names) never cross, nor do prefixpin's own ``x-prefixpin-*``
request headers; a response header the upstream repeated is joined into one."""

from __future__ import annotations

from collections.abc import Iterable

import httpx

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


def _named_in_connection(headers: Iterable[tuple[str, str]]) -> set[str]:
    """Header names listed in ``Connection`` (RFC 9110 7.6.1): hop-by-hop too."""
    return {t.strip().lower() for k, v in headers if k.lower() == "connection" for t in v.split(",") if t.strip()}


def request_headers(headers: Iterable[tuple[str, str]], *, identity: bool = False) -> list[tuple[str, str]]:
    """Client headers fit to forward: hop-by-hop (incl. those ``Connection`` names)
    and ``x-prefixpin-*`` removed."""
    headers = list(headers)
    skip = HOP_BY_HOP | _named_in_connection(headers)
    out = [
        (k, v)
        for k, v in headers
        if k.lower() not in skip
        and not k.lower().startswith(OWN_HEADERS)
        and not (identity and k.lower() == "accept-encoding")
    ]
    if identity:
        out.append(("accept-encoding", "identity"))
    return out


def response_headers(headers: httpx.Headers, *, drop: Iterable[str] = ()) -> dict[str, str]:
    items = headers.multi_items()
    skip = HOP_BY_HOP | _named_in_connection(items) | {d.lower() for d in drop}
    out: dict[str, str] = {}
    for k, v in items:
        lk = k.lower()
        if lk in skip:
            continue
        out[lk] = f"{out[lk]}, {v}" if lk in out and lk != "set-cookie" else v
    return out
