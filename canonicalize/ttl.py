"""Anthropic's cache TTL per lineage (``provider_cache.anthropic_ttl: auto``): when a
1-hour cache write pays for itself.

An Anthropic cache entry lives 5 minutes (written at 1.25x the input price) or 1
hour (written at 2x); a read (0.1x) refreshes it at no cost.  Between two requests
of a lineage, for the prefix the system+tools breakpoint covers:

- a pause of up to 5 minutes (the agent's own tool loop): both entries are read,
  the TTL changes nothing;
- a pause of 5 minutes to an hour (a person reading the answer, typing the next
  turn): the 5-minute entry is gone and written again (1.25x), the 1-hour one is
  read (0.1x): 1h saves ``write_5m - read`` (1.15x);
- a pause over an hour: both are gone and written again: 1h costs
  ``write_1h - write_5m`` more (0.75x);
- and moving a lineage to 1h costs that once more: its first 1-hour write.

The rule: a lineage's recent pauses over 5 minutes (the last :data:`PAUSES_KEPT`)
are taken as a forecast of as many more, alike.  1h when what the pauses within the
hour save exceeds what the pauses over it and the switch cost::

    within x (write_5m - read)  >  (over + 1) x (write_1h - write_5m)

At Anthropic's prices one pause of 5-60 minutes is enough (1.15 > 0.75); each
pause over an hour needs about one more within it.  A lineage that never paused
over 5 minutes stays at 5m.  Only the ratios of the prices matter.

Pure: the caller's clock comes in as ``now``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FIVE_MINUTES = 300.0
ONE_HOUR = 3600.0
PAUSES_KEPT = 8  # the newest pauses over 5 minutes a lineage record keeps
TTLS = ("5m", "1h", "auto")  # provider_cache.anthropic_ttl


@dataclass(frozen=True, slots=True)
class CachePrices:
    """What a token costs read from the cache and written at each TTL (any unit)."""

    read: float
    write_5m: float
    write_1h: float


# Anthropic's multiples of the input price: the rule's default when a model has no price.
ANTHROPIC = CachePrices(read=0.1, write_5m=1.25, write_1h=2.0)


def pauses(kept: Sequence[int], last_at: float | None, now: float) -> tuple[int, ...]:
    """``kept`` (a lineage's pauses over 5 minutes, the newest last) with the pause
    between its last request (at ``last_at``) and this one (at ``now``), if it was
    one: at most :data:`PAUSES_KEPT`."""
    kept = tuple(kept)
    if last_at is None or now - last_at <= FIVE_MINUTES:
        return kept
    return (*kept, int(now - last_at))[-PAUSES_KEPT:]


def choose(kept: Sequence[int], prices: CachePrices = ANTHROPIC) -> str:
    """``"1h"`` or ``"5m"`` for a lineage with these pauses over 5 minutes (module docstring)."""
    if not kept:
        return "5m"
    within = sum(1 for p in kept if p <= ONE_HOUR)
    over = len(kept) - within
    gain = prices.write_5m - prices.read  # per pause within the hour
    loss = prices.write_1h - prices.write_5m  # per pause over it, and once for the switch
    return "1h" if within * gain > (over + 1) * loss else "5m"


__all__ = ["ANTHROPIC", "FIVE_MINUTES", "ONE_HOUR", "PAUSES_KEPT", "TTLS", "CachePrices", "choose", "pauses"]
