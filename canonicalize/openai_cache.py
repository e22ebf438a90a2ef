"""OpenAI's explicit prompt-cache controls, as byte-preserving edits.

GPT-5.6 and later match a cached prefix only where a breakpoint was written: the
one implicit breakpoint OpenAI places at the newest message, and the explicit
ones a request marks with ``"prompt_cache_breakpoint": {"mode": "explicit"}`` on
an input content part (chat: a ``text`` part; Responses: an ``input_text`` part).
An agent that marks nothing shares nothing between two sessions, or with a fork,
beyond what its newest message's breakpoint covers.

- :func:`chat_breakpoints` / :func:`responses_breakpoints`
  (``provider_cache.openai_breakpoints: auto``): the end of the stable part, on a
  request that carries no ``prompt_cache_breakpoint`` of its own:

  1. the last text part of the system / developer content (the leading run of
     ``system`` / ``developer`` messages; Responses' ``instructions`` cannot carry
     one);
  2. the last text part of the newest user or tool message before the last user
     message (a tool result: chat's ``tool`` message, Responses'
     ``function_call_output`` / ``custom_tool_call_output`` ``output``).

  A string content becomes one text part carrying the breakpoint (its string bytes
  as sent); nothing else changes.  Never on an assistant part (OpenAI accepts
  breakpoints on input parts only), never more than :data:`MAX_BREAKPOINTS`.
  Combine with the edits already decided with :func:`canonicalize.provider.place`
  (``member=MEMBER``).
- :func:`comparison`: ``prompt_cache_options.comparison_response_id`` naming the
  lineage's previous response (``provider_cache.diagnostics: auto`` on Responses):
  OpenAI answers with ``prompt_cache_diagnostics`` (:mod:`canonicalize.verdicts`).

No ``prompt_cache_options`` member is ever added next to ``prompt_cache_retention``
(OpenAI rejects a request that sets its ``ttl`` and the retention together; the
scripted provider of the tests rejects any two).

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

import orjson

from canonicalize.edits import AddMember, Op, SetMember, SetValue
from canonicalize.jsonspan import JsonDoc, Path

MEMBER = "prompt_cache_breakpoint"
EXPLICIT = b'{"mode":"explicit"}'
MAX_BREAKPOINTS = 4  # what one request may write
OPTIONS = "prompt_cache_options"
RETENTION = "prompt_cache_retention"
COMPARISON = "comparison_response_id"
_SYSTEM = frozenset({"system", "developer"})
_TOOL_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})


def _part(doc: JsonDoc, path: Path, text: str, kind: bytes) -> bytes:
    """``[{"type":<kind>,"text":<the string as written>,"prompt_cache_breakpoint":...}]``."""
    span = doc.span(path)
    raw = doc.raw[span[0] : span[1]] if span is not None else b""
    if not raw or orjson.loads(raw) != text:  # a rule or a repair changed it: its new value
        raw = orjson.dumps(text)
    return b'[{"type":"' + kind + b'","text":' + raw + b',"' + MEMBER.encode() + b'":' + EXPLICIT + b"}]"


def _mark(doc: JsonDoc, path: Path, value: Any, kind: str) -> Op | None:
    """The breakpoint on the text at ``path``: a non-empty string made one ``kind``
    part, or the last non-empty ``kind`` part of a list."""
    if isinstance(value, str):
        return SetValue(path, _part(doc, path, value, kind.encode())) if value else None
    if isinstance(value, list):
        for j in range(len(value) - 1, -1, -1):
            part = value[j]
            text = part.get("text") if isinstance(part, dict) and part.get("type") == kind else None
            if isinstance(text, str) and text:
                return SetMember((*path, j), MEMBER, EXPLICIT)
    return None


def _last_user(items: list[Any], start: int, is_user: Any) -> int | None:
    return max((i for i in range(start, len(items)) if is_user(items[i])), default=None)


def _distinct(ops: list[Op | None]) -> list[Op]:
    out: list[Op] = []
    for op in ops:
        if op is not None and op not in out:
            out.append(op)
    return out[:MAX_BREAKPOINTS]


def chat_breakpoints(doc: JsonDoc, body: dict[str, Any]) -> list[Op]:
    """The breakpoints of a chat-completions request (module docstring); ``body`` is
    the parse of ``doc`` as it will be forwarded (rules and repairs applied)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    out: list[Op | None] = []
    lead = 0
    while lead < len(messages) and isinstance(messages[lead], dict) and messages[lead].get("role") in _SYSTEM:
        lead += 1
    if lead:
        out.append(_mark(doc, ("messages", lead - 1, "content"), messages[lead - 1].get("content"), "text"))
    last = _last_user(messages, lead, lambda m: isinstance(m, dict) and m.get("role") == "user")
    for i in range(last - 1 if last is not None else -1, lead - 1, -1):
        msg = messages[i]
        if isinstance(msg, dict) and msg.get("role") in ("user", "tool"):
            out.append(_mark(doc, ("messages", i, "content"), msg.get("content"), "text"))
            break
    return _distinct(out)


def _is_message(item: Any, roles: frozenset[str]) -> bool:
    return isinstance(item, dict) and item.get("type", "message") == "message" and item.get("role") in roles


def _is_tools(item: Any) -> bool:
    """An ``additional_tools`` input item: part of the leading system run, never marked."""
    return isinstance(item, dict) and item.get("type") == "additional_tools"


def responses_breakpoints(doc: JsonDoc, body: dict[str, Any]) -> list[Op]:
    """The breakpoints of a Responses request (module docstring)."""
    items = body.get("input")
    if not isinstance(items, list):
        return []  # a string input is one user message: nothing before it to mark
    out: list[Op | None] = []
    lead, system = 0, None
    while lead < len(items) and (_is_message(items[lead], _SYSTEM) or _is_tools(items[lead])):
        if _is_message(items[lead], _SYSTEM):
            system = lead
        lead += 1
    if system is not None:
        out.append(_mark(doc, ("input", system, "content"), items[system].get("content"), "input_text"))
    user = frozenset({"user"})
    last = _last_user(items, lead, lambda item: _is_message(item, user))
    for i in range(last - 1 if last is not None else -1, lead - 1, -1):
        item = items[i]
        if _is_message(item, user):
            out.append(_mark(doc, ("input", i, "content"), item.get("content"), "input_text"))
            break
        if isinstance(item, dict) and item.get("type") in _TOOL_OUTPUTS:
            out.append(_mark(doc, ("input", i, "output"), item.get("output"), "input_text"))
            break
    return _distinct(out)


def comparison(body: dict[str, Any], previous_response_id: str, *, retention_added: bool = False) -> Op | None:
    """``prompt_cache_options.comparison_response_id`` naming ``previous_response_id``,
    when the client set none: a member of its ``prompt_cache_options``, or that
    object added, unless the request carries ``prompt_cache_retention`` (the client's,
    or prefixpin's: ``retention_added``).  None: nothing to add."""
    value = orjson.dumps(previous_response_id)
    if OPTIONS not in body:
        if RETENTION in body or retention_added:
            return None
        return AddMember(OPTIONS, b'{"' + COMPARISON.encode() + b'":' + value + b"}")
    options = body[OPTIONS]
    if isinstance(options, dict) and COMPARISON not in options:
        return SetMember((OPTIONS,), COMPARISON, value)
    return None  # the client's own comparison, or options that are not an object: kept


__all__ = [
    "COMPARISON",
    "EXPLICIT",
    "MAX_BREAKPOINTS",
    "MEMBER",
    "OPTIONS",
    "RETENTION",
    "chat_breakpoints",
    "comparison",
    "responses_breakpoints",
]
