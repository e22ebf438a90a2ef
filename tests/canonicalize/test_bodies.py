"""Bodies parsed by pieces of their conversations' previous bodies: every parse is the one the
no-memo form gives (orjson's parse of the whole body), every span carried over is
the one a fresh document finds, and the kept parse never changes whatever a
request does to its copy."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import orjson
import pytest
import xxhash

from canonicalize import pieces
from canonicalize.bodies import LEAD_BYTES, SHARED, SKIM_TOKENS, Bodies, Kept, lead
from canonicalize.jsonspan import JsonDoc, has_line_break


def _text(rng: random.Random) -> str:
    alphabet = 'abc xyz,:[]{}"\\\n\t—é😀0123456789'
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))


def _message(rng: random.Random, i: int) -> dict[str, Any]:
    kind = rng.randrange(5)
    if kind == 0:
        return {"role": "user", "content": f"question {i}: {_text(rng)}"}
    if kind == 1:
        return {"role": "user", "content": [{"type": "text", "text": _text(rng)}, {"type": "text", "text": str(i)}]}
    if kind == 2:
        call = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == 3:
        return {"role": "tool", "tool_call_id": f"c{i}", "content": _text(rng) + str(i)}
    return {"role": "assistant", "content": f"answer {i} {_text(rng)}", "n": rng.randint(-5, 10**15)}


def _prompt(rng: random.Random) -> str:
    """A system prompt of one line, or of many (long enough to be parsed as an edit of
    the previous one's, canonicalize.strpiece)."""
    if rng.random() < 0.5:
        return f"You are helpful. Now: 10:{rng.randint(10, 59)}. {_text(rng)}"
    return "\n".join(f"{j} {_text(rng)}" for j in range(rng.randint(90, 140)))


def _edit_prompt(rng: random.Random, text: str) -> str:
    """A line of ``text`` changed, inserted or removed, or a tail appended."""
    lines = text.split("\n")
    at = rng.randrange(len(lines))
    choice = rng.randrange(4)
    if choice == 0:
        lines[at] = _text(rng)
    elif choice == 1:
        lines.insert(at, _text(rng))
    elif choice == 2 and len(lines) > 1:
        del lines[at]
    else:
        return text + _text(rng)[:3] + "!"
    return "\n".join(lines)


def _session(rng: random.Random, n: int) -> dict[str, Any]:
    system = {"role": "system", "content": _prompt(rng)}
    tools = [{"type": "function", "function": {"name": f"t{j}", "parameters": {"type": "object"}}} for j in range(3)]
    return {"model": "m", "messages": [system, *(_message(rng, i) for i in range(n))], "tools": tools, "t": 0.5}


def _mutate(rng: random.Random, body: dict[str, Any], turn: int) -> dict[str, Any]:
    body = copy.deepcopy(body)
    msgs = body["messages"]
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(9)
        if op <= 2:  # a turn appended
            msgs += [_message(rng, 1000 * turn + j) for j in range(rng.randint(1, 3))]
        elif op == 3 and len(msgs) > 1:  # the last message changed (a retry)
            msgs[-1] = _message(rng, 1000 * turn + 99)
        elif op == 4:  # the system prompt changed
            msgs[0] = {"role": "system", "content": _edit_prompt(rng, msgs[0]["content"])}
        elif op == 5 and len(msgs) > 2:  # one in the middle changed, or removed, or inserted
            at = rng.randrange(1, len(msgs))
            choice = rng.randrange(3)
            if choice == 0:
                msgs[at] = _message(rng, 1000 * turn + 7)
            elif choice == 1:
                del msgs[at]
            else:
                msgs.insert(at, _message(rng, 1000 * turn + 8))
        elif op == 6:  # the tail or the head changed
            if rng.random() < 0.5:
                body["t"] = rng.choice([0.5, 0.7, 1])
            else:
                body["model"] = rng.choice(["m", "m2"])
        elif op == 7 and len(msgs) > 3:  # history cut back (compaction)
            del msgs[1 : rng.randint(2, len(msgs) - 1)]
        else:  # all but the system prompt replaced
            msgs[1:] = [_message(rng, 1000 * turn + 50 + j) for j in range(rng.randint(0, 4))]
    return body


def _compact(body: Any) -> bytes:
    return orjson.dumps(body)


OFF = Bodies(enabled=False)  # remembers nothing: every body parsed whole


def _check(bodies: Bodies, raw: bytes, scope: str = "t") -> dict[str, Any]:
    found = bodies.parse(raw, "messages", scope)
    assert found is not None
    body, doc, _ = found
    fresh = OFF.parse(raw, "messages", scope)
    assert fresh is not None and fresh[2] is None
    assert body == fresh[0] == orjson.loads(raw)
    for path, span in doc._quick.items():
        assert fresh[1].span(path) == span, path
    if doc.flat is not None:  # known without looking: as looking finds
        assert doc.flat is not has_line_break(raw, 0, len(raw))
    for i, msg in enumerate(body["messages"]):  # through the item spans the doc knows, or its own search
        for path in [("messages", i), *((("messages", i, k) for k in msg) if isinstance(msg, dict) else ())]:
            assert doc.span(path) == JsonDoc(raw).span(path), path
    return body  # type: ignore[no-any-return]


@pytest.mark.parametrize("seed", range(40))
def test_a_session_parsed_by_pieces_is_parsed_as_orjson_parses_it_whole(seed: int) -> None:
    bodies = Bodies()
    _sessions(seed, bodies)
    assert bodies.reused > 0


def test_system_prompts_are_parsed_as_the_previous_ones_with_the_string_replaced() -> None:
    """A changed line of a long prompt: its parse made from the previous one's with only
    the string parsed (canonicalize.strpiece), checked as every parse above."""
    assert sum(_sessions(seed, Bodies()) for seed in range(10)) > 10


def _sessions(seed: int, bodies: Bodies) -> int:
    """Three sessions' bodies, each a random change of its previous one, parsed and
    checked; how many items were parsed as an old one with its string replaced."""
    made: list[bool] = []
    real = pieces.replaced

    def counted(*args: Any) -> Any:
        found = real(*args)
        made.append(found is not None)
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pieces, "replaced", counted)
        _turns(seed, bodies)
    return sum(made)


def _turns(seed: int, bodies: Bodies) -> None:
    rng = random.Random(seed)
    sessions = [_session(rng, rng.randint(0, 8)) for _ in range(3)]
    for turn in range(30):
        s = rng.randrange(len(sessions))
        sessions[s] = _mutate(rng, sessions[s], turn)
        raw = _compact(sessions[s])
        body = _check(bodies, raw)
        kept = bodies.newest("t")
        assert kept is not None
        doc = kept.doc
        # What a request does to its copy (render's lookups, the pipeline's writes) never
        # reaches the kept parse.
        for i in range(len(body["messages"])):
            doc.span(("messages", i, "content"))
        for msg in body["messages"]:
            if msg.get("role") in SHARED:  # what no request writes to
                continue
            if isinstance(msg.get("content"), str):
                msg["content"] += " (edited)"
            elif isinstance(msg.get("content"), list):
                for part in msg["content"]:
                    part["text"] = "edited"
        body["tools"] = []


@pytest.mark.parametrize("seed", range(20))
def test_whether_a_body_holds_a_line_break_is_known_from_its_pieces(seed: int) -> None:
    # Line breaks where JSON allows them (whitespace): in the head, the tail, or
    # before an item of the array (a gap the next turn may reuse or parse anew).
    rng = random.Random(seed)
    bodies, session, known = Bodies(), _session(rng, 4), 0
    for turn in range(30):
        session = _mutate(rng, session, turn)
        raw = _compact(session)
        where = rng.choice([b"", b"", b'{"model"', b'"tools"', b',{"role"'])
        if where:
            at = raw.find(where, rng.randrange(len(raw) // 2) if where == b',{"role"' else 0)
            if at >= 0:
                cut = at + 1 if where[:1] == b"," else at if where != b'{"model"' else 1
                raw = raw[:cut] + rng.choice([b"\n", b"\r\n", b" \n "]) + raw[cut:]
        _check(bodies, raw)
        doc = bodies.newest("t").doc
        known += doc.flat is not None
        assert doc.is_flat() is not has_line_break(raw, 0, len(raw))
    assert known > 0


def test_only_the_changed_message_is_parsed_and_the_rest_is_the_kept_objects() -> None:
    rng = random.Random(1)
    bodies = Bodies()
    first = _session(rng, 12)
    _check(bodies, _compact(first))
    kept = bodies.newest("t").items
    second = copy.deepcopy(first)
    second["messages"].append({"role": "user", "content": "next"})
    _check(bodies, _compact(second))
    assert bodies.reused == 1
    again = bodies.newest("t").items
    assert all(a is b for a, b in zip(kept, again[: len(kept)], strict=True))
    third = copy.deepcopy(second)
    third["messages"][0]["content"] += " changed"
    third["messages"][-1]["content"] = "retried"
    _check(bodies, _compact(third))
    assert bodies.reused == 2
    now = bodies.newest("t").items
    assert all(a is b for a, b in zip(again[1:-1], now[1:-1], strict=True))  # the middle run, found again


def test_a_new_item_with_whitespace_around_it_has_the_span_a_scan_finds() -> None:
    rng = random.Random(3)
    bodies = Bodies()
    first = _session(rng, 4)
    _check(bodies, _compact(first))
    second = copy.deepcopy(first)
    second["messages"].append({"role": "user", "content": "next"})
    raw = _compact(second)
    at = raw.rindex(b',{"role"') + 1
    _check(bodies, raw[:at] + b" \n " + raw[at:])  # every item's span, as JsonDoc finds it
    assert bodies.reused == 1


def test_bodies_not_written_as_orjson_writes_them_are_parsed_whole() -> None:
    rng = random.Random(2)
    bodies = Bodies()
    body = _session(rng, 6)
    for n in range(4):
        body["messages"].append({"role": "user", "content": f"é {n}"})
        for raw in (json.dumps(body).encode(), json.dumps(body, indent=1).encode()):
            _check(bodies, raw, scope="spaced")
    assert bodies.reused == 0
    # Numbers orjson writes otherwise (0.50, an integer past 64 bits, parsed as a float)
    # make a body's items unusable, never wrong.
    for n in range(3):
        raw = b'{"messages":[{"role":"user","content":"a","x":0.50,"big":123456789012345678901234567890}'
        raw += b',{"role":"user","content":"%d"}' % n * n + b"]}"
        _check(bodies, raw, scope="numbers")
    assert bodies.reused == 0


def test_a_duplicate_member_is_the_last_one_as_in_the_whole_parse() -> None:
    bodies = Bodies()
    for n in range(3):
        raw = b'{"messages":[{"role":"user","content":"early"}],"m":1,"messages":[{"role":"user","content":"%d"}]}' % n
        _check(bodies, raw)
        raw2 = b'{"meta":{"messages":[{"role":"user","content":"%d"}]},"messages":[{"role":"user","content":"x"}]}' % n
        _check(bodies, raw2)


def test_one_tenants_bodies_are_never_reused_for_another() -> None:
    rng = random.Random(3)
    bodies = Bodies()
    body = _session(rng, 10)
    _check(bodies, _compact(body), scope="a")
    body["messages"].append({"role": "user", "content": "next"})
    _check(bodies, _compact(body), scope="b")
    assert bodies.reused == 0
    _check(bodies, _compact(body), scope="a")
    assert bodies.reused == 1


def _conversation(c: int, turns: int) -> list[bytes]:
    """Conversation ``c``'s bodies: a system prompt whose minute moves every turn, its own
    first message, a reply and a new question per turn."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {c}: " + "y" * 300}]
    out = []
    for k in range(turns):
        system = {"role": "system", "content": "You are helpful. " + "x" * 500 + f"\nStarted: 10:{k:02d}"}
        out.append(_compact({"model": "m", "messages": [system, *messages], "tools": [{"name": "t"}]}))
        messages += [{"role": "assistant", "content": f"answer {k}"}, {"role": "user", "content": f"next {k}"}]
    return out


def test_interleaved_conversations_each_continue_from_their_own_previous_body() -> None:
    """64 conversations under one tenant, sent round robin, each turn's system prompt
    moved: every turn after the first is parsed by pieces of its conversation's previous
    body, which it then replaces."""
    bodies = Bodies()
    convs = [_conversation(c, 4) for c in range(64)]
    for k in range(4):
        for c, turns in enumerate(convs):
            body = _check(bodies, turns[k])
            assert len(bodies) == (64 if k else c + 1)
            if k:
                kept = bodies.newest("t")
                assert kept is not None and kept.base is not None and kept.base.items[1] is kept.items[1]
                assert body["messages"][1]["content"].startswith(f"task {c}:")
    assert bodies.reused == 63 + 3 * 64  # the first turns share their prompt: each reuses the one before


def test_a_new_conversation_reuses_a_shared_prompt_and_leaves_that_body() -> None:
    """A conversation that starts with another's system prompt and tools reuses their
    parse; the other conversation's body stays for its own next turn."""
    bodies = Bodies()
    system = {"role": "system", "content": "Shared prompt. " + "x" * 500}
    tools = [{"name": "t"}]
    a1 = _compact({"messages": [system, {"role": "user", "content": "a"}], "tools": tools})
    b1 = _compact({"messages": [system, {"role": "user", "content": "b"}], "tools": tools})
    _check(bodies, a1)
    kept_a = bodies.newest("t")
    assert kept_a is not None
    _check(bodies, b1)
    assert bodies.reused == 1 and len(bodies) == 2
    kept_b = bodies.newest("t")
    assert kept_b is not None and kept_b.items[0] is kept_a.items[0]  # the prompt's parse, shared
    a2 = _compact({"messages": [system, {"role": "user", "content": "a"}, {"role": "user", "content": "a2"}]})
    a2 = a2[:-1] + b',"tools":[{"name":"t"}]}'
    _check(bodies, a2)
    assert bodies.reused == 2 and len(bodies) == 2
    assert kept_a not in bodies._all  # replaced by its conversation's next body


def test_a_new_conversation_with_no_message_in_common_reuses_the_head_and_tail() -> None:
    """Another prompt, another first message: only the item array is parsed, the
    model and tools are the newest body's parse; that body stays."""
    bodies = Bodies()
    tools = [{"type": "function", "function": {"name": f"t{j}", "parameters": {"type": "object"}}} for j in range(9)]
    a = {
        "model": "m",
        "messages": [{"role": "system", "content": "A"}, {"role": "user", "content": "a"}],
        "tools": tools,
    }
    b = {**a, "messages": [{"role": "system", "content": "B"}, {"role": "user", "content": "b"}]}
    _check(bodies, _compact(a))
    _check(bodies, _compact(b))
    kept_a, kept_b = list(bodies._all)
    assert bodies.reused == 1 and kept_b.top["tools"] is kept_a.top["tools"]
    assert kept_b.spans is not None and kept_b.open > 0  # its layout, found by the gap's parse


def _one(n: int, scope: str, size: int = 500) -> tuple[bytes, str, str]:
    return _compact({"messages": [{"role": "user", "content": f"{n} " + "x" * size}]}), "messages", scope


def test_remembered_bodies_are_bounded_in_number_least_recently_used_first() -> None:
    bodies = Bodies(max_bodies=4)

    def send(prompt: str, first: str) -> None:
        raw = _compact({"messages": [{"role": "system", "content": prompt * 50}, {"role": "user", "content": first}]})
        _check(bodies, raw, scope="s")

    for n in "abcd":
        send(n, n)
    send("a", "e")  # another conversation with a's prompt: a's body is used, so kept longest
    assert bodies.reused == 4 and len(bodies) == 4  # (b, c, d: the newest body's head and tail reused)
    assert [k.items[1]["content"] for k in bodies._all] == ["c", "d", "a", "e"]
    for n in "fg":
        send(n, n)
        assert len(bodies) == 4
    assert [k.items[1]["content"] for k in bodies._all] == ["a", "e", "f", "g"]


def test_remembered_bodies_are_bounded_per_tenant() -> None:
    bodies = Bodies(per_scope=2)
    for n in range(9):
        bodies.parse(*_one(n, f"s{n % 3}"))
        assert all(len(v) <= 2 for v in bodies._scopes.values())
    assert len(bodies) == 6
    bodies.parse(*_one(99, "s0"))
    assert len(bodies._scopes["s0"]) == 2 and len(bodies) == 6


def test_remembered_bodies_are_bounded_in_bytes() -> None:
    bodies = Bodies(max_bytes=10_000)
    for n in range(50):
        bodies.parse(*_one(n, f"s{n % 7}"))
        assert bodies.size <= 10_000
    assert bodies.size == sum(len(b.raw) for b in bodies._all) > 9_000
    kept = len(bodies)
    found = bodies.parse(*_one(1, "s", size=1_300))  # over an eighth of the bound: not kept
    assert found is not None and found[2] is None and len(bodies) == kept


def test_bodies_sharing_a_lead_item_are_bounded_per_key() -> None:
    """Many conversations opening with the same message: each key finds its newest
    ``per_key`` bodies; a body nothing finds any more is forgotten."""
    bodies = Bodies(per_key=2)
    system = {"role": "system", "content": "p"}
    for n in range(5):
        bodies.parse(_compact({"messages": [system, {"role": "user", "content": f"u{n}"}]}), "messages", "s")
        assert all(len(v) <= 2 for v in bodies._index.values())
    assert len(bodies) == 5  # each still found by its own first message
    for n in range(5):  # found by their first item only (the skim reads no number): pushed out, forgotten
        bodies.parse(b'{"messages":[{"role":"user","content":"same"},%d]}' % n, "messages", "t")
    assert len(bodies._scopes["t"]) == 2 and len(bodies) == 7
    assert all(len(v) <= 2 for v in bodies._index.values())


def test_a_body_found_by_nothing_is_tried_as_the_tenants_newest() -> None:
    """Both lead items changed (a system prompt and a first message rewritten): the
    tenant's newest body is tried, and its items reused where they are equal."""
    bodies = Bodies()
    msgs = [{"role": "user", "content": f"m{i} " + "x" * 100} for i in range(6)]
    _check(bodies, _compact({"messages": [{"role": "system", "content": "a"}, *msgs]}))
    changed = [{"role": "system", "content": "b"}, {"role": "user", "content": "other"}, *msgs[1:]]
    _check(bodies, _compact({"messages": changed}))
    assert bodies.reused == 1


def test_the_lead_is_a_hint_never_a_parse() -> None:
    """Bytes the skim reads otherwise than a parser would (a look-alike member first, a
    number, a broken string) give other marks or none, and the body is parsed as orjson
    parses it."""
    escaped = b'{"messages":["a\\\\\\"b",{"c":"]"}]}'  # a quote after three backslashes, a bracket in a string
    assert [m[1] for m in lead(escaped, "messages", "t")] == [0, 1]
    assert lead(b'{"messages":[1,2]}', "messages", "t") == ()
    assert lead(b'{"messages":["unterminated', "messages", "t") == ()
    rng = random.Random(5)
    for n in range(200):  # written compactly: the items' own bytes, whichever way the skim took
        items = [_message(rng, n), _message(rng, n + 1)]
        if n % 3 == 0:
            items[0] = {"role": "system", "content": _text(rng), **({"name": "x"} if n % 2 else {})}
        if n % 5 == 0:
            items[0] = {"role": "system", "content": _text(rng) * 80}  # long: by its first KiB and length
        marks = lead(_compact({"model": "m", "messages": items}), "messages", "t")
        own = [_compact(item) for item in items]
        assert marks == (
            ("t", 0, xxhash.xxh3_128_intdigest(own[0][:LEAD_BYTES], len(own[0]))),
            ("t", 1, xxhash.xxh3_128_intdigest(own[1], len(own[1]))),
        )
    for raw in (escaped, b'{"meta":{"messages":[{"a":1}]},"messages":[{"role":"user","content":"x"}]}'):
        bodies = Bodies()
        for _ in range(2):
            _check(bodies, raw)
    assert Bodies().parse(b'{"messages":["unterminated', "messages", "t") is None


def test_the_skim_is_bounded_and_a_body_it_gives_up_on_still_continues(monkeypatch: pytest.MonkeyPatch) -> None:
    """A system message of 5,000 text parts: the skim for its lead stops after
    SKIM_TOKENS strings and brackets (walked whole, ~30,000 of them held the loop ~50 ms
    at 1 MB) and the body has no mark; its next turn is still parsed by pieces of it,
    the tenant's newest body."""
    import re

    import canonicalize.bodies as bodies_module

    calls = 0
    pattern = re.compile(rb'["\[\]{}]')

    class Counted:
        def search(self, raw: bytes, pos: int) -> Any:
            nonlocal calls
            calls += 1
            return pattern.search(raw, pos)

    monkeypatch.setattr(bodies_module, "_TOKEN", Counted())
    parts = [{"type": "text", "text": f"rule {i}"} for i in range(5000)]
    turn = [{"role": "system", "content": parts}, {"role": "user", "content": "hi"}]
    raw = _compact({"model": "m", "messages": turn})
    assert lead(raw, "messages", "t") == () and calls == SKIM_TOKENS
    small = _compact({"messages": [{"role": "system", "content": parts[:3]}, {"role": "user", "content": "hi"}]})
    assert [m[1] for m in lead(small, "messages", "t")] == [0, 1]  # a few parts: skimmed
    bodies = Bodies()
    _check(bodies, raw)
    turn += [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    _check(bodies, _compact({"model": "m", "messages": turn}))
    assert bodies.reused == 1 and len(bodies) == 1


def test_bodies_that_are_not_objects_or_not_json() -> None:
    bodies = Bodies()
    found = bodies.parse(b"[1,2]", "messages", "t")
    assert found is not None and found[0] == [1, 2]
    assert bodies.parse(b'{"messages":', "messages", "t") is None
    assert bodies.parse(b"", "messages", "t") is None
    found = bodies.parse(b'{"input":"a string"}', "input", "t")
    assert found is not None and found[0] == {"input": "a string"}


def _consistent(bodies: Bodies) -> None:
    """The memo's books agree: each remembered body is in its tenant's order and in the
    bucket of each mark it has, each bucket holds only bodies with its mark, newest
    first and ``per_key`` at most, and the bytes counted are the bodies'."""
    assert {k for recent in bodies._scopes.values() for k in recent} == set(bodies._all)
    for scope, recent in bodies._scopes.items():
        assert recent and all(k.scope == scope for k in recent)
    for kept in bodies._all:
        assert kept.marks and all(kept in bodies._index[m] for m in kept.marks)
    for mark, bucket in bodies._index.items():
        assert bucket and len(bucket) <= bodies.per_key and len(set(map(id, bucket))) == len(bucket)
        assert all(mark in k.marks and k in bodies._all for k in bucket)
    assert bodies.size == sum(len(k.raw) for k in bodies._all)


@pytest.mark.parametrize("seed", range(40))
def test_the_memos_books_agree_whatever_the_conversations_do(seed: int) -> None:
    """Conversations continued, their prompts edited, forked, retried and started anew
    (with their own prompt or another's), in one tenant or two, under tight bounds:
    after every body the books agree (a body that continues another takes its place,
    found by its own marks), and each bucket holds its bodies newest first (in the
    order they were remembered)."""
    rng = random.Random(seed)
    bodies = Bodies(max_bodies=6, per_scope=4, per_key=2, max_bytes=60_000)
    talks: list[tuple[str, list[dict[str, Any]]]] = []
    born: dict[Kept, int] = {}  # when each body was remembered
    for n in range(60):
        choice = rng.random()
        if not talks or choice < 0.15:  # a new conversation, as often as not with a prompt another has
            prompt = rng.choice(talks)[1][0]["content"] if talks and rng.random() < 0.5 else _prompt(rng)
            talks.append((rng.choice("ab"), [{"role": "system", "content": prompt}, _message(rng, n)]))
        scope, messages = talks[rng.randrange(len(talks))]
        if choice < 0.3 and "\n" in messages[0]["content"]:
            messages[0] = {"role": "system", "content": _edit_prompt(rng, messages[0]["content"])}
        elif choice < 0.4 and len(messages) > 2:
            messages = messages[: rng.randrange(2, len(messages))]  # a fork (or a retry) of an earlier turn
            talks.append((scope, messages))
        messages.append(_message(rng, n))
        _check(bodies, _compact({"model": "m", "messages": messages}), scope=scope)
        _consistent(bodies)
        newest = bodies.newest(scope)
        if newest is not None:
            born.setdefault(newest, n)
        for bucket in bodies._index.values():
            order = [born[k] for k in bucket]
            assert order == sorted(order, reverse=True), order
