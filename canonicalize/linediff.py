"""Which lines differ between two renderings of one text: the first step of
:mod:`canonicalize.textdiff`, with a bounded cost whatever the texts are.

The common prefix and suffix are found by comparing slices (C memcmp) and widened
to whole lines; only the lines between them (the *middle*) are looked at.  With as
many lines on both sides (values changed within lines, the common case) they are
paired by position.  Otherwise the lines are anchored on the lines each side has
exactly once, in the same order (the longest such run: a patience alignment,
``O(n log n)``); between two anchors, the equal lines at both ends are trimmed, then
as many lines on both sides are paired, a few (``MAX_SEGMENT``) are aligned by
:class:`difflib.SequenceMatcher`, and more are one run.  Past ``MAX_LINES`` lines the
whole middle is one run, unaligned.

A run is a :data:`Hunk`: its old and new character offsets, and whether lines were
replaced (else only inserted or removed).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from difflib import SequenceMatcher
from itertools import accumulate

MAX_PAIRED = 64  # differing lines paired by position (as many lines on both sides)
MAX_LINES = 4096  # lines of the middle (both sides) aligned; more: the whole middle is one run
MAX_SEGMENT = 32  # lines (each side) between two anchors aligned by SequenceMatcher; more: one run

Hunk = tuple[int, int, int, int, bool]  # old start, end, new start, end; True: replaced (else inserted/removed)
Lines = tuple[list[str], list[int]]  # the lines (with their newline) and where each starts, then the end
Run = tuple[int, int, int, int]  # line indices: old i1:i2 became new j1:j2


def lines(old: str, new: str) -> list[Hunk]:
    """The runs of lines that differ between ``old`` and ``new`` (module docstring):
    no token is looked at, enough to tell which of several texts ``new`` is closest to."""
    if old == new:
        return []
    return hunks(*middle(old, new))


def middle(old: str, new: str) -> tuple[Lines, Lines]:
    """The lines of ``old`` and ``new`` between their common prefix and suffix (whole
    lines: a value the prefix cut in two is one token again), with their offsets."""
    p = common_prefix(old, new)
    s = common_suffix(old, new, min(len(old), len(new)) - p)
    start = old.rfind("\n", 0, p) + 1
    end = old.find("\n", len(old) - s)  # the suffix's first line break: the middle's last one
    old_end = len(old) if end < 0 else end + 1
    new_end = len(new) - (len(old) - old_end)
    return _lines(old, start, old_end), _lines(new, start, new_end)


def shared(a: Lines, b: Lines) -> int:
    """Characters of ``a``'s lines that ``b`` has too (anywhere): at most what an
    alignment of the two finds equal."""
    mine = set(b[0])
    return sum(len(line) for line in a[0] if line in mine)


def hunks(a: Lines, b: Lines) -> list[Hunk]:
    """The runs of ``a``'s and ``b``'s lines that differ, as character offsets."""
    (la, sa), (lb, sb) = a, b
    if len(la) == len(lb):
        paired = [i for i, (x, y) in enumerate(zip(la, lb, strict=True)) if x != y]
        if len(paired) <= MAX_PAIRED:
            return [(sa[i], sa[i + 1], sb[i], sb[i + 1], True) for i in paired]
    if len(la) + len(lb) > MAX_LINES:
        return [(sa[0], sa[-1], sb[0], sb[-1], False)]
    return [(sa[i1], sa[i2], sb[j1], sb[j2], i1 < i2 and j1 < j2) for i1, i2, j1, j2 in align(la, lb)]


def align(la: list[str], lb: list[str]) -> list[Run]:
    """The runs of ``la`` and ``lb`` that differ, anchored on the lines each has once."""
    out: list[Run] = []
    i0 = j0 = 0
    for i, j in (*_anchors(la, lb), (len(la), len(lb))):
        out += _segment(la, i0, i, lb, j0, j)
        i0, j0 = i + 1, j + 1
    return out


def _anchors(la: list[str], lb: list[str]) -> list[tuple[int, int]]:
    """The longest run of lines found once on each side, in the same order on both."""
    ca, cb = Counter(la), Counter(lb)
    at = {line: j for j, line in enumerate(lb) if cb[line] == 1}
    pairs = [(i, at[line]) for i, line in enumerate(la) if ca[line] == 1 and line in at]
    # Longest increasing subsequence of the pairs' j (patience sorting): tops[k] is the
    # smallest j ending a run of k + 1; back[n] the pair before pairs[n] in its run.
    tops: list[int] = []
    ends: list[int] = []
    back: list[int] = []
    for n, (_, j) in enumerate(pairs):
        k = bisect_left(tops, j)
        back.append(ends[k - 1] if k else -1)
        if k == len(tops):
            tops.append(j)
            ends.append(n)
        else:
            tops[k], ends[k] = j, n
    out: list[tuple[int, int]] = []
    n = ends[-1] if ends else -1
    while n >= 0:
        out.append(pairs[n])
        n = back[n]
    return out[::-1]


def _segment(la: list[str], i1: int, i2: int, lb: list[str], j1: int, j2: int) -> list[Run]:
    """The runs between two anchors: equal ends trimmed, then paired, aligned or one run."""
    while i1 < i2 and j1 < j2 and la[i1] == lb[j1]:
        i1, j1 = i1 + 1, j1 + 1
    while i1 < i2 and j1 < j2 and la[i2 - 1] == lb[j2 - 1]:
        i2, j2 = i2 - 1, j2 - 1
    if i1 == i2 and j1 == j2:
        return []
    if i2 - i1 == j2 - j1:
        return [(i, i + 1, j1 + i - i1, j1 + i - i1 + 1) for i in range(i1, i2) if la[i] != lb[j1 + i - i1]]
    if i1 == i2 or j1 == j2 or i2 - i1 > MAX_SEGMENT or j2 - j1 > MAX_SEGMENT:
        return [(i1, i2, j1, j2)]
    matcher = SequenceMatcher(None, la[i1:i2], lb[j1:j2], autojunk=False)
    return [(i1 + a1, i1 + a2, j1 + b1, j1 + b2) for tag, a1, a2, b1, b2 in matcher.get_opcodes() if tag != "equal"]


def _lines(text: str, start: int, end: int) -> Lines:
    """``text[start:end]`` cut into lines (each with its newline), and where each
    starts; one more start: ``end``."""
    lines = text[start:end].split("\n")
    last = lines.pop()
    lines = [line + "\n" for line in lines]
    if last:
        lines.append(last)
    return lines, list(accumulate(map(len, lines), initial=start))


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
