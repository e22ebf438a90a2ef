"""A learned span (:mod:`canonicalize.learn`) and the rule that would pin it.

A :class:`Span` is one changed span of a request's system text or a tool
description: its class, its value before and now, and the line it sits on.  Its
rule is written on demand (:meth:`Span.rule`): the value's shape (digits as
``\\d``, names as their alternations: :func:`canonicalize.values.shape`) in the
named group ``v``, with context from its line (at least ``CONTEXT`` characters
before it, and after it when what comes before says too little), every value in
the context written as its shape too, ``^`` / ``$`` where the context reaches the
line's edge; the rule must match the span where it is, before and now.  A rule
never holds the value it was learned from.  Its action is ``date`` for a time or
a date (the model is told the current one), ``pin`` for the rest; its name comes
from the context's words (``learned_request_id``).

``key`` names a span's place: its line with every changed span masked, so that
the next turns of an agent (fresh values, same lines) find the place known and
need no rule written again.  ``place`` names it whatever else on the line changed:
the line with every value on it masked, and which value it is (what the evidence
of :mod:`canonicalize.sightings` is kept under).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from canonicalize import textdiff, values
from canonicalize.identity import hash_text

CONTEXT = 32  # characters of a span's line a rule keeps as its context (at least)
TOLD = ("time", "date")  # classes whose current value the model is told in a note
RULE_SCOPES = ("system", "tools")  # where a rule can pin a learned span (not ``messages``)


@dataclass(frozen=True, slots=True)
class Span:
    """One changed span: its class, where it is, and (written on demand) the rule that
    would pin it.

    ``old`` and ``new`` are the values (never logged); ``line`` / ``at`` and
    ``old_line`` / ``old_at`` the line holding the span and where in it, now and
    before; ``scope`` is ``system``, ``tools`` or ``messages`` (the messages before the
    first reply, :mod:`canonicalize.recall`: no rule pins those); ``key`` names the span's place: a
    hash of its line with every changed span masked, and which of them it is (the
    same turn after turn while only values change)."""

    cls: str
    scope: str
    old: str
    new: str
    line: str = ""
    at: tuple[int, int] = (0, 0)
    old_line: str = ""
    old_at: tuple[int, int] = (0, 0)
    key: str = ""
    place: str = ""

    @property
    def action(self) -> str:
        return "date" if self.cls in TOLD else "pin"

    def suggest(self) -> tuple[str, str] | None:
        """The rule's pattern (the span in group ``v``) and name; None for ``other``, or
        when no pattern with context from the line matches the span before and now."""
        if self.cls == "other" or self.scope not in RULE_SCOPES:
            return None  # (a value in the messages: no rule pins it, learning does)
        found = rule_for(self.line, *self.at, self.cls, self.old)
        if found is None or not _matches(found[0], self.old_line, *self.old_at):
            return None
        return found

    def rule(self) -> dict[str, str] | None:
        """The rule (a ``canonicalize.rules`` entry) that pins this span, or None."""
        found = self.suggest()
        if found is None:
            return None
        return {"name": found[1], "pattern": found[0], "action": self.action, "scope": self.scope}


def spans_of(changes: Sequence[textdiff.Change], old: str, new: str, scope: str) -> tuple[Span, ...]:
    """The changes as spans: each value with its line (now and before) and the key of
    its place (module docstring of :class:`Span`)."""
    out: list[Span] = []
    by_line: dict[int, list[textdiff.Change]] = {}
    for c in changes:
        if c.cls != "other":
            by_line.setdefault(new.rfind("\n", 0, c.nstart) + 1, []).append(c)
    for c in changes:
        o, n = old[c.ostart : c.oend], new[c.nstart : c.nend]
        if c.cls == "other":
            out.append(Span("other", scope, o, n))
            continue
        first, last = _line(new, c.nstart, c.nend)
        ofirst, olast = _line(old, c.ostart, c.oend)
        line = new[first:last]
        mine = by_line[first]
        masked: list[str] = []
        pos = first
        for m in mine:
            masked += (new[pos : m.nstart], "\x00")
            pos = m.nend
        masked.append(new[pos:last])
        key = hash_text(f"{scope}\x1f{c.cls}\x1f{''.join(masked)}\x1f{mine.index(c)}")
        at, old_at = (c.nstart - first, c.nend - first), (c.ostart - ofirst, c.oend - ofirst)
        out.append(Span(c.cls, scope, o, n, line, at, old[ofirst:olast], old_at, key, place_of(scope, line, at[0])))
    return tuple(out)


def place_of(scope: str, line: str, start: int) -> str:
    """The place of the value starting at ``line[start]``: a hash of the line with every
    value on it masked, and which of them it is (its other values changing or not)."""
    masked: list[str] = []
    which = pos = 0
    for _, s, e, _ in values.value_tokens(line):
        which += s < start
        masked += (line[pos:s], "\x00")
        pos = e
    masked.append(line[pos:])
    return hash_text(f"{scope}\x1f{''.join(masked)}\x1f{which}")


def _line(text: str, start: int, end: int) -> tuple[int, int]:
    """Where the line holding ``text[start:end]`` starts and ends."""
    last = text.find("\n", end)
    return text.rfind("\n", 0, start) + 1, len(text) if last < 0 else last


def rule_for(line: str, start: int, end: int, cls: str, old: str) -> tuple[str, str] | None:
    """A pattern (the span in group ``v``) and name for the value ``line[start:end]`` of
    class ``cls`` (which was ``old``): its shape, with context from its line, each
    value in the context written as its shape too; None when none matches it there."""
    before = list(values.tokens(line[:start]))[::-1]
    after = list(values.tokens(line[end:]))
    pre, pre_all, words = _context(before)
    post, post_all = "", False
    if sum(c.isalnum() for c in words) < 3:  # too little to tell this line from others: what follows too
        post, post_all, more = _context(after, forward=True)
        words += more
    shape = values.shape(cls, old, line[start:end])
    pattern = ("^" if pre_all else "") + pre + f"(?P<v>{shape})" + post + ("$" if post and post_all else "")
    if not _matches(pattern, line, start, end):
        return None
    label = "_".join(w.lower() for w in words.split() if w)[:40].strip("_")
    return pattern, f"learned_{label or cls}"


def _context(toks: Sequence[tuple[str, int, int, str]], *, forward: bool = False) -> tuple[str, bool, str]:
    """Regex of at least CONTEXT characters of tokens next to a span (``toks`` nearest
    first), whether it reaches the line's edge, and the context's words."""
    parts: list[str] = []
    words: list[str] = []
    size = 0
    for kind, _, _, tok in toks:
        if size >= 2 * CONTEXT or (size >= CONTEXT and kind == "space"):  # a context starts with a word
            break
        size += len(tok)
        if values.is_value(kind):
            parts.append(values.shape(kind, tok))
            continue
        parts.append(values.escape(tok))
        if kind == "word":
            words.append(tok)
    reached = size >= sum(len(t[3]) for t in toks)
    if not forward:
        parts.reverse()
        words.reverse()
    return "".join(parts), reached, " ".join(words)


def _matches(pattern: str, line: str, start: int, end: int) -> bool:
    """``pattern`` matches ``line`` with group ``v`` exactly at ``line[start:end]``."""
    try:
        rx = re.compile(pattern, re.MULTILINE)
    except re.error:
        return False
    return any(m.span("v") == (start, end) for m in rx.finditer(line))
