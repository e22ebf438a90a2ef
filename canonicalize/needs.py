"""What the request machine asks of the shell (:mod:`canonicalize.pipeline`).

The core does no I/O: where it needs something only the store has, the machine
stops and returns a :class:`Need`; where the rest of a request's steps are heavy
(:class:`OffLoop`), it says so before it takes them, and the shell moves them.  The shell
answers it (``proxy.steps``) and feeds the answer back.  Each need names the type
of its answer (``Need[T]``); an answer may also be :data:`UNAVAILABLE`: the store
failed, and the machine goes on without it (the request keeps its static rules,
nothing of it is recorded).  Every need is answered within the request's tenant.

=================  ===========================================  =======================================
need               answered with                                the store's call
=================  ===========================================  =======================================
:class:`Previous`  (lineage, tip link) a response id ended at   ``response(tenant, response_id)``
:class:`Chain`     what the store holds of the links            ``lookup(tenant, links, declared, ...)``
:class:`Declared`  one lineage's record, found by its id        ``lookup(tenant, (), id, origin=id)``
:class:`Blobs`     blobs of one conversation (None: not held)   ``blobs(tenant, refs, owner)``
:class:`Marked`    the lineages that marked each link           ``tenant_wide(tenant, links, ())``
:class:`Evidence`  the tenant's evidence blobs                  ``tenant_wide(tenant, (), refs)``
:class:`Together`  each of its needs' answers, asked at once    (one round trip)
:class:`OffLoop`   None, once the next steps run off the loop   (none: a worker thread)
=================  ===========================================  =======================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from canonicalize.lineage import LineageRecord, Lookup, Origin
from canonicalize.recall import Marker

T = TypeVar("T")


class Unavailable:
    """The answer to a need the store could not answer (down, slow, or it failed)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNAVAILABLE"


UNAVAILABLE = Unavailable()


class Need(Generic[T]):
    """Something the machine needs before its next step; answered with a ``T``."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Previous(Need[tuple[str, bytes] | None]):
    """The lineage and tip link the Responses API response ``response_id`` ended at."""

    response_id: str


@dataclass(frozen=True, slots=True)
class Chain(Need[Lookup]):
    """What the store holds of ``links`` and the ``declared`` lineage, in the home of
    ``origin``; ``sent``: the request's system skeleton and tools[] ref as sent (the
    lookup then returns the recorded blobs the request may read next)."""

    links: Sequence[bytes]
    declared: str | None
    origin: Origin
    sent: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Declared(Need[LineageRecord | None]):
    """The record of the lineage ``lineage`` (from its own home)."""

    lineage: str


@dataclass(frozen=True, slots=True)
class Blobs(Need[list[bytes | None]]):
    """The blobs ``refs`` of lineage ``owner``'s conversation, in order."""

    refs: Sequence[str]
    owner: str | None


@dataclass(frozen=True, slots=True)
class Marked(Need[list[tuple[Marker, ...]]]):
    """The lineages that marked each of ``links`` (the tenant's, newest first)."""

    links: Sequence[bytes]


@dataclass(frozen=True, slots=True)
class Evidence(Need[list[bytes | None]]):
    """The tenant's evidence blobs ``refs``, in order."""

    refs: Sequence[str]


@dataclass(frozen=True, slots=True)
class Together(Need[tuple[Any, ...]]):
    """Every one of ``needs`` at once (one round trip); unavailable if any is."""

    needs: tuple[Need[Any], ...]


@dataclass(frozen=True, slots=True)
class OffLoop(Need[None]):
    """The request's next steps are heavy (``texts`` system texts, ``chars`` characters
    of them to analyse, -1 when not counted: far more than an agent sends): the shell
    runs them, and what it does with the outcome, where they do not hold up other requests."""

    texts: int
    chars: int


__all__ = [
    "UNAVAILABLE",
    "Blobs",
    "Chain",
    "Declared",
    "Evidence",
    "Marked",
    "Marker",
    "Need",
    "OffLoop",
    "Previous",
    "Together",
    "Unavailable",
]
