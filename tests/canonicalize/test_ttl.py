"""canonicalize.ttl: a lineage's pauses, and when a 1-hour cache write pays."""

from __future__ import annotations

import pytest

from canonicalize.ttl import ANTHROPIC, PAUSES_KEPT, CachePrices, choose, pauses


def test_only_pauses_over_five_minutes_are_kept_the_newest_last() -> None:
    assert pauses((), None, 1000.0) == ()  # the lineage's first request
    assert pauses((), 1000.0, 1299.0) == ()  # the agent's own tool loop
    assert pauses((), 1000.0, 1300.0) == ()  # exactly 5 minutes: both TTLs still hold
    assert pauses((400,), 1000.0, 1900.5) == (400, 900)
    full = tuple(range(301, 301 + PAUSES_KEPT))
    assert pauses(full, 0.0, 5000.0) == (*full[1:], 5000)


@pytest.mark.parametrize(
    ("kept", "ttl"),
    [
        ((), "5m"),  # never paused: 5m costs the same and writes cheaper
        ((600,), "1h"),  # one pause within the hour: 1.15x saved > the 0.75x switch
        ((3601,), "5m"),  # over the hour: 1h expires too, and writes dearer
        ((600, 7200), "5m"),  # 1.15 < 0.75 + 0.75
        ((600, 900, 7200), "1h"),  # 2.3 > 1.5
        ((3600,), "1h"),  # an hour exactly is still within it
    ],
)
def test_choose_at_anthropics_prices(kept: tuple[int, ...], ttl: str) -> None:
    assert choose(kept) == choose(kept, ANTHROPIC) == ttl


def test_choose_follows_the_prices() -> None:
    # A model whose 5-minute write costs no more than input: a 1h write (2x) needs more pauses to pay.
    flat = CachePrices(read=0.3, write_5m=3.0, write_1h=6.0)  # USD per 1M tokens: input 3
    assert choose((600,), flat) == "5m"  # 2.7 < 3
    assert choose((600, 900), flat) == "1h"  # 5.4 > 3
    # Prices in any unit: only their ratios matter.
    scaled = CachePrices(read=0.3, write_5m=3.75, write_1h=6.0)
    assert [choose(k, scaled) for k in ((600,), (3601,))] == [choose(k) for k in ((600,), (3601,))]
