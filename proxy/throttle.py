"""At most so many warnings a while: what a flood of one failure logs.

A failure that repeats (a full queue, a store down, an upstream without the route)
would log a line per request; each place that warns of one lets a few lines through
per window instead and counts the ones it held back, which its next line tells.
:class:`Throttle` is one such window; :class:`Throttles` keeps one per key (a kind of
failure, a path), bounded in keys (the least recently used forgotten first).  The
caller reads its own clock and passes ``now``.
"""

from __future__ import annotations

from collections.abc import Hashable


class Throttle:
    """Lets ``burst`` events through per ``every_s`` seconds (a window starts at the
    first event let through after the last one ended) and counts those it holds back."""

    __slots__ = ("_began", "_passed", "burst", "every_s", "held")

    def __init__(self, every_s: float, burst: int = 1) -> None:
        self.every_s = every_s
        self.burst = burst
        self._began = float("-inf")
        self._passed = 0
        self.held = 0  # events held back since the last one told (take_held)

    def ready(self, now: float) -> bool:
        """An event at ``now`` would be let through (nothing is counted)."""
        return now - self._began >= self.every_s or self._passed < self.burst

    def allow(self, now: float) -> bool:
        """Whether the event at ``now`` goes through; one held back is counted."""
        if now - self._began >= self.every_s:
            self._began, self._passed = now, 0
        if self._passed >= self.burst:
            self.held += 1
            return False
        self._passed += 1
        return True

    def take_held(self) -> int:
        """The events held back since the last call (told with the next line)."""
        held, self.held = self.held, 0
        return held


class Throttles:
    """One :class:`Throttle` per key, at most ``max_keys``: past it the key used least
    recently is forgotten (its window starts again if it comes back), so a flood of
    one key keeps its window however many other keys pass by."""

    __slots__ = ("_keys", "burst", "every_s", "max_keys")

    def __init__(self, every_s: float, *, burst: int = 1, max_keys: int = 64) -> None:
        self.every_s = every_s
        self.burst = burst
        self.max_keys = max_keys
        self._keys: dict[Hashable, Throttle] = {}  # least recently used first

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, key: Hashable) -> Throttle:
        keys = self._keys
        found = keys.pop(key, None)
        if found is None:
            if len(keys) >= self.max_keys:
                del keys[next(iter(keys))]
            found = Throttle(self.every_s, self.burst)
        keys[key] = found  # (the most recently used, last)
        return found


def more(held: int, what: str) -> str:
    """What a line adds for the ``held`` events held back since the last one told."""
    return f" ({held} more {what} since the last warning)" if held else ""


__all__ = ["Throttle", "Throttles", "more"]
