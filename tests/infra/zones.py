"""Time zones for tests that run a real agent several times in one session."""

from __future__ import annotations

from datetime import UTC, datetime


def noon_zone(now: datetime | None = None) -> str:
    """A fixed-offset zone (``Etc/GMT±N``) where it is about noon now: agents put the
    local date in their prompts, and a test's invocations (minutes apart) then all see
    one date, whenever the suite runs (at UTC midnight too).  ``Etc/GMT-N`` is UTC+N."""
    hour = (now or datetime.now(UTC)).astimezone(UTC).hour
    offset = 12 - hour  # -11 .. 12
    if offset == 0:
        return "Etc/GMT"
    return f"Etc/GMT-{offset}" if offset > 0 else f"Etc/GMT+{-offset}"
