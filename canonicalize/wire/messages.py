"""Anthropic Messages: ``POST /v1/messages``.

System text is the top-level ``system`` (a string or text blocks) and any
message of role ``system`` (Claude Code 2.1.33x puts its cwd and date in one at
``messages[1]``): rules see them, the hash chain does not, so a new date there
does not look like a rewritten history.  tools[] carry ``input_schema``; every
other message is history.  ``cache_control`` markers do not change a message's
hash: they move between turns.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from canonicalize.edits import AddMember, DeleteMember, Op, SetMember
from canonicalize.jsonspan import JsonDoc
from canonicalize.wire.base import (
    Reply,
    RoleMessages,
    Slot,
    canonical_json,
    description_slots,
    flat_content,
    text_slots,
)
from canonicalize.wire.reply_messages import MessagesReply

_PATH = re.compile(r"/v1/messages/?")


class MessagesExchange(RoleMessages):
    name = "messages"
    items_key = "messages"
    schema_key = "input_schema"
    cache_key_member: str | None = None  # Anthropic caches by breakpoints (canonicalize.provider.breakpoints)

    def matches(self, path: str) -> bool:
        return _PATH.fullmatch(path) is not None

    # -- system -----------------------------------------------------------------------
    def system_slots(self, body: dict[str, Any]) -> list[Slot]:
        out: list[Slot] = []
        if "system" in body:
            text_slots(body, "system", ("system",), out)
        for i, msg in enumerate(self.messages(body)):
            if self.is_system(msg) and "content" in msg:
                text_slots(msg, "content", ("messages", i, "content"), out)
        return out

    def split(self, body: dict[str, Any]) -> tuple[list[Slot], list[Any]]:
        return self.system_slots(body), self.history(body)

    def system_value(self, body: dict[str, Any]) -> Any:
        return body.get("system")

    def system_blob(self, doc: JsonDoc, body: dict[str, Any]) -> bytes:
        if "system" not in body:
            return b"null"
        span = doc.span(("system",))
        if span is None:
            raise KeyError(("system",))
        return doc.raw[span[0] : span[1]]

    def set_system(self, body: dict[str, Any], blob: bytes) -> list[Op]:
        value = orjson.loads(blob)
        if value is None:
            if "system" not in body:
                return []
            del body["system"]
            return [DeleteMember((), "system")]
        had = "system" in body
        body["system"] = value
        return [SetMember((), "system", blob) if had else AddMember("system", blob)]

    # -- tools ------------------------------------------------------------------------
    def tool_name(self, tool: Any) -> str | None:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            return str(tool["name"])
        return None

    def tool_slots(self, body: dict[str, Any]) -> list[Slot]:
        out: list[Slot] = []
        for i, tool in enumerate(self.tools(body) or ()):
            description_slots(tool, ("tools", i), out)
        return out

    # -- history ------------------------------------------------------------------------
    def canonical_message(self, msg: Any) -> bytes:
        if not isinstance(msg, dict):
            return canonical_json(msg)
        content = msg.get("content")
        if isinstance(content, list):
            content = [
                {k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b for b in content
            ]
        return canonical_json({"r": msg.get("role"), "c": flat_content(content)})

    # -- streaming, replies, errors ---------------------------------------------------
    def stream_usage(self, body: dict[str, Any]) -> list[Op]:
        return []  # message_start and message_delta always carry usage

    def reply(self, *, offered: frozenset[str] | None, drop_usage_chunk: bool) -> Reply:
        return MessagesReply(offered=offered)

    def error_body(self, message: str, type_: str, code: str) -> dict[str, Any]:
        kind = _ANTHROPIC_TYPES.get(code) or _ANTHROPIC_TYPES.get(type_, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}


# prefixpin's error types -> Anthropic's (https://docs.anthropic.com/en/api/errors)
_ANTHROPIC_TYPES = {
    "invalid_request_error": "invalid_request_error",
    "request_too_large": "request_too_large",
    "upstream_error": "api_error",
    "upstream_timeout": "timeout_error",
    "overloaded": "overloaded_error",
}

MESSAGES = MessagesExchange()
