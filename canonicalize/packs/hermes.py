"""NousResearch/hermes-agent (see shared/seeds: #25322, #25427, #18547, #2235).

- memory-usage counters in the MEMORY / USER PROFILE headers are stripped:
  ``MEMORY (your personal notes) [49% — 1,085/2,200 chars]`` -> ``MEMORY (your personal notes)``;
- ``Conversation started: …`` (legacy minute timestamp, or the current date + zone)
  is pinned to the lineage's first value;
- ``Session ID: …`` is pinned and names the session (identity), so a new session
  that replays the same first message is a new root, never a continuation;
- background-review prompts (``Review the conversation above and …``) mark forks,
  so even the oldest review forks that kept the full toolset are recognised.
"""

from __future__ import annotations

import re

from canonicalize.packs._pack import Pack
from canonicalize.rules import compile_rule

# Every pattern starts with a literal and checks the line start in a lookbehind
# after it: `re` then jumps from one occurrence of the literal to the next instead
# of trying every position of a 10-50 KB system prompt (~6x faster).  ``seek`` goes
# further: the pattern is tried only where its whole line prefix occurs, which
# str.find finds far faster than `re` steps through every " [", "C" or "S".
_MEMORY = r"MEMORY \(your personal notes\) \["
_PROFILE = r"USER PROFILE \(who the user is\) \["

PACK = Pack(
    name="hermes",
    rules=(
        compile_rule(
            "hermes.memory_usage",
            rf"(?P<v> \[(?:(?<=^{_MEMORY})|(?<=^{_PROFILE}))\d{{1,3}}% — [\d,]+/[\d,]+ chars\])$",
            "strip",
            # The match starts at " [", 28 / 30 characters into its line's literal prefix.
            seek=(("MEMORY (your personal notes) [", 28), ("USER PROFILE (who the user is) [", 30)),
            line=True,
        ),
        compile_rule(
            "hermes.conversation_started",
            r"Conversation started: (?<=^Conversation started: )(?P<v>[^\n]+)$",
            "pin",
            seek=(("Conversation started: ", 0),),
            line=True,
        ),
        compile_rule(
            "hermes.session_id",
            r"Session ID: (?<=^Session ID: )(?P<v>\d{8}_\d{6}_[0-9a-f]{6,8})$",
            "pin",
            identity=True,
            seek=(("Session ID: ", 0),),
            line=True,
        ),
    ),
    markers=(
        re.compile(
            r"^Review the conversation above and (?:consider saving to memory|consider saving or updating"
            r" a skill|consider two things|update the skill library|update two things)"
        ),
    ),
)
