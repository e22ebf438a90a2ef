"""Both store backends against the same contract: memory (clock injected) and a
real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from canonicalize import LineageRecord
from canonicalize.pipeline import LINKS_PER_KEY
from proxy.store import Store
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "memory":
        yield MemoryStore(ttl_s=60)
    else:
        url = request.getfixturevalue("redis_url")
        s = RedisStore(url, ttl_s=60, timeout_s=2)
        yield s
        asyncio.run(_flush(s))


async def _flush(s: RedisStore) -> None:
    await s._redis.flushdb()
    await s.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


L = [bytes([i]) * 16 for i in range(1, 8)]


def test_lookup_finds_deepest_and_candidates(store: Store) -> None:
    async def go() -> None:
        a, b = LineageRecord(id="a", skeleton="s1"), LineageRecord(id="b", skeleton="s2")
        await store.record("t", a, L[:3], {"h1": b"blob"}, [])
        await store.record("t", b, L[2:5], {}, [])
        found = await store.lookup("t", L[:6], None)
        assert found.depth == 5
        assert [c.id for c in found.candidates] == ["b", "a"]
        assert found.depths == (5, 3)
        shallow = await store.lookup("t", L[:2], "a")
        assert (shallow.depth, [c.id for c in shallow.candidates], shallow.declared) == (2, ["a"], a)
        assert (await store.lookup("t", [b"\xff" * 16], None)).depth == 0
        assert await store.blobs("t", ["h1", "missing"]) == [b"blob", None]
        if isinstance(store, RedisStore):
            await store._redis.aclose()

    run(go())


def test_tenants_never_share(store: Store) -> None:
    async def go() -> None:
        await store.record("t1", LineageRecord(id="a"), L[:3], {"h": b"x"}, [])
        assert (await store.lookup("t2", L[:3], "a")) .depth == 0
        assert (await store.lookup("t2", L[:3], "a")).declared is None
        assert await store.blobs("t2", ["h"]) == [None]
        if isinstance(store, RedisStore):
            await store._redis.aclose()

    run(go())


def test_link_owners_are_capped_and_deduped(store: Store) -> None:
    async def go() -> None:
        for i in range(LINKS_PER_KEY + 3):
            await store.record("t", LineageRecord(id=f"x{i}"), L[:1], {}, [])
        await store.record("t", LineageRecord(id="x5"), L[:1], {}, [])
        found = await store.lookup("t", L[:1], None)
        ids = [c.id for c in found.candidates]
        assert ids[0] == "x5" and len(ids) == LINKS_PER_KEY and len(set(ids)) == len(ids)
        if isinstance(store, RedisStore):
            await store._redis.aclose()

    run(go())


def test_memory_ttl_and_bound_with_injected_clock() -> None:
    clock = Clock()
    s = MemoryStore(ttl_s=10, max_entries=5, clock=clock)

    async def go() -> None:
        await s.record("t", LineageRecord(id="a"), L[:2], {"h": b"x"}, [])
        assert len(s) == 4
        clock.now += 9
        await s.record("t", LineageRecord(id="a"), [], {}, ["h"])  # touch keeps the blob alive
        clock.now += 2
        assert (await s.lookup("t", L[:2], None)).depth == 0  # links expired
        assert await s.blobs("t", ["h"]) == [b"x"]
        for i in range(10):
            await s.record("t", LineageRecord(id=f"n{i}"), [], {}, [])
        assert len(s) == 5  # bounded: least recently used went first

    run(go())


def test_memory_bound_in_bytes() -> None:
    s = MemoryStore(max_bytes=10_000)

    async def go() -> None:
        for i in range(20):
            await s.record("t", LineageRecord(id=f"n{i}"), [], {f"b{i}": bytes(1000)}, [])
        held = [b for b in await s.blobs("t", [f"b{i}" for i in range(20)]) if b is not None]
        assert len(held) == 10 and s._bytes == 10_000
        assert await s.blobs("t", ["b19"]) == [bytes(1000)]

    run(go())


def test_redis_keys_expire_and_are_namespaced(redis_url: str) -> None:
    async def go() -> None:
        s = RedisStore(redis_url, ttl_s=30, timeout_s=2)
        await s.record("tenantA", LineageRecord(id="a"), L[:2], {"h": b"x"}, [])
        keys = sorted(k.decode() for k in await s._redis.keys("pp:*"))
        assert all(k.startswith("pp:{tenantA}:") for k in keys) and len(keys) == 4
        for k in keys:
            assert 0 < await s._redis.ttl(k) <= 30
        await s._redis.flushdb()
        await s.close()

    run(go())


def test_redis_down_raises_store_error() -> None:
    from proxy.errors import StoreError
    from tests.infra.procs import free_port

    async def go() -> None:
        s = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
        with pytest.raises(StoreError):
            await s.lookup("t", L[:2], None)
        with pytest.raises(StoreError):
            await s.ping()
        await s.close()

    run(go())
