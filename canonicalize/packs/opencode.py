"""anomalyco/opencode (sst/opencode).

``Today's date: Thu Jan 01 2026`` in the system ``<env>`` block is recomputed per
request and changes at local midnight in the middle of a session: a ``date``
rule keeps the first date in the system prompt and tells the model the new one
in the newest user message.  The ``x-session-id`` header names the session
(honoured whichever packs are enabled: :data:`canonicalize.ruleset.SESSION_HEADERS`).
"""

from __future__ import annotations

from canonicalize.packs._pack import Pack
from canonicalize.rules import compile_rule

PACK = Pack(
    name="opencode",
    rules=(
        compile_rule(
            "opencode.todays_date",
            r"Today's date: (?P<v>(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep"
            r"|Oct|Nov|Dec) \d{2} \d{4})",
            "date",
            line=True,
        ),
    ),
    identity_headers=("x-session-id",),
)
