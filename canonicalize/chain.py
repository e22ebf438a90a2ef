"""The hash chain over a conversation's non-system messages.

Link *i* is ``xxh3_128(link[i-1] + canonical(message[i]))``: equal links mean equal
histories up to that point, so the deepest recorded link a request shares with
the store is its parent.  The chain grows linearly with the conversation and is
computed once per request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import xxhash

if TYPE_CHECKING:
    from canonicalize.wire.base import Exchange

ROOT = b"prefixpin/1"


def link(prev: bytes, canonical: bytes) -> bytes:
    """One link of the chain: a 16-byte digest."""
    return xxhash.xxh3_128_digest(prev + canonical)


def links(exchange: Exchange, messages: Iterable[Any], prev: bytes = ROOT) -> tuple[list[bytes], list[int]]:
    """The chain for ``messages`` (one link per message) and each message's canonical size."""
    out: list[bytes] = []
    sizes: list[int] = []
    for msg in messages:
        canonical = exchange.canonical_message(msg)
        prev = link(prev, canonical)
        out.append(prev)
        sizes.append(len(canonical))
    return out, sizes


def extend(exchange: Exchange, chain: Sequence[bytes], message: Any) -> bytes:
    """The link a reply ``message`` adds after ``chain``."""
    return link(chain[-1] if chain else ROOT, exchange.canonical_message(message))


def digest(data: bytes) -> str:
    """Content hash used for blobs and fingerprints (hex)."""
    return xxhash.xxh3_128_hexdigest(data)
