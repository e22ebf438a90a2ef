"""OpenAI Responses API: ``POST /v1/responses`` (also ``/responses``).  Codex CLI
sends only this.

- System text is ``instructions`` (a string) and the *leading* input items of role
  ``system``/``developer`` (their ``content`` string or ``input_text`` parts).  A
  developer item after the first history item (Codex appends a
  ``<current_date>`` block on a day change) is history: it is hashed, never
  rewritten, so an append-only history stays append-only.
- tools[] are the top-level ``tools`` (``{"type": "function", "name", "parameters"}``,
  ``custom``, ``namespace`` …) or, when there is none, the ``tools`` of an
  ``additional_tools`` input item (``{"type": "additional_tools", "role":
  "developer", "tools": [...]}``, the shape "responses lite" Codex builds send as
  ``input[0]``; assumption from public client code, no capture of ours).
- History is every other input item: messages, ``function_call(_output)``,
  ``custom_tool_call(_output)``, reasoning items.  A string ``input`` is one user
  message.

``canonical_message`` hashes what a replay keeps: item ``id`` and ``status`` are
left out (a client replaying output items may drop or regenerate them; Codex with
``store: false`` sends none), a message's text parts hash as their joined text
(``input_text`` / ``output_text`` / a plain string are the same words), call
arguments are normalised like chat's.  ``call_id`` is kept: it ties an output to
its call.  Forwarded bytes never change because of it.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from canonicalize.edits import AddMember, DeleteMember, Op, SetItems, SetMember
from canonicalize.jsonspan import JsonDoc, Path
from canonicalize.wire.base import Reply, Slot, arguments_form, canonical_json, description_slots
from canonicalize.wire.reply_responses import ResponsesReply

SYSTEM_ROLES = frozenset({"system", "developer"})
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
TOOLS_ITEM = "additional_tools"
VOLATILE = frozenset({"id", "status"})
_PATH = re.compile(r"(?:/v1)?/responses/?")

# Built-in tools the client itself runs, which have no name: each is named by its type
# (canonicalize.wire.reply_responses judges their calls by the same names).
_CLIENT_BUILT_INS = frozenset({"local_shell", "shell", "apply_patch", "computer", "computer_use_preview"})


def _input(body: dict[str, Any]) -> list[Any]:
    items = body.get("input")
    return items if isinstance(items, list) else []


def _is_system(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and item.get("type", "message") == "message"
        and isinstance(item.get("role"), str)
        and item["role"] in SYSTEM_ROLES
    )


def _is_tools(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == TOOLS_ITEM


def _lead(body: dict[str, Any]) -> int:
    """How many input items come before the first history item (system items and
    an ``additional_tools`` item)."""
    n = 0
    for item in _input(body):
        if not (_is_system(item) or _is_tools(item)):
            break
        n += 1
    return n


def _text_slots(item: dict[str, Any], path: Path, out: list[Slot]) -> None:
    content = item.get("content")
    if isinstance(content, str):
        out.append(Slot(item, "content", (*path, "content")))
    elif isinstance(content, list):
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str):
                out.append(Slot(part, "text", (*path, "content", j, "text")))


def _flat(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, list):
        if all(isinstance(p, dict) and p.get("type") in TEXT_PARTS for p in content):
            return "".join(str(p.get("text", "")) for p in content)
        return [{k: v for k, v in p.items() if k not in VOLATILE} if isinstance(p, dict) else p for p in content]
    return content


class ResponsesExchange:
    name = "responses"
    items_key = "input"
    schema_key = "parameters"
    cache_key_member: str | None = "prompt_cache_key"  # Codex sets its own (its thread id): kept

    def matches(self, path: str) -> bool:
        return _PATH.fullmatch(path) is not None

    # -- system -----------------------------------------------------------------------
    def system_slots(self, body: dict[str, Any]) -> list[Slot]:
        out: list[Slot] = []
        if isinstance(body.get("instructions"), str):
            out.append(Slot(body, "instructions", ("instructions",)))
        items = _input(body)
        for i in range(_lead(body)):
            if _is_system(items[i]):
                _text_slots(items[i], ("input", i), out)
        return out

    def system_value(self, body: dict[str, Any]) -> Any:
        """``instructions`` and the leading system (and tools) items: what a fork gets."""
        return {"instructions": body.get("instructions"), "items": _input(body)[: _lead(body)]}

    def system_blob(self, doc: JsonDoc, body: dict[str, Any]) -> bytes:
        instructions = b"null"
        if "instructions" in body:
            span = doc.span(("instructions",))
            if span is None:
                raise KeyError(("instructions",))
            instructions = doc.raw[span[0] : span[1]]
        parts = []
        for i in range(_lead(body)):
            span = doc.span(("input", i))
            if span is None:
                raise KeyError(("input", i))
            parts.append(doc.raw[span[0] : span[1]])
        return b'{"instructions":' + instructions + b',"items":[' + b",".join(parts) + b"]}"

    def set_system(self, body: dict[str, Any], blob: bytes) -> list[Op]:
        doc = JsonDoc(blob)
        value = orjson.loads(blob)
        ops: list[Op] = []
        span = doc.span(("instructions",))
        assert span is not None
        raw = blob[span[0] : span[1]]
        if value["instructions"] is None:
            if "instructions" in body:
                del body["instructions"]
                ops.append(DeleteMember((), "instructions"))
        else:
            had = "instructions" in body
            body["instructions"] = value["instructions"]
            ops.append(SetMember((), "instructions", raw) if had else AddMember("instructions", raw))
        spans = doc.items(("items",)) or []
        n = _lead(body)
        if isinstance(body.get("input"), list) and (n or spans):
            body["input"] = list(value["items"]) + _input(body)[n:]
            ops.append(SetItems(("input",), 0, n, tuple(blob[s:e] for s, e in spans)))
        return ops

    # -- tools ------------------------------------------------------------------------
    def tools_path(self, body: dict[str, Any]) -> Path:
        if "tools" in body:
            return ("tools",)
        items = _input(body)
        for i in range(_lead(body)):
            if _is_tools(items[i]) and isinstance(items[i].get("tools"), list):
                return ("input", i, "tools")
        return ("tools",)

    def tools(self, body: dict[str, Any]) -> list[Any] | None:
        if "tools" in body:
            tools = body["tools"]
            return tools if isinstance(tools, list) else None
        items = _input(body)
        for i in range(_lead(body)):
            if _is_tools(items[i]) and isinstance(items[i].get("tools"), list):
                tools = items[i]["tools"]
                return tools if isinstance(tools, list) else None
        return None

    def tool_name(self, tool: Any) -> str | None:
        if isinstance(tool, dict):
            if isinstance(tool.get("name"), str):
                return str(tool["name"])
            fn = tool.get("function")  # chat-style tools some clients send here too
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                return str(fn["name"])
            if tool.get("type") in _CLIENT_BUILT_INS:  # named by its type (the fork guard judges its calls so)
                return str(tool["type"])
        return None

    def tool_slots(self, body: dict[str, Any]) -> list[Slot]:
        out: list[Slot] = []
        path = self.tools_path(body)
        for i, tool in enumerate(self.tools(body) or ()):
            description_slots(tool, (*path, i), out)
        return out

    # -- history ----------------------------------------------------------------------
    def split(self, body: dict[str, Any]) -> tuple[list[Slot], list[Any]]:
        return self.system_slots(body), self.history(body)

    def history(self, body: dict[str, Any]) -> list[Any]:
        items = body.get("input")
        if isinstance(items, str):
            return [{"role": "user", "content": items}]
        return _input(body)[_lead(body) :]

    def message_slots(self, body: dict[str, Any]) -> list[Slot]:
        out: list[Slot] = []
        items = _input(body)
        for i in range(_lead(body), len(items)):
            item = items[i]
            if isinstance(item, dict) and item.get("type", "message") == "message":
                _text_slots(item, ("input", i), out)
        return out

    def note_slot(self, body: dict[str, Any], index: int) -> Slot | None:
        if isinstance(body.get("input"), str):
            return Slot(body, "input", ("input",)) if index == 0 else None
        i = _lead(body) + index
        items = _input(body)
        if not (index >= 0 and i < len(items) and self.is_user(items[i])):
            return None
        found: list[Slot] = []
        _text_slots(items[i], ("input", i), found)
        return found[-1] if found else None

    def canonical_message(self, msg: Any) -> bytes:
        if not isinstance(msg, dict):
            return canonical_json(msg)
        kind = msg.get("type", "message")
        if kind == "message":
            return canonical_json({"r": msg.get("role"), "c": _flat(msg.get("content"))})
        if kind in ("function_call", "custom_tool_call"):
            args = msg.get("arguments") if kind == "function_call" else msg.get("input")
            return canonical_json({"t": kind, "c": msg.get("call_id"), "n": msg.get("name"), "a": arguments_form(args)})
        if kind in ("function_call_output", "custom_tool_call_output"):
            return canonical_json({"t": kind, "c": msg.get("call_id"), "o": _flat(msg.get("output"))})
        return canonical_json({k: v for k, v in msg.items() if k not in VOLATILE})

    def is_assistant(self, msg: Any) -> bool:
        """Model output: an assistant message, a call, a reasoning item."""
        if not isinstance(msg, dict):
            return False
        kind = msg.get("type", "message")
        if kind == "message":
            return msg.get("role") == "assistant"
        return kind in ("function_call", "custom_tool_call", "reasoning")

    def is_user(self, msg: Any) -> bool:
        return isinstance(msg, dict) and msg.get("type", "message") == "message" and msg.get("role") == "user"

    def last_user_text(self, body: dict[str, Any]) -> str:
        for msg in reversed(self.history(body)):
            if self.is_user(msg):
                flat = _flat(msg.get("content"))
                return flat if isinstance(flat, str) else ""
        return ""

    def replayed(self, message: dict[str, Any]) -> list[Any]:
        """The history items the next turn replays for a reply: its output items."""
        output = message.get("output")
        return list(output) if isinstance(output, list) else []

    # -- streaming, replies, errors ---------------------------------------------------
    def stream_usage(self, body: dict[str, Any]) -> list[Op]:
        return []  # response.completed always carries usage

    def reply(self, *, offered: frozenset[str] | None, drop_usage_chunk: bool) -> Reply:
        return ResponsesReply(offered=offered)

    def error_body(self, message: str, type_: str, code: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": type_, "param": None, "code": code}}


RESPONSES = ResponsesExchange()
