"""Lineage records and the root / continuation / fork decision.

A *lineage* is one conversation as the upstream sees it.  Its record (small, JSON)
holds what later requests need: the session identity and system skeleton that
tell a continuation from another session, the pinned values, the tool order of
its first request, and references (content hashes) to the system and tools[] it
last forwarded, which a fork of it reuses.

``classify`` is pure: it gets the request's analysis and what the store found
(the lineages owning the deepest recorded link this request extends) and
returns a :class:`Decision`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, Literal

import orjson
import xxhash

Role = Literal["root", "continuation", "fork"]
Kind = Literal["root", "fork"]


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What the prefix predictor needs of a forwarded request (sizes in bytes)."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickled across worker processes (proxy.store.replica): positional fields
        # rebuild it ~10x faster than the dataclass' own __getstate__/__setstate__.
        return (Fingerprint, tuple(getattr(self, name) for name in _FIELDS_FINGERPRINT))

    model: str | None = None
    params: str = ""
    system_blocks: tuple[str, ...] = ()
    system_len: int = 0
    tools: str = ""
    tools_len: int = 0
    n_messages: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "m": self.model,
            "p": self.params,
            "sb": list(self.system_blocks),
            "sl": self.system_len,
            "t": self.tools,
            "tl": self.tools_len,
            "n": self.n_messages,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Fingerprint:
        return cls(
            model=d.get("m"),
            params=d.get("p", ""),
            system_blocks=tuple(d.get("sb", ())),
            system_len=int(d.get("sl", 0)),
            tools=d.get("t", ""),
            tools_len=int(d.get("tl", 0)),
            n_messages=int(d.get("n", 0)),
        )


@dataclass(frozen=True, slots=True)
class LineageRecord:
    """The stored state of one lineage (see module docstring)."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickled across worker processes (proxy.store.replica): positional fields
        # rebuild it ~10x faster than the dataclass' own __getstate__/__setstate__ (and
        # without the frozen __init__'s setattr per field: every write is applied in
        # every worker).
        return (_record_from, _record_values(self))

    id: str
    kind: Kind = "root"
    parent: str | None = None
    root: str = ""  # the root lineage's id: the same for a lineage and all its forks (affinity, cache keys)
    identity: tuple[str, ...] = ()
    skeleton: str = ""
    head: str = ""
    pins: dict[str, str] = field(default_factory=dict)
    tool_order: tuple[str, ...] = ()
    own_tools: tuple[str, ...] = ()
    system_ref: str | None = None
    tools_ref: str | None = None
    tools_meaning: str = ""  # hash of the tools as a set of canonical schemas (key order ignored)
    params: dict[str, str] = field(default_factory=dict)  # inherit_params as forwarded: raw JSON text
    notes: tuple[tuple[int, str, str], ...] = ()  # date notes: (history index, line, message hash): canonicalize.notes
    fingerprint: Fingerprint | None = None
    requests: int = 0
    branch: int = 0  # forks: how many messages of the parent's history the fork replayed
    # The pool replica (its index in upstream.pool) that last served the lineage; a
    # fork starts with its parent's.  Every process sharing the store routes the
    # lineage there while it is healthy (section 2c), so a lineage the load bound or
    # a failover moved stays where its prefix is now cached.
    replica: int | None = None
    # provider_cache (section 2b): when the lineage's last request came (the proxy's
    # wall clock, seconds) and its recent pauses over 5 minutes (whole seconds, the
    # newest last), which decide ``anthropic_ttl: auto``; the id of its last Messages
    # response (``diagnostics.previous_message_id``).  Set only when those are on.
    at: float | None = None
    pauses: tuple[int, ...] = ()
    message_id: str | None = None
    # learn: pin (canonicalize.recall): the lineage's newest user message as forwarded
    # (its history index, the blob ref), and the messages it forwards as recorded
    # because the agent dropped a block from them (index, the agent's hash, blob ref).
    tail: tuple[int, str] | None = None
    restores: tuple[tuple[int, str, str], ...] = ()
    first: str | None = None  # the blob ref of its first message as its root forwarded it

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "id": self.id,
                "k": self.kind,
                "p": self.parent,
                "r": self.root,
                "i": list(self.identity),
                "s": self.skeleton,
                "h": self.head,
                "pin": self.pins,
                "to": list(self.tool_order),
                "ot": list(self.own_tools),
                "sr": self.system_ref,
                "tr": self.tools_ref,
                "tm": self.tools_meaning,
                "par": self.params,
                "no": [list(n) for n in self.notes],
                "fp": self.fingerprint.to_json() if self.fingerprint else None,
                "n": self.requests,
                "b": self.branch,
                "rp": self.replica,
                **self._provider_json(),
            }
        )

    def _provider_json(self) -> dict[str, Any]:
        """The provider_cache fields that are set (absent otherwise: records of those not
        using them stay as they were, and older records read as unset)."""
        out: dict[str, Any] = {}
        if self.at is not None:
            out["at"] = self.at
        if self.pauses:
            out["ps"] = list(self.pauses)
        if self.message_id is not None:
            out["mi"] = self.message_id
        if self.tail is not None:
            out["tl"] = list(self.tail)
        if self.restores:
            out["rs"] = [list(r) for r in self.restores]
        if self.first is not None:
            out["fm"] = self.first
        return out

    @classmethod
    def from_bytes(cls, raw: bytes | str) -> LineageRecord:
        d = orjson.loads(raw)
        fp = d.get("fp")
        return cls(
            id=d["id"],
            kind=d.get("k", "root"),
            parent=d.get("p"),
            root=d.get("r", ""),
            identity=tuple(d.get("i", ())),
            skeleton=d.get("s", ""),
            head=d.get("h", ""),
            pins=dict(d.get("pin", {})),
            tool_order=tuple(d.get("to", ())),
            own_tools=tuple(d.get("ot", ())),
            system_ref=d.get("sr"),
            tools_ref=d.get("tr"),
            tools_meaning=d.get("tm", ""),
            params={k: v for k, v in dict(d.get("par", {})).items() if isinstance(v, str)},
            notes=tuple((int(n[0]), str(n[1]), str(n[2]) if len(n) > 2 else "") for n in d.get("no", ())),
            fingerprint=Fingerprint.from_json(fp) if fp else None,
            requests=int(d.get("n", 0)),
            branch=int(d.get("b", 0)),
            replica=_replica(d.get("rp")),
            at=_at(d.get("at")),
            pauses=tuple(p for p in d.get("ps", ()) if isinstance(p, int) and not isinstance(p, bool)),
            message_id=d["mi"] if isinstance(d.get("mi"), str) else None,
            tail=(int(d["tl"][0]), str(d["tl"][1])) if isinstance(d.get("tl"), list) and len(d["tl"]) == 2 else None,
            restores=tuple((int(i), str(h), str(r)) for i, h, r in d.get("rs", ())),
            first=d["fm"] if isinstance(d.get("fm"), str) else None,
        )

    @property
    def root_id(self) -> str:
        """The id of the lineage's root (its own id unless it is a fork)."""
        return self.root or self.id

    def evolve(self, **changes: Any) -> LineageRecord:
        """A copy with ``changes`` (``dataclasses.replace``, without its per-field checks):
        every value read in one call, the changed ones put in their places."""
        values = list(_record_values(self))
        for name, value in changes.items():
            i = _RECORD_PLACE.get(name)
            if i is None:
                raise TypeError(f"not LineageRecord fields: {sorted(changes.keys() - _RECORD_PLACE.keys())}")
            values[i] = value
        return _build_record(values)


_RECORD_FIELDS = tuple(f.name for f in fields(LineageRecord))
_RECORD_PLACE = {name: i for i, name in enumerate(_RECORD_FIELDS)}
_record_values: Callable[[LineageRecord], tuple[Any, ...]] = attrgetter(*_RECORD_FIELDS)


def _builder(cls: type[Any]) -> Callable[[Sequence[Any]], Any]:
    """A constructor of the frozen slots dataclass ``cls`` from all its field values, in
    order, that sets each slot through its descriptor: what the generated ``__init__``
    does (it has no defaults to fill and no ``__post_init__`` here) without its
    ``object.__setattr__`` per field.  Every request evolves one record."""
    setters = tuple(cls.__dict__[f.name].__set__ for f in fields(cls))
    new = object.__new__

    def build(values: Sequence[Any]) -> Any:
        obj = new(cls)
        for put, value in zip(setters, values, strict=True):
            put(obj, value)
        return obj

    return build


_build_record: Callable[[Sequence[Any]], LineageRecord] = _builder(LineageRecord)


def _record_from(*values: Any) -> LineageRecord:
    """A record from all its field values, in order (its pickles name this)."""
    return _build_record(values)


def _replica(value: Any) -> int | None:
    """A recorded replica index; anything else (absent in records written before the
    field existed) is no preference."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


# The store's lookup, bounded (every store answers within these):
LINKS_PER_KEY = 8  # lineages remembered per link (sessions sharing a history)
CANDIDATES = 8  # lineages a lookup returns at most
SCAN_UP = 32  # links a lookup walks up past the deepest recorded one


def _at(value: Any) -> float | None:
    """A recorded time; absent (records written before the field existed) is None."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class Lookup:
    """What the store found for a request's chain.

    ``depth`` is how many of the request's links are recorded (0: none);
    ``candidates`` are the lineages owning the deepest of them (most recent first),
    then those owning shallower links, each with ``depths[i]``, the deepest link of
    this request it owns; ``declared`` is the lineage named by
    ``x-prefixpin-parent``, if it exists.  ``blobs``: recorded system parts and
    tools[] the store returned with them, by ref (those a fork, a fork's later turn
    or learning reads next: see :func:`wants_blobs`), so that they are not read again.
    """

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickled across worker processes (proxy.store.replica): positional fields
        # rebuild it ~10x faster than the dataclass' own __getstate__/__setstate__.
        return (Lookup, tuple(getattr(self, name) for name in _FIELDS_LOOKUP))

    depth: int = 0
    candidates: tuple[LineageRecord, ...] = ()
    declared: LineageRecord | None = None
    depths: tuple[int, ...] = ()
    blobs: Mapping[str, bytes] = field(default_factory=dict)

    def depth_of(self, i: int) -> int:
        return self.depths[i] if i < len(self.depths) else self.depth


EMPTY_LOOKUP = Lookup()
MAX_LOOKUP_BLOBS = 4  # blobs a lookup returns at most (two lineages' system part and tools[])

# A conversation's origin: its first link, or the id of the lineage it continues.  It
# names the conversation's home (where a store keeps it: proxy.store), with which every
# new lineage id of prefixpin's shape starts.
Origin = bytes | str
_HEX = frozenset("0123456789abcdef")


def _is_lineage_id(text: str) -> bool:
    """Whether ``text`` has the shape of prefixpin's lineage ids: 16 lowercase hex digits."""
    return len(text) == 16 and _HEX.issuperset(text)


def home(tenant: str, origin: Origin) -> str:
    """The four hex digits naming a conversation's home: hashed from the tenant and
    its first link, or read from one of its lineage ids (hashed from an id of
    another shape)."""
    if isinstance(origin, str):
        if _is_lineage_id(origin):
            return origin[:4]
        return xxhash.xxh3_64_hexdigest(origin.encode("utf-8", "surrogatepass"))[:4]
    return xxhash.xxh3_64_hexdigest(tenant.encode("utf-8", "surrogatepass") + b"\0" + origin)[:4]


def homed(fresh: str, tenant: str, origin: Origin) -> str:
    """``fresh`` (16 hex digits) made to start with its conversation's home; an id of
    another shape is returned as it is."""
    if not _is_lineage_id(fresh):
        return fresh
    return home(tenant, origin) + fresh[4:]


def origin_of(links: Sequence[bytes], continues: str | None = None) -> Origin:
    """A request's origin: the lineage it continues when its chain starts at a
    previous response's tip, else its first link (b"": no history)."""
    if continues is not None:
        return continues
    return links[0] if links else b""


def wants_blobs(rec: LineageRecord, skeleton: str, tools_ref: str) -> bool:
    """Whether a request whose system skeleton and tools[] ref (as sent) are these may
    read ``rec``'s recorded system part and tools[] next: ``rec`` is a fork (its later
    turns forward its parent's), or its skeleton or tools[] differ (a fork of it, a
    tools[] written otherwise, learning).  The stores return those blobs with the lookup."""
    return rec.kind == "fork" or rec.skeleton != skeleton or rec.tools_ref != tools_ref


@dataclass(frozen=True, slots=True)
class ForkPolicy:
    """The ``fork`` config section, as the pure core needs it."""

    enabled: bool = True
    min_depth: int = 2
    markers: tuple[re.Pattern[str], ...] = ()
    inherit_params: tuple[str, ...] = ("chat_template_kwargs", "reasoning_effort")
    guard_tools: bool = True


@dataclass(frozen=True, slots=True)
class Signals:
    """The facts about one request that classification looks at."""

    depth: int
    first_assistant: int | None  # index of the first assistant message in the history
    last_assistant: int | None  # index of the last one
    identity: tuple[str, ...]
    skeleton: str
    head: str
    tools: tuple[str, ...]
    last_user_index: int | None
    last_user_text: str
    declared_parent: str | None

    def at_depth(self, depth: int) -> Signals:
        """These signals for a request whose first ``depth`` links are recorded."""
        return _build_signals(
            (
                depth,
                self.first_assistant,
                self.last_assistant,
                self.identity,
                self.skeleton,
                self.head,
                self.tools,
                self.last_user_index,
                self.last_user_text,
                self.declared_parent,
            )
        )


_build_signals: Callable[[Sequence[Any]], Signals] = _builder(Signals)


@dataclass(frozen=True, slots=True)
class Decision:
    role: Role
    parent: LineageRecord | None = None  # continuation: its lineage; fork: the parent
    signal: str | None = None  # tools_subset | header | marker (forks)
    fork_disabled: bool = False  # a fork was recognised but fork.enabled is false


def same_session(sig: Signals, rec: LineageRecord, depth: int) -> bool:
    """Identity spans equal when both have them; else equal masked system skeletons
    *and* a replayed reply: two sessions that merely share a first user message
    are two roots."""
    if sig.identity and rec.identity:
        return sig.identity == rec.identity
    return sig.skeleton == rec.skeleton and _has_reply(sig, depth)


def _has_reply(sig: Signals, depth: int) -> bool:
    return sig.first_assistant is not None and sig.first_assistant < depth


def _fork_signal(sig: Signals, rec: LineageRecord, depth: int, policy: ForkPolicy) -> str | None:
    if sig.declared_parent is not None and sig.declared_parent == rec.id:
        return "header"
    if sig.tools != rec.own_tools and set(sig.tools) < set(rec.own_tools):  # (equal: no sets to build)
        return "tools_subset"
    # A marker counts only on a new message: the fork's own tool loop replays it.
    if sig.last_user_index is not None and sig.last_user_index >= depth:
        for marker in policy.markers:
            if marker.search(sig.last_user_text):
                return "marker"
    return None


def fork_signal(sig: Signals, rec: LineageRecord, depth: int, policy: ForkPolicy) -> str | None:
    """The fork signal ``sig`` carries against ``rec`` when it replays enough of it
    (``fork.min_depth`` messages, a reply among them) and forks are enabled; else None."""
    if not policy.enabled or depth < max(policy.min_depth, 1) or not _has_reply(sig, depth):
        return None
    return _fork_signal(sig, rec, depth, policy)


def classify(sig: Signals, lookup: Lookup, policy: ForkPolicy) -> Decision:
    """Root, continuation of a recorded lineage, or fork of one."""
    if lookup.depth == 0:
        return Decision("root")
    candidates = [(rec, lookup.depth_of(i)) for i, rec in enumerate(lookup.candidates)]
    if lookup.declared is not None and all(c.id != lookup.declared.id for c, _ in candidates):
        candidates.append((lookup.declared, lookup.depth))
    disabled = False
    for rec, depth in candidates:
        if rec.kind == "fork":
            # Only a request that replays the fork's own messages continues it; the
            # parent's next turn shares no more than the parent's history with it.
            if depth > rec.branch and same_session(sig, rec, depth):
                return Decision("continuation", rec)
            if depth <= rec.branch:
                continue
        replays = depth >= max(policy.min_depth, 1) and _has_reply(sig, depth)
        signal = _fork_signal(sig, rec, depth, policy) if replays else None
        # Safety: a fork reuses its parent's system prompt, so it must start like
        # it (same skeleton head) unless the client declared the parent itself.
        if signal is not None and (signal == "header" or sig.head == rec.head):
            if policy.enabled:
                return Decision("fork", rec, signal)
            disabled = True
        if same_session(sig, rec, depth):
            return Decision("continuation", rec, fork_disabled=disabled)
    return Decision("root", fork_disabled=disabled)


_FIELDS_FINGERPRINT = tuple(f.name for f in fields(Fingerprint))
_FIELDS_LOOKUP = tuple(f.name for f in fields(Lookup))
