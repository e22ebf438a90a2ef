"""Replica policies: pure functions of the key and the replicas' health and load."""

from __future__ import annotations

from collections import Counter

from proxy.config import Affinity
from proxy.upstream.policy import NO_ROUTE, Lineage, Replica, RoundRobin, Route, make_policy


def _up(
    n: int,
    loads: dict[int, int] | None = None,
    down: frozenset[int] = frozenset(),
    lineages: dict[int, int] | None = None,
) -> list[Replica]:
    return [Replica(i, i not in down, (loads or {}).get(i, 0), (lineages or {}).get(i, 0)) for i in range(n)]


def _key(key: str, home: int | None = None) -> Route:
    return Route(key, home)


KEYS = [f"lineage-{i}" for i in range(300)]


def test_lineage_is_deterministic_across_processes_and_spreads() -> None:
    a, b = Lineage(3, 1.25), Lineage(3, 1.25)
    picks = [a.choose(_key(k), _up(3)) for k in KEYS]
    assert picks == [b.choose(_key(k), _up(3)) for k in KEYS]
    assert min(Counter(picks).values()) > 50


def test_a_down_replica_moves_only_its_own_lineages() -> None:
    p = Lineage(3, 1.25)
    before = {k: p.choose(_key(k), _up(3)) for k in KEYS}
    after = {k: p.choose(_key(k), _up(3, down=frozenset({1}))) for k in KEYS}
    assert all(after[k] != 1 for k in KEYS)
    assert all(after[k] == before[k] for k in KEYS if before[k] != 1)


def test_bounded_load_skips_a_replica_over_the_cap() -> None:
    p = Lineage(3, 1.25)
    key = KEYS[0]
    home = p.choose(_key(key), _up(3))
    # home holds 2 of 2 in flight: cap = ceil(1.25 * 3 / 3) = 2, a third would pass it
    assert p.choose(_key(key), _up(3, {home: 2})) == p.order(key)[1]
    # one each: cap = ceil(1.25 * 4 / 3) = 2, home stays
    assert p.choose(_key(key), _up(3, dict.fromkeys(range(3), 1))) == home


def test_no_key_and_round_robin_cycle_healthy_replicas() -> None:
    rr = RoundRobin()
    assert [rr.choose(NO_ROUTE, _up(3, down=frozenset({1}))) for _ in range(4)] == [0, 2, 0, 2]
    p = Lineage(2, 1.25)
    assert {p.choose(NO_ROUTE, _up(2)) for _ in range(4)} == {0, 1}


def test_all_down_still_chooses() -> None:
    assert Lineage(2, 1.25).choose(_key("k"), _up(2, down=frozenset({0, 1}))) in (0, 1)


def test_factory() -> None:
    assert make_policy(Affinity(), 2).name == "lineage"
    assert make_policy(Affinity(replicas="round_robin"), 2).name == "round_robin"


def test_the_recorded_replica_comes_before_the_ring() -> None:
    p = Lineage(3, 1.25)
    key = KEYS[0]
    home, second, third = p.order(key)
    assert p.choose(_key(key, third), _up(3)) == third
    # down, or out of this pool (a record from another pool config): the ring decides
    assert p.choose(_key(key, third), _up(3, down=frozenset({third}))) == home
    assert p.choose(_key(key, 7), _up(3)) == home
    # over the load bound like any replica: the ring's order after it
    assert p.choose(_key(key, third), _up(3, {third: 2})) == home
    assert p.choose(_key(key, third), _up(3, {third: 3, home: 3})) == second


def test_round_robin_ignores_the_recorded_replica() -> None:
    rr = RoundRobin()
    assert [rr.choose(_key("k", 1), _up(2)) for _ in range(4)] == [0, 1, 0, 1]


def test_a_new_lineage_goes_where_the_load_is_least() -> None:
    p = Lineage(2, 1.25)
    key = KEYS[0]
    first, second = p.order(key)
    new = Route(key, new=True)
    assert p.choose(new, _up(2)) == first  # a tie: the ring's order
    assert p.choose(new, _up(2, lineages={first: 1})) == second
    assert p.choose(new, _up(2, lineages={first: 1, second: 1})) == first
    # live lineages and requests in flight both count
    assert p.choose(new, _up(2, loads={second: 2}, lineages={first: 1})) == first
    assert p.choose(new, _up(2, loads={first: 1}, lineages={first: 1, second: 1})) == second
    # a down replica takes nothing, however idle
    assert p.choose(new, _up(2, down=frozenset({second}), lineages={first: 9})) == first


def test_two_replicas_three_new_lineages_both_serve() -> None:
    """Hashing alone often puts a few lineages all on one replica; placing by load
    spreads them, whatever their keys."""
    p = Lineage(2, 1.25)
    hashed = [p.choose(_key(k), _up(2)) for k in KEYS[:3]]
    placed: list[int] = []
    for k in KEYS[:3]:
        live = Counter(placed)
        placed.append(p.choose(Route(k, new=True), _up(2, lineages=dict(live))))
    assert sorted(Counter(placed).values()) == [1, 2], (hashed, placed)
