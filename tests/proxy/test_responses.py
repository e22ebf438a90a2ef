"""The Responses API through the real request flow, offline (tests.flows.Harness):
Codex-shaped turns continue one lineage, a fork gets its parent's instructions,
system items and tools[] as bytes, the codex pack's identity keeps sessions apart."""

from __future__ import annotations

from typing import Any

import orjson

from canonicalize import RESPONSES, Settings
from tests.flows import Harness

SHELL = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}
PATCH = {"type": "function", "name": "apply_patch", "parameters": {"type": "object"}}
SPAWN = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}
TASK = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the bug"}]}
DEV = {
    "type": "message",
    "role": "developer",
    "content": [{"type": "input_text", "text": "<permissions>ro</permissions>"}],
}
MSG = {
    "type": "message",
    "id": "msg_1",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Looking.", "annotations": []}],
}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell", "arguments": '{"cmd":["ls"]}'}
# Codex's base instructions are long: a fork starts like its parent (same head).
INSTRUCTIONS = "You are Codex, a coding agent based on GPT-5. " * 10
OUT = {"type": "function_call_output", "call_id": "call_1", "output": "a.py"}


def req(items: list[Any], *, key: str = "thread-1", tools: list[Any] | None = None, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gpt-5-codex",
        "instructions": INSTRUCTIONS,
        "input": items,
        "tools": [SHELL, PATCH, SPAWN] if tools is None else tools,
        "stream": True,
        "prompt_cache_key": key,
    }
    body.update(kw)
    return body


def harness() -> Harness:
    return Harness(Settings(packs=("generic", "hermes", "codex")))


def replayed(*items: dict[str, Any]) -> list[dict[str, Any]]:
    """Output items as Codex replays them (store: false, no ids)."""
    return [{k: v for k, v in item.items() if k != "id"} for item in items]


def test_codex_turns_continue_one_lineage_untouched() -> None:
    h = harness()
    one = h.send(req([DEV, TASK]), exchange=RESPONSES, reply={"role": "assistant", "output": [MSG, CALL]})
    assert one.role == "root"
    items = [DEV, TASK, *replayed(MSG, CALL), OUT]
    raw = orjson.dumps(req(items))
    two = h.send(raw, exchange=RESPONSES)
    assert two.role == "continuation"
    assert two.record.id == one.record.id
    assert two.raw == raw  # nothing rewritten


def test_day_change_developer_block_is_history_not_rewritten() -> None:
    h = harness()
    one = h.send(req([DEV, TASK]), exchange=RESPONSES, reply={"role": "assistant", "output": [MSG]})
    date = {"type": "message", "role": "developer", "content": "<current_date>2026-11-24</current_date>"}
    raw = orjson.dumps(req([DEV, TASK, *replayed(MSG), date, TASK]))
    two = h.send(raw, exchange=RESPONSES)
    assert (two.role, two.record.id, two.raw) == ("continuation", one.record.id, raw)


def test_prompt_cache_key_keeps_sessions_apart() -> None:
    h = harness()
    a = h.send(req([TASK], key="t-a"), exchange=RESPONSES, reply={"role": "assistant", "output": [MSG]})
    b = h.send(req([TASK, *replayed(MSG), TASK], key="t-b"), exchange=RESPONSES)
    assert b.role == "root" and b.record.id != a.record.id
    c = h.send(req([TASK, *replayed(MSG), TASK], key="t-a"), exchange=RESPONSES)
    assert c.role == "continuation" and c.record.id == a.record.id


def test_session_id_header_is_the_identity_without_a_key() -> None:
    h = harness()
    head = {"authorization": "Bearer sk-test", "session-id": "s1"}
    a = h.send(req([TASK], key=""), exchange=RESPONSES, headers=head, reply={"role": "assistant", "output": [MSG]})
    other = {**head, "session-id": "s2"}
    b = h.send(req([TASK, *replayed(MSG), TASK], key=""), exchange=RESPONSES, headers=other)
    assert b.role == "root" and b.record.id != a.record.id


def test_fork_gets_the_parents_instructions_system_items_and_tools_as_bytes() -> None:
    h = harness()
    parent_raw = orjson.dumps(req([DEV, TASK]))
    one = h.send(parent_raw, exchange=RESPONSES, reply={"role": "assistant", "output": [MSG]})
    fork_body = req(
        [TASK, *replayed(MSG), {"role": "user", "content": "review the change"}],
        key="fork-thread",
        tools=[SHELL],
        instructions=INSTRUCTIONS + "\nYou review the change.",
    )
    fork_raw = orjson.dumps(fork_body)
    fork = h.send(fork_raw, exchange=RESPONSES)
    assert fork.role == "fork" and fork.fork_signal == "tools_subset"
    assert fork.record.parent == one.record.id
    assert fork.offered == frozenset({"shell"})
    sent = fork.body
    parent = orjson.loads(parent_raw)
    assert sent["instructions"] == parent["instructions"]
    assert sent["tools"] == parent["tools"]
    assert sent["input"][0] == DEV and sent["input"][1:] == fork_body["input"]
    assert sent["prompt_cache_key"] == "thread-1"  # inherited (codex pack)
    # The parent's tools[] bytes, exactly as the parent sent them.
    tools_raw = orjson.dumps([SHELL, PATCH, SPAWN])
    assert tools_raw in fork.raw
    assert {"fork.system", "fork.tools", "fork.params"} <= set(fork.rewrites)
    expected = {**fork_body, "instructions": INSTRUCTIONS, "input": [DEV, *fork_body["input"]]}
    expected.update(tools=parent["tools"], prompt_cache_key="thread-1")
    assert fork.raw == orjson.dumps(expected)


def test_fork_of_an_additional_tools_request_gets_the_parents_tools_item() -> None:
    h = harness()
    extra = {"type": "additional_tools", "role": "developer", "tools": [SHELL, PATCH, SPAWN]}
    parent = {"model": "m", "input": [extra, DEV, TASK], "prompt_cache_key": "t1"}
    h.send(parent, exchange=RESPONSES, reply={"role": "assistant", "output": [MSG]})
    small = {"type": "additional_tools", "role": "developer", "tools": [SHELL]}
    fork_body = {"model": "m", "input": [small, DEV, TASK, *replayed(MSG), {"role": "user", "content": "review"}]}
    fork = h.send(fork_body, exchange=RESPONSES)
    assert fork.role == "fork" and fork.offered == frozenset({"shell"})
    assert fork.body["input"][:3] == [extra, DEV, TASK]


def test_string_input_then_replay() -> None:
    h = harness()
    one = h.send(req("hello"), exchange=RESPONSES, reply={"role": "assistant", "output": [MSG]})
    two = h.send(req([{"role": "user", "content": "hello"}, *replayed(MSG), TASK]), exchange=RESPONSES)
    assert two.role == "continuation" and two.record.id == one.record.id


def test_previous_response_id_continues_from_the_responses_tip() -> None:
    h = harness()
    first = req([DEV, TASK], key="")
    one = h.send(first, exchange=RESPONSES, reply={"role": "assistant", "id": "resp_1", "output": [MSG, CALL]})
    # The next turn sends only what is new, naming the previous response.
    nxt = req([OUT], key="", previous_response_id="resp_1")
    two = h.send(nxt, exchange=RESPONSES, reply={"role": "assistant", "id": "resp_2", "output": [MSG]})
    assert two.role == "continuation" and two.record.id == one.record.id
    assert two.flow.outcome is not None and two.flow.outcome.depth == 1
    three = h.send(req([TASK], key="", previous_response_id="resp_2"), exchange=RESPONSES)
    assert three.role == "continuation" and three.record.id == one.record.id
    # Another tenant naming the same id shares nothing.
    other = {"authorization": "Bearer sk-other"}
    assert h.send(nxt, exchange=RESPONSES, headers=other).role == "root"
    # An unknown id: a root.
    assert h.send(req([OUT], key="", previous_response_id="resp_x"), exchange=RESPONSES).role == "root"
