"""canonicalize.openai_cache: OpenAI's explicit breakpoints and the diagnostics
comparison as byte-preserving edits."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from canonicalize import JsonDoc, render
from canonicalize.edits import AddMember, Op, SetItems, SetMember, SetString
from canonicalize.openai_cache import (
    EXPLICIT,
    MEMBER,
    chat_breakpoints,
    comparison,
    responses_breakpoints,
)
from canonicalize.provider import place, sent_breakpoints

BP = b'"prompt_cache_breakpoint":{"mode":"explicit"}'


def _chat(raw: bytes, ops: list[Op] | None = None, body: dict[str, Any] | None = None) -> bytes:
    doc = JsonDoc(raw)
    return render(doc, place(ops or [], chat_breakpoints(doc, body or orjson.loads(raw)), member=MEMBER))


def _responses(raw: bytes, ops: list[Op] | None = None, body: dict[str, Any] | None = None) -> bytes:
    doc = JsonDoc(raw)
    return render(doc, place(ops or [], responses_breakpoints(doc, body or orjson.loads(raw)), member=MEMBER))


CHAT = (
    b'{ "model":"gpt-5.6", "temperature":0.50,\n "messages":[ {"role":"system","content":"You are \\u00e9 careful."},\n'
    b' {"role":"user","content":"List the files."},\n'
    b' {"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",'
    b'"function":{"name":"ls","arguments":"{}"}}]},\n'
    b' {"role":"tool","tool_call_id":"c","content":"README.md"},\n'
    b' {"role":"assistant","content":"Two files."},\n'
    b' {"role":"user","content":"And the tests?"} ] }'
)


def _part(text: bytes, kind: bytes = b"text") -> bytes:
    return b'[{"type":"' + kind + b'","text":' + text + b"," + BP + b"}]"


def test_chat_the_system_and_the_newest_user_or_tool_message_before_the_last_user_message() -> None:
    out = _chat(CHAT)
    # Each string made one text part carrying the breakpoint, its bytes as sent
    # (the escape kept); every other byte as sent.
    expected = CHAT.replace(b'"You are \\u00e9 careful."', _part(b'"You are \\u00e9 careful."')).replace(
        b'"README.md"', _part(b'"README.md"')
    )
    assert out == expected
    body = orjson.loads(out)
    assert [m.get("content") for m in body["messages"] if m["role"] == "assistant"] == [None, "Two files."]
    assert out.count(b"prompt_cache_breakpoint") == 2


def test_chat_text_parts_get_the_member_and_nothing_else_changes() -> None:
    raw = (
        b'{"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"},'
        b'{"type":"image_url","image_url":{"url":"x"}}]},{"role":"user","content":[{"type":"text","text":"q"},'
        b'{"type":"text","text":""}]},{"role":"assistant","content":"r"},{"role":"user","content":"next"}]}'
    )
    out = _chat(raw)
    assert out == raw.replace(b'"text":"b"}', b'"text":"b",' + BP + b"}").replace(
        b'"text":"q"}', b'"text":"q",' + BP + b"}"
    )


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hi"}],  # a first request: nothing before the last user message
        [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "hi"}],
        [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}],  # an empty system: nothing to mark
    ],
)
def test_chat_nothing_to_mark(messages: list[dict[str, Any]]) -> None:
    raw = orjson.dumps({"model": "m", "messages": messages})
    assert chat_breakpoints(JsonDoc(raw), orjson.loads(raw)) == []


def test_chat_never_an_assistant_part_and_at_most_two() -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    for i in range(20):
        messages += [
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
        ]
    messages.append({"role": "user", "content": "last"})
    raw = orjson.dumps({"messages": messages})
    ops = chat_breakpoints(JsonDoc(raw), orjson.loads(raw))
    assert len(ops) == 2
    out = orjson.loads(render(JsonDoc(raw), ops))
    marked = [i for i, m in enumerate(out["messages"]) if MEMBER.encode() in orjson.dumps(m)]
    assert marked == [0, 39] and out["messages"][39]["role"] == "user"


def test_a_rule_changed_string_is_marked_with_its_new_value() -> None:
    raw = b'{"messages":[{"role":"system","content":"at 10:00"},{"role":"user","content":"q"}]}'
    body = orjson.loads(raw)
    body["messages"][0]["content"] = "at <pinned>"
    ops: list[Op] = [SetString(("messages", 0, "content"), "at <pinned>")]
    out = _chat(raw, ops, body)
    assert orjson.loads(out)["messages"][0]["content"] == [
        {"type": "text", "text": "at <pinned>", "prompt_cache_breakpoint": {"mode": "explicit"}}
    ]


def test_a_forks_recorded_system_loses_the_parents_breakpoint_and_gets_its_own() -> None:
    raw = (
        b'{"messages":[{"role":"system","content":"mine"},{"role":"system","content":"more"},'
        b'{"role":"user","content":"q"},{"role":"assistant","content":"a"},{"role":"user","content":"r"}]}'
    )
    parent = b'{"role":"system","content":[{"type":"text","text":"parent" ,' + BP + b"}]}"
    body = orjson.loads(raw)
    body["messages"] = [orjson.loads(parent), *body["messages"][2:]]
    out = _chat(raw, [SetItems(("messages",), 0, 2, (parent,))], body)
    assert out == (
        b'{"messages":[{"role":"system","content":[{"type":"text","text":"parent",' + BP + b"}]},"
        b'{"role":"user","content":' + _part(b'"q"') + b'},{"role":"assistant","content":"a"},'
        b'{"role":"user","content":"r"}]}'
    )
    assert out.count(BP) == 2  # the parent's, taken off and put back: never two on one part


RESPONSES = (
    b'{"model":"gpt-5.6","instructions":"Be careful.","input":[{"type":"message","role":"developer",'
    b'"content":"<permissions>"},{"role":"user","content":[{"type":"input_text","text":"<env>"}]},'
    b'{"role":"user","content":"Fix the bug."},{"type":"reasoning","summary":[]},'
    b'{"type":"function_call","call_id":"c1","name":"shell","arguments":"{}"},'
    b'{"type":"function_call_output","call_id":"c1","output":"ok"},'
    b'{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Done."}]},'
    b'{"role":"user","content":"Thanks."}],"max_output_tokens":1e3}'
)


def test_responses_the_developer_item_and_the_newest_tool_output() -> None:
    out = _responses(RESPONSES)
    assert out == RESPONSES.replace(b'"<permissions>"', _part(b'"<permissions>"', b"input_text")).replace(
        b'"output":"ok"', b'"output":' + _part(b'"ok"', b"input_text")
    )
    # instructions cannot carry one; an input_text part gets the member.
    first_turn = RESPONSES[: RESPONSES.index(b',{"type":"reasoning"')] + b'],"max_output_tokens":1e3}'
    out = _responses(first_turn)
    assert out == first_turn.replace(b'"<permissions>"', _part(b'"<permissions>"', b"input_text")).replace(
        b'"text":"<env>"}', b'"text":"<env>",' + BP + b"}"
    )


def test_responses_a_string_input_or_no_history_has_nothing_to_mark() -> None:
    for raw in (b'{"input":"hi"}', b'{"instructions":"x","input":[{"role":"user","content":"hi"}]}'):
        assert responses_breakpoints(JsonDoc(raw), orjson.loads(raw)) == []


def test_the_clients_own_breakpoints_leave_the_request_alone() -> None:
    own = (
        CHAT.replace(b'"text":', b'"text":')[:-3]
        + b',{"role":"user","content":[{"type":"text","text":"x",'
        + BP
        + b"}]}]}"
    )
    assert sent_breakpoints(own, MEMBER)
    assert not sent_breakpoints(CHAT, MEMBER)
    assert not sent_breakpoints(b'{"messages":[{"role":"user","content":"prompt_cache_breakpoint"}]}', MEMBER)


def test_comparison_names_the_previous_response_unless_the_client_did() -> None:
    assert comparison({"input": []}, "resp_1") == AddMember(
        "prompt_cache_options", b'{"comparison_response_id":"resp_1"}'
    )
    assert comparison({"prompt_cache_options": {"mode": "explicit"}}, "resp_1") == SetMember(
        ("prompt_cache_options",), "comparison_response_id", b'"resp_1"'
    )
    assert comparison({"prompt_cache_options": {"comparison_response_id": "mine"}}, "resp_1") is None
    assert comparison({"prompt_cache_options": None}, "resp_1") is None
    # Never prompt_cache_options added next to a prompt_cache_retention.
    assert comparison({"prompt_cache_retention": "24h"}, "resp_1") is None
    assert comparison({}, "resp_1", retention_added=True) is None
    raw = b'{"input":[] , "prompt_cache_options":{ "mode":"explicit" }}'
    op = comparison(orjson.loads(raw), 'r"1')
    assert op is not None
    assert (
        render(JsonDoc(raw), [op])
        == b'{"input":[] , "prompt_cache_options":{ "mode":"explicit" ,"comparison_response_id":"r\\"1"}}'
    )


def test_the_marker_is_openais() -> None:
    assert orjson.loads(EXPLICIT) == {"mode": "explicit"} and MEMBER == "prompt_cache_breakpoint"
