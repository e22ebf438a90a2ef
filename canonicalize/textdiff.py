"""What changed between two renderings of one prompt, as value changes.

:func:`changes` compares the text a lineage forwarded (``old``) with a request's
(``new``) and returns each changed run with its class (:mod:`canonicalize.values`):
a value rendered fresh (``12:30:15`` -> ``12:31:02``) is one token replaced by
one token of the same class; anything else (a word, a line added or removed, a
value inside an edited line) is ``other``.

It is cheap where prompts are alike: the common prefix and suffix are found by
comparing slices (C memcmp), the rest is cut into lines; with as many lines on
both sides (values changed within lines) they are paired by position, else
aligned (:class:`difflib.SequenceMatcher`); only the lines that differ are
tokenized and aligned token by token (no junk heuristic).  A run of changed
lines longer than ``MAX_HUNK`` characters is ``other`` whole, unexamined.

Safety: a value is never taken out of an edited context.  Every change on a
line that holds an ``other`` change is ``other``: a number in a rewritten
sentence is part of the edit, not a counter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from canonicalize import values

MAX_HUNK = 4096  # characters of changed lines aligned token by token; more is "other" whole
MAX_PAIRED = 64  # differing lines paired by position (as many lines on both sides)
MAX_LINES = 8192  # lines aligned with SequenceMatcher; more: the whole middle is "other"


Hunk = tuple[int, int, int, int, bool]  # old start, end, new start, end; True: replaced (else inserted/removed)
Lines = tuple[list[str], list[int]]  # the lines (with their newline) and where each starts


@dataclass(frozen=True, slots=True)
class Change:
    """``old[ostart:oend]`` became ``new[nstart:nend]``; ``cls`` is a value class or ``other``."""

    cls: str
    ostart: int
    oend: int
    nstart: int
    nend: int


@dataclass(frozen=True, slots=True)
class Diff:
    """The changes of ``new`` against ``old``, and how much of ``old`` they kept."""

    changes: tuple[Change, ...]
    kept: float  # share of old's characters outside every ``other`` change (1.0: none)

    @property
    def values(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.cls != "other")

    @property
    def others(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.cls == "other")


def changes(old: str, new: str, hunks: Sequence[Hunk] | None = None) -> Diff:
    """The value changes that turn ``old`` into ``new`` (module docstring); ``hunks``:
    their :func:`lines`, when the caller has them."""
    if old == new:
        return Diff((), 1.0)
    found: list[Change] = []
    for o1, o2, n1, n2, replaced in lines(old, new) if hunks is None else hunks:
        if not replaced or o2 - o1 > MAX_HUNK or n2 - n1 > MAX_HUNK:
            found.append(Change("other", o1, o2, n1, n2))
        else:
            found += _tokens(old, o1, o2, new, n1, n2)
    found = _untaint(found, new)
    removed = sum(c.oend - c.ostart for c in found if c.cls == "other")
    return Diff(tuple(found), 1.0 - removed / len(old) if old else 0.0)


def lines(old: str, new: str) -> list[Hunk]:
    """The runs of lines that differ between ``old`` and ``new``: the cheap first step
    of :func:`changes` (no token is looked at), enough to tell which of several texts
    ``new`` is closest to."""
    if old == new:
        return []
    p = common_prefix(old, new)
    s = common_suffix(old, new, min(len(old), len(new)) - p)
    start = old.rfind("\n", 0, p) + 1  # whole lines: a value the prefix cut in two is one token again
    end = old.find("\n", len(old) - s)
    old_end = len(old) if end < 0 else end
    new_end = len(new) - (len(old) - old_end)
    return _hunks(old, _lines(old, start, old_end), old_end, new, _lines(new, start, new_end), new_end)


def _hunks(old: str, a: Lines, old_end: int, new: str, b: Lines, new_end: int) -> list[Hunk]:
    """The runs of lines that differ.  As many lines on both sides (values changed
    within lines, the common case) pairs them by position: each differing pair is a
    hunk.  Otherwise the lines are aligned (SequenceMatcher); past ``MAX_LINES`` the
    whole middle is one hunk."""
    (la, sa), (lb, sb) = a, b
    if len(la) == len(lb):
        paired = [i for i, (x, y) in enumerate(zip(la, lb, strict=True)) if x != y]
        if len(paired) <= MAX_PAIRED:
            return [(sa[i], sa[i + 1], sb[i], sb[i + 1], True) for i in paired]
    if len(la) + len(lb) > MAX_LINES:
        return [(sa[0], old_end, sb[0], new_end, False)]
    return [
        (sa[i1], sa[i2], sb[j1], sb[j2], tag == "replace")
        for tag, i1, i2, j1, j2 in SequenceMatcher(None, la, lb).get_opcodes()
        if tag != "equal"
    ]


Token = tuple[str, int, int, str]  # (kind, start, end, text): canonicalize.values.tokens


def _tokens(old: str, o1: int, o2: int, new: str, n1: int, n2: int) -> list[Change]:
    """The changes of one hunk, token by token: paired by position when both sides
    have as many tokens and every differing pair is a value (values rendered afresh,
    the common case), else aligned."""
    ot = values.token_list(old[o1:o2])
    nt = values.token_list(new[n1:n2])
    if len(ot) == len(nt):
        out = []
        for o, n in zip(ot, nt, strict=True):
            if o[3] != n[3]:
                cls = values.pair_class(o[0], o[3], n[0], n[3])
                if cls == "other":
                    break
                out.append(Change(cls, o1 + o[1], o1 + o[2], n1 + n[1], n1 + n[2]))
        else:
            return out
    matcher = SequenceMatcher(None, [t[3] for t in ot], [t[3] for t in nt], autojunk=False)
    out = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            out += _replaced(ot, i1, i2, o1, o2, nt, j1, j2, n1, n2)
    return out


def _replaced(
    ot: list[Token], i1: int, i2: int, o1: int, o2: int, nt: list[Token], j1: int, j2: int, n1: int, n2: int
) -> list[Change]:
    """Tokens ``ot[i1:i2]`` replaced by ``nt[j1:j2]``: values paired from both ends
    (a value that changed next to an inserted line is still that value), the
    rest one ``other`` change."""
    head: list[Change] = []
    tail: list[Change] = []

    def pair(o: Token, n: Token) -> Change | None:
        cls = values.pair_class(o[0], o[3], n[0], n[3])
        return None if cls == "other" else Change(cls, o1 + o[1], o1 + o[2], n1 + n[1], n1 + n[2])

    while i1 < i2 and j1 < j2 and (c := pair(ot[i1], nt[j1])) is not None:
        head.append(c)
        i1, j1 = i1 + 1, j1 + 1
    while i1 < i2 and j1 < j2 and (c := pair(ot[i2 - 1], nt[j2 - 1])) is not None:
        tail.append(c)
        i2, j2 = i2 - 1, j2 - 1
    if i1 == i2 and j1 == j2:
        return head + tail[::-1]
    os_ = o1 + (ot[i1][1] if i1 < len(ot) else o2 - o1)
    oe = o1 + ot[i2 - 1][2] if i2 > i1 else os_
    ns = n1 + (nt[j1][1] if j1 < len(nt) else n2 - n1)
    ne = n1 + nt[j2 - 1][2] if j2 > j1 else ns
    return [*head, Change("other", os_, oe, ns, ne), *tail[::-1]]


def _untaint(found: list[Change], new: str) -> list[Change]:
    """Every change on a line (of ``new``) that an ``other`` change touches is
    ``other``: a value inside an edited line is part of the edit.  A line added or
    removed whole touches no other line."""
    tainted: set[int] = set()  # start offsets of the tainted lines
    for c in found:
        if c.cls != "other":
            continue
        start, end = c.nstart, c.nend
        while start < end and new[start] == "\n":
            start += 1
        while end > start and new[end - 1] == "\n":
            end -= 1
        if start == end and (start == 0 or start == len(new) or "\n" in (new[start - 1], new[start])):
            continue  # whole lines went (or only newlines came): no line of new was edited
        pos = new.rfind("\n", 0, start) + 1
        while True:
            tainted.add(pos)
            nl = new.find("\n", pos, end)
            if nl < 0:
                break
            pos = nl + 1
    if not tainted:
        return found
    return [
        Change("other", c.ostart, c.oend, c.nstart, c.nend)
        if c.cls != "other" and new.rfind("\n", 0, c.nstart) + 1 in tainted
        else c
        for c in found
    ]


def _lines(text: str, start: int, end: int) -> Lines:
    """``text[start:end]`` cut into lines (each with its newline), and where each
    starts; one more start: ``end``."""
    lines = text[start:end].split("\n")
    last = lines.pop()
    lines = [line + "\n" for line in lines]
    if last:
        lines.append(last)
    starts = [start]
    for line in lines:
        starts.append(starts[-1] + len(line))
    return lines, starts


def common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    lo, step = 0, 4096
    while lo < n:
        hi = min(lo + step, n)
        if a[lo:hi] == b[lo:hi]:
            lo = hi
            step *= 2
            continue
        while hi - lo > 1:  # a[:lo] == b[:lo], and they differ before hi
            mid = (lo + hi) // 2
            if a[lo:mid] == b[lo:mid]:
                lo = mid
            else:
                hi = mid
        return lo
    return n


def common_suffix(a: str, b: str, most: int) -> int:
    """The length of the longest common suffix of ``a`` and ``b``, at most ``most``."""
    lo, step = 0, 4096
    la, lb = len(a), len(b)
    while lo < most:
        hi = min(lo + step, most)
        if a[la - hi : la - lo] == b[lb - hi : lb - lo]:
            lo = hi
            step *= 2
            continue
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if a[la - mid : la - lo] == b[lb - mid : lb - lo]:
                lo = mid
            else:
                hi = mid
        return lo
    return most
