"""Drive the proxy's request path without sockets from synchronous tests.

:class:`Hooks` is the app's own request path less the network: its addons'
request hooks, the edits spliced, then its done hooks (the record among them)
with the reply a test gives, on an embedded store.  ``proxy.offline.Offline`` (the
core alone, as ``prefixpin audit`` drives it) answers the same calls, so a test
may take either."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from starlette.datastructures import Headers

from canonicalize import CHAT, Canonicalizer, Exchange, LineageRecord, Lookup, Memos, Outcome, Prepared, Settings
from proxy import addons
from proxy.addons import Runner
from proxy.config import Config, load
from proxy.flow import Flow, Guarded, Inbound
from proxy.handler import splice
from proxy.metrics import Metrics
from proxy.services import Services
from proxy.store import Bounds, Store
from proxy.store.guard import StoreGuard
from proxy.store.memory import MemoryStore

LIVE_ONLY = ("affinity", "measure", "trace")  # addons that place, count or trace a live request


class Sends(Protocol):
    """What a test sends requests through (:class:`Hooks`, ``proxy.offline.Offline``)."""

    async def send(
        self,
        body: dict[str, Any] | bytes,
        *,
        exchange: Exchange = ...,
        headers: Mapping[str, str] | None = ...,
        reply: dict[str, Any] | None = ...,
    ) -> Any: ...


class Hooks:
    """The app's request path without sockets (module docstring)."""

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
        canon = Canonicalizer(settings or config.settings(), memos=memos)
        bounds = Bounds(10**9, 2**62, config.store.max_links_per_request)
        self.s = Services(
            config=config,
            canon=canon,
            store=store
            if store is not None
            else MemoryStore(ttl_s=10**9, max_entries=10**9, max_bytes=2**62, bounds=bounds),
            guard=StoreGuard(),
            metrics=Metrics(rules=canon.rule_names),
        )
        if clock is not None:
            self.s.clock = clock
        counter = itertools.count(1)
        ids = new_id or (lambda: f"L{next(counter):04d}")
        hooks = tuple(a for a in addons.build(self.s, new_id=ids) if a.name not in LIVE_ONLY)
        self.runner = Runner(hooks, self.s.metrics)

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
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        head = Headers({k.lower(): v for k, v in (headers or {}).items()})
        flow = Flow(Inbound(exchange, "", query.encode("utf-8", "surrogateescape"), head, raw, 0.0))
        await self.runner.request(flow)
        flow.outbound.body = splice(flow, self.runner)
        flow.answer.message, flow.answer.status = reply, status
        await self.runner.after_last(flow)
        await self.runner.counting.flushed()
        await self.s.drain()
        return flow


@dataclass
class Sent:
    """One request as prefixpin would forward it."""

    flow: Any  # a Flow (Hooks) or a Replayed (Offline)

    @property
    def raw(self) -> bytes:
        """The bytes that go upstream."""
        return self.flow.out

    @property
    def body(self) -> Any:
        return orjson.loads(self.flow.out)

    @property
    def outcome(self) -> Outcome:
        assert self.flow.outcome is not None, f"no outcome (role {self.flow.role})"
        return self.flow.outcome

    @property
    def role(self) -> str:
        return self.flow.role

    @property
    def prep(self) -> Prepared:
        """The core's analysis of the request."""
        done = self.flow.done
        assert done is not None, f"not judged (role {self.flow.role})"
        return done.prep

    @property
    def lookup(self) -> Lookup:
        """What the store found for the request's chain."""
        done = self.flow.done
        assert done is not None, f"not judged (role {self.flow.role})"
        return done.lookup

    @property
    def rewrites(self) -> list[str]:
        return self.flow.rewrites

    @property
    def record(self) -> LineageRecord:
        return self.outcome.record

    @property
    def fork_action(self) -> str | None:
        return self.outcome.fork_action

    @property
    def fork_signal(self) -> str | None:
        return self.outcome.fork_signal

    @property
    def offered(self) -> frozenset[str] | None:
        """The tools the fork guard lets the reply call (None: no guard)."""
        if isinstance(self.flow, Flow):
            guard = self.flow.get(Guarded)
            return guard.offered if guard is not None else None
        offered: frozenset[str] | None = self.flow.offered
        return offered


KEY = {"authorization": "Bearer sk-test"}  # one tenant: a request without a key shares nothing


class Harness:
    def __init__(
        self,
        settings: Settings | None = None,
        *,
        config: Config | None = None,
        memos: Memos | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.offline = Hooks(config or load(None, env={}), settings=settings, memos=memos, clock=clock)
        self.canon = self.offline.s.canon

    def send(
        self,
        body: dict[str, Any] | bytes,
        *,
        reply: dict[str, Any] | None = None,
        declared: str | None = None,
        headers: dict[str, str] | None = None,
        exchange: Exchange = CHAT,
    ) -> Sent:
        h = dict(headers if headers is not None else KEY)
        if declared:
            h["x-prefixpin-parent"] = declared
        return Sent(self.run(self.next().send(body, exchange=exchange, headers=h, reply=reply)))

    def next(self) -> Sends:
        """The flow the next request goes through (a subclass may take turns between several)."""
        return self.offline

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run one request's coroutine (a subclass on a network store keeps one event loop)."""
        return asyncio.run(coro)
