"""Evidence that a learned span is a value the agent renders, not an edit (SPEC 2d).

One difference proves nothing: ``Never make more than 3 tool calls`` becoming
``30`` looks like a counter moving on, and is a user's edit.  A ``counter`` is
pinned only once its place (its line with every value masked, and which value it
is: :attr:`canonicalize.spans.Span.place`) has been seen changing in two requests of
the tenant, with two different changes: the session's own next turn, or another
session of the tenant.  The same change seen twice (an edit every session of
the tenant picks up, a client retrying a request) is one change.  A changed
span in the messages before the first reply is pinned only where its line is
the agent's template, which :mod:`canonicalize.recall` judges.

The evidence lives in the store, once per tenant and apart from any of its
conversations (``Store.tenant_wide``: on Redis, in the tenant's own slot), so it
survives a restart with Redis, is shared by every process on it, expires with
``store.ttl_s`` and is bounded with the tenant; two blobs per place:

=================  =================================================================
``ev1:<place>``    the first change seen there (16 hex digits: a hash of the old and
                   the new value, never the values)
``ev2:<place>``    present once a second, different change was seen
=================  =================================================================

:func:`refs` names the blobs a request needs; :func:`judge` says, from what the
store returned, whether a span is pinned and which blobs to write.  The first
writer of a blob wins (the stores keep a blob's first bytes), so two processes
seeing the first change at once agree on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import xxhash

from canonicalize.spans import Span

FIRST = "ev1:"
SURE = "ev2:"
NEEDS_EVIDENCE = ("counter",)  # classes pinned only on evidence (the rest: on sight)


def needs_evidence(span: Span) -> bool:
    """``span`` is pinned only once its place has been seen changing twice."""
    return span.cls in NEEDS_EVIDENCE and bool(span.place)


def refs(spans: Iterable[Span]) -> tuple[str, ...]:
    """The evidence blobs ``spans`` need, in order, without repeats."""
    out: list[str] = []
    for span in spans:
        if needs_evidence(span):
            for ref in (FIRST + span.place, SURE + span.place):
                if ref not in out:
                    out.append(ref)
    return tuple(out)


def change_id(span: Span) -> bytes:
    """What changed at the span's place, as 16 hex digits (the values are not kept)."""
    return xxhash.xxh64_hexdigest(f"{span.old}\x1f{span.new}".encode("utf-8", "surrogatepass")).encode()


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a span is pinned, and the evidence blobs to write after the request."""

    pinned: bool
    writes: dict[str, bytes]


def judge(span: Span, blobs: Mapping[str, bytes]) -> Verdict:
    """``span``'s verdict given the evidence blobs the store returned (absent: never seen).

    Pinned: the place was seen with a second, different change before (``ev2``), or the
    first change recorded there (``ev1``) is not this one (then ``ev2`` is written).
    Not pinned: this is the first change seen there (``ev1`` is written), or the same
    change seen again."""
    if not needs_evidence(span):
        return Verdict(True, {})
    if SURE + span.place in blobs:
        return Verdict(True, {})
    first = blobs.get(FIRST + span.place)
    this = change_id(span)
    if first is None:
        return Verdict(False, {FIRST + span.place: this})
    if first != this:
        return Verdict(True, {SURE + span.place: b"1"})
    return Verdict(False, {})
