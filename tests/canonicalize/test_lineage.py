"""Lineage, pins and forks through the request flow (offline: the proxy's own addons
and memory store), checked on the bytes that would go upstream."""

from __future__ import annotations

import copy
import re
from typing import Any

import orjson
import pytest

from canonicalize import (
    CHAT,
    ForkPolicy,
    JsonDoc,
    LineageRecord,
    Settings,
    chain,
)
from canonicalize.lineage import home, homed
from canonicalize.predict import predict
from tests import hermes
from tests.flows import Harness, Sent


def system_of(out: Sent) -> str:
    return str(out.body["messages"][0]["content"])


USER1 = {"role": "user", "content": "List the files in the repo."}
REPLY1 = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}}
    ],
}
TOOL1 = {"role": "tool", "tool_call_id": "c1", "content": "README.md\nsetup.py"}
REPLY2 = {"role": "assistant", "content": "There are two files."}


def turn1(**kw: Any) -> dict[str, Any]:
    return hermes.request(hermes.system_prompt(**kw), [USER1], hermes.tools_full())


def turn2(**kw: Any) -> dict[str, Any]:
    return hermes.request(hermes.system_prompt(**kw), [USER1, REPLY1, TOOL1], hermes.tools_full())


def test_memory_counter_is_stripped_statically() -> None:
    h = Harness()
    out = h.send(turn1(pct=49))
    assert out.role == "root"
    assert "hermes.memory_usage" in out.rewrites
    text = system_of(out)
    assert "MEMORY (your personal notes)\n" in text
    assert "USER PROFILE (who the user is)\n" in text
    assert "chars]" not in text


def test_continuation_pins_minute_and_keeps_system_bytes() -> None:
    h = Harness()
    first = h.send(turn1(minute="02:30 PM", pct=49), reply=REPLY1)
    second = h.send(turn2(minute="02:31 PM", pct=50))
    assert second.role == "continuation"
    assert second.record.id == first.record.id
    assert system_of(second) == system_of(first)
    assert "hermes.conversation_started" in second.rewrites
    assert orjson.dumps(second.body["tools"]) == orjson.dumps(first.body["tools"])


def test_unchanged_request_has_no_rewrites() -> None:
    h = Harness(Settings(packs=("hermes",)))
    body = {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, USER1]}
    out = h.send(body)
    assert out.rewrites == []
    assert out.body == body


def test_legacy_review_fork_gets_parent_system_and_tools() -> None:
    h = Harness()
    parent = h.send(turn2(), reply=REPLY2)
    fork_body = hermes.request(
        hermes.system_prompt(minute="02:31 PM", session="20260513_204511_9e319e", skills=hermes.SKILLS_REVIEW),
        [USER1, REPLY1, TOOL1, REPLY2, {"role": "user", "content": hermes.REVIEW_PROMPT}],
        hermes.tools_review(),
    )
    fork = h.send(fork_body, reply={"role": "assistant", "content": "Nothing to save."})
    assert fork.role == "fork"
    assert fork.fork_action == "repaired"
    assert fork.fork_signal == "tools_subset"
    assert system_of(fork) == system_of(parent)
    assert orjson.dumps(fork.body["tools"]) == orjson.dumps(parent.body["tools"])
    assert fork.offered == frozenset(hermes.REVIEW_TOOL_NAMES)
    assert {"fork.system", "fork.tools"} <= set(fork.rewrites)
    # The fork's history is forwarded as sent.
    assert fork.body["messages"][1:] == fork_body["messages"][1:]

    # Its tool loop continues the fork with the same repaired system and tools.
    loop_body = copy.deepcopy(fork_body)
    loop_body["messages"] += [
        {"role": "assistant", "content": "Nothing to save."},
        {"role": "user", "content": "Are you sure?"},
    ]
    loop = h.send(loop_body)
    assert loop.role == "fork"
    assert loop.fork_action == "continued"
    assert loop.record.id == fork.record.id
    assert system_of(loop) == system_of(parent)
    assert loop.offered == frozenset(hermes.REVIEW_TOOL_NAMES)

    # The parent's next turn is still a continuation of the parent.
    nxt = h.send(
        hermes.request(
            hermes.system_prompt(minute="02:33 PM"),
            [USER1, REPLY1, TOOL1, REPLY2, {"role": "user", "content": "thanks"}],
            hermes.tools_full(),
        )
    )
    assert nxt.role == "continuation"
    assert nxt.record.id == parent.record.id


def test_marker_marks_fork_that_kept_full_toolset() -> None:
    h = Harness()
    parent = h.send(turn2(), reply=REPLY2)
    body = hermes.request(
        hermes.system_prompt(minute="02:35 PM", session="20260513_204511_aaaaaa"),
        [USER1, REPLY1, TOOL1, REPLY2, {"role": "user", "content": hermes.REVIEW_PROMPT}],
        hermes.tools_full(),
    )
    fork = h.send(body)
    assert (fork.role, fork.fork_signal) == ("fork", "marker")
    assert system_of(fork) == system_of(parent)


def test_header_declares_fork() -> None:
    h = Harness(Settings(packs=("generic",)))
    body = {"model": "m", "messages": [{"role": "system", "content": "A"}, USER1], "tools": hermes.tools_full()}
    parent = h.send(body, reply=REPLY2)
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": "B"}, USER1, REPLY2, {"role": "user", "content": "summarize"}],
    }
    fork = h.send(body, declared=parent.record.id)
    assert (fork.role, fork.fork_signal) == ("fork", "header")
    assert fork.body["messages"][0]["content"] == "A"
    assert fork.offered == frozenset()


def test_fork_needs_replayed_assistant_and_depth() -> None:
    h = Harness()
    h.send(turn1())
    # Same first user message, narrower tools, but nothing of the parent's reply replayed.
    body = hermes.request(hermes.system_prompt(session="20260513_204511_bbbbbb"), [USER1], hermes.tools_review())
    assert h.send(body).role == "root"


def test_fork_requires_same_system_head() -> None:
    """A summarizer with its own system prompt is not repaired into the agent's."""
    h = Harness()
    h.send(turn2(), reply=REPLY2)
    body = hermes.request(
        "You summarize conversations.", [USER1, REPLY1, TOOL1, REPLY2, {"role": "user", "content": "Summarize."}], []
    )
    out = h.send(body)
    assert out.role == "root"
    assert out.body["messages"][0]["content"] == "You summarize conversations."


def test_fork_disabled() -> None:
    h = Harness(Settings(fork=ForkPolicy(enabled=False)))
    h.send(turn2(), reply=REPLY2)
    body = hermes.request(
        hermes.system_prompt(session="20260513_204511_cccccc", skills=hermes.SKILLS_REVIEW),
        [USER1, REPLY1, TOOL1, REPLY2, {"role": "user", "content": hermes.REVIEW_PROMPT}],
        hermes.tools_review(),
    )
    out = h.send(body)
    assert out.role == "root"
    assert out.fork_action == "disabled"
    assert "20260513_204511_cccccc" in system_of(out)


def test_sessions_sharing_first_message_do_not_share_values() -> None:
    h = Harness()
    a = h.send(turn1(minute="02:30 PM", session="20260513_204511_aaaaaa"))
    b = h.send(turn1(minute="03:10 PM", session="20260513_204511_bbbbbb"))
    assert b.role == "root" and b.record.id != a.record.id
    assert "Session ID: 20260513_204511_bbbbbb" in system_of(b)
    assert "03:10 PM" in system_of(b)
    # Both sessions go on, each with its own values.
    a2 = h.send(turn2(minute="02:45 PM", session="20260513_204511_aaaaaa"))
    b2 = h.send(turn2(minute="03:20 PM", session="20260513_204511_bbbbbb"))
    assert a2.role == b2.role == "continuation"
    assert "02:30 PM" in system_of(a2) and "20260513_204511_aaaaaa" in system_of(a2)
    assert "03:10 PM" in system_of(b2) and "20260513_204511_bbbbbb" in system_of(b2)


def test_genuine_system_change_is_forwarded() -> None:
    h = Harness()
    first = h.send(turn1(minute="02:30 PM"), reply=REPLY1)
    out = h.send(turn2(minute="02:40 PM", extra="NEW INSTRUCTIONS: answer in French."))
    assert out.role == "continuation"
    assert "NEW INSTRUCTIONS: answer in French." in system_of(out)
    assert "02:30 PM" in system_of(out)  # the volatile span is still pinned
    assert system_of(out) != system_of(first)


def test_pins_only_restore_into_the_same_line() -> None:
    h = Harness(Settings(packs=("generic", "hermes")))
    sid = "\nSession ID: 20260513_204511_d02a5d"
    sys1 = "Now: 2026-05-14T14:30:00Z\nDeadline: 2026-06-01 09:00" + sid
    h.send({"model": "m", "messages": [{"role": "system", "content": sys1}, USER1]}, reply=REPLY2)
    sys2 = "Now: 2026-05-14T14:31:00Z\nDeadline: 2026-06-01 09:00\nNew note 2026-07-01 10:00" + sid
    out = h.send(
        {
            "model": "m",
            "messages": [{"role": "system", "content": sys2}, USER1, REPLY2, {"role": "user", "content": "next"}],
        }
    )
    assert out.role == "continuation"
    assert system_of(out) == "Now: 2026-05-14T14:30:00Z\nDeadline: 2026-06-01 09:00\nNew note 2026-07-01 10:00" + sid


def test_tools_that_mean_the_same_get_the_lineages_first_bytes() -> None:
    h = Harness()
    first = h.send(hermes.request(hermes.system_prompt(), [USER1], hermes.tools_full()), reply=REPLY2)
    # The same tools, in another order, each schema's keys in another order.
    shuffled = [
        {"function": {k: t["function"][k] for k in reversed(list(t["function"]))}, "type": t["type"]}
        for t in reversed(hermes.tools_full())
    ]
    history = [USER1, REPLY2, {"role": "user", "content": "go"}]
    out = h.send(hermes.request(hermes.system_prompt(), history, shuffled))
    assert out.role == "continuation"
    assert "lineage.tools" in out.rewrites
    assert _tools_bytes(out.raw) == _tools_bytes(first.raw)


def test_new_tools_are_forwarded_as_sent() -> None:
    h = Harness()
    h.send(hermes.request(hermes.system_prompt(), [USER1], hermes.tools_full()), reply=REPLY2)
    extra = copy.deepcopy(hermes.TOOLS_FULL[0])
    extra["function"]["name"] = "mcp_github_search"
    tools = [extra, *reversed(hermes.tools_full())]
    body = hermes.request(hermes.system_prompt(), [USER1, REPLY2, {"role": "user", "content": "go"}], tools)
    out = h.send(orjson.dumps(body))
    assert "lineage.tools" not in out.rewrites
    assert _tools_bytes(out.raw) == orjson.dumps(tools)


def test_tool_schemas_are_never_resorted() -> None:
    h = Harness(Settings(packs=("generic",)))
    raw = (
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":'
        b'{"name":"t","parameters":{"type":"object","required":["b","a"],"properties":{"b":{"type":"string"},'
        b'"a":{"type":"integer"}}}}}]}'
    )
    out = h.send(raw)
    assert out.raw == raw
    assert out.rewrites == []


def _tools_bytes(raw: bytes) -> bytes:
    span = JsonDoc(raw).span(("tools",))
    assert span is not None
    return raw[span[0] : span[1]]


@pytest.mark.parametrize(
    "variant",
    [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "x", "type": "function", "function": {"name": "terminal", "arguments": '{ "command" : "ls" }'}}
            ],
        },
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "y", "type": "function", "function": {"name": "terminal", "arguments": '{"command":"ls"}'}}
            ],
        },
    ],
)
def test_hash_chain_ignores_representation(variant: dict[str, Any]) -> None:
    base, _ = chain.links(CHAT, [USER1, REPLY1])
    same, _ = chain.links(CHAT, [{"role": "user", "content": [{"type": "text", "text": USER1["content"]}]}, variant])
    assert base == same
    other, _ = chain.links(CHAT, [USER1, {**REPLY1, "content": "different"}])
    assert other[0] == base[0] and other[1] != base[1]


def test_prediction_of_continuation_and_break() -> None:
    h = Harness()
    first = h.send(turn1(), reply=REPLY1)
    second = h.send(turn2(minute="02:59 PM"))
    prep = second.prep
    assert prep is not None
    p = predict(second.record.fingerprint, first.record.fingerprint, second.outcome.depth, prep.sizes)  # type: ignore[arg-type]
    assert p.cause is None and p.ratio > 0.8
    third = h.send(
        hermes.request(
            hermes.system_prompt(extra="changed"),
            [USER1, REPLY1, TOOL1, REPLY2, {"role": "user", "content": "x"}],
            hermes.tools_full(),
        )
    )
    prep = third.prep
    assert prep is not None
    p = predict(third.record.fingerprint, second.record.fingerprint, third.outcome.depth, prep.sizes)  # type: ignore[arg-type]
    assert p.cause == "system_changed"
    assert 0 < p.ratio < 0.5


def test_user_rule_strip_mask_date() -> None:
    from canonicalize import compile_rule

    rules = (
        compile_rule("clock", r"Local time: (?P<v>\d{2}:\d{2})", "pin"),
        compile_rule("nonce", r"nonce=[0-9a-f]+", "mask", replacement="nonce=*"),
        compile_rule("day", r"(?P<date>\d{4}-\d{2}-\d{2}) \d{2}:\d{2}", "date"),
    )
    h = Harness(Settings(packs=(), rules=rules))
    out = h.send(
        {
            "model": "m",
            "messages": [{"role": "system", "content": "Local time: 10:00 nonce=abc123 at 2026-05-14 10:00"}, USER1],
        }
    )
    assert system_of(out) == "Local time: 10:00 nonce=* at 2026-05-14 10:00"  # a date is pinned, not cut
    assert out.rewrites == ["nonce"]
    assert re.search("Local time", system_of(out))


@pytest.mark.parametrize("reply_recorded", [True, False])
def test_parent_turn_after_a_same_session_fork_stays_the_parents(reply_recorded: bool) -> None:
    """Current hermes forks keep the parent's Session ID, system and tools; the
    parent's next turn replays the same reply as the fork but must not continue it."""
    h = Harness()
    parent = h.send(turn2(), reply=REPLY2 if reply_recorded else None)
    review = [USER1, REPLY1, TOOL1, REPLY2, {"role": "user", "content": hermes.REVIEW_PROMPT}]
    fork = h.send(
        hermes.request(hermes.system_prompt(), review, hermes.tools_full()),
        reply={"role": "assistant", "content": "Nothing to save."},
    )
    assert (fork.role, fork.fork_signal) == ("fork", "marker")
    new = "NEW: be terse."
    nxt = h.send(
        hermes.request(
            hermes.system_prompt(extra=new),
            [USER1, REPLY1, TOOL1, REPLY2, {"role": "user", "content": "go on"}],
            hermes.tools_full(),
        )
    )
    assert nxt.role == "continuation" and nxt.record.id == parent.record.id
    assert new in system_of(nxt)
    loop_history = [*review, {"role": "assistant", "content": "Nothing to save."}, {"role": "user", "content": "sure?"}]
    loop = h.send(hermes.request(hermes.system_prompt(), loop_history, hermes.tools_full()))
    assert loop.record.id == fork.record.id and loop.fork_action == "continued"


def test_a_lineage_and_its_forks_share_one_root() -> None:
    h = Harness()
    parent = h.send(turn2(), reply=REPLY2)
    review = [USER1, REPLY1, TOOL1, REPLY2, {"role": "user", "content": hermes.REVIEW_PROMPT}]
    fork = h.send(hermes.request(hermes.system_prompt(), review, hermes.tools_review()))
    assert fork.role == "fork"
    assert parent.record.root == parent.record.id
    assert fork.record.root == parent.record.id != fork.record.id
    other = h.send(turn1(session="20260514_090000_abcdef"))
    assert other.record.root == other.record.id != parent.record.root


def test_the_served_replica_round_trips_and_old_records_decode() -> None:
    rec = LineageRecord(id="a", root="a", replica=2)
    assert LineageRecord.from_bytes(rec.to_bytes()) == rec
    old = orjson.loads(rec.to_bytes())
    del old["rp"]  # written before the field existed
    assert LineageRecord.from_bytes(orjson.dumps(old)).replica is None
    for junk in (None, -1, "1", True, 1.5):
        assert LineageRecord.from_bytes(orjson.dumps({**old, "rp": junk})).replica is None


def test_the_provider_cache_fields_round_trip_and_are_absent_unless_set() -> None:
    plain = LineageRecord(id="a", root="a")
    assert not {"at", "ps", "mi"} & orjson.loads(plain.to_bytes()).keys()  # records of everyone else: as before
    rec = plain.evolve(at=1_790_000_000.25, pauses=(900, 4000), message_id="msg_01")
    assert LineageRecord.from_bytes(rec.to_bytes()) == rec
    assert orjson.loads(rec.to_bytes())["ps"] == [900, 4000]
    # Written before the fields existed (or by an older process): unset.
    assert LineageRecord.from_bytes(plain.to_bytes()) == plain
    junk = {**orjson.loads(plain.to_bytes()), "at": "x", "ps": [1, "2", True], "mi": 5}
    assert LineageRecord.from_bytes(orjson.dumps(junk)) == plain.evolve(pauses=(1,))


def test_signals_at_depth_keeps_every_other_field() -> None:
    from dataclasses import fields, replace

    from canonicalize.lineage import Signals

    values = {f.name: (f"v-{f.name}",) for f in fields(Signals)}
    sig = Signals(**values)  # type: ignore[arg-type]
    assert sig.at_depth(7) == replace(sig, depth=7)


def test_record_evolve_is_dataclasses_replace() -> None:
    from dataclasses import replace

    rec = LineageRecord(id="a", pins={"k": "v"}, notes=((1, "x"),), requests=3, replica=1)
    assert rec.evolve(requests=4, skeleton="s") == replace(rec, requests=4, skeleton="s")
    with pytest.raises(TypeError):
        rec.evolve(no_such_field=1)


def test_a_new_lineage_id_starts_with_its_conversations_home_and_other_shapes_stay() -> None:
    fresh = "0123456789abcdef"
    made = homed(fresh, "tenant", b"first link")
    assert made[4:] == fresh[4:] and made[:4] == home("tenant", b"first link")
    assert home("t", made) == made[:4]  # a lineage id of prefixpin's shape names its home
    for other in ("L0001", "0123456789ABCDEF", "0123456789abcdeg", "0123456789abcdef0", ""):
        assert homed(other, "tenant", b"first link") == other  # not of prefixpin's shape: as it is
        named = home("t", other)  # a lineage of another shape: its home hashed from its id
        assert len(named) == 4 and set(named) <= set("0123456789abcdef")
