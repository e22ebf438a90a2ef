"""Where lineages live: a small protocol and two structural backends.

One lookup per request (one Redis round trip): the deepest recorded link of the
request's chain, the lineages owning it, and the lineage named by
``x-prefixpin-parent``.  A fork additionally reads its parent's system and
tools[] blobs.  After the response, one write records the new links, the
response's link, the lineage record and any new blobs.  Everything is namespaced
by tenant and expires after ``store.ttl_s``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from canonicalize import CANDIDATES, LINKS_PER_KEY, SCAN_UP, LineageRecord, Lookup

if TYPE_CHECKING:
    from proxy.config import Store as StoreConfig

Links = Sequence[bytes]


class Store(Protocol):
    """The storage contract; backends raise :class:`proxy.errors.StoreError`."""

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
        """Save ``record``; add its id in front of each link's owners (deduped,
        at most LINKS_PER_KEY); store new blobs once; keep ``touch`` blobs alive."""
        ...

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


def open_store(cfg: StoreConfig) -> Store:
    """The factory the app (and audit) calls: the ``store`` config section's backend."""
    if cfg.backend == "redis":
        from proxy.store.redis import RedisStore

        return RedisStore(cfg.redis_url, ttl_s=cfg.ttl_s, timeout_s=cfg.timeout_ms / 1000)
    from proxy.store.memory import MemoryStore

    return MemoryStore(ttl_s=cfg.ttl_s, max_entries=cfg.max_entries, max_bytes=cfg.max_bytes)


__all__ = ["CANDIDATES", "LINKS_PER_KEY", "SCAN_UP", "Store", "open_store"]
