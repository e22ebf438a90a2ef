"""Pinned spans: find them, key them by their line, restore recorded values.

A pin is keyed by its rule and the *line it sits on with the span masked* (and
every other pinned span on that line), so a value is only ever restored into the
same line it was recorded from.  A line that
is new (changed content, a new memory entry with a datetime) has no recorded
value and is forwarded as sent: pins never move a value between contexts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from canonicalize.rules import Rule
from canonicalize.wire.base import Slot

MASK = "\x00"


@dataclass(frozen=True, slots=True)
class Span:
    rule: Rule
    slot: int  # index into the slot list
    start: int
    end: int
    key: str  # rule name + hash of the masked line
    value: str


def _line_key(rule: Rule, text: str, start: int, end: int, on_line: Sequence[tuple[int, int]]) -> str:
    """The rule's name and the hash of the span's line with every pinned span on it
    (``on_line``, in order) masked: another span's fresh value on the same line
    does not make it a new line."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    if line_end < 0:
        line_end = len(text)
    parts: list[str] = []
    pos = line_start
    for s, e in on_line:
        if s < line_start or e > line_end or s < pos:
            continue
        parts += (text[pos:s], MASK)
        pos = e
    parts.append(text[pos:line_end])
    masked = "".join(parts)
    return f"{rule.name}:{xxhash.xxh64_hexdigest(masked.encode('utf-8', 'surrogatepass'))}"


def find_spans(rules: Sequence[Rule], slots: Sequence[Slot]) -> list[Span]:
    """Every span of every pin rule in ``slots`` (in slot, then position order)."""
    spans: list[Span] = []
    for i, slot in enumerate(slots):  # (so the spans come in slot, then position order)
        text = slot.get()
        found = [(start, end, rule) for rule in rules for start, end in rule.spans(text)]
        if not found:
            continue
        if len(found) > 1:
            found.sort(key=_first)  # by position; rules in order at one position
        where = [(start, end) for start, end, _ in found]
        for start, end, rule in found:
            spans.append(Span(rule, i, start, end, _line_key(rule, text, start, end, where), text[start:end]))
    return spans


def _first(found: tuple[int, int, Rule]) -> int:
    return found[0]


def skeleton(slots: Sequence[Slot], spans: Sequence[Span]) -> str:
    """The slots' text with every pinned span masked, joined by a record separator."""
    by_slot: dict[int, list[Span]] = {}
    for span in spans:
        by_slot.setdefault(span.slot, []).append(span)
    parts = []
    for i, slot in enumerate(slots):
        text = slot.get()
        pos, out = 0, []
        for span in by_slot.get(i, ()):
            if span.start < pos:  # overlapping spans of two rules: the first wins
                continue
            out.append(text[pos : span.start])
            out.append(MASK)
            pos = span.end
        out.append(text[pos:])
        parts.append("".join(out))
    return "\x1e".join(parts)


def restore(slots: Sequence[Slot], spans: Sequence[Span], recorded: dict[str, str]) -> list[str]:
    """Put recorded values back in place; returns the names of the rules that changed text."""
    changed: list[str] = []
    by_slot: dict[int, list[Span]] = {}
    for span in spans:
        value = recorded.get(span.key)
        if value is not None and value != span.value:
            by_slot.setdefault(span.slot, []).append(span)
    for i, slot_spans in by_slot.items():
        text = slots[i].get()
        pos, out = 0, []
        for span in slot_spans:
            if span.start < pos:
                continue
            out.append(text[pos : span.start])
            out.append(recorded[span.key])
            pos = span.end
            if span.rule.name not in changed:
                changed.append(span.rule.name)
        out.append(text[pos:])
        slots[i].set("".join(out))
    return changed
