"""Claude Code 2.1.33x shapes on ``/v1/messages``, through the real flow offline:
its cwd/date in a ``role: system`` message at ``messages[1]`` and
``cache_control`` markers that move between turns keep one lineage, and nothing
of the history is rewritten."""

from __future__ import annotations

from typing import Any

import orjson

from canonicalize import MESSAGES, Settings
from tests.flows import Harness

SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.331.a1b; cc_entrypoint=cli; cch=0f3e1;"},
    {
        "type": "text",
        "text": "You are Claude Code, Anthropic's official CLI for Claude.",
        "cache_control": {"type": "ephemeral"},
    },
]
CC = {"type": "ephemeral"}


def env(day: str) -> dict[str, Any]:
    return {"role": "system", "content": f"<env>\nWorking directory: /src/app\nToday's date: {day}\n</env>"}


def user(text: str, *, marked: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if marked:
        block["cache_control"] = CC
    return {"role": "user", "content": [block]}


def assistant(text: str, *, marked: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if marked:
        block["cache_control"] = CC
    return {"role": "assistant", "content": [block]}


def req(messages: list[Any], nonce: str = "0f3e1") -> dict[str, Any]:
    system = [dict(SYSTEM[0], text=SYSTEM[0]["text"].replace("0f3e1", nonce)), SYSTEM[1]]
    return {"model": "claude-sonnet-4-5", "max_tokens": 1024, "system": system, "messages": messages}


def test_claude_code_turns_continue_across_a_date_change_and_moving_markers() -> None:
    h = Harness(Settings(packs=("generic", "claude_code")))
    one = h.send(req([user("fix it", marked=True), env("2026-11-23")]), exchange=MESSAGES, reply=assistant("ok"))
    assert one.role == "root"
    # Next turn: the marker moved to the newest message, the date moved on, a new nonce.
    turn = [user("fix it"), env("2026-11-24"), assistant("ok"), user("and the test", marked=True)]
    raw = orjson.dumps(req(turn, nonce="9a8b7"))
    two = h.send(raw, exchange=MESSAGES)
    assert two.role == "continuation" and two.record.id == one.record.id
    sent = orjson.loads(two.raw)
    # Pinned to the lineage's first values, as single-string edits; the history as sent.
    assert sent["system"][0]["text"].endswith("cch=0f3e1;")
    assert sent["messages"][1]["content"].endswith("Today's date: 2026-11-23\n</env>")
    assert sent["messages"][0] == turn[0] and sent["messages"][2:] == turn[2:]
    expected = raw.replace(b"cch=9a8b7;", b"cch=0f3e1;").replace(b"2026-11-24", b"2026-11-23")
    assert two.raw == expected


def test_the_system_message_is_not_history() -> None:
    body = req([user("a"), env("2026-11-23"), assistant("b")])
    assert MESSAGES.history(body) == [user("a"), assistant("b")]
    assert [s.path for s in MESSAGES.system_slots(body)][-1] == ("messages", 1, "content")
    slot = MESSAGES.note_slot(req([user("a"), env("d"), assistant("b"), user("c")]), 2)
    assert slot is not None and slot.path == ("messages", 3, "content", 0, "text")
