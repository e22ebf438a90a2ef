"""Parse once, static rules, one store lookup, classify, pins / notes / tools /
fork repair: the edits that make this request extend its lineage's cached
prefix.

A request whose system text (or a tool description) is not what the lineage it
continues forwarded learns the spans that changed (``canonicalize.learn``): one
more store call, for the recorded text; they are counted and logged
(:mod:`proxy.learned`) and, with ``learn: pin``, pinned.

A body that is not a JSON object is not ours to judge: it goes upstream
untouched and the upstream answers it.  A big body is parsed, hashed and
finalized on a worker thread so the event loop keeps serving everyone else; a
body over ``limits.canonicalize_max_bytes`` is not parsed at all (orjson holds
the GIL while it parses, and freeing millions of objects costs the loop too).  A store that is
down or slow costs the lineage, not the request: it goes on as a root with its
static rules (``fail_open{stage="store"}``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import cast

import orjson

from canonicalize import CANDIDATES, Decision, JsonDoc, Learned, LineageRecord, Lookup, Plan, Prepared
from canonicalize.recall import Head, Marker
from proxy.errors import StoreError
from proxy.flow import Flow
from proxy.learned import Suggestions
from proxy.services import Services
from proxy.store import ISOLATED, Origin, homed, origin_of

log = logging.getLogger("prefixpin")
LOOKUP_LINKS = 1024  # the newest links a lookup walks: a continuation's parent is near the end


class Canonicalize:
    name = "canonicalize"

    def __init__(self, s: Services, *, new_id: Callable[[], str] | None = None) -> None:
        self.s = s
        self.new_id = new_id or _Ids()
        self.suggestions = Suggestions(s.metrics, s.canon.settings.learn)

    async def request(self, flow: Flow) -> None:
        if flow.skip:
            return
        if len(flow.raw) > self.s.config.limits.canonicalize_max_bytes:
            log.info("a %d-byte body is over limits.canonicalize_max_bytes: forwarded as sent", len(flow.raw))
            flow.skip, flow.role = True, "bypass"
            return
        parsed = await asyncio.to_thread(self._parse_whole, flow) if flow.big else self._parse(flow)
        if not parsed:
            flow.skip, flow.role = True, "bypass"
            return
        s, canon = self.s, self.s.canon
        previous = await self._previous(flow)
        prep = await asyncio.to_thread(self._prepare, flow, previous) if flow.big else self._prepare(flow, previous)
        flow.prep = prep
        try:
            lookup = await s.guard.call(lambda: self._lookup(flow.tenant, prep))
        except StoreError:
            lookup, flow.store_ok = Lookup(), False
        flow.lookup = lookup
        decision = canon.classify(prep, lookup)
        head, got = None, lookup.blobs  # got: blobs read already
        if flow.store_ok and decision.role == "root" and not lookup.depth:
            recalled = await self._recall(flow, prep)
            if recalled is not None:
                decision, lookup, head, got = recalled
        learned = None
        plan = canon.learning(prep, lookup, decision) if flow.store_ok else None
        if plan is not None:
            learned = await self._learn(flow, prep, lookup, decision, plan)
            if learned is not None:
                decision, lookup = learned.decision, learned.lookup
        needed = canon.blobs_needed(prep, decision, learned, lookup)
        blobs = {ref: got[ref] for ref in needed if ref in got}
        refs = tuple(ref for ref in needed if ref not in got)
        evidence = canon.evidence_needed(decision, learned)
        if (refs or evidence) and flow.store_ok:
            owner = decision.parent.id if decision.parent is not None else None
            try:
                blobs.update(await s.guard.call(lambda: self._blobs(flow.tenant, refs, owner, evidence)))
            except StoreError:
                flow.store_ok = False
        # An id of prefixpin's shape (16 hex digits) starts with its conversation's home
        # (proxy.store); another (a test's "L0001") is kept as it is.
        new_id = homed(self.new_id(), flow.tenant, origin_of(prep.links, prep.continues if prep.offset else None))
        if flow.big:
            outcome = await asyncio.to_thread(
                canon.finalize, prep, lookup, decision, new_id=new_id, blobs=blobs, learned=learned, head=head
            )
        else:
            outcome = canon.finalize(prep, lookup, decision, new_id=new_id, blobs=blobs, learned=learned, head=head)
        flow.ops.extend(outcome.ops)
        flow.rewrites = outcome.rewrites
        if flow.store_ok:
            flow.outcome, flow.role = outcome, outcome.role
        else:
            s.metrics.fail_open.labels("store").inc()
            flow.role = "fail-open"

    async def _blobs(
        self, tenant: str, refs: tuple[str, ...], owner: str | None, evidence: tuple[str, ...]
    ) -> dict[str, bytes]:
        """The blobs ``refs`` of lineage ``owner``'s conversation and the tenant's
        ``evidence``, read at once (on Redis: the conversation's home, the tenant's slot)."""
        store = self.s.store
        if not evidence:
            found = await store.blobs(tenant, refs, owner)
        elif not refs:
            found = (await store.tenant_wide(tenant, (), evidence))[1]
        else:
            own, (_, wide) = await asyncio.gather(
                store.blobs(tenant, refs, owner), store.tenant_wide(tenant, (), evidence)
            )
            found = [*own, *wide]
        return {ref: raw for ref, raw in zip((*refs, *evidence), found, strict=True) if raw is not None}

    async def _learn(
        self, flow: Flow, prep: Prepared, lookup: Lookup, decision: Decision, plan: Plan
    ) -> Learned | None:
        """What the request learns from the lineages of ``plan`` (their recorded blobs
        fetched in one store call); counted and logged.  The store down: nothing (the
        request goes on as classified)."""
        s, canon = self.s, self.s.canon
        got = flow.lookup.blobs if flow.lookup is not None else {}
        blobs = {ref: got[ref] for ref in plan.refs if ref in got}  # returned by the lookup already
        refs = tuple(ref for ref in plan.refs if ref not in got)
        if refs:
            owner = plan.candidates[0][0].id if plan.candidates else None  # all found in this conversation's home
            try:
                found = await s.guard.call(lambda: s.store.blobs(flow.tenant, refs, owner))
            except StoreError:
                return None
            blobs.update((ref, raw) for ref, raw in zip(refs, found, strict=True) if raw is not None)
        if flow.big:
            learned = await asyncio.to_thread(canon.learn, prep, lookup, decision, plan, blobs)
        else:
            learned = canon.learn(prep, lookup, decision, plan, blobs)
        if learned is not None:
            self.suggestions.note(flow.tenant, learned)
        return learned

    async def _recall(self, flow: Flow, prep: Prepared) -> tuple[Decision, Lookup, Head, dict[str, bytes]] | None:
        """The lineage of a request whose first message is the one the lineage forwarded
        but for a dropped block or fresh values on the agent's template lines (``learn:
        pin``, canonicalize.recall): the lineages that marked its stem (the tenant's), each
        one's record and recorded message (its home's) compared, then at once each changed
        line checked (another conversation of the tenant marked it) and the request's chain
        with the recorded message in place looked up again, which the lineage must own
        whole.  Three store round trips; the lineage, and the blobs read (its first
        message); nothing found, or the store down: None."""
        s, canon, tenant = self.s, self.s.canon, flow.tenant
        stem = canon.stem(prep)
        if stem is None:
            return None
        try:
            marked = (await s.guard.call(lambda: s.store.tenant_wide(tenant, [stem], ())))[0][0]
            if not marked:
                return None
            recs, blobs = await s.guard.call(lambda: self._lineages(tenant, marked[:CANDIDATES]))
            for rec in canon.stem_heads(prep, recs):
                head = canon.match_head(prep, rec, blobs)
                if head is None or rec.fingerprint is None:
                    continue
                lines, links = head.lines, head.links
                markers, check = await s.guard.call(
                    lambda: asyncio.gather(
                        s.store.tenant_wide(tenant, lines, ()),  # noqa: B023
                        self._lookup_links(tenant, links, None),  # noqa: B023
                    )
                )
                if not all(canon.is_template(prep, rec, m) for m in markers[0]):
                    continue
                owners = {r.id for i, r in enumerate(check.candidates) if check.depth_of(i) == check.depth}
                if check.depth >= rec.fingerprint.n_messages and rec.id in owners:
                    return Decision("continuation", rec), Lookup(0, (rec,), None, (0,)), head, blobs
        except StoreError:
            return None
        return None

    async def _lineages(self, tenant: str, markers: Sequence[Marker]) -> tuple[list[LineageRecord], dict[str, bytes]]:
        """The records of the lineages ``markers`` name (in their order) and their first
        messages, read at once (on Redis: each from its home)."""
        store = self.s.store
        found = await asyncio.gather(
            *(store.lookup(tenant, (), lineage, origin=lineage) for lineage, _ in markers),
            *(store.blobs(tenant, [first], lineage) for lineage, first in markers),
        )
        n = len(markers)
        recs = [f.declared for f in cast(list[Lookup], found[:n]) if f.declared is not None]
        raws = cast(list[list[bytes | None]], found[n:])
        blobs = {first: raw[0] for (_, first), raw in zip(markers, raws, strict=True) if raw[0] is not None}
        return recs, blobs

    def _parse(self, flow: Flow) -> bool:
        """The body parsed by pieces of the tenant's recent bodies where they are equal."""
        # An isolated request (no credential) is no one's: nothing of it is kept for another.
        found = self.s.canon.parse(flow.raw, flow.exchange, flow.tenant, remember=flow.tenant != ISOLATED)
        if found is None or not isinstance(found[0], dict):
            return False
        flow.body, flow.doc, flow.kept = found
        return True

    @staticmethod
    def _parse_whole(flow: Flow) -> bool:
        """A big body, on a worker thread: parsed whole, remembered nowhere."""
        try:
            body = orjson.loads(flow.raw)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(body, dict):
            return False
        flow.body = body
        flow.doc = JsonDoc(flow.raw)
        return True

    async def _previous(self, flow: Flow) -> tuple[str, bytes] | None:
        """The lineage and tip link the response named by ``previous_response_id``
        (Responses API) left: the request continues there.  Unknown, or the store
        down: None (the request is judged on its own)."""
        assert flow.body is not None
        response_id = flow.body.get("previous_response_id")
        if not isinstance(response_id, str) or not response_id:
            return None
        s = self.s
        try:
            found = await s.guard.call(lambda: s.store.response(flow.tenant, response_id))
        except StoreError:
            return None
        return found

    def _prepare(self, flow: Flow, previous: tuple[str, bytes] | None) -> Prepared:
        assert flow.doc is not None and flow.body is not None
        parent = flow.headers.get("x-prefixpin-parent") or None
        return self.s.canon.prepare(
            flow.doc,
            flow.body,
            flow.exchange,
            declared_parent=parent,
            headers=flow.headers,
            previous=previous,
            scope=flow.tenant,
            kept=flow.kept,
        )

    async def _lookup(self, tenant: str, prep: Prepared) -> Lookup:
        """The store's answer for the newest LOOKUP_LINKS links (depths stay absolute)."""
        origin = origin_of(prep.links, prep.continues if prep.offset else None)
        sent = self.s.canon.sent(prep)
        return await self._lookup_links(tenant, prep.links, prep.signals.declared_parent, origin, sent)

    async def _lookup_links(
        self,
        tenant: str,
        links: list[bytes],
        declared: str | None,
        origin: Origin | None = None,
        sent: tuple[str, str] | None = None,
    ) -> Lookup:
        """The store's answer for the newest LOOKUP_LINKS of ``links`` (depths stay absolute),
        in the home of ``origin`` (default: the conversation starting with ``links[0]``);
        ``sent``: the request's skeleton and tools[] ref (Store.lookup)."""
        offset = max(len(links) - LOOKUP_LINKS, 0)
        if origin is None:
            origin = origin_of(links)
        found = await self.s.store.lookup(tenant, links[offset:], declared, origin=origin, sent=sent)
        if not offset or not found.depth:
            return found
        depths = tuple(d + offset for d in found.depths)
        return Lookup(found.depth + offset, found.candidates, found.declared, depths, found.blobs)


class _Ids:
    """New lineage ids: 16 hex digits from the OS's CSPRNG, drawn 64 at a time (one
    ``getrandom`` per 64 requests, not one per request)."""

    def __init__(self) -> None:
        self._pool: list[str] = []

    def __call__(self) -> str:
        if not self._pool:
            pool = secrets.token_hex(8 * 64)
            self._pool = [pool[i : i + 16] for i in range(0, len(pool), 16)]
        return self._pool.pop()
