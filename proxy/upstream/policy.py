"""Which replica of ``upstream.pool`` serves a request (SGLang's router policy model).

A :class:`Policy` has a ``name`` (for logs) and one required method,
:meth:`Policy.choose`: given the request's affinity key (the lineage root id, or
None for a request that has none) and the replicas as they stand now, the index
of the one to use; ``prefer`` is the replica the lineage's record says last
served it (shared through the store, so every process knows it), or None.
:func:`make_policy` is the factory from config.

    round_robin   the next healthy replica in turn
    lineage       consistent hashing of the key with bounded load (Mirrokni et al.,
                  "Consistent Hashing with Bounded Loads"): walk the ring from the
                  key's point and take the first healthy replica whose in-flight
                  count stays within ``max_load`` x the mean.  The ring depends only
                  on the pool, so every process maps a key to the same replica; the
                  load bound is each process's own view.  The preferred (recorded)
                  replica is offered first, before the ring's order: once the load
                  bound or a failover moved a lineage, every process follows it
                  there, where its prefix is now cached.  A key without a lineage
                  goes round robin.

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
    in_flight: int


class Policy(Protocol):
    name: str

    def choose(self, key: str | None, replicas: Sequence[Replica], prefer: int | None = None) -> int:
        """The index of the replica for this request; ``replicas`` is never empty
        and has at least one healthy replica unless all are down (then any may be
        chosen: a request that might succeed beats a certain 502).  ``prefer`` is a
        hint a policy may ignore."""
        ...


def _candidates(replicas: Sequence[Replica]) -> list[Replica]:
    up = [r for r in replicas if r.healthy]
    return up or list(replicas)


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._next = itertools.count()

    def choose(self, key: str | None, replicas: Sequence[Replica], prefer: int | None = None) -> int:
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

    def choose(self, key: str | None, replicas: Sequence[Replica], prefer: int | None = None) -> int:
        if key is None:
            return self._fallback.choose(key, replicas)
        up = {r.index: r for r in _candidates(replicas)}
        total = sum(r.in_flight for r in up.values()) + 1  # this request included
        cap = math.ceil(self.max_load * total / len(up))
        ring = self.order(key)
        if prefer in ring:  # only an index of this pool; a healthy one, below
            ring = [prefer, *(i for i in ring if i != prefer)]
        order = [i for i in ring if i in up]
        for i in order:
            if up[i].in_flight + 1 <= cap:
                return i
        return order[0]  # unreachable while cap >= the mean; kept for safety


def make_policy(cfg: Affinity, size: int) -> Policy:
    """The policy ``affinity.replicas`` names, for a pool of ``size`` replicas."""
    if cfg.replicas == "round_robin":
        return RoundRobin()
    return Lineage(size, cfg.max_load)


__all__ = ["Lineage", "Policy", "Replica", "RoundRobin", "make_policy"]
