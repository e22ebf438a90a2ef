"""The request path of ``/v1/chat/completions`` and ``/v1/messages``.

    read body -> parse once -> tenant -> canonicalize.prepare (static rules, chain)
    -> store lookup (one round trip) -> classify -> [fork: parent blobs]
    -> finalize (pins, tool order, fork repair) -> serialize only if changed
    -> upstream (streamed through the reply state machine) -> client
    -> after the response: record the lineage + reply link, count.

Anything of prefixpin's own that fails on the way fails open: the request goes
upstream unchanged (or with its static rewrites when only the store failed),
``x-prefixpin-role: fail-open``, and ``prefixpin_fail_open_total{stage}`` counts it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import httpx
import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from canonicalize import ANTHROPIC, OPENAI, Canonicalizer, Dialect, Outcome, Prepared, ensure_stream_usage
from canonicalize.predict import predict
from canonicalize.reply import ChatReply, MessagesReply
from canonicalize.sse import SSESplitter, encode
from proxy.errors import BodyTooLarge, PrefixpinError, RequestRejected, StoreError, UpstreamError, from_httpx
from proxy.forward import UpstreamClient, request_headers, response_headers
from proxy.metrics import Metrics
from proxy.resolve import record, resolve
from proxy.store import Store
from proxy.store.guard import StoreGuard
from proxy.target import client_path
from proxy.tenancy import tenant_of

log = logging.getLogger("prefixpin")
T = TypeVar("T")

ROUTE_DIALECT: dict[str, Dialect] = {"chat_completions": OPENAI, "messages": ANTHROPIC}


@dataclass
class Services:
    """What the request path needs; built once in the app's lifespan."""

    canon: Canonicalizer
    store: Store
    guard: StoreGuard
    upstream: UpstreamClient
    metrics: Metrics
    max_body_bytes: int
    trust_tenant_header: bool
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes is over the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass
class Plan:
    """What one request turned into before it goes upstream."""

    role: str
    body: bytes
    drop_usage_chunk: bool = False
    prep: Prepared | None = None
    outcome: Outcome | None = None
    tenant: str = ""
    model: object = None
    rewrites: tuple[str, ...] = ()


class ChatRoute:
    """One instance per route; holds no per-request state."""

    def __init__(self, route: str, services: Services) -> None:
        self.route = route
        self.dialect = ROUTE_DIALECT[route]
        self.s = services

    async def __call__(self, request: Request) -> Response:
        s, m = self.s, self.s.metrics
        started = time.perf_counter()
        try:
            raw = await read_body(request, s.max_body_bytes)
        except BodyTooLarge as exc:
            m.requests.labels(self.route, "rejected", "413").inc()
            return exc.response()
        except ClientDisconnect:
            return Response(status_code=499)
        plan = await self._plan(request, raw)
        m.overhead.observe(time.perf_counter() - started)
        try:
            response = await self._send(request, plan, started)
        except ClientGone:
            m.requests.labels(self.route, plan.role, "499").inc()
            log.info("client went away before the upstream answered; upstream request cancelled")
            return Response(status_code=499)
        except UpstreamError as exc:
            m.upstream_errors.labels(exc.metric_kind).inc()
            m.requests.labels(self.route, plan.role, str(exc.status)).inc()
            m.request_duration.labels(self.route).observe(time.perf_counter() - started)
            log.warning("upstream error on %s: %s (%s)", self.route, exc, exc.detail)
            if plan.outcome is not None:  # record the request so a retry still finds its lineage
                s.spawn(self._record(plan, None))
            return _tag(exc.response(), plan)
        except RequestRejected as exc:  # a path the upstream must not get
            m.requests.labels(self.route, plan.role, str(exc.status)).inc()
            return _tag(exc.response(), plan)
        return _tag(response, plan)

    # -- before the upstream ----------------------------------------------------------
    async def _plan(self, request: Request, raw: bytes) -> Plan:
        s, m = self.s, self.s.metrics
        headers = request.headers
        if headers.get("x-prefixpin-bypass", "").strip() == "1":
            return Plan("bypass", raw)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):  # not ours to judge: the upstream answers it
            return Plan("bypass", raw)
        tenant = tenant_of(headers, trust_header=s.trust_tenant_header)
        try:
            prep = s.canon.prepare(body, self.dialect, declared_parent=headers.get("x-prefixpin-parent") or None)
        except Exception:
            log.exception("canonicalization failed; forwarding unchanged")
            m.fail_open.labels("canonicalize").inc()
            return Plan("fail-open", raw, model=body.get("model"))
        try:
            resolved = await resolve(s.canon, s.store, tenant, prep, call=s.guard.call)
            outcome, store_ok = resolved.outcome, resolved.store_ok
            injected = self.dialect is OPENAI and ensure_stream_usage(outcome.body)
            changed = bool(outcome.rewrites) or injected
            out = orjson.dumps(outcome.body) if changed else raw
        except Exception:
            log.exception("canonicalization failed; forwarding unchanged")
            m.fail_open.labels("canonicalize").inc()
            return Plan("fail-open", raw, model=body.get("model"))
        if not store_ok:
            m.fail_open.labels("store").inc()
        role = outcome.role if store_ok else "fail-open"
        return Plan(
            role, out, drop_usage_chunk=injected, prep=prep,
            outcome=outcome if store_ok else None, tenant=tenant, model=body.get("model"),
            rewrites=tuple(outcome.rewrites),
        )  # fmt: skip

    # -- the upstream -------------------------------------------------------------------
    async def _send(self, request: Request, plan: Plan, started: float) -> Response:
        s = self.s
        headers = request_headers(request.headers.items(), identity=True)
        sent = time.perf_counter()
        try:
            resp = await _unless_client_leaves(
                request, s.upstream.send("POST", client_path(request), request.url.query, headers, plan.body)
            )
        except httpx.HTTPError as exc:
            raise from_httpx(exc, s.upstream.base) from exc
        offered = plan.outcome.offered if plan.outcome is not None else None
        reply: ChatReply | MessagesReply = (
            ChatReply(offered=offered, drop_usage_chunk=plan.drop_usage_chunk)
            if self.dialect is OPENAI
            else MessagesReply(offered=offered)
        )
        ctype = resp.headers.get("content-type", "")
        if resp.status_code < 400 and "text/event-stream" in ctype:
            return StreamingResponse(
                self._relay(resp, reply, plan, started, sent),
                status_code=resp.status_code,
                headers=response_headers(resp.headers, drop=("content-encoding",)),
            )
        try:
            content = await _unless_client_leaves(request, resp.aread())
        except httpx.HTTPError as exc:
            raise from_httpx(exc, s.upstream.base) from exc
        finally:
            await resp.aclose()
        s.metrics.upstream_ttft.observe(time.perf_counter() - sent)
        if resp.status_code < 400 and plan.role != "bypass":
            content = self._complete(content, reply)
        elif resp.status_code >= 400:
            s.metrics.upstream_errors.labels(f"http_{resp.status_code // 100}xx").inc()
        self._finish(plan, reply, resp.status_code, started)
        return Response(
            content, status_code=resp.status_code,
            headers=response_headers(resp.headers, drop=("content-encoding",)),
        )  # fmt: skip

    def _complete(self, content: bytes, reply: ChatReply | MessagesReply) -> bytes:
        try:
            obj = orjson.loads(content)
        except orjson.JSONDecodeError:
            return content
        try:
            if reply.complete(obj):
                return orjson.dumps(obj)
        except Exception:
            log.exception("response processing failed; passing the response through")
            self.s.metrics.fail_open.labels("response").inc()
        return content

    async def _relay(
        self, resp: httpx.Response, reply: ChatReply | MessagesReply, plan: Plan, started: float, sent: float
    ) -> AsyncIterator[bytes]:
        m = self.s.metrics
        splitter = SSESplitter()
        status = str(resp.status_code)
        first = True
        broken = False  # our state machine failed: pass the rest through untouched
        try:
            async for chunk in resp.aiter_bytes():
                if broken or plan.role == "bypass":
                    yield chunk
                    continue
                try:
                    out = [b for b in (reply.feed(ev) for ev in splitter.feed(chunk)) if b is not None]
                except Exception:
                    log.exception("stream processing failed; passing the rest through")
                    m.fail_open.labels("response").inc()
                    broken = True
                    yield chunk
                    continue
                if first and reply.first_token:
                    m.upstream_ttft.observe(time.perf_counter() - sent)
                    first = False
                if out:
                    yield b"".join(out)
            tail = splitter.flush()
            if tail is not None and not broken:
                yield tail.raw
        except httpx.HTTPError as exc:
            # The upstream cut the stream: tell the client in-band and end cleanly.
            m.upstream_errors.labels("stream_cut").inc()
            status = "502"
            err = {"error": {"message": f"the upstream stream ended early: {type(exc).__name__}",
                             "type": "upstream_error", "code": "upstream_stream_cut"}}  # fmt: skip
            yield encode(orjson.dumps(err))
        finally:
            # A client that went away cancels us; closing the upstream must still happen.
            with anyio.CancelScope(shield=True):
                await resp.aclose()
            self._finish(plan, reply, int(status), started)

    # -- after the response -------------------------------------------------------------
    def _finish(self, plan: Plan, reply: ChatReply | MessagesReply, status: int, started: float) -> None:
        s, m = self.s, self.s.metrics
        m.requests.labels(self.route, plan.role, str(status)).inc()
        m.request_duration.labels(self.route).observe(time.perf_counter() - started)
        outcome = plan.outcome
        role = plan.role
        model = m.model_label(plan.model)
        usage = reply.usage.result
        if usage is not None:
            m.prompt_tokens.labels(model, role).inc(usage.prompt)
            m.cached_tokens.labels(model, role).inc(usage.cached)
            m.cache_write_tokens.labels(model, role).inc(usage.cache_write)
        if reply.blocked:
            m.blocked_tool_calls.inc(reply.blocked)
        if outcome is None or plan.prep is None:
            return
        for rule in outcome.rewrites:
            m.rewrites.labels(rule).inc()
        if outcome.fork_action:
            m.forks.labels(outcome.fork_action).inc()
        if outcome.parent_fp is not None and outcome.record.fingerprint is not None:
            p = predict(outcome.record.fingerprint, outcome.parent_fp, plan.prep.signals.depth, plan.prep.sizes)
            m.predicted_prefix_ratio.observe(p.ratio)
            if p.cause is not None:
                m.prefix_breaks.labels(p.cause).inc()
        message = reply.message() if status < 400 else None
        s.spawn(self._record(plan, message))

    async def _record(self, plan: Plan, message: dict[str, Any] | None) -> None:
        outcome, prep, s = plan.outcome, plan.prep, self.s
        if outcome is None or prep is None:
            return
        try:
            await record(s.store, plan.tenant, prep, outcome, message, call=s.guard.call)
        except StoreError as exc:
            log.debug("store record failed: %s", exc)
            s.metrics.fail_open.labels("record").inc()
        except Exception:
            log.exception("recording failed")
            s.metrics.fail_open.labels("record").inc()


class ClientGone(Exception):
    """The client disconnected while we waited on the upstream."""


WATCH_AFTER_S = 1.0  # a request answered sooner is not worth a disconnect watcher


async def _unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client disconnects first: then cancel it (which
    closes the upstream request) and raise ClientGone.

    The watcher only starts once the upstream has taken WATCH_AFTER_S: a task per
    request would cost more than the whole fast path.  Streams need no watcher:
    Starlette's StreamingResponse already stops on disconnect."""
    me = asyncio.current_task()
    gone = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        if me is not None:
            me.cancel()

    def start() -> None:
        nonlocal watcher
        watcher = asyncio.ensure_future(watch())

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, start)
    try:
        return await work
    except asyncio.CancelledError:
        if not gone or me is None:
            raise
        me.uncancel()
        raise ClientGone from None
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()


def _tag(response: Response, plan: Plan) -> Response:
    response.headers["x-prefixpin-role"] = plan.role
    if plan.outcome is not None:
        response.headers["x-prefixpin-lineage"] = plan.outcome.record.id
    if plan.rewrites:
        response.headers["x-prefixpin-rewrites"] = ",".join(plan.rewrites)
    return response


__all__ = ["ChatRoute", "PrefixpinError", "Services"]
