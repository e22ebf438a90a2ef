"""What the scripted provider (``tests/infra/provider.py``) does as OpenAI's GPT-5.6
and later: explicit prompt-cache breakpoints, cache writes, diagnostics, and the
streamed shapes of chat completions and Responses.  Not a model of OpenAI's
internals: the documented behaviour, strictly, so a test sees what prefixpin got
wrong.

- A prompt is a chain of segments (tools[], then each message or input item;
  Responses: the instructions first).  A segment is compared as rendered: without
  its ``prompt_cache_breakpoint`` markers, a string content the same as one text
  part.
- Entries are written only at breakpoints: the explicit ones (a content part with
  ``"prompt_cache_breakpoint": {"mode": "explicit"}``; the latest 3, or 4 with
  ``prompt_cache_options.mode: explicit``) and, unless that mode is ``explicit``,
  the one implicit breakpoint at the newest segment; never below
  :data:`MIN_TOKENS`.  A read is the longest prefix with a live entry; what lies
  past it up to the furthest breakpoint written is ``cache_write_tokens``.  An
  entry lives :data:`TTL` (``prompt_cache_retention: "24h"``: a day).
- Rejected (400): a breakpoint that is not ``{"mode": "explicit"}``, one on an
  assistant part, more than 4 in a request, a ``ttl`` other than ``"30m"``.
- Responses' ``prompt_cache_options.comparison_response_id`` gets
  ``prompt_cache_diagnostics``: ``cache_hit``, ``cache_miss`` with a ``reason``
  (``model_changed``, ``prompt_cache_key_changed``, ``tools_changed``,
  ``text_format_changed``, ``reasoning_effort_changed``, ``input_changed``),
  ``comparison_response_not_found``; ``unavailable`` on an earlier model.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

Json = Any
MEMBER = "prompt_cache_breakpoint"
MIN_TOKENS = 1024
TTL = 1800.0  # prompt_cache_options.ttl "30m", its default and only value
MAX_BREAKPOINTS = 4
_MODEL = re.compile(r"(?:.*/)?gpt-(?:5\.(?:[6-9]|\d\d)|[6-9])(?:[.-].*)?")
_TEXT = {"text", "input_text", "output_text"}


class Invalid(ValueError):
    """The request is rejected with this message."""


def is_breakpoint_model(model: Any) -> bool:
    """GPT-5.6 and later: entries only at breakpoints, cache writes, diagnostics."""
    return isinstance(model, str) and _MODEL.fullmatch(model) is not None


def _canon(value: Json) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _parts(value: Json, kind: str) -> Json:
    """A string as the one text part it renders as; parts without their markers."""
    if isinstance(value, str):
        return [{"type": kind, "text": value}]
    if isinstance(value, list):
        return [{k: v for k, v in p.items() if k != MEMBER} if isinstance(p, dict) else p for p in value]
    return value


def _marks(value: Json) -> int:
    return sum(1 for p in value if isinstance(p, dict) and MEMBER in p) if isinstance(value, list) else 0


def segment(item: Json, *, responses: bool = False) -> tuple[bytes, int]:
    """One message / input item as compared (rendered), and how many breakpoints it carries."""
    if not isinstance(item, dict):
        return _canon(item), 0
    out, marks = dict(item), 0
    assistant = item.get("role") == "assistant"
    for key in ("content", "output"):
        if key in item and (
            key == "content" or item.get("type") in ("function_call_output", "custom_tool_call_output")
        ):
            kind = ("output_text" if assistant else "input_text") if responses else "text"
            n = _marks(item[key])
            if n and assistant:
                raise Invalid(f"{MEMBER} is supported on input content parts only, not on an assistant message")
            for part in item[key] if isinstance(item[key], list) else ():
                if isinstance(part, dict) and MEMBER in part and part[MEMBER] != {"mode": "explicit"}:
                    raise Invalid(f'{MEMBER} must be {{"mode": "explicit"}} (got {part[MEMBER]!r})')
            out[key], marks = _parts(item[key], kind), marks + n
    if responses:
        out.pop("id", None)
        out.pop("status", None)
        out.setdefault("type", "message")
    return _canon(out), marks


def options(body: Json) -> dict[str, Any]:
    """``prompt_cache_options``, checked."""
    opts = body.get("prompt_cache_options")
    if opts is None:
        return {}
    if not isinstance(opts, dict):
        raise Invalid("prompt_cache_options must be an object")
    if "ttl" in opts and opts["ttl"] != "30m":
        raise Invalid(f"prompt_cache_options.ttl: '30m' is the only supported value (got {opts['ttl']!r})")
    if opts.get("mode", "implicit") not in ("implicit", "explicit"):
        raise Invalid(f"prompt_cache_options.mode: must be implicit or explicit (got {opts.get('mode')!r})")
    return opts


def write_points(marks: list[int], mode: str) -> list[int]:
    """The segment indexes a request writes at: its latest explicit breakpoints and the implicit one."""
    explicit = [i for i, n in enumerate(marks) for _ in range(n)]
    if len(explicit) > MAX_BREAKPOINTS:
        raise Invalid(f"A maximum of {MAX_BREAKPOINTS} prompt_cache_breakpoint may be provided. Found {len(explicit)}.")
    if mode == "explicit":
        return sorted(set(explicit[-MAX_BREAKPOINTS:]))
    return sorted({*explicit[-(MAX_BREAKPOINTS - 1) :], len(marks) - 1} if marks else set())


def fingerprint(body: Json, conversation: list[bytes]) -> dict[str, Any]:
    """What a later request's diagnostics compare with."""
    return {
        "model": body.get("model"),
        "key": body.get("prompt_cache_key"),
        "tools": _canon(body.get("tools") or []),
        "format": _canon((body.get("text") or {}).get("format")),
        "effort": _canon((body.get("reasoning") or {}).get("effort")),
        "input": conversation,
    }


def diagnose(previous: dict[str, Any] | None, current: dict[str, Any], tokens: list[int]) -> Json:
    """``prompt_cache_diagnostics`` of ``current`` against ``previous`` (None: not found)."""
    if previous is None:
        return {"type": "comparison_response_not_found"}
    for field, reason in (
        ("model", "model_changed"),
        ("key", "prompt_cache_key_changed"),
        ("tools", "tools_changed"),
        ("format", "text_format_changed"),
        ("effort", "reasoning_effort_changed"),
    ):
        if previous[field] != current[field]:
            return {"type": "cache_miss", "reason": reason, "cache_missed_tokens": sum(tokens)}
    prev, cur = previous["input"], current["input"]
    if cur[: len(prev)] == prev:
        return {"type": "cache_hit"}
    shared = next((i for i, (a, b) in enumerate(zip(prev, cur, strict=False)) if a != b), min(len(prev), len(cur)))
    reusable = sum(max(1, len(s) // 4) for s in prev)
    missed = reusable - sum(max(1, len(s) // 4) for s in prev[:shared])
    return {
        "type": "cache_miss",
        "reason": "input_changed",
        "comparison_reusable_tokens": reusable,
        "cache_missed_tokens": missed,
    }


def _sse(obj: Json, event: str | None = None) -> bytes:
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def chat_stream(done: Json, *, include_usage: bool) -> bytes:
    """A chat completion as OpenAI streams it (the usage chunk only when asked for)."""
    base = {k: done[k] for k in ("id", "object", "created", "model")} | {"object": "chat.completion.chunk"}
    text = done["choices"][0]["message"]["content"]
    nulls = {"usage": None} if include_usage else {}
    out = _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}], **nulls})
    out += _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], **nulls})
    if include_usage:
        out += _sse({**base, "choices": [], "usage": done["usage"]})
    return out + b"data: [DONE]\n\n"


def responses_stream(done: Json) -> bytes:
    """A Responses response as OpenAI streams it: usage and diagnostics in ``response.completed``."""
    started = {**done, "status": "in_progress", "output": [], "usage": None}
    started.pop("prompt_cache_diagnostics", None)
    item = done["output"][0]
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": started}),
        ("response.output_item.added", {"output_index": 0, "item": {**item, "status": "in_progress", "content": []}}),
        ("response.output_text.delta", {"item_id": item["id"], "output_index": 0, "content_index": 0, "delta": "ok"}),
        ("response.output_item.done", {"output_index": 0, "item": item}),
        ("response.completed", {"response": done}),
    ]
    return b"".join(_sse({"type": kind, "sequence_number": n, **data}, kind) for n, (kind, data) in enumerate(events))
