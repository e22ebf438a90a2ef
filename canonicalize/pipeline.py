"""The request machine: one request's canonicalization, its steps in the order
the core decides them, stepped by the shell (sans-IO, as h11 is).

    parse -> previous -> (off loop) -> prepare -> lookup -> classify -> recall -> learn -> blobs -> finalize

:meth:`Canonicalizer.start` returns a :class:`Machine` for one request.  The shell
calls :meth:`Machine.send`: the machine runs its steps until it needs something
only the store has (the previous response, the lookup, blobs, the tenant's
marks and evidence: :mod:`canonicalize.needs`) and returns that :class:`Need`;
the shell answers it and sends the answer back, until ``send`` returns None and
:attr:`Machine.result` holds the :class:`Canonicalized` request (None: the body
is not a JSON object, not ours to judge).  Every step is done by the module that
owns it:

==============  ================================================================
parse           the body, by pieces of its conversation's previous one where the
                bytes are equal (:mod:`canonicalize.bodies`)
previous        a Responses request's ``previous_response_id``: the lineage and
                tip link it continues (``Previous``)
off loop        a body whose analysis is heavy (:func:`heavy`: hundreds of system
                texts, or over 128 K characters of them) says so first, kept no more
                for its conversation's next request (as a big body is not)
                (``OffLoop``): the shell takes its next steps off the event loop
prepare         static rules, pin spans, tools' identity, the hash chain and the
                signals (:mod:`canonicalize.analysis`)
lookup          the store's answer for the chain (``Chain``)
classify        root, continuation or fork (:mod:`canonicalize.lineage`)
recall          ``learn: pin``: the lineage of a root whose first message lost a
                block (:mod:`canonicalize.recall`; ``Marked``, ``Declared``)
learn           the spans a request whose system text changed learns
                (:mod:`canonicalize.learn`)
blobs           the recorded parts finalizing needs (``Blobs``, ``Evidence``)
finalize        pins, notes, the lineage's tools[] and fork repair as edits, and
                what to record (:mod:`canonicalize.finalize`); the prefix the
                forwarded request shares with its parent's (:mod:`canonicalize.predict`)
==============  ================================================================

A store that fails answers :data:`~canonicalize.needs.UNAVAILABLE`: the request
goes on as a root with its static rules, and nothing of it is recorded (role
``fail-open``).  The machine runs no I/O, reads no clock, draws no random number
(a new lineage's id comes with the request); which thread runs each step is the
shell's choice.

:class:`Canonicalizer` is the core's long-lived state, one per app: the compiled
rule set (:mod:`canonicalize.ruleset`) and the memos (:mod:`canonicalize.memo`).
Every step is a pure function of the request and those explicit objects: a
memo's answer is verified against the content it stands for and is the answer
computed afresh (``Memos.off()`` computes everything afresh; the tests compare
the two).  The memos are safe to share between threads.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from canonicalize import analysis, chain, finalize, identity, recall
from canonicalize.analysis import Prepared
from canonicalize.edits import Op
from canonicalize.finalize import Outcome
from canonicalize.jsonspan import JsonDoc
from canonicalize.learn import Learned, Plan, learn_plan, learn_spans
from canonicalize.lineage import CANDIDATES, Decision, Fingerprint, ForkPolicy, LineageRecord, Lookup, classify, homed
from canonicalize.lineage import origin_of as _origin_of
from canonicalize.memo import Memos
from canonicalize.needs import (
    UNAVAILABLE,
    Blobs,
    Chain,
    Declared,
    Evidence,
    Marked,
    Need,
    OffLoop,
    Previous,
    Together,
)
from canonicalize.predict import Prediction, parent_of, predict
from canonicalize.ruleset import RuleSet, Settings
from canonicalize.wire.base import Exchange, Slot

T = TypeVar("T")
# The answers the shell sends back are the types the needs name (canonicalize.needs).
Steps = Generator[Need[Any], Any, T]
LOOKUP_LINKS = 1024  # the newest links a lookup walks: a continuation's parent is near the end
PARENT_HEADER = "x-prefixpin-parent"  # the request's declared parent lineage
# A body whose analysis is heavy (OffLoop): more system texts, or characters of them,
# than this.  An agent sends one to a few texts of 10-50 KB; each text costs ~20-40 us to
# analyse, a KB of dated lines ~0.5 ms.
HEAVY_TEXTS = 256
HEAVY_CHARS = 128 * 1024


class Request(NamedTuple):
    """A request as the core sees it: the client's bytes, its wire API and tenant
    (the scope of every memo and need), its headers (a session header, a declared
    parent: at least those :attr:`Canonicalizer.header_names` names), and ``fresh``,
    a new random lineage id (randomness is the shell's), the request's if it starts
    a lineage, made to start with its conversation's home
    (:func:`~canonicalize.lineage.homed`).  ``remember`` False: the body is parsed
    whole and nothing of it is kept for its conversation's next one (a body no one owns,
    or one too big to keep)."""

    raw: bytes
    exchange: Exchange
    tenant: str
    headers: Mapping[str, str]
    fresh: str
    remember: bool = True


class Canonicalized(NamedTuple):
    """The core's outcome for one request: its parse, analysis and lookup, the edits
    and rule names to forward it with, its role, and (None when the store failed:
    nothing is recorded) the :class:`~canonicalize.finalize.Outcome` to record and
    the :class:`~canonicalize.predict.Prediction` against its parent.
    Immutable, like :class:`Request` (NamedTuples: made per request, they cost a
    quarter of a frozen dataclass)."""

    body: dict[str, Any]
    doc: JsonDoc
    prep: Prepared
    lookup: Lookup  # what the store found for the request's chain (its parent: canonicalize.predict)
    ops: list[Op]
    rewrites: list[str]
    role: str  # root, continuation, fork; fail-open when the store failed
    outcome: Outcome | None
    learned: Learned | None  # the spans the request learned (counted and logged by the shell)
    prediction: Prediction | None  # the forwarded prefix against its parent's (None: no parent, nothing recorded)
    heavy: bool = False  # its steps asked to run off the loop (OffLoop): so does what the shell does with it


class Machine:
    """One request's steps (module docstring): :meth:`send` each answer until it
    returns None, then read :attr:`result`."""

    __slots__ = ("_steps", "result")

    def __init__(self, steps: Steps[Canonicalized | None]) -> None:
        self._steps = steps
        self.result: Canonicalized | None = None

    def send(self, answer: object = None) -> Need[Any] | None:
        """Run the steps up to the next need (the first call starts them, with no
        answer); None once they are done."""
        try:
            return self._steps.send(answer)
        except StopIteration as done:
            self.result = done.value
            return None


class Canonicalizer:
    """The rule set and the memos: the core's state, one per app (module docstring)."""

    def __init__(self, settings: Settings, *, memos: Memos | None = None) -> None:
        """``memos``: the memos to use (``Memos.off()``: none); new ones by default."""
        self.settings = settings
        self.rules = RuleSet.compile(settings)
        self.memos = Memos() if memos is None else memos
        # The request headers the steps read (lowercase): a Request's ``headers`` need
        # hold no other (the shell hands it these, read once from the request's).
        self.header_names: tuple[str, ...] = (PARENT_HEADER, *self.rules.identity_headers)

    @property
    def rule_names(self) -> tuple[str, ...]:
        return self.rules.names

    @property
    def fork(self) -> ForkPolicy:
        """The fork policy, with the packs' markers and inherited params."""
        return self.rules.fork

    @property
    def keeps_history(self) -> bool:
        """``learn: pin``: lineages keep their newest user message as forwarded and
        forward it again when the agent drops a block from it (:mod:`canonicalize.recall`)."""
        return self.settings.learn == "pin"

    def start(self, request: Request) -> Machine:
        """The machine that canonicalizes ``request``."""
        return Machine(_steps(self, request))

    def measure(self, body: dict[str, Any], exchange: Exchange) -> tuple[Fingerprint, list[int]]:
        """Fingerprint and message sizes of a body as received (no rule applied)."""
        tool_list = exchange.tools(body)
        tools = self.memos.tools.identify(exchange, tool_list, hold=False, shared=False) if tool_list else None
        _, sizes = chain.links(exchange, exchange.history(body))
        fp = identity.fingerprint(
            self.memos.texts,
            self.rules.fork.inherit_params,
            body,
            exchange,
            tools_ref=identity.tools_ref(exchange, body),
            tools_len=tools.size if tools else 0,
            n_messages=len(sizes),
        )
        return fp, sizes


# -- the steps ----------------------------------------------------------------------------------
def _steps(canon: Canonicalizer, req: Request) -> Steps[Canonicalized | None]:
    rules, memos = canon.rules, canon.memos
    remember = req.remember and not rules.edits_tools
    found = memos.bodies.parse(req.raw, req.exchange.items_key, req.tenant, remember=remember)
    if found is None or not isinstance(found[0], dict):
        return None
    body, doc, kept = found
    previous = None
    response_id = body.get("previous_response_id")  # Responses: the lineage and tip link it continues
    if isinstance(response_id, str) and response_id:
        previous = yield Previous(response_id)
        previous = None if previous is UNAVAILABLE else previous
    headers = req.headers
    split = req.exchange.split(body)
    offload = heavy(split[0])
    if offload is not None:
        if kept is not None:  # its steps go to a worker thread: nothing of it is shared with another request
            memos.bodies.forget(kept)
            kept = None
        yield offload
    prep = analysis.prepare(
        rules,
        memos,
        doc,
        body,
        req.exchange,
        declared_parent=headers.get(PARENT_HEADER) or None,
        headers=headers,
        previous=previous,
        scope=req.tenant,
        kept=kept,
        split=split,
    )
    sent = prep.signals.skeleton, finalize.sent_tools_ref(rules, prep)
    need, offset = _chain(prep.links, prep.signals.declared_parent, prep.origin, sent)
    first = yield need
    store_ok = first is not UNAVAILABLE
    lookup = _deepened(first, offset) if store_ok else Lookup()
    decision, final, learned, head, got = yield from _decide(canon, prep, lookup, store_ok)
    keep = canon.keeps_history
    needed = finalize.blobs_needed(prep, decision, learned, lookup=final, keep_history=keep)
    blobs = {ref: got[ref] for ref in needed if ref in got} if needed else {}
    refs = tuple(ref for ref in needed if ref not in got) if needed else ()
    evidence = finalize.evidence_needed(decision, learned)
    if (refs or evidence) and store_ok:
        owner = decision.parent.id if decision.parent is not None else None
        read = yield from _blobs(refs, owner, evidence)
        store_ok = read is not None
        blobs.update(read or {})
    new_id = homed(req.fresh, req.tenant, prep.origin)
    outcome = finalize.finalize(
        rules, memos, prep, final, decision, new_id=new_id, blobs=blobs, learned=learned, keep_history=keep, head=head
    )
    big = offload is not None
    if not store_ok:
        ops, rewrites = outcome.ops, outcome.rewrites
        return Canonicalized(body, doc, prep, lookup, ops, rewrites, "fail-open", None, learned, None, big)
    predicted = _predicted(outcome, prep, lookup)
    return Canonicalized(
        body, doc, prep, lookup, outcome.ops, outcome.rewrites, outcome.role, outcome, learned, predicted, big
    )


def heavy(system: Sequence[Slot]) -> OffLoop | None:
    """The ``OffLoop`` need of a request with ``system`` texts when their analysis is
    heavy (over :data:`HEAVY_TEXTS` texts or :data:`HEAVY_CHARS` characters), else None.
    (Other parts of a body under the size bound cost tens of ms at most: 12,000 tools,
    25,000 messages.)"""
    if len(system) == 1:  # (the common case)
        text = system[0].get()
        return OffLoop(1, len(text)) if type(text) is str and len(text) > HEAVY_CHARS else None
    if len(system) > HEAVY_TEXTS:
        return OffLoop(len(system), -1)  # (their characters not counted: that too is work)
    chars = sum(len(t) for s in system if type(t := s.get()) is str)
    return OffLoop(len(system), chars) if chars > HEAVY_CHARS else None


def _predicted(outcome: Outcome, prep: Prepared, lookup: Lookup) -> Prediction | None:
    """The request as forwarded against its parent (:mod:`canonicalize.predict`); None:
    it has none.  Made here, while the request's objects are in the caches, rather
    than by the counting after the response, which would meet them cold."""
    fingerprint = outcome.record.fingerprint
    if fingerprint is None:
        return None
    parent = parent_of(outcome, prep, lookup)
    if parent is None:
        return None
    return predict(fingerprint, parent.fingerprint, outcome.depth, prep.sizes)


Decided = tuple[Decision, Lookup, Learned | None, recall.Head | None, Mapping[str, bytes]]


def _decide(canon: Canonicalizer, prep: Prepared, lookup: Lookup, store_ok: bool) -> Steps[Decided]:
    """Classify, then (the store answering) recall and learn: the decision, the lookup
    to finalize with, what was learned, the first message recalled, and the blobs read
    on the way (``got``)."""
    decision = _classify(canon.rules, prep, lookup)
    final, head, got = lookup, None, lookup.blobs
    if store_ok and decision.role == "root" and not lookup.depth and canon.keeps_history:
        recalled = yield from _recall(canon, prep)
        if recalled is not None:
            decision, final, head, got = recalled
    learned = None
    plan = _plan(canon, prep, final, decision) if store_ok else None
    if plan is not None:
        learned = yield from _learn(canon, prep, lookup.blobs, final, decision, plan)
        if learned is not None:
            decision, final = learned.decision, learned.lookup
    return decision, final, learned, head, got


def _chain(
    links: Sequence[bytes], declared: str | None, origin: bytes | str, sent: tuple[str, str] | None = None
) -> tuple[Chain, int]:
    """The lookup of the newest LOOKUP_LINKS of ``links``, and how many older ones it
    leaves out (its depths are made absolute again: :func:`_deepened`)."""
    offset = max(len(links) - LOOKUP_LINKS, 0)
    return Chain(links[offset:] if offset else links, declared, origin, sent), offset


def _deepened(found: Lookup, offset: int) -> Lookup:
    """A lookup of the newest links, its depths counted from the request's first link."""
    if not offset or not found.depth:
        return found
    depths = tuple(d + offset for d in found.depths)
    return Lookup(found.depth + offset, found.candidates, found.declared, depths, found.blobs)


def _classify(rules: RuleSet, prep: Prepared, lookup: Lookup) -> Decision:
    """Root, continuation or fork, given what the store found for the request's
    chain.  A request naming a previous response continues its lineage."""
    if prep.continues is not None:  # named by previous_response_id: no guessing
        for rec in lookup.candidates:
            if rec.id == prep.continues:
                return Decision("continuation", rec)
    return classify(prep.signals.at_depth(lookup.depth), lookup, rules.fork)


def _plan(canon: Canonicalizer, prep: Prepared, lookup: Lookup, decision: Decision) -> Plan | None:
    """What ``prep`` may learn from (:func:`canonicalize.learn.learn_plan`); None with
    ``learn: off``, or when its system text and tools are what its lineage forwarded."""
    if canon.settings.learn == "off":
        return None
    return learn_plan(prep, lookup, decision, canon.rules.fork)


def _learn(
    canon: Canonicalizer,
    prep: Prepared,
    got: Mapping[str, bytes],
    lookup: Lookup,
    decision: Decision,
    plan: Plan,
) -> Steps[Learned | None]:
    """The spans ``prep`` learns from ``plan``'s lineages (their recorded blobs: those
    the lookup returned, ``got``, and the rest read at once), and with ``learn: pin``
    the decision and lookup to finalize with.  The store failing: None (the request
    goes on as classified)."""
    blobs = {ref: got[ref] for ref in plan.refs if ref in got}
    refs = tuple(ref for ref in plan.refs if ref not in got)
    if refs:
        owner = plan.candidates[0][0].id if plan.candidates else None  # all found in this conversation's home
        found = yield Blobs(refs, owner)
        if found is UNAVAILABLE:
            return None
        blobs.update((ref, raw) for ref, raw in zip(refs, found, strict=True) if raw is not None)
    return learn_spans(prep, lookup, decision, plan, blobs, canon.settings.learn, canon.rules.fork)


def _blobs(refs: tuple[str, ...], owner: str | None, evidence: tuple[str, ...]) -> Steps[dict[str, bytes] | None]:
    """The blobs ``refs`` of lineage ``owner``'s conversation and the tenant's
    ``evidence``, read at once (on Redis: the conversation's home, the tenant's slot)."""
    found: list[bytes | None]
    if not evidence:
        one = yield Blobs(refs, owner)
        if one is UNAVAILABLE:
            return None
        found = one
    elif not refs:
        wide = yield Evidence(evidence)
        if wide is UNAVAILABLE:
            return None
        found = wide
    else:
        both = yield Together((Blobs(refs, owner), Evidence(evidence)))
        if both is UNAVAILABLE:
            return None
        found = [*both[0], *both[1]]
    return {ref: raw for ref, raw in zip((*refs, *evidence), found, strict=True) if raw is not None}


Recalled = tuple[Decision, Lookup, recall.Head, dict[str, bytes]]


def _recall(canon: Canonicalizer, prep: Prepared) -> Steps[Recalled | None]:
    """The lineage of a request whose first message is the one the lineage forwarded
    but for a dropped block or fresh values on the agent's template lines (``learn:
    pin``, canonicalize.recall): the lineages that marked its stem (the tenant's), each
    one's record and recorded message (its home's) compared, then at once each changed
    line checked (another conversation of the tenant marked it) and the request's chain
    with the recorded message in place looked up again, which the lineage must own
    whole.  Three store round trips; the lineage, and the blobs read (its first
    message); nothing found, or the store failing: None."""
    if not canon.keeps_history or prep.signals.first_assistant is None:
        return None
    stem = recall.stem(prep)
    if stem is None:
        return None
    marked = yield Marked((stem,))
    if marked is UNAVAILABLE or not marked[0]:
        return None
    found = yield from _lineages(marked[0][:CANDIDATES])
    if found is None:
        return None
    recs, blobs = found
    for rec in recall.stem_heads(prep, recs):
        head = recall.match_head(prep, rec, blobs)
        if head is None or rec.fingerprint is None:
            continue
        chain_need, offset = _chain(head.links, None, _origin_of(head.links))
        both = yield Together((Marked(head.lines), chain_need))
        if both is UNAVAILABLE:
            return None
        lines, check = both[0], _deepened(both[1], offset)
        if not all(recall.is_template(prep, rec, m) for m in lines):
            continue
        owners = {r.id for i, r in enumerate(check.candidates) if check.depth_of(i) == check.depth}
        if check.depth >= rec.fingerprint.n_messages and rec.id in owners:
            return Decision("continuation", rec), Lookup(0, (rec,), None, (0,)), head, blobs
    return None


def _lineages(markers: Sequence[recall.Marker]) -> Steps[tuple[list[LineageRecord], dict[str, bytes]] | None]:
    """The records of the lineages ``markers`` name (in their order) and their first
    messages, read at once (on Redis: each from its home)."""
    needs: list[Need[Any]] = [Declared(lineage) for lineage, _ in markers]
    needs += [Blobs((first,), lineage) for lineage, first in markers]
    found = yield Together(tuple(needs))
    if found is UNAVAILABLE:
        return None
    n = len(markers)
    recs = [r for r in found[:n] if r is not None]
    raws = found[n:]
    blobs = {first: raw[0] for (_, first), raw in zip(markers, raws, strict=True) if raw[0] is not None}
    return recs, blobs


__all__ = ["Canonicalized", "Canonicalizer", "Machine", "Request"]
