"""A changed item parsed as its previous parse with one string member's lines replaced.

An agent's next system prompt is, as a rule, its previous one with a line changed
(a minute, a memory counter), and parsing the 10-50 KB message again is most of
what parsing such a body by pieces costs: ``orjson.loads`` builds the whole string
anew (~9 µs for 13 KB).  :func:`edited` builds it from the previous value instead:
where the old item's bytes are its compact serialization (``orjson.dumps``, which
:meth:`canonicalize.pieces.Kept.layout` proved) and the new item's bytes differ
from them only inside one string member, the new value is the old one with the
lines that differ replaced by the new bytes' lines, parsed on their own.

Why that is the parse.  In the old bytes the member's literal is the canonical
escape of its value: a backslash always starts an escape, and every newline of
the value is the escape ``\\n``.  The changed bytes are widened to whole lines:
from just after a ``\\n`` escape (or the literal's first byte) to the start of one
(or its closing quote), so both cuts fall between two whole escapes or characters
of the old literal.  The new literal is the old one's bytes up to the first cut,
the new bytes between, the old ones from the second: the first part reads as it
did (the same bytes from the same place), the new bytes must parse on their own
as a string's content (so no unescaped quote ends the literal early), and the
backslashes right before the second cut must pair up in the new bytes (so the
escape or quote there starts as it did, and the rest reads as it did, to the same
closing quote and the same members after it).  The value is then the old value's
characters up to the first cut, the new piece, and the old characters from the
second; the old piece is checked to be where the counts put it.  Anything else
(another spacing, a changed key, a change outside one string, most of the text
changed) gives None, and the item is parsed whole.
"""

from __future__ import annotations

from typing import Any

import orjson

BIG = 2048  # a string's bytes below this: its item is parsed whole (as cheap as the checks)
_PROBE = 256  # bytes compared at once first when looking for where two items differ
_BACKSLASH = 0x5C

# The new item, the member, the characters of the old value's start and end it kept,
# and where the member's value (its literal, quotes included) is in the new bytes.
Edited = tuple[dict[str, Any], str, int, int, tuple[int, int]]


def edited(item: Any, old: bytes, a0: int, a1: int, raw: bytes, b0: int, b1: int) -> Edited | None:
    """``raw[b0:b1]``'s parse as ``item`` (whose compact serialization is ``old[a0:a1]``)
    with one string member's lines replaced (module docstring): the new item (a new
    dict), the member's key, how many characters of the old value's start and end the
    new one keeps, and the span of the member's value in ``raw``; None when it is not
    that."""
    if type(item) is not dict:
        return None
    n = min(a1 - a0, b1 - b0)
    p = _prefix(old, a0, raw, b0, n)
    if p == n:
        return None  # equal, or one the other's start: no change inside a string
    s = _suffix(old, a1, raw, b1, n - p)
    found = _member(item, old, a0, a1, a0 + p, a1 - s)
    if found is None:
        return None
    key, first, close = found  # the literal's first content byte, and its closing quote, in ``old``
    value: str = item[key]
    cut = _line_start(old, first, a0 + p)
    end = _line_end(old, first, a1 - s, close)
    if 2 * (end - cut) > close - first:
        return None  # most of it changed: parsed whole
    new_cut, new_end = cut - a0 + b0, end - a1 + b1  # the same places in the new bytes
    if not _even_before(raw, new_end, new_cut):
        return None  # the escape or quote at the second cut does not start there in the new bytes
    try:
        piece = orjson.loads(b"".join((b'"', raw[new_cut:new_end], b'"')))
        was = _chars(old, cut, end)
        if close - end <= cut - first:  # the shorter of the two old parts is counted
            kept_end = _count(old, end, close)
            kept_start = len(value) - kept_end - len(was)
        else:
            kept_start = _count(old, first, cut)
            kept_end = len(value) - kept_start - len(was)
    except orjson.JSONDecodeError:
        return None
    if kept_start < 0 or kept_end < 0 or value[kept_start : len(value) - kept_end] != was:
        return None  # (never: the counts are the old literal's)
    new = dict(item)
    text = value[:kept_start]  # (appended to in place: the kept start is copied once)
    text += piece
    text += value[len(value) - kept_end :]
    new[key] = text
    return new, key, kept_start, kept_end, (first - 1 - a0 + b0, close + 1 - a1 + b1)


def _member(item: dict[str, Any], old: bytes, a0: int, a1: int, lo: int, hi: int) -> tuple[str, int, int] | None:
    """The string member of ``item`` (serialized compactly as ``old[a0:a1]``) whose
    literal's content and closing quote hold ``old[lo:hi]``, where nothing else
    differs: its key, its first content byte and its closing quote; None: another
    member, or a short one."""
    pos = a0 + 1  # after '{'
    last = len(item) - 1
    for i, (key, value) in enumerate(item.items()):
        start = pos + len(orjson.dumps(key)) + 1  # the literal's opening quote (after the key and ':')
        if start > lo:
            return None  # the change starts before this member's value
        stop = a1 - 1 if i == last else start + len(orjson.dumps(value))  # after the literal
        if lo < stop:
            if type(value) is not str or stop - start < BIG or hi > stop - 1 or lo <= start:
                return None
            return key, start + 1, stop - 1
        pos = stop + 1  # after ','
    return None


def _line_start(buf: bytes, lo: int, at: int) -> int:
    """Just after the last ``\\n`` escape in ``buf[lo:at]``, else ``lo``."""
    i = buf.rfind(b"\\n", lo, at)
    while i >= 0 and not _even_before(buf, i, lo):
        i = buf.rfind(b"\\n", lo, i)
    return i + 2 if i >= 0 else lo


def _line_end(buf: bytes, lo: int, at: int, hi: int) -> int:
    """Where the first ``\\n`` escape at or after ``at`` starts, before ``hi`` (the
    closing quote), else ``hi`` (the literal's content starts at ``lo``)."""
    i = buf.find(b"\\n", at, hi)
    while i >= 0 and not _even_before(buf, i, lo):
        i = buf.find(b"\\n", i + 1, hi)
    return i if i >= 0 else hi


def _even_before(buf: bytes, i: int, lo: int) -> bool:
    """Whether the run of backslashes right before ``buf[i]`` (from ``lo`` on) is even:
    then ``buf[i]`` stands for itself (a backslash there starts an escape, a quote
    ends the literal)."""
    j = i
    while j > lo and buf[j - 1] == _BACKSLASH:
        j -= 1
    return (i - j) % 2 == 0


def _chars(buf: bytes, start: int, end: int) -> str:
    """``buf[start:end]``, whole escapes and characters of a canonical (orjson-written)
    string literal, read.  (Not for the new bytes: read without orjson, a raw control
    character or an unescaped quote there would pass.)"""
    piece = buf[start:end]
    if b"\\" not in piece:
        return piece.decode("utf-8")
    value: str = orjson.loads(b"".join((b'"', piece, b'"')))
    return value


def _count(buf: bytes, start: int, end: int) -> int:
    """How many characters ``buf[start:end]`` (as :func:`_chars` takes it) reads as,
    without reading them when it is ASCII with no ``\\u`` in it: a byte each, but for
    each escape's backslash (a run of backslashes in a canonical literal is escaped
    backslashes, and one escape more when it is odd: half of it, rounded up, is what
    ``count`` of one backslash less ``count`` of two gives)."""
    piece = buf[start:end]
    if piece.isascii() and b"\\u" not in piece:
        return len(piece) - piece.count(b"\\") + piece.count(b"\\\\")
    return len(_chars(buf, start, end))


def _prefix(x: bytes, xs: int, y: bytes, ys: int, most: int) -> int:
    """How many bytes ``x[xs:]`` and ``y[ys:]`` start with alike, ``most`` at most: all
    but the last ``_PROBE`` compared at once first (a prompt changes near its end as
    often as not), else halving down to ``_PROBE`` bytes (views of ``x``: nothing
    copied), then the first differing byte of those read from the two as integers.
    (:mod:`canonicalize.scan` compares two ``str`` the same way, halving to the end:
    a ``str`` has neither views nor an integer reading.)"""
    view = memoryview(x)
    lo, hi = 0, most  # x[xs:xs+lo] == y[ys:ys+lo]; the first difference is before hi
    if most > _PROBE and y.startswith(view[xs : xs + most - _PROBE], ys):
        lo = most - _PROBE
    while hi - lo > _PROBE:
        mid = (lo + hi) // 2
        if y.startswith(view[xs + lo : xs + mid], ys + lo):
            lo = mid
        else:
            hi = mid
    differ = int.from_bytes(x[xs + lo : xs + hi], "big") ^ int.from_bytes(y[ys + lo : ys + hi], "big")
    # (the first byte is the most significant: the first difference is the highest set bit's byte)
    return hi if not differ else hi - 1 - (differ.bit_length() - 1) // 8


def _suffix(x: bytes, xe: int, y: bytes, ye: int, most: int) -> int:
    """How many bytes ``x[:xe]`` and ``y[:ye]`` end with alike, ``most`` at most: the
    last ``_PROBE`` compared first, then twice as many each time, then halving down
    to ``_PROBE`` bytes, then the last differing byte of those read as integers."""
    view = memoryview(x)
    lo, step = 0, _PROBE
    while lo < most and y.endswith(view[xe - min(lo + step, most) : xe - lo], 0, ye - lo):
        lo, step = min(lo + step, most), step * 2
    if lo >= most:
        return most
    hi = min(lo + step, most)  # not alike at hi
    while hi - lo > _PROBE:
        mid = (lo + hi) // 2
        if y.endswith(view[xe - mid : xe - lo], 0, ye - lo):
            lo = mid
        else:
            hi = mid
    differ = int.from_bytes(x[xe - hi : xe - lo], "big") ^ int.from_bytes(y[ye - hi : ye - lo], "big")
    # (the last byte is the least significant: the bytes alike at the end are the lowest zero bytes)
    return lo + ((differ & -differ).bit_length() - 1) // 8 if differ else hi


__all__ = ["BIG", "Edited", "edited"]
