"""After the response: record the lineage, its links, the reply's link and any
new blobs (the system part and tools[] as forwarded), off the request's path.
A request the upstream failed is recorded too, so a retry finds its lineage."""

from __future__ import annotations

import asyncio
import logging

from canonicalize import JsonDoc, Outcome, chain
from proxy.errors import StoreError
from proxy.flow import Flow
from proxy.services import Services

log = logging.getLogger("prefixpin")


class Record:
    name = "record"

    def __init__(self, s: Services) -> None:
        self.s = s

    def done(self, flow: Flow) -> None:
        if flow.outcome is None or flow.prep is None or flow.failed:
            return
        self.s.spawn(self._record(flow))

    async def _record(self, flow: Flow) -> None:
        outcome, prep, s = flow.outcome, flow.prep, self.s
        assert outcome is not None and prep is not None
        try:
            links = list(outcome.links)
            if flow.message is not None and flow.status < 400:
                tip = list(prep.links)
                for item in prep.exchange.replayed(flow.message):
                    tip.append(chain.extend(prep.exchange, tip, item))
                    links.append(tip[-1])
                response_id = flow.message.get("id")
                if isinstance(response_id, str) and response_id and tip:  # Responses: previous_response_id
                    rec_id, last = outcome.record.id, tip[-1]
                    await s.guard.call(lambda: s.store.record_response(flow.tenant, response_id, rec_id, last))
            blobs = await asyncio.to_thread(self._blobs, flow, outcome) if flow.big else self._blobs(flow, outcome)
            await s.guard.call(lambda: s.store.record(flow.tenant, outcome.record, links, blobs, outcome.touch))
        except StoreError as exc:
            log.debug("store record failed: %s", exc)
            s.metrics.fail_open.labels(self.name).inc()
        except Exception:
            log.exception("recording failed")
            s.metrics.fail_open.labels(self.name).inc()

    @staticmethod
    def _blobs(flow: Flow, outcome: Outcome) -> dict[str, bytes]:
        """The system part and tools[] as forwarded, for the refs the lineage does not hold yet."""
        if not outcome.new_blobs or flow.prep is None:
            return {}
        body, exchange, rec = flow.prep.body, flow.prep.exchange, outcome.record
        doc = JsonDoc(flow.out)
        out: dict[str, bytes] = {}
        if "system" in outcome.new_blobs and rec.system_ref is not None:
            out[rec.system_ref] = exchange.system_blob(doc, body)
        if "tools" in outcome.new_blobs and rec.tools_ref is not None:
            span = doc.span(exchange.tools_path(body)) if exchange.tools(body) else None
            out[rec.tools_ref] = doc.raw[span[0] : span[1]] if span else b"[]"
        return out
