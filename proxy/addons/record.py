"""After the response: record the lineage, its links, the reply's link and any
new blobs (the system part and tools[] as forwarded).

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

Blobs are stored once by content ref.  Finding a blob's bytes in the forwarded
body costs a scan of the body (tools[] come after the whole history), so a ref
this process wrote recently for the tenant is only touched (kept alive), not
extracted again: every new session of an agent sends the same tools[].  A
request of the isolated tenant (no credential) records nothing at all."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any

from canonicalize import JsonDoc, Outcome, chain
from proxy.errors import StoreError
from proxy.flow import Flow
from proxy.services import Services
from proxy.store import ISOLATED

log = logging.getLogger("prefixpin")
WRITTEN = 4096  # (tenant, ref) pairs remembered as written


class Record:
    name = "record"
    counts_only = False  # the next turn's lookup needs it: right at the response's end

    def __init__(self, s: Services) -> None:
        self.s = s
        self._written: OrderedDict[tuple[str, str], None] = OrderedDict()

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
                    rec_id, last = outcome.record.id, tip
                    await s.guard.call(lambda: s.store.record_response(flow.tenant, response_id, rec_id, last))
            touch = list(outcome.touch)
            wanted = self._wanted(flow.tenant, outcome, touch)
            if wanted:
                blobs = (
                    await asyncio.to_thread(self._blobs, flow, outcome, wanted)
                    if flow.big
                    else self._blobs(flow, outcome, wanted)
                )
            else:
                blobs = {}
            blobs.update(outcome.extra_blobs)  # what learning leaves (evidence), stored as is
            if outcome.keep_items:  # forwarded messages a lineage keeps (learn: pin)
                blobs.update(self._items(flow, outcome))
            record = outcome.record if flow.replica is None else outcome.record.evolve(replica=flow.replica)
            message_id = flow.reply.usage.message_id if flow.keep_message_id and flow.reply is not None else None
            if message_id is not None and flow.status < 400:  # the next turn's diagnostics.previous_message_id
                record = record.evolve(message_id=message_id)
            await s.guard.call(lambda: s.store.record(flow.tenant, record, links, blobs, touch))
            for ref in blobs:
                self._remember(flow.tenant, ref)
        except StoreError as exc:
            log.debug("store record failed: %s", exc)
            s.metrics.fail_open.labels(self.name).inc()
        except Exception:
            log.exception("recording failed")
            s.metrics.fail_open.labels(self.name).inc()

    def _wanted(self, tenant: str, outcome: Outcome, touch: list[str]) -> tuple[str, ...]:
        """The new blobs to extract; those written recently are touched instead."""
        rec, wanted = outcome.record, []
        for name in outcome.new_blobs:
            ref = rec.system_ref if name == "system" else rec.tools_ref
            if ref is not None and (tenant, ref) in self._written:
                self._written.move_to_end((tenant, ref))
                touch.append(ref)
            else:
                wanted.append(name)
        return tuple(wanted)

    def _remember(self, tenant: str, ref: str) -> None:
        self._written[(tenant, ref)] = None
        if len(self._written) > WRITTEN:
            self._written.popitem(last=False)

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
