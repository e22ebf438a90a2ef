"""The warnings' throttle: so many lines per window, the rest counted."""

from __future__ import annotations

from proxy.throttle import Throttle, Throttles, more


def test_one_event_per_window_and_the_rest_counted() -> None:
    t = Throttle(60.0)
    assert t.ready(0.0) and t.allow(0.0)
    assert not t.ready(59.9)
    assert [t.allow(now) for now in (1.0, 30.0, 59.9)] == [False, False, False]
    assert t.take_held() == 3 and t.take_held() == 0
    assert t.allow(60.0)  # a new window from here
    assert not t.allow(119.9) and t.allow(120.0)


def test_a_burst_per_window() -> None:
    t = Throttle(10.0, burst=3)
    assert [t.allow(0.0), t.allow(1.0), t.allow(2.0), t.allow(3.0), t.allow(9.9)] == [True, True, True, False, False]
    assert t.held == 2 and t.ready(10.0) and t.held == 2  # ready() counts nothing
    assert t.allow(10.0) and t.take_held() == 2


def test_one_window_per_key_and_the_keys_bounded() -> None:
    ts = Throttles(60.0, max_keys=2)
    assert ts["a"].allow(0.0) and ts["b"].allow(0.0)
    assert not ts["a"].allow(1.0) and ts["a"] is ts["a"]
    assert ts["c"].allow(1.0)  # a third key: "b", used least recently, is forgotten
    assert len(ts) == 2
    assert not ts["a"].allow(2.0)  # "a" kept its window
    assert ts["b"].allow(2.0)  # "b" starts again ("c" goes)


def test_a_flood_keeps_its_window_while_other_keys_cycle() -> None:
    """The bound hit by many one-off keys (a client cycling paths) while one key
    floods: the flood still gets one line a window, and the keys stay bounded."""
    ts = Throttles(60.0, max_keys=8)
    lines = 0
    for n in range(10_000):
        now = n * 0.001  # ten seconds: within one window
        lines += ts["flood"].allow(now)
        ts[f"once-{n}"].allow(now)
        assert len(ts) <= 8
    assert lines == 1 and ts["flood"].take_held() == 9_999


def test_what_a_line_adds() -> None:
    assert more(0, "such failures") == ""
    assert more(4, "such failures") == " (4 more such failures since the last warning)"
