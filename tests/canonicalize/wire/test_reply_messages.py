"""canonicalize.wire.reply_messages: the fork guard against every place an Anthropic
Messages reply can carry a ``tool_use``, judged on what the anthropic SDK assembles."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import anthropic
import httpx2
import pytest

from canonicalize.sse import SSESplitter
from canonicalize.wire.reply_messages import MessagesReply
from tests.canonicalize.wire.test_reply import MSG_USAGE, anthropic_event

OFFERED = frozenset({"memory", "skill_manage"})


def run(reply: MessagesReply, raw: bytes, cuts: list[int] | None = None) -> list[bytes]:
    splitter = SSESplitter()
    out: list[bytes] = []
    bounds = [0, *(cuts or []), len(raw)]
    for a, b in itertools.pairwise(bounds):
        for event in splitter.feed(raw[a:b]):
            if (fwd := reply.feed(event)) is not None:
                out.append(fwd)
    out.append(reply.close(splitter.take()))
    return [o for o in out if o]


def received(out: list[bytes]) -> list[dict[str, Any]]:
    splitter = SSESplitter()
    return [json.loads(e.data) for raw in out for e in splitter.feed(raw) if e.data is not None]


def sdk_tool_names(out: list[bytes]) -> list[str]:
    """The tool_use blocks the anthropic SDK ends with, reading the forwarded bytes."""
    body = b"".join(out)

    def upstream(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    with httpx2.Client(transport=httpx2.MockTransport(upstream)) as http:
        client = anthropic.Anthropic(api_key="k", base_url="http://upstream", http_client=http)
        with client.messages.stream(model="claude", max_tokens=10, messages=[{"role": "user", "content": "hi"}]) as s:
            message = s.get_final_message()
    return [b.name for b in message.content if b.type == "tool_use"]


def start(message_content: list[Any] | None = None) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude",
            "content": message_content or [],
            "stop_reason": None,
            "usage": MSG_USAGE,
        },
    }


def tool_block(index: int, name: Any, tid: str = "toolu_1") -> list[dict[str, Any]]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "tool_use", "id": tid, "name": name, "input": {}},
        },
        {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": "{}"}},
        {"type": "content_block_stop", "index": index},
    ]


def text_block(index: int, text: str = "ok") -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": index},
    ]


def end(stop: str = "tool_use") -> list[dict[str, Any]]:
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": stop, "stop_sequence": None},
        "usage": {"output_tokens": 9},
    }
    return [delta, {"type": "message_stop"}]


END = end()


def stream(*events: dict[str, Any]) -> bytes:
    return b"".join(anthropic_event(e) for e in events)


def test_a_tool_use_in_message_start_is_removed() -> None:
    # The SDK takes message_start's message as its snapshot, content included.
    terminal = {"type": "tool_use", "id": "toolu_t", "name": "terminal", "input": {"command": "ls"}}
    raw = stream(start([terminal]), *text_block(1), *END)
    assert sdk_tool_names([raw]) == ["terminal"]
    reply = MessagesReply(offered=OFFERED)
    out = run(reply, raw)
    assert sdk_tool_names(out) == [] and reply.blocked == 1
    assert [e["index"] for e in received(out) if "index" in e] == [0, 0, 0]
    assert reply.message() == {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}


def test_a_name_that_is_not_a_string_is_removed_not_an_error() -> None:
    raw = stream(start(), *tool_block(0, ["memory"]), *END)
    reply = MessagesReply(offered=OFFERED)
    assert b"tool_use" not in b"".join(run(reply, raw)) and reply.blocked == 1


@pytest.mark.parametrize("index", ["1", "x", 1.0, None, [1], True])
def test_a_block_event_whose_index_is_not_an_integer_is_removed_under_the_guard(index: Any) -> None:
    events = [start(), *text_block(0), *tool_block(1, "terminal"), *tool_block(2, "memory", "toolu_2")]
    events.insert(8, {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta"}})
    raw = stream(*events, *END)
    reply = MessagesReply(offered=OFFERED)
    out = run(reply, raw)
    assert sdk_tool_names(out) == ["memory"] and reply.blocked == 1
    assert all(isinstance(e.get("index", 0), int) and e.get("index") is not True for e in received(out))
    unguarded = MessagesReply()
    assert b"".join(run(unguarded, raw)) == raw


def test_events_for_a_block_never_started_are_removed_under_the_guard() -> None:
    raw = stream(
        start(),
        *tool_block(0, "terminal"),
        *tool_block(5, "memory"),
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "x"}},
        *END,
    )
    reply = MessagesReply(offered=OFFERED)
    out = run(reply, raw)
    assert b'"x"' not in b"".join(out)
    assert sdk_tool_names(out) == ["memory"]


def test_an_event_orjson_refuses_is_guarded() -> None:
    raw = stream(start(), *END[:1])
    bad = tool_block(0, "terminal")
    block = anthropic_event(bad[0]).replace(b'"input": {}', b'"input": {"x": NaN}')
    reply = MessagesReply(offered=OFFERED)
    out = run(reply, raw + block + stream(*bad[1:]))
    assert b"terminal" not in b"".join(out) and reply.blocked == 1


def test_server_tool_use_passes() -> None:
    # The provider ran it before the reply arrived: removing it would hide, not prevent.
    server = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
    }
    raw = stream(start(), server, {"type": "content_block_stop", "index": 0}, *end("end_turn"))
    reply = MessagesReply(offered=OFFERED)
    assert b"".join(run(reply, raw)) == raw and reply.blocked == 0


def test_random_streams_reach_the_sdk_with_offered_tools_only() -> None:
    rng = random.Random(5)
    names = ["memory", "skill_manage", "terminal", "memory_x"]
    for _ in range(300):
        events: list[dict[str, Any]] = [start()]
        chosen: list[str] = []
        for i in range(rng.randint(0, 5)):
            if rng.random() < 0.4:
                events += text_block(i, "t")
            else:
                name = rng.choice(names)
                chosen.append(name)
                events += tool_block(i, name, f"toolu_{i}")
            if rng.random() < 0.2:
                events.append({"type": "ping"})
        events += end("tool_use" if chosen else "end_turn")
        raw = stream(*events)
        cuts = sorted(rng.randint(0, len(raw)) for _ in range(rng.randint(0, 4)))
        reply = MessagesReply(offered=OFFERED)
        out = run(reply, raw, cuts)
        kept = [n for n in chosen if n in OFFERED]
        assert sdk_tool_names(out) == kept
        assert reply.blocked == len(chosen) - len(kept)
        if kept == chosen:
            assert b"".join(out) == raw
        assert b"".join(run(MessagesReply(), raw, cuts)) == raw
