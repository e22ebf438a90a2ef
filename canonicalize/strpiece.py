"""A changed item parsed as its previous parse with its last member, a long string, replaced.

An agent's next system prompt is, as a rule, its previous one with a line changed
(a minute, a memory counter): the message's bytes are the previous ones but inside
its last member's string (``{"role":"system","content":"…"}``).  :func:`replaced`
parses only that string, with ``orjson``, and takes every other member from the
previous parse; and it knows where the string is in the new bytes, which the
request's edits would otherwise look for in a 10-50 KB item.

Why that is the parse.  The old item's bytes are its compact serialization
(``orjson.dumps``, which :meth:`canonicalize.pieces.Kept.layout` proved): its
members in order, no duplicate keys, the last member's literal right before the
closing ``}``.  When the new bytes start with the old ones up to that literal's
opening quote, end with a quote and ``}``, and the bytes from the opening quote to
the last quote parse alone as one JSON string (so no unescaped quote ends the
literal early: ``orjson`` refuses anything after a string's closing quote), the new
item is the same members before it, the same key, that string and the end of the
object: the old parse with that one value replaced.  Anything else (another spacing,
a changed key or member, a member after the string, a value that is not a string)
gives None, and the item is parsed whole; so does an item whose last string is
short, or with a long string before its last member (it would be serialized again only to learn where the last
starts).

The string is parsed, not made from the old value's characters: by the next turn
the old value and bytes have left the CPU's caches, where the new bytes were just
read.  Where the two strings differ is found only when the analysis needs it, for a
system text the memo of texts does not hold (:func:`alike`): from the two literals'
bytes, compared without copying, and the characters of the lines around the change
counted (:func:`canonicalize.scan.rescan` would otherwise compare the two texts,
copying them).
"""

from __future__ import annotations

from typing import Any

import orjson

BIG = 2048  # an item's bytes below this: parsed whole (as cheap as the checks)
SHORT = 256  # characters of a string member before the last one, at most (a role, a type, a name);
# the last one is longer
_PROBE = 256  # bytes compared at once first when looking for where two literals differ
_BACKSLASH = 0x5C

# The new item, the member replaced, and where its literal (quotes included) is in the new bytes.
Replaced = tuple[dict[str, Any], str, tuple[int, int]]


def replaced(item: Any, old: bytes, a0: int, a1: int, raw: bytes, b0: int, b1: int) -> Replaced | None:
    """``raw[b0:b1]``'s parse as ``item`` (whose compact serialization is ``old[a0:a1]``)
    with its last member's string replaced (module docstring): the new item (a new
    dict), the member's key, and the span of its literal in ``raw``; None when it is
    not that."""
    if type(item) is not dict or not item:
        return None
    *before, (key, value) = item.items()
    if type(value) is not str or len(value) <= SHORT:
        return None  # (its last member is not the long string: nothing before it is serialized again)
    if any(type(v) is str and len(v) > SHORT for _, v in before):
        return None  # (a long member before it: another shape, not serialized again to learn so)
    # The literal's opening quote: after '{', each member before it and its ',', the key and ':'.
    quote = a0 + 1 + sum(len(orjson.dumps(k)) + len(orjson.dumps(v)) + 2 for k, v in before)
    quote += len(orjson.dumps(key)) + 1
    head = quote + 1 - a0  # the bytes the two items start alike with, through the quote
    if b1 - b0 < head + 2 or raw[b1 - 2 : b1] != b'"}' or not raw.startswith(memoryview(old)[a0 : a0 + head], b0):
        return None
    start, end = b0 + head - 1, b1 - 1
    try:
        text = orjson.loads(memoryview(raw)[start:end])
    except orjson.JSONDecodeError:
        return None
    if type(text) is not str:
        return None  # (never: the bytes open with a quote)
    new = dict(item)
    new[key] = text
    return new, key, (start, end)


def alike(value: str, old: bytes, first: int, close: int, raw: bytes, start: int, end: int) -> tuple[int, int] | None:
    """How many characters ``value`` (whose canonical literal's content is
    ``old[first:close]``) and the string whose literal's content is ``raw[start:end]``
    are known to start and to end with alike, at line boundaries (at most as many as
    they do): what :func:`canonicalize.scan.rescan` would otherwise compare the two
    texts for, read from their bytes; None when one holds the other whole.

    The bytes alike are widened to whole lines: from just after a ``\\n`` escape (or
    the literal's start) and to the start of one (or its end), so both cuts fall
    between two whole escapes or characters of the old literal.  The new literal
    reads its first part as the old one does (the same bytes from the same place);
    its second part too when the backslashes right before it pair up in the new
    bytes (so the escape there starts as it did).  The characters of the shorter
    old part are counted, the other's from the value's length and the changed
    lines' characters, read.  None also when most lines changed, or the second part
    is not read as it was."""
    n = min(close - first, end - start)
    p = _prefix(old, first, raw, start, n)
    if p == n:
        return None  # equal, or one the other's start
    s = _suffix(old, close, raw, end, n - p)
    cut = _line_start(old, first, first + p)
    stop = _line_end(old, first, close - s, close)
    if 2 * (stop - cut) > close - first or not _even_before(raw, end - (close - stop), start + (cut - first)):
        return None  # most of it changed, or the second part not read as it was: compared whole
    try:
        was = _chars(old, cut, stop)
    except orjson.JSONDecodeError:
        return None  # (never: the cuts are between whole escapes of a canonical literal)
    if close - stop <= cut - first:  # the shorter of the two old parts is counted
        kept_end = _count(old, stop, close)
        kept_start = len(value) - kept_end - len(was)
    else:
        kept_start = _count(old, first, cut)
        kept_end = len(value) - kept_start - len(was)
    if kept_start < 0 or kept_end < 0:
        return None  # (never: the counts are the old literal's)
    return kept_start, kept_end


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


__all__ = ["BIG", "Replaced", "alike", "replaced"]
