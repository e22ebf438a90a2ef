"""After the response: record the lineage, its links, the reply's link and any
new blobs (the system part and tools[] as forwarded), in one store write with
the Responses API response id and what learning leaves to the tenant's other
conversations (its evidence, a new root's marked links).

When: ``store.shared`` says (proxy.store.Store).  The memory store's writes
never wait: the turn is recorded right after the response's last byte, before
the event loop can read the client's next request.  A shared store's (Redis) go
over the network in a task (``flow.recording``), which the handler awaits before
the response's last bytes.
A request the upstream failed is recorded too, so a retry finds its lineage.
The record names the pool replica that answered (section 2c: every process
sharing the store routes the lineage's next request there) and, when
``provider_cache.diagnostics`` asks for it, the id of the Messages response (the
lineage's next request names it to Anthropic).

Blobs are stored once per conversation by content ref: a lineage's new system
part or tools[] is extracted from the forwarded body and written; one it recorded
before is only touched (kept alive).  When the store answers that a touched blob
is gone (evicted, or lost with the data of a restarted or failed-over Redis), it
is extracted and written again at once, so later forks find it: nothing in this
process remembers what the store holds.  A request of the isolated tenant (no
credential) records nothing at all."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from canonicalize import JsonDoc, Outcome, chain
from proxy.errors import StoreError
from proxy.flow import Flow
from proxy.services import Services
from proxy.store import ISOLATED, TenantWide, origin_of

log = logging.getLogger("prefixpin")


class Record:
    name = "record"
    counts_only = False  # the next turn's lookup needs it: right at the response's end

    def __init__(self, s: Services) -> None:
        self.s = s

    def done(self, flow: Flow) -> None:
        if flow.outcome is None or flow.prep is None or flow.failed or flow.tenant == ISOLATED:
            return
        if not self.s.store.shared and not flow.big:
            _run_inline(self._record(flow))
        else:
            flow.recording = self.s.spawn(self._record(flow))

    async def _record(self, flow: Flow) -> None:
        outcome, prep, s = flow.outcome, flow.prep, self.s
        assert outcome is not None and prep is not None
        response: tuple[str, bytes] | None = None
        try:
            links = list(outcome.links)
            if flow.message is not None and flow.status < 400:
                # The chain's tip: its last link, then one per item the reply adds.
                tip = prep.links[-1] if prep.links else None
                for item in prep.exchange.replayed(flow.message):
                    tip = chain.link(chain.ROOT if tip is None else tip, prep.exchange.canonical_message(item))
                    links.append(tip)
                response_id = flow.message.get("id")
                if isinstance(response_id, str) and response_id and tip is not None:  # Responses: previous_response_id
                    response = (response_id, tip)
            touch = list(outcome.touch)
            blobs = await self._extract(flow, outcome, outcome.new_blobs)
            if outcome.keep_items:  # forwarded messages a lineage keeps (learn: pin)
                blobs.update(self._items(flow, outcome))
            record = outcome.record if flow.replica is None else outcome.record.evolve(replica=flow.replica)
            message_id = flow.reply.usage.message_id if flow.keep_message_id and flow.reply is not None else None
            if message_id is not None and flow.status < 400:  # the next turn's diagnostics.previous_message_id
                record = record.evolve(message_id=message_id)
            # What learning leaves to the tenant's other conversations: kept once per tenant.
            wide = TenantWide(outcome.marks, record.first, outcome.shared_blobs)
            origin = origin_of(prep.links, prep.continues if prep.offset else None)
            missing = await s.guard.call(
                lambda: s.store.record(
                    flow.tenant, record, links, blobs, touch, origin=origin, wide=wide, response=response
                )
            )
            if missing:  # touched blobs the store lost: written again now, for the next fork
                rec = outcome.record
                names = tuple(n for n, ref in (("system", rec.system_ref), ("tools", rec.tools_ref)) if ref in missing)
                again = await self._extract(flow, outcome, names)
                if again:
                    await s.guard.call(lambda: s.store.record(flow.tenant, record, (), again, ()))
        except StoreError as exc:
            log.debug("store record failed: %s", exc)
            s.metrics.fail_open.labels(self.name).inc()
        except Exception:
            log.exception("recording failed")
            s.metrics.fail_open.labels(self.name).inc()

    async def _extract(self, flow: Flow, outcome: Outcome, wanted: tuple[str, ...]) -> dict[str, bytes]:
        """The blobs ``wanted`` (``system``, ``tools``) as forwarded; a big body's on a thread."""
        if not wanted:
            return {}
        if flow.big:
            return await asyncio.to_thread(self._blobs, flow, outcome, wanted)
        return self._blobs(flow, outcome, wanted)

    @staticmethod
    def _items(flow: Flow, outcome: Outcome) -> dict[str, bytes]:
        """The forwarded values the outcome names, by their refs."""
        doc = JsonDoc(flow.out)
        out: dict[str, bytes] = {}
        for path, ref in outcome.keep_items:
            span = doc.span(path)
            if span is not None:
                out[ref] = doc.raw[span[0] : span[1]]
        return out

    @staticmethod
    def _blobs(flow: Flow, outcome: Outcome, wanted: tuple[str, ...]) -> dict[str, bytes]:
        """The system part and/or tools[] (``wanted``) as forwarded."""
        if flow.prep is None:
            return {}
        body, exchange, rec = flow.prep.body, flow.prep.exchange, outcome.record
        doc = JsonDoc(flow.out)
        out: dict[str, bytes] = {}
        if "system" in wanted and rec.system_ref is not None:
            out[rec.system_ref] = exchange.system_blob(doc, body)
        if "tools" in wanted and rec.tools_ref is not None:
            span = doc.span(exchange.tools_path(body)) if exchange.tools(body) else None
            out[rec.tools_ref] = doc.raw[span[0] : span[1]] if span else b"[]"
        return out


def _run_inline(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that never suspends (the memory store's calls) to its end, now."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise RuntimeError("a store that records inline waited")
