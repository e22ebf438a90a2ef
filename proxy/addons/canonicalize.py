"""The core's request machine on the request path (:mod:`proxy.drive`): parse,
previous response, static rules, the store lookup, classify, recall, learning,
the blobs, finalize: the edits that make this request extend its lineage's
cached prefix.

A body that is not a JSON object is not ours to judge: it goes upstream
untouched and the upstream answers it.  A body over
``limits.canonicalize_max_bytes`` is not parsed at all (orjson holds the GIL
while it parses, and freeing millions of objects costs the loop too).  A store
that is down or slow costs the lineage, not the request: it goes on as a root
with its static rules (``fail_open{stage="store"}``).
"""

from __future__ import annotations

import logging

from canonicalize import Canonicalized
from proxy.drive import Driver
from proxy.flow import SKIP, Edits, Flow, Parsed, Skip, Tenant
from proxy.store import ISOLATED

log = logging.getLogger("prefixpin")


class Canonicalize:
    name = "canonicalize"
    needs = (Skip, Tenant)
    provides = (Skip, Parsed, Canonicalized, Edits)

    def __init__(self, driver: Driver, *, max_bytes: int) -> None:
        """``max_bytes``: ``limits.canonicalize_max_bytes``."""
        self.driver = driver
        self.max_bytes = max_bytes

    async def request(self, flow: Flow) -> None:
        if flow.get(Skip) is not None:
            return
        inbound = flow.inbound
        if len(inbound.raw) > self.max_bytes:
            log.info("a %d-byte body is over limits.canonicalize_max_bytes: forwarded as sent", len(inbound.raw))
            flow.decide(SKIP)
            return
        # An isolated request (no credential) is no one's: nothing of it is kept for another;
        # nor is a big body, parsed whole on a worker thread.
        tenant, big = flow.tenant, inbound.big
        remember = tenant != ISOLATED and not big
        done = await self.driver.canonicalize(
            inbound.raw, inbound.exchange, tenant, inbound.headers, remember=remember, big=big
        )
        if done is None:
            flow.decide(SKIP)
            return
        flow.decide(Parsed(done.body, done.doc))
        flow.decide(done)
        flow.outbound.ops.extend(done.ops)
