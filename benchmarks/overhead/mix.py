"""The conversation mix: many hermes conversations at once, each request continuing one.

Conversation *c* opens like a hermes session in mid-flight: its own system prompt
and ``Session ID``, the 22 tools, ``HISTORY`` messages of tool calls and results, a
new user message (~43-49 KB).  Turn *k* replays turn *k-1*'s messages, then the
assistant's reply (the text the instant upstream answers, :data:`REPLY`), then a
new user message, which is what a client that got the reply sends next; so
prefixpin finds turn *k-1* recorded and classifies turn *k* as a continuation.
The pre-fix per-turn ``Conversation started:`` minute moves by one each turn, as
a legacy hermes gateway sends it, so prefixpin also pins it back.

The templates are in send order, turn-major: every conversation's turn 0, then
every conversation's turn 1, ...  Sent round robin, turn *k* of a conversation
leaves ``conversations`` requests after turn *k-1*, long after its answer came
back.  When all turns are sent the load generator starts over with new
conversations: the pass number (``@@GEN@@``, see ``wrk.lua``) is the date part of
each ``Session ID`` and names the task in the first user message, so each pass is
a new set of sessions whose histories differ from the first message on, as two
real conversations' do.  (Conversations that differ only in their Session ID
would share every hash-chain link past the pinned system prompt.)
"""

from __future__ import annotations

import json
from typing import Any

from benchmarks.overhead.body import hermes_body, session_id

REPLY = "Done — the config is fixed and the tests pass."  # the instant upstream's answer (targets.py)
GEN = "@@GEN@@"  # the load generator's pass number, 8 digits: the Session ID's date part
HISTORY = (44, 38, 50, 58)  # history messages of turn 0, by conversation mod 4 (as body.SESSION_MESSAGES)

_ASKS = (
    "Good. Now run the full suite once more and show me only the failures.",
    "Can you also add a test for the empty inventory case?",
    "What does the journal say about the last deploy?",
    "Commit that with a short message and push the branch.",
    "Check whether the backup timer ran after the change.",
    "Summarize what we changed today in three lines.",
    "Is there anything in the logs that looks like the same bug?",
    "Open a PR with the fix and link the issue.",
)


def conversation(c: int, turns: int) -> list[dict[str, Any]]:
    """The bodies of conversation ``c``'s first ``turns`` turns (turn k extends turn k-1)."""
    first = hermes_body(
        c,
        HISTORY[c % len(HISTORY)],
        user=_ask(c, 0),
        minute=_minute(0),
        sid=session_id(c, day=GEN),
    )
    opening = first["messages"][1]
    first["messages"][1] = {**opening, "content": f"Task {GEN}-{c}: {opening['content']}"}
    bodies = [first]
    for k in range(1, turns):
        prev = bodies[-1]
        system = {"role": "system", "content": _with_minute(prev["messages"][0]["content"], k)}
        messages = [
            system,
            *prev["messages"][1:],
            {"role": "assistant", "content": REPLY},
            {"role": "user", "content": _ask(c, k)},
        ]
        bodies.append({**prev, "messages": messages})
    return bodies


def templates(conversations: int, turns: int) -> list[str]:
    """Every conversation's turns as compact JSON lines, in send order (turn-major)."""
    per = [conversation(c, turns) for c in range(conversations)]
    return [_line(per[c][k]) for k in range(turns) for c in range(conversations)]


def _line(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def _ask(c: int, k: int) -> str:
    return f"{_ASKS[(c + k) % len(_ASKS)]} (turn {k})"


def _minute(k: int) -> str:
    return f"{(30 + k) % 60:02d}"


def _with_minute(system: str, k: int) -> str:
    """``system`` with its ``Conversation started:`` minute set to turn ``k``'s."""
    head, sep, rest = system.rpartition("Conversation started: ")
    line, nl, tail = rest.partition("\n")
    stamp = line.rsplit(":", 1)[0] + f":{_minute(k)} " + line.rsplit(" ", 1)[1]  # "... 02:MM PM"
    return head + sep + stamp + nl + tail


__all__ = ["GEN", "REPLY", "conversation", "templates"]
