"""The one request flow of every wire API route (chat completions, Messages):

    read the body -> Flow -> addons' request hooks (bypass, tenancy, canonicalize,
    stream usage, fork guard) -> splice the edits into the raw bytes -> upstream
    -> the exchange's reply machine, streamed or not -> client
    -> addons' done hooks (measure, record)

Every hook runs under one :class:`proxy.addons.Runner` that fails open.  The
response carries ``x-prefixpin-role``, ``-lineage`` and ``-rewrites``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import anyio
import httpx
import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from canonicalize import Exchange, Reply, SSESplitter
from proxy import responses
from proxy.addons import Runner
from proxy.errors import BodyTooLarge, RequestRejected, UpstreamError
from proxy.flow import Flow
from proxy.services import Services
from proxy.upstream import client_path, request_headers, response_headers
from proxy.upstream.pool import REPLICA, Pool

log = logging.getLogger("prefixpin")
T = TypeVar("T")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it is known to pass ``limit``."""
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


class Handler:
    """Serves every exchange route; holds no per-request state."""

    def __init__(self, s: Services, upstream: Pool, runner: Runner) -> None:
        self.s = s
        self.upstream = upstream
        self.runner = runner

    async def __call__(self, request: Request, exchange: Exchange) -> Response:
        m = self.s.metrics
        started = time.perf_counter()
        try:
            raw = await read_body(request, self.s.config.limits.max_body_bytes)
        except BodyTooLarge as exc:
            m.requests.labels(exchange.name, "rejected", "413").inc()
            return responses.from_error(exc, exchange)
        except ClientDisconnect:
            return responses.client_gone()
        flow = Flow(exchange, request.headers, request.url.query, raw, started)
        await self.runner.request(flow)
        if flow.big:
            await asyncio.to_thread(self.runner.render, flow)
        else:
            self.runner.render(flow)
        if not flow.skip:
            flow.reply = exchange.reply(offered=flow.offered, drop_usage_chunk=flow.drop_usage_chunk)
        m.overhead.observe(time.perf_counter() - started)
        try:
            response = await self._send(request, flow)
        except ClientGone:
            log.info("client went away before the upstream answered; upstream request cancelled")
            flow.status = 499
            self.runner.done(flow)
            return responses.client_gone()
        except UpstreamError as exc:
            m.upstream_errors.labels(exc.metric_kind).inc()
            log.warning("upstream error on %s: %s (%s)", exchange.name, exc, exc.detail)
            flow.status = exc.status
            self.runner.done(flow)
            return _tag(responses.from_error(exc, exchange), flow)
        except RequestRejected as exc:  # a path the upstream must not get
            flow.status = exc.status
            self.runner.done(flow)
            return _tag(responses.from_error(exc, exchange), flow)
        return _tag(response, flow)

    # -- the upstream -------------------------------------------------------------------
    async def _send(self, request: Request, flow: Flow) -> Response:
        headers = request_headers(request.headers.items(), identity=True)
        if flow.set_headers:  # affinity.headers: ours replace the client's
            names = {k for k, _ in flow.set_headers}
            headers = [(k, v) for k, v in headers if k.lower() not in names] + list(flow.set_headers)
        sent = time.perf_counter()
        send = self.upstream.send(
            "POST", client_path(request), flow.query, headers, flow.out, key=flow.affinity_key, prefer=flow.home
        )
        resp = await _unless_client_leaves(request, send)
        if self.upstream.pooled:
            flow.replica = resp.extensions.get(REPLICA)
        out_headers = response_headers(resp.headers, drop=("content-encoding",))
        if resp.status_code < 400 and "text/event-stream" in resp.headers.get("content-type", ""):
            return StreamingResponse(self._relay(resp, flow, sent), status_code=resp.status_code, headers=out_headers)
        try:
            content = await _unless_client_leaves(request, self.upstream.read(resp))
        finally:
            await resp.aclose()
        self.s.metrics.upstream_ttft.observe(time.perf_counter() - sent)
        if resp.status_code >= 400:
            self.s.metrics.upstream_errors.labels(f"http_{resp.status_code // 100}xx").inc()
        elif flow.reply is not None:
            content = self._complete(flow, flow.reply, content)
        flow.status = resp.status_code
        self.runner.done(flow)
        return Response(content, status_code=resp.status_code, headers=out_headers)

    def _complete(self, flow: Flow, reply: Reply, content: bytes) -> bytes:
        try:
            obj = orjson.loads(content)
        except orjson.JSONDecodeError:
            return content
        try:
            changed = reply.complete(obj)
            flow.message = reply.message()
            return orjson.dumps(obj) if changed else content
        except Exception:
            log.exception("response processing failed; passing the response through")
            self.s.metrics.fail_open.labels("response").inc()
            return content

    async def _relay(self, resp: httpx.Response, flow: Flow, sent: float) -> AsyncIterator[bytes]:
        m = self.s.metrics
        reply = flow.reply
        splitter = SSESplitter()
        flow.status = resp.status_code
        first = True
        try:
            async for chunk in resp.aiter_bytes():
                if reply is None:
                    yield chunk
                    continue
                try:
                    out = [b for b in (reply.feed(ev) for ev in splitter.feed(chunk)) if b is not None]
                except Exception:
                    # Our state machine failed: pass the rest through untouched, starting
                    # with what the splitter was holding back.
                    log.exception("stream processing failed; passing the rest through")
                    m.fail_open.labels("response").inc()
                    reply, flow.reply = None, None
                    yield splitter.take() + chunk
                    continue
                if first and reply.first_token:
                    m.upstream_ttft.observe(time.perf_counter() - sent)
                    first = False
                if out:
                    yield b"".join(out)
            tail = splitter.take()
            if tail:
                yield tail
        except httpx.HTTPError as exc:
            # The upstream cut the stream: tell the client in-band and end cleanly.
            m.upstream_errors.labels("stream_cut").inc()
            flow.status = 502
            yield responses.stream_cut(flow.exchange, type(exc).__name__)
        finally:
            # A client that went away cancels us; closing the upstream must still happen.
            with anyio.CancelScope(shield=True):
                await resp.aclose()
            if flow.reply is not None and flow.status < 400:
                flow.message = flow.reply.message()
            self.runner.done(flow)


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


def _tag(response: Response, flow: Flow) -> Response:
    response.headers["x-prefixpin-role"] = flow.role
    if flow.outcome is not None:
        response.headers["x-prefixpin-lineage"] = flow.outcome.record.id
    if flow.rewrites:
        response.headers["x-prefixpin-rewrites"] = ",".join(flow.rewrites)
    if flow.replica is not None:
        response.headers["x-prefixpin-replica"] = str(flow.replica)
    if flow.slot is not None:
        response.headers["x-prefixpin-slot"] = str(flow.slot)
    return response
