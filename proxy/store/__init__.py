"""Where lineages live: a small protocol and two structural backends.

One lookup per request (one Redis round trip): the deepest recorded link of the
request's chain, the lineages owning it, and the lineage named by
``x-prefixpin-parent``.  A fork additionally reads its parent's system and
tools[] blobs.  After the response, one write records the new links, the
response's link, the lineage record and any new blobs.  Everything is namespaced
by tenant and expires after ``store.ttl_s``.

Bounds, so that no client can push another one's lineages out: each tenant holds
at most ``tenant_max_entries`` entries and ``tenant_max_bytes`` of blobs (past
them its own least recently used entries go first), on top of the store's global
bounds; a request records, and a lookup walks, only the newest
``max_links_per_request`` links of its chain (the next turn extends the newest
ones, so a long conversation still continues).  The tenant :data:`ISOLATED` owns
nothing: its lookups find nothing and its records are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from canonicalize import CANDIDATES, LINKS_PER_KEY, SCAN_UP, LineageRecord, Lookup

if TYPE_CHECKING:  # the config section the factory reads (only its fields: no import cycle)
    from proxy.config import Store as StoreConfig

Links = Sequence[bytes]

MAX_RESPONSE_ID = 256  # a response id is the client's string: longer ones are not stored

ISOLATED = ""  # the tenant of a request that shares nothing (see proxy.tenancy)


class Store(Protocol):
    """The storage contract; backends raise :class:`proxy.errors.StoreError`."""

    # When a turn is recorded.  False (the memory store, whose writes never wait): right
    # after its response's last byte, before this process reads the client's next
    # request.  True (Redis: other processes read it): before the response's last bytes
    # go out, so whichever process gets the next turn finds it (proxy.handler).
    shared: bool

    async def lookup(self, tenant: str, links: Sequence[bytes], declared: str | None) -> Lookup: ...

    async def blobs(self, tenant: str, refs: Sequence[str]) -> list[bytes | None]: ...

    async def record(
        self,
        tenant: str,
        record: LineageRecord,
        links: Links,
        blobs: dict[str, bytes],
        touch: Sequence[str],
    ) -> None:
        """Save ``record``; add its id in front of each of the newest
        ``max_links_per_request`` links' owners (deduped, at most LINKS_PER_KEY);
        store new blobs once; keep ``touch`` blobs alive."""
        ...

    async def response(self, tenant: str, response_id: str) -> tuple[str, bytes] | None:
        """The (lineage id, tip link) recorded for a Responses API response id."""
        ...

    async def record_response(self, tenant: str, response_id: str, lineage_id: str, tip: bytes) -> None:
        """Remember that ``response_id`` ended ``lineage_id`` at link ``tip`` (a request
        with ``previous_response_id`` continues from there); one entry of the tenant's,
        bounded and expiring like its others.  Ids over MAX_RESPONSE_ID chars are ignored."""
        ...

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Bounds:
    """Per-tenant bounds, shared by both backends (config: ``store.*``)."""

    tenant_max_entries: int = 50_000
    tenant_max_bytes: int = 128 * 2**20
    max_links_per_request: int = 256


DEFAULT_BOUNDS = Bounds()


def newest(links: Sequence[bytes], bounds: Bounds) -> int:
    """Index of the first of the newest links a request records or looks up."""
    return max(0, len(links) - bounds.max_links_per_request)


def open_store(cfg: StoreConfig) -> Store:
    """The factory the app calls: the ``store`` config section's backend."""
    bounds = Bounds(cfg.tenant_max_entries, cfg.tenant_max_bytes, cfg.max_links_per_request)
    if cfg.backend == "redis":
        from proxy.store.redis import RedisStore

        return RedisStore(cfg.redis_url, ttl_s=cfg.ttl_s, timeout_s=cfg.timeout_ms / 1000, bounds=bounds)
    from proxy.store.memory import MemoryStore

    return MemoryStore(ttl_s=cfg.ttl_s, max_entries=cfg.max_entries, max_bytes=cfg.max_bytes, bounds=bounds)


__all__ = [
    "CANDIDATES",
    "DEFAULT_BOUNDS",
    "ISOLATED",
    "LINKS_PER_KEY",
    "MAX_RESPONSE_ID",
    "SCAN_UP",
    "Bounds",
    "Store",
    "newest",
    "open_store",
]
