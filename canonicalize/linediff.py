"""Which lines differ between two renderings of one text: the first step of
:mod:`canonicalize.textdiff`, with a bounded cost whatever the texts are.

The common prefix and suffix are found by comparing slices (C memcmp) and widened
to whole lines; only the lines between them (the *middle*) are looked at.  With as
many lines on both sides (values changed within lines, the common case) they are
paired by position.  Otherwise the lines are anchored on the lines each side has
exactly once, in the same order (the longest such run: a patience alignment,
``O(n log n)``); between two anchors, the equal lines at both ends are trimmed, then
as many lines on both sides are paired, and the others aligned one by one
(:class:`difflib.SequenceMatcher`) while the comparison has pairs of lines left to
align (``MAX_ALIGNED``), else they are one run.  Past ``MAX_LINES`` lines the whole
middle is one run, unaligned.

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
MAX_ALIGNED = 256  # pairs of lines (one side's times the other's) aligned one by one per comparison

Hunk = tuple[int, int, int, int, bool]  # old start, end, new start, end; True: replaced (else inserted/removed)
Lines = tuple[list[str], list[int]]  # the lines (with their newline) and where each starts, then the end
Run = tuple[int, int, int, int]  # line indices: old i1:i2 became new j1:j2


def lines(old: str, new: str) -> list[Hunk]:
    """The runs of lines that differ between ``old`` and ``new`` (module docstring):
    no token is looked at, enough to tell which of several texts ``new`` is closest to."""
    return runs(old, new)[0]


def runs(old: str, new: str, pairs: int = MAX_ALIGNED) -> tuple[list[Hunk], int]:
    """:func:`lines`, aligning at most ``pairs`` pairs of lines one by one, and how many
    it did."""
    if old == new:
        return [], 0
    start, old_end, new_end = _middle(old, new)
    n_old, n_new = old.count("\n", start, old_end), new.count("\n", start, new_end)
    if n_old == n_new:
        found = _paired(old, start, old_end, new, new_end)
        if found is not None:
            return found, 0
    if n_old + n_new > MAX_LINES:
        return [(start, old_end, start, new_end, False)], 0
    (la, sa), (lb, sb) = _lines(old, start, old_end), _lines(new, start, new_end)
    aligned, left = align(la, lb, pairs)
    return [(sa[i1], sa[i2], sb[j1], sb[j2], i1 < i2 and j1 < j2) for i1, i2, j1, j2 in aligned], pairs - left


def _middle(old: str, new: str) -> tuple[int, int, int]:
    """Where the lines between ``old``'s and ``new``'s common prefix and suffix start (on
    both sides) and end (on each): whole lines, so that a value the prefix cut in two
    is one token again."""
    p = common_prefix(old, new)
    s = common_suffix(old, new, min(len(old), len(new)) - p)
    start = old.rfind("\n", 0, p) + 1
    end = old.find("\n", len(old) - s)  # the suffix's first line break: the middle's last one
    old_end = len(old) if end < 0 else end + 1
    return start, old_end, len(new) - (len(old) - old_end)


def _paired(old: str, o: int, old_end: int, new: str, new_end: int) -> list[Hunk] | None:
    """With as many lines on both sides, the lines that differ, paired by position: from
    one difference to the next, found by comparing slices (no line is cut out of the
    rest); None past ``MAX_PAIRED`` of them (lines were added or removed)."""
    out: list[Hunk] = []
    n = o
    while o < old_end or n < new_end:
        p = common_prefix(old, new, o, n, min(old_end - o, new_end - n))
        if o + p == old_end and n + p == new_end:
            break
        first = old.rfind("\n", o, o + p) + 1 or o  # the line holding the difference, on both sides
        last, new_last = old.find("\n", o + p, old_end), new.find("\n", n + p, new_end)
        end = old_end if last < 0 else last + 1
        nend = new_end if new_last < 0 else new_last + 1
        if len(out) == MAX_PAIRED or (end == old_end) != (nend == new_end) or first == end or n + first - o == nend:
            return None  # (or one side has a line more: its last, without a line break)
        out.append((first, end, n + first - o, nend, True))
        o, n = end, nend
    return out


def align(la: list[str], lb: list[str], pairs: int = MAX_ALIGNED) -> tuple[list[Run], int]:
    """The runs of ``la`` and ``lb`` that differ, anchored on the lines each has once,
    and the pairs of lines left of ``pairs`` to align one by one."""
    out: list[Run] = []
    i0 = j0 = 0
    for i, j in (*_anchors(la, lb), (len(la), len(lb))):
        found, pairs = _segment(la, i0, i, lb, j0, j, pairs)
        out += found
        i0, j0 = i + 1, j + 1
    return out, pairs


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


def _segment(la: list[str], i1: int, i2: int, lb: list[str], j1: int, j2: int, left: int) -> tuple[list[Run], int]:
    """The runs between two anchors (equal ends trimmed, then paired, aligned or one
    run), and the pairs of lines still ``left`` to align one by one."""
    while i1 < i2 and j1 < j2 and la[i1] == lb[j1]:
        i1, j1 = i1 + 1, j1 + 1
    while i1 < i2 and j1 < j2 and la[i2 - 1] == lb[j2 - 1]:
        i2, j2 = i2 - 1, j2 - 1
    if i1 == i2 and j1 == j2:
        return [], left
    if i2 - i1 == j2 - j1:
        return [(i, i + 1, j1 + i - i1, j1 + i - i1 + 1) for i in range(i1, i2) if la[i] != lb[j1 + i - i1]], left
    cells = (i2 - i1) * (j2 - j1)
    if not cells or cells > left:
        return [(i1, i2, j1, j2)], left
    matcher = SequenceMatcher(None, la[i1:i2], lb[j1:j2], autojunk=False)
    found = [(i1 + a1, i1 + a2, j1 + b1, j1 + b2) for tag, a1, a2, b1, b2 in matcher.get_opcodes() if tag != "equal"]
    return found, left - cells


def _lines(text: str, start: int, end: int) -> Lines:
    """``text[start:end]`` cut into lines (each with its newline), and where each
    starts; one more start: ``end``."""
    lines = text[start:end].split("\n")
    last = lines.pop()
    lines = [line + "\n" for line in lines]
    if last:
        lines.append(last)
    return lines, list(accumulate(map(len, lines), initial=start))


def common_prefix(a: str, b: str, i: int = 0, j: int = 0, most: int | None = None) -> int:
    """The length of the longest common prefix of ``a[i:]`` and ``b[j:]``, at most ``most``."""
    n = min(len(a) - i, len(b) - j) if most is None else most
    lo, step = 0, 4096
    while lo < n:
        hi = min(lo + step, n)
        if a[i + lo : i + hi] == b[j + lo : j + hi]:
            lo = hi
            step *= 2
            continue
        while hi - lo > 1:  # a[i:i + lo] == b[j:j + lo], and they differ before hi
            mid = (lo + hi) // 2
            if a[i + lo : i + mid] == b[j + lo : j + mid]:
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
