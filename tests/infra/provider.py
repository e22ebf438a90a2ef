"""A scripted hosted provider with a prompt cache, to show what prefixpin's
``provider_cache`` settings change (not a model of any provider's internals).

Run as ``python -m tests.infra.provider --port N [--machines 4]``.

Time is the provider's own clock, which only moves when told: ``POST /_clock``
with ``{"now": seconds}`` or ``{"advance": seconds}`` (in process:
``Provider(clock=...)``).  It starts at 0 and stays there unless told, so nothing
expires in a run that never moves it.

Chat completions and Responses (OpenAI-like): the prompt is a chain of segments
(tools[], then each message or input item; Responses: the instructions first, and
``previous_response_id`` replays the stored conversation); every prefix a machine
has served is cached on that machine for 10 minutes after its last use, or 24
hours with ``prompt_cache_retention: "24h"``.  A request that sends both
``prompt_cache_retention`` and ``prompt_cache_options`` is rejected (400), as
OpenAI does.  A request with a ``prompt_cache_key`` goes to the machine its key
hashes to; one without is spread over the machines in turn (what a provider does
under load when it cannot tell two conversations apart), so consecutive turns of
one conversation land on machines that have not seen its prefix.  Usage reports
``prompt_tokens_details.cached_tokens`` (Responses: ``input_tokens_details``).
Models named GPT-5.6 and later (``gpt-5.6``, ``gpt-6-…``) cache as OpenAI documents
for them (``tests/infra/provider_openai.py``): only at breakpoints, from 1,024
tokens, reporting ``cache_write_tokens``, with ``prompt_cache_diagnostics`` on
Responses; their keyless requests all go to the first machine (OpenAI routes them
itself).  ``"stream": true`` streams chat completions (the usage chunk when
``stream_options.include_usage``) and Responses (usage in ``response.completed``).

Messages (Anthropic-like): one cache, written only at ``cache_control``
breakpoints (tools, then system blocks, then message blocks, in order), each
entry living 5 minutes or, with ``"ttl": "1h"``, an hour; a read refreshes it.
More than 4 breakpoints, or a 1-hour one after a 5-minute one, is rejected (400).
A read is the longest live prefix ending at a breakpoint or up to ``LOOKBACK``
blocks before one; what lies past it up to each later breakpoint is written at
that breakpoint's TTL (Anthropic's billing: read up to the hit, 1-hour writes up
to the last 1-hour breakpoint, 5-minute writes up to the last one).  A breakpoint
inside what was read that has no live entry gets none (the conservative reading:
its TTL was not paid for).  Usage reports ``cache_read_input_tokens`` /
``cache_creation_input_tokens`` (split in ``cache_creation`` by TTL) /
``input_tokens``.  A request carrying ``diagnostics: {"previous_message_id": id}``
(with the ``anthropic-beta: cache-diagnosis-2026-04-07`` header, else 400) gets
``diagnostics.cache_miss_reason`` comparing it with that response's request
(``model_changed``, ``system_changed``, ``tools_changed``, ``messages_changed``,
null when it only extends it, ``previous_message_not_found``).

Tokens are bytes / 4 of the compact JSON of each segment.  ``GET /_stats`` sums
what was reported; ``GET /_requests`` returns every request received (path,
headers, raw body: the recorder's shape); ``POST /_reset`` forgets everything
(and sets the clock back to 0).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import itertools
from collections.abc import Callable
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.infra import provider_openai as gpt

LOOKBACK = 20
FIVE_MINUTES = 300.0
ONE_HOUR = 3600.0
IN_MEMORY = 600.0  # OpenAI's default retention before GPT-5.6, as this model has it
DAY = 86400.0
DIAGNOSIS_BETA = "cache-diagnosis-2026-04-07"
Json = Any


class Rejected(Exception):
    """The provider answers 400 with this message."""


class ManualClock:
    """Seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Provider:
    def __init__(self, machines: int = 4, clock: Callable[[], float] | None = None) -> None:
        self.machines = machines
        self.clock = clock or ManualClock()
        self.reset()

    def reset(self) -> None:
        if isinstance(self.clock, ManualClock):
            self.clock.now = 0.0
        self.caches: list[dict[bytes, float]] = [{} for _ in range(self.machines)]  # link -> expiry
        self.anthropic: dict[bytes, tuple[float, float]] = {}  # link -> (expiry, ttl)
        self.turn = itertools.count()
        self.ids = itertools.count(1)
        self.prints: dict[str, dict[str, Any]] = {}
        self.conversations: dict[str, list[bytes]] = {}  # Responses: id -> its segments and output
        self.responses_prints: dict[str, dict[str, Any]] = {}  # Responses: id -> what diagnostics compare
        self.stats = {"requests": 0, "prompt": 0, "cached": 0, "written": 0, "written_1h": 0}

    # -- chat completions and Responses ---------------------------------------------------
    def chat(self, body: Json) -> Json:
        marks, segments = [0], [orjson.dumps(body.get("tools") or [])]
        for m in body.get("messages") or []:
            seg, n = _segment(m)
            segments.append(seg)
            marks.append(n)
        prompt, cached, written = self._openai(body, segments, marks)
        details = {
            "cached_tokens": cached,
            **({"cache_write_tokens": written} if gpt.is_breakpoint_model(body.get("model")) else {}),
        }
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
                "prompt_tokens_details": details,
            },
        }

    def responses(self, body: Json) -> Json:
        items = body.get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items or []
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self.conversations:
            raise Rejected(f"Previous response with id '{previous}' not found.")
        head = [_canon(body.get("instructions")), orjson.dumps(body.get("tools") or [])]
        segments = list(self.conversations.get(previous or "", head))
        marks = [0] * len(segments)
        for i in items:
            seg, n = _segment(i, responses=True)
            segments.append(seg)
            marks.append(n)
        prompt, cached, written = self._openai(body, segments, marks)
        response_id = f"resp_{next(self.ids):04d}"
        item = {
            "type": "message",
            "id": f"msg_{response_id}",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}],
        }
        self.conversations[response_id] = [*segments, _segment(item, responses=True)[0]]
        breakpoints = gpt.is_breakpoint_model(body.get("model"))
        details = {"cached_tokens": cached, **({"cache_write_tokens": written} if breakpoints else {})}
        out: Json = {
            "id": response_id,
            "object": "response",
            "created_at": 0,
            "status": "completed",
            "model": body.get("model", "m"),
            "output": [item],
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": details,
                "output_tokens": 1,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + 1,
            },
        }
        now = gpt.fingerprint(body, [segments[0], *segments[2:]])  # the input, the instructions first
        compare = gpt.options(body).get("comparison_response_id")
        if compare is not None:
            found = self.responses_prints.get(compare)
            tokens = [_tokens(x) for x in segments]
            out["prompt_cache_diagnostics"] = (
                gpt.diagnose(found, now, tokens) if breakpoints else {"type": "unavailable"}
            )
        conversation = self.conversations[response_id]
        self.responses_prints[response_id] = {**now, "input": [conversation[0], *conversation[2:]]}
        return out

    def _openai(self, body: Json, segments: list[bytes], marks: list[int]) -> tuple[int, int, int]:
        """(prompt, cached, written) tokens of an OpenAI-shaped request; its prefixes cached."""
        retention = body.get("prompt_cache_retention")
        if retention is not None and body.get("prompt_cache_options") is not None:
            raise Rejected("prompt_cache_retention and prompt_cache_options cannot be used together")
        try:
            opts = gpt.options(body)
            points = gpt.write_points(marks, opts.get("mode", "implicit"))
        except gpt.Invalid as exc:
            raise Rejected(str(exc)) from None
        if gpt.is_breakpoint_model(body.get("model")):
            return self._breakpoints(body, segments, points, DAY if retention == "24h" else gpt.TTL)
        ttl = DAY if retention == "24h" else IN_MEMORY
        key = body.get("prompt_cache_key")
        if isinstance(key, str):
            machine = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % self.machines
        else:
            machine = next(self.turn) % self.machines
        cache, now = self.caches[machine], self.clock()
        chain, prompt, cached = _chain(segments), 0, 0
        for link, seg in zip(chain, segments, strict=True):
            prompt += _tokens(seg)
            if cache.get(link, -1.0) > now and cached == prompt - _tokens(seg):
                cached = prompt
        for link in chain:
            cache[link] = max(cache.get(link, -1.0), now + ttl)
        self._count(prompt, cached, 0, 0)
        return prompt, cached, 0

    def _breakpoints(self, body: Json, segments: list[bytes], points: list[int], ttl: float) -> tuple[int, int, int]:
        """GPT-5.6 and later: entries only at the request's breakpoints ``points``."""
        key = body.get("prompt_cache_key")
        machine = (
            int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % self.machines
            if isinstance(key, str)
            else 0
        )
        cache, now = self.caches[machine], self.clock()
        chain = _chain(segments)
        sizes = list(itertools.accumulate(_tokens(s) for s in segments))
        hit = max((j for j, link in enumerate(chain) if cache.get(link, -1.0) > now), default=-1)
        cached = sizes[hit] if hit >= 0 else 0
        for j in range(hit + 1):  # what was read is refreshed
            if cache.get(chain[j], -1.0) > now:
                cache[chain[j]] = now + ttl
        created = [p for p in points if sizes[p] >= gpt.MIN_TOKENS and sizes[p] > cached]
        for p in created:
            cache[chain[p]] = now + ttl
        written = max(sizes[p] for p in created) - cached if created else 0
        prompt = sizes[-1] if sizes else 0
        self._count(prompt, cached, written, 0)
        return prompt, cached, written

    # -- messages ---------------------------------------------------------------------
    def messages(self, body: Json, headers: dict[str, str] | None = None) -> Json:
        blocks: list[tuple[bytes, float | None]] = []  # (canonical block, its breakpoint's TTL)
        for tool in body.get("tools") or []:
            blocks.append(_block(tool))
        system = body.get("system")
        for part in [{"type": "text", "text": system}] if isinstance(system, str) else system or []:
            blocks.append(_block(part))
        for msg in body.get("messages") or []:
            content = msg.get("content")
            parts = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
            for i, part in enumerate(parts):
                raw, ttl = _block(part)
                blocks.append((msg["role"].encode() + str(i).encode() + raw, ttl))
        marks = [(i, ttl) for i, (_, ttl) in enumerate(blocks) if ttl is not None]
        if len(marks) > 4:
            raise Rejected(f"A maximum of 4 blocks with cache_control may be provided. Found {len(marks)}.")
        for (_, before), (_, after) in itertools.pairwise(marks):
            if after > before:
                raise Rejected("a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block")
        diag = body.get("diagnostics")
        betas = {b.strip() for b in (headers or {}).get("anthropic-beta", "").split(",")}
        if diag is not None and DIAGNOSIS_BETA not in betas:
            raise Rejected(f"diagnostics: requires the anthropic-beta header {DIAGNOSIS_BETA}")
        now = self.clock()
        chain = _chain([b for b, _ in blocks])
        sizes = list(itertools.accumulate(_tokens(b) for b, _ in blocks))

        def live(j: int) -> bool:
            entry = self.anthropic.get(chain[j])
            return entry is not None and entry[0] > now

        read, hit = 0, -1
        for m, _ in marks:
            for j in range(m, max(m - LOOKBACK, -1), -1):
                if live(j):
                    if sizes[j] > read:
                        read, hit = sizes[j], j
                    break
        for j in range(hit + 1):  # what was read is refreshed, each entry at its own TTL
            if live(j):
                ttl = self.anthropic[chain[j]][1]
                self.anthropic[chain[j]] = (now + ttl, ttl)
        written = {FIVE_MINUTES: 0, ONE_HOUR: 0}
        covered = read
        for m, ttl in marks:
            if sizes[m] > covered:
                self.anthropic[chain[m]] = (now + ttl, ttl)
                written[ttl] += sizes[m] - covered
                covered = sizes[m]
        prompt = sizes[-1] if sizes else 0
        write = written[FIVE_MINUTES] + written[ONE_HOUR]
        self._count(prompt, read, write, written[ONE_HOUR])
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
                "input_tokens": prompt - read - write,
                "cache_read_input_tokens": read,
                "cache_creation_input_tokens": write,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": written[FIVE_MINUTES],
                    "ephemeral_1h_input_tokens": written[ONE_HOUR],
                },
                "output_tokens": 1,
            },
        }
        fp = self.prints[msg_id] = _fingerprint(body)  # any later request may name this one
        if isinstance(diag, dict):
            out["diagnostics"] = {
                "cache_miss_reason": _miss(self.prints.get(diag.get("previous_message_id") or ""), fp)
            }
        return out

    def _count(self, prompt: int, cached: int, written: int, written_1h: int) -> None:
        s = self.stats
        s["requests"] += 1
        s["prompt"] += prompt
        s["cached"] += cached
        s["written"] += written
        s["written_1h"] += written_1h


def _canon(value: Json) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _segment(item: Json, *, responses: bool = False) -> tuple[bytes, int]:
    try:
        return gpt.segment(item, responses=responses)
    except gpt.Invalid as exc:
        raise Rejected(str(exc)) from None


def _block(part: Json) -> tuple[bytes, float | None]:
    """A block without its ``cache_control``, and the TTL of the breakpoint it carried (None: none)."""
    if not isinstance(part, dict):
        return _canon(part), None
    mark = part.get("cache_control")
    ttl = None if mark is None else ONE_HOUR if isinstance(mark, dict) and mark.get("ttl") == "1h" else FIVE_MINUTES
    return _canon({k: v for k, v in part.items() if k != "cache_control"}), ttl


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


def create_app(machines: int = 4, provider: Provider | None = None) -> Starlette:
    provider = provider or Provider(machines)
    received: list[dict[str, Any]] = []

    async def answer(request: Request, fn: Callable[[Json], Json]) -> Response:
        raw = await request.body()
        received.append(
            {
                "method": request.method,
                "path": request.url.path,
                "query": request.url.query,
                "headers": dict(request.headers.items()),
                "body_b64": base64.b64encode(raw).decode(),
            }
        )
        try:
            body = orjson.loads(raw)
            out = fn(body)
            if isinstance(body, dict) and body.get("stream") is True and request.url.path != "/v1/messages":
                if request.url.path.endswith("/responses"):
                    return Response(gpt.responses_stream(out), media_type="text/event-stream")
                include = (body.get("stream_options") or {}).get("include_usage") is True
                return Response(gpt.chat_stream(out, include_usage=include), media_type="text/event-stream")
            return JSONResponse(out)
        except Rejected as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error"}}, status_code=400)

    async def chat(request: Request) -> Response:
        return await answer(request, provider.chat)

    async def responses(request: Request) -> Response:
        return await answer(request, provider.responses)

    async def messages(request: Request) -> Response:
        return await answer(request, lambda body: provider.messages(body, dict(request.headers.items())))

    async def stats(request: Request) -> Response:
        return JSONResponse(provider.stats)

    async def requests_(request: Request) -> Response:
        return JSONResponse(received)

    async def clock(request: Request) -> Response:
        told = await request.json()
        manual = provider.clock
        if not isinstance(manual, ManualClock):
            return JSONResponse({"error": "this provider's clock is not a manual one"}, status_code=409)
        manual.now = float(told["now"]) if "now" in told else manual.now + float(told.get("advance", 0))
        return JSONResponse({"now": manual.now})

    async def reset(request: Request) -> Response:
        provider.reset()
        received.clear()
        return JSONResponse({})

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/_stats", stats),
            Route("/_requests", requests_),
            Route("/_clock", clock, methods=["POST"]),
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
