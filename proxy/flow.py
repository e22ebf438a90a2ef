"""One request on its way through prefixpin: what came in, what the addons
decided, what goes out, what came back.

- :class:`Inbound`: the request as the client sent it, once its body is in.
  Immutable.
- The addons' decisions: small frozen values, each made by the one addon that
  provides it (:mod:`proxy.addons` checks that every addon comes after those it
  needs): :class:`Skip`, :class:`Tenant`, :class:`Parsed`, the core's
  :class:`~canonicalize.Canonicalized`, :class:`UsageAsked`,
  :class:`CacheControls`, :class:`Guarded`, :class:`Placement`.
  :meth:`Flow.get` reads one (None: not made).
- :class:`Outbound`: the small part the addons add to as they go: the edits
  spliced into the client's bytes, the request headers set.
- :class:`Answer`: the upstream's answer as it is read: the reply machine, the
  status, the reply as the client got it.

When an addon fails, :meth:`Flow.fail_open` drops every decision and edit (the
request goes as the client sent it, nothing is recorded) but the facts that
describe the request (its tenant and its parse, for the metrics and the trace).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, TypeVar

from starlette.datastructures import Headers

from canonicalize import Canonicalized, Exchange, JsonDoc, LineageRecord, Op, Outcome, Reply
from proxy.cpu import is_big
from proxy.upstream.policy import NO_ROUTE, Route

D = TypeVar("D")


class Inbound(NamedTuple):
    """The request as the client sent it, its whole body read (at ``started``,
    ``perf_counter()``).  Immutable (a NamedTuple: made per request, it costs a
    quarter of a frozen dataclass)."""

    exchange: Exchange
    path: str  # the request target's path, as the client sent it (no query)
    query: bytes  # the raw query string
    headers: Headers
    raw: bytes  # the body
    started: float

    @property
    def big(self) -> bool:
        """Its CPU work runs on a worker thread (:mod:`proxy.cpu`)."""
        return is_big(len(self.raw))

    @property
    def bypassed(self) -> bool:
        """``x-prefixpin-bypass: 1``: the client asks for it to go untouched.  (Its first
        value, read from the raw headers: ``Headers.get`` raises a ``KeyError`` inside
        for an absent header, and almost every request has none.)"""
        for name, value in self.headers.raw:
            if name == b"x-prefixpin-bypass":
                return value.decode("latin-1").strip() == "1"
        return False


# -- the decisions ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Skip:
    """Not ours to judge (bypassed, too big, not a JSON object): forwarded untouched."""

    role: ClassVar[str] = "bypass"


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who the request belongs to (:mod:`proxy.tenancy`).  A fact: kept on fail-open."""

    id: str


@dataclass(frozen=True, slots=True)
class Parsed:
    """The body as parsed by the core, a JSON object.  A fact: kept on fail-open."""

    body: dict[str, Any]
    doc: JsonDoc

    @property
    def model(self) -> Any:
        return self.body.get("model")


@dataclass(frozen=True, slots=True)
class UsageAsked:
    """Usage was asked for on the client's behalf: the reply machine drops the usage
    chunk the client did not ask for."""


@dataclass(frozen=True, slots=True)
class CacheControls:
    """What the provider caches' addon decided beyond its edits: record the response's
    message id with the turn (diagnostics), and the record as it is to be written
    (with this request's time among its pauses, ``anthropic_ttl: auto``)."""

    keep_message_id: bool = False
    record: LineageRecord | None = None


@dataclass(frozen=True, slots=True)
class Guarded:
    """A repaired fork: the reply machine removes calls to tools it did not offer."""

    offered: frozenset[str]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the pool places the request (its lineage's route) and the llama-server
    slot pinned in its body (``x-prefixpin-slot``)."""

    route: Route = NO_ROUTE
    slot: int | None = None


class Edits:
    """What an addon provides when it adds to :class:`Outbound`, and needs when it reads
    what the addons before it added."""


SKIP = Skip()
FACTS: tuple[type, ...] = (Skip, Tenant, Parsed)  # what fail_open keeps


# -- what goes out, what comes back -------------------------------------------------------
@dataclass(slots=True)
class Outbound:
    """What goes upstream besides the client's bytes: the edits, in the order the addons
    made them, and request headers set (each replacing the client's of that name)."""

    ops: list[Op] = field(default_factory=list)
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""  # the client's bytes with the edits spliced in (the handler's)


@dataclass(slots=True)
class Answer:
    """The upstream's answer as it is read: the exchange's reply machine (None: read by
    no one, it goes as the upstream sent it), the status the client got, the pool's
    replica, the reply as the client received it (the next turn replays it) and when
    the response ended."""

    reply: Reply | None = None
    status: int = 0
    replica: int | None = None
    message: dict[str, Any] | None = None
    ended: float = 0.0
    whole: bytes | None = None  # a whole answer the reply machine reads once the client has it

    def unread(self) -> None:
        """From here on the answer is not read: it goes on as the upstream sends it."""
        self.reply = None
        self.whole = None


class Flow:
    """One request (module docstring)."""

    __slots__ = ("_decided", "answer", "done", "failed", "inbound", "outbound")

    def __init__(self, inbound: Inbound) -> None:
        self.inbound = inbound
        self._decided: dict[type, Any] = {}
        self.done: Canonicalized | None = None  # the core's outcome, the decision most read
        self.outbound = Outbound()
        self.answer = Answer()
        self.failed = False  # an addon failed: forwarded as the client sent it

    def get(self, kind: type[D]) -> D | None:
        """The decision of type ``kind``, if an addon made it."""
        return self._decided.get(kind)

    def decide(self, decision: object) -> None:
        """Add an addon's decision (one of each type)."""
        self._decided[type(decision)] = decision
        if isinstance(decision, Canonicalized):
            self.done = decision

    def fail_open(self) -> None:
        """Forward what the client sent: no decision, no edit, nothing recorded."""
        self.failed = True
        self._decided = {k: v for k, v in self._decided.items() if k in FACTS}
        self.done = None
        self.outbound = Outbound()

    # -- what the decisions say, read by many ------------------------------------------
    @property
    def big(self) -> bool:
        """Its CPU work runs on a worker thread (:mod:`proxy.cpu`): a big body, or one
        whose analysis the core found heavy (``Canonicalized.heavy``)."""
        done = self.done
        return self.inbound.big or (done is not None and done.heavy)

    @property
    def role(self) -> str:
        """``x-prefixpin-role`` and the ``role`` label."""
        if self.failed:
            return "fail-open"
        done = self.done
        if done is not None:
            return done.role
        return Skip.role if Skip in self._decided else "root"

    @property
    def tenant(self) -> str:
        tenant = self._decided.get(Tenant)
        return tenant.id if tenant is not None else ""

    @property
    def model(self) -> Any:
        parsed = self._decided.get(Parsed)
        return parsed.model if parsed is not None else None

    @property
    def outcome(self) -> Outcome | None:
        """What is recorded of it (None: nothing)."""
        done = self.done
        return done.outcome if done is not None else None

    @property
    def rewrites(self) -> list[str]:
        done = self.done
        return done.rewrites if done is not None else []

    @property
    def out(self) -> bytes:
        """What went upstream."""
        return self.outbound.body or self.inbound.raw


__all__ = [
    "FACTS",
    "SKIP",
    "Answer",
    "CacheControls",
    "Edits",
    "Flow",
    "Guarded",
    "Inbound",
    "Outbound",
    "Parsed",
    "Placement",
    "Skip",
    "Tenant",
    "UsageAsked",
]
