"""Chat-completions responses, streamed or not: usage, the fork tool-call guard,
the reply message.

A pure state machine fed event by event.  For each upstream response it

- reads usage (counted once, see :mod:`canonicalize.usage`);
- for a fork, removes calls to tools the fork did not itself offer (below);
- drops the usage-only chunk prefixpin asked for when the client did not, and
  the ``"usage": null`` member that asking put in every other chunk (removed
  from the chunk's bytes; nothing else of the chunk changes);
- rebuilds the assistant message *as the client received it*, so the next turn,
  which replays it, extends the recorded chain.

An event nobody changed is forwarded as its original bytes.

The guard, and where a chat response carries a call
----------------------------------------------------
Every place a client reads a call from is guarded:

- ``choices[].message.tool_calls[]`` (not streamed): ``function.name``, and
  ``custom.name`` for ``type: "custom"`` calls; every name a call carries must
  be offered;
- ``choices[].message.function_call``: the legacy single call (before
  ``tool_calls``), which clients still run;
- streamed, ``choices[].delta.tool_calls[]`` and ``choices[].delta.function_call``.
  A client concatenates every string of a call's deltas, its name included
  (the openai SDK's ``accumulate_delta``), so a name may arrive in pieces
  ("memory", then "_purge_all") and only the whole name can be judged.  A
  call's events are therefore held, as received, until the call can no longer
  grow: the next call index starts in its choice, the choice's
  ``finish_reason`` arrives, ``[DONE]``, or the stream ends (:meth:`close`).
  Then they are released in their original order — byte for byte when nothing
  in them changes — or released without the call, counted once, when its whole
  name is not offered.  Every event after a held one waits behind it, so the
  client sees the upstream's order.  A name piece for a call already released
  is removed (the client keeps the name that was checked), and a delta whose
  ``index`` is not an integer, which clients place differently, is removed;
- ``choices[].message`` inside a streamed chunk (some servers repeat the whole
  message at the end): guarded as a whole response.

Kept calls are renumbered so the client's indexes stay dense, and a
``finish_reason`` of ``tool_calls`` / ``function_call`` becomes ``stop`` when no
call of its choice is left.  Nothing else in a chat response names a call the
client runs.

Under the guard an event is read as the most lenient client reads it
(:func:`canonicalize.sse.read`: NaN, a lone surrogate or invalid UTF-8 make
orjson refuse what the openai SDK accepts); one that no JSON reader takes is
forwarded as received, since no client reads a call from it.  A chunk with no
call and no ``finish_reason``, while nothing is held, goes the unguarded way:
one pass, its raw bytes.  Without a guard nothing is held and events are read
with orjson alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from canonicalize.jsonspan import Edits, JsonDoc
from canonicalize.sse import Event, dumps, encode, loads_or_none, payload
from canonicalize.usage import UsageAccumulator

_NAMED = ("function", "custom")  # where a tool call's name sits
_CALL_ENDS = ("tool_calls", "function_call")  # finish reasons that say "run the calls"
_UNPLACED = object()  # the key of deltas and choices whose index is not an integer


@dataclass(slots=True)
class _Call:
    """A streamed call: its name pieces, then the verdict on the whole name."""

    names: dict[str, list[str]] = field(default_factory=dict)  # "function" / "custom" / legacy -> pieces
    poisoned: bool = False  # something no offered name can be (a piece that is not a string)
    allowed: bool | None = None  # None: undecided, the name may still grow
    index: int = -1  # the client's index (a kept tool call)


@dataclass(slots=True)
class _Choice:
    calls: dict[Any, _Call] = field(default_factory=dict)  # upstream index -> call
    open: _Call | None = None  # the newest tool call: the only one whose name may still grow
    legacy: _Call | None = None  # delta.function_call
    next: int = 0  # the next client index
    kept: int = 0  # calls let through (tool calls and the legacy one)
    unplaced: bool = False  # its index is not an integer: clients place it differently, no call is offered


@dataclass(slots=True)
class _Held:
    event: Event
    obj: Any  # the parsed payload; None: forwarded as its raw bytes
    strict: bool  # orjson read it
    changed: bool  # changed on arrival
    waits: list[_Call]  # the calls whose verdict it waits for


class ChatReply:
    """OpenAI chat completions: one instance per response."""

    def __init__(self, *, offered: frozenset[str] | None = None, drop_usage_chunk: bool = False) -> None:
        self.offered = offered
        self.drop_usage_chunk = drop_usage_chunk
        self.usage = UsageAccumulator()
        self.blocked = 0
        self.first_token = False  # a content/tool delta came from the upstream
        self.ended = False
        self._choices: dict[Any, _Choice] = {}  # guard state per choice (``n`` > 1 streams several)
        self._held: list[_Held] = []  # events waiting for a verdict, in order
        self._content: list[str] = []
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self._saw_choice = False

    # -- streamed --------------------------------------------------------------
    def feed(self, event: Event) -> bytes | None:
        """Bytes to forward for ``event`` (its own raw bytes if unchanged, with any held
        events it releases before it), or None: nothing to forward now."""
        if self.offered is not None:
            return self._guarded(event)
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
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict):
                    self._read(choice)
        if self.drop_usage_chunk and "usage" in obj and obj["usage"] is None:
            return _without_usage(event, obj, True, False)
        return event.raw

    def close(self, tail: bytes) -> bytes:
        """The stream ended; ``tail``: the bytes the splitter still held (an unterminated
        event, or nothing).  The bytes still to forward: the tail, guarded like any
        event, after the held events, whose calls are decided now."""
        out = self.feed(Event.parse(tail)) if tail else None
        if self.offered is None:
            return out or b""
        self._decide_all()
        return (out or b"") + (self._drain() or b"")

    def _read(self, choice: dict[str, Any]) -> None:
        """A choice nothing changes: the message as received; the first token."""
        primary = (choice.get("index") or 0) == 0
        self._saw_choice |= primary
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if isinstance(content, str):
                if primary:
                    self._content.append(content)
                if content:
                    self.first_token = True
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for d in calls:
                    self._collect(d, primary)

    # -- streamed, guarded: on arrival --------------------------------------------
    def _guarded(self, event: Event) -> bytes | None:
        data = event.data
        if data is None:
            return self._queue(_Held(event, None, True, False, []))
        if data.strip() == b"[DONE]":
            self.ended = True
            self._decide_all()
            return self._queue(_Held(event, None, True, False, []))
        obj, strict = payload(data, lenient=True)  # as the most lenient client reads it
        if not isinstance(obj, dict):
            return self._queue(_Held(event, None, True, False, []))
        self.usage.feed(obj)
        choices = obj.get("choices")
        if self.drop_usage_chunk and choices == [] and obj.get("usage") is not None:
            return None
        if isinstance(choices, list):
            if not self._held and all(_plain(c) for c in choices):
                # Most chunks: text, nothing held, no call, no finish: as unguarded.
                for choice in choices:
                    self._read(choice)
                if self.drop_usage_chunk and "usage" in obj and obj["usage"] is None:
                    return _without_usage(event, obj, strict, False)
                return event.raw
            held = _Held(event, obj, strict, False, [])
            for choice in choices:
                if isinstance(choice, dict):
                    held.changed |= self._arrive(choice, held.waits)
            return self._queue(held)
        return self._queue(_Held(event, obj, strict, False, []))

    def _arrive(self, choice: dict[str, Any], waits: list[_Call]) -> bool:
        """Record a choice's calls and name pieces; decide the calls that ended.  True
        if the choice was changed (a late name piece, a whole message, finish_reason)."""
        assert self.offered is not None
        key = _choice_key(choice)
        st = self._choices.get(key)
        if st is None:
            st = self._choices[key] = _Choice(unplaced=key is _UNPLACED)
        changed = False
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if delta.get("content"):
                self.first_token = True
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for d in calls:
                    if isinstance(d, dict):
                        changed |= self._arrive_call(st, d, waits)
            if isinstance(delta.get("function_call"), dict):
                if st.legacy is None:
                    st.legacy = _Call(poisoned=st.unplaced)
                self.first_token = True
                changed |= self._pieces(st.legacy, delta, ("function_call",))
                if st.legacy.allowed is None:
                    waits.append(st.legacy)
        message = choice.get("message")
        if isinstance(message, dict):
            whole, kept = self._filter(choice, message)
            changed |= whole
            st.kept += kept
        if choice.get("finish_reason") is not None:
            self._decide_choice(st)
            if choice["finish_reason"] in _CALL_ENDS and st.kept == 0:
                choice["finish_reason"] = "stop"
                changed = True
        return changed

    def _arrive_call(self, st: _Choice, d: dict[str, Any], waits: list[_Call]) -> bool:
        self.first_token = True
        key = _key(d)
        call = st.calls.get(key)
        if call is None:  # a new call: the one before it can no longer grow
            if st.open is not None:
                self._decide(st, st.open, tool=True)
            call = st.calls[key] = st.open = _Call(poisoned=key is _UNPLACED or st.unplaced)
        changed = self._pieces(call, d, _NAMED)
        if call.allowed is None:
            waits.append(call)
        return changed

    def _pieces(self, call: _Call, holder: dict[str, Any], kinds: tuple[str, ...]) -> bool:
        """Add the name pieces in ``holder`` to ``call``; remove one that comes after the
        verdict (True: ``holder`` changed)."""
        changed = False
        for kind in kinds:
            part = holder.get(kind)
            if part is None:
                continue
            if not isinstance(part, dict):
                call.poisoned |= call.allowed is None
                continue
            piece = part.get("name")
            if piece is None:
                continue
            if call.allowed is None:
                if isinstance(piece, str):
                    call.names.setdefault(kind, []).append(piece)
                else:
                    call.poisoned = True
            elif call.allowed:
                del part["name"]
                changed = True
        return changed

    def _decide(self, st: _Choice, call: _Call, *, tool: bool) -> None:
        if call.allowed is not None:
            return
        assert self.offered is not None
        offered = self.offered
        whole = ["".join(pieces) for pieces in call.names.values()]
        call.allowed = bool(whole) and not call.poisoned and all(name in offered for name in whole)
        if not call.allowed:
            self.blocked += 1
            return
        st.kept += 1
        if tool:
            call.index = st.next
            st.next += 1

    def _decide_choice(self, st: _Choice) -> None:
        for call in st.calls.values():
            self._decide(st, call, tool=True)
        if st.legacy is not None:
            self._decide(st, st.legacy, tool=False)

    def _decide_all(self) -> None:
        for st in self._choices.values():
            self._decide_choice(st)

    # -- streamed, guarded: on release ------------------------------------------------
    def _queue(self, held: _Held) -> bytes | None:
        if not self._held and all(c.allowed is not None for c in held.waits):
            return self._release(held)  # nothing waits: out at once
        self._held.append(held)
        return self._drain()

    def _drain(self) -> bytes | None:
        """Release the held events whose calls are all decided, from the first on."""
        held = self._held
        n = 0
        while n < len(held) and all(c.allowed is not None for c in held[n].waits):
            n += 1
        if not n:
            return None
        out = [self._release(h) for h in held[:n]]
        del held[:n]
        return b"".join(b for b in out if b is not None) or None

    def _release(self, held: _Held) -> bytes | None:
        obj = held.obj
        if obj is None:
            return held.event.raw
        changed = held.changed
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict):
                    changed |= self._apply(choice)
        if self.drop_usage_chunk and "usage" in obj and obj["usage"] is None:
            return _without_usage(held.event, obj, held.strict, changed)
        return encode(dumps(obj, held.strict)) if changed else held.event.raw

    def _apply(self, choice: dict[str, Any]) -> bool:
        """Apply the verdicts to a choice's deltas (blocked calls out, kept ones at their
        client index); the message as the client receives it.  True if changed."""
        st = self._choices[_choice_key(choice)]
        primary = (choice.get("index") or 0) == 0
        self._saw_choice |= primary
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return False
        changed = False
        if primary and isinstance(delta.get("content"), str):
            self._content.append(delta["content"])
        calls = delta.get("tool_calls")
        if calls is not None:
            kept = []
            for d in calls if isinstance(calls, list) else ():
                call = st.calls[_key(d)] if isinstance(d, dict) else None
                if call is None or not call.allowed:
                    continue
                if (d.get("index") or 0) != call.index:
                    d["index"] = call.index
                    changed = True
                kept.append(d)
            if not isinstance(calls, list) or len(kept) != len(calls):
                changed = True
                if kept:
                    delta["tool_calls"] = kept
                else:
                    del delta["tool_calls"]
            for d in kept:
                self._collect(d, primary)
        if delta.get("function_call") is not None and not (
            isinstance(delta["function_call"], dict) and st.legacy is not None and st.legacy.allowed
        ):
            del delta["function_call"]
            changed = True
        return changed

    def _collect(self, d: Any, primary: bool) -> None:
        if not isinstance(d, dict):
            return
        self.first_token = True
        if not primary:
            return
        index = d.get("index", 0) or 0
        call = self._tool_calls.setdefault(index if isinstance(index, int) else -1, {"args": []})
        if d.get("id"):
            call["id"] = d["id"]
        if d.get("type"):
            call["type"] = d["type"]
        fn = d.get("function")
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str):
                call["name"] = call.get("name", "") + fn["name"]  # clients join a name's pieces
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
            if self.offered is not None:
                changed |= self._filter(choice, msg)[0]
            if choice.get("index", 0) == 0:
                self._saw_choice = True
                if isinstance(msg.get("content"), str):
                    self._content = [msg["content"]]
                calls = msg.get("tool_calls")
                for i, c in enumerate(calls if isinstance(calls, list) else ()):
                    if isinstance(c, dict):
                        fn = c.get("function")
                        fn = fn if isinstance(fn, dict) else {}
                        self._tool_calls[i] = {
                            "id": c.get("id"),
                            "type": c.get("type", "function"),
                            "name": fn.get("name"),
                            "args": [fn.get("arguments") or ""],
                        }
        return changed

    def _filter(self, choice: dict[str, Any], msg: dict[str, Any]) -> tuple[bool, int]:
        """Remove a whole message's calls to tools not offered (``tool_calls``, the legacy
        ``function_call``): whether it changed, and how many calls it kept."""
        assert self.offered is not None
        offered = self.offered
        changed = False
        kept_n = 0
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            kept = [c for c in calls if _whole_name_offered(c, offered)]
            kept_n += len(kept)
            if len(kept) != len(calls):
                self.blocked += len(calls) - len(kept)
                changed = True
                if kept:
                    msg["tool_calls"] = kept
                else:
                    del msg["tool_calls"]
        elif calls is not None:  # no client reads calls from anything else
            del msg["tool_calls"]
            self.blocked += 1
            changed = True
        fc = msg.get("function_call")
        if fc is not None:
            if isinstance(fc, dict) and isinstance(fc.get("name"), str) and fc["name"] in offered:
                kept_n += 1
            else:
                del msg["function_call"]
                self.blocked += 1
                changed = True
        if changed and not kept_n and choice.get("finish_reason") in _CALL_ENDS:
            choice["finish_reason"] = "stop"
        return changed, kept_n

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


def _without_usage(event: Event, obj: dict[str, Any], strict: bool, changed: bool) -> bytes:
    """A chunk without the ``"usage": null`` asking for usage put in it: cut from its
    bytes (nothing else of it changes), or re-encoded if it changed anyway."""
    if changed or not strict:
        del obj["usage"]
        return encode(dumps(obj, strict))
    edits = Edits(JsonDoc(event.data or b""))
    edits.delete_member((), "usage")
    return encode(edits.apply())


def _plain(choice: Any) -> bool:
    """A choice with no call, no whole message and no finish_reason: nothing to guard."""
    if not isinstance(choice, dict) or choice.get("finish_reason") is not None or "message" in choice:
        return False
    delta = choice.get("delta")
    return not isinstance(delta, dict) or ("tool_calls" not in delta and "function_call" not in delta)


def _choice_key(choice: dict[str, Any]) -> Any:
    """A choice's index (missing or null: 0), or one key for every index that is not an integer."""
    index = choice.get("index") or 0
    return index if isinstance(index, int) else _UNPLACED


def _key(d: dict[str, Any]) -> Any:
    """A delta's call: its index (missing or null: 0, as before), or one key for every
    index that is not an integer (clients place those differently: never offered)."""
    index = d.get("index")
    if index is None:
        return 0
    return index if isinstance(index, int) else _UNPLACED


def _whole_name_offered(call: Any, offered: frozenset[str]) -> bool:
    """Every name a whole call carries (``function.name``, ``custom.name``) is offered,
    and it carries one."""
    if not isinstance(call, dict):
        return False
    found = False
    for kind in _NAMED:
        part = call.get(kind)
        if part is None:
            continue
        if not (isinstance(part, dict) and isinstance(part.get("name"), str) and part["name"] in offered):
            return False
        found = True
    return found
