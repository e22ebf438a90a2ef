"""Agent-independent rules.

- ``generic.iso_datetime`` pins ISO-8601 datetimes that carry a time part
  (``2026-05-14T14:30:00Z``, ``2026-05-14 14:30``) in system text.  A pin only ever
  restores the value the same line had at the lineage's first request, so a
  datetime that belongs to changed content (a new line) is left alone.

tools[] are never re-serialized: the lineage forwards the bytes it first sent for
tools that mean the same (see :mod:`canonicalize.finalize`).
"""

from __future__ import annotations

from canonicalize.packs._pack import Pack
from canonicalize.rules import compile_rule

PACK = Pack(
    name="generic",
    rules=(
        compile_rule(
            "generic.iso_datetime",
            # "\d(?<![\d-]\d)\d{3}" is "(?<![\d-])\d{4}" with a digit first: 3.5x faster to scan.
            r"\d(?<![\d-]\d)\d{3}-[01]\d-[0-3]\d[T ][0-2]\d:[0-5]\d(?::[0-5]\d(?:\.\d{1,9})?)?"
            r"(?:Z|[+-][0-2]\d:?[0-5]\d)?(?![\d:])",
            "pin",
            # Every match has "-0" or "-1" (the month's first digit) 4 characters in:
            # the pattern is tried there only (a \d first is tried at every position).
            anchor="-[01]",
            anchor_at=4,
            line=True,
        ),
    ),
)
