"""OpenAI Responses replies, streamed or not: usage, the fork tool-call guard,
the output items the client received.  A pure state machine fed event by event
(see :mod:`canonicalize.wire.reply_chat` for what it does and why).

A streamed response is a sequence of typed events (``response.created``,
``response.output_item.added`` / ``.done``, ``response.output_text.delta``,
``response.function_call_arguments.delta`` / ``.done``, ``response.completed``
…); every event about an output item names its ``output_index``, most its
``item_id``.  Usage is read from ``response.completed`` (always sent).

The guard, and where a Responses reply carries a call
-----------------------------------------------------
Items the client runs are calls to its own tools: ``function_call`` and
``custom_tool_call`` (judged by ``name``, or by the ``namespace`` they are
called in, e.g. Codex's multi-agent tools), and the built-in tools the client
executes, ``local_shell_call``, ``shell_call``, ``apply_patch_call`` and
``computer_call`` (judged by their tool's type: ``local_shell``, ``shell``,
``apply_patch``, ``computer`` / ``computer_use_preview``; the request side names
a tool by ``tool_name``, which gives these none, so in a fork they are removed
unless the fork offered a tool of that name).  For a fork, such an item naming a
tool the fork did not offer is removed wherever it appears, and counted once:

- as the ``item`` of any event (``output_item.added``, ``output_item.done`` —
  Codex runs the calls of ``output_item.done`` and needs no ``added`` before it);
- in the ``output`` of any event's ``response`` (``response.created``, whose
  output the openai SDK takes as its snapshot, ``in_progress``, ``completed``,
  ``incomplete``, ``failed`` …);
- named by an arguments event (``response.function_call_arguments.done`` carries
  the name) for an item not seen yet;
- with every event about it: by ``output_index``, or by ``item_id`` (the
  arguments and custom-input deltas).

Later items are renumbered so the client sees a dense ``output`` list (without a
guard nothing is renumbered).  Not guarded: the tools the provider runs itself
(``web_search_call``, ``file_search_call``, ``code_interpreter_call``,
``image_generation_call``, ``mcp_call``, ``mcp_list_tools``): they have run
before the reply arrives, so removing them would hide what happened without
preventing it, and their results are part of the answer.  Nor
``mcp_approval_request``, which asks the client to approve such a run (the
client decides), nor ``tool_search_call``, which loads tool definitions and runs
no tool of the client (calls to what it finds are guarded by name like any
other).
"""

from __future__ import annotations

from typing import Any

from canonicalize.sse import Event, dumps, encode, payload
from canonicalize.usage import UsageAccumulator

_NAMED = frozenset({"function_call", "custom_tool_call"})  # judged by name or namespace
# Built-in tools the client executes: the item type, and its tool's types.
_BUILT_IN = {
    "local_shell_call": ("local_shell",),
    "shell_call": ("shell",),
    "apply_patch_call": ("apply_patch",),
    "computer_call": ("computer", "computer_use_preview"),
}
_ARGUMENT_EVENTS = frozenset({"response.function_call_arguments.delta", "response.function_call_arguments.done"})
_FIRST_TOKEN = frozenset(
    {"response.output_text.delta", "response.function_call_arguments.delta", "response.custom_tool_call_input.delta"}
)
_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})  # a stream's last event
_FINAL = frozenset({"response.completed", "response.incomplete"})  # their output is the reply


def _ids(node: dict[str, Any]) -> list[str]:
    """What events and later requests name a call by: its item id, its call id."""
    return [v for v in (node.get("id"), node.get("call_id"), node.get("item_id")) if isinstance(v, str)]


class ResponsesReply:
    """One instance per response."""

    def __init__(self, *, offered: frozenset[str] | None = None) -> None:
        self.offered = offered
        self.usage = UsageAccumulator()
        self.blocked = 0
        self.first_token = False
        self.ended = False
        self._dropped: set[int] = set()  # upstream output indexes removed
        self._dropped_ids: set[str] = set()  # item and call ids removed
        self._let: set[int] = set()  # upstream output indexes whose item was let through
        self._let_ids: set[str] = set()
        self._renumber: dict[int, int] = {}  # upstream output index -> the client's
        self._used: set[int] = set()  # the client's numbers given
        self._items: dict[int, dict[str, Any]] = {}  # client index -> item as received
        self._saw = False
        self.response_id: str | None = None

    def _blocks(self, item: Any) -> bool:
        """A call the client runs, to a tool the fork did not offer."""
        offered = self.offered
        if offered is None or not isinstance(item, dict):
            return False
        kind = item.get("type")
        if type(kind) is not str:
            return False
        if kind in _NAMED:
            return not any(type(n) is str and n in offered for n in (item.get("name"), item.get("namespace")))
        tools = _BUILT_IN.get(kind)
        return tools is not None and not any(t in offered for t in tools)

    def _block(self, index: int | None, ids: list[str]) -> None:
        """Remove a call (its output index, its ids) from here on; count it once."""
        known = (index is not None and index in self._dropped) or any(i in self._dropped_ids for i in ids)
        if index is not None:
            self._dropped.add(index)
        self._dropped_ids.update(ids)
        if not known:
            self.blocked += 1

    # -- streamed --------------------------------------------------------------
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
        if kind in _ENDS:
            self.ended = True
        if kind in _FIRST_TOKEN:
            self.first_token = True
        changed = False
        if kind in ("response.created", "response.completed", "response.incomplete"):
            self._id(obj.get("response"))
        if kind in _FINAL:
            self._saw = True
            changed = self._filter(obj.get("response"), streamed=True)
        elif self.offered is not None and isinstance(obj.get("response"), dict):
            changed = self._filter(obj["response"], streamed=True, final=False)
        index = obj.get("output_index")
        if type(index) is not int:  # bool is not an index
            index = None
        item = obj.get("item")
        new = index
        if self.offered is not None:  # without a guard nothing is removed, nothing renumbered
            if self._removes(obj, kind, index, item):
                return None
            if index is not None:
                new = self._renumber.get(index)
                if new is None:
                    new = self._number(index)
                if new != index:
                    obj["output_index"] = new
                    changed = True
        if kind == "response.output_item.done" and isinstance(item, dict) and new is not None:
            self._saw = True
            self._items[new] = item
        if not changed:
            return event.raw
        return b"event: " + str(kind).encode() + b"\n" + encode(dumps(obj, strict))

    def _number(self, index: int) -> int:
        """The client's number for an upstream output index, fixed by its first event:
        one less per removed index below it (no removal, no change), never one
        already given (a call found removed after later items went out)."""
        new = index - sum(1 for d in self._dropped if d < index) if self._dropped else index
        while new in self._used:
            new += 1
        self._renumber[index] = new
        self._used.add(new)
        return new

    def _removes(self, obj: dict[str, Any], kind: Any, index: int | None, item: Any) -> bool:
        """Whether an event belongs to a call the guard removes (deciding on it if it
        names one: an item, or the name an arguments event carries)."""
        assert self.offered is not None
        if self._blocks(item):
            self._block(index, _ids(item))
            return True
        if isinstance(item, dict):  # judged, let through: its arguments events need no other verdict
            if index is not None:
                self._let.add(index)
            self._let_ids.update(_ids(item))
        elif (
            kind in _ARGUMENT_EVENTS
            and "name" in obj
            and not (index in self._let or any(i in self._let_ids for i in _ids(obj)))
            and self._blocks({"type": "function_call", "name": obj["name"], "namespace": obj.get("namespace")})
        ):
            self._block(index, _ids(obj))
            return True
        if index is not None and index in self._dropped:
            return True
        ids = _ids(obj)
        if isinstance(item, dict):
            ids += _ids(item)
        return any(i in self._dropped_ids for i in ids)

    def close(self, tail: bytes) -> bytes:
        """The stream ended; ``tail``: the bytes the splitter still held.  Nothing is
        held here (an item's name is whole in its first event): the tail, guarded."""
        return (self.feed(Event.parse(tail)) or b"") if tail else b""

    def _id(self, response: Any) -> None:
        if isinstance(response, dict) and isinstance(response.get("id"), str):
            self.response_id = response["id"]

    def _filter(self, response: Any, *, streamed: bool = False, final: bool = True) -> bool:
        """Remove blocked calls from a whole response's ``output``; True if changed.
        A stream's final ``output`` replaces the items collected from
        ``output_item.done`` unless it is empty (some backends leave it so)."""
        if not isinstance(response, dict) or not isinstance(response.get("output"), list):
            return False
        output = response["output"]
        kept = []
        for item in output:
            if self._blocks(item):
                self._block(None, _ids(item))
            elif not (self._dropped_ids and isinstance(item, dict) and any(i in self._dropped_ids for i in _ids(item))):
                kept.append(item)
        if final and (kept or not streamed):
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
        return self._filter(obj)

    def message(self) -> dict[str, Any] | None:
        """The output items the client received, as ``{"role": "assistant", "id":
        <response id>, "output": [...]}`` (the id is what ``previous_response_id`` names)."""
        if not self._saw:
            return None
        out: dict[str, Any] = {"role": "assistant", "output": [item for _, item in sorted(self._items.items())]}
        if self.response_id is not None:
            out["id"] = self.response_id
        return out
