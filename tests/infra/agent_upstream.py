"""A scripted OpenAI-compatible upstream that real agents can work against, recording
every request they send.

Run as ``python -m tests.infra.agent_upstream --port N --out requests.jsonl
[--script script.json]``.  It answers ``POST /v1/chat/completions`` (and
``/chat/completions``), streamed and not, and ``GET /v1/models``.  Each request
is appended to ``--out`` as one JSON line: its path, headers and raw body (the
agent's own bytes), and the reply it got.

How it answers (plausibly, and the same way every time): when the newest message
is the user's and its text contains a rule's ``when`` (``--script``: a JSON list of
``{"when": "app.py", "tool": "read_file", "arguments": {...}}``) and the request
offers that tool, it calls the tool once; after a tool's result, or for any other
request, it answers with a short text that names the turn (``reply``).  Usage is
reported from the body's size (a token per four bytes), and ``stream_options``
is honoured as OpenAI does.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

Json = dict[str, Any]


class Script:
    """The answers: tool calls the rules name, else a text reply."""

    def __init__(self, rules: list[Json]) -> None:
        self.rules = rules
        self.calls = 0

    def answer(self, body: Json) -> Json:
        """The assistant message for ``body``."""
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        offered = {t.get("function", {}).get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        if last.get("role") == "user":
            text = _text(last.get("content"))
            for rule in self.rules:
                if rule["when"] in text and rule["tool"] in offered:
                    self.calls += 1
                    call = {
                        "id": f"call_{self.calls}",
                        "type": "function",
                        "function": {"name": rule["tool"], "arguments": json.dumps(rule.get("arguments", {}))},
                    }
                    return {"role": "assistant", "content": None, "tool_calls": [call]}
        users = sum(1 for m in messages if m.get("role") == "user")
        return {"role": "assistant", "content": f"Done (turn {users}): the file prints a greeting."}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _usage(raw: bytes) -> Json:
    prompt = max(1, len(raw) // 4)
    return {"prompt_tokens": prompt, "completion_tokens": 8, "total_tokens": prompt + 8}


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def app(out: Path, script: Script) -> Starlette:
    async def chat(request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
            assert isinstance(body, dict) and isinstance(body.get("messages"), list)
        except (ValueError, AssertionError):
            return JSONResponse({"error": {"message": "bad request body", "type": "invalid_request_error"}}, 400)
        msg = script.answer(body)
        with out.open("a", encoding="utf-8") as fh:
            line = {"path": request.url.path, "headers": dict(request.headers), "raw": raw.decode(), "reply": msg}
            fh.write(json.dumps(line, ensure_ascii=False) + "\n")
        finish = "tool_calls" if msg.get("tool_calls") else "stop"
        base = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body.get("model", "m")}
        if not body.get("stream"):
            choice = {"index": 0, "message": msg, "finish_reason": finish}
            return JSONResponse({**base, "choices": [choice], "usage": _usage(raw)})
        usage = (body.get("stream_options") or {}).get("include_usage") is True
        return StreamingResponse(_stream(base, msg, finish, raw, usage), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "test"}]})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/models", models, methods=["GET"]),
        ]
    )


async def _stream(base: Json, msg: Json, finish: str, raw: bytes, usage: bool) -> AsyncIterator[bytes]:
    chunk: Json = {**base, "object": "chat.completion.chunk"}
    yield _sse({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    if msg.get("content"):
        yield _sse({**chunk, "choices": [{"index": 0, "delta": {"content": msg["content"]}}]})
    for i, call in enumerate(msg.get("tool_calls") or []):
        delta = {"tool_calls": [{"index": i, **call}]}
        yield _sse({**chunk, "choices": [{"index": 0, "delta": delta}]})
    yield _sse({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if usage:
        yield _sse({**chunk, "choices": [], "usage": _usage(raw)})
    yield b"data: [DONE]\n\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--script", type=Path, default=None)
    args = ap.parse_args()
    rules = json.loads(args.script.read_text()) if args.script else []
    uvicorn.run(app(args.out, Script(rules)), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
