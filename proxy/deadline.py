"""A deadline that moves on every request, kept by one timer armed lazily.

A connection's deadline moves far more often than it expires: the keep-alive
timeout after each response, the read timeout at each wait on the upstream.  A
timer made and cancelled for each move is a handle added to and taken from the
event loop's heap, per request.  :class:`Deadline` arms its timer only when none
is due by the new deadline; when the timer fires it calls ``on_expiry`` if the
deadline has passed, arms again for a deadline that moved later, or does nothing
when there is none.  So a busy connection arms about one timer per timeout
period, and an expiry is still never late.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Deadline:
    """``on_expiry`` once the deadline set last passes (see the module docstring)."""

    __slots__ = ("_at", "_loop", "_on_expiry", "_timer", "when")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_expiry: Callable[[], None]) -> None:
        self._loop = loop
        self._on_expiry = on_expiry
        self._timer: asyncio.TimerHandle | None = None
        self._at = 0.0  # when the armed timer fires
        self.when: float | None = None  # the deadline, in the loop's time (None: none)

    def set(self, delay: float) -> None:
        """The deadline is ``delay`` seconds from now."""
        self.when = when = self._loop.time() + delay
        if self._timer is None or self._at > when:
            self._arm(when)

    def clear(self) -> None:
        """No deadline (an armed timer finds none when it fires)."""
        self.when = None

    def cancel(self) -> None:
        """No deadline, and no timer: the loop holds nothing of the owner's (it is closed)."""
        self.when = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def armed(self) -> bool:
        """Is a timer on the event loop?"""
        return self._timer is not None

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = when
        self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        when = self.when
        if when is None:
            return
        if self._loop.time() < when:
            self._arm(when)  # it moved later since the timer was armed
            return
        self.when = None
        self._on_expiry()


__all__ = ["Deadline"]
