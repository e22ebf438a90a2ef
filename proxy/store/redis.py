"""The shared store: Redis (one server, a Redis Cluster, or Sentinel's master), two
round trips per proxied request, TTL on every key.

Keys (the part in braces is the cluster hash tag: each key lives in one slot)::

    pp:{HOME}:<tenant>:h          a conversation's home: its links, lineage records,
                                  blobs and response ids, in one HASH (proxy.store.scripts)
    pp:{T}:<tenant>:t, :c         the tenant's index: its homes by last report, and
                                  what each holds (T: hashed from the tenant)
    pp:{T}:<tenant>:w             what learning keeps for all the tenant's conversations:
                                  marked links and evidence, in one HASH (scripts.WIDE)
    pp:{R}:<tenant>:r:<id>        lineage id, ',', tip link: where a Responses API
                                  response left its lineage (R: hashed from the id)

A home is named by the conversation's first link (proxy.store.home), so a tenant's
conversations spread over every shard, and a request's work goes to one: the lookup
is one script (HMGET of its newest links, HMGET of their owners' records), the
record one script (HMGET, HSET, EXPIRE).  A home reports to the tenant's index
only when it outgrew what it reserved (or its blobs changed, or a minute passed):
that write goes out after the response, off the request's path.  When the tenant
is over ``store.tenant_max_entries`` or ``tenant_max_bytes``, its least recently
reporting homes are dropped whole; one conversation over them alone drops its own
oldest fields.  The tenant-wide HASH holds at most ``TENANT_WIDE_MAX`` fields (and
no more than ``tenant_max_entries``), its oldest dropped first.

A record's other writes go with its script, at the same time: the record's copy in
the request's own home when that is not the lineage's (a conversation resumed with
another first message), the tenant-wide fields a request leaves, a Responses API
response id's key (in the id's own slot).  On a cluster they go to their nodes side
by side: the request still waits one round trip.  The global bound is the server's ``maxmemory`` policy: it evicts a
conversation whole, and a later request of it starts again as a root.

Scripts run by EVALSHA; a server that does not know one (restarted, failed over,
flushed) gets it by EVAL, which loads it.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import xxhash
from redis.exceptions import NoScriptError, RedisError

from canonicalize import LineageRecord, Lookup
from canonicalize.lineage import MAX_LOOKUP_BLOBS
from proxy.errors import StoreError
from proxy.store import (
    CANDIDATES,
    DEFAULT_BOUNDS,
    ISOLATED,
    LINKS_PER_KEY,
    MAX_RESPONSE_ID,
    NOTHING_WIDE,
    SCAN_UP,
    TENANT_WIDE_MAX,
    Bounds,
    Links,
    Marker,
    Origin,
    TenantWide,
    home,
    newest,
    origin_of,
    scripts,
)
from proxy.store.connect import Client, open_client
from proxy.store.ready import check_writes

REPORT_EVERY_S = 60  # an active conversation tells the tenant's index it is alive at least this often
MAX_REPORTS = 1024  # reports to the tenants' indexes in flight at once (more: dropped, the next retells)


class _Script:
    """One Lua script, run by EVALSHA (EVAL when the server has not seen it)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()  # what Redis names it by

    async def __call__(self, client: Client, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await client.eval(self.source, len(keys), *keys, *args)


_LOOKUP, _RECORD, _MARK, _REPORT, _DROP, _WIDE = map(
    _Script, (scripts.LOOKUP, scripts.RECORD, scripts.MARK, scripts.REPORT, scripts.DROP, scripts.WIDE)
)


def _tag(data: str) -> str:
    return xxhash.xxh3_64_hexdigest(data.encode("utf-8", "surrogatepass"))[:4]


class RedisStore:
    records_at = "before_last_byte"  # every prefixpin process on this Redis reads it (see Store.records_at)

    def __init__(
        self,
        redis: str | Client,
        *,
        ttl_s: int = 86400,
        timeout_s: float = 0.25,
        bounds: Bounds = DEFAULT_BOUNDS,
        mode: str = "standalone",
        nodes: tuple[str, ...] = (),
        master: str | None = None,
    ) -> None:
        """``redis``: a URL (with ``mode``, ``nodes``, ``master`` as in proxy.store.connect)
        or a client opened already."""
        self.ttl_s = ttl_s
        self.bounds = bounds
        self._redis = open_client(redis, mode, nodes, master, timeout_s) if isinstance(redis, str) else redis
        self._pending: set[asyncio.Task[None]] = set()  # reports to the tenants' indexes
        self.clock: Callable[[], float] = time.time

    @staticmethod
    def _home(tenant: str, origin: Origin) -> str:
        return f"pp:{{{home(tenant, origin)}}}:{tenant}:h"

    @staticmethod
    def _wide(tenant: str) -> str:
        return f"pp:{{{_tag(tenant)}}}:{tenant}:w"

    @staticmethod
    def _response_key(tenant: str, response_id: str) -> str:
        return f"pp:{{{_tag(tenant + chr(0) + response_id)}}}:{tenant}:r:{response_id}"

    async def _call(self, what: str, fn: Awaitable[Any]) -> Any:
        try:
            return await fn
        except RedisError as exc:
            raise StoreError(f"redis {what} failed: {type(exc).__name__}: {brief(exc)}") from exc

    async def lookup(
        self,
        tenant: str,
        links: Sequence[bytes],
        declared: str | None,
        origin: Origin | None = None,
        sent: tuple[str, str] | None = None,
    ) -> Lookup:
        if tenant == ISOLATED:
            return Lookup()
        key = self._home(tenant, origin_of(links) if origin is None else origin)
        start = newest(links, self.bounds)
        skeleton, tools = sent if sent is not None else ("", "")
        head = [declared or "", CANDIDATES, SCAN_UP, skeleton, tools, MAX_LOOKUP_BLOBS]
        args = [*head, *(b"l" + link for link in links[start:])]
        work = _LOOKUP(self._redis, [key], args)
        elsewhere = declared is not None and self._home(tenant, declared) != key
        if elsewhere:  # a declared parent of another conversation: its home, at the same time
            assert declared is not None
            other = self._redis.hget(self._home(tenant, declared), "g" + declared)
            out, raw = await self._call("lookup", _both(work, other))
            if isinstance(raw, bytes):
                out[1] = raw
        else:
            out = await self._call("lookup", work)
        depth = int(out[0]) + start if int(out[0]) else 0
        found = _record(out[1]) if out[1] else None
        n = 3 + 2 * int(out[2])
        blobs = {ref.decode(): raw for ref, raw in zip(out[3:n:2], out[4:n:2], strict=True)}
        depths = tuple(int(d) + start for d in out[n::2])
        candidates = tuple(_record(raw) for raw in out[n + 1 :: 2])
        return Lookup(depth, candidates, found, depths, blobs)

    async def blobs(self, tenant: str, refs: Sequence[str], owner: str | None = None) -> list[bytes | None]:
        if tenant == ISOLATED or owner is None or not refs:
            return [None] * len(refs)
        values = await self._call("blob read", self._redis.hmget(self._home(tenant, owner), ["b" + r for r in refs]))
        return [v if isinstance(v, bytes) else None for v in values]

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
        links = links[newest(links, self.bounds) :]
        rid = response[0] if response is not None and len(response[0]) <= MAX_RESPONSE_ID else ""
        at = home(tenant, record.id)
        away = home(tenant, origin) if origin is not None else at
        calls: list[Awaitable[Any]] = [
            _RECORD(self._redis, [self._home(tenant, record.id)], self._args(record, links, blobs, touch, rid))
        ]
        if away != at:  # its copy, with the request's links, where the request's next turn looks
            calls.append(_RECORD(self._redis, [f"pp:{{{away}}}:{tenant}:h"], self._args(record, links, {}, (), "")))
        if wide:
            calls.append(self._write_wide(tenant, record.id, wide))
        if rid:
            assert response is not None
            key, value = self._response_key(tenant, rid), record.id.encode() + b"," + response[1]
            calls.append(self._redis.set(key, value, ex=self.ttl_s))
        outs = await self._call("write", _all(calls))
        out = outs[0]
        report, n_missing = int(out[0]), int(out[3])
        missing = [m.decode() for m in out[4 : 4 + n_missing]]
        dropped = [r.decode() for r in out[4 + n_missing :]]
        if report >= 0 or dropped:
            self._spawn(self._report(tenant, at, report, int(out[2]), dropped))
        if away != at:
            copy = outs[1]
            if int(copy[0]) >= 0 or len(copy) > 4:
                self._spawn(self._report(tenant, away, int(copy[0]), int(copy[2]), [r.decode() for r in copy[4:]]))
        return missing

    def _args(
        self, record: LineageRecord, links: Links, blobs: dict[str, bytes], touch: Sequence[str], rid: str
    ) -> list[str | int | bytes]:
        """RECORD's arguments (scripts.RECORD)."""
        b = self.bounds
        return [
            record.id,
            record.to_bytes(),
            self.ttl_s,
            LINKS_PER_KEY,
            b.tenant_max_entries,
            b.tenant_max_bytes,
            min(REPORT_EVERY_S, max(1, self.ttl_s // 4)),
            int(self.clock()),
            len(links),
            len(blobs),
            len(touch),
            rid,
            _hints(record),
            *(b"l" + link for link in links),
            *blobs,
            *blobs.values(),
            *touch,
        ]

    def _write_wide(self, tenant: str, lineage_id: str, wide: TenantWide) -> Awaitable[Any]:
        marks = list(wide.marks) if wide.first is not None else []
        cap = min(TENANT_WIDE_MAX, self.bounds.tenant_max_entries)
        args = [self.ttl_s, LINKS_PER_KEY, cap, lineage_id, wide.first or "", len(marks), len(wide.blobs)]
        return _WIDE(self._redis, [self._wide(tenant)], [*args, *marks, *wide.blobs, *wide.blobs.values()])

    async def tenant_wide(
        self, tenant: str, marks: Sequence[bytes], refs: Sequence[str]
    ) -> tuple[list[tuple[Marker, ...]], list[bytes | None]]:
        if tenant == ISOLATED or not (marks or refs):
            return [() for _ in marks], [None] * len(refs)
        fields = [b"m" + m for m in marks] + [b"e" + r.encode() for r in refs]
        got = await self._call("tenant-wide read", self._redis.hmget(self._wide(tenant), fields))
        return [_markers(v) for v in got[: len(marks)]], [_evidence(v) for v in got[len(marks) :]]

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        if len(self._pending) >= MAX_REPORTS:  # Redis slower than the writes: the next report retells it
            coro.close()
            return
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def settle(self) -> None:
        """Wait for the reports to the tenants' indexes sent so far."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    async def _report(self, tenant: str, at: str, entries: int, size: int, dropped: list[str]) -> None:
        """Tell the tenant's index what home ``at`` holds; drop the homes it evicts."""
        try:
            if dropped:
                await asyncio.gather(*(self._redis.delete(self._response_key(tenant, r)) for r in dropped))
            if entries < 0:
                return
            t = f"pp:{{{_tag(tenant)}}}:{tenant}:"
            b = self.bounds
            # Scored by the wall clock to the microsecond: reports within a second keep their order.
            args = [at, entries, size, f"{self.clock():.6f}", b.tenant_max_entries, b.tenant_max_bytes, self.ttl_s]
            gone = await _REPORT(self._redis, [t + "t", t + "c"], args)
            for h in gone:
                rids = await _DROP(self._redis, [f"pp:{{{h.decode()}}}:{tenant}:h"], [])
                if rids:
                    await asyncio.gather(*(self._redis.delete(self._response_key(tenant, r.decode())) for r in rids))
        except RedisError:
            pass  # the next report of a home retells it; the guard sees the store's failures on the request path

    async def response(self, tenant: str, response_id: str) -> tuple[str, bytes] | None:
        if tenant == ISOLATED or len(response_id) > MAX_RESPONSE_ID:
            return None
        raw = await self._call("response read", self._redis.get(self._response_key(tenant, response_id)))
        if not isinstance(raw, bytes) or b"," not in raw:
            return None
        lineage_id, tip = raw.split(b",", 1)
        return lineage_id.decode(), tip

    async def record_response(self, tenant: str, response_id: str, lineage_id: str, tip: bytes) -> None:
        """The response's key, in its own slot, and its mark in the lineage's home
        (it counts, and is dropped, as one of the home's entries)."""
        if tenant == ISOLATED or len(response_id) > MAX_RESPONSE_ID:
            return
        key = self._response_key(tenant, response_id)
        await self._call(
            "write",
            _both(
                self._redis.set(key, lineage_id.encode() + b"," + tip, ex=self.ttl_s),
                _MARK(self._redis, [self._home(tenant, lineage_id)], [response_id, self.ttl_s]),
            ),
        )

    async def ping(self) -> None:
        await check_writes(self._redis)

    async def close(self) -> None:
        await self.settle()
        await self._redis.aclose()


async def _both(first: Awaitable[Any], second: Awaitable[Any]) -> tuple[Any, Any]:
    """Two calls at once (on a cluster, to two nodes); the first error raised once both are done."""
    results = await _all([first, second])
    return results[0], results[1]


async def _all(calls: Sequence[Awaitable[Any]]) -> list[Any]:
    """Calls at once (one alone: awaited as it is); the first error raised once all are done."""
    if len(calls) == 1:
        return [await calls[0]]
    results: list[Any] = list(await asyncio.gather(*calls, return_exceptions=True))
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def _markers(raw: Any) -> tuple[Marker, ...]:
    """A marked link's "<seq>,<id> <first>,..." (scripts.WIDE)."""
    if not isinstance(raw, bytes):
        return ()
    out: list[Marker] = []
    for item in raw.decode("utf-8", "replace").split(",")[1:]:
        lineage, _, first = item.partition(" ")
        if lineage and first:
            out.append((lineage, first))
    return tuple(out)


def _evidence(raw: Any) -> bytes | None:
    """An evidence blob's "<seq>|<bytes>" (scripts.WIDE)."""
    return raw.partition(b"|")[2] if isinstance(raw, bytes) else None


def brief(exc: BaseException) -> str:
    """An error's message without the clients' reprs some carry (a Sentinel's), bounded."""
    return str(exc).split(" : <", 1)[0][:300]


def _hints(rec: LineageRecord) -> str:
    """What LOOKUP reads of a record to choose the blobs it returns (scripts.RECORD)."""
    return f"{rec.kind[0]}:{rec.skeleton}:{rec.system_ref or ''}:{rec.tools_ref or ''}"


def _record(raw: bytes) -> LineageRecord:
    """A record as its home holds it: "<seq>:<hints>|<JSON>"."""
    return LineageRecord.from_bytes(raw.partition(b"|")[2] if raw[:1].isdigit() else raw)


__all__ = ["RedisStore"]
