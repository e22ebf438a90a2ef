"""Learning an agent's volatile spans from its own traffic (SPEC section 2d).

Packs know seven agents.  Any other agent shows its volatile spans itself: a
request that continues a recorded conversation of its tenant, yet whose system
text differs from what that lineage forwarded, is the agent rendering the same
prompt again with fresh values.  The two texts are compared
(:mod:`canonicalize.textdiff`) and each changed span is classed
(:mod:`canonicalize.values`): ``time``, ``date``, ``uuid``, ``hex_id``,
``counter`` or ``other``.

``canonicalize.learn`` says what becomes of them:

- ``suggest`` (the default): nothing the request forwards changes, nor its role;
  the spans are counted and each new pattern is logged once with a rule;
- ``pin``: the request continues the lineage, and every span of a class but
  ``other`` gets the value the lineage forwarded, as a ``pin`` rule would, once
  the evidence says it is a value (a ``counter`` only when its place has been
  seen changing twice, with two different changes: :mod:`canonicalize.sightings`;
  :meth:`Learned.settle` decides with the evidence the store returned); for
  ``time`` and ``date`` the model is told the current value in a note, as a
  ``date`` rule does (:mod:`canonicalize.notes`).  The edits are named
  ``learned.<class>``.  ``other`` changes reach the upstream as sent;
- ``off``: nothing of this runs.

Safety.  Which requests learn (:func:`learn_plan`): a continuation whose system
text is not the lineage's, or a root whose history extends a recorded request of
the same tenant *whole* (its every message, then a reply: two sessions that
merely share a first message are two roots; a lineage this one only branched
from counts when it is the only one) with the same session identity (hermes'
``Session ID``, the agents' session headers; a different one is another
session).  Among the lineages it could continue, the one whose text differs in
the fewest lines is taken (a session's own previous turn differs by its
per-turn values, another session's also by its session's values), then the
deepest; two equally close at one depth are two sessions the request cannot
tell apart, and it continues neither.  A request whose text kept less than
``MIN_KEPT`` of the lineage's outside its ``other`` changes is a different
prompt: nothing is learned from it.  Every span is short (``values.MAX_VALUE``),
a value inside an edited line is ``other``, and the rule a span suggests is its
generalized shape with its context (:mod:`canonicalize.spans`), never the
value.  Nothing here crosses tenants: the store's lookups and blobs are the
tenant's own.

The messages before the first reply, and the blocks an agent drops from its
history, are :mod:`canonicalize.recall`'s.

Cost: an agent whose system text comes back as the lineage forwarded it (the
packs' spans masked) never reaches this module; a request that does costs one
store call for the recorded texts, a line-level comparison with each candidate
lineage (at most the lookup's ``CANDIDATES``: :mod:`canonicalize.linediff`, bounded)
and a token-level one with the closest, which with its tool descriptions spends at
most one budget (:func:`canonicalize.textdiff.fresh`: characters tokenized, pairs
aligned) and stops as soon as the request cannot keep ``MIN_KEPT`` of the
lineage's text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from canonicalize import linediff, pins, sightings, textdiff, values
from canonicalize.analysis import Prepared
from canonicalize.lineage import Decision, ForkPolicy, LineageRecord, Lookup, fork_signal
from canonicalize.linediff import Hunk
from canonicalize.ruleset import LearnMode
from canonicalize.spans import TOLD, Span, spans_of
from canonicalize.wire.base import Exchange, Slot

Mode = LearnMode
MODES: tuple[Mode, ...] = ("off", "suggest", "pin")
CLASSES = values.CLASSES
PINNED = CLASSES[:-1]  # every class but other
REWRITES = (*(f"learned.{c}" for c in PINNED), "learned.history")  # (history: canonicalize.recall)
MIN_KEPT = 0.5  # share of the lineage's text a request must keep outside its "other" changes
MAX_SPANS = 64  # value changes in one request: more is a different prompt, not fresh values
SEP = "\n\x1e\n"  # between a request's system texts when they are compared as one


@dataclass(frozen=True, slots=True)
class Plan:
    """Which lineages a request may learn from, and the blobs that takes."""

    candidates: tuple[tuple[LineageRecord, int], ...]  # (record, depth), deepest and most recent first
    refs: tuple[str, ...]
    decided: bool  # the decision already continues the one candidate (its text changed)


@dataclass(frozen=True, slots=True)
class Learned:
    """What a request learned, and (``pin``) what it may forward because of it: which
    spans are pinned is settled with their evidence (:meth:`settle`)."""

    spans: tuple[Span, ...]  # every change found, ``other`` included
    decision: Decision  # the decision to finalize (``pin``: it continues ``parent``)
    lookup: Lookup  # the lookup to finalize with (``pin``: as deep as the parent is)
    pin: bool = False  # the pins below apply
    base: tuple[str, ...] = ()  # the system texts after the lineage's pack pins, which ``texts`` pin
    compared: _Compared | None = None  # the system texts against the lineage's, value by value
    tool_spans: tuple[Span, ...] = ()  # the spans of the tool descriptions
    tools: bytes | None = None  # the lineage's tools[] (every difference a value in a description)

    @property
    def refs(self) -> tuple[str, ...]:
        """The evidence blobs settling the pins takes (:mod:`canonicalize.sightings`)."""
        return sightings.refs(self.spans) if self.pin else ()

    def settle(self, blobs: Mapping[str, bytes]) -> Settled:
        """The pins, given the evidence blobs the store returned for :attr:`refs`."""
        writes: dict[str, bytes] = {}
        allowed: set[int] = set()
        for i, span in enumerate(self.spans):
            if span.cls == "other":
                continue
            verdict = sightings.judge(span, blobs)
            writes.update(verdict.writes)
            if verdict.pinned:
                allowed.add(i)
        system = [s for i, s in enumerate(self.spans) if i in allowed and s.scope == "system"]
        tools_ok = self.tools is not None and all(
            i in allowed for i, s in enumerate(self.spans) if s.scope == "tools" and s.cls != "other"
        )
        texts = self.compared.pinned({id(s) for s in system}) if self.compared is not None and system else None
        kept = [s for s in self.spans if s.scope == "system" and s in system] if texts is not None else []
        kept += [s for s in self.spans if s.scope == "tools" and s.cls != "other"] if tools_ok else []
        return Settled(
            spans=tuple(kept),
            texts=texts or (),
            tools=self.tools if tools_ok else None,
            told=tuple(s.new for s in kept if s.cls in TOLD),
            writes=writes,
        )


@dataclass(frozen=True, slots=True)
class Settled:
    """The learned pins a request forwards, and the evidence it leaves."""

    spans: tuple[Span, ...]  # the spans pinned
    texts: tuple[str, ...]  # the system texts to forward (empty: forwarded as they are)
    tools: bytes | None  # the lineage's tools[] to forward
    told: tuple[str, ...]  # time / date values the model is told
    writes: dict[str, bytes]  # evidence blobs to store


def learn_plan(prep: Prepared, lookup: Lookup, decision: Decision, policy: ForkPolicy) -> Plan | None:
    """The lineages ``prep`` may learn from (module docstring), or None: nothing to learn.
    Pure and cheap: it only compares what the lookup and the analysis found."""
    sig = prep.signals
    parent = decision.parent
    if decision.role == "continuation" and parent is not None:
        if parent.kind != "root":
            return None
        system = sig.skeleton != parent.skeleton and parent.system_ref is not None
        tools = _tools_changed(prep, parent)
        if not (system or tools):
            return None
        wanted = (parent.system_ref if system else None, parent.tools_ref if tools else None)
        return Plan(((parent, lookup.depth),), tuple(r for r in wanted if r is not None), True)
    if decision.role != "root" or not lookup.depth:
        return None
    whole: list[tuple[LineageRecord, int]] = []
    branched: list[tuple[LineageRecord, int]] = []
    for i, rec in enumerate(lookup.candidates):
        depth = lookup.depth_of(i)
        if _continues(prep, rec, depth):
            (whole if _replays_last(rec, depth) else branched).append((rec, depth))
    # Lineages whose last request this one replays whole; else a lone one it branched
    # from (its last request went another way: a fork no signal told, a retry with a new
    # last message).  Two or more such are sessions that went further than this one.
    # Every one at the two deepest depths is compared: the request's own session must be
    # among them (another session with the same messages may own a link one deeper, its
    # reply or its next message), or another session's would be the closest.
    depths = sorted({d for _, d in whole}, reverse=True)[:2]
    found = [(r, d) for r, d in whole if d in depths] or (branched if len(branched) == 1 else [])
    if not found:
        return None
    refs: list[str] = []
    for rec, _ in found:
        for ref in (rec.system_ref, rec.tools_ref if _tools_changed(prep, rec) else None):
            if ref is not None and ref not in refs:
                refs.append(ref)
    return Plan(tuple(found), tuple(refs), False)


def _continues(prep: Prepared, rec: LineageRecord, depth: int) -> bool:
    """``prep`` replays ``rec``'s history to ``depth``, then a reply (recorded or not: one
    at or before ``depth``), in the same session identity."""
    sig = prep.signals
    if rec.kind != "root" or rec.system_ref is None or sig.identity != rec.identity:
        return False
    return sig.first_assistant is not None and sig.first_assistant <= depth


def _replays_last(rec: LineageRecord, depth: int) -> bool:
    """The request replays ``rec``'s last request whole (its every message)."""
    return rec.fingerprint is not None and depth >= rec.fingerprint.n_messages


def _tools_changed(prep: Prepared, rec: LineageRecord) -> bool:
    return prep.tools is not None and rec.tools_ref is not None and prep.tools.meaning != rec.tools_meaning


def learn_spans(
    prep: Prepared,
    lookup: Lookup,
    decision: Decision,
    plan: Plan,
    blobs: dict[str, bytes],
    mode: Mode,
    policy: ForkPolicy,
) -> Learned | None:
    """What ``prep`` learns from the lineages of ``plan`` (their blobs in ``blobs``): the
    spans, and with ``mode`` ``pin`` the decision and the pins to finalize with."""
    scored: list[tuple[tuple[int, int], int, LineageRecord, _Lines | None]] = []
    for rec, depth in plan.candidates:
        found = _lines_against(prep, rec, blobs)
        if found is None and not plan.decided:
            continue
        scored.append((found.score if found is not None else (0, 0), depth, rec, found))
    if not scored:
        return None
    # The lineage whose text differs in the fewest lines (another session's differs by
    # its own values too), then the deepest; two lineages alike in both are two sessions
    # this request cannot tell apart: it learns, but continues neither.
    scored.sort(key=lambda x: (x[0][0], -x[1], x[0][1]))  # stable: the lookup's order among equals
    _, depth, rec, first = scored[0]
    ambiguous = len(scored) > 1 and scored[1][0][0] == scored[0][0][0] and scored[1][1] == depth
    budget = textdiff.fresh()  # the request's, for its system texts and tool descriptions
    compared, spent = _compare(first, budget) if first is not None else (None, textdiff.NOTHING)
    if compared is None and not plan.decided:
        return None  # the closest is not the same prompt rendered again: nothing to learn from
    system = compared.spans() if compared is not None else ()
    tools = _tools(prep, rec, blobs, budget.less(spent))
    spans = system + (tools[0] if tools is not None else ())
    if not spans:
        return None
    keep = Learned(spans, decision, lookup)
    system_pins = [s for s in system if s.cls != "other"]
    if mode != "pin":
        return keep
    if not plan.decided:
        if compared is None or not system_pins or ambiguous:
            return keep  # nothing tells this request continues that lineage (or that one alone)
        narrowed = Lookup(depth, (rec,), lookup.declared, (depth,))
        signal = fork_signal(prep.signals.at_depth(depth), rec, depth, policy)
        if signal is not None:  # a fork that started like its parent but for fresh values
            return keep if compared.diff.others else Learned(spans, Decision("fork", rec, signal), narrowed)
        decision, lookup = Decision("continuation", rec), narrowed
    tool_pins = [s for s in tools[0] if s.cls != "other"] if tools is not None and tools[1] is not None else []
    if not system_pins and not tool_pins:
        return Learned(spans, decision, lookup)
    return Learned(
        spans,
        decision,
        lookup,
        pin=True,
        base=compared.base if compared is not None else (),
        compared=compared if system_pins else None,
        tool_spans=tuple(tool_pins),
        tools=tools[1] if tools is not None else None,
    )


@dataclass(frozen=True, slots=True)
class _Lines:
    """A request's system texts against a lineage's, line by line (the cheap step)."""

    old: str  # the lineage's texts, joined by SEP
    new: str  # the request's, its pack pins restored, joined
    base: tuple[str, ...]  # the request's, its pack pins restored
    hunks: list[Hunk]

    @property
    def score(self) -> tuple[int, int]:
        """(lines that differ, characters they hold)."""
        lines = chars = 0
        for o1, o2, n1, n2, _ in self.hunks:
            lines += max(self.old.count("\n", o1, o2), self.new.count("\n", n1, n2), 1)
            chars += o2 - o1 + n2 - n1
        return lines, chars


@dataclass(frozen=True, slots=True)
class _Compared:
    """A request's system texts compared with a lineage's, value by value."""

    diff: textdiff.Diff
    old: str
    new: str
    base: tuple[str, ...]
    _spans: tuple[Span, ...] = ()

    def spans(self) -> tuple[Span, ...]:
        return self._spans

    def __post_init__(self) -> None:
        object.__setattr__(self, "_spans", spans_of(self.diff.changes, self.old, self.new, "system"))

    def pinned(self, allowed: set[int]) -> tuple[str, ...] | None:
        """The request's texts with every value change whose span (by ``id``) is in
        ``allowed`` given the lineage's value."""
        out: list[str] = []
        pos = 0
        for c, span in zip(self.diff.changes, self._spans, strict=True):
            if c.cls == "other" or id(span) not in allowed:
                continue
            out += (self.new[pos : c.nstart], self.old[c.ostart : c.oend])
            pos = c.nend
        out.append(self.new[pos:])
        pinned = tuple("".join(out).split(SEP))
        return pinned if len(pinned) == len(self.base) else None  # (never: a value holds no newline)


def _lines_against(prep: Prepared, rec: LineageRecord, blobs: dict[str, bytes]) -> _Lines | None:
    """The request's system texts (the lineage's pack pins restored) against the ones
    ``rec`` forwarded, line by line; None when there are none to compare."""
    blob = blobs.get(rec.system_ref or "")
    if blob is None:
        return None
    old = recorded_texts(prep.exchange, blob)
    base = restored(prep, rec.pins)
    if old is None or bool(old) != bool(base) or any("\x1e" in t for t in (*old, *base)):
        return None  # (none: another wire API's system part; links of equal messages are equal)
    old_text, new_text = SEP.join(old), SEP.join(base)
    return _Lines(old_text, new_text, base, linediff.lines(old_text, new_text))


def _compare(found: _Lines, budget: textdiff.Budget) -> tuple[_Compared | None, textdiff.Budget]:
    """The value changes of ``found`` (None when they are not one prompt rendered
    again), and what finding them spent of ``budget``."""
    diff = textdiff.changes(found.old, found.new, found.hunks, keep=MIN_KEPT, budget=budget)
    if len(diff.values) > MAX_SPANS or diff.kept < MIN_KEPT:
        return None, diff.spent
    return _Compared(diff, found.old, found.new, found.base), diff.spent


def recorded_texts(exchange: Exchange, blob: bytes) -> tuple[str, ...] | None:
    """The system texts of a recorded system part (``Exchange.system_blob``'s bytes)."""
    body: dict[str, Any] = {exchange.items_key: []}
    try:
        exchange.set_system(body, blob)
        return tuple(s.get() for s in exchange.system_slots(body))
    except (ValueError, KeyError, TypeError, AssertionError):  # not a system part this exchange wrote
        return None


def restored(prep: Prepared, recorded: dict[str, str]) -> tuple[str, ...]:
    """The request's system texts with the lineage's pack pins restored (what a
    continuation would forward before learning), computed on copies."""
    n = len(prep.system_slots)
    copies = [Slot([s.get()], 0, ()) for s in prep.system_slots]
    pins.restore(copies, [s for s in prep.spans if s.slot < n], recorded)
    return tuple(c.get() for c in copies)


def _tools(
    prep: Prepared, rec: LineageRecord, blobs: dict[str, bytes], budget: textdiff.Budget
) -> tuple[tuple[Span, ...], bytes | None] | None:
    """The tool descriptions' spans against ``rec``'s tools[], and its bytes when every
    difference between the two lists is a value in a description (then pinned whole);
    ``budget``: what all the descriptions' comparisons may spend."""
    if not _tools_changed(prep, rec) or rec.tools_ref not in blobs:
        return None
    blob = blobs[rec.tools_ref or ""]
    try:
        old = orjson.loads(blob)
    except orjson.JSONDecodeError:
        return None
    pairs = _descriptions(old, prep.exchange.tools(prep.body))
    if not pairs:
        return None
    found: list[Span] = []
    whole = True
    for o, n in pairs:
        diff = textdiff.changes(o, n, budget=budget)
        budget = budget.less(diff.spent)
        if diff.others or len(diff.values) > MAX_SPANS:
            whole = False
        found += spans_of(diff.changes, o, n, "tools")
    return tuple(found), blob if whole else None


def _descriptions(old: Any, new: Any) -> list[tuple[str, str]] | None:
    """The (old, new) description strings that differ between two tool lists; None
    when anything else differs."""
    if isinstance(old, dict) and isinstance(new, dict):
        if old.keys() != new.keys():
            return None
        out: list[tuple[str, str]] = []
        for key, o in old.items():
            n = new[key]
            if key == "description" and isinstance(o, str) and isinstance(n, str):
                if o != n:
                    out.append((o, n))
                continue
            found = _descriptions(o, n)
            if found is None:
                return None
            out += found
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return None
        out = []
        for o, n in zip(old, new, strict=True):
            found = _descriptions(o, n)
            if found is None:
                return None
            out += found
        return out
    return [] if type(old) is type(new) and old == new else None
