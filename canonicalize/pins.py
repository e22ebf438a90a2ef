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


def find_spans(rules: Sequence[Rule], slots: Sequence[Slot]) -> list[Span]:
    """Every span of every pin rule in ``slots`` (in slot, then position order).

    A span's key is its rule's name and the hash of its line with every pinned span on
    that line masked (another span's fresh value on the same line does not make it a
    new line); the line runs from the one the span starts on to the end of the one it
    ends on.  That masked line is the same for every span of it, so it is hashed once
    per line, and each span finds its line from the previous one's: linear in the
    text and the spans (a prompt of 30,000 dated lines, or one line of as many dates)."""
    spans: list[Span] = []
    for i, slot in enumerate(slots):  # (so the spans come in slot, then position order)
        text = slot.get()
        found = [(start, end, rule) for rule in rules for start, end in rule.spans(text)]
        if not found:
            continue
        if len(found) > 1:
            found.sort(key=_first)  # by position; rules in order at one position
        hashes: dict[tuple[int, int], str] = {}  # (line start, line end) -> its masked hash
        line_start = line_end = last_start = last_end = -1
        first = 0  # the first span that starts on the line
        for k, (start, end, rule) in enumerate(found):
            newline = text.rfind("\n", max(last_start, 0), start)  # (none since the previous span's start: its line)
            if newline >= 0 or line_start < 0:
                line_start, first = newline + 1, k
            if not last_end <= end <= line_end:  # (else the previous span's line ends there too)
                line_end = text.find("\n", end)
                line_end = len(text) if line_end < 0 else line_end
            last_start, last_end = start, end
            line = (line_start, line_end)
            masked = hashes.get(line)
            if masked is None:
                masked = hashes[line] = _masked_line(text, line_start, line_end, found, first)
            spans.append(Span(rule, i, start, end, f"{rule.name}:{masked}", text[start:end]))
    return spans


def _masked_line(text: str, line_start: int, line_end: int, found: Sequence[tuple[int, int, Rule]], first: int) -> str:
    """The hash of ``text[line_start:line_end]`` with every span of ``found`` (sorted by
    start; ``first``: the first that starts on the line) that lies on it masked, the
    first of overlapping ones."""
    parts: list[str] = []
    pos = line_start
    for k in range(first, len(found)):
        s, e, _ = found[k]
        if s >= line_end:
            break
        if e > line_end or s < pos:
            continue
        parts += (text[pos:s], MASK)
        pos = e
    parts.append(text[pos:line_end])
    return xxhash.xxh64_hexdigest("".join(parts).encode("utf-8", "surrogatepass"))


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
