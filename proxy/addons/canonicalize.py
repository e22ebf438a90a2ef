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

from canonicalize import Request
from proxy.drive import Driver
from proxy.flow import Flow
from proxy.services import Services
from proxy.store import ISOLATED

log = logging.getLogger("prefixpin")


class Canonicalize:
    name = "canonicalize"

    def __init__(self, s: Services, driver: Driver) -> None:
        self.max_bytes = s.config.limits.canonicalize_max_bytes
        self.driver = driver

    async def request(self, flow: Flow) -> None:
        if flow.skip:
            return
        if len(flow.raw) > self.max_bytes:
            log.info("a %d-byte body is over limits.canonicalize_max_bytes: forwarded as sent", len(flow.raw))
            flow.skip, flow.role = True, "bypass"
            return
        # An isolated request (no credential) is no one's: nothing of it is kept for another;
        # nor is a big body, parsed whole on a worker thread.
        remember = flow.tenant != ISOLATED and not flow.big
        request = Request(flow.raw, flow.exchange, flow.tenant, flow.headers, remember)
        done = await self.driver.canonicalize(request, big=flow.big)
        if done is None:
            flow.skip, flow.role = True, "bypass"
            return
        flow.body, flow.doc, flow.prep, flow.lookup = done.body, done.doc, done.prep, done.lookup
        flow.ops.extend(done.ops)
        flow.rewrites = done.rewrites
        flow.outcome, flow.role = done.outcome, done.role
        flow.store_ok = done.outcome is not None
        flow.done = done
