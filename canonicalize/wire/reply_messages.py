"""Anthropic Messages responses, streamed or not: usage, the fork tool-call guard,
the reply message.  A pure state machine fed event by event (see
:mod:`canonicalize.wire.reply_chat` for what it does and why)."""

from __future__ import annotations

from typing import Any

import orjson

from canonicalize.sse import Event, encode, loads_or_none
from canonicalize.usage import UsageAccumulator


class MessagesReply:
    """Anthropic messages: one instance per response."""

    def __init__(self, *, offered: frozenset[str] | None = None) -> None:
        self.offered = offered
        self.usage = UsageAccumulator()
        self.blocked = 0
        self.first_token = False
        self.ended = False
        self._dropped: set[int] = set()
        self._renumber: dict[int, int] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._kept_tool_use = 0
        self._saw = False

    def feed(self, event: Event) -> bytes | None:
        if event.data is None:
            return event.raw
        obj = loads_or_none(event.data)
        if not isinstance(obj, dict):
            return event.raw
        self.usage.feed(obj)
        kind = obj.get("type")
        changed = False
        if kind == "message_stop":
            self.ended = True
        if kind == "message_start":
            self._saw = True
        elif kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            index = int(obj.get("index", 0) or 0)
            if kind == "content_block_start":
                block = obj.get("content_block") or {}
                if (
                    self.offered is not None
                    and isinstance(block, dict)
                    and block.get("type") == "tool_use"
                    and block.get("name") not in self.offered
                ):
                    self._dropped.add(index)
                    self.blocked += 1
                    return None
                self._renumber[index] = len(self._renumber)
                if isinstance(block, dict):
                    self._blocks[self._renumber[index]] = dict(block)
                    if block.get("type") == "tool_use":
                        self._kept_tool_use += 1
            if index in self._dropped:
                return None
            new = self._renumber.get(index, index)
            if new != index:
                obj["index"] = new
                changed = True
            if kind == "content_block_delta":
                self.first_token = True
                self._collect(new, obj.get("delta") or {})
        elif kind == "message_delta" and self.offered is not None:
            delta = obj.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") == "tool_use" and self._kept_tool_use == 0:
                delta["stop_reason"] = "end_turn"
                changed = True
        if not changed:
            return event.raw
        return b"event: " + str(kind).encode() + b"\n" + encode(orjson.dumps(obj))

    def _collect(self, index: int, delta: dict[str, Any]) -> None:
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        dtype = delta.get("type")
        if dtype == "text_delta":
            block["text"] = block.get("text", "") + str(delta.get("text", ""))
        elif dtype == "input_json_delta":
            self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))
        elif dtype == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
        elif dtype == "signature_delta":
            block["signature"] = str(delta.get("signature", ""))

    def complete(self, obj: Any) -> bool:
        if not isinstance(obj, dict):
            return False
        self.usage.feed(obj)
        content = obj.get("content")
        if not isinstance(content, list):
            return False
        self._saw = True
        changed = False
        if self.offered is not None:
            kept = [
                b
                for b in content
                if not (isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") not in self.offered)
            ]
            if len(kept) != len(content):
                self.blocked += len(content) - len(kept)
                obj["content"] = content = kept
                changed = True
                if obj.get("stop_reason") == "tool_use" and not any(
                    isinstance(b, dict) and b.get("type") == "tool_use" for b in kept
                ):
                    obj["stop_reason"] = "end_turn"
        self._blocks = {i: b for i, b in enumerate(content) if isinstance(b, dict)}
        return changed

    def message(self) -> dict[str, Any] | None:
        if not self._saw:
            return None
        blocks = []
        for i, block in sorted(self._blocks.items()):
            block = dict(block)
            if i in self._json:
                block["input"] = loads_or_none("".join(self._json[i]).encode() or b"{}")
            blocks.append(block)
        return {"role": "assistant", "content": blocks}
