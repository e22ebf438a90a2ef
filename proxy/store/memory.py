"""The embedded store: one LRU dict bounded in entries and in blob bytes, the same
bounds per tenant (a tenant over its share loses its own least recently used
entries, never another tenant's), TTL on every entry, clock injected.  Homes mean
nothing here: every conversation of a tenant is in one dict, and its tenant-wide
entries (marked links, evidence) are entries of the tenant's like any.  ``max_bytes``
and ``tenant_max_bytes`` count the blobs' bytes and what a lineage record holds that
grows with its request (its pinned values, its inherited params, its lists: :func:`held`).  A lookup
whose deepest link belongs to a lineage no other shares a link with reads that link
and the lineage's record, not the links past it (``_owners``); the note of those
lineages holds one entry per lineage record held (and one index entry by its
origin, its first link), dropped with it.  A link's owners are a tuple of lineage
ids, not a list: made of strings only, it is untracked by the cyclic garbage
collector once a collection has seen it, so later collections do not walk it."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from canonicalize import LineageRecord, Lookup
from canonicalize.lineage import MAX_LOOKUP_BLOBS, wants_blobs
from proxy.store import (
    CANDIDATES,
    DEFAULT_BOUNDS,
    ISOLATED,
    LINKS_PER_KEY,
    MAX_RESPONSE_ID,
    NOTHING_WIDE,
    SCAN_UP,
    Bounds,
    Links,
    Marker,
    Origin,
    TenantWide,
    newest,
)

Key = tuple[str, str, Any]
ITEM_BYTES = 64  # what one item of a record's dicts and lists holds besides its characters, about


def held(value: Any) -> int:
    """The bytes ``value`` is charged in the bounds: a blob's length; for a lineage
    record, the characters of its pinned values and inherited params (what the client
    wrote) and ``ITEM_BYTES`` per item of those dicts and of its lists (a system prompt
    of 10,000 dated lines records 10,000 pins); nothing for the other values (a link's
    owners, a marked link's markers, a response's lineage: bounded in size).  An entry
    keeps what it was charged, given back when it goes."""
    kind = type(value)
    if kind is bytes:
        return len(value)
    if kind is not LineageRecord:
        return 0
    pins, params = value.pins, value.params
    n = 2 * (len(pins) + len(params)) + len(value.identity) + len(value.tool_order) + len(value.notes)
    return sum(map(len, pins.values())) + sum(map(len, params.values())) + ITEM_BYTES * (n + len(value.restores))


class _Share:
    """One tenant's entries in use order, and the bytes of its blobs."""

    __slots__ = ("bytes", "keys")

    def __init__(self) -> None:
        self.keys: OrderedDict[Key, None] = OrderedDict()
        self.bytes = 0


class MemoryStore:
    """Bounded by ``max_entries`` and ``max_bytes`` (blobs and records: :func:`held`) in all, by
    ``bounds.tenant_max_entries`` and ``bounds.tenant_max_bytes`` per tenant (least
    recently used go first) and by ``ttl_s``."""

    records_at = "after_last_byte"  # this process's own: record() never waits (see Store.records_at)

    def __init__(
        self,
        *,
        ttl_s: int = 86400,
        max_entries: int = 200_000,
        max_bytes: int = 512 * 2**20,
        bounds: Bounds = DEFAULT_BOUNDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bounds = bounds
        self.clock = clock
        self._data: OrderedDict[Key, tuple[float, Any, int]] = OrderedDict()  # expires, value, held(value)
        self._bytes = 0  # what the entries held are charged (held())
        self._shares: dict[str, _Share] = {}
        # Per tenant, each lineage every link naming it names alone (see _owners): when the
        # first of those links expires, and its origin (its first link), by which
        # ``_origins`` finds it.
        self._alone: dict[str, dict[str, tuple[float, bytes]]] = {}
        self._origins: dict[str, dict[bytes, str]] = {}

    def __len__(self) -> int:
        return len(self._data)

    def _get(self, key: Key, now: float | None = None) -> Any:
        """The live value at ``key`` (now most recently used), or None; ``now``: the
        clock, when the caller has read it for several keys."""
        item = self._data.get(key)
        if item is None:
            return None
        if item[0] <= (self.clock() if now is None else now):
            self._drop(key)
            return None
        self._data.move_to_end(key)
        self._shares[key[0]].keys.move_to_end(key)
        return item[1]

    def _drop(self, key: Key) -> None:
        size = self._data.pop(key)[2]
        share = self._shares[key[0]]
        del share.keys[key]
        if key[1] == "g" and self._alone:
            self._unalone(key[0], key[2])
        if size:
            self._bytes -= size
            share.bytes -= size
        if not share.keys:
            del self._shares[key[0]]

    def _set(self, key: Key, value: Any, now: float | None = None, size: int | None = None) -> None:
        """``value`` at ``key``, charged ``size`` (``held(value)``, given when the caller
        knows it) in the bounds."""
        data = self._data
        expires = (self.clock() if now is None else now) + self.ttl_s
        old = data.get(key)
        if size is None:
            size = held(value)
        if old is not None:  # replaced in place, then most recently used: as if dropped and set again
            share = self._shares[key[0]]
            data[key] = (expires, value, size)
            data.move_to_end(key)
            share.keys.move_to_end(key)
            grown = size - old[2]
            self._bytes += grown
            share.bytes += grown
            if grown <= 0:
                return  # nothing grew: every bound still holds
        else:
            found = self._shares.get(key[0])
            share = found if found is not None else self._shares.setdefault(key[0], _Share())
            data[key] = (expires, value, size)
            share.keys[key] = None
            self._bytes += size
            share.bytes += size
        b = self.bounds
        while len(share.keys) > b.tenant_max_entries or (share.bytes > b.tenant_max_bytes and len(share.keys) > 1):
            self._drop(next(iter(share.keys)))
        while len(self._data) > self.max_entries or (self._bytes > self.max_bytes and len(self._data) > 1):
            self._drop(next(iter(self._data)))

    def _touch(self, key: Key, now: float) -> bool:
        """``_set(key, _get(key, now), now)`` when it is live: one lookup, nothing grows.
        False: it is not held."""
        item = self._data.get(key)
        if item is None:
            return False
        if item[0] <= now:
            self._drop(key)
            return False
        self._data[key] = (now + self.ttl_s, item[1], item[2])
        self._data.move_to_end(key)
        self._shares[key[0]].keys.move_to_end(key)
        return True

    async def lookup(
        self,
        tenant: str,
        links: Sequence[bytes],
        declared: str | None,
        origin: Origin | None = None,
        sent: tuple[str, str] | None = None,
    ) -> Lookup:
        """The deepest recorded link and the lineages owning the links up to SCAN_UP past
        it.  A link the walk passes is used (most recently) only when it names a lineage
        not named deeper: the deepest one and one per lineage, not every link of a
        conversation on every turn (the next record uses the deepest again; Redis'
        lookups use nothing)."""
        if tenant == ISOLATED:
            return Lookup()
        if tenant not in self._shares:  # nothing recorded (or all of it gone)
            return Lookup()
        now = self.clock()
        lo = newest(links, self.bounds)
        depth = self._deepest(tenant, links, lo, now)
        candidates, depths = self._owners(tenant, links, depth, lo, now) if depth else ([], [])
        found = self._get((tenant, "g", declared), now) if declared else None
        blobs = self._wanted(tenant, sent, [found, *candidates], now) if sent is not None else {}
        return Lookup(depth, tuple(candidates), found, tuple(depths), blobs)

    def _deepest(self, tenant: str, links: Sequence[bytes], lo: int, now: float) -> int:
        """How many of ``links`` (from ``lo`` on) are recorded: the deepest live one's
        depth (0: none)."""
        data = self._data
        i = len(links) - 1
        while i >= lo:
            key = (tenant, "l", links[i])
            item = data.get(key)  # self._get, inlined: the loop may visit every link
            if item is not None:
                if item[0] > now:
                    return i + 1
                self._drop(key)
                if tenant not in self._shares:  # that was the tenant's last entry
                    return 0
            i -= 1
        return 0

    def _owners(
        self, tenant: str, links: Sequence[bytes], depth: int, lo: int, now: float
    ) -> tuple[list[LineageRecord], list[int]]:
        """The lineages of the links up to SCAN_UP past the deepest (at ``depth``), each
        with the deepest link of the request it owns.

        When the deepest link names one lineage and that lineage is *alone* (``_alone``),
        that lineage is the answer and the links past the deepest are not read.  A
        lineage is alone from its first record as a new root (which covers its history
        from the first link) until a link naming it is shared with another lineage, its
        record is dropped, a record of it leaves links of its history unrecorded, or
        another lineage records anew (not held before) a link of a conversation from
        the same origin (its first link; a record whose origin is a previous response's
        lineage ends every note of its tenant); and no longer than its first link could
        live.  Meanwhile each link past the deepest that is held names it alone: the
        links of its history were its own when recorded, and one it lost (evicted,
        expired) is held again only once recorded anew, by itself or by a conversation
        with the same prefix, hence the same first link, which ends the note.  So the
        walk would pass each of them by.  ``tests/proxy/test_store.py`` holds the two to
        the same answers and the same entries on random traffic (with records written
        after other requests evicted links) and on the cases that end a note."""
        notes = self._alone.get(tenant)
        if not notes:
            return self._walk(tenant, links, depth, lo, now)
        deepest = (tenant, "l", links[depth - 1])
        ids = self._data[deepest][1]  # live: _deepest found it
        note = notes.get(ids[0]) if len(ids) == 1 else None
        if note is not None and note[0] > now:
            self._data.move_to_end(deepest)
            self._shares[tenant].keys.move_to_end(deepest)
            rec = self._get((tenant, "g", ids[0]), now)
            return ([rec], [depth]) if rec is not None else ([], [])
        return self._walk(tenant, links, depth, lo, now)

    def _walk(
        self, tenant: str, links: Sequence[bytes], depth: int, lo: int, now: float
    ) -> tuple[list[LineageRecord], list[int]]:
        """``_owners``, link by link."""
        get, data = self._get, self._data
        used, tenant_used = data.move_to_end, self._shares[tenant].keys.move_to_end
        seen: set[str] = set()
        candidates: list[LineageRecord] = []
        depths: list[int] = []
        for j in range(depth - 1, max(lo, depth - 1 - SCAN_UP) - 1, -1):
            key = (tenant, "l", links[j])
            item = data.get(key)
            if item is None:
                continue
            if item[0] <= now:
                self._drop(key)
                if tenant not in self._shares:  # that was the tenant's last entry
                    break
                continue
            ids = item[1]
            if seen.issuperset(ids):  # lineages named deeper: nothing new, the link stays where it is
                continue
            used(key)  # the deepest link, and each naming another lineage: now most recently used
            tenant_used(key)
            for lineage_id in ids:
                if lineage_id in seen:
                    continue
                seen.add(lineage_id)
                rec = get((tenant, "g", lineage_id), now)
                if rec is not None and len(candidates) < CANDIDATES:
                    candidates.append(rec)
                    depths.append(j + 1)
            if len(candidates) >= CANDIDATES:
                break
        return candidates, depths

    def _wanted(
        self, tenant: str, sent: tuple[str, str], recs: Sequence[LineageRecord | None], now: float
    ) -> dict[str, bytes]:
        """The blobs a lookup returns (Store.lookup's ``sent``; the Redis store's LOOKUP)."""
        refs: list[str] = []
        for rec in recs:
            if rec is not None and wants_blobs(rec, *sent):
                refs += [r for r in (rec.system_ref, rec.tools_ref) if r and r not in refs]
        blobs = {}
        for ref in refs[:MAX_LOOKUP_BLOBS]:
            raw = self._get((tenant, "b", ref), now)
            if raw is not None:
                blobs[ref] = raw
        return blobs

    async def blobs(self, tenant: str, refs: Sequence[str], owner: str | None = None) -> list[bytes | None]:
        now = self.clock()
        return [self._get((tenant, "b", ref), now) for ref in refs]

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
        if tenant == ISOLATED:
            return ()
        if response is not None and len(response[0]) <= MAX_RESPONSE_ID:
            self._set((tenant, "r", response[0]), (record.id, response[1]), None, 0)
        if wide:
            self._wide(tenant, record.id, wide)
        now = self.clock()
        data, expires, rec_id = self._data, now + self.ttl_s, record.id
        start = newest(links, self.bounds)
        if start:  # links of its history go unrecorded: it walks as any lineage from now on
            self._unalone(tenant, rec_id)
        # A new root: alone until a link naming it is shared, or a link of its origin is
        # recorded anew by another lineage (see _owners).
        new_root = (
            not start
            and bool(links)
            and record.kind == "root"
            and record.requests <= 1
            and (tenant, "g", rec_id) not in data
        )
        shared, fresh = self._link(tenant, rec_id, links[start:], now)
        if self._alone:
            for lineage_id in shared:
                self._unalone(tenant, lineage_id)
            if fresh:
                self._recorded_anew(tenant, rec_id, origin)
        if new_root and rec_id not in shared:
            self._note_alone(tenant, rec_id, expires, links[0])
        self._set((tenant, "g", record.id), record, now, held(record))
        for ref, raw in blobs.items():
            self._set((tenant, "b", ref), raw, now, len(raw))
        return [ref for ref in touch if not self._touch((tenant, "b", ref), now)]

    def _link(self, tenant: str, rec_id: str, links: Links, now: float) -> tuple[list[str], bool]:
        """``links`` named ``rec_id``'s (first among their owners), each then the most
        recently used; returns the lineages of the links it shares with another, and
        whether a link was not held before."""
        data, expires = self._data, now + self.ttl_s
        shared: list[str] = []
        fresh = False
        for link in links:
            key = (tenant, "l", link)
            # ``_set(key, owners, now)`` after ``_get(key, now)``, in one lookup when it is live.
            item = data.get(key)
            if item is not None and item[0] <= now:
                self._drop(key)
                item = None
            if item is None:
                owners = (rec_id,)  # a new link (most of a new conversation's): no generator to build
                fresh = True
            else:
                owners = item[1]
                if len(owners) != 1 or owners[0] != rec_id:
                    shared += owners
                    shared.append(rec_id)
                if not owners or owners[0] != rec_id:
                    owners = (rec_id, *(o for o in owners if o != rec_id))[:LINKS_PER_KEY]
            if item is None:
                self._set(key, owners, now, 0)
            else:  # replaced in place (not bytes: nothing grows), then most recently used
                data[key] = (expires, owners, 0)
                data.move_to_end(key)
                self._shares[tenant].keys.move_to_end(key)
        return shared, fresh

    def _recorded_anew(self, tenant: str, rec_id: str, origin: Origin | None) -> None:
        """Lineage ``rec_id`` recorded links that were not held, of a conversation from
        ``origin``: one of them may be a link an alone lineage of that origin lost (every
        link of a conversation chains from its first), which would name another lineage
        now: that lineage is alone no more.  An origin that is not a first link (a
        previous response's lineage, or not said): no alone lineage of the tenant is."""
        if isinstance(origin, bytes):
            other = self._origins.get(tenant, {}).get(origin)
            if other is not None and other != rec_id:
                self._unalone(tenant, other)
        else:
            self._alone.pop(tenant, None)
            self._origins.pop(tenant, None)

    def _note_alone(self, tenant: str, lineage_id: str, expires: float, origin: bytes) -> None:
        """``lineage_id`` (a new root from ``origin``) is alone until ``expires``."""
        other = self._origins.get(tenant, {}).get(origin)
        if other is not None and other != lineage_id:  # one alone lineage per origin: the index is 1:1
            self._unalone(tenant, other)
        self._alone.setdefault(tenant, {})[lineage_id] = (expires, origin)
        self._origins.setdefault(tenant, {})[origin] = lineage_id

    def _unalone(self, tenant: str, lineage_id: str) -> None:
        """``lineage_id`` is alone no more (nothing when it was not)."""
        notes = self._alone.get(tenant)
        if notes is None:
            return
        note = notes.pop(lineage_id, None)
        if note is None:
            return
        del self._origins[tenant][note[1]]
        if not notes:
            del self._alone[tenant]
            del self._origins[tenant]

    def _wide(self, tenant: str, lineage_id: str, wide: TenantWide) -> None:
        now = self.clock()
        if wide.first is not None:
            marker = (lineage_id, wide.first)
            for link in wide.marks:
                key = (tenant, "m", link)
                markers = self._get(key, now) or ()
                self._set(key, (marker, *(m for m in markers if m[0] != lineage_id))[:LINKS_PER_KEY], now, 0)
        for ref, raw in wide.blobs.items():
            if not self._touch((tenant, "b", ref), now):  # a ref's first bytes are kept
                self._set((tenant, "b", ref), raw, now, len(raw))

    async def tenant_wide(
        self, tenant: str, marks: Sequence[bytes], refs: Sequence[str]
    ) -> tuple[list[tuple[Marker, ...]], list[bytes | None]]:
        if tenant == ISOLATED:
            return [() for _ in marks], [None] * len(refs)
        now = self.clock()
        return [self._get((tenant, "m", m), now) or () for m in marks], [self._get((tenant, "b", r), now) for r in refs]

    async def response(self, tenant: str, response_id: str) -> tuple[str, bytes] | None:
        if tenant == ISOLATED or len(response_id) > MAX_RESPONSE_ID:
            return None
        found: tuple[str, bytes] | None = self._get((tenant, "r", response_id))
        return found

    async def record_response(self, tenant: str, response_id: str, lineage_id: str, tip: bytes) -> None:
        if tenant != ISOLATED and len(response_id) <= MAX_RESPONSE_ID:
            self._set((tenant, "r", response_id), (lineage_id, tip), None, 0)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        self._data.clear()
        self._shares.clear()
        self._alone.clear()
        self._origins.clear()
        self._bytes = 0
