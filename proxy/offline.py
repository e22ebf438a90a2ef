"""The core's request machine without sockets, for ``prefixpin audit``: each
request canonicalized as the proxy canonicalizes it (:mod:`proxy.drive`, the
same driver, against an embedded store: unbounded unless one is given), its
edits spliced into its bytes, and its turn recorded with the reply the trace
says the client received.  Nothing is sent anywhere.

What it leaves out is what only a live upstream or a provider makes: the
provider caches' controls (``provider_cache``), the usage a stream is asked for,
the replica a pool places it on; and it counts no request (the learned spans
only, :mod:`proxy.learned`).  Tests and benchmarks drive lineage, pins and forks
through it: there is no second implementation of the core's protocol or of the
store's semantics.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.datastructures import Headers

from canonicalize import (
    CHAT,
    Canonicalized,
    Canonicalizer,
    Exchange,
    Lookup,
    Memos,
    Op,
    Outcome,
    Prepared,
    Settings,
    render,
)
from proxy.config import Config
from proxy.cpu import off_loop
from proxy.drive import Driver
from proxy.flow import Inbound
from proxy.metrics import Metrics
from proxy.services import Services
from proxy.store import ISOLATED, Bounds, Store
from proxy.store.guard import StoreGuard
from proxy.store.memory import MemoryStore
from proxy.tenancy import tenant_of

log = logging.getLogger("prefixpin")


def _unbounded(config: Config) -> MemoryStore:
    bounds = Bounds(10**9, 2**62, config.store.max_links_per_request)
    return MemoryStore(ttl_s=10**9, max_entries=10**9, max_bytes=2**62, bounds=bounds)


@dataclass(frozen=True, slots=True)
class Replayed:
    """One request through the core offline: what would be forwarded (``out``), its
    role, and the core's outcome (None: bypassed, not a JSON object, or failed open)."""

    raw: bytes
    out: bytes
    role: str
    done: Canonicalized | None = None
    failed: bool = False  # prefixpin's own failure: forwarded as the client sent it

    @property
    def outcome(self) -> Outcome | None:
        """What is recorded (None: nothing, the store failed too)."""
        return self.done.outcome if self.done is not None else None

    @property
    def prep(self) -> Prepared | None:
        return self.done.prep if self.done is not None else None

    @property
    def lookup(self) -> Lookup | None:
        return self.done.lookup if self.done is not None else None

    @property
    def ops(self) -> list[Op]:
        return self.done.ops if self.done is not None else []

    @property
    def rewrites(self) -> list[str]:
        return self.done.rewrites if self.done is not None else []

    @property
    def offered(self) -> frozenset[str] | None:
        """The tools a repaired fork itself offered (its reply's guard)."""
        outcome = self.outcome
        return outcome.offered if outcome is not None else None


class Offline:
    """Requests through the core, one by one, on one store (module docstring)."""

    def __init__(
        self,
        config: Config,
        *,
        settings: Settings | None = None,
        store: Store | None = None,
        new_id: Callable[[], str] | None = None,
        memos: Memos | None = None,
    ) -> None:
        """``settings`` replaces the config's packs, rules and fork policy, ``memos`` the
        canonicalizer's memos (tests: ``Memos.off()`` remembers nothing); ``new_id``:
        lineage ids (default ``L0001``, ``L0002``, ...)."""
        canon = Canonicalizer(settings or config.settings(), memos=memos)
        self.s = Services(
            config=config,
            canon=canon,
            store=store if store is not None else _unbounded(config),  # an empty store is falsy (len 0)
            guard=StoreGuard(),
            metrics=Metrics(rules=canon.rule_names),
        )
        counter = itertools.count(1)
        ids = new_id or (lambda: f"L{next(counter):04d}")
        self.driver = Driver(canon, self.s.store, self.s.guard, self.s.metrics, new_id=ids)

    async def send(
        self,
        body: dict[str, Any] | bytes,
        *,
        exchange: Exchange = CHAT,
        headers: Mapping[str, str] | None = None,
        query: str = "",
        reply: dict[str, Any] | None = None,
        status: int = 200,
        tenant: str | None = None,
    ) -> Replayed:
        """One request: what would be forwarded, its role and outcome; ``reply`` (the
        assistant message the client received) is recorded with it, unless ``status``
        says the upstream failed.  ``tenant``: whose it is (None: what its credentials
        make, as ``tenancy`` says; "" shares nothing)."""
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        head = Headers({k.lower(): v for k, v in (headers or {}).items()})
        inbound = Inbound(exchange, "", query.encode("utf-8", "surrogateescape"), head, raw, 0.0)
        if inbound.bypassed:
            return Replayed(raw, raw, "bypass")
        if tenant is None:
            tenant = tenant_of(head.raw, inbound.query, self.s.config.tenancy)
        big = inbound.big
        try:
            remember = tenant != ISOLATED and not big
            done = await self.driver.canonicalize(raw, exchange, tenant, head, remember=remember, big=big)
            if done is None:
                return Replayed(raw, raw, "bypass")
            big = big or done.heavy
            out = (
                raw
                if not done.ops
                else render(done.doc, done.ops)
                if not big
                else await off_loop(render, done.doc, done.ops)
            )
        except Exception:
            log.exception("canonicalize failed; the request is replayed as the client sent it")
            self.s.metrics.fail_open.labels("canonicalize").inc()
            return Replayed(raw, raw, "fail-open", failed=True)
        if done.outcome is not None and tenant != ISOLATED:
            replied = reply if status < 400 else None
            await self.driver.record(tenant, done, out, replied, done.outcome.record, big=big)
        return Replayed(raw, out, done.role, done)
