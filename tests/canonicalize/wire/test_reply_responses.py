"""canonicalize.wire.reply_responses: the fork guard against every place a Responses
stream or body can carry a call the client runs (Codex runs ``output_item.done``'s item;
the openai SDK builds its snapshot from ``response.created`` and ``output_item.added``)."""

from __future__ import annotations

import copy
import itertools
import json
import random
from typing import Any

import pytest

from canonicalize.sse import SSESplitter
from canonicalize.wire.reply_responses import ResponsesReply

OFFERED = frozenset({"shell", "multi_agent_v1"})
CLIENT_RUN = (
    "function_call",
    "custom_tool_call",
    "local_shell_call",
    "shell_call",
    "apply_patch_call",
    "computer_call",
)


def ev(obj: dict[str, Any]) -> bytes:
    return f"event: {obj['type']}\n".encode() + b"data: " + json.dumps(obj).encode() + b"\n\n"


def run(reply: ResponsesReply, raw: bytes, cuts: list[int] | None = None) -> list[bytes]:
    splitter = SSESplitter()
    out: list[bytes] = []
    bounds = [0, *(cuts or []), len(raw)]
    for a, b in itertools.pairwise(bounds):
        for event in splitter.feed(raw[a:b]):
            if (fwd := reply.feed(event)) is not None:
                out.append(fwd)
    out.append(reply.close(splitter.take()))
    return [o for o in out if o]


def events(out: list[bytes]) -> list[dict[str, Any]]:
    splitter = SSESplitter()
    return [json.loads(e.data) for raw in out for e in splitter.feed(raw) if e.data is not None]


def calls_seen(node: Any) -> list[str]:
    """Every call a client could run, anywhere in what it received: ``type:name``."""
    found: list[str] = []
    if isinstance(node, dict):
        if node.get("type") in CLIENT_RUN:
            found.append(f"{node['type']}:{node.get('name')}")
        for value in node.values():
            found += calls_seen(value)
    elif isinstance(node, list):
        for value in node:
            found += calls_seen(value)
    return found


def fcall(i: int, name: str, **kw: Any) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{i}", "call_id": f"call_{i}", "name": name, "arguments": "{}", **kw}


def created(output: list[Any] | None = None) -> bytes:
    return ev({"type": "response.created", "response": {"id": "resp_1", "output": output or []}})


def completed(output: list[Any]) -> bytes:
    return ev({"type": "response.completed", "response": {"id": "resp_1", "output": output, "usage": None}})


def args_delta(i: int, delta: str = "{}") -> bytes:
    return ev(
        {"type": "response.function_call_arguments.delta", "item_id": f"fc_{i}", "output_index": i, "delta": delta}
    )


# -- 3. a call that appears without output_item.added ------------------------------------------
def test_a_call_in_output_item_done_without_added_is_removed() -> None:
    bad = fcall(0, "spawn_agent")
    raw = (
        created()
        + args_delta(0)
        + ev({"type": "response.output_item.done", "output_index": 0, "item": bad})
        + args_delta(0, "late")
        + completed([bad])
    )
    reply = ResponsesReply(offered=OFFERED)
    out = run(reply, raw)
    assert calls_seen(events(out)) == []
    assert b"late" not in b"".join(out)
    assert reply.blocked == 1  # once, though it appears twice
    assert reply.message() == {"role": "assistant", "id": "resp_1", "output": []}


def test_a_call_whose_done_names_another_tool_than_its_added_is_removed_at_done() -> None:
    raw = (
        created()
        + ev({"type": "response.output_item.added", "output_index": 0, "item": fcall(0, "shell", arguments="")})
        + ev({"type": "response.output_item.done", "output_index": 0, "item": fcall(0, "spawn_agent")})
        + completed([fcall(0, "spawn_agent")])
    )
    reply = ResponsesReply(offered=OFFERED)
    out = events(run(reply, raw))
    assert calls_seen(out) == ["function_call:shell"]  # what went out before the done
    assert reply.blocked == 1


@pytest.mark.parametrize("kind", ["response.created", "response.in_progress", "response.failed", "response.incomplete"])
def test_a_call_in_any_response_snapshot_is_removed(kind: str) -> None:
    raw = ev({"type": kind, "response": {"id": "resp_1", "output": [fcall(0, "spawn_agent"), fcall(1, "shell")]}})
    reply = ResponsesReply(offered=OFFERED)
    assert calls_seen(events(run(reply, raw))) == ["function_call:shell"]
    assert reply.blocked == 1


def test_a_call_only_in_response_completed_is_removed_and_counted() -> None:
    reply = ResponsesReply(offered=OFFERED)
    out = events(run(reply, created() + completed([fcall(0, "spawn_agent")])))
    assert calls_seen(out) == [] and reply.blocked == 1


def test_arguments_done_that_names_a_tool_not_offered_is_removed() -> None:
    raw = created() + ev(
        {
            "type": "response.function_call_arguments.done",
            "item_id": "fc_0",
            "output_index": 0,
            "name": "spawn_agent",
            "arguments": "{}",
        }
    )
    reply = ResponsesReply(offered=OFFERED)
    assert events(run(reply, raw)) == [json.loads(created()[len(b"event: response.created\ndata: ") :])]
    assert reply.blocked == 1


def test_arguments_done_of_a_namespaced_call_that_was_let_through_stays() -> None:
    inside = fcall(0, "spawn_agent", namespace="multi_agent_v1")
    done = {
        "type": "response.function_call_arguments.done",
        "item_id": "fc_0",
        "output_index": 0,
        "name": "spawn_agent",
    }
    raw = (
        created()
        + ev({"type": "response.output_item.added", "output_index": 0, "item": inside})
        + ev(done)
        + ev({"type": "response.output_item.done", "output_index": 0, "item": inside})
    )
    reply = ResponsesReply(offered=OFFERED)
    assert b"".join(run(reply, raw)) == raw and reply.blocked == 0


def test_an_event_naming_a_removed_call_by_item_id_alone_is_removed() -> None:
    raw = (
        created()
        + ev({"type": "response.output_item.added", "output_index": 0, "item": fcall(0, "spawn_agent")})
        + ev({"type": "response.function_call_arguments.delta", "item_id": "fc_0", "output_index": 5, "delta": "x"})
    )
    reply = ResponsesReply(offered=OFFERED)
    assert calls_seen(events(run(reply, raw))) == [] and b'"x"' not in b"".join(
        run(ResponsesReply(offered=OFFERED), raw)
    )


def test_custom_tool_calls_and_their_input_events_are_removed() -> None:
    custom = {"type": "custom_tool_call", "id": "ct_0", "call_id": "c0", "name": "apply_patch", "input": ""}
    raw = (
        created()
        + ev({"type": "response.output_item.added", "output_index": 0, "item": custom})
        + ev({"type": "response.custom_tool_call_input.delta", "item_id": "ct_0", "output_index": 0, "delta": "***"})
        + ev({"type": "response.custom_tool_call_input.done", "item_id": "ct_0", "output_index": 0, "input": "***"})
        + ev({"type": "response.output_item.done", "output_index": 0, "item": {**custom, "input": "***"}})
    )
    reply = ResponsesReply(offered=OFFERED)
    out = run(reply, raw)
    assert b"***" not in b"".join(out) and calls_seen(events(out)) == [] and reply.blocked == 1


@pytest.mark.parametrize(
    ("item", "tool"),
    [
        ({"type": "local_shell_call", "action": {"type": "exec", "command": ["rm", "-rf", "/"]}}, "local_shell"),
        ({"type": "shell_call", "action": {"commands": ["rm -rf /"]}}, "shell"),
        ({"type": "apply_patch_call", "operation": {"type": "delete_file", "path": "x"}}, "apply_patch"),
        ({"type": "computer_call", "action": {"type": "click", "x": 1, "y": 2}}, "computer_use_preview"),
    ],
)
def test_built_in_calls_the_client_runs_need_their_tool_offered(item: dict[str, Any], tool: str) -> None:
    item = {**item, "id": "b_0", "call_id": "c_0", "status": "completed"}
    raw = created() + ev({"type": "response.output_item.done", "output_index": 0, "item": item}) + completed([item])
    reply = ResponsesReply(offered=frozenset({"memory"}))
    assert calls_seen(events(run(reply, raw))) == [] and reply.blocked == 1
    reply = ResponsesReply(offered=frozenset({tool}))
    assert b"".join(run(reply, raw)) == raw and reply.blocked == 0


def test_server_side_tool_calls_pass() -> None:
    items = [
        {"type": "web_search_call", "id": "ws_0", "status": "completed", "action": {"type": "search", "query": "q"}},
        {"type": "mcp_call", "id": "mcp_0", "server_label": "x", "name": "delete_all", "arguments": "{}"},
    ]
    raw = created() + b"".join(
        ev({"type": "response.output_item.done", "output_index": i, "item": item}) for i, item in enumerate(items)
    )
    reply = ResponsesReply(offered=OFFERED)
    assert b"".join(run(reply, raw)) == raw and reply.blocked == 0


def test_a_name_that_is_not_a_string_is_not_offered() -> None:
    obj = {"id": "r", "output": [{**fcall(0, "x"), "name": ["shell"]}, fcall(1, "shell")]}
    reply = ResponsesReply(offered=OFFERED)
    assert reply.complete(obj) is True
    assert obj["output"] == [fcall(1, "shell")] and reply.blocked == 1


def test_complete_removes_built_in_calls_not_offered() -> None:
    shell = {"type": "local_shell_call", "id": "ls", "call_id": "c", "action": {"type": "exec", "command": ["ls"]}}
    obj = {"id": "r", "output": [shell, fcall(1, "shell")]}
    before = copy.deepcopy(obj)
    reply = ResponsesReply(offered=OFFERED)
    assert reply.complete(obj) is True and obj["output"] == [fcall(1, "shell")] and reply.blocked == 1
    assert ResponsesReply().complete(before) is False


# -- property: random streams, any cut: no call to a tool not offered reaches the client ---------------
NAMES = ["shell", "spawn_agent", "apply_patch", "shell2"]


def random_responses_stream(rng: random.Random) -> tuple[bytes, int]:
    """A stream whose items' events are sometimes missing; how many calls to tools not
    offered it names somewhere."""
    out = [created()]
    final: list[Any] = []
    named: list[dict[str, Any]] = []
    for i in range(rng.randint(0, 4)):
        if rng.random() < 0.3:
            item: dict[str, Any] = {"type": "message", "id": f"msg_{i}", "role": "assistant", "content": []}
        else:
            item = fcall(i, rng.choice(NAMES))
        if rng.random() < 0.7:
            out.append(ev({"type": "response.output_item.added", "output_index": i, "item": item}))
            named.append(item)
        if item["type"] == "function_call":
            for _ in range(rng.randint(0, 2)):
                out.append(args_delta(i))
            if rng.random() < 0.5:
                done = {"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": i}
                out.append(ev({**done, "arguments": "{}", "name": item["name"]}))
                named.append(item)
        if rng.random() < 0.7:
            out.append(ev({"type": "response.output_item.done", "output_index": i, "item": item}))
            named.append(item)
        final.append(item)
    if rng.random() < 0.8:
        out.append(completed(final))
        named += final
    else:
        out.append(completed([]))
    bad = {item["id"] for item in named if item["type"] == "function_call" and item["name"] not in OFFERED}
    return b"".join(out), len(bad)


def test_random_streams_reach_the_client_with_offered_calls_only() -> None:
    rng = random.Random(99)
    for _ in range(400):
        raw, bad = random_responses_stream(rng)
        cuts = sorted(rng.randint(0, len(raw)) for _ in range(rng.randint(0, 4)))
        reply = ResponsesReply(offered=OFFERED)
        out = run(reply, raw, cuts)
        assert all(seen == "function_call:shell" for seen in calls_seen(events(out))), raw
        assert reply.blocked == bad, raw
        if not bad:
            assert b"".join(out) == raw
        assert b"".join(run(ResponsesReply(), raw, cuts)) == raw
