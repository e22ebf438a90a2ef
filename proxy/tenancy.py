"""Who a request belongs to.

Every credential the request carries, wherever it carries it, makes up its
tenant: the values of the ``tenancy.credential_headers`` (``Authorization``,
``x-api-key``, Azure's ``api-key``, Google's ``x-goog-api-key``) and of the
``tenancy.credential_params`` of the query string (``?key=``, ``?api_key=``, ...)
are combined, each with its place, into one blake2b hash.  Two clients with
different credentials never share a lineage, and no credential is stored or
logged (only this one-way hash is).  Credentials are hashed as the bytes the
client sent (the header's value, the query parameter's percent-decoded bytes):
two values that differ in any byte, valid UTF-8 or not, are two tenants.  The place is part of the hash: the same key
sent as ``x-api-key`` and as ``?key=`` makes two tenants (a client keeps its
place, so it loses nothing; nothing is ever shared across places).

A request with no credential at all has no tenant to share with anyone: under
``tenancy.anonymous: isolated`` (the default) it is :data:`ISOLATED`, which the
stores treat as owning nothing (it never continues or forks from anything and
records nothing).  ``shared`` puts every anonymous request in one ``anon``
tenant (a sidecar whose only client is trusted).

``x-prefixpin-tenant`` names the tenant instead only when
``tenancy.trust_header`` is on (a trusted gateway in front of prefixpin sets it).

:class:`RedactCredentials` keeps the credential query parameters out of the
access log, which prints each request's path with its query string.
"""

from __future__ import annotations

import functools
import hashlib
from operator import itemgetter
from urllib.parse import unquote_to_bytes

from proxy.config import Tenancy
from proxy.store import ISOLATED

SHARED_ANONYMOUS = "anon"


def tenant_of(headers: list[tuple[bytes, bytes]], query: bytes, policy: Tenancy) -> str:
    """The tenant of a request with these headers (ASGI's: lower-case names, raw
    values) and this raw query string."""
    if policy.trust_header:
        named = next((v for k, v in headers if k == b"x-prefixpin-tenant" and v), None)
        if named:
            return "t" + _hash([b"tenant", named])
    places = _header_places(policy.credential_headers)
    found: list[tuple[int, bytes]] = []
    for k, v in headers:  # one pass over the headers, each name looked up once
        listed = places.get(k)
        if listed is not None and v:
            found += ((rank, prefix + v) for rank, prefix in listed)
    if len(found) > 1:
        found.sort(key=itemgetter(0))  # in the configured order, then as sent (a stable sort): the hash's order
    parts = [part for _, part in found]
    if query:
        parts += _query_credentials(query, _param_names(policy.credential_params))
    if not parts:
        return SHARED_ANONYMOUS if policy.anonymous == "shared" else ISOLATED
    return "k" + _hash(parts)


def _query_credentials(query: bytes, names: dict[bytes, bytes]) -> list[bytes]:
    """Each credential parameter's value in ``query``, percent-decoded to its bytes."""
    out = []
    for item in query.split(b"&"):
        name, eq, value = item.partition(b"=")
        prefix = names.get(unquote_to_bytes(name.replace(b"+", b" ")))
        if prefix is not None and eq and value:
            out.append(prefix + unquote_to_bytes(value.replace(b"+", b" ")))
    return out


@functools.lru_cache(maxsize=16)
def _param_names(names: tuple[str, ...]) -> dict[bytes, bytes]:
    return {n.encode(): b"q:" + n.encode() + b"=" for n in names}


@functools.lru_cache(maxsize=16)
def _header_places(names: tuple[str, ...]) -> dict[bytes, tuple[tuple[int, bytes], ...]]:
    """Each credential header as ``Headers`` keys it (lower-case latin-1): its places in
    the configured list (a name listed twice counts twice) and the prefix of its part."""
    places: dict[bytes, tuple[tuple[int, bytes], ...]] = {}
    for rank, name in enumerate(names):
        key = name.lower().encode("latin-1")
        places[key] = (*places.get(key, ()), (rank, b"h:" + name.lower().encode() + b"="))
    return places


def _hash(parts: list[bytes]) -> str:
    # A cryptographic hash: no credential can be recovered from what is stored.
    # Each part is length-prefixed, so no two lists of credentials hash alike.
    h = hashlib.blake2b(digest_size=16, person=b"prefixpin")
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()
