"""A small real upstream that records what it receives and answers as told.

Run as ``python -m tests.infra.recorder --port N``.  It speaks OpenAI chat
completions, Anthropic messages and OpenAI Responses, streamed and not, and can be told (``POST
/_control``) to answer with tool calls, an error status, a delay, or a stream that
is cut mid-way; a control with ``then`` answers once and then as ``then`` says (an
agent's tool loop: a call, then a final message).  ``GET /_requests`` returns every request received, with its raw
body, so tests can check the exact bytes prefixpin forwarded.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

STATE: dict[str, Any] = {"requests": [], "control": {}}


def _record(request: Request, raw: bytes) -> None:
    STATE["requests"].append(
        {
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "headers": {k: v for k, v in request.headers.items()},
            "body_b64": base64.b64encode(raw).decode(),
        }
    )


def _usage(raw: bytes, ctl: dict[str, Any]) -> dict[str, Any]:
    prompt = max(1, len(raw) // 4)
    return ctl.get("usage") or {
        "prompt_tokens": prompt,
        "completion_tokens": 3,
        "total_tokens": prompt + 3,
        "prompt_tokens_details": {"cached_tokens": ctl.get("cached", 0)},
    }


def _calls(ctl: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"id": f"call_{i}", "type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", "{}")}}
        for i, c in enumerate(ctl.get("tool_calls", []))
    ]


async def _preamble(request: Request) -> tuple[bytes, dict[str, Any], Response | None]:
    """Record the request, then apply the told delay / error status."""
    raw = await request.body()
    _record(request, raw)
    ctl = STATE["control"]
    if ctl.get("delay_s"):
        await asyncio.sleep(float(ctl["delay_s"]))  # a slow upstream, as told: not a wait
    if ctl.get("status"):
        return (
            raw,
            ctl,
            JSONResponse(
                {"error": {"message": "told to fail", "type": "test", "code": ctl["status"]}},
                status_code=int(ctl["status"]),
                headers={"x-recorder": "error"},
            ),
        )
    return raw, ctl, None


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def chat(request: Request) -> Response:
    raw, ctl, early = await _preamble(request)
    if early is not None:
        return early
    if isinstance(ctl.get("then"), dict):  # answer once, then as ``then`` says (an agent's tool loop)
        STATE["control"] = ctl["then"]
    try:
        body = json.loads(raw)
        assert isinstance(body, dict) and isinstance(body.get("messages"), list)
    except (ValueError, AssertionError):
        return JSONResponse(
            {"error": {"message": "bad request body", "type": "invalid_request_error"}}, status_code=400
        )
    content = ctl.get("content", "ok")
    calls = _calls(ctl)
    finish = "tool_calls" if calls else "stop"
    base = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body.get("model", "m")}
    if not body.get("stream"):
        msg: dict[str, Any] = {"role": "assistant", "content": content if not calls else None}
        if calls:
            msg["tool_calls"] = calls
        return JSONResponse(
            {**base, "choices": [{"index": 0, "message": msg, "finish_reason": finish}], "usage": _usage(raw, ctl)}
        )
    include_usage = (body.get("stream_options") or {}).get("include_usage") is True

    async def gen() -> AsyncIterator[bytes]:
        chunk: dict[str, Any] = {**base, "object": "chat.completion.chunk"}
        if include_usage:  # as OpenAI and vLLM do: every chunk carries "usage": null
            chunk["usage"] = None
        yield _sse({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        if ctl.get("slow_chunks"):  # a long stream that notes whether it was closed early
            STATE["stream_closed_early"] = None
            finished = False
            try:
                for i in range(int(ctl["slow_chunks"])):
                    yield _sse({**chunk, "choices": [{"index": 0, "delta": {"content": f"{i} "}}]})
                    await asyncio.sleep(0.05)  # the pace of a slow upstream: not a wait
                finished = True
            finally:
                STATE["stream_closed_early"] = not finished
        if not calls:
            for piece in (content[: len(content) // 2], content[len(content) // 2 :]):
                yield _sse({**chunk, "choices": [{"index": 0, "delta": {"content": piece}}]})
                if ctl.get("cut"):
                    raise RuntimeError("cut the stream")
        for i, c in enumerate(calls):
            first = {
                "index": i,
                "id": c["id"],
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": ""},
            }
            yield _sse({**chunk, "choices": [{"index": 0, "delta": {"tool_calls": [first]}}]})
            args = c["function"]["arguments"]
            for part in (args[: len(args) // 2], args[len(args) // 2 :]):
                delta = {"tool_calls": [{"index": i, "function": {"arguments": part}}]}
                yield _sse({**chunk, "choices": [{"index": 0, "delta": delta}]})
        yield _sse({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if include_usage:
            yield _sse({**chunk, "choices": [], "usage": _usage(raw, ctl)})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


async def messages(request: Request) -> Response:
    raw, ctl, early = await _preamble(request)
    if early is not None:
        return early
    body = json.loads(raw)
    calls = STATE["control"].get("tool_calls", [])
    usage = ctl.get("usage") or {
        "input_tokens": 10,
        "output_tokens": 3,
        "cache_read_input_tokens": ctl.get("cached", 0),
        "cache_creation_input_tokens": 0,
    }
    blocks: list[dict[str, Any]] = [{"type": "text", "text": ctl.get("content", "ok")}]
    blocks += [
        {"type": "tool_use", "id": f"toolu_{i}", "name": c["name"], "input": json.loads(c.get("arguments", "{}"))}
        for i, c in enumerate(calls)
    ]
    stop = "tool_use" if calls else "end_turn"
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": body.get("model", "m")}
    if not body.get("stream"):
        return JSONResponse({**msg, "content": blocks, "stop_reason": stop, "usage": usage})

    async def gen() -> AsyncIterator[bytes]:
        def ev(kind: str, obj: dict[str, Any]) -> bytes:
            return f"event: {kind}\n".encode() + _sse({"type": kind, **obj})

        yield ev("message_start", {"message": {**msg, "content": [], "stop_reason": None, "usage": usage}})
        for i, b in enumerate(blocks):
            if b["type"] == "text":
                yield ev("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}})
                yield ev("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": b["text"]}})
            else:
                start = {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}
                yield ev("content_block_start", {"index": i, "content_block": start})
                delta = {"type": "input_json_delta", "partial_json": json.dumps(b["input"])}
                yield ev("content_block_delta", {"index": i, "delta": delta})
            yield ev("content_block_stop", {"index": i})
        yield ev("message_delta", {"delta": {"stop_reason": stop}, "usage": {"output_tokens": 3}})
        yield ev("message_stop", {})

    return StreamingResponse(gen(), media_type="text/event-stream")


RESPONSE_IDS = iter(range(1, 1 << 30))


async def responses(request: Request) -> Response:
    """OpenAI Responses: output items (a message, or function calls), usage in the
    whole response and in ``response.completed``; ids ``resp_<n>`` in order.  A
    control with ``then`` answers once and makes ``then`` the control (an agent's
    tool loop: a call, then a final message)."""
    raw, ctl, early = await _preamble(request)
    if early is not None:
        return early
    if isinstance(ctl.get("then"), dict):
        STATE["control"] = ctl["then"]
    body = json.loads(raw)
    calls = ctl.get("tool_calls", [])
    n = next(RESPONSE_IDS)
    items: list[dict[str, Any]] = [
        {
            "type": "function_call",
            "id": f"fc_{n}_{i}",
            "call_id": f"call_{n}_{i}",
            "name": c["name"],
            "arguments": c.get("arguments", "{}"),
            "status": "completed",
        }
        for i, c in enumerate(calls)
    ]
    text = ctl.get("content", "ok")
    if not calls:
        part = {"type": "output_text", "text": text, "annotations": []}
        items.append(
            {"type": "message", "id": f"msg_{n}", "status": "completed", "role": "assistant", "content": [part]}
        )
    usage = ctl.get("usage") or {
        "input_tokens": max(1, len(raw) // 4),
        "input_tokens_details": {"cached_tokens": ctl.get("cached", 0)},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": max(1, len(raw) // 4) + 3,
    }
    resp = {
        "id": f"resp_{n}",
        "object": "response",
        "created_at": 1,
        "status": "completed",
        "model": body.get("model", "m"),
        "output": items,
        "usage": usage,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    if not body.get("stream"):
        return JSONResponse(resp)

    async def gen() -> AsyncIterator[bytes]:
        seq = iter(range(1 << 30))

        def ev(kind: str, obj: dict[str, Any]) -> bytes:
            return f"event: {kind}\n".encode() + _sse({"type": kind, "sequence_number": next(seq), **obj})

        start = {**resp, "status": "in_progress", "output": [], "usage": None}
        yield ev("response.created", {"response": start})
        for i, item in enumerate(items):
            if item["type"] == "function_call":
                yield ev(
                    "response.output_item.added",
                    {"output_index": i, "item": {**item, "arguments": "", "status": "in_progress"}},
                )
                args = item["arguments"]
                for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
                    yield ev(
                        "response.function_call_arguments.delta",
                        {"item_id": item["id"], "output_index": i, "delta": piece},
                    )
                yield ev(
                    "response.function_call_arguments.done",
                    {"item_id": item["id"], "output_index": i, "arguments": args},
                )
            else:
                added = {**item, "content": [], "status": "in_progress"}
                yield ev("response.output_item.added", {"output_index": i, "item": added})
                empty = {"type": "output_text", "text": "", "annotations": []}
                where = {"item_id": item["id"], "output_index": i, "content_index": 0}
                yield ev("response.content_part.added", {**where, "part": empty})
                for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                    yield ev("response.output_text.delta", {**where, "delta": piece, "logprobs": []})
                yield ev("response.output_text.done", {**where, "text": text, "logprobs": []})
                yield ev("response.content_part.done", {**where, "part": item["content"][0]})
            yield ev("response.output_item.done", {"output_index": i, "item": item})
        yield ev("response.completed", {"response": resp})

    return StreamingResponse(gen(), media_type="text/event-stream")


async def control(request: Request) -> Response:
    STATE["control"] = await request.json()
    return JSONResponse({"ok": True})


async def requests_(request: Request) -> Response:
    return JSONResponse(STATE["requests"])


async def status(request: Request) -> Response:
    return JSONResponse({"stream_closed_early": STATE.get("stream_closed_early")})


async def reset(request: Request) -> Response:
    STATE["requests"].clear()
    STATE["control"] = {}
    STATE["stream_closed_early"] = None
    return JSONResponse({"ok": True})


async def echo(request: Request) -> Response:
    raw = await request.body()
    _record(request, raw)
    return Response(
        raw,
        media_type=request.headers.get("content-type", "application/octet-stream"),
        headers={"x-echo-method": request.method},
    )


async def chunks(request: Request) -> Response:
    _record(request, await request.body())
    n = int(request.query_params.get("n", "5"))
    delay = float(request.query_params.get("delay", "0"))

    async def gen() -> AsyncIterator[bytes]:
        for i in range(n):
            yield f"chunk {i}\n".encode()
            await asyncio.sleep(delay)  # the pace the client asked for: not a wait

    return StreamingResponse(gen(), media_type="text/plain")


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


app = Starlette(
    routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/chat/completions/", chat, methods=["POST"]),
        Route("/openai/deployments/{name}/chat/completions", chat, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/_control", control, methods=["POST"]),
        Route("/_requests", requests_, methods=["GET"]),
        Route("/_reset", reset, methods=["POST"]),
        Route("/_status", status, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/chunks", chunks, methods=["GET", "POST"]),
        Route("/{path:path}", echo, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ]
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
