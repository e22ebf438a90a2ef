"""The pack container."""

from __future__ import annotations

import re
from dataclasses import dataclass

from canonicalize.rules import Rule


@dataclass(frozen=True, slots=True)
class Pack:
    """A named, ordered tuple of rules plus the fork markers an agent is known by."""

    name: str
    rules: tuple[Rule, ...]
    markers: tuple[re.Pattern[str], ...] = ()
    inherit_params: tuple[str, ...] = ()
