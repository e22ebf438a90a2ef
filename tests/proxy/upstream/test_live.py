"""Live lineages per replica: placed or served within the window, bounded."""

from __future__ import annotations

from proxy.upstream.live import LiveLineages


def test_a_lineage_counts_where_it_was_last_placed() -> None:
    live = LiveLineages(2, window_s=10)
    live.touch("a", 0, 0.0)
    live.touch("b", 0, 1.0)
    assert live.counts(1.0) == [2, 0]
    live.touch("a", 1, 2.0)  # moved (failover): counted once, where it is now
    assert live.counts(2.0) == [1, 1]
    assert live.where("a", 2.0) == 1 and live.where("c", 2.0) is None


def test_lineages_expire_after_the_window() -> None:
    live = LiveLineages(2, window_s=10)
    live.touch("a", 0, 0.0)
    live.touch("b", 1, 5.0)
    assert live.counts(10.0) == [1, 1]
    assert live.counts(10.5) == [0, 1]
    assert live.where("a", 10.5) is None
    live.touch("b", 1, 14.0)  # seen again: live for another window
    assert live.counts(20.0) == [0, 1]
    assert len(live) == 1


def test_memory_is_bounded_the_least_recently_seen_forgotten() -> None:
    live = LiveLineages(3, window_s=1e9, limit=100)
    for i in range(1000):
        live.touch(f"k{i}", i % 3, float(i))
    assert len(live) == 100
    assert sum(live.counts(1000.0)) == 100
    assert live.where("k999", 1000.0) == 0 and live.where("k0", 1000.0) is None
