"""Step 1, :func:`prepare`: a parsed request, analysed once, as :class:`Prepared`.

What a request is, before the store is asked anything about it:

1. the *static pass*: the rule set's static rules rewrite the system texts (and,
   for rules of scope ``tools`` or ``all``, tool descriptions and messages);
2. the *pin spans*: where pin and date rules matched, with the value each span
   holds now; the system texts with those spans masked give the *skeleton* that
   tells one session's prompt from another's;
3. tools[]' identity (:class:`~canonicalize.identity.ToolsId`);
4. the *hash chain* over the history (:mod:`canonicalize.chain`): one link per
   message, the lookup's key in the store;
5. the :class:`~canonicalize.lineage.Signals` classification reads.

The parse is edited in place (the rewritten texts), and every string a rule may
change is noted with its value as sent (``Prepared.originals``): the edits
:func:`canonicalize.finalize.finalize` emits are the differences.  What is
derived from a system text is kept with it in the texts memo; the history's
links come from the body this one was parsed from (:mod:`canonicalize.bodies`),
else from the histories memo.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from canonicalize import chain, pins, strpiece
from canonicalize.bodies import Kept, shared_prefix
from canonicalize.histories import Histories
from canonicalize.identity import ToolsId, hash_text
from canonicalize.jsonspan import JsonDoc, Path
from canonicalize.lineage import Origin, Signals, origin_of
from canonicalize.memo import Memos
from canonicalize.pieces import Strings
from canonicalize.rules import Rule
from canonicalize.ruleset import RuleSet
from canonicalize.scan import HEAD_CHARS, SystemText, rescan, scan
from canonicalize.texts import Texts
from canonicalize.wire.base import Exchange, Slot

# A body's strings the parse read alone in place of its base's (Kept.strings), the base's bytes and its own.
Made = tuple[Strings, bytes, bytes]

_TIP = object()  # a previous response, standing first in a chain that starts from its tip
SPAN_CHARS = 64  # what a pin span (or a slot's list of them) holds, in characters, for the texts memo's bound


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
    signals: Signals  # what the request says of itself (at depth 0: the lookup's is the outcome's)
    tools: ToolsId | None
    originals: dict[Path, tuple[Slot, str]]  # every string a rule may change, as sent
    offset: int = 0  # chain links before the body's own history (1: a previous response's tip)
    continues: str | None = None  # the lineage a previous response belongs to (it continues it)
    tool_list: list[Any] | None = None  # the parsed tools[] ``tools`` identifies (finalize reuses its ref)
    scope: str = ""  # the tenant: the memos finalize uses are its own
    history: list[Any] = field(default_factory=list)  # the body's own items (``exchange.history(body)``)

    @property
    def origin(self) -> Origin:
        """The request's conversation (its home in the store): the lineage a previous
        response continues, else its first link."""
        return origin_of(self.links, self.continues if self.offset else None)


def prepare(
    rules: RuleSet,
    memos: Memos,
    doc: JsonDoc,
    body: dict[str, Any],
    exchange: Exchange,
    *,
    declared_parent: str | None = None,
    headers: Mapping[str, str] | None = None,
    previous: tuple[str, bytes] | None = None,
    scope: str = "",
    kept: Kept | None = None,
    split: tuple[list[Slot], list[Any]] | None = None,
) -> Prepared:
    """Static rules, pin spans and the hash chain of ``body`` (the parse of ``doc``); ``scope``
    (the tenant) is the only part of the memos this request uses; ``headers`` (the request's)
    name the session for packs that say so; ``kept`` is what the bodies memo kept of this body;
    ``split``: ``exchange.split(body)``, when the caller has it.
    ``previous``: the lineage and tip link a previous response ended at (Responses
    ``previous_response_id``): the chain is that link, then the body's own history chained
    from it, the tip counts as the replayed reply, and the request continues that lineage."""
    tip = previous[1] if previous is not None else None
    rewrites: list[str] = []
    originals: dict[Path, tuple[Slot, str]] = {}
    system_slots, history = exchange.split(body) if split is None else split
    base = kept.base if kept is not None and rules.system_lines else None
    near = base.system if base is not None else ()
    made = (kept.strings, base.raw, kept.raw) if base is not None and kept is not None and kept.strings else None
    # (a body that continues its base's conversation: the base's prompts are its previous ones)
    followed = base is not None and kept is not None and kept.continues
    spans, skeleton, head = _system_pass(
        rules, memos.texts, system_slots, scope, rewrites, originals, near, made, followed
    )
    if kept is not None:  # what the next body's texts are analysed from
        kept.system = tuple(originals[s.path][1] for s in system_slots)
        kept.strings = {}  # (the old values it holds were for this analysis only)
    tool_slots = _static_pass(rules, body, exchange, rewrites, originals)
    tool_list, tools = _tools(rules, memos, exchange, body, scope, hold=kept is not None)
    if tool_slots and rules.pin_tools:
        spans += _tool_spans(rules, tool_slots, len(system_slots), originals)
    links, sizes = _chain(memos.histories, exchange, body, history, tip, scope, kept)
    own = history
    offset = 0
    if tip is not None:
        links, sizes, history, offset = [tip, *links], [0, *sizes], [_TIP, *history], 1
    identity = tuple(s.value for s in spans if s.rule.identity) + rules.session(body, headers)
    signals = _signals(exchange, body, history, identity, (skeleton, head), tools, declared_parent)
    return Prepared(
        doc,
        body,
        exchange,
        rewrites,
        system_slots,
        system_slots + tool_slots,
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
        own,
    )


def _tools(
    rules: RuleSet, memos: Memos, exchange: Exchange, body: dict[str, Any], scope: str, *, hold: bool
) -> tuple[list[Any] | None, ToolsId | None]:
    """The body's tools[] and its identity (None: no tools[]), remembered for ``scope``;
    ``hold``: the memo keeps it for the conversation's next body."""
    tool_list = exchange.tools(body)
    if not tool_list:
        return tool_list, None
    return tool_list, memos.tools.identify(exchange, tool_list, hold=hold, shared=not rules.edits_tools, scope=scope)


def _signals(
    exchange: Exchange,
    body: dict[str, Any],
    history: list[Any],
    identity: tuple[str, ...],
    shape: tuple[str, str],
    tools: ToolsId | None,
    declared_parent: str | None,
) -> Signals:
    """What the request says of itself (at depth 0): its turns, session identity,
    system ``shape`` (skeleton, head), tools and declared parent."""
    first_assistant, last_assistant, last_user = _turns(exchange, history)
    return Signals(
        depth=0,
        first_assistant=first_assistant,
        last_assistant=last_assistant,
        identity=identity,
        skeleton=shape[0],
        head=shape[1],
        tools=tools.names if tools else (),
        last_user_index=last_user,
        last_user_text=exchange.last_user_text(body) if last_user is not None else "",
        declared_parent=declared_parent,
    )


def _system_pass(
    rules: RuleSet,
    texts: Texts,
    slots: list[Slot],
    scope: str,
    rewrites: list[str],
    originals: dict[Path, tuple[Slot, str]],
    near: Sequence[str],
    made: Made | None = None,
    followed: bool = False,
) -> tuple[list[pins.Span], str, str]:
    """The static rules on each system slot, and the pin spans, skeleton and head of
    them all.  A text seen before in ``scope`` is found by comparing it whole, never
    by hashing it, and carries its analysis and its slot's spans; a new one is
    analysed from the previous body's text at its slot (``near``) where it can be,
    and where the parse read it alone in place of that text (``made``: the body's
    :attr:`Kept.strings` and the two bodies' bytes), from where their bytes differ.
    ``followed``: ``near`` are its conversation's previous
    prompts (not another conversation's), superseded by the new ones (:meth:`Texts.supersede`)."""
    spans: list[pins.Span] = []
    masked_hashes, heads = [], []
    entry = None
    for i, slot in enumerate(slots):
        entry = texts.entry(scope, slot.get())
        text, derived = entry.text, entry.derived
        originals[slot.path] = (slot, text)
        res = derived.get("slot")
        if res is None:
            near_text = near[i] if i < len(near) else None
            res = _analyse(rules, texts, scope, text, near_text, _alike(made, slot.path, near_text), followed)
            res = texts.derive(entry, "slot", res, _held(res, text))
        slot.set(texts.intern(scope, res.text))
        rewrites.extend(n for n in res.fired if n not in rewrites)
        found = derived.get(("spans", i))
        if found is None:
            found = tuple(pins.Span(r, i, s, e, k, v) for r, s, e, k, v in res.spans)
            found = texts.derive(entry, ("spans", i), found, SPAN_CHARS * (1 + len(found)))  # (one per slot index)
        spans += found
        masked_hashes.append(res.masked_hash)
        heads.append(res.head)
    if entry is None or len(slots) != 1:
        return spans, *_skeleton(masked_hashes, heads)
    shape = entry.derived.get("skeleton")
    if shape is None:
        shape = texts.derive(entry, "skeleton", _skeleton(masked_hashes, heads))
    return spans, *shape


def _held(res: SystemText, text: str) -> int:
    """What an analysis of ``text`` holds beyond it, in characters for the memo's bound: the
    rewritten text (when it is another) and its spans (a key and a value each)."""
    return (len(res.text) if res.text is not text else 0) + SPAN_CHARS * len(res.spans)


def _analyse(
    rules: RuleSet,
    texts: Texts,
    scope: str,
    text: str,
    near_text: str | None,
    alike: Callable[[], tuple[int, int] | None] | None = None,
    followed: bool = False,
) -> SystemText:
    """The analysis of a system text not seen before: from ``near_text``'s (the same
    slot of the body it was parsed from), kept in ``scope``, when it is there; else
    whole.  ``alike``: how many characters the two are known to start and end with
    alike, read when needed (what ``rescan`` would otherwise compare them for).  ``followed``:
    ``near_text`` is its conversation's previous prompt, which then goes first from the
    memo (with its rewritten form)."""
    if near_text is not None and near_text is not text:
        entry = texts.known(scope, near_text)
        near = entry.derived.get("slot") if entry is not None else None
        if entry is not None and near is not None:
            found = rescan(rules, near_text, near, text, alike() if alike is not None else None)
            if found is not None:
                if followed:
                    texts.supersede(entry)
                    if near.text is not near_text and (rewritten := texts.known(scope, near.text)) is not None:
                        texts.supersede(rewritten)
                return found
    return scan(rules, text)


def _alike(made: Made | None, path: Path, near_text: str | None) -> Callable[[], tuple[int, int] | None] | None:
    """How many characters the text at ``path`` starts and ends with alike with
    ``near_text``, from the bytes the parse read it from (:func:`canonicalize.strpiece.alike`),
    when it read it alone in place of that text; None: not known that way."""
    if made is None or near_text is None:
        return None
    strings, old, raw = made
    found = strings.get(path)
    if found is None or found[0] != near_text:  # (!= is identity first)
        return None
    value, first, close, start, end = found
    return lambda: strpiece.alike(value, old, first, close, raw, start, end)


def shape_of(rules: RuleSet, texts: Texts, scope: str, system: Sequence[str]) -> tuple[str, str]:
    """The skeleton and head of system texts as forwarded (what a request that sends
    them again has as its signals'), each text's analysis found in ``scope``'s memo."""
    masked_hashes, heads = [], []
    for text in system:
        entry = texts.entry(scope, text)
        res = entry.derived.get("slot")
        if res is None:
            res = scan(rules, text)
            res = texts.derive(entry, "slot", res, _held(res, text))
        masked_hashes.append(res.masked_hash)
        heads.append(res.head)
    return _skeleton(masked_hashes, heads)


def _skeleton(masked_hashes: Sequence[str], heads: Sequence[str]) -> tuple[str, str]:
    """The signals' skeleton and head of the system slots whose masked hashes and heads these are."""
    return hash_text("\x1e".join(masked_hashes)), hash_text("\x1e".join(heads)[:HEAD_CHARS])


def _static_pass(
    rules: RuleSet,
    body: dict[str, Any],
    exchange: Exchange,
    rewrites: list[str],
    originals: dict[Path, tuple[Slot, str]],
) -> list[Slot]:
    """The static rules of scope ``tools`` and ``all`` on tool descriptions and messages;
    the tool slots when a rule reaches them (pin rules too), else none."""
    tool_slots: list[Slot] = []
    if exchange.tools(body) and (rules.static_tools or rules.pin_tools):
        tool_slots = exchange.tool_slots(body)
        _apply_static(rules.static_tools, tool_slots, rewrites, originals)
    if rules.static_messages:
        _apply_static(rules.static_messages, exchange.message_slots(body), rewrites, originals)
    return tool_slots


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


def _tool_spans(
    rules: RuleSet, tool_slots: list[Slot], offset: int, originals: dict[Path, tuple[Slot, str]]
) -> list[pins.Span]:
    """The pin spans in tool descriptions, their slots numbered after the ``offset`` system slots."""
    found = [
        pins.Span(s.rule, s.slot + offset, s.start, s.end, s.key, s.value)
        for s in pins.find_spans(rules.pin_tools, tool_slots)
    ]
    for slot in tool_slots:
        originals.setdefault(slot.path, (slot, slot.get()))
    return found


def _chain(
    histories: Histories,
    exchange: Exchange,
    body: dict[str, Any],
    history: list[Any],
    tip: bytes | None,
    scope: str,
    kept: Kept | None,
) -> tuple[list[bytes], list[int]]:
    """The history's links and message sizes: those of the body this one was parsed
    from for the items it shares (:func:`_kept_links`), else from the histories memo."""
    if kept is None or tip is not None:
        return histories.links(exchange, history, prev=tip or chain.ROOT, scope=scope)
    start = _history_start(body, exchange, history)
    known = _kept_links(kept, start, exchange, history)
    if known is not None:
        return known
    links, sizes = histories.links(exchange, history, scope=scope)
    kept.hist = (start, tuple(links), tuple(sizes)) if start is not None else None
    return links, sizes


def _kept_links(
    kept: Kept, start: int | None, exchange: Exchange, history: list[Any]
) -> tuple[list[bytes], list[int]] | None:
    """The history's links when the body was parsed from its session's previous one:
    that body's links for the history items it shares, the same objects from the
    start (a link is a pure function of the messages up to it), and only the rest
    hashed; None when nothing is shared."""
    base, kept.base = kept.base, None
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
