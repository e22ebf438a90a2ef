"""tests/infra/zones.py: the zone the agent e2e tests run their agents in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from tests.infra.zones import noon_zone


@pytest.mark.parametrize("hour", range(24))
def test_noon_zone_is_a_zone_where_it_is_noon(hour: int) -> None:
    now = datetime(2026, 11, 30, hour, 59, tzinfo=UTC)
    local = now.astimezone(ZoneInfo(noon_zone(now)))  # a zone the system's tz database holds
    assert local.hour == 12
    # Minutes later (a test's next invocation), the local date is the same.
    assert (now + timedelta(minutes=30)).astimezone(local.tzinfo).date() == local.date()
