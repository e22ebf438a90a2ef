"""canonicalize.wire.reply_chat: the fork guard against every place a chat response can
carry a call, judged on what a real client assembles (the openai SDK's stream state)."""

from __future__ import annotations

import copy
import itertools
import json
import random
from typing import Any

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from canonicalize.sse import Event, SSESplitter
from canonicalize.wire.reply_chat import ChatReply
from tests.canonicalize.wire.test_reply import DONE, USAGE_CHUNK, call_delta, chunk, data, payloads, tool_chunk

OFFERED = frozenset({"memory", "skill_manage"})


def feed_all(reply: ChatReply, stream: bytes, cuts: list[int] | None = None) -> list[bytes]:
    """The bytes the client gets: ``stream`` cut at ``cuts``, then the stream's end."""
    splitter = SSESplitter()
    out: list[bytes] = []
    bounds = [0, *(cuts or []), len(stream)]
    for a, b in itertools.pairwise(bounds):
        for event in splitter.feed(stream[a:b]):
            forwarded = reply.feed(event)
            if forwarded is not None:
                out.append(forwarded)
    out.append(reply.close(splitter.take()))
    return [o for o in out if o]


def sdk_message(out: list[bytes]) -> Any:
    """Choice 0's message as the openai SDK assembles it from the forwarded bytes."""
    state = ChatCompletionStreamState()
    for obj in payloads(out):
        state.handle_chunk(ChatCompletionChunk.model_validate(obj))
    return state.get_final_completion().choices[0]


def names(choice: Any) -> list[str]:
    calls = [c.function.name for c in choice.message.tool_calls or ()]
    if choice.message.function_call is not None:
        calls.append(choice.message.function_call.name)
    return calls


# -- 1. a name in pieces ---------------------------------------------------------------------------
PIECES = [
    chunk({"role": "assistant", "content": ""}),
    tool_chunk(call_delta(0, id="call_p", name="memory", args="")),
    tool_chunk(call_delta(0, name="_purge_all", args='{"all": ')),
    tool_chunk(call_delta(0, args="true}")),
    chunk({}, "tool_calls"),
]


def test_a_name_whose_first_piece_is_offered_is_judged_whole() -> None:
    stream = b"".join(data(c) for c in PIECES) + DONE
    assert names(sdk_message([stream])) == ["memory_purge_all"]  # what an unguarded client runs
    reply = ChatReply(offered=OFFERED)
    out = feed_all(reply, stream)
    choice = sdk_message(out)
    assert names(choice) == []
    assert choice.finish_reason == "stop"
    assert reply.blocked == 1
    assert b"_purge_all" not in b"".join(out) and b"memory" not in b"".join(out)
    assert reply.message() == {"role": "assistant", "content": None}


def test_an_offered_name_in_pieces_is_released_byte_for_byte_when_the_call_ends() -> None:
    events = [
        data(chunk({"role": "assistant", "content": ""})),
        data(tool_chunk(call_delta(0, id="call_m", name="mem", args=""))),
        data(tool_chunk(call_delta(0, name="ory", args='{"a": 1}'))),
        data(tool_chunk(call_delta(1, id="call_s", name="skill_manage", args="{}"))),
        data(chunk({}, "tool_calls")),
        DONE,
    ]
    reply = ChatReply(offered=OFFERED)
    got = [reply.feed(Event.parse(e)) for e in events]
    # call 0 is held until call 1 starts; call 1 until finish_reason; then released, in order
    assert got == [events[0], None, None, events[1] + events[2], events[3] + events[4], events[5]]
    assert reply.blocked == 0
    assert names(sdk_message([e for e in got if e])) == ["memory", "skill_manage"]


def test_everything_behind_a_held_call_waits_in_order() -> None:
    events = [
        data(tool_chunk(call_delta(0, id="c", name="memory"))),
        b": keep-alive\n\n",
        data(chunk({"content": "between"})),
        data(tool_chunk(call_delta(0, args="{}"))),
        data(chunk({}, "tool_calls")),
    ]
    reply = ChatReply(offered=OFFERED)
    got = [reply.feed(Event.parse(e)) for e in events]
    assert got == [None, None, None, None, b"".join(events)]


def test_a_name_piece_after_the_call_was_released_is_removed() -> None:
    # Call 0 ends when call 1 starts; a later piece of its name would make the client's
    # name one nobody checked.
    stream = (
        b"".join(
            data(c)
            for c in [
                tool_chunk(call_delta(0, id="a", name="memory", args="{}")),
                tool_chunk(call_delta(1, id="b", name="skill_manage", args="{}")),
                tool_chunk(call_delta(0, name="_purge_all")),
                chunk({}, "tool_calls"),
            ]
        )
        + DONE
    )
    reply = ChatReply(offered=OFFERED)
    assert names(sdk_message(feed_all(reply, stream))) == ["memory", "skill_manage"]


def test_a_call_still_open_when_the_stream_stops_is_decided_by_close() -> None:
    allowed = data(tool_chunk(call_delta(0, id="a", name="memory", args="{}")))
    reply = ChatReply(offered=OFFERED)
    assert reply.feed(Event.parse(allowed)) is None
    assert reply.close(b"") == allowed
    blocked = data(tool_chunk(call_delta(0, id="a", name="terminal", args="{}")))
    reply = ChatReply(offered=OFFERED)
    assert reply.feed(Event.parse(blocked)) is None
    assert b"terminal" not in reply.close(b"") and reply.blocked == 1


def test_an_unterminated_last_event_is_guarded_too() -> None:
    stream = data(chunk({"content": "x"})) + data(tool_chunk(call_delta(0, id="a", name="terminal")))[:-2]
    reply = ChatReply(offered=OFFERED)
    out = feed_all(reply, stream)
    assert b"terminal" not in b"".join(out) and reply.blocked == 1


def test_a_delta_whose_index_is_not_an_integer_is_removed() -> None:
    stream = (
        data(tool_chunk(call_delta(0, id="a", name="memory", args="{}")))
        + data(tool_chunk({"index": "0", "function": {"name": "_purge_all"}}))
        + data(chunk({}, "tool_calls"))
    )
    reply = ChatReply(offered=OFFERED)
    out = feed_all(reply, stream)
    assert b"_purge_all" not in b"".join(out)
    assert names(sdk_message(out)) == ["memory"]


# -- 4. the legacy function_call ------------------------------------------------------------------
def legacy_completion(name: str, finish: str = "function_call") -> dict[str, Any]:
    return {
        "id": "chatcmpl-3",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "function_call": {"name": name, "arguments": "{}"}},
                "finish_reason": finish,
            }
        ],
    }


def test_complete_guards_the_legacy_function_call() -> None:
    body = legacy_completion("terminal")
    reply = ChatReply(offered=OFFERED)
    assert reply.complete(body) is True
    assert "function_call" not in body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert reply.blocked == 1
    allowed = legacy_completion("memory")
    before = copy.deepcopy(allowed)
    reply = ChatReply(offered=OFFERED)
    assert reply.complete(allowed) is False and allowed == before and reply.blocked == 0


def test_stream_guards_the_legacy_function_call_in_pieces() -> None:
    stream = (
        b"".join(
            data(c)
            for c in [
                chunk({"role": "assistant", "content": None, "function_call": {"name": "memory", "arguments": ""}}),
                chunk({"function_call": {"name": "_purge_all", "arguments": "{}"}}),
                chunk({}, "function_call"),
            ]
        )
        + DONE
    )
    reply = ChatReply(offered=OFFERED)
    out = feed_all(reply, stream)
    choice = sdk_message(out)
    assert names(choice) == [] and choice.finish_reason == "stop"
    assert reply.blocked == 1
    offered = stream.replace(b"_purge_all", b"")
    reply = ChatReply(offered=OFFERED)
    assert b"".join(feed_all(reply, offered)) == offered and reply.blocked == 0


# -- other places a chat response carries a call ---------------------------------------------------
def test_complete_guards_custom_tool_calls_by_their_custom_name() -> None:
    custom = {"id": "c1", "type": "custom", "custom": {"name": "terminal", "input": "rm -rf /"}}
    mine = {"id": "c2", "type": "custom", "custom": {"name": "memory", "input": "add"}}
    body = {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "tool_calls": [custom, mine]}, "finish_reason": "tool_calls"}
        ]
    }
    reply = ChatReply(offered=OFFERED)
    assert reply.complete(body) is True
    assert body["choices"][0]["message"]["tool_calls"] == [mine] and reply.blocked == 1


def test_stream_guards_a_whole_message_inside_a_chunk() -> None:
    whole = {
        **chunk(),
        "choices": [
            {
                "index": 0,
                "delta": {},
                "message": {"role": "assistant", "tool_calls": [{"id": "t", "function": {"name": "terminal"}}]},
                "finish_reason": "tool_calls",
            }
        ],
    }
    reply = ChatReply(offered=OFFERED)
    out = feed_all(reply, data(whole))
    assert b"terminal" not in b"".join(out) and reply.blocked == 1


@pytest.mark.parametrize("payload", [b'"x": NaN', b'"x": 1e400', b'"x": "\\ud800"', b'"x": "\xff"'])
def test_an_event_orjson_refuses_but_a_client_reads_is_guarded(payload: bytes) -> None:
    # The openai SDK reads events with the standard library's json, which takes NaN,
    # Infinity and lone surrogates; a JavaScript client replaces invalid UTF-8.
    obj = tool_chunk(call_delta(0, id="t", name="terminal", args="{}"))
    raw = data(obj)
    raw = raw[: raw.rindex(b"}")] + b", " + payload + b"}\n\n"
    json.loads(raw[6:].decode("utf-8", "replace"))  # a client reads it
    reply = ChatReply(offered=OFFERED)
    out = feed_all(reply, raw + data(chunk({}, "tool_calls")) + DONE)
    assert b"terminal" not in b"".join(out) and reply.blocked == 1


def test_an_event_no_json_reader_takes_passes_as_received() -> None:
    junk = b'data: {"choices": [{"delta": {"tool_calls": [{"function": {"name": "terminal"}}]}}],,}\n\n'
    with pytest.raises(ValueError):
        json.loads(junk[6:])
    for reply in (ChatReply(offered=OFFERED), ChatReply()):
        assert feed_all(reply, junk + DONE) == [junk, DONE]


# -- property: whatever the stream and its cuts, the SDK assembles offered names only -----------------
NAMES = ["memory", "skill_manage", "terminal", "memory_purge_all", "mem", "skill", ""]


def random_chat_stream(rng: random.Random) -> tuple[bytes, list[str]]:
    """A stream of calls with names cut in pieces at random; the whole names, in order."""
    events = [data(chunk({"role": "assistant", "content": ""}))]
    whole: list[str] = []
    for i in range(rng.randint(0, 4)):
        name = rng.choice(NAMES)
        whole.append(name)
        cut = sorted(rng.randint(0, len(name)) for _ in range(rng.randint(0, 2)))
        pieces = [name[a:b] for a, b in zip([0, *cut], [*cut, len(name)], strict=True)]
        for k, piece in enumerate(pieces):
            args = rng.choice(["", "{", "}"])
            events.append(data(tool_chunk(call_delta(i, id=None if k else f"call_{i}", name=piece or None, args=args))))
            if rng.random() < 0.3:
                events.append(data(chunk({"content": "."})))
        if rng.random() < 0.3:  # arguments for this call or an earlier one
            events.append(data(tool_chunk(call_delta(rng.randint(0, i), args="{}"))))
    events.append(data(chunk({}, "tool_calls" if whole else "stop")))
    events.append(data(USAGE_CHUNK))
    if rng.random() < 0.8:
        events.append(DONE)
    return b"".join(events), whole


def test_random_streams_reach_the_sdk_with_offered_names_only() -> None:
    rng = random.Random(1234)
    for _ in range(400):
        stream, whole = random_chat_stream(rng)
        cuts = sorted(rng.randint(0, len(stream)) for _ in range(rng.randint(0, 5)))
        reply = ChatReply(offered=OFFERED, drop_usage_chunk=rng.random() < 0.5)
        out = feed_all(reply, stream, cuts)
        choice = sdk_message(out)
        kept = [n for n in whole if n in OFFERED]
        assert names(choice) == kept, (stream, cuts)
        assert reply.blocked == len(whole) - len(kept)
        assert [c["function"]["name"] for c in (reply.message() or {}).get("tool_calls", [])] == kept
        if kept == whole and not reply.drop_usage_chunk:
            assert b"".join(out) == stream  # nothing to change: every byte as received
        unguarded = ChatReply()
        assert b"".join(feed_all(unguarded, stream, cuts)) == stream


def test_calls_in_a_choice_whose_index_is_not_an_integer_are_removed() -> None:
    # Two such choices must not join their name pieces into one offered name.
    halves = [
        {**chunk(), "choices": [{"index": "a", "delta": {"tool_calls": [call_delta(0, id="x", name="mem")]}}]},
        {**chunk(), "choices": [{"index": "b", "delta": {"tool_calls": [call_delta(0, name="ory")]}}]},
    ]
    reply = ChatReply(offered=OFFERED)
    out = feed_all(reply, b"".join(data(c) for c in halves) + DONE)
    assert b"mem" not in b"".join(out) and b"ory" not in b"".join(out) and reply.blocked == 1
