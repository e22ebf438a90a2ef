"""OpenAI chat completions: ``POST /v1/chat/completions`` (also with a trailing
slash, and Azure's ``/openai/deployments/{name}/chat/completions``).

System text is the content of ``system``/``developer`` messages; tools[] are
``tools[].function``; the hash chain covers every other message.

``canonical_message`` is the normalised form of one message used only for
hashing: representations that mean the same (``content`` null / "" / missing, a
string vs a list of one text part, tool-call ``arguments`` whitespace and key
order, ``cache_control`` markers) hash the same.  Forwarded bytes never change
because of it.
"""

from __future__ import annotations

import re
from itertools import repeat
from typing import Any

import orjson

from canonicalize.edits import AddMember, Op, SetItems, SetMember
from canonicalize.jsonspan import JsonDoc
from canonicalize.wire.base import (
    Reply,
    RoleMessages,
    Slot,
    arguments_form,
    canonical_json,
    description_slots,
    flat_content,
    text_slots,
)
from canonicalize.wire.reply_chat import ChatReply

SYSTEM_ROLES = frozenset({"system", "developer"})
_PATH = re.compile(r"(?:/v1)?/chat/completions/?|/openai/deployments/[^/]+/chat/completions/?")


def _call(call: Any) -> Any:
    """A tool call's hashing form: its name and its normalised arguments."""
    if not isinstance(call, dict):
        return call
    fn = call.get("function")
    if not isinstance(fn, dict):
        return [None, fn]
    return [fn.get("name"), arguments_form(fn.get("arguments"))]


class ChatExchange(RoleMessages):
    name = "chat_completions"
    items_key = "messages"
    system_roles = SYSTEM_ROLES
    schema_key = "parameters"
    cache_key_member: str | None = "prompt_cache_key"

    def matches(self, path: str) -> bool:
        return _PATH.fullmatch(path) is not None

    # -- system -----------------------------------------------------------------------
    def system_slots(self, body: dict[str, Any]) -> list[Slot]:
        out: list[Slot] = []
        roles = self.system_roles  # is_system, inlined: this runs over every message of every request
        for i, msg in enumerate(self.messages(body)):
            if isinstance(msg, dict) and "content" in msg and type(r := msg.get("role")) is str and r in roles:
                text_slots(msg, "content", ("messages", i, "content"), out)
        return out

    def split(self, body: dict[str, Any]) -> tuple[list[Slot], list[Any]]:
        """``system_slots`` and ``history`` in one pass over the messages."""
        slots: list[Slot] = []
        roles = self.system_roles
        messages = self.messages(body)
        try:  # every message's role at C speed (a message not a dict: the loop below)
            said = list(map(dict.get, messages, repeat("role")))
        except TypeError:
            said = None
        if said is not None:
            # (list.count compares by ==: only a str equals a system role's name)
            system = sum(map(said.count, roles))
            if not system:
                return slots, list(messages)
            if system == 1 and type(said[0]) is str and said[0] in roles:
                msg = messages[0]  # the one system message leads (the common case)
                if "content" in msg:
                    text_slots(msg, "content", ("messages", 0, "content"), slots)
                return slots, messages[1:]
        history = []
        for i, msg in enumerate(messages):
            if isinstance(msg, dict) and type(r := msg.get("role")) is str and r in roles:
                if "content" in msg:
                    text_slots(msg, "content", ("messages", i, "content"), slots)
            else:
                history.append(msg)
        return slots, history

    def _lead(self, body: dict[str, Any]) -> int:
        n = 0
        for msg in self.messages(body):
            if not self.is_system(msg):
                break
            n += 1
        return n

    def system_value(self, body: dict[str, Any]) -> Any:
        """The leading system messages (a fork gets its parent's)."""
        return self.messages(body)[: self._lead(body)]

    def system_blob(self, doc: JsonDoc, body: dict[str, Any]) -> bytes:
        parts = []
        for i in range(self._lead(body)):
            span = doc.span(("messages", i))
            if span is None:
                raise KeyError(("messages", i))
            parts.append(doc.raw[span[0] : span[1]])
        return b"[" + b",".join(parts) + b"]"

    def set_system(self, body: dict[str, Any], blob: bytes) -> list[Op]:
        items = JsonDoc(blob).items(())
        if items is None:
            raise ValueError("a recorded system part is not a JSON array")
        n = self._lead(body)
        body["messages"] = list(orjson.loads(blob)) + self.messages(body)[n:]
        return [SetItems(("messages",), 0, n, tuple(blob[s:e] for s, e in items))]

    # -- tools ------------------------------------------------------------------------
    def tool_name(self, tool: Any) -> str | None:
        if isinstance(tool, dict):
            fn = tool.get("function")
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                return str(fn["name"])
            custom = tool.get("custom")  # {"type": "custom", "custom": {"name": ...}}
            if isinstance(custom, dict) and isinstance(custom.get("name"), str):
                return str(custom["name"])
            if isinstance(tool.get("name"), str):
                return str(tool["name"])
        return None

    def tool_slots(self, body: dict[str, Any]) -> list[Slot]:
        out: list[Slot] = []
        for i, tool in enumerate(self.tools(body) or ()):
            if isinstance(tool, dict):
                fn = tool.get("function")
                if isinstance(fn, dict):
                    description_slots(fn, ("tools", i, "function"), out)
                else:
                    description_slots(tool, ("tools", i), out)
        return out

    # -- history ------------------------------------------------------------------------
    def canonical_message(self, msg: Any) -> bytes:
        if not isinstance(msg, dict):
            return canonical_json(msg)
        out: dict[str, Any] = {"r": msg.get("role"), "c": flat_content(msg.get("content"))}
        calls = msg.get("tool_calls")
        if calls:
            out["t"] = [_call(c) for c in calls] if isinstance(calls, list) else calls
        if msg.get("name"):
            out["n"] = msg["name"]
        return canonical_json(out)

    # -- streaming, replies, errors ---------------------------------------------------
    def stream_usage(self, body: dict[str, Any]) -> list[Op]:
        if body.get("stream") is not True:
            return []
        opts = body.get("stream_options")
        if isinstance(opts, dict):
            if opts.get("include_usage") is True:
                return []
            return [SetMember(("stream_options",), "include_usage", b"true")]
        if "stream_options" in body:  # null or another non-object: replaced
            return [SetMember((), "stream_options", b'{"include_usage":true}')]
        return [AddMember("stream_options", b'{"include_usage":true}')]

    def reply(self, *, offered: frozenset[str] | None, drop_usage_chunk: bool) -> Reply:
        return ChatReply(offered=offered, drop_usage_chunk=drop_usage_chunk)

    def error_body(self, message: str, type_: str, code: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": type_, "code": code}}


CHAT = ChatExchange()
