"""The one request flow of every wire API route (chat completions, Messages, Responses):

    read the body -> Flow (proxy.flow) -> the addons' request hooks (bypass, tenancy,
    canonicalize, stream usage, provider cache, fork guard, affinity) -> the edits
    spliced into the raw bytes -> upstream -> the answer written and read
    (proxy.answer) -> the moment after the last byte: the done hooks (the record),
    the counting queued (proxy.addons.counting)

Every hook runs under one :class:`proxy.addons.Runner` that fails open.  The
response carries ``x-prefixpin-role``, ``-lineage`` and ``-rewrites`` (empty when
no rule changed the request).  An error before the response started is answered
in the API's own shape (:mod:`proxy.responses`); a stream the upstream cuts ends
with an in-band error event.
"""

from __future__ import annotations

import logging
import time

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from canonicalize import Exchange, render
from proxy import access, responses
from proxy.addons import Runner, trace
from proxy.answer import Answering, tag
from proxy.body import read_body
from proxy.cpu import off_loop
from proxy.errors import BodyTooLarge, PrefixpinError, UpstreamError
from proxy.flow import Flow, Guarded, Inbound, Parsed, Placement, Skip, UsageAsked
from proxy.services import Services
from proxy.upstream import client_path
from proxy.upstream.headers import raw_request_headers
from proxy.upstream.policy import NO_ROUTE
from proxy.upstream.pool import Pool
from proxy.watch import ClientGone, ClientWatch

log = logging.getLogger("prefixpin")


def splice(flow: Flow, runner: Runner) -> bytes:
    """The edits spliced into the client's bytes, or those bytes as they are when there
    is nothing to edit or splicing fails (fail open)."""
    raw, ops, parsed = flow.inbound.raw, flow.outbound.ops, flow.get(Parsed)
    if not ops or parsed is None or flow.failed:
        return raw
    try:
        return render(parsed.doc, ops)
    except Exception:
        runner.failed(flow, "canonicalize")
        return raw


class Handler:
    """Serves every exchange route; holds no per-request state."""

    def __init__(self, s: Services, upstream: Pool, runner: Runner) -> None:
        self.s = s
        self.upstream = upstream
        self.runner = runner
        self.answering = Answering(s.metrics, s.config.limits, runner)
        self.waiting = 0  # requests waiting on their upstream's answer head

    async def __call__(self, scope: Scope, receive: Receive, send: Send, exchange: Exchange) -> None:
        """One request of ``exchange``'s route, from its body to the moment after its
        response's last byte (one coroutine: each wait on the upstream or the client
        suspends and resumes every frame of the chain)."""
        started = time.perf_counter()
        try:
            raw = await read_body(scope, receive, self.s.config.limits.max_body_bytes)
        except BodyTooLarge as exc:
            self.s.metrics.requests.labels(exchange.name, "rejected", "413").inc()
            if self.s.recorder is not None:
                trace.rejected(self.s.recorder, scope, 413)
            await responses.from_error(exc, exchange)(scope, receive, send)
            return
        except ClientDisconnect:
            await responses.client_gone()(scope, receive, send)
            return
        flow = Flow(Inbound(exchange, client_path(scope), scope["query_string"], Headers(scope=scope), raw, started))
        await self.runner.request(flow)
        big = flow.big
        flow.outbound.body = splice(flow, self.runner) if not big else await off_loop(splice, flow, self.runner)
        if flow.get(Skip) is None:
            guard = flow.get(Guarded)
            asked = flow.get(UsageAsked) is not None
            flow.answer.reply = exchange.reply(offered=guard.offered if guard else None, drop_usage_chunk=asked)
        self.s.metrics.overhead.observe(time.perf_counter() - started)
        watch = ClientWatch(scope, receive)
        try:
            await self._forward(scope, send, flow, watch)
        except ClientGone:
            log.info("client went away before the upstream answered; upstream request cancelled")
            flow.answer.status = 499
            await responses.client_gone()(scope, receive, send)
        except PrefixpinError as exc:  # before the response started: the upstream failed, or the path is refused
            if isinstance(exc, UpstreamError):
                self.s.metrics.upstream_errors.labels(exc.metric_kind).inc()
                log.warning("upstream error on %s: %s", exchange.name, exc.logged)
            flow.answer.status = exc.status
            response = responses.from_error(exc, exchange)
            response.raw_headers = tag(response.raw_headers, flow)
            await response(scope, receive, send)
        finally:
            watch.close()
            # The moment after the last byte, whatever the response was: with the memory
            # store, the turn is recorded before this process reads the client's next request.
            self.answering.read(flow)
            await self.runner.after_last(flow)
            if access.enabled():
                scope.setdefault("extensions", {})[access.ACCESS_NOTE] = access.note(flow)

    async def _forward(self, scope: Scope, send: Send, flow: Flow, watch: ClientWatch) -> None:
        headers = raw_request_headers(scope["headers"], identity=True)
        ours = flow.outbound.headers
        if ours:  # affinity.headers, Anthropic's beta: ours replace the client's
            names = {k for k, _ in ours}
            headers = [(k, v) for k, v in headers if k.lower() not in names] + list(ours)
        sent = time.perf_counter()
        upstream = self.upstream
        if not self.waiting:  # the loop is idle while this one is with the upstream: count earlier ones now
            self.runner.counting.kick()
        path = flow.inbound.path
        placement = flow.get(Placement)
        self.waiting += 1
        try:
            with watch:
                resp = await upstream.send(
                    "POST",
                    path,
                    flow.inbound.query.decode("latin-1"),
                    headers,
                    flow.out,
                    route=placement.route if placement is not None else NO_ROUTE,
                )
        finally:
            self.waiting -= 1
        try:
            if upstream.pooled:
                flow.answer.replica = resp.replica
            content = await self.answering.write(send, resp, flow, watch, sent)
            upstream.answered(resp.replica, path, resp.status, content)  # a 404: a wrong base path?
        finally:
            await resp.aclose()  # early (the client left): the upstream connection is closed
