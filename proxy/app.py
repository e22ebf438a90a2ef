"""The ASGI app: ``create_app(config)`` wires routes to services opened in the lifespan.

POST <an exchange's path>   the one request flow (proxy.handler): chat completions
                            (also ``/chat/completions``, a trailing slash, Azure's
                            ``/openai/deployments/{name}/chat/completions``), Messages,
                            Responses; served by :class:`Front` straight from the ASGI
                            scope (the hot path: no router, no framework middleware)
GET  /metrics               Prometheus exposition (per-app registry)
GET  /healthz               200 while the process serves
GET  /readyz                200 when the store and the upstream (a replica of the pool) answer, else
                            503 + reason; with a pool, each replica's health
*    anything else          forwarded unchanged, streaming preserved (proxy.upstream.passthrough)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from canonicalize import Canonicalizer, Exchange, match
from proxy import addons, responses
from proxy.admission import Admission
from proxy.config import Config, Limits
from proxy.errors import Overloaded, PrefixpinError, StoreError, UpstreamError, UpstreamStreamCut
from proxy.handler import Handler, read_body
from proxy.link import LinkClosed
from proxy.metrics import Metrics
from proxy.server import ABORT, CutStreams
from proxy.services import Services
from proxy.store import Store, open_store
from proxy.store.guard import StoreGuard
from proxy.upstream.passthrough import passthrough, relay
from proxy.upstream.pool import Pool
from proxy.watch import ClientGone, ClientWatch
from proxy.workers import Fleet

log = logging.getLogger("prefixpin")
HOT_BODY_BYTES = 8 * 1024 * 1024
HOT_WAIT_S = 1.0


class Front:
    """The ASGI app: a POST to an exchange's path goes straight to the handler;
    everything else (prefixpin's own endpoints, passthrough, the lifespan) to the
    Starlette app.  Admission and CutStreams wrap both."""

    def __init__(
        self,
        app: Starlette,
        state: dict[str, Handler],
        *,
        limits: Limits,
        on_cut: Callable[[UpstreamStreamCut], None],
        on_reject: Callable[[str], None],
    ) -> None:
        self.starlette = app
        self._state = state
        self._limits = limits
        self._on_cut = on_cut
        # The hot route (proxy.server.HotCycle): a body is gathered whole by the
        # protocol up to this size and for this long, else it goes the ordinary way.
        self.hot_limit = min(limits.max_body_bytes, HOT_BODY_BYTES)
        self.hot_wait_s = min(limits.body_timeout_s, HOT_WAIT_S)
        self.app: ASGIApp = Admission(
            CutStreams(self._route, on_cut=on_cut),
            limit=limits.max_concurrency,
            body_timeout_s=limits.body_timeout_s,
            on_reject=on_reject,
        )

    @property
    def state(self) -> State:
        return self.starlette.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    def hot(self, path: str) -> Exchange | None:
        """The exchange a POST to ``path`` is, if the protocol may serve it on the hot
        route: not with admission control on (it counts in ASGI), nor before the
        lifespan has opened the services."""
        if self._limits.max_concurrency > 0 or "handler" not in self._state:
            return None
        return match(path)

    async def serve(self, scope: Scope, body: bytes, receive: Receive, send: Send, exchange: Exchange) -> None:
        """A hot request, its body whole: what ``__call__`` does for it, minus the layers."""
        try:
            await self._state["handler"].serve(scope, receive, send, exchange, body, time.perf_counter())
        except UpstreamStreamCut as exc:  # as CutStreams
            self._on_cut(exc)
            scope["extensions"][ABORT]()

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
    config: Config,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    store: Store | None = None,
    fleet: Fleet | None = None,
) -> Front:
    """Build the app.  ``transport`` and ``store`` replace the real ones in unit tests;
    ``fleet`` is a worker's link to its serve process (proxy.workers)."""
    canon = Canonicalizer(config.settings())
    metrics = Metrics(config.metrics.models, config.metrics.max_models, rules=canon.rule_names)
    state: dict[str, Handler] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        upstream = Pool(config, metrics, transport)
        the_store = store if store is not None else open_store(config.store)  # an empty MemoryStore is falsy
        s = Services(config=config, canon=canon, store=the_store, guard=StoreGuard(), metrics=metrics)
        state["handler"] = Handler(s, upstream, addons.Runner(addons.build(s), metrics))
        app.state.services = s
        if fleet is not None:
            fleet.before_collect = state["handler"].runner.drain
            await fleet.start(metrics.registry)
        try:
            yield
        finally:
            state["handler"].runner.drain()
            await s.drain(timeout=5)  # let pending records land
            await upstream.aclose()
            await the_store.close()
            if fleet is not None:
                await fleet.close()

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
        extra = {"replicas": [{"replica": i, "ok": h is None, "problem": h} for i, h in enumerate(health)]}
        if problems:
            body = {"status": "not ready", "reasons": problems, **(extra if pool.pooled else {})}
            return JSONResponse(body, status_code=503)
        return JSONResponse({"status": "ready", **(extra if pool.pooled else {})})

    async def metrics_endpoint(request: Request) -> Response:
        if not config.metrics.enabled:
            return responses.error(None, 404, "metrics are disabled", "not_found", "metrics_disabled")
        state["handler"].runner.drain()  # the counting of the last responses, if it waits
        if fleet is None:
            return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
        try:
            data = await fleet.exposition()  # every worker's, summed
        except (LinkClosed, RuntimeError) as exc:
            # One worker's counters alone would look like a reset to Prometheus: a
            # failed scrape (a gap) is the honest answer.
            log.warning("/metrics: the serve process did not answer (%s)", exc)
            return responses.error(None, 503, "metrics are unavailable; retry", "unavailable", "metrics_unavailable")
        return Response(data, media_type=CONTENT_TYPE_LATEST)

    async def other(scope: Scope, receive: Receive, send: Send) -> None:
        upstream = state["handler"].upstream
        watch = ClientWatch(scope, receive)
        try:
            try:
                body = await read_body(scope, receive, config.limits.max_body_bytes)
                with watch:
                    resp = await passthrough(scope, upstream, body)
            except (ClientDisconnect, ClientGone):
                await responses.client_gone()(scope, receive, send)
                return
            except Overloaded as exc:  # counted by Admission; answered here, as Starlette's error
                # middleware (around this route) would answer a 500 before Admission could
                await responses.from_error(exc)(scope, receive, send)
                return
            except PrefixpinError as exc:
                if isinstance(exc, UpstreamError):
                    metrics.upstream_errors.labels(exc.metric_kind).inc()
                    log.warning("upstream error on passthrough: %s (%s)", exc, exc.detail)
                metrics.requests.labels("passthrough", "bypass", str(exc.status)).inc()
                await responses.from_error(exc)(scope, receive, send)
                return
            metrics.requests.labels("passthrough", "bypass", str(resp.status_code)).inc()
            with contextlib.suppress(ClientGone):  # the client left: the upstream response is closed
                await relay(send, resp, upstream, watch)
        finally:
            watch.close()

    def rejected(path: str) -> None:
        exchange = match(path)
        metrics.requests.labels(exchange.name if exchange else "passthrough", "rejected", "503").inc()

    def cut(exc: UpstreamStreamCut) -> None:
        metrics.upstream_errors.labels(exc.metric_kind).inc()
        log.warning("the upstream cut a passthrough response; the client's is cut too (%s)", exc.detail)

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
    return Front(app, state, limits=config.limits, on_cut=cut, on_reject=rejected)
