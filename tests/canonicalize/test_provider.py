"""canonicalize.provider: cache keys, Anthropic breakpoints as byte-preserving
edits fitted into the edits already decided."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from canonicalize import JsonDoc, render
from canonicalize.edits import DeleteMember, Op, SetItems, SetMember, SetValue
from canonicalize.provider import (
    DIAGNOSIS_BETA,
    breakpoints,
    cache_key,
    chat_breakpoints,
    diagnostics,
    has_cache_control,
    place,
    sent_breakpoints,
    unmarked,
    with_beta,
)

CC = b'"cache_control":{"type":"ephemeral"}'
CC_1H = b'"cache_control":{"type":"ephemeral","ttl":"1h"}'


def _apply(raw: bytes, ops: list[Op] | None = None, ttl: str = "5m") -> tuple[bytes, list[Op]]:
    doc = JsonDoc(raw)
    found = breakpoints(doc, orjson.loads(raw), ttl=ttl)
    return render(doc, place(ops or [], found)), found


def test_cache_key_is_keyed_by_tenant_and_root() -> None:
    key = cache_key("tenant-a", "L1")
    assert re.fullmatch(r"pp-[0-9a-f]{24}", key)
    assert key == cache_key("tenant-a", "L1")
    assert key != cache_key("tenant-b", "L1")
    assert key != cache_key("tenant-a", "L2")


RAW = (
    b'{ "model" : "claude-x", "max_tokens":1e3, "system": "You are \\u00e9 helpful.  ",\n'
    b' "tools": [ {"name":"a","input_schema":{}}, {"name":"ls", "input_schema":{"x":0.50} } ],\n'
    b' "messages": [ {"role":"user","content":"hi"},\n'
    b'  {"role":"assistant","content":[{"type":"text","text":"hello"},\n'
    b'   {"type":"tool_use","id":"t","name":"ls","input":{}} ]},\n'
    b'  {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok"}]} ] }'
)


@pytest.mark.parametrize(("ttl", "first"), [("5m", CC), ("1h", CC_1H)])
def test_breakpoints_at_the_end_of_system_and_tools_and_before_the_last_user_turn(ttl: str, first: bytes) -> None:
    # Anthropic's prefix is tools, system, messages: system+tools ends at the system.
    out, ops = _apply(RAW, ttl=ttl)
    assert len(ops) == 2
    expected = RAW.replace(
        b'"You are \\u00e9 helpful.  "', b'[{"type":"text","text":"You are \\u00e9 helpful.  ",' + first + b"}]"
    ).replace(b'"input":{}} ]', b'"input":{},' + CC + b"} ]")
    assert out == expected
    assert out.count(b"cache_control") == 2
    # The 1h breakpoint comes first; the later one keeps Anthropic's default 5 minutes.
    assert out.index(first) < out.index(CC + b"} ]")


def test_without_a_system_the_last_tool_ends_system_and_tools() -> None:
    raw = RAW.replace(b' "system": "You are \\u00e9 helpful.  ",\n', b"")
    out, _ = _apply(raw, ttl="1h")
    assert out == raw.replace(b'{"x":0.50} }', b'{"x":0.50} ,' + CC_1H + b"}").replace(
        b'"input":{}} ]', b'"input":{},' + CC + b"} ]"
    )
    # A system of only empty text blocks has nothing to mark: the last tool is.
    empty = RAW.replace(b'"You are \\u00e9 helpful.  "', b'[{"type":"text","text":""}]')
    assert _apply(empty)[1][0] == SetMember(("tools", 1), "cache_control", b'{"type":"ephemeral"}')


def test_string_system_becomes_one_block_only_without_tools() -> None:
    raw = b'{"model":"m","system":"Be \\"brief\\"\\n","messages":[{"role":"user","content":"q"}]}'
    out, _ = _apply(raw)
    block = b'[{"type":"text","text":"Be \\"brief\\"\\n",' + CC + b"}]"
    assert out == raw.replace(b'"Be \\"brief\\"\\n"', block)


def test_string_content_before_the_last_user_turn_becomes_one_block() -> None:
    raw = (
        b'{"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"q1"},'
        b'{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}'
    )
    out, ops = _apply(raw)
    assert out == raw.replace(b'"text":"s"}', b'"text":"s",' + CC + b"}").replace(
        b'"content":"a1"', b'"content":[{"type":"text","text":"a1",' + CC + b"}]"
    )
    assert len(ops) == 2


@pytest.mark.parametrize(
    "where",
    [
        {"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]},
        {"tools": [{"name": "t", "input_schema": {}, "cache_control": {"type": "ephemeral"}}]},
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral"}}]}
            ]
        },
    ],
)
def test_a_request_with_its_own_breakpoints_is_left_alone(where: dict[str, Any]) -> None:
    body = {"system": "s", "messages": [{"role": "user", "content": "a"}], **where}
    assert has_cache_control(body) and sent_breakpoints(orjson.dumps(body))
    assert not sent_breakpoints(b'{"system":"s","messages":[{"role":"user","content":"no cache_control here"}]}')


def test_no_breakpoint_on_thinking_or_empty_blocks_nor_inside_replaced_values() -> None:
    body = {
        "tools": [{"name": "t", "input_schema": {}}],
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "text", "text": ""}, {"type": "thinking", "thinking": "x"}]},
            {"role": "user", "content": "q2"},
        ],
    }
    doc = JsonDoc(orjson.dumps(body))
    assert breakpoints(doc, body) == [SetMember(("tools", 0), "cache_control", b'{"type":"ephemeral"}')]
    # A breakpoint inside a value replaced whole is made in the replacement's bytes.
    recorded = b'[ {"name":"t","input_schema":{ }} ]'
    placed = place([SetMember((), "tools", recorded)], breakpoints(doc, body))
    assert placed == [
        SetMember((), "tools", b'[ {"name":"t","input_schema":{ },"cache_control":{"type":"ephemeral"}} ]')
    ]
    assert place([DeleteMember((), "tools")], breakpoints(doc, body)) == [DeleteMember((), "tools")]


def test_a_rewritten_system_string_is_taken_as_forwarded() -> None:
    raw = b'{"system":"at 10:00","messages":[]}'
    body = {"system": "at <pinned>", "messages": []}
    (op,) = breakpoints(JsonDoc(raw), body)
    assert isinstance(op, SetValue)
    assert orjson.loads(op.raw) == [{"type": "text", "text": "at <pinned>", "cache_control": {"type": "ephemeral"}}]


def test_chat_breakpoints_are_members_added_for_litellm() -> None:
    raw = (
        b'{"model":"anthropic/c","messages":[{"role":"system","content":"s"},{"role":"user","content":"q"},'
        b'{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f",'
        b'"arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"out"}]}'
    )
    doc = JsonDoc(raw)
    out = render(doc, chat_breakpoints(orjson.loads(raw)))
    assert out == raw.replace(b'"content":"s"}', b'"content":"s",' + CC + b"}").replace(
        b'"arguments":"{}"}}', b'"arguments":"{}"},' + CC + b"}"
    )
    # With tools, the end of system+tools is still the system message (Anthropic puts tools first).
    with_tools = {**orjson.loads(raw), "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert [type(op).__name__ for op in chat_breakpoints(with_tools)] == ["SetMember", "SetMember"]
    assert chat_breakpoints(with_tools, ttl="1h")[0] == SetMember(
        ("messages", 0), "cache_control", b'{"type":"ephemeral","ttl":"1h"}'
    )
    no_system = {**with_tools, "messages": with_tools["messages"][1:]}
    assert chat_breakpoints(no_system)[0] == SetMember(("tools", 0), "cache_control", b'{"type":"ephemeral"}')
    parts = {**with_tools, "messages": [{"role": "system", "content": [{"type": "text", "text": "s"}]}]}
    assert chat_breakpoints(parts, ttl="1h") == [
        SetMember(("messages", 0, "content", 0), "cache_control", b'{"type":"ephemeral","ttl":"1h"}')
    ]


def test_recorded_bytes_lose_their_old_breakpoints() -> None:
    """A lineage's recorded tools[] (or a fork parent's system) carry the breakpoints
    they were forwarded with: the request gets only the ones placed now, so a 5m
    breakpoint left on the tools never precedes the new 1h one on the system."""
    raw = (
        b'{"system":[{"type":"text","text":"s"}],"tools":[{"name":"t","input_schema":{}}],'
        b'"messages":[{"role":"user","content":"q"}]}'
    )
    recorded = b'[ {"name":"t","input_schema":{ },"cache_control":{"type":"ephemeral"}} ]'
    doc = JsonDoc(raw)
    ops = place([SetMember((), "tools", recorded)], breakpoints(doc, orjson.loads(raw), ttl="1h"))
    out = render(doc, ops)
    assert out == raw.replace(b'"text":"s"}', b'"text":"s",' + CC_1H + b"}").replace(
        b'[{"name":"t","input_schema":{}}]', b'[ {"name":"t","input_schema":{ }} ]'
    )
    assert unmarked(b'{"a": 0.50, "cache_control" :{"type":"ephemeral"} , "b":[{"cache_control":1}]}') == (
        b'{"a": 0.50, "b":[{}]}'
    )
    assert unmarked(b'{"a":1.0}') == b'{"a":1.0}'


def test_a_chat_forks_recorded_system_messages_get_the_breakpoint_in_their_bytes() -> None:
    # The fork's own two system messages were replaced by its parent's one: the
    # forwarded body counts one, the client's bytes two.
    raw = (
        b'{"messages":[{"role":"system","content":"mine"},{"role":"system","content":"more"},'
        b'{"role":"user","content":"q"},{"role":"assistant","content":"a"},{"role":"user","content":"r"}]}'
    )
    parent = b'{"role":"system","content":"parent" ,"cache_control":{"type":"ephemeral"}}'
    body = orjson.loads(raw)
    body["messages"] = [orjson.loads(parent), *body["messages"][2:]]
    ops = place([SetItems(("messages",), 0, 2, (parent,))], chat_breakpoints(body, ttl="1h"))
    out = render(JsonDoc(raw), ops)
    assert out == (
        b'{"messages":[{"role":"system","content":"parent",' + CC_1H + b"},"
        b'{"role":"user","content":"q"},{"role":"assistant","content":"a",' + CC + b'},{"role":"user","content":"r"}]}'
    )


def test_diagnostics_member_and_beta_header() -> None:
    assert diagnostics('msg_01"x') == b'{"previous_message_id":"msg_01\\"x"}'
    assert with_beta([]) == DIAGNOSIS_BETA
    assert (
        with_beta(["prompt-caching-2024-07-31, files-api"]) == f"prompt-caching-2024-07-31,files-api,{DIAGNOSIS_BETA}"
    )
    assert with_beta(["a", f"b,{DIAGNOSIS_BETA}"]) == f"a,b,{DIAGNOSIS_BETA}"
