"""What changed between two renderings of one prompt, as value changes.

:func:`changes` compares the text a lineage forwarded (``old``) with a request's
(``new``) and returns each changed run with its class (:mod:`canonicalize.values`):
a value rendered fresh (``12:30:15`` -> ``12:31:02``) is one token replaced by
one token of the same class; anything else (a word, a line added or removed, a
value inside an edited line) is ``other``.

Its cost is bounded whatever the texts are.  The runs of lines that differ are
found first (:mod:`canonicalize.linediff`: slices compared, no token looked at).
Of a run only its differing part is tokenized, widened to the nearest edges no
token spans (a line break, a quote, a bracket, ...), so that its tokens are the
run's.  A request's comparisons share one :class:`Budget` (:func:`fresh`): at most
``MAX_TOKENIZED`` characters tokenized; a part longer than ``MAX_HUNK``, or past
that budget, is ``other`` whole, unexamined.  In a part, the equal tokens and the
value pairs at both ends are peeled off (values rendered afresh: the common case is
all of it); what is left between them is aligned token by token while the budget
has pairs of tokens left (``MAX_ALIGNED``), else it is one ``other`` change.
A caller that needs ``new`` to keep a share of ``old`` (``keep``) stops
tokenizing as soon as it cannot.

Safety: a value is never taken out of an edited context.  Every change on a
line that holds an ``other`` change is ``other``: a number in a rewritten
sentence is part of the edit, not a counter.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from canonicalize import linediff, values
from canonicalize.linediff import Hunk, common_prefix, common_suffix

MAX_HUNK = 2048  # characters (either side) of a run's differing part tokenized; more is "other" whole
MAX_TOKENIZED = 4096  # characters (both sides) tokenized per request; past it a part is "other" whole
MAX_ALIGNED = 4096  # pairs of tokens (one side's times the other's; lines too) aligned one by one per request

_TEXT = re.compile(r"[^\n]")  # (where an edit's text starts, past its line breaks)
# Where a run's differing part is widened to: a line break (runs are whole lines), or a
# character no token spans (each is a token of its own: no value, word or space holds it).
_EDGE = re.compile(r"[\n\"'()\[\]{}<>;=!?*#@&|`\\^$]")


@dataclass(frozen=True, slots=True)
class Change:
    """``old[ostart:oend]`` became ``new[nstart:nend]``; ``cls`` is a value class or ``other``."""

    cls: str
    ostart: int
    oend: int
    nstart: int
    nend: int


@dataclass(frozen=True, slots=True)
class Budget:
    """What comparisons may still spend (one budget per request, passed along from one
    comparison to the next): characters tokenized, and pairs of lines or of tokens (one
    side's times the other's) aligned one by one."""

    chars: int
    pairs: int

    def less(self, spent: Budget) -> Budget:
        """What is left once ``spent`` is spent."""
        return Budget(self.chars - spent.chars, self.pairs - spent.pairs)


NOTHING = Budget(0, 0)


def fresh() -> Budget:
    """A request's whole budget: ``MAX_TOKENIZED`` characters, ``MAX_ALIGNED`` pairs."""
    return Budget(MAX_TOKENIZED, MAX_ALIGNED)


@dataclass(frozen=True, slots=True)
class Diff:
    """The changes of ``new`` against ``old``, how much of ``old`` they kept, and what
    finding them spent of the budget."""

    changes: tuple[Change, ...]
    kept: float  # share of old's characters outside every ``other`` change (1.0: none)
    spent: Budget = NOTHING

    @property
    def values(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.cls != "other")

    @property
    def others(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.cls == "other")


def changes(
    old: str, new: str, runs: Sequence[Hunk] | None = None, *, keep: float = 0.0, budget: Budget | None = None
) -> Diff:
    """The value changes that turn ``old`` into ``new`` (module docstring); ``runs``:
    their :func:`canonicalize.linediff.lines`, when the caller has them.  It spends at
    most ``budget`` (default: a :func:`fresh` one); with ``keep``, once ``new`` cannot
    keep that share of ``old`` the parts left are ``other`` whole (``kept`` is below
    ``keep`` either way).  With no character left to tokenize, every difference is
    ``other``: one change, unexamined."""
    if old == new:
        return Diff((), 1.0)
    budget = fresh() if budget is None else budget
    if budget.chars <= 0:
        return Diff((Change("other", 0, len(old), 0, len(new)),), 0.0)
    pairs = budget.pairs
    if runs is None:
        runs, aligned = linediff.runs(old, new, max(min(pairs, linediff.MAX_ALIGNED), 0))
        pairs -= aligned
    parts = [_part(old, new, run) for run in runs]
    whole = [not r or o2 - o1 > MAX_HUNK or n2 - n1 > MAX_HUNK for o1, o2, n1, n2, r in parts]
    most = (1.0 - keep) * len(old)  # old's characters "other" may take before new cannot keep ``keep``
    removed = sum(p[1] - p[0] for p, w in zip(parts, whole, strict=True) if w)
    chars = budget.chars
    out: list[Change] = []
    for (o1, o2, n1, n2, _), w in zip(parts, whole, strict=True):
        if not w and removed <= most and o2 - o1 + n2 - n1 <= chars:
            chars -= o2 - o1 + n2 - n1
            got, pairs = _tokens(old, o1, o2, new, n1, n2, pairs)
            removed += sum(c.oend - c.ostart for c in got if c.cls == "other")
            out += got
            continue
        removed += 0 if w else o2 - o1
        out.append(Change("other", o1, o2, n1, n2))
    out = _untaint(out, new)
    removed = sum(c.oend - c.ostart for c in out if c.cls == "other")
    spent = Budget(budget.chars - chars, budget.pairs - pairs)
    return Diff(tuple(out), 1.0 - removed / len(old) if old else 0.0, spent)


def _part(old: str, new: str, run: Hunk) -> Hunk:
    """The part of a replaced run that differs, widened to the nearest edges no token
    spans (``_EDGE``) before and after it: tokenized alone, it gives the tokens the whole
    run would there, and the rest of the run is equal on both sides.  An inserted or
    removed run is its own part."""
    o1, o2, n1, n2, replaced = run
    if not replaced:
        return run
    a, b = old[o1:o2], new[n1:n2]
    p = common_prefix(a, b)
    s = common_suffix(a, b, min(len(a), len(b)) - p)
    edge = _EDGE.search(a[p - 1 :: -1]) if p else None  # the nearest edge before, read backwards
    start = p - edge.start() if edge else 0
    edge = _EDGE.search(a, len(a) - s)
    end = len(a) if edge is None else edge.end() if edge.group() == "\n" else edge.start()  # (whole lines)
    return o1 + start, o1 + end, n1 + start, n2 - (len(a) - end), True


Token = values.Token


def _tokens(old: str, o1: int, o2: int, new: str, n1: int, n2: int, pairs: int) -> tuple[list[Change], int]:
    """The changes of one part, token by token: the equal tokens and value pairs at both
    ends peeled off (all of them, when only values were rendered afresh), what is left
    between aligned one by one while ``pairs`` allow, else one ``other`` change; and the
    pairs of tokens left."""
    ot = values.token_list(old[o1:o2])
    nt = values.token_list(new[n1:n2])
    i, head = _peel(zip(ot, nt, strict=False), o1, n1)  # (as far as the shorter side goes)
    k, tail = _peel(zip(reversed(ot[i:]), reversed(nt[i:]), strict=False), o1, n1)
    i2, j2 = len(ot) - k, len(nt) - k
    if i == i2 and i == j2:
        return head + tail[::-1], pairs
    cells = (i2 - i) * (j2 - i)
    if not cells or cells > pairs:
        return [*head, *_replaced(ot, i, i2, o1, o2, nt, i, j2, n1, n2), *tail[::-1]], pairs
    matcher = SequenceMatcher(None, [t[3] for t in ot[i:i2]], [t[3] for t in nt[i:j2]], autojunk=False)
    for tag, a1, a2, b1, b2 in matcher.get_opcodes():
        if tag != "equal":
            head += _replaced(ot, i + a1, i + a2, o1, o2, nt, i + b1, i + b2, n1, n2)
    return head + tail[::-1], pairs - cells


def _peel(pairs: Iterable[tuple[Token, Token]], o1: int, n1: int) -> tuple[int, list[Change]]:
    """How many of ``pairs`` (an old and a new token at one place, in order) come before
    the first edit (each equal, or a value rendered afresh), and those values' changes."""
    n = 0
    out: list[Change] = []
    for o, t in pairs:
        if o[3] != t[3]:
            cls = values.pair_class(o[0], o[3], t[0], t[3])
            if cls == "other":
                break
            out.append(Change(cls, o1 + o[1], o1 + o[2], n1 + t[1], n1 + t[2]))
        n += 1
    return n, out


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
    edits: list[tuple[int, int]] = []  # each edit's first line start and end: the lines starting in it
    for c in found:
        if c.cls != "other":
            continue
        first = _TEXT.search(new, c.nstart, c.nend)  # line breaks at either end edit no line
        start = c.nend if first is None else first.start()
        end = start + len(new[start : c.nend].rstrip("\n"))
        if start == end and (start == 0 or start == len(new) or "\n" in (new[start - 1], new[start])):
            continue  # whole lines went (or only newlines came): no line of new was edited
        edits.append((new.rfind("\n", 0, start) + 1, end))
    if not edits:
        return found
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(edits):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    starts = [lo for lo, _ in merged]

    def tainted(c: Change) -> bool:
        line = new.rfind("\n", 0, c.nstart) + 1
        k = bisect_right(starts, line) - 1
        return k >= 0 and line <= merged[k][1]

    return [
        Change("other", c.ostart, c.oend, c.nstart, c.nend) if c.cls != "other" and tainted(c) else c for c in found
    ]
