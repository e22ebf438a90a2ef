"""The built-in rule packs, on the real volatile strings agents send
(shared/agents/volatile.json), embedded in realistic system prompts."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import orjson
import pytest

from canonicalize import (
    CHAT,
    PACKS,
    Canonicalizer,
    JsonDoc,
    Prepared,
    Rule,
    RuleError,
    Settings,
    analysis,
    compile_rule,
    rules,
)
from canonicalize.packs import Pack
from tests.flows import Harness, Sent

SEP = "═" * 46


def rule(pack: str, name: str) -> Rule:
    found = [r for r in PACKS[pack].rules if r.name == name]
    assert len(found) == 1, name
    return found[0]


def spans(r: Rule, text: str) -> list[str]:
    return [text[s:e] for s, e in r.spans(text)]


def static(pack: Pack, text: str) -> str:
    for r in pack.rules:
        text = r.apply(text)
    return text


# -- realistic system prompts ----------------------------------------------------
def hermes_system(
    *,
    memory: str = "[49% — 1,085/2,200 chars]",
    profile: str = "[12% — 170/1,375 chars]",
    started: str = "Thursday, May 14, 2026 02:30 PM",
    session: str = "20260513_204511_d02a5d",
) -> str:
    return (
        "You are Hermes Agent, an intelligent AI assistant created by Nous Research.\n"
        "You are helpful, knowledgeable, and direct.\n\n"
        "You have persistent memory across sessions. Save durable facts using the memory tool.\n\n"
        f"{SEP}\nMEMORY (your personal notes) {memory}\n{SEP}\n"
        "User prefers ruff over black\n§\nProject targets Python 3.11; CI runs on 2026-05-01 14:00 UTC\n\n"
        f"{SEP}\nUSER PROFILE (who the user is) {profile}\n{SEP}\n"
        "Name: Alice. Timezone America/New_York.\n\n"
        "## Skills (mandatory)\n"
        "<available_skills>\n  productivity:\n"
        "    - maps: Geocode, POIs, routes, timezones via OpenStreetMap/OSRM.\n"
        "</available_skills>\n\n"
        f"Conversation started: {started}\n"
        f"Session ID: {session}\n"
        "Model: anthropic/claude-opus-4.6\nProvider: openrouter\nPlatform: cli"
    )


CLAUDE_SYSTEM0 = "x-anthropic-billing-header: cc_version=2.1.117.48f; cc_entrypoint=cli; cch=71fea;"
CLAUDE_SYSTEM = (
    "You are Claude Code, Anthropic's official CLI for Claude.\n"
    "You can use the following tools without requiring user approval: Bash(git add:*), Bash(git commit:*)\n\n"
    "<env>\nWorking directory: /home/u/proj\nIs directory a git repo: Yes\nPlatform: linux\n"
    "Today's date: 2026-08-03\n</env>\n"
    "You are powered by the model named Opus 4.1."
)


def opencode_system(date: str = "Thu Jan 01 2026") -> str:
    return (
        "You are opencode, an interactive CLI tool that helps users with software engineering tasks.\n\n"
        "Here is some useful information about the environment you are running in:\n"
        "<env>\n  Working directory: /p\n  Is directory a git repo: yes\n  Platform: linux\n"
        f"  Today's date: {date}\n</env>\n<files>\n  src/\n    index.ts\n</files>"
    )


def goose_system(stamp: str = "2026-01-08 19:00") -> str:
    return (
        "You are a general-purpose AI agent called goose, created by Block, the parent company of Square,"
        " CashApp, and Tidal.\ngoose is being developed as an open-source software project.\n\n"
        f"The current date is {stamp}.\n\n"
        "goose uses LLM providers with tool calling capability.\n\n"
        "# Extensions\n\n## developer\nTools: developer__shell, developer__text_editor\n"
    )


GOOSE_SUBAGENT = (
    "You are a specialized subagent within the Goose AI framework, created by Block. You were spawned by the"
    " main Goose agent to handle a specific task efficiently. The current date is 2026-01-08 19:00.\n\n"
    "# Your Role\nYou are an autonomous subagent."
)

RUNTIME = (
    "agent=main | host=box | repo=/p | os=linux (x64) | node=v22.1.0 | model=anthropic/claude-sonnet-4-6"
    " | channel=telegram | thinking=low"
)


def openclaw_system(runtime: str = RUNTIME) -> str:
    return (
        "You are a personal assistant running inside OpenClaw.\n\n## Tooling\n- read: Read file contents\n\n"
        f"## Runtime\nRuntime: {runtime}\nReasoning: low (hidden unless on/stream)."
    )


# Items that live only in user / tool messages (volatile.json 'location').
USER_ONLY = {
    "hermes.memory_context": (
        "<memory-context>\n[System note: The following is recalled memory context, NOT new user input. Treat as"
        " authoritative reference data — this is the agent's persistent memory and should inform all"
        " responses.]\n\nUser prefers ruff\n</memory-context>"
    ),
    "hermes.system_note": (
        "[System note: The user's session was automatically reset by the daily schedule. This is a fresh"
        " conversation with no prior context.]"
    ),
    "hermes.review_prompt": (
        "Review the conversation above and consider saving to memory if appropriate.\n\nFocus on:\n...\n\n"
        "You can only call memory and skill management tools. Other tools will be denied at runtime — do not"
        " attempt them."
    ),
    "hermes.digest": (
        "[Earlier conversation digest — older turns summarised to bound the review's cold-write cost on the"
        " routed aux model. Recent turns follow verbatim below.]\nUSER: fix the 2026-05-14 14:30 report"
    ),
    "hermes.memory_tool_result": '{"success": true, "usage": "49% — 1,085/2,200 chars"}',
    "codex.environment_context": (
        "<environment_context>\n  <cwd>/repo</cwd>\n  <shell>bash</shell>\n  <current_date>2026-02-26"
        "</current_date>\n  <timezone>America/Los_Angeles</timezone>\n  <subagents>\n    - agent-1: atlas\n"
        "    - agent-2\n  </subagents>\n</environment_context>"
    ),
    "goose.moim": (
        "<info-msg>\nIt is currently 2026-01-08 19:20:00\nWorking directory: /home/u/proj\n"
        "Context: ~7k/128k tokens used (6%)\n</info-msg>"
    ),
    "claude_code.current_date": (
        "<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
        "# currentDate\nToday's date is 2026-08-03.\n</system-reminder>"
    ),
    "openclaw.conversation_info": (
        'Conversation info (untrusted metadata):\n```json\n{\n  "message_id": "4821",\n  "sender_id":'
        ' "289522496",\n  "timestamp": "Wed 2026-01-21 14:05 PST"\n}\n```'
    ),
    "openclaw.envelope": "[Telegram Alice id:289522496 +5m Wed 2026-01-21 14:05 PST] hello",
}


def chat(system: str | list[Any] | None, *turns: dict[str, Any], **extra: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.extend(turns)
    return {"model": "m", "messages": messages, **extra}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def tool_def(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": f"The {name} tool.", "parameters": {"type": "object"}},
    }


def canon(*packs: str) -> Canonicalizer:
    return Canonicalizer(Settings(packs=packs))


def prepare(c: Canonicalizer, body: dict[str, Any]) -> Prepared:
    """The static pass over ``body`` (as if it arrived as orjson writes it)."""
    return analysis.prepare(c.rules, c.memos, JsonDoc(orjson.dumps(body)), body, CHAT)


def two_turns(c: Canonicalizer, first: dict[str, Any], second: dict[str, Any]) -> tuple[Sent, Sent]:
    """Forward ``first`` (a new root), record the reply ``second`` replays, forward ``second``."""
    h = Harness(c.settings)
    reply = second["messages"][len(first["messages"])]
    assert reply["role"] == "assistant"
    return h.send(first, reply=reply), h.send(second)


# -- the pack registry -----------------------------------------------------------------
def test_every_agent_has_a_pack() -> None:
    assert set(PACKS) == {"generic", "hermes", "claude_code", "opencode", "goose", "openclaw", "codex"}
    for name, pack in PACKS.items():
        assert pack.name == name
        assert all(r.name.startswith(name + ".") for r in pack.rules)


def test_rule_names_are_unique_across_packs() -> None:
    names = [r.name for p in PACKS.values() for r in p.rules]
    assert len(names) == len(set(names))


# -- generic ----------------------------------------------------------------------------
ISO = rule("generic", "generic.iso_datetime")


@pytest.mark.parametrize(
    "value",
    [
        "2026-05-14T14:30:00Z",
        "2026-05-14 14:30",
        "2026-05-14T14:30:00.123+02:00",
        "2026-05-14T14:30",
        "2026-05-14 14:30:59",
        "2026-05-14T14:30:00-0500",
    ],
)
def test_iso_datetime_matches_datetimes(value: str) -> None:
    text = f"You are a bot.\nCurrent time: {value}\nBe brief."
    assert spans(ISO, text) == [value]
    assert ISO.action == "pin" and ISO.scope == "system" and not ISO.identity


@pytest.mark.parametrize(
    "text",
    [
        "Today is 2026-05-14.",
        "pkg==1.2026-05-14 is pinned",
        "release 1.2026-05-14",
        "build 20260514T1430",
        "id 12026-05-14 14:30",
        "range 2025-2026-05-14 14:30",
        "clock 14:30:00 only",
    ],
)
def test_iso_datetime_ignores_dates_versions_and_times(text: str) -> None:
    assert spans(ISO, text) == []


def test_iso_datetime_anchors_find_what_the_pattern_finds() -> None:
    """The anchored scan (the pattern tried where "-0"/"-1" says a match may start)
    gives exactly ``finditer``'s spans, overlaps and Unicode digits included."""
    import random

    plain = dataclasses.replace(ISO, anchor=None, anchor_at=0)
    rnd = random.Random(15)
    alphabet = "0123456789--:: TZ+.\n\u0663x"
    seeds = [
        "2026-05-14T14:30:00Z 2026-05-14 14:30",
        "12026-05-14 14:30 2026-05-14T14:30:00-0500-01-01 10:00",
        "\u0662\u0660\u0662\u0666-05-14 14:30",  # Arabic-Indic digits are \\d too
        "2026-01-012026-01-01 10:00:00.5+01:00:00",
    ]
    texts = seeds + ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 80))) for _ in range(3000)]
    for t in texts:
        assert ISO.spans(t) == plain.spans(t), t
    assert all(ISO.spans(t) for t in seeds[:3])


@pytest.mark.parametrize("short", [0, rules.SHORT], ids=["seek-always", "seek-past-short"])
@pytest.mark.parametrize("name", ["hermes.memory_usage", "hermes.conversation_started", "hermes.session_id"])
def test_seek_finds_and_rewrites_what_the_pattern_does(name: str, short: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trying the pattern only at the ``seek`` places gives ``finditer``'s spans and
    ``pattern.sub``'s text (a static rule), whatever comes before, between and after;
    with ``short`` 0 on every text, else on those of :data:`rules.SHORT` or more."""
    import random

    monkeypatch.setattr(rules, "SHORT", short)
    r = rule("hermes", name)
    assert r.seek
    plain = dataclasses.replace(r, seek=())
    rnd = random.Random(15)
    pieces = [
        "MEMORY (your personal notes) [49% — 1,085/2,200 chars]",
        "USER PROFILE (who the user is) [7% — 90/1,375 chars]",
        "MEMORY (your personal notes)",
        " [12% — 1/2 chars]",
        "MEMORY (your personal notes) [",
        "USER PROFILE (who the user is) [1% — 1/2 chars]\nMEMORY (your personal notes) [1% — 1/2 chars]",
        "Conversation started: Thursday, May 14, 2026 02:30 PM",
        "Conversation started: ",
        "Session ID: 20260513_204511_d02a5d",
        "Session ID: 2026",
        "x Session ID: 20260513_204511_d02a5d",
        "\n",
        "\n",
        "text",
        "═" * 3,
    ]
    found = 0
    for _ in range(2000):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 12)))
        assert r.spans(text) == plain.spans(text), text
        assert r.apply(text) == plain.apply(text), text
        found += bool(plain.spans(text))
    assert found > 30


def test_a_rule_anchor_is_never_empty_and_sits_at_an_offset() -> None:
    with pytest.raises(RuleError):
        compile_rule("x", r"\d+", "pin", anchor="1?")
    with pytest.raises(RuleError):
        compile_rule("x", r"\d+", "pin", anchor="1", anchor_at=-1)
    with pytest.raises(RuleError):
        compile_rule("x", r"\d+", "pin", seek=(("", 0),))
    with pytest.raises(RuleError):
        compile_rule("x", r"\d+", "pin", anchor="1", seek=(("1", 0),))


def test_generic_pipeline_pins_a_changed_datetime_back() -> None:
    c = canon("generic")
    sys1 = "You are a bot.\nCurrent time: 2026-05-14T14:30:00Z\n    indented  code 12"
    sys2 = sys1.replace("14:30:00Z", "14:31:07Z")
    prep = prepare(c, chat(sys2, user("hi")))
    assert prep.rewrites == []  # pins only act on a continuation
    assert [s.value for s in prep.spans] == ["2026-05-14T14:31:07Z"]
    _, out2 = two_turns(c, chat(sys1, user("hi")), chat(sys2, user("hi"), assistant("yo"), user("more")))
    assert out2.role == "continuation"
    assert out2.body["messages"][0]["content"] == sys1
    assert "generic.iso_datetime" in out2.rewrites


def test_generic_never_sorts_tool_parameter_keys() -> None:
    c = canon("generic")
    tool = {
        "type": "function",
        "function": {
            "name": "t",
            "parameters": {"type": "object", "required": ["b"], "properties": {"b": {}, "a": {}}},
        },
    }
    prep = prepare(c, chat("sys", user("hi"), tools=[tool]))
    assert prep.rewrites == []
    assert list(prep.body["tools"][0]["function"]["parameters"]["properties"]) == ["b", "a"]


# -- hermes -----------------------------------------------------------------------------
def test_hermes_strips_memory_and_profile_counters_only() -> None:
    text = hermes_system()
    out = rule("hermes", "hermes.memory_usage").apply(text)
    expected = text.replace(" [49% — 1,085/2,200 chars]", "").replace(" [12% — 170/1,375 chars]", "")
    assert out == expected
    assert f"{SEP}\nMEMORY (your personal notes)\n{SEP}\n" in out
    assert f"{SEP}\nUSER PROFILE (who the user is)\n{SEP}\n" in out
    assert out.count(SEP) == 4


@pytest.mark.parametrize("counter", ["[0% — 0/2,200 chars]", "[100% — 2,200/2,200 chars]", "[7% — 99/1,375 chars]"])
def test_hermes_memory_counter_variants(counter: str) -> None:
    text = hermes_system(memory=counter, profile=counter)
    assert "MEMORY (your personal notes)\n" in static(PACKS["hermes"], text)
    assert static(PACKS["hermes"], text) == static(PACKS["hermes"], hermes_system())


def test_hermes_counter_rule_needs_its_header() -> None:
    r = rule("hermes", "hermes.memory_usage")
    for text in (
        "NOTES [49% — 1,085/2,200 chars]",
        "MEMORY (your personal notes) [49% — 1,085/2,200 chars] extra",
        '"usage": "49% — 1,085/2,200 chars"',
    ):
        assert r.apply(text) == text


@pytest.mark.parametrize(
    "started",
    ["Thursday, May 14, 2026 02:30 PM", "Thursday, May 14, 2026 (America/New_York, EDT, UTC-04:00)"],
)
def test_hermes_conversation_started_pin(started: str) -> None:
    text = hermes_system(started=started)
    assert spans(rule("hermes", "hermes.conversation_started"), text) == [started]


def test_hermes_session_id_pin_names_the_session() -> None:
    r = rule("hermes", "hermes.session_id")
    assert r.identity and r.action == "pin"
    assert spans(r, hermes_system()) == ["20260513_204511_d02a5d"]
    assert spans(r, hermes_system(session="20260513_204511_d02a5d0f")) == ["20260513_204511_d02a5d0f"]
    assert spans(r, "Session ID: not-a-hermes-id") == []


# The three review prompts of hermes-agent's background review (shared/seeds/003),
# with the denial suffix the fork appends.
_SUFFIX = (
    "\n\nYou can only call memory and skill management tools. Other tools will be denied at runtime — do not"
    " attempt them."
)
REVIEW_PROMPTS = [
    "Review the conversation above and consider saving to memory if appropriate.\n\nFocus on:\n1. Has the"
    " user revealed things about themselves — their persona, desires, preferences, or personal details worth"
    " remembering?" + _SUFFIX,
    "Review the conversation above and update the skill library. Be ACTIVE — most sessions produce at least"
    " one skill update, even if small. A pass that does nothing is a missed learning opportunity, not a"
    " neutral outcome." + _SUFFIX,
    "Review the conversation above and update two things:\n\n**Memory**: who the user is. Did the user reveal"
    " persona, desires, preferences, personal details, or expectations about how you should behave?" + _SUFFIX,
    # older wordings listed in volatile.json
    "Review the conversation above and consider saving or updating a skill if appropriate.",
    "Review the conversation above and consider two things:",
]


@pytest.mark.parametrize("prompt", REVIEW_PROMPTS)
def test_hermes_markers_match_review_prompts(prompt: str) -> None:
    assert any(m.search(prompt) for m in PACKS["hermes"].markers)


@pytest.mark.parametrize(
    "text",
    [
        "Can you review the conversation above and summarise it?",
        "review the conversation above and consider saving to memory",
        "Please: Review the conversation above and consider saving to memory if appropriate.",
        "Review the conversation above and tell me what went wrong.",
        "Review the code above and update the skill library",
        "I said earlier:\nReview the conversation above and update two things",
        "",
    ],
)
def test_hermes_markers_ignore_ordinary_user_text(text: str) -> None:
    assert not any(m.search(text) for m in PACKS["hermes"].markers)


def test_hermes_pipeline_static_pass() -> None:
    c = canon("generic", "hermes")
    body = chat(hermes_system(), user("hello"))
    prep = prepare(c, body)
    assert prep.rewrites == ["hermes.memory_usage"]
    system = prep.body["messages"][0]["content"]
    assert system == hermes_system().replace(" [49% — 1,085/2,200 chars]", "").replace(" [12% — 170/1,375 chars]", "")
    assert prep.body["messages"][1] == user("hello")
    by_rule = {s.rule.name: s.value for s in prep.spans}
    assert by_rule["hermes.conversation_started"] == "Thursday, May 14, 2026 02:30 PM"
    assert by_rule["hermes.session_id"] == "20260513_204511_d02a5d"
    assert by_rule["generic.iso_datetime"] == "2026-05-01 14:00"
    assert c.fork.markers  # the review markers are part of the fork policy


def test_hermes_pipeline_pins_a_rebuilt_prompt_to_the_first() -> None:
    c = canon("generic", "hermes")
    first = chat(hermes_system(), user("hello"))
    rebuilt = hermes_system(memory="[55% — 1,210/2,200 chars]", started="Thursday, May 14, 2026 03:02 PM")
    second = chat(rebuilt, user("hello"), assistant("hi"), user("again"))
    out1, out2 = two_turns(c, first, second)
    assert out2.role == "continuation"
    assert out2.body["messages"][0]["content"] == out1.body["messages"][0]["content"]
    assert set(out2.rewrites) == {"hermes.memory_usage", "hermes.conversation_started"}


def test_hermes_new_session_is_never_pinned_to_another() -> None:
    c = canon("generic", "hermes")
    first = chat(hermes_system(), user("hello"))
    other = hermes_system(session="20260514_090000_abcdef", started="Thursday, May 14, 2026 09:00 AM")
    _, out2 = two_turns(c, first, chat(other, user("hello"), assistant("hi"), user("again")))
    assert out2.role == "root"
    assert "Conversation started: Thursday, May 14, 2026 09:00 AM" in out2.body["messages"][0]["content"]
    assert "Session ID: 20260514_090000_abcdef" in out2.body["messages"][0]["content"]


# -- claude_code --------------------------------------------------------------------------
def test_claude_code_billing_header_pin() -> None:
    r = rule("claude_code", "claude_code.billing_header")
    assert spans(r, CLAUDE_SYSTEM0) == ["cc_version=2.1.117.48f; cc_entrypoint=cli; cch=71fea;"]
    other = "x-anthropic-billing-header: cc_version=2.1.118.0ab; cc_entrypoint=sdk-ts; cch=0c3d9;"
    assert spans(r, other) == ["cc_version=2.1.118.0ab; cc_entrypoint=sdk-ts; cch=0c3d9;"]
    assert spans(r, "x-anthropic-billing-header: cc_version=2.1.117.48f; cch=71fea;") == []


def test_claude_code_env_date_pin() -> None:
    r = rule("claude_code", "claude_code.env_date")
    assert spans(r, CLAUDE_SYSTEM) == ["2026-08-03"]
    assert spans(r, USER_ONLY["claude_code.current_date"]) == []


def test_claude_code_pipeline() -> None:
    c = canon("generic", "claude_code")
    parts = [{"type": "text", "text": CLAUDE_SYSTEM0}, {"type": "text", "text": CLAUDE_SYSTEM}]
    prep = prepare(c, chat(copy.deepcopy(parts), user("hi")))
    assert prep.rewrites == []
    assert prep.body["messages"][0]["content"] == parts
    assert {s.rule.name: s.value for s in prep.spans} == {
        "claude_code.billing_header": "cc_version=2.1.117.48f; cc_entrypoint=cli; cch=71fea;",
        "claude_code.env_date": "2026-08-03",
    }
    later = copy.deepcopy(parts)
    later[0]["text"] = later[0]["text"].replace("cch=71fea", "cch=9a0b1")
    _, out2 = two_turns(c, chat(copy.deepcopy(parts), user("hi")), chat(later, user("hi"), assistant("a"), user("b")))
    assert out2.role == "continuation"
    assert out2.body["messages"][0]["content"] == parts
    assert out2.rewrites == ["claude_code.billing_header"]


# -- opencode -----------------------------------------------------------------------------
def test_opencode_todays_date_pin() -> None:
    r = rule("opencode", "opencode.todays_date")
    assert spans(r, opencode_system()) == ["Thu Jan 01 2026"]
    assert spans(r, "Today's date: 2026-01-01") == []


def test_opencode_pipeline_midnight_rollover() -> None:
    c = canon("generic", "opencode")
    prep = prepare(c, chat(opencode_system(), user("hi")))
    assert prep.rewrites == []
    assert prep.body["messages"][0]["content"] == opencode_system()
    _, out2 = two_turns(
        c,
        chat(opencode_system(), user("hi")),
        chat(opencode_system("Fri Jan 02 2026"), user("hi"), assistant("a"), user("b")),
    )
    assert out2.role == "continuation"
    assert out2.body["messages"][0]["content"] == opencode_system()
    assert out2.rewrites == ["opencode.todays_date"]
    # The model is told: one line on the newest user message.
    assert out2.body["messages"][-1]["content"] == "b\n\n(Note: the current date is now Fri Jan 02 2026.)"


def test_opencode_date_note_stays_on_its_message() -> None:
    h = Harness(Settings(packs=("generic", "opencode")))
    h.send(chat(opencode_system(), user("hi")), reply=assistant("a"))
    history = [user("hi"), assistant("a"), user("b")]
    second = h.send(chat(opencode_system("Fri Jan 02 2026"), *history), reply=assistant("c"))
    note = "b\n\n(Note: the current date is now Fri Jan 02 2026.)"
    assert second.body["messages"][-1]["content"] == note
    third = h.send(chat(opencode_system("Fri Jan 02 2026"), *history, assistant("c"), user("d")))
    assert third.role == "continuation"
    assert third.body["messages"][0]["content"] == opencode_system()
    assert third.body["messages"][3]["content"] == note  # the same line, at the same message
    assert third.body["messages"][-1]["content"] == "d"  # and no second one
    assert third.raw.startswith(second.raw[: second.raw.index(b'"b\\n\\n')])


# -- goose ---------------------------------------------------------------------------------
@pytest.mark.parametrize("stamp", ["2026-01-08 19:00", "2026-01-08 19:20:00"])
def test_goose_timestamp_pin(stamp: str) -> None:
    r = rule("goose", "goose.timestamp")
    assert spans(r, goose_system(stamp)) == [stamp]
    assert spans(r, f"intro\n{stamp}\nmore") == [stamp]


def test_goose_timestamp_pin_in_subagent_prompt() -> None:
    assert spans(rule("goose", "goose.timestamp"), GOOSE_SUBAGENT) == ["2026-01-08 19:00"]


def test_goose_timestamp_ignores_other_lines() -> None:
    r = rule("goose", "goose.timestamp")
    assert spans(r, "Deadline 2026-01-08 19:00 sharp") == []
    assert spans(r, USER_ONLY["goose.moim"]) == []


def test_goose_pipeline_hourly_stamp() -> None:
    c = canon("goose")
    _, out2 = two_turns(
        c,
        chat(goose_system(), user("hi")),
        chat(goose_system("2026-01-08 20:00"), user("hi"), assistant("a"), user("b")),
    )
    assert out2.role == "continuation"
    assert out2.body["messages"][0]["content"] == goose_system()
    assert out2.rewrites == ["goose.timestamp"]


# -- openclaw ------------------------------------------------------------------------------
def test_openclaw_runtime_pin() -> None:
    r = rule("openclaw", "openclaw.runtime")
    assert spans(r, openclaw_system()) == [RUNTIME]
    assert spans(r, "Runtime: agent=main") == ["agent=main"]
    assert spans(r, "Runtime: fast") == []
    assert spans(r, "Runtime: agent=main |") == []


def test_openclaw_runtime_pin_is_linear_on_a_line_that_does_not_match() -> None:
    # A nested quantifier here backtracked exponentially (a minute for 25 pairs).
    r = rule("openclaw", "openclaw.runtime")
    assert r.spans("Runtime: " + "a=a" * 5000 + "\x00|x") == []
    assert r.spans("Runtime: " + "a=b | " * 5000 + "|") == []


def test_openclaw_pipeline_heartbeat_turn() -> None:
    c = canon("generic", "openclaw")
    heartbeat = RUNTIME.replace("channel=telegram", "channel=heartbeat")
    _, out2 = two_turns(
        c,
        chat(openclaw_system(), user("hi")),
        chat(openclaw_system(heartbeat), user("hi"), assistant("a"), user("b")),
    )
    assert out2.role == "continuation"
    assert out2.body["messages"][0]["content"] == openclaw_system()
    assert out2.rewrites == ["openclaw.runtime"]


# -- codex ---------------------------------------------------------------------------------
def test_codex_pack_inherits_prompt_cache_key() -> None:
    assert PACKS["codex"].rules == ()
    assert "prompt_cache_key" in PACKS["codex"].inherit_params
    assert "prompt_cache_key" in canon("codex").fork.inherit_params
    assert "prompt_cache_key" not in canon("generic").fork.inherit_params


def test_codex_fork_forwards_the_parents_prompt_cache_key() -> None:
    store = Harness(Settings(packs=("generic", "codex")))
    tools = [tool_def("shell"), tool_def("apply_patch"), tool_def("spawn_agent")]
    system = "You are Codex, based on GPT-5."
    history = [user(USER_ONLY["codex.environment_context"]), user("fix the bug")]
    key = "019de48f-2c1a-7b3e-9f00-5a1b2c3d4e5f"
    parent = store.send(chat(system, *history, tools=tools, prompt_cache_key=key), reply=assistant("done"))
    assert parent.role == "root"
    assert parent.record.params.get("prompt_cache_key") == orjson.dumps(key).decode()

    # A side chat replays the thread with a narrower toolset and a fresh key.
    fork = chat(
        system,
        *history,
        assistant("done"),
        user("side question"),
        tools=tools[:2],
        prompt_cache_key="019de490-0000-7000-8000-000000000001",
    )
    out = store.send(fork)
    assert out.role == "fork"
    assert out.body["prompt_cache_key"] == key
    assert out.body["tools"] == tools
    assert "fork.params" in out.rewrites
    assert out.offered == frozenset({"shell", "apply_patch"})


# -- what no pack may touch ------------------------------------------------------------------
@pytest.mark.parametrize("item", sorted(USER_ONLY))
def test_no_pack_rewrites_user_message_items(item: str) -> None:
    text = USER_ONLY[item]
    for pack in PACKS.values():
        for r in pack.rules:
            assert r.scope != "all", r.name  # messages are out of every built-in rule's reach
            assert r.apply(text) == text, r.name


def test_pipeline_leaves_user_and_tool_messages_byte_identical() -> None:
    c = canon(*PACKS)
    turns: list[dict[str, Any]] = [user(v) for v in USER_ONLY.values()]
    turns.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "memory", "arguments": '{"a":1}'}}],
        }
    )
    turns.append({"role": "tool", "tool_call_id": "c1", "content": USER_ONLY["hermes.memory_tool_result"]})
    body = chat(hermes_system(), *turns)
    before = orjson.dumps(body["messages"][1:])
    prep = prepare(c, body)
    assert orjson.dumps(prep.body["messages"][1:]) == before
    assert prep.rewrites == ["hermes.memory_usage"]

    # A later turn with the same system and new user-only values changes nothing either.
    later_user = user(USER_ONLY["goose.moim"].replace("19:20:00", "19:31:00"))
    second = chat(hermes_system(), *copy.deepcopy(turns), assistant("ok"), later_user)
    before2 = orjson.dumps(second["messages"][1:])
    _, out2 = two_turns(c, chat(hermes_system(), *copy.deepcopy(turns)), second)
    assert out2.role == "continuation"
    assert orjson.dumps(out2.body["messages"][1:]) == before2


@pytest.mark.parametrize("name", sorted(PACKS))
def test_every_pack_leaves_an_unrelated_prompt_alone(name: str) -> None:
    system = (
        "You are a coding assistant.\n\n    def f(x):\n        return x  *  2   # 1,085/2,200\n"
        "Version 1.2.3 released\tTuesday.\n"
    )
    prep = prepare(canon(name), chat(system, user("hi")))
    assert prep.rewrites == []
    assert prep.spans == []
    assert prep.body["messages"][0]["content"] == system
