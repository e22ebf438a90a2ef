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

from canonicalize.jsonspan import Edits, JsonDoc, Path


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
    edits = Edits(doc)
    added: list[AddMember] = []
    for op in ops:
        if isinstance(op, AddMember):
            added.append(op)
        elif isinstance(op, SetString):
            edits.replace(op.path, orjson.dumps(op.text))
        elif isinstance(op, SetValue):
            edits.replace(op.path, op.raw)
        elif isinstance(op, SetMember):
            edits.set_member(op.obj, op.key, op.raw)
        elif isinstance(op, DeleteMember):
            edits.delete_member(op.obj, op.key)
        else:
            edits.replace_items(op.array, op.start, op.stop, list(op.items))
    out = edits.apply() if edits else doc.raw
    return _append(out, added) if added else out


def _append(raw: bytes, members: Sequence[AddMember]) -> bytes:
    """``members`` added before the closing brace of the top-level object."""
    end = len(raw.rstrip())
    if end == 0 or raw[end - 1 : end] != b"}":
        raise ValueError("the body is not a JSON object")
    before = raw[: end - 1].rstrip()
    sep = b"" if before.endswith(b"{") else b","
    added = b",".join(orjson.dumps(m.key) + b":" + m.raw for m in members)
    return raw[: end - 1] + sep + added + raw[end - 1 :]


__all__ = ["AddMember", "DeleteMember", "Op", "SetItems", "SetMember", "SetString", "SetValue", "render"]
