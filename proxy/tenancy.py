"""Who a request belongs to.

The default tenant is a hash of the ``Authorization`` / ``x-api-key`` value: two
clients with different keys never share a lineage, and the key itself is never
stored or logged (only this one-way hash is).  ``x-prefixpin-tenant`` names the
tenant instead only when ``tenancy.trust_header`` is on (a trusted gateway in
front of prefixpin sets it).
"""

from __future__ import annotations

import hashlib

from starlette.datastructures import Headers


def tenant_of(headers: Headers, *, trust_header: bool) -> str:
    if trust_header:
        named = headers.get("x-prefixpin-tenant")
        if named:
            return "t" + _hash(b"tenant:" + named.encode("utf-8", "replace"))
    secret = headers.get("authorization") or headers.get("x-api-key") or ""
    if not secret:
        return "anon"
    return "k" + _hash(b"key:" + secret.encode("utf-8", "replace"))


def _hash(data: bytes) -> str:
    # A cryptographic hash: the key cannot be recovered from what is stored.
    return hashlib.blake2b(data, digest_size=16, person=b"prefixpin").hexdigest()
