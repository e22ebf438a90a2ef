"""Where things live in a request, for each wire dialect.

Two dialects share one pipeline: OpenAI chat completions (system/developer
messages, ``tools[].function.parameters``) and Anthropic messages (top-level
``system``, ``tools[].input_schema``).  A *slot* is a ``(container, key)`` pair
whose value is a ``str`` that rules may rewrite in place.

``canonical_message`` is the normalised form of one message used only for
hashing: representations that mean the same (``content`` null / "" / missing, a
string vs a list of one text part, tool-call ``arguments`` whitespace and key
order, ``cache_control`` markers) hash the same.  Forwarded bytes never change
because of it.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import orjson

Slot = tuple[Any, Any]
Json = Any
DialectName = Literal["openai", "anthropic"]

SYSTEM_ROLES = frozenset({"system", "developer"})


def _text_slots(container: Any, key: Any, out: list[Slot]) -> None:
    value = container[key]
    if isinstance(value, str):
        out.append((container, key))
    elif isinstance(value, list):
        for part in value:
            if isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                out.append((part, "text"))


def _description_slots(node: Any, out: list[Slot]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                out.append((node, key))
            elif isinstance(value, dict | list):
                _description_slots(value, out)
    elif isinstance(node, list):
        for item in node:
            _description_slots(item, out)


def canonical_json(value: Json) -> bytes:
    """Compact JSON with sorted keys: the hashing form of structured values."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _normalize_args(arguments: str) -> orjson.Fragment:
    try:
        return orjson.Fragment(canonical_json(orjson.loads(arguments)))
    except orjson.JSONDecodeError:
        return orjson.Fragment(orjson.dumps(arguments))


# Tool-call arguments replay unchanged turn after turn: normalise each short one
# once (bounded: at most 8192 entries of at most 4 KB each).
_cached_args = functools.lru_cache(maxsize=8192)(_normalize_args)


def _args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        return _cached_args(arguments) if len(arguments) <= 4096 else _normalize_args(arguments)
    return arguments


def _flat_content(content: Any) -> Any:
    """``None``/"" -> "", one or more text parts -> their text, else parts sans cache_control."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        if all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            return "".join(str(p.get("text", "")) for p in content)
        return [
            {k: v for k, v in p.items() if k != "cache_control"} if isinstance(p, dict) else p
            for p in content
        ]
    return content


class Dialect:
    """Accessors for one wire format.  Stateless; use the module-level instances."""

    name: DialectName = "openai"
    schema_key = "parameters"

    # -- system -------------------------------------------------------------
    def system_slots(self, body: dict[str, Any]) -> list[Slot]:
        out: list[Slot] = []
        for msg in body.get("messages") or ():
            if isinstance(msg, dict) and msg.get("role") in SYSTEM_ROLES and "content" in msg:
                _text_slots(msg, "content", out)
        return out

    def system_value(self, body: dict[str, Any]) -> Json:
        """The leading system block, as forwarded (a fork gets its parent's)."""
        lead = []
        for msg in body.get("messages") or ():
            if not (isinstance(msg, dict) and msg.get("role") in SYSTEM_ROLES):
                break
            lead.append(msg)
        return lead

    def set_system_value(self, body: dict[str, Any], value: Json) -> None:
        messages = list(body.get("messages") or ())
        n = len(self.system_value(body))
        body["messages"] = list(value or ()) + messages[n:]

    # -- tools --------------------------------------------------------------
    def tools(self, body: dict[str, Any]) -> list[Any] | None:
        tools = body.get("tools")
        return tools if isinstance(tools, list) else None

    def tool_name(self, tool: Any) -> str | None:
        if isinstance(tool, dict):
            fn = tool.get("function")
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                return str(fn["name"])
            if isinstance(tool.get("name"), str):
                return str(tool["name"])
        return None

    def tool_schema(self, tool: Any) -> tuple[Any, str] | None:
        """The (container, key) of a tool's JSON schema, if it has one."""
        if isinstance(tool, dict):
            fn = tool.get("function")
            if isinstance(fn, dict) and isinstance(fn.get("parameters"), dict):
                return fn, "parameters"
        return None

    def tool_slots(self, body: dict[str, Any]) -> list[Slot]:
        out: list[Slot] = []
        for tool in self.tools(body) or ():
            if isinstance(tool, dict):
                fn = tool.get("function")
                _description_slots(fn if isinstance(fn, dict) else tool, out)
        return out

    # -- history ------------------------------------------------------------
    def history(self, body: dict[str, Any]) -> list[Any]:
        return [m for m in body.get("messages") or () if not (isinstance(m, dict) and m.get("role") in SYSTEM_ROLES)]

    def message_slots(self, body: dict[str, Any]) -> list[Slot]:
        out: list[Slot] = []
        for msg in self.history(body):
            if isinstance(msg, dict) and "content" in msg:
                _text_slots(msg, "content", out)
        return out

    def canonical_message(self, msg: Any) -> bytes:
        if not isinstance(msg, dict):
            return canonical_json(msg)
        out: dict[str, Any] = {"r": msg.get("role"), "c": _flat_content(msg.get("content"))}
        calls = msg.get("tool_calls")
        if calls:
            out["t"] = [
                [(c.get("function") or {}).get("name"), _args((c.get("function") or {}).get("arguments"))]
                if isinstance(c, dict)
                else c
                for c in calls
            ]
        if msg.get("name"):
            out["n"] = msg["name"]
        return canonical_json(out)

    def is_assistant(self, msg: Any) -> bool:
        return isinstance(msg, dict) and msg.get("role") == "assistant"

    def last_user_text(self, body: dict[str, Any]) -> str:
        for msg in reversed(self.history(body)):
            if isinstance(msg, dict) and msg.get("role") == "user":
                flat = _flat_content(msg.get("content"))
                return flat if isinstance(flat, str) else ""
        return ""


class AnthropicDialect(Dialect):
    name: DialectName = "anthropic"
    schema_key = "input_schema"

    def system_slots(self, body: dict[str, Any]) -> list[Slot]:
        out: list[Slot] = []
        if "system" in body:
            _text_slots(body, "system", out)
        return out

    def system_value(self, body: dict[str, Any]) -> Json:
        return body.get("system")

    def set_system_value(self, body: dict[str, Any], value: Json) -> None:
        if value is None:
            body.pop("system", None)
        else:
            body["system"] = value

    def tool_name(self, tool: Any) -> str | None:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            return str(tool["name"])
        return None

    def tool_schema(self, tool: Any) -> tuple[Any, str] | None:
        if isinstance(tool, dict) and isinstance(tool.get("input_schema"), dict):
            return tool, "input_schema"
        return None

    def tool_slots(self, body: dict[str, Any]) -> list[Slot]:
        out: list[Slot] = []
        for tool in self.tools(body) or ():
            _description_slots(tool, out)
        return out

    def history(self, body: dict[str, Any]) -> list[Any]:
        return list(body.get("messages") or ())

    def canonical_message(self, msg: Any) -> bytes:
        if not isinstance(msg, dict):
            return canonical_json(msg)
        content = msg.get("content")
        if isinstance(content, list):
            content = [
                {k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b
                for b in content
            ]
        return canonical_json({"r": msg.get("role"), "c": _flat_content(content)})


OPENAI = Dialect()
ANTHROPIC = AnthropicDialect()
