"""The canonicalization pipeline: static rewrite -> analysis -> (store) -> finalize.

The proxy calls :meth:`Canonicalizer.prepare` on a parsed body, looks the chain up
in its store, and calls :meth:`Canonicalizer.finalize` with the store's answer (and,
for forks, the parent's recorded system and tools[]).  Both steps are pure: no
I/O, no clock, no randomness (the new lineage id is passed in).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import xxhash

from canonicalize import chain, pins, tools
from canonicalize.lineage import (
    Decision,
    Fingerprint,
    ForkPolicy,
    LineageRecord,
    Lookup,
    Role,
    Signals,
    classify,
)
from canonicalize.packs import PACKS, Pack
from canonicalize.packs.generic import TOOL_KEY_ORDER
from canonicalize.rules import Rule
from canonicalize.shape import Dialect, Slot

HEAD_CHARS = 256
BLOCK_BYTES = 256
LINKS_PER_KEY = 8  # lineages remembered per link (sessions sharing a history)
CANDIDATES = 8  # lineages a lookup returns at most
SCAN_UP = 32  # links a lookup walks up past the deepest recorded one
SLOT_CACHE = 256  # distinct system texts whose analysis is memoised


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


@dataclass(slots=True)
class Prepared:
    """A request after the static pass, with everything classification needs."""

    body: dict[str, Any]
    dialect: Dialect
    rewrites: list[str]
    system_slots: list[Slot]
    spans: list[pins.Span]
    links: list[bytes]
    sizes: list[int]  # canonical byte size of each history message (prefix prediction)
    signals: Signals
    own_tools: tuple[str, ...]


@dataclass(slots=True)
class Outcome:
    """The result: what to forward, what to record, what to count."""

    body: dict[str, Any]
    role: Role
    rewrites: list[str]
    record: LineageRecord
    links: list[bytes]  # links the lineage now owns (stores prepend its id)
    blobs: dict[str, bytes]  # content hash -> bytes, to store once
    touch: list[str]  # blob refs that already exist and must stay alive
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
        self._slot_cache: OrderedDict[str, _SlotResult] = OrderedDict()
        self._tools_cache: OrderedDict[bytes, list[Any] | bytes | None] = OrderedDict()
        self.rule_names = tuple(r.name for r in rules)
        self.sort_tool_keys = "generic" in settings.packs and TOOL_KEY_ORDER not in settings.disabled
        self.static = {s: tuple(r for r in rules if r.static and r.scope in (s, "all")) for s in ("system", "tools")}
        self.static_messages = tuple(r for r in rules if r.static and r.scope == "all")
        self.pin_system = tuple(r for r in rules if not r.static and r.scope in ("system", "all"))
        self.pin_tools = tuple(r for r in rules if not r.static and r.scope in ("tools", "all"))
        self.tools_immutable = not (self.static["tools"] or self.pin_tools)
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
        """Static rules and pin spans of one system text, memoised: an agent sends
        the same system prompt turn after turn, so each distinct text is scanned once."""
        hit = self._slot_cache.get(text)
        if hit is not None:
            self._slot_cache.move_to_end(text)
            return hit
        fired: list[str] = []
        new = text
        for rule in self.static["system"]:
            out = rule.apply(new)
            if out != new:
                new = out
                fired.append(rule.name)
        slot = [([new], 0)]
        spans = pins.find_spans(self.pin_system, slot)
        masked = pins.skeleton(slot, spans)
        result = _SlotResult(
            new, tuple(fired), tuple((s.rule, s.start, s.end, s.key, s.value) for s in spans),
            _hash(masked), masked[:HEAD_CHARS],
        )  # fmt: skip
        self._slot_cache[text] = result
        if len(self._slot_cache) > SLOT_CACHE:
            self._slot_cache.popitem(last=False)
        return result

    def _sort_tools(self, body: dict[str, Any], dialect: Dialect, tool_list: list[Any]) -> bool:
        """Canonical key order in every tool schema, memoised by the tools' bytes:
        agents resend the same tools[] on every turn."""
        try:
            key = orjson.dumps(tool_list)
        except TypeError:
            return tools.sort_schema_keys(dialect, tool_list)
        hit = self._tools_cache.get(key)
        if hit is None:
            moved = tools.sort_schema_keys(dialect, tool_list)
            # The sorted tools are shared between requests unless a tools-scope rule
            # may rewrite their descriptions in place; nothing else mutates a tool.
            hit = (list(tool_list) if self.tools_immutable else orjson.dumps(tool_list)) if moved else None
            self._tools_cache[key] = hit
            if len(self._tools_cache) > SLOT_CACHE:
                self._tools_cache.popitem(last=False)
            return moved
        self._tools_cache.move_to_end(key)
        if not hit:
            return False
        body["tools"] = list(hit) if isinstance(hit, list) else orjson.loads(hit)
        return True

    def prepare(self, body: dict[str, Any], dialect: Dialect, *, declared_parent: str | None = None) -> Prepared:
        rewrites: list[str] = []
        system_slots = dialect.system_slots(body)
        spans: list[pins.Span] = []
        masked_hashes, heads = [], []
        for i, (container, key) in enumerate(system_slots):
            res = self._system_text(container[key])
            container[key] = res.text
            rewrites.extend(n for n in res.fired if n not in rewrites)
            spans.extend(pins.Span(r, i, s, e, k, v) for r, s, e, k, v in res.spans)
            masked_hashes.append(res.masked_hash)
            heads.append(res.head)
        skeleton = _hash("\x1e".join(masked_hashes))
        head = _hash("\x1e".join(heads)[:HEAD_CHARS])
        tool_list = dialect.tools(body)
        tool_slots: list[Slot] = []
        if tool_list:
            if self.sort_tool_keys and self._sort_tools(body, dialect, tool_list):
                rewrites.append(TOOL_KEY_ORDER)
                tool_list = dialect.tools(body)
            if self.static["tools"] or self.pin_tools:
                tool_slots = dialect.tool_slots(body)
                _apply_static(self.static["tools"], tool_slots, rewrites)
        if self.static_messages:
            _apply_static(self.static_messages, dialect.message_slots(body), rewrites)

        slots = system_slots + tool_slots
        if tool_slots and self.pin_tools:
            offset = len(system_slots)
            spans += [
                pins.Span(s.rule, s.slot + offset, s.start, s.end, s.key, s.value)
                for s in pins.find_spans(self.pin_tools, tool_slots)
            ]
        history = dialect.history(body)
        links, sizes = chain.links(dialect, history)
        first_assistant = next((i for i, m in enumerate(history) if dialect.is_assistant(m)), None)
        last_assistant = next((i for i in range(len(history) - 1, -1, -1) if dialect.is_assistant(history[i])), None)
        last_user = next(
            (i for i in range(len(history) - 1, -1, -1) if _role(history[i]) == "user"),
            None,
        )
        own = tools.names(dialect, tool_list)
        signals = Signals(
            depth=0,
            first_assistant=first_assistant,
            last_assistant=last_assistant,
            identity=tuple(s.value for s in spans if s.rule.identity),
            skeleton=skeleton,
            head=head,
            tools=own,
            last_user_index=last_user,
            last_user_text=dialect.last_user_text(body) if last_user is not None else "",
            declared_parent=declared_parent,
        )
        return Prepared(body, dialect, rewrites, slots, spans, links, sizes, signals, own)

    # -- step 2: classify ---------------------------------------------------
    def classify(self, prep: Prepared, lookup: Lookup) -> Decision:
        sig = prep.signals
        sig = replace(sig, depth=lookup.depth)
        prep.signals = sig
        return classify(sig, lookup, self.fork)

    # -- step 3: finalize ---------------------------------------------------
    def finalize(
        self,
        prep: Prepared,
        lookup: Lookup,
        decision: Decision,
        *,
        new_id: str,
        parent_system: Any = None,
        parent_tools: Any = None,
        have_parent_blobs: bool = False,
    ) -> Outcome:
        """Apply pins / tool order / fork repair and build what to record.

        For a fork (or a fork's own later request) the caller passes the parent's
        recorded system value and tools[] (``have_parent_blobs``); without them the
        request is forwarded as a new root, never half-repaired.
        """
        body, dialect, sig = prep.body, prep.dialect, prep.signals
        rewrites = list(prep.rewrites)
        parent = decision.parent
        role: Role = decision.role
        fork_action: str | None = "disabled" if decision.fork_disabled else None
        offered: frozenset[str] | None = None
        repairs_fork = parent is not None and (role == "fork" or parent.kind == "fork")
        if repairs_fork and not have_parent_blobs:
            role, parent, fork_action, repairs_fork = "root", None, "missing_parent", False

        if role == "root" or parent is None:
            record = LineageRecord(
                id=new_id,
                identity=sig.identity,
                skeleton=sig.skeleton,
                head=sig.head,
                pins=_first_values(prep.spans),
                tool_order=prep.own_tools,
                own_tools=prep.own_tools,
            )
            parent_fp = None
        elif repairs_fork:
            if role == "fork":
                record = LineageRecord(
                    id=new_id,
                    kind="fork",
                    parent=parent.id,
                    identity=sig.identity,
                    skeleton=sig.skeleton,
                    head=sig.head,
                    own_tools=prep.own_tools,
                    tool_order=parent.tool_order,
                    system_ref=parent.system_ref,
                    tools_ref=parent.tools_ref,
                    params=dict(parent.params),
                    branch=_branch(prep, lookup),
                )
                fork_action = "repaired"
            else:
                record = parent
                role, fork_action = "fork", "continued"
            self._repair_fork(body, dialect, record, parent_system, parent_tools, rewrites)
            if self.fork.guard_tools:
                offered = frozenset(prep.own_tools)
            parent_fp = parent.fingerprint
        else:  # continuation of a root lineage
            changed = pins.restore(prep.system_slots, prep.spans, parent.pins)
            rewrites.extend(n for n in changed if n not in rewrites)
            tool_order = parent.tool_order
            tool_list = dialect.tools(body)
            if tool_list:
                new_list, tool_order = tools.reorder(dialect, tool_list, parent.tool_order)
                if [id(t) for t in new_list] != [id(t) for t in tool_list]:
                    body["tools"] = new_list
                    rewrites.append("lineage.tool_order")
            merged = dict(_first_values(prep.spans))
            merged.update(parent.pins)
            record = parent.evolve(
                identity=sig.identity or parent.identity,
                skeleton=sig.skeleton,
                head=sig.head,
                pins=merged,
                tool_order=tool_order,
                own_tools=prep.own_tools,
            )
            parent_fp = parent.fingerprint

        if role != "fork" or record.params == {}:
            record = record.evolve(params={p: body[p] for p in self.fork.inherit_params if p in body})

        # What the lineage forwarded, stored once by content hash.
        blobs: dict[str, bytes] = {}
        touch: list[str] = []
        system_bytes = orjson.dumps(dialect.system_value(body))
        tools_bytes = orjson.dumps(dialect.tools(body) or [])
        refs = []
        for raw in (system_bytes, tools_bytes):
            ref = chain.digest(raw)
            refs.append(ref)
            if ref in (record.system_ref, record.tools_ref):
                touch.append(ref)
            else:
                blobs[ref] = raw
        fingerprint = self.fingerprint(
            body, dialect, tools_ref=refs[1], tools_len=len(tools_bytes), n_messages=len(prep.links)
        )
        record = record.evolve(
            system_ref=refs[0], tools_ref=refs[1], fingerprint=fingerprint, requests=record.requests + 1
        )

        start = _branch(prep, lookup) if fork_action == "repaired" else max(lookup.depth - 1, 0)
        links = prep.links[start:]
        return Outcome(
            body=body,
            role=role,
            rewrites=rewrites,
            record=record,
            links=links,
            blobs=blobs,
            touch=touch,
            offered=offered,
            fork_action=fork_action,
            parent_fp=parent_fp,
            fork_signal=decision.signal if role == "fork" and fork_action == "repaired" else None,
        )

    # -- helpers ------------------------------------------------------------
    def _repair_fork(
        self,
        body: dict[str, Any],
        dialect: Dialect,
        record: LineageRecord,
        parent_system: Any,
        parent_tools: Any,
        rewrites: list[str],
    ) -> None:
        if orjson.dumps(dialect.system_value(body)) != orjson.dumps(parent_system):
            dialect.set_system_value(body, parent_system)
            rewrites.append("fork.system")
        if (dialect.tools(body) or []) != (parent_tools or []):
            if parent_tools:
                body["tools"] = parent_tools
            else:
                body.pop("tools", None)
            rewrites.append("fork.tools")
        changed_params = False
        for p in self.fork.inherit_params:
            if p in record.params:
                if body.get(p) != record.params[p]:
                    body[p] = record.params[p]
                    changed_params = True
            elif p in body:
                del body[p]
                changed_params = True
        if changed_params:
            rewrites.append("fork.params")

    def fingerprint(
        self, body: dict[str, Any], dialect: Dialect, *, tools_ref: str, tools_len: int, n_messages: int
    ) -> Fingerprint:
        """What prefix prediction compares, for ``body`` as it is (forwarded or as received)."""
        text = "\x1e".join(c[k] for c, k in dialect.system_slots(body)).encode("utf-8", "surrogatepass")
        blocks = tuple(
            xxhash.xxh64_hexdigest(text[i : i + BLOCK_BYTES]) for i in range(0, len(text), BLOCK_BYTES)
        )
        params = {p: body[p] for p in self.fork.inherit_params if p in body}
        return Fingerprint(
            model=body.get("model") if isinstance(body.get("model"), str) else None,
            params=_hash(orjson.dumps(params, option=orjson.OPT_SORT_KEYS).decode()) if params else "",
            system_blocks=blocks,
            system_len=len(text),
            tools=tools_ref,
            tools_len=tools_len,
            n_messages=n_messages,
        )

    def measure(self, body: dict[str, Any], dialect: Dialect) -> tuple[Fingerprint, list[int]]:
        """Fingerprint and message sizes of a body as received (no rule applied)."""
        tools_bytes = orjson.dumps(dialect.tools(body) or [])
        _, sizes = chain.links(dialect, dialect.history(body))
        fp = self.fingerprint(
            body, dialect, tools_ref=chain.digest(tools_bytes), tools_len=len(tools_bytes), n_messages=len(sizes)
        )
        return fp, sizes



def _branch(prep: Prepared, lookup: Lookup) -> int:
    """Where a new fork leaves its parent's history: after the parent's last reply it
    replays (recorded or not).  The fork owns only the links past this point, so the
    parent's next turn, which replays the same reply, stays the parent's; a lineage
    otherwise gets its links from the deepest recorded one on, since another session
    may own that one too."""
    last = prep.signals.last_assistant
    return max(lookup.depth, last + 1 if last is not None else 0)


def _apply_static(rules: Sequence[Rule], slots: Iterable[Slot], rewrites: list[str]) -> None:
    if not rules:
        return
    for container, key in slots:
        text = container[key]
        for rule in rules:
            new = rule.apply(text)
            if new != text:
                text = new
                if rule.name not in rewrites:
                    rewrites.append(rule.name)
        container[key] = text


def _role(msg: Any) -> Any:
    return msg.get("role") if isinstance(msg, dict) else None


def _first_values(spans: Sequence[pins.Span]) -> dict[str, str]:
    out: dict[str, str] = {}
    for span in spans:
        out.setdefault(span.key, span.value)
    return out


def _hash(text: str) -> str:
    return xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass"))


def blobs_needed(decision: Decision) -> tuple[str, str] | None:
    """The parent's (system, tools) blob refs that finalizing ``decision`` needs, if any."""
    parent = decision.parent
    if parent is None or not (decision.role == "fork" or parent.kind == "fork"):
        return None
    if parent.system_ref is None or parent.tools_ref is None:
        return None
    return parent.system_ref, parent.tools_ref


def ensure_stream_usage(body: dict[str, Any]) -> bool:
    """Ask a streaming upstream for usage; True if the client had not asked itself."""
    if body.get("stream") is not True:
        return False
    opts = body.get("stream_options")
    if isinstance(opts, dict) and opts.get("include_usage") is True:
        return False
    body["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
    return True
