"""canonicalize.learn through the request flow: an agent no pack knows re-renders its
system prompt with fresh values; ``suggest`` changes nothing, ``pin`` keeps the
lineage's first values; edits, other sessions and other tenants are never pinned."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from canonicalize import CHAT, MESSAGES, RESPONSES, Exchange, Settings, textdiff
from canonicalize.ruleset import LearnMode
from tests.flows import KEY, Harness, Sent

UUID1 = "3f2c1a9b-1234-4abc-9def-0123456789ab"
UUID2 = "8e2c1a9b-5678-4abc-9def-0123456789ac"
UUID3 = "0d2c1a9b-9abc-4abc-9def-0123456789ad"
GUIDE = "Work in small steps. Read files before you change them and run the tests after every change."


def system(
    clock: str = "14:30:15", rid: str = UUID1, used: str = "12,345", ws: str = "a1b2c3d4e5f6", extra: str = ""
) -> str:
    return (
        "You are Atlas, a coding agent. Answer concisely.\n"
        f"Current time: {clock}\n"
        f"Request-Id: {rid}\n"
        f"Workspace: {ws}\n\n"
        f"{GUIDE}\n\n"
        f"Context: tokens used: {used} / 200,000{extra}"
    )


U1 = {"role": "user", "content": "The import failed. Why?"}
R1 = {"role": "assistant", "content": "The CSV had a BOM."}
U2 = {"role": "user", "content": "Strip it, then."}
R2 = {"role": "assistant", "content": "Done."}
U3 = {"role": "user", "content": "Thanks."}


def chat(text: str, *history: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": text}, *history]}


def harness(mode: LearnMode) -> Harness:
    return Harness(Settings(learn=mode))


def sys_of(out: Sent) -> str:
    return str(out.body["messages"][0]["content"])


def two_turns(h: Harness, second: str, *, reply: bool = True) -> tuple[Sent, Sent]:
    first = h.send(chat(system(), U1), reply=R1 if reply else None)
    return first, h.send(chat(second, U1, R1, U2))


# -- suggest -------------------------------------------------------------------------------------
def test_suggest_learns_but_changes_no_byte_nor_role() -> None:
    second = system(clock="14:31:02", rid=UUID2, used="13,001")
    _, off = two_turns(harness("off"), second)
    _, out = two_turns(harness("suggest"), second)
    assert out.raw == off.raw == orjson.dumps(chat(second, U1, R1, U2))
    assert out.role == off.role == "root"
    assert [s.cls for s in out.outcome.learned] == ["time", "uuid", "counter"]
    assert off.outcome.learned == ()
    spans = {s.cls: s for s in out.outcome.learned}
    assert spans["uuid"].rule() == {
        "name": "learned_request_id",
        "pattern": "^Request-Id: (?P<v>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})",
        "action": "pin",
        "scope": "system",
    }
    assert spans["time"].action == "date"
    patterns = [str(s.rule()) for s in out.outcome.learned]
    assert not any(v in p for v in (UUID1, UUID2, "14:30:15", "14:31:02", "12,345", "13,001") for p in patterns)


# -- pin --------------------------------------------------------------------------------------------
def test_pin_keeps_the_lineages_first_values_and_tells_the_time() -> None:
    h = harness("pin")
    first, out = two_turns(h, system(clock="14:31:02", rid=UUID2, used="13,001"))
    assert out.role == "continuation" and out.record.id == first.record.id
    # A clock and an id are pinned on sight; a counter's first change reaches the upstream.
    assert sys_of(out) == system(used="13,001")
    assert out.rewrites == ["learned.time", "learned.uuid"]
    assert out.body["messages"][-1]["content"] == "Strip it, then.\n\n(Note: the current time is now 14:31:02.)"
    # The next turn: the counter's line changed again (another change): now it is pinned
    # too; the note stays on its message, a new one is added.
    third = h.send(chat(system(clock="14:32:40", rid=UUID3, used="14,200"), U1, R1, U2, R2, U3))
    assert third.role == "continuation" and sys_of(third) == system(used="13,001")
    assert third.rewrites == ["learned.time", "learned.uuid", "learned.counter"]
    messages = third.body["messages"]
    assert messages[3]["content"] == "Strip it, then.\n\n(Note: the current time is now 14:31:02.)"
    assert messages[-1]["content"] == "Thanks.\n\n(Note: the current time is now 14:32:40.)"


def test_pin_without_a_recorded_reply_joins_a_request_that_replays_the_whole_last_one() -> None:
    # A trace without responses (or a client that rewrites the reply it replays): the
    # request replays the lineage's last request whole, then a reply.
    _, out = two_turns(harness("pin"), system(clock="14:31:02", rid=UUID2), reply=False)
    assert out.role == "continuation" and sys_of(out) == system()


def test_a_first_request_sharing_only_the_first_message_is_a_root() -> None:
    h = harness("pin")
    a = h.send(chat(system(), U1), reply=R1)
    b = h.send(chat(system(clock="14:31:02", rid=UUID2, ws="0f0e0d0c0b0a"), U1))
    assert b.role == "root" and b.record.id != a.record.id
    assert sys_of(b) == system(clock="14:31:02", rid=UUID2, ws="0f0e0d0c0b0a")


@pytest.mark.parametrize(
    ("edit", "seen"),
    [
        ((GUIDE, "Write a failing test first, then fix the bug, and keep the test."), "Write a failing test first"),
        (("Answer concisely", "Answer thoroughly"), "Answer thoroughly"),
        (("/ 200,000", "/ 200,000\n\n## File: src/app.py\nprint(1)"), "## File: src/app.py\nprint(1)"),
        (("Current time: 14:31:02", "Current time: 14:31:02 (your clock is 2 minutes late)"), "2 minutes late"),
    ],
)
def test_legitimate_edits_reach_the_upstream_as_sent(edit: tuple[str, str], seen: str) -> None:
    h = harness("pin")
    second = system(clock="14:31:02", rid=UUID2, used="13,001").replace(*edit)
    first, out = two_turns(h, second)
    text = sys_of(out)
    assert seen in text
    assert out.role == "continuation" and out.record.id == first.record.id
    assert f"Request-Id: {UUID1}" in text  # the fresh values are still pinned
    if "late" in seen:  # a value inside an edited line is part of the edit
        assert "Current time: 14:31:02 (your clock" in text
    else:
        assert "Current time: 14:30:15" in text


def test_a_different_prompt_is_not_learned_from() -> None:
    h = harness("pin")
    first = h.send(chat(system(), U1), reply=R1)
    other = "You summarise conversations. Keep it under 100 words. Time: 14:31:02."
    out = h.send(chat(other, U1, R1, U2))
    assert out.role == "root" and sys_of(out) == other and out.outcome.learned == ()
    assert out.record.id != first.record.id


def test_nothing_is_learned_across_tenants() -> None:
    h = harness("pin")
    h.send(chat(system(), U1), reply=R1)
    out = h.send(chat(system(clock="14:31:02", rid=UUID2), U1, R1, U2), headers={"authorization": "Bearer sk-2"})
    assert out.role == "root" and out.outcome.learned == ()
    assert sys_of(out) == system(clock="14:31:02", rid=UUID2)


def test_a_session_with_the_same_messages_keeps_its_own_values() -> None:
    # Two sessions of one tenant ask the same thing and get the same reply: their
    # histories are equal; each continues its own lineage (its workspace differs).
    h = harness("pin")
    ws_b = "0f0e0d0c0b0a"
    a1 = h.send(chat(system(), U1), reply=R1)
    b1 = h.send(chat(system(clock="14:30:40", rid=UUID3, ws=ws_b), U1), reply=R1)
    a2 = h.send(chat(system(clock="14:31:02", rid=UUID2), U1, R1, U2), reply=R2)
    b2 = h.send(chat(system(clock="14:31:30", rid="1" * 8 + UUID2[8:], ws=ws_b), U1, R1, U2))
    assert a2.record.id == a1.record.id and b2.record.id == b1.record.id
    assert sys_of(a2) == system()
    assert sys_of(b2) == system(clock="14:30:40", rid=UUID3, ws=ws_b)


def test_two_sessions_it_cannot_tell_apart_are_neither_continued() -> None:
    # Same messages, no per-session value, no recorded reply: the request could be
    # either session's; it learns, but pins nothing another session sent.
    h = harness("pin")
    h.send(chat(system(), U1))
    h.send(chat(system(clock="14:30:40", rid=UUID3), U1))
    out = h.send(chat(system(clock="14:31:02", rid=UUID2), U1, R1, U2))
    assert out.role == "root" and sys_of(out) == system(clock="14:31:02", rid=UUID2)
    assert [s.cls for s in out.outcome.learned] == ["time", "uuid"]


def test_a_midnight_date_is_pinned_and_told_once() -> None:
    h = harness("pin")

    def prompt(date: str, clock: str) -> str:
        return f"You are Atlas.\nDate: {date}\nTime: {clock}\n\n{GUIDE}"

    h.send(chat(prompt("2026-05-14", "23:59:40"), U1), reply=R1)
    out = h.send(chat(prompt("2026-05-15", "00:00:20"), U1, R1, U2), reply=R2)
    assert sys_of(out) == prompt("2026-05-14", "23:59:40")
    assert out.rewrites == ["learned.date", "learned.time"]
    assert out.body["messages"][-1]["content"] == (
        "Strip it, then.\n\n(Note: the current date is now 2026-05-15.)\n\n(Note: the current time is now 00:00:20.)"
    )
    again = h.send(chat(prompt("2026-05-15", "00:01:05"), U1, R1, U2, R2, U3))
    assert again.body["messages"][-1]["content"] == "Thanks.\n\n(Note: the current time is now 00:01:05.)"


def test_a_continuation_by_session_header_learns_too() -> None:
    # Claude Code names its session in a header: the request continues by identity,
    # and the spans its system text changed are learned.
    h = harness("pin")
    head = {**KEY, "x-claude-code-session-id": "s-1"}
    h.send(chat(system(), U1), headers=head)
    out = h.send(chat(system(clock="14:31:02", rid=UUID2), U1, R1, U2), headers=head)
    assert out.role == "continuation" and sys_of(out) == system()


def test_learn_off_learns_nothing() -> None:
    _, out = two_turns(harness("off"), system(clock="14:31:02", rid=UUID2))
    assert out.role == "root" and out.outcome.learned == () and sys_of(out) == system(clock="14:31:02", rid=UUID2)


# -- the other wire APIs, and tool descriptions ------------------------------------------------------
def _messages(text: str, *history: dict[str, Any]) -> dict[str, Any]:
    head, _, rest = text.partition("\n")
    return {
        "model": "m",
        "system": [{"type": "text", "text": head}, {"type": "text", "text": rest}],
        "messages": list(history),
    }


def _responses(text: str, *history: dict[str, Any]) -> dict[str, Any]:
    items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in history]
    return {"model": "m", "instructions": text, "input": items, "store": False}


def _texts(exchange: Exchange, out: Sent) -> list[str]:
    return [s.get() for s in exchange.system_slots(out.body)]


MESSAGES_R1 = {"role": "assistant", "content": [{"type": "text", "text": "The CSV had a BOM."}]}
RESPONSES_R1 = {"type": "message", "role": "assistant", "content": "The CSV had a BOM."}


@pytest.mark.parametrize(
    ("exchange", "make", "reply", "replayed"),
    [
        (CHAT, chat, R1, R1),
        (MESSAGES, _messages, MESSAGES_R1, MESSAGES_R1),
        (RESPONSES, _responses, {"role": "assistant", "output": [RESPONSES_R1]}, R1),
    ],
)
def test_every_wire_api_pins(exchange: Exchange, make: Any, reply: dict[str, Any], replayed: dict[str, Any]) -> None:
    h = harness("pin")
    first = h.send(make(system(), U1), exchange=exchange, reply=reply)
    out = h.send(make(system(clock="14:31:02", rid=UUID2), U1, replayed, U2), exchange=exchange)
    assert out.role == "continuation" and out.record.id == first.record.id
    assert _texts(exchange, out) == _texts(exchange, first)
    assert "learned.uuid" in out.rewrites


def test_tool_descriptions_are_pinned_when_they_only_differ_by_values() -> None:
    def tools(date: str) -> list[dict[str, Any]]:
        desc = f"Search the web. Results are as of {date}."
        return [
            {"type": "function", "function": {"name": "web", "description": desc, "parameters": {"type": "object"}}}
        ]

    h = harness("pin")
    first = h.send({**chat(system(), U1), "tools": tools("2026-05-14")}, reply=R1)
    out = h.send({**chat(system(), U1, R1, U2), "tools": tools("2026-05-15")})
    assert out.role == "continuation"
    assert out.body["tools"] == tools("2026-05-14") and out.record.tools_ref == first.record.tools_ref
    assert "learned.date" in out.rewrites
    assert [s.scope for s in out.outcome.learned] == ["tools"]


def test_the_system_text_and_the_tool_descriptions_share_one_budget() -> None:
    # A request tokenizes at most textdiff.MAX_TOKENIZED characters of what changed: here
    # as many dated tool descriptions as that holds.  Past it a description's change is
    # "other", unexamined, and tools[] reaches the upstream as sent.
    def tools(date: str) -> list[dict[str, Any]]:
        return [
            {"type": "function", "function": {"name": f"t{i:04d}", "description": f"Tool {i:04d}, as of {date}."}}
            for i in range(many)
        ]

    each = 2 * len("Tool 0000, as of 2026-05-14.")  # a description's changed part, both sides
    many = textdiff.MAX_TOKENIZED // each
    assert textdiff.MAX_TOKENIZED - many * each < 2 * len("Current time: 14:30:15\n")  # a clock's line: past it
    for clock, pinned in (("14:30:15", True), ("14:31:02", False)):  # a changed line in the system text first
        h = harness("pin")
        h.send({**chat(system(), U1), "tools": tools("2026-05-14")}, reply=R1)
        out = h.send({**chat(system(clock=clock), U1, R1, U2), "tools": tools("2026-05-15")})
        assert out.role == "continuation"
        assert (out.body["tools"] == tools("2026-05-14")) is pinned
        assert ("other" in [s.cls for s in out.outcome.learned]) is not pinned


def test_a_fork_whose_head_differs_only_by_fresh_values_is_repaired_as_forks_are() -> None:
    def prompt(clock: str) -> str:
        return f"Current time: {clock}\nYou are Atlas.\n{GUIDE}"

    tools = [
        {"type": "function", "function": {"name": n, "description": n, "parameters": {"type": "object"}}}
        for n in ("read", "write", "memory")
    ]
    review = {"role": "user", "content": "Review the conversation and save what matters."}
    for mode, role in (("suggest", "root"), ("pin", "fork")):
        h = harness(mode)
        h.send({**chat(prompt("10:00:00"), U1), "tools": tools}, reply=R1)
        out = h.send({**chat(prompt("10:00:30"), U1, R1, review), "tools": tools[2:]})
        assert out.role == role
        if role == "fork":
            assert out.fork_action == "repaired" and sys_of(out) == prompt("10:00:00")
            assert out.body["tools"] == tools


def test_a_request_naming_its_previous_response_learns_its_changed_instructions() -> None:
    h = harness("pin")
    item = {"type": "message", "role": "assistant", "content": "The CSV had a BOM."}
    first = h.send(
        {"model": "m", "instructions": system(), "input": "The import failed. Why?"},
        exchange=RESPONSES,
        reply={"role": "assistant", "output": [item], "id": "resp_1"},
    )
    out = h.send(
        {
            "model": "m",
            "instructions": system(clock="14:31:02", rid=UUID2),
            "input": "Strip it.",
            "previous_response_id": "resp_1",
        },
        exchange=RESPONSES,
    )
    assert out.role == "continuation" and out.record.id == first.record.id
    assert out.body["instructions"] == system()
    assert out.body["input"] == "Strip it.\n\n(Note: the current time is now 14:31:02.)"


def test_a_side_request_no_signal_told_leaves_the_parents_next_turn_its_lineage() -> None:
    # An agent's background "review" request replays the conversation with fresh values
    # and no fork signal: it continues the lineage (it is that conversation); the next
    # turn, which does not replay the review, still does.
    h = harness("pin")
    first = h.send(chat(system(), U1), reply=R1)
    review = h.send(chat(system(clock="14:31:00", rid=UUID2), U1, R1, {"role": "user", "content": "Review this."}))
    assert review.role == "continuation" and sys_of(review) == system()
    out = h.send(chat(system(clock="14:31:30", rid=UUID3), U1, R1, U2))
    assert out.role == "continuation" and out.record.id == first.record.id and sys_of(out) == system()


def test_a_lineage_of_another_wire_api_with_the_same_messages_is_never_learned_from() -> None:
    # Equal messages hash to equal links whatever the API: three other sessions, one of
    # them on /v1/messages, own the same first turn; the request continues its own.
    h = harness("pin")
    mine = h.send(chat(system(), U1), reply=R1)
    for clock, ws in (("14:30:20", "0f0e0d0c0b0a"), ("14:30:25", "1f1e1d1c1b1a")):
        h.send(chat(system(clock=clock, rid=UUID3, ws=ws), U1), reply=R1)
    h.send(_messages(system(clock="14:30:30", rid=UUID3), U1), exchange=MESSAGES, reply=R1)
    out = h.send(chat(system(clock="14:31:02", rid=UUID2), U1, R1, U2))
    assert out.role == "continuation" and out.record.id == mine.record.id and sys_of(out) == system()


# -- evidence: a number changed once is an edit --------------------------------------------------
def _rules(limit: str, words: str, clock: str = "14:30:15") -> str:
    return (
        f"You are Atlas.\nCurrent time: {clock}\nNever make more than {limit} tool calls.\n"
        f"Answer in under {words} words.\n\n{GUIDE}"
    )


def test_a_number_changed_once_reaches_the_upstream_as_sent() -> None:
    h = harness("pin")
    h.send(chat(_rules("3", "200"), U1), reply=R1)
    out = h.send(chat(_rules("30", "50", clock="14:31:02"), U1, R1, U2), reply=R2)
    assert out.role == "continuation"
    assert sys_of(out) == _rules("30", "50")  # the edits as sent, the clock pinned
    assert "learned.counter" not in out.rewrites
    # Kept: the next turn sends what was forwarded, nothing changes there.
    again = h.send(chat(_rules("30", "50", clock="14:32:00"), U1, R1, U2, R2, U3))
    assert sys_of(again) == _rules("30", "50")


def test_the_same_edit_in_another_session_is_still_one_change() -> None:
    # An operator's edit every session of the tenant picks up: the same change twice.
    h = harness("pin")
    a, b = {"role": "user", "content": "Session A."}, {"role": "user", "content": "Session B."}
    h.send(chat(_rules("3", "200"), a), reply=R1)
    h.send(chat(_rules("3", "200", clock="14:30:20"), b), reply=R1)
    h.send(chat(_rules("30", "200", clock="14:31:00"), a, R1, U2))
    out = h.send(chat(_rules("30", "200", clock="14:31:05"), b, R1, U2))
    assert "Never make more than 30 tool calls" in sys_of(out)


def test_a_line_seen_changing_twice_is_a_counter() -> None:
    h = harness("pin")
    h.send(chat(system(used="12,345"), U1), reply=R1)
    second = h.send(chat(system(used="13,001"), U1, R1, U2), reply=R2)
    assert sys_of(second) == system(used="13,001")
    third = h.send(chat(system(used="14,200"), U1, R1, U2, R2, U3))
    assert sys_of(third) == system(used="13,001") and "learned.counter" in third.rewrites


def test_evidence_is_the_tenants_own() -> None:
    # Tenant 1's counter line changed twice (a counter now); tenant 2's first change on
    # the very same line is still one change: forwarded as sent.
    h = harness("pin")
    h.send(chat(system(used="12,345"), U1), reply=R1)
    h.send(chat(system(used="13,001"), U1, R1, U2), reply=R2)
    assert "learned.counter" in h.send(chat(system(used="14,200"), U1, R1, U2, R2, U3)).rewrites
    other = {"authorization": "Bearer sk-2"}
    h.send(chat(system(used="12,345"), U1), reply=R1, headers=other)
    out = h.send(chat(system(used="13,001"), U1, R1, U2), headers=other)
    assert out.role == "continuation" and sys_of(out) == system(used="13,001")
    assert "learned.counter" not in out.rewrites


def test_the_date_note_stays_on_its_message_when_the_agent_lays_its_history_out_anew() -> None:
    # An agent that re-lays its history (aider puts its files message after the restored
    # turns): the note moves with the message it was added to, and says that request's date.
    h = harness("pin")

    def prompt(date: str) -> str:
        return f"You are Atlas.\n- Current date: {date}\n\n{GUIDE}"

    files = {"role": "user", "content": "I have added these files to the chat: app.py"}
    h.send(chat(prompt("2026-05-14"), U1), reply=R1)
    second = h.send(chat(prompt("2026-05-15"), U1, R1, U2), reply=R2)
    note = "\n\n(Note: the current date is now 2026-05-15.)"
    assert second.body["messages"][3]["content"] == "Strip it, then." + note
    third = h.send(chat(prompt("2026-05-15"), U1, R1, files, U2, R2, U3))
    messages = third.body["messages"]
    assert messages[3] == files and messages[4]["content"] == "Strip it, then." + note
    assert messages[-1]["content"] == "Thanks."
    assert sys_of(third) == prompt("2026-05-14")
