"""anthropics/claude-code (closed source; from wire captures).

- the billing-header nonce in system[0]
  (``x-anthropic-billing-header: cc_version=2.1.117.48f; cc_entrypoint=cli; cch=71fea;``)
  changes on every request: pinned;
- older builds put ``Today's date: YYYY-MM-DD`` in the system ``<env>``: pinned;
- the ``x-claude-code-session-id`` header names the session (honoured whichever
  packs are enabled: :data:`canonicalize.ruleset.SESSION_HEADERS`).
"""

from __future__ import annotations

from canonicalize.packs._pack import Pack
from canonicalize.rules import compile_rule

PACK = Pack(
    name="claude_code",
    rules=(
        compile_rule(
            "claude_code.billing_header",
            r"^x-anthropic-billing-header: (?P<v>cc_version=[\d.]+\.[0-9a-f]{3}; cc_entrypoint=[\w-]+;"
            r" cch=[0-9a-f]{5};)$",
            "pin",
            line=True,
        ),
        compile_rule("claude_code.env_date", r"Today's date: (?P<v>\d{4}-\d{2}-\d{2})", "pin", line=True),
    ),
    identity_headers=("x-claude-code-session-id",),
)
