"""The shared store: Redis, one round trip per lookup, TTL on every key.

Keys (``{tenant}`` is a hash tag, so a tenant's keys share a cluster slot)::

    pp:{tenant}:l:<link hex>   comma-separated ids of the lineages owning this link
    pp:{tenant}:g:<lineage id> the lineage record (JSON)
    pp:{tenant}:b:<content hash> a system / tools[] blob, stored once
    pp:{tenant}:r:<response id> lineage id, ',', tip link: where a Responses API
                               response left its lineage (``previous_response_id``)
    pp:{tenant}:i              the tenant's keys by time of last write (ZSET, for its bounds)
    pp:{tenant}:s              the sizes of the tenant's blobs, their total under '' (HASH)

The lookup is a Lua script: it walks the chain from the deepest link up, stops at
the first recorded one, and returns that link's lineage records (and the declared
parent's) in the same round trip.  The record is one script too: it writes the
links, the lineage and the blobs, then holds the tenant to ``store.tenant_max_entries``
and ``store.tenant_max_bytes`` by deleting its least recently *written* entries
(lookups stay read-only; every turn rewrites what it used: its links from the
deepest found one on, its record, and its blobs' TTLs).  The global bound is the
server's own ``maxmemory`` policy.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from canonicalize import LineageRecord, Lookup
from proxy.errors import StoreError
from proxy.store import (
    CANDIDATES,
    DEFAULT_BOUNDS,
    ISOLATED,
    LINKS_PER_KEY,
    MAX_RESPONSE_ID,
    SCAN_UP,
    Bounds,
    Links,
    newest,
)

# KEYS: the request's link keys in chain order.  ARGV: n, lineage key prefix,
# declared parent id, max candidates, links to scan past the deepest.
# Returns {deepest depth, declared record or '', depth1, record1, depth2, ...}.
_LOOKUP = """
local n = tonumber(ARGV[1])
local prefix = ARGV[2]
local declared = ARGV[3]
local max_candidates = tonumber(ARGV[4])
local scan_up = tonumber(ARGV[5])
local out = {0, ''}
if declared ~= '' then
  local d = redis.call('GET', prefix .. declared)
  if d then out[2] = d end
end
local depth = 0
local seen = {}
local found = 0
for i = n, 1, -1 do
  if depth > 0 and (depth - 1 - i > scan_up or found >= max_candidates) then break end
  local v = redis.call('GET', KEYS[i])
  if v then
    if depth == 0 then depth = i end
    for id in string.gmatch(v, '[^,]+') do
      if not seen[id] and found < max_candidates then
        seen[id] = true
        local rec = redis.call('GET', prefix .. id)
        if rec then
          table.insert(out, i)
          table.insert(out, rec)
          found = found + 1
        end
      end
    end
  end
end
out[1] = depth
return out
"""

# KEYS: the tenant's use index, its blob sizes, then the keys written in order: the
# links, the record, the new blobs, the touched blobs.  ARGV: key prefix, lineage id,
# ttl, max owners per link, tenant max entries, tenant max bytes, n links, n blobs,
# n touched, the record, then one value per new blob.
# Puts the id in front of each link's owner list (deduped, capped), sets the record
# and the blobs, then holds the tenant to its bounds: its least recently written
# entries go first.  The index scores each key by the time (us) of its last write,
# which is also when its TTL started, so the expired ones are exactly those older
# than the TTL.  The sizes hash keeps each blob's size and, under '', their total.
_RECORD = """
local index, sizes = KEYS[1], KEYS[2]
local prefix, id, ttl, cap = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local max_entries, max_bytes = tonumber(ARGV[5]), tonumber(ARGV[6])
local n_links, n_blobs, n_touch = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local plen = #prefix
local total = tonumber(redis.call('HGET', sizes, '') or '0')

local function forget(member)
  local size = redis.call('HGET', sizes, member)
  if size then
    total = total - tonumber(size)
    redis.call('HDEL', sizes, member)
  end
end

local dead = redis.call('ZRANGEBYSCORE', index, '-inf', now - ttl * 1000000, 'LIMIT', 0, 1000)
for _, member in ipairs(dead) do
  forget(member)
  redis.call('ZREM', index, member)
end

local seq = 0
local function written(key)
  seq = seq + 1
  redis.call('ZADD', index, now + seq, string.sub(key, plen + 1))
end

local k = 3
for _ = 1, n_links do
  local key = KEYS[k]
  k = k + 1
  local v = redis.call('GET', key)
  local owners = {id}
  if v then
    for o in string.gmatch(v, '[^,]+') do
      if o ~= id and #owners < cap then table.insert(owners, o) end
    end
  end
  redis.call('SET', key, table.concat(owners, ','), 'EX', ttl)
  written(key)
end
redis.call('SET', KEYS[k], ARGV[10], 'EX', ttl)
written(KEYS[k])
k = k + 1
for i = 1, n_blobs do
  local key, raw = KEYS[k], ARGV[10 + i]
  k = k + 1
  if redis.call('SET', key, raw, 'NX', 'EX', ttl) then
    if redis.call('HSETNX', sizes, string.sub(key, plen + 1), #raw) == 1 then total = total + #raw end
  else
    redis.call('EXPIRE', key, ttl)
  end
  written(key)
end
for _ = 1, n_touch do
  if redis.call('EXPIRE', KEYS[k], ttl) == 1 then written(KEYS[k]) end
  k = k + 1
end

local count = redis.call('ZCARD', index)
while count > max_entries or (total > max_bytes and count > 1) do
  local member = redis.call('ZPOPMIN', index)[1]
  forget(member)
  redis.call('DEL', prefix .. member)
  count = count - 1
end
redis.call('HSET', sizes, '', total)
redis.call('EXPIRE', index, ttl)
redis.call('EXPIRE', sizes, ttl)
return count
"""


class RedisStore:
    shared = True  # every prefixpin process on this Redis reads it (see Store.shared)

    def __init__(
        self, url: str, *, ttl_s: int = 86400, timeout_s: float = 0.25, bounds: Bounds = DEFAULT_BOUNDS
    ) -> None:
        self.ttl_s = ttl_s
        self.bounds = bounds
        self._redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
            health_check_interval=0,
            decode_responses=False,
        )
        self._lookup = self._redis.register_script(_LOOKUP)
        self._record = self._redis.register_script(_RECORD)

    @staticmethod
    def _prefix(tenant: str) -> str:
        return f"pp:{{{tenant}}}:"

    async def lookup(self, tenant: str, links: Sequence[bytes], declared: str | None) -> Lookup:
        if tenant == ISOLATED:
            return Lookup()
        p = self._prefix(tenant)
        start = newest(links, self.bounds)
        keys = [f"{p}l:{link.hex()}" for link in links[start:]]
        try:
            out = await self._lookup(keys=keys, args=[len(keys), p + "g:", declared or "", CANDIDATES, SCAN_UP])
        except RedisError as exc:
            raise StoreError(f"redis lookup failed: {type(exc).__name__}") from exc
        depth = int(out[0]) + start if int(out[0]) else 0
        found = LineageRecord.from_bytes(out[1]) if out[1] else None
        depths = tuple(int(d) + start for d in out[2::2])
        candidates = tuple(LineageRecord.from_bytes(raw) for raw in out[3::2])
        return Lookup(depth, candidates, found, depths)

    async def blobs(self, tenant: str, refs: Sequence[str]) -> list[bytes | None]:
        p = self._prefix(tenant)
        try:
            values = await self._redis.mget([f"{p}b:{ref}" for ref in refs])
        except RedisError as exc:
            raise StoreError(f"redis blob read failed: {type(exc).__name__}") from exc
        return [v if isinstance(v, bytes) else None for v in values]

    async def record(
        self, tenant: str, record: LineageRecord, links: Links, blobs: dict[str, bytes], touch: Sequence[str]
    ) -> None:
        if tenant == ISOLATED:
            return
        p, b = self._prefix(tenant), self.bounds
        links = links[newest(links, b) :]
        keys = [p + "i", p + "s"]
        keys += (f"{p}l:{link.hex()}" for link in links)
        keys.append(f"{p}g:{record.id}")
        keys += (f"{p}b:{ref}" for ref in blobs)
        keys += (f"{p}b:{ref}" for ref in touch)
        args: list[str | int | bytes] = [
            p,
            record.id,
            self.ttl_s,
            LINKS_PER_KEY,
            b.tenant_max_entries,
            b.tenant_max_bytes,
            len(links),
            len(blobs),
            len(touch),
            record.to_bytes(),
        ]
        args += blobs.values()
        try:
            await self._record(keys=keys, args=args)
        except RedisError as exc:
            raise StoreError(f"redis write failed: {type(exc).__name__}") from exc

    async def response(self, tenant: str, response_id: str) -> tuple[str, bytes] | None:
        if tenant == ISOLATED or len(response_id) > MAX_RESPONSE_ID:
            return None
        try:
            raw = await self._redis.get(f"{self._prefix(tenant)}r:{response_id}")
        except RedisError as exc:
            raise StoreError(f"redis response read failed: {type(exc).__name__}") from exc
        if not isinstance(raw, bytes) or b"," not in raw:
            return None
        lineage_id, tip = raw.split(b",", 1)
        return lineage_id.decode(), tip

    async def record_response(self, tenant: str, response_id: str, lineage_id: str, tip: bytes) -> None:
        """Written before the lineage's record, whose script holds the tenant to its
        bounds: the entry joins the tenant's index, so it counts and is evicted like any."""
        if tenant == ISOLATED or len(response_id) > MAX_RESPONSE_ID:
            return
        p = self._prefix(tenant)
        try:
            now = await self._redis.time()
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(f"{p}r:{response_id}", lineage_id.encode() + b"," + tip, ex=self.ttl_s)
                pipe.zadd(p + "i", {f"r:{response_id}": now[0] * 1_000_000 + now[1]})
                await pipe.execute()
        except RedisError as exc:
            raise StoreError(f"redis write failed: {type(exc).__name__}") from exc

    async def ping(self) -> None:
        try:
            await self._redis.ping()
        except RedisError as exc:
            raise StoreError(f"redis is not answering: {type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        await self._redis.aclose()


__all__ = ["RedisStore"]
