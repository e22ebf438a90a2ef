"""canonicalize.evidence: the changed field, its first differing byte, and the texts around it."""

from __future__ import annotations

import copy
from typing import Any

from canonicalize import CHAT, MESSAGES, RESPONSES, evidence
from canonicalize.evidence import CONTEXT_CHARS, EVIDENCE_CHARS, window
from canonicalize.identity import PROMPT_PARAMS


def tool(name: str, desc: str) -> dict[str, Any]:
    params = {"type": "object", "properties": {"path": {"type": "string"}}}
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}


BASE: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "Tu es un agent prudent. Règle: réponds brièvement. " * 4},
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "sh"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "user", "content": "thanks"},
    ],
    "tools": [tool("sh", "Run a command."), tool("read", "Read a file."), tool("write", "Write a file.")],
    "reasoning_effort": "low",
}


def changed(**edits: Any) -> dict[str, Any]:
    body = copy.deepcopy(BASE)
    body.update(edits)
    return body


def test_system_offset_counts_utf8_bytes() -> None:
    body = changed()
    text = body["messages"][0]["content"]
    body["messages"][0]["content"] = text[:60] + "X" + text[60:]
    ev = evidence(CHAT, BASE, body, "system_changed")
    assert ev.field == "system"
    assert ev.offset == len(text[:60].encode())  # 'è' takes two bytes
    assert ev.offset > 60
    assert len(ev.before) <= EVIDENCE_CHARS and len(ev.after) <= EVIDENCE_CHARS
    assert ev.after.startswith(text[60 - CONTEXT_CHARS : 60] + "X")
    assert ev.before == text[60 - CONTEXT_CHARS : 60 - CONTEXT_CHARS + EVIDENCE_CHARS]


def test_tools_name_the_tool_and_the_member_without_the_function_wrapper() -> None:
    body = changed()
    body["tools"][1]["function"]["description"] = "Read a file, or a directory."
    ev = evidence(CHAT, BASE, body, "tools_changed")
    assert (ev.field, ev.offset, ev.before, ev.after) == (
        "tools[1].description",
        len("Read a file"),
        "Read a file.",
        "Read a file, or a directory.",
    )
    body = changed(tools=[*BASE["tools"], tool("grep", "Search.")])
    ev = evidence(CHAT, BASE, body, "tools_changed")
    assert ev.field == "tools[3]" and ev.before == "" and '"name":"grep"' in ev.after
    body = changed()
    body["tools"][2]["function"]["parameters"]["properties"]["force"] = {"type": "boolean"}
    assert evidence(CHAT, BASE, body, "tools_changed").field == "tools[2].parameters.properties.force"


def test_tools_in_another_key_order_name_the_reordered_object() -> None:
    body = changed()
    fn = body["tools"][0]["function"]
    body["tools"][0]["function"] = {"description": fn["description"], "name": fn["name"], "parameters": {}}
    ev = evidence(CHAT, BASE, body, "tools_changed")
    assert ev.field == "tools[0]" and ev.before.startswith('{"name"') and ev.after.startswith('{"description"')


def test_params_model_and_history() -> None:
    ev = evidence(CHAT, BASE, changed(reasoning_effort="high"), "params_changed", PROMPT_PARAMS)
    assert (ev.field, ev.before, ev.after) == ("params.reasoning_effort", "low", "high")
    ev = evidence(CHAT, BASE, changed(tool_choice="required"), "params_changed", PROMPT_PARAMS)
    assert (ev.field, ev.before, ev.after) == ("params.tool_choice", "", "required")
    ev = evidence(CHAT, BASE, changed(model="m2"), "model_changed")
    assert (ev.field, ev.offset, ev.before, ev.after) == ("model", 1, "m", "m2")
    body = changed()
    body["messages"][3]["content"] = "ok [truncated]"
    ev = evidence(CHAT, BASE, body, "history_rewritten")
    assert (ev.field, ev.offset, ev.before, ev.after) == ("messages[3].content", 2, "ok", "ok [truncated]")
    body = changed()
    body["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"x": 1}'
    ev = evidence(CHAT, BASE, body, "history_rewritten")
    assert ev.field == "messages[2].tool_calls[0].function.arguments"
    body = changed()
    del body["messages"][2:4]  # a call and its result dropped
    ev = evidence(CHAT, BASE, body, "history_rewritten")
    assert ev.field == "messages[2].role" and (ev.before, ev.after) == ("assistant", "user")


def test_messages_and_responses_shapes() -> None:
    parent = {"model": "c", "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}], "messages": []}
    body = {**parent, "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B2"}]}
    assert evidence(MESSAGES, parent, body, "system_changed").field == "system[1]"
    parent = {"model": "g", "instructions": "Be Codex.", "input": [{"role": "user", "content": "a"}]}
    body = {**parent, "input": [{"role": "user", "content": "b"}]}
    assert evidence(RESPONSES, parent, body, "history_rewritten").field == "input[0].content"
    assert evidence(RESPONSES, parent, {**parent, "instructions": "Be Codex!"}, "system_changed").field == "system"


def test_window_of_long_texts() -> None:
    a = "x" * 1000 + "abc" + "y" * 1000
    b = "x" * 1000 + "abd" + "y" * 1000
    ev = window("f", a, b)
    assert ev.offset == 1002
    assert ev.before == a[1002 - CONTEXT_CHARS : 1002 - CONTEXT_CHARS + EVIDENCE_CHARS]
    assert ev.after[CONTEXT_CHARS] == "d"
    assert window("f", "", "new").before == "" and window("f", "", "new").offset == 0
