"""What every wire API module shares: :class:`Slot`, the :class:`Exchange` and
:class:`Reply` protocols, and the slot finders."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Protocol

import orjson

from canonicalize.edits import Op
from canonicalize.jsonspan import JsonDoc, Path
from canonicalize.sse import Event
from canonicalize.usage import UsageAccumulator


class Slot(NamedTuple):
    container: Any
    key: Any
    path: Path

    def get(self) -> str:
        text: str = self.container[self.key]
        return text

    def set(self, text: str) -> None:
        self.container[self.key] = text


class Reply(Protocol):
    """A response state machine: usage, the fork tool guard, the reply message."""

    usage: UsageAccumulator
    blocked: int
    first_token: bool
    ended: bool  # the stream's last event went by (chat: [DONE]; Messages: message_stop; Responses: its end)
    offered: frozenset[str] | None  # the fork guard's tools; None: ``complete`` never changes a body

    def feed(self, event: Event) -> bytes | None:
        """Bytes to forward for a streamed ``event`` (its raw bytes if unchanged), after any
        held events it releases; None: nothing to forward now (dropped, or held until
        the guard can judge the call it carries)."""
        ...

    def close(self, tail: bytes) -> bytes:
        """The stream ended; ``tail``: what the splitter still held (an unterminated event,
        or nothing).  The bytes still to forward: the events held for a verdict, decided
        now, then the tail, guarded like any event."""
        ...

    def complete(self, obj: Any) -> bool:
        """Process a whole (non-streamed) response in place; True if it changed."""
        ...

    def message(self) -> dict[str, Any] | None:
        """The assistant message as the client received it (the next turn replays it)."""
        ...


class Exchange(Protocol):
    """One wire API (see the module docstring)."""

    name: str  # the ``route`` metric label
    items_key: str  # the top-level array of history items (Bodies parses it by pieces)
    schema_key: str  # where a tool's JSON schema sits
    # The top-level member naming a provider cache key (OpenAI's ``prompt_cache_key``),
    # set per lineage by ``provider_cache.prompt_cache_key: lineage``; None: the API has none.
    cache_key_member: str | None

    def matches(self, path: str) -> bool: ...

    # -- system ---------------------------------------------------------------------
    def system_slots(self, body: dict[str, Any]) -> list[Slot]: ...

    def system_value(self, body: dict[str, Any]) -> Any:
        """The system part as forwarded (what a fork gets from its parent), parsed."""
        ...

    def system_blob(self, doc: JsonDoc, body: dict[str, Any]) -> bytes:
        """The raw bytes of the system part of ``doc`` (``body`` is its parse)."""
        ...

    def set_system(self, body: dict[str, Any], blob: bytes) -> list[Op]:
        """Replace the system part with recorded bytes: the edits, and ``body`` updated."""
        ...

    # -- tools ------------------------------------------------------------------------
    def tools(self, body: dict[str, Any]) -> list[Any] | None: ...

    def tool_name(self, tool: Any) -> str | None: ...

    def tool_slots(self, body: dict[str, Any]) -> list[Slot]: ...

    def tools_path(self, body: dict[str, Any]) -> Path:
        """Where tools[] sits (or would be added) in the request."""
        ...

    # -- history ----------------------------------------------------------------------
    def history(self, body: dict[str, Any]) -> list[Any]: ...

    def split(self, body: dict[str, Any]) -> tuple[list[Slot], list[Any]]:
        """``system_slots(body)`` and ``history(body)``, found together."""
        ...

    def message_slots(self, body: dict[str, Any]) -> list[Slot]: ...

    def note_slot(self, body: dict[str, Any], index: int) -> Slot | None:
        """The text a line may be appended to in history item ``index`` (a user message)."""
        ...

    def canonical_message(self, msg: Any) -> bytes: ...

    def is_assistant(self, msg: Any) -> bool: ...

    def is_user(self, msg: Any) -> bool: ...

    def last_user_text(self, body: dict[str, Any]) -> str: ...

    def replayed(self, message: dict[str, Any]) -> list[Any]:
        """The history items the next turn replays for a reply's ``message()``."""
        ...

    # -- streaming, replies, errors ---------------------------------------------------------
    def stream_usage(self, body: dict[str, Any]) -> list[Op]:
        """Edits that make a streaming upstream report usage the client did not ask for."""
        ...

    def reply(self, *, offered: frozenset[str] | None, drop_usage_chunk: bool) -> Reply: ...

    def error_body(self, message: str, type_: str, code: str) -> dict[str, Any]: ...


def text_slots(container: Any, key: Any, path: Path, out: list[Slot]) -> None:
    """The string at ``container[key]``, or the text of each text part of a list there."""
    value = container[key]
    if isinstance(value, str):
        out.append(Slot(container, key, path))
    elif isinstance(value, list):
        for j, part in enumerate(value):
            if isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                out.append(Slot(part, "text", (*path, j, "text")))


def description_slots(node: Any, path: Path, out: list[Slot]) -> None:
    """Every ``description`` string under ``node`` (tool descriptions, schema properties)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                out.append(Slot(node, key, (*path, key)))
            elif isinstance(value, dict | list):
                description_slots(value, (*path, key), out)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            description_slots(item, (*path, i), out)


def canonical_json(value: Any) -> bytes:
    """Compact JSON with sorted keys: the hashing form of structured values."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def flat_content(content: Any) -> Any:
    """``None``/"" -> "", one or more text parts -> their text, else parts sans cache_control."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        if all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            return "".join(str(p.get("text", "")) for p in content)
        return [{k: v for k, v in p.items() if k != "cache_control"} if isinstance(p, dict) else p for p in content]
    return content


class RoleMessages:
    """What APIs whose history is ``{"role": ..., "content": ...}`` messages and whose
    tools are a top-level ``tools`` list share (chat completions, Messages): every
    message whose role is not in ``system_roles`` is history."""

    system_roles: frozenset[str] = frozenset({"system"})

    @staticmethod
    def messages(body: dict[str, Any]) -> list[Any]:
        messages = body.get("messages")
        return messages if isinstance(messages, list) else []

    def is_system(self, msg: Any) -> bool:
        if not isinstance(msg, dict):
            return False
        role = msg.get("role")
        return type(role) is str and role in self.system_roles

    def history(self, body: dict[str, Any]) -> list[Any]:
        roles = self.system_roles  # is_system, inlined: this runs over every message of every request
        out = []
        for m in self.messages(body):
            if isinstance(m, dict) and type(role := m.get("role")) is str and role in roles:
                continue
            out.append(m)
        return out

    def message_slots(self, body: dict[str, Any]) -> list[Slot]:
        out: list[Slot] = []
        for i, msg in enumerate(self.messages(body)):
            if isinstance(msg, dict) and not self.is_system(msg) and "content" in msg:
                text_slots(msg, "content", ("messages", i, "content"), out)
        return out

    def note_slot(self, body: dict[str, Any], index: int) -> Slot | None:
        at = [i for i, m in enumerate(self.messages(body)) if not self.is_system(m)]
        if not 0 <= index < len(at):
            return None
        msg = self.messages(body)[at[index]]
        if not (self.is_user(msg) and "content" in msg):
            return None
        found: list[Slot] = []
        text_slots(msg, "content", ("messages", at[index], "content"), found)
        return found[-1] if found else None

    def tools(self, body: dict[str, Any]) -> list[Any] | None:
        tools = body.get("tools")
        return tools if isinstance(tools, list) else None

    def tools_path(self, body: dict[str, Any]) -> Path:
        return ("tools",)

    def is_assistant(self, msg: Any) -> bool:
        return isinstance(msg, dict) and msg.get("role") == "assistant"

    def is_user(self, msg: Any) -> bool:
        return isinstance(msg, dict) and msg.get("role") == "user"

    def last_user_text(self, body: dict[str, Any]) -> str:
        for msg in reversed(self.messages(body)):  # a user message is never a system one
            if self.is_user(msg):
                flat = flat_content(msg.get("content"))
                return flat if isinstance(flat, str) else ""
        return ""

    def replayed(self, message: dict[str, Any]) -> list[Any]:
        """The history items a reply becomes when the next request replays it: itself."""
        return [message]


def _normalize_args(arguments: str) -> orjson.Fragment:
    try:
        return orjson.Fragment(canonical_json(orjson.loads(arguments)))
    except orjson.JSONDecodeError:
        return orjson.Fragment(orjson.dumps(arguments))


# Tool-call arguments replay unchanged turn after turn: normalise each short one
# once (bounded: at most 8192 entries of at most 4 KB each).
_cached_args = functools.lru_cache(maxsize=8192)(_normalize_args)


def arguments_form(arguments: Any) -> Any:
    """Tool-call arguments as hashed: JSON text parsed and re-encoded with sorted keys
    (whitespace and key order do not change a call's meaning), anything else as is."""
    if isinstance(arguments, str):
        return _cached_args(arguments) if len(arguments) <= 4096 else _normalize_args(arguments)
    return arguments
