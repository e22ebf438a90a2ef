"""One system text through the rules: the static rewrites, the pin spans, the skeleton.

:func:`scan` reads the whole text.  An agent's next system prompt is, as a rule,
its previous one with a line or two changed (a minute, a memory counter), and
reading 10-50 KB again with every rule is most of what such a request costs.
When every system rule is line-local (:mod:`canonicalize.rules`: what a rule
finds in a line alone is what it finds there in the whole text, and it neither
adds nor removes a newline), :func:`rescan` takes the previous text's analysis
and reads only the lines that differ: the text is ``P + M + S`` where ``P`` and
``S`` are whole lines it shares with the previous ``P + M' + S``, so the static
rewrites and pin spans of ``P`` and ``S`` are the previous ones (shifted by the
length difference in ``S``) and only ``M`` is scanned.  The result is the one
:func:`scan` gives (the tests compare them on random edits).

To place ``P`` and ``S`` in the rewritten text, an analysis made with line-local
rules keeps its static rewrites' lines (:attr:`SystemText.rewrites`: where the
line starts in the text as sent, which rule, how much longer or shorter it made
the line).  With line-local rules, a rule fired on a text when it rewrote one of
its lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from canonicalize import pins
from canonicalize.identity import hash_text
from canonicalize.rules import Rule
from canonicalize.ruleset import RuleSet
from canonicalize.wire.base import Slot

HEAD_CHARS = 256  # the skeleton's head: how much of the masked system text a fork must share
_PROBE = 256  # characters compared at once first when looking for the first difference

Rewrite = tuple[int, int, int]  # the line's start in the text as sent, the rule's index, the length change


@dataclass(frozen=True, slots=True)
class SystemText:
    """One system text after the static rules, and its pin spans."""

    text: str  # after static rules
    fired: tuple[str, ...]
    spans: tuple[tuple[Rule, int, int, str, str], ...]  # pin spans: rule, start, end, key, value
    masked_hash: str  # hash of the text with pin spans masked
    head: str  # first HEAD_CHARS of the masked text
    rewrites: tuple[Rewrite, ...] | None = None  # None: not kept (rules that are not line-local)


def scan(rules: RuleSet, text: str) -> SystemText:
    """The static rules and pin spans of one system text, read whole."""
    if rules.system_lines:
        new, rewrites = _static(rules.static_system, text)
        fired = _fired(rules.static_system, rewrites)
    else:
        fired_list: list[str] = []
        new, rewrites = text, None
        for rule in rules.static_system:
            out = rule.apply(new)
            if out != new:
                new = out
                fired_list.append(rule.name)
        fired = tuple(fired_list)
    found = pins.find_spans(rules.pin_system, [Slot([new], 0, ())])
    return _finish(new, fired, [(s.rule, s.start, s.end, s.key, s.value) for s in found], rewrites)


def rescan(
    rules: RuleSet, near_text: str, near: SystemText, text: str, alike: tuple[int, int] | None = None
) -> SystemText | None:
    """``text``'s analysis from ``near_text``'s (``near``), reading only the lines that
    differ; None when the rules are not line-local or most lines differ.  ``alike``:
    how many characters the two texts are known to start and to end with alike (at
    most as many as they do), instead of comparing them for it."""
    if not rules.system_lines or near.rewrites is None:
        return None
    if alike is not None:
        p, s = alike
    else:
        s = _common_suffix(near_text, text, min(len(near_text), len(text)))
        p = _common_prefix(near_text, text, min(len(near_text), len(text)) - s)
    a = text.rfind("\n", 0, p) + 1  # the first line that differs starts here, in both
    end = text.find("\n", len(text) - s)  # and the last one ends here (its newline, or the end)
    end = len(text) if end < 0 else end
    if 2 * (end - a) > len(text):
        return None  # most of it changed: read it whole
    grow = len(text) - len(near_text)
    near_end = end - grow
    before = sum(d for at, _, d in near.rewrites if at < a)
    inside = sum(d for at, _, d in near.rewrites if a <= at <= near_end)
    old = near.text
    a2, near_end2 = a + before, near_end + before + inside  # the same places in the rewritten text
    if (a and old[a2 - 1 : a2] != "\n") or (near_end < len(near_text) and old[near_end2 : near_end2 + 1] != "\n"):
        return None  # not where the kept rewrites say: never guess
    mid, mid_rewrites = _static(rules.static_system, text[a:end])
    # No rewrite in either: the rewritten text is ``text`` (the lines around ``mid`` are
    # the ones it shares), so the object itself, not a copy that the memos would compare.
    new = text if not near.rewrites and not mid_rewrites else old[:a2] + mid + old[near_end2:]
    shift = len(new) - len(old)
    rewrites = (
        *(r for r in near.rewrites if r[0] < a),
        *((at + a, rule, d) for at, rule, d in mid_rewrites),
        *((at + grow, rule, d) for at, rule, d in near.rewrites if at > near_end),
    )
    found = pins.find_spans(rules.pin_system, [Slot([mid], 0, ())])
    spans = [sp for sp in near.spans if sp[2] <= a2]
    spans += [(sp.rule, sp.start + a2, sp.end + a2, sp.key, sp.value) for sp in found]
    spans += [(r, b + shift, e + shift, k, v) for r, b, e, k, v in near.spans if b > near_end2]
    fired = _fired(rules.static_system, rewrites)
    old_mid = [pins.Span(r, 0, b - a2, e - a2, k, v) for r, b, e, k, v in near.spans if a2 <= b and e <= near_end2]
    masked_mid = pins.skeleton([Slot([old[a2:near_end2]], 0, ())], old_mid)
    if masked_mid == pins.skeleton([Slot([mid], 0, ())], found):
        # Masked, the text is the previous one (a pinned value moved): so are its hash and head.
        return SystemText(new, fired, tuple(spans), near.masked_hash, near.head, rewrites)
    return _finish(new, fired, spans, rewrites)


def _finish(
    text: str,
    fired: tuple[str, ...],
    spans: list[tuple[Rule, int, int, str, str]],
    rewrites: tuple[Rewrite, ...] | None,
) -> SystemText:
    slot = [Slot([text], 0, ())]
    masked = pins.skeleton(slot, [pins.Span(r, 0, b, e, k, v) for r, b, e, k, v in spans])
    return SystemText(text, fired, tuple(spans), hash_text(masked), masked[:HEAD_CHARS], rewrites)


def _static(rules: Sequence[Rule], text: str) -> tuple[str, tuple[Rewrite, ...]]:
    """``text`` after line-local static ``rules``, and the lines each rewrote (where they
    start in ``text``).  A later rule reads an earlier one's output: its lines are the
    same lines (none is added or removed), found by the lengths rewritten before them."""
    done: list[list[int]] = []  # [line start now, line start in text, rule, length change]
    for index, rule in enumerate(rules):
        found = rule.rewrites(text)
        if not found:
            continue
        parts: list[str] = []
        new: list[list[int]] = []
        pos = 0
        for start, stop, replacement in found:
            parts += (text[pos:start], replacement)
            pos = stop
            line = text.rfind("\n", 0, start) + 1
            origin = line - sum(d for now, _, _, d in done if now < line)
            new.append([line, origin, index, len(replacement) - (stop - start)])
        parts.append(text[pos:])
        text = "".join(parts)
        moved = [(now, d) for now, _, _, d in new]
        for entry in (*done, *new):  # lines after a rewritten one moved
            entry[0] += sum(d for now, d in moved if now < entry[0])
        done += new
    return text, tuple(sorted((origin, index, d) for _, origin, index, d in done))


def _fired(rules: Sequence[Rule], rewrites: Sequence[Rewrite]) -> tuple[str, ...]:
    """The rules that rewrote a line, in their order."""
    used = {index for _, index, _ in rewrites}
    return tuple(rule.name for index, rule in enumerate(rules) if index in used)


def _common_prefix(a: str, b: str, most: int) -> int:
    """How many characters ``a`` and ``b`` start with alike, ``most`` at most: all but
    the last ``_PROBE`` compared at once first (the texts differ near where their common
    suffix starts, as a rule), else halving; each compare copies only the part of ``a``
    it reads."""
    lo, hi = 0, most + 1  # a[:lo] == b[:lo]; a[:hi] != b[:hi] (most + 1: not known)
    if most > _PROBE and b.startswith(a[: most - _PROBE]):
        lo = most - _PROBE
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if b.startswith(a[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    return lo


def _common_suffix(a: str, b: str, most: int) -> int:
    """How many characters ``a`` and ``b`` end with alike, ``most`` at most."""
    la, lb = len(a), len(b)
    lo, step = 0, _PROBE
    while lo < most and b.endswith(a[la - min(lo + step, most) : la - lo], 0, lb - lo):
        lo, step = min(lo + step, most), step * 2
    if lo >= most:
        return most
    hi = min(lo + step, most)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if b.endswith(a[la - mid : la - lo], 0, lb - lo):
            lo = mid
        else:
            hi = mid
    return lo
