"""Rules: small frozen objects that rewrite one kind of volatile span.

A rule has a ``name`` (used in metrics and the ``x-prefixpin-rewrites`` header), a
compiled ``pattern``, an ``action`` and a ``scope``:

- ``strip``  removes the span;
- ``mask``   replaces the span with a constant (``replacement``, default ``<masked>``);
- ``pin``    replaces the span with the value recorded at the lineage's first
  request (see :mod:`canonicalize.pins`); a pin rule with ``identity=True`` also
  names the session (hermes ``Session ID: …``);
- ``date``   pins the span like ``pin`` (the system prompt keeps the lineage's
  first date) and, when the agent's date moves on, tells the model: one short
  line with the new date is added to the newest user message, and kept at that
  message in every later request of the lineage (see :mod:`canonicalize.notes`).

The span is the pattern's named group ``v`` when it has one (else its ``date``
group for a date rule), else the whole match, so a rule can anchor on context
it does not change (``^MEMORY \\(your personal notes\\)(?P<v> \\[49% — …\\])$``).

A pattern ``re`` cannot scan fast is better tried only where a match can start:

- ``anchor``: a pattern led by a literal (which ``re`` jumps to) that every match
  has ``anchor_at`` characters after its start, no two of its occurrences
  overlapping (``\\d`` first is otherwise tried at every position of a 10-50 KB
  system prompt);
- ``seek``: literals, each with the offset from it to the start of a match; every
  match has one of them there (a long line prefix, which ``str.find`` skips to far
  faster than ``re`` steps through every ``" ["`` or ``"C"``).

The rule's pattern is then tried at those places only, in order; the spans are the same.
(A text shorter than :data:`SHORT`, a changed line, is read by the pattern whole.)

A rule that is ``line``-local finds in each line of a text, taken alone, exactly
what it finds there in the whole text (its matches and what its lookarounds read
lie within a line; ``^`` and ``$`` with ``re.MULTILINE``), and its replacement
has no newline.  When every system rule is, a system text that differs from its
conversation's previous one in a few lines is analysed in those lines only
(:mod:`canonicalize.scan`).  The packs' rules are; a user's rule is not assumed to be.

Rules never touch anything their pattern does not match: no whitespace or number
normalisation happens anywhere in prefixpin.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

Action = Literal["pin", "strip", "mask", "date"]
# A text this short is read by the pattern at every position: finding where a match may
# start first (``anchor``, ``seek``) costs more there than it saves (a changed line).
SHORT = 256
Scope = Literal["system", "tools", "all"]

ACTIONS: tuple[Action, ...] = ("pin", "strip", "mask", "date")
SCOPES: tuple[Scope, ...] = ("system", "tools", "all")


class RuleError(ValueError):
    """A rule definition is invalid; the message says why."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One rewrite of volatile spans. ``apply`` is pure; pins go through ``pin``."""

    name: str
    pattern: re.Pattern[str]
    action: Action
    scope: Scope = "system"
    identity: bool = False
    replacement: str = "<masked>"
    anchor: re.Pattern[str] | None = None
    anchor_at: int = 0
    seek: tuple[tuple[str, int], ...] = ()
    line: bool = False  # line-local (module docstring)
    # The span's group (module docstring), derived from ``pattern`` and ``action``.
    group: str | int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise RuleError(f"action must be one of {', '.join(ACTIONS)}, not {self.action!r}")
        if self.scope not in SCOPES:
            raise RuleError(f"scope must be one of {', '.join(SCOPES)}, not {self.scope!r}")
        if self.identity and self.action != "pin":
            raise RuleError("identity: true is only meaningful on a pin rule")
        if self.anchor is not None and (self.anchor.fullmatch("") is not None or self.anchor_at < 0):
            raise RuleError("an anchor must not match the empty string, and sits at a non-negative offset")
        if not all(literal for literal, _ in self.seek):
            raise RuleError("seek literals must not be empty")
        if self.seek and self.anchor is not None:
            raise RuleError("a rule has an anchor or seek literals, not both")
        if self.line and "\n" in self.replacement:
            raise RuleError("a line-local rule's replacement has no newline")
        groups = self.pattern.groupindex
        group = "v" if "v" in groups else "date" if self.action == "date" and "date" in groups else 0
        object.__setattr__(self, "group", group)

    @property
    def static(self) -> bool:
        """True for rules that need no lineage state (``strip`` and ``mask``)."""
        return self.action not in ("pin", "date")

    def apply(self, text: str) -> str:
        """Return ``text`` with every span of a static rule rewritten."""
        if self.action == "strip":
            return self._sub(text, lambda m: "")
        if self.action == "mask":
            return self._sub(text, lambda m: self.replacement)
        return text

    def rewrites(self, text: str) -> list[tuple[int, int, str]]:
        """What :meth:`apply` replaces in ``text``: each match's ``(start, end, new)``, in
        order, where ``new`` differs from the match."""
        if not self.static:
            return []
        out = []
        for m in self._finditer(text):
            new = self._replace(m, "" if self.action == "strip" else self.replacement)
            if new != m.group(0):
                out.append((m.start(), m.end(), new))
        return out

    def _replace(self, m: re.Match[str], new: str) -> str:
        """The match ``m`` with its span (the rule's group) replaced by ``new``."""
        whole, base = m.group(0), m.start()
        s, e = m.span(self.group)
        if not 0 <= s < e:
            # An empty span (a lookaround-only pattern such as ``\b``) matches no
            # text: rewriting it would insert text everywhere.
            return whole
        return whole[: s - base] + new + whole[e - base :]

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Start/end of every (non-empty) span this rule matches in ``text``."""
        grp, out = self.group, []
        for m in self._finditer(text):
            s, e = m.span(grp)
            if 0 <= s < e:
                out.append((s, e))
        return out

    def _finditer(self, text: str) -> Iterable[re.Match[str]]:
        """``pattern.finditer(text)``, the pattern tried only where ``anchor`` or ``seek`` say
        a match may start."""
        if (self.anchor is None and not self.seek) or (self.seek and len(text) < SHORT):
            return self.pattern.finditer(text)
        found: list[re.Match[str]] = []
        end = 0
        match = self.pattern.match
        for start in self._starts(text):
            if start < end:
                continue
            m = match(text, start)
            if m is None:
                continue
            if m.end() == start:  # an empty match: finditer's rules for those are not worth copying
                return self.pattern.finditer(text)
            found.append(m)
            end = m.end()
        return found

    def _starts(self, text: str) -> list[int]:
        """Where a match may start, in order."""
        if self.anchor is not None:
            at = self.anchor_at
            return [a.start() - at for a in self.anchor.finditer(text, at)]
        starts: set[int] = set()
        for literal, offset in self.seek:
            i = text.find(literal)
            while i >= 0:
                if i + offset >= 0:
                    starts.add(i + offset)
                i = text.find(literal, i + 1)
        return sorted(starts)

    def _sub(self, text: str, new: Callable[[re.Match[str]], str]) -> str:
        def repl(m: re.Match[str]) -> str:
            return self._replace(m, new(m))

        if self.anchor is None and not self.seek:
            return self.pattern.sub(repl, text)
        out: list[str] = []  # pattern.sub, on the matches _finditer found
        last = 0
        for m in self._finditer(text):
            out += (text[last : m.start()], repl(m))
            last = m.end()
        if not out:
            return text
        out.append(text[last:])
        return "".join(out)


def compile_rule(
    name: str,
    pattern: str,
    action: str,
    scope: str = "system",
    *,
    identity: bool = False,
    replacement: str = "<masked>",
    flags: int = re.MULTILINE,
    anchor: str | None = None,
    anchor_at: int = 0,
    seek: tuple[tuple[str, int], ...] = (),
    line: bool = False,
) -> Rule:
    """Build a rule from plain values (config or pack data); raises RuleError."""
    if not name or not isinstance(name, str):
        raise RuleError("a rule needs a non-empty name")
    if not isinstance(pattern, str):
        raise RuleError(f"pattern must be a string, not {type(pattern).__name__}")
    try:
        compiled = re.compile(pattern, flags)
    except re.error as exc:
        raise RuleError(f"pattern does not compile: {exc}") from None
    if compiled.fullmatch("") is not None:
        # A pattern that matches the empty string would fire everywhere.
        raise RuleError("pattern matches the empty string")
    return Rule(
        name=name,
        pattern=compiled,
        action=action,  # type: ignore[arg-type]
        scope=scope,  # type: ignore[arg-type]
        identity=identity,
        replacement=replacement,
        anchor=re.compile(anchor) if anchor is not None else None,
        anchor_at=anchor_at,
        seek=seek,
        line=line,
    )
