"""Step 3, :func:`finalize`: the classified request as edits, and what to record.

Each role has its function:

- :func:`_root` starts a lineage: its record holds the request's pin values,
  identity and skeleton as they are;
- :func:`_continuation` extends a root lineage: pinned spans get the lineage's
  recorded values back, date notes go where the lineage put them, tools[] that
  mean what the lineage's mean are forwarded as the lineage's recorded bytes;
- :func:`_fork` forwards a new fork, or a fork's own later request, with its
  parent's system part, tools[] and params (:mod:`canonicalize.repair`).

:func:`_outcome` then turns what the role decided into an :class:`Outcome`: the
edits (each string that differs from what was sent, and the structural
replacements), the refs of the system part and tools[] as forwarded, the
fingerprint, and the record evolved once with all of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from canonicalize import analysis, chain, identity, notes, pins, recall
from canonicalize.analysis import Prepared
from canonicalize.edits import Op, SetString, SetValue
from canonicalize.jsonspan import Path
from canonicalize.learn import Learned, Settled
from canonicalize.lineage import Decision, Fingerprint, LineageRecord, Lookup, Role
from canonicalize.memo import Memos
from canonicalize.repair import branch, repair_fork, set_tools
from canonicalize.ruleset import RuleSet
from canonicalize.spans import TOLD, Span
from canonicalize.texts import Texts

TOOLS_RULE = "lineage.tools"  # forwarded the lineage's recorded tools[] bytes
RESTORED_PER_TEXT = 8  # sets of pinned values remembered restored per system text
_NOTHING: Mapping[str, bytes] = {}


class Outcome(NamedTuple):
    """The result: what to forward, what to record, what to count.  Immutable (a
    NamedTuple: made per request, it costs a quarter of a frozen dataclass)."""

    ops: list[Op]
    role: Role
    rewrites: list[str]
    record: LineageRecord
    links: list[bytes]  # links the lineage now owns (stores prepend its id)
    touch: list[str]  # blob refs that already exist and must stay alive
    new_blobs: tuple[str, ...]  # "system" / "tools": the forwarded bytes to store after sending
    offered: frozenset[str] | None  # fork tool guard: tools the request itself offered
    fork_action: str | None = None  # forks_total{action}
    parent_fp: Fingerprint | None = None
    fork_signal: str | None = None
    depth: int = 0  # how many of the request's links were recorded (the prefix its parent shares)
    learned: tuple[Span, ...] = ()  # the spans learned from this request (canonicalize.learn)
    # What the request leaves to every conversation of its tenant, kept apart from its
    # own (the stores keep them once per tenant): the evidence learning leaves
    # (canonicalize.sightings), stored under these refs as is; and the links a new root
    # marks (its first message's stem and template lines: canonicalize.recall), each
    # kept with the lineage's id and its first message's ref.
    shared_blobs: Mapping[str, bytes] = _NOTHING
    marks: tuple[bytes, ...] = ()
    # Forwarded values to store as blobs after the request, each under its ref: the
    # lineage's newest user message as forwarded (canonicalize.recall).
    keep_items: tuple[tuple[Path, str], ...] = ()


@dataclass(slots=True)
class _Applied:
    """What a role's function decided, before the forwarded parts are recorded."""

    role: Role
    record: LineageRecord  # the lineage's record before this request
    changes: dict[str, Any] = field(default_factory=dict)  # to the record, applied once
    structural: list[Op] = field(default_factory=list)  # edits beyond the strings a rule changed
    fork_action: str | None = None
    offered: frozenset[str] | None = None
    parent_fp: Fingerprint | None = None
    repaired: bool = False  # forwards a fork parent's system part and tools[]
    shared_blobs: dict[str, bytes] = field(default_factory=dict)  # Outcome.shared_blobs
    keep_items: list[tuple[Path, str]] = field(default_factory=list)  # Outcome.keep_items
    marks: list[bytes] = field(default_factory=list)  # Outcome.marks
    restored: recall.Restored | None = None  # messages forwarded as recorded


def blobs_needed(
    prep: Prepared,
    decision: Decision,
    learned: Learned | None = None,
    *,
    lookup: Lookup | None = None,
    keep_history: bool = False,
) -> tuple[str, ...]:
    """The recorded blobs finalizing ``decision`` needs: a fork's parent's system
    and tools[]; a continuation's recorded tools[] when the request's tools mean
    the same but are written differently and (``keep_history``, with its ``lookup``)
    the lineage's recorded messages: all of them in the lineage's conversation (the
    evidence its learned spans need is the tenant's: :func:`evidence_needed`)."""
    parent = decision.parent
    if parent is None:
        return ()
    if decision.role == "fork" or parent.kind == "fork":
        if parent.system_ref is None or parent.tools_ref is None:
            return ()
        return parent.system_ref, parent.tools_ref
    out: tuple[str, ...] = ()
    if _recorded_tools(prep, parent) and parent.tools_ref is not None:
        out = (parent.tools_ref,)
    if keep_history and lookup is not None:
        out += tuple(r for r in recall.refs(prep, lookup, parent) if r not in out)
    return out


def evidence_needed(decision: Decision, learned: Learned | None) -> tuple[str, ...]:
    """The tenant's evidence blobs settling ``learned``'s pins take (a continuation's,
    with ``learn: pin``: :mod:`canonicalize.sightings`)."""
    parent = decision.parent
    if learned is None or not learned.pin or parent is None or decision.role == "fork" or parent.kind == "fork":
        return ()
    return learned.refs


def finalize(
    rules: RuleSet,
    memos: Memos,
    prep: Prepared,
    lookup: Lookup,
    decision: Decision,
    *,
    new_id: str,
    blobs: dict[str, bytes],
    learned: Learned | None = None,
    keep_history: bool = False,
    head: recall.Head | None = None,
) -> Outcome:
    """Pins, date notes, the lineage's tools[] and fork repair, as edits, and what
    to record.  A fork (or a fork's own later request) whose parent's blobs are
    missing is forwarded as a new root, never half-repaired.  ``learned``: what the
    request learned (:mod:`canonicalize.learn`); its pins apply to a continuation.
    ``keep_history`` (``learn: pin``): the lineage keeps its newest user message as
    forwarded and forwards it again when the agent drops a block from it
    (:mod:`canonicalize.recall`)."""
    rewrites = list(prep.rewrites)
    parent = decision.parent
    fork_action = "disabled" if decision.fork_disabled else None
    if decision.role == "root" or parent is None:
        applied = _root(prep, new_id, fork_action)
    elif decision.role == "fork" or parent.kind == "fork":
        if all(ref in blobs for ref in blobs_needed(prep, decision)):
            applied = _fork(rules, prep, lookup, decision.role, parent, new_id, blobs, rewrites)
        else:
            applied = _root(prep, new_id, "missing_parent")
    else:
        pinned = learned if learned is not None and learned.pin else None
        applied = _continuation(rules, memos.texts, prep, lookup, parent, blobs, rewrites, fork_action, pinned)
        if keep_history:
            _keep_history(prep, lookup, parent, blobs, applied, rewrites, head)
    if keep_history and applied.role != "fork":
        _keep_tail(prep, lookup, applied)
    spans = learned.spans if learned is not None else ()
    if head is not None and applied.restored is not None:
        spans += head.spans
    return _outcome(rules, memos.texts, prep, lookup, decision, applied, rewrites, spans)


def _keep_history(
    prep: Prepared,
    lookup: Lookup,
    parent: LineageRecord,
    blobs: dict[str, bytes],
    applied: _Applied,
    rewrites: list[str],
    head: recall.Head | None,
) -> None:
    """The lineage's messages the agent dropped a block from (or, ``head``, changed the
    values of its template lines in), forwarded as recorded; the model is told a date
    or time it no longer sees."""
    restored = recall.restore(prep, lookup, parent, blobs, head)
    if not restored.ops:
        return
    applied.structural += restored.ops
    applied.changes["restores"] = restored.restores
    applied.restored = restored
    names = [recall.RULE] if head is None or head.dropped else []
    if head is not None and 0 in restored.indices:
        names += [f"learned.{s.cls}" for s in head.spans]
        told = [s.new for s in head.spans if s.cls in TOLD]
        if told:
            sig = prep.signals
            said = applied.changes.get("notes", parent.notes)
            added = notes.told(told, said, newest_user=sig.last_user_index, depth=0, message=_newest_user_hash(prep))
            applied.changes["notes"] = tuple(said) + tuple(added)
            _apply_notes(prep, added, rewrites, learned=True)
    rewrites.extend(n for n in dict.fromkeys(names) if n not in rewrites)


def _keep_tail(prep: Prepared, lookup: Lookup, applied: _Applied) -> None:
    """The request's newest user message, new in it, kept as forwarded (the lineage's
    tail); a root's stem too (:mod:`canonicalize.recall`)."""
    found = recall.tail(prep, 0 if applied.role == "root" else lookup.depth)  # a root's every message is its own
    if found is not None:
        index, ref, path = found
        applied.changes["tail"] = (index, ref)
        applied.keep_items.append((path, ref))
    if applied.role == "root":
        if found is not None and found[0] == 0:
            applied.changes["first"] = found[1]
        stem = recall.stem(prep)
        if stem is not None:
            applied.marks.append(stem)
        applied.marks += recall.templates(prep)


def _root(prep: Prepared, new_id: str, fork_action: str | None) -> _Applied:
    """A new lineage, recorded as the request is."""
    sig, tools = prep.signals, prep.tools
    own_tools = tools.names if tools else ()
    record = LineageRecord(
        id=new_id,
        root=new_id,
        identity=sig.identity,
        skeleton=sig.skeleton,
        head=sig.head,
        pins=_first_values(prep.spans),
        tool_order=own_tools,
        own_tools=own_tools,
        tools_meaning=tools.meaning if tools else "",
    )
    return _Applied("root", record, fork_action=fork_action)


def _continuation(
    rules: RuleSet,
    texts: Texts,
    prep: Prepared,
    lookup: Lookup,
    parent: LineageRecord,
    blobs: dict[str, bytes],
    rewrites: list[str],
    fork_action: str | None,
    learned: Learned | None,
) -> _Applied:
    """The next request of a root lineage: its pins, notes and tools[] as recorded;
    ``learned``: the spans learned from it, pinned."""
    sig, tools = prep.signals, prep.tools
    own_tools = tools.names if tools else ()
    changed = _restore(texts, prep, parent.pins)
    rewrites.extend(n for n in changed if n not in rewrites)
    merged = dict(_first_values(prep.spans))
    merged.update(parent.pins)
    dates = notes.moved(prep.spans, parent.pins)
    new_user = sig.last_user_index is not None and sig.last_user_index >= lookup.depth
    # Where a note would go (as the agent sent it): hashed only when one may be added.
    newest = _newest_user_hash(prep) if new_user and (dates or learned is not None) else ""
    # The lineage's notes where their messages are now; one whose message the agent no
    # longer sends is gone with it (and its date is told again if it still applies).
    kept = tuple(_apply_notes(prep, parent.notes, rewrites, learned=learned is not None))
    added = notes.told(dates, kept, newest_user=sig.last_user_index, depth=lookup.depth, message=newest)
    skeleton, head = sig.skeleton, sig.head
    settled = learned.settle(blobs) if learned is not None else None
    if learned is not None and settled is not None:
        if _pin_learned(texts, prep, learned, settled):
            # What the lineage forwards now: a request sending it again is this session's.
            skeleton, head = analysis.shape_of(rules, texts, prep.scope, [s.get() for s in prep.system_slots])
        for span in settled.spans:
            name = f"learned.{span.cls}"
            if name not in rewrites:
                rewrites.append(name)
        said = kept + tuple(added)
        added += notes.told(settled.told, said, newest_user=sig.last_user_index, depth=lookup.depth, message=newest)
    changes: dict[str, Any] = {
        "identity": sig.identity or parent.identity,
        "skeleton": skeleton,
        "head": head,
        "pins": merged,
        "own_tools": own_tools,
        "notes": kept + tuple(added),
    }
    _apply_notes(prep, added, rewrites, learned=learned is not None)
    structural = _lineage_tools(prep, parent, blobs, settled, rewrites, changes)
    applied = _Applied("continuation", parent, changes, structural, fork_action, parent_fp=parent.fingerprint)
    if settled is not None:
        applied.shared_blobs = settled.writes
    return applied


def _lineage_tools(
    prep: Prepared,
    parent: LineageRecord,
    blobs: dict[str, bytes],
    settled: Settled | None,
    rewrites: list[str],
    changes: dict[str, Any],
) -> list[Op]:
    """A continuation's tools[]: the lineage's recorded bytes when learning pinned
    their descriptions, or when the request's mean the same but are written
    otherwise; else the request's own, their meaning recorded when it changed."""
    tools = prep.tools
    if settled is not None and settled.tools is not None:  # descriptions pinned: the lineage's tools[]
        set_tools(prep.exchange, prep.body, orjson.loads(settled.tools))
        return [SetValue(prep.exchange.tools_path(prep.body), settled.tools)]
    if _recorded_tools(prep, parent) and parent.tools_ref in blobs:
        blob = blobs[parent.tools_ref]
        op = SetValue(prep.exchange.tools_path(prep.body), blob)
        set_tools(prep.exchange, prep.body, orjson.loads(blob))
        rewrites.append(TOOLS_RULE)
        return [op]
    if tools is not None and tools.meaning != parent.tools_meaning:
        changes.update(tools_meaning=tools.meaning, tool_order=tools.names)
    return []


def _fork(
    rules: RuleSet,
    prep: Prepared,
    lookup: Lookup,
    role: Role,
    parent: LineageRecord,
    new_id: str,
    blobs: dict[str, bytes],
    rewrites: list[str],
) -> _Applied:
    """A new fork of ``parent`` (``role`` fork), or a fork's own later request (a
    continuation of the fork ``parent``): forwarded as the parent."""
    sig = prep.signals
    own_tools = prep.tools.names if prep.tools else ()
    if role == "fork":
        record = LineageRecord(
            id=new_id,
            kind="fork",
            parent=parent.id,
            root=parent.root_id,
            identity=sig.identity,
            skeleton=sig.skeleton,
            head=sig.head,
            own_tools=own_tools,
            tool_order=parent.tool_order,
            system_ref=parent.system_ref,
            tools_ref=parent.tools_ref,
            tools_meaning=parent.tools_meaning,
            params=dict(parent.params),
            notes=parent.notes,
            branch=branch(prep, lookup),
            replica=parent.replica,  # a fork goes where its parent's prefix is cached
        )
        action = "repaired"
    else:
        record, action = parent, "continued"
    _apply_notes(prep, record.notes, rewrites)
    structural = repair_fork(rules.fork.inherit_params, prep, record, blobs, rewrites)
    offered = frozenset(own_tools) if rules.fork.guard_tools else None
    return _Applied("fork", record, {}, structural, action, offered, parent.fingerprint, repaired=True)


def _outcome(
    rules: RuleSet,
    texts: Texts,
    prep: Prepared,
    lookup: Lookup,
    decision: Decision,
    applied: _Applied,
    rewrites: list[str],
    learned: tuple[Span, ...],
) -> Outcome:
    """The edits, the refs and fingerprint of what is forwarded, and the record."""
    body, exchange, record = prep.body, prep.exchange, applied.record
    if not applied.repaired:
        # The system texts as forwarded, as the objects kept for them: an equal text,
        # so nothing forwarded changes, whose hash and UTF-8 are already known.
        for slot in prep.system_slots:
            slot.set(texts.intern(prep.scope, slot.get()))
    ops: list[Op] = [SetString(path, slot.get()) for path, (slot, text) in prep.originals.items() if slot.get() != text]
    ops += applied.structural
    # What the lineage forwarded: refs by the parse, bytes stored after sending.
    system_ref = identity.system_ref(texts, exchange.system_value(body), prep.scope)
    tools_ref = _forwarded_tools_ref(rules, prep)
    new_blobs = tuple(n for n, ref, had in _parts(system_ref, tools_ref, record) if ref != had)
    touch = [ref for _, ref, had in _parts(system_ref, tools_ref, record) if ref == had]
    fingerprint = _fingerprint(rules, texts, prep, tools_ref, repaired=applied.repaired)
    changes = applied.changes
    if applied.role != "fork":
        changes["params"] = _params(rules.fork.inherit_params, prep)
    record = record.evolve(
        **changes, system_ref=system_ref, tools_ref=tools_ref, fingerprint=fingerprint, requests=record.requests + 1
    )
    start, depth = _recorded_from(prep, lookup, applied)
    return Outcome(
        ops=ops,
        role=applied.role,
        rewrites=rewrites,
        record=record,
        links=prep.links[start:],
        touch=touch,
        new_blobs=new_blobs,
        offered=applied.offered,
        fork_action=applied.fork_action,
        parent_fp=applied.parent_fp,
        fork_signal=decision.signal if applied.fork_action == "repaired" else None,
        depth=depth,
        learned=learned,
        shared_blobs=applied.shared_blobs,
        marks=tuple(applied.marks),
        keep_items=tuple(applied.keep_items),
    )


def _fingerprint(rules: RuleSet, texts: Texts, prep: Prepared, tools_ref: str, *, repaired: bool) -> Fingerprint:
    """What prefix prediction compares of the request as forwarded."""
    body, exchange = prep.body, prep.exchange
    return identity.fingerprint(
        texts,
        rules.fork.inherit_params,
        body,
        exchange,
        tools_ref=tools_ref,
        tools_len=prep.tools.size if prep.tools else 0,
        n_messages=len(prep.links),
        # A repaired fork forwards its parent's system messages; otherwise they are the
        # request's own, found once by prepare (their texts as edited since).
        system_slots=exchange.system_slots(body) if repaired else prep.system_slots,
        scope=prep.scope,
    )


def _parts(system_ref: str, tools_ref: str, record: LineageRecord) -> tuple[tuple[str, str, str | None], ...]:
    """The system part and tools[] as forwarded, by name: (name, ref, the ref the
    lineage recorded before)."""
    return ("system", system_ref, record.system_ref), ("tools", tools_ref, record.tools_ref)


def _recorded_from(prep: Prepared, lookup: Lookup, applied: _Applied) -> tuple[int, int]:
    """The first of the request's links its lineage now owns, and how much of the
    request its parent had (``Outcome.depth``)."""
    if applied.fork_action == "repaired":
        start = branch(prep, lookup)
    elif applied.role == "root":
        # A root owns its whole history, replayed or not: a later request of it that
        # rewinds into the replayed part finds it (canonicalize.predict's parent).
        start = 0
    else:
        start = max(lookup.depth - 1, 0)
    depth = lookup.depth
    if applied.restored is not None and applied.restored.new is not None:
        # The agent's own form of the restored message from there on (its next request
        # finds it), and the prefix shared is the lineage's whole history.
        start = min(start, applied.restored.new)
        depth = max(depth, applied.parent_fp.n_messages if applied.parent_fp is not None else depth)
    return start, depth


def _restore(texts: Texts, prep: Prepared, recorded: dict[str, str]) -> list[str]:
    """``pins.restore(prep.slots, prep.spans, recorded)``, each system slot's result
    kept with its text (by the recorded values of its spans, which with the text
    determine it): a lineage's turns restore the same values into the same prompt,
    and get the same text object back, whose UTF-8 and fingerprint are known."""
    changed: list[str] = []
    n = len(prep.system_slots)
    by_slot: dict[int, list[pins.Span]] = {}
    for span in prep.spans:
        by_slot.setdefault(span.slot, []).append(span)
    for i, slot in enumerate(prep.system_slots):
        mine = by_slot.get(i)
        if not mine:
            continue
        values = tuple([recorded.get(s.key) for s in mine])
        entry = texts.entry(prep.scope, slot.get())
        hit: tuple[str, tuple[str, ...]] | None = texts.found_among(entry, "restored", values)
        if hit is None:
            names = pins.restore(prep.slots, mine, recorded)
            hit = texts.intern(prep.scope, slot.get()), tuple(names)
            hit = texts.derive_among(entry, "restored", values, hit, len(hit[0]), most=RESTORED_PER_TEXT)
        slot.set(hit[0])
        changed += [name for name in hit[1] if name not in changed]
    rest = [s for s in prep.spans if s.slot >= n]
    if rest:
        changed += [name for name in pins.restore(prep.slots, rest, recorded) if name not in changed]
    return changed


def _pin_learned(texts: Texts, prep: Prepared, learned: Learned, settled: Settled) -> bool:
    """The system texts with the settled learned spans pinned, when they are still the
    texts learning compared (the lineage's pack pins restored); True if they were set."""
    slots = prep.system_slots
    if not settled.texts or len(learned.base) != len(slots):
        return False
    if any(s.get() != b for s, b in zip(slots, learned.base, strict=True)):
        return False
    for slot, text in zip(slots, settled.texts, strict=True):
        slot.set(texts.intern(prep.scope, text))
    return True


def _apply_notes(
    prep: Prepared, recorded: Sequence[notes.Note], rewrites: list[str], *, learned: bool = False
) -> list[notes.Note]:
    """The lineage's date notes, each on the user message it was first added to,
    wherever the agent put it now (named by the date rule, else by learning's class);
    the notes placed, as recorded (their index now where the message is)."""
    if not recorded:
        return []
    rule = next((s.rule.name for s in prep.spans if s.rule.action == "date"), None)
    history = prep.history
    known: dict[int, str | None] = {}

    def hashes(index: int) -> str | None:
        if index not in known:
            j = index - prep.offset
            msg = history[j] if 0 <= j < len(history) else None
            known[index] = message_hash(prep, msg) if msg is not None and prep.exchange.is_user(msg) else None
        return known[index]

    # Every place is found before a line is appended (the hashes are of the agent's messages).
    out: list[notes.Note] = []
    for index, line in notes.placed(recorded, hashes, len(history) + prep.offset):
        slot = prep.exchange.note_slot(prep.body, index - prep.offset) if index >= prep.offset else None
        if slot is None:
            continue
        out.append((index, line, known.get(index) or ""))
        prep.originals.setdefault(slot.path, (slot, slot.get()))
        slot.set(notes.appended(slot.get(), line))
        if notes.is_time(line) and (learned or rule is None):
            name = "learned.time"
        else:
            name = rule or ("learned.date" if learned else "date")
        if name not in rewrites:
            rewrites.append(name)
    return out


def message_hash(prep: Prepared, msg: Any) -> str:
    """The hash of a history item as the agent sent it (where a date note goes)."""
    return chain.digest(prep.exchange.canonical_message(msg))


def _newest_user_hash(prep: Prepared) -> str:
    """The hash of the request's newest user message ("" when it has none)."""
    index = prep.signals.last_user_index
    history = prep.history
    j = -1 if index is None else index - prep.offset
    return message_hash(prep, history[j]) if 0 <= j < len(history) else ""


def _params(inherit_params: Sequence[str], prep: Prepared) -> dict[str, str]:
    """The inherit_params the request carries, as written (raw JSON text)."""
    out: dict[str, str] = {}
    for p in inherit_params:
        if p in prep.body:
            span = prep.doc.span((p,))
            if span is not None:
                out[p] = prep.doc.raw[span[0] : span[1]].decode("utf-8", "surrogatepass")
    return out


def _forwarded_tools_ref(rules: RuleSet, prep: Prepared) -> str:
    """The ref of the tools[] forwarded: the one prepare computed, unless the tools
    were replaced since (a fork's parent's, the lineage's recorded bytes) or a pin
    rule may have edited a description in place."""
    tools = prep.tools
    if tools is not None and not rules.pin_tools and prep.exchange.tools(prep.body) is prep.tool_list:
        return tools.form
    return identity.tools_ref(prep.exchange, prep.body)


def sent_tools_ref(rules: RuleSet, prep: Prepared) -> str:
    """The ref of the request's tools[] as sent (before finalize replaces any): the ref
    a lineage records when it forwards them unchanged."""
    return _forwarded_tools_ref(rules, prep)


def _recorded_tools(prep: Prepared, parent: LineageRecord) -> bool:
    """The request's tools[] mean the lineage's but are written otherwise."""
    t = prep.tools
    return t is not None and t.meaning == parent.tools_meaning and t.form != parent.tools_ref


def _first_values(spans: Sequence[pins.Span]) -> dict[str, str]:
    out: dict[str, str] = {}
    for span in spans:
        out.setdefault(span.key, span.value)
    return out
