"""The embedded store shared by several worker processes (``listen.workers``).

The serve process holds the one :class:`~proxy.store.memory.MemoryStore`; each
worker's :class:`SharedStore` asks it over the worker's :class:`~proxy.link.Link`.
A lookup is one round trip, like Redis's; a record is one more, after the
response.  So a continuation finds its lineage whichever worker its connection
landed on, and a worker that restarts finds every lineage still there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from canonicalize import LineageRecord, Lookup
from proxy.errors import StoreError
from proxy.link import Link, LinkClosed, run_sync
from proxy.store import Links, Store

# The operations a worker may ask for: Store's methods, nothing else.
OPS = frozenset({"lookup", "blobs", "record", "response", "record_response", "ping"})


def serve(store: Store, name: str, args: tuple[Any, ...]) -> Any:
    """Run one worker's store call on the serve process's memory store (whose
    calls never wait: answered at once, in the order they came)."""
    if name not in OPS:
        raise ValueError(f"unknown store operation {name!r}")
    return run_sync(getattr(store, name)(*args))


class SharedStore:
    """The Store protocol over a link to the serve process."""

    immediate = True  # record() and record_response() never wait (proxy.addons.record)
    # Records leave this process: the handler sends them before the client's last
    # bytes, so the serve process has them before the next turn can reach any worker
    # (and a worker killed as its answer leaves has sent them already).
    remote = True

    def __init__(self, link: Link | None = None, *, timeout_s: float = 0.25) -> None:
        self.link = link  # set by the worker once its event loop runs
        self.timeout_s = timeout_s

    async def _call(self, name: str, *args: Any) -> Any:
        link = self.link
        if link is None:
            raise StoreError("store: the worker is not connected to its serve process")
        try:
            return await link.call("store." + name, *args, timeout=self.timeout_s)
        except LinkClosed as exc:
            raise StoreError(f"store: {exc}") from None
        except RuntimeError as exc:
            raise StoreError(f"store: {exc}") from None

    async def lookup(self, tenant: str, links: Sequence[bytes], declared: str | None) -> Lookup:
        found: Lookup = await self._call("lookup", tenant, list(links), declared)
        return found

    async def blobs(self, tenant: str, refs: Sequence[str]) -> list[bytes | None]:
        found: list[bytes | None] = await self._call("blobs", tenant, list(refs))
        return found

    def _cast(self, name: str, *args: Any) -> None:
        link = self.link
        if link is None:
            raise StoreError("store: the worker is not connected to its serve process")
        try:
            link.cast("store." + name, *args)
        except LinkClosed as exc:
            raise StoreError(f"store: {exc}") from None

    async def record(
        self, tenant: str, record: LineageRecord, links: Links, blobs: dict[str, bytes], touch: Sequence[str]
    ) -> None:
        # Sent, not awaited: the serve process applies a link's frames in order, and
        # a lookup from another worker comes after this request's response.
        self._cast("record", tenant, record, list(links), blobs, list(touch))

    async def response(self, tenant: str, response_id: str) -> tuple[str, bytes] | None:
        found: tuple[str, bytes] | None = await self._call("response", tenant, response_id)
        return found

    async def record_response(self, tenant: str, response_id: str, lineage_id: str, tip: bytes) -> None:
        self._cast("record_response", tenant, response_id, lineage_id, tip)

    async def ping(self) -> None:
        await self._call("ping")

    async def close(self) -> None:
        return None  # the link is the worker's, closed with it
