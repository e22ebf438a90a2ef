"""Which replica of ``upstream.pool`` serves a request (SGLang's router policy model).

A :class:`Policy` has a ``name`` (for logs) and one required method,
:meth:`Policy.choose`: given the request's :class:`Route` (its affinity key, the
lineage root id or None; the replica the lineage's record names, ``home``; whether
the lineage is new) and the replicas as they stand now, the index of the one to
use.  :func:`make_policy` is the factory from config.

    round_robin   the next healthy replica in turn
    lineage       a new lineage (a root) goes to the healthy replica with the least
                  load: this process's live lineages there plus its requests in
                  flight, ties broken by the ring's order for its key.  The replica
                  that answers is written into the lineage's record, and every later
                  request of the lineage and of its forks is offered that replica
                  first (``home``), so the lineage stays where its prefix is cached,
                  in every process sharing the store.  Without a home (a record
                  written before replicas were recorded, a record that could not be
                  written) the lineage goes by consistent hashing of its key with
                  bounded load (Mirrokni et al., "Consistent Hashing with Bounded
                  Loads"): walk the ring from the key's point and take the first
                  healthy replica whose in-flight count stays within ``max_load`` x
                  the mean.  The ring depends only on the pool, so every process maps
                  a key to the same replica.  The home is subject to the same load
                  bound, and a home that is down is skipped.  A request without a key
                  goes round robin.

Hashing alone spreads many lineages evenly, but a few lineages land where the ring
happens to put them (three sessions on two replicas: often all on one); placing a
new lineage by load spreads even two.

Policies hold no clock and do no I/O: health and load come in as :class:`Replica`.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from proxy.config import Affinity

VNODES = 160  # points per replica on the ring: keys spread evenly over a few replicas


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica as a policy sees it."""

    index: int
    healthy: bool
    in_flight: int  # this process's requests to it not yet answered in full
    lineages: int = 0  # this process's live lineages there (placed or served lately)


@dataclass(frozen=True, slots=True)
class Route:
    """What a policy knows of a request."""

    key: str | None = None  # the lineage root id (a lineage and its forks share it)
    home: int | None = None  # the replica the lineage's record says last served it
    new: bool = False  # a new lineage: no replica holds its prefix yet


NO_ROUTE = Route()


class Policy(Protocol):
    name: str

    def choose(self, route: Route, replicas: Sequence[Replica]) -> int:
        """The index of the replica for this request; ``replicas`` is never empty
        and has at least one healthy replica unless all are down (then any may be
        chosen: a request that might succeed beats a certain 502)."""
        ...


def _candidates(replicas: Sequence[Replica]) -> list[Replica]:
    up = [r for r in replicas if r.healthy]
    return up or list(replicas)


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._next = itertools.count()

    def choose(self, route: Route, replicas: Sequence[Replica]) -> int:
        up = _candidates(replicas)
        return up[next(self._next) % len(up)].index


def _point(data: str) -> int:
    return int.from_bytes(hashlib.blake2b(data.encode(), digest_size=8).digest(), "big")


class Lineage:
    name = "lineage"

    def __init__(self, size: int, max_load: float) -> None:
        ring = sorted((_point(f"replica-{i}#{v}"), i) for i in range(size) for v in range(VNODES))
        self.size = size
        self._points = [p for p, _ in ring]
        self._owners = [i for _, i in ring]
        self.max_load = max_load
        self._fallback = RoundRobin()

    def order(self, key: str) -> list[int]:
        """Every replica index, in the order the ring offers them to ``key``."""
        start = bisect.bisect(self._points, _point(key))
        seen: list[int] = []
        n = len(self._owners)
        for k in range(n):
            owner = self._owners[(start + k) % n]
            if owner not in seen:
                seen.append(owner)
                if len(seen) == self.size:
                    break
        return seen

    def choose(self, route: Route, replicas: Sequence[Replica]) -> int:
        key = route.key
        if key is None:
            return self._fallback.choose(route, replicas)
        up = {r.index: r for r in _candidates(replicas)}
        ring = [i for i in self.order(key) if i in up]
        if route.new:  # the least loaded; min() keeps the ring's order among equals
            return min(ring, key=lambda i: up[i].lineages + up[i].in_flight)
        total = sum(r.in_flight for r in up.values()) + 1  # this request included
        cap = math.ceil(self.max_load * total / len(up))
        if route.home in up:  # a healthy replica of this pool
            ring = [route.home, *(i for i in ring if i != route.home)]
        for i in ring:
            if up[i].in_flight + 1 <= cap:
                return i
        return ring[0]  # unreachable while cap >= the mean; kept for safety


def make_policy(cfg: Affinity, size: int) -> Policy:
    """The policy ``affinity.replicas`` names, for a pool of ``size`` replicas."""
    if cfg.replicas == "round_robin":
        return RoundRobin()
    return Lineage(size, cfg.max_load)


__all__ = ["NO_ROUTE", "Lineage", "Policy", "Replica", "RoundRobin", "Route", "make_policy"]
