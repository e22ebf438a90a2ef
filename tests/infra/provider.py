"""A scripted hosted provider with a prompt cache, to show what prefixpin's
``provider_cache`` settings change (not a model of any provider's internals).

Run as ``python -m tests.infra.provider --port N [--machines 4]``.

Chat completions (OpenAI-like): the prompt is a chain of segments (tools[], then
each message); every prefix a machine has served is cached on that machine.  A
request with a ``prompt_cache_key`` goes to the machine its key hashes to; one
without is spread over the machines in turn (what a provider does under load
when it cannot tell two conversations apart), so consecutive turns of one
conversation land on machines that have not seen its prefix.  Usage reports
``prompt_tokens_details.cached_tokens`` (the longest cached prefix).

Messages (Anthropic-like): one cache, written only at ``cache_control``
breakpoints (tools, then system blocks, then message blocks, in order); a read
is the longest cached prefix ending at a breakpoint or up to ``LOOKBACK`` blocks
before one.  Usage reports ``cache_read_input_tokens`` /
``cache_creation_input_tokens`` / ``input_tokens``.  A request carrying
``diagnostics: {"previous_message_id": id}`` gets
``diagnostics.cache_miss_reason`` comparing it with that response's request
(``model_changed``, ``system_changed``, ``tools_changed``, ``messages_changed``,
null when it only extends it, ``previous_message_not_found``).

Tokens are bytes / 4 of the compact JSON of each segment.  ``GET /_stats`` sums
what was reported; ``POST /_reset`` forgets everything.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

LOOKBACK = 20
Json = Any


class Provider:
    def __init__(self, machines: int = 4) -> None:
        self.machines = machines
        self.reset()

    def reset(self) -> None:
        self.caches: list[set[bytes]] = [set() for _ in range(self.machines)]
        self.anthropic: set[bytes] = set()
        self.turn = itertools.count()
        self.ids = itertools.count(1)
        self.prints: dict[str, dict[str, Any]] = {}
        self.stats = {"requests": 0, "prompt": 0, "cached": 0, "written": 0}

    # -- chat completions ----------------------------------------------------------
    def chat(self, body: Json) -> Json:
        segments = [orjson.dumps(body.get("tools") or [])] + [_canon(m) for m in body.get("messages") or []]
        key = body.get("prompt_cache_key")
        if isinstance(key, str):
            machine = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % self.machines
        else:
            machine = next(self.turn) % self.machines
        cache = self.caches[machine]
        chain, prompt, cached = _chain(segments), 0, 0
        for link, seg in zip(chain, segments, strict=True):
            prompt += _tokens(seg)
            if link in cache and cached == prompt - _tokens(seg):
                cached = prompt
        cache.update(chain)
        self._count(prompt, cached, 0)
        return {
            "id": f"chatcmpl-{next(self.ids)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "m"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": 1,
                "total_tokens": prompt + 1,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }

    # -- messages ---------------------------------------------------------------------
    def messages(self, body: Json) -> Json:
        blocks: list[tuple[bytes, bool]] = []  # (canonical block, carries a breakpoint)
        for tool in body.get("tools") or []:
            blocks.append(_block(tool))
        system = body.get("system")
        for part in [{"type": "text", "text": system}] if isinstance(system, str) else system or []:
            blocks.append(_block(part))
        for msg in body.get("messages") or []:
            content = msg.get("content")
            parts = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
            for i, part in enumerate(parts):
                raw, marked = _block(part)
                blocks.append((msg["role"].encode() + str(i).encode() + raw, marked))
        chain = _chain([b for b, _ in blocks])
        sizes = list(itertools.accumulate(_tokens(b) for b, _ in blocks))
        marks = [i for i, (_, marked) in enumerate(blocks) if marked]
        read = 0
        for m in marks:
            for j in range(m, max(m - LOOKBACK, -1), -1):
                if chain[j] in self.anthropic:
                    read = max(read, sizes[j])
                    break
        written = 0
        for m in marks:
            if chain[m] not in self.anthropic:
                self.anthropic.add(chain[m])
                written = max(written, sizes[m] - read)
        prompt = sizes[-1] if sizes else 0
        self._count(prompt, read, written)
        msg_id = f"msg_{next(self.ids):04d}"
        out: Json = {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "m"),
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": prompt - read - written,
                "cache_read_input_tokens": read,
                "cache_creation_input_tokens": written,
                "output_tokens": 1,
            },
        }
        diag = body.get("diagnostics")
        if isinstance(diag, dict):
            fp = _fingerprint(body)
            self.prints[msg_id] = fp
            out["diagnostics"] = {
                "cache_miss_reason": _miss(self.prints.get(diag.get("previous_message_id") or ""), fp)
            }
        return out

    def _count(self, prompt: int, cached: int, written: int) -> None:
        s = self.stats
        s["requests"] += 1
        s["prompt"] += prompt
        s["cached"] += cached
        s["written"] += written


def _canon(value: Json) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _block(part: Json) -> tuple[bytes, bool]:
    if not isinstance(part, dict):
        return _canon(part), False
    return _canon({k: v for k, v in part.items() if k != "cache_control"}), "cache_control" in part


def _chain(segments: list[bytes]) -> list[bytes]:
    out, h = [], hashlib.sha256()
    for seg in segments:
        h.update(hashlib.sha256(seg).digest())
        out.append(h.copy().digest())
    return out


def _tokens(seg: bytes) -> int:
    return max(1, len(seg) // 4)


def _strip(value: Json) -> Json:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _blocks(content: Json) -> Json:
    """A string content is the one text block it stands for."""
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _fingerprint(body: Json) -> dict[str, Any]:
    messages = [{**m, "content": _blocks(m.get("content"))} for m in body.get("messages") or []]
    return {
        "model": body.get("model"),
        "system": _canon(_strip(_blocks(body.get("system")))),
        "tools": _canon(_strip(body.get("tools"))),
        "messages": [_canon(_strip(m)) for m in messages],
    }


def _miss(prev: dict[str, Any] | None, cur: dict[str, Any]) -> Json:
    if prev is None:
        return {"type": "previous_message_not_found"}
    for part in ("model", "system", "tools"):
        if prev[part] != cur[part]:
            return {"type": f"{part}_changed"}
    if cur["messages"][: len(prev["messages"])] != prev["messages"]:
        return {"type": "messages_changed"}
    return None


def create_app(machines: int = 4) -> Starlette:
    provider = Provider(machines)

    async def chat(request: Request) -> Response:
        return JSONResponse(provider.chat(orjson.loads(await request.body())))

    async def messages(request: Request) -> Response:
        return JSONResponse(provider.messages(orjson.loads(await request.body())))

    async def stats(request: Request) -> Response:
        return JSONResponse(provider.stats)

    async def reset(request: Request) -> Response:
        provider.reset()
        return JSONResponse({})

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/_stats", stats),
            Route("/_reset", reset, methods=["POST"]),
            Route("/health", health),
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--machines", type=int, default=4)
    args = ap.parse_args()
    uvicorn.run(create_app(args.machines), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
