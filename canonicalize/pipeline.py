"""The canonicalization pipeline: static rewrite -> analysis -> (store) -> finalize.

The proxy calls :meth:`Canonicalizer.prepare` on a request's raw bytes and their
parse, looks the chain up in its store, fetches the blobs
:meth:`Canonicalizer.blobs_needed` names (a fork's parent's system and tools[],
or the lineage's recorded tools[]), and calls :meth:`Canonicalizer.finalize`.
Both steps are pure: no I/O, no clock, no randomness (the new lineage id is
passed in).

What to forward is a list of edits (:mod:`canonicalize.edits`) against the raw
bytes: the string values a rule changed, and the structural replacements a
fork or the lineage's tools[] make.  ``prep.body`` (the parse) is updated to
match, for hashing and fingerprints.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import xxhash

from canonicalize import chain, notes, pins
from canonicalize.bodies import Bodies, shared_prefix
from canonicalize.edits import AddMember, DeleteMember, Op, SetMember, SetString, SetValue
from canonicalize.histories import Histories
from canonicalize.jsonspan import JsonDoc, Path
from canonicalize.lineage import Decision, Fingerprint, ForkPolicy, LineageRecord, Lookup, Role, Signals, classify
from canonicalize.packs import PACKS, Pack
from canonicalize.rules import Rule
from canonicalize.texts import Texts
from canonicalize.wire.base import Exchange, Slot

HEAD_CHARS = 256
BLOCK_BYTES = 256
LINKS_PER_KEY = 8  # lineages remembered per link (sessions sharing a history)
CANDIDATES = 8  # lineages a lookup returns at most
SCAN_UP = 32  # links a lookup walks up past the deepest recorded one
SLOT_CACHE = 256  # distinct tool lists whose analysis is memoised
RESTORED_PER_TEXT = 8  # pinned values remembered restored per system text
TOOLS_RULE = "lineage.tools"  # forwarded the lineage's recorded tools[] bytes
_TIP = object()  # a previous response, standing first in a chain that starts from its tip


@dataclass(frozen=True, slots=True)
class Settings:
    """What the pipeline is built from (the ``canonicalize`` and ``fork`` config)."""

    packs: tuple[str, ...] = ("generic", "hermes")
    rules: tuple[Rule, ...] = ()  # user rules, applied after the packs'
    disabled: tuple[str, ...] = ()  # rule names to leave out
    fork: ForkPolicy = field(default_factory=ForkPolicy)


@dataclass(frozen=True, slots=True)
class _SlotResult:
    text: str  # after static rules
    fired: tuple[str, ...]
    spans: tuple[tuple[Rule, int, int, str, str], ...]  # pin spans: rule, start, end, key, value
    masked_hash: str  # hash of the text with pin spans masked
    head: str  # first HEAD_CHARS of the masked text


@dataclass(frozen=True, slots=True)
class ToolsId:
    """tools[] as sent (``form``: its exact parse) and as meant (``meaning``: a set of
    schemas, key order ignored)."""

    form: str
    meaning: str
    names: tuple[str, ...]
    size: int  # bytes, compact (prefix prediction)


@dataclass(slots=True)
class Prepared:
    """A request after the static pass, with everything classification needs."""

    doc: JsonDoc
    body: dict[str, Any]
    exchange: Exchange
    rewrites: list[str]
    system_slots: list[Slot]
    slots: list[Slot]  # system + tool slots, the index space of ``spans``
    spans: list[pins.Span]
    links: list[bytes]
    sizes: list[int]  # canonical byte size of each history message (prefix prediction)
    signals: Signals
    tools: ToolsId | None
    originals: dict[Path, tuple[Slot, str]]  # every string a rule may change, as sent
    offset: int = 0  # chain links before the body's own history (1: a previous response's tip)
    continues: str | None = None  # the lineage a previous response belongs to (it continues it)
    tool_list: list[Any] | None = None  # the parsed tools[] ``tools`` identifies (finalize reuses its ref)
    scope: str = ""  # the tenant: the memos finalize uses are its own


@dataclass(slots=True)
class Outcome:
    """The result: what to forward, what to record, what to count."""

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


class Canonicalizer:
    """Holds the compiled rule set; one per app, shared by all requests."""

    def __init__(self, settings: Settings) -> None:
        unknown = [p for p in settings.packs if p not in PACKS]
        if unknown:
            raise ValueError(f"unknown rule pack(s): {', '.join(unknown)} (known: {', '.join(PACKS)})")
        packs: list[Pack] = [PACKS[p] for p in settings.packs]
        rules = [r for p in packs for r in p.rules] + list(settings.rules)
        rules = [r for r in rules if r.name not in settings.disabled]
        self.settings = settings
        self._tools_cache: OrderedDict[tuple[str, str], tuple[bytes, ToolsId]] = OrderedDict()
        # By id(): kept bodies' lists, which no rule writes to (oldest popped in O(1)).
        self._tools_held: OrderedDict[int, tuple[list[Any], str, ToolsId]] = OrderedDict()
        self.histories = Histories()  # a turn hashes only the messages its previous turn did not send
        self.texts = Texts()  # system texts seen again: hashed, encoded and fingerprinted once
        self.bodies = Bodies()  # a body parsed as its session's previous one but for what changed
        self.rule_names = tuple(r.name for r in rules)
        self.identity_params = tuple(dict.fromkeys(q for p in packs for q in p.identity_params))
        self.identity_headers = tuple(dict.fromkeys(h for p in packs for h in p.identity_headers))
        self.static = {s: tuple(r for r in rules if r.static and r.scope in (s, "all")) for s in ("system", "tools")}
        self.static_messages = tuple(r for r in rules if r.static and r.scope == "all")
        self.pin_system = tuple(r for r in rules if not r.static and r.scope in ("system", "all"))
        self.pin_tools = tuple(r for r in rules if not r.static and r.scope in ("tools", "all"))
        # Rules that write into tools[] (scope tools or all, the latter into every message too).
        self.edits_tools = bool(self.static["tools"] or self.pin_tools or self.static_messages)
        markers = tuple(m for p in packs for m in p.markers) + settings.fork.markers
        inherit = tuple(dict.fromkeys(settings.fork.inherit_params + tuple(q for p in packs for q in p.inherit_params)))
        self.fork = ForkPolicy(
            enabled=settings.fork.enabled,
            min_depth=settings.fork.min_depth,
            markers=markers,
            inherit_params=inherit,
            guard_tools=settings.fork.guard_tools,
        )

    # -- step 1: static rewrite and analysis --------------------------------
    def _system_text(self, text: str) -> _SlotResult:
        """Static rules and pin spans of one system text (prepare keeps the result
        with the text in ``self.texts``, per tenant: each distinct text is scanned once)."""
        fired: list[str] = []
        new = text
        for rule in self.static["system"]:
            out = rule.apply(new)
            if out != new:
                new = out
                fired.append(rule.name)
        slot = [Slot([new], 0, ())]
        spans = pins.find_spans(self.pin_system, slot)
        masked = pins.skeleton(slot, spans)
        return _SlotResult(
            new,
            tuple(fired),
            tuple((s.rule, s.start, s.end, s.key, s.value) for s in spans),
            _hash(masked),
            masked[:HEAD_CHARS],
        )

    def parse(
        self, raw: bytes, exchange: Exchange, scope: str, *, remember: bool = True
    ) -> tuple[Any, JsonDoc, Any] | None:
        """``raw``'s parse (for this request to edit), doc and what is kept of it (for
        ``prepare``), by pieces of the tenant's recent bodies where the bytes are equal
        (:mod:`canonicalize.bodies`); None: not JSON.  ``remember`` False: parsed whole,
        nothing kept (a scope that is no one's).  Not thread-safe: the event loop's only."""
        return self.bodies.parse(raw, exchange.items_key, scope, remember=remember and not self.edits_tools)

    def tools_id(self, exchange: Exchange, tool_list: list[Any], *, hold: bool = False) -> ToolsId | None:
        """What identifies ``tool_list``; None when it cannot be hashed (e.g. an
        integer beyond 64 bits): such tools are forwarded as sent, never replaced.
        ``hold``: the list is a kept body's (:mod:`canonicalize.bodies`), which the
        session's next body may share: its answer is remembered by identity.  Any
        other list is never seen again, and holding it would only move the freeing of
        its parse to a later request, where its memory has gone cold."""
        if not self.edits_tools:
            # The same list object again (a body parsed by pieces shares its session's
            # tools[], which nothing writes to then): its answer without serializing it.
            held = self._tools_held.get(id(tool_list))
            if held is not None and held[0] is tool_list and held[1] == exchange.name:
                return held[2]
        try:
            form = orjson.dumps(tool_list)
        except TypeError:
            return None
        ref = chain.digest(form)
        # Keyed by the digest (cheap to hash), verified against the bytes (a digest
        # collision is a miss, never another list's meaning); tool names are found
        # where the wire API puts them.
        key = (exchange.name, ref)
        hit = self._tools_cache.get(key)
        if hit is None or hit[0] != form:
            canon = sorted(orjson.dumps(t, option=orjson.OPT_SORT_KEYS) for t in tool_list)
            hit = form, ToolsId(ref, chain.digest(b"\x1e".join(canon)), _names(exchange, tool_list), len(form))
            self._tools_cache[key] = hit
            if len(self._tools_cache) > SLOT_CACHE:
                self._tools_cache.popitem(last=False)
        else:
            self._tools_cache.move_to_end(key)
        if hold and not self.edits_tools:
            self._tools_held[id(tool_list)] = (tool_list, exchange.name, hit[1])  # holds it: the id stays its
            if len(self._tools_held) > SLOT_CACHE:
                self._tools_held.popitem(last=False)
        return hit[1]  # frozen: the same object serves every request that sends these bytes

    def prepare(
        self,
        doc: JsonDoc,
        body: dict[str, Any],
        exchange: Exchange,
        *,
        declared_parent: str | None = None,
        headers: Mapping[str, str] | None = None,
        previous: tuple[str, bytes] | None = None,
        scope: str = "",
        kept: Any = None,
    ) -> Prepared:
        """Static rules, pin spans and the hash chain of ``body`` (the parse of ``doc``);
        ``scope`` (the tenant) is the only part of the history memo this request uses;
        ``headers`` (the request's) name the session for packs that say so.  ``previous``
        is the lineage and tip link a previous response ended at (Responses
        ``previous_response_id``): the chain is that link, then the body's own history
        chained from it, the tip counts as the replayed reply, and the request
        continues that lineage."""
        tip = previous[1] if previous is not None else None
        rewrites: list[str] = []
        originals: dict[Path, tuple[Slot, str]] = {}
        system_slots, history = exchange.split(body)
        spans: list[pins.Span] = []
        masked_hashes, heads = [], []
        entry = None
        for i, slot in enumerate(system_slots):
            # The text seen before in this scope is found by comparing it whole, never by
            # hashing it, and carries its analysis and this slot's spans.
            entry = self.texts.entry(scope, slot.get())
            text, derived = entry.text, entry.derived
            originals[slot.path] = (slot, text)
            res = derived.get("slot")
            if res is None:
                res = derived["slot"] = self._system_text(text)
                if res.text is not text:  # held by the entry too: counted in its bound
                    self.texts.charge(entry, len(res.text))
            slot.set(self.texts.intern(scope, res.text))
            rewrites.extend(n for n in res.fired if n not in rewrites)
            found = derived.get(("spans", i))
            if found is None:
                found = derived["spans", i] = tuple(pins.Span(r, i, s, e, k, v) for r, s, e, k, v in res.spans)
            spans += found
            masked_hashes.append(res.masked_hash)
            heads.append(res.head)
        if entry is not None and len(system_slots) == 1:
            found = entry.derived.get("skeleton")
            if found is None:
                found = entry.derived["skeleton"] = _skeleton(masked_hashes, heads)
            skeleton, head = found
        else:
            skeleton, head = _skeleton(masked_hashes, heads)
        tool_slots: list[Slot] = []
        if exchange.tools(body) and (self.static["tools"] or self.pin_tools):
            tool_slots = exchange.tool_slots(body)
            _apply_static(self.static["tools"], tool_slots, rewrites, originals)
        if self.static_messages:
            _apply_static(self.static_messages, exchange.message_slots(body), rewrites, originals)
        tool_list = exchange.tools(body)
        tools = self.tools_id(exchange, tool_list, hold=kept is not None) if tool_list else None

        slots = system_slots + tool_slots
        if tool_slots and self.pin_tools:
            offset = len(system_slots)
            spans += [
                pins.Span(s.rule, s.slot + offset, s.start, s.end, s.key, s.value)
                for s in pins.find_spans(self.pin_tools, tool_slots)
            ]
            for slot in tool_slots:
                originals.setdefault(slot.path, (slot, slot.get()))
        known = self._kept_links(kept, body, exchange, history) if kept is not None and tip is None else None
        if known is None:
            links, sizes = self.histories.links(exchange, history, prev=tip or chain.ROOT, scope=scope)
            if kept is not None and tip is None:
                self._keep_links(kept, body, exchange, history, links, sizes)
        else:
            links, sizes = known
        offset = 0
        if tip is not None:
            links, sizes, history, offset = [tip, *links], [0, *sizes], [_TIP, *history], 1
        first_assistant, last_assistant, last_user = _turns(exchange, history)
        signals = Signals(
            depth=0,
            first_assistant=first_assistant,
            last_assistant=last_assistant,
            identity=tuple(s.value for s in spans if s.rule.identity) + self._identity(body, headers),
            skeleton=skeleton,
            head=head,
            tools=tools.names if tools else (),
            last_user_index=last_user,
            last_user_text=exchange.last_user_text(body) if last_user is not None else "",
            declared_parent=declared_parent,
        )
        return Prepared(
            doc,
            body,
            exchange,
            rewrites,
            system_slots,
            slots,
            spans,
            links,
            sizes,
            signals,
            tools,
            originals,
            offset,
            previous[0] if previous is not None else None,
            tool_list if tools is not None else None,
            scope,
        )

    def _kept_links(
        self, kept: Any, body: dict[str, Any], exchange: Exchange, history: list[Any]
    ) -> tuple[list[bytes], list[int]] | None:
        """The history's links when the body was parsed from its session's previous one
        (:mod:`canonicalize.bodies`): that body's links for the history items it shares,
        the same objects from the start (a link is a pure function of the messages up to
        it), and only the rest hashed; None when nothing is shared (Histories then)."""
        base, kept.base = kept.base, None
        start = _history_start(body, exchange, history)
        if base is None or base.hist is None or start is None:
            return None
        base_start, base_links, base_sizes = base.hist
        k = shared_prefix(kept, start, base, base_start, len(base_links))
        if not k:
            return None
        new_links, new_sizes = chain.links(exchange, history[k:], prev=base_links[k - 1])
        links, sizes = [*base_links[:k], *new_links], [*base_sizes[:k], *new_sizes]
        kept.hist = (start, tuple(links), tuple(sizes))
        return links, sizes

    @staticmethod
    def _keep_links(
        kept: Any, body: dict[str, Any], exchange: Exchange, history: list[Any], links: list[bytes], sizes: list[int]
    ) -> None:
        start = _history_start(body, exchange, history)
        kept.hist = (start, tuple(links), tuple(sizes)) if start is not None else None

    # -- step 2: classify ---------------------------------------------------
    def classify(self, prep: Prepared, lookup: Lookup) -> Decision:
        prep.signals = prep.signals.at_depth(lookup.depth)
        if prep.continues is not None:  # named by previous_response_id: no guessing
            for rec in lookup.candidates:
                if rec.id == prep.continues:
                    return Decision("continuation", rec)
        return classify(prep.signals, lookup, self.fork)

    def blobs_needed(self, prep: Prepared, decision: Decision) -> tuple[str, ...]:
        """The recorded blobs finalizing ``decision`` needs: a fork's parent's system
        and tools[]; a continuation's recorded tools[] when the request's tools mean
        the same but are written differently."""
        parent = decision.parent
        if parent is None:
            return ()
        if decision.role == "fork" or parent.kind == "fork":
            if parent.system_ref is None or parent.tools_ref is None:
                return ()
            return parent.system_ref, parent.tools_ref
        if self._recorded_tools(prep, parent) and parent.tools_ref is not None:
            return (parent.tools_ref,)
        return ()

    @staticmethod
    def _recorded_tools(prep: Prepared, parent: LineageRecord) -> bool:
        t = prep.tools
        return t is not None and t.meaning == parent.tools_meaning and t.form != parent.tools_ref

    # -- step 3: finalize ---------------------------------------------------
    def finalize(
        self, prep: Prepared, lookup: Lookup, decision: Decision, *, new_id: str, blobs: dict[str, bytes]
    ) -> Outcome:
        """Pins, date notes, the lineage's tools[] and fork repair, as edits, and
        what to record.  A fork (or a fork's own later request) whose parent's
        blobs are missing is forwarded as a new root, never half-repaired."""
        body, exchange, sig = prep.body, prep.exchange, prep.signals
        rewrites = list(prep.rewrites)
        structural: list[Op] = []
        parent = decision.parent
        role: Role = decision.role
        fork_action: str | None = "disabled" if decision.fork_disabled else None
        offered: frozenset[str] | None = None
        repairs_fork = parent is not None and (role == "fork" or parent.kind == "fork")
        if repairs_fork and not all(ref in blobs for ref in self.blobs_needed(prep, decision)):
            repairs_fork = False
        if parent is not None and (role == "fork" or parent.kind == "fork") and not repairs_fork:
            role, parent, fork_action = "root", None, "missing_parent"
        own_tools = prep.tools.names if prep.tools else ()
        tools_meaning = prep.tools.meaning if prep.tools else ""
        changes: dict[str, Any] = {}  # to the record, applied once at the end

        if role == "root" or parent is None:
            record = LineageRecord(
                id=new_id,
                root=new_id,
                identity=sig.identity,
                skeleton=sig.skeleton,
                head=sig.head,
                pins=_first_values(prep.spans),
                tool_order=own_tools,
                own_tools=own_tools,
                tools_meaning=tools_meaning,
            )
            parent_fp = None
        elif repairs_fork:
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
                    branch=_branch(prep, lookup),
                    replica=parent.replica,  # a fork goes where its parent's prefix is cached
                )
                fork_action = "repaired"
            else:
                record = parent
                role, fork_action = "fork", "continued"
            self._apply_notes(prep, record.notes, rewrites)
            structural += self._repair_fork(prep, record, blobs, rewrites)
            if self.fork.guard_tools:
                offered = frozenset(own_tools)
            parent_fp = parent.fingerprint
        else:  # continuation of a root lineage
            changed = self._restore(prep, parent.pins)
            rewrites.extend(n for n in changed if n not in rewrites)
            merged = dict(_first_values(prep.spans))
            merged.update(parent.pins)
            added = notes.new_notes(
                prep.spans, parent.pins, parent.notes, newest_user=sig.last_user_index, depth=lookup.depth
            )
            record = parent  # evolved once, below, with everything that changes
            changes.update(
                identity=sig.identity or parent.identity,
                skeleton=sig.skeleton,
                head=sig.head,
                pins=merged,
                own_tools=own_tools,
                notes=parent.notes + tuple(added),
            )
            self._apply_notes(prep, changes["notes"], rewrites)
            if self._recorded_tools(prep, parent) and parent.tools_ref in blobs:
                structural.append(SetValue(exchange.tools_path(body), blobs[parent.tools_ref]))
                _set_tools(exchange, body, orjson.loads(blobs[parent.tools_ref]))
                rewrites.append(TOOLS_RULE)
            elif prep.tools is not None and tools_meaning != parent.tools_meaning:
                changes.update(tools_meaning=tools_meaning, tool_order=own_tools)
            parent_fp = parent.fingerprint

        if not repairs_fork:
            # The system texts as forwarded, as the objects kept for them: an equal text,
            # so nothing forwarded changes, whose hash and UTF-8 are already known.
            for slot in prep.system_slots:
                slot.set(self.texts.intern(prep.scope, slot.get()))
        ops: list[Op] = [
            SetString(path, slot.get()) for path, (slot, text) in prep.originals.items() if slot.get() != text
        ]
        ops += structural

        # What the lineage forwarded: refs by the parse, bytes stored after sending.
        new_blobs: list[str] = []
        touch: list[str] = []
        system_ref = self.system_ref(exchange.system_value(body), prep.scope)
        tools_ref = self._forwarded_tools_ref(prep)
        for name, ref, had in (("system", system_ref, record.system_ref), ("tools", tools_ref, record.tools_ref)):
            if ref == had:
                touch.append(ref)
            else:
                new_blobs.append(name)
        size = prep.tools.size if prep.tools else 0
        # A repaired fork forwards its parent's system messages; otherwise they are the
        # request's own, found once by prepare (their texts as edited since).
        system_slots = exchange.system_slots(body) if repairs_fork else prep.system_slots
        fingerprint = self.fingerprint(
            body,
            exchange,
            tools_ref=tools_ref,
            tools_len=size,
            n_messages=len(prep.links),
            system_slots=system_slots,
            scope=prep.scope,
        )
        if role != "fork":
            changes["params"] = self._params(prep)
        record = record.evolve(
            **changes, system_ref=system_ref, tools_ref=tools_ref, fingerprint=fingerprint, requests=record.requests + 1
        )

        start = _branch(prep, lookup) if fork_action == "repaired" else max(lookup.depth - 1, 0)
        return Outcome(
            ops=ops,
            role=role,
            rewrites=rewrites,
            record=record,
            links=prep.links[start:],
            touch=touch,
            new_blobs=tuple(new_blobs),
            offered=offered,
            fork_action=fork_action,
            parent_fp=parent_fp,
            fork_signal=decision.signal if role == "fork" and fork_action == "repaired" else None,
        )

    # -- helpers ------------------------------------------------------------
    def _restore(self, prep: Prepared, recorded: dict[str, str]) -> list[str]:
        """``pins.restore(prep.slots, prep.spans, recorded)``, each system slot's result
        memoised with its text (by the recorded values of its spans, which with the
        text determine it): a lineage's turns restore the same values into the same
        prompt, and get the same text object back, whose UTF-8 and fingerprint are known."""
        changed: list[str] = []
        n = len(prep.system_slots)
        for i, slot in enumerate(prep.system_slots):
            mine = [s for s in prep.spans if s.slot == i]
            if not mine:
                continue
            values = tuple([recorded.get(s.key) for s in mine])
            entry = self.texts.entry(prep.scope, slot.get())
            memo = entry.derived.setdefault("restored", {})
            hit = memo.get(values)
            if hit is None:
                names = pins.restore(prep.slots, mine, recorded)
                hit = self.texts.intern(prep.scope, slot.get()), tuple(names)
                for old in list(memo)[: len(memo) + 1 - RESTORED_PER_TEXT]:  # (list(): one step, safe across threads)
                    gone = memo.pop(old, None)
                    if gone is not None:
                        self.texts.charge(entry, -len(gone[0]))
                memo[values] = hit
                self.texts.charge(entry, len(hit[0]))
            slot.set(hit[0])
            changed += [name for name in hit[1] if name not in changed]
        rest = [s for s in prep.spans if s.slot >= n]
        if rest:
            changed += [name for name in pins.restore(prep.slots, rest, recorded) if name not in changed]
        return changed

    def system_ref(self, value: Any, scope: str) -> str:
        """``chain.digest(orjson.dumps(value))`` for a system part ``value``; when it is one
        text (a string, or one message of only a role and that content) the ref is kept
        with the text's entry in ``scope``'s memo: a lineage forwards the same system
        part turn after turn, and serializing it is a pass over the whole prompt."""
        text: Any = value
        key: tuple[Any, ...] = ("system_ref",)
        if type(value) is list and len(value) == 1 and type(m := value[0]) is dict and len(m) == 2:
            role, text = m.get("role"), m.get("content")
            if type(role) is not str or next(iter(m)) != "role":  # serialized as role, then content
                text = None
            key = ("system_ref", role)
        if type(text) is not str or len(text) < HEAD_CHARS:
            return chain.digest(orjson.dumps(value))
        entry = self.texts.entry(scope, text)  # (finalize's texts are kept: found by identity)
        ref: str | None = entry.derived.get(key)
        if ref is None:
            ref = entry.derived[key] = chain.digest(orjson.dumps(value))
        return ref

    def _forwarded_tools_ref(self, prep: Prepared) -> str:
        """The ref of the tools[] forwarded: the one prepare computed, unless the tools
        were replaced since (a fork's parent's, the lineage's recorded bytes) or a pin
        rule may have edited a description in place."""
        tools = prep.tools
        if tools is not None and not self.pin_tools and prep.exchange.tools(prep.body) is prep.tool_list:
            return tools.form
        return _tools_ref(prep.exchange, prep.body)

    def _identity(self, body: dict[str, Any], headers: Mapping[str, str] | None) -> tuple[str, ...]:
        """The session named by the packs' identity params / headers (first one found)."""
        for p in self.identity_params:
            if isinstance(body.get(p), str) and body[p]:
                return (f"{p}={body[p]}",)
        for h in self.identity_headers if headers is not None else ():
            value = headers.get(h) if headers is not None else None
            if value:
                return (f"header={value}",)
        return ()

    def _apply_notes(self, prep: Prepared, recorded: Sequence[notes.Note], rewrites: list[str]) -> None:
        for index, line in recorded:
            slot = prep.exchange.note_slot(prep.body, index - prep.offset) if index >= prep.offset else None
            if slot is None:
                continue
            prep.originals.setdefault(slot.path, (slot, slot.get()))
            slot.set(notes.appended(slot.get(), line))
            name = next((s.rule.name for s in prep.spans if s.rule.action == "date"), "date")
            if name not in rewrites:
                rewrites.append(name)

    def _params(self, prep: Prepared) -> dict[str, str]:
        """The inherit_params the request carries, as written (raw JSON text)."""
        out: dict[str, str] = {}
        for p in self.fork.inherit_params:
            if p in prep.body:
                span = prep.doc.span((p,))
                if span is not None:
                    out[p] = prep.doc.raw[span[0] : span[1]].decode("utf-8", "surrogatepass")
        return out

    def _repair_fork(
        self, prep: Prepared, record: LineageRecord, blobs: dict[str, bytes], rewrites: list[str]
    ) -> list[Op]:
        """The parent's system part, tools[] and params instead of the fork's own."""
        body, exchange = prep.body, prep.exchange
        ops: list[Op] = []
        assert record.system_ref is not None and record.tools_ref is not None
        system_blob, tools_blob = blobs[record.system_ref], blobs[record.tools_ref]
        if orjson.dumps(exchange.system_value(body)) != orjson.dumps(orjson.loads(system_blob)):
            ops += exchange.set_system(body, system_blob)
            rewrites.append("fork.system")
        parent_tools = orjson.loads(tools_blob)
        if (exchange.tools(body) or []) != (parent_tools or []):
            path = exchange.tools_path(body)
            if parent_tools and path != ("tools",):  # tools inside the body (a Responses input item)
                _set_tools(exchange, body, parent_tools)
                ops.append(SetValue(path, tools_blob))
            elif parent_tools:
                had = "tools" in body
                body["tools"] = parent_tools
                ops.append(SetMember((), "tools", tools_blob) if had else AddMember("tools", tools_blob))
            else:
                body.pop("tools", None)
                ops.append(DeleteMember((), "tools"))
            rewrites.append("fork.tools")
        changed_params = False
        for p in self.fork.inherit_params:
            if p in record.params:
                raw = record.params[p].encode("utf-8", "surrogatepass")
                value = orjson.loads(raw)
                if p not in body or body[p] != value:
                    ops.append(SetMember((), p, raw) if p in body else AddMember(p, raw))
                    body[p] = value
                    changed_params = True
            elif p in body:
                del body[p]
                ops.append(DeleteMember((), p))
                changed_params = True
        if changed_params:
            rewrites.append("fork.params")
        return ops

    def fingerprint(
        self,
        body: dict[str, Any],
        exchange: Exchange,
        *,
        tools_ref: str,
        tools_len: int,
        n_messages: int,
        system_slots: Sequence[Slot] | None = None,
        scope: str | None = None,
    ) -> Fingerprint:
        """What prefix prediction compares, for ``body`` as it is (forwarded or as received);
        ``system_slots`` are its system slots when the caller has them; with a ``scope``
        (the tenant) the system text's blocks are memoised in it."""
        slots = exchange.system_slots(body) if system_slots is None else system_slots
        texts = [s.get() for s in slots]
        joined = texts[0] if len(texts) == 1 else "\x1e".join(texts)
        if scope is None:
            blocks, size = _blocks(joined)
        else:
            entry = self.texts.entry(scope, joined)
            found = entry.derived.get("blocks")
            if found is None:
                found = entry.derived["blocks"] = _blocks(joined)
                self.texts.charge(entry, 24 * len(found[0]))  # a short str per block
            blocks, size = found
        params = {p: body[p] for p in self.fork.inherit_params if p in body}
        try:
            params_hash = _hash(orjson.dumps(params, option=orjson.OPT_SORT_KEYS).decode()) if params else ""
        except TypeError:
            params_hash = _hash(repr(sorted(params.items())))
        return Fingerprint(
            model=body.get("model") if isinstance(body.get("model"), str) else None,
            params=params_hash,
            system_blocks=blocks,
            system_len=size,
            tools=tools_ref,
            tools_len=tools_len,
            n_messages=n_messages,
        )

    def measure(self, body: dict[str, Any], exchange: Exchange) -> tuple[Fingerprint, list[int]]:
        """Fingerprint and message sizes of a body as received (no rule applied)."""
        tool_list = exchange.tools(body)
        tools = self.tools_id(exchange, tool_list) if tool_list else None
        _, sizes = chain.links(exchange, exchange.history(body))
        fp = self.fingerprint(
            body,
            exchange,
            tools_ref=_tools_ref(exchange, body),
            tools_len=tools.size if tools else 0,
            n_messages=len(sizes),
        )
        return fp, sizes


def _history_start(body: dict[str, Any], exchange: Exchange, history: list[Any]) -> int | None:
    """Where ``history`` starts in the body's item array when it is all the items from
    there on (the system messages lead), else None."""
    items = body.get(exchange.items_key)
    if not history or type(items) is not list:
        return None
    start = len(items) - len(history)
    # split() keeps the order and drops system messages only: the first history item at
    # ``start`` means the ``start`` items before it are the dropped ones.
    return start if start >= 0 and items[start] is history[0] else None


def _turns(exchange: Exchange, history: Sequence[Any]) -> tuple[int | None, int | None, int | None]:
    """The history indices of the first and last assistant messages (a previous
    response's tip counts as one) and of the last user message."""
    first = last = user = None
    for i, m in enumerate(history):
        if m is _TIP or exchange.is_assistant(m):
            first = i
            break
    for i in range(len(history) - 1, -1, -1):
        m = history[i]
        if last is None and (m is _TIP or exchange.is_assistant(m)):
            last = i
        if user is None and m is not _TIP and exchange.is_user(m):
            user = i
        if last is not None and user is not None:
            break
    return first, last, user


def _skeleton(masked_hashes: Sequence[str], heads: Sequence[str]) -> tuple[str, str]:
    """The signals' skeleton and head of the system slots whose masked hashes and heads these are."""
    return _hash("\x1e".join(masked_hashes)), _hash("\x1e".join(heads)[:HEAD_CHARS])


def _blocks(text: str) -> tuple[tuple[str, ...], int]:
    """The fingerprint's hashes of ``text`` in BLOCK_BYTES blocks of its UTF-8, and its length in bytes."""
    raw = text.encode("utf-8", "surrogatepass")
    h = xxhash.xxh64_hexdigest
    return tuple([h(raw[i : i + BLOCK_BYTES]) for i in range(0, len(raw), BLOCK_BYTES)]), len(raw)


def _tools_ref(exchange: Exchange, body: dict[str, Any]) -> str:
    """The ref of the tools[] ``body`` forwards: the digest of their exact parse."""
    tool_list = exchange.tools(body)
    if not tool_list:
        return chain.digest(b"[]")
    try:
        return chain.digest(orjson.dumps(tool_list))
    except TypeError:
        return chain.digest(repr(tool_list).encode("utf-8", "surrogatepass"))


def _set_tools(exchange: Exchange, body: dict[str, Any], tools: Any) -> None:
    """Put ``tools`` where ``exchange`` keeps tools[] in the parse."""
    *parents, key = exchange.tools_path(body)
    node: Any = body
    for k in parents:
        node = node[k]
    node[key] = tools


def _names(exchange: Exchange, tool_list: Sequence[Any]) -> tuple[str, ...]:
    return tuple(n for n in (exchange.tool_name(t) for t in tool_list) if n is not None)


def _branch(prep: Prepared, lookup: Lookup) -> int:
    """Where a new fork leaves its parent's history: after the parent's last reply it
    replays (recorded or not).  The fork owns only the links past this point, so the
    parent's next turn, which replays the same reply, stays the parent's; a lineage
    otherwise gets its links from the deepest recorded one on, since another session
    may own that one too."""
    last = prep.signals.last_assistant
    return max(lookup.depth, last + 1 if last is not None else 0)


def _apply_static(
    rules: Sequence[Rule], slots: Iterable[Slot], rewrites: list[str], originals: dict[Path, tuple[Slot, str]]
) -> None:
    if not rules:
        return
    for slot in slots:
        text = original = slot.get()
        for rule in rules:
            new = rule.apply(text)
            if new != text:
                text = new
                if rule.name not in rewrites:
                    rewrites.append(rule.name)
        if text != original:
            originals.setdefault(slot.path, (slot, original))
            slot.set(text)


def _first_values(spans: Sequence[pins.Span]) -> dict[str, str]:
    out: dict[str, str] = {}
    for span in spans:
        out.setdefault(span.key, span.value)
    return out


def _hash(text: str) -> str:
    return xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass"))
