"""This process's live lineages per replica of ``upstream.pool``: the load a new
lineage is placed by (proxy.upstream.policy).

A lineage is live on a replica from the moment it is placed or served there until
``window_s`` passes without a request of it (its session ended, or its prefix has
likely left the replica's cache).  At most ``limit`` lineages are remembered, the
least recently seen forgotten first, so memory stays bounded whatever the traffic.
Time comes in as an argument (the pool's clock).
"""

from __future__ import annotations

from collections import OrderedDict

WINDOW_S = 600.0  # an agent's turns come seconds to minutes apart
LIMIT = 100_000


class LiveLineages:
    """Lineage key -> (replica, last seen); counts per replica kept as they change."""

    def __init__(self, replicas: int, *, window_s: float = WINDOW_S, limit: int = LIMIT) -> None:
        self.window_s = window_s
        self.limit = limit
        self._seen: OrderedDict[str, tuple[int, float]] = OrderedDict()  # oldest first
        self._counts = [0] * replicas

    def touch(self, key: str, replica: int, now: float) -> None:
        """``key`` was placed on, or served by, ``replica`` at ``now``."""
        old = self._seen.pop(key, None)
        if old is not None:
            self._counts[old[0]] -= 1
        self._seen[key] = (replica, now)
        self._counts[replica] += 1
        self._expire(now)

    def where(self, key: str, now: float) -> int | None:
        """The replica ``key`` is live on, if it is."""
        got = self._seen.get(key)
        return got[0] if got is not None and now - got[1] <= self.window_s else None

    def counts(self, now: float) -> list[int]:
        """Live lineages per replica."""
        self._expire(now)
        return list(self._counts)

    def __len__(self) -> int:
        return len(self._seen)

    def _expire(self, now: float) -> None:
        seen, counts = self._seen, self._counts
        while seen:
            key, (replica, at) = next(iter(seen.items()))
            if now - at <= self.window_s and len(seen) <= self.limit:
                return
            del seen[key]
            counts[replica] -= 1


__all__ = ["LiveLineages"]
