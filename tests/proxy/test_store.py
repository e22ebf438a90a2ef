"""Both store backends against the same contract: memory (clock injected), a real
redis-server, and a real Redis Cluster (3 masters, 3 replicas).

Lineage ids are made as prefixpin makes them (:func:`lid`): they start with their
conversation's home, which the Redis store keeps in one hash slot."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import xxhash

from canonicalize import LineageRecord
from canonicalize.lineage import LINKS_PER_KEY, MAX_LOOKUP_BLOBS
from proxy.store import DEFAULT_BOUNDS, ISOLATED, Bounds, Store, TenantWide, homed
from proxy.store.memory import ITEM_BYTES, MemoryStore, held
from proxy.store.redis import RedisStore
from tests.infra.redis_topologies import Cluster


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _both(request: pytest.FixtureRequest, bounds: Bounds, **memory: int) -> Iterator[Store]:
    if request.param == "memory":
        yield MemoryStore(ttl_s=60, bounds=bounds, **memory)
    elif request.param == "redis":
        url = request.getfixturevalue("redis_url")
        yield RedisStore(url, ttl_s=60, timeout_s=2, bounds=bounds)
        with redis.Redis.from_url(url) as client:
            client.flushdb()
    else:
        cluster: Cluster = request.getfixturevalue("redis_cluster")
        yield RedisStore(cluster.url, ttl_s=60, timeout_s=2, bounds=bounds, mode="cluster", nodes=tuple(cluster.nodes))
        cluster.flush()


BACKENDS = ["memory", "redis", "cluster"]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    yield from _both(request, DEFAULT_BOUNDS)


SMALL = Bounds(tenant_max_entries=40, tenant_max_bytes=10_000, max_links_per_request=16)


@pytest.fixture(params=BACKENDS)
def bounded(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A store with small per-tenant bounds (SMALL); the memory store's global bounds
    hold two tenants' shares, not one tenant's whole traffic (Redis: no global bound)."""
    yield from _both(request, SMALL, max_entries=100, max_bytes=30_000)


async def _done(store: Store) -> None:
    if isinstance(store, RedisStore):
        await store.close()


async def _settled(store: Store) -> None:
    """The Redis store's reports to the tenants' indexes have landed (they go out
    after record() returns, off the request's path)."""
    if isinstance(store, RedisStore):
        await store.settle()


def lid(name: str, tenant: str = "t", first: bytes | None = None) -> str:
    """A lineage id as prefixpin makes them: 16 hex digits, the first four naming the
    home of the conversation that starts with link ``first``."""
    return homed(xxhash.xxh3_64_hexdigest(name.encode()), tenant, L[0] if first is None else first)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


L = [bytes([i]) * 16 for i in range(1, 8)]


def test_lookup_finds_deepest_and_candidates(store: Store) -> None:
    async def go() -> None:
        a, b = LineageRecord(id=lid("a"), skeleton="s1"), LineageRecord(id=lid("b"), skeleton="s2")
        await store.record("t", a, L[:3], {"h1": b"blob"}, [])
        await store.record("t", b, L[2:5], {}, [])  # a fork of a's conversation: its home
        found = await store.lookup("t", L[:6], None)
        assert found.depth == 5
        assert [c.id for c in found.candidates] == [b.id, a.id]
        assert found.depths == (5, 3)
        shallow = await store.lookup("t", L[:2], a.id)
        assert (shallow.depth, [c.id for c in shallow.candidates], shallow.declared) == (2, [a.id], a)
        assert (await store.lookup("t", [b"\xff" * 16], None)).depth == 0
        assert await store.blobs("t", ["h1", "missing"], a.id) == [b"blob", None]
        await _done(store)

    run(go())


def test_tenants_never_share(store: Store) -> None:
    async def go() -> None:
        a = lid("a", "t1")
        await store.record("t1", LineageRecord(id=a), L[:3], {"h": b"x"}, [])
        assert (await store.lookup("t1", L[:3], a)).depth == 3
        assert (await store.lookup("t2", L[:3], a)).depth == 0
        assert (await store.lookup("t2", L[:3], a)).declared is None
        assert (await store.lookup("t2", L[:3], None, a)).depth == 0
        assert await store.blobs("t2", ["h"], a) == [None]
        await _done(store)

    run(go())


def test_link_owners_are_capped_and_deduped(store: Store) -> None:
    async def go() -> None:
        for i in range(LINKS_PER_KEY + 3):
            await store.record("t", LineageRecord(id=lid(f"x{i}")), L[:1], {}, [])
        await store.record("t", LineageRecord(id=lid("x5")), L[:1], {}, [])
        found = await store.lookup("t", L[:1], None)
        ids = [c.id for c in found.candidates]
        assert ids[0] == lid("x5") and len(ids) == LINKS_PER_KEY and len(set(ids)) == len(ids)
        await _done(store)

    run(go())


def test_response_ids_map_to_their_lineage_tip(store: Store) -> None:
    async def go() -> None:
        a = lid("a")
        assert await store.response("t", "resp_1") is None
        await store.record_response("t", "resp_1", a, L[2])
        await store.record("t", LineageRecord(id=a), L[:3], {}, [])
        assert await store.response("t", "resp_1") == (a, L[2])
        assert await store.response("u", "resp_1") is None  # tenant-namespaced
        # The next request's chain starts at the tip: its conversation is the lineage's.
        found = await store.lookup("t", [L[2], L[6]], None, a)
        assert (found.depth, [c.id for c in found.candidates]) == (1, [a])
        await store.record_response(ISOLATED, "resp_2", a, L[2])
        assert await store.response(ISOLATED, "resp_2") is None
        await store.record_response("t", "x" * 300, a, L[2])  # a client's overlong id: not stored
        assert await store.response("t", "x" * 300) is None
        await _done(store)

    run(go())


def test_response_ids_count_against_the_tenant_bound(bounded: Store) -> None:
    async def go() -> None:
        for i in range(100):
            await store_one(bounded, i)
        await _settled(bounded)
        assert await bounded.response("t", "resp_99") == (lid("a99", first=bytes([99]) * 16), L[0])
        assert await bounded.response("t", "resp_0") is None  # evicted with the tenant's oldest entries
        await _done(bounded)

    async def store_one(s: Store, i: int) -> None:
        a = lid(f"a{i}", first=bytes([i]) * 16)
        await s.record_response("t", f"resp_{i}", a, L[0])
        await s.record("t", LineageRecord(id=a), [bytes([i]) * 16], {}, [])

    run(go())


def test_a_record_carries_its_response_id(store: Store) -> None:
    """The response id written with the record (one write), found as record_response's."""

    async def go() -> None:
        a = lid("a")
        await store.record("t", LineageRecord(id=a), L[:3], {}, [], response=("resp_1", L[2]))
        assert await store.response("t", "resp_1") == (a, L[2])
        await store.record("t", LineageRecord(id=a), L[:3], {}, [], response=("x" * 300, L[2]))
        assert await store.response("t", "x" * 300) is None  # a client's overlong id: not stored
        await store.record(ISOLATED, LineageRecord(id=a), L[:3], {}, [], response=("resp_2", L[2]))
        assert await store.response(ISOLATED, "resp_2") is None
        await _done(store)

    run(go())


def test_response_ids_written_with_their_record_count_against_the_tenant_bound(bounded: Store) -> None:
    async def go() -> None:
        for i in range(100):
            a = lid(f"a{i}", first=bytes([i]) * 16)
            await bounded.record("t", LineageRecord(id=a), [bytes([i]) * 16], {}, [], response=(f"resp_{i}", L[0]))
        await _settled(bounded)
        assert await bounded.response("t", "resp_99") == (lid("a99", first=bytes([99]) * 16), L[0])
        assert await bounded.response("t", "resp_0") is None  # evicted with the tenant's oldest entries
        await _done(bounded)

    run(go())


def test_a_lineage_recorded_from_another_origin_is_found_there(store: Store) -> None:
    """A conversation resumed with another first message continues a lineage homed at the
    first one's: its record names its own origin, and its next lookup (from there) finds
    the lineage, its blobs still read by the lineage's id."""

    async def go() -> None:
        a = lid("a")  # homed at L[0]
        resumed = [b"\xee" * 16, *L[1:4]]  # another first link: another home on Redis
        await store.record("t", LineageRecord(id=a, skeleton="s"), L[:3], {"h1": b"blob"}, [])
        await store.record("t", LineageRecord(id=a, skeleton="s2"), resumed, {}, ["h1"], origin=resumed[0])
        found = await store.lookup("t", [*resumed, L[5]], None)
        assert (found.depth, [(c.id, c.skeleton) for c in found.candidates]) == (4, [(a, "s2")])
        assert (await store.lookup("t", L[:3], a)).declared == LineageRecord(id=a, skeleton="s2")
        assert await store.blobs("t", ["h1"], a) == [b"blob"]
        await _done(store)

    run(go())


def test_a_lookup_returns_the_blobs_a_fork_or_learning_reads_next(store: Store) -> None:
    """With the request's skeleton and tools[] ref as sent: the recorded system part and
    tools[] of the lineages found that are forks or differ from them, at most
    MAX_LOOKUP_BLOBS; none when they are the request's own."""

    async def go() -> None:
        a = LineageRecord(id=lid("a"), skeleton="sk", system_ref="sa", tools_ref="ta")
        b = LineageRecord(id=lid("b"), kind="fork", skeleton="sk", system_ref="sb", tools_ref="ta")
        blobs = {"sa": b"system a", "ta": b"tools a", "sb": b"system b"}
        await store.record("t", a, L[:3], blobs, [])
        assert (await store.lookup("t", L[:4], None, sent=("sk", "ta"))).blobs == {}
        assert (await store.lookup("t", L[:4], None)).blobs == {}  # not asked
        found = await store.lookup("t", L[:4], None, sent=("sk", "tx"))  # tools[] differ: a fork of it
        assert found.blobs == {"sa": b"system a", "ta": b"tools a"}
        assert (await store.lookup("t", L[:4], None, sent=("other", "ta"))).blobs == found.blobs
        await store.record("t", b, L[2:4], {}, ["ta"])  # a fork's later turn: its parent's blobs
        found = await store.lookup("t", L[:5], None, sent=("sk", "ta"))
        assert [c.id for c in found.candidates] == [b.id, a.id] and found.blobs == {"sb": b"system b", "ta": b"tools a"}
        c = LineageRecord(id=lid("c"), kind="fork", system_ref="sc", tools_ref="tc")
        await store.record("t", c, L[2:4], {"sc": b"c", "tc": b"c"}, [])
        assert len((await store.lookup("t", L[:5], None, sent=("x", "y"))).blobs) == MAX_LOOKUP_BLOBS
        declared = await store.lookup("t", [b"\xee" * 16], a.id, a.id, sent=("sk", "tx"))  # nothing but the declared
        assert (
            declared.depth == 0 and declared.declared == a and declared.blobs == {"sa": b"system a", "ta": b"tools a"}
        )
        await _done(store)

    run(go())


def test_tenant_wide_marks_and_evidence(store: Store) -> None:
    """What learning keeps for all of a tenant's conversations: the lineages that marked
    a link (newest first, deduped, at most LINKS_PER_KEY) with their first message's ref,
    and evidence blobs whose first bytes are kept; another tenant sees none of it."""

    async def go() -> None:
        for i in range(LINKS_PER_KEY + 2):
            chain = _chain(40 + i, 2)
            rec = LineageRecord(id=lid(f"m{i}", first=chain[0]))
            wide = TenantWide((L[5], L[6]) if i < 2 else (L[5],), f"h:{i}", {"ev1:p": f"{i}".encode()})
            await store.record("t", rec, chain, {}, [], wide=wide)
        again = LineageRecord(id=lid("m3", first=_chain(43, 2)[0]))
        await store.record("t", again, _chain(43, 2), {}, [], wide=TenantWide((L[5],), "h:3"))
        marked, found = await store.tenant_wide("t", [L[5], L[6], L[4]], ["ev1:p", "ev2:p"])
        assert marked[0][0] == (again.id, "h:3") and len(marked[0]) == LINKS_PER_KEY
        assert len({m[0] for m in marked[0]}) == LINKS_PER_KEY
        assert marked[1] == ((lid("m1", first=_chain(41, 2)[0]), "h:1"), (lid("m0", first=_chain(40, 2)[0]), "h:0"))
        assert marked[2] == ()
        assert found == [b"0", None]  # the first writer's bytes
        await store.record("t", again, [], {}, [], wide=TenantWide((L[4],), None, {"ev2:p": b"1"}))
        marked, found = await store.tenant_wide("t", [L[4]], ["ev1:p", "ev2:p"])
        assert marked == [()] and found == [b"0", b"1"]  # no first message: nothing marked
        assert await store.tenant_wide("u", [L[5]], ["ev1:p"]) == ([()], [None])
        assert await store.tenant_wide(ISOLATED, [L[5]], ["ev1:p"]) == ([()], [None])
        await _done(store)

    run(go())


def test_tenant_wide_fields_are_bounded(bounded: Store) -> None:
    """The tenant-wide fields count against the tenant (memory: its entries; Redis: at
    most tenant_max_entries of them, the oldest dropped first)."""

    async def go() -> None:
        rec = LineageRecord(id=lid("a"))
        for i in range(200):
            wide = TenantWide((bytes([i]) * 16,), "h:a", {f"ev1:{i}": b"x"})
            await bounded.record("t", rec, [], {}, [], wide=wide)
        marked, found = await bounded.tenant_wide(
            "t", [bytes([i]) * 16 for i in range(200)], [f"ev1:{i}" for i in range(200)]
        )
        held = sum(bool(m) for m in marked) + sum(f is not None for f in found)
        assert 0 < held <= SMALL.tenant_max_entries
        assert marked[-1] and found[-1] == b"x" and not marked[0] and found[0] is None
        await _done(bounded)

    run(go())


def test_tenant_wide_entries_are_shared_by_every_process(redis_url: str) -> None:
    """Two prefixpin processes on one Redis: what one leaves, the other reads."""

    async def go() -> None:
        one, two = RedisStore(redis_url, ttl_s=30, timeout_s=2), RedisStore(redis_url, ttl_s=30, timeout_s=2)
        a = LineageRecord(id=lid("a"))
        await one.record("t", a, L[:2], {}, [], wide=TenantWide((L[5],), "h:a", {"ev1:p": b"c1"}))
        await two.record("t", a, L[:2], {}, [], wide=TenantWide((), None, {"ev1:p": b"c2"}))
        assert await two.tenant_wide("t", [L[5]], ["ev1:p"]) == ([((a.id, "h:a"),)], [b"c1"])
        await one._redis.flushdb()
        await one.close()
        await two.close()

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


def test_memory_bound_counts_what_a_record_holds() -> None:
    """A record's pins and params grow with its request (a system prompt of many dated
    lines): they count in max_bytes and tenant_max_bytes as blobs do, so lineage
    records alone cannot hold more than the bound; what each is charged goes with it."""
    pins = {f"clock:{i:016x}": "2026-12-02 13:07" for i in range(500)}  # ~500 * (16 + 128) bytes
    one = held(LineageRecord(id="x", pins=pins))
    assert one == sum(len(v) + 2 * ITEM_BYTES for v in pins.values())
    s = MemoryStore(max_bytes=one * 10, bounds=Bounds(tenant_max_entries=1000, tenant_max_bytes=one * 5))

    async def go() -> None:
        for i in range(20):
            await s.record("a", LineageRecord(id=f"a{i}", pins=pins), [], {}, [])
        assert len(s) == 5 and s._bytes == 5 * one  # the tenant's share: its oldest records went
        for i in range(20):
            await s.record("b", LineageRecord(id=f"b{i}", pins=pins), [], {}, [])
        assert len(s) == 10 and s._bytes == 10 * one  # and the store's
        await s.record("b", LineageRecord(id="b19", params={"reasoning_effort": '"high"'}), [], {}, [])
        assert s._bytes == 9 * one + held(LineageRecord(id="b19", params={"reasoning_effort": '"high"'}))
        assert s._bytes == sum(size for _, _, size in s._data.values())
        assert all(size == held(value) for _, value, size in s._data.values())
        assert held(LineageRecord(id="e")) == 0 and held(("a0", b"tip")) == 0

    run(go())


def test_memory_replacing_a_value_keeps_its_accounting_and_use_order() -> None:
    s = MemoryStore(max_entries=4, max_bytes=10_000)

    async def go() -> None:
        await s.record("t", LineageRecord(id="a"), [], {"b1": bytes(1000), "b2": bytes(1000)}, [])
        await s.record("t", LineageRecord(id="a"), [], {"b1": bytes(3000)}, [])  # in place, and grown
        assert s._bytes == 4000 and s._shares["t"].bytes == 4000
        await s.record("t", LineageRecord(id="a"), [], {"b1": bytes(500)}, [])  # shrunk
        assert s._bytes == 1500 and s._shares["t"].bytes == 1500
        await s.record("t", LineageRecord(id="a"), [], {}, ["b2"])  # b2 is now the most recently used
        await s.record("t", LineageRecord(id="n1"), [], {}, [])
        await s.record("t", LineageRecord(id="n2"), [], {}, [])  # five entries: the oldest goes
        assert await s.blobs("t", ["b1", "b2"]) == [None, bytes(1000)]
        assert s._bytes == 1000 and len(s) == 4
        assert list(s._data) == list(s._shares["t"].keys)  # one use order, store-wide and per tenant

    run(go())


def test_redis_keys_expire_and_are_namespaced(redis_url: str) -> None:
    async def go() -> None:
        s = RedisStore(redis_url, ttl_s=30, timeout_s=2)
        await s.record("tenantA", LineageRecord(id=lid("a", "tenantA")), L[:2], {"h": b"x"}, [])
        await s.settle()
        keys = sorted(k.decode() for k in await s._redis.keys("pp:*"))
        # The conversation's home (2 links, the record, 1 blob), the tenant's index and counts.
        assert len(keys) == 3 and all(":tenantA:" in k for k in keys), keys
        home = next(k for k in keys if k.endswith(":h"))
        assert int(await s._redis.hget(home, "#")) == 4
        for k in keys:
            assert 0 < await s._redis.ttl(k) <= 30
        await s._redis.flushdb()
        await s.close()

    run(go())


def test_one_conversation_is_one_slot_and_a_tenant_spreads(redis_url: str) -> None:
    """A conversation's keys (its forks' too) share a hash tag; a tenant's many
    conversations do not."""
    from redis.crc import key_slot

    async def go() -> None:
        s = RedisStore(redis_url, ttl_s=30, timeout_s=2)
        for i in range(40):
            chain = _chain(300 + i, 3)
            await s.record("A", LineageRecord(id=lid(f"r{i}", "A", chain[0])), chain, {"h": b"x"}, [])
            await s.record("A", LineageRecord(id=lid(f"f{i}", "A", chain[0])), chain[1:], {}, [])  # a fork
        homes = [k for k in await s._redis.keys("pp:*:A:h")]
        assert len(homes) == 40  # one key per conversation, its fork's records and links in it
        assert len({key_slot(k) for k in homes}) > 30
        await s._redis.flushdb()
        await s.close()

    run(go())


def test_redis_down_raises_store_error() -> None:
    from proxy.errors import StoreError
    from tests.infra.procs import closed_port

    async def go(port: int) -> None:
        s = RedisStore(f"redis://127.0.0.1:{port}/0", timeout_s=0.2)
        with pytest.raises(StoreError):
            await s.lookup("t", L[:2], None)
        with pytest.raises(StoreError):
            await s.ping()
        await s.close()

    with closed_port() as port:
        run(go(port))


# -- per-tenant bounds (#16: a noisy neighbour) -------------------------------------


def _chain(tag: int, n: int) -> list[bytes]:
    return [tag.to_bytes(2, "big") + i.to_bytes(14, "big") for i in range(n)]


def test_heavy_tenant_never_evicts_another(bounded: Store) -> None:
    async def go() -> None:
        victim = _chain(1, 3)
        a = lid("a", "A", victim[0])
        await bounded.record("A", LineageRecord(id=a, system_ref="sa"), victim, {"sa": b"s" * 4000}, [])
        # Tenant B: far more entries and blob bytes than its share, in many conversations.
        ids = [lid(f"b{i}", "B", _chain(100 + i, 1)[0]) for i in range(60)]
        for i in range(60):
            await bounded.record("B", LineageRecord(id=ids[i]), _chain(100 + i, 5), {f"bb{i}": bytes(3000)}, [])
        await _settled(bounded)
        found = await bounded.lookup("A", [*victim, b"\xee" * 16], None)
        assert (found.depth, [c.id for c in found.candidates]) == (3, [a])
        assert await bounded.blobs("A", ["sa"], a) == [b"s" * 4000]
        # B lost its own oldest entries, kept its newest, and holds no more than its bounds.
        assert (await bounded.lookup("B", _chain(100, 5), None)).depth == 0
        newest = await bounded.lookup("B", _chain(159, 5), None)
        assert (newest.depth, newest.candidates[0].id) == (5, ids[59])
        held = [i for i in range(60) if (await bounded.blobs("B", [f"bb{i}"], ids[i]))[0] is not None]
        assert 0 < len(held) * 3000 <= SMALL.tenant_max_bytes and 59 in held
        await _done(bounded)

    run(go())


def test_tenant_bound_counts_entries(bounded: Store) -> None:
    async def go() -> None:
        await bounded.record("A", LineageRecord(id=lid("a", "A", _chain(1, 1)[0])), _chain(1, 2), {}, [])
        for i in range(200):  # 200 lineages of 1 link + 1 record: 400 entries, B's share is 40
            chain = _chain(100 + i, 1)
            await bounded.record("B", LineageRecord(id=lid(f"b{i}", "B", chain[0])), chain, {}, [])
        await _settled(bounded)
        assert (await bounded.lookup("A", _chain(1, 2), None)).depth == 2
        alive = [i for i in range(200) if (await bounded.lookup("B", _chain(100 + i, 1), None)).depth]
        assert alive == list(range(200 - len(alive), 200)) and 10 <= len(alive) <= 20, alive
        if isinstance(bounded, RedisStore):  # what B's conversations hold, wherever they are
            held = await _entries(bounded, "B")
            assert held <= SMALL.tenant_max_entries
        await _done(bounded)

    run(go())


async def _entries(s: RedisStore, tenant: str) -> int:
    """The entries a tenant's homes hold, summed over every node."""
    from redis.asyncio import RedisCluster

    client = s._redis
    total = 0
    if isinstance(client, RedisCluster):
        keys = [k for node in client.get_primaries() for k in await node.execute_command("KEYS", f"pp:*:{tenant}:h")]
    else:
        keys = await client.keys(f"pp:*:{tenant}:h")
    for k in keys:
        total += int(await client.hget(k, "#") or 0)
    return total


def test_a_request_records_only_its_newest_links(bounded: Store) -> None:
    async def go() -> None:
        links = _chain(7, 100)
        long = lid("long", "A", links[0])
        await bounded.record("A", LineageRecord(id=long), links, {}, [])
        nxt = await bounded.lookup("A", [*links, b"\xee" * 16], None)
        assert (nxt.depth, [c.id for c in nxt.candidates]) == (100, [long])
        assert (await bounded.lookup("A", links[:50], None)).depth == 0  # older links were not recorded
        # A lookup walks the newest links only: 20 new messages at once (> 16) start anew.
        assert (await bounded.lookup("A", [*links, *_chain(8, 20)], None)).depth == 0
        await _done(bounded)

    run(go())


def test_a_long_conversation_keeps_continuing(bounded: Store) -> None:
    async def go() -> None:
        """Turn after turn (3 messages each) well past max_links_per_request and the
        tenant's entry bound, each turn records from the deepest link it found on, as
        canonicalize.finalize does, and the next turn finds it."""
        history = _chain(9, 1)
        c = lid("c", "A", history[0])
        await bounded.record("A", LineageRecord(id=c), history, {}, [])
        for turn in range(60):
            history = history + _chain(10 + turn, 3)
            found = await bounded.lookup("A", history, None)
            assert (found.depth, found.candidates[0].id) == (len(history) - 3, c), turn
            await bounded.record("A", LineageRecord(id=c), history[found.depth - 1 :], {}, [])
        if isinstance(bounded, RedisStore):
            await bounded.settle()
            assert await _entries(bounded, "A") <= SMALL.tenant_max_entries
        await _done(bounded)

    run(go())


def test_the_isolated_tenant_owns_nothing(store: Store) -> None:
    async def go() -> None:
        a = lid("a", ISOLATED)
        await store.record(ISOLATED, LineageRecord(id=a), L[:3], {"h": b"x"}, [])
        assert (await store.lookup(ISOLATED, L[:3], a)) == (await store.lookup("other", L[:3], a))
        assert (await store.lookup(ISOLATED, L[:3], a)).depth == 0
        assert await store.blobs(ISOLATED, ["h"], a) == [None]
        if isinstance(store, RedisStore):
            assert await _entries(store, ISOLATED) == 0
        else:
            assert len(store) == 0
        await _done(store)

    run(go())


def test_redis_a_conversation_expires_whole(redis_url: str) -> None:
    """Redis runs the TTL (its clock cannot be injected): ``ttl_s`` after its last
    write a conversation's home is gone, and a new one starts again."""
    from tests.infra.wait import wait_until_async

    async def go() -> None:
        s = RedisStore(redis_url, ttl_s=1, timeout_s=2, bounds=SMALL)
        a = lid("a", "A")
        await s.record("A", LineageRecord(id=a), L[:3], {"h": bytes(500)}, [])
        assert (await s.lookup("A", L[:4], None)).depth == 3

        async def gone() -> bool:
            return (await s.lookup("A", L[:4], None)).depth == 0

        await wait_until_async(gone, timeout=5, message="the home expired")
        assert await s.blobs("A", ["h"], a) == [None]
        await s.record("A", LineageRecord(id=a), L[:3], {"h": bytes(500)}, [])
        assert (await s.lookup("A", L[:4], None)).depth == 3
        await s._redis.flushdb()
        await s.close()

    run(go())


class _FirstMemoryStore(MemoryStore):
    """record() and _touch() as first written: ``_get`` then ``_set`` for each key."""

    def _touch(self, key: Any, now: float) -> bool:
        value = self._get(key, now)
        if value is not None:
            self._set(key, value, now)
        return value is not None

    async def record(self, tenant: str, record: LineageRecord, links: Any, blobs: Any, touch: Any) -> list[str]:
        from proxy.store import newest

        if tenant == ISOLATED:
            return []
        now = self.clock()
        for link in links[newest(links, self.bounds) :]:
            key = (tenant, "l", link)
            owners = self._get(key, now) or ()
            if not owners or owners[0] != record.id:
                owners = (record.id, *(o for o in owners if o != record.id))[:LINKS_PER_KEY]
            self._set(key, owners, now)
        self._set((tenant, "g", record.id), record, now)
        for ref, raw in blobs.items():
            self._set((tenant, "b", ref), raw, now)
        return [ref for ref in touch if not self._touch((tenant, "b", ref), now)]


def test_memory_record_and_touch_leave_the_state_the_first_writing_left() -> None:
    """Random records, touches, lookups and expiry under tight bounds: the same values,
    expiries, use order and accounting, store-wide and per tenant."""
    import random

    rnd = random.Random(3)
    clock = Clock()
    bounds = Bounds(tenant_max_entries=12, tenant_max_bytes=300, max_links_per_request=6)
    new, old = (
        cls(ttl_s=30, max_entries=20, max_bytes=500, bounds=bounds, clock=clock)
        for cls in (MemoryStore, _FirstMemoryStore)
    )
    for _ in range(400):
        clock.now += rnd.choice([0, 1, 5, 31])
        tenant = rnd.choice(["a", "b"])
        links = [bytes([rnd.randrange(6)]) * 16 for _ in range(rnd.randint(0, 8))]
        rec = LineageRecord(id=f"L{rnd.randrange(5)}")
        blobs = {f"r{rnd.randrange(4)}": b"x" * rnd.randrange(1, 80) for _ in range(rnd.randint(0, 2))}
        touch = [f"r{rnd.randrange(4)}" for _ in range(rnd.randint(0, 2))]
        look = rnd.random() < 0.3
        for s in (new, old):
            asyncio.run(s.record(tenant, rec, links, dict(blobs), list(touch)))
            if look:
                asyncio.run(s.lookup(tenant, links, None))
        assert list(new._data.items()) == list(old._data.items())
        assert {t: list(s.keys) for t, s in new._shares.items()} == {t: list(s.keys) for t, s in old._shares.items()}
        assert (new._bytes, {t: s.bytes for t, s in new._shares.items()}) == (
            old._bytes,
            {t: s.bytes for t, s in old._shares.items()},
        )


def test_memory_lookup_uses_the_deepest_link_and_one_per_lineage() -> None:
    """A lookup makes most recently used the deepest recorded link and each link naming
    a lineage not named deeper, not every link it walks past (a long conversation would
    move dozens of keys on every turn)."""
    s = MemoryStore(ttl_s=60)
    a = [bytes([i]) * 16 for i in range(1, 6)]
    b = [*a[:2], b"\x09" * 16]  # another session sharing the first two links

    async def go() -> None:
        await s.record("t", LineageRecord(id="B"), b, {}, [])
        await s.record("t", LineageRecord(id="A"), a, {}, [])
        await s.record("u", LineageRecord(id="U"), a[:1], {}, [])
        found = await s.lookup("t", a, None)
        assert found.depth == 5 and [r.id for r in found.candidates] == ["A", "B"]

    run(go())
    link = [("t", "l", x) for x in a]
    # Walked from a[4] up: a[4] names A, a[1] names B too; a[3], a[2] and a[0] name
    # nothing new and keep their places (b's own link was not walked at all).
    assert [k for k in s._data if k[0] == "t"] == [
        ("t", "l", b[2]),
        link[0],
        link[2],
        link[3],
        link[4],
        ("t", "g", "A"),
        link[1],
        ("t", "g", "B"),
    ]
    assert [k for k in s._data if k[0] == "t"] == list(s._shares["t"].keys)


def test_store_failures_are_warned_once_per_kind_per_10_s(caplog: pytest.LogCaptureFixture) -> None:
    """A store down costs a WARNING per kind of failure every 10 s, not one per request."""
    import logging

    from proxy.errors import StoreError
    from proxy.store.guard import StoreGuard

    clock = Clock()
    guard = StoreGuard(cooldown_s=0, clock=clock)

    async def refused() -> None:
        raise StoreError("redis lookup failed: ConnectionError: refused") from ConnectionRefusedError()

    async def readonly() -> None:
        raise StoreError("redis write failed: ReadOnlyError: READONLY") from redis.exceptions.ReadOnlyError()

    async def go() -> None:
        for _ in range(5):
            for fn in (refused, readonly):
                with pytest.raises(StoreError):
                    await guard.call(fn)
            clock.now += 1
        clock.now += 6
        with pytest.raises(StoreError):
            await guard.call(refused)

    with caplog.at_level(logging.WARNING, logger="prefixpin"):
        run(go())
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 3, lines  # each kind once, then the first again 10 s later
    assert "ConnectionRefusedError" in lines[0] and "ReadOnlyError" in lines[1] and "READONLY" in lines[1]


class _Counted(MemoryStore):
    """The memory store, counting its lookups' walks."""

    walks = 0

    def _walk(self, tenant: str, links: Any, depth: int, lo: int, now: float) -> Any:
        self.walks += 1
        return super()._walk(tenant, links, depth, lo, now)


class WalkingStore(_Counted):
    """The memory store without the alone lineages' answer: every lookup walks (the
    reference the embedded store is held to, here and in tests/agents)."""

    def _owners(self, tenant: str, links: Any, depth: int, lo: int, now: float) -> Any:
        return self._walk(tenant, links, depth, lo, now)


Written = tuple[str, LineageRecord, list[bytes], "bytes | str | None"]  # tenant, record, links, origin


def _links(messages: list[str]) -> list[bytes]:
    out, prev = [], b""
    for m in messages:
        prev = xxhash.xxh3_128_digest(prev + m.encode())
        out.append(prev)
    return out


@pytest.mark.parametrize("origin", ["first link", "a previous response's lineage"])
def test_an_alone_lineage_that_lost_its_first_links_walks_once_another_records_them(origin: str) -> None:
    """A conversation's early links evicted (recorded once, the least recently used)
    leave it alone: nothing else names its links.  Another conversation that opens as
    it did and records those links anew names them; the first then walks, and finds
    both, as the store that always walks does."""
    bounds = Bounds(tenant_max_entries=12, tenant_max_bytes=10**6, max_links_per_request=64)
    clock = Clock()
    fast, slow = _Counted(bounds=bounds, clock=clock), WalkingStore(bounds=bounds, clock=clock)
    a = _links([f"a{i}" for i in range(8)])
    other = _links([f"x{i}" for i in range(8)])
    b = _links(["a0", "a1", "b2"])  # opens as a did

    async def go() -> None:
        for s in (fast, slow):
            await s.record("t", LineageRecord(id="A", requests=1), a, {}, [], origin=a[0])
            await s.lookup("t", a, None)  # a's deepest link: used; its first ones are not
            await s.record("t", LineageRecord(id="X", requests=1), other[:4], {}, [], origin=other[0])
        assert ("t", "l", a[0]) not in fast._data and ("t", "l", a[7]) in fast._data  # a's first links went
        assert "A" in fast._alone["t"]  # and a is alone all the same
        first = await fast.lookup("t", a, None)
        assert [c.id for c in first.candidates] == ["A"] and fast.walks == 0
        said = a[0] if origin == "first link" else "A0"
        for s in (fast, slow):
            assert (await s.lookup("t", b, None)).depth == 0  # none of b's links is held: a root
            await s.record("t", LineageRecord(id="B", requests=1), b, {}, [], origin=said)
        assert "A" not in fast._alone.get("t", {})
        found, walked = [await s.lookup("t", a, None) for s in (fast, slow)]
        assert [c.id for c in found.candidates] == [c.id for c in walked.candidates] == ["A", "B"]
        assert fast.walks == 1

    run(go())
    assert list(fast._data.items()) == list(slow._data.items())


@pytest.mark.parametrize("origin", ["first link", "a previous response's lineage"])
def test_a_fork_recorded_after_its_branch_link_went_makes_its_parent_walk(origin: str) -> None:
    """A fork looked up (its parent's link at the branch used), its parent going on,
    the branch link evicted before the fork's record writes it again as the fork's:
    a link of the parent's history names the fork now, and the parent's next lookup
    walks and finds both, as the walking store's does.  (A record whose origin is a
    lineage, not a first link, makes every lineage of its tenant walk.)"""
    bounds = Bounds(tenant_max_entries=10, tenant_max_bytes=10**6, max_links_per_request=64)
    clock = Clock()
    fast, slow = _Counted(bounds=bounds, clock=clock), WalkingStore(bounds=bounds, clock=clock)
    a = _links([f"a{i}" for i in range(6)])
    f = _links([*(f"a{i}" for i in range(4)), "f4"])  # a fork of a's first four messages
    other = _links([f"x{i}" for i in range(6)])  # with its record, pushes out a0 to a3

    async def go() -> None:
        for s in (fast, slow):
            await s.record("t", LineageRecord(id="A", requests=1), a[:4], {}, [], origin=a[0])
            assert [c.id for c in (await s.lookup("t", f, None)).candidates] == ["A"]  # the fork's lookup
            await s.record("t", LineageRecord(id="A", requests=2), a[3:], {}, [], origin=a[0])  # a goes on
            await s.record("t", LineageRecord(id="X", requests=1), other, {}, [], origin=other[0])
            assert ("t", "l", a[3]) not in s._data and ("t", "l", a[5]) in s._data  # the branch link went
            await s.lookup("t", a, None)  # (a's deepest link and record used: the fork's record leaves them)
            fork = LineageRecord(id="F", kind="fork", parent="A", requests=1)
            said = f[0] if origin == "first link" else "A"
            await s.record("t", fork, f[3:], {}, [], origin=said)  # from the branch link, written anew
        found, walked = [await s.lookup("t", a, None) for s in (fast, slow)]
        assert [c.id for c in found.candidates] == [c.id for c in walked.candidates] == ["A", "F"]

    run(go())
    assert list(fast._data.items()) == list(slow._data.items())


@pytest.mark.parametrize("seed", range(10))
def test_memory_lookups_of_alone_lineages_answer_as_the_walk_does(seed: int) -> None:
    """Random traffic (new conversations, some opening alike; turns appended, a burst
    past max_links_per_request; rewinds; forks; the clock moving on, past the TTL at
    times) through two memory stores under small bounds, classified as the pipeline
    does (no link found: a root; else the first candidate's continuation, or a fork):
    the store that answers an alone lineage's lookup without walking gives every
    lookup the same answer as the one that always walks, and holds the same entries
    in the same use order after every request."""
    rnd = random.Random(seed)
    clock = Clock()
    bounds = Bounds(tenant_max_entries=120, tenant_max_bytes=10_000, max_links_per_request=16)
    fast = _Counted(ttl_s=300, max_entries=200, bounds=bounds, clock=clock)
    slow = WalkingStore(ttl_s=300, max_entries=200, bounds=bounds, clock=clock)
    convs: list[tuple[str, list[str]]] = []
    fresh = iter(range(10**9))

    def said() -> str:
        return f"m{next(fresh)}"

    async def look(tenant: str, messages: list[str]) -> Written:
        """The request's lookup in both (the same answers), and what it will record."""
        links = _links(messages)
        lk, walked = [await s.lookup(tenant, links, None) for s in (fast, slow)]
        assert (lk.depth, [c.id for c in lk.candidates], lk.depths) == (
            walked.depth,
            [c.id for c in walked.candidates],
            walked.depths,
        )
        new_id = f"L{next(fresh)}"
        if not lk.depth or not lk.candidates:
            record, start = LineageRecord(id=new_id, requests=1), 0
        elif rnd.random() < 0.15:
            parent = lk.candidates[0]
            fork = LineageRecord(id=new_id, kind="fork", parent=parent.id, requests=1)
            record, start = fork, lk.depth - rnd.randint(0, 1)  # from the branch point, or the link before
        else:
            parent = lk.candidates[0]
            record, start = parent.evolve(requests=parent.requests + 1), lk.depth - 1
        messages.append(said())  # the reply
        full = _links(messages)
        # Its origin: its first link; now and then a previous response's lineage, or none said.
        origin: bytes | str | None = full[0] if rnd.random() < 0.97 else rnd.choice(("L0", None))
        return tenant, record, full[start:], origin

    async def write(w: Written) -> None:
        tenant, record, written, origin = w
        for s in (fast, slow):
            await s.record(tenant, record, written, {}, [], origin=origin)
        assert list(fast._data.items()) == list(slow._data.items())
        assert {t: list(share.keys) for t, share in fast._shares.items()} == {
            t: list(share.keys) for t, share in slow._shares.items()
        }
        # The note of alone lineages is bounded by the lineage records held: each goes with
        # its own; and each is found by its origin.
        alone = {(t, i) for t, notes in fast._alone.items() for i in notes}
        assert {(t, i) for t, kind, i in fast._data if kind == "g"} >= alone
        assert {(t, i) for t, by in fast._origins.items() for i in by.values()} == alone
        assert all(fast._origins[t][o] == i for t, notes in fast._alone.items() for i, (_, o) in notes.items())

    async def go() -> None:
        held: Written | None = None  # a request looked up, recorded after the next one
        for _ in range(600):
            step = rnd.random()
            if step < 0.15 or not convs:  # a new conversation, at times opening as another of its tenant's
                tenant = rnd.choice(("t", "u"))
                same = [m for t, m in convs if t == tenant]
                opening = rnd.choice(same)[: rnd.randint(1, 3)] if same and rnd.random() < 0.3 else []
                convs.append((tenant, [*opening, *(said() for _ in range(rnd.randint(1, 12)))]))
                tenant, messages = convs[-1]
            elif step < 0.65:  # its next turn; at times more messages than a record keeps links of
                tenant, messages = rnd.choice(convs)
                messages += [said() for _ in range(20 if rnd.random() < 0.02 else rnd.randint(1, 2))]
            elif step < 0.75:  # a rewind
                tenant, messages = rnd.choice(convs)
                del messages[rnd.randint(1, len(messages)) :]
                messages.append(said())
            elif step < 0.85:  # a side conversation from a point of another
                tenant, messages = rnd.choice(convs)
                convs.append((tenant, [*messages[: rnd.randint(1, len(messages))], said()]))
                tenant, messages = convs[-1]
            else:
                clock.now += rnd.choice((1, 5, 150, 320))
                continue
            w = await look(tenant, messages)
            if held is None and rnd.random() < 0.2:
                held = w  # in flight while the next request comes and goes (its links may go meanwhile)
                continue
            await write(w)
            if held is not None:
                await write(held)
                held = None
        if held is not None:
            await write(held)

    run(go())
    assert fast._alone  # (some were alone at the end, some had stopped being)
    run(fast.close())
    assert not fast._alone and not fast._origins
    assert fast.walks < slow.walks * 0.7  # most lookups were an alone lineage's
    assert fast.walks > 0


def test_reports_to_the_tenants_index_in_flight_are_bounded(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each record may send a report to its tenant's index after it returns; while Redis
    is slower than the writes they would pile up, so past ``MAX_REPORTS`` in flight one
    is dropped (the home's next report retells what it holds)."""
    from proxy.store import redis as redis_store

    monkeypatch.setattr(redis_store, "MAX_REPORTS", 2)

    async def go() -> None:
        store = RedisStore(redis_url, ttl_s=60, timeout_s=2)
        most = 0
        for n in range(20):  # each a new conversation: each reports
            history = _chain(100 + n, 3)
            await store.record("T", LineageRecord(id=lid(f"c{n}", "T", history[0])), history, {}, [])
            most = max(most, len(store._pending))
        assert 0 < most <= 2
        await store.settle()
        found = await store.lookup("T", _chain(119, 3), None)
        assert found.depth == 3  # the records themselves are all there
        await store.close()

    run(go())
    with redis.Redis.from_url(redis_url) as client:
        client.flushdb()
