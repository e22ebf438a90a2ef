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
    # The session's identity when the agent names it outside the system text: request
    # params (``prompt_cache_key``) and headers (``session-id``), as sent.
    identity_params: tuple[str, ...] = ()
    identity_headers: tuple[str, ...] = ()
