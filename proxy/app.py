"""The ASGI app: ``create_app(config)`` wires routes to services opened in the lifespan.

POST <an exchange's path>   the one request flow (proxy.handler): chat completions
                            (also ``/chat/completions``, a trailing slash, Azure's
                            ``/openai/deployments/{name}/chat/completions``), Messages,
                            Responses; served by :class:`Front` straight from the ASGI
                            scope (the hot path: no router, no framework middleware)
GET  /metrics               Prometheus exposition (per-app registry)
GET  /healthz               200 while the process serves
GET  /readyz                200 when the store and the upstream (a replica of the pool) answer, else
                            503 + reason; with a pool, each replica's health; with
                            affinity.llama_slots, what it pins now and why
*    anything else          forwarded unchanged, streaming preserved (proxy.upstream.passthrough)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from canonicalize import Canonicalizer, match
from proxy import addons, responses
from proxy.admission import Admission
from proxy.config import Config
from proxy.errors import PrefixpinError, StoreError, UpstreamError
from proxy.handler import Handler, read_body
from proxy.metrics import Metrics
from proxy.recording import open_recorder
from proxy.services import Services
from proxy.store import Store, open_store
from proxy.store.guard import StoreGuard
from proxy.upstream.passthrough import forward, passthrough
from proxy.upstream.pool import Pool
from proxy.upstream.slot_watch import SlotWatch
from proxy.watch import ClientGone, ClientWatch

log = logging.getLogger("prefixpin")


class Front:
    """The ASGI app: a POST to an exchange's path goes straight to the handler (no
    router, no framework middleware on the request path); everything else
    (prefixpin's own endpoints, passthrough, the lifespan) to the Starlette app.
    Admission (``limits.max_concurrency``) wraps both."""

    def __init__(
        self, app: Starlette, state: dict[str, Handler], *, on_reject: Callable[[str], None], limit: int
    ) -> None:
        self.starlette = app
        self._state = state
        self.app: ASGIApp = Admission(self._route, limit=limit, on_reject=on_reject) if limit > 0 else self._route

    @property
    def state(self) -> State:
        return self.starlette.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            exchange = match(scope["path"])
            if exchange is not None:
                await self._state["handler"](scope, receive, send, exchange)
                return
        await self.starlette(scope, receive, send)


class _Endpoint:
    """A plain ASGI endpoint for Starlette's router: an object, not a function, so the
    router hands it the call as it is (no Request, no Response object)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def create_app(
    config: Config, *, transport: Any = None, store: Store | None = None, clock: Callable[[], float] | None = None
) -> Front:
    """Build the app.  ``transport`` (an httpx transport), ``store`` and ``clock`` (wall
    seconds: when a lineage's requests came) replace the network, the configured store
    and the time in tests and benchmarks."""
    canon = Canonicalizer(config.settings())
    metrics = Metrics(config.metrics.models, config.metrics.max_models, rules=canon.rule_names)
    exposed = metrics.registry
    if config.environment.metrics_dir:  # one of several workers (proxy.workers): every worker's counts
        exposed = CollectorRegistry()
        MultiProcessCollector(exposed, config.environment.metrics_dir)  # type: ignore[no-untyped-call]
    state: dict[str, Handler] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        upstream = Pool(config, metrics, transport)
        the_store = store if store is not None else open_store(config.store)  # an empty MemoryStore is falsy
        slots = SlotWatch(upstream.clients, config.affinity.llama_slots) if config.affinity.llama_slots else None
        s = Services(config=config, canon=canon, store=the_store, guard=StoreGuard(), metrics=metrics, slots=slots)
        s.recorder = open_recorder(config, metrics)
        if clock is not None:
            s.clock = clock
        state["handler"] = Handler(s, upstream, addons.Runner(addons.build(s), metrics))
        app.state.services = s
        if slots is not None:
            slots.start()  # in the background: the first request does not wait for it
        s.spawn(_first_ping(s))  # a store down at start is said at once, not at the first request
        try:
            yield
        finally:
            if slots is not None:
                await slots.aclose()
            await state["handler"].runner.counting.close()  # what is left to count
            await s.drain(timeout=5)  # let pending records land
            if s.recorder is not None:  # the trace lines still queued
                await asyncio.to_thread(s.recorder.close, 5.0)
            await upstream.aclose()
            await the_store.close()

    async def _first_ping(s: Services) -> None:
        try:
            await asyncio.wait_for(s.store.ping(), 5)
        except TimeoutError as exc:
            s.guard.warn(exc, "no answer within 5 s; serving anyway: requests fail open until the store answers")
        except (StoreError, OSError) as exc:
            s.guard.warn(exc, "serving anyway: requests fail open (forwarded as sent) until the store answers")

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "pid": os.getpid()})

    async def readyz(request: Request) -> Response:
        handler = state["handler"]
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

    async def metrics_endpoint(request: Request) -> Response:
        if not config.metrics.enabled:
            return responses.error(None, 404, "metrics are disabled", "not_found", "metrics_disabled")
        await state["handler"].runner.counting.flushed()  # the counting of the last responses, if it waits
        return Response(generate_latest(exposed), media_type=CONTENT_TYPE_LATEST)

    async def other(scope: Scope, receive: Receive, send: Send) -> None:
        upstream = state["handler"].upstream
        slots = state["handler"].s.slots
        if slots is not None and scope["method"] == "POST":
            slots.last_sent = None  # e.g. /v1/completions: a task on some slot, unrouted
        watch = ClientWatch(scope, receive)
        try:
            try:
                body = await read_body(scope, receive, config.limits.max_body_bytes)
                with watch:
                    resp = await passthrough(scope, upstream, body)
            except (ClientDisconnect, ClientGone):
                await responses.client_gone()(scope, receive, send)
                return
            except PrefixpinError as exc:
                if isinstance(exc, UpstreamError):
                    metrics.upstream_errors.labels(exc.metric_kind).inc()
                    log.warning("upstream error on passthrough: %s", exc.logged)
                metrics.requests.labels("passthrough", "bypass", str(exc.status)).inc()
                await responses.from_error(exc)(scope, receive, send)
                return
            metrics.requests.labels("passthrough", "bypass", str(resp.status)).inc()
            try:
                with watch:
                    await forward(send, resp, pooled=upstream.pooled)
            except ClientGone:
                pass  # the client left: the upstream response is closed
            except UpstreamError as exc:
                # The upstream cut the body: the client's is cut too (the server aborts
                # the connection, no terminating chunk), so the client can tell.
                metrics.upstream_errors.labels("stream_cut").inc()
                log.warning("the upstream cut a passthrough response; the client's is cut too: %s", exc.logged)
                raise
        finally:
            watch.close()

    def rejected(path: str) -> None:
        exchange = match(path)
        metrics.requests.labels(exchange.name if exchange else "passthrough", "rejected", "503").inc()

    all_methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    app = Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET", "HEAD"]),
            Route("/readyz", readyz, methods=["GET", "HEAD"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
            Route("/{path:path}", _Endpoint(other), methods=all_methods),
        ],
        lifespan=lifespan,
    )
    return Front(app, state, on_reject=rejected, limit=config.limits.max_concurrency)
