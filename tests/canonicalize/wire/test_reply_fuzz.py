"""The reply machines never raise, whatever JSON an upstream sends: a machine that
raises makes the proxy pass the rest of the response through unguarded (fail-open),
so an exception would be a way around the fork guard."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from canonicalize.sse import Event
from canonicalize.wire.reply_chat import ChatReply
from canonicalize.wire.reply_messages import MessagesReply
from canonicalize.wire.reply_responses import ResponsesReply
from tests.canonicalize.wire.test_reply import GUARDED, anthropic_stream
from tests.canonicalize.wire.test_responses import GUARDED as RESPONSES_STREAM

KEYS = [
    "choices", "delta", "message", "tool_calls", "function_call", "index", "function", "custom", "name",
    "arguments", "type", "id", "content", "finish_reason", "usage", "item", "output_index", "item_id",
    "response", "output", "namespace", "call_id", "content_block", "stop_reason", "partial_json", "text",
    "prompt_tokens", "input_tokens", "cached_tokens", "prompt_tokens_details", "input_tokens_details",
]  # fmt: skip
STRINGS = [
    "memory", "terminal", "tool_calls", "function_call", "function", "custom", "tool_use", "stop", "",
    "function_call", "custom_tool_call", "local_shell_call", "response.output_item.added",
    "response.output_item.done", "response.completed", "response.created", "response.function_call_arguments.done",
    "content_block_start", "content_block_delta", "content_block_stop", "message_start", "message_delta",
    "input_json_delta", "text_delta", "0", "x",
]  # fmt: skip


def value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 5 and roll < 0.35:
        return {rng.choice(KEYS): value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if depth < 5 and roll < 0.5:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rng.choice([None, True, False, 0, 1, 2, -1, 1.5, 2**70, rng.choice(STRINGS), [], {}])


MACHINES = [
    lambda: ChatReply(),
    lambda: ChatReply(offered=frozenset({"memory"}), drop_usage_chunk=True),
    lambda: MessagesReply(),
    lambda: MessagesReply(offered=frozenset({"memory"})),
    lambda: ResponsesReply(),
    lambda: ResponsesReply(offered=frozenset({"memory"})),
]


@pytest.mark.parametrize("make", MACHINES)
def test_no_event_makes_a_machine_raise(make: Any) -> None:
    rng = random.Random(6)
    for _ in range(300):
        reply = make()
        for _ in range(rng.randint(1, 12)):
            data = json.dumps(value(rng)).encode()
            if rng.random() < 0.05:
                data = data.replace(b"1", b"NaN", 1)
            reply.feed(Event(b"data: " + data + b"\n\n", data))
        reply.close(b"data: " + json.dumps(value(rng)).encode() if rng.random() < 0.3 else b"")
        reply.message()
        make().complete(value(rng))


def paths(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(node, dict):
        for k, v in node.items():
            out += paths(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += paths(v, (*at, i))
    return out


def mutated(obj: Any, rng: random.Random) -> Any:
    """``obj`` with one node (or its whole self) replaced by a random value."""
    obj = json.loads(json.dumps(obj))
    path = rng.choice(paths(obj))
    if not path:
        return value(rng)
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value(rng)
    return obj


def responses_events() -> list[Any]:
    return [json.loads(e.split(b"data: ", 1)[1]) for e in RESPONSES_STREAM.split(b"\n\n") if e]


@pytest.mark.parametrize(
    ("make", "events"),
    [
        (lambda: ChatReply(offered=frozenset({"memory"}), drop_usage_chunk=True), GUARDED),
        (lambda: ChatReply(), GUARDED),
        (lambda: MessagesReply(offered=frozenset({"memory"})), anthropic_stream()),
        (lambda: MessagesReply(), anthropic_stream()),
        (lambda: ResponsesReply(offered=frozenset({"shell"})), responses_events()),
        (lambda: ResponsesReply(), responses_events()),
    ],
)
def test_no_mutation_of_a_real_stream_makes_a_machine_raise(make: Any, events: list[Any]) -> None:
    rng = random.Random(6)
    for _ in range(600):
        reply = make()
        for obj in events:
            if rng.random() < 0.3:
                obj = mutated(obj, rng)
            data = json.dumps(obj).encode()
            reply.feed(Event(b"data: " + data + b"\n\n", data))
        reply.close(b"")
        reply.message()
        whole = {"choices": [{"index": 0, "message": {"tool_calls": [{"function": {"name": "memory"}}]}}]}
        make().complete(mutated(rng.choice([whole, {"content": [events[-1]]}, {"output": events[-1:]}]), rng))
