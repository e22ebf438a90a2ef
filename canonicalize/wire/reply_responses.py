"""OpenAI Responses replies, streamed or not: usage, the fork tool-call guard,
the output items the client received.  A pure state machine fed event by event
(see :mod:`canonicalize.wire.reply_chat` for what it does and why).

A streamed response is a sequence of typed events (``response.created``,
``response.output_item.added`` / ``.done``, ``response.output_text.delta``,
``response.function_call_arguments.delta`` / ``.done``, ``response.completed``
…); every event about an output item names its ``output_index``.  For a fork,
a ``function_call`` / ``custom_tool_call`` item to a tool the fork did not offer
is dropped with every event about it (its name is known from the first one,
``output_item.added``), later items are renumbered so the client sees a dense
``output`` list, and ``response.completed``'s ``output`` loses it too.  Usage is
read from ``response.completed`` (always sent).
"""

from __future__ import annotations

from typing import Any

import orjson

from canonicalize.sse import Event, encode
from canonicalize.usage import UsageAccumulator

CALLS = frozenset({"function_call", "custom_tool_call"})
_FIRST_TOKEN = frozenset(
    {"response.output_text.delta", "response.function_call_arguments.delta", "response.custom_tool_call_input.delta"}
)
_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})  # a stream's last event


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


class ResponsesReply:
    """One instance per response."""

    def __init__(self, *, offered: frozenset[str] | None = None) -> None:
        self.offered = offered
        self.usage = UsageAccumulator()
        self.blocked = 0
        self.first_token = False
        self.ended = False
        self._dropped: set[int] = set()  # upstream output indexes removed
        self._dropped_ids: set[str] = set()
        self._renumber: dict[int, int] = {}
        self._items: dict[int, dict[str, Any]] = {}  # client index -> item as received
        self._saw = False
        self.response_id: str | None = None

    def _blocks(self, item: Any) -> bool:
        """A call to a tool the fork did not offer: neither its name nor its
        ``namespace`` (a call into a ``{"type": "namespace"}`` tool, e.g. Codex's
        multi-agent tools) is among the offered tools' names."""
        return (
            self.offered is not None
            and isinstance(item, dict)
            and item.get("type") in CALLS
            and item.get("name") not in self.offered
            and item.get("namespace") not in self.offered
        )

    # -- streamed --------------------------------------------------------------
    def feed(self, event: Event) -> bytes | None:
        if event.data is None:
            return event.raw
        obj = _loads(event.data)
        if not isinstance(obj, dict):
            return event.raw
        self.usage.feed(obj)
        kind = obj.get("type")
        if kind in _ENDS:
            self.ended = True
        if kind in _FIRST_TOKEN:
            self.first_token = True
        changed = False
        if kind in ("response.created", "response.completed", "response.incomplete"):
            self._id(obj.get("response"))
        if kind == "response.completed" or kind == "response.incomplete":
            self._saw = True
            changed = self._filter(obj.get("response"), streamed=True)
        index = obj.get("output_index")
        if isinstance(index, int) and not isinstance(index, bool):
            item = obj.get("item")
            if kind == "response.output_item.added" and index not in self._renumber and index not in self._dropped:
                if self._blocks(item):
                    self._dropped.add(index)
                    if isinstance(item, dict) and isinstance(item.get("id"), str):
                        self._dropped_ids.add(item["id"])
                    self.blocked += 1
                else:
                    self._renumber[index] = len(self._renumber)
            if index in self._dropped:
                return None
            new = self._renumber.get(index, index)
            if kind == "response.output_item.done" and isinstance(item, dict):
                self._saw = True
                self._items[new] = item
            if new != index:
                obj["output_index"] = new
                changed = True
        elif obj.get("item_id") in self._dropped_ids:
            return None
        if not changed:
            return event.raw
        return b"event: " + str(kind).encode() + b"\n" + encode(orjson.dumps(obj))

    def _id(self, response: Any) -> None:
        if isinstance(response, dict) and isinstance(response.get("id"), str):
            self.response_id = response["id"]

    def _filter(self, response: Any, *, streamed: bool = False) -> bool:
        """Remove blocked calls from a whole response's ``output``; True if changed.
        A stream's final ``output`` replaces the items collected from
        ``output_item.done`` unless it is empty (some backends leave it so)."""
        if not isinstance(response, dict) or not isinstance(response.get("output"), list):
            return False
        output = response["output"]
        kept = [item for item in output if not self._blocks(item)]
        if kept or not streamed:
            self._items = {i: item for i, item in enumerate(kept) if isinstance(item, dict)}
        if len(kept) == len(output):
            return False
        response["output"] = kept
        return True

    # -- not streamed ------------------------------------------------------------
    def complete(self, obj: Any) -> bool:
        if not isinstance(obj, dict):
            return False
        self.usage.feed(obj)
        self._id(obj)
        if not isinstance(obj.get("output"), list):
            return False
        self._saw = True
        before = len(obj["output"])
        changed = self._filter(obj)
        self.blocked += before - len(obj["output"])
        return changed

    def message(self) -> dict[str, Any] | None:
        """The output items the client received, as ``{"role": "assistant", "id":
        <response id>, "output": [...]}`` (the id is what ``previous_response_id`` names)."""
        if not self._saw:
            return None
        out: dict[str, Any] = {"role": "assistant", "output": [item for _, item in sorted(self._items.items())]}
        if self.response_id is not None:
            out["id"] = self.response_id
        return out
