"""The memo of big texts, and the pipeline's memos built on it: every answer is the
one a canonicalizer that remembers nothing (``Memos.off()``) gives."""

from __future__ import annotations

import random
import sys
from typing import Any

import pytest

from canonicalize import CHAT, MESSAGES, RESPONSES, Fingerprint, Settings, compile_rule, identity, pieces, strpiece
from canonicalize.memo import Memos, ToolIds
from canonicalize.pipeline import Canonicalizer
from canonicalize.texts import HEAD, TAIL, Texts
from tests import hermes
from tests.flows import Harness, Sent


def copy_of(text: str) -> str:
    """An equal text that is another object."""
    out = "".join([text[:1], text[1:]])
    assert out == text and out is not text
    return out


def test_an_equal_text_gets_the_kept_object_and_what_was_derived_from_it() -> None:
    memo = Texts()
    first = memo.entry("t", "x" * 5000)
    first.derived["n"] = 1
    again = memo.entry("t", copy_of(first.text))
    assert again is first and again.derived == {"n": 1}
    assert memo.intern("t", copy_of(first.text)) is first.text
    assert memo.entry("t", first.text) is first  # the kept object itself: found by identity
    assert len(memo) == 1 and memo.chars == 5000 + 1


def test_texts_sharing_the_key_are_told_apart_by_their_whole_text() -> None:
    memo = Texts()
    head, tail = "h" * HEAD, "t" * TAIL
    a = memo.entry("t", head + "a" * 1000 + tail)
    b = memo.entry("t", head + "b" * 1000 + tail)  # same length, start and end
    assert a is not b and a.text != b.text
    assert memo.entry("t", copy_of(a.text)) is a
    assert memo.entry("t", copy_of(b.text)) is b


def test_texts_used_again_and_again_are_kept_longest() -> None:
    """The least recently used text goes first, however often the newest was used."""
    memo = Texts(max_entries=3)
    texts = [f"{i}" * 3000 for i in range(4)]
    kept = [memo.entry("t", t) for t in texts[:3]]
    for _ in range(3):
        for entry in (kept[0], kept[0], kept[2], kept[0]):
            assert memo.entry("t", entry.text) is entry
    memo.entry("t", texts[3])  # pushes out the least recently used: the second
    assert memo.known("t", texts[1]) is None
    assert memo.known("t", texts[0]) is kept[0] and memo.known("t", texts[2]) is kept[2]


def test_a_text_another_was_read_from_goes_first() -> None:
    """Over the bound, a superseded text goes before the least recently used; used
    again, it is the newest again; a key that holds other texts too is not moved."""
    memo = Texts(max_entries=3)
    texts = [f"{i}" * 3000 for i in range(5)]
    kept = [memo.entry("t", t) for t in texts[:3]]
    memo.supersede(kept[2])  # the newest
    memo.entry("t", texts[3])
    assert memo.known("t", texts[2]) is None  # before kept[0], the least recently used
    assert memo.known("t", texts[0]) is kept[0] and memo.known("t", texts[1]) is kept[1]
    memo.supersede(kept[0])
    assert memo.entry("t", texts[0]) is kept[0]  # used again: the newest again
    memo.entry("t", texts[4])
    assert memo.known("t", texts[1]) is None and memo.known("t", texts[0]) is kept[0]

    shared = Texts(max_entries=3, per_key=2)
    head, tail = "h" * HEAD, "t" * TAIL
    c = shared.entry("t", "c" * 3000)
    a, b = (shared.entry("t", head + x * 1000 + tail) for x in "ab")  # one key, two texts
    shared.supersede(b)
    shared.entry("t", "d" * 3000)
    assert shared.known("t", c.text) is None  # the least recently used went, not their key
    assert shared.known("t", a.text) is a and shared.known("t", b.text) is b


def test_one_scope_never_finds_anothers_texts() -> None:
    memo = Texts()
    text = "s" * 3000
    mine = memo.entry("tenant-a", text)
    mine.derived["secret"] = "a's"
    theirs = memo.entry("tenant-b", text)  # the very same object, another scope
    assert theirs is not mine and theirs.derived == {}
    assert memo.entry("tenant-a", copy_of(text)) is mine
    assert memo.entry("tenant-b", copy_of(text)) is theirs


def test_bounded_in_entries_characters_and_per_key() -> None:
    memo = Texts(max_entries=4, max_chars=10**9, per_key=2)
    for i in range(10):
        memo.entry("t", f"{i:04d}" + "x" * 500)
    assert len(memo) == 4
    head, tail = "h" * HEAD, "t" * TAIL
    for c in "abcdef":  # one key
        memo.entry("u", head + c * 100 + tail)
    assert len(memo) == 4
    assert sum(1 for bucket in memo._buckets.values() for e in bucket if e.key[0] == "u") == 2

    small = Texts(max_entries=1000, max_chars=8000)
    for i in range(50):
        small.entry("t", f"{i:04d}" + "y" * 900)
    assert 0 < small.chars <= 8000
    big = small.entry("t", "z" * 5000)  # over an eighth of the bound: used, not kept
    assert small.entry("t", copy_of(big.text)) is not big


def test_a_forgotten_text_is_not_found_by_identity() -> None:
    memo = Texts(max_entries=1)
    first = memo.entry("t", "a" * 100)
    memo.entry("t", "b" * 100)  # evicts the first
    assert len(memo) == 1
    assert memo.entry("t", first.text) is not first
    assert not any(e is first for e in memo._ids.values())


def test_fingerprint_memoised_in_a_scope_is_the_one_computed() -> None:
    canon = Canonicalizer(Settings())
    body = hermes.request(hermes.system_prompt(), [{"role": "user", "content": "hi"}], hermes.tools_full())
    kw: dict[str, Any] = {"tools_ref": "r", "tools_len": 3, "n_messages": 1}

    def fingerprint(body: dict[str, Any], **more: Any) -> Fingerprint:
        return identity.fingerprint(canon.memos.texts, canon.fork.inherit_params, body, CHAT, **kw, **more)

    plain = fingerprint(body)
    assert fingerprint(body, scope="t") == plain
    assert fingerprint(body, scope="t") == plain  # from the memo
    two = {**body, "messages": [*body["messages"], {"role": "developer", "content": "also \u00e9 this"}]}
    assert fingerprint(two, scope="t") == fingerprint(two)


def test_only_a_kept_bodys_tools_list_is_held_by_identity() -> None:
    # A list parsed whole (a body remembered nowhere) is never sent again: holding it
    # would keep its whole parse alive until later requests push it out.
    canon = Canonicalizer(Settings())
    tools = hermes.tools_full()
    before = sys.getrefcount(tools)
    first = canon.memos.tools.identify(CHAT, tools, hold=False, shared=True)
    assert sys.getrefcount(tools) == before
    held = canon.memos.tools.identify(CHAT, tools, hold=True, shared=True)
    assert held is first and sys.getrefcount(tools) == before + 1
    assert canon.memos.tools.identify(CHAT, tools, hold=False, shared=True) is first  # answered by identity now


def _tool(name: str, pad: int = 0) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": "x" * pad, "parameters": {}}}


def test_a_text_sent_in_thousands_of_slots_counts_what_it_holds_for_each() -> None:
    """One system text in 2,000 blocks of a Messages body: its entry keeps the spans of
    each slot, each counted in the memo's bound (not nothing), so the bound holds."""
    from canonicalize.analysis import SPAN_CHARS

    for texts in (Texts(), Texts(max_chars=100_000)):
        h = Harness(memos=Memos(texts=texts))
        for t in range(3):
            body = {
                "model": "claude-x",
                "max_tokens": 8,
                "system": [{"type": "text", "text": f"p{t}"} for _ in range(2000)],
                "messages": [{"role": "user", "content": "hi"}],
            }
            h.send(body, exchange=MESSAGES)
            assert texts.chars <= texts.max_chars
            if texts.max_chars > 2000 * SPAN_CHARS:  # it stays: each slot's spans counted in it
                entries = [e for bucket in texts._buckets.values() for e in bucket if e.text == f"p{t}"]
                assert [e.extra >= 2000 * SPAN_CHARS for e in entries] == [True]


def test_tool_lists_are_bounded_in_bytes_and_a_huge_one_is_not_remembered() -> None:
    tools = ToolIds(max_entries=100, max_bytes=64 * 1024)
    for i in range(40):  # ~4 KiB each: 160 KiB sent, 64 KiB kept
        tools.identify(CHAT, [_tool(f"t{i}", 4000)], hold=True, shared=True, scope="a")
        assert tools.size <= 2 * tools.max_bytes  # the lists by their bytes, and those held
    huge = [_tool("huge", 9000)]  # over an eighth of the bound: neither remembered nor held
    first = tools.identify(CHAT, huge, hold=True, shared=True, scope="a")
    assert tools.identify(CHAT, huge, hold=True, shared=True, scope="a") is not first  # computed again
    assert first == tools.identify(CHAT, huge, hold=False, shared=False, scope="a")
    small = [_tool("small")]
    kept = tools.identify(CHAT, small, hold=False, shared=False, scope="a")
    assert tools.identify(CHAT, [_tool("small")], hold=False, shared=False, scope="a") is kept


def test_one_tenants_tool_lists_are_never_found_by_another() -> None:
    tools = ToolIds()
    mine = tools.identify(CHAT, [_tool("read_file")], hold=False, shared=False, scope="a")
    theirs = tools.identify(CHAT, [_tool("read_file")], hold=False, shared=False, scope="b")
    assert theirs == mine and theirs is not mine  # the same answer, computed afresh
    held = [_tool("write_file")]
    tools.identify(CHAT, held, hold=True, shared=True, scope="a")
    assert tools.identify(CHAT, held, hold=False, shared=True, scope="a") is not None
    assert tools.identify(CHAT, held, hold=False, shared=True, scope="b") is not tools.identify(
        CHAT, held, hold=False, shared=True, scope="a"
    )


def forgetful(settings: Settings | None = None) -> Harness:
    """A harness whose canonicalizer remembers nothing: every answer computed afresh."""
    return Harness(settings, memos=Memos.off())


def same(a: Sent, b: Sent) -> None:
    assert a.flow.role == b.flow.role
    assert a.raw == b.raw
    assert a.flow.rewrites == b.flow.rewrites
    if a.flow.outcome is not None:
        assert b.flow.outcome is not None
        assert a.flow.outcome.record == b.flow.outcome.record
        assert a.flow.outcome.links == b.flow.outcome.links
        assert a.flow.outcome.touch == b.flow.outcome.touch
        assert a.flow.outcome.new_blobs == b.flow.outcome.new_blobs


@pytest.mark.parametrize("seed", range(6))
def test_memoised_requests_match_a_canonicalizer_that_remembers_nothing(seed: int) -> None:
    """Sessions that go on, retry their last turn, move their minute, memory counter and
    date on, and two tenants sending the same prompts: the forwarded bytes, the role,
    the rewrites and what is recorded are those of a canonicalizer with no memo."""
    rnd = random.Random(seed)
    memo, cold = Harness(), forgetful()
    sessions = [f"20260513_2045{i:02d}_d02a5d" for i in range(3)]
    keys = [{"authorization": "Bearer sk-a"}, {"authorization": "Bearer sk-b"}]
    turns: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for n in range(60):
        s, k = rnd.randrange(len(sessions)), rnd.randrange(len(keys))
        history = turns.setdefault((s, k), [{"role": "user", "content": f"start {s}"}])
        action = rnd.random()
        if action < 0.5 and len(history) > 1:  # the same turn, another last message (a retry)
            history[-1] = {"role": "user", "content": f"retry {n}"}
        elif action < 0.6:
            history.append({"role": "user", "content": "Review the conversation above and consider saving to memory"})
        else:
            history.append({"role": "user", "content": f"turn {n}"})
        system = hermes.system_prompt(
            minute=f"02:{rnd.choice([30, 31, 32])} PM",
            session=sessions[s],
            pct=rnd.choice([49, 50]),
            extra=rnd.choice(["", "Conversation started: Friday, May 15, 2026 09:00 AM"]),
        )
        body = hermes.request(system, list(history), hermes.tools_full())
        reply = {"role": "assistant", "content": f"answer {n}"}
        a = memo.send(body, reply=reply, headers=keys[k])
        b = cold.send(body, reply=reply, headers=keys[k])
        same(a, b)
        if a.flow.role != "fork":
            history.append(reply)
    assert memo.canon.memos.bodies.reused > 0  # most bodies parsed by pieces of the previous one


@pytest.mark.parametrize("seed", range(3))
def test_interleaved_conversations_under_one_key_match_a_canonicalizer_that_remembers_nothing(seed: int) -> None:
    """Many conversations under one key, sent in a random interleaving, each turn's
    minute moved (a gateway in front of many sessions): each turn is parsed by pieces of
    its own conversation's previous body, and what is forwarded and recorded is what a
    canonicalizer with no memo gives."""
    rnd = random.Random(seed)
    memo, cold = Harness(), forgetful()
    convs = 24
    histories: list[list[dict[str, Any]]] = [[{"role": "user", "content": f"task {c}"}] for c in range(convs)]
    turns = [0] * convs
    for n in range(150):
        c = rnd.randrange(convs)
        if rnd.random() < 0.15 and len(histories[c]) > 1:  # a retry of the last turn
            histories[c][-1] = {"role": "user", "content": f"retry {n}"}
        system = hermes.system_prompt(minute=f"02:{30 + turns[c] % 30} PM", session=f"20260513_2045{c:02d}_d02a5d")
        body = hermes.request(system, list(histories[c]), hermes.tools_full())
        reply = {"role": "assistant", "content": f"answer {n}"}
        same(memo.send(body, reply=reply), cold.send(body, reply=reply))
        histories[c] += [reply, {"role": "user", "content": f"turn {n}"}]
        turns[c] += 1
    assert memo.canon.memos.bodies.reused > 120  # by pieces of its own conversation's body, nearly every one


@pytest.mark.parametrize("seed", range(4))
def test_dates_notes_and_two_system_messages_match_a_canonicalizer_that_remembers_nothing(seed: int) -> None:
    """A ``date`` rule (opencode) whose date moves on mid-session, in a prompt of two
    system messages (one of them in text parts): pins restored, notes appended."""
    rnd = random.Random(seed)
    settings = Settings(packs=("generic", "opencode"))
    memo, cold = Harness(settings), forgetful(settings)
    history: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for n in range(30):
        if rnd.random() < 0.3 and len(history) > 1:
            history[-1] = {"role": "user", "content": f"retry {n}"}
        else:
            history.append({"role": "user", "content": f"turn {n}"})
        day = rnd.choice(["Thu Jan 01 2026", "Fri Jan 02 2026", "Sat Jan 03 2026"])
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are opencode.\n<env>\nToday's date: " + day + "\n</env>\n" + "x" * 400},
            {"role": "system", "content": [{"type": "text", "text": f"Second part. Today's date: {day}"}]},
            *history,
        ]
        body = {"model": "m", "messages": messages}
        reply = {"role": "assistant", "content": f"answer {n}"}
        same(memo.send(body, reply=reply), cold.send(body, reply=reply))
        history.append(reply)


def test_what_an_entry_holds_counts_in_the_bound() -> None:
    memo = Texts(max_entries=100, max_chars=1000)
    a = memo.entry("t", "a" * 100)
    memo.charge(a, 50)
    assert memo.chars == 101 + 50
    memo.charge(a, -20)
    assert memo.chars == 101 + 30
    memo.charge(a, 2000)  # over the bound: the oldest entries go, this one with them
    assert memo.chars == 0 and len(memo) == 0 and not a.kept
    memo.charge(a, 10)  # a forgotten entry is not counted
    assert memo.chars == 0
    b = memo.entry("u", "b" * 100)
    memo.entry("u", "c" * 100)
    assert memo.chars == 202 and b.kept


def test_the_pipelines_memos_stay_within_the_text_bound() -> None:
    h = Harness(memos=Memos(texts=Texts(max_chars=200_000)))
    for i in range(40):  # 40 sessions' prompts, each with its analysis, restored pins and blocks
        system = hermes.system_prompt(session=f"20260513_2045{i:02d}_d02a5d", filler=60)
        h.send(hermes.request(system, [{"role": "user", "content": "hi"}], hermes.tools_full()))
        h.send(hermes.request(system.replace("02:30", "02:31"), [{"role": "user", "content": "hi"}]))
        assert 0 < h.canon.memos.texts.chars <= 200_000


def test_turns_are_those_three_searches_find() -> None:
    """The first / last assistant and last user indices, in one pass each way."""
    from canonicalize import RESPONSES
    from canonicalize.analysis import _TIP, _turns

    rnd = random.Random(5)
    kinds = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "t"},
        {"type": "function_call", "name": "f", "arguments": "{}"},
        {"type": "message", "role": "assistant", "content": []},
        "not a message",
    ]
    for exchange in (CHAT, RESPONSES):
        for _ in range(300):
            history: list[Any] = [rnd.choice(kinds) for _ in range(rnd.randint(0, 6))]
            if rnd.random() < 0.3:
                history.insert(0, _TIP)
            n = len(history)
            first = next((i for i, m in enumerate(history) if m is _TIP or exchange.is_assistant(m)), None)
            last = next(
                (i for i in range(n - 1, -1, -1) if history[i] is _TIP or exchange.is_assistant(history[i])), None
            )
            user = next(
                (i for i in range(n - 1, -1, -1) if history[i] is not _TIP and exchange.is_user(history[i])), None
            )
            assert _turns(exchange, history) == (first, last, user)


def test_signals_at_a_depth_are_the_signals_built_with_it() -> None:
    from canonicalize.lineage import Signals

    sig = Signals(0, 1, 3, ("i",), "s", "h", ("t",), 4, "text", None)
    moved = sig.at_depth(7)
    assert moved == Signals(7, 1, 3, ("i",), "s", "h", ("t",), 4, "text", None)
    assert hash(moved) == hash(Signals(7, 1, 3, ("i",), "s", "h", ("t",), 4, "text", None))


def test_an_evolved_record_is_the_record_built_with_the_changes() -> None:
    from canonicalize import LineageRecord

    rec = LineageRecord(id="a", pins={"k": "v"}, notes=((1, "n", "h"),), requests=3)
    assert rec.evolve(requests=4, head="h") == LineageRecord(
        id="a", pins={"k": "v"}, notes=((1, "n", "h"),), requests=4, head="h"
    )
    with pytest.raises(TypeError):
        rec.evolve(nonsense=1)


def test_system_ref_memoised_with_the_text_is_the_one_computed() -> None:
    """Random system parts (a string, one message or several, other keys, another key
    order, short texts): the ref is the digest of the serialized value, from the memo
    or not, in any scope."""
    import orjson

    from canonicalize import chain

    rnd = random.Random(7)
    canon = Canonicalizer(Settings())
    prompts = [hermes.system_prompt(minute=f"02:{m} PM") for m in (30, 31)] + ["short", "x" * 300 + "\u00e9"]
    for _ in range(400):
        text = copy_of(rnd.choice(prompts))
        role = rnd.choice(["system", "developer", 7])
        shape = rnd.randrange(6)
        value: Any
        if shape == 0:
            value = text
        elif shape == 1:
            value = [{"role": role, "content": text}]
        elif shape == 2:
            value = [{"content": text, "role": role}]
        elif shape == 3:
            value = [{"role": role, "content": text, "name": "n"}]
        elif shape == 4:
            value = [{"role": role, "content": text}, {"role": "system", "content": "more"}]
        else:
            value = [{"role": role, "content": [{"type": "text", "text": text}]}]
        scope = rnd.choice(["a", "b"])
        assert identity.system_ref(canon.memos.texts, value, scope) == chain.digest(orjson.dumps(value)), (shape, role)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("scope", ["all", "tools"])
def test_rules_that_edit_history_or_tools_match_a_canonicalizer_that_remembers_nothing(seed: int, scope: str) -> None:
    """A user rule of scope ``all`` writes into every message, one of scope ``tools``
    into tools[]: bodies parsed by pieces are never edited through another request."""
    rnd = random.Random(seed)
    rule = compile_rule("user.mask", r"secret-\d+", "mask", scope)
    settings = Settings(rules=(rule,))
    memo, cold = Harness(settings), forgetful(settings)
    history: list[dict[str, Any]] = [{"role": "user", "content": "start secret-1"}]
    tools = hermes.tools_full()
    tools[0]["function"]["description"] += " secret-7"
    for n in range(30):
        if rnd.random() < 0.3 and len(history) > 1:
            history[-1] = {"role": "user", "content": f"retry {n} secret-{n}"}
        else:
            history.append({"role": "user", "content": f"turn {n}"})
        system = hermes.system_prompt(minute=f"02:{rnd.choice([30, 31])} PM", session="20260513_204500_d02a5d")
        body = hermes.request(system, list(history), tools)
        reply = {"role": "assistant", "content": f"answer {n} secret-{n}"}
        same(memo.send(body, reply=reply), cold.send(body, reply=reply))
        history.append(reply)
    assert memo.canon.memos.bodies.reused == 0  # edited in place: parsed whole


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("api", ["messages", "responses"])
def test_messages_and_responses_bodies_match_a_canonicalizer_that_remembers_nothing(seed: int, api: str) -> None:
    """Anthropic Messages (system at the top level, content blocks) and Responses
    (``instructions``, ``input`` items): bodies parsed by pieces of the previous one, a
    system text that moves on, retries: the same bytes, role, rewrites and records."""
    rnd = random.Random(seed)
    memo, cold = Harness(), forgetful()
    exchange = MESSAGES if api == "messages" else RESPONSES
    history: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "start"}]}]
    for n in range(30):
        if rnd.random() < 0.3 and len(history) > 1:
            history[-1] = {"role": "user", "content": f"retry {n}"}
        else:
            history.append({"role": "user", "content": f"turn {n}"})
        system = hermes.system_prompt(minute=f"02:{rnd.choice([30, 31])} PM", pct=rnd.choice([49, 50]))
        if api == "messages":
            blocks = [{"type": "text", "text": system}, {"type": "text", "text": "Be brief."}]
            body: dict[str, Any] = {"model": "m", "max_tokens": 100, "system": blocks, "messages": list(history)}
        else:
            body = {"model": "m", "instructions": system, "input": list(history), "tools": hermes.tools_full()}
        reply = {"role": "assistant", "content": [{"type": "text", "text": f"answer {n}"}]}
        same(memo.send(body, reply=reply, exchange=exchange), cold.send(body, reply=reply, exchange=exchange))
        history.append(reply)
    assert memo.canon.memos.bodies.reused > 0


def test_a_value_derived_twice_is_kept_and_counted_once() -> None:
    memo = Texts()
    entry = memo.entry("t", "a" * 100)
    assert memo.derive(entry, "k", "first", 10) == "first"
    assert memo.derive(entry, "k", "second", 10) == "first"  # another thread stored it first
    assert memo.chars == 101 + 10


def test_a_derived_list_keeps_its_newest_within_its_bound() -> None:
    memo = Texts()
    entry = memo.entry("t", "a" * 100)
    for i in range(5):
        assert memo.derive_among(entry, "r", i, f"v{i}", 10, most=3) == f"v{i}"
    assert memo.derive_among(entry, "r", 4, "again", 10, most=3) == "v4"
    assert [memo.found_among(entry, "r", i) for i in range(5)] == [None, None, "v2", "v3", "v4"]
    assert memo.chars == 101 + 30


def test_the_no_memo_form_remembers_nothing() -> None:
    off, on = Memos.off(), Memos()
    text = "x" * 5000
    off.texts.entry("t", text).derived["n"] = 1
    assert off.texts.entry("t", text).derived == {} and len(off.texts) == 0
    assert off.texts.intern("t", text) is text
    tools = hermes.tools_full()
    before = sys.getrefcount(tools)
    found = off.tools.identify(CHAT, tools, hold=True, shared=True)
    assert found == on.tools.identify(CHAT, tools, hold=False, shared=True)
    assert sys.getrefcount(tools) == before  # not held
    assert off.tools.identify(CHAT, tools, hold=True, shared=True) is not found  # computed afresh
    raw = b'{"messages":[{"role":"user","content":"hi"}]}'
    for _ in range(2):
        parsed = off.bodies.parse(raw, "messages", "t")
        assert parsed is not None and parsed[2] is None
    assert off.bodies.reused == 0


def test_a_prompt_parsed_as_its_previous_ones_item_is_analysed_as_a_fresh_canonicalizer_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The next requests' prompts (the minute moved) are parsed as the previous ones'
    items with only the string parsed (canonicalize.strpiece); their analysis is the
    one a canonicalizer that remembers nothing gives."""
    made: list[bool] = []

    def replaced(*args: Any) -> Any:
        found = strpiece.replaced(*args)
        made.append(found is not None)
        return found

    monkeypatch.setattr(pieces, "replaced", replaced)
    memo, fresh = Harness(), Harness(memos=Memos.off())
    history = [{"role": "user", "content": "hi"}]
    for minute in ("02:30 PM", "02:31 PM", "02:32 PM"):
        body = hermes.request(hermes.system_prompt(minute=minute), list(history), hermes.tools_full())
        assert memo.send(body).raw == fresh.send(body).raw
        history += [{"role": "assistant", "content": f"at {minute}"}, {"role": "user", "content": "next"}]
    assert memo.canon.memos.bodies.reused == 2 and made == [True, True]


def test_a_conversations_previous_prompt_goes_first_and_another_conversations_stays() -> None:
    """A prompt whose minute moved is read from the conversation's previous one, which
    then goes first from the memo of texts; a new conversation read from another's
    prompt (another session) leaves that one where it was."""
    memo = Harness()
    texts = memo.canon.memos.texts
    history = [{"role": "user", "content": "hi"}]
    sent = []
    for minute in ("02:30 PM", "02:31 PM"):
        prompt = hermes.system_prompt(minute=minute)
        sent.append(prompt)
        memo.send(hermes.request(prompt, list(history), hermes.tools_full()))
        history += [{"role": "assistant", "content": f"at {minute}"}, {"role": "user", "content": "next"}]
    first = next(iter(texts._buckets.values()))
    assert [e.text for e in first] == [sent[0]]  # the previous prompt: first to go

    other = Harness()
    texts = other.canon.memos.texts
    other.send(hermes.request(hermes.system_prompt(), [{"role": "user", "content": "hi"}], hermes.tools_full()))
    kept = [e.text for bucket in texts._buckets.values() for e in bucket]
    other.send(
        hermes.request(
            hermes.system_prompt(session="20260513_999999_ffffff"),
            [{"role": "user", "content": "hey"}],
            hermes.tools_full(),
        )
    )
    assert other.canon.memos.bodies.reused == 1  # parsed from the other conversation's body
    assert [e.text for bucket in texts._buckets.values() for e in bucket][: len(kept)] == kept  # in their order
