"""Edits of a request, as data, and the one place they are spliced into its bytes.

The pipeline decides *what* changes (a string a rule rewrote, a fork's system
messages from the parent's record, a member the proxy adds); :func:`render`
splices exactly that into the bytes the client sent.  Every byte outside the
edited values reaches the upstream as sent: numbers as written, key order,
duplicate keys, escapes, whitespace.  The body is never re-serialized whole.

    SetString(path, text)          a string value a rule changed (re-encoded: that string only)
    SetValue(path, raw)            a value replaced by recorded bytes (a fork's tools[])
    SetMember(obj, key, raw)       a member replaced, or added last
    AddMember(key, raw)            a top-level member the request does not have, added last
                                   (stream_options): found from the body's end, no scan
    DeleteMember(obj, key)         a member removed (a param the fork's parent did not send)
    SetItems(array, start, stop, items)   a run of array items replaced (a fork's system messages)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from canonicalize.jsonspan import Edits, JsonDoc, Path, PathError


@dataclass(frozen=True, slots=True)
class SetString:
    path: Path
    text: str


@dataclass(frozen=True, slots=True)
class SetValue:
    path: Path
    raw: bytes


@dataclass(frozen=True, slots=True)
class SetMember:
    obj: Path
    key: str
    raw: bytes


@dataclass(frozen=True, slots=True)
class AddMember:
    key: str
    raw: bytes


@dataclass(frozen=True, slots=True)
class DeleteMember:
    obj: Path
    key: str


@dataclass(frozen=True, slots=True)
class SetItems:
    array: Path
    start: int
    stop: int
    items: tuple[bytes, ...]


Op = SetString | SetValue | SetMember | AddMember | DeleteMember | SetItems


def render(doc: JsonDoc, ops: Sequence[Op]) -> bytes:
    """``doc``'s bytes with ``ops`` spliced in (in order: a later structural op
    supersedes earlier string edits inside the value it replaces).  Raises
    ``KeyError`` when a path is not in the document and
    :class:`canonicalize.jsonspan.EditConflict` when edits overlap: the caller
    fails open and forwards the body unchanged."""
    if not ops:
        return doc.raw
    added = [op for op in ops if isinstance(op, AddMember)]
    rest = [op for op in ops if not isinstance(op, AddMember)] if added else ops
    if len(rest) == 1 and isinstance(rest[0], SetString | SetValue):
        out = _replace_one(doc, rest[0])  # most requests: one string a rule changed (and stream_options)
    else:
        out = _edit(doc, rest)
    return _append(out, added) if added else out


def _edit(doc: JsonDoc, ops: Sequence[Op]) -> bytes:
    """Any mix of edits, through one :class:`Edits` round (AddMember: appended by the caller)."""
    edits = Edits(doc)
    for op in ops:
        if isinstance(op, SetString):
            edits.replace(op.path, orjson.dumps(op.text))
        elif isinstance(op, SetValue):
            edits.replace(op.path, op.raw)
        elif isinstance(op, SetMember):
            edits.set_member(op.obj, op.key, op.raw)
        elif isinstance(op, DeleteMember):
            edits.delete_member(op.obj, op.key)
        elif isinstance(op, SetItems):
            edits.replace_items(op.array, op.start, op.stop, list(op.items))
    return edits.apply() if edits else doc.raw


def _replace_one(doc: JsonDoc, op: SetString | SetValue) -> bytes:
    """The one edit of most requests (a rule's string), spliced without an :class:`Edits` round."""
    span = doc.span(op.path)
    if span is None:
        raise PathError(op.path)
    data = orjson.dumps(op.text) if isinstance(op, SetString) else op.raw
    raw = memoryview(doc.raw)  # slices of a view: the unchanged bytes are copied once, by join
    return b"".join((raw[: span[0]], data, raw[span[1] :]))


def _append(raw: bytes, members: Sequence[AddMember]) -> bytes:
    """``members`` added before the closing brace of the top-level object."""
    end = len(raw.rstrip())
    if end == 0 or raw[end - 1] != 0x7D:
        raise ValueError("the body is not a JSON object")
    i = end - 2
    while i >= 0 and raw[i] in _SPACE:  # what bytes.rstrip() strips, without copying the body for it
        i -= 1
    sep = b"" if i >= 0 and raw[i] == 0x7B else b","
    added = b",".join(orjson.dumps(m.key) + b":" + m.raw for m in members)
    view = memoryview(raw)
    return b"".join((view[: end - 1], sep, added, view[end - 1 :]))


_SPACE = b" \t\n\r\x0b\x0c"


__all__ = ["AddMember", "DeleteMember", "Op", "SetItems", "SetMember", "SetString", "SetValue", "render"]
