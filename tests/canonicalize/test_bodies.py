"""Bodies parsed by pieces of a tenant's recent bodies: every parse is the one the
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

from canonicalize.bodies import SHARED, Bodies
from canonicalize.jsonspan import JsonDoc


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


def _session(rng: random.Random, n: int) -> dict[str, Any]:
    system = {"role": "system", "content": f"You are helpful. Now: 10:{rng.randint(10, 59)}. {_text(rng)}"}
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
            msgs[0] = {"role": "system", "content": msgs[0]["content"] + _text(rng)[:3] + "!"}
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
    for i, msg in enumerate(body["messages"]):  # through the item spans the doc knows, or its own search
        for path in [("messages", i), *((("messages", i, k) for k in msg) if isinstance(msg, dict) else ())]:
            assert doc.span(path) == JsonDoc(raw).span(path), path
    return body  # type: ignore[no-any-return]


@pytest.mark.parametrize("seed", range(40))
def test_a_session_parsed_by_pieces_is_parsed_as_orjson_parses_it_whole(seed: int) -> None:
    rng = random.Random(seed)
    bodies = Bodies()
    sessions = [_session(rng, rng.randint(0, 8)) for _ in range(3)]
    for turn in range(30):
        s = rng.randrange(len(sessions))
        sessions[s] = _mutate(rng, sessions[s], turn)
        raw = _compact(sessions[s])
        body = _check(bodies, raw)
        doc = bodies._scopes["t"][0].doc
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
    assert bodies.reused > 0


def test_only_the_changed_message_is_parsed_and_the_rest_is_the_kept_objects() -> None:
    rng = random.Random(1)
    bodies = Bodies()
    first = _session(rng, 12)
    _check(bodies, _compact(first))
    kept = bodies._scopes["t"][0].items
    second = copy.deepcopy(first)
    second["messages"].append({"role": "user", "content": "next"})
    _check(bodies, _compact(second))
    assert bodies.reused == 1
    again = bodies._scopes["t"][0].items
    assert all(a is b for a, b in zip(kept, again[: len(kept)], strict=True))
    third = copy.deepcopy(second)
    third["messages"][0]["content"] += " changed"
    third["messages"][-1]["content"] = "retried"
    _check(bodies, _compact(third))
    assert bodies.reused == 2
    now = bodies._scopes["t"][0].items
    assert all(a is b for a, b in zip(again[1:-1], now[1:-1], strict=True))  # the middle run, found again


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


def test_remembered_bodies_are_bounded_per_tenant_and_in_bytes() -> None:
    bodies = Bodies(per_scope=2, max_bytes=10_000)
    for n in range(50):
        raw = _compact({"messages": [{"role": "user", "content": f"{n} " + "x" * 500}]})
        bodies.parse(raw, "messages", f"s{n % 7}")
        assert all(len(v) <= 2 for v in bodies._scopes.values())
        assert bodies._bytes <= 10_000 or sum(len(v) for v in bodies._scopes.values()) == 1
    assert bodies._bytes == sum(len(b.raw) for v in bodies._scopes.values() for b in v)


def test_bodies_that_are_not_objects_or_not_json() -> None:
    bodies = Bodies()
    found = bodies.parse(b"[1,2]", "messages", "t")
    assert found is not None and found[0] == [1, 2]
    assert bodies.parse(b'{"messages":', "messages", "t") is None
    assert bodies.parse(b"", "messages", "t") is None
    found = bodies.parse(b'{"input":"a string"}', "input", "t")
    assert found is not None and found[0] == {"input": "a string"}
