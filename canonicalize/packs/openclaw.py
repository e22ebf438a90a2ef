"""openclaw/openclaw.

The system ``Runtime: agent=… | model=… | channel=… | thinking=…`` line changes per
turn type (heartbeat / cron turns) and on model fallback: pinned.  Conversation
info and message envelopes live in user messages and are left alone.
"""

from __future__ import annotations

from canonicalize.packs._pack import Pack
from canonicalize.rules import compile_rule

PACK = Pack(
    name="openclaw",
    # One ``key=value`` then `` | key=value`` pairs: a value cannot contain ``|``, so
    # every split is fixed by the ``|`` positions (a nested ``(?:k=v(?: \| )?)+``
    # backtracks exponentially on a long ``Runtime: a=a=a=…`` line that fails to match).
    rules=(compile_rule("openclaw.runtime", r"^Runtime: (?P<v>\w+=[^|\n]+(?: \| \w+=[^|\n]+)*)$", "pin", line=True),),
)
