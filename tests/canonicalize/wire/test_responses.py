"""canonicalize.wire.responses and reply_responses: where system, tools and history
live in a Responses request, the hashing form, fork system edits as bytes, and the
reply machine (usage, guard, output items) streamed at every byte boundary and not."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest

from canonicalize import chain, render
from canonicalize.jsonspan import JsonDoc
from canonicalize.sse import SSESplitter
from canonicalize.usage import Usage
from canonicalize.wire import RESPONSES, match
from canonicalize.wire.reply_responses import ResponsesReply

FN = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}
FN2 = {"type": "function", "name": "apply_patch", "description": "Patch files.", "parameters": {"type": "object"}}


def body(**kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": "gpt-5", "instructions": "You are Codex.", "tools": [FN, FN2], "stream": True}
    out.update(kw)
    return out


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_paths() -> None:
    assert match("/v1/responses") is RESPONSES
    assert match("/responses") is RESPONSES
    assert match("/v1/responses/resp_1/input_items") is None


def test_system_tools_history() -> None:
    dev = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<perm>x</perm>"}]}
    later_dev = {"role": "developer", "content": "<current_date>2026-11-24</current_date>"}
    b = body(input=[dev, user("hi"), later_dev])
    assert [s.get() for s in RESPONSES.system_slots(b)] == ["You are Codex.", "<perm>x</perm>"]
    assert [s.path for s in RESPONSES.system_slots(b)] == [("instructions",), ("input", 0, "content", 0, "text")]
    assert RESPONSES.tools(b) == [FN, FN2]
    assert [RESPONSES.tool_name(t) for t in RESPONSES.tools(b) or ()] == ["shell", "apply_patch"]
    # A developer item after the history started is history: hashed, never a system slot.
    assert RESPONSES.history(b) == [user("hi"), later_dev]
    assert RESPONSES.last_user_text(b) == "hi"


def test_string_input_is_one_user_message() -> None:
    b = body(input="hello")
    assert RESPONSES.history(b) == [{"role": "user", "content": "hello"}]
    assert RESPONSES.is_user(RESPONSES.history(b)[0])
    slot = RESPONSES.note_slot(b, 0)
    assert slot is not None and slot.path == ("input",)


def test_additional_tools_item() -> None:
    extra = {"type": "additional_tools", "role": "developer", "tools": [FN]}
    dev = {"role": "developer", "content": "rules"}
    b = {"model": "m", "input": [extra, dev, user("hi")]}
    assert RESPONSES.tools(b) == [FN]
    assert RESPONSES.tools_path(b) == ("input", 0, "tools")
    assert [s.get() for s in RESPONSES.system_slots(b)] == ["rules"]
    assert RESPONSES.history(b) == [user("hi")]


def test_canonical_form_ignores_ids_status_and_text_part_shapes() -> None:
    c = RESPONSES.canonical_message
    sent = {
        "type": "message",
        "id": "msg_1",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "done", "annotations": []}],
    }
    assert c(sent) == c({"role": "assistant", "content": "done"})
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "shell", "arguments": '{"b": 1, "a": 2}'}
    assert c(call) == c({"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"a":2,"b":1}'})
    assert c(call) != c({**call, "call_id": "c2"})
    assert c(user("a")) != c({"role": "assistant", "content": "a"})
    out = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    assert c(out) != c({**out, "output": "no"})
    assert RESPONSES.is_assistant(call) and RESPONSES.is_assistant({"type": "reasoning", "summary": []})
    assert not RESPONSES.is_assistant(out)


def test_set_system_splices_the_parents_bytes() -> None:
    parent_raw = (
        b'{"model":"m","instructions":"Parent  rules",'
        b'"input":[{"role":"developer","content":"P"},{"role":"user","content":"q"}]}'
    )
    parent = orjson.loads(parent_raw)
    blob = RESPONSES.system_blob(JsonDoc(parent_raw), parent)
    fork_raw = b'{"model":"m", "instructions": "Fork", "input": [{"role":"user","content":"q"}],  "n": 1.50}'
    fork = orjson.loads(fork_raw)
    ops = RESPONSES.set_system(fork, blob)
    out = render(JsonDoc(fork_raw), ops)
    assert out == (
        b'{"model":"m", "instructions": "Parent  rules", "input": [{"role":"developer","content":"P"},'
        b'{"role":"user","content":"q"}],  "n": 1.50}'
    )
    assert fork == orjson.loads(out)


# -- the reply machine ------------------------------------------------------------------
def ev(obj: dict[str, Any]) -> bytes:
    return f"event: {obj['type']}\n".encode() + b"data: " + json.dumps(obj).encode() + b"\n\n"


USAGE = {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 100}, "output_tokens": 5}
MSG = {
    "type": "message",
    "id": "msg_1",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Hi", "annotations": []}],
}


def fcall(i: int, name: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{i}", "call_id": f"call_{i}", "name": name, "arguments": "{}"}


def stream(*items: dict[str, Any]) -> bytes:
    out = [ev({"type": "response.created", "response": {"id": "resp_1", "output": [], "usage": None}})]
    for i, item in enumerate(items):
        added = {**item, "arguments": ""} if item["type"] == "function_call" else {**item, "content": []}
        out.append(ev({"type": "response.output_item.added", "output_index": i, "item": added}))
        if item["type"] == "function_call":
            out.append(
                ev(
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": item["id"],
                        "output_index": i,
                        "delta": "{}",
                    }
                )
            )
        else:
            out.append(ev({"type": "response.output_text.delta", "output_index": i, "content_index": 0, "delta": "Hi"}))
        out.append(ev({"type": "response.output_item.done", "output_index": i, "item": item}))
    done = {"id": "resp_1", "object": "response", "output": list(items), "usage": USAGE}
    out.append(ev({"type": "response.completed", "response": done}))
    return b"".join(out)


def run(reply: ResponsesReply, raw: bytes, cut: int) -> list[bytes]:
    splitter = SSESplitter()
    out: list[bytes] = []
    for piece in (raw[:cut], raw[cut:]):
        for event in splitter.feed(piece):
            fwd = reply.feed(event)
            if fwd is not None:
                out.append(fwd)
    tail = splitter.flush()
    if tail is not None and (fwd := reply.feed(tail)) is not None:
        out.append(fwd)
    return out


def events(out: list[bytes]) -> list[dict[str, Any]]:
    splitter = SSESplitter()
    return [json.loads(e.data) for raw in out for e in splitter.feed(raw) if e.data is not None]


PLAIN = stream(MSG, fcall(1, "shell"))
GUARDED = stream(fcall(0, "spawn_agent"), MSG, fcall(2, "shell"))


@pytest.mark.parametrize("cut", range(0, len(PLAIN) + 1))
def test_stream_passes_through_byte_identical(cut: int) -> None:
    reply = ResponsesReply(offered=frozenset({"shell"}))
    assert b"".join(run(reply, PLAIN, cut)) == PLAIN
    assert reply.usage.result == Usage(120, 100)
    assert reply.blocked == 0 and reply.first_token
    assert reply.message() == {"role": "assistant", "id": "resp_1", "output": [MSG, fcall(1, "shell")]}


@pytest.mark.parametrize("cut", range(0, len(GUARDED) + 1))
def test_stream_guard_drops_calls_not_offered_and_renumbers(cut: int) -> None:
    reply = ResponsesReply(offered=frozenset({"shell"}))
    got = events(run(reply, GUARDED, cut))
    assert reply.blocked == 1
    assert all(e.get("item_id") != "fc_0" and (e.get("item") or {}).get("name") != "spawn_agent" for e in got)
    assert [e["output_index"] for e in got if "output_index" in e] == [0, 0, 0, 1, 1, 1]
    assert got[-1]["response"]["output"] == [MSG, fcall(2, "shell")]
    assert reply.message() == {"role": "assistant", "id": "resp_1", "output": [MSG, fcall(2, "shell")]}
    assert reply.usage.result == Usage(120, 100)


def test_stream_whose_completed_output_is_empty_keeps_the_streamed_items() -> None:
    raw = PLAIN.replace(b'"output": [{"type": "message"', b'"output": [], "was": [{"type": "message"')
    assert raw != PLAIN
    reply = ResponsesReply()
    assert b"".join(run(reply, raw, 0)) == raw
    assert reply.message() == {"role": "assistant", "id": "resp_1", "output": [MSG, fcall(1, "shell")]}


def test_guard_allows_calls_into_an_offered_namespace() -> None:
    inside = {**fcall(0, "spawn_agent"), "namespace": "multi_agent_v1"}
    obj = {"id": "resp_1", "object": "response", "output": [inside, fcall(1, "spawn_agent")], "usage": USAGE}
    reply = ResponsesReply(offered=frozenset({"shell", "multi_agent_v1"}))
    assert reply.complete(obj) is True
    assert obj["output"] == [inside] and reply.blocked == 1


def test_not_streamed_guard_and_message() -> None:
    whole = {"id": "resp_1", "object": "response", "output": [fcall(0, "spawn_agent"), MSG], "usage": USAGE}
    obj = copy.deepcopy(whole)
    reply = ResponsesReply(offered=frozenset({"shell"}))
    assert reply.complete(obj) is True
    assert obj["output"] == [MSG] and reply.blocked == 1
    assert reply.usage.result == Usage(120, 100)
    assert reply.message() == {"role": "assistant", "id": "resp_1", "output": [MSG]}
    unguarded = ResponsesReply()
    assert unguarded.complete(copy.deepcopy(whole)) is False and unguarded.blocked == 0


def test_reply_extends_the_next_turns_chain() -> None:
    first = body(input=[user("hi")])
    reply = ResponsesReply()
    run(reply, PLAIN, 0)
    msg = reply.message()
    assert msg is not None
    links, _ = chain.links(RESPONSES, RESPONSES.history(first))
    for item in RESPONSES.replayed(msg):
        links.append(chain.extend(RESPONSES, links, item))
    # The client replays the output items (without ids) plus the call's output.
    replay = [{k: v for k, v in item.items() if k != "id"} for item in (MSG, fcall(1, "shell"))]
    out = {"type": "function_call_output", "call_id": "call_1", "output": "ok"}
    nxt, _ = chain.links(RESPONSES, RESPONSES.history(body(input=[user("hi"), *replay, out])))
    assert nxt[: len(links)] == links


def test_error_body_is_openai_shaped() -> None:
    assert RESPONSES.error_body("m", "upstream_error", "upstream_error")["error"]["message"] == "m"


def test_built_in_tools_the_client_runs_are_named_by_their_type() -> None:
    """The fork guard judges a ``local_shell_call`` by its tool's type: a fork that
    offered the tool keeps its calls."""
    tools = [{"type": "local_shell"}, {"type": "computer_use_preview", "display_width": 1024}, {"type": "web_search"}]
    assert [RESPONSES.tool_name(t) for t in tools] == ["local_shell", "computer_use_preview", None]
