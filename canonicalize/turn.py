"""What a finished request records: :func:`turn`.

Once the response is done, the request's lineage record is written with the
links its lineage now owns (its own, then one per item of the reply the client
received, which the next request replays), the blobs it forwarded for the first
time (its system part and tools[], its newest user message with ``learn: pin``),
the blobs it forwarded before (only kept alive), the Responses API response id
(``previous_response_id`` continues from the chain's tip) and what it leaves to
its tenant's other conversations.  Every blob is cut from the bytes forwarded,
as they went.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from canonicalize import chain
from canonicalize.edits import SetString
from canonicalize.jsonspan import JsonDoc, moved
from canonicalize.lineage import LineageRecord, Origin
from canonicalize.pipeline import Canonicalized


class Turn(NamedTuple):
    """One store write (``Store.record``): the record, the links it owns from now on,
    new blobs by ref, refs to keep alive, the conversation's origin, what the tenant's
    other conversations get (links marked, evidence blobs) and a Responses API
    (response id, tip link)."""

    record: LineageRecord
    links: list[bytes]
    blobs: dict[str, bytes]
    touch: list[str]
    origin: Origin
    marks: tuple[bytes, ...]
    shared_blobs: Mapping[str, bytes]
    response: tuple[str, bytes] | None


def turn(done: Canonicalized, forwarded: bytes, reply: dict[str, Any] | None, record: LineageRecord) -> Turn:
    """The write that records ``done`` (its outcome, which must be there) as
    ``record``: ``forwarded`` are the bytes that went upstream, ``reply`` the message
    the client received (None: the upstream failed, nothing to replay)."""
    outcome, prep = done.outcome, done.prep
    assert outcome is not None
    links = list(outcome.links)
    response: tuple[str, bytes] | None = None
    if reply is not None:
        # The chain's tip: its last link, then one per item the reply adds.
        tip = prep.links[-1] if prep.links else None
        for item in prep.exchange.replayed(reply):
            tip = chain.link(chain.ROOT if tip is None else tip, prep.exchange.canonical_message(item))
            links.append(tip)
        response_id = reply.get("id")
        if isinstance(response_id, str) and response_id and tip is not None:  # Responses: previous_response_id
            response = (response_id, tip)
    blobs: dict[str, bytes] = {}
    if outcome.new_blobs or outcome.keep_items:
        doc = _located(done, forwarded)
        blobs = _parts(done, doc, outcome.new_blobs)
        for path, ref in outcome.keep_items:  # forwarded messages a lineage keeps (learn: pin)
            span = doc.span(path)
            if span is not None:
                blobs[ref] = doc.raw[span[0] : span[1]]
    return Turn(record, links, blobs, list(outcome.touch), prep.origin, outcome.marks, outcome.shared_blobs, response)


def again(done: Canonicalized, forwarded: bytes, missing: Sequence[str]) -> dict[str, bytes]:
    """The blobs of ``missing`` (refs a store answered it no longer holds) this turn
    can write again: its system part and tools[] as forwarded."""
    outcome = done.outcome
    assert outcome is not None
    rec = outcome.record
    names = tuple(n for n, ref in (("system", rec.system_ref), ("tools", rec.tools_ref)) if ref in missing)
    return _parts(done, _located(done, forwarded), names) if names else {}


def _located(done: Canonicalized, forwarded: bytes) -> JsonDoc:
    """``forwarded``'s document: the request's own when no edit changed its bytes; when
    its edits replaced strings (a pinned value, a stripped counter) and appended
    members, one that takes its spans from the request's, moved by the edits
    (:func:`canonicalize.jsonspan.moved`): what the request located, or locates now,
    is not looked for again in ``forwarded``, and stays with the request's document
    for its conversation's next body (canonicalize.pieces); else a new one."""
    doc = done.doc
    if forwarded is doc.raw or forwarded == doc.raw:
        return doc
    strings = [span for op in done.ops if isinstance(op, SetString) and (span := doc.span(op.path)) is not None]
    found = moved(doc, forwarded, strings)
    return found if found is not None else JsonDoc(forwarded)


def _parts(done: Canonicalized, doc: JsonDoc, wanted: Sequence[str]) -> dict[str, bytes]:
    """The system part and/or tools[] (``wanted``) as forwarded, by their refs."""
    out: dict[str, bytes] = {}
    if not wanted or done.outcome is None:
        return out
    body, exchange, rec = done.prep.body, done.prep.exchange, done.outcome.record
    if "system" in wanted and rec.system_ref is not None:
        out[rec.system_ref] = exchange.system_blob(doc, body)
    if "tools" in wanted and rec.tools_ref is not None:
        span = doc.span(exchange.tools_path(body)) if exchange.tools(body) else None
        out[rec.tools_ref] = doc.raw[span[0] : span[1]] if span else b"[]"
    return out


__all__ = ["Turn", "again", "turn"]
