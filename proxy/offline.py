"""The proxy's request flow without sockets: the real addons (the app's tuple, less
the ones a live upstream needs) and runner on an embedded store, a request in, the
flow out.  ``prefixpin audit`` replays traces
through it, and tests drive lineage, pins and forks through it: there is no
second implementation of the request path or of the store's semantics.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from starlette.datastructures import Headers

from canonicalize import CHAT, Canonicalizer, Exchange, Memos, Settings
from proxy import addons
from proxy.addons import Runner
from proxy.config import Config
from proxy.flow import Flow
from proxy.metrics import Metrics
from proxy.services import Services
from proxy.store import Bounds, Store
from proxy.store.guard import StoreGuard
from proxy.store.memory import MemoryStore


def _unbounded(config: Config) -> MemoryStore:
    bounds = Bounds(10**9, 2**62, config.store.max_links_per_request)
    return MemoryStore(ttl_s=10**9, max_entries=10**9, max_bytes=2**62, bounds=bounds)


class Offline:
    """Send requests through the request hooks, then record their replies."""

    def __init__(
        self,
        config: Config,
        *,
        settings: Settings | None = None,
        store: Store | None = None,
        new_id: Callable[[], str] | None = None,
        memos: Memos | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``settings`` replaces the config's packs, rules and fork policy, ``memos`` the
        canonicalizer's memos (tests: ``Memos.off()`` remembers nothing); ``clock``: the
        time each request comes at (audit: the trace's)."""
        canon = Canonicalizer(settings or config.settings(), memos=memos)
        self.s = Services(
            config=config,
            canon=canon,
            store=store if store is not None else _unbounded(config),  # an empty store is falsy (len 0)
            guard=StoreGuard(),
            metrics=Metrics(rules=canon.rule_names),
        )
        if clock is not None:
            self.s.clock = clock
        counter = itertools.count(1)
        ids = new_id or (lambda: f"L{next(counter):04d}")
        self.runner = Runner(addons.build(self.s, new_id=ids, offline=True), self.s.metrics)

    async def send(
        self,
        body: dict[str, Any] | bytes,
        *,
        exchange: Exchange = CHAT,
        headers: Mapping[str, str] | None = None,
        query: str = "",
        reply: dict[str, Any] | None = None,
        status: int = 200,
    ) -> Flow:
        """One request: what would be forwarded (``flow.out``), its role and outcome;
        ``reply`` (the assistant message the client received) is recorded with it."""
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        head = Headers({k.lower(): v for k, v in (headers or {}).items()})
        flow = Flow(exchange, head, query.encode("utf-8", "surrogateescape"), raw, 0.0)
        await self.runner.request(flow)
        self.runner.render(flow)
        flow.message, flow.status = reply, status
        self.runner.done(flow)
        await self.s.drain()
        return flow
