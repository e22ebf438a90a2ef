"""Host names as they go on the wire.

A configured upstream may name its host in any script (``http://bücher.example``):
DNS, the ``Host`` header and TLS's server name all take the ASCII form, IDNA 2008
with UTS 46 mapping (``xn--bcher-kva.example``), as httpx and browsers write it.
Addresses and ASCII names pass unchanged.  Config validation calls
:func:`ascii_host` on every upstream URL, so a name that has no such form is a
config error naming the key, never a failure at the first request.
"""

from __future__ import annotations

import functools

import idna


@functools.lru_cache(maxsize=256)
def ascii_host(host: str) -> str:
    """``host`` as DNS and HTTP take it; ValueError naming the problem when it has no
    ASCII form."""
    if host.isascii():
        return host
    try:
        return idna.encode(host, uts46=True).decode("ascii")
    except idna.IDNAError as exc:
        raise ValueError(f"the host {host!r} has no IDNA (ASCII) form: {exc}") from None


__all__ = ["ascii_host"]
