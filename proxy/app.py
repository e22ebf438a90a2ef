"""The ASGI app: ``create_app(config)`` wires routes to services opened in the lifespan.

    POST /v1/chat/completions   canonicalize -> forward (proxy.chat)
    POST /v1/messages           the same, Anthropic dialect
    GET  /metrics               Prometheus exposition (per-app registry)
    GET  /healthz               200 while the process serves
    GET  /readyz                200 when the store and the upstream answer, else 503 + reason
    *    anything else          forwarded unchanged, streaming preserved (proxy.forward)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from canonicalize import Canonicalizer
from proxy.admission import Admission
from proxy.chat import ChatRoute, Services, read_body
from proxy.config import Config
from proxy.errors import Overloaded, PrefixpinError, StoreError, UpstreamError, UpstreamStreamCut, from_httpx
from proxy.forward import UpstreamClient, passthrough
from proxy.metrics import Metrics
from proxy.server import CutStreams
from proxy.store import Store, open_store
from proxy.store.guard import StoreGuard

log = logging.getLogger("prefixpin")


def create_app(
    config: Config,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    store: Store | None = None,
) -> Starlette:
    """Build the app.  ``transport`` and ``store`` replace the real ones in unit tests."""
    canon = Canonicalizer(config.settings())
    metrics = Metrics(config.metrics.models, config.metrics.max_models, rules=canon.rule_names)
    holder: dict[str, Services] = {}

    def services() -> Services:
        return holder["s"]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        upstream = UpstreamClient(config.upstream, transport)
        the_store = store or open_store(
            config.store.backend, redis_url=config.store.redis_url, ttl_s=config.store.ttl_s,
            max_entries=config.store.max_entries, max_bytes=config.store.max_bytes,
            timeout_ms=config.store.timeout_ms,
        )  # fmt: skip
        s = Services(
            canon=canon,
            store=the_store,
            guard=StoreGuard(),
            upstream=upstream,
            metrics=metrics,
            max_body_bytes=config.limits.max_body_bytes,
            trust_tenant_header=config.tenancy.trust_header,
        )
        holder["s"] = s
        app.state.services = s
        try:
            yield
        finally:
            if s.tasks:  # let pending records land
                await asyncio.wait(list(s.tasks), timeout=5)
            await upstream.aclose()
            await the_store.close()

    routes = {name: _LazyRoute(name, services) for name in ("chat_completions", "messages")}

    async def chat(request: Request) -> Response:
        return await routes["chat_completions"](request)

    async def messages(request: Request) -> Response:
        return await routes["messages"](request)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        s = services()
        problems = []
        try:
            await asyncio.wait_for(s.store.ping(), 2)
        except (StoreError, OSError, TimeoutError) as exc:
            problems.append(f"store: {exc or type(exc).__name__}")
        try:
            r = await s.upstream.send("GET", "/health", "", [], b"", timeout=2)
            await r.aclose()
            if r.status_code >= 500:
                problems.append(f"upstream: answered {r.status_code}")
        except httpx.HTTPError as exc:
            problems.append(f"upstream: {from_httpx(exc, s.upstream.base)}")  # names no URL
        if problems:
            return JSONResponse({"status": "not ready", "reasons": problems}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def metrics_endpoint(request: Request) -> Response:
        if not config.metrics.enabled:
            return JSONResponse({"error": {"message": "metrics are disabled", "type": "not_found",
                                           "code": "metrics_disabled"}}, status_code=404)  # fmt: skip
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def other(request: Request) -> Response:
        s = services()
        try:
            body = await read_body(request, s.max_body_bytes)
            response = await passthrough(request, s.upstream, body)
        except ClientDisconnect:
            return Response(status_code=499)
        except Overloaded:
            raise  # answered and counted by Admission
        except PrefixpinError as exc:
            if isinstance(exc, UpstreamError):
                metrics.upstream_errors.labels(exc.metric_kind).inc()
                log.warning("upstream error on passthrough: %s (%s)", exc, exc.detail)
            metrics.requests.labels("passthrough", "bypass", str(exc.status)).inc()
            return exc.response()
        metrics.requests.labels("passthrough", "bypass", str(response.status_code)).inc()
        return response

    def rejected(path: str) -> None:
        route = {"/v1/chat/completions": "chat_completions", "/chat/completions": "chat_completions",
                 "/v1/messages": "messages"}.get(path, "passthrough")  # fmt: skip
        metrics.requests.labels(route, "rejected", "503").inc()

    def cut(exc: UpstreamStreamCut) -> None:
        metrics.upstream_errors.labels(exc.metric_kind).inc()
        log.warning("the upstream cut a passthrough response; the client's is cut too (%s)", exc.detail)

    all_methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    return Starlette(
        middleware=[
            Middleware(Admission, limit=config.limits.max_concurrency, body_timeout_s=config.limits.body_timeout_s,
                       on_reject=rejected),
            Middleware(CutStreams, on_cut=cut),
        ],
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/chat/completions", chat, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET", "HEAD"]),
            Route("/readyz", readyz, methods=["GET", "HEAD"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
            Route("/{path:path}", other, methods=all_methods),
        ],
        lifespan=lifespan,
    )


class _LazyRoute:
    """A ChatRoute built on first use (services exist only inside the lifespan)."""

    def __init__(self, name: str, services: object) -> None:
        self.name = name
        self.services = services
        self.route: ChatRoute | None = None

    async def __call__(self, request: Request) -> Response:
        if self.route is None:
            self.route = ChatRoute(self.name, self.services())  # type: ignore[operator]
        return await self.route(request)
