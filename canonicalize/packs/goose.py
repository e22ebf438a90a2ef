"""block/goose.

The system-prompt timestamp (``2026-01-08 19:00`` hourly, ``%Y-%m-%d %H:%M:%S`` in
v1.0.18) changes while the conversation does not: pinned, on a line of its own or
after ``The current date is`` (the subagent prompt has that sentence mid-line).
Its MOIM ``<info-msg>`` lives in user messages and is left alone.
"""

from __future__ import annotations

from canonicalize.packs._pack import Pack
from canonicalize.rules import compile_rule

PACK = Pack(
    name="goose",
    rules=(
        compile_rule(
            "goose.timestamp",
            r"(?:^|The current date is )(?P<v>\d{4}-\d{2}-\d{2} \d{2}:\d{2}(?::\d{2})?)\.?$",
            "pin",
            line=True,
        ),
    ),
)
