"""The one request flow of every wire API route (chat completions, Messages, Responses):

    read the body -> Flow -> addons' request hooks (bypass, tenancy, canonicalize,
    stream usage, provider cache, fork guard, affinity) -> splice the edits into
    the raw bytes -> upstream -> the exchange's reply machine, streamed or not
    -> client -> addons' done hooks (measure, record), right after the last byte
       (with a shared store, Redis: just before it, the turn's record awaited, so the
       next turn finds it whichever process serves it; see proxy.store.Store.shared)

Every hook runs under one :class:`proxy.addons.Runner` that fails open.  The
response carries ``x-prefixpin-role``, ``-lineage`` and ``-rewrites`` (empty when
no rule changed the request).  An error
before the response started is answered in the API's own shape
(:mod:`proxy.responses`); a stream the upstream cuts ends with an in-band error
event.
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from canonicalize import Exchange, Reply
from canonicalize.sse import dumps, read
from proxy import access, responses
from proxy.addons import Runner
from proxy.cpu import on_cpu
from proxy.errors import BodyTooLarge, PrefixpinError, UpstreamEncoding, UpstreamError
from proxy.flow import Flow
from proxy.relay import AsSent, HeldHead, relay
from proxy.services import Services
from proxy.through import Through
from proxy.upstream import client_path, decode
from proxy.upstream.headers import has_header, raw_request_headers, raw_response_headers
from proxy.upstream.message import Body, Response
from proxy.upstream.pool import Pool
from proxy.upstream.reading import Decoded, Over, read_whole
from proxy.watch import ClientGone, ClientWatch

log = logging.getLogger("prefixpin")
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
    """Serves every exchange route; holds no per-request state."""

    def __init__(self, s: Services, upstream: Pool, runner: Runner) -> None:
        self.s = s
        self.upstream = upstream
        self.runner = runner
        self.record_first = s.store.shared  # the record lands before the client's last bytes

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
        path = scope["raw_path"].decode("latin-1") if scope.get("raw_path") else scope["path"]
        flow = Flow(exchange, Headers(scope=scope), scope["query_string"], raw, started, path)
        await self.runner.request(flow)
        await on_cpu(flow.big, self.runner.render, flow)
        if not flow.skip:
            flow.reply = exchange.reply(offered=flow.offered, drop_usage_chunk=flow.drop_usage_chunk)
        self.s.metrics.overhead.observe(time.perf_counter() - started)
        watch = ClientWatch(scope, receive)
        try:
            await self._forward(scope, send, flow, watch)
        except ClientGone:
            log.info("client went away before the upstream answered; upstream request cancelled")
            flow.status = 499
            await responses.client_gone()(scope, receive, send)
        except PrefixpinError as exc:  # before the response started: the upstream failed, or the path is refused
            if isinstance(exc, UpstreamError):
                self.s.metrics.upstream_errors.labels(exc.metric_kind).inc()
                log.warning("upstream error on %s: %s", exchange.name, exc.logged)
            flow.status = exc.status
            response = responses.from_error(exc, exchange)
            response.raw_headers = _tag(response.raw_headers, flow)
            await response(scope, receive, send)
        finally:
            watch.close()
            # Right after the last byte, with no await between: the memory store has
            # the turn before this process reads the client's next request.
            self._finish(flow)
            if access.enabled():
                scope.setdefault("extensions", {})[access.ACCESS_NOTE] = access.note(flow)

    def _finish(self, flow: Flow) -> None:
        """The done hooks (record now, the counting a little later), once."""
        if not flow.finished:
            flow.finished = True
            self.runner.done(flow, later=True)

    async def _record_first(self, flow: Flow) -> None:
        """A shared store's way: the done hooks, and the turn's record written, before
        the client's last bytes."""
        if flow.reply is not None and flow.status < 400 and flow.message is None:
            flow.message = flow.reply.message()
        self._finish(flow)
        if flow.recording is not None:
            await flow.recording

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
        path = client_path(scope)
        with watch:
            resp = await upstream.send(
                "POST",
                path,
                flow.query.decode("latin-1"),
                headers,
                flow.out,
                route=flow.route,
            )
        try:
            if upstream.pooled:
                flow.replica = resp.replica
            decoder = self._decoder(flow, resp)
            out_headers = raw_response_headers(resp.headers, drop=(b"content-encoding",) if decoder else ())
            flow.status = resp.status
            ctype = next((v for k, v in out_headers if k == b"content-type"), b"")
            content = b""
            if resp.status < 400 and b"text/event-stream" in ctype:
                await self._stream(send, resp, flow, _tag(out_headers, flow), sent, watch, decoder)
            else:
                content = await self._whole(send, resp, flow, out_headers, sent, watch, decoder)
            upstream.answered(resp.replica, path, resp.status, content)  # a 404: a wrong base path?
        finally:
            await resp.aclose()  # early (the client left): the upstream connection is closed

    def _decoder(self, flow: Flow, resp: Response) -> decode.Decoder | None:
        """A decoder for a body the upstream compressed although asked not to; one
        prefixpin cannot undo goes to the client as it came, unread."""
        try:
            return decode.decoder(resp.header(b"content-encoding"))
        except decode.Undecodable as exc:
            log.warning("passing an upstream response through unread: %s", exc)
            flow.reply = None
            return None

    async def _whole(
        self,
        send: Send,
        resp: Response,
        flow: Flow,
        headers: list[tuple[bytes, bytes]],
        sent: float,
        watch: ClientWatch,
        decoder: decode.Decoder | None,
    ) -> bytes:
        """The whole answer, read, then sent; returns what was sent."""
        with watch:
            content = await read_whole(resp.body, decoder, self.s.config.limits.max_decoded_bytes)
        if isinstance(content, Over):
            self.s.metrics.fail_open.labels("decode").inc()
            log.warning("an answer on %s is over limits.max_decoded_bytes: relayed unread", flow.exchange.name)
            with watch:
                await self._as_sent(send, resp, flow, content.raw)
            return b""  # not read: nothing to judge a 404 by
        m = self.s.metrics
        m.upstream_ttft.observe(time.perf_counter() - sent)
        status, reply = resp.status, flow.reply
        if status >= 400:
            m.upstream_errors.labels(f"http_{status // 100}xx").inc()
            reply = None
        # The guard may change what the client gets: read first.  Otherwise the reply is
        # read for the record once the client has it, unless the record goes first.
        read_first = reply is not None and (reply.offered is not None or self.record_first)
        if read_first:
            assert reply is not None
            content = self._complete(flow, reply, content)
        if self.record_first:
            await self._record_first(flow)
        if not (status < 200 or status in _NO_LENGTH):
            headers.append((b"content-length", b"%d" % len(content)))
        await send({"type": "http.response.start", "status": status, "headers": _tag(headers, flow)})
        await send({"type": "http.response.body", "body": content})
        if reply is not None and not read_first:
            self._complete(flow, reply, content)
        return content

    async def _as_sent(self, send: Send, resp: Response, flow: Flow, raw: list[bytes]) -> None:
        """Past a bound, before the client's response started: the answer as the upstream
        sent it (its content-encoding, its bytes: ``raw`` read so far, then the rest),
        unread (fail open)."""
        flow.reply = None
        headers = raw_response_headers(resp.headers)
        length = resp.header(b"content-length")
        if length is not None and not has_header(resp.headers, b"transfer-encoding"):
            headers.append((b"content-length", length))
        await send({"type": "http.response.start", "status": resp.status, "headers": _tag(headers, flow)})
        if resp.status >= 400:
            self.s.metrics.upstream_errors.labels(f"http_{resp.status // 100}xx").inc()
        for part in raw:
            if part:
                await send({"type": "http.response.body", "body": part, "more_body": True})
        before_end = (lambda: self._record_first(flow)) if self.record_first else None
        await relay(send, resp.body, before_end=before_end)

    def _complete(self, flow: Flow, reply: Reply, content: bytes) -> bytes:
        try:
            # A guard reads the body as the most lenient client does (NaN, bad UTF-8, ...).
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
        resp: Response,
        flow: Flow,
        headers: list[tuple[bytes, bytes]],
        sent: float,
        watch: ClientWatch,
        decoder: decode.Decoder | None,
    ) -> None:
        """Relay a streamed body as it arrives, through the exchange's reply machine.
        A client that leaves ends it (the upstream connection is closed); an upstream
        that cuts it gets an in-band error event and a clean end.  A compressed stream's
        head waits for its first event, so that a stream past a bound before then can
        still go out as the upstream sent it."""
        start = {"type": "http.response.start", "status": resp.status, "headers": headers}
        body: Body = resp.body
        held = None
        if decoder is None:
            await send(start)
            await send({"type": "http.response.body", "body": b"", "more_body": True})  # the head goes out now
        else:
            body = decoded = Decoded(resp.body, decoder, keep_raw=True)
            send = held = HeldHead(send, start, on_sent=decoded.forget_raw)
        limits = self.s.config.limits
        through = Through(
            self.s.metrics,
            flow,
            sent,
            max_event_bytes=limits.max_event_bytes,
            max_decoded_bytes=limits.max_decoded_bytes,
            held=held,
        )
        before_end = (lambda: self._record_first(flow)) if self.record_first else None
        try:
            with watch:
                await relay(send, body, through, before_end=before_end)
        except ClientGone:
            pass  # counted with the upstream's status, as the relay saw it
        except AsSent:
            assert held is not None and isinstance(body, Decoded)
            with watch:
                await self._as_sent(held.send, resp, flow, body.raw)
        except UpstreamError as exc:
            if held is not None and not held.sent:
                raise  # nothing went out yet: a 502 in the API's shape
            kind = exc.metric_kind if isinstance(exc, UpstreamEncoding) else "stream_cut"
            self.s.metrics.upstream_errors.labels(kind).inc()
            log.warning("the upstream cut a stream on %s: %s", flow.exchange.name, exc.logged)
            flow.status = 502
            await send({"type": "http.response.body", "body": responses.stream_cut(flow.exchange, exc)})
        if flow.reply is not None and flow.status < 400:
            flow.message = flow.reply.message()


def _tag(headers: list[tuple[bytes, bytes]], flow: Flow) -> list[tuple[bytes, bytes]]:
    """Our ``x-prefixpin-*`` response headers, each replacing one the upstream sent."""
    tags = [(b"x-prefixpin-role", flow.role.encode())]
    if flow.outcome is not None:
        tags.append((b"x-prefixpin-lineage", flow.outcome.record.id.encode()))
    # Always there, empty when no rule changed the request: a client can tell "nothing
    # changed" from "not through prefixpin".
    tags.append((b"x-prefixpin-rewrites", ",".join(flow.rewrites).encode()))
    if flow.replica is not None:
        tags.append((b"x-prefixpin-replica", b"%d" % flow.replica))
    if flow.slot is not None:
        tags.append((b"x-prefixpin-slot", b"%d" % flow.slot))
    if any(k.startswith(b"x-prefixpin-") for k, _ in headers):
        names = {k for k, _ in tags}
        headers = [(k, v) for k, v in headers if k not in names]
    return headers + tags
