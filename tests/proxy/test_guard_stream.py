"""The fork guard through the app, in-process: a repaired fork's stream whose last
event comes without its empty line, or whose call is still open when the upstream
ends, reaches the client guarded (the reply machine sees the stream's end); a whole
reply that only a lenient JSON reader takes is guarded too."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.testclient import TestClient

from proxy.app import create_app
from proxy.config import load
from tests import hermes

USER1 = {"role": "user", "content": "List the files in the repo, please."}
PARENT_REPLY = {"role": "assistant", "content": "Sure."}
FORK_SID = "20260513_204511_9e319e"


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    obj = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "tiny"}
    obj["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def call(name: str, args: str = "{}") -> dict[str, Any]:
    return {
        "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": args}}]
    }


class Upstream:
    """The parent gets a whole reply; the fork gets ``parts``, one chunk each, streamed
    if it asked for a stream, else as one body."""

    def __init__(self, *parts: bytes) -> None:
        self.parts = parts
        self.n = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.n += 1
        if self.n == 1:
            reply = {"choices": [{"index": 0, "message": PARENT_REPLY, "finish_reason": "stop"}], "usage": {}}
            return httpx.Response(200, json=reply)
        if not json.loads(request.read()).get("stream"):
            return httpx.Response(200, headers={"content-type": "application/json"}, content=b"".join(self.parts))
        parts = self.parts

        class Stream(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                for part in parts:
                    yield part

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Stream())


def fork_reply(*parts: bytes, stream: bool = True) -> tuple[bytes, str, float]:
    """The bytes a repaired fork's client gets, its role, and the blocked-calls count."""
    app = create_app(load(None, env={}), transport=httpx.MockTransport(Upstream(*parts)))
    with TestClient(app, headers={"authorization": "Bearer sk-tenant-1"}) as client:
        parent = hermes.request(hermes.system_prompt(), [USER1], hermes.tools_full())
        assert client.post("/v1/chat/completions", json=parent).status_code == 200
        # A review fork: another session's system prompt, the parent's history, fewer tools.
        system = hermes.system_prompt(minute="02:31 PM", session=FORK_SID, skills=hermes.SKILLS_REVIEW)
        history = [USER1, PARENT_REPLY, {"role": "user", "content": hermes.REVIEW_PROMPT}]
        body = hermes.request(system, history, hermes.tools_review(), stream=stream)
        fork = client.post("/v1/chat/completions", json=body)
        metrics = client.get("/metrics").text
    blocked = next(ln for ln in metrics.splitlines() if ln.startswith("prefixpin_blocked_tool_calls_total"))
    return fork.content, fork.headers["x-prefixpin-role"], float(blocked.split()[-1])


def test_an_unterminated_last_event_is_guarded() -> None:
    content, role, blocked = fork_reply(chunk({"content": "ok"}), chunk(call("terminal"), "tool_calls")[:-2])
    assert role == "fork"
    assert b"terminal" not in content and blocked == 1


def test_a_call_open_when_the_stream_ends_is_released_or_removed() -> None:
    content, role, blocked = fork_reply(chunk({"content": "ok"}), chunk(call("memory")))
    assert role == "fork" and content == chunk({"content": "ok"}) + chunk(call("memory")) and blocked == 0
    content, _, blocked = fork_reply(chunk(call("memory")), chunk(call("_purge_all")))
    assert b"purge" not in content and blocked == 1


def test_a_whole_reply_only_a_lenient_reader_takes_is_guarded() -> None:
    # orjson refuses NaN; the openai SDK (the standard library's json) reads it.
    message = {"role": "assistant", "content": None, "tool_calls": [{"id": "t", **call("terminal")["tool_calls"][0]}]}
    body = json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}], "x": float("nan")})
    content, role, blocked = fork_reply(body.encode(), stream=False)
    assert role == "fork" and b"terminal" not in content and blocked == 1
    assert json.loads(content)["choices"][0]["finish_reason"] == "stop"
