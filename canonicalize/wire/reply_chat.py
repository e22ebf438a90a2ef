"""Chat-completions responses, streamed or not: usage, the fork tool-call guard,
the reply message.

A pure state machine fed event by event.  For each upstream response it

- read usage (counted once, see :mod:`canonicalize.usage`);
- for a fork, remove tool calls to tools the fork did not itself offer: a
  streamed call's deltas are held until its name is known, the remaining calls
  are renumbered, and when none remain ``finish_reason`` becomes ``stop``
  (Anthropic: the ``tool_use`` block is dropped, blocks renumbered,
  ``stop_reason`` becomes ``end_turn``);
- drop the usage-only chunk prefixpin asked for when the client did not, and
  the ``"usage": null`` member that asking put in every other chunk (removed
  from the chunk's bytes; nothing else of the chunk changes);
- rebuild the assistant message *as the client received it*, so the next turn,
  which replays it, extends the recorded chain.

An event nobody changed is forwarded as its original bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from canonicalize.jsonspan import Edits, JsonDoc
from canonicalize.sse import Event, encode, loads_or_none
from canonicalize.usage import UsageAccumulator


@dataclass(slots=True)
class _Call:
    name: str | None = None
    allowed: bool | None = None
    index: int = -1
    pending: list[dict[str, Any]] = field(default_factory=list)


def _merge_deltas(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    args = []
    for d in deltas:
        for k, v in d.items():
            if k == "function" and isinstance(v, dict):
                fn = out.setdefault("function", {})
                for fk, fv in v.items():
                    if fk == "arguments":
                        args.append(fv or "")
                    elif fv is not None:
                        fn[fk] = fv
            elif v is not None:
                out.setdefault(k, v)
    if args:
        out.setdefault("function", {})["arguments"] = "".join(args)
    return out


class ChatReply:
    """OpenAI chat completions: one instance per response."""

    def __init__(self, *, offered: frozenset[str] | None = None, drop_usage_chunk: bool = False) -> None:
        self.offered = offered
        self.drop_usage_chunk = drop_usage_chunk
        self.usage = UsageAccumulator()
        self.blocked = 0
        self.first_token = False  # a content/tool delta has been forwarded
        self.ended = False
        # Guard state per choice (``n`` > 1 streams several): upstream call index -> state,
        # and the next client-side index.
        self._calls: dict[tuple[int, int], _Call] = {}
        self._next: dict[int, int] = {}
        self._content: list[str] = []
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self._saw_choice = False

    # -- streamed --------------------------------------------------------------
    def feed(self, event: Event) -> bytes | None:
        """Bytes to forward for ``event`` (its own raw bytes if unchanged), or None to drop it."""
        if event.data is None:
            return event.raw
        if event.data.strip() == b"[DONE]":
            self.ended = True
            return event.raw
        obj = loads_or_none(event.data)
        if not isinstance(obj, dict):
            return event.raw
        self.usage.feed(obj)
        choices = obj.get("choices")
        if self.drop_usage_chunk and choices == [] and obj.get("usage") is not None:
            return None
        changed = False
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict):
                    changed |= self._choice(choice)
        if changed:
            if self.drop_usage_chunk and "usage" in obj and obj["usage"] is None:
                del obj["usage"]
            return encode(orjson.dumps(obj))
        if self.drop_usage_chunk and "usage" in obj and obj["usage"] is None:
            edits = Edits(JsonDoc(event.data))
            edits.delete_member((), "usage")
            return encode(edits.apply())
        return event.raw

    def _choice(self, choice: dict[str, Any]) -> bool:
        # Every choice is guarded; the message is rebuilt from choice 0 only.
        ci = choice.get("index") or 0
        ci = ci if isinstance(ci, int) else -1  # still guarded, never the message
        primary = ci == 0
        self._saw_choice |= primary
        delta = choice.get("delta")
        changed = False
        if isinstance(delta, dict):
            if isinstance(delta.get("content"), str):
                if primary:
                    self._content.append(delta["content"])
                if delta["content"]:
                    self.first_token = True
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                kept = self._guard(ci, calls) if self.offered is not None else calls
                if kept is not calls:
                    changed = True
                    if kept:
                        delta["tool_calls"] = kept
                    else:
                        del delta["tool_calls"]
                for d in kept:
                    self._collect(d, primary)
        if self.offered is not None and choice.get("finish_reason") == "tool_calls" and self._next.get(ci, 0) == 0:
            choice["finish_reason"] = "stop"
            changed = True
        return changed

    def _guard(self, ci: int, calls: list[Any]) -> list[Any]:
        assert self.offered is not None
        out: list[Any] = []
        for d in calls:
            if not isinstance(d, dict):
                continue
            st = self._calls.setdefault((ci, int(d.get("index", 0) or 0)), _Call())
            fn = d.get("function")
            if st.name is None and isinstance(fn, dict) and fn.get("name"):
                st.name = str(fn["name"])
            if st.allowed is None:
                if st.name is None:
                    st.pending.append(d)
                    continue
                st.allowed = st.name in self.offered
                if not st.allowed:
                    self.blocked += 1
                    st.pending.clear()
                    continue
                st.index = self._next.get(ci, 0)
                self._next[ci] = st.index + 1
                merged = _merge_deltas([*st.pending, d])
                st.pending.clear()
                merged["index"] = st.index
                out.append(merged)
            elif st.allowed:
                out.append({**d, "index": st.index})
        return out

    def _collect(self, d: Any, primary: bool) -> None:
        if not isinstance(d, dict):
            return
        self.first_token = True
        if not primary:
            return
        call = self._tool_calls.setdefault(int(d.get("index", 0) or 0), {"args": []})
        if d.get("id"):
            call["id"] = d["id"]
        if d.get("type"):
            call["type"] = d["type"]
        fn = d.get("function")
        if isinstance(fn, dict):
            if fn.get("name"):
                call["name"] = fn["name"]
            if isinstance(fn.get("arguments"), str):
                call["args"].append(fn["arguments"])

    # -- not streamed ------------------------------------------------------------
    def complete(self, obj: Any) -> bool:
        """Process a whole response in place; True if it was changed."""
        if not isinstance(obj, dict):
            return False
        self.usage.feed(obj)
        changed = False
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return False
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            msg = choice.get("message")
            if not isinstance(msg, dict):
                continue
            calls = msg.get("tool_calls")
            if self.offered is not None and isinstance(calls, list) and calls:
                kept = [c for c in calls if _call_name(c) in self.offered]
                if len(kept) != len(calls):
                    self.blocked += len(calls) - len(kept)
                    changed = True
                    if kept:
                        msg["tool_calls"] = kept
                    else:
                        del msg["tool_calls"]
                        if choice.get("finish_reason") == "tool_calls":
                            choice["finish_reason"] = "stop"
            if choice.get("index", 0) == 0:
                self._saw_choice = True
                if isinstance(msg.get("content"), str):
                    self._content = [msg["content"]]
                for i, c in enumerate(msg.get("tool_calls") or ()):
                    if isinstance(c, dict):
                        fn = c.get("function") or {}
                        self._tool_calls[i] = {
                            "id": c.get("id"),
                            "type": c.get("type", "function"),
                            "name": fn.get("name"),
                            "args": [fn.get("arguments") or ""],
                        }
        return changed

    def message(self) -> dict[str, Any] | None:
        """The assistant message the client received (None if there was none)."""
        if not self._saw_choice:
            return None
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self._content) or None}
        if self._tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.get("id"),
                    "type": c.get("type", "function"),
                    "function": {"name": c.get("name"), "arguments": "".join(c["args"])},
                }
                for _, c in sorted(self._tool_calls.items())
            ]
        return msg


def _call_name(call: Any) -> str | None:
    if isinstance(call, dict):
        fn = call.get("function")
        if isinstance(fn, dict):
            return fn.get("name")
    return None
