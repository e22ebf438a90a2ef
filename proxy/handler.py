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
from collections.abc import AsyncIterable, Callable

import httpx
import orjson
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from canonicalize import Exchange, Reply, SSESplitter
from canonicalize.sse import dumps, read
from proxy import responses
from proxy.addons import Runner
from proxy.errors import BodyTooLarge, RequestRejected, UpstreamError
from proxy.flow import Flow
from proxy.server import CORK
from proxy.services import Services
from proxy.upstream import client_path
from proxy.upstream.headers import has_header, raw_request_headers, raw_response_headers
from proxy.upstream.pool import REPLICA, Pool
from proxy.watch import ClientGone, ClientWatch

log = logging.getLogger("prefixpin")
_DROP = (b"content-encoding",)  # bodies are relayed decoded
_NO_LENGTH = frozenset({204, 304})


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it is known to pass ``limit``;
    ClientDisconnect when the client leaves before it is in."""
    for k, v in scope["headers"]:
        if k == b"content-length":
            if v.isdigit() and int(v) > limit:
                declared = v.decode("latin-1")
                raise BodyTooLarge(f"request body of {declared} bytes is over the limit of {limit} bytes")
            break
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is over the limit of {limit} bytes")
        if not message.get("more_body", False):
            if not chunks:
                return chunk  # the usual case: one piece
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)


class Handler:
    """Serves every exchange route; holds no per-request state.

    It answers through ASGI's ``send`` itself: a streamed body goes out chunk by
    chunk from this one task, and a client that leaves cancels the upstream wait
    or read through :class:`proxy.watch.ClientWatch` (no task group, no second
    task per response)."""

    def __init__(self, s: Services, upstream: Pool, runner: Runner) -> None:
        self.s = s
        self.upstream = upstream
        self.runner = runner
        # The store's records leave this process (a worker's): the done hooks run
        # before the client's last bytes go out (held by the cork), not after.
        self.done_first = getattr(s.store, "remote", False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send, exchange: Exchange) -> None:
        started = time.perf_counter()
        try:
            raw = await read_body(scope, receive, self.s.config.limits.max_body_bytes)
        except BodyTooLarge as exc:
            self.s.metrics.requests.labels(exchange.name, "rejected", "413").inc()
            await responses.from_error(exc, exchange)(scope, receive, send)
            return
        except ClientDisconnect:
            await responses.client_gone()(scope, receive, send)
            return
        await self.serve(scope, receive, send, exchange, raw, started)

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, exchange: Exchange, raw: bytes, started: float
    ) -> None:
        """The request, its body ``raw`` read (since ``started``)."""
        m = self.s.metrics
        flow = Flow(exchange, Headers(scope=scope), scope["query_string"].decode("latin-1"), raw, started)
        await self.runner.request(flow)
        if flow.big:
            await asyncio.to_thread(self.runner.render, flow)
        else:
            self.runner.render(flow)
        if not flow.skip:
            flow.reply = exchange.reply(offered=flow.offered, drop_usage_chunk=flow.drop_usage_chunk)
        m.overhead.observe(time.perf_counter() - started)
        watch = ClientWatch(scope, receive)
        try:
            await self._forward(scope, send, flow, watch)
        except ClientGone:
            log.info("client went away before the upstream answered; upstream request cancelled")
            flow.status = 499
            self.runner.done(flow)
            await responses.client_gone()(scope, receive, send)
        except UpstreamError as exc:
            m.upstream_errors.labels(exc.metric_kind).inc()
            log.warning("upstream error on %s: %s (%s)", exchange.name, exc, exc.detail)
            flow.status = exc.status
            self.runner.done(flow)
            await _tagged(responses.from_error(exc, exchange), flow)(scope, receive, send)
        except RequestRejected as exc:  # a path the upstream must not get
            flow.status = exc.status
            self.runner.done(flow)
            await _tagged(responses.from_error(exc, exchange), flow)(scope, receive, send)
        finally:
            watch.close()

    # -- the upstream -------------------------------------------------------------------
    async def _forward(self, scope: Scope, send: Send, flow: Flow, watch: ClientWatch) -> None:
        headers = raw_request_headers(scope["headers"], identity=True)
        if flow.set_headers:  # affinity.headers: ours replace the client's
            names = {k for k, _ in flow.set_headers}
            headers = [(k, v) for k, v in headers if k.lower() not in names] + list(flow.set_headers)
        sent = time.perf_counter()
        upstream = self.upstream
        if self.runner.pending:  # earlier responses' counting: while this one is with the upstream
            asyncio.get_running_loop().call_soon(self.runner.drain)
        with watch:
            resp = await upstream.send(
                "POST", client_path(scope), flow.query, headers, flow.out, key=flow.affinity_key, prefer=flow.home
            )
        if upstream.pooled:
            flow.replica = resp.extensions.get(REPLICA)
        out_headers = raw_response_headers(resp.headers, drop=_DROP)
        ctype = next((v for k, v in out_headers if k == b"content-type"), b"")
        cork = scope["extensions"].get(CORK) if "extensions" in scope else None
        if resp.status_code < 400 and b"text/event-stream" in ctype:
            await self._stream(send, resp, flow, _tag(out_headers, flow), sent, watch, cork)
            return
        try:
            with watch:
                content = await upstream.read(resp)
        finally:
            await resp.aclose()
        m = self.s.metrics
        m.upstream_ttft.observe(time.perf_counter() - sent)
        status = resp.status_code
        reply = flow.reply
        read_after = None  # the reply, read once the client has it (nothing may change it: no guard)
        if status >= 400:
            m.upstream_errors.labels(f"http_{status // 100}xx").inc()
        elif reply is not None:
            if reply.offered is None and not self.done_first:
                read_after = reply
            else:
                content = self._complete(flow, reply, content)
        flow.status = status
        if not (status < 200 or status in _NO_LENGTH):
            out_headers.append((b"content-length", b"%d" % len(content)))
        done = False
        try:
            if cork is not None:
                cork(True)  # the head and the body in one write
            await send({"type": "http.response.start", "status": status, "headers": _tag(out_headers, flow)})
            await send({"type": "http.response.body", "body": content})
            if self.done_first and cork is not None:
                done = True
                self.runner.done(flow, later=True)  # the record is on its way before the client has the answer
        finally:
            if cork is not None:
                cork(False)
            # Right after the last byte, with no await between: a store that records
            # without waiting (memory) has the lineage before the client can send its
            # next turn.
            if read_after is not None:
                self._complete(flow, read_after, content)
            if not done:
                self.runner.done(flow, later=True)  # counting: once the next request is on its way

    def _complete(self, flow: Flow, reply: Reply, content: bytes) -> bytes:
        try:
            # A guard reads the body as the most lenient client does (NaN, bad UTF-8 …).
            obj, strict = read(content) if reply.offered is not None else (orjson.loads(content), True)
        except ValueError:
            return content
        try:
            changed = reply.complete(obj)
            flow.message = reply.message()
            return dumps(obj, strict) if changed else content
        except Exception:
            log.exception("response processing failed; passing the response through")
            self.s.metrics.fail_open.labels("response").inc()
            return content

    async def _stream(
        self,
        send: Send,
        resp: httpx.Response,
        flow: Flow,
        headers: list[tuple[bytes, bytes]],
        sent: float,
        watch: ClientWatch,
        cork: Callable[[bool], None] | None = None,
    ) -> None:
        """Relay a streamed body as it arrives, through the exchange's reply machine.
        A client that leaves ends it (the upstream connection is closed); an upstream
        that cuts it gets an in-band error event and a clean end."""
        flow.status = resp.status_code
        try:
            await send({"type": "http.response.start", "status": resp.status_code, "headers": headers})
            with watch:
                await self._relay(send, resp, flow, sent, cork if self.done_first else None)
        except ClientGone:
            pass  # counted with the upstream's status, as the relay saw it
        finally:
            if flow.reply is not None and flow.status < 400:
                flow.message = flow.reply.message()
            self.runner.done(flow, later=True)  # before any await, as for a whole body
            if cork is not None:
                cork(False)  # the last bytes, held by the relay when the done hooks go first
            await resp.aclose()  # early (the client left): the upstream connection is closed

    def _last(self, reply: Reply | None, splitter: SSESplitter) -> bytes:
        """The stream's last bytes: what the splitter held (an unterminated event) through
        the reply machine, which also gives up the events it held for a verdict."""
        tail = splitter.take()
        if reply is None:
            return tail
        try:
            return reply.close(tail)
        except Exception:
            log.exception("stream processing failed at its end; passing the tail through")
            self.s.metrics.fail_open.labels("response").inc()
            return tail

    async def _relay(
        self, send: Send, resp: httpx.Response, flow: Flow, sent: float, hold: Callable[[bool], None] | None
    ) -> None:
        """``hold``: the cork, to hold the last bytes until the done hooks ran."""
        m = self.s.metrics
        reply = flow.reply
        splitter = SSESplitter()
        first = True
        chunks: AsyncIterable[bytes]
        if isinstance(resp.stream, httpx.AsyncByteStream) and not has_header(resp.headers, b"content-encoding"):
            chunks = resp.stream  # as received: no decoder chain to run
        else:
            chunks = resp.aiter_bytes()
        # Our transport tells when the bytes just read were the last: they then end the
        # response in the same write as the terminating chunk (one write less per stream).
        at_end = getattr(chunks, "at_end", None)
        ended = False
        try:
            async for chunk in chunks:  # read to its end even once ended: that returns the connection
                if ended:
                    continue
                if reply is not None:
                    try:
                        out = [b for b in (reply.feed(ev) for ev in splitter.feed(chunk)) if b is not None]
                    except Exception:
                        # Our state machine failed: pass the rest through untouched, starting
                        # with what the splitter was holding back.
                        log.exception("stream processing failed; passing the rest through")
                        m.fail_open.labels("response").inc()
                        reply, flow.reply = None, None
                        chunk = splitter.take() + chunk
                    else:
                        if first and reply.first_token:
                            m.upstream_ttft.observe(time.perf_counter() - sent)
                            first = False
                        chunk = b"".join(out)
                        if hold is not None and reply.ended:
                            # The stream's last event: a client that stops reading there must
                            # not be answered before the done hooks ran (workers: the record).
                            hold(True)
                if at_end is not None and at_end():
                    ended = True
                    if hold is not None:
                        hold(True)
                    await send({"type": "http.response.body", "body": chunk + self._last(reply, splitter)})
                elif chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if not ended:
                if hold is not None:
                    hold(True)
                await send({"type": "http.response.body", "body": self._last(reply, splitter)})
        except httpx.HTTPError as exc:
            # The upstream cut the stream: tell the client in-band and end cleanly.
            m.upstream_errors.labels("stream_cut").inc()
            flow.status = 502
            await send({"type": "http.response.body", "body": responses.stream_cut(flow.exchange, type(exc).__name__)})


def _tag(headers: list[tuple[bytes, bytes]], flow: Flow) -> list[tuple[bytes, bytes]]:
    """Our ``x-prefixpin-*`` response headers, each replacing one the upstream sent."""
    tags = [(b"x-prefixpin-role", flow.role.encode())]
    if flow.outcome is not None:
        tags.append((b"x-prefixpin-lineage", flow.outcome.record.id.encode()))
    if flow.rewrites:
        tags.append((b"x-prefixpin-rewrites", ",".join(flow.rewrites).encode()))
    if flow.replica is not None:
        tags.append((b"x-prefixpin-replica", b"%d" % flow.replica))
    if flow.slot is not None:
        tags.append((b"x-prefixpin-slot", b"%d" % flow.slot))
    if any(k.startswith(b"x-prefixpin-") for k, _ in headers):
        names = {k for k, _ in tags}
        headers = [(k, v) for k, v in headers if k not in names]
    headers += tags
    return headers


def _tagged(response: Response, flow: Flow) -> Response:
    response.raw_headers = _tag(response.raw_headers, flow)
    return response
