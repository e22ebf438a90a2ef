"""A body parsed as pieces of another: the remembered body (:class:`Kept`) and
:func:`reuse`, which parses a new body as its items wherever the bytes are equal.

How, and why the result is the whole parse's, is :mod:`canonicalize.bodies`'
docstring; which remembered body is tried is the memo's business, this module only
proves and splices.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import islice, takewhile
from operator import is_
from typing import Any

import orjson

from canonicalize.jsonspan import JsonDoc, Path, has_line_break
from canonicalize.strpiece import BIG, replaced

# The roles of the items no request writes to (it writes system texts and date notes
# on user messages): the only items shared between requests; every other is copied.
SHARED = frozenset({"assistant", "tool"})

Span = tuple[int, int]
# Kept.strings: by path, a string parsed alone in place of the base's
# (canonicalize.strpiece): the base's value, its literal's content in the base's
# bytes, and the new literal's content in this body's.
Strings = dict[Path, tuple[str, int, int, int, int]]
_WS = b" \t\n\r"  # JSON's whitespace
_ENDS = 32  # at most this many last bytes compared before a body's layout is found (it costs a serialization)


class Kept:
    """One remembered body: its bytes, its parse (kept, never handed out), the layout
    of its item array, found on first use (``layout``), and what the pipeline found
    of it (``hist``)."""

    __slots__ = (
        "base",
        "close",
        "continues",
        "doc",
        "head",
        "hist",
        "items",
        "key",
        "marks",
        "open",
        "raw",
        "scope",
        "spans",
        "strings",
        "system",
        "tail",
        "top",
        "writable",
    )

    def __init__(self, raw: bytes, top: dict[str, Any], key: str, doc: JsonDoc) -> None:
        self.raw = raw
        self.top = top
        self.key = key
        self.items: list[Any] = top[key]
        self.doc = doc  # the request's: spans it located while served carry over
        self.spans: list[Span] | None = None  # None: not yet known; [] and open < 0: unusable
        self.open = -1  # offset of the array's '['
        self.close = -1  # offset of its ']'
        self.head = b""  # raw[: open + 1]
        self.tail = b""  # raw[close:]
        # The body this one was parsed from (its items reused are the same objects), until
        # the pipeline took what it needs of it; and what the pipeline found of this one:
        # where its history starts in ``items``, the history's links and sizes.
        self.base: Kept | None = None
        self.continues = False  # it took its base's place: its conversation's next body (bodies)
        self.writable: list[int] = []  # the indices of the items a request gets copies of
        self.hist: tuple[int, tuple[bytes, ...], tuple[int, ...]] | None = None
        self.system: tuple[str, ...] = ()  # its system texts as the memo of texts keeps them (analysis)
        self.strings: Strings = {}  # until the analysis read them
        self.scope = ""  # the tenant whose memo holds it
        self.marks: list[tuple[str, int, int]] = []  # what finds it there (canonicalize.bodies.lead)

    def layout(self) -> bool:
        """Find and prove the item spans (once); False when this body cannot be reused."""
        if self.spans is not None:
            return self.open >= 0
        self.spans = []
        raw, items = self.raw, self.items
        member = opening(self.key)
        at = raw.find(member)
        if at < 0:
            return False
        start = at + len(member) - 1
        spans: list[Span] = []
        pos = start + 1
        try:
            for n, item in enumerate(items):
                if n:
                    if raw[pos : pos + 1] != b",":
                        return False
                    pos += 1
                form = orjson.dumps(item)
                if not raw.startswith(form, pos):
                    return False
                spans.append((pos, pos + len(form)))
                pos += len(form)
            if raw[pos : pos + 1] != b"]":
                return False
        except TypeError:
            return False
        if not (self.doc.member_start(self.key) == start or self._probe(start, pos)):
            return False
        self.spans, self.open, self.close = spans, start, pos
        self.head, self.tail = raw[: start + 1], raw[pos:]
        return True

    def _probe(self, start: int, close: int) -> bool:
        """The array at ``start`` is the member the parse kept (not an earlier duplicate,
        not a look-alike inside a string): with it replaced by 0, the rest parses to the
        same members and the key to that 0.  (What :meth:`JsonDoc.member_start` cannot
        prove: a spelling of the key in a later string.)"""
        try:
            probe = orjson.loads(self.raw[:start] + b"0" + self.raw[close + 1 :])
        except orjson.JSONDecodeError:
            return False
        if not isinstance(probe, dict) or type(probe.get(self.key)) is not int or probe[self.key] != 0:
            return False
        probe[self.key] = self.items
        return probe == self.top


def opening(key: str) -> bytes:
    """``"key":[``, the bytes that open item array ``key`` in a compact body."""
    found = _OPENINGS.get(key)
    return found if found is not None else b'"' + key.encode() + b'":['


_OPENINGS = {key: b'"' + key.encode() + b'":[' for key in ("messages", "input")}  # the wire APIs' item arrays


def shared_prefix(body: Kept, start: int, base: Kept, base_start: int, most: int) -> int:
    """How many items from ``start`` on are ``base``'s from ``base_start`` on, the same
    objects (reused from it), ``most`` at most."""
    new, old = body.items, base.items
    most = min(most, len(new) - start, len(old) - base_start)
    pairs = map(is_, islice(new, start, start + most), islice(old, base_start, base_start + most))
    return len(list(takewhile(bool, pairs)))


Assembled = tuple[dict[str, Any], JsonDoc, tuple[int, list[Span]] | None, list[int], Strings]


def reuse(old: Kept, raw: bytes, key: str) -> Assembled | None:
    """``raw``'s parse, doc, layout (its close and item spans, when all are known),
    the items a request gets copies of and the strings parsed alone in place of
    ``old``'s, as ``old``'s items where the bytes are equal; or None."""
    if old.key != key:
        return None
    if old.spans is None and not (_same_end(old.raw, raw) and old.layout()):
        return None  # (a body with other params refused before its layout is found: it costs a serialization)
    if old.open < 0:
        return None
    head, tail = old.head, old.tail
    if len(raw) < len(head) + len(tail) or not raw.startswith(head) or not raw.endswith(tail):
        return None
    close = len(raw) - len(tail)  # the new ']'
    return _assemble(old, raw, _runs(old, raw, close), close)


Run = tuple[int, int, int]  # a run of old items reused: its first item, its start in the new body, its count


def _runs(old: Kept, raw: bytes, close: int) -> list[Run]:
    """The runs of ``old``'s items ``raw``'s array has as they were, in order: those
    it starts with, those it ends with, and one more in the middle (after the first
    changed item); none: another conversation's body (its head and tail still reused)."""
    spans = old.spans
    assert spans is not None
    n = len(spans)
    src = memoryview(old.raw)
    lo = len(old.head)  # where the items start, in both

    def starts(k: int) -> bool:  # the first k old items start the new array, at the same offsets
        return k == 0 or raw.startswith(src[lo : spans[k - 1][1]], lo)

    if not n or not starts(1):
        k = 0
    elif raw.startswith(src[spans[-1][0] : spans[-1][1]], spans[-1][0]) and starts(n):
        k = n  # (the last item checked alone first: where a retry differs, one compare of it)
    else:
        k = _largest(n - 1, starts)
    at = spans[k - 1][1] if k else lo  # the end of that run, in both

    def ends(m: int) -> bool:  # the last m old items end it (after the first run and a comma)
        if m == 0:
            return True
        s = spans[n - m][0]
        return close - (old.close - s) >= at + (1 if k else 0) and raw.endswith(src[s : old.close], 0, close)

    m = _largest(n - k, ends) if k < n and ends(1) else 0
    tail_at = close - (old.close - spans[n - m][0]) if m else close
    runs: list[Run] = []
    if k:
        runs.append((0, lo, k))
    # One more run in the middle: the old items after the first changed one, found
    # by where the first of them starts, checked whole at that place.
    for first, last in ((k + 1, n - m), (k + 1, n - m - 1)):
        if last - first < 1:
            continue
        lead = src[spans[first][0] : spans[first][1]]
        q = raw.find(lead, at, tail_at)
        while q > at and raw[q - 1] != 0x2C:
            q = raw.find(lead, q + 1, tail_at)
        if q <= at:
            continue
        width = spans[last - 1][1] - spans[first][0]
        if q + width < tail_at and raw.startswith(src[spans[first][0] : spans[last - 1][1]], q):
            runs.append((first, q, last - first))
            break
    if m:
        runs.append((n - m, tail_at, m))
    return runs


def _assemble(old: Kept, raw: bytes, runs: list[Run], close: int) -> Assembled | None:
    """``raw``'s parse, doc and layout: ``old``'s items of ``runs``, the gaps between
    them (whole new items) parsed on their own (with no run: another conversation's
    body, whose head and tail, its model and tools, are reused); None when a gap is
    not items.  A gap of one item where one old item stood is first tried as that
    item with its last member's string replaced (:mod:`canonicalize.strpiece`)."""
    spans = old.spans
    assert spans is not None
    items: list[Any] = []
    new_spans: list[Span] = []
    moves: list[tuple[int, int, int, int, int]] = []  # old start, old end, shift, old first, new first
    pos, after_item = len(old.head), False
    old_items, old_writable = old.items, old.writable
    copies: list[int] = []
    breaks = False  # a line break in the new bytes (the gaps): the rest are old's
    strings: Strings = {}
    done = 0  # the old items before here: runs' and the gaps' they replaced
    several = False  # a gap of more than one item (only such a gap may leave a span unknown)
    try:
        for first, start, count in runs:
            if start != pos or after_item:  # (else the run starts the array: no gap before it)
                n_before = len(items)
                breaks = breaks or has_line_break(raw, pos, start)
                like = done if first - done == 1 else -1
                if not _gap(raw, pos, start, after_item, True, items, new_spans, (old, like, strings)):
                    return None
                if len(items) > n_before:
                    several = several or len(items) - n_before > 1
                    copies += writable(items, n_before)
            done = first + count
            s0, e0 = spans[first][0], spans[first + count - 1][1]
            base = len(items) - first
            # the run's writable items, at their new places (old.writable is in order)
            kept = old_writable[bisect_left(old_writable, first) : bisect_left(old_writable, first + count)]
            copies += [j + base for j in kept] if base else kept
            shift = start - s0
            moves.append((s0, e0, shift, first, len(items)))
            items += old_items[first : first + count]
            if shift:
                new_spans += [(s + shift, e + shift) for s, e in spans[first : first + count]]
            else:  # the same offsets: the same tuples
                new_spans += spans[first : first + count]
            pos, after_item = e0 + shift, True
        n_before = len(items)
        breaks = breaks or has_line_break(raw, pos, close)
        like = done if len(spans) - done == 1 else -1
        if not _gap(raw, pos, close, after_item, False, items, new_spans, (old, like, strings)):
            return None
        if len(items) > n_before:
            several = several or len(items) - n_before > 1
            copies += writable(items, n_before)
    except (orjson.JSONDecodeError, TypeError):
        return None
    top = dict(old.top)
    top[old.key] = items
    doc = JsonDoc(raw)
    if breaks:
        doc.flat = False
    elif old.doc.is_flat():  # (its head and tail are old's too)
        doc.flat = True
    _carry(old, doc, moves, close)
    for path, (_, _, _, start, end) in strings.items():
        doc._quick[path] = (start - 1, end + 1)  # (as a scan of the new item would find it)
    known = not several or (-1, -1) not in new_spans
    if known:
        doc.known_items = (old.key, new_spans)
    return top, doc, ((close, new_spans) if known else None), copies, strings


def _same_end(old: bytes, raw: bytes) -> bool:
    """Whether ``raw`` ends as ``old`` does after its last ``]`` (which the item array's
    tail holds all of): a cheap refusal of a body with other params, before its layout."""
    k = min(_ENDS, len(old) - old.rfind(b"]"))
    return raw[-k:] == old[-k:]


def _largest(n: int, ok: Any) -> int:
    """The largest k in [0, n] with ``ok(k)`` (true for 0, and for every k below one
    it is true for): n and n - 1 tried first (a turn appended, the last message
    changed), then a binary search."""
    if ok(n):
        return n
    if n >= 1 and ok(n - 1):
        return n - 1
    a, b = 0, max(n - 2, 0)
    while a < b:
        mid = (a + b + 1) // 2
        if ok(mid):
            a = mid
        else:
            b = mid - 1
    return a


def _gap(
    raw: bytes,
    start: int,
    end: int,
    after: bool,
    before: bool,
    items: list[Any],
    spans: list[Span],
    like: tuple[Kept, int, Strings],
) -> bool:
    """Parse ``raw[start:end]``, between a reused item (``after``) or the '[', and a
    reused item (``before``) or the ']': new whole items and their separators, or
    just one separator.  Appends the items and their spans (found by their compact
    serialization; unknown spans make the caller's body unusable later).  ``like``:
    the old body, the index of the one old item the gap stands in place of (-1:
    none), and where to note a string parsed alone (:func:`_replaced`)."""
    inner = _between(raw, start, end, after, before)
    if type(inner) is not tuple:
        return bool(inner)  # a separator alone (or nothing), or not one
    start, end = inner
    if like[1] >= 0 and end - start >= BIG:
        item = _replaced(raw, start, end, like, len(items))
        if item is not None:
            items.append(item)
            spans.append((start, end))
            return True
    new = orjson.loads(b"".join((b"[", memoryview(raw)[start:end], b"]")))  # the gap copied once
    if len(new) == 1:  # one item: the gap is its span, without whitespace around it
        while raw[start] in _WS:
            start += 1
        while raw[end - 1] in _WS:
            end -= 1
        spans.append((start, end))
        items += new
        return True
    pos = start
    for n, item in enumerate(new):
        if n:
            pos += 1  # ','
        form = orjson.dumps(item)
        if raw.startswith(form, pos):
            spans.append((pos, pos + len(form)))
            pos += len(form)
        else:
            spans.append((-1, -1))
            pos = -(1 << 62)
    items += new
    return True


def _between(raw: bytes, start: int, end: int, after: bool, before: bool) -> tuple[int, int] | bool:
    """Where the items of the gap ``raw[start:end]`` are, without the commas that join
    it to a reused item before (``after``) and after (``before``) it; True: the gap is
    only those commas (or nothing); False: it is not what stands there."""
    if after and before:
        if end - start < 1 or raw[start] != 0x2C or raw[end - 1] != 0x2C:
            return False
        if end - start == 1:
            return True
        start, end = start + 1, end - 1
    elif after:
        if start == end:
            return True
        if raw[start] != 0x2C:
            return False
        start += 1
    elif before:
        if start == end:
            return True
        if raw[end - 1] != 0x2C:
            return False
        end -= 1
    elif start == end:
        return True
    return (start, end) if start < end else False


def _replaced(raw: bytes, start: int, end: int, like: tuple[Kept, int, Strings], index: int) -> Any:
    """The item ``raw[start:end]`` as the old item ``like`` names with its last member's
    string replaced (:func:`canonicalize.strpiece.replaced`), noted in ``like``'s
    strings at its path (at the new ``index``); None: not that."""
    old, j, strings = like
    assert old.spans is not None
    item = old.items[j]
    a0, a1 = old.spans[j]
    found = replaced(item, old.raw, a0, a1, raw, start, end)
    if found is None:
        return None
    new, key, (s, e) = found
    # (the literals' contents: after the same bytes in both items, to the quote before '}')
    strings[(old.key, index, key)] = (item[key], a0 + s + 1 - start, a1 - 2, s + 1, e - 1)
    return new


def _carry(old: Kept, doc: JsonDoc, moves: list[tuple[int, int, int, int, int]], close: int) -> None:
    """The spans the old doc located in the head, the tail or a reused item, at their
    new offsets (and items' new indices): the same bytes in the same structure, so
    what proved them there proves them here."""
    key, shift_tail = old.key, close - old.close
    quick = doc._quick
    for path, (s, e) in old.doc._quick.items():
        if e <= old.open:
            quick[path] = (s, e)
        elif s > old.close:
            quick[path] = (s + shift_tail, e + shift_tail)
        elif len(path) >= 2 and path[0] == key and type(path[1]) is int:
            for s0, e0, d, first, new_first in moves:
                if s0 <= s and e <= e0:
                    quick[(key, path[1] - first + new_first, *path[2:])] = (s + d, e + d)
                    break


def writable(items: list[Any], start: int) -> list[int]:
    """The indices from ``start`` on of the items a request may write to (dicts but
    assistant and tool messages)."""
    return [
        i
        for i in range(start, len(items))
        if type(item := items[i]) is dict and not (type(role := item.get("role")) is str and role in SHARED)
    ]


__all__ = ["SHARED", "Kept", "Span", "opening", "reuse", "shared_prefix", "writable"]
