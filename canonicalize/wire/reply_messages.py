"""Anthropic Messages responses, streamed or not: usage, the fork tool-call guard,
the reply message.  A pure state machine fed event by event (see
:mod:`canonicalize.wire.reply_chat` for what it does and why).

The guard, and where a Messages reply carries a call
----------------------------------------------------
The client runs ``tool_use`` blocks (Anthropic-defined client tools such as
``bash`` or ``str_replace_based_edit_tool`` are ``tool_use`` blocks too, named
by their tool's ``name``).  For a fork, one whose ``name`` the fork did not
offer is removed, and counted, wherever a client reads it:

- ``content[]`` of a whole response;
- streamed, ``content_block_start``, which carries the whole name (no event
  adds to a name later, so nothing is held), with every later event of its
  block (``input_json_delta`` …); later blocks are renumbered;
- ``message_start``'s ``message.content``, which the anthropic SDK takes as
  the start of its snapshot (empty from Anthropic, not from every proxy).

A ``stop_reason`` of ``tool_use`` becomes ``end_turn`` when no ``tool_use`` is
left.  Under the guard a block event whose ``index`` is not an integer (clients
read ``"1"``, ``1.0`` or ``true`` as different blocks, or fail), or names a block
that never started, is removed: it can only land in a block the guard did not
judge.  Not guarded: ``server_tool_use`` and ``mcp_tool_use`` (with their
results): the provider ran them before the reply arrived, so removing them
would hide what happened without preventing it.
"""

from __future__ import annotations

from typing import Any

from canonicalize.sse import Event, dumps, encode, loads_or_none, payload
from canonicalize.usage import UsageAccumulator

_BLOCK_EVENTS = frozenset({"content_block_start", "content_block_delta", "content_block_stop"})


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

    def _not_offered(self, block: Any) -> bool:
        """A ``tool_use`` block naming a tool the fork did not offer."""
        if self.offered is None or not isinstance(block, dict) or block.get("type") != "tool_use":
            return False
        name = block.get("name")
        return not (type(name) is str and name in self.offered)

    def feed(self, event: Event) -> bytes | None:
        if event.data is None:
            return event.raw
        obj, strict = payload(event.data, lenient=self.offered is not None)
        if not isinstance(obj, dict):
            return event.raw
        self.usage.feed(obj)
        kind = obj.get("type")
        if type(kind) is not str:
            kind = None  # (a list or a dict would not even look up in a set)
        changed = False
        if kind == "message_stop":
            self.ended = True
        if kind == "message_start":
            self._saw = True
            if self.offered is not None:
                changed = self._start(obj.get("message"))
        elif kind in _BLOCK_EVENTS:
            index = obj.get("index")
            if type(index) is not int:
                if self.offered is not None:
                    return None
                try:
                    index = int(index or 0)
                except (TypeError, ValueError):
                    return event.raw
            if kind == "content_block_start":
                block = obj.get("content_block") or {}
                if self._not_offered(block):
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
            if self.offered is not None and index not in self._renumber:
                return None  # a block that never started: the client would put it in another
            new = self._renumber.get(index, index)
            if new != index:
                obj["index"] = new
                changed = True
            if kind == "content_block_delta":
                self.first_token = True
                delta = obj.get("delta")
                self._collect(new, delta if isinstance(delta, dict) else {})
        elif kind == "message_delta" and self.offered is not None:
            delta = obj.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") == "tool_use" and self._kept_tool_use == 0:
                delta["stop_reason"] = "end_turn"
                changed = True
        if not changed:
            return event.raw
        return b"event: " + str(kind).encode() + b"\n" + encode(dumps(obj, strict))

    def _start(self, message: Any) -> bool:
        """``message_start``'s content: blocks the client starts with (upstream indexes
        0, 1, … before any ``content_block_start``); blocked ones removed."""
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            return False
        content = message["content"]
        kept = []
        for i, block in enumerate(content):
            if self._not_offered(block):
                self._dropped.add(i)
                self.blocked += 1
                continue
            self._renumber[i] = len(self._renumber)
            if isinstance(block, dict):
                self._blocks[self._renumber[i]] = dict(block)
                self._kept_tool_use += block.get("type") == "tool_use"
            kept.append(block)
        if len(kept) == len(content):
            return False
        message["content"] = kept
        return True

    def close(self, tail: bytes) -> bytes:
        """The stream ended; ``tail``: the bytes the splitter still held.  Nothing is
        held here (a block's name is whole in its first event): the tail, guarded."""
        return (self.feed(Event.parse(tail)) or b"") if tail else b""

    def _collect(self, index: int, delta: dict[str, Any]) -> None:
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        dtype = delta.get("type")
        if dtype == "text_delta":
            block["text"] = _text(block, "text") + str(delta.get("text", ""))
        elif dtype == "input_json_delta":
            self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))
        elif dtype == "thinking_delta":
            block["thinking"] = _text(block, "thinking") + str(delta.get("thinking", ""))
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
            kept = [b for b in content if not self._not_offered(b)]
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


def _text(block: dict[str, Any], key: str) -> str:
    text = block.get(key)
    return text if isinstance(text, str) else ""
