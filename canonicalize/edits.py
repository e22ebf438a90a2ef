"""Edits of a request, as data, and the one place they are spliced into its bytes.

The pipeline decides *what* changes (a string a rule rewrote, a fork's system
messages from the parent's record, a member the proxy adds); :func:`render`
splices exactly that into the bytes the client sent.  Every byte outside the
edited values reaches the upstream as sent: numbers as written, key order,
duplicate keys, escapes, whitespace.  The body is never re-serialized whole.

    SetString(path, text)          a string value a rule changed (re-encoded: that string only)
    SetValue(path, raw)            a value replaced by recorded bytes (a fork's tools[])
    SetMember(obj, key, raw)       a member replaced, or added last (stream_options, id_slot)
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
class DeleteMember:
    obj: Path
    key: str


@dataclass(frozen=True, slots=True)
class SetItems:
    array: Path
    start: int
    stop: int
    items: tuple[bytes, ...]


Op = SetString | SetValue | SetMember | DeleteMember | SetItems


def render(doc: JsonDoc, ops: Sequence[Op]) -> bytes:
    """``doc``'s bytes with ``ops`` spliced in (in order: a later structural op
    supersedes earlier string edits inside the value it replaces).  Raises
    ``KeyError`` when a path is not in the document and
    :class:`canonicalize.jsonspan.EditConflict` when edits overlap: the caller
    fails open and forwards the body unchanged."""
    if not ops:
        return doc.raw
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
        else:
            edits.replace_items(op.array, op.start, op.stop, list(op.items))
    return edits.apply()


__all__ = ["DeleteMember", "Op", "SetItems", "SetMember", "SetString", "SetValue", "render"]
