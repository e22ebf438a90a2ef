"""A circuit breaker around the store: a down or slow store costs one timeout,
not one per request.  The timeout itself is the backend's (Redis socket timeouts
of ``store.timeout_ms``; the memory store never blocks), so a healthy call costs
no extra task.  After a failure the store is skipped (requests fail open
at once) for a cool-down that doubles up to ``max_cooldown_s``; the first call
after it probes again, so a store that comes back is used without a restart.

Each failure is logged as a WARNING naming its cause, at most once per
``log_every_s`` for each kind (the error's class: a connection refused, a READONLY
replica, a cluster without a master for a slot, a timeout), so a store down for an
hour costs a line every ten seconds, not one per request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from proxy.errors import StoreError
from proxy.throttle import Throttles, more

T = TypeVar("T")
log = logging.getLogger("prefixpin")


class StoreGuard:
    def __init__(
        self,
        *,
        cooldown_s: float = 0.25,
        max_cooldown_s: float = 5.0,
        log_every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base = cooldown_s
        self.max = max_cooldown_s
        self.log_every_s = log_every_s
        self.clock = clock
        self._until = 0.0
        self._cooldown = cooldown_s
        self._logged = Throttles(log_every_s)  # per kind of failure (error classes: few, bounded all the same)

    def warn(self, exc: BaseException, context: str = "requests fail open until it answers") -> None:
        """Log ``exc`` as a WARNING unless its kind was logged in the last ``log_every_s``."""
        cause = exc.__cause__ if isinstance(exc, StoreError) and exc.__cause__ is not None else exc
        kind = type(cause).__name__
        throttle = self._logged[kind]
        if throttle.allow(self.clock()):
            log.warning("store failed (%s): %s; %s%s", kind, exc, context, more(throttle.take_held(), "such failures"))

    @property
    def open(self) -> bool:
        """True while the store is being skipped."""
        return self.clock() < self._until

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        if self.open:
            raise StoreError("store skipped after a recent failure")
        try:
            result = await fn()
        except (StoreError, OSError, TimeoutError) as exc:
            self._until = self.clock() + self._cooldown
            self._cooldown = min(self._cooldown * 2, self.max)
            self.warn(exc)
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"store failed: {type(exc).__name__}") from exc
        self._cooldown = self.base
        return result
