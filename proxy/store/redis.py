"""The shared store: Redis, one round trip per lookup, TTL on every key.

Keys (``{tenant}`` is a hash tag, so a tenant's keys share a cluster slot)::

    pp:{tenant}:l:<link hex>   comma-separated ids of the lineages owning this link
    pp:{tenant}:g:<lineage id> the lineage record (JSON)
    pp:{tenant}:b:<content hash> a system / tools[] blob, stored once

The lookup is a Lua script: it walks the chain from the deepest link up, stops at
the first recorded one, and returns that link's lineage records (and the declared
parent's) in the same round trip.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from canonicalize import LineageRecord, Lookup
from proxy.errors import StoreError
from proxy.store import CANDIDATES, LINKS_PER_KEY, SCAN_UP, Links

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

# KEYS: link keys.  ARGV: lineage id, ttl, max owners per link.
# Puts the id in front of each link's owner list (deduped, capped), atomically.
_OWN = """
local id, ttl, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for _, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  local owners = {id}
  if v then
    for o in string.gmatch(v, '[^,]+') do
      if o ~= id and #owners < cap then table.insert(owners, o) end
    end
  end
  redis.call('SET', key, table.concat(owners, ','), 'EX', ttl)
end
return #KEYS
"""


class RedisStore:
    def __init__(self, url: str, *, ttl_s: int = 86400, timeout_s: float = 0.25) -> None:
        self.ttl_s = ttl_s
        self._redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
            health_check_interval=0,
            decode_responses=False,
        )
        self._lookup = self._redis.register_script(_LOOKUP)
        self._own = self._redis.register_script(_OWN)

    @staticmethod
    def _prefix(tenant: str) -> str:
        return f"pp:{{{tenant}}}:"

    async def lookup(self, tenant: str, links: Sequence[bytes], declared: str | None) -> Lookup:
        p = self._prefix(tenant)
        keys = [f"{p}l:{link.hex()}" for link in links]
        try:
            out = await self._lookup(
                keys=keys, args=[len(keys), p + "g:", declared or "", CANDIDATES, SCAN_UP]
            )
        except RedisError as exc:
            raise StoreError(f"redis lookup failed: {type(exc).__name__}") from exc
        depth = int(out[0])
        found = LineageRecord.from_bytes(out[1]) if out[1] else None
        depths = tuple(int(d) for d in out[2::2])
        candidates = tuple(LineageRecord.from_bytes(raw) for raw in out[3::2])
        return Lookup(depth, candidates, found, depths)

    async def blobs(self, tenant: str, refs: Sequence[str]) -> list[bytes | None]:
        p = self._prefix(tenant)
        try:
            values = await self._redis.mget([f"{p}b:{ref}" for ref in refs])
        except RedisError as exc:
            raise StoreError(f"redis blob read failed: {type(exc).__name__}") from exc
        return [v if isinstance(v, bytes) else None for v in values]

    async def record(self, tenant: str, record: LineageRecord, links: Links,
                     blobs: dict[str, bytes], touch: Sequence[str]) -> None:  # fmt: skip
        p, ttl = self._prefix(tenant), self.ttl_s
        pipe = self._redis.pipeline(transaction=False)
        if links:
            await self._own(keys=[f"{p}l:{link.hex()}" for link in links],
                            args=[record.id, ttl, LINKS_PER_KEY], client=pipe)  # fmt: skip
        pipe.set(f"{p}g:{record.id}", record.to_bytes(), ex=ttl)
        for ref, raw in blobs.items():
            pipe.set(f"{p}b:{ref}", raw, ex=ttl, nx=True)
            pipe.expire(f"{p}b:{ref}", ttl)
        for ref in touch:
            pipe.expire(f"{p}b:{ref}", ttl)
        try:
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
