"""Does the store take writes now?  What ``/readyz`` asks (SPEC section 2g).

A ping is not enough: a demoted master answers PING and refuses every write
(READONLY), and a cluster with one shard down answers on the others.  So one small
key is written, with a short TTL, on the server (or Sentinel's master), or on each
master of a cluster, and a failure names what could not take it: the server, the
Sentinel group's master, or the cluster's slots and their master.
"""

from __future__ import annotations

import asyncio
from itertools import count

from redis.asyncio import Redis, RedisCluster
from redis.crc import key_slot
from redis.exceptions import ReadOnlyError, RedisError

from proxy.errors import StoreError

KEY_TTL_S = 10
SLOTS = 16384


async def check_writes(client: Redis | RedisCluster) -> None:
    """Raise StoreError naming what does not take a write."""
    if isinstance(client, RedisCluster):
        await _cluster(client)
        return
    try:
        await client.set("pp:ready", b"1", ex=KEY_TTL_S)
    except RedisError as exc:
        raise StoreError(f"{_where(client)} {_why(exc)}") from exc


def _where(client: Redis) -> str:
    pool = client.connection_pool
    service = getattr(pool, "service_name", None)  # a Sentinel-managed pool
    if service is not None:
        return f"the master of Sentinel group {service!r}"
    kw = pool.connection_kwargs
    return f"redis at {kw.get('host', kw.get('path'))}:{kw.get('port', '')}".rstrip(":")


def _why(exc: RedisError) -> str:
    if isinstance(exc, ReadOnlyError):
        return "is a read-only replica (READONLY): it takes no writes"
    return f"takes no write: {type(exc).__name__}: {str(exc).split(' : <', 1)[0][:300]}"


async def _cluster(client: RedisCluster) -> None:
    first: RedisError | None = None
    try:
        await client.set("pp:{ready}", b"1", ex=KEY_TTL_S)  # the map of the slots, refreshed if stale
    except RedisError as exc:
        first = exc  # named below, shard by shard
    owners = {slot: nodes[0].name for slot, nodes in client.nodes_manager.slots_cache.items() if nodes}
    if not owners:
        raise StoreError(f"no node of the cluster answers: {type(first).__name__}: {first}") from first
    problems = [f"cluster slots {a}-{b} have no master" for a, b in _gaps(owners)]
    keys: dict[str, str] = {}
    for i in count():
        if len(keys) == len(set(owners.values())) or i > 100_000:
            break
        key = f"pp:{{ready{i}}}"
        name = owners.get(key_slot(key.encode()))
        if name is not None and name not in keys:
            keys[name] = key
    results = await asyncio.gather(
        *(client.set(key, b"1", ex=KEY_TTL_S) for key in keys.values()), return_exceptions=True
    )
    for name, result in zip(keys, results, strict=True):
        if isinstance(result, RedisError):
            problems.append(f"cluster master {name} (slots {_ranges(owners, name)}) {_why(result)}")
        elif isinstance(result, BaseException):
            raise result
    if problems:
        raise StoreError("; ".join(problems))


def _gaps(owners: dict[int, str]) -> list[tuple[int, int]]:
    """The ranges of slots no master serves."""
    out: list[tuple[int, int]] = []
    start = None
    for slot in range(SLOTS + 1):
        if slot < SLOTS and slot not in owners:
            start = slot if start is None else start
        elif start is not None:
            out.append((start, slot - 1))
            start = None
    return out


def _ranges(owners: dict[int, str], name: str) -> str:
    """``name``'s slots as ranges, e.g. ``0-5460``."""
    mine = sorted(s for s, n in owners.items() if n == name)
    parts: list[str] = []
    for slot in mine:
        if parts and int(parts[-1].rsplit("-", 1)[-1]) == slot - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{slot}"
        else:
            parts.append(f"{slot}-{slot}")
    return ",".join(parts)


__all__ = ["check_writes"]
