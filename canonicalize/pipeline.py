"""The canonicalization pipeline, one request at a time: parse -> prepare ->
(the proxy's store lookup) -> classify -> (the blobs it needs) -> finalize.

:class:`Canonicalizer` is what the proxy holds: the compiled rule set
(:mod:`canonicalize.ruleset`) and the memos (:mod:`canonicalize.memo`), one per
app, shared by every request.  Each of its methods is one step, done by the
module that owns it:

==================  ==============================================================
``parse``           the body parsed by pieces of its tenant's previous one
                    (:mod:`canonicalize.bodies`)
``prepare``         static rules, pin spans, tools' identity, the hash chain and
                    the signals (:mod:`canonicalize.analysis`)
``classify``        root, continuation or fork, from what the store found
                    (:mod:`canonicalize.lineage`)
``learning``        the lineages a request whose system text changed may learn its
                    volatile spans from, and the blobs that takes; ``learn``: the
                    spans, and with ``learn: pin`` the decision and pins
                    (:mod:`canonicalize.learn`)
``blobs_needed``    the recorded parts finalizing needs (a fork's parent's system
                    and tools[], a lineage's tools[]) (:mod:`canonicalize.finalize`)
``finalize``        pins, notes, the lineage's tools[] and fork repair as edits,
                    and what to record (:mod:`canonicalize.finalize`)
==================  ==============================================================

``tools_id``, ``system_ref``, ``fingerprint`` and ``measure`` name content
(:mod:`canonicalize.identity`).  Every step is pure: no I/O, no clock, no
randomness (the new lineage id is passed in).  What to forward is a list of
edits (:mod:`canonicalize.edits`) against the raw bytes: the string values a
rule changed, and the structural replacements a fork or the lineage's tools[]
make.  ``Prepared.body`` (the parse) is updated to match, for hashing and
fingerprints.  Big bodies are prepared and finalized on worker threads: the
memos are safe to share between threads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from canonicalize import analysis, chain, finalize, identity, recall
from canonicalize.analysis import Prepared
from canonicalize.bodies import Kept
from canonicalize.finalize import Outcome
from canonicalize.identity import ToolsId
from canonicalize.jsonspan import JsonDoc
from canonicalize.learn import Learned, Plan, learn_plan, learn_spans
from canonicalize.lineage import Decision, Fingerprint, ForkPolicy, LineageRecord, Lookup, classify
from canonicalize.memo import Memos
from canonicalize.ruleset import RuleSet, Settings
from canonicalize.wire.base import Exchange, Slot


class Canonicalizer:
    """The rule set and the memos; one per app, shared by all requests."""

    def __init__(self, settings: Settings, *, memos: Memos | None = None) -> None:
        """``memos``: the memos to use (``Memos.off()``: none); new ones by default."""
        self.settings = settings
        self.rules = RuleSet.compile(settings)
        self.memos = Memos() if memos is None else memos

    @property
    def rule_names(self) -> tuple[str, ...]:
        return self.rules.names

    @property
    def fork(self) -> ForkPolicy:
        """The fork policy, with the packs' markers and inherited params."""
        return self.rules.fork

    def parse(
        self, raw: bytes, exchange: Exchange, scope: str, *, remember: bool = True
    ) -> tuple[Any, JsonDoc, Kept | None] | None:
        """``raw``'s parse (for this request to edit), doc and what is kept of it (for
        ``prepare``), by pieces of the tenant's recent bodies where the bytes are equal
        (:mod:`canonicalize.bodies`); None: not JSON.  ``remember`` False: parsed whole,
        nothing kept (a scope that is no one's)."""
        remember = remember and not self.rules.edits_tools
        return self.memos.bodies.parse(raw, exchange.items_key, scope, remember=remember)

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
        kept: Kept | None = None,
    ) -> Prepared:
        """Step 1: :func:`canonicalize.analysis.prepare` (its arguments are this one's)."""
        return analysis.prepare(
            self.rules,
            self.memos,
            doc,
            body,
            exchange,
            declared_parent=declared_parent,
            headers=headers,
            previous=previous,
            scope=scope,
            kept=kept,
        )

    def classify(self, prep: Prepared, lookup: Lookup) -> Decision:
        """Step 2: root, continuation or fork, given what the store found for the
        request's chain.  A request naming a previous response continues its lineage."""
        if prep.continues is not None:  # named by previous_response_id: no guessing
            for rec in lookup.candidates:
                if rec.id == prep.continues:
                    return Decision("continuation", rec)
        return classify(prep.signals.at_depth(lookup.depth), lookup, self.rules.fork)

    def sent(self, prep: Prepared) -> tuple[str, str]:
        """The request's system skeleton and tools[] ref as sent: with them the store's
        lookup returns the recorded blobs the request may read next
        (:func:`canonicalize.lineage.wants_blobs`)."""
        return prep.signals.skeleton, finalize.sent_tools_ref(self.rules, prep)

    def learning(self, prep: Prepared, lookup: Lookup, decision: Decision) -> Plan | None:
        """What ``prep`` may learn from (:func:`canonicalize.learn.learn_plan`); None with
        ``learn: off``, or when its system text and tools are what its lineage forwarded."""
        if self.settings.learn == "off":
            return None
        return learn_plan(prep, lookup, decision, self.rules.fork)

    def learn(
        self, prep: Prepared, lookup: Lookup, decision: Decision, plan: Plan, blobs: dict[str, bytes]
    ) -> Learned | None:
        """The spans ``prep`` learns from ``plan``'s lineages (their blobs fetched), and
        with ``learn: pin`` the decision and lookup to finalize with
        (:func:`canonicalize.learn.learn_spans`)."""
        return learn_spans(prep, lookup, decision, plan, blobs, self.settings.learn, self.rules.fork)

    def blobs_needed(
        self, prep: Prepared, decision: Decision, learned: Learned | None = None, lookup: Lookup | None = None
    ) -> tuple[str, ...]:
        """The recorded blobs :meth:`finalize` needs for ``decision``, all in its
        lineage's conversation (with ``learn: pin`` and its ``lookup``, the lineage's
        recorded messages too)."""
        return finalize.blobs_needed(prep, decision, learned, lookup=lookup, keep_history=self.keeps_history)

    def evidence_needed(self, decision: Decision, learned: Learned | None) -> tuple[str, ...]:
        """The tenant's evidence blobs :meth:`finalize` needs to settle ``learned``'s pins
        (:func:`canonicalize.finalize.evidence_needed`): kept once per tenant, not in a
        conversation."""
        return finalize.evidence_needed(decision, learned)

    @property
    def keeps_history(self) -> bool:
        """``learn: pin``: lineages keep their newest user message as forwarded and
        forward it again when the agent drops a block from it (:mod:`canonicalize.recall`)."""
        return self.settings.learn == "pin"

    def stem(self, prep: Prepared) -> bytes | None:
        """The link that finds the lineage of a request whose first message lost a block
        (:func:`canonicalize.recall.stem`); None: nothing to look for."""
        if not self.keeps_history or prep.signals.first_assistant is None:
            return None
        return recall.stem(prep)

    def stem_heads(self, prep: Prepared, found: Sequence[LineageRecord]) -> tuple[LineageRecord, ...]:
        """Of the lineages that marked the request's stem (newest first), those ``prep``
        may continue: roots of its session identity that recorded their first message."""
        return tuple(
            r for r in found if r.kind == "root" and r.first is not None and r.identity == prep.signals.identity
        )

    def match_head(self, prep: Prepared, rec: LineageRecord, blobs: dict[str, bytes]) -> recall.Head | None:
        """How the request's first message relates to ``rec``'s recorded one
        (:func:`canonicalize.recall.match_head`)."""
        return recall.match_head(prep, rec, blobs)

    def is_template(self, prep: Prepared, rec: LineageRecord, markers: Sequence[recall.Marker]) -> bool:
        """A value line, marked by ``markers``, is the agent's template
        (:func:`canonicalize.recall.is_template`)."""
        return recall.is_template(prep, rec, markers)

    def finalize(
        self,
        prep: Prepared,
        lookup: Lookup,
        decision: Decision,
        *,
        new_id: str,
        blobs: dict[str, bytes],
        learned: Learned | None = None,
        head: recall.Head | None = None,
    ) -> Outcome:
        """Step 3: :func:`canonicalize.finalize.finalize` (edits ``prep``'s parse); ``head``:
        the lineage's first message to forward (found by :meth:`match_head`)."""
        return finalize.finalize(
            self.rules,
            self.memos,
            prep,
            lookup,
            decision,
            new_id=new_id,
            blobs=blobs,
            learned=learned,
            keep_history=self.keeps_history,
            head=head,
        )

    def tools_id(self, exchange: Exchange, tool_list: list[Any], *, hold: bool = False) -> ToolsId | None:
        """What identifies ``tool_list``; None when it cannot be hashed (such tools are
        forwarded as sent, never replaced).  ``hold``: the list is a kept body's
        (:mod:`canonicalize.bodies`), which the session's next body may share: its
        answer is remembered by identity."""
        return self.memos.tools.identify(exchange, tool_list, hold=hold, shared=not self.rules.edits_tools)

    def system_ref(self, value: Any, scope: str) -> str:
        """The ref of a system part ``value`` (:func:`canonicalize.identity.system_ref`)."""
        return identity.system_ref(self.memos.texts, value, scope)

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
        """What prefix prediction compares (:func:`canonicalize.identity.fingerprint`)."""
        return identity.fingerprint(
            self.memos.texts,
            self.rules.fork.inherit_params,
            body,
            exchange,
            tools_ref=tools_ref,
            tools_len=tools_len,
            n_messages=n_messages,
            system_slots=system_slots,
            scope=scope,
        )

    def measure(self, body: dict[str, Any], exchange: Exchange) -> tuple[Fingerprint, list[int]]:
        """Fingerprint and message sizes of a body as received (no rule applied)."""
        tool_list = exchange.tools(body)
        tools = self.tools_id(exchange, tool_list) if tool_list else None
        _, sizes = chain.links(exchange, exchange.history(body))
        fp = self.fingerprint(
            body,
            exchange,
            tools_ref=identity.tools_ref(exchange, body),
            tools_len=tools.size if tools else 0,
            n_messages=len(sizes),
        )
        return fp, sizes
