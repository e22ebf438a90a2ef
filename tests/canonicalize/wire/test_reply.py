"""canonicalize.wire.reply_chat and reply_messages (and where a Responses stream ends): pass-through, the
usage chunk, the fork tool-call guard and the reply message, for OpenAI chat completions and Anthropic
messages, streamed or not."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from canonicalize.sse import Event, SSESplitter
from canonicalize.usage import Usage
from canonicalize.wire.reply_chat import ChatReply
from canonicalize.wire.reply_messages import MessagesReply
from canonicalize.wire.reply_responses import ResponsesReply

OFFERED = frozenset({"memory", "skill_manage"})


# -- wire helpers ---------------------------------------------------------------------
def data(obj: Any) -> bytes:
    # json.dumps' spaced separators, as upstreams send them: a re-encoded event
    # (orjson, compact) would not compare equal, so identity of bytes is observable.
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def anthropic_event(obj: dict[str, Any]) -> bytes:
    return f"event: {obj['type']}\n".encode() + data(obj)


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, index: int = 0) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1747233000,
        "model": "m",
        "choices": [{"index": index, "delta": delta or {}, "logprobs": None, "finish_reason": finish}],
    }


USAGE = {
    "prompt_tokens": 2006,
    "completion_tokens": 9,
    "total_tokens": 2015,
    "prompt_tokens_details": {"cached_tokens": 1920},
}
USAGE_CHUNK = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1747233000,
    "model": "m",
    "choices": [],
    "usage": USAGE,
}
DONE = b"data: [DONE]\n\n"


def call_delta(index: int, *, id: str | None = None, name: str | None = None, args: str | None = None) -> dict:
    d: dict[str, Any] = {"index": index}
    if id is not None:
        d["id"] = id
        d["type"] = "function"
    fn: dict[str, Any] = {}
    if name is not None:
        fn["name"] = name
    if args is not None:
        fn["arguments"] = args
    if fn:
        d["function"] = fn
    return d


def tool_chunk(*deltas: dict[str, Any]) -> dict[str, Any]:
    return chunk({"tool_calls": list(deltas)})


def run(reply: ChatReply | MessagesReply, stream: bytes, size: int = 0) -> list[bytes]:
    """Feed ``stream`` in chunks of ``size`` bytes (whole if 0); the bytes the client gets, per event."""
    splitter = SSESplitter()
    out: list[bytes] = []
    step = size or len(stream) or 1
    for i in range(0, len(stream), step):
        for event in splitter.feed(stream[i : i + step]):
            forwarded = reply.feed(event)
            if forwarded is not None:
                out.append(forwarded)
    tail = splitter.flush()
    if tail is not None:
        forwarded = reply.feed(tail)
        if forwarded is not None:
            out.append(forwarded)
    return out


def payloads(out: list[bytes]) -> list[Any]:
    """What an SDK parses from the forwarded bytes."""
    events: list[Event] = []
    splitter = SSESplitter()
    for raw in out:
        events.extend(splitter.feed(raw))
    return [json.loads(e.data) for e in events if e.data is not None and e.data != b"[DONE]"]


def client_message(out: list[bytes]) -> dict[str, Any]:
    """Accumulate the forwarded chat chunks the way the openai SDK does (choice 0)."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for obj in payloads(out):
        for choice in obj.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            finish = choice.get("finish_reason") or finish
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for d in delta.get("tool_calls") or ():
                c = calls.setdefault(d["index"], {"id": None, "type": "function", "name": None, "args": ""})
                c["id"] = d.get("id") or c["id"]
                fn = d.get("function") or {}
                c["name"] = fn.get("name") or c["name"]
                c["args"] += fn.get("arguments") or ""
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        assert sorted(calls) == list(range(len(calls)))  # indices are dense from 0
        msg["tool_calls"] = [
            {"id": c["id"], "type": c["type"], "function": {"name": c["name"], "arguments": c["args"]}}
            for _, c in sorted(calls.items())
        ]
    msg["finish_reason"] = finish
    return msg


def without_finish(msg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in msg.items() if k != "finish_reason"}


# -- OpenAI streams ------------------------------------------------------------------------
PLAIN = [
    chunk({"role": "assistant", "content": "", "refusal": None}),
    chunk({"content": "Hello — "}),
    chunk({"content": "wörld 🚀"}),
    tool_chunk(call_delta(0, id="call_a", name="terminal", args="")),
    tool_chunk(call_delta(0, args='{"command": ')),
    tool_chunk(call_delta(0, args='"ls"}')),
    chunk({}, "tool_calls"),
]
PLAIN_STREAM = b"".join(data(c) for c in PLAIN) + data(USAGE_CHUNK) + DONE


@pytest.mark.parametrize("size", [0, 1, 7, 64])
def test_chat_stream_passes_through_byte_identical(size: int) -> None:
    reply = ChatReply()
    out = run(reply, PLAIN_STREAM, size)
    assert b"".join(out) == PLAIN_STREAM
    assert reply.usage.result == Usage(2006, 1920)
    assert reply.blocked == 0
    assert reply.first_token


def test_chat_stream_with_guard_and_no_tool_calls_is_byte_identical() -> None:
    stream = b"".join(data(c) for c in PLAIN[:3]) + data(chunk({}, "stop")) + DONE
    reply = ChatReply(offered=OFFERED)
    assert b"".join(run(reply, stream, 5)) == stream


def test_unchanged_events_keep_their_own_bytes() -> None:
    # Comments, event lines, CRLF separators and non-JSON data are forwarded as received.
    stream = b": ping\r\n\r\nevent: x\ndata: not json\n\n" + data(PLAIN[1]).replace(b"\n\n", b"\r\n\r\n")
    reply = ChatReply(offered=OFFERED, drop_usage_chunk=True)
    assert b"".join(run(reply, stream, 3)) == stream


@pytest.mark.parametrize("size", [0, 1, 9])
def test_drop_usage_chunk_removes_only_that_chunk(size: int) -> None:
    reply = ChatReply(drop_usage_chunk=True)
    out = run(reply, PLAIN_STREAM, size)
    assert b"".join(out) == b"".join(data(c) for c in PLAIN) + DONE
    assert reply.usage.result == Usage(2006, 1920)


def test_usage_chunk_is_kept_unless_asked() -> None:
    reply = ChatReply()
    assert data(USAGE_CHUNK) in run(reply, PLAIN_STREAM)


def test_drop_usage_chunk_keeps_usage_that_rides_on_a_content_chunk() -> None:
    # vLLM continuous usage / servers that put usage on the final choice chunk.
    last = {**chunk({"content": "!"}, "stop"), "usage": USAGE}
    stream = data(PLAIN[1]) + data(last) + DONE
    reply = ChatReply(drop_usage_chunk=True)
    assert b"".join(run(reply, stream)) == stream
    assert reply.usage.result == Usage(2006, 1920)


def test_drop_usage_chunk_keeps_an_empty_choices_chunk_without_usage() -> None:
    stream = data({**USAGE_CHUNK, "usage": None}) + DONE
    expected = data({k: v for k, v in USAGE_CHUNK.items() if k != "usage"}) + DONE
    assert b"".join(run(ChatReply(drop_usage_chunk=True), stream)) == expected


def test_asked_usage_null_is_removed_from_every_chunk_and_nothing_else() -> None:
    # Asking for usage makes servers add "usage": null to every chunk; the client
    # did not ask, so it must not see it.  The rest of each chunk keeps its bytes.
    chunks = [{**c, "usage": None} for c in PLAIN]
    stream = b"".join(data(c) for c in chunks) + DONE
    out = b"".join(run(ChatReply(drop_usage_chunk=True), stream, 7))
    assert out == b"".join(data(c) for c in PLAIN) + DONE
    # A client that asked for usage itself gets what the server sent.
    assert b"".join(run(ChatReply(), stream)) == stream


# -- the fork guard, streamed ---------------------------------------------------------------
GUARDED = [
    chunk({"role": "assistant", "content": "Saving."}),
    tool_chunk(call_delta(0, id="call_t", name="terminal", args="")),
    tool_chunk(call_delta(0, args='{"command": "rm -rf /tmp/x"}')),
    # memory: the name arrives after the id and the first arguments
    tool_chunk(call_delta(1, id="call_m", args="")),
    tool_chunk(call_delta(1, args='{"action": ')),
    tool_chunk(call_delta(1, name="memory", args='"add", ')),
    tool_chunk(call_delta(1, args='"content": "likes ruff"}')),
    # two deltas in one chunk: a blocked call's and an allowed call's
    tool_chunk(
        call_delta(2, id="call_w", name="web_search", args="{}"),
        call_delta(3, id="call_s", name="skill_manage", args=""),
    ),
    tool_chunk(call_delta(3, args='{"name": "x"}'), call_delta(2, args="more")),
    chunk({}, "tool_calls"),
]
GUARDED_STREAM = b"".join(data(c) for c in GUARDED) + data(USAGE_CHUNK) + DONE
CLIENT_CALLS = [
    {
        "id": "call_m",
        "type": "function",
        "function": {"name": "memory", "arguments": '{"action": "add", "content": "likes ruff"}'},
    },
    {"id": "call_s", "type": "function", "function": {"name": "skill_manage", "arguments": '{"name": "x"}'}},
]


@pytest.mark.parametrize("size", [0, 1, 13, 100])
def test_stream_guard_removes_calls_to_tools_not_offered(size: int) -> None:
    reply = ChatReply(offered=OFFERED, drop_usage_chunk=True)
    out = run(reply, GUARDED_STREAM, size)
    raw = b"".join(out)
    assert b"terminal" not in raw and b"rm -rf" not in raw and b"web_search" not in raw and b"more" not in raw
    assert reply.blocked == 2
    received = client_message(out)
    assert received == {
        "role": "assistant",
        "content": "Saving.",
        "tool_calls": CLIENT_CALLS,
        "finish_reason": "tool_calls",
    }
    assert reply.message() == without_finish(received)
    assert reply.usage.result == Usage(2006, 1920)
    assert out[0] == data(GUARDED[0])  # untouched event: same bytes
    assert out[-1] == DONE


def test_stream_guard_holds_a_calls_deltas_until_the_call_ends() -> None:
    # A name may grow until its call ends, so nothing of call 1 goes out before then (this
    # test once expected one merged delta as soon as a first name piece came: the bypass);
    # then its deltas go out as they came, renumbered to 0.
    reply = ChatReply(offered=OFFERED)
    events = [data(c) for c in [*GUARDED[3:7], chunk({}, "tool_calls")]]
    forwarded = [reply.feed(next(SSESplitter().feed(e))) for e in events]
    assert forwarded[:4] == [None] * 4
    released = payloads([forwarded[4]])  # type: ignore[list-item]
    assert [p["choices"][0]["delta"].get("tool_calls") for p in released] == [
        [{**d, "index": 0} for d in c["choices"][0]["delta"]["tool_calls"]] for c in GUARDED[3:7]
    ] + [None]
    assert released[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_stream_guard_only_blocked_calls_turns_finish_into_stop() -> None:
    stream = (
        b"".join(
            data(c)
            for c in [
                chunk({"role": "assistant", "content": None}),
                tool_chunk(call_delta(0, id="call_t", args="")),
                tool_chunk(call_delta(0, name="terminal", args='{"command": "ls"}')),
                tool_chunk(call_delta(0, args="")),
                chunk({}, "tool_calls"),
            ]
        )
        + DONE
    )
    reply = ChatReply(offered=OFFERED)
    out = run(reply, stream, 11)
    assert b"terminal" not in b"".join(out)
    assert reply.blocked == 1
    assert client_message(out) == {"role": "assistant", "content": None, "finish_reason": "stop"}
    assert reply.message() == {"role": "assistant", "content": None}


def test_stream_guard_allowed_only_keeps_finish_reason() -> None:
    stream = b"".join(
        data(c) for c in [tool_chunk(call_delta(0, id="c", name="memory", args="{}")), chunk({}, "tool_calls")]
    )
    reply = ChatReply(offered=OFFERED)
    out = run(reply, stream)
    assert client_message(out)["finish_reason"] == "tool_calls"
    assert reply.blocked == 0


def test_stream_guard_covers_every_choice() -> None:
    stream = b"".join(
        data(c)
        for c in [
            {
                **chunk(),
                "choices": [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [call_delta(0, id="a", name="memory", args="{}")]},
                        "finish_reason": None,
                    },
                    {
                        "index": 1,
                        "delta": {"tool_calls": [call_delta(0, id="b", name="terminal", args="{}")]},
                        "finish_reason": None,
                    },
                ],
            },
            {
                **chunk(),
                "choices": [
                    {"index": 0, "delta": {}, "finish_reason": "tool_calls"},
                    {"index": 1, "delta": {}, "finish_reason": "tool_calls"},
                ],
            },
        ]
    )
    reply = ChatReply(offered=OFFERED)
    out = payloads(run(reply, stream))
    assert b"terminal" not in b"".join(run(ChatReply(offered=OFFERED), stream))
    assert reply.blocked == 1
    assert out[1]["choices"][0]["finish_reason"] == "tool_calls"
    assert out[1]["choices"][1]["finish_reason"] == "stop"
    assert reply.message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "a", "type": "function", "function": {"name": "memory", "arguments": "{}"}}],
    }


def test_no_guard_without_offered() -> None:
    reply = ChatReply()
    out = run(reply, GUARDED_STREAM)
    assert b"".join(out) == GUARDED_STREAM
    assert reply.blocked == 0
    names = [c["function"]["name"] for c in reply.message()["tool_calls"]]  # type: ignore[index]
    assert names == ["terminal", "memory", "web_search", "skill_manage"]


# -- OpenAI, not streamed ----------------------------------------------------------------------
def completion(calls: list[dict[str, Any]] | None, content: str | None = None, finish: str = "tool_calls") -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls is not None:
        msg["tool_calls"] = calls
    return {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "model": "m",
        "usage": USAGE,
        "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
    }


def call(id: str, name: str, args: str = "{}") -> dict[str, Any]:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": args}}


def test_complete_guard_removes_calls_not_offered() -> None:
    body = completion([call("t", "terminal"), call("m", "memory", '{"action": "add"}'), call("s", "skill_manage")])
    reply = ChatReply(offered=OFFERED)
    assert reply.complete(body) is True
    assert body["choices"][0]["message"]["tool_calls"] == [
        call("m", "memory", '{"action": "add"}'),
        call("s", "skill_manage"),
    ]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert reply.blocked == 1
    assert reply.usage.result == Usage(2006, 1920)
    assert reply.message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": body["choices"][0]["message"]["tool_calls"],
    }


def test_complete_guard_only_blocked_calls() -> None:
    body = completion([call("t", "terminal")], content="Let me look.")
    reply = ChatReply(offered=OFFERED)
    assert reply.complete(body) is True
    assert "tool_calls" not in body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert reply.blocked == 1
    assert reply.message() == {"role": "assistant", "content": "Let me look."}


def test_complete_unchanged_reports_false() -> None:
    body = completion([call("m", "memory")])
    before = copy.deepcopy(body)
    reply = ChatReply(offered=OFFERED)
    assert reply.complete(body) is False
    assert body == before
    assert ChatReply().complete(completion([call("t", "terminal")])) is False


def test_complete_message_as_received() -> None:
    reply = ChatReply()
    reply.complete(completion(None, content="Hi there.", finish="stop"))
    assert reply.message() == {"role": "assistant", "content": "Hi there."}


@pytest.mark.parametrize("body", [None, [], {"error": {"message": "boom"}}, {"choices": []}])
def test_no_message_without_a_choice(body: Any) -> None:
    reply = ChatReply()
    assert reply.complete(body) is False
    assert reply.message() is None


def test_stream_message_joins_content_and_calls() -> None:
    reply = ChatReply()
    run(reply, PLAIN_STREAM, 4)
    assert reply.message() == {
        "role": "assistant",
        "content": "Hello — wörld 🚀",
        "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}}
        ],
    }


def test_stream_without_choices_has_no_message() -> None:
    reply = ChatReply()
    run(reply, data({"error": {"message": "overloaded"}}))
    assert reply.message() is None


# -- Anthropic messages -------------------------------------------------------------------------
MSG_USAGE = {
    "input_tokens": 12,
    "cache_creation_input_tokens": 248,
    "cache_read_input_tokens": 93801,
    "output_tokens": 1,
}


def anthropic_stream(*, terminal: bool = True, memory: bool = True) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude",
                "content": [],
                "stop_reason": None,
                "usage": MSG_USAGE,
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Saving "}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "that — ✓"}},
        {"type": "content_block_stop", "index": 0},
    ]
    n = 1
    if terminal:
        events += [
            {
                "type": "content_block_start",
                "index": n,
                "content_block": {"type": "tool_use", "id": "toolu_t", "name": "terminal", "input": {}},
            },
            {
                "type": "content_block_delta",
                "index": n,
                "delta": {"type": "input_json_delta", "partial_json": '{"command": '},
            },
            {"type": "content_block_delta", "index": n, "delta": {"type": "input_json_delta", "partial_json": '"ls"}'}},
            {"type": "content_block_stop", "index": n},
        ]
        n += 1
    if memory:
        events += [
            {
                "type": "content_block_start",
                "index": n,
                "content_block": {"type": "tool_use", "id": "toolu_m", "name": "memory", "input": {}},
            },
            {"type": "content_block_delta", "index": n, "delta": {"type": "input_json_delta", "partial_json": ""}},
            {
                "type": "content_block_delta",
                "index": n,
                "delta": {"type": "input_json_delta", "partial_json": '{"action": "ad'},
            },
            {
                "type": "content_block_delta",
                "index": n,
                "delta": {"type": "input_json_delta", "partial_json": 'd", "content": "ruff"}'},
            },
            {"type": "content_block_stop", "index": n},
        ]
    events += [
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 61},
        },
        {"type": "message_stop"},
    ]
    return events


def astream(events: list[dict[str, Any]]) -> bytes:
    return b"".join(anthropic_event(e) for e in events)


TEXT_BLOCK = {"type": "text", "text": "Saving that — ✓"}
MEMORY_BLOCK = {"type": "tool_use", "id": "toolu_m", "name": "memory", "input": {"action": "add", "content": "ruff"}}
TERMINAL_BLOCK = {"type": "tool_use", "id": "toolu_t", "name": "terminal", "input": {"command": "ls"}}


@pytest.mark.parametrize("size", [0, 1, 17])
def test_messages_stream_passes_through_byte_identical(size: int) -> None:
    stream = astream(anthropic_stream())
    reply = MessagesReply()
    assert b"".join(run(reply, stream, size)) == stream
    assert reply.usage.result == Usage(prompt=94061, cached=93801, cache_write=248)
    assert reply.message() == {"role": "assistant", "content": [TEXT_BLOCK, TERMINAL_BLOCK, MEMORY_BLOCK]}
    assert reply.first_token


@pytest.mark.parametrize("size", [0, 1, 17])
def test_messages_stream_guard_drops_and_renumbers(size: int) -> None:
    events = anthropic_stream()
    reply = MessagesReply(offered=OFFERED)
    out = run(reply, astream(events), size)
    assert b"terminal" not in b"".join(out)
    assert reply.blocked == 1
    received = payloads(out)
    starts = [(e["index"], e["content_block"]["type"]) for e in received if e["type"] == "content_block_start"]
    assert starts == [(0, "text"), (1, "tool_use")]
    assert {e["index"] for e in received if e["type"] in ("content_block_delta", "content_block_stop")} == {0, 1}
    assert next(e for e in received if e["type"] == "message_delta")["delta"]["stop_reason"] == "tool_use"
    # untouched events keep their bytes; renumbered ones keep their event: line
    assert out[0] == anthropic_event(events[0])
    renumbered = [o for o in out if b'"index":1' in o]
    assert renumbered and all(o.startswith(b"event: content_block_") for o in renumbered)
    assert reply.message() == {"role": "assistant", "content": [TEXT_BLOCK, MEMORY_BLOCK]}
    assert reply.usage.result == Usage(prompt=94061, cached=93801, cache_write=248)


def test_messages_stream_guard_only_blocked_tool_use_ends_the_turn() -> None:
    reply = MessagesReply(offered=OFFERED)
    received = payloads(run(reply, astream(anthropic_stream(memory=False)), 5))
    assert next(e for e in received if e["type"] == "message_delta")["delta"]["stop_reason"] == "end_turn"
    assert [e["type"] for e in received].count("content_block_start") == 1
    assert reply.blocked == 1
    assert reply.message() == {"role": "assistant", "content": [TEXT_BLOCK]}


def test_messages_tool_use_without_input_deltas_keeps_empty_input() -> None:
    events = [
        {
            "type": "message_start",
            "message": {"id": "m", "type": "message", "role": "assistant", "content": [], "usage": MSG_USAGE},
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "t", "name": "memory", "input": {}},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 3}},
    ]
    reply = MessagesReply(offered=OFFERED)
    assert b"".join(run(reply, astream(events))) == astream(events)
    assert reply.message() == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t", "name": "memory", "input": {}}],
    }


def test_messages_message_before_message_start_is_none() -> None:
    reply = MessagesReply()
    run(reply, anthropic_event({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
    assert reply.message() is None


def message_body(content: list[dict[str, Any]], stop: str = "tool_use") -> dict[str, Any]:
    return {
        "id": "msg_2",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": content,
        "stop_reason": stop,
        "usage": {**MSG_USAGE, "output_tokens": 61},
    }


def test_messages_complete_guard() -> None:
    body = message_body([TEXT_BLOCK, TERMINAL_BLOCK, MEMORY_BLOCK])
    reply = MessagesReply(offered=OFFERED)
    assert reply.complete(body) is True
    assert body["content"] == [TEXT_BLOCK, MEMORY_BLOCK]
    assert body["stop_reason"] == "tool_use"
    assert reply.blocked == 1
    assert reply.message() == {"role": "assistant", "content": [TEXT_BLOCK, MEMORY_BLOCK]}
    assert reply.usage.result == Usage(prompt=94061, cached=93801, cache_write=248)


def test_messages_complete_guard_only_blocked() -> None:
    body = message_body([TEXT_BLOCK, TERMINAL_BLOCK])
    reply = MessagesReply(offered=OFFERED)
    assert reply.complete(body) is True
    assert body["content"] == [TEXT_BLOCK]
    assert body["stop_reason"] == "end_turn"
    assert reply.message() == {"role": "assistant", "content": [TEXT_BLOCK]}


def test_messages_complete_unchanged() -> None:
    body = message_body([TEXT_BLOCK, MEMORY_BLOCK])
    before = copy.deepcopy(body)
    reply = MessagesReply(offered=OFFERED)
    assert reply.complete(body) is False
    assert body == before
    assert reply.message() == {"role": "assistant", "content": [TEXT_BLOCK, MEMORY_BLOCK]}
    assert MessagesReply().complete(message_body([TERMINAL_BLOCK])) is False


def test_each_reply_knows_when_its_stream_has_ended() -> None:
    """``ended`` turns true on the stream's last event, so a worker can hold what follows
    until its record is out (proxy.handler)."""

    def events(raw: bytes) -> list[Event]:
        return list(SSESplitter().feed(raw))

    chat = ChatReply()
    for ev in events(data(chunk({"content": "hi"})) + data(chunk(finish="stop"))):
        chat.feed(ev)
    assert not chat.ended
    for ev in events(b"data: [DONE]\n\n"):
        chat.feed(ev)
    assert chat.ended
    msgs = MessagesReply()
    for kind in ("message_start", "message_delta"):
        for ev in events(anthropic_event({"type": kind, "message": {}, "delta": {}})):
            msgs.feed(ev)
    assert not msgs.ended
    for ev in events(anthropic_event({"type": "message_stop"})):
        msgs.feed(ev)
    assert msgs.ended
    for end in ("response.completed", "response.incomplete", "response.failed"):
        resp = ResponsesReply()
        for ev in events(data({"type": "response.created", "response": {"id": "r1"}})):
            resp.feed(ev)
        assert not resp.ended
        for ev in events(data({"type": end, "response": {"id": "r1", "output": []}})):
            resp.feed(ev)
        assert resp.ended, end
