"""A circuit breaker around the store: a down or slow store costs one timeout,
not one per request.  The timeout itself is the backend's (Redis socket timeouts
of ``store.timeout_ms``; the memory store never blocks), so a healthy call costs
no extra task.  After a failure the store is skipped (requests fail open
at once) for a cool-down that doubles up to ``max_cooldown_s``; the first call
after it probes again, so a store that comes back is used without a restart.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from proxy.errors import StoreError

T = TypeVar("T")


class StoreGuard:
    def __init__(
        self, *, cooldown_s: float = 0.25, max_cooldown_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.base = cooldown_s
        self.max = max_cooldown_s
        self.clock = clock
        self._until = 0.0
        self._cooldown = cooldown_s

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
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"store failed: {type(exc).__name__}") from exc
        self._cooldown = self.base
        return result
