"""The ASGI app: ``create_app(config)`` wires one router to services opened in the lifespan.

POST <an exchange's path>   the one request flow (proxy.handler): chat completions
                            (also ``/chat/completions``, a trailing slash, Azure's
                            ``/openai/deployments/{name}/chat/completions``), Messages,
                            Responses; the router's first route, matched by
                            ``canonicalize.match`` straight from the ASGI scope
GET  /metrics               Prometheus exposition (per-app registry)
GET  /healthz               200 while the process serves
GET  /readyz                200 when the store and the upstream (a replica of the pool) answer, else
                            503 + reason; with a pool, each replica's health; with
                            affinity.llama_slots, what it pins now and why
*    anything else          forwarded unchanged, streaming preserved (proxy.passthrough)

One Starlette :class:`~starlette.routing.Router` serves every route and the
lifespan, with no framework middleware on the request path; admission control
(``limits.max_concurrency``, :mod:`proxy.admission`) wraps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.datastructures import State
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, NoMatchFound, Route, Router
from starlette.types import ASGIApp, Receive, Scope, Send

from canonicalize import Canonicalizer, Exchange, match
from proxy import addons, responses
from proxy.addons import trace
from proxy.admission import Admission
from proxy.config import Config
from proxy.errors import StoreError
from proxy.handler import Handler
from proxy.metrics import Metrics
from proxy.passthrough import Passthrough
from proxy.recording import open_recorder
from proxy.services import Services
from proxy.store import Store, open_store
from proxy.store.guard import StoreGuard
from proxy.upstream.pool import Pool
from proxy.upstream.slot_watch import SlotWatch

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
EXCHANGE = "prefixpin.exchange"  # scope key: the wire API the exchange route matched


class ExchangeRoute(BaseRoute):
    """A POST to a wire API's path (``canonicalize.match``), served by ``endpoint``
    (the handler, once the lifespan has made it) with the ASGI call and the exchange:
    no Request object, no framework middleware."""

    def __init__(self) -> None:
        self.endpoint: Callable[[Scope, Receive, Send, Exchange], Coroutine[Any, Any, None]] = _not_started

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and scope["method"] == "POST":
            exchange = match(scope["path"])
            if exchange is not None:
                return Match.FULL, {EXCHANGE: exchange}
        return Match.NONE, {}

    def handle(self, scope: Scope, receive: Receive, send: Send) -> Coroutine[Any, Any, None]:
        return self.endpoint(scope, receive, send, scope[EXCHANGE])

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        raise NoMatchFound(name, path_params)


async def _not_started(scope: Scope, receive: Receive, send: Send, exchange: Exchange) -> None:
    raise RuntimeError("the app's lifespan has not started")


class _Endpoint:
    """A plain ASGI endpoint for a Starlette route: an object, not a function, so the
    router hands it the call as it is (no Request, no Response object)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


class App:
    """The app of one config (module docstring); ``state.services`` once started."""

    def __init__(
        self, config: Config, *, transport: Any = None, store: Store | None = None, clock: Callable[[], float] | None
    ) -> None:
        self.config = config
        self.canon = Canonicalizer(config.settings())
        self.metrics = Metrics(config.metrics.models, config.metrics.max_models, rules=self.canon.rule_names)
        self.exposed = self.metrics.registry
        if config.environment.metrics_dir:  # one of several workers (proxy.workers): every worker's counts
            self.exposed = CollectorRegistry()
            MultiProcessCollector(self.exposed, config.environment.metrics_dir)  # type: ignore[no-untyped-call]
        self._transport, self._store, self._clock = transport, store, clock
        # Where this process listens (set by the server before it starts): no request goes there.
        self.listening: tuple[tuple[str, int], ...] = ()
        self.state = State()
        self.handler: Handler | None = None  # from the lifespan on
        self.passthrough: Passthrough | None = None
        self.exchanges = ExchangeRoute()
        self.router = Router(
            routes=[
                self.exchanges,
                Route("/healthz", self._healthz, methods=["GET", "HEAD"]),
                Route("/readyz", self._readyz, methods=["GET", "HEAD"]),
                Route("/metrics", self._metrics, methods=["GET"]),
                Route("/{path:path}", _Endpoint(self._other), methods=ALL_METHODS),
            ],
            lifespan=self._lifespan,
        )
        limit = config.limits.max_concurrency
        routed = self.router.middleware_stack
        self.asgi: ASGIApp = Admission(routed, limit=limit, on_reject=self._rejected) if limit > 0 else routed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.asgi(scope, receive, send)

    @contextlib.asynccontextmanager
    async def _lifespan(self, _: Any) -> AsyncIterator[None]:
        config, metrics = self.config, self.metrics
        upstream = Pool(config, metrics, self._transport, listening=self.listening)
        store = self._store if self._store is not None else open_store(config.store)  # an empty MemoryStore is falsy
        slots = SlotWatch(upstream.clients, config.affinity.llama_slots) if config.affinity.llama_slots else None
        s = Services(config=config, canon=self.canon, store=store, guard=StoreGuard(), metrics=metrics, slots=slots)
        s.recorder = open_recorder(config, metrics)
        if self._clock is not None:
            s.clock = self._clock
        self.handler = self.exchanges.endpoint = Handler(s, upstream, addons.Runner(addons.build(s), metrics))
        self.passthrough = Passthrough(upstream, metrics, config.limits.max_body_bytes, slots)
        self.state.services = s
        if slots is not None:
            slots.start()  # in the background: the first request does not wait for it
        s.spawn(_first_ping(s))  # a store down at start is said at once, not at the first request
        try:
            yield
        finally:
            if slots is not None:
                await slots.aclose()
            await self.handler.runner.counting.close()  # what is left to count
            await s.drain(timeout=5)  # let pending records land
            if s.recorder is not None:  # the trace lines still queued
                await asyncio.to_thread(s.recorder.close, 5.0)
            await upstream.aclose()
            await store.close()

    def _live(self) -> Handler:
        assert self.handler is not None, "the app's lifespan has not started"
        return self.handler

    async def _other(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.passthrough is not None, "the app's lifespan has not started"
        await self.passthrough(scope, receive, send)

    async def _healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "pid": os.getpid()})

    async def _readyz(self, request: Request) -> Response:
        handler = self._live()
        problems = []
        try:
            await asyncio.wait_for(handler.s.store.ping(), 2)
        except (StoreError, OSError, TimeoutError) as exc:
            problems.append(f"store: {exc or type(exc).__name__}")
        pool = handler.upstream
        health = await pool.health()
        if not pool.pooled:
            problems += [f"upstream: {h}" for h in health if h is not None]  # names no URL
        elif all(h is not None for h in health):
            problems.append("upstream: no replica of upstream.pool answers")
        extra: dict[str, Any] = {}
        if pool.pooled:
            extra["replicas"] = [{"replica": i, "ok": h is None, "problem": h} for i, h in enumerate(health)]
        if handler.s.slots is not None:  # what affinity.llama_slots does now, and why
            plan = handler.s.slots.plan
            extra["llama_slots"] = {"pinning": plan.mode, "slots": plan.slots, "why": plan.why}
        if problems:
            return JSONResponse({"status": "not ready", "reasons": problems, **extra}, status_code=503)
        return JSONResponse({"status": "ready", **extra})

    async def _metrics(self, request: Request) -> Response:
        if not self.config.metrics.enabled:
            return responses.error(None, 404, "metrics are disabled", "not_found", "metrics_disabled")
        await self._live().runner.counting.flushed()  # the counting of the last responses, if it waits
        return Response(generate_latest(self.exposed), media_type=CONTENT_TYPE_LATEST)

    def _rejected(self, scope: Scope) -> None:
        exchange = match(scope["path"])
        self.metrics.requests.labels(exchange.name if exchange else "passthrough", "rejected", "503").inc()
        self.refused(scope, 503)

    def refused(self, scope: Scope, status: int) -> None:
        """A request refused before its body was read (by the front: 413, 431, ...; by
        admission: 503): recorded with ``trace.path`` when it is on a wire route."""
        recorder = self.handler.s.recorder if self.handler is not None else None
        if recorder is not None and match(scope["path"]) is not None:
            trace.rejected(recorder, scope, status)


async def _first_ping(s: Services) -> None:
    try:
        await asyncio.wait_for(s.store.ping(), 5)
    except TimeoutError as exc:
        s.guard.warn(exc, "no answer within 5 s; serving anyway: requests fail open until the store answers")
    except (StoreError, OSError) as exc:
        s.guard.warn(exc, "serving anyway: requests fail open (forwarded as sent) until the store answers")


def create_app(
    config: Config, *, transport: Any = None, store: Store | None = None, clock: Callable[[], float] | None = None
) -> App:
    """Build the app.  ``transport`` (an httpx transport), ``store`` and ``clock`` (wall
    seconds: when a lineage's requests came) replace the network, the configured store
    and the time in tests and benchmarks."""
    return App(config, transport=transport, store=store, clock=clock)


__all__ = ["App", "ExchangeRoute", "create_app"]
