"""canonicalize.recall through the request flow: an agent drops a block (a reminder) from
a message it sent before; with ``learn: pin`` the lineage forwards the message as it
recorded it (``learned.history``), byte for byte, and nothing else of the history."""

from __future__ import annotations

from typing import Any

import orjson

from canonicalize import JsonDoc, Settings, recall, textdiff
from canonicalize.ruleset import LearnMode
from tests.flows import Harness, Sent

SYSTEM = {"role": "system", "content": "You are Quill, a coding agent. Work in small steps."}
REMINDER = "<system-reminder>\nThe current date is: Friday, November 27, 2026.\n</system-reminder>"
SKILLS = "<system-reminder>\nSkills: batch, review, test.\n</system-reminder>"
FORMAT = "\n\n# Reply format\nAnswer with the whole file, in one fenced block.\nReply in English."


def parts(*texts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": t} for t in texts]


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def reply(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def chat(*messages: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [SYSTEM, *messages], "stream": False}


def harness(mode: LearnMode = "pin") -> Harness:
    return Harness(Settings(learn=mode))


def item(out: Sent, i: int) -> bytes:
    span = JsonDoc(out.raw).span(("messages", i))
    assert span is not None
    return out.raw[span[0] : span[1]]


def test_a_reminder_part_dropped_from_the_first_message_is_forwarded_as_recorded() -> None:
    h = harness()
    first = h.send(chat(user(parts(SKILLS, REMINDER, "What does app.py do?"))), reply=reply("It greets."))
    later = user(parts(REMINDER, "Make it casual."))
    second = h.send(chat(user(parts(SKILLS, "What does app.py do?")), reply("It greets."), later), reply=reply("Ok."))
    assert second.role == "continuation" and second.record.id == first.record.id
    assert item(second, 1) == item(first, 1)  # the recorded bytes, reminder and all
    assert second.rewrites == ["learned.history"]
    assert second.body["messages"][3] == later  # the newest message as sent
    # The next turn drops the second reminder too: both messages as the lineage forwarded them.
    third = h.send(
        chat(
            user(parts(SKILLS, "What does app.py do?")),
            reply("It greets."),
            user(parts("Make it casual.")),
            reply("Ok."),
            user("Thanks."),
        )
    )
    assert third.role == "continuation" and third.record.id == first.record.id
    assert item(third, 1) == item(first, 1) and item(third, 3) == item(second, 3)
    assert third.raw.startswith(second.raw[: JsonDoc(second.raw).span(("messages", 3))[1]])  # type: ignore[index]


def test_a_reminder_appended_to_the_newest_message_is_kept_in_history() -> None:
    h = harness()
    first = h.send(chat(user("Hi."), reply("Hello."), user("What does app.py do?" + FORMAT)), reply=reply("Greets."))
    second = h.send(chat(user("Hi."), reply("Hello."), user("What does app.py do?"), reply("Greets."), user("Ok.")))
    assert second.role == "continuation" and second.record.id == first.record.id
    assert item(second, 3) == item(first, 3) and "learned.history" in second.rewrites
    assert second.body["messages"][-1] == user("Ok.")


def test_suggest_and_off_forward_every_byte_as_sent() -> None:
    for mode in ("suggest", "off"):
        h = harness(mode)
        h.send(chat(user(parts(SKILLS, REMINDER, "What does app.py do?"))), reply=reply("It greets."))
        body = chat(user(parts(SKILLS, "What does app.py do?")), reply("It greets."), user("Ok."))
        out = h.send(body)
        assert out.raw == orjson.dumps(body) and "learned.history" not in out.rewrites


def test_a_message_edited_otherwise_reaches_the_upstream_as_sent() -> None:
    # A word changed, a value changed, text added: not a block dropped.
    for edited in (
        parts(SKILLS, "What does main.py do?"),
        parts(SKILLS.replace("test", "lint"), "What does app.py do?"),
        parts(SKILLS, REMINDER, "What does app.py do?", "And why?"),
    ):
        h = harness()
        h.send(chat(user(parts(SKILLS, REMINDER, "What does app.py do?"))), reply=reply("It greets."))
        body = chat(user(edited), reply("It greets."), user("Ok."))
        out = h.send(body)
        assert out.raw == orjson.dumps(body) and "learned.history" not in out.rewrites


def test_another_session_with_the_same_first_message_is_not_continued() -> None:
    # Session B sent the same first message (reminder and all) and got another reply: its
    # next request is B's, never A's (the chain with the recorded message is looked up).
    h = harness()
    first = parts(SKILLS, REMINDER, "What does app.py do?")
    a = h.send(chat(user(first)), reply=reply("It greets."))
    b = h.send(chat(user(first)), reply=reply("It prints."))
    out = h.send(chat(user(parts(SKILLS, "What does app.py do?")), reply("It prints."), user("Ok.")))
    assert out.record.id == b.record.id != a.record.id
    assert item(out, 1) == orjson.dumps(user(first))


def test_a_block_is_whole_parts_or_whole_lines() -> None:
    old = user("Fix the parser.\n\n<system-reminder>\nDate: 2026-11-27\n</system-reminder>\nThanks.")
    assert recall.dropped_block(old, user("Fix the parser.\n\nThanks."))  # a tag block, whole lines
    assert recall.dropped_block(user("Fix it." + FORMAT), user("Fix it."))  # lines at the end
    assert not recall.dropped_block(user("Fix the parser now."), user("Fix the parser"))  # not at a line's end
    assert not recall.dropped_block(user("A\n\nB\n\nC"), user("A\n\nC"))  # a paragraph in the middle: an edit
    assert not recall.dropped_block(user(parts("a", "b")), user(parts("b", "a")))  # reordered
    assert not recall.dropped_block(user(parts(REMINDER, "x")), user(parts()))  # nothing of its own left


# -- the messages before the first reply: the agent's environment block --------------------------
def env(day: str, task: str) -> dict[str, Any]:
    startup = (
        "<system-reminder>\nThis is Quill. We are setting up the context for our chat.\n"
        f"Today's date is {day}, November {27 if day == 'Friday' else 28}, 2026.\n"
        "My operating system is: linux\n</system-reminder>"
    )
    return user(parts(startup, task))


def test_a_resumed_session_gets_its_recorded_environment_and_is_told_the_date() -> None:
    h = harness()
    a = h.send(chat(env("Friday", "What does app.py do?")), reply=reply("It greets."))
    h.send(chat(env("Friday", "Fix the tests.")), reply=reply("Fixed."))  # another conversation
    out = h.send(chat(env("Saturday", "What does app.py do?"), reply("It greets."), user("Thanks.")))
    assert out.role == "continuation" and out.record.id == a.record.id
    assert item(out, 1) == item(a, 1)  # the recorded first message: its date pinned
    assert (
        out.body["messages"][-1]["content"] == "Thanks.\n\n(Note: the current date is now Saturday, November 28, 2026.)"
    )
    assert out.rewrites == ["learned.date"]
    assert [(s.cls, s.scope) for s in out.outcome.learned] == [("date", "messages")]
    # The next request of the resumed session: the same, the note where it was.
    again = h.send(
        chat(env("Saturday", "What does app.py do?"), reply("It greets."), user("Thanks."), reply("Ok."), user("Bye."))
    )
    assert again.record.id == a.record.id and item(again, 1) == item(a, 1)
    assert again.body["messages"][3]["content"] == out.body["messages"][3]["content"]


def test_a_line_no_other_conversation_has_is_the_users_and_reaches_the_upstream_as_sent() -> None:
    # The user's own task with a date, changed: no other conversation of the tenant sent
    # that line (a side request replaying this conversation does not count).
    h = harness()
    task = "Ship the release by 2026-05-14. Tell me what is left."
    h.send(chat(user(task)), reply=reply("Two bugs."))
    side = {"role": "system", "content": "You summarise conversations."}
    h.send({"model": "m", "messages": [side, user(task), reply("Two bugs."), user("Summarise.")]}, reply=reply("S."))
    h.send(chat(user("Other work, due 2026-06-01.")), reply=reply("Ok."))
    body = chat(user(task.replace("05-14", "05-15")), reply("Two bugs."), user("And now?"))
    out = h.send(body)
    assert out.raw == orjson.dumps(body) and out.role == "root"


def test_a_single_conversation_gives_no_evidence_of_a_template() -> None:
    h = harness()
    h.send(chat(env("Friday", "What does app.py do?")), reply=reply("It greets."))
    body = chat(env("Saturday", "What does app.py do?"), reply("It greets."), user("Thanks."))
    out = h.send(body)
    assert out.raw == orjson.dumps(body)


def test_restores_are_bounded_per_lineage(monkeypatch: Any) -> None:
    # Past MAX_RESTORES a lineage keeps no new one: that message is forwarded as sent.
    monkeypatch.setattr(recall, "MAX_RESTORES", 1)
    h = harness()
    turns = [user("Hi."), reply("Hello."), user("Next."), reply("Ok."), user("Then."), reply("Done.")]
    h.send(chat(user("Hi."), reply("Hello."), user("Next." + FORMAT)), reply=reply("Ok."))
    second = h.send(chat(*turns[:4], user("Then." + FORMAT)), reply=reply("Done."))
    assert "learned.history" in second.rewrites and len(second.record.restores) == 1
    third = h.send(chat(*turns, user("Last.")))
    assert third.body["messages"][5] == user("Then.") and len(third.record.restores) == 1
    assert item(third, 3) == item(second, 3)  # the kept one still applies


def test_a_root_records_at_most_max_templates_value_lines(monkeypatch: Any) -> None:
    monkeypatch.setattr(recall, "MAX_TEMPLATES", 2)
    lines = "\n".join(f"{name}: due 2026-05-{10 + i}" for i, name in enumerate(("Alpha", "Beta", "Gamma", "Delta")))
    out = harness().send(chat(user(lines)), reply=reply("Ok."))
    stems_and_templates = out.outcome.marks
    assert len(stems_and_templates) == 1 + 2


def test_a_first_messages_values_are_compared_within_one_budget(monkeypatch: Any) -> None:
    # The first message's parts share textdiff.MAX_TOKENIZED characters: past it a changed
    # part is not examined, the message is not the recorded one with fresh values, and it
    # reaches the upstream as sent.
    for budget, learned in ((textdiff.MAX_TOKENIZED, True), (10, False)):
        monkeypatch.setattr(textdiff, "MAX_TOKENIZED", budget)
        h, tenant = harness(), {"authorization": f"Bearer sk-budget-{budget}"}  # (its own tenant: a cluster is shared)
        h.send(chat(env("Friday", "What does app.py do?")), reply=reply("It greets."), headers=tenant)
        h.send(chat(env("Friday", "Fix the tests.")), reply=reply("Fixed."), headers=tenant)
        body = chat(env("Saturday", "What does app.py do?"), reply("It greets."), user("Thanks."))
        out = h.send(body, headers=tenant)
        assert (out.rewrites == ["learned.date"]) is learned
        assert (out.raw == orjson.dumps(body)) is not learned


def test_a_first_message_is_scanned_for_values_up_to_max_scanned(monkeypatch: Any) -> None:
    # A root marks its value lines as templates (and masks them in its stem) within
    # MAX_SCANNED characters of lines that may hold a value; the lines past it are not.
    rows = [f"{name}: due 2026-05-{10 + i}" for i, name in enumerate(("Alpha", "Beta", "Gamma", "Delta"))]
    monkeypatch.setattr(recall, "MAX_SCANNED", 2 * len(rows[0]) + 1)
    out = harness().send(chat(user("\n".join(["No value on this line.", *rows]))), reply=reply("Ok."))
    assert len(out.outcome.marks) == 1 + 2  # its stem, then two template lines
    assert recall.template_link(rows[0]) in out.outcome.marks and recall.template_link(rows[2]) not in out.outcome.marks
