"""Where lineages live: a small protocol and two structural backends.

One lookup per request (one Redis round trip): the deepest recorded link of the
request's chain, the lineages owning it, the lineage named by
``x-prefixpin-parent``, and the recorded system and tools[] blobs a fork (or a
fork's later turn, or learning) reads next.  After the response, one write records the new links, the
response's link, the lineage record, any new blobs, the Responses API response
id and what the request leaves to its tenant's other conversations.  Everything
is namespaced by tenant and expires after ``store.ttl_s``.

A conversation (a root lineage, its continuations and its forks) has a *home*,
named by its *origin*: the first link of its history, which every request of it
shares (two histories that share any link share their first).  A new lineage's id
starts with its home (:func:`homed`), so a lineage id names it too: the lineage a
Responses request continues (``previous_response_id``), or a declared parent.  The
Redis store keeps each home in one hash slot (proxy.store.redis); the memory store
ignores homes.

What learning keeps (``learn``, canonicalize.sightings and canonicalize.recall) is the
tenant's, not one conversation's: its evidence blobs, and the links its roots *mark*
(a first message's stem and template lines), each with the lineages that marked it
(:data:`Marker`: id and first message's ref).  It is read by :meth:`Store.tenant_wide`
and written with a record (:class:`TenantWide`); the Redis store keeps it in the
tenant's own slot, bounded by :data:`TENANT_WIDE_MAX` fields.

Bounds, so that no client can push another one's lineages out: each tenant holds
at most ``tenant_max_entries`` entries and ``tenant_max_bytes`` of blobs (past
them its own least recently used entries go first), on top of the store's global
bounds; a request records, and a lookup walks, only the newest
``max_links_per_request`` links of its chain (the next turn extends the newest
ones, so a long conversation still continues).  The tenant :data:`ISOLATED` owns
nothing: its lookups find nothing and its records are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from canonicalize import CANDIDATES, LINKS_PER_KEY, SCAN_UP, LineageRecord, Lookup
from canonicalize.lineage import Origin, home, homed, origin_of
from canonicalize.recall import Marker  # a lineage that marked a tenant-wide link: its id, its first message's ref

if TYPE_CHECKING:  # the config section the factory reads (only its fields: no import cycle)
    from proxy.config import Store as StoreConfig

Links = Sequence[bytes]

MAX_RESPONSE_ID = 256  # a response id is the client's string: longer ones are not stored
TENANT_WIDE_MAX = 4096  # tenant-wide fields (marked links, evidence) per tenant, at most tenant_max_entries

ISOLATED = ""  # the tenant of a request that shares nothing (see proxy.tenancy)


@dataclass(frozen=True, slots=True)
class TenantWide:
    """What a request leaves to every conversation of its tenant (written with its
    record): the links its lineage marks, each kept with the lineage's id and
    ``first`` (its first message's ref; None: nothing is marked), and evidence blobs,
    of which a store keeps the first bytes written under a ref."""

    marks: Sequence[bytes] = ()
    first: str | None = None
    blobs: Mapping[str, bytes] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.blobs) or (bool(self.marks) and self.first is not None)


NOTHING_WIDE = TenantWide()


class Store(Protocol):
    """The storage contract; backends raise :class:`proxy.errors.StoreError`."""

    # The moment a turn is recorded (proxy.addons.runner).  "after_last_byte" (the memory
    # store, whose writes never wait): right after its response's last byte, before this
    # process reads the client's next request.  "before_last_byte" (Redis: other
    # processes read it): before the response's last bytes go out, so whichever process
    # gets the next turn finds it.
    records_at: str

    async def lookup(
        self,
        tenant: str,
        links: Sequence[bytes],
        declared: str | None,
        origin: Origin | None = None,
        sent: tuple[str, str] | None = None,
    ) -> Lookup:
        """What the store holds of ``links`` (the newest ``max_links_per_request``),
        and the ``declared`` lineage.  ``origin``: the request's conversation when
        ``links`` do not start with its first link (default: ``links[0]``).  ``sent``:
        the request's system skeleton and tools[] ref as sent; the lookup then also
        returns the recorded system part and tools[] of the lineages found (in the
        conversation's home) for which :func:`canonicalize.lineage.wants_blobs` holds,
        at most ``MAX_LOOKUP_BLOBS`` (``Lookup.blobs``)."""
        ...

    async def blobs(self, tenant: str, refs: Sequence[str], owner: str | None = None) -> list[bytes | None]:
        """The blobs ``refs`` of lineage ``owner``'s conversation (None: not found)."""
        ...

    async def record(
        self,
        tenant: str,
        record: LineageRecord,
        links: Links,
        blobs: dict[str, bytes],
        touch: Sequence[str],
        *,
        origin: Origin | None = None,
        wide: TenantWide = NOTHING_WIDE,
        response: tuple[str, bytes] | None = None,
    ) -> Sequence[str]:
        """Save ``record``; add its id in front of each of the newest
        ``max_links_per_request`` links' owners (deduped, at most LINKS_PER_KEY);
        store new blobs once; keep ``touch`` blobs alive.  Returns the refs of
        ``touch`` the store no longer holds (lost to eviction or a data loss): the
        caller writes them again.

        ``origin``: the request's conversation, when it may not be the record's (a
        conversation resumed with another first message continues a lineage of the
        one it resumes): its next request, looked up there, finds the lineage.
        ``wide``: what the request leaves to the tenant's other conversations.
        ``response``: (response id, the chain's tip) of a Responses API response:
        as :meth:`record_response`, in the same write."""
        ...

    async def tenant_wide(
        self, tenant: str, marks: Sequence[bytes], refs: Sequence[str]
    ) -> tuple[list[tuple[Marker, ...]], list[bytes | None]]:
        """The lineages that marked each of ``marks`` (newest first, at most
        LINKS_PER_KEY), and the tenant's evidence blobs ``refs`` (None: not held)."""
        ...

    async def response(self, tenant: str, response_id: str) -> tuple[str, bytes] | None:
        """The (lineage id, tip link) recorded for a Responses API response id."""
        ...

    async def record_response(self, tenant: str, response_id: str, lineage_id: str, tip: bytes) -> None:
        """Remember that ``response_id`` ended ``lineage_id`` at link ``tip`` (a request
        with ``previous_response_id`` continues from there); one entry of the tenant's,
        bounded and expiring like its others.  Ids over MAX_RESPONSE_ID chars are ignored."""
        ...

    async def ping(self) -> None:
        """Raise :class:`proxy.errors.StoreError`, naming the cause, unless the store
        takes writes now (every shard of a cluster)."""
        ...

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
        from proxy.store.connect import open_client
        from proxy.store.redis import RedisStore

        client = open_client(cfg.redis_url, cfg.redis_mode, cfg.redis_nodes, cfg.sentinel_master, cfg.timeout_ms / 1000)
        return RedisStore(client, ttl_s=cfg.ttl_s, bounds=bounds)
    from proxy.store.memory import MemoryStore

    return MemoryStore(ttl_s=cfg.ttl_s, max_entries=cfg.max_entries, max_bytes=cfg.max_bytes, bounds=bounds)


__all__ = [
    "CANDIDATES",
    "DEFAULT_BOUNDS",
    "ISOLATED",
    "LINKS_PER_KEY",
    "MAX_RESPONSE_ID",
    "NOTHING_WIDE",
    "SCAN_UP",
    "TENANT_WIDE_MAX",
    "Bounds",
    "Marker",
    "Origin",
    "Store",
    "TenantWide",
    "home",
    "homed",
    "newest",
    "open_store",
    "origin_of",
]
